//! Taking one backup: snapshot → SHA-256 → multipart upload → manifest.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::manifest::{self, Manifest};
use crate::redis::rdb::{RdbFormat, RdbOptions, stream_rdb};
use crate::redis::{ConnectOptions, Endpoint};

/// Bytes buffered before a part is uploaded (S3 wants at least 5 MiB per
/// part but the last).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploaded at once. With one part filling, the upload holds at most
/// `PART_SIZE * (UPLOADS_IN_FLIGHT + 1)` bytes (24 MiB), whatever the size
/// of the dataset.
pub const UPLOADS_IN_FLIGHT: usize = 2;

/// Why a backup failed. Messages name the cause, never a credential.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The server could not be read (unreachable, refused, died mid-stream).
    #[error("reading the snapshot from {source_name}: {error}")]
    Source {
        /// The instance.
        source_name: String,
        /// What happened.
        error: crate::redis::Error,
    },
    /// The store refused or could not be reached.
    #[error("{action} {location}: {}", describe(error))]
    Store {
        /// What was being done.
        action: &'static str,
        /// `s3://bucket/key`.
        location: String,
        /// What happened.
        error: object_store::Error,
    },
    /// The instance is behind where it was when the operator checked and
    /// chose it (it restarted empty since): reading it would store a
    /// snapshot missing what the backup was asked to hold; running again
    /// reads the same instance.
    #[error("reading the snapshot from {source_name}: {message}")]
    SourceChanged {
        /// The instance.
        source_name: String,
        /// What differed.
        message: String,
    },
    /// The request itself is wrong (a malformed endpoint, a missing value).
    #[error("invalid backup request: {0}")]
    Invalid(String),
    /// A restore refused what it fetched.
    #[error("{0}")]
    Refused(#[from] Refused),
    /// The archive cannot restore the time asked for (outside its window,
    /// or a hole in it).
    #[error("{0}")]
    NotRestorable(String),
}

impl BackupError {
    /// Whether running again may succeed (a server or store that was down,
    /// a stream cut short); wrong credentials, a missing bucket or object, a
    /// bad request or a file that cannot be loaded fail the same way again.
    pub fn retryable(&self) -> bool {
        matches!(self.category(), "SourceFailed" | "StoreFailed")
    }

    /// A bounded category, for metrics, events and the status reason.
    pub fn category(&self) -> &'static str {
        match self {
            BackupError::Source { .. } => "SourceFailed",
            BackupError::SourceChanged { .. } => "SourceChanged",
            BackupError::Store { error, .. } => match error {
                object_store::Error::Unauthenticated { .. }
                | object_store::Error::PermissionDenied { .. } => "StoreAccessDenied",
                object_store::Error::NotFound { .. } => "StoreNotFound",
                _ => "StoreFailed",
            },
            BackupError::Invalid(_) => "InvalidRequest",
            BackupError::Refused(Refused::TooNew { .. }) => "IncompatibleVersion",
            BackupError::Refused(Refused::Mismatch(_)) => "ChecksumMismatch",
            BackupError::NotRestorable(_) => "NotRestorable",
        }
    }
}

/// The server to back up.
#[derive(Debug, Clone)]
pub struct Source {
    /// Its name in the manifest (the pod).
    pub name: String,
    /// Its address.
    pub endpoint: Endpoint,
    /// How to connect (password, TLS, timeouts).
    pub options: ConnectOptions,
    /// The shard of a Cluster Redis it serves, and its slot ranges.
    pub shard: Option<(i32, String)>,
    /// Its replication offset when the operator checked and chose it
    /// ([`RdbOptions::min_offset`]).
    pub min_offset: Option<i64>,
}

