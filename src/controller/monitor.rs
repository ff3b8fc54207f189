//! Primary health: one long-lived connection per watched primary, probed
//! with `PING` every [`PROBE_INTERVAL`], so a failed primary is noticed in
//! well under a second without waiting for the next reconcile.
//!
//! Cost per Redis, flat in the number of Redis: one task (on the monitor's
//! own thread, see [`probe_runtime`]), one connection
//! (a [`ProbeConn`]: a `PING` is one write of fixed bytes and one read into
//! a kept buffer, no allocation), two `PING`s a second. On a broken
//! connection the probe reconnects at once, and classifies what it finds:
//! - **down**: the TCP connect is refused (nothing listens on the address:
//!   the process died or is restarting);
//! - **restarted**: the server answers but is no longer a primary (a
//!   primary restarted in place boots as a replica, see the start script);
//! - **silent**: no answer (connect or command timed out). A silent primary
//!   may only be slow (`DEBUG SLEEP`, a CPU stall, a long command): it is
//!   reported with how long it has been silent, and the failover module
//!   replaces it only after a bound (the Redis controller's failover step).
//!
//! For a Redis with the memory autopilot on, the probe also reads the
//! primary's `used_memory` every [`MEMORY_INTERVAL`] over the same
//! connection, keeps the last [`MEMORY_WINDOW`] of samples for the growth
//! rate, and asks for a reconcile when the use reaches (or, at that rate,
//! will reach within the lookahead) the level the autopilot acts at — so a
//! fill is caught within a second, not at the next periodic reconcile.
//!
//! In Cluster mode (memory autopilot on) every shard's primary is watched;
//! the autopilot reads the fullest one's samples.
//!
//! Length: ~390 lines of code and ~100 of tests: one probe loop serves
//! both watches (health and memory) over one connection per primary.
//!
//! The monitor decides nothing: on each change to a failing verdict (and
//! when silence crosses the bound given with the target) it asks for a
//! reconcile of the Redis, which observes and decides. Only the leader
//! reconciles, so only the leader's monitor has targets.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;

use crate::api::v1alpha1::Redis;
use crate::redis::probe::{ProbeConn, answered, closed};
use crate::redis::{ConnectOptions, Endpoint, KEEPALIVE_RETRIES};

/// Time between two probes of one primary.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Time between two probes of a calm primary: the last probe answered,
/// every replica reported a live link to it in the last reconcile (they
/// hear from it every second; [`Target::calm`]), and its memory is not
/// watched. A server that dies closes the kept connection and is probed
/// at once whatever the rate; a partition fails the kept connection by
/// its keepalive ([`KEEPALIVE`], about 3 s) and a stopped process is
/// noticed at the next calm tick; from then on it is probed at
/// [`PROBE_INTERVAL`]. Its silence is counted from `CALM_INTERVAL -
/// PROBE_INTERVAL` after its last answer (what the full rate would have
/// vouched for), so the silence bound keeps its meaning and a silent calm
/// primary is replaced at most that much later.
pub const CALM_INTERVAL: Duration = Duration::from_secs(5);

/// TCP keepalive on the kept connection: between calm probes the kernel
/// probes the peer once a second and fails the connection after
/// [`KEEPALIVE_RETRIES`] probes in a row went unanswered, so a partition
/// closes it about three seconds after the last acknowledgement, and the
/// monitor probes at once (at the full rate from then on). No command
/// reaches Redis, and the process is not woken: the kernel answers.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

/// The time up to which a kept connection that closed at `at` vouched
/// for the primary, as a probe at the full rate would have: a keepalive
/// failure comes `KEEPALIVE * (KEEPALIVE_RETRIES + 1)` after the last
/// acknowledgement at most, and the full rate would have found that
/// answer at most a [`PROBE_INTERVAL`] later.
fn keepalive_vouched(at: Instant) -> Instant {
    let since = KEEPALIVE * (KEEPALIVE_RETRIES + 1);
    at.checked_sub(since.saturating_sub(PROBE_INTERVAL))
        .unwrap_or(at)
}

/// The oldest acknowledgement a calm probe accepts from a replica (they
/// acknowledge every second).
pub const LIVE_LAG_SECS: i64 = 3;

/// Time between two memory samples of a primary (autopilot on): every
/// probe.
pub const MEMORY_INTERVAL: Duration = PROBE_INTERVAL;
/// The samples the growth rate is computed over: short, so a fill that
/// starts is seen at its own rate within a second, not averaged with the
/// quiet before it.
pub const MEMORY_WINDOW: Duration = Duration::from_secs(5);

/// The memory watch of one primary: where the autopilot acts, and the
/// samples.
#[derive(Debug, Default)]
struct MemoryWatch {
    /// Ask for a reconcile when `used_memory` reaches this many bytes.
    alert: Option<u64>,
    /// ... and when it falls below this many.
    low: u64,
    /// What `low` is compared with.
    low_measure: LowMeasure,
    /// A reconcile was asked for since the use last was above `low`.
    told_low: bool,
    /// Project the growth rate this far.
    lookahead: Duration,
    /// `(when, used_memory)`, oldest first, within [`MEMORY_WINDOW`].
    samples: VecDeque<(Instant, u64)>,
    /// A reconcile was asked for since the use last was below the alert.
    told: bool,
}

