//! The names of a Redis's children and the labels, annotations and keys
//! they carry, and the metadata every child gets: the bottom of the
//! controller. Every other module may use it; it uses none of them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::api::v1alpha1::{Engine, Redis};

/// The port every instance listens on.
pub const REDIS_PORT: u16 = 6379;
/// Label naming the Redis a child belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Label naming the managing operator.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "redpilot";
/// Pod label the operator keeps equal to the instance's replication role.
pub const ROLE_LABEL: &str = "redpilot.io/role";
/// Annotation holding the hash of what an object was built from.
pub const HASH_ANNOTATION: &str = "redpilot.io/desired-hash";
/// The server container of every instance.
pub const SERVER_CONTAINER: &str = "redis";
/// StatefulSet annotation: the engine its template runs.
pub const ENGINE_ANNOTATION: &str = "redpilot.io/engine";
/// StatefulSet annotation: the version its template runs.
pub const VERSION_ANNOTATION: &str = "redpilot.io/version";
/// Pod template annotation: hash of the settings that need a restart.
pub const RESTART_HASH_ANNOTATION: &str = "redpilot.io/restart-hash";
/// Key of the password in an auth Secret.
pub const PASSWORD_KEY: &str = "password";
/// Server-auth Secret key: the redis.conf lines with the password
/// (`requirepass`, `masterauth`), included by redis.conf at start-up.
pub const AUTH_CONF_KEY: &str = "auth.conf";
/// Server-auth Secret key: the password being retired during a rotation.
pub const PREVIOUS_KEY: &str = "previous";
/// Server-auth Secret key: the password of [`PROBE_USER`], generated once
/// per Redis and never rotated.
pub const PROBE_PASSWORD_KEY: &str = "probe-password";
/// The operator's own ACL user: the default user's passwords (rotated with
/// them), every command but those that wipe data, every key (resharding
/// moves them). Replicas authenticate to their primary as it, so the
/// default user can be disabled (`spec.auth.defaultUser.enabled: false`).
pub const OPERATOR_USER: &str = "redpilot-operator";
/// The ACL user of the metrics sidecar: `PING`, `INFO`, `CLUSTER INFO`.
pub const EXPORTER_USER: &str = "redpilot-exporter";
/// Server-auth Secret key: [`EXPORTER_USER`]'s password (generated once).
pub const EXPORTER_PASSWORD_KEY: &str = "exporter-password";
/// The ACL user of the backup agent: the replication handshake only
/// (`PING`, `REPLCONF`, `PSYNC`, `SYNC`).
pub const BACKUP_USER: &str = "redpilot-backup";
/// Server-auth Secret key: [`BACKUP_USER`]'s password (generated once).
pub const BACKUP_PASSWORD_KEY: &str = "backup-password";
/// Server-auth Secret key: the `user` lines of `spec.users` as the
/// servers load them (also at the end of `auth.conf`).
pub const USERS_CONF_KEY: &str = "users.conf";
/// Server-auth Secret key: the hash of the `users.conf` every instance was
/// last seen to run (absent until the first one was applied everywhere).
pub const USERS_APPLIED_KEY: &str = "users-applied";
/// The ACL user the readiness probe authenticates as: it may run `PING`
/// and `INFO` and nothing else. A probe's environment is fixed when its
/// container starts (the kubelet resolves it then), so it must not hold the
/// application password, which rotates live: a probe still sending the
/// retired password would fail and take every instance started before the
/// rotation out of its Services.
pub const PROBE_USER: &str = "redpilot-probe";
/// Where the start script writes `auth.conf` (from the environment, which
/// the kubelet resolves at every container start: a mounted file can lag
/// behind a rotation) for redis.conf to include.
pub const AUTH_CONF_PATH: &str = "/tmp/redpilot-auth.conf";
/// Server-auth Secret key: the CA bundle (`ca.crt` of `spec.tls`) of the
/// certificate every instance was last seen to serve. The operator trusts
/// it beside the Secret's own until every instance serves the Secret's
/// certificate, so a renewal that also changes the CA never cuts it off.
pub const TLS_CA_APPLIED_KEY: &str = "tls-ca-applied";
/// Key of the server-auth Secret: the hash of the certificate Secret's
/// `tls.crt` and `ca.crt` once every instance serves them.
pub const TLS_SERVED_KEY: &str = "tls-served";
/// The namespace's CA the operator issues certificates from (`ca.crt`,
/// `ca.key`); shared by every Redis of the namespace, so owned by none.
pub const NAMESPACE_CA_SECRET: &str = "redpilot-ca";
/// Annotation of an issued certificate's Secret (and the CA's): when the
/// certificate expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "redpilot.io/not-after";
/// Annotation of an issued certificate's Secret: the hash of the CA that
/// signed it (a new CA reissues it).
pub const ISSUER_ANNOTATION: &str = "redpilot.io/issuer-hash";
/// Where the certificate Secret of `spec.tls` is mounted, in the server
/// and the sidecar (`tls.crt`, `tls.key`, `ca.crt`).
pub const TLS_DIR: &str = "/etc/redis-tls";

/// Port of the archive sidecar's `/status` and `/metrics` (`spec.archive`).
pub const ARCHIVE_PORT: u16 = 9122;
/// Name of that port (the PodMonitor scrapes it).
pub const ARCHIVE_PORT_NAME: &str = "archive";
/// ConfigMap key holding redis.conf.
pub const CONFIG_KEY: &str = "redis.conf";
/// ConfigMap key holding the current primary as `ip port` (read at start-up
/// so a restarted instance comes back as a replica of the current primary).
pub const PRIMARY_KEY: &str = "primary";
/// ConfigMap key present once a bootstrap from a backup finished (its
/// value is the backup's location): the restore init container then does
/// nothing, so a re-created instance never loads the old backup again.
pub const BOOTSTRAPPED_KEY: &str = "bootstrapped";
/// ConfigMap key of a Cluster Redis waking from hibernation (when every
/// instance saved): its nodes skip the boot rule's wait for a takeover.
pub const WAKING_KEY: &str = "waking";

