//! Fetching a backup for a server to load: the manifest is read and checked
//! first (the RDB version against what the server reads), then the object
//! is streamed to `<dest>.partial` while it is hashed, and renamed to `dest`
//! only when its size and SHA-256 match the manifest. A restore that fails
//! leaves no file at `dest`, so a server never starts from a bad dump.

use std::path::Path;

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::agent::{BackupError, Refused, hex, read_manifest};
use super::manifest::Manifest;

/// The server that will load a restored file: its engine and the newest
/// RDB version it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loader {
    /// True for Valkey, false for Redis.
    pub valkey: bool,
    /// The RDB version the server writes (`REDIS0011` → 11, `VALKEY080` → 80).
    pub max_rdb_version: u32,
}

/// The last RDB version with the `REDIS` magic that Valkey reads: Redis 7.4
/// moved to 12, a format Valkey never adopted.
pub const VALKEY_READS_REDIS_UP_TO: u32 = 11;

impl Loader {
    /// Whether this server loads a file of `magic` (`Redis` or `Valkey`,
    /// the manifest's `engine`) at `version`. Redis reads only its own
    /// magic; Valkey reads its own and Redis files up to RDB 11.
    pub fn reads(&self, magic: &str, version: u32) -> bool {
        match (self.valkey, magic.eq_ignore_ascii_case("valkey")) {
            (false, false) => version <= self.max_rdb_version,
            (false, true) => false,
            (true, true) => version <= self.max_rdb_version,
            (true, false) => version <= self.max_rdb_version.min(VALKEY_READS_REDIS_UP_TO),
        }
    }
}

/// Fetches the backup stored under `key` into `dest`, after checking that
/// `loader` (when known) can load it.
pub async fn restore(
    store: &dyn ObjectStore,
    location: &str,
    key: &str,
    dest: &Path,
    loader: Option<Loader>,
) -> Result<Manifest, BackupError> {
    let m = read_manifest(store, location, key).await?;
    if let Some(l) = loader
        && !l.reads(&m.engine, m.rdb_version)
    {
        return Err(BackupError::Refused(Refused::TooNew {
            have: m.rdb_version,
            max: l.max_rdb_version,
            engine: m.engine.clone(),
            version: m.engine_version.clone().unwrap_or_else(|| "?".into()),
            loader: if l.valkey { "Valkey" } else { "Redis" },
        }));
    }
    let at = format!("{location}/{key}");
    let path =
        ObjectPath::parse(key).map_err(|e| BackupError::Invalid(format!("key {key:?}: {e}")))?;
    let store_err = |action: &'static str| {
        let at = at.clone();
        move |error| BackupError::Store {
            action,
            location: at,
            error,
        }
    };
    let mut partial = dest.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let local = |e: std::io::Error, what: &str| {
        BackupError::Invalid(format!("{what} {}: {e}", partial.display()))
    };
    let result = async {
        let mut stream = store
            .get(&path)
            .await
            .map_err(store_err("reading"))?
            .into_stream();
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| local(e, "creating"))?;
        let mut sha = Sha256::new();
        let mut size: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(store_err("reading"))?;
            sha.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk)
                .await
                .map_err(|e| local(e, "writing"))?;
        }
        file.sync_all().await.map_err(|e| local(e, "syncing"))?;
        let sha256 = hex(&sha.finalize());
        if size != m.size_bytes || sha256 != m.sha256 {
            return Err(BackupError::Refused(Refused::Mismatch(format!(
                "{at} is {size} bytes with SHA-256 {sha256}; its manifest says {} bytes with {}",
                m.size_bytes, m.sha256
            ))));
        }
        tokio::fs::rename(&partial, dest)
            .await
            .map_err(|e| local(e, "renaming"))?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(e);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_server_loads_which_file() {
        let redis70 = Loader {
            valkey: false,
            max_rdb_version: 10,
        };
        let redis74 = Loader {
            valkey: false,
            max_rdb_version: 12,
        };
        let valkey81 = Loader {
            valkey: true,
            max_rdb_version: 11,
        };
        let valkey91 = Loader {
            valkey: true,
            max_rdb_version: 80,
        };
        assert!(redis70.reads("Redis", 9) && redis70.reads("Redis", 10));
        assert!(!redis70.reads("Redis", 11));
        assert!(redis74.reads("Redis", 12));
        assert!(
            !redis74.reads("Valkey", 80),
            "Redis never reads a Valkey file"
        );
        assert!(valkey81.reads("Redis", 11) && !valkey81.reads("Valkey", 80));
        assert!(valkey91.reads("Valkey", 80) && valkey91.reads("Redis", 11));
        assert!(
            !valkey91.reads("Redis", 12),
            "Redis 7.4's RDB 12 is not Valkey's"
        );
    }
}