/// What the scale-down level of a memory watch is compared with: the
/// measure the autopilot that set it decides on, so the pass the monitor
/// asks for finds the level crossed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum LowMeasure {
    /// `used_memory` (the memory autopilot).
    #[default]
    Used,
    /// `used_memory_dataset` (the shard autopilot: the data that moves
    /// when a shard goes; the replication backlog and the server's own
    /// overhead stay with every shard, so `used_memory` may never fall
    /// that low after a drain).
    Dataset,
}

/// The primary's memory as the monitor sampled it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemorySample {
    /// The last `used_memory`.
    pub used: u64,
    /// Growth in bytes per second over the window; `None` with less than
    /// a second of samples.
    pub rate: Option<f64>,
}

impl MemoryWatch {
    fn sample(&self) -> Option<MemorySample> {
        let (t1, last) = *self.samples.back()?;
        let rate = self.samples.front().and_then(|(t0, first)| {
            let dt = t1.duration_since(*t0).as_secs_f64();
            (dt >= 1.0).then(|| (last as f64 - *first as f64) / dt)
        });
        Some(MemorySample { used: last, rate })
    }

    /// Records a sample (`used_memory`, and `used_memory_dataset` when the
    /// server reports it); true when a reconcile is to be asked for.
    fn record(&mut self, at: Instant, used: u64, dataset: Option<u64>) -> bool {
        self.samples.push_back((at, used));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > MEMORY_WINDOW)
        {
            self.samples.pop_front();
        }
        let Some(alert) = self.alert else {
            return false;
        };
        // The scale-up level first: a fill that starts below the scale-down
        // level is still caught by its rate.
        let projected = self.sample().map_or(used as f64, |s| {
            used as f64 + s.rate.unwrap_or(0.0).max(0.0) * self.lookahead.as_secs_f64()
        });
        let up = if projected >= alert as f64 {
            let ask = !self.told;
            self.told = true;
            ask
        } else {
            self.told = false;
            false
        };
        let low_side = match self.low_measure {
            LowMeasure::Used => used,
            LowMeasure::Dataset => dataset.unwrap_or(used),
        };
        let down = if low_side < self.low {
            let ask = !self.told_low;
            self.told_low = true;
            ask
        } else {
            self.told_low = false;
            false
        };
        up || down
    }
}

/// What to watch.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// Pod name of the primary.
    pub pod: String,
    /// Its address.
    pub ip: String,
    /// Its port.
    pub port: u16,
    /// Silence after which a reconcile is asked for again.
    pub silence: Duration,
    /// The password (never logged; compared to notice a rotation).
    pub password: String,
    /// False once the primary's pod is gone or lost its address: the old
    /// address may belong to another pod by now (of another tenant), so
    /// it is probed at the TCP level only and never sent the password.
    pub authenticate: bool,
    /// With TLS, how: the CA bundle the primary's certificate is checked
    /// against (chain and dates, not the name), and the certificate the
    /// probe presents when the servers ask clients for one.
    pub tls: Option<crate::redis::TlsOptions>,
    /// The primary of a Redis that follows a source (`spec.replicaOf`): a
    /// replica to Redis, so the probe does not ask for the primary role.
    pub follows_source: bool,
    /// Every replica reported a live link to it when the target was set:
    /// it is probed at [`CALM_INTERVAL`] while it answers and names at
    /// least `replicas` replicas online (each calm probe asks it).
    pub calm: bool,
    /// The replicas a calm primary should name online.
    pub replicas: usize,
}

/// What the probes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The last probe was answered by a primary.
    Healthy,
    /// Nothing listens on the address.
    Down,
    /// The server answers as a replica.
    Restarted,
    /// No answer yet (see [`Health::silent_for`]).
    Silent,
}

/// The health of a watched primary.
#[derive(Debug, Clone)]
pub struct Health {
    /// Pod name of the primary watched.
    pub pod: String,
    /// Its address.
    pub ip: String,
    /// The last probe's verdict.
    pub verdict: Verdict,
    /// Its silence, as the silence bound counts it: since the last answer
    /// from it as primary (since the watch started when it never
    /// answered), or since what a calm probe rate vouched for after it
    /// (see [`CALM_INTERVAL`]).
    pub silent_for: Duration,
    /// Time since the last answer from it as primary (since the watch
    /// started when it never answered).
    pub since_answer: Duration,
    /// While failing: how long after that last answer the probe first
    /// found it failing.
    pub noticed_after: Option<Duration>,
    /// Whether this target ever answered as primary (a watch of a pod made
    /// anew at another address starts with none).
    pub answered: bool,
}

struct Shared {
    verdict: Verdict,
    last_answer: Instant,
    /// Silence is counted from here: the last answer, or later by what a
    /// calm probe rate leaves unprobed (see [`CALM_INTERVAL`]).
    vouched: Instant,
    /// When a probe first found it failing since its last answer.
    failing_since: Option<Instant>,
    /// It answered as primary at least once.
    answered: bool,
    /// Probed at the calm rate: it answered the last probe, and every
    /// replica the last reconcile saw still hears from it.
    calm: bool,
    /// Its last `INFO replication` (a calm probe's) named every replica
    /// the last reconcile saw online, and no probe failed since.
    heard_all: bool,
}

