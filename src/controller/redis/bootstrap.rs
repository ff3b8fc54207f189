//! A new Redis loaded from a backup (`spec.bootstrap.fromBackup`).
//!
//! The backup is resolved once (a Completed RedisBackup, or a bucket and
//! key given directly) into `status.bootstrap`, before any child exists, so
//! the StatefulSet is created with the restore in it and later changes to
//! the RedisBackup (or its deletion) change nothing. The restore runs as an
//! init container of the operator's image in the first instance
//! (`redpilot restore --only-pod <name>-0`): it checks the manifest (the
//! engine and RDB version against this Redis's server) and the object's
//! size and SHA-256 before the file is in place, so the server starts
//! from a verified dump or not at all. The instance boots fenced like every
//! Replication instance; recovery promotes ordinal 0 (no other instance is
//! ahead of it) and the replicas sync from it. A failed restore stops the
//! bootstrap with a Degraded condition whose reason names the cause.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, VolumeMount,
};
use kube::runtime::events::EventType;

use super::Reconciler;
use super::build::{self, Names};
use crate::api::v1alpha1::{
    BackupPhase, BootstrapStatus, Engine, Redis, RedisBackup, S3Location, VolumeLocation,
};
use crate::controller::Error;
use crate::controller::agent::{self, Outcome, Target};

/// Name of the restore init container.
pub const RESTORE_CONTAINER: &str = "restore";

/// Why a bootstrap cannot go on yet.
enum Unresolved {
    /// Waiting for something that may still happen.
    Waiting(String),
    /// Something that will not fix itself.
    Failed(&'static str, String),
}

impl Reconciler {
    /// Resolves `spec.bootstrap` into `status.bootstrap` (once). Returns
    /// false when the pass must stop before creating anything: the backup
    /// is missing, not finished yet, or failed (reported in the status).
    pub(super) async fn resolve_bootstrap(&mut self) -> Result<bool, Error> {
        let Some(spec) = self.redis.spec.bootstrap.clone() else {
            return Ok(true);
        };
        if self.bootstrap.is_some() {
            return Ok(true);
        }
        let from = spec.from_backup;
        let resolved = match (&from.backup, &from.key) {
            (Some(name), _) => self.resolve_named(name).await?,
            (None, Some(key)) if from.s3.is_some() || from.volume.is_some() => {
                Ok(resolved(from.s3.clone(), from.volume.clone(), key.clone()))
            }
            _ => Err(Unresolved::Failed(
                "InvalidBootstrap",
                "spec.bootstrap.fromBackup names neither a backup nor a bucket and key".into(),
            )),
        };
        match resolved {
            Ok(bs) => {
                let note = format!("restoring {} into {}", bs.location, self.names.pod(0));
                self.event(EventType::Normal, "BootstrapStarted", "Bootstrap", note)
                    .await;
                self.bootstrap = Some(bs);
                Ok(true)
            }
            Err(Unresolved::Waiting(why)) => {
                self.progress_reason = Some("WaitingForBackup");
                self.progressing.push(why);
                Ok(false)
            }
            Err(Unresolved::Failed(reason, why)) => {
                self.report_failure(reason, "Bootstrap", "bootstrap", why)
                    .await;
                Ok(false)
            }
        }
    }

    async fn resolve_named(
        &self,
        name: &str,
    ) -> Result<Result<BootstrapStatus, Unresolved>, Error> {
        self.ctx.metrics.kube("get_redisbackup");
        let backup: Option<RedisBackup> = self.api().get_opt(name).await?;
        let Some(b) = backup else {
            return Ok(Err(Unresolved::Failed(
                "BackupNotFound",
                format!(
                    "spec.bootstrap.fromBackup.backup: RedisBackup {name} does not exist in namespace {}",
                    self.ns
                ),
            )));
        };
        let status = b.status.clone().unwrap_or_default();
        Ok(match (status.phase, status.key) {
            (Some(BackupPhase::Completed), Some(key)) => {
                Ok(resolved(b.spec.target.s3, b.spec.target.volume, key))
            }
            (Some(BackupPhase::Failed), _) => Err(Unresolved::Failed(
                "BackupFailed",
                format!(
                    "spec.bootstrap.fromBackup.backup: RedisBackup {name} failed ({}); nothing to restore",
                    status.reason.unwrap_or_default()
                ),
            )),
            _ => Err(Unresolved::Waiting(format!(
                "waiting for RedisBackup {name} to complete"
            ))),
        })
    }

    /// The location a finished bootstrap loaded (published in the
    /// ConfigMap so the restore never runs again).
    pub(super) fn bootstrapped(&self) -> Option<&str> {
        self.bootstrap
            .as_ref()
            .filter(|b| b.done)
            .map(|b| b.location.as_str())
    }

