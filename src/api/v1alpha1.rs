//! `redpilot.io/v1alpha1`: the `Redis` custom resource.
//!
//! Validation lives in the schema: OpenAPI types, enums and bounds from the
//! Rust types, and CEL rules (`x-kubernetes-validations`) for everything that
//! crosses fields or compares with the old object. Every rule's message names
//! the field it is about, so a bad spec is refused at `kubectl apply` with a
//! reason a person can act on.
//!
//! Length: one file per API version, as the CRD derive reads it; the CEL
//! rules are long strings next to the fields they guard.

// kube-derive takes repeated `printcolumn` and `validation` keys inside one
// attribute, which this lint reads as duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::{Message, Reason, Rule};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

mod archive;
mod autopilot;
mod backup;
mod monitoring;
mod network;
mod schedule;
mod tls;
mod users;
pub use archive::*;
pub use autopilot::*;
pub use backup::*;
pub use monitoring::*;
pub use network::*;
pub use schedule::*;
pub use tls::*;
pub use users::*;

/// Configuration keys the operator owns: setting them in `spec.config` would
/// break networking, persistence paths, replication or authentication.
pub const OPERATOR_OWNED_CONFIG: &[&str] = &[
    "port",
    "bind",
    "dir",
    "dbfilename",
    "appendfilename",
    "appenddirname",
    "replicaof",
    "slaveof",
    "masterauth",
    "masteruser",
    "requirepass",
    "aclfile",
    "include",
    "daemonize",
    "supervised",
    "pidfile",
    "logfile",
    "unixsocket",
    "unixsocketperm",
    "protected-mode",
    "tls-port",
    "tls-cert-file",
    "tls-key-file",
    "tls-ca-cert-file",
    "tls-ca-cert-dir",
    "tls-replication",
    "tls-cluster",
    "tls-auth-clients",
    "tls-client-cert-file",
    "tls-client-key-file",
    "cluster-enabled",
    "cluster-config-file",
    // Cluster mode: the operator sets the addresses and the failure timing.
    "cluster-announce-ip",
    "cluster-announce-port",
    "cluster-announce-bus-port",
    "cluster-port",
    "cluster-node-timeout",
    "cluster-require-full-coverage",
    "cluster-allow-replica-migration",
    "rename-command",
    "replica-announce-ip",
    "slave-announce-ip",
    "replica-announce-port",
    "slave-announce-port",
    "maxmemory",
    "save",
    "appendonly",
    "appendfsync",
    // ACL users would bypass the operator's password; replicas must stay
    // read-only and the operator alone chooses which one is promoted.
    "user",
    "replica-read-only",
    "slave-read-only",
    "replica-priority",
    "slave-priority",
    // Fencing for failover (spec.failover): the operator sets these live.
    "min-replicas-to-write",
    "min-slaves-to-write",
    "min-replicas-max-lag",
    "min-slaves-max-lag",
    "repl-ping-replica-period",
    "repl-ping-slave-period",
    "repl-timeout",
];

/// CEL: the value is a DNS subdomain, the format of most object names.
pub(crate) const DNS_SUBDOMAIN: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";

/// One CEL rule per operator-owned key, so the message names exactly the
/// key that was set (`spec.config.port is managed by the operator ...`).
/// A single rule over the list cannot name the key within the apiserver's
/// CEL cost budget.
fn config_owned_key_rules() -> Vec<Rule> {
    OPERATOR_OWNED_CONFIG
        .iter()
        .map(|k| {
            Rule::new(format!("!('{k}' in self)"))
                .message(Message::Message(format!(
                    "spec.config.{k} is managed by the operator and cannot be set here (use the dedicated spec fields: auth, storage, persistence, resources, failover)"
                )))
                .reason(Reason::FieldValueForbidden)
        })
        .collect()
}

fn config_key_format_rule() -> Rule {
    Rule::new("self.all(k, k.matches('^[a-z][a-z0-9-]*$'))").message(
        "spec.config: keys must be lowercase redis.conf parameter names (letters, digits and '-')",
    )
}

fn config_value_line_rule() -> Rule {
    Rule::new("self.all(k, !self[k].contains('\\n'))")
        .message("spec.config: values must be a single line")
}

/// The versions Redpilot knows, by engine (`spec.version`, admission).
pub const KNOWN_VERSIONS: &[(Engine, &[&str])] = &[
    (Engine::Redis, &["6.2", "7.0", "7.2", "7.4"]),
    (Engine::Valkey, &["7.2", "8.0", "8.1", "9.0", "9.1"]),
];

// Unset `mode`, `engine` and `version` read as their defaults in the rules
// (Standalone, Redis, 7.0), as the operator reads them. A Redis bootstrapped
// from a RedisBackup by name may leave them unset: the operator then sets
// them from the backup before it creates anything, and the rules let that
// first setting through (not for a bucket key: no origin to take them from).
const KNOWN_VERSION_RULE: &str = "has(self.image) || (!has(self.version) && has(self.bootstrap) && has(self.bootstrap.fromBackup.backup)) \
    || ((has(self.engine) ? self.engine : 'Redis') == 'Redis' \
    ? (has(self.version) ? self.version : '7.0').matches('^(6[.]2|7[.][024])([.][0-9]+)?$') \
    : (has(self.version) ? self.version : '7.0').matches('^(7[.]2|8[.][01]|9[.][01])([.][0-9]+)?$'))";
const KNOWN_VERSION_MESSAGE: &str = "'spec.version: ' + (has(self.version) ? self.version : '7.0 (the default)') \
    + ' is not a ' + (has(self.engine) ? self.engine : 'Redis') \
    + ' version Redpilot knows; known: Redis 6.2, 7.0, 7.2, 7.4 (6.0 lacks the write pause a \
    switchover needs); Valkey 7.2, 8.0, 8.1, 9.0, 9.1 (or set spec.image to run another build)'";

/// The engine moves that work with the real servers: a Valkey replica
/// syncs from a Redis 6.2 or 7.0 primary (RDB 9 and 10); a Valkey primary
/// cannot feed a Redis replica, and the other pairs are not tested.
const MIGRATION_RULE: &str = "(has(self.engine) ? self.engine : 'Redis') \
    == (has(oldSelf.engine) ? oldSelf.engine : 'Redis') \
    || (!has(oldSelf.engine) && has(self.bootstrap) && has(self.bootstrap.fromBackup.backup)) \
    || ((has(oldSelf.engine) ? oldSelf.engine : 'Redis') == 'Redis' \
    && has(self.engine) && self.engine == 'Valkey' \
    && (has(oldSelf.version) ? oldSelf.version : '7.0').matches('^(6[.]2|7[.]0)([.]|$)') \
    && has(self.version) && self.version.matches('^(8[.]1|9[.]1)([.]|$)'))";
