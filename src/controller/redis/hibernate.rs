//! Hibernation (`spec.hibernate`): the pods go, the volumes and the Secret
//! stay, and switching it off brings the same data back.
//!
//! Going to sleep: writes are paused on the primary, the replicas catch up,
//! and every instance writes its dataset with `SAVE` (whatever the
//! persistence settings: a Redis without RDB snapshots would otherwise come
//! back empty); only then is the StatefulSet scaled to zero, its claims
//! retained. The published primary is cleared, so the instances come back
//! as a new Redis's do: fenced, until recovery promotes the one furthest
//! ahead (they all saved the same offset; ordinal 0 wins the tie) and the
//! others sync from it. A Redis without `spec.storage` cannot hibernate
//! (admission refuses it: its data would go with the pods).

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::events::EventType;

use super::Reconciler;
use super::facts::{PodFacts, Role};
use crate::api::v1alpha1::HibernationStatus;
use crate::controller::error::Error;
use crate::controller::names;
use crate::redis::{ConnectOptions, Endpoint, Node};

/// How long writes stay paused on the primary while the instances save
/// (the pods stop well before; a pass that fails lets them resume).
const WRITE_PAUSE: Duration = Duration::from_secs(60);
/// How long the replicas have to catch up with the paused primary.
const CATCH_UP: Duration = Duration::from_secs(10);

/// A StatefulSet of a hibernating Redis: no pod, and the claims stay
/// whatever the scale-down policy.
pub fn scaled_to_zero(mut sts: StatefulSet) -> StatefulSet {
    sts.spec.replicas = Some(0);
    if let Some(p) = sts.spec.persistent_volume_claim_retention_policy.as_mut() {
        p.when_scaled = Some("Retain".into());
    }
    names::stamp_hash(sts)
}

impl Reconciler {
    /// A hibernating Redis: saves the data once; `true` once saved, when
    /// the children are to be applied with no replica. `groups` are the
    /// primaries and their instances (one for Replication, one per shard
    /// for Cluster), saved at once. When a save fails, nothing is scaled
    /// down and the failure is reported.
    pub(super) async fn hibernate(
        &mut self,
        facts: &[PodFacts],
        groups: &[(Option<&str>, Vec<PodFacts>)],
        opts: &ConnectOptions,
    ) -> Result<bool, Error> {
        let saved = self
            .records
            .hibernation
            .as_ref()
            .is_some_and(|h| h.saved_at.is_some());
        let running: Vec<&PodFacts> = facts.iter().filter(|f| !f.terminating).collect();
        if !saved && !running.is_empty() {
            let saves = groups
                .iter()
                .map(|(primary, facts)| save_all(facts, *primary, opts));
            let saved: Result<Vec<i64>, _> =
                futures::future::join_all(saves).await.into_iter().collect();
            match saved {
                Ok(offsets) => {
                    // One offset names the Replication primary's; a Cluster
                    // Redis's shards each have their own.
                    let offset = match offsets.as_slice() {
                        [one] => Some(*one),
                        _ => None,
                    };
                    let at = match offset {
                        Some(o) => format!("at offset {o}"),
                        None => {
                            format!("at {} shard primaries' offsets {offsets:?}", offsets.len())
                        }
                    };
                    let now = crate::controller::base::rfc3339(chrono::Utc::now());
                    let note = format!(
                        "saved the dataset on {} instance(s) {at}; removing the pods (volumes and Secret stay)",
                        running.len()
                    );
                    self.event(EventType::Normal, "Hibernating", "Hibernate", note)
                        .await;
                    self.records.hibernation = Some(HibernationStatus {
                        saved_at: Some(now),
                        offset,
                        since: None,
                    });
                }
                Err(e) => {
                    // Nothing is removed before the data is on the volumes.
                    let msg = format!("hibernating: saving the dataset failed, the pods stay: {e}");
                    self.report_failure("HibernationFailed", "Hibernate", "redis", msg)
                        .await;
                    return Ok(false);
                }
            }
        }
        if self.records.hibernation.is_none() {
            self.records.hibernation = Some(HibernationStatus::default());
        }
        if facts.is_empty()
            && let Some(h) = self.records.hibernation.as_mut()
            && h.since.is_none()
        {
            h.since = Some(crate::controller::base::rfc3339(chrono::Utc::now()));
            let note = "all pods stopped; the volumes and the Secret are kept".to_string();
            self.event(EventType::Normal, "Hibernated", "Hibernate", note)
                .await;
        }
        if !facts.is_empty() {
            self.report.progress(format!(
                "hibernating: waiting for {} pod(s) to stop",
                facts.len()
            ));
        }
        Ok(true)
    }

    /// Called when the Redis is Ready: a hibernation that ended is cleared.
    pub(super) async fn track_wake(&mut self, all_ready: bool) {
        if self.redis.spec.hibernate || !all_ready || self.records.hibernation.is_none() {
            return;
        }
        self.records.hibernation = None;
        let note = "woke up: every instance is back with its data".to_string();
        self.event(EventType::Normal, "Resumed", "Hibernate", note)
            .await;
    }
}

/// Pauses writes on the primary, lets the replicas catch up, and saves on
/// every reachable instance (in the background: a node's event loop never
/// blocks, see [`Node::save_in_background`]). Returns the primary's offset.
async fn save_all(
    facts: &[PodFacts],
    primary: Option<&str>,
    opts: &ConnectOptions,
) -> Result<i64, crate::redis::Error> {
    let endpoint = |f: &PodFacts| f.ip.as_ref().map(|ip| Endpoint::new(ip, names::REDIS_PORT));
    let p = facts
        .iter()
        .find(|f| Some(f.name.as_str()) == primary && f.reachable && f.role == Some(Role::Primary))
        .or_else(|| {
            facts
                .iter()
                .find(|f| f.reachable && f.role == Some(Role::Primary))
        });
    let mut offset = 0;
    if let Some(pep) = p.and_then(endpoint) {
        let mut node = Node::connect(&pep, opts).await?;
        node.pause_writes(WRITE_PAUSE).await?;
        offset = node.replication().await?.repl_offset.unwrap_or(0);
        for r in facts
            .iter()
            .filter(|f| f.reachable && f.role == Some(Role::Replica))
        {
            if let Some(rep) = endpoint(r) {
                // A replica that cannot catch up still saves what it has;
                // the primary's file is the one recovery prefers.
                let _ = crate::redis::actions::wait_caught_up(&rep, &pep, opts, CATCH_UP).await;
            }
        }
    }
    // The primary first: its file must be written, the others' may fail.
    let mut order: Vec<&PodFacts> = facts.iter().filter(|f| f.reachable).collect();
    order.sort_by_key(|f| f.role != Some(Role::Primary));
    for (i, f) in order.iter().enumerate() {
        let Some(ep) = endpoint(f) else { continue };
        let saved = async {
            let mut node = Node::connect(&ep, opts).await?;
            node.save_in_background(Duration::from_secs(300)).await
        }
        .await;
        if i == 0 {
            saved?;
        }
    }
    Ok(offset)
}