struct Watch {
    target: Target,
    shared: Arc<Mutex<Shared>>,
    memory: Arc<Mutex<MemoryWatch>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A watch: the Redis and which of its primaries (0 outside Cluster mode;
/// the shard's index in Cluster mode).
type Key = (ObjectRef<Redis>, usize);

/// The primaries watched, per Redis.
pub struct Monitor {
    watches: Mutex<HashMap<Key, Watch>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
    /// The sources followed Redis replicate from (`spec.replicaOf`).
    pub sources: super::source_watch::SourceWatches,
}

/// The probe loops' own thread, shared by every monitor of the process: a
/// single-threaded runtime that does nothing but probe, so a reconcile
/// that keeps the operator's workers busy does not delay a probe. (It did
/// not change an idle operator's CPU measurably: a probe's cost is its
/// trip through the network stack, not the runtime.) `None` when the
/// thread could not be started: the probe loops then run on the caller's
/// runtime.
fn probe_runtime() -> Option<&'static tokio::runtime::Handle> {
    static PROBES: std::sync::OnceLock<Option<tokio::runtime::Handle>> = std::sync::OnceLock::new();
    PROBES
        .get_or_init(|| match start_probe_thread() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(
                    "the failure monitor's thread did not start ({e}); probing on the \
                     operator's runtime"
                );
                None
            }
        })
        .as_ref()
}

fn start_probe_thread() -> std::io::Result<tokio::runtime::Handle> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("redpilot-monitor".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    Ok(handle)
}

impl Monitor {
    /// A monitor that asks for reconciles on the returned stream.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<ObjectRef<Redis>>) {
        let (trigger, rx) = mpsc::unbounded();
        (
            Monitor {
                watches: Mutex::new(HashMap::new()),
                sources: super::source_watch::SourceWatches::new(trigger.clone(), probe_runtime()),
                trigger,
            },
            rx,
        )
    }

    /// Watches `target` as the primary of `obj` (replacing another target;
    /// the same target keeps its probe and its history).
    pub fn watch(&self, obj: &ObjectRef<Redis>, target: Target) {
        self.watch_at(obj, 0, target);
    }

    /// Watches `target` as primary `index` of `obj` (a Cluster Redis has
    /// one per shard).
    pub fn watch_at(&self, obj: &ObjectRef<Redis>, index: usize, target: Target) {
        let Ok(mut w) = self.watches.lock() else {
            return;
        };
        let key = (obj.clone(), index);
        let obj = &key;
        if w.get(obj).is_some_and(|old| old.target == target) {
            return;
        }
        // The same primary at the same address (only how it is probed
        // changed): its history carries over, so silence keeps counting.
        let shared = match w.get(obj) {
            Some(old) if old.target.pod == target.pod && old.target.ip == target.ip => {
                old.shared.clone()
            }
            _ => Arc::new(Mutex::new(Shared {
                verdict: Verdict::Healthy,
                last_answer: Instant::now(),
                vouched: Instant::now(),
                failing_since: None,
                answered: false,
                calm: false,
                heard_all: false,
            })),
        };
        // A new primary starts a new series; the level carries over.
        let memory = Arc::new(Mutex::new(MemoryWatch::default()));
        if let Some(old) = w.get(obj)
            && let (Ok(old), Ok(mut new)) = (old.memory.lock(), memory.lock())
        {
            new.alert = old.alert;
            new.low = old.low;
            new.low_measure = old.low_measure;
            new.lookahead = old.lookahead;
        }
        let probing = probe_loop(
            key.0.clone(),
            target.clone(),
            Probed {
                shared: shared.clone(),
                memory: memory.clone(),
            },
            self.trigger.clone(),
        );
        let task = match probe_runtime() {
            Some(runtime) => runtime.spawn(probing),
            None => tokio::spawn(probing),
        };
        w.insert(
            obj.clone(),
            Watch {
                target,
                shared,
                memory,
                task,
            },
        );
    }

    /// Samples the memory of the primary of `obj` and asks for a reconcile
    /// when its `low_measure` falls below the first of `levels` or its
    /// `used_memory` reaches the second, now or within `lookahead` at its
    /// growth rate. `None` stops the sampling.
    pub fn watch_memory(
        &self,
        obj: &ObjectRef<Redis>,
        levels: Option<(u64, u64)>,
        low_measure: LowMeasure,
        lookahead: Duration,
    ) {
        let Ok(w) = self.watches.lock() else { return };
        let (low, alert) = (levels.map_or(0, |l| l.0), levels.map(|l| l.1));
        for (_, watch) in w.iter().filter(|((o, _), _)| o == obj) {
            if let Ok(mut m) = watch.memory.lock()
                && (m.alert != alert
                    || m.low != low
                    || m.low_measure != low_measure
                    || m.lookahead != lookahead)
            {
                m.alert = alert;
                m.low = low;
                m.low_measure = low_measure;
                m.lookahead = lookahead;
                m.told = false;
                m.told_low = false;
                if alert.is_none() {
                    m.samples.clear();
                }
            }
        }
    }

    /// The memory of the primary of `obj`, as last sampled (in Cluster
    /// mode, of the fullest shard primary).
    pub fn memory(&self, obj: &ObjectRef<Redis>) -> Option<MemorySample> {
        let w = self.watches.lock().ok()?;
        w.iter()
            .filter(|((o, _), _)| o == obj)
            .filter_map(|(_, watch)| watch.memory.lock().ok()?.sample())
            .max_by_key(|s| s.used)
    }

    /// Stops watching the primaries of `obj`.
    pub fn unwatch(&self, obj: &ObjectRef<Redis>) {
        self.unwatch_from(obj, 0);
    }

    /// Stops watching the primaries of `obj` from index `from` on (the
    /// shards a Cluster Redis does not have).
    pub fn unwatch_from(&self, obj: &ObjectRef<Redis>, from: usize) {
        if let Ok(mut w) = self.watches.lock() {
            w.retain(|(o, i), _| o != obj || *i < from);
        }
    }

    /// Keeps only the watches of objects `keep` names.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Redis>) -> bool) {
        if let Ok(mut w) = self.watches.lock() {
            w.retain(|(o, _), _| keep(o));
        }
        self.sources.retain(&keep);
    }

    /// The objects whose primary is watched.
    pub fn objects(&self) -> Vec<ObjectRef<Redis>> {
        let Ok(w) = self.watches.lock() else {
            return Vec::new();
        };
        let mut out: Vec<ObjectRef<Redis>> = Vec::new();
        for (o, _) in w.keys() {
            if !out.contains(o) {
                out.push(o.clone());
            }
        }
        out
    }

    /// Whether `obj`'s primary is watched by a running probe, answered
    /// within two calm intervals, is probed at the calm rate, and its last
    /// `INFO replication` named every replica (see [`Shared::heard_all`]).
    pub fn holds_calm(&self, obj: &ObjectRef<Redis>) -> bool {
        let Ok(w) = self.watches.lock() else {
            return false;
        };
        w.get(&(obj.clone(), 0)).is_some_and(|watch| {
            watch.target.calm
                && !watch.task.is_finished()
                && watch.shared.lock().is_ok_and(|s| {
                    s.calm
                        && s.heard_all
                        && s.verdict == Verdict::Healthy
                        && s.last_answer.elapsed() < 2 * CALM_INTERVAL
                })
        })
    }

    /// The health of the primary watched for `obj` (in Cluster mode, shard
    /// 0's).
    pub fn health(&self, obj: &ObjectRef<Redis>) -> Option<Health> {
        let w = self.watches.lock().ok()?;
        let watch = w.get(&(obj.clone(), 0))?;
        let s = watch.shared.lock().ok()?;
        Some(Health {
            pod: watch.target.pod.clone(),
            ip: watch.target.ip.clone(),
            verdict: s.verdict,
            silent_for: Instant::now().saturating_duration_since(s.vouched),
            since_answer: s.last_answer.elapsed(),
            noticed_after: s
                .failing_since
                .map(|t| t.saturating_duration_since(s.last_answer)),
            answered: s.answered,
        })
    }
}

