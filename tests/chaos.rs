//! The composition harness: from a seed, a Redis shape, a schedule of
//! operations and faults at random moments, and writers of unique keys
//! confirmed with `WAIT 1`; at the end, invariants. A defect where two
//! capabilities meet (a backup during a resharding, a switchover during a
//! roll with the `default` user off) shows as a violation with the seed that
//! replays it.
//!
//! `make chaos SEED=<n> RUNS=<k> DURATION=<s> JOBS=<j>` runs seeds n..n+k
//! (each run's schedule spans DURATION seconds; j of them at once, each in
//! its own namespace with its own operator); `make chaos SEEDS=regressions`
//! (or `SEEDS=4,6,12`) runs the seeds of [`REGRESSION_SEEDS`] (or those);
//! `make test` runs the short seed of [`SHORT_SEEDS`]. Environment:
//! `REDPILOT_CHAOS_SEEDS`, `REDPILOT_CHAOS_SEED`,
//! `REDPILOT_CHAOS_RUNS`, `REDPILOT_CHAOS_DURATION`, `REDPILOT_CHAOS_JOBS`,
//! `REDPILOT_CHAOS_ONLY` (`standalone`, `replication` or `cluster`: draw
//! that mode only),
//! `REDPILOT_CHAOS_DRAW=1` (print what each seed draws and run nothing).
//!
//! What is drawn:
//! - the shape: Replication (2 or 3 instances) or Cluster (3 shards of 2),
//!   Redis 7.0, Valkey 8.1 or 9.1, storage or none, the `default` user on or
//!   off (the writers always log in as ACL user `app`); from a fourth
//!   stream, an append-only file or none, and in Replication mode the
//!   write fence on or off;
//! - operations: a switchover, a restart-only config change (a roll), a
//!   backup (the last Completed one is restored into a new Redis and must
//!   hold every write confirmed before it was asked for), shards 3 ↔ 4;
//!   and, drawn from a second stream of the seed (so the first stream's
//!   schedule is the one it always was), the operator's password rotated
//!   (it comes from a Secret of the user's), and with storage hibernation
//!   followed by a wake, and the volumes grown; from a third stream, an
//!   upgrade (Redis 7.0 to Valkey 8.1, Valkey 8.1 to 9.1) and the
//!   application user given a second password;
//! - faults: a server `kill -9`ed, a pod deleted, a server stopped
//!   (`SIGSTOP`) for three seconds, the operator `kill -9`ed and started
//!   again; from the third stream, a pod cut off the node's bridge for 8 s
//!   and a server starved of CPU (stopped 90 ms of every 100) for 10 s;
//! - from a fifth stream, for seeds from [`FIFTH_FROM`] on: a Standalone
//!   instance (with storage) in a quarter of the Replication draws, TLS
//!   (`tls: {}`) on two in five Redis 7.0 shapes, backups to a real S3
//!   server in half; and the operator cut off the API server for 20 s
//!   (through a relay whose connections hang), a pod deleted with its
//!   claim, the S3 server down for 20 s;
//! - from a sixth stream, for seeds from [`SIXTH_FROM`] on: the memory
//!   autopilot (and in a Cluster the shard autopilot) on two in five
//!   shapes, with fills ([`Action::Fill`]) that make them act, a plain
//!   writer beside the confirming ones (its losses counted, not checked),
//!   and the operator armed at its [`FAILPOINTS`] ([`Action::ArmFailpoints`]).
//!
//! Writers: a Replication Redis has one through its Service (`WAIT 1`; a
//! Standalone one counts a write once the server answers it); a Cluster
//! has three, each writing the keys of one shard's first slots (`WAIT 1`),
//! so a shard that stalls stalls one writer and shows in its own row of the
//! picture. A reader reads confirmed keys the same way in, 50 a second.
//!
//! Invariants: Ready within [`CONVERGE`] of the last event; no confirmed
//! write lost; no read that found a confirmed key absent while it is there
//! at the end (a stale primary answered); no two primaries of one group
//! taking writes at once ([`primaries_watch`]); the status agrees with the
//! servers (the primary it names
//! answers `role:master`, every other instance is a replica with its link
//! up; in a Cluster every slot is owned exactly once and none is open);
//! every backup ends, Completed unless a fault took its source away while
//! it ran (or hibernation did, or the S3 server was down); the operator's user takes the last password
//! and the application user its second on every instance; no password in
//! the operator's log, the events or the status; no operator panic.
//!
//! Each run prints one line (seed, shape, events, writes, convergence,
//! violations) and writes its timeline (events and, each second, the phase
//! and the confirmed writes) to `$CARGO_TARGET_TMPDIR/chaos/seed-<n>.txt`.

#[path = "support/cluster_client.rs"]
mod cluster_client;
mod support;

use std::collections::BTreeMap;

use futures::StreamExt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use redpilot::api::v1alpha1::{BackupPhase, Redis, ReshardingPhase};
use redpilot::controller::names::OPERATOR_USER;
use redpilot::redis::info::{LinkStatus, Role};
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, SIZED_CLASS, apply_redis, create_backup, create_claim, is_ready, kill_9,
    patch_redis, recent_events, redis_api, redis_pods, server_pid, signal, spawn_operator,
    start_operator,
};
use support::{TestNamespace, client};
use tokio::sync::Mutex;

/// The seed `make test` runs: 6, a Cluster whose roll right after a
/// resharding began once waited for good, with a pod deleted, a server
/// stopped and a backup among its events.
const SHORT_SEEDS: &[u64] = &[6];
/// Every seed that found a defect, run again by `make chaos
/// SEEDS=regressions` (40 s schedules): 4 (a backup asked for during a roll
/// failed), 6, 12 (a backup asked for as a new operator started failed
/// `RedisNotFound`), 13 and 26 (a primary owning no slot was not restarted
/// by a roll), 202 (a down, outdated pod of a shard without a ready primary
/// was restarted), 203 (a restore refused a resharded layout) and 206
/// (`MIGRATE` logged in as `default`, off there); from the fifth stream,
/// 306 (a replica's link left on its primary's old address), 324 and 328
/// (a shard whose replicas the cluster would not elect).
const REGRESSION_SEEDS: &[u64] = &[4, 6, 12, 13, 26, 202, 203, 206, 306, 324, 328];
/// The first seed that draws the fifth stream (Standalone, TLS, backups to
/// S3; the operator cut off the API server, a pod deleted with its claim,
/// the S3 server down). Seeds below it draw what they drew before it came,
/// so every seed run before (1 to 212) and its timeline replay as they were.
const FIFTH_FROM: u64 = 300;
/// The first seed that draws the sixth stream: the memory autopilot (and in
/// a Cluster the shard autopilot) with fills that make them act, a plain
/// writer beside the confirming ones, the operator armed at its
/// failpoints. Seeds below it draw what they drew before it came.
const SIXTH_FROM: u64 = 400;
/// The points where an operator armed by [`Action::ArmFailpoints`] stops
/// as a crash would (the first it reaches; each lies between two writes of
/// a multi-step action); the harness starts it again without them.
const FAILPOINTS: &[&str] = &[
    "after-promote",
    "after-switchover",
    "cluster-after-slots",
    "reshard-after-intent",
    "reshard-after-open",
    "reshard-after-batch",
    "reshard-after-owner",
    "volumes-orphaned",
    "after-resize-replica",
    "shards-after-record",
    "backup-after-first-shard-job",
];
/// What one [`Action::Fill`] writes by default (MiB, `REDPILOT_CHAOS_FILL_MIB`
/// to change it), in values of [`FILL_VALUE`] bytes (not compressible),
/// over about [`FILL_TIME`]. 24 MiB into a 64Mi instance makes the memory
/// autopilot grow it (the fill's rate, projected, crosses its threshold);
/// 40 MiB makes the instances of the filled shard die of OOM once the
/// autopilot is at its 96Mi maximum (seeds 407 and 408, in the README).
const FILL_MIB: usize = 24;
const FILL_VALUE: usize = 32 << 10;
const FILL_TIME: Duration = Duration::from_secs(10);
/// A run's schedule spans this long in `make test`.
const SHORT_DURATION: u64 = 40;
/// Ready, and every change done, within this of the last event.
const CONVERGE: Duration = Duration::from_secs(300);
const APP_PASSWORD: &str = "chaos-app-password-4711";
/// The operator's password (`spec.auth.secretName: chaos-auth`), rotated
/// by [`Action::Rotate`] to the next of these.
const AUTH_PASSWORDS: &[&str] = &[
    "op-pass-0-9f3a",
    "op-pass-1-c27e",
    "op-pass-2-51d8",
    "op-pass-3-e06b",
];
const NAME: &str = "cache";
/// The node's bridge address (where pods reach a server of the host).
const NODE_IP: &str = "10.244.0.1";
/// The S3 bucket the backups go to when the shape draws S3.
const BUCKET: &str = "chaos";

/// splitmix64: a seeded generator, the same draws for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Standalone,
    Replication,
    Cluster,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    mode: Mode,
    engine: &'static str,
    version: &'static str,
    instances: i32,
    storage: bool,
    default_off: bool,
    /// An append-only file (`EverySec`): a killed server comes back with
    /// every write it acknowledged (the file is in the kernel's cache the
    /// moment it answers), and with a volume so does a deleted pod.
    aof: bool,
    /// Replication: `spec.failover.fence` off (a primary cut off from its
    /// replicas keeps taking writes; none can be `WAIT`-confirmed).
    fence_off: bool,
    /// `spec.tls: {}` (the operator issues the certificates): every client,
    /// the writers', readers' and the checks', speaks TLS with its CA.
    tls: bool,
    /// Backups go to an S3 server (a real one, started for the run on the
    /// node's bridge) rather than a volume.
    s3: bool,
    /// 64Mi memory limits with the memory autopilot on (and in a Cluster
    /// the shard autopilot, 3 to 4 shards): [`Action::Fill`] makes them act.
    autopilot: bool,
}

impl Shape {
    fn draw(rng: &mut Rng, only: Option<Mode>, seed: u64) -> Shape {
        let (fifth_on, sixth_on) = (seed >= FIFTH_FROM, seed >= SIXTH_FROM);
        let mode = only.unwrap_or(if rng.chance(0.5) {
            Mode::Replication
        } else {
            Mode::Cluster
        });
        let (engine, version) = rng.pick(&[("Redis", "7.0"), ("Valkey", "8.1"), ("Valkey", "9.1")]);
        let instances = match mode {
            Mode::Replication | Mode::Standalone => rng.pick(&[2, 3]),
            Mode::Cluster => 2,
        };
        let storage = rng.chance(0.5);
        let default_off = rng.chance(0.5);
        // A fourth stream, apart from the others, so each seed's earlier
        // draws (shape and schedule) stay what they were.
        let mut fourth = Rng(rng.0 ^ 0x0a0f_5eed_fe9c_2026);
        let aof = fourth.chance(0.3);
        let mut fence_off = mode == Mode::Replication && fourth.chance(0.3);
        // A fifth stream: a quarter of the Replication draws become a
        // Standalone instance (always with storage: without it every
        // restart would empty it, which the operator holds back); TLS on
        // two in five Redis 7.0 shapes; backups to S3 in half of them.
        let mut fifth = Rng(rng.0 ^ 0x5f1f_7e1a_b0b5_2026);
        let standalone = match only {
            Some(m) => m == Mode::Standalone,
            None => fifth_on && mode == Mode::Replication && fifth.chance(0.25),
        };
        let (mut mode, mut instances, mut storage) = (mode, instances, storage);
        if standalone {
            (mode, instances, storage, fence_off) = (Mode::Standalone, 1, true, false);
        }
        let tls = fifth_on && engine == "Redis" && fifth.chance(0.4);
        let s3 = fifth_on && fifth.chance(0.5);
        // A sixth stream: the autopilots in two of five Replication and
        // Cluster shapes.
        let mut sixth = Rng(rng.0 ^ 0x6a07_0f11_5eed_2026);
        let autopilot = sixth_on && mode != Mode::Standalone && sixth.chance(0.4);
        Shape {
            mode,
            engine,
            version,
            instances,
            storage,
            default_off,
            aof,
            fence_off,
            tls,
            s3,
            autopilot,
        }
    }

    /// The volumes' first size: room for the fills' snapshots (and their
    /// rewrite beside them) where the autopilots are drawn.
    fn storage_mi(&self) -> u32 {
        if self.autopilot { 256 } else { 64 }
    }

    fn spec(&self) -> Value {
        let mut spec = json!({
            "mode": format!("{:?}", self.mode),
            "instances": self.instances,
            "engine": self.engine,
            "version": self.version,
            "users": [{"name": "app", "passwords": [{"secretName": "chaos-app"}],
                       "rules": ["~*", "+@all"]}],
            "auth": {"secretName": "chaos-auth"},
        });
        if self.mode == Mode::Cluster {
            spec["shards"] = json!(3);
        }
        if self.storage {
            spec["storage"] = json!({"size": format!("{}Mi", self.storage_mi()),
                                     "storageClassName": SIZED_CLASS});
        }
        if self.autopilot {
            spec["resources"] = json!({"limits": {"memory": "64Mi"},
                                       "requests": {"memory": "64Mi"}});
            spec["autopilot"] = json!({"memory": {"maxMemory": self.autopilot_max()}});
            if self.mode == Mode::Cluster {
                spec["autopilot"]["shards"] = json!({"minShards": 3, "maxShards": 4});
            }
        }
        if self.default_off {
            spec["auth"]["defaultUser"] = json!({"enabled": false});
        }
        if self.aof {
            spec["persistence"] = json!({"aof": "EverySec"});
        }
        if self.fence_off {
            spec["failover"] = json!({"fence": false});
        }
        if self.tls {
            spec["tls"] = json!({});
        }
        spec
    }

