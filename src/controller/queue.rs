//! The Redis controller's work queue, measured: how many reconciles wait for
//! a worker, and how long each waited.
//!
//! kube-runtime's scheduler does not show its queue, so the controller keeps
//! a ledger of what the scheduler is given: every trigger as it reaches the
//! controller (a watch event of a Redis, of one of its children or pods, a
//! failing primary seen by the monitor), every requeue a reconcile or the
//! error policy asks for, and the start and end of every reconcile. The
//! ledger keeps what the scheduler keeps: one entry per Redis, due at the
//! earliest time asked for, held while that Redis's reconcile runs.
//!
//! A Redis *waits* from the moment its entry is due until its reconcile
//! starts: behind busy workers (`MAX_CONCURRENT_RECONCILES`), behind its
//! own running reconcile, or in the scheduler's debounce ([`DEBOUNCE`]), which is
//! time the change waits too. A requeue due later is *scheduled*, not
//! waiting.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::api::v1alpha1::Redis;

/// How long the controller holds a trigger for a Redis before reconciling
/// it, merging what arrives meanwhile: the burst of watch events one
/// change makes (a pod's status, its StatefulSet's, within milliseconds of
/// each other) becomes one pass. Every trigger waits this long, the failure
/// monitor's too, so it is part of every failover (it was 200 ms; the
/// events of a burst come well within 50).
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// How long to wait before looking again while something is in progress.
pub const PROGRESS_REQUEUE: Duration = Duration::from_secs(2);

/// How often a healthy Redis is re-observed to keep status fresh.
pub const STEADY_REQUEUE: Duration = Duration::from_secs(60);

/// What a reconcile asks of the scheduler: run again after a delay, or only
/// on a change. Kept readable (kube-runtime's [`Action`] hides its delay)
/// so the ledger knows when the next run is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next(Option<Duration>);

impl Next {
    /// Reconcile again after `d` (sooner on a change).
    pub const fn after(d: Duration) -> Self {
        Self(Some(d))
    }

    /// Reconcile again on a change only.
    pub const fn on_change() -> Self {
        Self(None)
    }

    /// The delay asked for, if any.
    pub fn delay(self) -> Option<Duration> {
        self.0
    }
}

impl From<Next> for Action {
    fn from(n: Next) -> Self {
        match n.0 {
            Some(d) => Action::requeue(d),
            None => Action::await_change(),
        }
    }
}

type Key = (Option<String>, String);

#[derive(Debug, Default)]
struct Entry {
    /// When the next run is due (`None`: nothing asked for).
    due: Option<Instant>,
    running: bool,
}

/// What the queue holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Depth {
    /// Redis due now whose reconcile has not started.
    pub waiting: usize,
    /// Redis with a run due later (a requeue).
    pub scheduled: usize,
    /// Reconciles running.
    pub running: usize,
    /// How long the longest-waiting Redis has waited.
    pub oldest: Duration,
}

/// The ledger (one per process; entries are keyed by namespace and name, so
/// controllers of several namespaces share it).
#[derive(Debug, Default)]
pub struct Queue {
    entries: Mutex<HashMap<Key, Entry>>,
}

fn key(o: &ObjectRef<Redis>) -> Key {
    (o.namespace.clone(), o.name.clone())
}

impl Queue {
    /// A trigger for `o` reached the controller at `now`.
    pub fn triggered(&self, o: &ObjectRef<Redis>, now: Instant) {
        if let Ok(mut e) = self.entries.lock() {
            let entry = e.entry(key(o)).or_default();
            entry.due = Some(entry.due.map_or(now, |d| d.min(now)));
        }
    }

    /// `o`'s reconcile starts at `now`: how long it waited (`None` when
    /// the ledger had no run due for it).
    pub fn started(&self, o: &ObjectRef<Redis>, now: Instant) -> Option<Duration> {
        let mut e = self.entries.lock().ok()?;
        let entry = e.entry(key(o)).or_default();
        entry.running = true;
        let due = entry.due.take()?;
        Some(now.saturating_duration_since(due))
    }

    /// `o`'s reconcile ended at `now`, asking to run again after `next`
    /// (the error policy's delay when it failed).
    pub fn finished(&self, o: &ObjectRef<Redis>, next: Option<Duration>, now: Instant) {
        if let Ok(mut e) = self.entries.lock() {
            let k = key(o);
            let entry = e.entry(k.clone()).or_default();
            entry.running = false;
            if let Some(d) = next {
                let at = now.checked_add(d).unwrap_or(now);
                entry.due = Some(entry.due.map_or(at, |x| x.min(at)));
            }
            if entry.due.is_none() {
                e.remove(&k);
            }
        }
    }

