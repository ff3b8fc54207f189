use std::time::Duration;

use super::*;

fn names() -> Names {
    Names::new("c")
}

fn primary(i: i32) -> PodFacts {
    PodFacts {
        name: format!("c-{i}"),
        ip: Some(format!("10.0.0.{i}")),
        ready: true,
        reachable: true,
        role: Some(Role::Primary),
        offset: Some(1000),
        ..Default::default()
    }
}

/// A replica of `c-0` whose link is up (`age` seconds since the last byte)
/// or down for `age` seconds.
fn replica(i: i32, offset: i64, up: bool, age: i64) -> PodFacts {
    PodFacts {
        name: format!("c-{i}"),
        ip: Some(format!("10.0.0.{i}")),
        ready: true,
        reachable: true,
        role: Some(Role::Replica),
        following: Some("10.0.0.0".into()),
        link_up: Some(up),
        link_age: Some(age),
        offset: Some(offset),
        ..Default::default()
    }
}

/// `c-<i>` restarted in place at `offset`: it boots following nothing.
fn restarted(i: i32, offset: i64) -> PodFacts {
    let mut r = replica(i, offset, false, 0);
    r.link_age = None;
    r.following = Some("127.0.0.1".into());
    r
}

fn lost(mut f: PodFacts) -> PodFacts {
    f.reachable = false;
    f.role = None;
    f.offset = None;
    f
}

fn health(verdict: Verdict, silent: u64) -> Health {
    Health {
        pod: "c-0".into(),
        ip: "10.0.0.0".into(),
        verdict,
        silent_for: Duration::from_secs(silent),
        since_answer: Duration::from_secs(silent),
        noticed_after: None,
        answered: true,
    }
}

fn on() -> FailoverSpec {
    FailoverSpec::default()
}

fn promote(c: &str, loss: Loss) -> Decision {
    Decision::Promote {
        candidate: c.into(),
        loss,
    }
}

#[test]
fn a_serving_primary_is_left_alone() {
    let facts = [primary(0), replica(1, 1000, true, 0)];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        Decision::Serving
    );
    // Even when the monitor had doubts: the pass saw it serve.
    let h = health(Verdict::Silent, 60);
    assert_eq!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        Decision::Serving
    );
}

#[test]
fn a_dead_primary_is_replaced_by_the_replica_furthest_ahead() {
    let facts = [
        lost(primary(0)),
        replica(1, 900, false, 1),
        replica(2, 950, false, 1),
    ];
    let h = health(Verdict::Down, 0);
    assert_eq!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        promote("c-2", Loss::Down)
    );
}

#[test]
fn a_primary_restarted_as_a_replica_or_gone_is_replaced_at_once() {
    let mut restarted = replica(0, 0, false, 0);
    restarted.link_age = None;
    restarted.following = Some("127.0.0.1".into());
    let facts = [
        restarted,
        replica(1, 900, false, 0),
        replica(2, 800, false, 0),
    ];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        promote("c-1", Loss::Restarted)
    );
    let facts = [replica(1, 900, false, 0), replica(2, 800, false, 0)];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        promote("c-1", Loss::Gone)
    );
    // Re-created, no address yet.
    let mut fresh = lost(primary(0));
    fresh.ip = None;
    let facts = [fresh, replica(1, 900, false, 0)];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        promote("c-1", Loss::Gone)
    );
}

#[test]
fn a_silent_primary_is_replaced_only_after_the_fencing_bound() {
    let facts = [
        lost(primary(0)),
        replica(1, 900, true, 4),
        replica(2, 950, true, 4),
    ];
    // maxLagSeconds 2: the bound is 5 s.
    let early = health(Verdict::Silent, 4);
    assert!(matches!(
        decide(&facts, "c-0", Some(&early), &on(), &names()),
        Decision::Wait(w) if w.contains("after 5s")
    ));
    let late = health(Verdict::Silent, 5);
    assert_eq!(
        decide(&facts, "c-0", Some(&late), &on(), &names()),
        promote("c-2", Loss::Unresponsive)
    );
    let slow = FailoverSpec {
        max_lag_seconds: 10,
        ..on()
    };
    assert!(matches!(
        decide(&facts, "c-0", Some(&late), &slow, &names()),
        Decision::Wait(_)
    ));
    // Nothing known yet about an unreachable primary: wait.
    assert!(matches!(
        decide(&facts, "c-0", None, &on(), &names()),
        Decision::Wait(_)
    ));
}

