//! Replication wiring: every replica follows the chosen primary, the pods'
//! role labels (which the Services select on) match the servers, and the
//! primary is published (ConfigMap for instances that start, status for
//! the operator's next pass) whenever it moves.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::conf;
use super::facts::{PodFacts, Role};
use super::{Error, Reconciler, plan};
use crate::controller::base::FIELD_MANAGER;
use crate::controller::names::{self, ROLE_LABEL};
use crate::redis::{ConnectOptions, Endpoint};

/// A replica following the primary whose link has been down this long is
/// repaired (the server itself retries every second).
pub const STUCK_LINK_SECS: i64 = 10;

impl Reconciler {
    pub(super) async fn wire(&mut self, facts: &[PodFacts], primary: &str, opts: &ConnectOptions) {
        let Some(pf) = facts.iter().find(|f| f.name == primary) else {
            return;
        };
        let Some(pip) = pf.ip.clone() else {
            self.report
                .progress(format!("waiting for primary {primary} to get an address"));
            return;
        };
        if pf.terminating {
            // Wiring waits for the primary's pod to stop; then the recorded
            // primary comes back and recovery decides.
            self.report.progress(format!(
                "primary {primary} is being deleted; waiting for it to stop"
            ));
            return;
        }
        let pep = Endpoint::new(&pip, names::REDIS_PORT);
        if pf.role == Some(Role::Replica) {
            // Promoting a replica while any server still acts as primary
            // would make two primaries: wait for the servers to settle.
            // Only when no reachable server is primary (everyone follows an
            // address that is gone) is the replica furthest ahead promoted.
            self.recover_primary(facts, opts).await;
            return;
        }
        if !(pf.reachable && pf.role == Some(Role::Primary)) {
            // Never point replicas that hold the data at an instance that has
            // not been seen acting as primary: a pod re-created under the
            // recorded name starts empty, and a replica that synchronised
            // from it would lose everything.
            self.report.progress(format!(
                "waiting for primary {primary} to answer as primary"
            ));
            return;
        }
        // While TLS is turned on or off, a primary that listens the new
        // way replicates that way too, should it follow another later (a
        // replica promoted mid-roll kept the setting of its old primary).
        if opts.listeners.is_some() && pf.listens_tls == self.redis.spec.tls.is_some() {
            self.match_replication_tls(pf, &pep, &pip, opts).await;
        }
        for f in facts {
            if f.name == primary || !f.reachable || f.terminating {
                continue;
            }
            let Some(ip) = &f.ip else { continue };
            let follows =
                f.role == Some(Role::Replica) && f.following.as_deref() == Some(pip.as_str());
            let ep = Endpoint::new(ip, names::REDIS_PORT);
            if follows {
                // A replica whose link is not up follows the primary the
                // way the primary listens: while TLS is turned on or off, a
                // replica restarted with the other template does not at
                // boot; after it, a replica promoted mid-roll that is a
                // replica again (a failover, then a switchover back) kept
                // the setting it was given then. Its link never came up, so
                // the server reports no time since it went down and the
                // repair below never fires. One `CONFIG GET` while a link
                // is down; nothing while it is up.
                if f.link_up != Some(true) && self.match_replication_tls(f, &ep, &pip, opts).await {
                    continue;
                }
                // The server retries a broken link every second; one still
                // down after STUCK_LINK_SECS is repaired.
                if f.link_up == Some(false)
                    && !f.syncing
                    && f.link_age.is_some_and(|a| a >= STUCK_LINK_SECS)
                {
                    self.repair_link(f, &ep, primary, opts).await;
                }
                continue;
            }
            self.note_diverged(f, primary).await;
            match crate::redis::actions::make_replica_of(&ep, &pep, opts).await {
                Ok(()) => {
                    self.event(
                        EventType::Normal,
                        "ReplicaConfigured",
                        "Replicate",
                        format!("{} now replicates from primary {primary}", f.name),
                    )
                    .await;
                    self.report
                        .progress(format!("{} is synchronising from {primary}", f.name));
                }
                Err(e) => {
                    self.data_plane_failed(format!("configuring {} as replica", f.name), &e)
                        .await
                }
            }
        }
    }