/// Whether the server at `ip:port` answers as a primary within `within`
/// (a fresh connection, as a probe makes). The failover module asks this
/// once more before replacing a primary that was silent for the bound: a
/// server that was only paused answers as soon as it runs again, and the
/// monitor may not have probed it since.
pub async fn answers_as_primary(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    within: Duration,
) -> bool {
    let opts = opts.clone().with_timeouts(within, within);
    matches!(
        tokio::time::timeout(within, open_probe(&mut None, endpoint, &opts, false)).await,
        Ok(Probe::Answered)
    )
}

/// What one probe found.
enum Probe {
    Answered,
    Refused,
    NotPrimary,
    Silent,
}

/// What a probe loop writes.
struct Probed {
    shared: Arc<Mutex<Shared>>,
    memory: Arc<Mutex<MemoryWatch>>,
}

async fn probe_loop(
    obj: ObjectRef<Redis>,
    target: Target,
    probed: Probed,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
) {
    let Probed { shared, memory } = probed;
    let mut last_sample: Option<Instant> = None;
    let endpoint = Endpoint::new(&target.ip, target.port);
    let opts = ConnectOptions::default()
        .with_user_or_default(
            crate::controller::names::OPERATOR_USER,
            target.password.clone(),
        )
        .with_timeouts(PROBE_INTERVAL, PROBE_INTERVAL)
        .with_keepalive(KEEPALIVE);
    let opts = match &target.tls {
        Some(tls) => opts.with_tls(tls.clone()),
        None => opts,
    };
    // Every watch probes on the same grid (see `grid_start`); a probe
    // that ran late skips to the grid's next tick rather than drifting off
    // it. The first probe runs at once.
    let mut period = PROBE_INTERVAL;
    let mut ticker = grid_ticker(period);
    let mut conn: Option<ProbeConn> = None;
    let mut told_silent = false;
    let mut told_short = false;
    let mut first = true;
    // At most one probe between two ticks comes from a closed connection,
    // so a server that accepts and closes at once cannot spin the loop.
    let mut watch_close = true;
    loop {
        // When the kept connection was seen to close (a calm primary's
        // silence is then counted from no later than that).
        let mut closed_at = None;
        if !std::mem::take(&mut first) {
            // Between probes the open connection is watched too: a server
            // that dies closes it, and the probe runs then instead of at
            // the next tick.
            tokio::select! {
                _ = ticker.tick() => watch_close = true,
                _ = closed(&mut conn), if watch_close => {
                    conn = None;
                    watch_close = false;
                    closed_at = Some(Instant::now());
                }
            }
        }
        // A calm probe asks for the replicas instead of a `PING`.
        let ask = period == CALM_INTERVAL && target.replicas > 0;
        let (probe, heard) = if target.authenticate {
            probe(&mut conn, &endpoint, &opts, target.follows_source, ask).await
        } else {
            (probe_address(&endpoint).await, None)
        };
        // Fewer replicas heard than the last reconcile saw: a reconcile
        // looks (once per change), and the probes go to the full rate.
        let short = heard.is_some_and(|n| n < target.replicas);
        if short && !told_short {
            // Not calm from now on: the pass asked for below must be a full
            // one (see `controller::redis::light`).
            if let Ok(mut s) = shared.lock() {
                s.calm = false;
                s.heard_all = false;
            }
            tracing::info!(redis = %obj, primary = %target.pod, heard = ?heard, replicas = target.replicas, "a replica no longer hears from the primary; reconciling");
            if trigger.unbounded_send(obj.clone()).is_err() {
                return;
            }
        }
        if heard.is_some() {
            told_short = short;
        }
        if matches!(probe, Probe::Answered)
            && last_sample.is_none_or(|t| t.elapsed() >= MEMORY_INTERVAL)
            && let Some(node) = conn.as_mut()
        {
            last_sample = Some(Instant::now());
            if let Some(used) = sample_memory(node, &memory).await {
                tracing::info!(redis = %obj, primary = %target.pod, used, "memory at the autopilot's level; reconciling");
                if trigger.unbounded_send(obj.clone()).is_err() {
                    return;
                }
            }
        }
        // The rate for the next probe: calm only after an answer.
        let calm = target.calm
            && !told_short
            && matches!(probe, Probe::Answered)
            && memory.lock().is_ok_and(|m| m.alert.is_none());
        let next = if calm { CALM_INTERVAL } else { PROBE_INTERVAL };
        if next != period {
            period = next;
            ticker = grid_ticker(period);
        }
        let Ok(mut s) = shared.lock() else { return };
        s.calm = calm;
        // What the light periodic pass relies on: the replicas were asked
        // and all heard; an unanswered question or a failed probe undoes it.
        if !matches!(probe, Probe::Answered) || (ask && heard.is_none()) || short {
            s.heard_all = false;
        } else if heard.is_some() {
            s.heard_all = true;
        }
        let before = s.verdict;
        s.verdict = match probe {
            Probe::Answered => {
                // What the full rate would have vouched for: up to a
                // probe interval before the next tick (calm ticks are on
                // a grid: the next may be nearer than a whole period).
                let now = Instant::now();
                let next_tick = grid_start(tokio::time::Instant::now(), period).into_std();
                s.last_answer = now;
                s.vouched = next_tick
                    .checked_sub(PROBE_INTERVAL)
                    .map_or(now, |v| v.max(now));
                s.failing_since = None;
                s.answered = true;
                told_silent = false;
                Verdict::Healthy
            }
            Probe::Refused => Verdict::Down,
            Probe::NotPrimary => Verdict::Restarted,
            Probe::Silent => Verdict::Silent,
        };
        // The connection closed and the primary does not answer: silence
        // counts from no later than what the kernel's keepalive vouched
        // for (see `KEEPALIVE`).
        if let Some(at) = closed_at
            && s.verdict != Verdict::Healthy
        {
            s.vouched = s.vouched.min(keepalive_vouched(at));
        }
        let crossed = s.verdict == Verdict::Silent
            && !told_silent
            && Instant::now().saturating_duration_since(s.vouched) >= target.silence;
        let changed = s.verdict != before && s.verdict != Verdict::Healthy;
        if s.verdict != Verdict::Healthy && s.failing_since.is_none() {
            s.failing_since = Some(Instant::now());
        }
        let verdict = s.verdict;
        drop(s);
        if crossed {
            told_silent = true;
        }
        if changed || crossed {
            tracing::info!(redis = %obj, primary = %target.pod, ?verdict, "primary failing; reconciling");
            if trigger.unbounded_send(obj.clone()).is_err() {
                return;
            }
        }
    }
}