#[test]
fn no_failover_while_a_replica_still_hears_from_the_primary() {
    // Only the operator is cut off: the replica had a byte a second ago.
    let facts = [lost(primary(0)), replica(1, 900, true, 1)];
    let h = health(Verdict::Silent, 30);
    assert!(matches!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        Decision::Wait(w) if w.contains("c-1 still hears")
    ));
}

#[test]
fn the_live_link_bound_follows_max_lag() {
    // maxLagSeconds 10: a byte 8 s ago may still count as an
    // acknowledgement that keeps the primary's fence open.
    let slow = FailoverSpec {
        max_lag_seconds: 10,
        ..on()
    };
    let facts = [lost(primary(0)), replica(1, 900, true, 8)];
    let h = health(Verdict::Silent, 30);
    assert!(matches!(
        decide(&facts, "c-0", Some(&h), &slow, &names()),
        Decision::Wait(w) if w.contains("c-1 still hears")
    ));
    // With the default 2 s, 8 s of quiet is a dead link.
    assert_eq!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        promote("c-1", Loss::Unresponsive)
    );
    assert!(live_link(2, &on()) && !live_link(3, &on()));
    assert!(live_link(
        60,
        &FailoverSpec {
            max_lag_seconds: 90,
            ..on()
        }
    ));
}

#[test]
fn a_silent_primary_is_not_replaced_while_a_replica_the_operator_cannot_see_may_feed_its_fence() {
    let h = health(Verdict::Silent, 30);
    // 5 instances split {operator, c-1, c-2} | {c-0, c-3, c-4}: c-3 and c-4
    // may keep acknowledging c-0, which then keeps taking writes.
    let facts = [
        lost(primary(0)),
        replica(1, 900, false, 30),
        replica(2, 950, false, 30),
        lost(replica(3, 0, false, 0)),
        lost(replica(4, 0, false, 0)),
    ];
    assert!(matches!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        Decision::Wait(w) if w.contains("c-3, c-4") && w.contains("fence")
    ));
    // 3 instances split {operator, c-1} | {c-0, c-2}: the same.
    let three = [
        lost(primary(0)),
        replica(1, 900, false, 30),
        lost(replica(2, 0, false, 0)),
    ];
    assert!(matches!(
        decide(&three, "c-0", Some(&h), &on(), &names()),
        Decision::Wait(_)
    ));
    // A pod without an address cannot feed anything.
    let mut gone = lost(replica(2, 0, false, 0));
    gone.ip = None;
    let facts = [lost(primary(0)), replica(1, 900, false, 30), gone];
    assert_eq!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        promote("c-1", Loss::Unresponsive)
    );
    // A primary known down (nothing listens), gone or restarted takes no
    // writes whatever its replicas do: replaced at once.
    let down = health(Verdict::Down, 0);
    assert_eq!(
        decide(&three, "c-0", Some(&down), &on(), &names()),
        promote("c-1", Loss::Down)
    );
    // Without the fence the user chose availability: the old rule.
    let unfenced = FailoverSpec {
        fence: false,
        ..on()
    };
    assert_eq!(
        decide(&three, "c-0", Some(&h), &unfenced, &names()),
        promote("c-1", Loss::Unresponsive)
    );
}

#[test]
fn a_health_report_about_another_pod_or_address_is_ignored() {
    let facts = [lost(primary(0)), replica(1, 900, false, 1)];
    let mut h = health(Verdict::Down, 0);
    h.ip = "10.9.9.9".into();
    assert!(matches!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        Decision::Wait(_)
    ));
}

