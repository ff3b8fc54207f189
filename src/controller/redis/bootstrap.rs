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
//!
//! A Cluster Redis is restored from a RedisBackup of a Cluster Redis with
//! the same shard count, whatever its slot layout (a backup taken after a
//! resharding holds shards that are no even spread; [`shape_mismatch`]
//! only checks that the files hold every slot once): shard `i`'s file goes
//! into `<name>-s<i>-0`, whose server claims the slots it holds keys of
//! when it starts; the cluster plan (`decide_shape` with the backed-up
//! layout as the shards' homes) meets those nodes and gives the rest of
//! each shard's backed-up slots to the same node.
//! The bootstrap is done once every shard serves its slots and the cluster
//! is whole.
//!
//! Restored to a time (`pointInTime`), a Cluster Redis's shard `i` restores
//! the archive's line `shard-<i>` into `<name>-s<i>-0`; the slots each shard
//! served at its checkpoint come back in the restore's outcome, and only
//! once every shard reported them (and they hold every slot once) are they
//! the shards' homes and is the cluster formed ([`Reconciler::pitr_layout`]).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, VolumeMount};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::Reconciler;
use super::cluster::build as cluster_build;
use super::cluster::model::Shard;
use super::facts::{PodFacts, Role};
use crate::api::v1alpha1::{
    BackupOrigin, BackupPhase, BootstrapShard, BootstrapStatus, Engine, Mode, Redis, RedisBackup,
    RedisBackupStatus, RedisSpec, S3Location, VolumeLocation,
};
use crate::controller::agent::{self, Outcome, Target};
use crate::controller::base::FIELD_MANAGER;
use crate::controller::error::Error;
use crate::controller::names::{self, Names};

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
        if self.records.bootstrap.is_some() {
            return Ok(true);
        }
        let from = spec.from_backup;
        let resolved = match (&from.backup, &from.key) {
            (Some(name), _) => self.resolve_named(name).await?,
            (None, Some(key)) if from.s3.is_some() || from.volume.is_some() => {
                // A Cluster Redis restored to a time: every shard from its
                // own line of the archive; the slots each served then are
                // known once its restore ran (`pitr_layout`).
                let shards =
                    if from.point_in_time.is_some() && self.redis.spec.mode() == Mode::Cluster {
                        (0..self.redis.spec.desired_shards())
                            .map(|index| BootstrapShard {
                                index,
                                key: key.clone(),
                                slots: String::new(),
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                Ok(BootstrapStatus {
                    point_in_time: from.point_in_time.clone(),
                    shards,
                    ..resolved(from.s3.clone(), from.volume.clone(), key.clone())
                })
            }
            _ => Err(Unresolved::Failed(
                "InvalidBootstrap",
                "spec.bootstrap.fromBackup names neither a backup nor a bucket and key".into(),
            )),
        };
        let field = match &from.backup {
            Some(name) => {
                format!("spec.bootstrap.fromBackup.backup (RedisBackup {name}'s spec.target.s3)")
            }
            None => "spec.bootstrap.fromBackup.s3".to_string(),
        };
        let resolved = match resolved {
            Ok(bs) => match &bs.s3 {
                Some(s3) => match crate::controller::trust::check_s3(
                    &self.ctx.client,
                    &self.ctx.metrics,
                    &self.ctx.settings.endpoints,
                    &self.ns,
                    s3,
                    &field,
                )
                .await?
                {
                    Some(r) => Err(Unresolved::Failed(r.reason, r.message)),
                    None => Ok(bs),
                },
                None => Ok(bs),
            },
            other => other,
        };
        match resolved {
            Ok(bs) => {
                let note = if let Some(t) =
                    bs.point_in_time.as_ref().filter(|_| !bs.shards.is_empty())
                {
                    format!(
                        "restoring every one of the {} shards of the archive {} to {t} into the first instance of each shard",
                        bs.shards.len(),
                        bs.location
                    )
                } else if let Some(t) = &bs.point_in_time {
                    format!(
                        "restoring the archive {} to {t} into {}",
                        bs.location,
                        self.names.pod(0)
                    )
                } else if bs.shards.is_empty() {
                    format!("restoring {} into {}", bs.location, self.names.pod(0))
                } else {
                    format!(
                        "restoring the {} shard files of {} into the first instance of each shard",
                        bs.shards.len(),
                        bs.location
                    )
                };
                self.event(EventType::Normal, "BootstrapStarted", "Bootstrap", note)
                    .await;
                self.records.bootstrap = Some(bs);
                Ok(true)
            }
            Err(Unresolved::Waiting(why)) => {
                self.report.waiting("WaitingForBackup");
                self.report.progress(why);
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
        &mut self,
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
        if status.phase == Some(BackupPhase::Completed) {
            // What the spec leaves unset comes from the backed-up Redis, set
            // in the spec before anything is checked or created.
            match &status.origin {
                Some(origin) => match from_origin(&self.redis.spec, origin, name) {
                    Err(why) => return Ok(Err(Unresolved::Failed("InvalidBootstrap", why))),
                    Ok(Some(fill)) => return self.fill_spec(fill, name).await,
                    Ok(None) => {}
                },
                // A backup taken before backups recorded their origin gives
                // no version: a Valkey spec must name one.
                None if self.redis.spec.version.is_none()
                    && self.redis.spec.image.is_none()
                    && self.redis.spec.engine() != Engine::Redis =>
                {
                    return Ok(Err(Unresolved::Failed(
                        "InvalidBootstrap",
                        format!(
                            "spec.version: set it: RedisBackup {name} records no origin (an earlier operator took it), so there is no version to take for spec.engine {:?}",
                            self.redis.spec.engine()
                        ),
                    )));
                }
                None => {}
            }
            if let Some((reason, why)) = shape_mismatch(&self.redis.spec, &status, name) {
                return Ok(Err(Unresolved::Failed(reason, why)));
            }
        }
        let shards: Vec<BootstrapShard> = status
            .shards
            .iter()
            .map(|s| BootstrapShard {
                index: s.index,
                key: s.key.clone(),
                slots: s.slots.clone(),
            })
            .collect();
        Ok(match (status.phase, status.key) {
            (Some(BackupPhase::Completed), Some(key)) => Ok(BootstrapStatus {
                shards,
                origin: status.origin,
                ..resolved(b.spec.target.s3, b.spec.target.volume, key)
            }),
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

    /// Sets what the spec left unset from RedisBackup `name`'s origin
    /// (server-side apply of those fields only, with the operator's field
    /// manager), then stops the pass: the next one sees the whole spec.
    async fn fill_spec(
        &mut self,
        fill: Fill,
        name: &str,
    ) -> Result<Result<BootstrapStatus, Unresolved>, Error> {
        let body = serde_json::json!({
            "apiVersion": "redpilot.io/v1alpha1",
            "kind": "Redis",
            "metadata": {"name": self.redis.name_any()},
            "spec": fill.patch,
        });
        self.ctx.metrics.kube("apply_redis_spec");
        let api: kube::Api<Redis> = self.api();
        let pp = kube::api::PatchParams::apply(FIELD_MANAGER);
        match api
            .patch(&self.redis.name_any(), &pp, &kube::api::Patch::Apply(&body))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => {
                return Ok(Err(Unresolved::Failed(
                    "InvalidBootstrap",
                    format!(
                        "spec.bootstrap.fromBackup.backup: taking {} from RedisBackup {name} was refused: {}",
                        fill.summary, e.message
                    ),
                )));
            }
            Err(e) => return Err(e.into()),
        }
        self.report.wrote();
        let note = format!(
            "{} from RedisBackup {name}, which the spec left unset",
            fill.summary
        );
        self.event(EventType::Normal, "SpecFromBackup", "Bootstrap", note)
            .await;
        Ok(Err(Unresolved::Waiting(format!(
            "taking {} from RedisBackup {name}",
            fill.summary
        ))))
    }

    /// The location a finished bootstrap loaded (published in the
    /// ConfigMap so the restore never runs again).
    pub(super) fn bootstrapped(&self) -> Option<&str> {
        self.records
            .bootstrap
            .as_ref()
            .filter(|b| b.done)
            .map(|b| b.location.as_str())
    }

    /// Reports a failed restore seen in the first instance's init
    /// container, and marks the bootstrap done once the first instance
    /// serves as primary (`facts` show it answering as one: a Standalone
    /// Redis names its only instance primary before its pod even starts,
    /// and a bootstrap marked done then tells the restore to skip).
    pub(super) async fn track_bootstrap(&mut self, facts: &[PodFacts], primary: Option<&str>) {
        let Some(bs) = self.records.bootstrap.clone() else {
            return;
        };
        if bs.done {
            return;
        }
        let first_name = self.names.pod(0);
        let ended = self.restore_ended(&first_name);
        // The restore's checksum, kept from the run that loaded it (a
        // later start of the same pod only skips).
        let mut bs = bs;
        let sha256 = match ended.as_ref().and_then(|(_, m)| m.as_deref()) {
            Some(m) => match agent::outcome(m) {
                Some(Outcome::Done(manifest)) => Some(manifest.sha256),
                Some(Outcome::ToTime(o)) => {
                    bs.restored_to = Some(o.checkpoint.clone());
                    bs.commands = i64::try_from(o.commands).ok();
                    Some(o.sha256)
                }
                _ => bs.sha256.clone(),
            },
            None => bs.sha256.clone(),
        };
        if sha256 != bs.sha256 || self.records.bootstrap.as_ref() != Some(&bs) {
            bs.sha256 = sha256.clone();
            self.records.bootstrap = Some(bs.clone());
        }
        // Done only when the instance the backup was restored into serves
        // as primary (recovery promotes no other while restoring).
        let serving = facts.iter().any(|f| {
            f.name == first_name && f.reachable && !f.terminating && f.role == Some(Role::Primary)
        });
        if primary == Some(first_name.as_str()) && serving {
            if bs.point_in_time.is_some() && !self.pitr_saved(facts, &first_name).await {
                self.report.progress(format!(
                    "{first_name} loaded the archive to {}; saving it as its RDB file",
                    bs.restored_to.as_deref().unwrap_or("the time asked")
                ));
                self.report
                    .recheck_within(std::time::Duration::from_secs(1));
                return;
            }
            let checksum = sha256
                .as_deref()
                .map(|s| format!(" (SHA-256 {s})"))
                .unwrap_or_default();
            let bs = BootstrapStatus { sha256, ..bs };
            if !self.publish_bootstrapped(&bs.location).await {
                return;
            }
            let note = format!(
                "{first_name} serves as primary the data restored from {}{checksum}",
                bs.location
            );
            self.event(EventType::Normal, "Bootstrapped", "Bootstrap", note)
                .await;
            self.records.bootstrap = Some(BootstrapStatus { done: true, ..bs });
            return;
        }
        if let Some((reason, why)) = restore_failure(ended) {
            let msg = format!("restoring {} into {first_name}: {why}", bs.location);
            self.report_failure(reason, "Bootstrap", "bootstrap", msg)
                .await;
        }
    }

    /// Publishes the finished bootstrap's `location` in the ConfigMap (the
    /// one this pass applied, with the key added) before the status says
    /// done: a server that restarts in place reads `REDPILOT_BOOTSTRAPPED`
    /// from it at its start (and a re-created pod's restore, to skip), so it
    /// must not find it empty once the status says done (a restarted server
    /// would start on the restored append-only file again). False (done
    /// waits for a later pass) when this pass applied no ConfigMap or the
    /// write failed.
    async fn publish_bootstrapped(&mut self, location: &str) -> bool {
        let Some(cm) = self.config_applied.clone() else {
            self.report
                .recheck_within(std::time::Duration::from_secs(1));
            return false;
        };
        let cm = super::conf::with_bootstrapped(cm, location);
        let live = match self
            .lookup::<k8s_openapi::api::core::v1::ConfigMap>(&self.names.config())
            .await
        {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(redis = %self.oref, error = %e, "reading the ConfigMap to publish the bootstrap");
                return false;
            }
        };
        match self.apply("ConfigMap", &cm, live.as_ref()).await {
            Ok(_) => {
                self.config_applied = Some(cm);
                true
            }
            Err(e) => {
                tracing::warn!(redis = %self.oref, error = %e, "publishing the bootstrap in the ConfigMap");
                self.report
                    .recheck_within(std::time::Duration::from_secs(1));
                false
            }
        }
    }

    /// A Redis restored to a point in time started on the restored
    /// append-only file: before the bootstrap is done its data must be in
    /// `dump.rdb` (a save after the server started) and the append-only
    /// file off (as the spec says: a bootstrapped Redis starts with AOF
    /// Disabled), so the file can go. Starts a background save when none
    /// was made; true once both hold.
    async fn pitr_saved(&mut self, facts: &[PodFacts], pod: &str) -> bool {
        let Some(ip) = super::facts::ip_of(facts, pod) else {
            return false;
        };
        let endpoint = crate::redis::Endpoint::new(&ip, crate::controller::names::REDIS_PORT);
        let Some(opts) = self.reach.opts.clone() else {
            return false;
        };
        let Ok(mut node) = crate::redis::Node::connect(&endpoint, &opts).await else {
            return false;
        };
        let Ok(info) = node.info_section("persistence").await else {
            return false;
        };
        let Ok(server) = node.info_section("server").await else {
            return false;
        };
        let p = &info.persistence;
        let uptime = i64::try_from(server.server.uptime_seconds.unwrap_or(0)).unwrap_or(0);
        let started = chrono::Utc::now().timestamp() - uptime;
        // A server counts its start as a save: only a later one is one.
        let saved = p.rdb_last_save_time.is_some_and(|t| t > started + 1)
            && p.rdb_last_bgsave_ok != Some(false)
            && p.rdb_bgsave_in_progress != Some(true)
            && p.loading != Some(true);
        if !saved {
            if p.rdb_bgsave_in_progress != Some(true) && p.loading != Some(true) {
                let r: crate::redis::Result<String> =
                    node.query("BGSAVE", &redis::cmd("BGSAVE")).await;
                if let Err(e) = r {
                    tracing::debug!(error = %e, "BGSAVE after a restore to a point in time");
                }
            }
            return false;
        }
        if p.aof_enabled == Some(true) {
            let off: crate::redis::Result<String> = node
                .query(
                    "CONFIG SET",
                    redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("no"),
                )
                .await;
            return off.is_ok();
        }
        true
    }

    /// How the restore container of `pod` ended (exit code, message).
    fn restore_ended(&self, pod: &str) -> Option<(i32, Option<String>)> {
        let p: Option<Pod> = self.cached(pod);
        let statuses = p
            .and_then(|p| p.status)
            .and_then(|s| s.init_container_statuses)
            .unwrap_or_default();
        agent::termination(&statuses, RESTORE_CONTAINER)
    }

    /// A Cluster Redis restored to a time: once every shard's restore
    /// ended, the slots each served at its checkpoint become the shards'
    /// homes (`status.bootstrap.shards[].slots`). False while they are not
    /// known yet or do not make one cluster (then reported); true for any
    /// other bootstrap.
    pub(super) async fn pitr_layout(&mut self) -> bool {
        let Some(bs) = self.records.bootstrap.clone() else {
            return true;
        };
        let Some(at) = bs.point_in_time.clone() else {
            return true;
        };
        if bs.done || bs.shards.is_empty() || bs.shards.iter().all(|s| !s.slots.is_empty()) {
            return true;
        }
        let mut shards = bs.shards.clone();
        let mut reported = 0;
        let mut commands = 0i64;
        let mut checkpoints: Vec<String> = Vec::new();
        for sh in &mut shards {
            let first = cluster_build::first_of_shard(&self.names, sh.index);
            let Some((0, Some(message))) = self.restore_ended(&first) else {
                continue;
            };
            if let Some(Outcome::ToTime(o)) = agent::outcome(&message) {
                // As the status writes slot ranges (`a-b,c`), whatever
                // the server's `CLUSTER NODES` spelling.
                let slots = o.slots.clone().unwrap_or_default();
                sh.slots = crate::redis::cluster::parse_ranges(&slots)
                    .map(|r| super::cluster::plan::show(&r))
                    .unwrap_or(slots);
                commands += i64::try_from(o.commands).unwrap_or(0);
                checkpoints.push(o.checkpoint.clone());
                reported += 1;
            }
        }
        if reported < shards.len() {
            self.report.progress(format!(
                "restoring every shard to {at}: {reported} of {} shards restored",
                shards.len()
            ));
            return false;
        }
        if let Some(why) = pitr_layout_problem(&shards, &at) {
            let msg = format!("restoring {} to {at}: {why}", bs.location);
            self.report_failure("NotRestorable", "Bootstrap", "bootstrap", msg)
                .await;
            return false;
        }
        // Every shard is at its own last checkpoint at or before the time:
        // the status names the earliest of them (every write acknowledged
        // by then is in).
        checkpoints.sort();
        let note = format!(
            "every shard restored to {at} (checkpoints {} to {}): layout {}",
            checkpoints.first().map(String::as_str).unwrap_or("-"),
            checkpoints.last().map(String::as_str).unwrap_or("-"),
            shards
                .iter()
                .map(|s| format!("shard {} {}", s.index, s.slots))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.event(EventType::Normal, "Restored", "Bootstrap", note)
            .await;
        self.records.bootstrap = Some(BootstrapStatus {
            shards,
            restored_to: checkpoints.first().cloned(),
            commands: Some(commands),
            ..bs
        });
        true
    }

    /// A Cluster Redis's bootstrap: a failed restore of any shard is
    /// reported; the bootstrap is done once every shard's first instance
    /// (the one its file was loaded into) serves the shard's slots and the
    /// cluster is whole.
    pub(super) async fn track_cluster_bootstrap(
        &mut self,
        facts: &[PodFacts],
        shards: &[Shard],
        healthy: bool,
    ) {
        let Some(bs) = self.records.bootstrap.clone() else {
            return;
        };
        if bs.done {
            return;
        }
        let mut serving = 0;
        for sh in &bs.shards {
            let first = cluster_build::first_of_shard(&self.names, sh.index);
            // Its primary holds the restored data: the first instance, or
            // a replica that synced from it and took over.
            let decided = shards.iter().find(|s| s.index == sh.index);
            if decided.is_some_and(|s| {
                s.primary.is_some() && super::cluster::plan::show(&s.slots) == sh.slots
            }) {
                serving += 1;
                continue;
            }
            if let Some((reason, why)) = restore_failure(self.restore_ended(&first)) {
                let location = target(&bs).map(|t| t.location(&sh.key)).unwrap_or_default();
                let msg = format!(
                    "restoring {location} into {first} (shard {}): {why}",
                    sh.index
                );
                self.report_failure(reason, "Bootstrap", "bootstrap", msg)
                    .await;
            }
        }
        if healthy && serving == bs.shards.len() {
            // Restored to a time: each shard's first instance saves what it
            // loaded as its RDB file and turns its append-only file off.
            if bs.point_in_time.is_some() {
                let mut saved = 0;
                for sh in &bs.shards {
                    let first = cluster_build::first_of_shard(&self.names, sh.index);
                    if self.pitr_saved(facts, &first).await {
                        saved += 1;
                    }
                }
                if saved < bs.shards.len() {
                    self.report.progress(format!(
                        "every shard loaded the archive to {}; {saved} of {} saved it as their RDB file",
                        bs.restored_to.as_deref().unwrap_or("the time asked"),
                        bs.shards.len()
                    ));
                    self.report
                        .recheck_within(std::time::Duration::from_secs(1));
                    return;
                }
            }
            if !self.publish_bootstrapped(&bs.location).await {
                return;
            }
            let note = format!(
                "the first instance of each of the {serving} shards serves the slots restored from {}",
                bs.location
            );
            self.event(EventType::Normal, "Bootstrapped", "Bootstrap", note)
                .await;
            self.records.bootstrap = Some(BootstrapStatus { done: true, ..bs });
        } else if !healthy || serving < bs.shards.len() {
            self.report.progress(format!(
                "restoring from {}: {serving} of {} shards serve their restored slots",
                bs.location,
                bs.shards.len()
            ));
        }
    }
}

/// Why a restore container that ended failed (`None` when it did not
/// end, or succeeded): a bounded reason and the agent's message.
fn restore_failure(ended: Option<(i32, Option<String>)>) -> Option<(&'static str, String)> {
    let (code, message) = ended?;
    if code == 0 {
        return None;
    }
    Some(match message.as_deref().and_then(agent::outcome) {
        Some(Outcome::Failed { reason, message }) => (agent::bounded_reason(&reason), message),
        _ => (
            "RestoreFailed",
            format!("the restore container exited with code {code}"),
        ),
    })
}

/// What a Redis bootstrapped from a backup takes from the backed-up Redis.
#[derive(Debug, PartialEq)]
pub struct Fill {
    /// The spec fields to set (a partial spec).
    pub patch: serde_json::Value,
    /// What they are, for the status and the event ("mode Cluster, ...").
    pub summary: String,
}

/// The spec fields a Redis bootstrapped from RedisBackup `name` leaves
/// unset and takes from its `origin`: mode, engine and version (with the
/// image, when engine and version are unset), the shard and instance
/// counts with the mode, and the config when none is given.
/// `None` when nothing is unset; an error naming the field when the
/// version cannot be taken (another engine than the backed-up one).
pub fn from_origin(
    spec: &RedisSpec,
    origin: &BackupOrigin,
    name: &str,
) -> Result<Option<Fill>, String> {
    let mut patch = serde_json::Map::new();
    let mut parts = Vec::new();
    let mode = spec.mode.unwrap_or(origin.mode);
    if spec.mode.is_none() {
        patch.insert("mode".into(), serde_json::json!(mode));
        parts.push(format!("mode {mode:?}"));
    }
    let engine = spec.engine.unwrap_or(origin.engine);
    if spec.engine.is_none() {
        patch.insert("engine".into(), serde_json::json!(engine));
        parts.push(format!("engine {engine:?}"));
    }
    if spec.version.is_none() && spec.image.is_none() {
        if engine != origin.engine {
            return Err(format!(
                "spec.version: set it: RedisBackup {name} holds {:?} {} data and spec.engine is {engine:?}, so its version does not apply",
                origin.engine, origin.version
            ));
        }
        patch.insert("version".into(), origin.version.clone().into());
        parts.push(format!("version {}", origin.version));
        if spec.engine.is_none()
            && let Some(image) = &origin.image
        {
            patch.insert("image".into(), image.clone().into());
            parts.push(format!("image {image}"));
        }
    }
    // The counts come with the mode: a spec that names its mode chose its
    // counts too (and in Cluster mode they cannot change once set).
    if spec.mode.is_none() && mode == origin.mode {
        if mode == Mode::Cluster
            && spec.shards.is_none()
            && let Some(shards) = origin.shards
        {
            patch.insert("shards".into(), shards.into());
            parts.push(format!("{shards} shards"));
        }
        if spec.instances.is_none() {
            patch.insert("instances".into(), origin.instances.into());
            let per = if mode == Mode::Cluster {
                " per shard"
            } else {
                ""
            };
            parts.push(format!("{} instances{per}", origin.instances));
        }
    }
    if spec.config.is_empty() && !origin.config.is_empty() {
        patch.insert("config".into(), serde_json::json!(origin.config));
        let keys: Vec<&str> = origin.config.keys().map(String::as_str).collect();
        parts.push(format!("config {}", keys.join(", ")));
    }
    if patch.is_empty() {
        return Ok(None);
    }
    Ok(Some(Fill {
        patch: serde_json::Value::Object(patch),
        summary: parts.join(", "),
    }))
}

/// Why the backup `b` (named `name`) cannot fill a Redis of `spec`: a
/// Cluster Redis's backup fills only a Cluster Redis of the same shard
/// count whose shards get the same slots, and a one-dataset backup only a
/// Standalone or Replication Redis. A bounded reason and a message naming
/// the field.
pub fn shape_mismatch(
    spec: &RedisSpec,
    b: &RedisBackupStatus,
    name: &str,
) -> Option<(&'static str, String)> {
    let field = "spec.bootstrap.fromBackup.backup";
    let cluster = spec.mode() == Mode::Cluster;
    let have = b.shards.len();
    if have == 0 {
        return cluster.then(|| {
            (
                "BackupModeMismatch",
                format!(
                    "{field}: RedisBackup {name} holds one dataset, not a shard per file; a Cluster Redis is restored from a backup of a Cluster Redis"
                ),
            )
        });
    }
    if !cluster {
        return Some((
            "BackupModeMismatch",
            format!(
                "{field}: RedisBackup {name} holds a Cluster Redis of {have} shards; restore it into a Redis with spec.mode Cluster and spec.shards {have}"
            ),
        ));
    }
    let want = spec.desired_shards();
    if usize::try_from(want).ok() != Some(have) {
        return Some((
            "ShardCountMismatch",
            format!(
                "spec.shards is {want} but RedisBackup {name} holds {have} shards: a backup is restored into the same shard count (restore it with spec.shards {have}, then change spec.shards to reshard online)"
            ),
        ));
    }
    // Any layout restores (a backup taken after a resharding holds no even
    // spread): each shard's first node gets its file and its slots. The
    // files must hold every slot exactly once.
    let msg = match partition(b.shards.iter().map(|s| (s.index, s.slots.as_str())))? {
        Partition::NotRanges(index, slots) => format!(
            "{field}: shard {index} of RedisBackup {name} records slots {slots:?}, which are not slot ranges"
        ),
        Partition::OutOfOrder(index, i) => format!(
            "{field}: RedisBackup {name} lists shard {index} in place {i}; its shards must be listed in order"
        ),
        Partition::Twice(slot, a, b) => format!(
            "{field}: slot {slot} is in both shard {a} and shard {b} of RedisBackup {name} (taken while slots moved?); it cannot be restored"
        ),
        Partition::Missing(slots) => format!(
            "{field}: no shard of RedisBackup {name} holds slots {slots}; it cannot be restored whole"
        ),
    };
    Some(("SlotLayoutMismatch", msg))
}

/// Why shards' slots are not every slot exactly once, shards in order.
#[derive(Debug, PartialEq)]
enum Partition {
    /// Shard `.0`'s slots `.1` are not slot ranges.
    NotRanges(i32, String),
    /// Shard `.0` is listed in place `.1`.
    OutOfOrder(i32, usize),
    /// Slot `.0` is in shards `.1` and `.2`.
    Twice(u16, i32, i32),
    /// No shard holds these slots.
    Missing(String),
}

fn partition<'a>(shards: impl IntoIterator<Item = (i32, &'a str)>) -> Option<Partition> {
    let mut seen = vec![None::<i32>; usize::from(crate::redis::cluster::SLOTS)];
    for (i, (index, slots)) in shards.into_iter().enumerate() {
        let Some(ranges) = crate::redis::cluster::parse_ranges(slots) else {
            return Some(Partition::NotRanges(index, slots.to_string()));
        };
        if index != i as i32 {
            return Some(Partition::OutOfOrder(index, i));
        }
        for slot in ranges.iter().flat_map(|r| r.start..=r.end) {
            if let Some(other) = seen[usize::from(slot)].replace(index) {
                return Some(Partition::Twice(slot, other, index));
            }
        }
    }
    let missing: Vec<u16> = (0..crate::redis::cluster::SLOTS)
        .filter(|s| seen[usize::from(*s)].is_none())
        .collect();
    (!missing.is_empty()).then(|| {
        Partition::Missing(super::cluster::plan::show(&crate::redis::cluster::ranges(
            missing,
        )))
    })
}

/// A Cluster Redis restored to a time: why the slots its shards served at
/// their checkpoints do not make one cluster (`spec.shards` fewer or more
/// than the archive had then, or shards whose checkpoints fell on the two
/// sides of a slot's move).
fn pitr_layout_problem(shards: &[BootstrapShard], at: &str) -> Option<String> {
    if let Some(empty) = shards.iter().find(|s| s.slots.is_empty()) {
        return Some(format!(
            "shard {} of the archive served no slot at {at}: spec.shards ({}) is more than the Redis had then",
            empty.index,
            shards.len()
        ));
    }
    Some(
        match partition(shards.iter().map(|s| (s.index, s.slots.as_str())))? {
            Partition::NotRanges(index, slots) => {
                format!(
                    "shard {index}'s restore reported slots {slots:?}, which are not slot ranges"
                )
            }
            Partition::OutOfOrder(index, i) => format!("shard {index} is in place {i}"),
            Partition::Twice(slot, a, b) => format!(
                "slot {slot} was served by both shard {a} and shard {b} at their checkpoints before {at}: a slot moved between them within a checkpoint interval of that time; choose a time a second earlier or later"
            ),
            Partition::Missing(slots) => format!(
                "no shard of the archive served slots {slots} at {at}: spec.shards ({}) is fewer than the Redis had then, or a slot moved within a checkpoint interval of that time",
                shards.len()
            ),
        },
    )
}

/// Adds the restore of `key` into `pod` to a StatefulSet's pod template
/// (and, for a backup on a volume, the claim read-only).
pub fn add_restore(
    sts: &mut StatefulSet,
    bs: &BootstrapStatus,
    (key, line): (&str, &str),
    pod: &str,
    names: &Names,
    redis: &Redis,
) {
    let Some(spec) = sts.spec.template.spec.as_mut() else {
        return;
    };
    spec.init_containers = Some(vec![init_container(bs, (key, line), pod, names, redis)]);
    if let Some((v, _)) = target(bs).and_then(|t| t.volume(true)) {
        spec.volumes.get_or_insert_with(Vec::new).push(v);
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
        shards: Vec::new(),
        origin: None,
        point_in_time: None,
        restored_to: None,
        commands: None,
    }
}

/// Where the restore reads from.
pub fn target(bs: &BootstrapStatus) -> Option<Target<'_>> {
    Target::of(bs.s3.as_ref(), bs.volume.as_ref())
}

/// The init container that fetches the file under `key` into
/// `/data/dump.rdb` of `pod` (the first instance, or a shard's), checked
/// against its manifest and this Redis's server.
pub fn init_container(
    bs: &BootstrapStatus,
    (key, line): (&str, &str),
    pod: &str,
    names: &Names,
    redis: &Redis,
) -> Container {
    let spec = &redis.spec;
    let mut args = vec![
        "restore".to_string(),
        "--only-pod".into(),
        pod.to_string(),
        "--dest".into(),
    ];
    match &bs.point_in_time {
        Some(t) => args.extend([
            format!("/data/{}", super::statefulset::PITR_FILE),
            "--point-in-time".into(),
            t.clone(),
            "--line".into(),
            line.into(),
        ]),
        None => args.push("/data/dump.rdb".into()),
    }
    let source = target(bs);
    args.extend(source.map(|t| t.args(key)).unwrap_or_default());
    if spec.image.is_none()
        && let Some(max) = super::statefulset::max_rdb(spec)
    {
        args.extend(["--max-rdb-version".into(), max.to_string()]);
        args.extend([
            "--server-engine".into(),
            names::engine_name(spec.engine()).into(),
        ]);
    }
    let from_config = |name: &str, key: &str| super::statefulset::config_env(names, name, key);
    let mut env = vec![
        agent::field_env("POD_NAME", "metadata.name"),
        from_config("REDPILOT_PRIMARY", names::PRIMARY_KEY),
        from_config("REDPILOT_BOOTSTRAPPED", names::BOOTSTRAPPED_KEY),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::BackupShardStatus;

    fn cluster_backup(slots: &[&str]) -> RedisBackupStatus {
        RedisBackupStatus {
            shards: slots
                .iter()
                .enumerate()
                .map(|(i, s)| BackupShardStatus {
                    index: i as i32,
                    slots: s.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn origin(mode: Mode, engine: Engine, version: &str) -> BackupOrigin {
        BackupOrigin {
            mode,
            engine,
            version: version.into(),
            image: None,
            shards: (mode == Mode::Cluster).then_some(3),
            instances: 2,
            config: [("maxmemory-policy".to_string(), "allkeys-lru".to_string())].into(),
        }
    }

    #[test]
    fn a_spec_that_names_only_the_backup_takes_its_shape() {
        let cluster = origin(Mode::Cluster, Engine::Valkey, "8.1");
        let fill = from_origin(&RedisSpec::default(), &cluster, "b1")
            .expect("fills")
            .expect("something to fill");
        assert_eq!(
            fill.patch,
            serde_json::json!({
                "mode": "Cluster", "engine": "Valkey", "version": "8.1", "shards": 3,
                "instances": 2, "config": {"maxmemory-policy": "allkeys-lru"}
            })
        );
        assert_eq!(
            fill.summary,
            "mode Cluster, engine Valkey, version 8.1, 3 shards, 2 instances per shard, config maxmemory-policy"
        );

        // What the spec sets stays; only the rest is taken.
        let given = RedisSpec {
            mode: Some(Mode::Cluster),
            shards: Some(3),
            version: Some("9.1".into()),
            config: [("hz".to_string(), "20".to_string())].into(),
            ..Default::default()
        };
        let fill = from_origin(&given, &cluster, "b1")
            .expect("fills")
            .expect("some");
        assert_eq!(fill.patch, serde_json::json!({"engine": "Valkey"}));

        // A spec that names its mode keeps its own counts (the shape check
        // then refuses what cannot be restored).
        let repl = origin(Mode::Replication, Engine::Redis, "7.2");
        let standalone = RedisSpec {
            mode: Some(Mode::Standalone),
            ..Default::default()
        };
        let fill = from_origin(&standalone, &repl, "b1")
            .expect("fills")
            .expect("some");
        assert_eq!(
            fill.patch,
            serde_json::json!({"engine": "Redis", "version": "7.2", "config": {"maxmemory-policy": "allkeys-lru"}})
        );

        // The image goes with the engine and version it was built for.
        let built = BackupOrigin {
            image: Some("registry.local/redis:7.2-patched".into()),
            ..repl.clone()
        };
        let fill = from_origin(&RedisSpec::default(), &built, "b1")
            .expect("fills")
            .expect("some");
        assert_eq!(fill.patch["image"], "registry.local/redis:7.2-patched");
        let valkey_given = RedisSpec {
            engine: Some(Engine::Valkey),
            version: Some("8.1".into()),
            ..Default::default()
        };
        let fill = from_origin(&valkey_given, &built, "b1")
            .expect("fills")
            .expect("some");
        assert!(fill.patch.get("image").is_none(), "{:?}", fill.patch);

        // Nothing unset: nothing to do.
        let whole = RedisSpec {
            mode: Some(Mode::Replication),
            engine: Some(Engine::Redis),
            version: Some("7.2".into()),
            instances: Some(3),
            config: [("hz".to_string(), "20".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(from_origin(&whole, &repl, "b1"), Ok(None));

        // Another engine with no version: refused, naming the field.
        let other = RedisSpec {
            engine: Some(Engine::Valkey),
            ..Default::default()
        };
        let err = from_origin(&other, &repl, "b1").expect_err("refused");
        assert!(
            err.starts_with("spec.version: set it: RedisBackup b1 holds Redis 7.2 data"),
            "{err}"
        );
    }

    fn spec(mode: Mode, shards: Option<i32>) -> RedisSpec {
        RedisSpec {
            mode: Some(mode),
            shards,
            ..Default::default()
        }
    }

    #[test]
    fn a_backup_fills_only_a_redis_of_its_shape() {
        let even = cluster_backup(&["0-5461", "5462-10922", "10923-16383"]);
        let one = RedisBackupStatus::default();
        let reason = |s: &RedisSpec, b: &RedisBackupStatus| shape_mismatch(s, b, "b1").map(|r| r.0);
        assert_eq!(reason(&spec(Mode::Cluster, Some(3)), &even), None);
        assert_eq!(reason(&spec(Mode::Replication, None), &one), None);
        assert_eq!(reason(&spec(Mode::Standalone, None), &one), None);
        assert_eq!(
            reason(&spec(Mode::Cluster, Some(3)), &one),
            Some("BackupModeMismatch")
        );
        assert_eq!(
            reason(&spec(Mode::Replication, None), &even),
            Some("BackupModeMismatch")
        );
        let (r, msg) = shape_mismatch(&spec(Mode::Cluster, Some(4)), &even, "b1").expect("refused");
        assert_eq!(r, "ShardCountMismatch");
        assert!(
            msg.contains("spec.shards is 4") && msg.contains("3 shards"),
            "{msg}"
        );
        // A layout a resharding left (3 -> 4 shards) restores as it is.
        let resharded = cluster_backup(&[
            "0-4095",
            "5462-9557",
            "10923-15018",
            "4096-5461,9558-10922,15019-16383",
        ]);
        assert_eq!(reason(&spec(Mode::Cluster, Some(4)), &resharded), None);
        // A slot in two files, or in none, does not.
        let twice = cluster_backup(&["0-5000", "4999-10922", "10923-16383"]);
        let (r, msg) =
            shape_mismatch(&spec(Mode::Cluster, Some(3)), &twice, "b1").expect("refused");
        assert_eq!(r, "SlotLayoutMismatch");
        assert!(
            msg.contains("slot 4999 is in both shard 0 and shard 1"),
            "{msg}"
        );
        let hole = cluster_backup(&["0-5000", "5002-10922", "10923-16383"]);
        let (r, msg) = shape_mismatch(&spec(Mode::Cluster, Some(3)), &hole, "b1").expect("refused");
        assert_eq!(r, "SlotLayoutMismatch");
        assert!(msg.contains("holds slots 5001;"), "{msg}");
    }
}
