//! `spec.tls`: TLS for clients and replication.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::DNS_SUBDOMAIN;

/// TLS on every connection to the servers. The servers listen with TLS
/// only, on the same port (6379); replication uses TLS too, and in
/// Cluster mode so does the cluster bus (`tls-cluster yes`), on which
/// the nodes authenticate each other with the same certificate: it must
/// allow client authentication (no extended key usage, or one with
/// `clientAuth`; the operator's and cert-manager's do). Everything the
/// operator runs speaks TLS with it: its own connections, the readiness probe, the metrics sidecar and
/// the backup agents. They check the server's certificate against
/// `ca.crt` (the chain and the dates; not the name, since they reach pods
/// by address).
///
/// The certificate comes from a Secret of yours (`secretName`), from
/// cert-manager (`issuerRef`: the operator writes a `Certificate`
/// `<name>-server` for the Redis's Services and reads the Secret
/// cert-manager fills, `<name>-server-tls`), or, when both are left out
/// (`tls: {}`), from the operator: it keeps a CA per namespace (Secret
/// `redpilot-ca`) and issues `<name>-tls` for the Redis's Services,
/// renewed before it expires.
///
/// Added to or removed from a running Standalone or Replication Redis, it
/// is rolled out with the ordered restart (replicas first, the primary
/// last after a switchover), losing no acknowledged write: a replica
/// follows its primary the way the primary listens while the two differ,
/// and when TLS is turned off the instances keep the certificate files
/// until none listens with TLS, then restart once more without them. A
/// Cluster Redis cannot have nodes that speak TLS on the cluster bus
/// beside nodes that do not: its nodes first roll onto a template that
/// starts them as before (with the certificate files, a readiness probe
/// that answers either way), then the operator switches every node live at
/// once (`CONFIG SET` of the port, `tls-cluster`, `tls-replication`), then
/// they roll onto the template that starts them the new way. A renewed
/// certificate in the Secret is read live (`CONFIG SET` of the file
/// parameters, once the mounted files show it), without a restart, also
/// when it comes from another CA; another Secret named here is rolled out
/// with the ordered restart.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("!has(self.secretName) || !has(self.issuerRef)")
        .message("spec.tls: secretName and issuerRef exclude each other: name your Secret, or let cert-manager fill one, not both")
        .field_path(".issuerRef"),
)]
pub struct TlsSpec {
    /// A Secret in the same namespace with `tls.crt` (the server
    /// certificate, with its intermediates), `tls.key` (its private key)
    /// and `ca.crt` (the CA clients trust), as cert-manager writes them.
    /// Absent: the operator issues the certificate (`<name>-tls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(DNS_SUBDOMAIN).message("spec.tls.secretName must be a valid Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub secret_name: Option<String>,

    /// A cert-manager issuer: the operator writes a `Certificate`
    /// (cert-manager.io/v1) named `<name>-server` for the Redis's Services
    /// (the names of an operator-issued certificate) and serves the
    /// Secret cert-manager fills, `<name>-server-tls`, renewals read live.
    /// The issuer must write `ca.crt` (a CA or self-signed issuer, Vault,
    /// and others do; ACME issuers do not). Needs cert-manager's CRDs in
    /// the cluster: without them the Redis is Degraded and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,

    /// Whether clients must present a certificate (`tls-auth-clients`):
    /// `None` (the default: clients authenticate with a password or an
    /// ACL user only), `Optional` (a certificate presented must be signed
    /// by a CA of `ca.crt`), or `Required` (every client presents one).
    /// With `Optional` or `Required` the operator's own connections, the
    /// readiness probe, the metrics sidecar and the backup agent present
    /// the servers' certificate, which must then allow client
    /// authentication (no extended key usage, or one with `clientAuth`).
    /// A change rolls the pods (the ordered restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,

    /// Not part of the API (not in the schema, so the API server drops it;
    /// never set on what the operator writes): set by the operator on the
    /// copy it builds children from while TLS is turned off, when the
    /// servers listen in plain text and keep the files only to follow a
    /// primary that still listens with TLS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(skip)]
    pub files_only: bool,

    /// Not part of the API either: set by the operator on the copy it
    /// builds a Cluster Redis's children from while TLS is turned on or
    /// off there. The servers start as the rest of the spec says, the
    /// operator switches them all live at once (`CONFIG SET` of the ports,
    /// `tls-cluster` and `tls-replication`), and the readiness probe
    /// answers whichever way the server listens.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(skip)]
    pub either: bool,
}

impl TlsSpec {
    /// `clientAuth`, `None` when left out.
    pub fn client_auth(&self) -> ClientAuth {
        self.client_auth.unwrap_or_default()
    }
}

/// `spec.tls.clientAuth`: whether the servers ask clients for a
/// certificate.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum ClientAuth {
    /// Clients are not asked for a certificate (`tls-auth-clients no`).
    #[default]
    None,
    /// A certificate presented is checked (`tls-auth-clients optional`).
    Optional,
    /// Every client presents a certificate (`tls-auth-clients yes`).
    Required,
}

impl ClientAuth {
    /// The `tls-auth-clients` value.
    pub fn config_value(self) -> &'static str {
        match self {
            ClientAuth::None => "no",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "yes",
        }
    }

    /// Whether the servers may ask the operator's processes for a
    /// certificate.
    pub fn asks(self) -> bool {
        self != ClientAuth::None
    }
}

/// The cert-manager issuer a `Certificate` names.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// The issuer's name (an `Issuer` in the Redis's namespace, or a
    /// `ClusterIssuer`).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(DNS_SUBDOMAIN).message("spec.tls.issuerRef.name must be the name of an Issuer or ClusterIssuer: lowercase letters, digits, '-' and '.'"))]
    pub name: String,
    /// `Issuer` (the default) or `ClusterIssuer`; another group's kind
    /// (an external issuer) is passed on as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: Option<String>,
    /// The issuer's API group; `cert-manager.io` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub group: Option<String>,
}

impl IssuerRef {
    /// The kind, `Issuer` when left out.
    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("Issuer")
    }

    /// The group, `cert-manager.io` when left out.
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or("cert-manager.io")
    }
}