    /// The scheduler dropped `name`'s run: the Redis is gone.
    pub fn gone(&self, namespace: Option<&str>, name: &str) {
        if let Ok(mut e) = self.entries.lock() {
            e.remove(&(namespace.map(str::to_string), name.to_string()));
        }
    }

    /// A controller of `namespace` (all when `None`) stopped: its queue
    /// went with it.
    pub fn clear(&self, namespace: Option<&str>) {
        if let Ok(mut e) = self.entries.lock() {
            e.retain(|(ns, _), _| namespace.is_some_and(|n| ns.as_deref() != Some(n)));
        }
    }

    /// The queue at `now`.
    pub fn depth(&self, now: Instant) -> Depth {
        let mut d = Depth::default();
        if let Ok(e) = self.entries.lock() {
            for entry in e.values() {
                if entry.running {
                    d.running += 1;
                }
                match entry.due {
                    Some(due) if due <= now => {
                        d.waiting += 1;
                        d.oldest = d.oldest.max(now - due);
                    }
                    Some(_) => d.scheduled += 1,
                    None => {}
                }
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str) -> ObjectRef<Redis> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn a_trigger_waits_until_its_reconcile_starts() {
        let q = Queue::default();
        let t0 = Instant::now();
        q.triggered(&r("a"), t0);
        q.triggered(&r("b"), t0 + Duration::from_millis(10));
        let d = q.depth(t0 + Duration::from_millis(50));
        assert_eq!((d.waiting, d.scheduled, d.running), (2, 0, 0));
        assert_eq!(d.oldest, Duration::from_millis(50));
        assert_eq!(
            q.started(&r("a"), t0 + Duration::from_millis(60)),
            Some(Duration::from_millis(60))
        );
        let d = q.depth(t0 + Duration::from_millis(60));
        assert_eq!((d.waiting, d.running), (1, 1));
        assert_eq!(d.oldest, Duration::from_millis(50));
    }

    #[test]
    fn a_requeue_is_scheduled_until_due_and_the_earliest_wins() {
        let q = Queue::default();
        let t0 = Instant::now();
        assert_eq!(q.started(&r("a"), t0), None);
        q.finished(&r("a"), Some(Duration::from_secs(60)), t0);
        let d = q.depth(t0 + Duration::from_secs(1));
        assert_eq!((d.waiting, d.scheduled, d.running), (0, 1, 0));
        // A change before then: due at once, as the scheduler merges it.
        q.triggered(&r("a"), t0 + Duration::from_secs(2));
        let d = q.depth(t0 + Duration::from_secs(3));
        assert_eq!((d.waiting, d.scheduled), (1, 0));
        assert_eq!(d.oldest, Duration::from_secs(1));
        // The requeue comes due on its own too.
        q.started(&r("a"), t0 + Duration::from_secs(3));
        q.finished(
            &r("a"),
            Some(Duration::from_secs(5)),
            t0 + Duration::from_secs(4),
        );
        assert_eq!(q.depth(t0 + Duration::from_secs(8)).scheduled, 1);
        let d = q.depth(t0 + Duration::from_secs(10));
        assert_eq!((d.waiting, d.oldest), (1, Duration::from_secs(1)));
    }

    #[test]
    fn a_trigger_while_running_waits_for_the_run_and_on_change_leaves_nothing() {
        let q = Queue::default();
        let t0 = Instant::now();
        q.triggered(&r("a"), t0);
        q.started(&r("a"), t0);
        q.triggered(&r("a"), t0 + Duration::from_millis(5));
        assert_eq!(q.depth(t0 + Duration::from_millis(6)).waiting, 1);
        q.finished(&r("a"), None, t0 + Duration::from_millis(7));
        assert_eq!(q.depth(t0 + Duration::from_millis(8)).waiting, 1);
        q.started(&r("a"), t0 + Duration::from_millis(9));
        q.finished(&r("a"), None, t0 + Duration::from_millis(10));
        assert_eq!(q.depth(t0 + Duration::from_secs(1)), Depth::default());
        assert!(q.entries.lock().map(|e| e.is_empty()).unwrap_or(false));
    }

    #[test]
    fn gone_and_cleared_redis_leave_the_queue() {
        let q = Queue::default();
        let t0 = Instant::now();
        q.triggered(&r("a"), t0);
        q.triggered(&ObjectRef::new("b").within("other"), t0);
        q.triggered(&ObjectRef::new("c").within("other"), t0);
        q.gone(Some("ns"), "a");
        assert_eq!(q.depth(t0).waiting, 2);
        q.clear(Some("ns"));
        assert_eq!(q.depth(t0).waiting, 2);
        q.clear(Some("other"));
        assert_eq!(q.depth(t0).waiting, 0);
        q.triggered(&r("a"), t0);
        q.clear(None);
        assert_eq!(q.depth(t0).waiting, 0);
    }
}
