//! The PodMonitor and PrometheusRule of each Redis, created when the cluster
//! serves `monitoring.coreos.com/v1` (looked up through discovery, again at
//! most every 30 s, so CRDs installed later are picked up and a cluster
//! without them sees no request and no error). Both carry a controller
//! owner reference to the Redis and a hash of what they were built from:
//! an object whose hash is current is not written again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::rules::{self, Scope};
use super::sidecar;
use crate::api::v1alpha1::Redis;
use crate::controller::base::FIELD_MANAGER;
use crate::controller::error::Error;
use crate::controller::names;
use crate::controller::served::Served;

const GROUP_VERSION: &str = "monitoring.coreos.com/v1";
const RECHECK: Duration = Duration::from_secs(30);

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind),
        plural,
    )
}

/// The kinds written per Redis, with their plural.
const KINDS: [(&str, &str); 2] = [
    ("PodMonitor", "podmonitors"),
    ("PrometheusRule", "prometheusrules"),
];

/// The plurals of [`KINDS`], which must all be served.
const PLURALS: [&str; 2] = [KINDS[0].1, KINDS[1].1];

/// What the operator knows of the cluster's monitoring CRDs, and what it
/// last did with each object read by name (the PodMonitor, the
/// PrometheusRule, the NetworkPolicy): per Redis and kind, the hash it
/// wrote, or `None` once it deleted it.
pub struct Insights {
    served: Served,
    written: Mutex<HashMap<Written, Option<String>>>,
}

impl Default for Insights {
    fn default() -> Self {
        Self {
            served: Served::new(GROUP_VERSION, &PLURALS, RECHECK),
            written: Mutex::default(),
        }
    }
}

/// A Redis and a kind.
type Written = (ObjectRef<Redis>, &'static str);

impl Insights {
    pub(crate) fn written(
        &self,
        redis: &ObjectRef<Redis>,
        kind: &'static str,
    ) -> Option<Option<String>> {
        self.written
            .lock()
            .ok()?
            .get(&(redis.clone(), kind))
            .cloned()
    }

    pub(crate) fn remember(
        &self,
        redis: &ObjectRef<Redis>,
        kind: &'static str,
        hash: Option<String>,
    ) {
        if let Ok(mut w) = self.written.lock() {
            w.insert((redis.clone(), kind), hash);
        }
    }

    /// Keeps only the Redis `keep` keeps (the context's per-object maps are
    /// pruned together, see [`crate::controller::Context::retain`]).
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Redis>) -> bool) {
        if let Ok(mut w) = self.written.lock() {
            w.retain(|(o, _), _| keep(o));
        }
    }
}

/// The PodMonitor (when the sidecar runs) and the PrometheusRule of
/// `redis`, by kind, each stamped with its hash.
fn desired(redis: &Redis) -> Vec<(&'static str, DynamicObject)> {
    let m = redis.spec.monitoring();
    let ns = redis.namespace().unwrap_or_default();
    let name = redis.name_any();
    let mut labels = m.labels.clone();
    labels.extend(names::labels(redis));
    let object = |(kind, plural): (&'static str, &str), spec: serde_json::Value| {
        let mut obj = DynamicObject::new(&name, &resource(kind, plural)).within(&ns);
        obj.metadata.labels = Some(labels.clone());
        obj.metadata.owner_references = names::owner_reference(redis).map(|o| vec![o]);
        obj.data = json!({ "spec": spec });
        (kind, names::stamp_hash(obj))
    };
    let mut out = Vec::new();
    let archived = redis.spec.archive.is_some();
    if m.exporter || archived {
        let mut relabelings = vec![json!({
            "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "targetLabel": "redis",
            "action": "replace",
        })];
        // A Cluster Redis: each series says which shard its pod serves.
        if redis.spec.mode() == crate::api::v1alpha1::Mode::Cluster {
            relabelings.push(json!({
                "sourceLabels": ["__meta_kubernetes_pod_label_redpilot_io_shard"],
                "targetLabel": "shard",
                "action": "replace",
            }));
        }
        let endpoints: Vec<serde_json::Value> = [
            (m.exporter, sidecar::PORT_NAME),
            (archived, names::ARCHIVE_PORT_NAME),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, port)| {
            json!({
                "port": port,
                "path": "/metrics",
                "interval": "15s",
                "relabelings": relabelings,
            })
        })
        .collect();
        out.push(object(
            KINDS[0],
            json!({
                "selector": {"matchLabels": names::selector_labels(redis)},
                "namespaceSelector": {"matchNames": [ns]},
                "podMetricsEndpoints": endpoints,
            }),
        ));
    }
    let scope = Scope::One {
        namespace: &ns,
        redis: &name,
    };
    out.push(object(
        KINDS[1],
        json!({"groups": [rules::redis_group(&scope, &m.alerts)]}),
    ));
    out
}