    /// The memory autopilot's largest limit: one grow in a Cluster (then
    /// the shard autopilot adds a shard), two in Replication.
    fn autopilot_max(&self) -> &'static str {
        if self.mode == Mode::Cluster {
            "96Mi"
        } else {
            "160Mi"
        }
    }

    /// `WAIT` confirms a write on this many replicas (none in Standalone
    /// mode: a write counts once the server answers it).
    fn confirm_on(&self) -> i64 {
        if self.mode == Mode::Standalone { 0 } else { 1 }
    }

    fn describe(&self) -> String {
        format!(
            "{:?} {} {} x{}{}{}{}{}{}{}{}{}",
            self.mode,
            self.engine,
            self.version,
            self.instances,
            if self.mode == Mode::Cluster {
                " (3 shards)"
            } else {
                ""
            },
            if self.storage { ", storage" } else { "" },
            if self.default_off {
                ", default user off"
            } else {
                ""
            },
            if self.aof { ", AOF" } else { "" },
            if self.fence_off { ", fence off" } else { "" },
            if self.tls { ", TLS" } else { "" },
            if self.s3 { ", backups to S3" } else { "" },
            if self.autopilot { ", autopilots" } else { "" },
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Switchover,
    Roll,
    Backup,
    Shards,
    KillServer,
    DeletePod,
    StopServer,
    KillOperator,
    /// The operator's password rotated (its Secret changed).
    Rotate,
    /// `spec.hibernate` on, and off again once saved.
    Hibernate,
    /// `spec.storage.size` grown by 32Mi.
    Grow,
    /// The engine or version moved on ([`upgrade_of`]: Redis 7.0 to
    /// Valkey 8.1, Valkey 8.1 to 9.1).
    Upgrade,
    /// The application user `app` given a second password (both valid).
    AppRotate,
    /// A pod cut off the node's bridge for [`PARTITION`] (its veth down:
    /// no reset, its peers and clients time out).
    Partition,
    /// A server starved of CPU for [`STARVE`]: stopped 90 ms of every 100.
    Starve,
    /// A pod deleted with its claim: it comes back on an empty volume.
    DeleteClaim,
    /// The S3 server the backups go to down for [`S3_DOWN`].
    S3Down,
    /// The operator cut off the API server for [`OPERATOR_CUT`]: its
    /// connections hang (no reset), as behind a blackhole route.
    CutOperator,
    /// [`fill_mib`] MiB of values written to one shard (or the primary) over
    /// [`FILL_TIME`], unconfirmed: the autopilots act.
    Fill,
    /// The operator killed and started again armed at its [`FAILPOINTS`]:
    /// it stops at the first it reaches and is started again without them.
    ArmFailpoints,
    /// `spec.tls` removed (every server rolls to plain text), then, once
    /// settled (or after [`FLIP_WAIT`]), `tls: {}` again.
    TlsFlip,
}

impl Action {
    const ALL: [Action; 21] = [
        Action::Switchover,
        Action::Roll,
        Action::Backup,
        Action::Shards,
        Action::KillServer,
        Action::DeletePod,
        Action::StopServer,
        Action::KillOperator,
        Action::Rotate,
        Action::Hibernate,
        Action::Grow,
        Action::Upgrade,
        Action::AppRotate,
        Action::Partition,
        Action::Starve,
        Action::DeleteClaim,
        Action::S3Down,
        Action::CutOperator,
        Action::Fill,
        Action::ArmFailpoints,
        Action::TlsFlip,
    ];

    fn is_fault(self) -> bool {
        matches!(
            self,
            Action::KillServer
                | Action::DeletePod
                | Action::StopServer
                | Action::KillOperator
                | Action::Partition
                | Action::Starve
                | Action::DeleteClaim
                | Action::S3Down
                | Action::CutOperator
                | Action::ArmFailpoints
        )
    }
}

/// How long [`Action::Partition`] keeps a pod cut off.
const PARTITION: Duration = Duration::from_secs(8);
/// How long [`Action::Starve`] starves a server.
const STARVE: Duration = Duration::from_secs(10);
/// How long [`Action::S3Down`] keeps the S3 server down.
const S3_DOWN: Duration = Duration::from_secs(20);
/// How long [`Action::CutOperator`] keeps the operator off the API server
/// (longer than its 15 s lease: it loses it and is started again).
const OPERATOR_CUT: Duration = Duration::from_secs(20);
/// How long [`Action::TlsFlip`] waits for TLS off to settle before it
/// turns TLS on again.
const FLIP_WAIT: Duration = Duration::from_secs(120);
/// The application user's second password ([`Action::AppRotate`]).
const APP_PASSWORD_2: &str = "chaos-app-password-2-0c5e";

/// The engine and version an upgrade of `engine` `version` moves to, where
/// the dev cluster has one: a Cluster only moves within Valkey (the engine
/// change is stated for replication).
fn upgrade_of(mode: Mode, engine: &str, version: &str) -> Option<(&'static str, &'static str)> {
    match (engine, version) {
        ("Redis", "7.0") if mode == Mode::Replication => Some(("Valkey", "8.1")),
        ("Valkey", "8.1") => Some(("Valkey", "9.1")),
        _ => None,
    }
}

/// The schedule: actions at seconds from the start of the load.
fn schedule(rng: &mut Rng, shape: &Shape, duration: u64, seed: u64) -> Vec<(u64, Action)> {
    let fifth_on = seed >= FIFTH_FROM;
    let mut ops = vec![Action::Switchover, Action::Roll, Action::Backup];
    if shape.mode == Mode::Cluster {
        ops.push(Action::Shards);
    }
    let faults = [
        Action::KillServer,
        Action::DeletePod,
        Action::StopServer,
        Action::KillOperator,
    ];
    let mut out = Vec::new();
    for _ in 0..2 + rng.below(2) {
        out.push((5 + rng.below(duration.saturating_sub(5)), rng.pick(&ops)));
    }
    for _ in 0..2 + rng.below(3) {
        out.push((5 + rng.below(duration.saturating_sub(5)), rng.pick(&faults)));
    }
    // The second stream: operations added after the first ones, drawn
    // apart so each seed's first-stream schedule stays what it was.
    let mut more = Rng(rng.0 ^ 0x5eed_0f0e_a5e5_2026);
    let mut later = vec![Action::Rotate];
    if shape.storage {
        later.extend([Action::Hibernate, Action::Grow]);
    }
    for _ in 0..more.below(3) {
        out.push((
            5 + more.below(duration.saturating_sub(5)),
            more.pick(&later),
        ));
    }
    // The third stream: an upgrade, the application user's rotation, a
    // pod cut off, a server starved of CPU.
    let mut third = Rng(rng.0 ^ 0x7a1d_c0de_3a3a_2026);
    let mut third_ops = vec![Action::AppRotate, Action::Partition, Action::Starve];
    if upgrade_of(shape.mode, shape.engine, shape.version).is_some() {
        third_ops.push(Action::Upgrade);
    }
    for _ in 0..third.below(3) {
        out.push((
            5 + third.below(duration.saturating_sub(5)),
            third.pick(&third_ops),
        ));
    }
    // The fifth stream: the operator cut off the API server, a pod deleted
    // with its claim, the S3 server down.
    let mut fifth = Rng(rng.0 ^ 0x5f1f_5c4e_d01e_2026);
    let mut fifth_ops = vec![Action::CutOperator];
    if shape.storage {
        fifth_ops.push(Action::DeleteClaim);
    }
    if shape.s3 {
        fifth_ops.push(Action::S3Down);
    }
    for _ in 0..if fifth_on { fifth.below(3) } else { 0 } {
        out.push((
            5 + fifth.below(duration.saturating_sub(5)),
            fifth.pick(&fifth_ops),
        ));
    }
    // The sixth stream: a fill in the first half wherever the autopilots
    // are on, and up to two of another fill and the operator armed at its
    // failpoints. With the shard autopilot the user does not set
    // `spec.shards` (it does).
    if seed >= SIXTH_FROM {
        let mut sixth = Rng(rng.0 ^ 0x6a07_5c4e_d01e_2026);
        let mut sixth_ops = vec![Action::ArmFailpoints];
        if shape.autopilot {
            sixth_ops.push(Action::Fill);
            out.push((5 + sixth.below(duration / 2), Action::Fill));
            if shape.mode == Mode::Cluster {
                out.retain(|(_, a)| *a != Action::Shards);
            }
        }
        for _ in 0..sixth.below(3) {
            out.push((
                5 + sixth.below(duration.saturating_sub(5)),
                sixth.pick(&sixth_ops),
            ));
        }
        // TLS turned off and on again in half of the TLS shapes (drawn
        // apart, so the draws above stay what they were).
        let mut flip = Rng(rng.0 ^ 0x7150_f11b_0ff0_2026);
        if shape.tls && flip.chance(0.5) {
            out.push((5 + flip.below(duration.saturating_sub(5)), Action::TlsFlip));
        }
    }
    out.sort_by_key(|(t, _)| *t);
    out
}

/// A schedule as `REDPILOT_CHAOS_SCHEDULE` takes it and the shrinker
/// prints it: `<second>:<Action>` joined by commas.
fn schedule_text(plan: &[(u64, Action)]) -> String {
    plan.iter()
        .map(|(t, a)| format!("{t}:{a:?}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`schedule_text`]'s form back; the error names the bad entry.
fn parse_schedule(text: &str) -> Result<Vec<(u64, Action)>, String> {
    let mut plan = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (t, a) = entry
            .split_once(':')
            .ok_or_else(|| format!("{entry:?}: want <second>:<Action>"))?;
        let t: u64 = t
            .parse()
            .map_err(|e| format!("{entry:?}: the second {t:?}: {e}"))?;
        let a = Action::ALL
            .into_iter()
            .find(|x| format!("{x:?}") == a)
            .ok_or_else(|| format!("{entry:?}: no action {a:?} (one of {:?})", Action::ALL))?;
        plan.push((t, a));
    }
    plan.sort_by_key(|(t, _)| *t);
    Ok(plan)
}

/// A run's timeline: what happened, seconds from the load's start.
#[derive(Default)]
struct Timeline {
    lines: Vec<(f64, String)>,
}

impl Timeline {
    fn add(&mut self, at: Instant, what: impl Into<String>) {
        self.lines.push((at.elapsed().as_secs_f64(), what.into()));
    }
}

/// The Cluster writers' count: every key a `SET k k` + `WAIT 1` confirmed,
/// in the order confirmed (so the keys confirmed before a moment are a
/// prefix), and the errors by kind.
#[derive(Default)]
struct Tally {
    acked: Vec<String>,
    errors: BTreeMap<String, u64>,
    /// The last few errors in full, for a violation's message.
    recent: Vec<String>,
}

/// The address of a pod of the Redis that has an IP (any: a cluster
/// client learns the rest from redirections).
async fn some_pod(client: &kube::Client, ns: &str, rng_pick: u64) -> Option<Endpoint> {
    let pods: Vec<String> = redis_pods(client, ns, NAME)
        .await
        .values()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    if pods.is_empty() {
        return None;
    }
    Some(Endpoint::new(&pods[(rng_pick as usize) % pods.len()], 6379))
}

/// Hash tags whose slots lie in the `lane`th of three even slot ranges
/// (the first shards' homes when a 3-shard Cluster is made): a writer of
/// those keys stalls only when that range's shard does.
fn lane_tags(lane: usize) -> Vec<String> {
    let range = redpilot::redis::cluster::spread(3)[lane];
    (0..)
        .map(|k| format!("w{lane}x{k}"))
        .filter(|t| {
            let slot = redpilot::redis::cluster::key_slot(format!("{{{t}}}").as_bytes());
            (range.start..=range.end).contains(&slot)
        })
        .take(64)
        .collect()
}

/// A Cluster writer of unique keys `{<tag>}:<id>:<n>`, its tags those of
/// one slot range ([`lane_tags`]), confirming each with `WAIT 1 500` (a
/// plain one, `confirm` false, counts a write once a server answers it), no
/// retry; after 3 failures in a row it starts again from another pod (its
/// seed may be the pod that went away), with the next of `ways` (TLS and
/// plain text while TLS may be turned off and on).
#[allow(clippy::too_many_arguments)]
fn cluster_writer(
    id: u64,
    confirm: bool,
    tags: Vec<String>,
    kube: kube::Client,
    ns: String,
    ways: Vec<ConnectOptions>,
    stop: Arc<AtomicBool>,
    confirmed: Arc<AtomicU64>,
    lane: Arc<AtomicU64>,
    tally: Arc<Mutex<Tally>>,
) -> tokio::task::JoinHandle<()> {
    let t = tally;
    tokio::spawn(async move {
        let mut c: Option<cluster_client::Client> = None;
        let mut fails = 0u32;
        let mut n = 0u64;
        let mut starts = 0usize;
        let mut pace = support::pace::pacer();
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            // A few failures in a row: the pods may have new addresses (a roll
            // makes them anew), so start again from one the API names.
            if c.is_none() || fails >= 3 {
                let Some(seed) = some_pod(&kube, &ns, n + id).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let opts = ways[starts % ways.len()].clone();
                starts += 1;
                let mut client = cluster_client::Client::new(seed, opts);
                client.confirm = confirm.then_some((1, 500));
                c = Some(client);
                fails = 0;
            }
            let Some(client) = c.as_mut() else { continue };
            let key = format!("{{{}}}:{id}:{n}", tags[(n as usize) % tags.len()]);
            n += 1;
            let r: Result<redis::Value, String> = client
                .run(&key, redis::cmd("SET").arg(&key).arg(&key))
                .await;
            let mut t = t.lock().await;
            match r {
                Ok(_) => {
                    t.acked.push(key);
                    confirmed.fetch_add(1, Ordering::Relaxed);
                    lane.fetch_add(1, Ordering::Relaxed);
                    fails = 0;
                }
                Err(e) => {
                    *t.errors.entry(cluster_client::error_kind(&e)).or_default() += 1;
                    if t.recent.len() == 5 {
                        t.recent.remove(0);
                    }
                    t.recent.push(e.chars().take(160).collect());
                    fails += 1;
                    drop(t);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    })
}

/// The plain writer of a run (from the sixth stream): a write counts once
/// a server answers it. Nothing is promised of such a write (a failover
/// may lose it); how many are lost is counted and said.
enum Plain {
    Service(support::faults::ServiceWriter),
    Cluster(tokio::task::JoinHandle<()>, Arc<Mutex<Tally>>),
}

impl Plain {
    fn start(
        shape: &Shape,
        client: &kube::Client,
        ns: &str,
        ways: &[ConnectOptions],
        stop: Arc<AtomicBool>,
    ) -> Plain {
        match shape.mode {
            Mode::Cluster => {
                let tally = Arc::new(Mutex::new(Tally::default()));
                let h = cluster_writer(
                    9,
                    false,
                    lane_tags(1),
                    client.clone(),
                    ns.to_string(),
                    ways.to_vec(),
                    stop,
                    Arc::default(),
                    Arc::default(),
                    tally.clone(),
                );
                Plain::Cluster(h, tally)
            }
            _ => Plain::Service(support::faults::ServiceWriter::trying(
                client,
                ns,
                NAME,
                ways.to_vec(),
                "plain",
                0,
                Duration::ZERO,
            )),
        }
    }

    /// The answered keys, once it stopped (`stop` is set by then).
    async fn stop(self) -> Vec<String> {
        match self {
            Plain::Service(w) => w.stop().await.keys(),
            Plain::Cluster(h, tally) => {
                let _ = h.await;
                tally.lock().await.acked.clone()
            }
        }
    }
}

/// How many MiB a fill writes ([`FILL_MIB`] unless the environment says).
fn fill_mib() -> usize {
    std::env::var("REDPILOT_CHAOS_FILL_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FILL_MIB)
}

/// [`Action::Fill`]: [`fill_mib`] MiB of values that do not compress, under
/// keys of the `lane`th slot range in a Cluster (through the slot owners),
/// else through the Service to the primary; unconfirmed, no retry (a
/// failed write is counted and the next one sent). What was written (MiB)
/// and how many writes failed.
fn fill(
    mode: Mode,
    kube: kube::Client,
    ns: String,
    opts: ConnectOptions,
    lane: usize,
    seed: u64,
) -> tokio::task::JoinHandle<(usize, u64)> {
    tokio::spawn(async move {
        let mut rng = Rng(seed ^ 0x0f11_0f11_2026);
        let count = (fill_mib() << 20) / FILL_VALUE;
        let tags = lane_tags(lane);
        let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::namespaced(kube.clone(), &ns);
        let mut pace = tokio::time::interval(FILL_TIME / count as u32);
        let (mut cluster, mut node): (Option<cluster_client::Client>, Option<Node>) = (None, None);
        let (mut written, mut failed) = (0usize, 0u64);
        for k in 0..count {
            pace.tick().await;
            let value: Vec<u8> = (0..FILL_VALUE / 8)
                .flat_map(|_| rng.next().to_le_bytes())
                .collect();
            let key = format!("{{{}}}:fill:{seed}:{k}", tags[k % tags.len()]);
            let mut cmd = redis::cmd("SET");
            cmd.arg(&key).arg(value);
            let ok = if mode == Mode::Cluster {
                if cluster.is_none() {
                    cluster = some_pod(&kube, &ns, k as u64)
                        .await
                        .map(|seed| cluster_client::Client::new(seed, opts.clone()));
                }
                match cluster.as_mut() {
                    Some(c) => c.run::<redis::Value>(&key, &cmd).await.is_ok(),
                    None => false,
                }
            } else {
                if node.is_none()
                    && let Some(ip) = support::faults::ready_endpoint(&slices, NAME).await
                {
                    node = Node::connect(&Endpoint::new(&ip, 6379), &opts).await.ok();
                }
                match node.as_mut() {
                    Some(n) => {
                        let r: Result<redis::Value, _> = n.query("SET", &cmd).await;
                        if r.is_err() {
                            node = None;
                        }
                        r.is_ok()
                    }
                    None => false,
                }
            };
            if ok {
                written += FILL_VALUE;
            } else {
                failed += 1;
            }
        }
        (written >> 20, failed)
    })
}

/// The writers of one run.
enum Load {
    Replication(support::faults::ServiceWriter),
    /// The writers, their shared tally, and each one's confirmed count.
    Cluster(
        Vec<tokio::task::JoinHandle<()>>,
        Arc<Mutex<Tally>>,
        Vec<Arc<AtomicU64>>,
    ),
}

/// Confirmed keys and errors by kind, once the writers stopped.
struct Written {
    acked: Vec<String>,
    errors: BTreeMap<String, u64>,
}

impl Load {
    async fn stop(self) -> Written {
        match self {
            Load::Replication(w) => {
                let t = w.stop().await;
                Written {
                    acked: t.keys(),
                    errors: t.errors.clone(),
                }
            }
            Load::Cluster(ws, tally, _) => {
                for h in ws {
                    h.await.expect("writer");
                }
                let t = tally.lock().await;
                Written {
                    acked: t.acked.clone(),
                    errors: t.errors.clone(),
                }
            }
        }
    }
}

impl Load {
    /// A reader of the confirmed writes per writer lane, for the
    /// sampler's task.
    fn counter(&self) -> Arc<dyn Fn() -> Vec<usize> + Send + Sync> {
        match self {
            Load::Replication(w) => {
                let c = w.acked_counter();
                Arc::new(move || vec![c()])
            }
            Load::Cluster(_, _, lanes) => {
                let lanes = lanes.clone();
                Arc::new(move || {
                    lanes
                        .iter()
                        .map(|c| c.load(Ordering::Relaxed) as usize)
                        .collect()
                })
            }
        }
    }

    /// For the reader: a confirmed key ([`support::faults::ServiceWriter::acked_key`]).
    fn picker(&self) -> Picker {
        match self {
            Load::Replication(w) => Arc::new(w.acked_key()),
            Load::Cluster(_, tally, _) => {
                let tally = tally.clone();
                Arc::new(move |pick, within| {
                    let t = tally.try_lock().ok()?;
                    let all = t.acked.len() as u64;
                    let n = within.unwrap_or(all).min(all);
                    (n > 0).then(|| t.acked[(all - n + pick % n) as usize].clone())
                })
            }
        }
    }

    /// The lanes' names, as the picture labels its rows.
    fn lanes(&self) -> Vec<String> {
        match self {
            Load::Replication(_) => vec!["writes/s".into()],
            Load::Cluster(_, _, lanes) => {
                (0..lanes.len()).map(|i| format!("slots of s{i}")).collect()
            }
        }
    }
}

/// A confirmed key: `(pick, within)` names the `pick % n`th of the last n
/// confirmed (of all with `None`).
type Picker = Arc<dyn Fn(u64, Option<u64>) -> Option<String> + Send + Sync>;

/// What the reader saw.
#[derive(Default)]
struct Reads {
    ok: u64,
    errors: u64,
    /// Confirmed keys a read answered without (nil, or another value):
    /// seconds from the load's start, the key, what it read.
    missed: Vec<(f64, String, String)>,
}

/// A reader of confirmed writes, in the way the writers go (the Service's
/// ready endpoint; a Cluster's slot owners), no retry: every 20 ms a
/// confirmed key, half the time one of the last 100, must read as written
/// (a Cluster writer's value is its key, a Service writer's its number).
/// A read that finds it absent while the key is there at the end was
/// served by a server that lacked a confirmed write: a stale primary.
#[allow(clippy::too_many_arguments)]
fn reader(
    mode: Mode,
    kube: kube::Client,
    ns: String,
    opts: ConnectOptions,
    pick: Picker,
    stop: Arc<AtomicBool>,
    t0: Instant,
    seed: u64,
) -> tokio::task::JoinHandle<Reads> {
    tokio::spawn(async move {
        let mut rng = Rng(seed ^ 0x00ea_d0e5_2026);
        let mut reads = Reads::default();
        let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::namespaced(kube.clone(), &ns);
        let mut node: Option<Node> = None;
        let mut cluster: Option<cluster_client::Client> = None;
        let mut fails = 0u32;
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let within = rng.chance(0.5).then_some(100);
            let Some(key) = pick(rng.next(), within) else {
                continue;
            };
            let got: Result<Option<String>, String> = if mode == Mode::Cluster {
                if cluster.is_none() || fails >= 3 {
                    let Some(seed) = some_pod(&kube, &ns, rng.next()).await else {
                        continue;
                    };
                    cluster = Some(cluster_client::Client::new(seed, opts.clone()));
                    fails = 0;
                }
                let Some(c) = cluster.as_mut() else { continue };
                c.run(&key, redis::cmd("GET").arg(&key)).await
            } else {
                if node.is_none() {
                    let Some(ip) = support::faults::ready_endpoint(&slices, NAME).await else {
                        reads.errors += 1;
                        continue;
                    };
                    match Node::connect(&Endpoint::new(&ip, 6379), &opts).await {
                        Ok(n) => node = Some(n),
                        Err(_) => {
                            reads.errors += 1;
                            continue;
                        }
                    }
                }
                let Some(n) = node.as_mut() else { continue };
                let r = n
                    .query::<Option<String>>("GET", redis::cmd("GET").arg(&key))
                    .await
                    .map_err(|e| e.to_string());
                if r.is_err() {
                    node = None;
                }
                r
            };
            let want = if mode == Mode::Cluster {
                key.clone()
            } else {
                key.rsplit(':').next().unwrap_or_default().to_string()
            };
            match got {
                Ok(Some(v)) if v == want => {
                    reads.ok += 1;
                    fails = 0;
                }
                Ok(v) => {
                    fails = 0;
                    reads
                        .missed
                        .push((t0.elapsed().as_secs_f64(), key, format!("{v:?}")))
                }
                Err(_) => {
                    reads.errors += 1;
                    fails += 1;
                }
            }
        }
        reads
    })
}

/// Growth of a primary's replication stream between two looks a second
/// apart that counts as taking writes (the writers add tens of KiB a
/// second; a primary's own pings to its replicas add tens of bytes).
const TAKING_WRITES: i64 = 4096;

/// Two primaries of one group (the Redis's instances; a Cluster's shard)
/// taking writes at once: once a second every instance that answers is
/// asked its role and stream offset, and where two said `role:master` at
/// both of two looks and both streams grew by [`TAKING_WRITES`] between
/// them, the two took writes for the same data at once. An instance cut off
/// from the node does not answer the look, so a primary cut off with the
/// fence off (which may take writes from clients beside it) is not seen.
fn primaries_watch(
    kube: kube::Client,
    ns: String,
    opts: ConnectOptions,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut last: BTreeMap<String, (bool, i64)> = BTreeMap::new();
        let mut found = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let pods = redis_pods(&kube, &ns, NAME).await;
            let looks = futures::future::join_all(pods.iter().filter_map(|(name, p)| {
                let ip = p.status.as_ref()?.pod_ip.clone()?;
                let opts = opts.clone();
                Some(async move {
                    let look = tokio::time::timeout(Duration::from_millis(800), async {
                        let mut n = Node::connect(&Endpoint::new(&ip, 6379), &opts).await.ok()?;
                        n.info_section("replication").await.ok()
                    })
                    .await
                    .ok()
                    .flatten();
                    (name.clone(), look.map(|i| i.replication))
                })
            }))
            .await;
            let mut taking: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (name, look) in looks {
                let Some(r) = look else {
                    last.remove(&name);
                    continue;
                };
                let primary = r.role == Some(Role::Primary);
                let offset = r.repl_offset.unwrap_or(0);
                if let Some((was_primary, was)) = last.get(&name)
                    && *was_primary
                    && primary
                    && offset - was > TAKING_WRITES
                {
                    let group = name.rsplit_once('-').map(|(g, _)| g).unwrap_or(&name);
                    taking
                        .entry(group.to_string())
                        .or_default()
                        .push(format!("{name} +{} B", offset - was));
                }
                last.insert(name, (primary, offset));
            }
            for (group, primaries) in taking {
                if primaries.len() > 1 {
                    found.push(format!(
                        "at {:.1} s two primaries of {group} took writes at once: {}",
                        t0.elapsed().as_secs_f64(),
                        primaries.join(", ")
                    ));
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        found
    })
}

/// The sampler's look, once a second.
struct Sample {
    /// Seconds from the load's start.
    at: f64,
    state: String,
    ready: bool,
    /// Confirmed writes so far, per writer lane.
    confirmed: Vec<usize>,
}

/// Confirmed writes so far (for the timeline and the backups' cut).
fn confirmed_now(load: &Load, cluster_count: &AtomicU64) -> usize {
    match load {
        Load::Replication(w) => w.acked(),
        Load::Cluster(..) => cluster_count.load(Ordering::Relaxed) as usize,
    }
}

/// Sends `sig` to `pid`, whether or not the process is still there.
fn signal_quiet(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// A pod of the Redis, drawn.
async fn drawn_pod(client: &kube::Client, ns: &str, rng: &mut Rng) -> Option<(String, Pod)> {
    let pods: Vec<(String, Pod)> = redis_pods(client, ns, NAME).await.into_iter().collect();
    if pods.is_empty() {
        return None;
    }
    let i = rng.below(pods.len() as u64) as usize;
    pods.into_iter().nth(i)
}

/// How long a restarted server may take to copy its primary's data again
/// (the shapes hold megabytes: a full sync takes about a second).
const RESYNC_GRACE: Duration = Duration::from_secs(20);

/// Whether `name`'s server holds the only copy of its group's data that is
/// in sync (the group: every instance in Replication mode, its shard's in
/// Cluster mode): it is a primary, and no other instance of the group is a
/// replica linked to it and done syncing, and every other one was lost
/// within [`RESYNC_GRACE`] (restarted by a roll or a fault, it copies
/// again). Without AOF a server fault there loses what only it held: the
/// writes it confirmed with `WAIT 1` reached a replica that is since gone.
/// `Some(why)` then; `None` when another copy is in sync, when one has run
/// longer than that without being in sync (a defect of its own, not a
/// window every resync has), when `name` is a replica, or when it does not
/// answer.
async fn last_copy(
    client: &kube::Client,
    ns: &str,
    name: &str,
    mode: Mode,
    opts: &ConnectOptions,
) -> Option<String> {
    let group = |pod: &str| match mode {
        Mode::Cluster => pod.rsplit_once('-').map(|(g, _)| g.to_string()),
        Mode::Replication | Mode::Standalone => Some(String::new()),
    };
    let pods = redis_pods(client, ns, NAME).await;
    let ip_of = |p: &Pod| p.status.as_ref().and_then(|s| s.pod_ip.clone());
    let own_ip = ip_of(pods.get(name)?)?;
    // Its role from the server, or, where it does not answer (stopped, cut
    // off), from the status.
    let said = match Node::connect(&Endpoint::new(&own_ip, 6379), opts).await {
        Ok(mut n) => n
            .info_section("replication")
            .await
            .ok()
            .map(|i| i.replication.role),
        Err(_) => None,
    };
    let primary = match said {
        Some(role) => role == Some(Role::Primary),
        None => redis_api(client, ns)
            .get(NAME)
            .await
            .ok()
            .and_then(|r| r.status)
            .is_some_and(|st| {
                st.primary.as_deref() == Some(name)
                    || st.shards.iter().any(|s| s.primary.as_deref() == Some(name))
            }),
    };
    if !primary {
        return None;
    }
    let mut others = Vec::new();
    for (pod, p) in &pods {
        if pod == name || group(pod) != group(name) {
            continue;
        }
        let Some(ip) = ip_of(p) else {
            others.push(format!("{pod} has no address"));
            continue;
        };
        let i = match Node::connect(&Endpoint::new(&ip, 6379), opts).await {
            Ok(mut m) => m.info().await,
            Err(e) => Err(e),
        };
        match i {
            Ok(i) => {
                let r = &i.replication;
                if r.role == Some(Role::Replica)
                    && r.link_status == Some(LinkStatus::Up)
                    && r.sync_in_progress != Some(true)
                    && r.primary.as_ref().is_some_and(|e| e.host() == own_ip)
                {
                    return None;
                }
                let up = i.server.uptime_seconds.unwrap_or(u64::MAX);
                if up > RESYNC_GRACE.as_secs() {
                    return None;
                }
                others.push(format!(
                    "{pod}: up {up} s, {:?}, link {:?}, syncing {:?}",
                    r.role, r.link_status, r.sync_in_progress
                ));
            }
            // Down: lost recently (restarting), or a defect of its own.
            Err(e) if started_within(p, RESYNC_GRACE) => {
                others.push(format!("{pod} does not answer ({e})"))
            }
            Err(_) => return None,
        }
    }
    Some(format!(
        "{name} was the group's only copy in sync ({})",
        if others.is_empty() {
            "no other instance".to_string()
        } else {
            others.join("; ")
        }
    ))
}

/// Whether `pod` was made, or its server container last started or
/// stopped, within `within` (a server that does not answer is then one
/// being restarted, not one down for good).
fn started_within(pod: &Pod, within: Duration) -> bool {
    let now = k8s_openapi::jiff::Timestamp::now();
    let recent = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        now.duration_since(t.0).as_secs_f64() <= within.as_secs_f64()
    };
    if pod.metadata.creation_timestamp.as_ref().is_some_and(recent) {
        return true;
    }
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == "redis")
        .any(|c| {
            let running = c.state.as_ref().and_then(|s| s.running.as_ref());
            let ended = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            running
                .and_then(|r| r.started_at.as_ref())
                .is_some_and(recent)
                || ended
                    .and_then(|t| t.finished_at.as_ref())
                    .is_some_and(recent)
        })
}

/// A server fault that hit the last copy in sync of its group's data (see
/// [`last_copy`]).
#[derive(Debug, Clone)]
struct LastCopy {
    /// The writes confirmed just after it.
    confirmed: usize,
    /// When it struck.
    at: chrono::DateTime<chrono::Utc>,
    /// Which instance, and where the other copies were.
    why: String,
}

/// Splits `lost` into the writes a fault on the last copy in sync took
/// (confirmed before it: their place among the confirmed writes, `acked`
/// in the order they were confirmed, is below the count read just after
/// the latest such fault of `last_copies`) and the rest.
fn excuse_last_copy<'a>(
    acked: &[String],
    lost: Vec<String>,
    last_copies: impl IntoIterator<Item = &'a LastCopy>,
) -> (Vec<String>, Vec<String>) {
    let Some(bound) = last_copies.into_iter().map(|c| c.confirmed).max() else {
        return (Vec::new(), lost);
    };
    let place: std::collections::HashMap<&str, usize> = acked
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    lost.into_iter()
        .partition(|k| place.get(k.as_str()).is_some_and(|i| *i < bound))
}

/// Waits (at most 60 s) until pod `name` of uid `uid` is gone (deleted, or
/// made anew under another uid).
async fn pod_gone(client: &kube::Client, ns: &str, name: &str, uid: Option<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match pods.get_opt(name).await {
            Ok(Some(p)) if p.metadata.uid == uid => {}
            Ok(_) => return,
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The server process of `pod` (a local process on the dev cluster's node).
async fn pid_of(pod: &Pod, opts: &ConnectOptions) -> Result<u32, String> {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or("no IP")?;
    let mut n = Node::connect(&Endpoint::new(ip, 6379), opts)
        .await
        .map_err(|e| e.to_string())?;
    Ok(server_pid(&mut n).await)
}

/// A replica to switch over to: for a Cluster one of a drawn shard.
fn switchover_target(r: &Redis, rng: &mut Rng) -> Option<String> {
    let st = r.status.as_ref()?;
    let replicas: Vec<String> = st
        .instances
        .iter()
        .filter(|i| i.role == "replica" && i.ready && i.link_up == Some(true))
        .map(|i| i.name.clone())
        .collect();
    if replicas.is_empty() {
        return None;
    }
    Some(replicas[rng.below(replicas.len() as u64) as usize].clone())
}

/// Settled: Ready, the shards the spec asks for, no resharding under way.
fn settled(r: &Redis) -> bool {
    if !is_ready(r) {
        return false;
    }
    let Some(st) = r.status.as_ref() else {
        return false;
    };
    if r.spec.shards.is_some() {
        let want = usize::try_from(r.spec.shards.unwrap_or(0)).unwrap_or(0);
        let resharding_done = st
            .resharding
            .as_ref()
            .is_none_or(|x| x.phase == ReshardingPhase::Done);
        return st.shards.len() == want && resharding_done;
    }
    true
}

/// Waits (at most [`CONVERGE`]) for Redis `name` to be [`settled`].
async fn settles(api: &Api<Redis>, name: &str) -> bool {
    let deadline = Instant::now() + CONVERGE;
    while Instant::now() < deadline {
        if api.get(name).await.ok().as_ref().is_some_and(settled) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// The status against the servers; violations found.
async fn status_agrees(client: &kube::Client, ns: &str, opts: &ConnectOptions) -> Vec<String> {
    let mut out = Vec::new();
    let r = redis_api(client, ns).get(NAME).await.expect("redis");
    let st = r.status.clone().unwrap_or_default();
    let pods = redis_pods(client, ns, NAME).await;
    let primaries: Vec<String> = if r.spec.shards.is_some() {
        st.shards.iter().filter_map(|s| s.primary.clone()).collect()
    } else {
        st.primary.iter().cloned().collect()
    };
    for (name, p) in &pods {
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            out.push(format!("{name} has no IP while the Redis is Ready"));
            continue;
        };
        let mut n = match Node::connect(&Endpoint::new(&ip, 6379), opts).await {
            Ok(n) => n,
            Err(e) => {
                out.push(format!(
                    "{name} does not answer while the Redis is Ready: {e}"
                ));
                continue;
            }
        };
        let repl = match n.info_section("replication").await {
            Ok(i) => i.replication,
            Err(e) => {
                out.push(format!("INFO replication of {name}: {e}"));
                continue;
            }
        };
        let named_primary = primaries.contains(name);
        match (named_primary, repl.role, repl.link_status) {
            (true, Some(Role::Primary), _) => {}
            (false, Some(Role::Replica), Some(LinkStatus::Up)) => {}
            (p, role, link) => out.push(format!(
                "{name}: the status names it {}, the server says {role:?} (link {link:?})",
                if p { "a primary" } else { "a replica" }
            )),
        }
        if r.spec.shards.is_some() {
            match redpilot::redis::reshard::open_slots_of(&mut n).await {
                Ok(open) if open.is_empty() => {}
                Ok(open) => out.push(format!("{name} has open slots at the end: {open:?}")),
                Err(e) => out.push(format!("open slots of {name}: {e}")),
            }
        }
    }
    if r.spec.shards.is_some()
        && let Some(first) = pods
            .values()
            .find_map(|p| p.status.as_ref()?.pod_ip.clone())
    {
        match Node::connect(&Endpoint::new(&first, 6379), opts).await {
            Ok(mut n) => match redpilot::redis::cluster::nodes(&mut n).await {
                Ok(nodes) => {
                    let mut owned = vec![0u8; 16384];
                    for k in nodes.iter().filter(|k| k.primary && !k.fail) {
                        for range in &k.slots {
                            for s in range.start..=range.end {
                                owned[usize::from(s)] += 1;
                            }
                        }
                    }
                    let wrong: Vec<usize> = (0..16384).filter(|s| owned[*s] != 1).collect();
                    if !wrong.is_empty() {
                        out.push(format!(
                            "{} slots not owned exactly once (the first: {:?})",
                            wrong.len(),
                            &wrong[..wrong.len().min(5)]
                        ));
                    }
                }
                Err(e) => out.push(format!("CLUSTER NODES: {e}")),
            },
            Err(e) => out.push(format!("connecting to {first}: {e}")),
        }
    }
    out
}

/// Keys of `keys` not readable with themselves as their value (Cluster), or
/// missing on the primary (Replication).
async fn missing(
    client: &kube::Client,
    ns: &str,
    name: &str,
    mode: Mode,
    opts: &ConnectOptions,
    keys: &[String],
) -> Result<Vec<String>, String> {
    match mode {
        Mode::Cluster => {
            let pod = redis_pods(client, ns, name)
                .await
                .values()
                .find_map(|p| p.status.as_ref()?.pod_ip.clone())
                .ok_or("no pod with an IP")?;
            let mut c = cluster_client::Client::new(Endpoint::new(pod, 6379), opts.clone());
            cluster_client::try_missing_keys(&mut c, keys).await
        }
        Mode::Replication | Mode::Standalone => {
            let r = redis_api(client, ns)
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            let primary = r
                .status
                .and_then(|s| s.primary)
                .ok_or("no primary in the status")?;
            let ip = support::operator::pod_ip(client, ns, &primary).await;
            let mut n = Node::connect(&Endpoint::new(ip, 6379), opts)
                .await
                .map_err(|e| e.to_string())?;
            Ok(support::writer::missing_on(&mut n, keys).await)
        }
    }
}

/// Reads that found a confirmed key absent (or another value) while it is
/// there at the end (not in `lost`): a server answered for the key's data
/// without a write it had confirmed.
fn stale_reads(reads: &Reads, lost: &[String], violations: &mut Vec<String>) {
    let lost: std::collections::HashSet<&str> = lost.iter().map(String::as_str).collect();
    let stale: Vec<&(f64, String, String)> = reads
        .missed
        .iter()
        .filter(|(_, k, _)| !lost.contains(k.as_str()))
        .collect();
    if let Some((at, key, got)) = stale.first() {
        violations.push(format!(
            "{} reads of confirmed keys found them absent though they are there at the end (the first at {at:.1} s: {key} read {got})",
            stale.len()
        ));
    }
}

/// The pods of the Redis that refuse `user` with `password` (or have no
/// address), once every one takes it or 30 s have passed (a pass or two).
async fn refused_anywhere(
    client: &kube::Client,
    ns: &str,
    base: &ConnectOptions,
    user: &str,
    password: &str,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut refused = Vec::new();
        for (pod, p) in redis_pods(client, ns, NAME).await {
            let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
                refused.push(format!("{pod} has no address"));
                continue;
            };
            let opts = base.clone().with_user(user, password.to_string());
            if let Err(e) = Node::connect(&Endpoint::new(&ip, 6379), &opts).await {
                refused.push(format!("{pod}: {e}"));
            }
        }
        if refused.is_empty() || Instant::now() > deadline {
            return refused;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What one run found.
struct Outcome {
    line: String,
    violations: Vec<String>,
    /// The schedule it ran.
    plan: Vec<(u64, Action)>,
}

/// One run of `seed`: its shape, and its drawn schedule or `given`
/// (the targets of the faults and switchovers are drawn from the seed
/// either way).
async fn run(
    seed: u64,
    duration: u64,
    only: Option<Mode>,
    given: Option<&[(u64, Action)]>,
) -> Outcome {
    let mut rng = Rng(seed);
    let shape = Shape::draw(&mut rng, only, seed);
    let drawn = schedule(&mut rng, &shape, duration, seed);
    let plan = given.map(<[_]>::to_vec).unwrap_or(drawn);
    let client = client().await;
    let tns = TestNamespace::new(&client, &format!("chaos{seed}"), &[]).await;
    let ns = tns.name.clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "chaos-app"},
        "stringData": {"password": APP_PASSWORD}
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &s)
        .await
        .expect("creating the app user's Secret");
    put_auth(&client, &ns, AUTH_PASSWORDS[0]).await;
    if shape.storage {
        support::operator::sized_class(&client).await;
    }
    let mut rotated = 0;
    let mut size_mi = shape.storage_mi();
    let backs_up = plan.iter().any(|(_, a)| *a == Action::Backup);
    if backs_up && !shape.s3 {
        create_claim(&client, &ns, "chaos-backups").await;
    }
    // The S3 server the backups go to (on the node's bridge, where the
    // backup agents in pods reach it), with its credentials lent to the
    // operator.
    let s3 = shape.s3.then(|| {
        Arc::new(std::sync::Mutex::new(
            support::s3_server::S3Server::start_on(NODE_IP, &[BUCKET]),
        ))
    });
    if s3.is_some() {
        let creds: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "chaos-s3", "labels": {"redpilot.io/allow-use": "true"}},
            "stringData": {"AWS_ACCESS_KEY_ID": support::s3_server::ACCESS_KEY,
                           "AWS_SECRET_ACCESS_KEY": support::s3_server::SECRET_KEY}
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &creds)
            .await
            .expect("creating the S3 credentials Secret");
    }
    let target = match &s3 {
        Some(s3) => {
            let endpoint = s3.lock().map(|s| s.endpoint()).expect("the S3 server");
            json!({"s3": {"endpoint": endpoint, "bucket": BUCKET, "prefix": "chaos",
                          "pathStyle": true, "credentials": {"secretName": "chaos-s3"}}})
        }
        None => json!({"volume": {"claimName": "chaos-backups", "path": "chaos"}}),
    };
    // Every way the operator reaches the API server passes this relay
    // ([`Action::CutOperator`] cuts it).
    let relay = Arc::new(support::faults::ApiRelay::start().await);
    let mut opts = OperatorOptions::watching(&[ns.as_str()]).named(&format!("chaos{seed}"));
    opts.api_server = Some(relay.url.clone());
    let mut op = start_operator(&client, opts.clone()).await;
    let mut violations = Vec::new();
    // What the invariants let pass, and why (said in the run's line).
    let mut notes: Vec<String> = Vec::new();
    let mut timeline = Timeline::default();
    let created = Instant::now();
    apply_redis(&client, &ns, NAME, shape.spec()).await;
    let api = redis_api(&client, &ns);
    assert!(
        settles(&api, NAME).await,
        "seed {seed}: {} never became Ready\n{}",
        shape.describe(),
        recent_events(&client, &ns, 40).await
    );
    let ready_in = created.elapsed();
    let mut app = ConnectOptions::default()
        .with_user("app", APP_PASSWORD)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    if shape.tls {
        // The namespace's CA, which the operator made for `tls: {}`.
        let ca = secrets
            .get("redpilot-ca")
            .await
            .ok()
            .and_then(|s| s.data?.get("ca.crt").map(|b| b.0.clone()))
            .expect("Secret redpilot-ca with ca.crt once a Redis with `tls: {}` is Ready");
        app = app.with_tls(redpilot::redis::TlsOptions::servers_of_ca(ca));
    }
    // The ways the clients connect: with TLS, and where the schedule turns
    // TLS off and on again, in plain text too (each reconnect tries the
    // next).
    let flips = plan.iter().any(|(_, a)| *a == Action::TlsFlip);
    let mut ways = vec![app.clone()];
    if flips {
        ways.push(
            ConnectOptions::default()
                .with_user("app", APP_PASSWORD)
                .with_timeouts(Duration::from_millis(500), Duration::from_secs(2)),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cluster_count = Arc::new(AtomicU64::new(0));
    let load = match shape.mode {
        Mode::Replication | Mode::Standalone => {
            Load::Replication(support::faults::ServiceWriter::trying(
                &client,
                &ns,
                NAME,
                ways.clone(),
                "chaos",
                shape.confirm_on(),
                Duration::ZERO,
            ))
        }
        Mode::Cluster => {
            let tally = Arc::new(Mutex::new(Tally::default()));
            let lanes: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
            Load::Cluster(
                (0..3)
                    .map(|id| {
                        cluster_writer(
                            id,
                            true,
                            lane_tags(id as usize),
                            client.clone(),
                            ns.clone(),
                            ways.clone(),
                            stop.clone(),
                            cluster_count.clone(),
                            lanes[id as usize].clone(),
                            tally.clone(),
                        )
                    })
                    .collect(),
                tally,
                lanes,
            )
        }
    };
    // From the sixth stream: a plain writer beside the confirming ones.
    let plain =
        (seed >= SIXTH_FROM).then(|| Plain::start(&shape, &client, &ns, &ways, stop.clone()));
    let mut fills: Vec<tokio::task::JoinHandle<(usize, u64)>> = Vec::new();
    let lanes = load.lanes();
    let t0 = Instant::now();
    timeline.add(t0, format!("load started on {}", shape.describe()));
    let watch = primaries_watch(client.clone(), ns.clone(), app.clone(), stop.clone(), t0);
    let reader = reader(
        shape.mode,
        client.clone(),
        ns.clone(),
        app.clone(),
        load.picker(),
        stop.clone(),
        t0,
        seed,
    );
    // Once a second: the phase and the confirmed writes.
    let sampling = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let (api, sampling, samples) = (api.clone(), sampling.clone(), samples.clone());
        let confirmed = load.counter();
        tokio::spawn(async move {
            while !sampling.load(Ordering::Relaxed) {
                let at = t0.elapsed().as_secs_f64();
                let (state, ready) = match api.get(NAME).await {
                    Ok(r) => {
                        let st = r.status.clone().unwrap_or_default();
                        let state = format!(
                            "phase {:?}, ready {}, primary {:?}, shards {}/{}",
                            st.phase,
                            is_ready(&r),
                            st.primary,
                            st.shards.len(),
                            r.spec.shards.unwrap_or(0)
                        );
                        (state, is_ready(&r))
                    }
                    Err(e) => (format!("reading the Redis: {e}"), false),
                };
                let confirmed = confirmed();
                samples.lock().await.push(Sample {
                    at,
                    state: format!("{state}, writes confirmed {confirmed:?}"),
                    ready,
                    confirmed,
                });
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    // Each backup: its name, the writes confirmed before it was asked for,
    // and when it was asked for.
    let mut backups: Vec<(String, usize, Instant)> = Vec::new();
    // Each fault that took a server away for a while: when, and the pod.
    let mut hits: Vec<(Instant, String)> = Vec::new();
    // Each server fault that hit the last copy in sync of its group's data.
    let mut last_copies: Vec<LastCopy> = Vec::new();
    // Those of claims deleted, once their pods are gone.
    let mut gone: Vec<tokio::task::JoinHandle<LastCopy>> = Vec::new();
    let mut hibernated_at: Vec<Instant> = Vec::new();
    // When the S3 server went down.
    let mut s3_down: Vec<Instant> = Vec::new();
    // When the last fault that lasts (a stop, a cut, a starving) ends.
    let mut faults_end = Instant::now();
    let mut engine = (shape.engine, shape.version);
    let mut app_rotated = false;
    let mut roll = 0;
    // The logs of operators killed on the way (checked with the last one's).
    let mut earlier_logs = String::new();
    for (at, action) in &plan {
        let when = t0 + Duration::from_secs(*at);
        tokio::time::sleep_until(tokio::time::Instant::from_std(when)).await;
        let done = match action {
            Action::Switchover => {
                let r = api.get(NAME).await.expect("redis");
                match switchover_target(&r, &mut rng) {
                    Some(target) => {
                        patch_redis(
                            &client,
                            &ns,
                            NAME,
                            json!({"spec": {"failover": {"switchoverTo": target}}}),
                        )
                        .await;
                        format!("switchover to {target} asked")
                    }
                    None => "switchover drawn, no ready replica to name: skipped".into(),
                }
            }
            Action::Roll => {
                roll += 1;
                let value = 500 + roll;
                patch_redis(
                    &client,
                    &ns,
                    NAME,
                    json!({"spec": {"config": {"tcp-backlog": value.to_string()}}}),
                )
                .await;
                format!("tcp-backlog {value} (a restart of every server)")
            }
            Action::Backup => {
                let name = format!("b{}", backups.len() + 1);
                let before = confirmed_now(&load, &cluster_count);
                create_backup(
                    &client,
                    &ns,
                    &name,
                    json!({"redis": NAME, "target": target}),
                )
                .await;
                backups.push((name.clone(), before, Instant::now()));
                format!("backup {name} asked ({before} writes confirmed before)")
            }
            Action::Shards => {
                let r = api.get(NAME).await.expect("redis");
                let to = if r.spec.shards.unwrap_or(3) >= 4 {
                    3
                } else {
                    4
                };
                patch_redis(&client, &ns, NAME, json!({"spec": {"shards": to}})).await;
                format!("spec.shards {to}")
            }
            Action::KillServer | Action::StopServer => {
                match drawn_pod(&client, &ns, &mut rng).await {
                    Some((name, pod)) => match pid_of(&pod, &app).await {
                        Ok(pid) if *action == Action::KillServer => {
                            // With AOF a killed server keeps what it acknowledged.
                            let last = if shape.aof {
                                None
                            } else {
                                last_copy(&client, &ns, &name, shape.mode, &app).await
                            };
                            kill_9(pid);
                            hits.push((Instant::now(), name.clone()));
                            last_copies.extend(last.map(|why| LastCopy {
                                confirmed: confirmed_now(&load, &cluster_count),
                                at: chrono::Utc::now(),
                                why,
                            }));
                            format!("kill -9 of {name}'s server (pid {pid})")
                        }
                        Ok(pid) => {
                            hits.push((Instant::now(), name.clone()));
                            signal(pid, "-STOP");
                            faults_end = faults_end.max(Instant::now() + Duration::from_secs(3));
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_secs(3)).await;
                                let _ = std::process::Command::new("kill")
                                    .args(["-CONT", &pid.to_string()])
                                    .status();
                            });
                            format!("SIGSTOP of {name}'s server (pid {pid}) for 3 s")
                        }
                        Err(e) => format!(
                            "{action:?} drawn on {name}, which does not answer ({e}): skipped"
                        ),
                    },
                    None => format!("{action:?} drawn, no pod: skipped"),
                }
            }
            Action::DeletePod => match drawn_pod(&client, &ns, &mut rng).await {
                Some((name, _)) => {
                    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                    // With AOF on a volume a deleted pod keeps it too.
                    let last = if shape.aof && shape.storage {
                        None
                    } else {
                        last_copy(&client, &ns, &name, shape.mode, &app).await
                    };
                    match pods.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {
                            hits.push((Instant::now(), name.clone()));
                            last_copies.extend(last.map(|why| LastCopy {
                                confirmed: confirmed_now(&load, &cluster_count),
                                at: chrono::Utc::now(),
                                why,
                            }));
                            format!("pod {name} deleted")
                        }
                        Err(e) => format!("deleting pod {name}: {e}"),
                    }
                }
                None => "pod deletion drawn, no pod: skipped".into(),
            },
            Action::Rotate => {
                if rotated + 1 < AUTH_PASSWORDS.len() {
                    rotated += 1;
                    put_auth(&client, &ns, AUTH_PASSWORDS[rotated]).await;
                    // Secrets are not watched: a change of the Redis starts
                    // the pass that reads it.
                    patch_redis(
                        &client,
                        &ns,
                        NAME,
                        json!({"metadata": {"annotations": {"chaos/rotated": rotated.to_string()}}}),
                    )
                    .await;
                    format!("the operator's password rotated (to #{rotated})")
                } else {
                    "rotation drawn, every password used: skipped".into()
                }
            }
            Action::Hibernate => {
                let t = Instant::now();
                hibernated_at.push(t);
                patch_redis(&client, &ns, NAME, json!({"spec": {"hibernate": true}})).await;
                let mut saved = false;
                while t.elapsed() < Duration::from_secs(90) {
                    let r = api.get(NAME).await.ok();
                    let at = r.and_then(|r| r.status?.hibernation?.saved_at);
                    if at.is_some() && redis_pods(&client, &ns, NAME).await.is_empty() {
                        saved = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                patch_redis(&client, &ns, NAME, json!({"spec": {"hibernate": false}})).await;
                if saved {
                    format!(
                        "hibernated (saved, no pod) in {:.1} s, then woken",
                        t.elapsed().as_secs_f64()
                    )
                } else {
                    "hibernation asked, not saved with every pod gone within 90 s; woken".into()
                }
            }
            Action::Grow => {
                size_mi += 32;
                patch_redis(
                    &client,
                    &ns,
                    NAME,
                    json!({"spec": {"storage": {"size": format!("{size_mi}Mi")}}}),
                )
                .await;
                format!("spec.storage.size {size_mi}Mi")
            }
            // The test ground's Valkey builds have no TLS: an upgrade from
            // Redis 7.0 with TLS on would only see its first pod fail and
            // the upgrade turned back (drawn all the same: the seed's other
            // draws stay).
            Action::Upgrade if shape.tls => {
                "upgrade drawn, TLS on and the test ground's Valkey has no TLS: skipped".into()
            }
            Action::Upgrade => match upgrade_of(shape.mode, engine.0, engine.1) {
                Some(to) => {
                    patch_redis(
                        &client,
                        &ns,
                        NAME,
                        json!({"spec": {"engine": to.0, "version": to.1}}),
                    )
                    .await;
                    let from = std::mem::replace(&mut engine, to);
                    format!("upgrade {} {} to {} {}", from.0, from.1, to.0, to.1)
                }
                None => format!(
                    "upgrade drawn, none from {} {}: skipped",
                    engine.0, engine.1
                ),
            },
            Action::AppRotate => {
                if app_rotated {
                    "application user rotation drawn, done already: skipped".into()
                } else {
                    app_rotated = true;
                    let s: Secret = serde_json::from_value(json!({
                        "apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "chaos-app-2"},
                        "stringData": {"password": APP_PASSWORD_2}
                    }))
                    .expect("secret");
                    secrets
                        .create(&PostParams::default(), &s)
                        .await
                        .expect("the application user's second Secret");
                    let mut users = shape.spec()["users"].clone();
                    users[0]["passwords"] =
                        json!([{"secretName": "chaos-app"}, {"secretName": "chaos-app-2"}]);
                    patch_redis(&client, &ns, NAME, json!({"spec": {"users": users}})).await;
                    "user app given a second password".into()
                }
            }
            Action::Partition => match drawn_pod(&client, &ns, &mut rng).await {
                Some((name, pod)) => match pod.status.and_then(|s| s.pod_ip) {
                    Some(ip) => {
                        // The pod may go away between the look and the cut:
                        // then there is nothing to cut (the helpers panic).
                        let cut = tokio::task::spawn_blocking(move || {
                            std::panic::catch_unwind(|| {
                                let mut p = support::faults::Partition::of(&ip);
                                p.cut();
                                p
                            })
                            .ok()
                        })
                        .await
                        .ok()
                        .flatten();
                        match cut {
                            Some(p) => {
                                hits.push((Instant::now(), name.clone()));
                                faults_end = faults_end.max(Instant::now() + PARTITION);
                                tokio::spawn(async move {
                                    tokio::time::sleep(PARTITION).await;
                                    // Dropping it brings the link up again.
                                    drop(p);
                                });
                                format!("pod {name} cut off for {PARTITION:?}")
                            }
                            None => format!("partition drawn on {name}, gone: skipped"),
                        }
                    }
                    None => format!("partition drawn on {name}, no address: skipped"),
                },
                None => "partition drawn, no pod: skipped".into(),
            },
            Action::Starve => match drawn_pod(&client, &ns, &mut rng).await {
                Some((name, pod)) => match pid_of(&pod, &app).await {
                    Ok(pid) => {
                        hits.push((Instant::now(), name.clone()));
                        faults_end = faults_end.max(Instant::now() + STARVE);
                        tokio::spawn(async move {
                            let until = Instant::now() + STARVE;
                            while Instant::now() < until {
                                signal_quiet(pid, "-STOP");
                                tokio::time::sleep(Duration::from_millis(90)).await;
                                signal_quiet(pid, "-CONT");
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            signal_quiet(pid, "-CONT");
                        });
                        format!(
                            "{name}'s server (pid {pid}) starved: stopped 90 ms of every 100 for {STARVE:?}"
                        )
                    }
                    Err(e) => {
                        format!("starving drawn on {name}, which does not answer ({e}): skipped")
                    }
                },
                None => "starving drawn, no pod: skipped".into(),
            },
            Action::DeleteClaim => match drawn_pod(&client, &ns, &mut rng).await {
                Some((name, old)) => {
                    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
                        Api::namespaced(client.clone(), &ns);
                    let claim = format!("data-{name}");
                    // Its data goes with the volume, AOF or not.
                    let last = last_copy(&client, &ns, &name, shape.mode, &app).await;
                    let c = claims.delete(&claim, &DeleteParams::default()).await;
                    let p = pods.delete(&name, &DeleteParams::default()).await;
                    match (c, p) {
                        (Ok(_), Ok(_)) => {
                            hits.push((Instant::now(), name.clone()));
                            // The server takes writes until its pod is
                            // gone (a graceful stop), and they go with the
                            // volume: the writes confirmed by then.
                            if let Some(why) = last {
                                let count = load.counter();
                                let (kube, ns, pod) = (client.clone(), ns.clone(), name.clone());
                                let uid = old.metadata.uid.clone();
                                let at = chrono::Utc::now();
                                gone.push(tokio::spawn(async move {
                                    pod_gone(&kube, &ns, &pod, uid).await;
                                    LastCopy {
                                        confirmed: count().iter().sum(),
                                        at,
                                        why,
                                    }
                                }));
                            }
                            format!("pod {name} deleted with its claim {claim}")
                        }
                        (c, p) => format!(
                            "deleting pod {name} ({}) with its claim {claim} ({}): skipped",
                            p.err().map(|e| e.to_string()).unwrap_or("deleted".into()),
                            c.err().map(|e| e.to_string()).unwrap_or("deleted".into()),
                        ),
                    }
                }
                None => "pod and claim deletion drawn, no pod: skipped".into(),
            },
            Action::S3Down => match &s3 {
                Some(server) => {
                    if let Ok(mut s) = server.lock() {
                        s.kill();
                    }
                    s3_down.push(Instant::now());
                    faults_end = faults_end.max(Instant::now() + S3_DOWN);
                    let server = server.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(S3_DOWN).await;
                        let _ = tokio::task::spawn_blocking(move || {
                            if let Ok(mut s) = server.lock() {
                                s.restart();
                            }
                        })
                        .await;
                    });
                    format!("the S3 server down for {S3_DOWN:?}")
                }
                None => "S3 down drawn, the backups go to a volume: skipped".into(),
            },
            Action::CutOperator => {
                relay.cut();
                faults_end = faults_end.max(Instant::now() + OPERATOR_CUT);
                let r = relay.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(OPERATOR_CUT).await;
                    r.heal();
                });
                format!("the operator cut off the API server for {OPERATOR_CUT:?}")
            }
            Action::KillOperator => {
                earlier_logs.push_str(&op.log_text());
                op.kill();
                op = spawn_operator(&client, opts.clone().named(&format!("chaos{seed}"))).await;
                "operator kill -9, a new one started".into()
            }
            Action::ArmFailpoints => {
                earlier_logs.push_str(&op.log_text());
                op.kill();
                let mut armed = opts.clone().named(&format!("chaos{seed}"));
                armed
                    .env
                    .push(("REDPILOT_FAILPOINTS".into(), FAILPOINTS.join(",")));
                armed.restart_after_failpoint = true;
                op = spawn_operator(&client, armed).await;
                "operator kill -9, a new one started armed at its failpoints".into()
            }
            Action::TlsFlip => {
                let t = Instant::now();
                patch_redis(&client, &ns, NAME, json!({"spec": {"tls": null}})).await;
                let mut off = false;
                while t.elapsed() < FLIP_WAIT {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if api.get(NAME).await.ok().is_some_and(|r| settled(&r)) {
                        off = true;
                        break;
                    }
                }
                let took = t.elapsed().as_secs_f64();
                patch_redis(&client, &ns, NAME, json!({"spec": {"tls": {}}})).await;
                faults_end = faults_end.max(Instant::now());
                if off {
                    format!("TLS turned off (settled in {took:.1} s), then on again")
                } else {
                    format!("TLS turned off, not settled within {FLIP_WAIT:?}; on again")
                }
            }
            Action::Fill => {
                let lane = fills.len() % 3;
                let seed = seed ^ ((fills.len() as u64 + 1) << 32);
                fills.push(fill(
                    shape.mode,
                    client.clone(),
                    ns.clone(),
                    app.clone(),
                    lane,
                    seed,
                ));
                format!(
                    "a fill of {} MiB over {FILL_TIME:?} into {}",
                    fill_mib(),
                    if shape.mode == Mode::Cluster {
                        format!("the slots of s{lane}")
                    } else {
                        "the primary".to_string()
                    }
                )
            }
        };
        let kind = if action.is_fault() { "fault" } else { "op" };
        timeline.add(t0, format!("{kind}: {done}"));
    }
    // The status lags a fault by up to a pass: the Redis counts as
    // settled once it has been so for 3 s running, looked at from 5 s after
    // the last event ended (a fault that lasts, the operator cut off, say,
    // ends later than it began: until then the status may be stale).
    let last = faults_end.max(Instant::now());
    tokio::time::sleep_until(tokio::time::Instant::from_std(
        last + Duration::from_secs(5),
    ))
    .await;
    let mut since: Option<Instant> = None;
    let converged = loop {
        let r = api.get(NAME).await.ok();
        if r.as_ref().is_some_and(settled) {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() >= Duration::from_secs(3) {
                break Some(s - last);
            }
        } else {
            since = None;
        }
        if last.elapsed() > CONVERGE {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    timeline.add(
        t0,
        match converged {
            Some(d) => format!("settled {:.1} s after the last event", d.as_secs_f64()),
            None => format!("NOT settled {CONVERGE:?} after the last event"),
        },
    );
    if converged.is_none() {
        violations.push(format!(
            "not Ready with every change done {CONVERGE:?} after the last event"
        ));
    }
    // Writes go on a little after convergence: the Redis takes them again.
    let before_end = confirmed_now(&load, &cluster_count);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_end = confirmed_now(&load, &cluster_count);
    if converged.is_some() && after_end <= before_end {
        let recent = match &load {
            Load::Cluster(_, t, _) => t.lock().await.recent.clone(),
            Load::Replication(_) => Vec::new(),
        };
        violations.push(format!(
            "no write confirmed in the 3 s after convergence ({after_end} in all; the writers' last errors: {recent:?})"
        ));
    }
    for g in gone {
        last_copies.extend(g.await.ok());
    }
    stop.store(true, Ordering::Relaxed);
    let written = load.stop().await;
    let answered = match plain {
        Some(p) => Some(p.stop().await),
        None => None,
    };
    let mut filled = Vec::new();
    for f in fills {
        filled.push(f.await.unwrap_or_default());
    }
    let reads = reader.await.unwrap_or_default();
    violations.extend(watch.await.unwrap_or_default());
    sampling.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    if converged.is_some() {
        match missing(&client, &ns, NAME, shape.mode, &app, &written.acked).await {
            Ok(lost) if lost.is_empty() => stale_reads(&reads, &[], &mut violations),
            Ok(lost) => {
                stale_reads(&reads, &lost, &mut violations);
                let (excused, lost) = excuse_last_copy(&written.acked, lost, &last_copies);
                if !excused.is_empty() {
                    notes.push(format!(
                        "{} confirmed writes lost, all confirmed before a fault took the last copy in sync (a server killed or a pod deleted without AOF to bring it back, a claim deleted), as the shape allows: {}",
                        excused.len(),
                        last_copies
                            .iter()
                            .map(|c| c.why.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                if !lost.is_empty() {
                    violations.push(format!(
                        "{} of {} confirmed writes lost (the first: {:?})",
                        lost.len(),
                        written.acked.len(),
                        &lost[..lost.len().min(5)]
                    ));
                }
            }
            Err(e) => violations.push(format!("could not check the writes: {e}")),
        }
        // The status agrees with the servers within 30 s (a pass or two).
        let deadline = Instant::now() + Duration::from_secs(30);
        let disagree = loop {
            let found = status_agrees(&client, &ns, &app).await;
            if found.is_empty() || Instant::now() > deadline {
                break found;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        violations.extend(disagree);
        // The operator's own user takes the last password everywhere, and
        // the application user its second one.
        let password = AUTH_PASSWORDS[rotated];
        let refused = refused_anywhere(&client, &ns, &app, OPERATOR_USER, password).await;
        if !refused.is_empty() {
            violations.push(format!(
                "the operator's user does not take password #{rotated} everywhere: {refused:?}"
            ));
        }
        if app_rotated {
            let refused = refused_anywhere(&client, &ns, &app, "app", APP_PASSWORD_2).await;
            if !refused.is_empty() {
                violations.push(format!(
                    "user app does not take its second password everywhere: {refused:?}"
                ));
            }
        }
    }
    // Every backup ends, Completed unless a fault took its source away
    // while it ran (or hibernation did); the last Completed one restores
    // what was confirmed before it was asked for.
    let mut restored = None;
    let mut ended = Vec::new();
    let backup_api: Api<redpilot::api::v1alpha1::RedisBackup> =
        Api::namespaced(client.clone(), &ns);
    for (name, before, asked) in &backups {
        let deadline = Instant::now() + Duration::from_secs(240);
        let phase = loop {
            let phase = backup_api
                .get(name)
                .await
                .ok()
                .and_then(|b| b.status?.phase);
            if matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed))
                || Instant::now() > deadline
            {
                break phase;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        ended.push(format!("{name} {phase:?}"));
        match phase {
            Some(BackupPhase::Completed) => restored = Some((name.clone(), *before)),
            Some(BackupPhase::Failed) => {
                let st = backup_api
                    .get(name)
                    .await
                    .ok()
                    .and_then(|b| b.status)
                    .unwrap_or_default();
                let sources: Vec<String> = st
                    .source
                    .iter()
                    .cloned()
                    .chain(st.shards.iter().map(|s| s.source.clone()))
                    .filter(|s| !s.is_empty())
                    .collect();
                let hit = hits
                    .iter()
                    .any(|(at, pod)| at >= asked && (sources.is_empty() || sources.contains(pod)));
                let slept = hibernated_at.iter().any(|at| at >= asked);
                // The store down while it ran (these backups take seconds;
                // a minute is ample): said as such, not a violation (a
                // Failed backup says why; the next one is taken anew).
                let store_down = !hit
                    && !slept
                    && s3_down.iter().any(|at| {
                        *at + S3_DOWN >= *asked && *at <= *asked + Duration::from_secs(60)
                    });
                if store_down {
                    notes.push(format!(
                        "backup {name} Failed while the S3 server was down ({}: {})",
                        st.reason.as_deref().unwrap_or("no reason"),
                        st.message.as_deref().unwrap_or("no message")
                    ));
                }
                if !hit && !slept && !store_down {
                    violations.push(format!(
                        "backup {name} Failed ({}: {}) though no fault took its source ({}) away while it ran",
                        st.reason.as_deref().unwrap_or("no reason"),
                        st.message.as_deref().unwrap_or("no message"),
                        if sources.is_empty() { "not chosen".to_string() } else { sources.join(", ") }
                    ));
                }
            }
            other => violations.push(format!("backup {name} did not end in 240 s ({other:?})")),
        }
    }
    if let Some((backup, before)) = &restored
        && converged.is_some()
    {
        // The shape the backup was taken of (a resharding may have changed
        // the shard count since the Redis was made).
        let mut spec = shape.spec();
        // What the Redis runs now (an upgrade may have moved it on; the
        // backup of an older server loads into it).
        spec["engine"] = json!(engine.0);
        spec["version"] = json!(engine.1);
        if let Some(shards) = backup_api
            .get(backup)
            .await
            .ok()
            .and_then(|b| b.status?.origin?.shards)
        {
            spec["shards"] = json!(shards);
        }
        spec["bootstrap"] = json!({"fromBackup": {"backup": backup}});
        // The fills may hold more than a first 64Mi instance takes: the
        // restore gets the autopilot's largest size from the start.
        if shape.autopilot {
            let max = shape.autopilot_max();
            spec["resources"] = json!({"limits": {"memory": max}, "requests": {"memory": max}});
            if let Some(o) = spec.as_object_mut() {
                o.remove("autopilot");
            }
        }
        // A restore is made without AOF (admission says so: a server with
        // AOF on would ignore the restored RDB file); AOF comes after.
        if let Some(o) = spec.as_object_mut() {
            o.remove("persistence");
        }
        apply_redis(&client, &ns, "restored", spec).await;
        if !settles(&api, "restored").await {
            violations.push(format!(
                "the Redis restored from {backup} never became Ready"
            ));
        } else {
            let keys = &written.acked[..(*before).min(written.acked.len())];
            match missing(&client, &ns, "restored", shape.mode, &app, keys).await {
                Ok(lost) if lost.is_empty() => {}
                Ok(lost) => {
                    // Writes the Redis had lost before the backup started
                    // (a fault on the last copy in sync) are not in it
                    // either: the snapshot is of what the Redis held then.
                    let started = backup_api
                        .get(backup)
                        .await
                        .ok()
                        .and_then(|b| b.status?.started_at)
                        .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok());
                    let earlier = last_copies
                        .iter()
                        .filter(|c| started.is_some_and(|s| c.at < s));
                    let (excused, lost) = excuse_last_copy(&written.acked, lost, earlier);
                    if !excused.is_empty() {
                        notes.push(format!(
                            "the restore of {backup} lacks {} writes the Redis had lost before it started",
                            excused.len()
                        ));
                    }
                    if !lost.is_empty() {
                        violations.push(format!(
                            "the restore of {backup} lacks {} of the {} writes confirmed before it was asked for (the first: {:?})",
                            lost.len(),
                            keys.len(),
                            &lost[..lost.len().min(5)]
                        ));
                    }
                }
                Err(e) => violations.push(format!("could not check the restore: {e}")),
            }
        }
        timeline.add(t0, format!("restored {backup} into a new Redis: checked"));
    }
    // No password anywhere it must not be; no panic.
    let log = format!("{earlier_logs}{}", op.log_text());
    let events = recent_events(&client, &ns, 400).await;
    let status =
        serde_json::to_string(&api.get(NAME).await.ok().and_then(|r| r.status)).unwrap_or_default();
    for (what, text) in [
        ("operator log", &log),
        ("events", &events),
        ("status", &status),
    ] {
        // The operator's password comes from `chaos-auth` (no generated one).
        let mut secrets = vec![
            ("app", APP_PASSWORD),
            ("app's second", APP_PASSWORD_2),
            ("S3 secret key's", support::s3_server::SECRET_KEY),
        ];
        secrets.extend(
            AUTH_PASSWORDS[..=rotated]
                .iter()
                .map(|p| ("operator's", *p)),
        );
        for (which, secret) in secrets {
            if !secret.is_empty() && text.contains(secret) {
                violations.push(format!("the {which} password is in the {what}"));
            }
        }
    }
    if log.contains("panicked at") {
        violations.push("the operator panicked (see its log)".into());
    }

    // The sixth stream's facts: the plain writes lost (counted, nothing
    // promised of them), the fills, what the autopilots did, the
    // failpoints the operator stopped at.
    let mut sixth = Vec::new();
    if let Some(keys) = &answered {
        let lost = if converged.is_some() {
            match missing(&client, &ns, NAME, shape.mode, &app, keys).await {
                Ok(l) => l.len().to_string(),
                Err(e) => format!("? ({e})"),
            }
        } else {
            "?".into()
        };
        sixth.push(format!("plain writes {} answered, {lost} lost", keys.len()));
    }
    if !filled.is_empty() {
        let f: Vec<String> = filled
            .iter()
            .map(|(mib, failed)| format!("{mib} MiB ({failed} failed)"))
            .collect();
        sixth.push(format!("fills {}", f.join(", ")));
    }
    if shape.autopilot {
        let r = api.get(NAME).await.ok();
        let a = r
            .as_ref()
            .and_then(|r| r.status.as_ref()?.autopilot.clone());
        let ap = serde_json::to_string(&a).unwrap_or_default();
        timeline.add(t0, format!("autopilot status at the end: {ap}"));
        let limit = a
            .as_ref()
            .and_then(|a| Some(a.memory.as_ref()?.limit.clone()))
            .unwrap_or_else(|| "64Mi".into());
        sixth.push(format!(
            "autopilots: memory limit {limit}, shards {}",
            r.and_then(|r| r.spec.shards)
                .map(|n| n.to_string())
                .unwrap_or("-".into())
        ));
    }
    let stopped_at: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("stopped at failpoint ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    if plan.iter().any(|(_, a)| *a == Action::ArmFailpoints) {
        sixth.push(format!("failpoints stopped at {stopped_at:?}"));
    }
    let sixth = if sixth.is_empty() {
        String::new()
    } else {
        format!(" | {}", sixth.join(", "))
    };
    let events_drawn: Vec<String> = plan.iter().map(|(t, a)| format!("{t}s {a:?}")).collect();
    let line = format!(
        "seed {seed}: {} | Ready in {:.0} s | {} | {} writes confirmed, errors {:?} | reads {} as written, {} absent, {} failed{sixth} | {} | backups [{}] | {}{}",
        shape.describe(),
        ready_in.as_secs_f64(),
        events_drawn.join(", "),
        written.acked.len(),
        written.errors,
        reads.ok,
        reads.missed.len(),
        reads.errors,
        match converged {
            Some(d) => format!("settled {:.1} s after the last event", d.as_secs_f64()),
            None => "not settled".into(),
        },
        ended.join(", "),
        notes
            .iter()
            .map(|n| format!("excused: {n} | "))
            .collect::<String>(),
        if violations.is_empty() {
            "no violation".to_string()
        } else {
            format!("VIOLATIONS: {}", violations.join("; "))
        }
    );
    // The timeline file.
    let mut text = String::new();
    let _ = writeln!(text, "{line}");
    let _ = writeln!(
        text,
        "replay: {}",
        replay(seed, duration, only, given.map(|_| plan.as_slice()))
    );
    let samples = std::mem::take(&mut *samples.lock().await);
    let picture = timeline_svg(
        &format!("seed {seed}: {}", shape.describe()),
        &timeline.lines,
        &samples,
        &lanes,
        &violations,
    );
    let mut all = timeline.lines;
    all.extend(samples.iter().map(|s| (s.at, s.state.clone())));
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, what) in &all {
        let _ = writeln!(text, "{at:8.1} s  {what}");
    }
    let _ = writeln!(text, "--- events\n{events}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!("seed-{seed}.txt"));
    let _ = std::fs::write(&file, text);
    let _ = std::fs::write(dir.join(format!("seed-{seed}.svg")), picture);
    op.kill();
    Outcome {
        plan: plan.clone(),
        line: format!(
            "{line}\n  timeline: {} (picture: seed-{seed}.svg beside it)",
            file.display()
        ),
        violations,
    }
}

/// Escapes text for SVG.
fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A run's timeline as a picture: the operations (blue) and faults (red)
/// on the time axis with their labels, beneath them whether the Redis was
/// Ready each second (green, grey when not), and beneath that the writes
/// confirmed per second, one row per writer lane (`lanes`: for a Cluster
/// each lane writes the keys of one shard's first slots, so a shard's stall
/// shows in its row alone; a gap is a stretch without bars); the
/// violations, if any, in red under the title.
fn timeline_svg(
    title: &str,
    events: &[(f64, String)],
    samples: &[Sample],
    lanes: &[String],
    violations: &[String],
) -> String {
    const W: f64 = 1000.0;
    const LEFT: f64 = 90.0;
    const RIGHT: f64 = 20.0;
    const LANES: usize = 7;
    let end = samples
        .iter()
        .map(|s| s.at)
        .chain(events.iter().map(|e| e.0))
        .fold(1.0_f64, f64::max)
        .ceil();
    let x = |t: f64| LEFT + (W - LEFT - RIGHT) * (t / end);
    let top = 50.0 + 16.0 * violations.len().min(4) as f64;
    let lanes_y = top;
    let ready_y = lanes_y + 18.0 * LANES as f64 + 10.0;
    let writes_y = ready_y + 30.0;
    let rows = lanes.len().max(1);
    let row_h = if rows == 1 { 120.0 } else { 60.0 };
    let axis_y = writes_y + (row_h + 10.0) * rows as f64 - 5.0;
    let h = axis_y + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r##"<rect width="{W}" height="{h}" fill="#ffffff"/>"##);
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#,
        xml(title)
    );
    for (i, v) in violations.iter().take(4).enumerate() {
        let _ = writeln!(
            out,
            r##"<text class="violation" x="10" y="{}" fill="#c62828">violation: {}</text>"##,
            40.0 + 16.0 * i as f64,
            xml(&v.chars().take(150).collect::<String>())
        );
    }
    // Operations and faults: a line down through the bands and a label in
    // one of LANES rows, so close events do not cover each other.
    let marked: Vec<(f64, &str, &str)> = events
        .iter()
        .filter_map(|(at, what)| {
            if let Some(rest) = what.strip_prefix("fault: ") {
                Some((*at, "fault", rest))
            } else {
                what.strip_prefix("op: ").map(|rest| (*at, "op", rest))
            }
        })
        .collect();
    for (i, (at, kind, what)) in marked.iter().enumerate() {
        let colour = if *kind == "fault" {
            "#c62828"
        } else {
            "#1565c0"
        };
        let lane_y = lanes_y + 18.0 * (i % LANES) as f64 + 12.0;
        let _ = writeln!(
            out,
            r#"<line class="{kind}" x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="{colour}" stroke-width="1" stroke-opacity="0.6"/>"#,
            x(*at),
            lane_y - 10.0,
            axis_y
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{lane_y:.1}" fill="{colour}">{:.0} s {}</text>"#,
            x(*at) + 3.0,
            at,
            xml(&what.chars().take(48).collect::<String>())
        );
    }
    // Ready, each second.
    let _ = writeln!(
        out,
        r#"<text x="10" y="{:.1}">Ready</text>"#,
        ready_y + 11.0
    );
    for w in samples.windows(2) {
        let colour = if w[0].ready { "#2e7d32" } else { "#bdbdbd" };
        let _ = writeln!(
            out,
            r#"<rect class="ready" x="{:.1}" y="{ready_y:.1}" width="{:.2}" height="14" fill="{colour}"/>"#,
            x(w[0].at),
            (x(w[1].at) - x(w[0].at)).max(0.5)
        );
    }
    // Confirmed writes per second, a row per lane on one scale.
    let count = |s: &Sample, lane: usize| s.confirmed.get(lane).copied().unwrap_or(0);
    let rates: Vec<Vec<(f64, f64, f64)>> = (0..rows)
        .map(|lane| {
            samples
                .windows(2)
                .map(|w| {
                    let dt = (w[1].at - w[0].at).max(0.001);
                    let n = count(&w[1], lane).saturating_sub(count(&w[0], lane)) as f64;
                    (w[0].at, w[1].at, n / dt)
                })
                .collect()
        })
        .collect();
    let peak = rates.iter().flatten().map(|r| r.2).fold(1.0_f64, f64::max);
    for (lane, row) in rates.iter().enumerate() {
        let y = writes_y + (row_h + 10.0) * lane as f64;
        let name = lanes.get(lane).map_or("writes/s", String::as_str);
        let _ = writeln!(
            out,
            r#"<text x="10" y="{:.1}">{}</text><text x="10" y="{:.1}">{peak:.0}/s</text>"#,
            y + row_h / 2.0,
            xml(name),
            y + 10.0
        );
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#000000"/>"##,
            y + row_h,
            W - RIGHT
        );
        for (from, to, rate) in row {
            let bar = row_h * rate / peak;
            let _ = writeln!(
                out,
                r##"<rect class="writes" data-lane="{lane}" x="{:.1}" y="{:.1}" width="{:.2}" height="{bar:.1}" fill="#455a64"/>"##,
                x(*from),
                y + row_h - bar,
                (x(*to) - x(*from) - 0.5).max(0.5)
            );
        }
    }
    // The time axis, a tick every 10 s.
    let mut t = 0.0;
    while t <= end {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.1}" y1="{axis_y:.1}" x2="{0:.1}" y2="{1:.1}" stroke="#000000"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{t:.0} s</text>"##,
            x(t),
            axis_y + 5.0,
            axis_y + 18.0
        );
        t += 10.0;
    }
    out.push_str("</svg>\n");
    out
}

/// The command that runs `seed` again (with `plan` as its schedule when
/// it is not the drawn one).
fn replay(seed: u64, duration: u64, only: Option<Mode>, plan: Option<&[(u64, Action)]>) -> String {
    let mut cmd = format!("make chaos SEED={seed} RUNS=1 DURATION={duration}");
    if let Some(m) = only {
        let _ = write!(cmd, " ONLY={}", format!("{m:?}").to_lowercase());
    }
    if let Some(plan) = plan {
        let _ = write!(cmd, " SCHEDULE={}", schedule_text(plan));
    }
    cmd
}

/// Creates or replaces the operator's password Secret `chaos-auth`.
async fn put_auth(client: &kube::Client, ns: &str, password: &str) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "chaos-auth", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"password": password}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            "chaos-auth",
            &PatchParams::apply("chaos").force(),
            &Patch::Apply(&s),
        )
        .await
        .expect("the operator's password Secret");
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seeded_schedules_of_operations_and_faults_keep_every_invariant() {
    let only = match std::env::var("REDPILOT_CHAOS_ONLY").ok().as_deref() {
        Some("replication") => Some(Mode::Replication),
        Some("cluster") => Some(Mode::Cluster),
        Some("standalone") => Some(Mode::Standalone),
        Some("") | None => None,
        Some(other) => panic!("REDPILOT_CHAOS_ONLY={other}: standalone, replication or cluster"),
    };
    let duration = env_u64("REDPILOT_CHAOS_DURATION").unwrap_or(SHORT_DURATION);
    // REDPILOT_CHAOS_SEEDS: `regressions` or a list (`4,6,12`); else
    // REDPILOT_CHAOS_SEED and _RUNS; else the short seeds.
    let listed = std::env::var("REDPILOT_CHAOS_SEEDS")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let seeds: Vec<u64> = match (listed.as_deref(), env_u64("REDPILOT_CHAOS_SEED")) {
        (Some("regressions"), _) => REGRESSION_SEEDS.to_vec(),
        (Some(list), _) => list
            .split(',')
            .map(|x| {
                x.trim().parse().unwrap_or_else(|_| {
                    panic!("REDPILOT_CHAOS_SEEDS={list}: `regressions` or seeds like 4,6,12")
                })
            })
            .collect(),
        (None, Some(first)) => {
            let runs = env_u64("REDPILOT_CHAOS_RUNS").unwrap_or(1);
            (first..first + runs).collect()
        }
        (None, None) => SHORT_SEEDS.to_vec(),
    };
    // REDPILOT_CHAOS_DRAW=1: print what each seed draws, run nothing.
    if std::env::var("REDPILOT_CHAOS_DRAW").is_ok_and(|v| v == "1") {
        for seed in seeds {
            let mut rng = Rng(seed);
            let shape = Shape::draw(&mut rng, only, seed);
            let plan = schedule(&mut rng, &shape, duration, seed);
            println!(
                "seed {seed}: {} | {}",
                shape.describe(),
                schedule_text(&plan)
            );
        }
        return;
    }
    // REDPILOT_CHAOS_SCHEDULE: this schedule instead of the drawn one.
    let given = std::env::var("REDPILOT_CHAOS_SCHEDULE")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_schedule(&s).unwrap_or_else(|e| panic!("REDPILOT_CHAOS_SCHEDULE: {e}")));
    // REDPILOT_CHAOS_SHRINK=1: a run with a violation is run again
    // without each event in turn, keeping every removal after which a
    // violation still shows, down to a schedule where every event counts.
    let shrink = std::env::var("REDPILOT_CHAOS_SHRINK").is_ok_and(|v| v == "1");
    // REDPILOT_CHAOS_JOBS: this many seeds run at once (each in its own
    // namespace with its own operator); shrinking runs one at a time.
    // Seeds run one at a time unless asked: side by side they share the
    // machine's cores with each other and with whatever else runs.
    let jobs = env_u64("REDPILOT_CHAOS_JOBS").unwrap_or(1).max(1) as usize;
    let given = given.as_deref();
    let mut outcomes: Vec<(u64, Outcome)> = futures::stream::iter(seeds)
        .map(|seed| async move {
            let out = run(seed, duration, only, given).await;
            println!("{}", out.line);
            (seed, out)
        })
        .buffer_unordered(jobs)
        .collect()
        .await;
    outcomes.sort_by_key(|(seed, _)| *seed);
    let mut failed = Vec::new();
    for (seed, out) in outcomes {
        if out.violations.is_empty() {
            continue;
        }
        if shrink {
            let mut plan = out.plan.clone();
            let mut i = 0;
            while i < plan.len() {
                let mut fewer = plan.clone();
                let dropped = fewer.remove(i);
                let again = run(seed, duration, only, Some(&fewer)).await;
                println!(
                    "shrink seed {seed}: without {}s {:?}: {}",
                    dropped.0,
                    dropped.1,
                    if again.violations.is_empty() {
                        "no violation, kept".to_string()
                    } else {
                        format!("still {}, dropped", again.violations.join("; "))
                    }
                );
                if again.violations.is_empty() {
                    i += 1;
                } else {
                    plan = fewer;
                }
            }
            println!(
                "shrink seed {seed}: {} of {} events left: {}\n  replay: {}",
                plan.len(),
                out.plan.len(),
                schedule_text(&plan),
                replay(seed, duration, only, Some(&plan))
            );
        }
        failed.push(out.line);
    }
    assert!(
        failed.is_empty(),
        "{} run(s) broke an invariant:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// The picture holds one line per operation and fault, one Ready and one
/// writes bar per second, the violations, and escapes what it writes.
#[test]
fn the_timeline_picture_shows_every_event_second_and_violation() {
    let events = vec![
        (0.0, "load started on Cluster <3 shards>".to_string()),
        (5.0, "op: backup b1 asked".to_string()),
        (9.5, "fault: kill -9 of cache-s0-0's server".to_string()),
        (12.0, "fault: pod cache-s1-1 deleted".to_string()),
        (40.0, "settled 3.1 s after the last event".to_string()),
    ];
    let samples: Vec<Sample> = (0..=40)
        .map(|i| Sample {
            at: f64::from(i),
            state: String::new(),
            ready: !(10..20).contains(&i),
            // Lane 0 stalls from 10 to 14 s (no write confirmed); lane 1
            // writes on at the same rate.
            confirmed: vec![(i.min(10) + (i - 14).max(0)) as usize * 50, i as usize * 50],
        })
        .collect();
    let svg = timeline_svg(
        "seed 1: Cluster & co",
        &events,
        &samples,
        &["slots of s0".to_string(), "slots of s1".to_string()],
        &["1 of 2 confirmed writes lost".to_string()],
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("seed 1: Cluster &amp; co"), "{svg}");
    assert_eq!(svg.matches(r#"class="op""#).count(), 1);
    assert_eq!(svg.matches(r#"class="fault""#).count(), 2);
    assert_eq!(svg.matches(r#"class="ready""#).count(), 40);
    assert_eq!(svg.matches("#bdbdbd").count(), 10, "10 seconds not Ready");
    let bars = |lane: usize| -> Vec<f64> {
        svg.lines()
            .filter(|l| l.contains(&format!(r#"class="writes" data-lane="{lane}""#)))
            .map(|l| {
                let h = l.split("height=\"").nth(1).expect("height");
                h[..h.find('"').expect("quote")].parse().expect("a number")
            })
            .collect()
    };
    let (stalled, steady) = (bars(0), bars(1));
    assert_eq!((stalled.len(), steady.len()), (40, 40));
    assert_eq!(
        stalled.iter().filter(|h| **h == 0.0).count(),
        4,
        "{stalled:?}"
    );
    assert!(
        stalled
            .iter()
            .all(|h| *h == 0.0 || (*h - 60.0).abs() < 0.01)
    );
    assert!(
        steady.iter().all(|h| (*h - 60.0).abs() < 0.01),
        "{steady:?}"
    );
    assert!(svg.contains(">slots of s0<") && svg.contains(">slots of s1<"));
    assert_eq!(svg.matches(r#"class="violation""#).count(), 1);
    assert!(!svg.contains("<3 shards>"), "the label is escaped");
}

/// A schedule reads back as it was written; a bad entry is named.
#[test]
fn a_schedule_round_trips_and_a_bad_entry_is_named() {
    let plan = vec![
        (5, Action::Backup),
        (12, Action::KillServer),
        (30, Action::Grow),
    ];
    assert_eq!(parse_schedule(&schedule_text(&plan)), Ok(plan));
    assert_eq!(
        parse_schedule(" 30:Grow , 5:Backup"),
        Ok(vec![(5, Action::Backup), (30, Action::Grow)])
    );
    let err = parse_schedule("5:Backup,7:Explode").expect_err("unknown action");
    assert!(
        err.contains("\"7:Explode\"") && err.contains("KillServer"),
        "{err}"
    );
    let err = parse_schedule("soon:Backup").expect_err("bad second");
    assert!(err.contains("\"soon\""), "{err}");
}

#[test]
fn only_writes_confirmed_before_a_fault_on_the_last_copy_are_excused() {
    let acked: Vec<String> = (1..=10).map(|i| format!("chaos:{i}")).collect();
    let lost = vec!["chaos:2".to_string(), "chaos:5".into(), "chaos:9".into()];
    // No such fault: every lost write is a violation.
    let (excused, rest) = excuse_last_copy(&acked, lost.clone(), &[]);
    assert!(excused.is_empty());
    assert_eq!(rest, lost);
    // A fault on the last copy read 6 confirmed writes just after it:
    // chaos:2 and chaos:5 went with it; chaos:9 was confirmed later, by a
    // server the fault did not touch, and stays a violation.
    let fault = |confirmed| LastCopy {
        confirmed,
        at: chrono::Utc::now(),
        why: String::new(),
    };
    let faults = [fault(3), fault(6)];
    let (excused, rest) = excuse_last_copy(&acked, lost, &faults);
    assert_eq!(excused, ["chaos:2", "chaos:5"]);
    assert_eq!(rest, ["chaos:9"]);
}