#[test]
fn the_replica_linked_most_recently_wins_over_a_higher_stale_offset() {
    // c-1 lost its link 60 s ago (its offset is from another history or
    // older): c-2, linked until the failure, is promoted.
    let facts = [
        lost(primary(0)),
        replica(1, 5000, false, 60),
        replica(2, 950, false, 1),
        replica(3, 940, false, 0),
    ];
    assert_eq!(candidate(&facts, "c-0", &names()), Some("c-2".into()));
    // A replica in a full sync, or being deleted, is never promoted.
    let mut syncing = replica(2, 950, false, 1);
    syncing.syncing = true;
    let mut leaving = replica(3, 940, false, 0);
    leaving.terminating = true;
    let facts = [lost(primary(0)), syncing, leaving];
    assert_eq!(candidate(&facts, "c-0", &names()), None);
    // Equal offsets: the lowest ordinal.
    let facts = [replica(2, 950, false, 0), replica(1, 950, false, 0)];
    assert_eq!(candidate(&facts, "c-0", &names()), Some("c-1".into()));
}

#[test]
fn no_candidate_is_reported_not_guessed() {
    let facts = [lost(primary(0)), lost(replica(1, 0, false, 0))];
    let h = health(Verdict::Down, 0);
    assert!(matches!(
        decide(&facts, "c-0", Some(&h), &on(), &names()),
        Decision::Blocked(w) if w.contains("no replica")
    ));
}

#[test]
fn with_failover_off_only_the_user_or_a_lossless_restart_promotes() {
    let off = FailoverSpec {
        enabled: false,
        ..on()
    };
    let h = health(Verdict::Down, 0);
    let facts = [lost(primary(0)), replica(1, 900, false, 0)];
    assert!(matches!(
        decide(&facts, "c-0", Some(&h), &off, &names()),
        Decision::Blocked(w) if w.contains("spec.failover.switchoverTo")
    ));
    let named = FailoverSpec {
        switchover_to: Some("c-1".into()),
        ..off.clone()
    };
    assert_eq!(
        decide(&facts, "c-0", Some(&h), &named, &names()),
        promote("c-1", Loss::Down)
    );
    // The primary came back with everything it had: it is primary again.
    let mut back = replica(0, 900, false, 0);
    back.link_age = None;
    let facts = [back.clone(), replica(1, 900, false, 0)];
    assert_eq!(
        decide(&facts, "c-0", None, &off, &names()),
        promote("c-0", Loss::Restarted)
    );
    // It came back behind a replica: that would lose writes.
    back.offset = Some(10);
    let facts = [back, replica(1, 900, false, 0)];
    assert!(matches!(
        decide(&facts, "c-0", None, &off, &names()),
        Decision::Blocked(_)
    ));
}

#[test]
fn a_primary_whose_pod_is_deleted_hands_over_to_an_in_sync_replica() {
    let mut p = primary(0);
    p.terminating = true;
    // The ready replica with a live link and the highest offset.
    let facts = [
        p.clone(),
        replica(2, 900, true, 0),
        replica(1, 1000, true, 0),
    ];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        Decision::Handover { to: "c-1".into() }
    );
    // No replica with a live link: the shutdown is waited for, and the
    // primary replaced once nothing listens.
    let facts = [p.clone(), replica(1, 1000, false, 3)];
    assert!(matches!(
        decide(&facts, "c-0", None, &on(), &names()),
        Decision::Wait(w) if w.contains("shutting down")
    ));
    // A replica leaving too is no target.
    let mut leaving = replica(1, 1000, true, 0);
    leaving.terminating = true;
    assert!(matches!(
        decide(&[p.clone(), leaving], "c-0", None, &on(), &names()),
        Decision::Wait(_)
    ));
    // Automatic failover off: nothing moves by itself.
    let off = FailoverSpec {
        enabled: false,
        ..on()
    };
    assert!(matches!(
        decide(&[p, replica(1, 1000, true, 0)], "c-0", None, &off, &names()),
        Decision::Wait(w) if w.contains("shutting down")
    ));
}

