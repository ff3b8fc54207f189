//! Pure decisions of a Cluster Redis' ordered restart and planned
//! failover: which pod restarts next, and when a shard's slots move to
//! another of its nodes with `CLUSTER FAILOVER` (graceful: the primary
//! stops taking writes until the replica has every one of them, so no
//! acknowledged write is lost). Table-tested; the actions run in
//! [`super`].
//!
//! The ordered restart goes one pod at a time across the whole Redis, and
//! only while the cluster is healthy (every pod Ready, every slot served,
//! every shard at its instance count), so each restarted pod is proven
//! before the next goes:
//! 1. every shard's outdated replicas, shard by shard, highest ordinal
//!    first. Replicas of every shard go before any primary moves: in an
//!    upgrade, a version that fails on any shard's data is seen while every
//!    primary still runs the old one, and the upgrade can still be rolled
//!    back (an older server cannot follow a newer primary);
//! 2. then, shard by shard, when its primary is outdated, a failover to an
//!    up-to-date replica (the old primary becomes a replica and restarts
//!    as 1.);
//! 3. a shard with no replica restarts its only pod only when it has a
//!    volume (`nodes.conf` keeps its node ID and slots); without one the
//!    restart would leave its slots to an empty node, and it waits;
//! 4. a shard whose primary owns no slot yet (a new shard of a resharding
//!    that paused for the restart) restarts that primary as it is: it
//!    serves nothing, and its replica could not take over from it.
//!
//! A pod that is already down (not Ready) and outdated is not serving:
//! restarting it onto the current template costs nothing, so it does not
//! wait for a healthy cluster. This is how a bad template (an image that
//! cannot start) is undone: the user reverts the spec and the broken pods
//! come back on the old one.

use std::collections::BTreeSet;

use super::model::{Member, Plan};

/// The next action of the ordered restart or of a requested failover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roll {
    /// Nothing to do.
    Idle,
    /// Something waits; the reason, for Progressing.
    Wait(String),
    /// Delete this pod (a replica, or a pod that is down).
    Restart { pod: String, shard: i32 },
    /// Move the shard's slots to `replica` with `CLUSTER FAILOVER`.
    Failover {
        replica: String,
        primary: String,
        shard: i32,
    },
    /// Delete the only pod of a shard with a volume.
    RestartLone { pod: String, shard: i32 },
}

/// What to do about pods in `outdated` (running an older template), given
/// the cluster's `plan` and its `members`. `has_storage`: the pods keep
/// `nodes.conf` and their data across a restart.
pub fn next_restart(
    plan: &Plan,
    members: &[Member],
    outdated: &BTreeSet<String>,
    has_storage: bool,
) -> Roll {
    if outdated.is_empty() {
        return Roll::Idle;
    }
    let primaries: BTreeSet<&str> = plan
        .shards
        .iter()
        .filter_map(|s| s.primary.as_deref())
        .collect();
    // A pod that is down and serves no slots restarts at once, unless its
    // server still answers while its shard has no ready primary elsewhere:
    // then it may hold the shard's only copy of the data (a replica taking
    // over from a primary that is gone is not Ready while the cluster
    // fails), and a restart would lose it where there is no volume.
    let shard_served = |m: &Member| {
        plan.shards.iter().any(|s| {
            s.index == m.shard
                && s.primary.as_deref().is_some_and(|p| {
                    p != m.pod
                        && members
                            .iter()
                            .any(|o| o.pod == p && o.ready && !o.terminating)
                })
        })
    };
    if let Some(m) = members.iter().find(|m| {
        outdated.contains(&m.pod)
            && !m.ready
            && !m.terminating
            && !primaries.contains(m.pod.as_str())
            && (m.view.is_none() || shard_served(m))
    }) {
        return Roll::Restart {
            pod: m.pod.clone(),
            shard: m.shard,
        };
    }
    let summary = format!(
        "rolling restart: {} of {} instances run an older pod template",
        outdated.len(),
        members.len()
    );
    if !plan.healthy || members.iter().any(|m| !m.ready || m.terminating) {
        return Roll::Wait(format!(
            "{summary}; the next restart waits for every instance to be ready and every slot served"
        ));
    }
    let ordinal = |pod: &str| {
        members
            .iter()
            .find(|m| m.pod == pod)
            .map_or(i32::MAX, |m| m.ordinal)
    };
    for shard in &plan.shards {
        let mut stale: Vec<&String> = shard
            .replicas
            .iter()
            .filter(|r| outdated.contains(*r))
            .collect();
        stale.sort_by_key(|r| std::cmp::Reverse(ordinal(r)));
        if let Some(r) = stale.first() {
            return Roll::Restart {
                pod: (*r).clone(),
                shard: shard.index,
            };
        }
    }
    for shard in &plan.shards {
        let Some(primary) = shard.primary.as_deref() else {
            continue;
        };
        if !outdated.contains(primary) {
            continue;
        }
        // A primary that owns no slot (a new shard a resharding has not
        // given one yet) serves nothing and holds no key, and its replica
        // cannot take over from it (a replica fails over only from a
        // primary that owns slots): it restarts as it is.
        if shard.slots.is_empty() && !shard.replicas.is_empty() {
            return Roll::Restart {
                pod: primary.to_string(),
                shard: shard.index,
            };
        }
        let mut fresh: Vec<&String> = shard.replicas.iter().collect();
        fresh.sort_by_key(|r| ordinal(r));
        if let Some(r) = fresh.first() {
            return Roll::Failover {
                replica: (*r).clone(),
                primary: primary.to_string(),
                shard: shard.index,
            };
        }
        if has_storage {
            return Roll::RestartLone {
                pod: primary.to_string(),
                shard: shard.index,
            };
        }
        return Roll::Wait(format!(
            "{summary}; shard {}: {primary} is its only instance and has no volume, so a \
             restart would leave its slots to an empty node: it keeps its old template. \
             Neither spec.instances nor spec.storage can change on a Cluster Redis: take the \
             change back, or restore a backup into a new Cluster Redis with spec.instances \
             2 or more or with spec.storage",
            shard.index
        ));
    }
    Roll::Wait(format!(
        "{summary}; the outdated instances are not part of a shard yet"
    ))
}

