//! Deleting a RedisBackup: the finalizer (applied only with
//! `deletionPolicy: Delete`) and the removal of the stored backup — by the
//! operator for a bucket, by a Job mounting the claim for a volume.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::{FINALIZER, FINALIZER_MANAGER, Pass, job};
use crate::controller::Error;
use crate::controller::agent;

impl Pass {
    /// The finalizer, added or removed with server-side apply (this
    /// operator's field manager owns only that entry).
    pub(super) async fn set_finalizer(&self, on: bool) -> Result<(), Error> {
        let finalizers: Vec<&str> = if on { vec![FINALIZER] } else { vec![] };
        let patch = serde_json::json!({
            "apiVersion": "redpilot.io/v1alpha1",
            "kind": "RedisBackup",
            "metadata": {"name": self.name, "finalizers": finalizers},
        });
        self.ctx.metrics.kube("apply_redisbackup");
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FINALIZER_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        Ok(())
    }

    /// Removes the stored backup and its manifest (`deletionPolicy:
    /// Delete`). The operator reads the credentials for this only; a
    /// missing object counts as deleted.
    /// The stored files: one, or one per shard of a Cluster Redis.
    fn stored_keys(&self) -> Vec<String> {
        let st = self.status();
        if st.shards.is_empty() {
            st.key.into_iter().collect()
        } else {
            st.shards.into_iter().map(|s| s.key).collect()
        }
    }

    pub(super) async fn delete_stored(&self) -> Result<(), Error> {
        let keys = self.stored_keys();
        let Some(key) = self.status().key else {
            return Ok(());
        };
        let Some(s3) = &self.b.spec.target.s3 else {
            return Ok(());
        };
        let c = &s3.credentials;
        self.ctx.metrics.kube("get_secret");
        let secret: Option<Secret> = Api::namespaced(self.ctx.client.clone(), &self.ns)
            .get_opt(&c.secret_name)
            .await?;
        let value = |k: &str| {
            secret
                .as_ref()
                .and_then(|s| s.data.as_ref())
                .and_then(|d| d.get(k))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        };
        let (Some(id), Some(secret_key)) =
            (value(&c.access_key_id_key), value(&c.secret_access_key_key))
        else {
            let msg = format!(
                "cannot delete the stored backup: Secret {} or its keys are missing",
                c.secret_name
            );
            self.event(EventType::Warning, "StoredBackupNotDeleted", msg.clone())
                .await;
            return Err(Error::Secret {
                name: c.secret_name.clone(),
                reason: msg,
            });
        };
        let target = crate::backup::S3Target {
            endpoint: s3.endpoint.clone(),
            region: s3.region.clone(),
            bucket: s3.bucket.clone(),
            path_style: s3.path_style,
            access_key_id: id,
            secret_access_key: secret_key.into(),
            retries: 2,
            retry_timeout: Duration::from_secs(20),
        };
        let result = async {
            let store = crate::backup::open(&target)?;
            for k in &keys {
                crate::backup::store::delete(store.as_ref(), &target.location(k), k).await?;
            }
            Ok::<(), crate::backup::BackupError>(())
        }
        .await;
        match result {
            Ok(()) => {
                let note = format!("deleted {} and its manifest", target.location(&key));
                self.event(EventType::Normal, "StoredBackupDeleted", note)
                    .await;
                Ok(())
            }
            Err(e) => {
                let msg = format!("deleting {}: {e}", target.location(&key));
                self.event(EventType::Warning, "StoredBackupNotDeleted", msg.clone())
                    .await;
                Err(Error::Backup {
                    category: e.category(),
                    message: msg,
                })
            }
        }
    }

    /// A backup on a volume is deleted by a Job that mounts it (the
    /// operator never mounts a volume). True once the Job ended; a failure
    /// is reported and the RedisBackup goes anyway.
    pub(super) async fn delete_on_volume(&self) -> Result<bool, Error> {
        let Some(key) = self.status().key else {
            return Ok(true);
        };
        let name = job::delete_job_name(&self.b);
        self.ctx.metrics.kube("get_job");
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let Some(j) = jobs.get_opt(&name).await? else {
            self.apply(job::delete_job(
                &self.b,
                self.target()?,
                &self.stored_keys(),
            ))
            .await?;
            return Ok(false);
        };
        let location = self.target()?.location(&key);
        let ended = |t: &str| job::condition(&j, t).is_some();
        if ended("Complete") {
            let note = format!("deleted {location} and its manifest");
            self.event(EventType::Normal, "StoredBackupDeleted", note)
                .await;
            return Ok(true);
        }
        if ended("Failed") {
            let why = match self.agent_outcome(&name, false).await? {
                Some(agent::Outcome::Failed { message, .. }) => message,
                _ => "the delete Job failed".into(),
            };
            let note = format!("could not delete {location}; it may remain: {why}");
            self.event(EventType::Warning, "StoredBackupNotDeleted", note)
                .await;
            return Ok(true);
        }
        Ok(false)
    }
}