    /// Reports a failed restore seen in the first instance's init
    /// container, and marks the bootstrap done once a primary serves.
    pub(super) async fn track_bootstrap(&mut self, primary: Option<&str>) {
        let Some(bs) = self.bootstrap.clone() else {
            return;
        };
        if bs.done {
            return;
        }
        let first_name = self.names.pod(0);
        let first: Option<Pod> = self.cached(&first_name);
        let statuses = first
            .and_then(|p| p.status)
            .and_then(|s| s.init_container_statuses)
            .unwrap_or_default();
        let ended = agent::termination(&statuses, RESTORE_CONTAINER);
        // The restore's checksum, kept from the run that loaded it (a
        // later start of the same pod only skips).
        let sha256 = match ended.as_ref().and_then(|(_, m)| m.as_deref()) {
            Some(m) => match agent::outcome(m) {
                Some(Outcome::Done(manifest)) => Some(manifest.sha256),
                _ => bs.sha256.clone(),
            },
            None => bs.sha256.clone(),
        };
        if sha256 != bs.sha256 {
            self.bootstrap = Some(BootstrapStatus {
                sha256: sha256.clone(),
                ..bs.clone()
            });
        }
        // Done only when the instance the backup was restored into serves
        // as primary (recovery promotes no other while restoring).
        if primary == Some(first_name.as_str()) {
            let checksum = sha256
                .as_deref()
                .map(|s| format!(" (SHA-256 {s})"))
                .unwrap_or_default();
            let note = format!(
                "{first_name} serves as primary the data restored from {}{checksum}",
                bs.location
            );
            self.event(EventType::Normal, "Bootstrapped", "Bootstrap", note)
                .await;
            self.bootstrap = Some(BootstrapStatus {
                done: true,
                sha256,
                ..bs
            });
            return;
        }
        let Some((code, message)) = ended else {
            return;
        };
        if code == 0 {
            return;
        }
        let (reason, why) = match message.as_deref().and_then(agent::outcome) {
            Some(Outcome::Failed { reason, message }) => (agent::bounded_reason(&reason), message),
            _ => (
                "RestoreFailed",
                format!("the restore container exited with code {code}"),
            ),
        };
        let msg = format!(
            "restoring {} into {}: {why}",
            bs.location,
            self.names.pod(0)
        );
        self.report_failure(reason, "Bootstrap", "bootstrap", msg)
            .await;
    }
}

fn resolved(
    s3: Option<S3Location>,
    volume: Option<VolumeLocation>,
    key: String,
) -> BootstrapStatus {
    let location = Target::of(s3.as_ref(), volume.as_ref())
        .map(|t| t.location(&key))
        .unwrap_or_default();
    BootstrapStatus {
        location,
        s3,
        volume,
        key,
        done: false,
        sha256: None,
    }
}

/// Where the restore reads from.
pub fn target(bs: &BootstrapStatus) -> Option<Target<'_>> {
    Target::of(bs.s3.as_ref(), bs.volume.as_ref())
}

/// The init container that fetches the backup into `/data/dump.rdb` of the
/// first instance, checked against its manifest and this Redis's server.
pub fn init_container(bs: &BootstrapStatus, names: &Names, redis: &Redis) -> Container {
    let spec = &redis.spec;
    let mut args = vec![
        "restore".to_string(),
        "--only-pod".into(),
        names.pod(0),
        "--dest".into(),
        "/data/dump.rdb".into(),
    ];
    let source = target(bs);
    args.extend(source.map(|t| t.args(&bs.key)).unwrap_or_default());
    if spec.image.is_none()
        && let Some(max) = super::statefulset::max_rdb(spec)
    {
        args.extend(["--max-rdb-version".into(), max.to_string()]);
        let engine = match spec.engine {
            Engine::Redis => "redis",
            Engine::Valkey => "valkey",
        };
        args.extend(["--server-engine".into(), engine.into()]);
    }
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let from_config = |name: &str, key: &str| super::statefulset::config_env(names, name, key);
    let mut env = vec![
        field("POD_NAME", "metadata.name"),
        from_config("REDPILOT_PRIMARY", build::PRIMARY_KEY),
        from_config("REDPILOT_BOOTSTRAPPED", build::BOOTSTRAPPED_KEY),
        // The restore is this object's: a marker left on a retained volume
        // by a deleted Redis of the same name does not count.
        EnvVar {
            name: "REDPILOT_RESTORE_OWNER".into(),
            value: redis.metadata.uid.clone(),
            ..Default::default()
        },
    ];
    env.extend(source.map(|t| t.env(true)).unwrap_or_default());
    let mut mounts = vec![
        VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    if let Some((_, m)) = source.and_then(|t| t.volume(true)) {
        mounts.push(m);
    }
    agent::container(RESTORE_CONTAINER, args, env, mounts)
}