    /// A replica whose link stays down: its credentials for the primary are
    /// set again (`masterauth`, in case they were changed on the server)
    /// and its connection to the primary is dropped, so it reconnects now.
    async fn repair_link(
        &mut self,
        f: &PodFacts,
        ep: &Endpoint,
        primary: &str,
        opts: &ConnectOptions,
    ) {
        let result = async {
            let mut node = crate::redis::Node::connect(ep, opts).await?;
            if let Some(pw) = &opts.password {
                super::credentials::set_masterauth(&mut node, pw.expose()).await?;
            }
            // No connection to kill is fine: the link is down anyway.
            let _: crate::redis::Result<redis::Value> = node
                .query(
                    "CLIENT KILL",
                    redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("master"),
                )
                .await;
            Ok::<(), crate::redis::Error>(())
        }
        .await;
        match result {
            Ok(()) => {
                let down = f.link_age.unwrap_or(0);
                self.event(
                    EventType::Warning,
                    "ReplicaLinkRepaired",
                    "Replicate",
                    format!(
                        "{}'s link to primary {primary} was down for {down}s; its credentials \
                         were set again and it reconnects",
                        f.name
                    ),
                )
                .await;
                self.report
                    .progress(format!("{} is reconnecting to {primary}", f.name));
            }
            Err(e) => {
                self.data_plane_failed(format!("repairing the link of {}", f.name), &e)
                    .await
            }
        }
    }

