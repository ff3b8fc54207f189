//! `RedisBackup`: one backup of a Redis, taken by a Job of the operator's
//! image and stored in an S3-compatible bucket; and the restore source a new
//! `Redis` bootstraps from (`spec.bootstrap.fromBackup`).

use kube::CustomResource;
use kube::KubeSchema;
use kube::core::Message;
use serde::{Deserialize, Serialize};

use super::DNS_SUBDOMAIN;

/// The longest RedisBackup name: it is the value of the `redpilot.io/backup`
/// label on its Job's pods, and label values are at most 63 characters.
pub const MAX_BACKUP_NAME: usize = 63;

/// CEL at a kind's root: a new object's `metadata.name` is at most `max`
/// characters (names cannot change, so only creation is checked).
pub(crate) fn name_length_rule(max: usize) -> String {
    format!("oldSelf.hasValue() || size(self.metadata.name) <= {max}")
}

/// The message of [`name_length_rule`]: the limit and why (`because`).
/// The API server's error names the object. A message expression with the
/// name's length is over the CEL cost budget at a kind's root (the name's
/// length is unbounded in the schema), so the message is fixed.
pub(crate) fn name_length_message(kind: &str, max: usize, because: &str) -> Message {
    Message::Message(format!(
        "metadata.name: a {kind} name is at most {max} characters ({because})"
    ))
}

/// A backup of one Redis, taken once. The spec cannot change after
/// creation (except `deletionPolicy`): a new backup is a new object.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "redpilot.io",
    version = "v1alpha1",
    kind = "RedisBackup",
    plural = "redisbackups",
    singular = "redisbackup",
    namespaced,
    shortname = "rbk",
    category = "redpilot",
    status = "RedisBackupStatus",
    validation = Rule::new(name_length_rule(MAX_BACKUP_NAME))
        .optional_old_self(true)
        .message(name_length_message("RedisBackup", MAX_BACKUP_NAME, "it is a label value on its Job's pods, and labels are at most 63 characters")),
    doc = "A backup of a Redis: a snapshot taken from a replica (the primary when there is none), stored with its manifest in an S3-compatible bucket.",
    printcolumn(name = "Redis", type_ = "string", json_path = ".spec.redis"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.sizeBytes"),
    printcolumn(name = "Keys", type_ = "integer", json_path = ".status.keys"),
    printcolumn(name = "Source", type_ = "string", json_path = ".status.source"),
    printcolumn(name = "Completed", type_ = "date", json_path = ".status.completedAt"),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        priority = 1
    ),
    printcolumn(
        name = "Location",
        type_ = "string",
        json_path = ".status.location",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.redis == oldSelf.redis")
        .message("spec.redis cannot change: create a new RedisBackup")
        .field_path(".redis"),
    validation = Rule::new("self.target == oldSelf.target")
        .message("spec.target cannot change: create a new RedisBackup")
        .field_path(".target"),
)]
#[serde(rename_all = "camelCase")]
pub struct RedisBackupSpec {
    /// The Redis to back up (in this namespace).
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message("spec.redis must be the name of a Redis (a DNS label)"))]
    pub redis: String,
    /// Where the backup is stored.
    pub target: BackupTarget,
    /// What deleting this RedisBackup does to the stored backup: `Retain`
    /// (default) keeps it, `Delete` removes the object and its manifest.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Seconds the backup Job may run before it is stopped and the backup
    /// fails with reason `DeadlineExceeded` (the Job's
    /// `activeDeadlineSeconds`; default 3600, 30 to 604800). Read when the
    /// Job is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 604800))]
    pub timeout_seconds: Option<i64>,
}

impl RedisBackupSpec {
    /// Default of `timeoutSeconds`: how long a backup Job may run (its
    /// `activeDeadlineSeconds`) before it is stopped and the backup fails.
    pub const DEFAULT_TIMEOUT_SECONDS: i64 = 3600;

    /// `timeoutSeconds` with its default applied.
    pub fn timeout_seconds(&self) -> i64 {
        self.timeout_seconds
            .unwrap_or(Self::DEFAULT_TIMEOUT_SECONDS)
    }
}

/// Where a backup is stored: an S3-compatible bucket or a volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.s3) != has(self.volume)")
        .message("spec.target: set exactly one of s3 (a bucket) and volume (a PersistentVolumeClaim)"),
)]
pub struct BackupTarget {
    /// An S3-compatible bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Location>,
    /// A PersistentVolumeClaim in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeLocation>,
}

/// A directory on a PersistentVolumeClaim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeLocation {
    /// The claim (in this namespace). With ReadWriteOnce, the backup Job
    /// must be able to run on the node that has it.
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// A directory on the volume (default: its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.split('/').exists(p, p == '..')").message("volume.path must be relative and must not contain '..'"))]
    pub path: Option<String>,
}