const MIGRATION_MESSAGE: &str = "'spec.engine: ' + (has(oldSelf.engine) ? oldSelf.engine : 'Redis') \
    + ' ' + (has(oldSelf.version) ? oldSelf.version : '7.0') + ' to ' \
    + (has(self.engine) ? self.engine : 'Redis') + ' ' \
    + (has(self.version) ? self.version : '7.0') + ' is not a supported move; supported: \
    Redis 6.2 or 7.0 to Valkey 8.1 or 9.1 (a Valkey primary cannot feed a Redis replica, other \
    pairs are untested); create a new Redis for other engines'";

/// `MAJOR*10^6 + MINOR*10^3 + PATCH` of a version string, in CEL.
macro_rules! cel_version_number {
    ($v:literal) => {
        concat!(
            "(int(",
            $v,
            ".split('.')[0]) * 1000000 + int(",
            $v,
            ".split('.')[1]) * 1000 + (size(",
            $v,
            ".split('.')) > 2 ? int(",
            $v,
            ".split('.')[2]) : 0))"
        )
    };
}

/// A version may only grow within an engine, except back to the version
/// the instances ran before an upgrade that is running or was rolled back
/// (`status.upgrade.from`); once it succeeded, that is a downgrade too.
/// (Between the switchover and success the operator holds the newer
/// version and says so in `UpgradeFailed`, reason `NoWayBack`.) After a
/// rollback every instance runs `from` again, so any later minor version
/// than `from` is an upgrade of what runs, even below the version that
/// failed (7.0 to 7.4 rolled back, then 7.2).
const NO_DOWNGRADE_RULE: &str = concat!(
    "(has(self.spec.engine) ? self.spec.engine : 'Redis') != ",
    "(has(oldSelf.spec.engine) ? oldSelf.spec.engine : 'Redis') || has(self.spec.image) || ",
    "(!has(oldSelf.spec.version) && has(self.spec.bootstrap) && has(self.spec.bootstrap.fromBackup.backup)) || ",
    cel_version_number!("(has(self.spec.version) ? self.spec.version : '7.0')"),
    " >= ",
    cel_version_number!("(has(oldSelf.spec.version) ? oldSelf.spec.version : '7.0')"),
    " || (has(oldSelf.status) && has(oldSelf.status.upgrade) && ",
    "oldSelf.status.upgrade.phase != 'Succeeded' && ",
    "oldSelf.status.upgrade.from.engine == (has(self.spec.engine) ? self.spec.engine : 'Redis') && ",
    "oldSelf.status.upgrade.from.version == (has(self.spec.version) ? self.spec.version : '7.0')) ",
    "|| (has(oldSelf.status) && has(oldSelf.status.upgrade) && ",
    "oldSelf.status.upgrade.phase == 'RolledBack' && ",
    "oldSelf.status.upgrade.from.engine == (has(self.spec.engine) ? self.spec.engine : 'Redis') && ",
    cel_version_number!("(has(self.spec.version) ? self.spec.version : '7.0')"),
    " / 1000 > ",
    cel_version_number!("oldSelf.status.upgrade.from.version"),
    " / 1000)"
);
const NO_DOWNGRADE_MESSAGE: &str = "'spec.version: ' \
    + (has(oldSelf.spec.version) ? oldSelf.spec.version : '7.0') + ' to ' \
    + (has(self.spec.version) ? self.spec.version : '7.0') + ' is a downgrade, which is refused (an older server cannot load data \
    written by a newer one); create a new Redis to run an older version'";

/// The fewest shards of a Cluster Redis: a majority of primaries must agree
/// that one failed before its replica takes over, and with fewer than three
/// a single lost primary blocks that.
pub const MIN_SHARDS: i32 = 3;
/// The most shards of a Cluster Redis.
pub const MAX_SHARDS: i32 = 100;
/// Instances per shard when `spec.instances` is not set in Cluster mode:
/// a primary and one replica.
pub const DEFAULT_CLUSTER_INSTANCES: i32 = 2;
/// The longest name of a Cluster Redis: its StatefulSets are
/// `<name>-s<shard>` (up to `-s99`, four characters more), and their pods'
/// `controller-revision-hash` label must stay within 63 characters.
pub const MAX_CLUSTER_REDIS_NAME: usize = MAX_REDIS_NAME - 4;

/// The longest Redis name: the StatefulSet of that name labels its pods
/// `controller-revision-hash: <name>-<hash>` (a hash of up to 10
/// characters), and a label value is at most 63 characters. Its other
/// children (`<name>-headless`, `<name>-14`) are shorter.
pub const MAX_REDIS_NAME: usize = 52;

const CLUSTER_NAME_RULE: &str =
    "!has(self.spec.mode) || self.spec.mode != 'Cluster' || size(self.metadata.name) <= 48";
const CLUSTER_NAME_MESSAGE: &str = "metadata.name: a Cluster Redis name is at most 48 characters: its StatefulSets are <name>-s<shard>, and their pods carry the label controller-revision-hash, <StatefulSet>-<hash of up to 10 characters>, at most 63 characters";

const AUTOPILOT_NEEDS_LIMIT_RULE: &str = "!has(self.autopilot) || !has(self.autopilot.memory) \
    || (has(self.resources) && has(self.resources.limits) && 'memory' in self.resources.limits)";
