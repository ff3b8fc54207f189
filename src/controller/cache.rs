//! The watch caches: one reflector store per child kind and for the pods,
//! each fed by a watch restricted by label selector to objects this
//! operator manages, slimmed to what the reconciler reads.

use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodSpec,
    Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};

/// The watch caches of one controller: every child kind and the pods, each
/// fed by a watch restricted to objects labelled
/// `app.kubernetes.io/managed-by=redpilot` in the watched namespaces, so
/// memory grows with what the operator manages, not with the cluster.
/// Secrets have no cache: every Secret, the operator's own and the one a
/// user names (`spec.auth.secretName`), is read by name, so the operator
/// needs neither `list` nor `watch` on Secrets and never holds a Secret it
/// does not use. `managedFields` are dropped on the way in.
#[derive(Clone)]
pub struct Stores {
    /// StatefulSets.
    pub statefulsets: Store<StatefulSet>,
    /// Services.
    pub services: Store<Service>,
    /// ConfigMaps.
    pub config_maps: Store<ConfigMap>,
    /// PodDisruptionBudgets.
    pub pdbs: Store<PodDisruptionBudget>,
    /// The Redis pods.
    pub pods: Store<Pod>,
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
/// last run ended (an upgrade judges the upgraded instances by them).
pub(crate) fn slim_pod(pod: &mut Pod) {
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            containers: spec
                .containers
                .into_iter()
                .map(|c| Container {
                    name: c.name,
                    image: c.image,
                    // The memory autopilot compares them with its target.
                    resources: c.resources,
                    ..Default::default()
                })
                .collect(),
            node_name: spec.node_name,
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

/// A watch of `K` restricted by `cfg`, feeding a reflector store; returns
/// the store and the stream of changed objects that drives the controller.
/// `managedFields` are dropped, and `slim` removes whatever else the
/// reconciler does not read, before an object is stored.
pub(crate) fn cached_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    slim: fn(&mut K),
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, cfg)
        .default_backoff()
        .modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            slim(o);
        })
        .reflect(writer)
        .touched_objects();
    (reader, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn caches_whose_watch_is_gone_say_so_at_once() {
        let (statefulsets, w1) = reflector::store::<StatefulSet>();
        let (services, w2) = reflector::store::<Service>();
        let (config_maps, w3) = reflector::store::<ConfigMap>();
        let (pdbs, w4) = reflector::store::<PodDisruptionBudget>();
        let (pods, w5) = reflector::store::<Pod>();
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
