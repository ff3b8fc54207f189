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

use super::agent::{BackupError, hex, read_manifest};
use super::manifest::Manifest;

/// Why the fetched bytes cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The backup was written by a newer server than the one restoring.
    #[error("the backup is RDB version {have} ({engine} {version}); this server reads up to {max}")]
    TooNew {
        /// RDB version of the backup.
        have: u32,
        /// Newest the server reads.
        max: u32,
        /// Engine that wrote it.
        engine: String,
        /// Its version.
        version: String,
    },
    /// The bytes are not what the manifest describes.
    #[error("the object does not match its manifest: {0}")]
    Mismatch(String),
}

/// Fetches the backup stored under `key` into `dest`. `max_rdb_version` is
/// the newest RDB version the server that will load it reads (unchecked
/// when `None`).
pub async fn restore(
    store: &dyn ObjectStore,
    location: &str,
    key: &str,
    dest: &Path,
    max_rdb_version: Option<u32>,
) -> Result<Manifest, BackupError> {
    let m = read_manifest(store, location, key).await?;
    if let Some(max) = max_rdb_version
        && m.rdb_version > max
    {
        return Err(BackupError::Refused(Refused::TooNew {
            have: m.rdb_version,
            max,
            engine: m.engine.clone(),
            version: m.engine_version.clone().unwrap_or_else(|| "?".into()),
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
