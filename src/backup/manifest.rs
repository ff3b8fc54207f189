//! The manifest stored next to each backup (`<key>.manifest.json`): what a
//! restore checks before it loads anything, and what a backup's status is
//! filled from. It names no credential.

use serde::{Deserialize, Serialize};

/// The manifest format this release writes.
pub const FORMAT: u32 = 1;

/// The manifest's object key for a backup stored under `key`.
pub fn key_for(key: &str) -> String {
    format!("{key}.manifest.json")
}

/// What a completed backup holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Manifest format ([`FORMAT`]).
    pub format: u32,
    /// Object key of the RDB file in the bucket.
    pub key: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
    /// Keys in the snapshot's first database section (its `RESIZEDB`
    /// record), and that database's number.
    pub keys: Option<u64>,
    /// The database `keys` counts.
    pub keys_db: Option<u64>,
    /// RDB format version (9 for Redis 6.2, 10 for 7.0, 11 for 7.2 and
    /// Valkey 7.2/8.x, 80 for Valkey 9.x): the oldest server that can load
    /// it is the one that writes this version.
    pub rdb_version: u32,
    /// `Redis` or `Valkey` (the file's magic).
    pub engine: String,
    /// The server version that wrote it (its `redis-ver`/`valkey-ver`).
    pub engine_version: Option<String>,
    /// The instance it was taken from.
    pub source: String,
    /// Replication id and offset of the snapshot.
    pub replid: Option<String>,
    /// Replication offset of the snapshot.
    pub offset: Option<i64>,
    /// A Cluster Redis's shard: its index ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<i32>,
    /// ... and the slot ranges it served, e.g. `0-5460`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<String>,
    /// When the snapshot was requested and when the upload completed (RFC 3339).
    pub started_at: String,
    /// When the upload completed.
    pub completed_at: String,
}
