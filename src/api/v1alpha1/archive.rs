//! `spec.archive`: the continuous archive of a Redis's writes, which lets a
//! new Redis be restored to any point in time inside its window
//! (`spec.bootstrap.fromBackup.pointInTime`).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::BackupTarget;

/// Archive every write as it happens, next to periodic snapshots: the
/// `archive` sidecar of one instance ships the replication stream to the
/// target, cut into segments every `intervalSeconds`, with checkpoints
/// every 100 ms that tie the primary's clock to the stream. A Redis with
/// replicas is archived from a replica (the archive never counts toward
/// the primary's write fence); one without, from its primary. Adding or
/// removing it rolls the pods (a sidecar is added or removed).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveSpec {
    /// Where the archive is kept: a bucket (its root is
    /// `<prefix>/<namespace>/<name>/archive`) or a volume every instance
    /// mounts (with ReadWriteOnce, all instances on one node).
    pub target: BackupTarget,
    /// Seconds between the segments shipped (default 1, 1 to 60): the
    /// archive's delay behind an acknowledged write, plus the upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub interval_seconds: Option<i32>,
    /// Hours between snapshots (bases) taken within a run (default 24, 1
    /// to 720): a restore loads the newest base before its time, then the
    /// stream from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 720))]
    pub base_interval_hours: Option<i32>,
    /// Days of history kept restorable (default 7, 1 to 3650): what no
    /// restore inside them needs is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3650))]
    pub retention_days: Option<i32>,
}

impl ArchiveSpec {
    /// `intervalSeconds` with its default.
    pub fn interval_seconds(&self) -> i32 {
        self.interval_seconds.unwrap_or(1)
    }

    /// `baseIntervalHours` with its default.
    pub fn base_interval_hours(&self) -> i32 {
        self.base_interval_hours.unwrap_or(24)
    }

    /// `retentionDays` with its default.
    pub fn retention_days(&self) -> i32 {
        self.retention_days.unwrap_or(7)
    }
}

/// What the archive holds (`status.archive`), from the archiving sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveStatus {
    /// `s3://bucket/<root>` or `pvc://claim/<root>`.
    pub location: String,
    /// The archive's root key (what `bootstrap.fromBackup.key` names to
    /// restore from it).
    pub key: String,
    /// The instance whose sidecar archives now (per shard in Cluster mode,
    /// comma-separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiver: Option<String>,
    /// The earliest time a restore can reach (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest: Option<String>,
    /// The newest time a restore can reach: the newest checkpoint stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest: Option<String>,
    /// Seconds between the newest checkpoint stored and when it was
    /// observed (the recovery point a loss of every instance would cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
    /// Bytes the archive holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Times the archive cannot restore exactly (`<from>/<to>`, RFC 3339):
    /// the stream could not be continued there (a full resync began a new
    /// run); a restore to a time more than a second inside one is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holes: Vec<String>,
    /// Why archiving is not going on, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When this was observed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<String>,
}
