//! The opt-in NetworkPolicy (`spec.networkPolicy`): built from the spec,
//! applied like the other children, removed when the field goes.
//!
//! It has no watch cache (the kind is rare and opt-in): while the field is
//! set, each pass reads it by name, so a hand edit is put back on the next
//! pass; once it is gone, the operator remembers it removed it.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec as PolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::DeleteParams;

use super::children::Child;
use super::{Error, Reconciler};
use crate::api::v1alpha1::{Mode, Redis};
use crate::controller::Stores;
use crate::controller::insights::sidecar;
use crate::controller::names::controlled_by;
use crate::controller::names::{self, Names, REDIS_PORT};

/// The kind, as events and the memory of writes name it.
pub const KIND: &str = "NetworkPolicy";

impl Child for NetworkPolicy {
    fn store(
        _: &Stores,
    ) -> Option<&kube::runtime::reflector::Store<crate::controller::cache::Frozen<Self>>> {
        None
    }
}

fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some("TCP".into()),
        port: Some(IntOrString::Int(i32::from(port))),
        ..Default::default()
    }
}

fn pods(labels: BTreeMap<String, String>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(labels),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The NetworkPolicy `spec.networkPolicy` asks for, or none. The operator
/// runs in `operator_ns`; its backup agents are pods labelled
/// `app.kubernetes.io/name: redpilot-backup` in the Redis's namespace.
pub fn policy(redis: &Redis, names: &Names, operator_ns: &str) -> Option<NetworkPolicy> {
    let spec = redis.spec.network_policy.as_ref()?;
    let own = names::selector_labels(redis);
    let mut peer_ports = vec![tcp(REDIS_PORT)];
    if redis.spec.mode() == Mode::Cluster {
        peer_ports.push(tcp(super::cluster::build::BUS_PORT));
    }
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                operator_ns.to_string(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let agents = pods(BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        "redpilot-backup".to_string(),
    )]));
    let mut client_peers = vec![operator.clone(), agents];
    client_peers.extend(spec.clients.iter().cloned());
    let mut ingress = vec![
        // Replication (and the cluster bus) between the Redis's own pods.
        NetworkPolicyIngressRule {
            from: Some(vec![pods(own.clone())]),
            ports: Some(peer_ports),
        },
        NetworkPolicyIngressRule {
            from: Some(client_peers),
            ports: Some(vec![tcp(REDIS_PORT)]),
        },
    ];
    let exporter = redis.spec.monitoring().exporter;
    match &spec.metrics {
        Some(peers) if peers.is_empty() => {}
        _ if !exporter => {}
        peers => ingress.push(NetworkPolicyIngressRule {
            // No `from`: any peer.
            from: peers.clone(),
            ports: Some(vec![tcp(sidecar::PORT)]),
        }),
    }
    // The archive sidecar's `/status` (the operator) and `/metrics`
    // (whoever may scrape the metrics; anyone when unset).
    if redis.spec.archive.is_some() {
        // The sidecars also ask each other before one starts.
        let from = spec.metrics.clone().map(|mut peers| {
            peers.push(operator.clone());
            peers.push(pods(own.clone()));
            peers
        });
        ingress.push(NetworkPolicyIngressRule {
            from,
            ports: Some(vec![tcp(super::archive::PORT)]),
        });
    }
    let np = NetworkPolicy {
        metadata: names::meta(redis, names.network_policy()),
        spec: Some(PolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(own),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    };
    Some(names::stamp_hash(np))
}

