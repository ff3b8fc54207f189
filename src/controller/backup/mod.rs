//! The `RedisBackup` controller: one backup, taken by a Job of the
//! operator's image (`redpilot backup`, see [`crate::backup`]), on a
//! replica whenever one can serve. The bytes never pass through the
//! operator: it creates the Job, follows it, and fills the status from the
//! manifest the agent leaves as its termination message.
//!
//! Pending → Running (the Job exists; the key and source are in the status
//! first, so an operator restarted mid-way re-creates the same Job) →
//! Completed (size, keys, SHA-256, engine, source, offset from the manifest)
//! or Failed (a bounded reason and a message naming the cause, never a
//! secret). Failures worth retrying (the source or the store went away) are
//! retried by the Job with backoff; the others fail the Job at once
//! (its podFailurePolicy). A failed upload leaves no object under the key.
//!
//! A Cluster Redis is backed up shard by shard, all at once: one Job per
//! shard on its best replica, each file under `<key>/shard-<i>.rdb` with
//! the shard and its slots in its manifest; `status.shards` follows each,
//! and the backup completes when every shard did.
//!
//! Deleting a RedisBackup keeps the stored backup unless its
//! `deletionPolicy` is `Delete`: then a finalizer holds the object until the
//! backup and its manifest are removed from the bucket. A Redis never owns
//! its backups: deleting it deletes none.
//!
//! One backup's life from the first pass to its end (start, follow the
//! Job, read its outcome) reads as one sequence here; the status writes are
//! in `outcome`, deletion in `delete`, the pure Job builders in `job`.

mod delete;
pub mod job;
mod outcome;
mod shards;
mod verify;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::agent::{self, Target};
use crate::api::v1alpha1::{
    BackupOrigin, BackupPhase, DeletionPolicy, Mode, Redis, RedisBackup, RedisBackupStatus,
    S3Location,
};
use crate::controller::base::FIELD_MANAGER;
use crate::controller::error::Error;

use crate::telemetry::Metrics;

/// Holds a RedisBackup whose stored backup is deleted with it.
pub const FINALIZER: &str = "redpilot.io/delete-stored-backup";
/// The field manager of the finalizer alone: a schedule creates its backups
/// as [`FIELD_MANAGER`], and an apply of the finalizer under that name
/// would give up (delete) the spec it applied.
pub const FINALIZER_MANAGER: &str = "redpilot-finalizer";
/// The field manager that cuts the deadline of a Job whose pod cannot
/// start (the rest of the Job stays [`FIELD_MANAGER`]'s).
pub const STOP_MANAGER: &str = "redpilot-stop";

/// Shared by the backup reconciles.
pub struct BackupContext {
    /// The API client.
    pub client: Client,
    /// Publishes events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The Redis the operator watches (read without an API call).
    pub redis: Store<crate::controller::cache::Frozen<Redis>>,
    /// Operator-wide settings.
    pub settings: Arc<crate::controller::Settings>,
}

/// Runs the RedisBackup controller in `ns` (all namespaces when `None`).
pub async fn run(client: Client, ns: Option<String>, ctx: Arc<BackupContext>) {
    let backups: Api<RedisBackup> = crate::controller::base::scoped_api(&client, &ns);
    let jobs: Api<Job> = crate::controller::base::scoped_api(&client, &ns);
    let managed = watcher::Config::default().labels("app.kubernetes.io/managed-by=redpilot");
    let controller = Controller::new(backups, watcher::Config::default());
    // The per-Redis series (phase, last backup) are read from these caches.
    ctx.metrics.add_source(crate::telemetry::StateSource {
        redis: ctx.redis.clone(),
        backups: controller.store(),
    });
    controller
        .owns_stream(
            watcher(jobs, managed)
                .default_backoff()
                .modify(|j: &mut Job| j.metadata.managed_fields = None)
                .applied_objects(),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "backup reconcile");
            }
        })
        .await;
}