/// An S3-compatible bucket and the credentials to use it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Location {
    /// Endpoint URL, e.g. `https://s3.example.com:9000`; AWS S3 when absent.
    /// `http://` only for a store on a trusted network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^/?#\\\\s]+(/.*)?$')").message("s3.endpoint must be an http:// or https:// URL"))]
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    #[serde(default = "default_region")]
    #[schemars(length(min = 1, max = 64))]
    pub region: String,
    /// Bucket name.
    #[schemars(length(min = 3, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9][a-z0-9.-]*[a-z0-9]$')").message("bucket must be an S3 bucket name (lowercase letters, digits, '.' and '-')"))]
    pub bucket: String,
    /// Key prefix (a "folder") under which backups are stored; no leading
    /// `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.contains('//')").message("prefix must not start with '/' or contain '//'"))]
    pub prefix: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`); most self-hosted stores
    /// need them.
    #[serde(default)]
    pub path_style: bool,
    /// The Secret (in this namespace) holding the access key. It must carry
    /// the label `redpilot.io/allow-use: "true"` (only its owner can lend
    /// it to the agents), else the backup fails with
    /// `CredentialsNotAllowed`.
    pub credentials: S3Credentials,
}

fn default_region() -> String {
    "us-east-1".into()
}

/// Keys of the Secret holding an S3 access key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Key of the access key id (default `AWS_ACCESS_KEY_ID`).
    #[serde(default = "default_access_key_id_key")]
    pub access_key_id_key: String,
    /// Key of the secret access key (default `AWS_SECRET_ACCESS_KEY`).
    #[serde(default = "default_secret_access_key_key")]
    pub secret_access_key_key: String,
}

fn default_access_key_id_key() -> String {
    "AWS_ACCESS_KEY_ID".into()
}

fn default_secret_access_key_key() -> String {
    "AWS_SECRET_ACCESS_KEY".into()
}

/// What happens to the stored backup when its RedisBackup is deleted.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum DeletionPolicy {
    /// Keep the object in the bucket.
    #[default]
    Retain,
    /// Delete the object and its manifest from the bucket.
    Delete,
}

/// Lifecycle of a backup.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum BackupPhase {
    /// Accepted; the Job is not running yet.
    Pending,
    /// The Job is streaming the snapshot.
    Running,
    /// Stored and described by its manifest.
    Completed,
    /// Ended without a backup (see `reason` and `message`).
    Failed,
}

/// Observed state of a backup.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisBackupStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// When the Job was created (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the upload completed, or the backup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// Where the RDB file is: `s3://bucket/key` (its manifest is
    /// `<key>.manifest.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Object key of the RDB file in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Size of the stored RDB file in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Keys in the snapshot (its first database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,
    /// SHA-256 of the stored RDB file (lowercase hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Engine that wrote the snapshot (`Redis` or `Valkey`, from the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Server version that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    /// RDB format version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdb_version: Option<i64>,
    /// The instance (pod) it was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The source's replication offset when the operator checked it on
    /// its server and chose it: the agent reads only a snapshot that
    /// reached it (a source restarted empty since fails `SourceChanged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_offset: Option<i64>,
    /// Replication offset of the snapshot on that instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    /// The Job doing the work (not set for a Cluster Redis: each shard has
    /// its own, in `shards`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// A Cluster Redis: one RDB file per shard, each taken from a replica of
    /// the shard where one serves, in parallel. `key` is then the prefix
    /// every shard's key shares, and `sizeBytes` and `keys` are the sums.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<BackupShardStatus>,
    /// What the backed-up Redis was when the backup started: a restore
    /// compares it with the Redis it fills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<BackupOrigin>,
    /// Why it failed, as a bounded category: RedisNotFound,
    /// CredentialsNotFound, ClaimNotFound, SourceFailed, SourceChanged,
    /// StoreAccessDenied,
    /// StoreNotFound, StoreFailed, InvalidRequest, DeadlineExceeded,
    /// ImagePullFailed, PodConfigInvalid, Unschedulable, JobNotOwned,
    /// JobRejected, ManifestMismatch, JobFailed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened, in words (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One shard's part of a backup of a Cluster Redis (`status.shards[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupShardStatus {
    /// The shard's index.
    pub index: i32,
    /// The slot ranges the shard served when the backup started, e.g.
    /// `0-5461` (also in the shard's manifest).
    pub slots: String,
    /// The instance (pod) its snapshot is taken from.
    pub source: String,
    /// Its replication offset when the operator checked and chose it (see
    /// `sourceOffset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_offset: Option<i64>,
    /// Object key of its RDB file (its manifest is `<key>.manifest.json`).
    pub key: String,
    /// The Job taking it.
    pub job: String,
    /// Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// Size of the stored file in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Keys in the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,
    /// SHA-256 of the stored file (lowercase hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The backed-up Redis's shape when its backup started (`status.origin`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupOrigin {
    /// Its mode.
    pub mode: super::Mode,
    /// Its engine.
    pub engine: super::Engine,
    /// Its `spec.version`.
    pub version: String,
    /// Its `spec.image`, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its shard count (Cluster mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<i32>,
    /// Instances (per shard in Cluster mode).
    pub instances: i32,
    /// Its `spec.config`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub config: std::collections::BTreeMap<String, String>,
}