/// Desired state of a Redis (or Valkey) deployment.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "redpilot.io",
    version = "v1alpha1",
    kind = "Redis",
    plural = "redis",
    singular = "redis",
    namespaced,
    shortname = "rds",
    category = "redpilot",
    status = "RedisStatus",
    validation = Rule::new(NO_DOWNGRADE_RULE)
        .message(Message::Expression(NO_DOWNGRADE_MESSAGE.into()))
        .field_path(".spec.version"),
    validation = Rule::new(backup::name_length_rule(MAX_REDIS_NAME))
        .optional_old_self(true)
        .message(backup::name_length_message("Redis", MAX_REDIS_NAME, "its StatefulSet's pods carry the label controller-revision-hash, <name>-<hash of up to 10 characters>, and labels are at most 63 characters")),
    validation = Rule::new(CLUSTER_NAME_RULE)
        .message(CLUSTER_NAME_MESSAGE),
    doc = "A Redis or Valkey deployment managed by Redpilot: standalone, a primary with replicas, or a Redis Cluster of shards.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Shards", type_ = "integer", json_path = ".spec.shards"),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.currentVersion"
    ),
    printcolumn(name = "Primary", type_ = "string", json_path = ".status.primary"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".status.memory.summary"),
    printcolumn(name = "Source", type_ = "string", json_path = ".status.replicaOf.source"),
    printcolumn(name = "Link", type_ = "string", json_path = ".status.replicaOf.link", priority = 1),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("(has(self.mode) && self.mode != 'Standalone') || !has(self.instances) || self.instances == 1")
        .message("spec.instances: Standalone mode runs exactly 1 instance; use mode Replication for more")
        .field_path(".instances"),
    validation = Rule::new("has(self.mode) && self.mode == 'Cluster' ? has(self.shards) : !has(self.shards)")
        .message("spec.shards: set it (3 to 100) in mode Cluster, and only there")
        .field_path(".shards"),
    validation = Rule::new("!has(self.autopilot) || !has(self.autopilot.shards) || (has(self.mode) && self.mode == 'Cluster')")
        .message("spec.autopilot.shards: the shard autopilot needs mode Cluster")
        .field_path(".autopilot.shards"),
    validation = Rule::new("!has(self.mode) || self.mode != 'Cluster' || has(self.image) || (has(self.engine) && self.engine != 'Redis') || (has(self.version) ? !self.version.matches('^6[.]') : true)")
        .message("spec.version: Redis 6.2 is not supported in Cluster mode: the operator assigns slots with CLUSTER ADDSLOTSRANGE, which needs Redis 7.0 or later")
        .field_path(".version"),
    validation = Rule::new("!has(self.mode) || self.mode != 'Cluster' || !has(oldSelf.mode) || (has(self.instances) == has(oldSelf.instances) && (!has(self.instances) || self.instances == oldSelf.instances))")
        .message("spec.instances cannot change yet in Cluster mode: adding and removing replicas of a shard is not supported; create a new Cluster Redis")
        .field_path(".instances"),
    validation = Rule::new("!has(self.mode) || self.mode != 'Cluster' || !has(self.bootstrap) || has(self.bootstrap.fromBackup.backup) || has(self.bootstrap.fromBackup.pointInTime)")
        .message("spec.bootstrap.fromBackup: a Cluster Redis is restored from a RedisBackup of a Cluster Redis (set backup) or from a Cluster Redis's archive to a time (set pointInTime); a bucket key alone holds one shard's file")
        .field_path(".bootstrap"),
    validation = Rule::new("has(self.storage) == has(oldSelf.storage)")
        .message("spec.storage cannot be added or removed after creation")
        .field_path(".storage"),
    validation = Rule::new(MIGRATION_RULE)
        .message(Message::Expression(MIGRATION_MESSAGE.into()))
        .field_path(".engine"),
    validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)")
        .message("spec.bootstrap is set at creation only and cannot change")
        .field_path(".bootstrap"),
    validation = Rule::new("oldSelf.hasValue() || !has(self.bootstrap) || !has(self.persistence) || !has(self.persistence.aof) || self.persistence.aof == 'Disabled'")
        .optional_old_self(true)
        .message("spec.persistence.aof: a Redis bootstrapped from a backup is created with AOF Disabled (a server with AOF on ignores the restored RDB file); enable AOF once it is Ready")
        .field_path(".persistence"),
    validation = Rule::new("!has(self.hibernate) || !self.hibernate || has(self.storage)")
        .message("spec.hibernate needs spec.storage: without a volume the data would be lost with the pods")
        .field_path(".hibernate"),
    validation = Rule::new("(has(self.mode) ? self.mode : 'Standalone') == (has(oldSelf.mode) ? oldSelf.mode : 'Standalone') || (!has(oldSelf.mode) && has(self.bootstrap) && has(self.bootstrap.fromBackup.backup))")
        .message("spec.mode is immutable")
        .field_path(".mode"),
    validation = Rule::new(KNOWN_VERSION_RULE)
        .message(Message::Expression(KNOWN_VERSION_MESSAGE.into()))
        .field_path(".version"),
    validation = Rule::new("!has(self.replicaOf) || !has(self.mode) || self.mode != 'Cluster'")
        .message("spec.replicaOf: a Cluster Redis cannot follow another Redis (a source cluster's slots would have to match shard by shard and move with it); migrate a Cluster with a backup and bootstrap.fromBackup")
        .field_path(".replicaOf"),
    validation = Rule::new("!has(self.replicaOf) || !has(self.hibernate) || !self.hibernate")
        .message("spec.replicaOf: a Redis that follows a source cannot hibernate (it would stop following without a promotion); remove spec.replicaOf first")
        .field_path(".replicaOf"),
    validation = Rule::new("!has(self.replicaOf) || !has(self.bootstrap)")
        .message("spec.replicaOf: a Redis that follows a source takes its data from it; it cannot also be bootstrapped from a backup")
        .field_path(".replicaOf"),
    validation = Rule::new(AUTOPILOT_NEEDS_LIMIT_RULE)
        .message("spec.autopilot.memory needs spec.resources.limits.memory: the memory limit the autopilot starts from")
        .field_path(".autopilot.memory"),
)]
#[serde(rename_all = "camelCase")]
pub struct RedisSpec {
    /// Topology: `Standalone` (one instance, the default), `Replication`
    /// (one primary and `instances - 1` replicas) or `Cluster` (`shards`
    /// primaries with replicas). Immutable. A Redis bootstrapped from a
    /// RedisBackup that leaves it unset takes the backed-up Redis's mode
    /// (and its shard and instance counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "unset_or::<Mode>")]
    pub mode: Option<Mode>,

    /// Server engine: `Redis` (the default) or `Valkey`. A Redis
    /// bootstrapped from a RedisBackup that leaves it unset takes the
    /// backed-up Redis's engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "unset_or::<Engine>")]
    pub engine: Option<Engine>,

    /// Engine version, `MAJOR.MINOR` or `MAJOR.MINOR.PATCH` (default 7.0);
    /// the image is derived from engine and version unless `image` is set.
    /// A Redis bootstrapped from a RedisBackup that leaves it unset takes
    /// the backed-up Redis's version (and its `image` and `config`, when
    /// those are unset too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "version_schema")]
    pub version: Option<String>,

    /// Container image overriding the one derived from engine and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// Number of instances: 1 primary plus replicas. Defaults to 1 for
    /// Standalone and 3 for Replication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 15))]
    pub instances: Option<i32>,

