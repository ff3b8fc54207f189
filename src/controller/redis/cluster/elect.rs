//! A shard whose primary is gone and whose replicas cannot elect one of
//! themselves on their own.
//!
//! The cluster's own failover promotes a replica once a majority of
//! primaries marks its primary failed, but only a replica whose data is
//! recent: one whose link to the primary has been down longer than the
//! node timeout times `cluster-replica-validity-factor` (10) plus the
//! replication ping period (10 s), 20 s here, does not stand, and a
//! replica that never linked to its primary since it started counts as
//! down for ever (`master_link_down_since_seconds:-1`). A replica that
//! restarts (a roll, a wake from hibernation, a deleted pod) just before
//! its primary is lost for good (its claim deleted, its node gone) is such
//! a replica: the shard would stay without a primary, its slots unserved,
//! until someone ran `CLUSTER FAILOVER FORCE` by hand (chaos seed 324).
//!
//! The operator runs it, when every candidate of the shard is past that
//! bound: the one with the most data. Only once the primary is gone for
//! good: every pod of the shard is there and answers, none as it (a pod
//! that does not answer may be the primary restarting with its data, which
//! would then follow the promoted replica and drop what it holds: chaos
//! seed 344), and only a candidate holding some of the primary's stream
//! (a new node that never synced would be an empty primary). `FORCE`
//! skips the primary's agreement and the age check, not the vote: a
//! majority of primaries must still grant it, and each candidate's own view must already mark the
//! primary failed (the cluster agreed it is gone), so a primary that is
//! only slow or cut off from the replica is not replaced. What the
//! promoted replica lacks is what no other copy holds: a write confirmed
//! with `WAIT` after its link went down reached another replica, which,
//! linked, would have been elected by the cluster itself.

use std::collections::BTreeMap;

use kube::runtime::events::EventType;

use super::super::Reconciler;
use super::build::NODE_TIMEOUT_MS;
use super::model::Plan;
use crate::redis::Node;
use crate::redis::cluster as rc;

/// How long a replica's link may have been down for the cluster's own
/// election to promote it: node timeout × validity factor (10) + the
/// replication ping period (10 s), in seconds.
pub const SELF_ELECTION_BOUND_SECS: i64 = (NODE_TIMEOUT_MS as i64 * 10) / 1000 + 10;

/// Whether a replica whose link has been down `down` seconds (`-1` or
/// less: never up since it started) can still be elected by the cluster.
pub fn can_stand(down: i64) -> bool {
    (0..=SELF_ELECTION_BOUND_SECS).contains(&down)
}

impl Reconciler {
    /// `CLUSTER FAILOVER FORCE` on the candidate with the most data of each
    /// shard of `plan` whose candidates all stand no chance on their own.
    pub(in crate::controller::redis) async fn force_stuck_elections(
        &mut self,
        plan: &Plan,
        conns: &mut BTreeMap<String, Node>,
    ) {
        for shard in &plan.electing {
            // Each candidate's link down time and offset.
            let mut looks = Vec::new();
            for pod in &shard.candidates {
                let Some(n) = conns.get_mut(pod) else {
                    continue;
                };
                let Ok(info) = n.info_section("replication").await else {
                    continue;
                };
                let r = info.replication;
                let down = r.link_down_since_seconds.unwrap_or(0);
                let offset = r.applied_offset().unwrap_or(0);
                // A replica that holds nothing of the primary's stream (a
                // new node never synced) would be an empty primary.
                if offset > 0 {
                    looks.push((pod.clone(), down, offset));
                }
            }
            if looks.is_empty() || looks.iter().any(|(_, down, _)| can_stand(*down)) {
                continue;
            }
            let Some((pod, down, offset)) = looks.iter().max_by_key(|(_, _, o)| *o).cloned() else {
                continue;
            };
            let Some(n) = conns.get_mut(&pod) else {
                continue;
            };
            match rc::failover_force(n).await {
                Ok(()) => {
                    let since = if down < 0 {
                        "never linked to its primary since it started".to_string()
                    } else {
                        format!("its link to its primary down {down} s")
                    };
                    let note = format!(
                        "shard {}: {pod} asked to take over its lost primary's slots \
                         (CLUSTER FAILOVER FORCE, replication offset {offset}): the cluster \
                         does not elect a replica {since}",
                        shard.shard
                    );
                    tracing::warn!(redis = %self.oref, "{note}");
                    self.report.progress(note.clone());
                    self.report.wrote();
                    self.event(EventType::Warning, "ForcedFailover", "Failover", note)
                        .await;
                }
                Err(e) => {
                    self.data_plane_failed(format!("{pod} taking over shard {}", shard.shard), &e)
                        .await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_stands_only_within_the_bound_and_never_when_it_never_linked() {
        assert_eq!(SELF_ELECTION_BOUND_SECS, 20);
        assert!(can_stand(0));
        assert!(can_stand(20));
        assert!(!can_stand(21));
        assert!(!can_stand(-1));
    }
}
