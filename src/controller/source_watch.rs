//! The watch on a source a Redis follows (`spec.replicaOf`): one long-lived
//! connection to the source per following Redis, probed with `PING`.
//!
//! Why: a Redis server that loses its primary reconnects by itself every
//! second, and a primary that restarted empty (a source without
//! persistence, `kill -9`ed and started again) answers that reconnect with
//! a full synchronisation of its empty dataset: the follower is wiped.
//! Redis has no setting to refuse it. So the moment the source stops
//! answering (its connection closes, a connect is refused, or it is silent
//! for [`SILENCE`]) the watch points the following Redis's primary at the
//! fence (`layout::SOURCE_FENCE_PORT`), where nothing listens, and asks for
//! a reconcile. Only the reconcile points it back at the source, after it
//! has checked the source continues the history the primary holds (see
//! `redis::follow`).
//!
//! The watch decides nothing else. It fences only a server that still
//! follows the source (one the operator moved meanwhile is left alone).
//! While the operator is not running nothing fences: a source that comes
//! back empty within a second of dying then wipes the follower. That bound
//! is in the README.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;

use crate::api::v1alpha1::Redis;
use crate::controller::layout::{BOOT_FENCE_HOST, SOURCE_FENCE_PORT};
use crate::redis::info::Role;
use crate::redis::probe::{ProbeConn, answered, closed};
use crate::redis::{ConnectOptions, Endpoint, Node};

/// Time between two probes of a source.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// A source silent this long (no answer, the connection still open) is
/// treated as lost.
pub const SILENCE: Duration = Duration::from_secs(2);

/// What to watch for one following Redis.
#[derive(Clone)]
pub struct SourceTarget {
    /// Tells targets apart (a hash of everything below, credentials
    /// included): the same key keeps the running probe.
    pub key: String,
    /// The source.
    pub source: Endpoint,
    /// How to reach it (its credentials; never logged).
    pub source_opts: ConnectOptions,
    /// The following Redis's primary.
    pub head: Endpoint,
    /// How to reach the primary (the operator's credentials and TLS).
    pub head_opts: ConnectOptions,
    /// After an unplanned promotion off the source: the history the Redis
    /// was promoted from. The watch then fences the old source instead
    /// (see [`fence_old_source`]), not the primary.
    pub old_history: Option<String>,
}

struct Watch {
    target: SourceTarget,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The sources watched, per Redis.
pub struct SourceWatches {
    watches: Mutex<HashMap<ObjectRef<Redis>, Watch>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
    /// Where the watches run (the failure monitor's thread), or the
    /// caller's runtime.
    runtime: Option<&'static tokio::runtime::Handle>,
}

impl SourceWatches {
    /// Watches that ask for reconciles on `trigger`, running on `runtime`.
    pub fn new(
        trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
        runtime: Option<&'static tokio::runtime::Handle>,
    ) -> Self {
        SourceWatches {
            watches: Mutex::new(HashMap::new()),
            trigger,
            runtime,
        }
    }

    /// Watches `target` for `obj` (the same target keeps its probe).
    pub fn watch(&self, obj: &ObjectRef<Redis>, target: SourceTarget) {
        let Ok(mut w) = self.watches.lock() else {
            return;
        };
        if w.get(obj)
            .is_some_and(|old| old.target.key == target.key && !old.task.is_finished())
        {
            return;
        }
        let (trigger, o, t) = (self.trigger.clone(), obj.clone(), target.clone());
        let task = match (self.runtime, target.old_history.is_some()) {
            (Some(runtime), false) => runtime.spawn(watch_loop(o, t, trigger)),
            (None, false) => tokio::spawn(watch_loop(o, t, trigger)),
            (Some(runtime), true) => runtime.spawn(old_source_loop(o, t, trigger)),
            (None, true) => tokio::spawn(old_source_loop(o, t, trigger)),
        };
        w.insert(obj.clone(), Watch { target, task });
    }

    /// Stops watching the source of `obj`.
    pub fn unwatch(&self, obj: &ObjectRef<Redis>) {
        if let Ok(mut w) = self.watches.lock() {
            w.remove(obj);
        }
    }

    /// Whether the source of `obj` is watched.
    pub fn watched(&self, obj: &ObjectRef<Redis>) -> bool {
        self.watches.lock().is_ok_and(|w| w.contains_key(obj))
    }

    /// Keeps only the watches of objects `keep` names.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Redis>) -> bool) {
        if let Ok(mut w) = self.watches.lock() {
            w.retain(|o, _| keep(o));
        }
    }
}