fn error_policy(b: Arc<RedisBackup>, err: &Error, ctx: Arc<BackupContext>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[err.category()])
        .inc();
    tracing::warn!(backup = %ObjectRef::from_obj(b.as_ref()), error = %err, "backup reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// One pass over one RedisBackup.
#[tracing::instrument(name = "backup.reconcile", skip_all, fields(backup.namespace = b.namespace().unwrap_or_default(), backup.name = b.name_any(), redis = b.spec.redis))]
pub async fn reconcile(b: Arc<RedisBackup>, ctx: Arc<BackupContext>) -> Result<Action, Error> {
    let ns = b.namespace().ok_or(Error::Incomplete("namespace"))?;
    let mut r = Pass {
        api: Api::namespaced(ctx.client.clone(), &ns),
        ns,
        name: b.name_any(),
        b,
        ctx,
    };
    r.run().await
}

/// Where one backup Job stands.
enum Part {
    /// Not ended; `started` once its agent runs.
    Running {
        /// Its agent runs.
        started: bool,
    },
    /// Stored, as its manifest describes.
    Done(Box<crate::backup::Manifest>),
    /// Ended without a backup: a bounded reason and what happened.
    Failed(&'static str, String),
}

struct Pass {
    b: Arc<RedisBackup>,
    ctx: Arc<BackupContext>,
    api: Api<RedisBackup>,
    ns: String,
    name: String,
}

impl Pass {
    fn status(&self) -> RedisBackupStatus {
        self.b.status.clone().unwrap_or_default()
    }

    fn uid(&self) -> Result<String, Error> {
        self.b
            .metadata
            .uid
            .clone()
            .ok_or(Error::Incomplete("metadata.uid"))
    }

    fn target(&self) -> Result<Target<'_>, Error> {
        let t = &self.b.spec.target;
        Target::of(t.s3.as_ref(), t.volume.as_ref()).ok_or(Error::Incomplete("spec.target"))
    }

    async fn run(&mut self) -> Result<Action, Error> {
        let wants_finalizer = self.b.spec.deletion_policy == DeletionPolicy::Delete;
        let has_finalizer = self.b.finalizers().iter().any(|f| f == FINALIZER);
        if self.b.meta().deletion_timestamp.is_some() {
            if has_finalizer {
                if !self.delete_stored().await? {
                    return Ok(Action::await_change());
                }
                self.set_finalizer(false).await?;
            }
            return Ok(Action::await_change());
        }
        if wants_finalizer != has_finalizer {
            self.set_finalizer(wants_finalizer).await?;
        }
        let st = self.status();
        match st.phase {
            Some(BackupPhase::Completed) | Some(BackupPhase::Failed) => Ok(Action::await_change()),
            _ if !st.shards.is_empty() => self.follow_shards(st).await,
            _ if st.job.is_none() => self.start().await,
            _ => self.follow(st).await,
        }
    }

    async fn start(&mut self) -> Result<Action, Error> {
        let spec = self.b.spec.clone();
        let Some(redis) = self.redis_or_api().await? else {
            let msg = format!(
                "spec.redis: Redis {} does not exist in namespace {}",
                spec.redis, self.ns
            );
            return self.fail("RedisNotFound", msg).await;
        };
        if let Some(s3) = &spec.target.s3
            && let Some(r) = self.refusal(s3).await?
        {
            return self.fail(r.reason, r.message).await;
        }
        if let Some(v) = &spec.target.volume
            && !self.claim_exists(&v.claim_name).await?
        {
            let msg = format!(
                "spec.target.volume.claimName: PersistentVolumeClaim {} does not exist in namespace {}",
                v.claim_name, self.ns
            );
            return self.fail("ClaimNotFound", msg).await;
        }
        if self.agent_user().await?.is_none() {
            return self
                .pending(format!(
                    "waiting for the backup agent's user on every instance of Redis {}",
                    spec.redis
                ))
                .await;
        }
        // A spec the operator has not taken yet may restart the instances
        // (a roll asked for while no operator ran): which ones is known
        // once it has built the StatefulSets for it.
        if let Some(seen) = spec_not_taken(&redis) {
            return self.pending(seen).await;
        }
        if redis.spec.mode() == Mode::Cluster {
            return self.start_shards(&redis).await;
        }
        let restarting = self.restarting(&redis).await?;
        let candidates = job::source_candidates(&redis, |n| !restarting.contains(n));
        if candidates.is_empty() {
            if let Some(s) = job::choose_source(&redis) {
                return self
                    .pending(format!(
                        "waiting for the ordered restart of Redis {} under way: {s}, like every \
                         instance that could serve, is about to restart",
                        spec.redis
                    ))
                    .await;
            }
            return self
                .pending(format!(
                    "waiting for an instance of Redis {} to be ready",
                    spec.redis
                ))
                .await;
        }
        let confirmed = match self.confirm_source(&redis, &candidates, None).await? {
            Ok(c) => c,
            Err(why) => {
                return self
                    .pending(format!(
                        "waiting for an instance of Redis {} whose server confirms it can serve: {why}",
                        spec.redis
                    ))
                    .await;
            }
        };
        let (source, host) = (confirmed.pod.clone(), confirmed.host.clone());
        let now = chrono::Utc::now();
        let key = self.object_key(now);
        let job_name = job::job_name(&self.name, &self.uid()?, "backup");
        let st = RedisBackupStatus {
            phase: Some(BackupPhase::Running),
            started_at: Some(crate::controller::base::rfc3339(now)),
            location: Some(self.target()?.location(&key)),
            key: Some(key.clone()),
            source: Some(source.clone()),
            source_offset: confirmed.offset,
            job: Some(job_name.clone()),
            origin: Some(BackupOrigin::of(&redis.spec)),
            ..Default::default()
        };
        // The key and source first: a pass after a crash here re-creates
        // the same Job.
        self.write_status(&st).await?;
        let from = (source.as_str(), host.as_str(), confirmed.offset);
        if let Some(refused) = self.apply_job(&job_name, from, &key, None).await? {
            return self.fail("JobRejected", refused).await;
        }
        let note = format!(
            "backing up {source} of Redis {} to {}",
            spec.redis,
            st.location.clone().unwrap_or_default()
        );
        self.event(EventType::Normal, "BackupStarted", note).await;
        Ok(Action::await_change())
    }

    /// The object key of this backup started at `now` (see
    /// [`job::object_key`]).
    fn object_key(&self, now: chrono::DateTime<chrono::Utc>) -> String {
        let spec = &self.b.spec;
        let prefix = spec.target.s3.as_ref().and_then(|s| s.prefix.as_deref());
        let stamp = now.format("%Y%m%dT%H%M%SZ").to_string();
        job::object_key(prefix, &self.ns, &spec.redis, &self.name, &stamp)
    }

    /// Applies the backup Job; `Some(why)` when the API server refuses it
    /// as invalid (retrying the same Job cannot help).
    async fn apply_job(
        &self,
        name: &str,
        (source, host, min_offset): (&str, &str, Option<i64>),
        key: &str,
        shard: Option<(i32, &str)>,
    ) -> Result<Option<String>, Error> {
        let as_user = self.agent_user().await?.unwrap_or(true);
        // A Redis with TLS is read over TLS: the agent gets its CA.
        let redis = self
            .ctx
            .redis
            .get(&ObjectRef::new(&self.b.spec.redis).within(&self.ns))
            .and_then(|r| r.thaw());
        let tls_secret = redis
            .as_ref()
            .and_then(crate::controller::layout::secret_of);
        let tls_present = redis
            .as_ref()
            .is_some_and(crate::controller::layout::asks_clients);
        let from = job::JobSource {
            pod: source,
            host,
            shard,
            tls_secret: tls_secret.as_deref(),
            tls_present,
            min_offset,
        };
        let j = job::job(&self.b, name, self.target()?, &from, key, as_user);
        match self.apply(j).await {
            Ok(()) => Ok(None),
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 422 => Ok(Some(format!(
                "the API server refused Job {name}: {}",
                e.message
            ))),
            Err(e) => Err(e),
        }
    }

    async fn apply(&self, j: Job) -> Result<(), Error> {
        let name = j.metadata.name.clone().unwrap_or_default();
        self.ctx.metrics.kube("apply_job");
        Api::<Job>::namespaced(self.ctx.client.clone(), &self.ns)
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&j),
            )
            .await?;
        Ok(())
    }

    async fn follow(&mut self, st: RedisBackupStatus) -> Result<Action, Error> {
        let job_name = st.job.clone().unwrap_or_default();
        match self
            .follow_part(
                &job_name,
                st.source.as_deref(),
                st.source_offset,
                st.key.as_deref(),
                None,
            )
            .await?
        {
            Part::Done(m) => self.complete(st, *m).await,
            Part::Failed(reason, msg) => self.fail(reason, msg).await,
            // Pod changes do not wake this controller: look again soon
            // while no agent runs (none started yet, or a retry is due); a
            // running agent's end changes the Job, which does.
            Part::Running { started: true } => Ok(Action::await_change()),
            Part::Running { started: false } => Ok(Action::requeue(Duration::from_secs(10))),
        }
    }

    /// Where the Job `job_name` (backing up `source` to `key`) stands. A
    /// Job that is gone is applied again; one whose pod cannot start is
    /// stopped.
    async fn follow_part(
        &self,
        job_name: &str,
        source: Option<&str>,
        min_offset: Option<i64>,
        key: Option<&str>,
        shard: Option<(i32, &str)>,
    ) -> Result<Part, Error> {
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        self.ctx.metrics.kube("get_job");
        let Some(j) = jobs.get_opt(job_name).await? else {
            // Deleted by someone, or never created (a crash right after the
            // status was written): the same Job again, from the status.
            let (Some(source), Some(key)) = (source, key) else {
                return Ok(Part::Failed("JobFailed", "the backup Job is gone".into()));
            };
            // The Secret's mark and the endpoint are checked again: since
            // the first Job the owner may have taken the loan back.
            if let Some(s3) = &self.b.spec.target.s3
                && let Some(r) = self.refusal(s3).await?
            {
                return Ok(Part::Failed(r.reason, r.message));
            }
            let Some(host) = self.pod_ip(source).await? else {
                let msg = format!("the source instance {source} is gone");
                return Ok(Part::Failed("SourceFailed", msg));
            };
            // The agent reads the source only at the replication offset
            // it had reached when it was chosen, or past it: one restarted
            // empty since fails the part `SourceChanged` rather than be read.
            let from = (source, host.as_str(), min_offset);
            if let Some(refused) = self.apply_job(job_name, from, key, shard).await? {
                return Ok(Part::Failed("JobRejected", refused));
            }
            return Ok(Part::Running { started: false });
        };
        let uid = self.uid()?;
        if !job::controlled_by(&j, &uid) {
            let msg = format!(
                "Job {job_name} is not controlled by this RedisBackup (uid {uid}); its outcome is not this backup's"
            );
            return Ok(Part::Failed("JobNotOwned", msg));
        }
        if job::condition(&j, "Complete").is_some() {
            return Ok(match self.agent_outcome(job_name, true).await? {
                Some(agent::Outcome::Done(m)) => match job::manifest_mismatch(key, &m) {
                    Some(why) => Part::Failed("ManifestMismatch", why),
                    None => Part::Done(m),
                },
                Some(agent::Outcome::Failed { reason, message }) => {
                    Part::Failed(agent::bounded_reason(&reason), message)
                }
                _ => Part::Failed(
                    "JobFailed",
                    "the backup Job succeeded but its pod left no manifest".into(),
                ),
            });
        }
        if let Some(c) = job::condition(&j, "Failed").cloned() {
            if c.reason.as_deref() == Some("DeadlineExceeded") {
                let limit = j
                    .spec
                    .as_ref()
                    .and_then(|s| s.active_deadline_seconds)
                    .unwrap_or_else(|| self.b.spec.timeout_seconds());
                let msg = format!(
                    "the backup did not end within {limit} s (spec.timeoutSeconds); Job {job_name} was stopped: {}",
                    c.message.unwrap_or_default()
                );
                return Ok(Part::Failed("DeadlineExceeded", msg));
            }
            return Ok(match self.agent_outcome(job_name, false).await? {
                Some(agent::Outcome::Failed { reason, message }) => {
                    Part::Failed(agent::bounded_reason(&reason), message)
                }
                _ => {
                    let why = c.message.unwrap_or_else(|| c.reason.unwrap_or_default());
                    Part::Failed("JobFailed", format!("the backup Job failed: {why}"))
                }
            });
        }
        // Running, or waiting for a pod that may never start.
        let pods = self.job_pods(job_name).await?;
        let now = chrono::Utc::now();
        if let Some((reason, msg)) = pods.iter().find_map(|p| job::cannot_start(p, now)) {
            // The Job would otherwise wait until its deadline; if it cannot
            // be stopped now, that deadline still ends it.
            if let Err(e) = self.stop_job(job_name).await {
                tracing::warn!(job = %job_name, error = %e, "could not stop a backup Job whose pod cannot start");
            }
            return Ok(Part::Failed(reason, msg));
        }
        let started = pods.iter().any(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                })
        });
        Ok(Part::Running { started })
    }

    /// The pods of the Job `job_name`.
    async fn job_pods(&self, job_name: &str) -> Result<Vec<Pod>, Error> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        self.ctx.metrics.kube("list_pods");
        let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job_name}"));
        Ok(pods.list(&lp).await?.items)
    }

    /// Ends a Job that cannot do its work: its deadline is cut to one
    /// second past its start, so the Job controller fails it and removes
    /// its pods at once (the Job stays, with its condition, until the
    /// RedisBackup is deleted). Applied under a field manager of its own, so
    /// the Job's other fields stay the operator's.
    async fn stop_job(&self, job_name: &str) -> Result<(), Error> {
        let patch = serde_json::json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job_name},
            "spec": {"activeDeadlineSeconds": 1},
        });
        self.ctx.metrics.kube("apply_job");
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match jobs
            .patch(
                job_name,
                &PatchParams::apply(STOP_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The outcome the agent left in the newest pod of the Job that
    /// succeeded (`ok`) or failed.
    async fn agent_outcome(
        &self,
        job_name: &str,
        ok: bool,
    ) -> Result<Option<agent::Outcome>, Error> {
        let mut found: Vec<(String, i32, Option<String>)> = self
            .job_pods(job_name)
            .await?
            .into_iter()
            .filter_map(|p| {
                let created = p.metadata.creation_timestamp.as_ref()?.0.to_string();
                let statuses = p.status?.container_statuses.unwrap_or_default();
                let (code, msg) = agent::termination(&statuses, job::CONTAINER)?;
                Some((created, code, msg))
            })
            .filter(|(_, code, _)| (*code == 0) == ok)
            .collect();
        found.sort();
        Ok(found
            .pop()
            .and_then(|(_, _, msg)| msg)
            .and_then(|m| agent::outcome(&m)))
    }

    /// Why the agent may not get the credentials Secret or reach the
    /// endpoint of `s3` (see [`crate::controller::trust`]), naming the
    /// field; never a Secret's content. Checked before any Job exists, so
    /// nothing leaves the cluster when refused.
    pub(super) async fn refusal(
        &self,
        s3: &S3Location,
    ) -> Result<Option<crate::controller::trust::Refusal>, Error> {
        Ok(crate::controller::trust::check_s3(
            &self.ctx.client,
            &self.ctx.metrics,
            &self.ctx.settings.endpoints,
            &self.ns,
            s3,
            "spec.target.s3",
        )
        .await?)
    }

    /// Whether the agent authenticates as its own user
    /// (`redpilot-backup`): `Some(true)` once every instance of the Redis
    /// has it, `Some(false)` for a Redis without a password, `None` while
    /// the user is not on every instance yet (read from the Redis's
    /// server-auth Secret, which records both).
    async fn agent_user(&self) -> Result<Option<bool>, Error> {
        use crate::controller::names as build;
        let name = build::Names::new(&self.b.spec.redis).server_auth();
        self.ctx.metrics.kube("get_secret");
        let secret: Option<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.ctx.client.clone(), &self.ns)
                .get_opt(&name)
                .await?;
        let Some(data) = secret.and_then(|s| s.data) else {
            return Ok(None);
        };
        let has = |k: &str| data.get(k).is_some_and(|v| !v.0.is_empty());
        Ok(if !has(build::PASSWORD_KEY) {
            Some(false)
        } else if has(build::BACKUP_PASSWORD_KEY) && has(build::USERS_APPLIED_KEY) {
            Some(true)
        } else {
            None
        })
    }

    /// The address the agent reads `pod` (an instance of `redis`) at, or
    /// what the backup waits for: the pod's address, or the pod to listen
    /// the way the agent speaks ([`job::listens_otherwise`]; a backup
    /// started while TLS is turned on or off waits for the ordered restart
    /// rather than fail).
    async fn source_address(
        &self,
        redis: &Redis,
        pod: &str,
    ) -> Result<std::result::Result<String, String>, Error> {
        let p = self.pod(pod).await?;
        let tls = crate::controller::layout::secret_of(redis).is_some();
        if let Some(why) = p.as_ref().and_then(|p| job::listens_otherwise(p, tls)) {
            return Ok(Err(format!(
                "waiting for the source to listen as the agent speaks: {why}"
            )));
        }
        Ok(p.and_then(|p| p.status)
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| format!("waiting for {pod} to have an address")))
    }

    /// The instances of `redis` an ordered restart under way is about to
    /// restart ([`job::restart_pending`]): a backup is not started from
    /// them (the agent reads the pod's address, which a restart changes).
    async fn restarting(&self, redis: &Redis) -> Result<std::collections::BTreeSet<String>, Error> {
        use k8s_openapi::api::apps::v1::StatefulSet;
        let selector = format!("app.kubernetes.io/instance={}", redis.name_any());
        let lp = ListParams::default().labels(&selector);
        self.ctx.metrics.kube("list_statefulsets");
        let sets: Vec<StatefulSet> = Api::namespaced(self.ctx.client.clone(), &self.ns)
            .list(&lp)
            .await?
            .items;
        self.ctx.metrics.kube("list_pods");
        let pods: Vec<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns)
            .list(&lp)
            .await?
            .items;
        Ok(pods
            .iter()
            .filter(|p| {
                // A pod's StatefulSet is its name without the ordinal.
                let name = p.name_any();
                let set = name.rsplit_once('-').map(|(s, _)| s).unwrap_or_default();
                sets.iter()
                    .find(|s| s.name_any() == set)
                    .is_some_and(|s| job::restart_pending(p, s))
            })
            .map(|p| p.name_any())
            .collect())
    }

    /// The Redis this backup is of, from the watch cache.
    fn redis(&self) -> Option<Redis> {
        self.ctx
            .redis
            .get(&ObjectRef::new(&self.b.spec.redis).within(&self.ns))
            .and_then(|r| r.thaw())
    }

    /// The Redis from the cache, or when the cache lacks it from the API:
    /// an operator that just started may still be listing the Redis, and a
    /// backup asked for then must not fail as if its Redis did not exist.
    async fn redis_or_api(&self) -> Result<Option<Redis>, Error> {
        if let Some(r) = self.redis() {
            return Ok(Some(r));
        }
        self.ctx.metrics.kube("get_redis");
        Ok(Api::<Redis>::namespaced(self.ctx.client.clone(), &self.ns)
            .get_opt(&self.b.spec.redis)
            .await?)
    }

    async fn pod_ip(&self, pod: &str) -> Result<Option<String>, Error> {
        Ok(self
            .pod(pod)
            .await?
            .and_then(|p| p.status)
            .and_then(|s| s.pod_ip))
    }

    /// The pod `pod` of this namespace, read from the API.
    async fn pod(&self, pod: &str) -> Result<Option<Pod>, Error> {
        self.ctx.metrics.kube("get_pod");
        Ok(Api::namespaced(self.ctx.client.clone(), &self.ns)
            .get_opt(pod)
            .await?)
    }

    async fn claim_exists(&self, claim: &str) -> Result<bool, Error> {
        self.ctx.metrics.kube("get_pvc");
        let pvc: Option<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(self.ctx.client.clone(), &self.ns)
                .get_opt(claim)
                .await?;
        Ok(pvc.is_some())
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let obj = self.b.object_ref(&());
        let (recorder, metrics) = (&self.ctx.recorder, &self.ctx.metrics);
        crate::controller::events::publish_event(
            recorder, metrics, &obj, type_, reason, "Backup", note,
        )
        .await;
    }
}