/// The first tick of a watch started at `now`: the next multiple of
/// [`PROBE_INTERVAL`] since the first watch of this process. All watches
/// tick together, so one timer wake-up serves every primary's probe and
/// their replies come back in a burst, instead of two wake-ups per probe
/// spread over the interval (at a few watched primaries, those wake-ups
/// were most of an idle operator's CPU time).
fn grid_start(now: tokio::time::Instant, interval: Duration) -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| now);
    grid_after(epoch, now, interval)
}

/// A ticker on the grid of `interval` (the calm grid's ticks are also the
/// full rate's: [`CALM_INTERVAL`] is a multiple of [`PROBE_INTERVAL`]); a
/// tick missed is skipped.
fn grid_ticker(interval: Duration) -> tokio::time::Interval {
    let mut t =
        tokio::time::interval_at(grid_start(tokio::time::Instant::now(), interval), interval);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    t
}

/// The first `epoch + k * interval` after `now` (k ≥ 1).
fn grid_after(
    epoch: tokio::time::Instant,
    now: tokio::time::Instant,
    interval: Duration,
) -> tokio::time::Instant {
    let step = interval.as_nanos().max(1);
    let k = now.saturating_duration_since(epoch).as_nanos() / step + 1;
    epoch + Duration::from_nanos(u64::try_from(k * step).unwrap_or(u64::MAX))
}

/// Reads `used_memory` (and `used_memory_dataset`) when the memory is
/// watched; `Some(used)` when a reconcile is to be asked for.
async fn sample_memory(node: &mut ProbeConn, memory: &Mutex<MemoryWatch>) -> Option<u64> {
    if !memory.lock().is_ok_and(|m| m.alert.is_some()) {
        return None;
    }
    let (used, dataset) = node.used_memory().await.ok()??;
    let ask = match memory.lock() {
        Ok(mut m) => m.record(Instant::now(), used, dataset),
        Err(_) => false,
    };
    ask.then_some(used)
}

