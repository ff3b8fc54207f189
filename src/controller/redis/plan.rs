//! Pure decisions: who is primary, what to restart next. Table-tested.

use super::facts::ordinal_of;
use super::facts::{PodFacts, Role, ordinal};
use crate::controller::names::Names;

/// Chooses the primary:
/// 1. what the servers say: the one reachable primary that linked replicas
///    follow (after a switchover this is the new primary, whatever the
///    record says);
/// 2. else the recorded intent (`status.targetPrimary`) when that server
///    answers as primary: a promotion happened but its publication did not
///    (the operator stopped in between);
/// 3. else the recorded primary, while its pod exists (a restarting primary
///    is waited for, not replaced: failover is a separate decision);
/// 4. else the reachable primary with data and the highest offset (ties:
///    lowest ordinal), not being deleted;
/// 5. else ordinal 0, once it exists, is not being deleted and is not a
///    replica (a replica is never made primary by default: only recovery
///    promotes one, deliberately; Replication instances boot as replicas, so
///    a new Redis gets its first primary from recovery too).
///
/// A replica whose link is down never decides anything: it may follow an
/// address that no longer exists.
pub fn choose_primary(
    facts: &[PodFacts],
    recorded: Option<&str>,
    target: Option<&str>,
    names: &Names,
) -> Option<String> {
    if let Some(p) = followed_primary(facts) {
        return Some(p);
    }
    if let Some(t) = target
        && facts
            .iter()
            .any(|f| f.name == t && f.reachable && f.role == Some(Role::Primary) && !f.terminating)
    {
        return Some(t.to_string());
    }
    if let Some(r) = recorded
        && facts.iter().any(|f| f.name == r)
    {
        return Some(r.to_string());
    }
    let mut primaries: Vec<&PodFacts> = facts
        .iter()
        .filter(|f| f.reachable && f.role == Some(Role::Primary) && !f.terminating)
        .collect();
    primaries.sort_by_key(|f| {
        (
            std::cmp::Reverse(f.offset.unwrap_or(0)),
            ordinal(&f.name, names).unwrap_or(i32::MAX),
        )
    });
    if let Some(best) = primaries.first()
        && best.offset.unwrap_or(0) > 0
    {
        return Some(best.name.clone());
    }
    let first = names.pod(0);
    facts
        .iter()
        .any(|f| f.name == first && !f.terminating && f.role != Some(Role::Replica))
        .then_some(first)
}

/// The reachable primary followed by linked replicas, when exactly one
/// primary has such followers.
fn followed_primary(facts: &[PodFacts]) -> Option<String> {
    let mut found: Option<&PodFacts> = None;
    for p in facts
        .iter()
        .filter(|f| f.reachable && f.role == Some(Role::Primary))
    {
        let Some(ip) = p.ip.as_deref() else { continue };
        let followed = facts.iter().any(|r| {
            r.reachable
                && r.role == Some(Role::Replica)
                && r.link_up == Some(true)
                && r.following.as_deref() == Some(ip)
        });
        if followed {
            if found.is_some() {
                return None;
            }
            found = Some(p);
        }
    }
    found.map(|p| p.name.clone())
}

/// The role label a pod should carry.
pub fn role_label(f: &PodFacts, primary: Option<&str>) -> &'static str {
    if Some(f.name.as_str()) == primary && f.role != Some(Role::Replica) {
        "primary"
    } else if f.role == Some(Role::Replica) {
        "replica"
    } else {
        "unknown"
    }
}

/// The ready, linked replica furthest ahead among those `eligible` (ties:
/// lowest ordinal).
pub fn best_replica(facts: &[PodFacts], eligible: impl Fn(&PodFacts) -> bool) -> Option<String> {
    facts
        .iter()
        .filter(|f| {
            f.ready
                && f.reachable
                && !f.terminating
                && f.role == Some(Role::Replica)
                && f.link_up == Some(true)
        })
        .filter(|f| eligible(f))
        .max_by_key(|f| {
            (
                f.offset.unwrap_or(0),
                std::cmp::Reverse(ordinal_of(&f.name).unwrap_or(0)),
            )
        })
        .map(|f| f.name.clone())
}

