//! The operator: controllers, their shared context, leader election.
//!
//! Length: ~470 lines of code and ~100 of tests: the wiring of the three
//! controllers of a watched namespace (Redis, RedisBackup,
//! RedisBackupSchedule: watches, stores, leader hand-over, readiness) is one
//! start-up sequence read top to bottom.

pub mod agent;
pub mod backup;
pub mod base;
pub mod cache;
pub mod error;
pub mod events;
pub mod images;
pub mod insights;
pub mod layout;
pub mod leader;
pub mod monitor;
pub mod names;
pub mod queue;
pub mod redis;
pub mod schedule;
pub mod served;
pub mod source_watch;
pub mod trust;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use self::base::backoff;
pub use self::cache::Stores;
use self::cache::{cached_watch, slim_pod};
use self::error::Error;
use self::events::{Events, recorder};
use self::queue::DEBOUNCE;

use crate::api::v1alpha1::Redis;
use crate::telemetry::Metrics;

/// Operator-wide settings from its command line.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The S3 endpoints agents may reach (`--s3-endpoints`).
    pub endpoints: trust::EndpointPolicy,
    /// The operator's own namespace: network policies let it in.
    pub namespace: String,
    /// Lifetime and renewal of the certificates it issues (`spec.tls`
    /// without a Secret).
    pub certs: redis::issuer::CertPolicy,
    /// How often each Redis's servers are looked at for tuning advice
    /// (zero: never).
    pub tuning_interval: std::time::Duration,
}

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes events.
    pub events: Events,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Engine images from `RELATED_IMAGE_*`.
    pub images: images::Images,
    /// Operator-wide settings.
    pub settings: Arc<Settings>,
    /// The watch caches.
    pub stores: Stores,
    /// Health of the primaries (failure detection for failover).
    pub monitor: monitor::Monitor,
    /// The monitoring CRDs and the PodMonitors and PrometheusRules written.
    pub insights: insights::objects::Insights,
    /// Whether the cluster serves cert-manager's Certificate.
    pub cert_manager: served::Served,
    /// The monitor's reconcile requests, taken once by the controller.
    triggers: Mutex<Option<futures::channel::mpsc::UnboundedReceiver<ObjectRef<Redis>>>>,
    /// Consecutive failures per object, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Redis>, u32>>,
    /// Resource version of this operator's last status write per object,
    /// until the watch cache has caught up with it.
    written: Mutex<HashMap<ObjectRef<Redis>, String>>,
    /// Per object that is not ready: a fingerprint of what the last pass saw
    /// and how many passes in a row saw it without writing anything.
    stuck: Mutex<HashMap<ObjectRef<Redis>, (String, u32)>>,
    /// Per Redis: when its servers were last looked at for tuning advice,
    /// and each server's baselines and key-sampling cursor.
    pub tuning: Mutex<HashMap<ObjectRef<Redis>, redis::tuning::Memory>>,
}