/// One probe: `PING` on the open connection; when there is none (or it just
/// broke) a TCP connect first, to tell "nothing listens" from "no answer",
/// then a connection that checks the server is still a primary.
async fn probe(
    conn: &mut Option<ProbeConn>,
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    any_role: bool,
    ask_replicas: bool,
) -> (Probe, Option<usize>) {
    if let Some(node) = conn.as_mut() {
        let asked = if ask_replicas {
            node.replicas_heard(LIVE_LAG_SECS).await.map(Some)
        } else {
            node.ping().await.map(|()| None)
        };
        match asked {
            Ok(heard) => return (Probe::Answered, heard),
            // An error reply (LOADING, a changed password) is an answer.
            Err(e) if answered(&e) => return (Probe::Answered, None),
            Err(_) => *conn = None,
        }
    }
    (open_probe(conn, endpoint, opts, any_role).await, None)
}

/// The probe of a primary without an open connection: see [`probe`].
async fn open_probe(
    conn: &mut Option<ProbeConn>,
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    any_role: bool,
) -> Probe {
    let addr = format!("{}:{}", endpoint.host(), endpoint.port());
    match tokio::time::timeout(PROBE_INTERVAL, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        _ => return Probe::Silent,
    }
    let mut node = match ProbeConn::open(endpoint, opts).await {
        Ok(node) => node,
        Err(e) if answered(&e) => return Probe::Answered,
        Err(_) => return Probe::Silent,
    };
    match node.is_primary().await {
        Ok(primary) if primary || any_role => {
            *conn = Some(node);
            Probe::Answered
        }
        Ok(_) => Probe::NotPrimary,
        Err(e) if answered(&e) => Probe::Answered,
        Err(_) => Probe::Silent,
    }
}