/// The failover `spec.failover.switchoverTo` asks for: `to` becomes its
/// shard's primary once it is a ready replica of it, on the current
/// template (`outdated` lists the pods that are not: the ordered restart
/// takes the slots away from them), and the cluster is healthy. `Err`
/// names why `to` can never be one.
pub fn requested_failover(
    plan: &Plan,
    members: &[Member],
    outdated: &BTreeSet<String>,
    to: &str,
) -> Result<Roll, String> {
    let Some(member) = members.iter().find(|m| m.pod == to) else {
        return Err(format!(
            "spec.failover.switchoverTo: {to} is not a pod of this Redis"
        ));
    };
    let Some(shard) = plan.shards.iter().find(|s| s.index == member.shard) else {
        return Ok(Roll::Wait(format!(
            "failover to {to} (spec.failover.switchoverTo) waits for its shard to form"
        )));
    };
    match shard.primary.as_deref() {
        Some(p) if p == to => Ok(Roll::Idle),
        Some(_) if outdated.contains(to) => Ok(Roll::Wait(format!(
            "failover to {to} (spec.failover.switchoverTo) waits for the ordered restart to \
             bring it onto the current pod template"
        ))),
        Some(p) if shard.replicas.iter().any(|r| r == to) && plan.healthy && member.ready => {
            Ok(Roll::Failover {
                replica: to.to_string(),
                primary: p.to_string(),
                shard: shard.index,
            })
        }
        _ => Ok(Roll::Wait(format!(
            "failover to {to} (spec.failover.switchoverTo) waits for it to be a ready replica \
             of shard {} and every slot served",
            shard.index
        ))),
    }
}