/// The reachable instance with the highest replication offset (ties: lowest
/// ordinal): the one that has lost the least when no primary is left.
pub fn most_advanced(facts: &[PodFacts]) -> Option<String> {
    facts
        .iter()
        .filter(|f| f.reachable && !f.terminating)
        .max_by_key(|f| {
            (
                f.offset.unwrap_or(0),
                std::cmp::Reverse(ordinal_of(&f.name).unwrap_or(0)),
            )
        })
        .map(|f| f.name.clone())
}

/// Whom recovery promotes in a new Redis (no recorded primary; every
/// instance booted as a replica), once no server is primary and no replica
/// has a live link: it waits for ordinal 0, so a new Redis always starts
/// with the same primary, then takes the reachable instance furthest ahead
/// ([`most_advanced`]). A lost recorded primary is replaced by the failover
/// module instead. `Err` names what recovery waits for.
///
/// A Redis being bootstrapped from a backup promotes ordinal 0, whatever
/// the others hold: it is the one the backup was restored into, and an
/// instance ahead of it holds data from a retained volume of an older
/// object, which the restore must replace (the others resync from it).
pub fn promotion_candidate(
    facts: &[PodFacts],
    names: &Names,
    restoring: bool,
) -> Result<String, String> {
    let first = names.pod(0);
    if !facts
        .iter()
        .any(|f| f.name == first && f.reachable && !f.terminating)
    {
        return Err(format!("waiting for {first} to start"));
    }
    if restoring {
        return Ok(first);
    }
    most_advanced(facts).ok_or_else(|| "no reachable instance to promote".to_string())
}

/// What to restart next in a rolling restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restart {
    /// An outdated replica.
    Replica(String),
    /// Only the primary is outdated: switch over to `target` first.
    PrimaryAfterSwitchover {
        /// An up-to-date replica.
        target: String,
    },
    /// The primary is the only instance.
    Primary,
}

