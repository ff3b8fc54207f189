//! Primary health: one long-lived connection per watched primary, probed
//! with `PING` every [`PROBE_INTERVAL`], so a failed primary is noticed in
//! well under a second without waiting for the next reconcile.
//!
//! Cost per Redis, flat in the number of Redis: one task, one TCP
//! connection, two `PING`s a second. On a broken connection the probe
//! reconnects at once, and classifies what it finds:
//! - **down**: the TCP connect is refused (nothing listens on the address:
//!   the process died or is restarting);
//! - **restarted**: the server answers but is no longer a primary (a
//!   primary restarted in place boots as a replica, see the start script);
//! - **silent**: no answer (connect or command timed out). A silent primary
//!   may only be slow (`DEBUG SLEEP`, a CPU stall, a long command): it is
//!   reported with how long it has been silent, and the failover module
//!   replaces it only after a bound (see [`super::redis::failover`]).
//!
//! The monitor decides nothing: on each change to a failing verdict (and
//! when silence crosses the bound given with the target) it asks for a
//! reconcile of the Redis, which observes and decides. Only the leader
//! reconciles, so only the leader's monitor has targets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;

use crate::api::v1alpha1::Redis;
use crate::redis::info::Role;
use crate::redis::{ConnectOptions, Endpoint, Node};

/// Time between two probes of one primary.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

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
    /// Time since the last answer from it as primary (since the watch
    /// started when it never answered).
    pub silent_for: Duration,
}

struct Shared {
    verdict: Verdict,
    last_answer: Instant,
}

struct Watch {
    target: Target,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The primaries watched, per Redis.
pub struct Monitor {
    watches: Mutex<HashMap<ObjectRef<Redis>, Watch>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
}

impl Monitor {
    /// A monitor that asks for reconciles on the returned stream.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<ObjectRef<Redis>>) {
        let (trigger, rx) = mpsc::unbounded();
        (
            Monitor {
                watches: Mutex::new(HashMap::new()),
                trigger,
            },
            rx,
        )
    }

    /// Watches `target` as the primary of `obj` (replacing another target;
    /// the same target keeps its probe and its history).
    pub fn watch(&self, obj: &ObjectRef<Redis>, target: Target) {
        let Ok(mut w) = self.watches.lock() else {
            return;
        };
        if w.get(obj).is_some_and(|old| old.target == target) {
            return;
        }
        let shared = Arc::new(Mutex::new(Shared {
            verdict: Verdict::Healthy,
            last_answer: Instant::now(),
        }));
        let task = tokio::spawn(probe_loop(
            obj.clone(),
            target.clone(),
            shared.clone(),
            self.trigger.clone(),
        ));
        w.insert(
            obj.clone(),
            Watch {
                target,
                shared,
                task,
            },
        );
    }

    /// Stops watching the primary of `obj`.
    pub fn unwatch(&self, obj: &ObjectRef<Redis>) {
        if let Ok(mut w) = self.watches.lock() {
            w.remove(obj);
        }
    }

    /// Keeps only the watches of objects `keep` names.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Redis>) -> bool) {
        if let Ok(mut w) = self.watches.lock() {
            w.retain(|o, _| keep(o));
        }
    }

    /// The objects whose primary is watched.
    pub fn objects(&self) -> Vec<ObjectRef<Redis>> {
        self.watches
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The health of the primary watched for `obj`.
    pub fn health(&self, obj: &ObjectRef<Redis>) -> Option<Health> {
        let w = self.watches.lock().ok()?;
        let watch = w.get(obj)?;
        let s = watch.shared.lock().ok()?;
        Some(Health {
            pod: watch.target.pod.clone(),
            ip: watch.target.ip.clone(),
            verdict: s.verdict,
            silent_for: s.last_answer.elapsed(),
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
        tokio::time::timeout(within, probe(&mut None, endpoint, &opts)).await,
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

async fn probe_loop(
    obj: ObjectRef<Redis>,
    target: Target,
    shared: Arc<Mutex<Shared>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
) {
    let endpoint = Endpoint::new(&target.ip, target.port);
    let opts = ConnectOptions::default()
        .with_password(target.password.clone())
        .with_timeouts(PROBE_INTERVAL, PROBE_INTERVAL);
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<Node> = None;
    let mut told_silent = false;
    loop {
        ticker.tick().await;
        let probe = probe(&mut conn, &endpoint, &opts).await;
        let Ok(mut s) = shared.lock() else { return };
        let before = s.verdict;
        s.verdict = match probe {
            Probe::Answered => {
                s.last_answer = Instant::now();
                told_silent = false;
                Verdict::Healthy
            }
            Probe::Refused => Verdict::Down,
            Probe::NotPrimary => Verdict::Restarted,
            Probe::Silent => Verdict::Silent,
        };
        let crossed = s.verdict == Verdict::Silent
            && !told_silent
            && s.last_answer.elapsed() >= target.silence;
        let changed = s.verdict != before && s.verdict != Verdict::Healthy;
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

/// One probe: `PING` on the open connection; when there is none (or it just
/// broke) a TCP connect first, to tell "nothing listens" from "no answer",
/// then a connection that checks the server is still a primary.
async fn probe(conn: &mut Option<Node>, endpoint: &Endpoint, opts: &ConnectOptions) -> Probe {
    if let Some(node) = conn.as_mut() {
        match node.ping().await {
            // An error reply (LOADING, a changed password) is an answer.
            Ok(()) => return Probe::Answered,
            Err(e) if answered(&e) => return Probe::Answered,
            Err(_) => *conn = None,
        }
    }
    let addr = format!("{}:{}", endpoint.host(), endpoint.port());
    match tokio::time::timeout(PROBE_INTERVAL, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        _ => return Probe::Silent,
    }
    let mut node = match Node::connect(endpoint, opts).await {
        Ok(node) => node,
        Err(e) if answered(&e) => return Probe::Answered,
        Err(_) => return Probe::Silent,
    };
    match node.replication().await {
        Ok(r) if r.role == Some(Role::Primary) => {
            *conn = Some(node);
            Probe::Answered
        }
        Ok(_) => Probe::NotPrimary,
        Err(e) if answered(&e) => Probe::Answered,
        Err(_) => Probe::Silent,
    }
}

/// The server replied, with an error: it is alive (a password being
/// rotated, a dataset loading), which is not for failover to judge.
fn answered(e: &crate::redis::Error) -> bool {
    matches!(
        e.category(),
        crate::redis::ErrorCategory::Auth | crate::redis::ErrorCategory::Server
    )
}