/// Hashes what goes through to the upload, and keeps the upload's own
/// error (the snapshot stream only sees that a write failed).
struct Hashing<W> {
    inner: W,
    sha: Sha256,
    write_error: Option<std::io::Error>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Hashing<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        match std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf)) {
            Ok(n) => {
                this.sha.update(&buf[..n]);
                Poll::Ready(Ok(n))
            }
            Err(e) => {
                let told = std::io::Error::new(e.kind(), e.to_string());
                this.write_error = Some(e);
                Poll::Ready(Err(told))
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A snapshot's upload under its final key: hashed as it goes, completed
/// (and its manifest written) or aborted, so no partial object is ever
/// left under the key.
pub struct UploadWriter {
    out: Hashing<BufWriter>,
    store: Arc<dyn ObjectStore>,
    key: String,
}

impl UploadWriter {
    /// An upload to `key` (nothing is sent before the first part fills).
    pub fn new(store: Arc<dyn ObjectStore>, key: &str) -> Result<Self, BackupError> {
        let path =
            Path::parse(key).map_err(|e| BackupError::Invalid(format!("key {key:?}: {e}")))?;
        let upload = BufWriter::with_capacity(store.clone(), path, PART_SIZE)
            .with_max_concurrency(UPLOADS_IN_FLIGHT);
        Ok(Self {
            out: Hashing {
                inner: upload,
                sha: Sha256::new(),
                write_error: None,
            },
            store,
            key: key.to_string(),
        })
    }

    /// Drops the upload: nothing appears under the key.
    pub async fn abort(mut self) {
        let _ = self.out.inner.abort().await;
    }

    /// The store's error behind a failed write, if that is what failed.
    fn take_write_error(&mut self, location: &str) -> Option<BackupError> {
        let at = format!("{location}/{}", self.key);
        self.out
            .write_error
            .take()
            .map(|w| store_error("uploading", at, w))
    }

    /// Completes the upload and writes the manifest of the snapshot
    /// described by `header`, `size`, `replid` and `offset`.
    #[allow(clippy::too_many_arguments)]
    pub async fn complete(
        mut self,
        source: &Source,
        location: &str,
        header: &crate::redis::rdb::RdbHeader,
        size: u64,
        replid: Option<String>,
        offset: Option<i64>,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Result<Manifest, BackupError> {
        let at = |k: &str| format!("{location}/{k}");
        // A completion that fails leaves an unfinished multipart upload,
        // which no reader sees as an object.
        if let Err(e) = self.out.shutdown().await {
            return Err(store_error("completing the upload of", at(&self.key), e));
        }
        let sha256 = hex(&self.out.sha.clone().finalize());
        let m = Manifest {
            format: manifest::FORMAT,
            key: self.key.clone(),
            size_bytes: size,
            sha256,
            keys: header.first_db.map(|(_, k)| k),
            keys_db: header.first_db.map(|(db, _)| db),
            rdb_version: header.version,
            engine: match header.format {
                RdbFormat::Redis => "Redis",
                RdbFormat::Valkey => "Valkey",
            }
            .to_string(),
            engine_version: header
                .aux
                .get("valkey-ver")
                .or_else(|| header.aux.get("redis-ver"))
                .cloned(),
            source: source.name.clone(),
            replid,
            offset,
            shard: source.shard.as_ref().map(|(i, _)| *i),
            slots: source
                .shard
                .as_ref()
                .map(|(_, s)| s.clone())
                .filter(|s| !s.is_empty()),
            started_at: started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            completed_at: now(),
        };
        let body = serde_json::to_vec_pretty(&m)
            .map_err(|e| BackupError::Invalid(format!("encoding the manifest: {e}")))?;
        let mkey = manifest::key_for(&self.key);
        let mpath =
            Path::parse(&mkey).map_err(|e| BackupError::Invalid(format!("key {mkey:?}: {e}")))?;
        self.store
            .put(&mpath, PutPayload::from(body))
            .await
            .map_err(|error| BackupError::Store {
                action: "writing the manifest",
                location: at(&mkey),
                error,
            })?;
        Ok(m)
    }
}

impl AsyncWrite for UploadWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.out).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.out).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.out).poll_shutdown(cx)
    }
}