/// A probe of an address that may no longer be the primary's: whether
/// something listens, without a word sent to it. Refused is down; an
/// answer is not the primary (its pod is gone); no answer is silence.
async fn probe_address(endpoint: &Endpoint) -> Probe {
    let addr = format!("{}:{}", endpoint.host(), endpoint.port());
    match tokio::time::timeout(PROBE_INTERVAL, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => Probe::NotPrimary,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        _ => Probe::Silent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_tick_on_one_grid() {
        let epoch = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let at = |t: u64| grid_after(epoch, epoch + ms(t), ms(500));
        assert_eq!(at(0), epoch + ms(500));
        assert_eq!(at(1), epoch + ms(500));
        assert_eq!(at(499), epoch + ms(500));
        assert_eq!(at(500), epoch + ms(1000));
        assert_eq!(at(12_345), epoch + ms(12_500));
        // A clock read before the epoch (another thread's) starts at the
        // first tick.
        assert_eq!(grid_after(epoch + ms(10), epoch, ms(500)), epoch + ms(510));
    }

    /// What a listener on loopback receives from one probe.
    async fn bytes_sent_by(authenticate: bool) -> (Vec<u8>, &'static str) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Every connection within 1.5 s, each read until it goes quiet.
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let got = Arc::new(Mutex::new(Vec::new()));
            let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
            let mut readers = Vec::new();
            while let Ok(Ok((mut sock, _))) =
                tokio::time::timeout_at(deadline, listener.accept()).await
            {
                let got = got.clone();
                readers.push(tokio::spawn(async move {
                    let mut buf = [0u8; 512];
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(700), sock.read(&mut buf)).await
                    {
                        if n == 0 {
                            break;
                        }
                        if let Ok(mut g) = got.lock() {
                            g.extend_from_slice(&buf[..n]);
                        }
                    }
                }));
            }
            for r in readers {
                let _ = r.await;
            }
            got.lock().map(|g| g.clone()).unwrap_or_default()
        });
        let ep = Endpoint::new("127.0.0.1", port);
        let opts = ConnectOptions::default()
            .with_password("s3cret-pw".to_string())
            .with_timeouts(PROBE_INTERVAL, PROBE_INTERVAL);
        let verdict = if authenticate {
            open_probe(&mut None, &ep, &opts, false).await
        } else {
            probe_address(&ep).await
        };
        let name = match verdict {
            Probe::Answered => "answered",
            Probe::Refused => "refused",
            Probe::NotPrimary => "not primary",
            Probe::Silent => "silent",
        };
        (reader.await.expect("reader"), name)
    }

    /// A listener that answers `AUTH` and `ROLE` as a primary, then closes
    /// the connection at once; how many connections it took in `window`,
    /// and the verdict at the end.
    async fn connections_to_a_closing_primary(window: Duration) -> (usize, Verdict) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let server = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 512];
                    let mut seen = Vec::new();
                    // AUTH, then ROLE: answer each, then hang up.
                    while let Ok(n) = sock.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&seen).to_string();
                        if text.contains("ROLE") {
                            let _ = sock.write_all(b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n").await;
                            return;
                        }
                        if text.contains("AUTH") && !text.contains("+") {
                            let _ = sock.write_all(b"+OK\r\n").await;
                            seen.push(b'+');
                        }
                    }
                });
            }
        });
        let (monitor, obj, _rx) = watching_local("closing", port);
        tokio::time::sleep(window).await;
        let verdict = monitor.health(&obj).map(|h| h.verdict);
        monitor.unwatch(&obj);
        server.abort();
        (
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            verdict.expect("watched"),
        )
    }

    /// A monitor watching the primary `<name>-0` on a local port.
    /// The receiver of its reconcile requests is returned, so it lives as
    /// long as the caller keeps it.
    fn watching_local(
        name: &str,
        port: u16,
    ) -> (
        Monitor,
        ObjectRef<Redis>,
        mpsc::UnboundedReceiver<ObjectRef<Redis>>,
    ) {
        watching_local_as(name, port, false)
    }

    fn watching_local_as(
        name: &str,
        port: u16,
        calm: bool,
    ) -> (
        Monitor,
        ObjectRef<Redis>,
        mpsc::UnboundedReceiver<ObjectRef<Redis>>,
    ) {
        let (monitor, rx) = Monitor::new();
        let obj = ObjectRef::<Redis>::new(name).within("ns");
        monitor.watch(
            &obj,
            Target {
                pod: format!("{name}-0"),
                ip: "127.0.0.1".into(),
                port,
                silence: Duration::from_secs(5),
                password: "pw".into(),
                authenticate: true,
                tls: None,
                follows_source: false,
                calm,
                replicas: usize::from(calm),
            },
        );
        (monitor, obj, rx)
    }

    /// A primary on plain threads (no runtime of its own) that answers
    /// `AUTH`, `ROLE` and `PING`, counting the `PING`s.
    fn threaded_primary() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        threaded_primary_muted(
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
            Arc::new(std::sync::atomic::AtomicUsize::new(1)),
        )
    }

    /// [`threaded_primary`] that reads but answers nothing while `mute`
    /// is set (a primary cut off: its connections stay open), and names
    /// `online` replicas online in `INFO replication` (counted as a probe).
    fn threaded_primary_muted(
        mute: Arc<std::sync::atomic::AtomicBool>,
        online: Arc<std::sync::atomic::AtomicUsize>,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let pings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = pings.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(mut sock) = sock else { return };
                let count = count.clone();
                let mute = mute.clone();
                let online = online.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    // One command per read: the probe waits for each reply.
                    while let Ok(n) = sock.read(&mut buf) {
                        let text = String::from_utf8_lossy(&buf[..n]).to_string();
                        let info = {
                            let n = online.load(std::sync::atomic::Ordering::SeqCst);
                            let body: String = (0..n)
                                .map(|i| {
                                    format!(
                                        "slave{i}:ip=127.0.0.1,port={},state=online,offset=9,lag=0\r\n",
                                        7000 + i
                                    )
                                })
                                .collect();
                            let body = format!("# Replication\r\nrole:master\r\n{body}");
                            format!("${}\r\n{body}\r\n", body.len())
                        };
                        let reply: &[u8] = if n == 0 {
                            return;
                        } else if mute.load(std::sync::atomic::Ordering::SeqCst) {
                            // Counted: any command (a new connection's
                            // login is a probe too).
                            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            continue;
                        } else if text.contains("PING") {
                            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            b"+PONG\r\n"
                        } else if text.contains("replication") {
                            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            info.as_bytes()
                        } else if text.contains("ROLE") {
                            b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"
                        } else {
                            b"+OK\r\n"
                        };
                        if sock.write_all(reply).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, pings)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn probes_go_on_while_the_operators_runtime_is_busy() {
        // The operator's runtime is this test's single thread. A reconcile
        // that holds it (here: a blocking sleep) must not hold up failure
        // detection: the probes run on the monitor's own thread.
        let (port, pings) = threaded_primary();
        let (monitor, obj, _rx) = watching_local("busy", port);
        let deadline = Instant::now() + Duration::from_secs(5);
        while pings.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the probe never sent PING");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = pings.load(std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1600));
        let during = pings.load(std::sync::atomic::Ordering::SeqCst) - before;
        assert!(
            during >= 2,
            "{during} PINGs while the runtime was held for 1.6 s (one every {PROBE_INTERVAL:?})"
        );
        assert_eq!(
            monitor.health(&obj).map(|h| h.verdict),
            Some(Verdict::Healthy)
        );
    }

    #[tokio::test]
    async fn a_calm_primary_is_probed_every_five_seconds_and_its_silence_counts_as_at_full_rate() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let mute = Arc::new(AtomicBool::new(false));
        let online = Arc::new(std::sync::atomic::AtomicUsize::new(1));
        let (port, pings) = threaded_primary_muted(mute.clone(), online.clone());
        let (monitor, obj, _rx) = watching_local_as("calm", port, true);
        // The first calm probe (an `INFO replication`) within a calm tick.
        let deadline = Instant::now() + CALM_INTERVAL + Duration::from_secs(2);
        while pings.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "no calm probe");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // 11 s: two or three calm ticks (22 at the full rate).
        let before = pings.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(11)).await;
        let calm = pings.load(Ordering::SeqCst) - before;
        assert!(
            (2..=3).contains(&calm),
            "{calm} probes in 11 s at the calm rate"
        );
        // Cut off: the next calm tick finds it silent, and from then on it
        // is probed at the full rate.
        mute.store(true, Ordering::SeqCst);
        let muted = Instant::now();
        let h = loop {
            let h = monitor.health(&obj).expect("watched");
            if h.verdict == Verdict::Silent {
                break h;
            }
            assert!(
                muted.elapsed() < CALM_INTERVAL + Duration::from_secs(2),
                "not found silent within a calm tick"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        // Its silence counts from CALM_INTERVAL - PROBE_INTERVAL after the
        // last answer: what probes at the full rate would have vouched for.
        let since_answer = h.noticed_after.expect("failing");
        let head = CALM_INTERVAL - PROBE_INTERVAL;
        assert!(
            since_answer > head,
            "noticed {since_answer:?} after the last answer"
        );
        let expected = since_answer - head;
        assert!(
            h.silent_for <= expected + Duration::from_millis(300),
            "silent for {:?}, {since_answer:?} after the last answer",
            h.silent_for
        );
        // No calm tick for 5 s; probes (each waiting its 0.5 s for an
        // answer) at the full rate meanwhile.
        let at_silence = pings.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let fast = pings.load(Ordering::SeqCst) - at_silence;
        assert!(fast >= 2, "{fast} probes in 2.1 s after it went silent");
        // A new watch, calm again; its replica gone from INFO: a reconcile
        // is asked for at the next calm probe, and the probes go to the
        // full rate.
        mute.store(false, Ordering::SeqCst);
        drop(monitor);
        let (_monitor, _obj, mut rx) = watching_local_as("calm", port, true);
        tokio::time::sleep(Duration::from_millis(700)).await;
        while rx.try_recv().is_ok() {}
        online.store(0, Ordering::SeqCst);
        let asked = Instant::now();
        while rx.try_recv().is_err() {
            assert!(
                asked.elapsed() < CALM_INTERVAL + Duration::from_secs(1),
                "no reconcile asked for within a calm tick of the replica going"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let at_short = pings.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let fast = pings.load(Ordering::SeqCst) - at_short;
        assert!(fast >= 2, "{fast} probes in 1.6 s with a replica gone");
    }

    #[tokio::test]
    async fn a_server_that_closes_every_connection_does_not_spin_the_probe() {
        // 2 s: the first probe and 4 or 5 ticks, each followed by at most
        // one probe for its connection being closed; a probe without a
        // connection makes two (a bare TCP connect that tells "refused"
        // from "silent", then the login): at most 24.
        let (connections, verdict) = connections_to_a_closing_primary(Duration::from_secs(2)).await;
        assert!(
            (4..=24).contains(&connections),
            "{connections} connections in 2 s"
        );
        assert_eq!(verdict, Verdict::Healthy, "it answers as primary each time");
    }

    #[tokio::test]
    async fn an_address_whose_pod_is_gone_is_never_sent_the_password() {
        // The primary's own address: the probe logs in (the listener,
        // which never answers, sees the password).
        let (sent, _) = bytes_sent_by(true).await;
        assert!(
            String::from_utf8_lossy(&sent).contains("s3cret-pw"),
            "an authenticated probe sends the password: {sent:?}"
        );
        // Its pod gone: whatever listens there now hears nothing.
        let (sent, verdict) = bytes_sent_by(false).await;
        assert!(sent.is_empty(), "{sent:?}");
        assert_eq!(verdict, "not primary");
    }

    #[test]
    fn memory_samples_give_a_rate_and_ask_once_per_crossing() {
        let mut m = MemoryWatch {
            alert: Some(1000),
            lookahead: Duration::from_secs(10),
            ..Default::default()
        };
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!m.record(at(0), 100, None));
        assert_eq!(m.sample().map(|s| s.rate), Some(None));
        assert!(!m.record(at(2), 120, None));
        // 10 bytes/s: 150 + 100 < 1000.
        assert!(!m.record(at(5), 150, None));
        assert_eq!(m.sample().and_then(|s| s.rate), Some(10.0));
        // A fill starts: the window holds only the last 5 s, so the rate is
        // the fill's (96 bytes/s), and 600 + 10 s of it crosses.
        assert!(m.record(at(7), 600, None));
        assert_eq!(m.sample().and_then(|s| s.rate), Some(96.0));
        assert!(!m.record(at(8), 650, None), "asked once per crossing");
        // Below again (a grow raised nothing yet, the data went): re-armed.
        assert!(!m.record(at(40), 100, None));
        assert!(m.record(at(41), 1000, None));
        // A fill that starts below the low level is caught by its rate.
        let mut f = MemoryWatch {
            alert: Some(1000),
            low: 300,
            lookahead: Duration::from_secs(10),
            ..Default::default()
        };
        assert!(
            f.record(at(0), 100, None),
            "below the low level: asked once"
        );
        assert!(!f.record(at(1), 100, None));
        assert!(
            f.record(at(2), 250, None),
            "75 bytes/s for 10 s from 250 crosses 1000"
        );
        // Falling below the low level asks once too.
        m.low = 200;
        assert!(m.record(at(42), 150, None));
        assert!(!m.record(at(43), 140, None));
        assert!(!m.record(at(44), 300, None));
        assert!(m.record(at(45), 100, None));
        // The shard autopilot's low level is the dataset's: a drained shard
        // whose used_memory stays above it (backlog, overhead) still asks.
        let mut d = MemoryWatch {
            alert: Some(1000),
            low: 200,
            low_measure: LowMeasure::Dataset,
            ..Default::default()
        };
        assert!(!d.record(at(0), 600, Some(500)));
        assert!(d.record(at(1), 400, Some(100)), "dataset under 200");
        assert!(!d.record(at(2), 400, Some(90)), "asked once");
        assert!(!d.record(at(3), 400, Some(300)), "above again: re-armed");
        assert!(d.record(at(4), 150, None), "no dataset field: used_memory");
        // The window forgets old samples.
        assert!(
            m.samples
                .iter()
                .all(|(t, _)| at(45).duration_since(*t) <= MEMORY_WINDOW)
        );
    }
}