    /// Cluster mode: the number of shards (3 to 100), each a primary with
    /// `instances - 1` replicas (`instances` defaults to 2 in Cluster mode).
    /// Required in Cluster mode and refused in the others. Changing it
    /// reshards online: new shards are created, joined and given slots, or
    /// the shards past the new count are emptied and then removed; the
    /// slots move while clients keep working (`status.resharding`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 3, max = 100))]
    pub shards: Option<i32>,

    /// CPU and memory for the server container. `maxmemory` is derived from
    /// the memory limit (or request) when one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// redis.conf parameters, e.g. `maxmemory-policy: allkeys-lru`. Keys the
    /// operator manages (port, dir, replicaof, requirepass, ...) are refused.
    /// Dynamic parameters are applied live; others roll the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(
        validation = config_key_format_rule(),
        validation = config_value_line_rule()
    )]
    #[schemars(schema_with = "config_schema")]
    pub config: BTreeMap<String, String>,

    /// Authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,

    /// Persistent storage; without it data lives in an emptyDir and is lost
    /// with the pod. Cannot be added or removed after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// RDB snapshots and the append-only file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistenceSpec>,

    /// Scheduling and metadata for the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateSpec>,

    /// When true the operator stops changing children (no applies, no
    /// replication changes) but keeps the status up to date.
    #[serde(default)]
    pub paused: bool,

    /// A single instance without `spec.storage` keeps its data only in
    /// memory and in a pod-lifetime directory: restarting it (a version
    /// change, a parameter that cannot change live) empties it. The operator
    /// holds such a restart (condition Progressing, reason
    /// `RestartWouldLoseData`) until this is true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_data_loss_on_restart: bool,

    /// Automatic failover of a Replication Redis, fencing of the primary,
    /// and planned switchovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverSpec>,

    /// How a change of `version` (or the move from Redis to Valkey) is
    /// rolled out and when it is rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeSpec>,

    /// Where the data of a new Redis comes from: a backup loaded into the
    /// first instance before the Redis reports Ready. Creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,

    /// Hibernation: when true, every instance saves its dataset and the
    /// pods are removed; the volumes and the Secret stay, and setting it
    /// back to false brings the same data back. Needs `storage`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hibernate: bool,

    /// Metrics: the exporter sidecar (on by default), the PodMonitor and
    /// PrometheusRule, and the alerts' bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<MonitoringSpec>,

    /// Automatic scaling: the memory autopilot grows every instance's
    /// memory (in place, without a restart, where the cluster allows it)
    /// before the dataset reaches `maxmemory`, and shrinks it once the data
    /// is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autopilot: Option<AutopilotSpec>,

    /// Tuning advice the operator carries out itself: for each rule listed
    /// in `apply`, the setting its finding advises is applied live on every
    /// instance (and kept in redis.conf), recorded in `status.tuning`. Only
    /// settings that change live and change nothing an application sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningSpec>,

    /// An opt-in NetworkPolicy in front of the pods: who may reach the
    /// client port and scrape the metrics (see `NetworkPolicySpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,

    /// ACL users on every instance, with passwords from Secrets and the
    /// server's ACL rules (at most 32, names unique).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub users: Vec<UserSpec>,

    /// TLS for clients, replication and (Cluster mode) the cluster bus,
    /// with the certificate from a Secret (see `TlsSpec`). Added or
    /// removed with the ordered restart (in Cluster mode with a live switch
    /// of every node between two rolls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// Follow a Redis outside this one (a server on a VM, another
    /// operator's, one in another Kubernetes cluster): the primary
    /// replicates from it, the replicas from the primary, and the Redis
    /// refuses writes. Removing it promotes the Redis (see `ReplicaOfSpec`
    /// and `status.replicaOf`). Standalone and Replication modes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_of: Option<ReplicaOfSpec>,

    /// Archive every write continuously, for restores to a point in time
    /// (see `ArchiveSpec`; `status.archive` shows the restorable window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveSpec>,
}

/// The Redis a Redis follows (`spec.replicaOf`).
///
/// The operator points the primary at the source only once it has checked
/// that the source continues the history the primary holds: when the
/// source cannot be reached, the primary is fenced (its link held down, so
/// a source that comes back empty cannot wipe it); when it comes back
/// with another history, the primary resynchronises from it unless the
/// source is empty and the primary is not (then it holds, condition
/// Degraded, reason `SourceEmpty`, until the annotation
/// `redpilot.io/accept-source-reset` names the source's run id).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaOfSpec {
    /// Host name or IP address of the source's primary, as this Redis's
    /// pods reach it.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$')").message("spec.replicaOf.host must be a host name or an IP address"))]
    pub host: String,
    /// Its port (default 6379).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// A Secret in the same namespace with the source's `password` (and,
    /// for an ACL user, `username`; `default` otherwise). The operator
    /// sends it to the source, so the Secret must carry the label
    /// `redpilot.io/allow-use: "true"`. Without it the source is reached
    /// without a password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message("spec.replicaOf.secretName must be a valid Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub secret_name: Option<String>,
}

impl ReplicaOfSpec {
    /// The source's port.
    pub fn port(&self) -> u16 {
        self.port
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(6379)
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port())
    }
}

/// What following the source looks like (`status.replicaOf`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaOfStatus {
    /// The source followed, `host:port`.
    pub source: String,
    /// The Secret its credentials come from (the name only), kept for the
    /// promotion once `spec.replicaOf` is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// `Up` (the primary streams from the source), `Down` (it retries),
    /// `Syncing` (a full synchronisation), `Fenced` (held off the source
    /// until its history is checked) or `Held` (the check refused it).
    pub link: String,
    /// Bytes the primary is behind the source, as of `observedAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// Seconds since the primary last heard from the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// Full synchronisations the source has served (`sync_full`, all its
    /// replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_full_syncs: Option<i64>,
    /// The replication history followed (the source's `master_replid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replid: Option<String>,
    /// Why the link is held, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When this was observed (RFC 3339); lag is refreshed at most every
    /// 30 seconds while nothing else changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<String>,
}

/// What removing `spec.replicaOf` did (`status.promotion`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromotionStatus {
    /// When the primary was promoted (RFC 3339).
    pub time: String,
    /// The source it followed.
    pub source: String,
    /// True when the source was reached: its writes were paused, the
    /// primary caught up with its final offset, and the source was made a
    /// replica of this Redis before the pause ended (no write it
    /// acknowledged is missing here).
    pub planned: bool,
    /// The source's offset the primary had matched (planned), or the
    /// primary's offset when it was promoted (unplanned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    /// Unplanned: how far behind the primary was, as last recorded
    /// (bytes), and how long the link had been down (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind_bytes: Option<i64>,
    /// See `behindBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_down_seconds: Option<i64>,
    /// What was and was not guaranteed.
    pub message: String,
    /// The replication history this Redis was promoted from (the source's
    /// `master_replid` it had followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
    /// The Secret of the source's credentials (the name only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Whether the source was made read-only. After an unplanned
    /// promotion it is not: the operator keeps trying, and the moment the
    /// old source answers again as a writable primary of that history it
    /// is made a replica of the fence (event `OldSourceFenced`), so it
    /// cannot take writes behind this Redis's back for longer than that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_fenced: Option<bool>,
}

