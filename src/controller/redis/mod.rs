//! Reconciles one `Redis`: observe (children, pods, live servers) → decide →
//! apply children in a fixed order (server-side apply, only what changed) →
//! wire replication → restart what must restart → one status patch.

pub mod build;
pub mod plan;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use self::build::{INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, Names, ROLE_LABEL};
use self::plan::{PodFacts, Role};
use self::status::Cond;
use super::{Context, Error, FIELD_MANAGER};
use crate::api::v1alpha1::{Engine, InstanceStatus, Mode, Phase, Redis, RedisStatus};
use crate::redis::info::{EngineKind, Version};
use crate::redis::{ConnectOptions, Endpoint};

/// How long to wait before looking again while something is in progress.
const PROGRESS_REQUEUE: Duration = Duration::from_secs(2);
/// How often a healthy Redis is re-observed to keep status fresh.
const STEADY_REQUEUE: Duration = Duration::from_secs(60);

/// Entry point from the controller.
pub async fn reconcile(redis: Arc<Redis>, ctx: Arc<Context>) -> Result<Action, Error> {
    if redis.meta().deletion_timestamp.is_some() {
        // Children carry owner references: the garbage collector removes
        // them, and the StatefulSet's PVC retention policy decides the data.
        return Ok(Action::await_change());
    }
    let ns = redis.namespace().ok_or(Error::Incomplete("namespace"))?;
    let names = Names::new(&redis.name_any());
    let mut r = Reconciler {
        redis,
        ctx,
        ns,
        names,
        notes: Vec::new(),
        progressing: Vec::new(),
        moved_primary: None,
    };
    r.run().await
}

struct Reconciler {
    redis: Arc<Redis>,
    ctx: Arc<Context>,
    ns: String,
    names: Names,
    /// Problems to report as Degraded.
    notes: Vec<String>,
    /// Work in progress, reported as Progressing.
    progressing: Vec<String>,
    /// The primary last recorded by this reconcile (`record_primary`): the
    /// chosen one, or the target of a switchover or recovery made here.
    moved_primary: Option<String>,
}