/// Streams a snapshot of `source` to `key` in `store`, then writes its
/// manifest to `<key>.manifest.json`. `location` is how the target is named
/// in messages (`s3://bucket`).
pub async fn backup(
    source: &Source,
    store: Arc<dyn ObjectStore>,
    location: &str,
    key: &str,
) -> Result<Manifest, BackupError> {
    let started = chrono::Utc::now();
    let mut out = UploadWriter::new(store, key)?;
    let rdb = RdbOptions {
        min_offset: source.min_offset,
        ..RdbOptions::default()
    };
    let streamed = stream_rdb(&source.endpoint, &source.options, &rdb, &mut out).await;
    let report = match streamed {
        Ok(r) => r,
        Err(e) => {
            // A failed write to the store surfaces as an I/O error of the
            // stream; name the store when that is what failed.
            let failed = match out.take_write_error(location) {
                Some(w) => w,
                None if source.min_offset.is_some()
                    && e.category() == crate::redis::ErrorCategory::State =>
                {
                    BackupError::SourceChanged {
                        source_name: source.name.clone(),
                        message: e.to_string(),
                    }
                }
                None => BackupError::Source {
                    source_name: source.name.clone(),
                    error: e,
                },
            };
            // The upload never completes: nothing appears under the key.
            out.abort().await;
            return Err(failed);
        }
    };
    let header = crate::redis::rdb::RdbHeader {
        format: report.format,
        version: report.rdb_version,
        aux: report.aux.clone(),
        first_db: report.first_db,
    };
    out.complete(
        source,
        location,
        &header,
        report.size,
        report.replid.clone(),
        report.offset,
        started,
    )
    .await
}

/// Reads the manifest of the backup stored under `key`.
pub async fn read_manifest(
    store: &dyn ObjectStore,
    location: &str,
    key: &str,
) -> Result<Manifest, BackupError> {
    let mkey = manifest::key_for(key);
    let at = format!("{location}/{mkey}");
    let mpath =
        Path::parse(&mkey).map_err(|e| BackupError::Invalid(format!("key {mkey:?}: {e}")))?;
    let bytes = async { store.get(&mpath).await?.bytes().await }
        .await
        .map_err(|error| BackupError::Store {
            action: "reading the manifest",
            location: at.clone(),
            error,
        })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| BackupError::Invalid(format!("the manifest {at} is not valid: {e}")))
}

/// The cause in a few words, for the S3 error codes users hit.
/// The cause in words, then the store's own text without the response
/// body (an S3 error document repeats the request, the access key id
/// included), within 300 characters.
fn describe(e: &object_store::Error) -> String {
    let text = e.to_string();
    let text = match text.find("<?xml").or_else(|| text.find("<Error>")) {
        Some(i) => text[..i].trim_end().trim_end_matches(':').to_string(),
        None => text,
    };
    let mut detail: String = text.chars().take(300).collect();
    if detail.len() < text.len() {
        detail.push('…');
    }
    format!("{}{detail}", explain(e))
}

fn explain(e: &object_store::Error) -> &'static str {
    let text = e.to_string();
    let has = |code: &str| text.contains(&format!("<Code>{code}</Code>"));
    if has("NoSuchBucket") {
        "the bucket does not exist; "
    } else if has("SignatureDoesNotMatch") || has("InvalidAccessKeyId") {
        "the access key id or secret access key is wrong; "
    } else if has("AccessDenied") {
        "the credentials may not write there; "
    } else if text.contains("error sending request") {
        "the endpoint cannot be reached; "
    } else {
        ""
    }
}

/// An I/O error of the upload, as the store error it wraps when it is one.
fn store_error(action: &'static str, location: String, e: std::io::Error) -> BackupError {
    let error = match e.into_inner() {
        Some(inner) => match inner.downcast::<object_store::Error>() {
            Ok(os) => *os,
            Err(other) => object_store::Error::Generic {
                store: "S3",
                source: other,
            },
        },
        None => object_store::Error::Generic {
            store: "S3",
            source: "the upload failed".into(),
        },
    };
    BackupError::Store {
        action,
        location,
        error,
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Why the fetched bytes cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The backup was written by a server whose format the one restoring
    /// does not read.
    #[error(
        "the backup is {engine} RDB version {have} (written by {version}); a {loader} server that writes RDB {max} cannot load it"
    )]
    TooNew {
        /// The engine of the server that would load it.
        loader: &'static str,
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