/// `spec.version` when it is not set.
pub const DEFAULT_VERSION: &str = "7.0";

/// Deployment topology.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum Mode {
    /// A single instance.
    #[default]
    Standalone,
    /// One primary and asynchronous replicas.
    Replication,
    /// Redis Cluster: `shards` primaries, each with `instances - 1`
    /// replicas, the 16,384 hash slots spread evenly over the shards.
    /// Clients must be cluster-aware.
    Cluster,
}

/// Server engine.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum Engine {
    /// Redis (`redis:<version>` images).
    #[default]
    Redis,
    /// Valkey (`valkey/valkey:<version>` images).
    Valkey,
}

/// Authentication settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// A Secret in the same namespace whose `password` key holds the password.
    /// When absent the operator generates one in `<name>-auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message("spec.auth.secretName must be a valid Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub secret_name: Option<String>,
    /// The `default` user's rights (its password is the one above). The
    /// operator and replication use a user of their own, so the default
    /// user can be limited or disabled once applications have users of
    /// their own (`spec.users`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_user: Option<DefaultUserSpec>,
}

/// The `default` user's rights.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultUserSpec {
    /// Whether clients may authenticate as `default` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// ACL rules replacing its rights (every key, channel and command when
    /// empty), e.g. `["~*", "+@read", "+@connection"]` for read-only; the
    /// same rules as `spec.users[].rules`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256)))]
    #[x_kube(validation = Rule::new("self.all(r, !r.contains(' ') && !(r.startsWith('>') || r.startsWith('<') || r.startsWith('#') || r.startsWith('!')) && !(r in ['on', 'off', 'nopass', 'resetpass', 'reset']))").message("spec.auth.defaultUser.rules: each rule is one ACL rule without spaces; no password rules, on/off or reset"))]
    pub rules: Vec<String>,
}

/// Persistent volume settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("isQuantity(self.size) && quantity(self.size).isGreaterThan(quantity('0'))")
        .message("spec.storage.size must be a positive quantity such as 1Gi")
        .field_path(".size"),
    validation = Rule::new("!isQuantity(self.size) || !isQuantity(oldSelf.size) || quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0")
        .message("spec.storage.size cannot shrink: volumes only grow (the StorageClass must allow volume expansion)")
        .field_path(".size"),
    validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)")
        .message("spec.storage.storageClassName is immutable")
        .field_path(".storageClassName"),
)]
pub struct StorageSpec {
    /// Volume size per instance, e.g. `1Gi`. May grow (every claim is
    /// expanded in place; the StorageClass must allow volume expansion),
    /// never shrink.
    #[schemars(schema_with = "quantity_string")]
    pub size: Quantity,
    /// StorageClass of the volumes; the cluster default when absent. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message("spec.storage.storageClassName must be a valid StorageClass name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub storage_class_name: Option<String>,
    /// Keep the volumes when the Redis is deleted (default true).
    #[serde(default = "default_true")]
    pub retain_on_delete: bool,
}

fn config_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = schemars::json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": 512}
    });
    for rule in config_owned_key_rules() {
        // Serialising a Rule cannot fail; a failure would only drop the rule
        // from the schema, which the CRD tests would catch.
        if let Err(e) = kube::core::validate(&mut schema, rule) {
            tracing::error!(error = %e, "building the spec.config schema");
        }
    }
    schema
}

/// The schema of an optional enum field: its values, not nullable (a null
/// is dropped by the API server, so the field reads as unset), with the
/// field's own description in place of the type's.
fn unset_or<T: schemars::JsonSchema>(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = schemars::schema_for!(T);
    for key in ["$schema", "title", "description"] {
        schema.remove(key);
    }
    schema
}

fn version_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": "^[0-9]+\\.[0-9]+(\\.[0-9]+)?$"
    })
}

fn quantity_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 64,
        "description": "A Kubernetes quantity, e.g. 1Gi or 500Mi."
    })
}

fn default_true() -> bool {
    true
}

/// Failover settings (Replication mode).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverSpec {
    /// Promote a replica when the primary dies or stops answering (default
    /// true). When false the operator never promotes a replica on its own:
    /// a lost primary is reported, and `switchoverTo` promotes by hand.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The primary stops accepting writes by itself once no replica has
    /// acknowledged the replication stream for `maxLagSeconds` (the
    /// server's `min-replicas-to-write 1` and `min-replicas-max-lag`; it
    /// also drops such replicas, `repl-timeout`), so a primary cut off from
    /// its replicas cannot take writes that a failover would throw away. An
    /// unanswering primary is replaced only after it must have fenced
    /// itself: `maxLagSeconds + 3` seconds of silence. Default true; with
    /// one replica, writes wait while that replica is down.
    #[serde(default = "default_true")]
    pub fence: bool,
    /// See `fence` (default 2, 2 to 60 seconds).
    #[serde(default = "default_max_lag")]
    #[schemars(range(min = 2, max = 60))]
    pub max_lag_seconds: i32,
    /// An instance (pod name, e.g. `cache-1`) to make primary: a planned
    /// switchover that loses no acknowledged write, done whenever the
    /// named instance is a healthy replica. With a lost primary and
    /// `enabled: false`, the named replica is promoted. In Cluster mode it
    /// names a pod of one shard (e.g. `orders-s1-1`), which takes over its
    /// shard's slots with `CLUSTER FAILOVER` once it is a ready replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub switchover_to: Option<String>,
}

impl Default for FailoverSpec {
    fn default() -> Self {
        FailoverSpec {
            enabled: true,
            fence: true,
            max_lag_seconds: default_max_lag(),
            switchover_to: None,
        }
    }
}

/// Upgrade settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// Seconds an upgraded instance has to become Ready (a replica: with a
    /// live, caught-up replication link) before the upgrade is rolled back
    /// (default 300, 30 to 3600). An image that cannot be pulled or a
    /// server that keeps exiting rolls it back at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 3600))]
    pub timeout_seconds: Option<i32>,
}

