//! Reconciles one `Redis`. How a pass flows, step by step and what each
//! returns, is `docs/how-a-pass-flows.md`. Layers, bottom up (every import
//! points down; `python3 hack/import-circles.py` lists any circle):
//!
//! 1. Below the controller: [`crate::controller::names`] (the children's
//!    names, labels, keys, the metadata every child gets),
//!    [`crate::controller::layout`] (TLS files and mounts, probe marks, the
//!    containers' security context), [`crate::controller::error`],
//!    [`crate::controller::base`], [`crate::controller::events`],
//!    [`crate::controller::queue`] (the requeue intervals).
//! 2. Facts and pure rules, no I/O: [`facts`] (what a pass knows about each
//!    pod and server), [`report`] (what steps find and decide, for the
//!    status), the pure builders and decisions: [`conf`] (redis.conf, the
//!    ConfigMap, the restart hash), [`auth`] (the server-auth Secret, ACL
//!    lines), [`material`] (a certificate Secret checked),
//!    [`autopilot::limits`] and [`autopilot::policy`], [`build`]
//!    (Services, PDB), [`statefulset`], [`cluster::build`], [`drift`],
//!    [`plan`] and [`cluster::plan`] (over [`cluster::model`]),
//!    [`cluster::moves`], [`status::record`].
//! 3. Steps: `impl Reconciler` blocks, one module per capability (table).
//!    A step reads the pass's inputs and [`Reach`], adds findings to the
//!    [`report::Report`], and returns what it decides.
//! 4. Two topology passes, entered from `run` (the one place that tells the
//!    modes apart for a whole pass): [`replication`] (Standalone and
//!    Replication: one StatefulSet, one primary) and [`cluster`] (one
//!    StatefulSet per shard, slots, `CLUSTER FAILOVER`). Each calls the
//!    steps in order, keeps their [`report::Outcomes`] and ends in the
//!    status step.
//!
//! | step | module | returns / what |
//! |---|---|---|
//! | begin | `Reconciler::begin` here, [`observe`] | the passwords, TLS material, pods and servers as observed ([`Reach`] set) |
//! | decide | [`plan`], [`cluster::plan`] | pure: who is primary, what restarts next; meet, slots, replicas, forget |
//! | bootstrap | [`bootstrap`] | whether a Redis loaded from a backup may go on (`status.bootstrap`) |
//! | hibernate | [`hibernate`] | whether the data is saved and the pods are to go (`status.hibernation`) |
//! | failover | [`failover`] | a lost primary replaced (fenced first) |
//! | upgrade | [`upgrade`] | `UpgradeFailed` when the spec cannot be served (`status.upgrade`) |
//! | config | [`config`] | live keys tracked; later `CONFIG SET` live, returning refused settings |
//! | autopilot | [`autopilot`] | the memory condition and next look; [`autopilot::resize`] moves instances to the limit, [`autopilot::shards`] the shard count |
//! | children | [`children`] | `Applied { hold, template_changed }`: server-side apply in a fixed order, drift repair, ownership |
//! | credentials, users | [`credentials`], [`users`] | the password rotated live; ACL users checked and applied |
//! | tls | [`tls`], [`certmanager`], [`issuer`] | certificates checked, issued, reloaded live; TLS turned on and off |
//! | follow | [`follow`] | with `spec.replicaOf` the primary on its source (`status.replicaOf`); the promotion off it (`status.promotion`); a Redis demoted from outside held (`status.demoted`) |
//! | wiring | [`wiring`], [`recovery`] | replication topology, role labels, the primary published (recorded in the report) |
//! | rollout | [`rollout`], [`cluster::roll`] | ordered restarts, switchovers |
//! | reshard | [`cluster::reshard`] | one step of slots moving (`status.resharding`) |
//! | tuning | [`tuning`] | the findings and `status.tuning` |
//! | status | [`status`], [`cluster::summary`] | conditions, events, one status patch, the requeue and its backoff |
//!
//! This file holds the entry point and what every step shares.

