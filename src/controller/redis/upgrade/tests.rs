use super::judge::*;
use crate::api::v1alpha1::{Engine, Served, UpgradePhase, UpgradeStatus};
use crate::controller::redis::facts::{PodFacts, Role};

fn replica(name: &str) -> PodFacts {
    PodFacts {
        name: name.into(),
        ready: true,
        reachable: true,
        role: Some(Role::Replica),
        link_up: Some(true),
        link_age: Some(0),
        lag_bytes: Some(0),
        image: Some("redis:7.0".into()),
        ..Default::default()
    }
}

#[test]
fn a_replica_is_proven_only_linked_recent_and_caught_up() {
    assert!(proven(&replica("c-1"), &["c-0"]));
    let mut f = replica("c-1");
    f.link_age = Some(3);
    f.lag_bytes = Some(5_000);
    assert!(!proven(&f, &["c-0"]), "not heard from for 3 s, behind");
    // An idle primary pings every 10 s: level with it, heard from 10 s ago.
    let mut f = replica("c-1");
    f.link_age = Some(10);
    assert!(proven(&f, &["c-0"]), "idle primary, level");
    f.link_age = Some(IDLE_LINK_AGE + 1);
    assert!(
        !proven(&f, &["c-0"]),
        "longer than an idle primary's ping period"
    );
    let mut f = replica("c-1");
    f.link_age = Some(3);
    f.lag_bytes = None;
    assert!(!proven(&f, &["c-0"]), "3 s, lag unknown");
    let mut f = replica("c-1");
    f.lag_bytes = Some(CAUGHT_UP_BYTES + 1);
    assert!(!proven(&f, &["c-0"]), "behind");
    let mut f = replica("c-1");
    f.syncing = true;
    assert!(!proven(&f, &["c-0"]), "full sync");
    let mut f = replica("c-1");
    f.ready = false;
    assert!(!proven(&f, &["c-0"]));
    // The primary needs no link.
    let mut p = replica("c-0");
    p.role = Some(Role::Primary);
    p.link_up = None;
    p.link_age = None;
    assert!(proven(&p, &["c-0"]));
}

#[test]
fn failures_name_the_instance_and_what_it_showed() {
    let healthy = replica("c-2");
    assert_eq!(failure(&healthy, 300), None);

    let mut pull = replica("c-2");
    pull.ready = false;
    pull.waiting = Some(("ErrImagePull".into(), "image not found".into()));
    let (reason, msg) = failure(&pull, 300).expect("pull failure");
    assert_eq!(reason, "ImagePullFailed");
    assert!(
        msg.contains("c-2") && msg.contains("image not found"),
        "{msg}"
    );

    let mut crash = replica("c-2");
    crash.ready = false;
    crash.restarts = 2;
    crash.last_exit = Some(1);
    let (reason, msg) = failure(&crash, 300).expect("crash loop");
    assert_eq!(reason, "CrashLoop");
    assert!(
        msg.contains("keeps exiting (2 restarts") && msg.contains("exit code 1"),
        "{msg}"
    );

    // One restart is not a loop.
    let mut once = replica("c-2");
    once.restarts = 1;
    assert_eq!(failure(&once, 300), None);

    // Not Ready: a failure once it stayed so for the whole timeout.
    let mut slow = replica("c-2");
    slow.ready = false;
    slow.link_up = Some(false);
    slow.unready_secs = Some(299);
    assert_eq!(failure(&slow, 300), None);
    slow.unready_secs = Some(300);
    let (reason, msg) = failure(&slow, 300).expect("timeout");
    assert_eq!(reason, "NotReadyInTime");
    assert!(
        msg.contains("c-2: not Ready for 300s: its replication link is down"),
        "{msg}"
    );
    // Ready but behind: it holds the next restart, and is no failure.
    let mut behind = replica("c-2");
    behind.lag_bytes = Some(CAUGHT_UP_BYTES * 4);
    assert_eq!(failure(&behind, 300), None);
    assert!(!proven(&behind, &["c-0"]));
}

#[test]
fn the_condition_says_what_is_not_served_and_why() {
    let served = |v: &str| Served {
        engine: Engine::Redis,
        version: v.into(),
        image: format!("redis:{v}"),
    };
    let mut u = UpgradeStatus {
        from: served("6.2"),
        to: served("7.0"),
        phase: UpgradePhase::RolledBack,
        done: 0,
        total: 3,
        started_at: "2026-01-01T00:00:00Z".into(),
        finished_at: None,
        reason: Some("ImagePullFailed".into()),
        message: Some("c-2: ErrImagePull: no such image".into()),
        primary_restarted_at: None,
        unavailable_seconds: None,
    };
    let c = condition(&u);
    assert!(c.status);
    assert_eq!(c.reason, "ImagePullFailed");
    assert!(
        c.message.contains("Redis 7.0 (redis:7.0) is not served")
            && c.message.contains("c-2: ErrImagePull")
            && c.message.contains("rolled back to Redis 6.2"),
        "{}",
        c.message
    );
    // Returning to the old version by hand is no failure.
    u.reason = Some(CANCELLED.into());
    assert!(!condition(&u).status);
    u.phase = UpgradePhase::Succeeded;
    assert_eq!(condition(&u).reason, "Succeeded");
}

#[test]
fn only_a_newer_server_may_follow() {
    use Engine::{Redis, Valkey};
    let cases = [
        ((Redis, "7.0"), (Redis, "6.2"), true),
        ((Redis, "7.0.15"), (Redis, "7.0.9"), true),
        ((Redis, "6.2"), (Redis, "7.0"), false),
        ((Redis, "7.0"), (Redis, "7.0"), false),
        // The same release spelled with or without its patch number.
        ((Redis, "7.0.0"), (Redis, "7.0"), false),
        ((Valkey, "8.1"), (Redis, "7.0"), true),
        ((Redis, "7.0"), (Valkey, "8.1"), false),
    ];
    for ((re, rv), (we, wv), expected) in cases {
        let served = |engine: Engine, v: &str| Served {
            engine,
            version: v.into(),
            image: String::new(),
        };
        assert_eq!(
            is_downgrade(&served(re, rv), &served(we, wv)),
            expected,
            "{re:?} {rv} -> {we:?} {wv}"
        );
    }
}