impl UpgradeSpec {
    /// Default of `timeoutSeconds`.
    pub const DEFAULT_TIMEOUT_SECONDS: i32 = 300;
}

fn default_max_lag() -> i32 {
    2
}

/// Persistence settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistenceSpec {
    /// Periodic RDB snapshots (default true).
    #[serde(default = "default_true")]
    pub rdb: bool,
    /// Append-only file fsync policy: `Disabled` (no AOF), `EverySec` or `Always`.
    #[serde(default)]
    pub aof: AofPolicy,
}

impl Default for PersistenceSpec {
    fn default() -> Self {
        PersistenceSpec {
            rdb: true,
            aof: AofPolicy::Disabled,
        }
    }
}

/// Append-only file policy.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum AofPolicy {
    /// No append-only file.
    #[default]
    Disabled,
    /// fsync once per second.
    EverySec,
    /// fsync after every write.
    Always,
}

/// Pod scheduling and metadata.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.labels) || !('redpilot.io/role' in self.labels)")
        .message("spec.podTemplate.labels: redpilot.io/role is set by the operator (the read-write and read-only Services select on it)")
        .field_path(".labels")
        .reason(Reason::FieldValueForbidden),
)]
pub struct PodTemplateSpec {
    /// Extra labels on the pods (operator labels win on conflict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity; when absent a preferred pod anti-affinity spreads instances
    /// across nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Topology spread constraints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Priority class name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Human summary: Pending, Creating, Ready, Recovering, Updating,
    /// Degraded, Paused, Hibernated (see [`Phase`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Ready, Progressing, Degraded and PrimaryAvailable, with transition
    /// times preserved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Pod name of the current primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// The instance the operator is making primary (recorded before the
    /// promotion, cleared once it is published as `primary`): an operator
    /// that stops in between finds the promotion from the servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary: Option<String>,
    /// Engine version reported by the running servers (`INFO server`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Ready instances out of desired, e.g. `3/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Number of ready instances.
    #[serde(default)]
    pub ready_instances: i32,
    /// Per-instance facts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    /// Service for writes (always the primary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_service: Option<String>,
    /// Service for reads from replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_service: Option<String>,
    /// Secret holding the password (the name only, never the value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_secret: Option<String>,
    /// The `spec.config` keys applied live with `CONFIG SET` (names only).
    /// A key that leaves `spec.config` cannot be set back live (the server's
    /// default is not known to the operator): it counts in `configResets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_config_keys: Option<Vec<String>>,
    /// How many times live keys were removed from `spec.config`; part of the
    /// restart hash, so each removal restarts the instances in order (zero
    /// loss) and they come back with the removed keys at their defaults.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub config_resets: i64,
    /// The last automatic failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<FailoverRecord>,
    /// The version upgrade in progress, or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
    /// The backup this Redis was bootstrapped from (`spec.bootstrap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapStatus>,
    /// The hibernation in progress (`spec.hibernate`), until the Redis is
    /// Ready again after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernation: Option<HibernationStatus>,
    /// Memory of the primary (the instance holding the whole dataset), as
    /// of the last reconcile; refreshed once it moved by 1 % of maxmemory
    /// (or 1 MiB without a limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
    /// What the autopilot decided and the size it keeps the instances at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autopilot: Option<AutopilotStatus>,
    /// Cluster mode: the cluster's own view (`CLUSTER INFO`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// Cluster mode: one entry per shard, in shard order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardStatus>,
    /// Cluster mode: the last (or current) move of slots between shards
    /// after `spec.shards` changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resharding: Option<ReshardingStatus>,
    /// Tuning advice: what the operator's periodic look at the servers
    /// found (slow commands, latency spikes, fragmentation, evictions, full
    /// resyncs, big keys...), most severe first, at most 20.
    /// `kubectl redpilot advise` prints them with the change to apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub insights: Vec<Insight>,
    /// What the operator applied for `spec.tuning`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningStatus>,
    /// The source followed (`spec.replicaOf`), until the promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_of: Option<ReplicaOfStatus>,
    /// The last promotion off a source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<PromotionStatus>,
    /// When (RFC 3339) this Redis's primary was found made read-only from
    /// outside: a Redis that followed it was promoted in a planned switch
    /// and fenced it. The operator then makes no instance writable on its
    /// own: set `spec.replicaOf` to the promoted Redis to follow it, or
    /// annotate `redpilot.io/take-writes` with this value to take writes
    /// here again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demoted: Option<String>,
    /// The continuous archive (`spec.archive`): its window and lag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveStatus>,
}

impl RedisStatus {
    /// Whether the `Ready` condition is true.
    pub fn ready(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    }
}

/// Tuning advice the operator applies itself (`spec.tuning`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningSpec {
    /// Rules whose advised setting the operator applies when they fire:
    /// `latency-monitor-off` (latency-monitor-threshold), `full-resyncs`
    /// (repl-backlog-size), `fragmentation` (activedefrag),
    /// `clients-near-max` and `rejected-connections` (maxclients),
    /// `big-keys` (lazyfree-lazy-user-del). A key set in `spec.config` is the
    /// user's and is never changed. A setting the server refuses is recorded
    /// and not tried again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apply: Vec<TunableRule>,
}

/// A rule whose advice the operator may apply (`spec.tuning.apply[]`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum TunableRule {
    /// latency-monitor-threshold.
    #[serde(rename = "latency-monitor-off")]
    LatencyMonitorOff,
    /// repl-backlog-size.
    #[serde(rename = "full-resyncs")]
    FullResyncs,
    /// activedefrag.
    #[serde(rename = "fragmentation")]
    Fragmentation,
    /// maxclients.
    #[serde(rename = "clients-near-max")]
    ClientsNearMax,
    /// maxclients.
    #[serde(rename = "rejected-connections")]
    RejectedConnections,
    /// lazyfree-lazy-user-del.
    #[serde(rename = "big-keys")]
    BigKeys,
}

impl TunableRule {
    /// The rule's name, as findings carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            TunableRule::LatencyMonitorOff => "latency-monitor-off",
            TunableRule::FullResyncs => "full-resyncs",
            TunableRule::Fragmentation => "fragmentation",
            TunableRule::ClientsNearMax => "clients-near-max",
            TunableRule::RejectedConnections => "rejected-connections",
            TunableRule::BigKeys => "big-keys",
        }
    }
}

/// What the operator applied for `spec.tuning` (`status.tuning`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningStatus {
    /// Each setting applied, oldest first (at most 20): the last record of
    /// a key that is not `Refused` is in effect, live and in redis.conf.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<AppliedTuning>,
}