pub mod archive;
pub mod auth;
pub mod autopilot;
pub mod bootstrap;
pub mod build;
pub mod certmanager;
pub mod children;
pub mod cluster;
pub mod conf;
pub mod config;
pub mod credentials;
pub mod drift;
pub mod facts;
pub mod failover;
pub mod follow;
pub mod hibernate;
pub mod issuer;
pub mod kept;
pub mod light;
pub mod material;
pub mod network;
pub mod observe;
pub mod plan;
pub mod recovery;
pub mod replication;
pub mod report;
pub mod rollout;
pub mod statefulset;
pub mod status;
pub mod tls;
pub mod tuning;
pub mod upgrade;
pub mod users;
pub mod volumes;
pub mod wiring;

use std::sync::Arc;
use std::time::Duration;

use crate::controller::queue::Next;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use self::observe::Auth;
use super::Context;
use crate::api::v1alpha1::{Engine, Mode, Redis};
use crate::controller::error::Error;
use crate::controller::names::Names;
use crate::redis::ConnectOptions;
use crate::redis::info::{EngineKind, Version};

/// Entry point from the controller.
pub async fn reconcile(redis: Arc<Redis>, ctx: Arc<Context>) -> Result<Next, Error> {
    if redis.meta().deletion_timestamp.is_some() {
        // Children carry owner references: the garbage collector removes
        // them, and the StatefulSet's PVC retention policy decides the data.
        return Ok(Next::on_change());
    }
    let ns = redis.namespace().ok_or(Error::Incomplete("namespace"))?;
    let names = Names::new(&redis.name_any());
    let oref = ObjectRef::from_obj(redis.as_ref());
    // A periodic pass of a calm Redis that nothing changed since its last
    // full pass: only what that pass read past the caches is read again.
    let epoch = ctx.metrics.queue.epoch(&oref);
    if light::unchanged(&redis, &oref, &ns, &ctx).await {
        ctx.metrics.light_passes.inc();
        return Ok(Next::after(crate::controller::queue::STEADY_REQUEUE));
    }
    ctx.metrics.queue.drop_mark(&oref);
    // The records the status carries from pass to pass (`upgrade`,
    // `bootstrap`, `hibernation`, `resharding`) are read in `run`, after
    // the object is refreshed: the cache may not have seen the last write.
    let mut r = Reconciler {
        redis,
        ctx,
        ns,
        names,
        oref,
        reach: Reach::default(),
        records: Records::default(),
        report: report::Report::default(),
        config_applied: None,
        reads: Default::default(),
    };
    let action = r.run().await?;
    if !r.redis.spec.paused {
        r.apply_insights().await;
    }
    light::leave_mark(&r, epoch, action);
    Ok(action)
}

/// What the first steps of a pass ([`Reconciler::begin`]) give the
/// topology passes.
struct Begun {
    /// The password the user wants (rolled out live by `rotate_password`).
    wanted: String,
    /// The password the servers run, and the one before it.
    auth: auth::ServerAuth,
    /// Connection options with the running password.
    opts: ConnectOptions,
    /// Pods and servers as observed.
    obs: observe::Observed,
}

/// One reconcile pass. Steps are its methods (one module per capability);
/// what each may touch:
///
/// - the inputs, set before the first step: the Redis (replaced only by
///   the pass's own status writes, and by the upgrade's view of what to
///   serve), the context, the namespace, the children's names;
/// - [`Reach`]: how the servers are reached, set by [`Self::begin`] and
///   read by every step after it;
/// - [`Records`]: the status records a pass carries on, each written by
///   one step;
/// - [`report::Report`]: what the steps found, added to by any step, read
///   by the status step.
///
/// What a step decides for the steps after it, or for the status, is its
/// return value ([`report::Outcomes`] for the status), not a field.
pub struct Reconciler {
    redis: Arc<Redis>,
    ctx: Arc<Context>,
    ns: String,
    names: Names,
    oref: ObjectRef<Redis>,
    reach: Reach,
    records: Records,
    report: report::Report,
    /// The ConfigMap this pass applied (a step later in the pass that
    /// must publish one more key starts from it).
    config_applied: Option<k8s_openapi::api::core::v1::ConfigMap>,
    /// What this pass read from the API past the caches (see [`light`]).
    reads: std::sync::Mutex<Vec<crate::controller::queue::Read>>,
}

