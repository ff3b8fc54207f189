//! The status's pure rules: the conditions a pass derives from what it
//! observed (`PrimaryAvailable`, not-ready, hibernated), the phase, the
//! instance list a moved primary leaves, which changes are worth a write,
//! the merge patch, and the backoff of a Redis that does not settle.
//! Table-tested; [`super`] assembles the status of a pass from them.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::v1alpha1::{InstanceStatus, MemoryStatus, Phase, RedisStatus};
use crate::controller::error::Error;
use crate::controller::layout::FENCED;
use crate::controller::queue::PROGRESS_REQUEUE;
use crate::controller::redis::facts::{Cond, PodFacts, Role};

/// The longest wait between passes of a Redis that is stuck (servers that
/// cannot be reached, a topology that does not settle).
pub const STUCK_REQUEUE_MAX: Duration = Duration::from_secs(120);

/// Identical passes at [`PROGRESS_REQUEUE`] before the backoff starts
/// (a replica's full sync has no Kubernetes event to wake the operator).
pub const PATIENT_PASSES: u32 = 5;

/// The wait before the next pass of a Redis that is not ready, after `n`
/// passes in a row that observed the same state and wrote nothing: the
/// progress interval at first, then doubling up to [`STUCK_REQUEUE_MAX`].
/// Any watch event (a pod becoming ready, a spec change) still starts a
/// pass at once; the backoff only spaces out the passes nothing asked for.
pub fn stuck_backoff(n: u32) -> Duration {
    if n < PATIENT_PASSES {
        return PROGRESS_REQUEUE;
    }
    let doublings = (n - PATIENT_PASSES + 1).min(16);
    PROGRESS_REQUEUE
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(STUCK_REQUEUE_MAX)
}

/// `PrimaryAvailable`: whether the primary accepts writes, and, after a
/// failover to it, what happened, when, and the offsets involved.
pub fn primary_condition(
    facts: &[PodFacts],
    primary: Option<&str>,
    last: Option<&crate::api::v1alpha1::FailoverRecord>,
) -> Cond {
    let Some(p) = primary else {
        return Cond::new("PrimaryAvailable", false, "NoPrimary", "no primary yet");
    };
    let Some(serving) = facts
        .iter()
        .find(|f| f.name == p && f.reachable && f.role == Some(Role::Primary))
    else {
        return Cond::new(
            "PrimaryAvailable",
            false,
            "PrimaryNotServing",
            format!("primary {p} does not answer as primary"),
        );
    };
    // The write fence is closed: the server answers every write with
    // NOREPLICAS until a replica acknowledges it again.
    if serving.good_replicas == Some(0) {
        return Cond::new(
            "PrimaryAvailable",
            false,
            FENCED,
            format!(
                "primary {p} refuses writes (NOREPLICAS): no replica acknowledged it within \
                 spec.failover.maxLagSeconds (min-replicas-to-write 1); writes resume as soon \
                 as a replica follows it again"
            ),
        );
    }
    match last.filter(|l| l.to == p) {
        Some(l) => {
            let others = if l.candidates.is_empty() {
                String::new()
            } else {
                format!("; other instances then: {}", l.candidates.join(", "))
            };
            Cond::new(
                "PrimaryAvailable",
                true,
                "FailedOver",
                format!(
                    "{p} was promoted at {} when {} was lost ({}), at replication offset {}{others}",
                    l.time, l.from, l.reason, l.offset
                ),
            )
        }
        None => Cond::new(
            "PrimaryAvailable",
            true,
            "PrimaryServing",
            format!("{p} accepts writes"),
        ),
    }
}