/// Why a source cannot be chosen yet: `redis`'s latest spec has not been
/// taken by the operator (`status.observedGeneration` behind
/// `metadata.generation`), so its StatefulSets may not yet say which
/// instances a roll will restart.
fn spec_not_taken(redis: &Redis) -> Option<String> {
    let generation = redis.metadata.generation?;
    let seen = redis.status.as_ref().and_then(|s| s.observed_generation);
    (seen.is_none_or(|g| g < generation)).then(|| {
        format!(
            "waiting for the operator to take generation {generation} of Redis {} (it may restart instances a backup would read from)",
            redis.name_any()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::spec_not_taken;
    use crate::api::v1alpha1::{Redis, RedisStatus};

    fn redis(generation: Option<i64>, observed: Option<i64>) -> Redis {
        let mut r = Redis::new("cache", Default::default());
        r.metadata.generation = generation;
        r.status = Some(RedisStatus {
            observed_generation: observed,
            ..Default::default()
        });
        r
    }

    #[test]
    fn a_backup_waits_until_the_latest_spec_is_taken() {
        assert_eq!(spec_not_taken(&redis(Some(2), Some(2))), None);
        let why = spec_not_taken(&redis(Some(3), Some(2))).expect("waits");
        assert!(why.contains("generation 3 of Redis cache"), "{why}");
        assert!(spec_not_taken(&redis(Some(1), None)).is_some());
        // No generation (not from an API server): nothing to wait for.
        assert_eq!(spec_not_taken(&redis(None, None)), None);
    }
}