#[test]
fn fencing_is_on_for_replication_with_replicas_only() {
    use crate::api::v1alpha1::RedisSpec;
    use crate::controller::redis::build::test_redis;
    let get = |spec: RedisSpec| {
        fencing_config(&test_redis(spec))
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let repl = RedisSpec {
        mode: Some(Mode::Replication),
        ..Default::default()
    };
    assert_eq!(
        get(repl.clone()),
        "repl-ping-replica-period=1 min-replicas-max-lag=2 repl-timeout=2 min-replicas-to-write=1"
    );
    let single = RedisSpec {
        instances: Some(1),
        ..repl.clone()
    };
    assert!(get(single).ends_with("min-replicas-to-write=0"));
    let unfenced = RedisSpec {
        failover: Some(FailoverSpec {
            fence: false,
            ..on()
        }),
        ..repl.clone()
    };
    assert!(get(unfenced).ends_with("min-replicas-to-write=0"));
    let lag = RedisSpec {
        failover: Some(FailoverSpec {
            max_lag_seconds: 7,
            ..on()
        }),
        ..repl
    };
    assert!(get(lag).contains("min-replicas-max-lag=7 repl-timeout=7"));
    assert_eq!(
        silence_bound(&FailoverSpec::default()),
        Duration::from_secs(5)
    );
}

#[test]
fn a_restarted_primary_is_not_brought_back_while_a_replica_that_may_be_ahead_does_not_answer() {
    // c-0 restarted empty (it boots following nothing); c-1, its replica
    // with every write, is cut off from the operator.
    let restarted = restarted(0, 1);
    let facts = [restarted.clone(), lost(replica(1, 900, false, 0))];
    let d = decide(&facts, "c-0", None, &on(), &names());
    let Decision::Wait(why) = &d else {
        panic!("expected a wait, got {d:?}");
    };
    assert!(why.contains("c-1 does not answer"), "{why}");
    // Once c-1 answers it takes over.
    let facts = [restarted.clone(), replica(1, 900, false, 8)];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        promote("c-1", Loss::Restarted)
    );
    // Gone (no address: its pod is being made again) it holds nothing:
    // the restarted server comes back.
    let mut gone = lost(replica(1, 900, false, 0));
    gone.ip = None;
    let facts = [restarted, gone];
    assert_eq!(
        decide(&facts, "c-0", None, &on(), &names()),
        promote("c-0", Loss::Restarted)
    );
}

#[test]
fn a_restarted_primary_is_not_brought_back_behind_an_instance_that_answers_further_ahead() {
    // c-1 restarted empty (offset 1); c-0, the old primary back from a
    // cut with every write, answers but cannot take over yet (it is in a
    // sync that cannot finish).
    let restarted = restarted(1, 1);
    let mut ahead = replica(0, 345_000, false, 0);
    ahead.syncing = true;
    let facts = [ahead.clone(), restarted.clone()];
    let d = decide(&facts, "c-1", None, &on(), &names());
    let Decision::Wait(why) = &d else {
        panic!("expected a wait, got {d:?}");
    };
    assert!(why.contains("c-0 at offset 345000"), "{why}");
    // Once it can, it takes over.
    ahead.syncing = false;
    let facts = [ahead, restarted];
    assert_eq!(
        decide(&facts, "c-1", None, &on(), &names()),
        promote("c-0", Loss::Restarted)
    );
}

#[test]
fn an_old_primary_further_ahead_takes_over_from_a_restarted_one() {
    // c-0, the primary before a cut (never demoted, every write), answers
    // again as a primary; the recorded primary c-1 restarted empty.
    let restarted = restarted(1, 1);
    let mut old = primary(0);
    old.offset = Some(345_000);
    let facts = [old, restarted];
    assert_eq!(
        decide(&facts, "c-1", None, &on(), &names()),
        promote("c-0", Loss::Restarted)
    );
}
