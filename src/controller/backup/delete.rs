//! Deleting a RedisBackup: the finalizer (applied only with
//! `deletionPolicy: Delete`) and the removal of the stored backup by a Job
//! of the agent (for a bucket as for a volume: the operator never reads the
//! credentials nor reaches the store itself).

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::{FINALIZER, FINALIZER_MANAGER, Pass, job};
use crate::controller::agent;
use crate::controller::error::Error;

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

    /// The stored files: one, or one per shard of a Cluster Redis.
    fn stored_keys(&self) -> Vec<String> {
        let st = self.status();
        if st.shards.is_empty() {
            st.key.into_iter().collect()
        } else {
            st.shards.into_iter().map(|s| s.key).collect()
        }
    }

    /// Removes the stored backup and its manifest (`deletionPolicy:
    /// Delete`) with a Job of the agent, like a backup is taken: the
    /// operator itself never reads the credentials nor reaches the store.
    /// True once the Job ended (or there is nothing to delete). A bucket
    /// whose Secret or endpoint is refused (see
    /// [`crate::controller::trust`]), or a failed Job, is reported and the
    /// RedisBackup goes anyway: what is stored then stays.
    pub(super) async fn delete_stored(&self) -> Result<bool, Error> {
        let Some(key) = self.status().key else {
            return Ok(true);
        };
        let target = self.target()?;
        let location = target.location(&key);
        let name = job::delete_job_name(&self.b);
        self.ctx.metrics.kube("get_job");
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let Some(j) = jobs.get_opt(&name).await? else {
            if let Some(s3) = &self.b.spec.target.s3
                && let Some(r) = self.refusal(s3).await?
            {
                let note = format!(
                    "could not delete {location}; it remains: {}: {}",
                    r.reason, r.message
                );
                self.event(EventType::Warning, "StoredBackupNotDeleted", note)
                    .await;
                return Ok(true);
            }
            self.apply(job::delete_job(&self.b, target, &self.stored_keys()))
                .await?;
            return Ok(false);
        };
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