/// How this pass reaches the servers: set by [`Reconciler::begin`] (the
/// TLS material and the observation), read by the steps after it.
#[derive(Default)]
struct Reach {
    /// Whether this pass asked the servers (so an instance that did not
    /// answer is a finding, not a gap in the observation).
    servers_observed: bool,
    /// The certificate Secret of `spec.tls`, checked this pass.
    tls: Option<material::TlsMaterial>,
    /// While TLS is turned off: the certificate Secret the instances that
    /// still listen with TLS serve (the one their pods mount).
    leaving_tls: Option<material::TlsMaterial>,
    /// While TLS is turned off: the name of the Secret a pod that still
    /// listens with TLS mounts (known even when it cannot be read).
    leaving_secret: Option<String>,
    /// Which servers listen with TLS while not all listen as `spec.tls`
    /// says (see [`tls::Reconciler::listeners_of`]).
    listeners: Option<Arc<crate::redis::Listeners>>,
    /// How this pass connects to the servers (for a step that runs after
    /// the topology pass handed its options over).
    opts: Option<ConnectOptions>,
}

/// The status records a pass carries on from the last one (read in
/// `run`, after the object is refreshed) and leaves for the status step;
/// each is written by one step.
#[derive(Default)]
struct Records {
    /// `status.upgrade` (the `upgrade` step).
    upgrade: Option<crate::api::v1alpha1::UpgradeStatus>,
    /// `status.bootstrap` (the `bootstrap` step).
    bootstrap: Option<crate::api::v1alpha1::BootstrapStatus>,
    /// `status.hibernation` (the `hibernate` step).
    hibernation: Option<crate::api::v1alpha1::HibernationStatus>,
    /// `status.resharding` (the Cluster topology's `reshard` step).
    resharding: Option<crate::api::v1alpha1::ReshardingStatus>,
}

impl Reconciler {
    fn uid(&self) -> &str {
        self.redis.metadata.uid.as_deref().unwrap_or("")
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let obj = self.redis.object_ref(&());
        let (recorder, metrics) = (self.ctx.events.recorder(), &self.ctx.metrics);
        crate::controller::events::publish_event(
            &recorder, metrics, &obj, type_, reason, action, note,
        )
        .await;
    }

    /// A data-plane action failed: Degraded with a reason by category, a
    /// Warning event, and `reconcile_errors_total{category}`. The pass goes
    /// on with the other instances; the next pass retries.
    async fn data_plane_failed(&mut self, what: String, e: &crate::redis::Error) {
        let category = crate::controller::error::redis_category(e);
        self.data_plane_category(format!("{what}: {e}"), category)
            .await;
    }

    /// As [`Self::data_plane_failed`], with the message given (for errors
    /// whose text must not be passed on).
    async fn data_plane_category(&mut self, msg: String, category: &'static str) {
        let reason = match category {
            "redis_auth" => "RedisAuthFailed",
            "redis_unreachable" => "RedisUnreachable",
            _ => "RedisCommandFailed",
        };
        self.report_failure(reason, "Reconcile", category, msg)
            .await;
    }

    /// A failure the pass goes on after: the Degraded reason (the first of
    /// the pass wins), a Warning event, `reconcile_errors_total{category}`
    /// and the message in the Degraded condition.
    async fn report_failure(
        &mut self,
        reason: &'static str,
        action: &str,
        category: &'static str,
        msg: String,
    ) {
        self.ctx
            .metrics
            .reconcile_errors
            .with_label_values(&[category])
            .inc();
        self.report.degraded(reason);
        self.event(EventType::Warning, reason, action, msg.clone())
            .await;
        self.report.note(msg);
    }

