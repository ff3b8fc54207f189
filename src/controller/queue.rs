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

/// How long a Redis may go on [`Mark`]s alone: at least this often its pass
/// is a full one (the servers observed, every step run).
pub const FULL_PASS_EVERY: Duration = Duration::from_secs(300);

/// An object a pass read from the API past the caches (a Secret, the
/// operator never caches), and the version it found.
#[derive(Clone)]
pub struct Read {
    /// Its name (in the Redis' namespace).
    pub name: String,
    /// Its `resourceVersion` then (`None`: it did not exist).
    pub version: Option<String>,
    /// Reads its `resourceVersion` now (its metadata only).
    pub check: VersionNow,
}

/// Reads the `resourceVersion` of an object of one kind, by namespace and
/// name (`None`: it does not exist).
pub type VersionNow =
    fn(kube::Client, String, String) -> futures::future::BoxFuture<'static, VersionRead>;

/// What [`VersionNow`] gives.
pub type VersionRead = Result<Option<String>, kube::Error>;

impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Read")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish()
    }
}

/// What a full pass that found nothing to do left for the periodic passes
/// after it: when it ran and what it read past the caches. While no change
/// reached the controller for that Redis since the pass began (its object,
/// a child, a pod, a monitor's trigger: every one goes through
/// [`Queue::triggered`]), a periodic pass reads those objects' versions
/// again and stops there when none changed (see
/// `controller::redis::light`).
#[derive(Debug, Clone)]
pub struct Mark {
    /// When the full pass ended.
    pub at: Instant,
    /// The `resourceVersion` of the Redis it worked from (a change that
    /// came while that pass waited to start is seen by this).
    pub version: Option<String>,
    /// What it read past the caches.
    pub reads: Vec<Read>,
}

#[derive(Debug, Default)]
struct Changes {
    /// Changes that reached the controller for this Redis (never reset
    /// while it exists).
    epoch: u64,
    /// Left by the last full pass that found nothing to do, when no change
    /// came since it began.
    mark: Option<Mark>,
}

/// The ledger (one per process; entries are keyed by namespace and name, so
/// controllers of several namespaces share it).
#[derive(Debug, Default)]
pub struct Queue {
    entries: Mutex<HashMap<Key, Entry>>,
    changes: Mutex<HashMap<Key, Changes>>,
}

fn key(o: &ObjectRef<Redis>) -> Key {
    (o.namespace.clone(), o.name.clone())
}

impl Queue {
    /// A trigger for `o` reached the controller at `now`: a change, so its
    /// next pass is a full one.
    pub fn triggered(&self, o: &ObjectRef<Redis>, now: Instant) {
        if let Ok(mut c) = self.changes.lock() {
            let changes = c.entry(key(o)).or_default();
            changes.epoch = changes.epoch.wrapping_add(1);
            changes.mark = None;
        }
        if let Ok(mut e) = self.entries.lock() {
            let entry = e.entry(key(o)).or_default();
            entry.due = Some(entry.due.map_or(now, |d| d.min(now)));
        }
    }

    /// The changes counted for `o` so far (read when a pass begins).
    pub fn epoch(&self, o: &ObjectRef<Redis>) -> u64 {
        self.changes
            .lock()
            .ok()
            .and_then(|c| c.get(&key(o)).map(|x| x.epoch))
            .unwrap_or(0)
    }

    /// A full pass of `o` that began at `epoch` found nothing to do: kept
    /// unless a change came since it began.
    pub fn leave_mark(&self, o: &ObjectRef<Redis>, epoch: u64, mark: Mark) {
        if let Ok(mut c) = self.changes.lock() {
            let changes = c.entry(key(o)).or_default();
            if changes.epoch == epoch {
                changes.mark = Some(mark);
            }
        }
    }

    /// The mark `o`'s last full pass left, while no change came since.
    pub fn mark(&self, o: &ObjectRef<Redis>) -> Option<Mark> {
        self.changes.lock().ok()?.get(&key(o))?.mark.clone()
    }

    /// A watch of children or pods lists again (after an outage): an
    /// object deleted meanwhile vanishes from its cache with no event to
    /// name its Redis, so every Redis' next pass is a full one.
    pub fn relisted(&self) {
        if let Ok(mut c) = self.changes.lock() {
            for changes in c.values_mut() {
                changes.epoch = changes.epoch.wrapping_add(1);
                changes.mark = None;
            }
        }
    }

    /// Forgets `o`'s mark (its pass is a full one).
    pub fn drop_mark(&self, o: &ObjectRef<Redis>) {
        if let Ok(mut c) = self.changes.lock()
            && let Some(changes) = c.get_mut(&key(o))
        {
            changes.mark = None;
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
        let k = (namespace.map(str::to_string), name.to_string());
        if let Ok(mut c) = self.changes.lock() {
            c.remove(&k);
        }
        if let Ok(mut e) = self.entries.lock() {
            e.remove(&k);
        }
    }

    /// A controller of `namespace` (all when `None`) stopped: its queue
    /// went with it.
    pub fn clear(&self, namespace: Option<&str>) {
        let keep = |ns: &Option<String>| namespace.is_some_and(|n| ns.as_deref() != Some(n));
        if let Ok(mut c) = self.changes.lock() {
            c.retain(|(ns, _), _| keep(ns));
        }
        if let Ok(mut e) = self.entries.lock() {
            e.retain(|(ns, _), _| keep(ns));
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

    fn mark() -> Mark {
        Mark {
            at: Instant::now(),
            version: None,
            reads: Vec::new(),
        }
    }

    #[test]
    fn a_mark_stays_only_while_no_change_came_since_its_pass_began() {
        let q = Queue::default();
        let (a, b) = (r("a"), r("b"));
        // A pass that began before a change leaves no mark.
        let began = q.epoch(&a);
        q.triggered(&a, Instant::now());
        q.leave_mark(&a, began, mark());
        assert!(q.mark(&a).is_none(), "a change came during the pass");
        // One that began after it does; the next change takes it away.
        let began = q.epoch(&a);
        q.leave_mark(&a, began, mark());
        assert!(q.mark(&a).is_some());
        assert!(q.mark(&b).is_none(), "marks are per Redis");
        q.triggered(&b, Instant::now());
        assert!(q.mark(&a).is_some(), "another Redis' change");
        q.triggered(&a, Instant::now());
        assert!(q.mark(&a).is_none(), "a change drops the mark");
        // Dropped by hand, and gone with the Redis (a new one of the same
        // name starts over).
        let began = q.epoch(&a);
        q.leave_mark(&a, began, mark());
        q.drop_mark(&a);
        assert!(q.mark(&a).is_none());
        q.leave_mark(&a, began, mark());
        q.gone(Some("ns"), "a");
        assert!(q.mark(&a).is_none());
        assert_eq!(q.epoch(&a), 0);
        q.leave_mark(&a, 0, mark());
        q.clear(Some("ns"));
        assert!(q.mark(&a).is_none(), "its namespace's controller stopped");
        // A watch that lists again drops every mark, and a pass that began
        // before it leaves none.
        let (ea, eb) = (q.epoch(&a), q.epoch(&b));
        q.leave_mark(&a, ea, mark());
        q.leave_mark(&b, eb, mark());
        q.relisted();
        assert!(q.mark(&a).is_none() && q.mark(&b).is_none());
        q.leave_mark(&a, ea, mark());
        assert!(q.mark(&a).is_none(), "began before the re-list");
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