    /// A former primary that comes back after a failover with writes past
    /// the point its successor was promoted at: those writes are discarded
    /// by the resync it is about to do. Said in an event, with the amount.
    async fn note_diverged(&mut self, f: &PodFacts, primary: &str) {
        let Some(last) = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.last_failover.clone())
        else {
            return;
        };
        if f.role != Some(Role::Primary) || last.from != f.name || last.to != primary {
            return;
        }
        let Some(extra) = f.offset.map(|o| o - last.offset).filter(|b| *b > 0) else {
            return;
        };
        self.event(
            EventType::Warning,
            "DivergedWritesDiscarded",
            "Replicate",
            format!(
                "{} rejoins as a replica of {primary}; it holds {extra} bytes of replication \
                 stream past offset {} where {primary} was promoted (writes it accepted that \
                 never reached a replica); the resync discards them",
                f.name, last.offset
            ),
        )
        .await;
    }

    /// Before a scale-down that would remove the primary, switch over to the
    /// surviving replica that is furthest ahead.
    pub(super) async fn move_primary_for_scale_down(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        desired: i32,
        opts: &ConnectOptions,
    ) {
        let Some(target) = plan::best_replica(facts, |f| {
            super::facts::ordinal(&f.name, &self.names).is_some_and(|o| o < desired)
        }) else {
            self.report.progress(
                "scale-down waits for a surviving replica to take over as primary".into(),
            );
            return;
        };
        if self
            .switchover(facts, primary, &target, opts, "scale-down")
            .await
            .is_some()
            && let Err(e) = self.publish_primary(facts, &target).await
        {
            self.report
                .progress(format!("recording new primary {target}: {e}"));
        }
    }

    /// Writes only `status.primary`, and clears the intent
    /// (`status.targetPrimary`): the move is done.
    pub(super) async fn record_primary(&mut self, primary: &str) -> Result<(), Error> {
        self.record_primary_with(primary, serde_json::json!({}))
            .await
    }

    /// As [`Self::record_primary`], with more status fields in the same
    /// write (`extra`, an object).
    async fn record_primary_with(
        &mut self,
        primary: &str,
        mut extra: serde_json::Value,
    ) -> Result<(), Error> {
        let old = self.redis.status.clone().unwrap_or_default();
        let moved = super::status::record::primary_moved(
            &old,
            primary,
            self.redis.metadata.generation,
            k8s_openapi::jiff::Timestamp::now(),
        );
        let mut phase_moved = false;
        if let Some(m) = extra.as_object_mut() {
            m.insert("primary".into(), primary.into());
            m.insert("targetPrimary".into(), serde_json::Value::Null);
            // The roles and the Ready condition move in the same write: a
            // reader never sees the new primary beside an instance list
            // that still names the old one, or a Ready left over from
            // before the move.
            if let Some(moved) = moved {
                let value = serde_json::to_value(&moved.instances)
                    .map_err(|e| Error::Serialize("status", e))?;
                m.insert("instances".into(), value);
                if let Some((conditions, phase)) = moved.conditions {
                    let value = serde_json::to_value(&conditions)
                        .map_err(|e| Error::Serialize("status", e))?;
                    m.insert("conditions".into(), value);
                    let value =
                        serde_json::to_value(phase).map_err(|e| Error::Serialize("status", e))?;
                    m.insert("phase".into(), value);
                    phase_moved = true;
                }
            }
        }
        self.patch_status(extra).await?;
        self.report.recorded_primary(primary);
        if phase_moved {
            self.event(
                EventType::Normal,
                "Updating",
                "Reconcile",
                "phase Updating".to_string(),
            )
            .await;
        }
        Ok(())
    }

    /// Records the intent to make `target` primary before any server is
    /// told: if the operator stops after the promotion and before
    /// [`Self::publish_primary`], the next pass finds the promoted server
    /// from this record (see [`plan::choose_primary`]).
    pub(super) async fn record_intent(&mut self, target: &str) -> Result<(), Error> {
        let recorded = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.target_primary.as_deref());
        if recorded == Some(target) {
            return Ok(());
        }
        self.patch_status(serde_json::json!({ "targetPrimary": target }))
            .await
    }

    /// Records `primary` in the ConfigMap (read by instances at start-up) and
    /// in the status, right after a switchover.
    pub(super) async fn publish_primary(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
    ) -> Result<(), Error> {
        self.publish_primary_with(facts, primary, serde_json::json!({}))
            .await
    }

    /// As [`Self::publish_primary`], recording `status.lastFailover` too.
    pub(super) async fn publish_failover(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        record: &crate::api::v1alpha1::FailoverRecord,
    ) -> Result<(), Error> {
        let value = failover_patch(record).map_err(|e| Error::Serialize("status", e))?;
        self.publish_primary_with(facts, primary, serde_json::json!({ "lastFailover": value }))
            .await
    }

    async fn publish_primary_with(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        extra: serde_json::Value,
    ) -> Result<(), Error> {
        let ip = facts
            .iter()
            .find(|f| f.name == primary)
            .and_then(|f| f.ip.clone());
        let live: Option<ConfigMap> = self.lookup(&self.names.config()).await?;
        let cm = conf::config_map(&self.redis, &self.names, ip.as_deref(), self.bootstrapped());
        self.apply("ConfigMap", &cm, live.as_ref()).await?;
        self.record_primary_with(primary, extra).await
    }

    pub(super) async fn label_roles(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
    ) -> Result<(), Error> {
        for f in facts {
            let want = plan::role_label(f, primary);
            if f.role_label.as_deref() == Some(want) {
                continue;
            }
            let patch = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f.name, "labels": {ROLE_LABEL: want}},
            });
            self.ctx.metrics.kube("apply");
            self.report.wrote();
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            match self
                .api::<Pod>()
                .patch(&f.name, &pp, &Patch::Apply(&patch))
                .await
            {
                Ok(_) => {}
                // An apply to a pod deleted since the list would create it
                // and is refused as invalid (or not found): a pod that is
                // gone needs no label.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => {
                    let live: Option<Pod> = self.fetch(&f.name).await?;
                    if live.is_some() {
                        return Err(kube::Error::Api(s).into());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// `status.lastFailover` as a merge patch that replaces the whole record:
/// a field this record leaves out (no timeline phase the monitor saw, no
/// other candidates) is written as null, or the previous failover's value
/// would stay beside this one's (seen: a timeline with the last failover's
/// `noticedMs` and this one's `silentMs`).
pub(super) fn failover_patch(
    record: &crate::api::v1alpha1::FailoverRecord,
) -> Result<serde_json::Value, serde_json::Error> {
    use serde_json::Value;
    let mut value = serde_json::to_value(record)?;
    if let Some(m) = value.as_object_mut() {
        for key in ["candidates", "timeline"] {
            m.entry(key).or_insert(Value::Null);
        }
        if let Some(t) = m.get_mut("timeline").and_then(Value::as_object_mut) {
            for key in ["noticedMs", "silentMs"] {
                t.entry(key).or_insert(Value::Null);
            }
        }
    }
    Ok(value)
}

#[cfg(test)]
mod patch_tests {
    use super::failover_patch;
    use crate::api::v1alpha1::{FailoverRecord, FailoverTimeline};

    #[test]
    fn a_failover_record_replaces_every_field_of_the_last_one() {
        let record = FailoverRecord {
            time: "2026-12-02T07:32:23.130Z".into(),
            from: "c-1".into(),
            to: "c-0".into(),
            reason: "PrimaryRestarted".into(),
            offset: 0,
            candidates: Vec::new(),
            timeline: Some(FailoverTimeline {
                noticed_ms: None,
                silent_ms: Some(411),
                promote_ms: 11,
                labels_ms: 43,
            }),
        };
        let v = failover_patch(&record).expect("patch");
        assert!(v["candidates"].is_null(), "{v}");
        assert!(v["timeline"]["noticedMs"].is_null(), "{v}");
        assert_eq!(v["timeline"]["silentMs"], 411);
        let none = FailoverRecord {
            timeline: None,
            ..record
        };
        assert!(failover_patch(&none).expect("patch")["timeline"].is_null());
    }
}