    /// The PodMonitor and PrometheusRule, when the cluster serves them,
    /// after every pass that got through: a failure here is reported (event,
    /// metric) and holds nothing else up.
    async fn apply_insights(&mut self) {
        let (ctx, redis) = (&self.ctx, &self.redis);
        match crate::controller::insights::objects::reconcile(
            &ctx.client,
            &ctx.insights,
            &ctx.metrics,
            redis,
        )
        .await
        {
            Ok(wrote) => {
                if wrote {
                    self.report.wrote();
                }
            }
            Err(e) => {
                ctx.metrics
                    .reconcile_errors
                    .with_label_values(&[e.category()])
                    .inc();
                let msg = format!("applying the PodMonitor and PrometheusRule: {e}");
                tracing::warn!(error = %e, "monitoring objects");
                self.event(EventType::Warning, "MonitoringFailed", "Apply", msg)
                    .await;
            }
        }
    }

    /// The conflict when an object of `kind` this pass would write
    /// exists (`meta`) and is neither controlled by this Redis nor left
    /// for it by an earlier install ([`children::adoptable`]).
    fn foreign(&self, kind: &'static str, meta: Option<&kube::api::ObjectMeta>) -> Option<Error> {
        let meta = meta?;
        let name = meta.name.clone().unwrap_or_default();
        (!crate::controller::names::controlled_by(meta, self.uid())
            && !crate::controller::names::adoptable(meta, &self.redis.name_any()))
        .then(|| Error::Conflict {
            kind,
            name,
            owner: crate::controller::error::holder(meta),
        })
    }

    fn connect_options(&self, password: &str) -> ConnectOptions {
        let mut opts = ConnectOptions::default()
            .with_user_or_default(
                crate::controller::names::OPERATOR_USER,
                password.to_string(),
            )
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
        // While TLS is turned on or off: per server, as observed this pass.
        opts.listeners = self.reach.listeners.clone();
        match &self.reach.tls {
            Some(t) => opts.with_tls(t.options.clone()),
            None => opts,
        }
    }

    fn engine_version(&self) -> (EngineKind, Version) {
        let engine = match self.redis.spec.engine() {
            Engine::Redis => EngineKind::Redis,
            Engine::Valkey => EngineKind::Valkey,
        };
        let version = self
            .redis
            .spec
            .version()
            .parse()
            .unwrap_or(Version::new(7, 0, 0));
        (engine, version)
    }

    /// Step 1 of every pass: the desired password (the user's Secret or
    /// the generated one) and what the servers run (the server-auth
    /// Secret, created or moved on here). The inner error is a Secret that
    /// cannot be used, for the status.
    async fn passwords(
        &mut self,
        paused: bool,
    ) -> Result<Result<(String, auth::ServerAuth), Error>, Error> {
        let server_auth: Option<k8s_openapi::api::core::v1::Secret> =
            self.lookup(&self.names.server_auth()).await?;
        // Secrets of this Redis's names that someone else holds are never
        // written: the server-auth Secret, and on a new Redis (nothing
        // written yet) the certificate Secret the operator would issue, so
        // a refused name leaves nothing behind. The conflict is the outer
        // error: `run` ends the pass Degraded `Conflict`.
        if let Some(e) = self.foreign("Secret", server_auth.as_ref().map(|s| &s.metadata)) {
            return Err(e);
        }
        if server_auth.is_none() && crate::controller::layout::issues_own(&self.redis) {
            let tls: Option<k8s_openapi::api::core::v1::Secret> =
                self.fetch(&self.names.issued_tls()).await?;
            if let Some(e) = self.foreign("Secret", tls.as_ref().map(|s| &s.metadata)) {
                return Err(e);
            }
        }
        let running = server_auth
            .as_ref()
            .and_then(auth::read_server_auth)
            .map(|a| a.current);
        let wanted = match self.auth(paused, running.as_deref()).await? {
            Auth::Ok { password, .. } => password,
            Auth::Failed(e) => return Ok(Err(e)),
        };
        let auth = self
            .server_auth(server_auth.as_ref(), &wanted, paused)
            .await?;
        Ok(Ok((wanted, auth)))
    }