/// One setting applied for a finding (`status.tuning.applied[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedTuning {
    /// The rule whose finding asked for it.
    pub rule: String,
    /// The setting.
    pub key: String,
    /// Its value on the servers before.
    pub from: String,
    /// Its value now.
    pub to: String,
    /// When it was applied.
    pub at: Time,
    /// The finding's evidence when it was applied (before).
    pub before: String,
    /// `Applied`; `Cleared` once the finding went after it (after); or
    /// `Refused` when a server refused the value (see `message`; not tried
    /// again, not in effect).
    pub state: String,
    /// Why a server refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One finding of the tuning advice (`status.insights[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Insight {
    /// The rule that found it (`fragmentation`, `slow-commands`, ...).
    pub rule: String,
    /// `info`, `warning` or `critical`.
    pub severity: String,
    /// The instance (pod) it was found on.
    pub instance: String,
    /// What was seen, in numbers.
    pub evidence: String,
    /// What to do.
    pub advice: String,
    /// The `spec.config` key whose change carries the advice out, when one
    /// does...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_key: Option<String>,
    /// ...and its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_value: Option<String>,
    /// When it was first found.
    pub since: Time,
    /// When the evidence was taken (refreshed every 10 minutes while the
    /// finding stands, so a standing finding does not write the status on
    /// every look).
    pub observed: Time,
}

/// What a Cluster Redis's nodes say of the cluster (`status.cluster`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// `ok` or `fail`, as the nodes report it (`fail` when any says so).
    pub state: String,
    /// Slots with an owner, out of 16,384.
    // The API server knows the integer formats int32 and int64 only; the
    // unsigned ones schemars writes print a warning on every install.
    #[schemars(extend("format" = "int64"))]
    pub slots_assigned: u32,
    /// Slots whose owner is not failing.
    #[schemars(extend("format" = "int64"))]
    pub slots_ok: u32,
    /// Nodes the cluster knows (the most any node reports).
    #[schemars(extend("format" = "int64"))]
    pub known_nodes: u32,
}

/// One shard of a Cluster Redis (`status.shards[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardStatus {
    /// The shard's index (its StatefulSet is `<name>-s<index>`).
    pub index: i32,
    /// Pod name of the shard's primary (the node serving its slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Pod names of the replicas following that primary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
    /// The slot ranges the shard serves, e.g. `0-5461`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<String>,
    /// Ready instances of the shard out of desired, e.g. `2/2`.
    pub ready: String,
}

/// Moving slots between shards (`status.resharding`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReshardingStatus {
    /// Moving, Paused (a bound holds: see `message`) or Done.
    pub phase: ReshardingPhase,
    /// How slots move: `Atomic` (Valkey 9's `CLUSTER MIGRATESLOTS`) or
    /// `Classic` (the importing/migrating protocol with `MIGRATE` in
    /// batches).
    pub path: String,
    /// The shard count before.
    pub from_shards: i32,
    /// The shard count asked for.
    pub to_shards: i32,
    /// Slots moved so far.
    pub slots_moved: i64,
    /// Slots to move in all (moved plus what is left).
    pub slots_total: i64,
    /// Keys moved so far (the classic path counts them as it moves them;
    /// the atomic path counts the keys its slots held when each job
    /// started).
    pub keys_moved: i64,
    /// The move under way, recorded before its first command: a pass that
    /// finds it finishes it before planning anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<SlotMoveIntent>,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When the first slot began to move (RFC 3339): from here to
    /// `slotsMovedAt` is the moves alone, without the new shards' start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_since: Option<String>,
    /// When the last slot moved (RFC 3339); `finishedAt` follows once the
    /// shards past the count are removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_moved_at: Option<String>,
    /// When the last slot moved and the shards past the count were
    /// removed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The expected end at the rate so far (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_end: Option<String>,
    /// Why it is paused, or what it does now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Phase of a resharding.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum ReshardingPhase {
    /// Slots are moving.
    #[default]
    Moving,
    /// Waiting for a bound to clear: the cluster not ok, a shard without
    /// its primary, an upgrade or an ordered restart running.
    Paused,
    /// Every shard holds its even count; removed shards are gone.
    Done,
}

/// One move of slots between two shards' primaries.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotMoveIntent {
    /// The slot ranges, e.g. `5461-5500`.
    pub slots: String,
    /// The shard giving them.
    pub from_shard: i32,
    /// The shard taking them.
    pub to_shard: i32,
    /// The source primary's node ID.
    pub source: String,
    /// The target primary's node ID.
    pub target: String,
}

/// Memory use of one instance (`status.memory`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStatus {
    /// The instance it was read from.
    pub instance: String,
    /// `used_memory`, bytes.
    pub used_bytes: i64,
    /// `maxmemory`, bytes (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<i64>,
    /// Used, in percent of maxmemory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// For people: `12Mi/48Mi (25%)`.
    pub summary: String,
}

/// A hibernation: when the data was saved, and since when no pod runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HibernationStatus {
    /// When every instance saved its dataset (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_at: Option<String>,
    /// The primary's replication offset when it saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    /// Since when no pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// An engine, version and image the instances run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Served {
    /// `Redis` or `Valkey`.
    pub engine: Engine,
    /// The version as the spec gave it.
    pub version: String,
    /// The container image.
    pub image: String,
}

/// Where a version upgrade stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum UpgradePhase {
    /// Instances restart on the new version: replicas first, each proven
    /// before the next, then a switchover, then the old primary.
    Upgrading,
    /// An upgraded instance failed: the upgraded replicas go back to the
    /// old version (the primary was never touched).
    RollingBack,
    /// Rolled back: every instance runs the old version again; the spec's
    /// version is not served until the spec changes.
    RolledBack,
    /// Every instance runs the new version.
    Succeeded,
}

/// A version upgrade (`status.upgrade`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// What the instances ran when the upgrade started.
    pub from: Served,
    /// What the spec asks for.
    pub to: Served,
    /// Upgrading, RollingBack, RolledBack or Succeeded.
    pub phase: UpgradePhase,
    /// Instances running `to` and proven (Ready; a replica linked and
    /// caught up).
    pub done: i32,
    /// Instances in all.
    pub total: i32,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it succeeded or finished rolling back (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it was rolled back: `ImagePullFailed`, `CrashLoop` or
    /// `NotReadyInTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the failed instance showed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the primary (a Standalone's only instance) was restarted on the
    /// new version (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_restarted_at: Option<String>,
    /// Standalone: seconds from the restart to Ready again (the time the
    /// instance served nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_seconds: Option<f64>,
}

