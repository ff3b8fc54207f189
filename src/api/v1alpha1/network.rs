//! `spec.networkPolicy`: an opt-in NetworkPolicy in front of a Redis's pods.

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use serde::{Deserialize, Serialize};

/// Who may reach a Redis's pods. When set, the operator keeps a
/// NetworkPolicy `<name>` selecting them (ingress only): the client port
/// from `clients`, from the operator's namespace and from this Redis's
/// backup agents; the replication (and cluster bus) ports from the Redis's
/// own pods; the metrics port from `metrics`. Removing the field removes
/// the policy. Enforced only where the cluster's network plugin enforces
/// NetworkPolicies.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Peers allowed to reach the client port (6379): pods by label
    /// (`podSelector`, in this namespace unless a `namespaceSelector` goes
    /// with it), namespaces by label, or address blocks (`ipBlock`). Empty:
    /// no application reaches it, only the operator and this Redis's own
    /// pods and agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub clients: Vec<NetworkPolicyPeer>,
    /// Peers allowed to scrape the metrics sidecar (port 9121), e.g. the
    /// Prometheus namespace. Absent: any peer (the metrics carry no
    /// secret); an empty list: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub metrics: Option<Vec<NetworkPolicyPeer>>,
}
