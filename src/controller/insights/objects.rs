//! The PodMonitor and PrometheusRule of each Redis, created when the cluster
//! serves `monitoring.coreos.com/v1` (looked up through discovery, again at
//! most every 30 s, so CRDs installed later are picked up and a cluster
//! without them sees no request and no error). Both carry a controller
//! owner reference to the Redis and a hash of what they were built from:
//! an object whose hash is current is not written again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::rules::{self, Scope};
use super::sidecar;
use crate::api::v1alpha1::Redis;
use crate::controller::redis::build::{self, HASH_ANNOTATION};
use crate::controller::{Error, FIELD_MANAGER};

const GROUP_VERSION: &str = "monitoring.coreos.com/v1";
const RECHECK: Duration = Duration::from_secs(30);

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind),
        plural,
    )
}

/// What the operator knows of the cluster's monitoring CRDs, and the hash
/// of the objects it last wrote per Redis.
#[derive(Default)]
pub struct Insights {
    served: Mutex<Option<(Instant, bool)>>,
    written: Mutex<HashMap<String, String>>,
}

impl Insights {
    /// Whether PodMonitor and PrometheusRule are served (cached a minute).
    async fn served(&self, client: &Client) -> bool {
        if let Ok(s) = self.served.lock()
            && let Some((at, yes)) = *s
            && at.elapsed() < RECHECK
        {
            return yes;
        }
        let yes = match client.list_api_group_resources(GROUP_VERSION).await {
            Ok(list) => {
                let has = |n: &str| list.resources.iter().any(|r| r.name == n);
                has("podmonitors") && has("prometheusrules")
            }
            Err(_) => false,
        };
        if let Ok(mut s) = self.served.lock() {
            *s = Some((Instant::now(), yes));
        }
        yes
    }

    fn written(&self, key: &str) -> Option<String> {
        self.written.lock().ok()?.get(key).cloned()
    }

    fn remember(&self, key: &str, hash: Option<String>) {
        if let Ok(mut w) = self.written.lock() {
            match hash {
                Some(h) => w.insert(key.to_string(), h),
                None => w.remove(key),
            };
        }
    }

    /// Forgets a deleted Redis.
    pub fn forget(&self, namespace: &str, name: &str) {
        if let Ok(mut w) = self.written.lock() {
            w.retain(|k, _| !k.starts_with(&format!("{namespace}/{name}/")));
        }
    }
}

/// The PodMonitor and PrometheusRule of `redis`, each with its hash.
pub fn desired(redis: &Redis) -> Vec<(ApiResource, DynamicObject)> {
    let m = redis.spec.monitoring();
    let ns = redis.namespace().unwrap_or_default();
    let name = redis.name_any();
    let mut labels = m.labels.clone();
    labels.extend(build::labels(redis));
    let meta = |kind: &str| {
        json!({
            "name": name,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": build::owner_reference(redis).map(|o| vec![o]),
            "kind": kind,
        })
    };
    let mut out = Vec::new();
    if m.exporter {
        let spec = json!({
            "selector": {"matchLabels": build::selector_labels(redis)},
            "namespaceSelector": {"matchNames": [ns]},
            "podMetricsEndpoints": [{
                "port": sidecar::PORT_NAME,
                "path": "/metrics",
                "interval": "15s",
                "relabelings": [{
                    "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                    "targetLabel": "redis",
                    "action": "replace",
                }],
            }],
        });
        out.push((
            resource("PodMonitor", "podmonitors"),
            object("PodMonitor", meta("PodMonitor"), spec),
        ));
    }
    let scope = Scope::One {
        namespace: &ns,
        redis: &name,
    };
    let spec = json!({"groups": [rules::redis_group(&scope, &m.alerts)]});
    out.push((
        resource("PrometheusRule", "prometheusrules"),
        object("PrometheusRule", meta("PrometheusRule"), spec),
    ));
    out
}

fn object(kind: &str, meta: serde_json::Value, spec: serde_json::Value) -> DynamicObject {
    let mut meta = meta;
    if let Some(m) = meta.as_object_mut() {
        m.remove("kind");
        m.remove("annotations");
    }
    let value = json!({
        "apiVersion": GROUP_VERSION,
        "kind": kind,
        "metadata": meta,
        "spec": spec,
    });
    // The value is built above from serializable parts: it always parses.
    let obj = serde_json::from_value(value)
        .unwrap_or_else(|_| DynamicObject::new("", &resource(kind, "")));
    build::stamp_hash(obj)
}

fn hash(obj: &DynamicObject) -> Option<String> {
    obj.annotations().get(HASH_ANNOTATION).cloned()
}

/// Applies (or removes) the monitoring objects of `redis`. True when it
/// wrote something.
pub async fn reconcile(
    client: &Client,
    insights: &Insights,
    metrics: &crate::telemetry::Metrics,
    redis: &Redis,
) -> Result<bool, Error> {
    if !insights.served(client).await {
        return Ok(false);
    }
    let ns = redis.namespace().unwrap_or_default();
    let name = redis.name_any();
    let want = redis.spec.monitoring();
    let desired = if want.prometheus {
        desired(redis)
    } else {
        Vec::new()
    };
    let mut wrote = false;
    for (kind, plural) in [
        ("PodMonitor", "podmonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        let ar = resource(kind, plural);
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        let key = format!("{ns}/{name}/{kind}");
        let target = desired.iter().find(|(r, _)| r.kind == kind).map(|(_, o)| o);
        let known = insights.written(&key);
        match target {
            Some(obj) => {
                let h = hash(obj);
                if known.is_some() && known == h {
                    continue;
                }
                // After a restart: the live object may already be current.
                if known.is_none() {
                    metrics.kube("get");
                    let live = api.get_opt(&name).await.map_err(Error::Kube)?;
                    if live.as_ref().and_then(hash) == h && h.is_some() {
                        insights.remember(&key, h);
                        continue;
                    }
                }
                metrics.kube("apply");
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(obj),
                )
                .await
                .map_err(Error::Kube)?;
                insights.remember(&key, h);
                wrote = true;
            }
            None => {
                if known.as_deref() == Some("") {
                    continue;
                }
                metrics.kube("delete");
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => wrote = true,
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(Error::Kube(e)),
                }
                insights.remember(&key, Some(String::new()));
            }
        }
    }
    Ok(wrote)
}

/// Labels a Prometheus scraping a PodMonitor gives every series of it, as
/// the prometheus-operator sets them (used by the tests that scrape without
/// the prometheus-operator).
pub fn target_labels() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("namespace", "__meta_kubernetes_namespace"),
        ("pod", "__meta_kubernetes_pod_name"),
        ("container", "__meta_kubernetes_pod_container_name"),
    ])
}
