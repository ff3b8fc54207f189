//! The pure half of upgrades: when an instance is proven, when an upgraded
//! one has failed, what runs and what is wanted, and the `UpgradeFailed`
//! condition. Table-tested in `tests.rs`.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;

use super::super::facts::Cond;
use super::super::facts::{PodFacts, Role};
use crate::api::v1alpha1::{Engine, Redis, Served, UpgradePhase, UpgradeStatus};
use crate::redis::info::Version;

/// A replica this far behind its primary (bytes) is caught up.
pub const CAUGHT_UP_BYTES: i64 = 1 << 20;

/// `status.upgrade.reason` when the spec returned to the old version.
pub(super) const CANCELLED: &str = "Cancelled";

/// Restarts of an upgraded server that make a crash loop.
const CRASH_LOOP_RESTARTS: i32 = 2;

/// Waiting reasons that say the image will not run.
const IMAGE_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// A primary with nothing to send pings its replicas once per
/// `repl-ping-replica-period` (10 s by default): a replica of an idle
/// primary last heard from it up to this long ago.
pub const IDLE_LINK_AGE: i64 = 11;
/// What an idle primary's pings add to the offset between two reads.
const IDLE_LAG_BYTES: i64 = 64;

/// Whether an instance is proven: Ready and answering; a replica also
/// linked, not in a full sync, and heard from its primary within 2 s and
/// at most [`CAUGHT_UP_BYTES`] behind — or, its primary idle, within
/// [`IDLE_LINK_AGE`] and level with it. (A pass every 30 s sampled an idle
/// primary's ping period at the same phase each time: its replica was
/// never heard from within 2 s, and a roll waited for it for good.)
/// `primaries`: the primary of each shard (one in Replication mode).
pub fn proven(f: &PodFacts, primaries: &[&str]) -> bool {
    if !(f.ready && f.reachable && !f.terminating) {
        return false;
    }
    if primaries.contains(&f.name.as_str()) || f.role == Some(Role::Primary) {
        return true;
    }
    let fresh = match (f.link_age, f.lag_bytes) {
        (Some(a), lag) if a <= 2 => lag.is_none_or(|l| l <= CAUGHT_UP_BYTES),
        (Some(a), Some(lag)) => a <= IDLE_LINK_AGE && lag <= IDLE_LAG_BYTES,
        _ => false,
    };
    f.link_up == Some(true) && !f.syncing && fresh
}

/// Whether a primary (in Cluster mode, any shard's) already runs something
/// other than `from` (a switchover of the upgrade happened: there is no way
/// back, an older server cannot follow a newer primary).
pub fn primary_left(facts: &[PodFacts], primaries: &[&str], from: &Served) -> bool {
    facts.iter().any(|f| {
        primaries.contains(&f.name.as_str())
            && !f.terminating
            && f.image.as_deref().is_some_and(|i| i != from.image)
    })
}

/// Why an upgraded instance failed, if it did: (reason, message).
pub fn failure(f: &PodFacts, timeout_secs: i64) -> Option<(String, String)> {
    if let Some((reason, msg)) = &f.waiting {
        if IMAGE_FAILURES.contains(&reason.as_str()) {
            return Some((
                "ImagePullFailed".into(),
                format!("{}: {reason}: {msg}", f.name),
            ));
        }
        if reason == "CrashLoopBackOff" {
            return Some(("CrashLoop".into(), crash_message(f)));
        }
    }
    if f.restarts >= CRASH_LOOP_RESTARTS {
        return Some(("CrashLoop".into(), crash_message(f)));
    }
    // Not Ready (a replica: linked, not loading, not in a full sync) for
    // the whole timeout. A Ready instance that is still catching up only
    // holds the next restart; a brief flap later is no failure.
    if f.unready_secs.is_some_and(|s| s >= timeout_secs) {
        let saw = match (f.reachable, f.link_up, f.syncing) {
            (false, _, _) => "not answering".to_string(),
            (_, _, true) => "still in a full sync".to_string(),
            (_, Some(false), _) => "its replication link is down".to_string(),
            _ => "its readiness probe fails".to_string(),
        };
        return Some((
            "NotReadyInTime".into(),
            format!("{}: not Ready for {timeout_secs}s: {saw}", f.name),
        ));
    }
    None
}

fn crash_message(f: &PodFacts) -> String {
    let exit = f
        .last_exit
        .map(|c| format!(", last exit code {c}"))
        .unwrap_or_default();
    format!(
        "{}: the server keeps exiting ({} restarts{exit})",
        f.name, f.restarts
    )
}

/// The serving target a spec asks for.
pub fn desired(redis: &Redis, image: String) -> Served {
    Served {
        engine: redis.spec.engine(),
        version: redis.spec.version().to_string(),
        image,
    }
}

/// What the live StatefulSet's template runs, from its annotations and
/// container (a StatefulSet written before the annotations existed: the
/// spec's engine and version).
pub fn running(sts: &StatefulSet, redis: &Redis) -> Option<Served> {
    let image = super::super::kept::server_image(sts)?.to_string();
    let ann = sts.metadata.annotations.as_ref();
    let engine = match ann
        .and_then(|a| a.get(crate::controller::names::ENGINE_ANNOTATION))
        .map(String::as_str)
    {
        Some("Valkey") => Engine::Valkey,
        Some("Redis") => Engine::Redis,
        _ => redis.spec.engine(),
    };
    let version = ann
        .and_then(|a| a.get(crate::controller::names::VERSION_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| redis.spec.version().to_string());
    Some(Served {
        engine,
        version,
        image,
    })
}

pub(super) fn same(a: &Served, b: &Served) -> bool {
    a.engine == b.engine && a.image == b.image
}

pub(super) fn label(s: &Served) -> String {
    format!("{:?} {} ({})", s.engine, s.version, s.image)
}

pub(super) fn now() -> String {
    Timestamp::now().to_string()
}

/// `UpgradeFailed`: true while a failed upgrade is rolled back and after,
/// until the spec changes; says which instance failed and what it showed.
pub fn condition(u: &UpgradeStatus) -> Cond {
    let failed = u.reason.as_deref().filter(|r| *r != CANCELLED);
    match (u.phase, failed) {
        (UpgradePhase::RollingBack | UpgradePhase::RolledBack, Some(reason)) => Cond::new(
            "UpgradeFailed",
            true,
            reason,
            format!(
                "{} is not served: {}; {} to {}",
                label(&u.to),
                u.message.as_deref().unwrap_or("the upgrade failed"),
                if u.phase == UpgradePhase::RolledBack {
                    "rolled back"
                } else {
                    "rolling back"
                },
                label(&u.from)
            ),
        ),
        (UpgradePhase::Succeeded, _) => Cond::new(
            "UpgradeFailed",
            false,
            "Succeeded",
            format!("every instance runs {}", label(&u.to)),
        ),
        (phase, _) => Cond::new(
            "UpgradeFailed",
            false,
            format!("{phase:?}"),
            format!("{} to {}", label(&u.from), label(&u.to)),
        ),
    }
}

/// Whether moving the instances from `running` to `want` would make an
/// older server follow a newer one: a lower version of the same engine, or
/// Valkey to Redis.
pub fn is_downgrade(running: &Served, want: &Served) -> bool {
    let version = |s: &Served| s.version.parse::<Version>().ok();
    match (running.engine, want.engine) {
        (Engine::Valkey, Engine::Redis) => true,
        (a, b) if a == b => version(want) < version(running),
        _ => false,
    }
}