/// What an automatic failover did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    /// When the new primary was promoted (RFC 3339).
    pub time: String,
    /// The primary that was lost.
    pub from: String,
    /// The instance promoted.
    pub to: String,
    /// Why: `PrimaryDown` (nothing listens), `PrimaryRestarted` (it came
    /// back empty-handed as a replica), `PrimaryGone` (its pod is gone),
    /// `PrimaryUnresponsive` (silent past the fencing bound) or
    /// `PrimaryPodDeleted` (its pod was deleted while it served: handed over
    /// to an in-sync replica by a switchover, nothing lost).
    pub reason: String,
    /// The promoted replica's replication offset.
    pub offset: i64,
    /// The other candidates' offsets, `name=offset`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<String>,
    /// Where the time went, in milliseconds, as the operator saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<FailoverTimeline>,
}

/// The steps of an automatic failover, in milliseconds. The fault itself
/// is not seen: it came at most one probe interval (500 ms) after the lost
/// primary's last answer. What follows `labelsMs` (Services' endpoints
/// updated, clients reconnecting) is outside the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverTimeline {
    /// From the lost primary's last answer to the failure monitor's
    /// failing verdict (none when the loss was seen another way, e.g. its
    /// pod gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // int64, not uint64: see `ClusterStatus`.
    #[schemars(extend("format" = "int64"))]
    pub noticed_ms: Option<u64>,
    /// From the lost primary's last answer to the promotion's start (the
    /// verdict, the reconcile it triggered, that reconcile's reads); none
    /// when the monitor never heard it (e.g. its pod made anew elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub silent_ms: Option<u64>,
    /// From the promotion's start to the new primary's answer
    /// (`REPLICAOF NO ONE` with its fencing settings; for a handover, the
    /// whole switchover: writes paused, the replica caught up, promoted,
    /// the old primary following it).
    #[schemars(extend("format" = "int64"))]
    pub promote_ms: u64,
    /// From the promotion's start to the role labels written (the
    /// read-write Service selects the new primary from then on); `time`
    /// is this moment.
    #[schemars(extend("format" = "int64"))]
    pub labels_ms: u64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Summary phase. A Redis goes Pending → Creating → Ready once; after it
/// was first Ready it never shows Creating again: an instance coming back
/// by itself (a restart, a re-created pod) is Recovering, and a change the
/// operator is carrying out (a rolling restart, an upgrade, a password
/// rotation, a resize, a switchover) is Updating.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Phase {
    /// Accepted, nothing created yet.
    Pending,
    /// Children created; waiting for the instances' first start.
    Creating,
    /// Every instance is ready and replication is healthy.
    Ready,
    /// Was Ready; an instance is not ready and nothing is being changed:
    /// waiting for it to come back (it restarted, its pod was re-created,
    /// a replica is resyncing).
    Recovering,
    /// Was Ready; the operator is carrying out a change (see the
    /// Progressing condition).
    Updating,
    /// Running, but something needs attention (see conditions).
    Degraded,
    /// Reconciliation of children is paused.
    Paused,
    /// No pod runs (`spec.hibernate`); the volumes keep the data.
    Hibernated,
}

/// What the operator saw of one instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Pod name.
    pub name: String,
    /// `primary`, `replica` or `unknown`.
    pub role: String,
    /// Whether the pod is ready.
    pub ready: bool,
    /// Replication offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    /// Bytes behind the primary (replicas only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// Whether the replica's link to the primary is up (replicas only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_up: Option<bool>,
}

impl RedisSpec {
    /// The `default` user's settings (enabled, every right, when absent).
    pub fn default_user(&self) -> DefaultUserSpec {
        self.auth
            .as_ref()
            .and_then(|a| a.default_user.clone())
            .unwrap_or_default()
    }

    /// The Secret named by `spec.auth.secretName`, if any.
    pub fn auth_secret_name(&self) -> Option<&str> {
        self.auth.as_ref()?.secret_name.as_deref()
    }

    /// `spec.mode`, or its default (Standalone).
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or_default()
    }

    /// `spec.engine`, or its default (Redis).
    pub fn engine(&self) -> Engine {
        self.engine.unwrap_or_default()
    }

    /// `spec.version`, or its default ([`DEFAULT_VERSION`]).
    pub fn version(&self) -> &str {
        self.version.as_deref().unwrap_or(DEFAULT_VERSION)
    }

    /// The number of instances, with the mode's default applied.
    pub fn desired_instances(&self) -> i32 {
        match (self.instances, self.mode()) {
            (Some(n), _) => n,
            (None, Mode::Standalone) => 1,
            (None, Mode::Replication) => 3,
            (None, Mode::Cluster) => DEFAULT_CLUSTER_INSTANCES,
        }
    }

    /// The number of shards: `spec.shards` in Cluster mode, 1 otherwise.
    pub fn desired_shards(&self) -> i32 {
        match self.mode() {
            Mode::Cluster => self.shards.unwrap_or(MIN_SHARDS),
            _ => 1,
        }
    }

    /// Every instance of every shard.
    pub fn total_instances(&self) -> i32 {
        self.desired_shards() * self.desired_instances()
    }

    /// The container image: `spec.image`, or the engine's image at `version`.
    pub fn image(&self) -> String {
        match &self.image {
            Some(image) => image.clone(),
            None => match self.engine() {
                Engine::Redis => format!("redis:{}", self.version()),
                Engine::Valkey => format!("valkey/valkey:{}", self.version()),
            },
        }
    }

    /// Persistence settings with defaults applied.
    pub fn persistence(&self) -> PersistenceSpec {
        self.persistence.clone().unwrap_or_default()
    }

    /// Monitoring settings with defaults applied.
    pub fn monitoring(&self) -> MonitoringSpec {
        self.monitoring.clone().unwrap_or_default()
    }

    /// The memory autopilot's policy, when it is enabled.
    pub fn memory_autopilot(&self) -> Option<&MemoryAutopilotSpec> {
        self.autopilot
            .as_ref()?
            .memory
            .as_ref()
            .filter(|m| m.enabled)
    }

    /// The shard autopilot's policy, when it is enabled.
    pub fn shard_autopilot(&self) -> Option<&ShardAutopilotSpec> {
        self.autopilot
            .as_ref()?
            .shards
            .as_ref()
            .filter(|s| s.enabled)
    }

    /// Failover settings with defaults applied.
    pub fn failover(&self) -> FailoverSpec {
        self.failover.clone().unwrap_or_default()
    }
}