/// A namespaced child object the reconciler reads and applies.
trait Child:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Child for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// Whether `obj` is controlled by the Redis with `uid`.
fn controlled_by(meta: &kube::api::ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Whether an object without our owner reference may be adopted: it carries
/// our instance and managed-by labels (left by an earlier install).
fn adoptable(meta: &kube::api::ObjectMeta, instance: &str) -> bool {
    let labels = meta.labels.as_ref();
    let has = |k: &str, v: &str| labels.and_then(|l| l.get(k)).map(String::as_str) == Some(v);
    let has_other_controller = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true));
    !has_other_controller && has(INSTANCE_LABEL, instance) && has(MANAGED_BY_LABEL, MANAGED_BY)
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
        self.ctx.metrics.kube("create_event");
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&ev, &self.redis.object_ref(&()))
            .await
        {
            tracing::warn!(error = %e, reason, "publishing an event failed");
        }
    }

    async fn get<K>(&self, name: &str) -> Result<Option<K>, Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        self.ctx.metrics.kube("get");
        Ok(self.api::<K>().get_opt(name).await?)
    }

    /// Applies `desired` unless the live object was built from the same
    /// content (its hash annotation matches). Refuses objects that belong to
    /// someone else; adopts ones that carry our labels. Returns whether it wrote.
    async fn apply<K>(
        &mut self,
        kind: &'static str,
        desired: &K,
        live: Option<&K>,
    ) -> Result<bool, Error>
    where
        K: Child,
    {
        let name = desired
            .meta()
            .name
            .clone()
            .ok_or(Error::Incomplete("name"))?;
        if let Some(live) = live {
            let meta = live.meta();
            let ours = controlled_by(meta, self.uid());
            if !ours && !adoptable(meta, &self.redis.name_any()) {
                return Err(Error::Conflict { kind, name });
            }
            if ours && build::stamped_hash(live) == build::stamped_hash(desired) {
                return Ok(false);
            }
            if !ours {
                self.event(
                    EventType::Normal,
                    "Adopted",
                    "Adopt",
                    format!("{kind} {name} carries this Redis's labels and was adopted"),
                )
                .await;
            }
        }
        self.ctx.metrics.kube("apply");
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.api::<K>()
            .patch(&name, &pp, &Patch::Apply(desired))
            .await?;
        Ok(true)
    }

    fn connect_options(&self, password: &str) -> ConnectOptions {
        ConnectOptions::default()
            .with_password(password.to_string())
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(5))
    }

    fn engine_version(&self) -> (EngineKind, Version) {
        let engine = match self.redis.spec.engine {
            Engine::Redis => EngineKind::Redis,
            Engine::Valkey => EngineKind::Valkey,
        };
        let version = self
            .redis
            .spec
            .version
            .parse()
            .unwrap_or(Version::new(7, 0, 0));
        (engine, version)
    }

    async fn run(&mut self) -> Result<Action, Error> {
        // The watch cache can lag behind our own status writes; decisions
        // about the primary must start from the recorded truth.
        match self.get::<Redis>(&self.redis.name_any()).await? {
            Some(fresh) => self.redis = Arc::new(fresh),
            None => return Ok(Action::await_change()),
        }
        let spec = self.redis.spec.clone();
        let paused = spec.paused;

        // 1. The password.
        let user_secret = spec.auth.as_ref().and_then(|a| a.secret_name.clone());
        let secret_name = user_secret
            .clone()
            .unwrap_or_else(|| self.names.generated_secret());
        let live_secret: Option<Secret> = self.get(&secret_name).await?;
        let password = match (&user_secret, live_secret) {
            (Some(_), Some(s)) => read_password(&s, &secret_name)?,
            (Some(_), None) => {
                return self
                    .fail_status(Error::Secret {
                        name: secret_name,
                        reason: "not found (spec.auth.secretName)".into(),
                    })
                    .await;
            }
            (None, Some(s)) => {
                let meta = &s.metadata;
                if !controlled_by(meta, self.uid()) && !adoptable(meta, &self.redis.name_any()) {
                    return self
                        .fail_status(Error::Conflict {
                            kind: "Secret",
                            name: secret_name,
                        })
                        .await;
                }
                let pw = read_password(&s, &secret_name)?;
                if !controlled_by(&s.metadata, self.uid()) && !paused {
                    // Adopt it: the same password, now owned by this Redis
                    // (so it goes with it). The data is applied too, so the
                    // apply can never drop the password.
                    let secret = build::auth_secret(&self.redis, &self.names, &pw);
                    self.apply("Secret", &secret, Some(&s)).await?;
                }
                pw
            }
            (None, None) if paused => String::new(),
            (None, None) => {
                let pw = build::generate_password().map_err(|e| Error::Random(e.to_string()))?;
                let secret = build::auth_secret(&self.redis, &self.names, &pw);
                self.apply("Secret", &secret, None).await?;
                self.event(
                    EventType::Normal,
                    "SecretCreated",
                    "Create",
                    format!("generated a password in Secret {secret_name}"),
                )
                .await;
                pw
            }
        };
        let opts = self.connect_options(&password);

        // 2. Observe pods and the live servers.
        self.ctx.metrics.kube("list");
        let selector = build::selector_labels(&self.redis)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let pods = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let live_sts: Option<StatefulSet> = self.get(&self.names.statefulset()).await?;
        let update_revision = live_sts
            .as_ref()
            .filter(|s| {
                s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
            })
            .and_then(|s| s.status.as_ref()?.update_revision.clone());
        let facts = plan::pod_facts(&pods, update_revision.as_deref());
        let endpoints: Vec<Endpoint> = facts
            .iter()
            .filter_map(|f| f.ip.as_ref().map(|ip| Endpoint::new(ip, build::REDIS_PORT)))
            .collect();
        let topology = if endpoints.is_empty() || password.is_empty() {
            None
        } else {
            Some(crate::redis::topology::observe(&endpoints, &opts).await)
        };
        let mut facts = facts;
        if let Some(topo) = &topology {
            plan::merge_topology(&mut facts, topo);
        }

        // 3. Decide the primary.
        let desired = spec.desired_instances();
        let previous_primary = self.redis.status.as_ref().and_then(|s| s.primary.clone());
        let primary = plan::choose_primary(&facts, previous_primary.as_deref(), &self.names);

        if paused {
            self.progressing
                .push("reconciliation is paused (spec.paused)".into());
            return self.finish(&facts, primary.as_deref(), desired, true).await;
        }

        // Record a new primary before anything else changes, so the status
        // never lags behind a scale-down or a restart that depends on it.
        if let Some(p) = &primary
            && previous_primary.as_deref() != Some(p.as_str())
        {
            self.record_primary(p).await?;
        }

        // 4. Children, in a fixed order: ConfigMap, Services, PDB, StatefulSet.
        let primary_ip = primary
            .as_deref()
            .and_then(|p| facts.iter().find(|f| f.name == p))
            .and_then(|f| f.ip.clone());
        let live_cm: Option<ConfigMap> = self.get(&self.names.config()).await?;
        // Keep the last known primary address while the primary has none
        // (restarting), so a restarting replica still finds it.
        let cm_primary = primary_ip.clone().or_else(|| {
            live_cm
                .as_ref()
                .and_then(|c| c.data.as_ref()?.get(build::PRIMARY_KEY).cloned())
                .and_then(|v| v.split_whitespace().next().map(String::from))
        });
        let cm = build::config_map(&self.redis, &self.names, cm_primary.as_deref());
        self.apply_or_degrade("ConfigMap", &cm, live_cm.as_ref())
            .await?;

        for svc in build::services(&self.redis, &self.names) {
            let name = svc.metadata.name.clone().unwrap_or_default();
            let live: Option<Service> = self.get(&name).await?;
            self.apply_or_degrade("Service", &svc, live.as_ref())
                .await?;
        }
        let pdb = build::pdb(&self.redis, &self.names);
        let live_pdb: Option<PodDisruptionBudget> = self.get(&self.names.pdb()).await?;
        self.apply_or_degrade("PodDisruptionBudget", &pdb, live_pdb.as_ref())
            .await?;

        let (engine, version) = self.engine_version();
        let restart = build::restart_hash(&self.redis, |k| {
            crate::redis::config::is_dynamic(k, engine, version)
        });
        let image = self.ctx.images.image_for(&self.redis.spec);
        let mut sts = build::statefulset(&self.redis, &self.names, &secret_name, &restart, &image);
        // Never let a scale-down remove the primary: hold the size until the
        // primary has moved to a surviving ordinal.
        let current_replicas = live_sts
            .as_ref()
            .and_then(|s| s.spec.replicas)
            .unwrap_or(desired);
        let primary_ordinal = primary
            .as_deref()
            .and_then(|p| plan::ordinal(p, &self.names));
        let hold = matches!(primary_ordinal, Some(o) if o >= desired) && current_replicas > desired;
        if hold {
            sts.spec.replicas = Some(current_replicas);
            sts = build::stamp_hash(sts);
        }
        let sts_written = self
            .apply_or_degrade("StatefulSet", &sts, live_sts.as_ref())
            .await?;
        if sts_written && live_sts.is_some() {
            self.progressing.push("StatefulSet updated".into());
        }

        if !self.notes.is_empty() {
            return self
                .finish(&facts, primary.as_deref(), desired, false)
                .await;
        }

        // 5. Replication wiring; with no primary to choose, recovery decides
        // (it promotes only when no server is primary and no link is up).
        match (&primary, &topology) {
            (Some(p), Some(_)) => {
                self.wire(&facts, p, &opts).await;
                if hold {
                    self.move_primary_for_scale_down(&facts, p, desired, &opts)
                        .await;
                }
            }
            (None, Some(_)) if !facts.is_empty() => self.recover_primary(&facts, &opts).await,
            _ => {}
        }
        // A switchover or recovery in step 5 made another instance primary:
        // what was observed is stale, so labels, restarts and the status
        // wait for the next pass, which observes the new topology. Only the
        // new primary is reported now (it is already recorded).
        if let Some(moved) = self.moved_primary.clone()
            && primary.as_deref() != Some(moved.as_str())
        {
            return self.finish(&facts, Some(&moved), desired, false).await;
        }

        // 6. Role labels (the Services select on them).
        self.label_roles(&facts, primary.as_deref()).await?;

        // 7. Live configuration.
        self.apply_live_config(&facts, &opts, engine, version).await;

        // 8. Restarts for settings that cannot change live.
        if let Some(p) = &primary {
            self.roll(&facts, p, desired, &opts).await?;
        }

        // A switchover in step 8 moved the primary: report the new one.
        let primary = self.moved_primary.clone().or(primary);
        self.finish(&facts, primary.as_deref(), desired, false)
            .await
    }

    /// Applies a child; a conflict with a foreign object, or an object the API
    /// server refuses as invalid, becomes a Degraded note and an event instead
    /// of an error (retrying would not help).
    async fn apply_or_degrade<K>(
        &mut self,
        kind: &'static str,
        desired: &K,
        live: Option<&K>,
    ) -> Result<bool, Error>
    where
        K: Child,
    {
        let (reason, msg) = match self.apply(kind, desired, live).await {
            Ok(w) => return Ok(w),
            Err(e @ Error::Conflict { .. }) => ("Conflict", e.to_string()),
            // The API server refuses the object as invalid (e.g. a change to
            // a field it keeps immutable): retrying cannot help, so say so.
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 422 => {
                let name = desired.meta().name.clone().unwrap_or_default();
                (
                    "Invalid",
                    format!("{kind} {name} was refused: {}", s.message),
                )
            }
            Err(e) => return Err(e),
        };
        self.event(EventType::Warning, reason, "Apply", msg.clone())
            .await;
        self.notes.push(msg);
        Ok(false)
    }

    async fn wire(&mut self, facts: &[PodFacts], primary: &str, opts: &ConnectOptions) {
        let Some(pf) = facts.iter().find(|f| f.name == primary) else {
            return;
        };
        let Some(pip) = pf.ip.clone() else {
            self.progressing
                .push(format!("waiting for primary {primary} to get an address"));
            return;
        };
        if pf.terminating {
            // Wiring waits for the primary's pod to stop; then the recorded
            // primary comes back and recovery decides.
            self.progressing.push(format!(
                "primary {primary} is being deleted; waiting for it to stop"
            ));
            return;
        }
        let pep = Endpoint::new(&pip, build::REDIS_PORT);
        if pf.role == Some(Role::Replica) {
            // Promoting a replica while any server still acts as primary
            // would make two primaries: wait for the servers to settle.
            // Only when no reachable server is primary (everyone follows an
            // address that is gone) is the replica furthest ahead promoted.
            self.recover_primary(facts, opts).await;
            return;
        }
        for f in facts {
            if f.name == primary || !f.reachable || f.terminating {
                continue;
            }
            let Some(ip) = &f.ip else { continue };
            let follows =
                f.role == Some(Role::Replica) && f.following.as_deref() == Some(pip.as_str());
            if follows {
                continue;
            }
            let ep = Endpoint::new(ip, build::REDIS_PORT);
            match crate::redis::actions::make_replica_of(&ep, &pep, opts).await {
                Ok(()) => {
                    self.event(
                        EventType::Normal,
                        "ReplicaConfigured",
                        "Replicate",
                        format!("{} now replicates from primary {primary}", f.name),
                    )
                    .await;
                    self.progressing
                        .push(format!("{} is synchronising from {primary}", f.name));
                }
                Err(e) => self
                    .progressing
                    .push(format!("configuring {} as replica: {e}", f.name)),
            }
        }
    }

    /// Before a scale-down that would remove the primary, switch over to the
    /// surviving replica that is furthest ahead.
    async fn move_primary_for_scale_down(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        desired: i32,
        opts: &ConnectOptions,
    ) {
        let Some(target) = plan::best_replica(facts, |f| {
            plan::ordinal(&f.name, &self.names).is_some_and(|o| o < desired)
        }) else {
            self.progressing
                .push("scale-down waits for a surviving replica to take over as primary".into());
            return;
        };
        if self
            .switchover(facts, primary, &target, opts, "scale-down")
            .await
            && let Err(e) = self.publish_primary(facts, &target).await
        {
            self.progressing
                .push(format!("recording new primary {target}: {e}"));
        }
    }

    /// When no reachable server is primary and none of the replicas has a
    /// live link, promotes the reachable replica with the highest offset
    /// (ties: lowest ordinal) and publishes it.
    async fn recover_primary(&mut self, facts: &[PodFacts], opts: &ConnectOptions) {
        let any_primary = facts
            .iter()
            .any(|f| f.reachable && f.role == Some(Role::Primary));
        let any_linked = facts.iter().any(|f| f.link_up == Some(true));
        if any_primary || any_linked {
            self.progressing
                .push("waiting for the replication topology to settle".into());
            return;
        }
        let Some(best) = plan::most_advanced(facts) else {
            self.progressing
                .push("no reachable instance to promote".into());
            return;
        };
        let Some(ip) = facts
            .iter()
            .find(|f| f.name == best)
            .and_then(|f| f.ip.clone())
        else {
            return;
        };
        let ep = Endpoint::new(&ip, build::REDIS_PORT);
        match crate::redis::actions::make_primary(&ep, opts).await {
            Ok(()) => {
                self.event(
                    EventType::Warning,
                    "PrimaryRecovered",
                    "Promote",
                    format!(
                        "no instance was primary; promoted {best}, the instance furthest ahead"
                    ),
                )
                .await;
                match self.publish_primary(facts, &best).await {
                    Ok(()) => self
                        .progressing
                        .push(format!("promoted {best}; the others follow it next")),
                    Err(e) => self
                        .progressing
                        .push(format!("recording new primary {best}: {e}")),
                }
            }
            Err(e) => self.progressing.push(format!("promoting {best}: {e}")),
        }
    }

    /// Writes only `status.primary`.
    async fn record_primary(&mut self, primary: &str) -> Result<(), Error> {
        self.ctx.metrics.kube("patch_status");
        let patch = serde_json::json!({"status": {"primary": primary}});
        self.api::<Redis>()
            .patch_status(
                &self.redis.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.moved_primary = Some(primary.to_string());
        Ok(())
    }

    /// Records `primary` in the ConfigMap (read by instances at start-up) and
    /// in the status, right after a switchover.
    async fn publish_primary(&mut self, facts: &[PodFacts], primary: &str) -> Result<(), Error> {
        let ip = facts
            .iter()
            .find(|f| f.name == primary)
            .and_then(|f| f.ip.clone());
        let live: Option<ConfigMap> = self.get(&self.names.config()).await?;
        let cm = build::config_map(&self.redis, &self.names, ip.as_deref());
        self.apply("ConfigMap", &cm, live.as_ref()).await?;
        self.record_primary(primary).await
    }

    async fn switchover(
        &mut self,
        facts: &[PodFacts],
        from: &str,
        to: &str,
        opts: &ConnectOptions,
        why: &str,
    ) -> bool {
        let members: Vec<Endpoint> = facts
            .iter()
            .filter(|f| f.reachable)
            .filter_map(|f| f.ip.as_ref().map(|ip| Endpoint::new(ip, build::REDIS_PORT)))
            .collect();
        let Some(target) = facts
            .iter()
            .find(|f| f.name == to)
            .and_then(|f| f.ip.as_ref())
            .map(|ip| Endpoint::new(ip, build::REDIS_PORT))
        else {
            return false;
        };
        let sw = crate::redis::actions::SwitchoverOptions::default();
        match crate::redis::actions::switchover(&members, &target, opts, &sw).await {
            Ok(report) => {
                self.event(
                    EventType::Normal,
                    "SwitchedOver",
                    "Switchover",
                    format!(
                        "primary {from} → {to}: {why} (writes paused {} ms)",
                        report.write_pause.as_millis()
                    ),
                )
                .await;
                self.progressing.push(format!("primary moved to {to}"));
                true
            }
            Err(e) => {
                self.progressing
                    .push(format!("switchover {from} → {to} failed: {e}"));
                false
            }
        }
    }

    async fn label_roles(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
    ) -> Result<(), Error> {
        for f in facts {
            let want = plan::role_label(f, primary);
            if f.role_label.as_deref() == Some(want) {
                continue;
            }
            let patch = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f.name, "labels": {ROLE_LABEL: want}},
            });
            self.ctx.metrics.kube("apply");
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            match self
                .api::<Pod>()
                .patch(&f.name, &pp, &Patch::Apply(&patch))
                .await
            {
                Ok(_) => {}
                // An apply to a pod deleted since the list would create it
                // and is refused as invalid (or not found): a pod that is
                // gone needs no label.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => {
                    let live: Option<Pod> = self.get(&f.name).await?;
                    if live.is_some() {
                        return Err(kube::Error::Api(s).into());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn apply_live_config(
        &mut self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
        engine: EngineKind,
        version: Version,
    ) {
        let dynamic: Vec<(&str, &str)> = self
            .redis
            .spec
            .config
            .iter()
            .filter(|(k, _)| crate::redis::config::is_dynamic(k, engine, version))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if dynamic.is_empty() {
            return;
        }
        for f in facts.iter().filter(|f| f.reachable) {
            let Some(ip) = &f.ip else { continue };
            let ep = Endpoint::new(ip, build::REDIS_PORT);
            let result = async {
                let mut node = crate::redis::Node::connect(&ep, opts).await?;
                crate::redis::config::apply_config(&mut node, &dynamic).await
            }
            .await;
            match result {
                Ok(changes) if !changes.is_empty() => {
                    let list = changes
                        .iter()
                        .map(|c| c.name)
                        .collect::<Vec<_>>()
                        .join(", ");
                    self.event(
                        EventType::Normal,
                        "ConfigApplied",
                        "Configure",
                        format!("applied {list} live on {} without a restart", f.name),
                    )
                    .await;
                }
                Ok(_) => {}
                Err(e) => self
                    .progressing
                    .push(format!("applying config on {}: {e}", f.name)),
            }
        }
    }

    /// Restarts pods running an outdated template, one at a time: replicas
    /// first (highest ordinal first), then the primary after a switchover to
    /// an up-to-date replica. Only when every instance is ready and caught up.
    async fn roll(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        desired: i32,
        opts: &ConnectOptions,
    ) -> Result<(), Error> {
        let outdated: Vec<&PodFacts> = facts.iter().filter(|f| f.outdated).collect();
        if outdated.is_empty() {
            return Ok(());
        }
        let all_ready = facts.len() as i32 == desired
            && facts.iter().all(|f| f.ready && f.reachable)
            && facts
                .iter()
                .filter(|f| f.name != primary)
                .all(|f| f.link_up == Some(true));
        self.progressing.push(format!(
            "rolling restart: {} of {} instances outdated",
            outdated.len(),
            facts.len()
        ));
        if !all_ready {
            return Ok(());
        }
        let victim = match plan::next_to_restart(facts, primary, &self.names) {
            Some(plan::Restart::Replica(name)) => name,
            Some(plan::Restart::PrimaryAfterSwitchover { target }) => {
                if !self
                    .switchover(facts, primary, &target, opts, "rolling restart")
                    .await
                {
                    return Ok(());
                }
                // The old primary must restart as a replica of the new one:
                // publish the new primary before deleting it.
                self.publish_primary(facts, &target).await?;
                primary.to_string()
            }
            Some(plan::Restart::Primary) => primary.to_string(),
            None => return Ok(()),
        };
        self.ctx.metrics.kube("delete");
        match self
            .api::<Pod>()
            .delete(&victim, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        self.event(
            EventType::Normal,
            "RollingRestart",
            "Restart",
            format!("restarted {victim} to apply settings that need a restart"),
        )
        .await;
        Ok(())
    }

    async fn fail_status(&mut self, err: Error) -> Result<Action, Error> {
        let msg = err.to_string();
        self.event(EventType::Warning, "InvalidAuth", "Reconcile", msg.clone())
            .await;
        self.notes.push(msg);
        let desired = self.redis.spec.desired_instances();
        self.finish(&[], None, desired, false).await?;
        Err(err)
    }

    /// Computes the status, patches it when it changed, and picks the requeue.
    async fn finish(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
        desired: i32,
        paused: bool,
    ) -> Result<Action, Error> {
        let ready_count = facts.iter().filter(|f| f.ready).count() as i32;
        let replicas_linked = facts
            .iter()
            .filter(|f| Some(f.name.as_str()) != primary)
            .all(|f| f.link_up == Some(true));
        let all_ready = ready_count == desired
            && facts.len() as i32 == desired
            && primary.is_some()
            && replicas_linked
            && facts.iter().all(|f| !f.outdated);
        let degraded = !self.notes.is_empty();
        let progressing = !self.progressing.is_empty() || !all_ready;

        let mut conds = Vec::new();
        conds.push(if all_ready && !degraded {
            Cond::new(
                "Ready",
                true,
                "AllInstancesReady",
                format!("{ready_count}/{desired} instances ready, replication healthy"),
            )
        } else {
            Cond::new(
                "Ready",
                false,
                if degraded {
                    "Degraded"
                } else {
                    "NotAllInstancesReady"
                },
                format!("{ready_count}/{desired} instances ready"),
            )
        });
        conds.push(if paused {
            Cond::new(
                "Progressing",
                false,
                "Paused",
                "spec.paused is true: children are not changed",
            )
        } else if progressing {
            let msg = if self.progressing.is_empty() {
                format!("waiting for instances: {ready_count}/{desired} ready")
            } else {
                self.progressing.join("; ")
            };
            Cond::new("Progressing", true, "Reconciling", msg)
        } else {
            Cond::new("Progressing", false, "Reconciled", "nothing to do")
        });
        conds.push(if degraded {
            Cond::new("Degraded", true, "ReconcileBlocked", self.notes.join("; "))
        } else {
            Cond::new("Degraded", false, "AsExpected", "no problems found")
        });

        let old = self.redis.status.clone().unwrap_or_default();
        let phase = if paused {
            Phase::Paused
        } else if degraded {
            Phase::Degraded
        } else if all_ready {
            Phase::Ready
        } else if facts.is_empty() {
            Phase::Pending
        } else {
            Phase::Creating
        };
        let instances: Vec<InstanceStatus> = facts
            .iter()
            .map(|f| InstanceStatus {
                name: f.name.clone(),
                role: plan::role_label(f, primary).to_string(),
                ready: f.ready,
                offset: f.offset,
                lag_bytes: f.lag_bytes,
                link_up: f.link_up,
            })
            .collect();
        let current_version = facts
            .iter()
            .find(|f| Some(f.name.as_str()) == primary)
            .and_then(|f| f.version.clone())
            .or(old.current_version.clone());
        let user_secret = self
            .redis
            .spec
            .auth
            .as_ref()
            .and_then(|a| a.secret_name.clone());
        let mut status = RedisStatus {
            observed_generation: self.redis.metadata.generation,
            phase: Some(phase),
            conditions: Vec::new(),
            primary: primary.map(String::from),
            current_version,
            ready: Some(format!("{ready_count}/{desired}")),
            ready_instances: ready_count,
            instances,
            write_service: Some(self.names.write_service()),
            read_service: (self.redis.spec.mode == Mode::Replication)
                .then(|| self.names.read_service()),
            auth_secret: Some(user_secret.unwrap_or_else(|| self.names.generated_secret())),
        };
        status.conditions = status::merge(
            &old.conditions,
            &conds,
            self.redis.metadata.generation,
            Timestamp::now(),
        );
        // Offsets move with every write; compare without them so a busy but
        // healthy Redis does not cause a status write per reconcile.
        if !status_differs(&old, &status) {
            return Ok(requeue(all_ready && !degraded));
        }
        self.ctx.metrics.kube("patch_status");
        let patch = serde_json::json!({"status": merge_patch_value(&old, &status)?});
        self.api::<Redis>()
            .patch_status(
                &self.redis.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        if old.phase != status.phase
            && let Some(p) = status.phase
        {
            {
                let (t, note) = match p {
                    Phase::Ready => (EventType::Normal, format!("all {desired} instances ready")),
                    Phase::Degraded => (EventType::Warning, self.notes.join("; ")),
                    _ => (EventType::Normal, format!("phase {p:?}")),
                };
                self.event(t, &format!("{p:?}"), "Reconcile", note).await;
            }
        }
        Ok(requeue(all_ready && !degraded))
    }
}

fn requeue(steady: bool) -> Action {
    Action::requeue(if steady {
        STEADY_REQUEUE
    } else {
        PROGRESS_REQUEUE
    })
}

/// Offsets and lags are refreshed in the status once one has moved this far,
/// so a busy Redis does not cost a status write per reconcile.
const OFFSET_REFRESH_BYTES: u64 = 1 << 20;

/// Whether the status changed in a way worth a write: anything but the
/// replication offsets and lags, or one of those that moved by at least
/// [`OFFSET_REFRESH_BYTES`] (or appeared, or went away).
fn status_differs(old: &RedisStatus, new: &RedisStatus) -> bool {
    let strip = |s: &RedisStatus| {
        let mut s = s.clone();
        for i in &mut s.instances {
            i.offset = None;
            i.lag_bytes = None;
        }
        s
    };
    if strip(old) != strip(new) {
        return true;
    }
    let moved = |a: Option<i64>, b: Option<i64>| match (a, b) {
        (Some(x), Some(y)) => x.abs_diff(y) >= OFFSET_REFRESH_BYTES,
        (x, y) => x.is_some() != y.is_some(),
    };
    old.instances
        .iter()
        .zip(&new.instances)
        .any(|(a, b)| moved(a.offset, b.offset) || moved(a.lag_bytes, b.lag_bytes))
}

/// The status as a JSON merge patch: `new`, plus an explicit `null` for
/// every field the old status had and `new` leaves out (an omitted field
/// would keep its old value on the server).
fn merge_patch_value(old: &RedisStatus, new: &RedisStatus) -> Result<serde_json::Value, Error> {
    let json = |s: &RedisStatus| serde_json::to_value(s).map_err(|e| Error::Serialize("status", e));
    let mut value = json(new)?;
    if let (serde_json::Value::Object(map), serde_json::Value::Object(old_map)) =
        (&mut value, json(old)?)
    {
        for key in old_map.keys() {
            if !map.contains_key(key) {
                map.insert(key.clone(), serde_json::Value::Null);
            }
        }
    }
    Ok(value)
}

fn read_password(secret: &Secret, name: &str) -> Result<String, Error> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(build::PASSWORD_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(build::PASSWORD_KEY))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| Error::Secret {
            name: name.to_string(),
            reason: format!("has no '{}' key", build::PASSWORD_KEY),
        })?;
    let pw = String::from_utf8(bytes).map_err(|_| Error::Secret {
        name: name.to_string(),
        reason: format!("key '{}' is not UTF-8", build::PASSWORD_KEY),
    })?;
    if pw.is_empty() || pw.contains(['\n', '\r']) {
        return Err(Error::Secret {
            name: name.to_string(),
            reason: format!("key '{}' is empty or spans lines", build::PASSWORD_KEY),
        });
    }
    Ok(pw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::InstanceStatus;

    fn with_instance(offset: i64, lag: i64) -> RedisStatus {
        RedisStatus {
            primary: Some("cache-0".into()),
            instances: vec![InstanceStatus {
                name: "cache-1".into(),
                role: "replica".into(),
                ready: true,
                offset: Some(offset),
                lag_bytes: Some(lag),
                link_up: Some(true),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn small_offset_and_lag_moves_are_not_worth_a_write() {
        let old = with_instance(1_000, 10);
        assert!(!status_differs(&old, &with_instance(1_000, 10)));
        assert!(!status_differs(&old, &with_instance(500_000, 90_000)));
        assert!(status_differs(&old, &with_instance(3_000_000, 10)));
        assert!(status_differs(&old, &with_instance(1_000, 2_000_000)));
        let mut gone = with_instance(1_000, 10);
        gone.instances[0].lag_bytes = None;
        assert!(status_differs(&old, &gone));
        let mut other = with_instance(1_000, 10);
        other.instances[0].ready = false;
        assert!(status_differs(&old, &other));
        // Extreme values from a misbehaving server do not overflow.
        assert!(status_differs(
            &with_instance(i64::MIN, 0),
            &with_instance(i64::MAX, 0)
        ));
    }

    #[test]
    fn fields_that_went_away_are_nulled_in_the_patch() {
        let old = with_instance(1, 0);
        let new = RedisStatus::default();
        let Ok(patch) = merge_patch_value(&old, &new) else {
            panic!("status serialises")
        };
        assert_eq!(patch["primary"], serde_json::Value::Null);
        assert!(patch.as_object().is_some_and(|m| m.contains_key("primary")));
        let Ok(same) = merge_patch_value(&old, &old) else {
            panic!("status serialises")
        };
        assert_eq!(same["primary"], "cache-0");
        assert_eq!(same["instances"][0]["name"], "cache-1");
    }
}
