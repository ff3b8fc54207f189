//! The watch caches: one reflector store per child kind and for the pods,
//! each fed by a watch restricted by label selector to objects this
//! operator manages, slimmed to what the reconciler reads.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateTerminated, ContainerStatus, ExecAction,
    Pod, PodSpec, Probe, SecretVolumeSource, Service, Volume,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The watch caches of one controller: every child kind and the pods, each
/// fed by a watch restricted to objects labelled
/// `app.kubernetes.io/managed-by=redpilot` in the watched namespaces, so
/// memory grows with what the operator manages, not with the cluster.
/// Secrets have no cache: every Secret, the operator's own and the one a
/// user names (`spec.auth.secretName`), is read by name, so the operator
/// needs neither `list` nor `watch` on Secrets and never holds a Secret it
/// does not use. `managedFields` are dropped on the way in, and every
/// object is held [`Frozen`]: its metadata typed, the rest as compact JSON.
#[derive(Clone)]
pub struct Stores {
    /// StatefulSets.
    pub statefulsets: Store<Frozen<StatefulSet>>,
    /// Services.
    pub services: Store<Frozen<Service>>,
    /// ConfigMaps.
    pub config_maps: Store<Frozen<ConfigMap>>,
    /// PodDisruptionBudgets.
    pub pdbs: Store<Frozen<PodDisruptionBudget>>,
    /// The Redis pods.
    pub pods: Store<Frozen<Pod>>,
}

/// A cached object: the metadata the controller's triggers and filters
/// read typed (name, namespace, owner references and, for the pods, the
/// labels a reconcile picks them by), everything else as the compact JSON
/// of the object, compressed against a dictionary shared by every object
/// of its watch, and decoded again ([`Frozen::thaw`]) only when a
/// reconcile reads that object.
///
/// The Kubernetes types hold every optional field inline: a StatefulSet of
/// this operator took about 30 KB on the heap and a slimmed pod 10 KB
/// (`heaptrack` of `make bench` at 1,100 Redis: 54 of the 101 MB at the
/// peak were the cached StatefulSets and pods). As JSON they take a few
/// kilobytes; and since the objects of one kind that this operator makes
/// differ mostly in names and hashes, compressing each one against the
/// first of its watch ([`Dictionary`]) leaves a few hundred bytes.
pub struct Frozen<K> {
    /// What is read without thawing: the name and namespace (the store's
    /// keys), the owner references (the controller's triggers) and the
    /// labels [`Labels`] says.
    meta: ObjectMeta,
    /// The object without the metadata above, as compact JSON: compressed
    /// with `dict` (its length first) when there is one, plain when not;
    /// empty when it could not be encoded (then it cannot be thawed either).
    body: Box<[u8]>,
    /// The dictionary `body` is compressed with.
    dict: Option<Arc<[u8]>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Frozen<K> {
    fn clone(&self) -> Self {
        Frozen {
            meta: self.meta.clone(),
            body: self.body.clone(),
            dict: self.dict.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Frozen<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frozen")
            .field("name", &self.meta.name)
            .field("namespace", &self.meta.namespace)
            .field("body_bytes", &self.body.len())
            .field("compressed", &self.dict.is_some())
            .finish()
    }
}

/// Where a frozen object keeps its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    /// All typed, readable without thawing (objects decoded straight into
    /// the frozen form).
    Typed,
    /// These keys typed, the rest in the body: the pods, which a reconcile
    /// picks from the whole cache by its selector labels and the
    /// controller maps to their Redis by the instance label (the other
    /// labels, typed, took a B-tree entry and two strings each).
    Only(&'static [&'static str]),
    /// In the body: kinds read only by name, whose labels matter only
    /// after thawing.
    InBody,
}

/// The dictionary the objects of one watch are compressed against: the
/// JSON of the first object frozen there, kept for the life of the watch
/// (every body compressed with it holds it).
#[derive(Debug, Default)]
pub struct Dictionary(OnceLock<Arc<[u8]>>);