async fn watch_loop(
    obj: ObjectRef<Redis>,
    target: SourceTarget,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
) {
    let opts = target
        .source_opts
        .clone()
        .with_timeouts(PROBE_INTERVAL * 2, PROBE_INTERVAL * 2);
    let mut conn: Option<ProbeConn> = None;
    let mut last_answer = Instant::now();
    // The source was lost and the primary fenced for it (fenced once per
    // loss; a fence that failed is tried again at the next probe).
    let mut fenced = false;
    // The open connection closed: the source is lost even if a reconnect
    // succeeds at once (a server restarted in place answers a new
    // connection within milliseconds — with whatever data it has).
    let mut closed_now = false;
    // A loss seen and not yet answered by a fence that took.
    let mut need_fence = false;
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let lost = std::mem::take(&mut closed_now)
            || match conn.as_mut() {
                Some(c) => match c.ping().await {
                    Ok(()) => {
                        last_answer = Instant::now();
                        false
                    }
                    // An error reply (LOADING, a changed password) is an
                    // answer from a server that is there; a closed
                    // connection is not.
                    Err(e) if answered(&e) => {
                        last_answer = Instant::now();
                        false
                    }
                    Err(_) => {
                        conn = None;
                        true
                    }
                },
                None if fenced => match ProbeConn::open(&target.source, &opts).await {
                    // Reachable again after a loss: a pass decides whether
                    // the primary may follow it; the watch keeps the
                    // connection to notice the next loss.
                    Ok(c) => {
                        conn = Some(c);
                        last_answer = Instant::now();
                        fenced = false;
                        if trigger.unbounded_send(obj.clone()).is_err() {
                            return;
                        }
                        false
                    }
                    Err(_) => true,
                },
                None => match ProbeConn::open(&target.source, &opts).await {
                    Ok(c) => {
                        conn = Some(c);
                        last_answer = Instant::now();
                        false
                    }
                    Err(_) => true,
                },
            };
        let silent = last_answer.elapsed() >= SILENCE;
        if (lost || silent) && !fenced {
            if silent {
                conn = None;
            }
            need_fence = true;
        }
        if need_fence {
            match fence(&target).await {
                Ok(true) => {
                    fenced = true;
                    need_fence = false;
                    tracing::warn!(redis = %obj, source = %target.source, head = %target.head, "source lost: primary fenced off it until its history is checked");
                }
                Ok(false) => {
                    fenced = true;
                    need_fence = false;
                }
                Err(e) => {
                    tracing::warn!(redis = %obj, source = %target.source, head = %target.head, error = %e, "source lost; fencing the primary failed (tried again at the next probe)");
                }
            }
            if trigger.unbounded_send(obj.clone()).is_err() {
                return;
            }
        }
        if conn.is_some() {
            // Between probes the open connection is watched: a source that
            // dies closes it, and the fence goes up at once.
            tokio::select! {
                _ = ticker.tick() => {}
                _ = closed(&mut conn) => {
                    conn = None;
                    closed_now = true;
                }
            }
        } else if !need_fence {
            ticker.tick().await;
        } else {
            // A fence that failed: tried again soon, not at the next tick.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Points the primary at the fence if it still follows the source; true
/// when it did.
async fn fence(target: &SourceTarget) -> crate::redis::Result<bool> {
    let mut node = Node::connect(&target.head, &target.head_opts).await?;
    let r = node.replication().await?;
    if r.role != Some(Role::Replica) || r.primary.as_ref() != Some(&target.source) {
        return Ok(false);
    }
    node.replicaof(Some(&Endpoint::new(BOOT_FENCE_HOST, SOURCE_FENCE_PORT)))
        .await?;
    Ok(true)
}

/// After an unplanned promotion: every [`PROBE_INTERVAL`], the old source
/// is asked; once it answers, it is fenced if it still takes writes on
/// the history the Redis was promoted from, and a reconcile records it.
async fn old_source_loop(
    obj: ObjectRef<Redis>,
    target: SourceTarget,
    trigger: mpsc::UnboundedSender<ObjectRef<Redis>>,
) {
    let opts = target
        .source_opts
        .clone()
        .with_timeouts(PROBE_INTERVAL * 2, PROBE_INTERVAL * 2);
    let Some(history) = target.old_history.clone() else {
        return;
    };
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        match fence_old_source(&target.source, &opts, &history).await {
            Ok(Some(found)) => {
                if found == OldSource::Fenced {
                    tracing::warn!(redis = %obj, source = %target.source, "the old source answered as a writable primary of the history this Redis was promoted from: fenced it");
                }
                if trigger.unbounded_send(obj.clone()).is_err() {
                    return;
                }
                return;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(redis = %obj, source = %target.source, error = %e, "the old source does not answer");
            }
        }
    }
}

/// What [`fence_old_source`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldSource {
    /// It took writes on the history: it is fenced now.
    Fenced,
    /// It takes no writes already (fenced, or a replica).
    AlreadyFenced,
    /// Another Redis answers there (another history): left alone.
    Other,
}

/// Fences the server at `source` when it takes writes on `history` (its
/// replication id, or the one before it after a failover of its own).
/// `None` when it has to be asked again (it did not answer).
pub async fn fence_old_source(
    source: &Endpoint,
    opts: &ConnectOptions,
    history: &str,
) -> crate::redis::Result<Option<OldSource>> {
    let mut node = Node::connect(source, opts).await?;
    let r = node.replication().await?;
    let fence = Endpoint::new(BOOT_FENCE_HOST, SOURCE_FENCE_PORT);
    if r.role == Some(Role::Replica) && r.primary.as_ref() == Some(&fence) {
        return Ok(Some(OldSource::AlreadyFenced));
    }
    let related = r.replid.as_deref() == Some(history) || r.replid2.as_deref() == Some(history);
    if !related {
        return Ok(Some(OldSource::Other));
    }
    if r.role != Some(Role::Primary) {
        // A replica takes no writes (one that follows the promoted Redis
        // is what the user is asked to set up).
        return Ok(Some(OldSource::AlreadyFenced));
    }
    node.replicaof(Some(&fence)).await?;
    Ok(Some(OldSource::Fenced))
}
