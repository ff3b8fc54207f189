//! `spec.tls`: TLS for clients and replication.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::DNS_SUBDOMAIN;

/// TLS on every connection to the servers. The servers listen with TLS
/// only, on the same port (6379); replication uses TLS too. Standalone
/// and Replication modes (Cluster mode not yet). Everything the operator runs speaks TLS with
/// it: its own connections, the readiness probe, the metrics sidecar and
/// the backup agents. They check the server's certificate against
/// `ca.crt` (the chain and the dates; not the name, since they reach pods
/// by address).
///
/// The certificate comes from a Secret of yours (`secretName`), or, when
/// that is left out (`tls: {}`), from the operator: it keeps a CA per
/// namespace (Secret `redpilot-ca`) and issues `<name>-tls` for the
/// Redis's Services, renewed before it expires.
///
/// Set at creation: it cannot be added or removed later. A renewed
/// certificate in the Secret is read live (`CONFIG SET` of the file
/// parameters, once the mounted files show it), without a restart, also
/// when it comes from another CA; another Secret named here is rolled out
/// with the ordered restart.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// A Secret in the same namespace with `tls.crt` (the server
    /// certificate, with its intermediates), `tls.key` (its private key)
    /// and `ca.crt` (the CA clients trust), as cert-manager writes them.
    /// Absent: the operator issues the certificate (`<name>-tls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(DNS_SUBDOMAIN).message("spec.tls.secretName must be a valid Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub secret_name: Option<String>,
}