    /// The first steps of every pass, whatever the mode: the passwords,
    /// then the pods and servers observed with the one the servers run.
    /// `Err` holds the pass's result when the password cannot be used
    /// (the status says why).
    async fn begin(&mut self, paused: bool) -> Result<Result<Begun, Next>, Error> {
        let (wanted, auth) = match self.passwords(paused).await? {
            Ok(p) => p,
            Err(e) => return Ok(Err(self.fail_status("InvalidAuth", e).await?)),
        };
        self.reach.tls = match self.tls_material(&auth, paused).await? {
            Ok(t) => t,
            Err(tls::Unready::Unusable(e)) => {
                return Ok(Err(self.fail_status("InvalidCertificate", e).await?));
            }
            Err(tls::Unready::Waiting(what)) => {
                return Ok(Err(self.wait_status(what).await?));
            }
        };
        let mut opts = self.connect_options(&auth.current);
        let obs = self
            .observe_servers(&mut opts, !auth.current.is_empty(), auth.tls_ca.as_deref())
            .await;
        self.reach.listeners = opts.listeners.clone();
        self.reach.opts = Some(opts.clone());
        if self.reach.listeners.is_some() {
            let on = self.redis.spec.tls.is_some();
            let done = obs.facts.iter().filter(|f| f.listens_tls == on).count();
            self.report.progress(format!(
                "turning TLS {}: {done} of {} instances listen {}",
                if on { "on" } else { "off" },
                obs.facts.len(),
                if on { "with TLS" } else { "in plain text" },
            ));
        }
        self.reach.servers_observed = obs.servers_observed;
        Ok(Ok(Begun {
            wanted,
            auth,
            opts,
            obs,
        }))
    }

    /// The records a pass continues from the status: read from the
    /// object as refreshed (a pass that read them from a cache behind this
    /// operator's last status write would redo, or lose, what that write
    /// recorded: a hibernation's save, an upgrade's step).
    fn carry_records(&mut self) {
        let status = self.redis.status.as_ref();
        self.records.upgrade = status.and_then(|s| s.upgrade.clone());
        self.records.bootstrap = status.and_then(|s| s.bootstrap.clone());
        self.records.hibernation = status.and_then(|s| s.hibernation.clone());
        self.records.resharding = status.and_then(|s| s.resharding.clone());
    }

    async fn run(&mut self) -> Result<Next, Error> {
        if !self.refresh().await? {
            return Ok(Next::on_change());
        }
        self.carry_records();
        // An image the operator may not run never reaches a pod (it would
        // hold the password and the TLS key): Degraded, nothing written.
        if let Err(why) = self.ctx.images.allows(&self.redis.spec) {
            return self
                .fail_status("ImageNotAllowed", Error::ImageNotAllowed(why))
                .await;
        }
        // One seam per topology: how instances are wired, how a primary is
        // chosen and replaced and what healthy means differ by mode; the
        // steps each pass shares (password, observation, children, live
        // config, status) are methods both passes call.
        let out = match self.redis.spec.mode() {
            Mode::Cluster => self.run_cluster().await,
            Mode::Standalone | Mode::Replication => self.run_replication().await,
        };
        match out {
            // A child's name is held by an object this Redis does not
            // control: the pass stopped before writing it; Degraded, naming
            // the object and its owner.
            Err(e @ Error::Conflict { .. }) => self.fail_status("Conflict", e).await,
            other => other,
        }
    }
}