/// Names of the children of one Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// StatefulSet, PDB and read-write Service name (the Redis name).
    pub base: String,
}

impl Names {
    /// Names for a Redis called `name`.
    pub fn new(name: &str) -> Self {
        Names {
            base: name.to_string(),
        }
    }
    /// The StatefulSet.
    pub fn statefulset(&self) -> String {
        self.base.clone()
    }
    /// The headless Service giving pods stable DNS names.
    pub fn headless(&self) -> String {
        format!("{}-headless", self.base)
    }
    /// The read-write Service (current primary).
    pub fn write_service(&self) -> String {
        self.base.clone()
    }
    /// The read-only Service (replicas).
    pub fn read_service(&self) -> String {
        format!("{}-ro", self.base)
    }
    /// The ConfigMap with redis.conf.
    pub fn config(&self) -> String {
        format!("{}-config", self.base)
    }
    /// The generated auth Secret.
    pub fn generated_secret(&self) -> String {
        format!("{}-auth", self.base)
    }
    /// The operator-owned Secret with the password the servers run (pods
    /// start from it; see the Redis controller's credentials step).
    pub fn server_auth(&self) -> String {
        format!("{}-server-auth", self.base)
    }
    /// The certificate Secret the operator issues (`spec.tls` without a
    /// `secretName`).
    pub fn issued_tls(&self) -> String {
        format!("{}-tls", self.base)
    }
    /// The cert-manager `Certificate` of `spec.tls.issuerRef`.
    pub fn certificate(&self) -> String {
        format!("{}-server", self.base)
    }
    /// The Secret cert-manager fills for [`Self::certificate`].
    pub fn certificate_secret(&self) -> String {
        format!("{}-server-tls", self.base)
    }
    /// The PodDisruptionBudget.
    pub fn pdb(&self) -> String {
        self.base.clone()
    }
    /// The NetworkPolicy (`spec.networkPolicy`).
    pub fn network_policy(&self) -> String {
        self.base.clone()
    }
    /// Pod name of ordinal `i`.
    pub fn pod(&self, i: i32) -> String {
        format!("{}-{i}", self.base)
    }
}

/// Labels every child carries.
pub fn labels(redis: &Redis) -> BTreeMap<String, String> {
    let mut l = selector_labels(redis);
    l.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    l.insert("app.kubernetes.io/component".into(), "database".into());
    l.insert(
        "app.kubernetes.io/version".into(),
        label_safe(redis.spec.version()),
    );
    l
}

/// In-memory annotation (never written) carrying the `app.kubernetes.io/name`
/// of the live StatefulSet's selector into the builders: a selector cannot
/// change, so after a move from Redis to Valkey the pods keep the name the
/// Redis was created with.
pub const SELECTOR_NAME_ANNOTATION: &str = "redpilot.io/selector-name";

/// `app.kubernetes.io/name` of a Redis created with `engine`.
pub fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Redis => "redis",
        Engine::Valkey => "valkey",
    }
}

/// Labels selecting the pods of one Redis.
pub fn selector_labels(redis: &Redis) -> BTreeMap<String, String> {
    let name = redis
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SELECTOR_NAME_ANNOTATION).cloned())
        .unwrap_or_else(|| engine_name(redis.spec.engine()).to_string());
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), name),
        (INSTANCE_LABEL.to_string(), redis.name_any()),
    ])
}

fn label_safe(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

/// The controller owner reference every child gets.
pub fn owner_reference(redis: &Redis) -> Option<OwnerReference> {
    redis.controller_owner_ref(&())
}

pub fn meta(redis: &Redis, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: redis.namespace(),
        labels: Some(labels(redis)),
        owner_references: owner_reference(redis).map(|o| vec![o]),
        ..Default::default()
    }
}

/// A stable 64-bit FNV-1a hash, rendered in hex. Used to tell whether a child
/// must be re-applied and whether pods must restart; it must not change
/// between builds of the operator, so std's randomised hasher will not do.
pub fn stable_hash(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Sets [`HASH_ANNOTATION`] from the object's own JSON form (without the
/// annotation), so an unchanged object can be skipped without a write.
pub fn stamp_hash<K: serde::Serialize + Resource>(mut obj: K) -> K {
    let text = serde_json::to_string(&obj).unwrap_or_default();
    let hash = stable_hash(&[&text]);
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(HASH_ANNOTATION.into(), hash);
    obj
}

/// The hash an object was stamped with.
pub fn stamped_hash<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(HASH_ANNOTATION)
        .map(String::as_str)
}

/// Whether `obj` is controlled by the Redis with `uid`.
pub fn controlled_by(meta: &kube::api::ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Whether an object without our owner reference may be adopted: it carries
/// our instance and managed-by labels (left by an earlier install).
pub fn adoptable(meta: &kube::api::ObjectMeta, instance: &str) -> bool {
    let labels = meta.labels.as_ref();
    let has = |k: &str, v: &str| labels.and_then(|l| l.get(k)).map(String::as_str) == Some(v);
    let has_other_controller = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true));
    !has_other_controller && has(INSTANCE_LABEL, instance) && has(MANAGED_BY_LABEL, MANAGED_BY)
}
