//! How one backup's status is written: completed (from the agent's
//! manifest), failed (a bounded reason and a message naming the cause,
//! never a secret), pending (what it waits for); each with its metric and
//! event.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::Pass;
use crate::api::v1alpha1::{BackupPhase, RedisBackupStatus};
use crate::controller::error::Error;

impl Pass {
    pub(super) async fn complete(
        &mut self,
        st: RedisBackupStatus,
        m: crate::backup::Manifest,
    ) -> Result<Action, Error> {
        let done = RedisBackupStatus {
            phase: Some(BackupPhase::Completed),
            completed_at: Some(m.completed_at.clone()),
            size_bytes: i64::try_from(m.size_bytes).ok(),
            keys: m.keys.and_then(|k| i64::try_from(k).ok()),
            sha256: Some(m.sha256.clone()),
            engine: Some(m.engine.clone()),
            engine_version: m.engine_version.clone(),
            rdb_version: Some(i64::from(m.rdb_version)),
            offset: m.offset,
            reason: None,
            message: None,
            ..st
        };
        let note = format!(
            "stored {} bytes ({} keys) from {} at {}",
            m.size_bytes,
            m.keys.map(|k| k.to_string()).unwrap_or_else(|| "?".into()),
            m.source,
            done.location.clone().unwrap_or_default()
        );
        self.completed(&done, note).await
    }

    /// Records a completed backup: its status, the metric, the event.
    pub(super) async fn completed(
        &mut self,
        done: &RedisBackupStatus,
        note: String,
    ) -> Result<Action, Error> {
        self.write_status(done).await?;
        self.ctx
            .metrics
            .backups
            .with_label_values(&["completed"])
            .inc();
        self.event(EventType::Normal, "BackupCompleted", note).await;
        Ok(Action::await_change())
    }

    pub(super) async fn fail(
        &mut self,
        reason: &'static str,
        message: String,
    ) -> Result<Action, Error> {
        let st = RedisBackupStatus {
            phase: Some(BackupPhase::Failed),
            completed_at: Some(crate::controller::base::rfc3339(chrono::Utc::now())),
            reason: Some(reason.into()),
            message: Some(message.clone()),
            ..self.status()
        };
        self.write_status(&st).await?;
        self.ctx
            .metrics
            .backups
            .with_label_values(&["failed"])
            .inc();
        self.event(
            EventType::Warning,
            "BackupFailed",
            format!("{reason}: {message}"),
        )
        .await;
        Ok(Action::await_change())
    }

    pub(super) async fn pending(&mut self, message: String) -> Result<Action, Error> {
        let st = RedisBackupStatus {
            phase: Some(BackupPhase::Pending),
            message: Some(message),
            ..self.status()
        };
        if Some(&st) != self.b.status.as_ref() {
            self.write_status(&st).await?;
        }
        Ok(Action::requeue(Duration::from_secs(5)))
    }

    pub(super) async fn write_status(&mut self, st: &RedisBackupStatus) -> Result<(), Error> {
        self.ctx.metrics.kube("patch_status");
        let mut patch = serde_json::json!({ "status": st });
        // A merge patch keeps a field it does not name: a status without a
        // message (Running, Completed) clears the one a wait left.
        if st.message.is_none() {
            patch["status"]["message"] = serde_json::Value::Null;
        }
        let updated = self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.b = Arc::new(updated);
        Ok(())
    }
}