/// Applies (or removes) the monitoring objects of `redis`. True when it
/// wrote something.
pub async fn reconcile(
    client: &Client,
    insights: &Insights,
    metrics: &crate::telemetry::Metrics,
    redis: &Redis,
) -> Result<bool, Error> {
    if !insights.served.check(client).await {
        return Ok(false);
    }
    let ns = redis.namespace().unwrap_or_default();
    let name = redis.name_any();
    let oref = ObjectRef::from_obj(redis);
    let desired = if redis.spec.monitoring().prometheus {
        desired(redis)
    } else {
        Vec::new()
    };
    let uid = redis.metadata.uid.clone().unwrap_or_default();
    let ours = |meta: &kube::api::ObjectMeta| crate::controller::names::controlled_by(meta, &uid);
    let mut wrote = false;
    for (kind, plural) in KINDS {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &resource(kind, plural));
        let known = insights.written(&oref, kind);
        match desired.iter().find(|(k, _)| *k == kind) {
            Some((_, obj)) => {
                let h = names::stamped_hash(obj).map(String::from);
                if known.as_ref() == Some(&h) {
                    continue;
                }
                // After a restart: the live object may already be current.
                if known.is_none() {
                    metrics.kube("get");
                    let live = api.get_opt(&name).await.map_err(Error::Kube)?;
                    // Someone else's object of this name is never written.
                    if let Some(l) = &live
                        && !ours(&l.metadata)
                    {
                        return Err(Error::Conflict {
                            kind,
                            name: name.clone(),
                            owner: crate::controller::error::holder(&l.metadata),
                        });
                    }
                    if live.as_ref().and_then(names::stamped_hash) == h.as_deref() {
                        insights.remember(&oref, kind, h);
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
                insights.remember(&oref, kind, h);
                wrote = true;
            }
            None => {
                if known == Some(None) {
                    continue;
                }
                // Only an object this Redis controls is removed (the
                // precondition holds the delete to the object read).
                metrics.kube("get");
                let live = api.get_opt(&name).await.map_err(Error::Kube)?;
                let Some(uid) = live
                    .as_ref()
                    .filter(|l| ours(&l.metadata))
                    .and_then(|l| l.metadata.uid.clone())
                else {
                    insights.remember(&oref, kind, None);
                    continue;
                };
                metrics.kube("delete");
                let dp = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&name, &dp).await {
                    Ok(_) => wrote = true,
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(Error::Kube(e)),
                }
                insights.remember(&oref, kind, None);
            }
        }
    }
    Ok(wrote)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{MonitoringSpec, RedisSpec};

    fn redis(exporter: bool) -> Redis {
        let mut r = Redis::new(
            "cache",
            RedisSpec {
                monitoring: Some(MonitoringSpec {
                    exporter,
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        r.metadata.namespace = Some("shop".into());
        r.metadata.uid = Some("u-1".into());
        r
    }

    #[test]
    fn both_objects_are_owned_stamped_and_typed() {
        let objs = desired(&redis(true));
        let kinds: Vec<&str> = objs.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ["PodMonitor", "PrometheusRule"]);
        for (kind, o) in &objs {
            let v = serde_json::to_value(o).expect("json");
            assert_eq!(v["apiVersion"], GROUP_VERSION);
            assert_eq!(v["kind"], *kind);
            assert_eq!(v["metadata"]["namespace"], "shop");
            assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
            assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
            assert!(names::stamped_hash(o).is_some());
        }
        let pm = serde_json::to_value(&objs[0].1).expect("json");
        assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
        // No sidecar, nothing to scrape: the rules only.
        let kinds: Vec<&str> = desired(&redis(false)).iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ["PrometheusRule"]);
    }

    #[test]
    fn what_was_written_is_forgotten_with_the_redis() {
        let i = Insights::default();
        let (a, b) = (
            ObjectRef::<Redis>::new("a").within("ns"),
            ObjectRef::<Redis>::new("b").within("ns"),
        );
        i.remember(&a, "PodMonitor", Some("h".into()));
        i.remember(&b, "PrometheusRule", None);
        assert_eq!(i.written(&a, "PodMonitor"), Some(Some("h".into())));
        assert_eq!(i.written(&b, "PrometheusRule"), Some(None));
        i.retain(|o| *o != a);
        assert_eq!(i.written(&a, "PodMonitor"), None);
        assert_eq!(i.written(&b, "PrometheusRule"), Some(None));
    }
}