/// Decodes the whole object and freezes it, labels typed and the body not
/// compressed (the controller's trigger streams ask their objects to be
/// decodable).
impl<'de, K> serde::Deserialize<'de> for Frozen<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        K::deserialize(d).map(|o| Frozen::freeze(o, Labels::Typed, None))
    }
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Frozen<K> {
    /// Freezes `obj`, its labels where `labels` says, its body compressed
    /// against `dict` when given (the first object frozen with a
    /// dictionary becomes it).
    pub fn freeze(mut obj: K, labels: Labels, dict: Option<&Dictionary>) -> Self {
        let m = obj.meta_mut();
        let typed_labels = match labels {
            Labels::Typed => m.labels.take(),
            Labels::Only(keys) => m.labels.as_mut().map(|all| {
                keys.iter()
                    .filter_map(|k| all.remove_entry(*k))
                    .collect::<std::collections::BTreeMap<_, _>>()
            }),
            Labels::InBody => None,
        };
        if matches!(labels, Labels::Only(_)) && m.labels.as_ref().is_some_and(|l| l.is_empty()) {
            m.labels = None;
        }
        let meta = ObjectMeta {
            name: m.name.take(),
            namespace: m.namespace.take(),
            owner_references: m.owner_references.take(),
            labels: typed_labels,
            ..Default::default()
        };
        let json = match serde_json::to_vec(&obj) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(
                    kind = %K::kind(&()),
                    name = meta.name.as_deref().unwrap_or(""),
                    error = %e,
                    "caching an object failed; it is read from the API instead"
                );
                Vec::new()
            }
        };
        let dict = dict
            .filter(|_| !json.is_empty())
            .map(|d| d.0.get_or_init(|| Arc::from(json.as_slice())).clone());
        let (body, dict) = match dict {
            Some(d) => {
                let packed = lz4_flex::block::compress_prepend_size_with_dict(&json, &d);
                if packed.len() < json.len() {
                    (packed, Some(d))
                } else {
                    (json, None)
                }
            }
            None => (json, None),
        };
        Frozen {
            meta,
            body: body.into_boxed_slice(),
            dict,
            kind: PhantomData,
        }
    }

    /// The whole object again; `None` when it cannot be decoded (never
    /// for an object this operator froze; logged).
    pub fn thaw(&self) -> Option<K> {
        if self.body.is_empty() {
            return None;
        }
        let unpacked;
        let json: &[u8] = match &self.dict {
            Some(d) => match lz4_flex::block::decompress_size_prepended_with_dict(&self.body, d) {
                Ok(j) => {
                    unpacked = j;
                    &unpacked
                }
                Err(e) => {
                    tracing::error!(
                        kind = %K::kind(&()),
                        name = self.meta.name.as_deref().unwrap_or(""),
                        error = %e,
                        "decompressing a cached object failed; it is read from the API instead"
                    );
                    return None;
                }
            },
            None => &self.body,
        };
        match serde_json::from_slice::<K>(json) {
            Ok(mut obj) => {
                let m = obj.meta_mut();
                m.name.clone_from(&self.meta.name);
                m.namespace.clone_from(&self.meta.namespace);
                m.owner_references.clone_from(&self.meta.owner_references);
                if let Some(typed) = &self.meta.labels {
                    m.labels
                        .get_or_insert_default()
                        .extend(typed.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                Some(obj)
            }
            Err(e) => {
                tracing::error!(
                    kind = %K::kind(&()),
                    name = self.meta.name.as_deref().unwrap_or(""),
                    error = %e,
                    "decoding a cached object failed; it is read from the API instead"
                );
                None
            }
        }
    }
}

impl<K> Resource for Frozen<K>
where
    K: Resource<DynamicType = ()>,
{
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// Whether the caches hold their initial lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSync {
    /// Every cache holds its initial list.
    Synced,
    /// Not within the time given: ask again later.
    Pending,
    /// A cache's watch is gone (its controller stopped, as when leadership
    /// is lost): it will never sync; waiting again returns at once.
    Gone,
}

impl Stores {
    /// Waits (at most `within`) until every cache holds its initial list.
    pub async fn sync(&self, within: Duration) -> CacheSync {
        let all = async {
            self.statefulsets.wait_until_ready().await.is_ok()
                && self.services.wait_until_ready().await.is_ok()
                && self.config_maps.wait_until_ready().await.is_ok()
                && self.pdbs.wait_until_ready().await.is_ok()
                && self.pods.wait_until_ready().await.is_ok()
        };
        match tokio::time::timeout(within, all).await {
            Ok(true) => CacheSync::Synced,
            Ok(false) => CacheSync::Gone,
            Err(_) => CacheSync::Pending,
        }
    }

    /// Whether every cache holds its initial list, waiting at most `within`.
    pub async fn ready(&self, within: Duration) -> bool {
        self.sync(within).await == CacheSync::Synced
    }
}

/// Drops what the reconciler never reads from a cached pod. Kept: the
/// labels, the deletion timestamp, the pod IP, the conditions, and of each
/// container its name and image, restart count, why it waits and how its
/// last run ended (an upgrade judges the upgraded instances by them); of
/// the readiness probe only whether it speaks TLS (its `--tls` flag, how
/// the server listens) or answers either way, and of the volumes the TLS one (its Secret).
pub(crate) fn slim_pod(pod: &mut Pod) {
    use crate::controller::layout::{
        EITHER_STARTS_PLAIN, EITHER_STARTS_TLS, TLS_PROBE_FLAG, probes_either, probes_tls,
    };
    if let Some(spec) = pod.spec.take() {
        let tls_volume = spec
            .volumes
            .into_iter()
            .flatten()
            .filter(|v| v.name == crate::controller::layout::TLS_VOLUME)
            .map(|v| Volume {
                name: v.name,
                secret: v.secret.map(|s| SecretVolumeSource {
                    secret_name: s.secret_name,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect::<Vec<_>>();
        pod.spec = Some(PodSpec {
            containers: spec
                .containers
                .into_iter()
                .map(|c| Container {
                    readiness_probe: {
                        let mark = match (probes_either(&c), probes_tls(&c)) {
                            (true, true) => Some(EITHER_STARTS_TLS),
                            (true, false) => Some(EITHER_STARTS_PLAIN),
                            (false, true) => Some(TLS_PROBE_FLAG),
                            (false, false) => None,
                        };
                        mark.map(|m| Probe {
                            exec: Some(ExecAction {
                                command: Some(vec![m.to_string()]),
                            }),
                            ..Default::default()
                        })
                    },
                    name: c.name,
                    image: c.image,
                    // The memory autopilot compares them with its target.
                    resources: c.resources,
                    ..Default::default()
                })
                .collect(),
            node_name: spec.node_name,
            volumes: (!tls_volume.is_empty()).then_some(tls_volume),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = status.container_statuses.take().map(|cs| {
            cs.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    image: c.image,
                    ready: c.ready,
                    restart_count: c.restart_count,
                    // What the kubelet applied (in-place resize).
                    resources: c.resources,
                    state: c.state.map(|s| ContainerState {
                        waiting: s.waiting,
                        ..Default::default()
                    }),
                    last_state: c.last_state.map(|s| ContainerState {
                        terminated: s.terminated.map(|t| ContainerStateTerminated {
                            exit_code: t.exit_code,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect()
        });
        // Init containers (a bootstrap's restore): how their runs ended,
        // with the termination message that names a failure's cause.
        let ended = |s: Option<ContainerState>| {
            s.map(|s| ContainerState {
                terminated: s.terminated.map(|t| ContainerStateTerminated {
                    exit_code: t.exit_code,
                    message: t.message,
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        status.init_container_statuses = status.init_container_statuses.take().map(|cs| {
            cs.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    restart_count: c.restart_count,
                    state: ended(c.state),
                    last_state: ended(c.last_state),
                    ..Default::default()
                })
                .collect()
        });
        status.ephemeral_container_statuses = None;
        status.resource_claim_statuses = None;
    }
}

/// A watch event with its objects frozen by `freeze`.
pub(crate) fn freeze_event<K>(
    event: watcher::Event<K>,
    mut freeze: impl FnMut(K) -> Frozen<K>,
) -> watcher::Event<Frozen<K>> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(freeze(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(freeze(o)),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(freeze(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The same object named as another type (a [`Frozen`] one and its
/// kind): the name and namespace, which are all a reference compares.
pub fn same_ref<A, B>(o: &ObjectRef<A>) -> ObjectRef<B>
where
    A: Resource<DynamicType = ()>,
    B: Resource<DynamicType = ()>,
{
    named(&o.name, o.namespace.as_deref())
}

/// The reference to the object `name` in `namespace` (`None`: cluster
/// scope).
pub fn named<K: Resource<DynamicType = ()>>(name: &str, namespace: Option<&str>) -> ObjectRef<K> {
    let r = ObjectRef::new(name);
    match namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// A watch of `K` restricted by `cfg`, feeding a reflector store; returns
/// the store and the stream of changed objects that drives the controller.
/// `managedFields` are dropped, and `slim` removes whatever else the
/// reconciler does not read, before an object is [`Frozen`] and stored.
pub(crate) fn cached_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    slim: fn(&mut K),
    labels: Labels,
    on_relist: impl Fn() + Send + 'static,
) -> (
    Store<Frozen<K>>,
    impl Stream<Item = Result<Frozen<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let dict = Dictionary::default();
    let stream = watcher(api, cfg)
        .default_backoff()
        .map_ok(move |event| {
            freeze_event(event, |mut o: K| {
                o.meta_mut().managed_fields = None;
                slim(&mut o);
                Frozen::freeze(o, labels, Some(&dict))
            })
        })
        .reflect(writer)
        .inspect_ok(move |event| {
            if matches!(event, watcher::Event::Init) {
                on_relist();
            }
        })
        .touched_objects();
    (reader, stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    /// A StatefulSet as this operator builds it, with TLS, a volume and
    /// the status the API adds, comes back from the cache as it went in.
    #[test]
    fn a_frozen_statefulset_thaws_to_the_same_object() {
        use crate::api::v1alpha1::{RedisSpec, StorageSpec, TlsSpec};
        use crate::controller::names::Names;
        use crate::controller::redis::build::test_redis;
        use crate::controller::redis::statefulset::statefulset;
        let r = test_redis(RedisSpec {
            tls: Some(TlsSpec {
                secret_name: Some("cache-tls".into()),
                ..Default::default()
            }),
            storage: Some(StorageSpec {
                size: k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
                storage_class_name: Some("fast".into()),
                retain_on_delete: false,
            }),
            ..Default::default()
        });
        let mut sts = statefulset(
            &r,
            &Names::new("cache"),
            "cache-auth",
            "h",
            "redis:7.0",
            None,
        );
        sts.metadata.uid = Some("u-1".into());
        sts.metadata.resource_version = Some("42".into());
        sts.status = Some(
            serde_json::from_value(serde_json::json!({
                "replicas": 3, "readyReplicas": 2, "observedGeneration": 4,
                "currentRevision": "cache-5d8", "updateRevision": "cache-6f9",
                "conditions": [{"type": "X", "status": "True",
                                "lastTransitionTime": "2026-12-03T10:00:00Z"}]
            }))
            .expect("status"),
        );
        sts.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        sts.metadata.owner_references = Some(vec![Default::default()]);
        let frozen = Frozen::freeze(sts.clone(), Labels::InBody, None);
        assert_eq!(frozen.meta().name.as_deref(), Some("cache"));
        assert_eq!(
            frozen.meta().owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert!(frozen.meta().labels.is_none() && frozen.meta().annotations.is_none());
        assert_eq!(frozen.thaw(), Some(sts.clone()));
        assert_eq!(
            Frozen::freeze(sts.clone(), Labels::Typed, None).thaw(),
            Some(sts.clone())
        );
        // The controller's trigger streams decode objects straight into
        // the frozen form: the same result.
        let decoded: Frozen<StatefulSet> =
            serde_json::from_value(serde_json::to_value(&sts).expect("json")).expect("decode");
        assert_eq!(decoded.thaw(), Some(sts.clone()));

        // Compressed against a dictionary: the first object frozen with it
        // becomes it; another Redis's StatefulSet (other names, another
        // hash) shrinks to a fraction of its JSON and thaws whole.
        let dict = Dictionary::default();
        let first = Frozen::freeze(sts.clone(), Labels::InBody, Some(&dict));
        assert!(first.dict.is_some());
        assert_eq!(first.thaw(), Some(sts));
        let other_redis = test_redis(RedisSpec {
            storage: Some(StorageSpec {
                size: k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into()),
                storage_class_name: None,
                retain_on_delete: true,
            }),
            ..Default::default()
        });
        let mut other = statefulset(
            &other_redis,
            &Names::new("orders-eu"),
            "orders-eu-auth",
            "9f3c2a",
            "valkey:8.1",
            None,
        );
        other.metadata.uid = Some("u-2".into());
        other.metadata.resource_version = Some("4711".into());
        let plain = Frozen::freeze(other.clone(), Labels::InBody, None);
        let packed = Frozen::freeze(other.clone(), Labels::InBody, Some(&dict));
        assert!(packed.dict.is_some());
        println!(
            "a StatefulSet: {} bytes of JSON, {} compressed against another's",
            plain.body.len(),
            packed.body.len()
        );
        assert!(
            packed.body.len() * 4 < plain.body.len(),
            "{} bytes compressed, {} plain",
            packed.body.len(),
            plain.body.len()
        );
        assert_eq!(packed.thaw(), Some(other));
    }

    /// A body that does not decompress is never thawed into a wrong
    /// object: the reader goes to the API instead.
    #[test]
    fn a_corrupt_compressed_body_thaws_to_nothing() {
        let dict = Dictionary::default();
        let cm = |name: &str, v: &str| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([("redis.conf".to_string(), v.repeat(40))].into()),
            ..Default::default()
        };
        let _ = Frozen::freeze(cm("a", "maxmemory 1gb\n"), Labels::InBody, Some(&dict));
        let mut b = Frozen::freeze(cm("b", "maxmemory 2gb\n"), Labels::InBody, Some(&dict));
        assert!(b.dict.is_some());
        assert_eq!(b.thaw(), Some(cm("b", "maxmemory 2gb\n")));
        let mut body = b.body.to_vec();
        body.truncate(body.len() / 2);
        b.body = body.into_boxed_slice();
        assert_eq!(b.thaw(), None);
    }

    #[test]
    fn a_frozen_pod_keeps_its_metadata_typed_and_thaws_whole() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cache-0", "namespace": "ns",
                         "uid": "9b1c", "resourceVersion": "77",
                         "labels": {"app.kubernetes.io/instance": "cache",
                                    "controller-revision-hash": "cache-5d8"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "redis", "image": "redis:7.0",
                     "resources": {"limits": {"memory": "1Gi"}}}]},
            "status": {"podIP": "10.0.0.7",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "redis", "image": "redis:7.0",
                                              "imageID": "", "ready": true, "restartCount": 2}]}
        }))
        .expect("pod");
        pod.metadata.managed_fields = None;
        slim_pod(&mut pod);
        let only = Labels::Only(&["app.kubernetes.io/instance"]);
        let frozen = Frozen::freeze(pod.clone(), only, None);
        assert_eq!(
            frozen.labels().keys().collect::<Vec<_>>(),
            ["app.kubernetes.io/instance"],
            "only the asked labels are typed"
        );
        assert_eq!(frozen.meta().uid, None, "the UID is in the body");
        let body = String::from_utf8_lossy(&frozen.body);
        assert!(!body.contains("cache-0"), "the name is not in the body");
        assert!(body.contains("cache-5d8") && body.contains("9b1c"));
        assert_eq!(frozen.thaw(), Some(pod.clone()));
        let dict = Dictionary::default();
        let packed = Frozen::freeze(pod.clone(), only, Some(&dict));
        assert!(packed.dict.is_some());
        assert_eq!(packed.thaw(), Some(pod));
    }

    #[tokio::test]
    async fn caches_whose_watch_is_gone_say_so_at_once() {
        let (statefulsets, w1) = reflector::store::<Frozen<StatefulSet>>();
        let (services, w2) = reflector::store::<Frozen<Service>>();
        let (config_maps, w3) = reflector::store::<Frozen<ConfigMap>>();
        let (pdbs, w4) = reflector::store::<Frozen<PodDisruptionBudget>>();
        let (pods, w5) = reflector::store::<Frozen<Pod>>();
        let stores = Stores {
            statefulsets,
            services,
            config_maps,
            pdbs,
            pods,
        };
        // Watches running, nothing listed yet: pending, after the bound.
        let t = std::time::Instant::now();
        assert_eq!(
            stores.sync(Duration::from_millis(50)).await,
            CacheSync::Pending
        );
        assert!(t.elapsed() >= Duration::from_millis(50));
        // The controller stopped (its writers dropped): gone, at once, so
        // a waiting loop stops instead of spinning.
        drop((w1, w2, w3, w4, w5));
        let t = std::time::Instant::now();
        assert_eq!(stores.sync(Duration::from_secs(60)).await, CacheSync::Gone);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