/// The instance list and conditions written with a new `status.primary`
/// (the rest of the status is written at the end of the pass): the new
/// primary is the only instance with the primary role (the one it replaced
/// is `unknown` until it is seen again), and a Ready condition that was
/// true becomes false (phase `Updating`), since the others still have to
/// follow the new primary. `None`: `primary` is already the recorded one.
pub fn primary_moved(
    old: &RedisStatus,
    primary: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<PrimaryMoved> {
    if old.primary.as_deref() == Some(primary) {
        return None;
    }
    let instances = old
        .instances
        .iter()
        .map(|i| {
            let mut i = i.clone();
            if i.name == primary {
                i.role = "primary".to_string();
                i.lag_bytes = None;
                i.link_up = None;
            } else if i.role == "primary" {
                i.role = "unknown".to_string();
            }
            i
        })
        .collect();
    let was_ready = old.ready();
    // Ready goes from true to false: a transition, at `now`.
    let conditions = was_ready.then(|| {
        let conditions = old
            .conditions
            .iter()
            .cloned()
            .map(|mut c| {
                if c.type_ == "Ready" {
                    c.status = "False".to_string();
                    c.reason = "PrimaryMoved".to_string();
                    c.message = format!(
                        "the primary moved to {primary}; the other instances follow it next"
                    );
                    c.observed_generation = generation;
                    c.last_transition_time = Time(now);
                }
                c
            })
            .collect();
        (conditions, Phase::Updating)
    });
    Some(PrimaryMoved {
        instances,
        conditions,
    })
}

/// The Ready condition of a Redis that is not ready: Degraded, or waiting
/// for instances (`ready` of `desired`).
pub fn not_ready_cond(degraded: bool, ready: i32, desired: i32) -> Cond {
    Cond::new(
        "Ready",
        false,
        if degraded {
            "Degraded"
        } else {
            "NotAllInstancesReady"
        },
        format!("{ready}/{desired} instances ready"),
    )
}

/// The phase of a Redis that is not Ready, not Degraded, not paused and not
/// The Ready condition of a Redis hibernated (no pod runs).
pub fn hibernated_cond() -> Cond {
    Cond::new(
        "Ready",
        false,
        "Hibernated",
        "spec.hibernate is true: no pod runs; the volumes keep the data",
    )
}

/// hibernated: Pending/Creating until it was first Ready (`old` is the
/// phase the last pass wrote), then Updating while the operator carries out
/// a change and Recovering while it waits for instances to come back.
pub fn not_ready_phase(old: Option<Phase>, no_instances: bool, changing: bool) -> Phase {
    let created = !matches!(old, None | Some(Phase::Pending | Phase::Creating));
    match (created, no_instances, changing) {
        (false, true, _) => Phase::Pending,
        (false, false, _) => Phase::Creating,
        (true, _, true) => Phase::Updating,
        (true, _, false) => Phase::Recovering,
    }
}

/// The status without replication offsets and lags (they move with every
/// write).
pub fn strip_offsets(s: &RedisStatus) -> RedisStatus {
    let mut s = s.clone();
    // Memory moves with every write too: compared apart (`memory_moved`).
    if let Some(m) = &mut s.memory {
        m.used_bytes = 0;
        m.percent = None;
        m.summary = String::new();
    }
    for i in &mut s.instances {
        i.offset = None;
        i.lag_bytes = None;
    }
    s
}

/// Offsets and lags are refreshed in the status once one has moved this far,
/// so a busy Redis does not cost a status write per reconcile.
const OFFSET_REFRESH_BYTES: u64 = 1 << 20;

/// Whether the status changed in a way worth a write: anything but the
/// replication offsets and lags, or one of those that moved by at least
/// [`OFFSET_REFRESH_BYTES`] (or appeared, or went away).
pub fn status_differs(old: &RedisStatus, new: &RedisStatus) -> bool {
    if strip_offsets(old) != strip_offsets(new) {
        return true;
    }
    let moved = |a: Option<i64>, b: Option<i64>| match (a, b) {
        (Some(x), Some(y)) => x.abs_diff(y) >= OFFSET_REFRESH_BYTES,
        (x, y) => x.is_some() != y.is_some(),
    };
    memory_moved(old.memory.as_ref(), new.memory.as_ref())
        || old
            .instances
            .iter()
            .zip(&new.instances)
            .any(|(a, b)| moved(a.offset, b.offset) || moved(a.lag_bytes, b.lag_bytes))
}

/// Whether memory use moved enough to be written: by 1 % of maxmemory, or
/// by 1 MiB without a limit.
fn memory_moved(old: Option<&MemoryStatus>, new: Option<&MemoryStatus>) -> bool {
    match (old, new) {
        (Some(a), Some(b)) => match (a.percent, b.percent) {
            (Some(x), Some(y)) => x != y,
            _ => a.used_bytes.abs_diff(b.used_bytes) >= 1 << 20,
        },
        (a, b) => a.is_some() != b.is_some(),
    }
}

/// `status.memory`: the primary's memory, or the first instance that
/// answered when there is no primary.
pub fn memory_status(facts: &[PodFacts], primary: Option<&str>) -> Option<MemoryStatus> {
    let f = facts
        .iter()
        .find(|f| Some(f.name.as_str()) == primary && f.used_memory.is_some())
        .or_else(|| facts.iter().find(|f| f.used_memory.is_some()))?;
    let used = f.used_memory? as i64;
    let max = f.maxmemory.filter(|m| *m > 0).map(|m| m as i64);
    let percent = max.map(|m| ((used as f64) * 100.0 / (m as f64)).round() as i32);
    let summary = match (max, percent) {
        (Some(m), Some(p)) => format!("{}/{} ({p}%)", mebibytes(used), mebibytes(m)),
        _ => format!("{} (no limit)", mebibytes(used)),
    };
    Some(MemoryStatus {
        instance: f.name.clone(),
        used_bytes: used,
        max_bytes: max,
        percent,
        summary,
    })
}

fn mebibytes(bytes: i64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if mib >= 10.0 {
        format!("{mib:.0}Mi")
    } else {
        format!("{mib:.1}Mi")
    }
}

/// The status as a JSON merge patch: `new`, plus an explicit `null` for
/// every field the old status had and `new` leaves out (an omitted field
/// would keep its old value on the server).
pub fn merge_patch_value(old: &RedisStatus, new: &RedisStatus) -> Result<serde_json::Value, Error> {
    let json = |s: &RedisStatus| serde_json::to_value(s).map_err(|e| Error::Serialize("status", e));
    let mut value = json(new)?;
    null_removed(&mut value, &json(old)?);
    Ok(value)
}

/// A JSON merge patch keeps what it does not name: every field the old
/// value had and the new one lacks is set to null, at every depth of the
/// objects both have (a nested field such as
/// `status.resharding.current` is removed too).
fn null_removed(new: &mut serde_json::Value, old: &serde_json::Value) {
    let (serde_json::Value::Object(map), serde_json::Value::Object(old_map)) = (new, old) else {
        return;
    };
    for (key, was) in old_map {
        match map.get_mut(key) {
            None => {
                map.insert(key.clone(), serde_json::Value::Null);
            }
            Some(now) => null_removed(now, was),
        }
    }
}

/// What [`primary_moved`] writes beside `status.primary`.
#[derive(Debug)]
pub struct PrimaryMoved {
    /// The instances with their roles as they are after the move.
    pub instances: Vec<InstanceStatus>,
    /// The conditions with Ready false, and the phase (`Updating`), when
    /// the Redis was Ready before the move; `None`: left as they are.
    pub conditions: Option<(
        Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        Phase,
    )>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::redis::facts::merge;

    fn with_instance(offset: i64, lag: i64) -> RedisStatus {
        RedisStatus {
            primary: Some("cache-0".into()),
            instances: vec![InstanceStatus {
                name: "cache-1".into(),
                role: "replica".into(),
                ready: true,
                offset: Some(offset),
                lag_bytes: Some(lag),
                link_up: Some(true),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_nested_field_removed_is_nulled_in_the_patch() {
        use crate::api::v1alpha1::{ReshardingStatus, SlotMoveIntent};
        let old = RedisStatus {
            resharding: Some(ReshardingStatus {
                current: Some(SlotMoveIntent::default()),
                ..Default::default()
            }),
            primary: Some("cache-0".into()),
            ..Default::default()
        };
        let new = RedisStatus {
            resharding: Some(ReshardingStatus::default()),
            ..Default::default()
        };
        let v = merge_patch_value(&old, &new).expect("patch");
        assert_eq!(v["resharding"]["current"], serde_json::Value::Null);
        assert!(
            v["resharding"]
                .as_object()
                .is_some_and(|m| m.contains_key("current"))
        );
        assert_eq!(v["primary"], serde_json::Value::Null);
        assert!(v.as_object().is_some_and(|m| m.contains_key("primary")));
    }

    #[test]
    fn small_offset_and_lag_moves_are_not_worth_a_write() {
        let old = with_instance(1_000, 10);
        assert!(!status_differs(&old, &with_instance(1_000, 10)));
        assert!(!status_differs(&old, &with_instance(500_000, 90_000)));
        assert!(status_differs(&old, &with_instance(3_000_000, 10)));
        assert!(status_differs(&old, &with_instance(1_000, 2_000_000)));
        let mut gone = with_instance(1_000, 10);
        gone.instances[0].lag_bytes = None;
        assert!(status_differs(&old, &gone));
        let mut other = with_instance(1_000, 10);
        other.instances[0].ready = false;
        assert!(status_differs(&old, &other));
        // Extreme values from a misbehaving server do not overflow.
        assert!(status_differs(
            &with_instance(i64::MIN, 0),
            &with_instance(i64::MAX, 0)
        ));
    }

    #[test]
    fn fields_that_went_away_are_nulled_in_the_patch() {
        let old = with_instance(1, 0);
        let new = RedisStatus::default();
        let Ok(patch) = merge_patch_value(&old, &new) else {
            panic!("status serialises")
        };
        assert_eq!(patch["primary"], serde_json::Value::Null);
        assert!(patch.as_object().is_some_and(|m| m.contains_key("primary")));
        let Ok(same) = merge_patch_value(&old, &old) else {
            panic!("status serialises")
        };
        assert_eq!(same["primary"], "cache-0");
        assert_eq!(same["instances"][0]["name"], "cache-1");
    }

    fn instance(name: &str, role: &str) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            role: role.into(),
            ready: true,
            offset: Some(84),
            lag_bytes: (role == "replica").then_some(0),
            link_up: (role == "replica").then_some(true),
        }
    }

    fn ready_status() -> RedisStatus {
        let then = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        RedisStatus {
            primary: Some("cache-0".into()),
            phase: Some(Phase::Ready),
            instances: vec![
                instance("cache-0", "primary"),
                instance("cache-1", "replica"),
                instance("cache-2", "replica"),
            ],
            conditions: merge(
                &[],
                &[
                    Cond::new("Ready", true, "AllInstancesReady", "3/3"),
                    Cond::new("Degraded", false, "AsExpected", "none"),
                ],
                Some(1),
                then,
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_moved_primary_is_the_only_primary_and_ready_drops() {
        let old = ready_status();
        let now = Timestamp::from_second(2_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let Some(moved) = primary_moved(&old, "cache-1", Some(1), now) else {
            panic!("cache-1 is not the recorded primary");
        };
        let roles: Vec<(&str, &str)> = moved
            .instances
            .iter()
            .map(|i| (i.name.as_str(), i.role.as_str()))
            .collect();
        assert_eq!(
            roles,
            [
                ("cache-0", "unknown"),
                ("cache-1", "primary"),
                ("cache-2", "replica")
            ]
        );
        assert_eq!(moved.instances[1].link_up, None, "a primary has no link");
        let Some((conds, phase)) = moved.conditions else {
            panic!("a Ready Redis whose primary moved is not Ready");
        };
        assert_eq!(phase, Phase::Updating);
        let ready = conds.iter().find(|c| c.type_ == "Ready");
        assert_eq!(
            ready.map(|c| (
                c.status.as_str(),
                c.reason.as_str(),
                c.last_transition_time.0
            )),
            Some(("False", "PrimaryMoved", now))
        );
        // The others are kept as they were, times included.
        assert_eq!(conds[1], old.conditions[1]);
    }

    #[test]
    fn a_primary_moved_while_not_ready_leaves_the_conditions() {
        let mut old = ready_status();
        old.conditions = merge(
            &[],
            &[Cond::new("Ready", false, "NotAllInstancesReady", "2/3")],
            Some(1),
            Timestamp::UNIX_EPOCH,
        );
        let Some(moved) = primary_moved(&old, "cache-2", Some(1), Timestamp::UNIX_EPOCH) else {
            panic!("cache-2 is not the recorded primary");
        };
        assert!(moved.conditions.is_none());
        assert_eq!(moved.instances[2].role, "primary");
        assert_eq!(moved.instances[0].role, "unknown");
    }

    #[test]
    fn the_recorded_primary_recorded_again_moves_nothing() {
        let old = ready_status();
        assert!(primary_moved(&old, "cache-0", Some(1), Timestamp::UNIX_EPOCH).is_none());
    }

    #[test]
    fn creating_is_only_before_the_first_ready() {
        use Phase::*;
        // (phase last written, no instance, a change in progress) -> phase
        let cases = [
            (None, true, false, Pending),
            (Some(Pending), false, false, Creating),
            (Some(Creating), false, true, Creating),
            (Some(Ready), false, false, Recovering),
            (Some(Ready), false, true, Updating),
            (Some(Recovering), false, true, Updating),
            (Some(Updating), false, false, Recovering),
            (Some(Degraded), false, false, Recovering),
            (Some(Hibernated), true, true, Updating),
            (Some(Paused), false, false, Recovering),
        ];
        for (old, empty, changing, want) in cases {
            assert_eq!(
                not_ready_phase(old, empty, changing),
                want,
                "{old:?} {empty} {changing}"
            );
        }
    }

    #[test]
    fn stuck_backoff_is_patient_then_doubles_and_caps() {
        let waits: Vec<u64> = (0..12).map(|n| stuck_backoff(n).as_secs()).collect();
        assert_eq!(waits, [2, 2, 2, 2, 2, 4, 8, 16, 32, 64, 120, 120]);
        assert_eq!(stuck_backoff(u32::MAX), STUCK_REQUEUE_MAX);
    }

    #[test]
    fn memory_is_the_primarys_and_written_only_when_it_moved() {
        let fact = |name: &str, used: u64| PodFacts {
            name: name.into(),
            used_memory: Some(used),
            maxmemory: Some(48 << 20),
            ..Default::default()
        };
        let facts = [fact("cache-0", 1 << 20), fact("cache-1", 12 << 20)];
        let m = memory_status(&facts, Some("cache-1")).expect("memory");
        assert_eq!(m.instance, "cache-1");
        assert_eq!(
            (m.used_bytes, m.max_bytes, m.percent),
            (12 << 20, Some(48 << 20), Some(25))
        );
        assert_eq!(m.summary, "12Mi/48Mi (25%)");
        // No primary: the first instance that answered.
        assert_eq!(
            memory_status(&facts, None).map(|m| m.instance),
            Some("cache-0".into())
        );
        // Less than a percent: no write; a percent: a write.
        let a = memory_status(&[fact("p", 12 << 20)], Some("p"));
        let b = memory_status(&[fact("p", (12 << 20) + (100 << 10))], Some("p"));
        let c = memory_status(&[fact("p", 13 << 20)], Some("p"));
        assert!(!memory_moved(a.as_ref(), b.as_ref()));
        assert!(memory_moved(a.as_ref(), c.as_ref()));
        assert!(memory_moved(a.as_ref(), None));
        // Without a limit: 1 MiB.
        let unlimited = |used: u64| {
            memory_status(
                &[PodFacts {
                    name: "p".into(),
                    used_memory: Some(used),
                    maxmemory: Some(0),
                    ..Default::default()
                }],
                None,
            )
        };
        assert_eq!(
            unlimited(3 << 20).map(|m| m.summary),
            Some("3.0Mi (no limit)".into())
        );
        assert!(!memory_moved(
            unlimited(3 << 20).as_ref(),
            unlimited((3 << 20) + 1000).as_ref()
        ));
        assert!(memory_moved(
            unlimited(3 << 20).as_ref(),
            unlimited(5 << 20).as_ref()
        ));
    }
}
