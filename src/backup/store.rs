//! The S3-compatible object store a backup goes to.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, RetryConfig};

use super::agent::BackupError;
use crate::redis::Secret;

/// Where backups are stored, and the credentials to store them with.
#[derive(Debug, Clone)]
pub struct S3Target {
    /// Endpoint URL (`https://…`, or `http://…` for a store on a trusted
    /// network); AWS S3 when absent.
    pub endpoint: Option<String>,
    /// Region (`us-east-1` for most S3-compatible stores).
    pub region: String,
    /// Bucket.
    pub bucket: String,
    /// Path-style requests (`endpoint/bucket/key`) instead of virtual-hosted
    /// style (`bucket.endpoint/key`); most self-hosted stores need them.
    pub path_style: bool,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key (never logged).
    pub secret_access_key: Secret,
    /// Attempts after a failed request that may succeed when retried
    /// (timeouts, 5xx, throttling), with exponential backoff.
    pub retries: usize,
    /// No retry starts later than this after the first attempt.
    pub retry_timeout: Duration,
}

impl S3Target {
    /// `s3://bucket/key`.
    pub fn location(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, key)
    }
}

/// A client for `target` (no request is made yet).
pub fn open(target: &S3Target) -> Result<Arc<dyn ObjectStore>, BackupError> {
    let mut b = AmazonS3Builder::new()
        .with_region(&target.region)
        .with_bucket_name(&target.bucket)
        .with_access_key_id(&target.access_key_id)
        .with_secret_access_key(target.secret_access_key.expose())
        .with_virtual_hosted_style_request(!target.path_style)
        .with_retry(RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: target.retries,
            retry_timeout: target.retry_timeout,
        });
    if let Some(endpoint) = &target.endpoint {
        b = b
            .with_endpoint(endpoint)
            .with_allow_http(endpoint.starts_with("http://"));
    }
    let store = b
        .build()
        .map_err(|e| BackupError::Invalid(format!("the S3 target: {e}")))?;
    Ok(Arc::new(store))
}

/// Deletes the backup stored under `key` and its manifest; one that is
/// already gone counts as deleted.
pub async fn delete(store: &dyn ObjectStore, location: &str, key: &str) -> Result<(), BackupError> {
    use object_store::ObjectStoreExt;
    for k in [super::manifest::key_for(key), key.to_string()] {
        let path = object_store::path::Path::parse(&k)
            .map_err(|e| BackupError::Invalid(format!("key {k:?}: {e}")))?;
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => {
                return Err(BackupError::Store {
                    action: "deleting",
                    location: location.to_string(),
                    error,
                });
            }
        }
    }
    Ok(())
}