impl Context {
    /// A context for `client`.
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        images: images::Images,
        stores: Stores,
        settings: Arc<Settings>,
    ) -> Self {
        let (monitor, triggers) = monitor::Monitor::new();
        Context {
            events: Events::new(&client),
            client,
            metrics,
            images,
            settings,
            stores,
            monitor,
            insights: Default::default(),
            cert_manager: redis::certmanager::discovery(),
            triggers: Mutex::new(Some(triggers)),
            failures: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            stuck: Mutex::new(HashMap::new()),
            tuning: Mutex::new(HashMap::new()),
        }
    }

    /// The resource version of our last status write to `obj` that the
    /// cache may not have seen yet.
    pub fn written_version(&self, obj: &ObjectRef<Redis>) -> Option<String> {
        self.written.lock().ok()?.get(obj).cloned()
    }

    /// Records a status write to `obj`.
    pub fn remember_written(&self, obj: &ObjectRef<Redis>, rv: String) {
        if let Ok(mut w) = self.written.lock() {
            w.insert(obj.clone(), rv);
        }
    }

    /// The cache has caught up with our writes to `obj`.
    pub fn forget_written(&self, obj: &ObjectRef<Redis>) {
        if let Ok(mut w) = self.written.lock() {
            w.remove(obj);
        }
    }

    /// Counts a pass of `obj` that is not ready: returns how many passes in
    /// a row (before this one) saw the same `fingerprint` without writing.
    pub fn stuck_passes(&self, obj: &ObjectRef<Redis>, fingerprint: String, wrote: bool) -> u32 {
        let Ok(mut m) = self.stuck.lock() else {
            return 0;
        };
        let entry = m.entry(obj.clone()).or_insert_with(|| (String::new(), 0));
        if wrote || entry.0 != fingerprint {
            *entry = (fingerprint, 0);
            return 0;
        }
        entry.1 = entry.1.saturating_add(1);
        entry.1
    }

    /// `obj` is ready (or gone): no backoff is remembered for it.
    pub fn forget_stuck(&self, obj: &ObjectRef<Redis>) {
        if let Ok(mut m) = self.stuck.lock() {
            m.remove(obj);
        }
    }

    /// Drops everything remembered about `obj` (it was deleted).
    pub fn forget(&self, obj: &ObjectRef<Redis>) {
        self.retain(|o| o != obj);
    }

    /// The monitor's reconcile requests (once; later calls get `None`).
    pub fn take_triggers(
        &self,
    ) -> Option<futures::channel::mpsc::UnboundedReceiver<ObjectRef<Redis>>> {
        self.triggers.lock().ok()?.take()
    }

    /// Keeps what is remembered only for the objects `keep` names: after a
    /// re-list, objects deleted while the watch was down are dropped too, so
    /// the per-object maps never outgrow the Redis that exist.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Redis>) -> bool) {
        self.monitor.retain(&keep);
        self.insights.retain(&keep);
        if let Ok(mut m) = self.failures.lock() {
            m.retain(|o, _| keep(o));
        }
        if let Ok(mut m) = self.written.lock() {
            m.retain(|o, _| keep(o));
        }
        if let Ok(mut m) = self.stuck.lock() {
            m.retain(|o, _| keep(o));
        }
    }

    /// How many objects have something remembered.
    pub fn remembered(&self) -> usize {
        let mut all: std::collections::HashSet<ObjectRef<Redis>> = Default::default();
        if let Ok(m) = self.failures.lock() {
            all.extend(m.keys().cloned());
        }
        if let Ok(m) = self.written.lock() {
            all.extend(m.keys().cloned());
        }
        if let Ok(m) = self.stuck.lock() {
            all.extend(m.keys().cloned());
        }
        all.extend(self.monitor.objects());
        all.len()
    }

    fn record_success(&self, obj: &ObjectRef<Redis>) {
        if let Ok(mut f) = self.failures.lock() {
            f.remove(obj);
        }
    }

    /// Backoff for the next retry of `obj`: 2s, 4s, 8s ... capped at 5 min.
    fn next_backoff(&self, obj: &ObjectRef<Redis>) -> Duration {
        let n = match self.failures.lock() {
            Ok(mut f) => {
                let n = f.entry(obj.clone()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        backoff(n)
    }
}

/// A Redis as the controller caches it (see [`cache::Frozen`]).
type FrozenRedis = cache::Frozen<Redis>;

/// The reference the per-Redis maps are keyed by.
fn redis_ref(obj: &FrozenRedis) -> ObjectRef<Redis> {
    let m = obj.meta();
    cache::named(m.name.as_deref().unwrap_or(""), m.namespace.as_deref())
}

fn error_policy(obj: Arc<FrozenRedis>, err: &Error, ctx: Arc<Context>) -> Action {
    let oref = redis_ref(&obj);
    let wait = ctx.next_backoff(&oref);
    ctx.metrics
        .queue
        .finished(&oref, Some(wait), std::time::Instant::now());
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[err.category()])
        .inc();
    tracing::warn!(
        redis = %oref,
        category = err.category(),
        error = %err,
        retry_in_s = wait.as_secs(),
        "reconcile failed"
    );
    Action::requeue(wait)
}

async fn reconcile(obj: Arc<FrozenRedis>, ctx: Arc<Context>) -> Result<Action, Error> {
    let oref = redis_ref(&obj);
    if let Some(waited) = ctx.metrics.queue.started(&oref, std::time::Instant::now()) {
        ctx.metrics.queue_wait.observe(waited.as_secs_f64());
    }
    let result = match thawed(&obj, &oref, &ctx).await {
        Ok(Some(redis)) => reconcile_queued(Arc::new(redis), &oref, ctx.clone()).await,
        // Deleted since it was cached: nothing to do.
        Ok(None) => Ok(queue::Next::on_change()),
        Err(e) => Err(e),
    };
    // A failure's requeue is the error policy's (it records it).
    if let Ok(next) = &result {
        ctx.metrics
            .queue
            .finished(&oref, next.delay(), std::time::Instant::now());
    }
    result.map(Action::from)
}

/// The cached Redis decoded, or (never for an object this operator
/// cached; logged by the cache) read from the API.
async fn thawed(
    obj: &FrozenRedis,
    oref: &ObjectRef<Redis>,
    ctx: &Context,
) -> Result<Option<Redis>, Error> {
    if let Some(r) = obj.thaw() {
        return Ok(Some(r));
    }
    let ns = oref
        .namespace
        .as_deref()
        .ok_or(Error::Incomplete("namespace"))?;
    Ok(Api::<Redis>::namespaced(ctx.client.clone(), ns)
        .get_opt(&oref.name)
        .await?)
}

async fn reconcile_queued(
    obj: Arc<Redis>,
    oref: &ObjectRef<Redis>,
    ctx: Arc<Context>,
) -> Result<queue::Next, Error> {
    let oref = oref.clone();
    // Decisions need complete caches: a child missing from a cache that is
    // still listing would look deleted.
    if !ctx.stores.ready(Duration::from_secs(30)).await {
        tracing::warn!(redis = %oref, "watch caches not synced yet; retrying");
        return Ok(queue::Next::after(Duration::from_secs(2)));
    }
    if obj.meta().deletion_timestamp.is_some() {
        ctx.forget_written(&oref);
        ctx.forget_stuck(&oref);
    }
    let timer = std::time::Instant::now();
    // One span per reconcile; the data-plane actions and the Kubernetes
    // requests are its children, and every log line in it has its trace id.
    let span = tracing::info_span!(
        "reconcile",
        otel.name = "reconcile",
        redis.namespace = oref.namespace.as_deref().unwrap_or(""),
        redis.name = %oref.name,
        redis.generation = obj.metadata.generation.unwrap_or(0),
        trace_id = tracing::field::Empty,
    );
    if let Some(id) = crate::telemetry::trace_id(&span) {
        span.record("trace_id", id);
    }
    ctx.metrics.in_flight.inc();
    let result = redis::reconcile(obj, ctx.clone()).instrument(span).await;
    ctx.metrics.in_flight.dec();
    ctx.metrics
        .reconcile_duration
        .observe(timer.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics
        .reconciliations
        .with_label_values(&[outcome])
        .inc();
    if result.is_ok() {
        ctx.record_success(&oref);
    }
    result
}

/// Records in the work-queue ledger that a Redis's own change reached the
/// controller.
fn queued_self(metrics: &Arc<Metrics>) -> impl FnMut(&FrozenRedis) + use<> {
    let m = metrics.clone();
    move |r: &FrozenRedis| m.queue.triggered(&redis_ref(r), std::time::Instant::now())
}

/// Records in the work-queue ledger the Redis a child's change triggers:
/// its owners, as kube-runtime's `trigger_owners` maps them.
fn queued_owners<K: Resource>(metrics: &Arc<Metrics>) -> impl FnMut(&K) + use<K> {
    let m = metrics.clone();
    move |child: &K| {
        let now = std::time::Instant::now();
        let ns = child.meta().namespace.as_deref();
        for owner in child.meta().owner_references.iter().flatten() {
            if let Some(o) = ObjectRef::<Redis>::from_owner_ref(ns, owner, ()) {
                m.queue.triggered(&o, now);
            }
        }
    }
}

/// Runs the Redis controller over `namespaces` (all when empty) until the
/// process is asked to stop.
pub async fn run_controllers(
    client: Client,
    namespaces: Vec<String>,
    metrics: Arc<Metrics>,
    images: images::Images,
    settings: Arc<Settings>,
    health: Arc<crate::telemetry::Health>,
    concurrency: u16,
) {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    health.start_leading(scopes.len());
    let runs = scopes.into_iter().map(|ns| {
        let client = client.clone();
        let metrics = metrics.clone();
        let images = images.clone();
        let settings = settings.clone();
        let health = health.clone();
        async move {
            use self::base::scoped_api as api;
            let managed =
                watcher::Config::default().labels("app.kubernetes.io/managed-by=redpilot");
            fn keep<K>(_: &mut K) {}
            // Only the pods are picked by label from the whole cache.
            use cache::Labels::InBody;
            let pod_labels =
                cache::Labels::Only(&["app.kubernetes.io/name", names::INSTANCE_LABEL]);
            // A re-listed watch makes every Redis' next pass a full one.
            let relisted = || {
                let m = metrics.clone();
                move || m.queue.relisted()
            };
            let (statefulsets, sts_changes) =
                cached_watch(api(&client, &ns), managed.clone(), keep, InBody, relisted());
            let (services, svc_changes) =
                cached_watch(api(&client, &ns), managed.clone(), keep, InBody, relisted());
            let (config_maps, cm_changes) =
                cached_watch(api(&client, &ns), managed.clone(), keep, InBody, relisted());
            let (pdbs, pdb_changes) =
                cached_watch(api(&client, &ns), managed.clone(), keep, InBody, relisted());
            let (pods, pod_changes) =
                cached_watch::<Pod>(api(&client, &ns), managed, slim_pod, pod_labels, relisted());
            let stores = Stores {
                statefulsets,
                services,
                config_maps,
                pdbs,
                pods,
            };
            let synced = stores.clone();
            tokio::spawn(async move {
                loop {
                    match synced.sync(Duration::from_secs(60)).await {
                        cache::CacheSync::Synced => break health.caches_synced(),
                        cache::CacheSync::Pending => {
                            tracing::warn!("watch caches still not synced after 60 s")
                        }
                        // The controller stopped (leadership lost, the
                        // process exiting): nothing will sync. Waiting
                        // again would return at once, and this loop would
                        // hold a runtime thread forever.
                        cache::CacheSync::Gone => break,
                    }
                }
            });
            let ctx = Arc::new(Context::new(
                client.clone(),
                metrics.clone(),
                images,
                stores,
                settings.clone(),
            ));
            let done = metrics.clone();
            let (redis_store, redis_writer) = reflector::store();
            let backups = backup::run(
                client.clone(),
                ns.clone(),
                Arc::new(backup::BackupContext {
                    client: client.clone(),
                    recorder: recorder(&client),
                    metrics: metrics.clone(),
                    redis: redis_store.clone(),
                    settings,
                }),
            );
            let schedules = schedule::run(
                client.clone(),
                ns.clone(),
                Arc::new(schedule::ScheduleContext {
                    client: client.clone(),
                    recorder: recorder(&client),
                    metrics: metrics.clone(),
                }),
            );
            // Deleted Redis leave nothing behind in the context's per-object
            // maps (a delete event, or a re-list that no longer has them).
            let (forget, listed) = (ctx.clone(), redis_store.clone());
            // The Redis are cached frozen too (their typed spec and status
            // took several kilobytes each); a reconcile thaws the one it runs.
            let redis_dict = cache::Dictionary::default();
            // A test point: the cache of Redis fills 5 s late (a slow list),
            // while the other controllers already run.
            let late = crate::failpoint::armed_here("redis-cache-late");
            let redis_api = api::<Redis>(&client, &ns);
            let redis_changes = futures::stream::once(async move {
                if late {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            })
            .map(move |()| watcher(redis_api.clone(), watcher::Config::default()))
            .flatten()
            .default_backoff()
            .map_ok(move |event| {
                cache::freeze_event(event, |mut r: Redis| {
                    r.metadata.managed_fields = None;
                    cache::Frozen::freeze(r, InBody, Some(&redis_dict))
                })
            })
            .reflect(redis_writer)
            .inspect_ok(move |event| match event {
                watcher::Event::Delete(r) => forget.forget(&redis_ref(r)),
                watcher::Event::InitDone => {
                    forget.retain(|o| listed.get(&cache::same_ref(o)).is_some())
                }
                _ => {}
            })
            .applied_objects()
            .inspect_ok(queued_self(&metrics));
            let queued = metrics.clone();
            let triggers = ctx
                .take_triggers()
                .map(|t| {
                    t.inspect(move |o| queued.queue.triggered(o, std::time::Instant::now()))
                        .map(|o| cache::same_ref(&o))
                        .boxed()
                })
                .unwrap_or_else(|| futures::stream::empty().boxed());
            let queued = metrics.clone();
            let redis_controller = Controller::for_stream(redis_changes, redis_store)
                // A failing primary (see monitor) is reconciled at once.
                .reconcile_on(triggers)
                .owns_stream(sts_changes.inspect_ok(queued_owners(&metrics)))
                .owns_stream(svc_changes.inspect_ok(queued_owners(&metrics)))
                .owns_stream(cm_changes.inspect_ok(queued_owners(&metrics)))
                .owns_stream(pdb_changes.inspect_ok(queued_owners(&metrics)))
                // Pods belong to the StatefulSet; map them to their Redis by
                // the instance label so readiness changes trigger a reconcile.
                .watches_stream(pod_changes, move |pod: cache::Frozen<Pod>| {
                    let name = pod.labels().get(names::INSTANCE_LABEL)?.clone();
                    let ns = pod.namespace()?;
                    let o = ObjectRef::<Redis>::new(&name).within(&ns);
                    queued.queue.triggered(&o, std::time::Instant::now());
                    Some(cache::same_ref::<Redis, FrozenRedis>(&o))
                })
                // Bounded: a thousand Redis appearing at once must queue here,
                // not as thousands of requests in flight at the API server.
                .with_config(
                    ControllerConfig::default()
                        .debounce(DEBOUNCE)
                        .concurrency(concurrency),
                )
                .shutdown_on_signal()
                .run(reconcile, error_policy, ctx)
                .for_each(|res| {
                    let queued = done.clone();
                    async move {
                        match res {
                            Ok((obj, _)) => tracing::debug!(redis = %obj, "reconciled"),
                            // A trigger for a Redis deleted meanwhile: nothing
                            // runs, and nothing waits any more.
                            Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                                queued.queue.gone(obj.namespace.as_deref(), &obj.name)
                            }
                            // Failed reconciles were logged by error_policy.
                            Err(e @ kube::runtime::controller::Error::ReconcilerFailed(..)) => {
                                tracing::debug!(error = %e, "reconcile failed")
                            }
                            Err(e) => tracing::warn!(error = %e, "controller stream error"),
                        }
                    }
                });
            futures::future::join3(redis_controller, backups, schedules).await;
            // This term's queue went with its controller.
            done.queue.clear(ns.as_deref());
        }
    });
    futures::future::join_all(runs).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::base::watch_namespaces;
    use crate::controller::events::event_note;

    #[test]
    fn watch_namespaces_parse() {
        assert!(watch_namespaces(None).is_empty());
        assert!(watch_namespaces(Some("")).is_empty());
        assert_eq!(watch_namespaces(Some("a, b,,c ")), vec!["a", "b", "c"]);
    }

    #[test]
    fn event_notes_fit_the_api() {
        assert_eq!(event_note("short".into()), "short");
        let long = event_note("é".repeat(5000));
        assert_eq!(long.chars().count(), 1000);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(30), Duration::from_secs(300));
    }

    #[tokio::test]
    async fn deleted_redis_leave_nothing_remembered() {
        let client = Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("uri"),
        ))
        .expect("client");
        let stores = Stores {
            statefulsets: reflector::store().0,
            services: reflector::store().0,
            config_maps: reflector::store().0,
            pdbs: reflector::store().0,
            pods: reflector::store().0,
        };
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let ctx = Context::new(
            client,
            metrics,
            images::Images::default(),
            stores,
            Arc::default(),
        );
        let a = ObjectRef::<Redis>::new("a").within("ns");
        let b = ObjectRef::<Redis>::new("b").within("ns");
        let c = ObjectRef::<Redis>::new("c").within("ns");
        ctx.remember_written(&a, "1".into());
        ctx.stuck_passes(&b, "f".into(), false);
        ctx.next_backoff(&c);
        ctx.next_backoff(&a);
        assert_eq!(ctx.remembered(), 3);
        ctx.forget(&a);
        assert_eq!(ctx.remembered(), 2);
        // A re-list that has only `c`.
        ctx.retain(|o| *o == c);
        assert_eq!(ctx.remembered(), 1);
        assert_eq!(ctx.written_version(&a), None);
    }
}