/// The plan as it stands after `new` took shard `shard`'s slots from
/// `old` in this pass (what the status reports).
pub fn after_failover(plan: &mut Plan, shard: i32, new: &str, old: &str) {
    if let Some(s) = plan.shards.iter_mut().find(|s| s.index == shard) {
        s.primary = Some(new.to_string());
        s.primary_id = None;
        s.replicas.retain(|r| r != new);
        if !s.replicas.iter().any(|r| r == old) {
            s.replicas.push(old.to_string());
        }
        s.replicas.sort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::redis::cluster::model::Shard;

    /// A healthy 3 × `n` cluster: pods `r-s<i>-<o>`, ordinal 0 primary,
    /// each shard's primary owning a slot.
    fn cluster(n: i32) -> (Plan, Vec<Member>) {
        let mut shards = Vec::new();
        let mut members = Vec::new();
        for s in 0..3 {
            for o in 0..n {
                members.push(Member {
                    pod: format!("r-s{s}-{o}"),
                    shard: s,
                    ordinal: o,
                    ready: true,
                    ..Default::default()
                });
            }
            shards.push(Shard {
                index: s,
                primary: Some(format!("r-s{s}-0")),
                replicas: (1..n).map(|o| format!("r-s{s}-{o}")).collect(),
                slots: vec![crate::redis::cluster::SlotRange {
                    start: s as u16,
                    end: s as u16,
                }],
                pods: n as usize,
                ready: n as usize,
                ..Default::default()
            });
        }
        let plan = Plan {
            shards,
            healthy: true,
            ..Default::default()
        };
        (plan, members)
    }

    fn set(pods: &[&str]) -> BTreeSet<String> {
        pods.iter().map(|p| p.to_string()).collect()
    }

    fn restart(pod: &str, shard: i32) -> Roll {
        Roll::Restart {
            pod: pod.into(),
            shard,
        }
    }

    #[test]
    fn every_replica_restarts_first_then_each_shard_hands_over_then_its_old_primary() {
        let (mut plan, members) = cluster(3);
        let all: Vec<String> = members.iter().map(|m| m.pod.clone()).collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        // Everything outdated: shard 0 first, highest ordinal first.
        assert_eq!(
            next_restart(&plan, &members, &set(&all), false),
            restart("r-s0-2", 0)
        );
        let rest: Vec<&str> = all.iter().copied().filter(|p| *p != "r-s0-2").collect();
        assert_eq!(
            next_restart(&plan, &members, &set(&rest), false),
            restart("r-s0-1", 0)
        );
        // Shard 0's replicas done: the other shards' replicas go before
        // any primary moves.
        let rest: Vec<&str> = rest.iter().copied().filter(|p| *p != "r-s0-1").collect();
        assert_eq!(
            next_restart(&plan, &members, &set(&rest), false),
            restart("r-s1-2", 1)
        );
        // Every replica done: shard 0's primary hands over to the lowest
        // ordinal up-to-date replica.
        let rest: Vec<&str> = all.iter().copied().filter(|p| p.ends_with("-0")).collect();
        assert_eq!(
            next_restart(&plan, &members, &set(&rest), false),
            Roll::Failover {
                replica: "r-s0-1".into(),
                primary: "r-s0-0".into(),
                shard: 0
            }
        );
        // After the failover the old primary is a replica and restarts.
        plan.shards[0].primary = Some("r-s0-1".into());
        plan.shards[0].replicas = vec!["r-s0-0".into(), "r-s0-2".into()];
        assert_eq!(
            next_restart(&plan, &members, &set(&rest), false),
            restart("r-s0-0", 0)
        );
        // Then shard 1's primary hands over.
        let rest: Vec<&str> = rest
            .iter()
            .copied()
            .filter(|p| !p.starts_with("r-s0"))
            .collect();
        assert_eq!(
            next_restart(&plan, &members, &set(&rest), false),
            Roll::Failover {
                replica: "r-s1-1".into(),
                primary: "r-s1-0".into(),
                shard: 1
            }
        );
        assert_eq!(next_restart(&plan, &members, &set(&[]), false), Roll::Idle);
    }

    #[test]
    fn nothing_restarts_while_the_cluster_is_not_healthy() {
        let (mut plan, mut members) = cluster(2);
        members[3].ready = false; // r-s1-1, up to date but down
        let outdated = set(&["r-s0-1"]);
        assert!(matches!(
            next_restart(&plan, &members, &outdated, false),
            Roll::Wait(w) if w.contains("waits for every instance to be ready")
        ));
        members[3].ready = true;
        plan.healthy = false;
        assert!(matches!(
            next_restart(&plan, &members, &outdated, false),
            Roll::Wait(_)
        ));
        plan.healthy = true;
        assert_eq!(
            next_restart(&plan, &members, &outdated, false),
            restart("r-s0-1", 0)
        );
    }

    #[test]
    fn a_pod_that_is_down_and_serves_nothing_restarts_at_once() {
        // A reverted bad template: r-s1-1 never came up on it.
        let (mut plan, mut members) = cluster(2);
        members[3].ready = false;
        plan.healthy = false;
        plan.shards[1].replicas.clear();
        assert_eq!(
            next_restart(&plan, &members, &set(&["r-s1-1"]), false),
            restart("r-s1-1", 1)
        );
        // A primary that is down is never restarted by the roll: its
        // replica takes over first.
        members[2].ready = false;
        assert!(matches!(
            next_restart(&plan, &members, &set(&["r-s1-0"]), false),
            Roll::Wait(_)
        ));
    }

    #[test]
    fn a_replica_taking_over_from_a_primary_that_is_gone_is_not_restarted() {
        // Shard 1's primary pod was deleted as an upgrade rolled: its
        // replica answers (it follows the lost node and is about to take
        // over) but is not Ready while the cluster fails. Without a volume
        // it holds the shard's only copy.
        let (mut plan, mut members) = cluster(2);
        plan.healthy = false;
        plan.shards[1].primary = None;
        members.retain(|m| m.pod != "r-s1-0");
        let replica = members
            .iter_mut()
            .find(|m| m.pod == "r-s1-1")
            .expect("r-s1-1");
        replica.ready = false;
        replica.view = Some(super::super::model::View::default());
        let outdated = set(&["r-s0-1", "r-s1-1", "r-s2-1"]);
        assert!(matches!(
            next_restart(&plan, &members, &outdated, false),
            Roll::Wait(_)
        ));
        // Once it took over, it is the shard's primary and is not
        // restarted until the cluster is healthy and a replica took over.
        plan.shards[1].primary = Some("r-s1-1".into());
        assert!(matches!(
            next_restart(&plan, &members, &outdated, false),
            Roll::Wait(_)
        ));
        // A down replica of a shard whose primary serves restarts at once
        // even when its server answers (it holds nothing the primary lacks).
        let (mut plan, mut members) = cluster(2);
        plan.healthy = false;
        members[3].ready = false;
        members[3].view = Some(super::super::model::View::default());
        assert_eq!(
            next_restart(&plan, &members, &set(&["r-s1-1"]), false),
            restart("r-s1-1", 1)
        );
    }

    #[test]
    fn a_primary_that_owns_no_slot_restarts_without_a_failover() {
        // A new shard 3 whose resharding paused for the roll before it got
        // a slot (found by the composition harness, seeds 13 and 26: the
        // failover to its replica never completed, and the roll and the
        // resharding waited on each other for good).
        let (mut plan, mut members) = cluster(2);
        plan.shards.push(Shard {
            index: 3,
            primary: Some("r-s3-0".into()),
            replicas: vec!["r-s3-1".into()],
            pods: 2,
            ready: 2,
            ..Default::default()
        });
        for o in 0..2 {
            members.push(Member {
                pod: format!("r-s3-{o}"),
                shard: 3,
                ordinal: o,
                ready: true,
                ..Default::default()
            });
        }
        assert_eq!(
            next_restart(&plan, &members, &set(&["r-s3-0"]), false),
            restart("r-s3-0", 3)
        );
        // A primary that owns slots still hands over first.
        assert_eq!(
            next_restart(&plan, &members, &set(&["r-s2-0"]), false),
            Roll::Failover {
                replica: "r-s2-1".into(),
                primary: "r-s2-0".into(),
                shard: 2
            }
        );
    }

    #[test]
    fn a_lone_primary_restarts_only_with_a_volume() {
        let (plan, members) = cluster(1);
        let outdated = set(&["r-s2-0"]);
        assert!(matches!(
            next_restart(&plan, &members, &outdated, false),
            Roll::Wait(w) if w.contains("no volume")
        ));
        assert_eq!(
            next_restart(&plan, &members, &outdated, true),
            Roll::RestartLone {
                pod: "r-s2-0".into(),
                shard: 2
            }
        );
    }

    #[test]
    fn a_requested_failover_waits_for_a_ready_replica_of_its_shard() {
        let (mut plan, mut members) = cluster(2);
        assert_eq!(
            requested_failover(&plan, &members, &set(&[]), "r-s1-1"),
            Ok(Roll::Failover {
                replica: "r-s1-1".into(),
                primary: "r-s1-0".into(),
                shard: 1
            })
        );
        // Already the primary: nothing.
        assert_eq!(
            requested_failover(&plan, &members, &set(&[]), "r-s1-0"),
            Ok(Roll::Idle)
        );
        // Not ready, or the cluster not healthy: it waits.
        members[3].ready = false;
        assert!(matches!(
            requested_failover(&plan, &members, &set(&[]), "r-s1-1"),
            Ok(Roll::Wait(_))
        ));
        members[3].ready = true;
        plan.healthy = false;
        assert!(matches!(
            requested_failover(&plan, &members, &set(&[]), "r-s1-1"),
            Ok(Roll::Wait(_))
        ));
        // Outdated (the ordered restart is under way): it waits, or the
        // failover and the restart would hand the slots back and forth.
        assert!(matches!(
            requested_failover(&plan, &members, &set(&["r-s1-1"]), "r-s1-1"),
            Ok(Roll::Wait(w)) if w.contains("ordered restart")
        ));
        // Not a pod of this Redis: an error naming the field.
        assert!(
            requested_failover(&plan, &members, &set(&[]), "other-0")
                .is_err_and(|e| e.contains("spec.failover.switchoverTo"))
        );
    }

    #[test]
    fn the_status_follows_a_failover_of_this_pass() {
        let (mut plan, _) = cluster(3);
        after_failover(&mut plan, 2, "r-s2-1", "r-s2-0");
        assert_eq!(plan.shards[2].primary.as_deref(), Some("r-s2-1"));
        assert_eq!(plan.shards[2].replicas, vec!["r-s2-0", "r-s2-2"]);
        assert_eq!(plan.shards[1].primary.as_deref(), Some("r-s1-0"));
    }
}