impl BackupOrigin {
    /// The shape of `spec` now.
    pub fn of(spec: &super::RedisSpec) -> Self {
        BackupOrigin {
            mode: spec.mode(),
            engine: spec.engine(),
            version: spec.version().to_string(),
            image: spec.image.clone(),
            shards: spec.shards,
            instances: spec.desired_instances(),
            config: spec.config.clone(),
        }
    }
}

/// The backup a new Redis is loaded from before it reports Ready.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.backup) != ((has(self.s3) || has(self.volume)) && has(self.key))")
        .message("spec.bootstrap.fromBackup: set either backup (a RedisBackup's name) or key with s3 or volume (a backup stored elsewhere)"),
    validation = Rule::new("!has(self.pointInTime) || !has(self.backup)")
        .message("spec.bootstrap.fromBackup.pointInTime: restore to a time from an archive (s3 or volume, with key its root: the source Redis's status.archive.key), not from a RedisBackup"),
    validation = Rule::new("!has(self.pointInTime) || self.pointInTime.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$')")
        .message("spec.bootstrap.fromBackup.pointInTime must be an RFC 3339 time, e.g. 2026-12-07T10:11:12Z or 2026-12-07T10:11:12.250+01:00"),
    validation = Rule::new("!(has(self.s3) && has(self.volume))")
        .message("spec.bootstrap.fromBackup: set s3 or volume, not both"),
    validation = Rule::new("has(self.key) == (has(self.s3) || has(self.volume))")
        .message("spec.bootstrap.fromBackup: key goes with s3 or volume"),
)]
pub struct FromBackup {
    /// A Completed RedisBackup in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub backup: Option<String>,
    /// A bucket holding a backup (e.g. from another cluster) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Location>,
    /// ... or a volume holding one (mounted read-only by every instance's
    /// pod, the first restoring from it: with ReadWriteOnce all instances
    /// must run on the node that has it; ReadOnlyMany or ReadWriteMany have
    /// no such limit) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeLocation>,
    /// ... and the object key of its RDB file (its manifest is
    /// `<key>.manifest.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub key: Option<String>,
    /// Restore to this time (RFC 3339) from a continuous archive
    /// (`spec.archive` of another Redis): `key` is then the archive's root
    /// (that Redis's `status.archive.key`). The data is what the primary
    /// held at the archive's last checkpoint at or before the time
    /// (checkpoints every 100 ms): every write it executed before that
    /// checkpoint, none after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 20, max = 40))]
    pub point_in_time: Option<String>,
}

/// How a new Redis gets its first data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Load a backup into the first instance before it serves; the others
    /// sync from it.
    pub from_backup: FromBackup,
}

/// What the bootstrap of a Redis from a backup resolved to and how it went.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapStatus {
    /// The bucket and credentials the backup is fetched with (fixed when
    /// first resolved, so deleting the RedisBackup later changes nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Location>,
    /// Or the volume it is read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeLocation>,
    /// Object key of the RDB file.
    pub key: String,
    /// `s3://bucket/key`.
    pub location: String,
    /// True once the first primary served the restored data.
    #[serde(default)]
    pub done: bool,
    /// SHA-256 of the dump the first instance loaded, as its restore
    /// container reported it (checked against the backup's manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A Cluster Redis: each shard's file, loaded into the shard's first
    /// instance (`<name>-s<i>-0`), which then serves the shard's slots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<BootstrapShard>,
    /// The backed-up Redis's shape (the RedisBackup's `status.origin`):
    /// what the spec left unset was taken from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<BackupOrigin>,
    /// A restore to a point in time: the time asked for ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<String>,
    /// ... the checkpoint the data was restored to (every write the primary
    /// executed before it, none after) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_to: Option<String>,
    /// ... and the stream's commands applied after the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<i64>,
}

/// One shard of a Cluster Redis's bootstrap (`status.bootstrap.shards[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapShard {
    /// The shard's index.
    pub index: i32,
    /// Object key of its RDB file.
    pub key: String,
    /// The slot ranges it holds.
    pub slots: String,
}