/// Replicas first (highest ordinal first), then the primary.
pub fn next_to_restart(facts: &[PodFacts], primary: &str, names: &Names) -> Option<Restart> {
    let replica = facts
        .iter()
        .filter(|f| f.outdated && f.name != primary)
        .max_by_key(|f| ordinal(&f.name, names).unwrap_or(0));
    if let Some(r) = replica {
        return Some(Restart::Replica(r.name.clone()));
    }
    let p = facts.iter().find(|f| f.name == primary)?;
    if !p.outdated {
        return None;
    }
    if facts.len() == 1 {
        return Some(Restart::Primary);
    }
    best_replica(facts, |f| !f.outdated).map(|target| Restart::PrimaryAfterSwitchover { target })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names::new("cache")
    }

    fn pod(i: i32, role: Option<Role>, following: Option<&str>, offset: i64) -> PodFacts {
        PodFacts {
            name: format!("cache-{i}"),
            ip: Some(format!("10.0.0.{i}")),
            ready: true,
            reachable: true,
            role,
            following: following.map(String::from),
            link_up: (role == Some(Role::Replica)).then_some(true),
            offset: Some(offset),
            ..Default::default()
        }
    }

    #[test]
    fn fresh_instances_elect_ordinal_zero() {
        let facts = vec![
            pod(0, Some(Role::Primary), None, 0),
            pod(1, Some(Role::Primary), None, 0),
            pod(2, Some(Role::Primary), None, 0),
        ];
        assert_eq!(
            choose_primary(&facts, None, None, &names()),
            Some("cache-0".into())
        );
    }

    #[test]
    fn replica_with_a_dead_link_does_not_outvote_the_followed_primary() {
        // After a switchover cache-1 leads; cache-0 restarted and follows a
        // stale address with its link down; the record still says cache-0.
        let mut facts = vec![
            pod(0, Some(Role::Replica), Some("10.0.0.99"), 0),
            pod(1, Some(Role::Primary), None, 500),
            pod(2, Some(Role::Replica), Some("10.0.0.1"), 500),
        ];
        facts[0].link_up = Some(false);
        assert_eq!(
            choose_primary(&facts, Some("cache-0"), None, &names()),
            Some("cache-1".into())
        );
    }

    #[test]
    fn two_followed_primaries_fall_back_to_the_record() {
        let facts = vec![
            pod(0, Some(Role::Primary), None, 10),
            pod(1, Some(Role::Replica), Some("10.0.0.0"), 10),
            pod(2, Some(Role::Primary), None, 10),
            pod(3, Some(Role::Replica), Some("10.0.0.2"), 10),
        ];
        assert_eq!(
            choose_primary(&facts, Some("cache-2"), None, &names()),
            Some("cache-2".into())
        );
    }

    #[test]
    fn recorded_primary_is_kept_while_its_pod_exists() {
        let mut facts = vec![
            pod(0, Some(Role::Replica), Some("10.0.0.1"), 10),
            pod(1, Some(Role::Primary), None, 10),
        ];
        facts[1].reachable = false;
        facts[0].reachable = false;
        assert_eq!(
            choose_primary(&facts, Some("cache-1"), None, &names()),
            Some("cache-1".into())
        );
    }

    #[test]
    fn servers_agreeing_on_a_new_primary_win_over_the_record() {
        let facts = vec![
            pod(0, Some(Role::Replica), Some("10.0.0.2"), 50),
            pod(1, Some(Role::Replica), Some("10.0.0.2"), 50),
            pod(2, Some(Role::Primary), None, 50),
        ];
        assert_eq!(
            choose_primary(&facts, Some("cache-0"), None, &names()),
            Some("cache-2".into())
        );
    }

    #[test]
    fn an_unpublished_promotion_is_found_from_the_recorded_intent() {
        // cache-1 was promoted, then the operator stopped before publishing
        // it: the record still names cache-0, which restarted fenced, and
        // cache-2 still follows cache-0's address with its link down.
        let mut facts = vec![
            pod(0, Some(Role::Replica), Some("127.0.0.1"), 0),
            pod(1, Some(Role::Primary), None, 500),
            pod(2, Some(Role::Replica), Some("10.0.0.0"), 500),
        ];
        facts[0].link_up = Some(false);
        facts[2].link_up = Some(false);
        assert_eq!(
            choose_primary(&facts, Some("cache-0"), Some("cache-1"), &names()),
            Some("cache-1".into())
        );
        // Without the intent the record wins and nothing moves.
        assert_eq!(
            choose_primary(&facts, Some("cache-0"), None, &names()),
            Some("cache-0".into())
        );
        // An intent whose server never became primary changes nothing.
        assert_eq!(
            choose_primary(&facts, Some("cache-0"), Some("cache-2"), &names()),
            Some("cache-0".into())
        );
    }

    #[test]
    fn a_new_redis_promotes_ordinal_zero_once_it_answers() {
        let mut facts = vec![
            pod(0, Some(Role::Replica), Some("127.0.0.1"), 0),
            pod(1, Some(Role::Replica), Some("127.0.0.1"), 0),
        ];
        for f in &mut facts {
            f.link_up = Some(false);
        }
        assert_eq!(choose_primary(&facts, None, None, &names()), None);
        facts[0].reachable = false;
        assert_eq!(
            promotion_candidate(&facts, &names(), false),
            Err("waiting for cache-0 to start".into())
        );
        facts[0].reachable = true;
        assert_eq!(
            promotion_candidate(&facts, &names(), false),
            Ok("cache-0".into())
        );
        // Once ordinal 0 answers, the instance furthest ahead is taken.
        facts[1].offset = Some(40);
        assert_eq!(
            promotion_candidate(&facts, &names(), false),
            Ok("cache-1".into())
        );
        // Restoring a backup: ordinal 0 holds it, an instance ahead holds a
        // retained volume's older object.
        assert_eq!(
            promotion_candidate(&facts, &names(), true),
            Ok("cache-0".into())
        );
        facts[0].reachable = false;
        assert!(promotion_candidate(&facts, &names(), true).is_err());
    }

    #[test]
    fn without_record_the_primary_with_data_is_kept() {
        let facts = vec![
            pod(0, Some(Role::Primary), None, 0),
            pod(1, Some(Role::Primary), None, 900),
        ];
        assert_eq!(
            choose_primary(&facts, None, None, &names()),
            Some("cache-1".into())
        );
    }

    #[test]
    fn a_primary_being_deleted_stays_primary_and_is_never_replaced_by_default() {
        // cache-1 leads and its pod is being deleted: still the primary while
        // replicas follow it, and while the record names it.
        let mut facts = vec![
            pod(0, Some(Role::Replica), Some("10.0.0.1"), 70),
            pod(1, Some(Role::Primary), None, 70),
            pod(2, Some(Role::Replica), Some("10.0.0.1"), 70),
        ];
        facts[1].terminating = true;
        assert_eq!(
            choose_primary(&facts, Some("cache-1"), None, &names()),
            Some("cache-1".into())
        );
        // Stopped, links down, no record: ordinal 0 is a replica and is not
        // chosen by default; nothing is.
        facts[1].reachable = false;
        facts[1].role = None;
        for i in [0, 2] {
            facts[i].link_up = Some(false);
        }
        assert_eq!(choose_primary(&facts, None, None, &names()), None);
        // Neither promotion nor switchover picks a pod being deleted.
        facts[0].terminating = true;
        assert_eq!(most_advanced(&facts), Some("cache-2".into()));
        facts[2].link_up = Some(true);
        facts[0].link_up = Some(true);
        assert_eq!(best_replica(&facts, |_| true), Some("cache-2".into()));
    }

    #[test]
    fn no_pods_no_primary() {
        assert_eq!(choose_primary(&[], None, None, &names()), None);
    }

    #[test]
    fn restarts_replicas_highest_first_then_primary_after_switchover() {
        let mut facts = vec![
            pod(0, Some(Role::Primary), None, 100),
            pod(1, Some(Role::Replica), Some("10.0.0.0"), 100),
            pod(2, Some(Role::Replica), Some("10.0.0.0"), 100),
        ];
        for f in &mut facts {
            f.outdated = true;
        }
        assert_eq!(
            next_to_restart(&facts, "cache-0", &names()),
            Some(Restart::Replica("cache-2".into()))
        );
        facts[2].outdated = false;
        assert_eq!(
            next_to_restart(&facts, "cache-0", &names()),
            Some(Restart::Replica("cache-1".into()))
        );
        facts[1].outdated = false;
        assert_eq!(
            next_to_restart(&facts, "cache-0", &names()),
            Some(Restart::PrimaryAfterSwitchover {
                target: "cache-1".into()
            })
        );
        facts[0].outdated = false;
        assert_eq!(next_to_restart(&facts, "cache-0", &names()), None);
    }

    #[test]
    fn standalone_primary_restarts_directly() {
        let mut facts = vec![pod(0, Some(Role::Primary), None, 1)];
        facts[0].outdated = true;
        assert_eq!(
            next_to_restart(&facts, "cache-0", &names()),
            Some(Restart::Primary)
        );
    }

    #[test]
    fn best_replica_prefers_offset_then_lowest_ordinal() {
        let facts = vec![
            pod(0, Some(Role::Primary), None, 100),
            pod(1, Some(Role::Replica), Some("10.0.0.0"), 90),
            pod(2, Some(Role::Replica), Some("10.0.0.0"), 100),
            pod(3, Some(Role::Replica), Some("10.0.0.0"), 100),
        ];
        assert_eq!(best_replica(&facts, |_| true), Some("cache-2".into()));
        assert_eq!(
            best_replica(&facts, |f| f.name == "cache-1"),
            Some("cache-1".into())
        );
    }

    #[test]
    fn most_advanced_prefers_offset_then_lowest_ordinal() {
        let mut facts = vec![
            pod(0, Some(Role::Replica), Some("10.9.9.9"), 40),
            pod(1, Some(Role::Replica), Some("10.9.9.9"), 70),
            pod(2, Some(Role::Replica), Some("10.9.9.9"), 70),
        ];
        assert_eq!(most_advanced(&facts), Some("cache-1".into()));
        facts[1].reachable = false;
        assert_eq!(most_advanced(&facts), Some("cache-2".into()));
    }

    #[test]
    fn role_labels() {
        let p = pod(0, Some(Role::Primary), None, 1);
        let r = pod(1, Some(Role::Replica), Some("10.0.0.0"), 1);
        let u = PodFacts {
            name: "cache-2".into(),
            ..Default::default()
        };
        assert_eq!(role_label(&p, Some("cache-0")), "primary");
        assert_eq!(role_label(&r, Some("cache-0")), "replica");
        assert_eq!(role_label(&u, Some("cache-0")), "unknown");
        assert_eq!(role_label(&p, Some("cache-1")), "unknown");
    }
}