impl Reconciler {
    /// Applies the NetworkPolicy while `spec.networkPolicy` is set (a live
    /// one that differs is put back) and deletes the one this Redis
    /// controls once it is not. A policy the API server refuses becomes a
    /// Degraded note naming it.
    pub(super) async fn apply_network_policy(&mut self) -> Result<(), Error> {
        let name = self.names.network_policy();
        let desired = policy(&self.redis, &self.names, &self.ctx.settings.namespace);
        let insights = &self.ctx.insights;
        match desired {
            Some(np) => {
                let live: Option<NetworkPolicy> = self.fetch(&name).await?;
                let notes = self.report.notes().len();
                self.apply_or_degrade(KIND, &np, live.as_ref()).await?;
                if self.report.notes().len() == notes {
                    let h = names::stamped_hash(&np).map(String::from);
                    self.ctx.insights.remember(&self.oref, KIND, h);
                }
            }
            None => {
                if insights.written(&self.oref, KIND) == Some(None) {
                    return Ok(());
                }
                let live: Option<NetworkPolicy> = self.fetch(&name).await?;
                if let Some(live) = live
                    && controlled_by(&live.metadata, self.uid())
                {
                    self.ctx.metrics.kube("delete");
                    match self
                        .api::<NetworkPolicy>()
                        .delete(&name, &DeleteParams::default())
                        .await
                    {
                        Ok(_) => self.report.wrote(),
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                self.ctx.insights.remember(&self.oref, KIND, None);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::RedisSpec;

    fn redis(spec: serde_json::Value) -> Redis {
        let spec: RedisSpec = serde_json::from_value(spec).expect("spec");
        let mut r = crate::controller::redis::build::test_redis(spec);
        r.metadata.namespace = Some("shop".into());
        r
    }

    fn json(np: &NetworkPolicy) -> serde_json::Value {
        serde_json::to_value(np).expect("json")
    }

    #[test]
    fn none_unless_asked() {
        let r = redis(serde_json::json!({}));
        assert!(policy(&r, &Names::new("cache"), "redpilot-system").is_none());
    }

    #[test]
    fn clients_reach_the_client_port_peers_replicate_and_metrics_are_open_by_default() {
        let r = redis(serde_json::json!({"mode": "Replication", "networkPolicy": {
            "clients": [{"podSelector": {"matchLabels": {"app": "web"}}}]}}));
        let np = policy(&r, &Names::new("cache"), "ops").expect("policy");
        let v = json(&np);
        assert_eq!(v["metadata"]["name"], "cache");
        assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
        assert!(names::stamped_hash(&np).is_some());
        let own = serde_json::to_value(names::selector_labels(&r)).expect("labels");
        assert_eq!(v["spec"]["podSelector"]["matchLabels"], own);
        assert_eq!(v["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
        let rules = v["spec"]["ingress"].as_array().expect("rules");
        assert_eq!(rules.len(), 3, "{rules:?}");
        assert_eq!(rules[0]["from"][0]["podSelector"]["matchLabels"], own);
        assert_eq!(
            rules[0]["ports"],
            serde_json::json!([{"protocol": "TCP", "port": 6379}])
        );
        assert_eq!(
            rules[1]["from"],
            serde_json::json!([
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}},
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "redpilot-backup"}}},
                {"podSelector": {"matchLabels": {"app": "web"}}},
            ])
        );
        assert_eq!(
            rules[1]["ports"],
            serde_json::json!([{"protocol": "TCP", "port": 6379}])
        );
        assert_eq!(rules[2].get("from"), None, "metrics: any peer");
        assert_eq!(
            rules[2]["ports"],
            serde_json::json!([{"protocol": "TCP", "port": 9121}])
        );
    }

    #[test]
    fn the_cluster_bus_is_open_between_nodes_and_metrics_follow_the_spec() {
        let r = redis(
            serde_json::json!({"mode": "Cluster", "shards": 3, "instances": 2,
            "networkPolicy": {"metrics": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]}}),
        );
        let v = json(&policy(&r, &Names::new("cache"), "ops").expect("policy"));
        let rules = v["spec"]["ingress"].as_array().expect("rules");
        assert_eq!(
            rules[0]["ports"],
            serde_json::json!([{"protocol": "TCP", "port": 6379}, {"protocol": "TCP", "port": 16379}])
        );
        assert_eq!(
            rules[1]["from"].as_array().map(Vec::len),
            Some(2),
            "operator and agents only"
        );
        assert_eq!(
            rules[2]["from"][0]["namespaceSelector"]["matchLabels"]["team"],
            "obs"
        );

        let none = redis(serde_json::json!({"networkPolicy": {"metrics": []}}));
        let v = json(&policy(&none, &Names::new("cache"), "ops").expect("policy"));
        assert_eq!(
            v["spec"]["ingress"].as_array().map(Vec::len),
            Some(2),
            "no metrics rule"
        );
        let no_sidecar =
            redis(serde_json::json!({"networkPolicy": {}, "monitoring": {"exporter": false}}));
        let v = json(&policy(&no_sidecar, &Names::new("cache"), "ops").expect("policy"));
        assert_eq!(
            v["spec"]["ingress"].as_array().map(Vec::len),
            Some(2),
            "no sidecar, no port"
        );
    }
}
