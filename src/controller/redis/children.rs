//! Children: server-side apply in a fixed order (ConfigMap, Services, PDB,
//! StatefulSet), ownership, and drift repair.
//!
//! A child is written only when it is missing or when a field this
//! operator owns differs on the live object ([`super::drift::covers`]):
//! a spec change (new desired content) and a hand edit (`kubectl scale`, an
//! edited selector) take the same path, and a pass with nothing changed
//! writes nothing. Every child watch triggers a reconcile of its owner, so a
//! hand edit or a deleted child is repaired within the controller's debounce.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::build;
use super::conf;
use super::facts::PodFacts;
use super::{Error, Reconciler, drift, kept, statefulset};
use crate::controller::Stores;
use crate::controller::base::FIELD_MANAGER;
use crate::controller::cache::Frozen;
use crate::controller::names;

/// A namespaced child object the reconciler reads (from its watch cache)
/// and applies.
pub trait Child:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The cache holding objects of this kind; none for Secrets, which are
    /// always read by name.
    fn store(stores: &Stores) -> Option<&Store<Frozen<Self>>>;
}

macro_rules! child {
    ($kind:ty, $field:ident) => {
        impl Child for $kind {
            fn store(stores: &Stores) -> Option<&Store<Frozen<Self>>> {
                Some(&stores.$field)
            }
        }
    };
}
child!(StatefulSet, statefulsets);
child!(Service, services);
child!(ConfigMap, config_maps);
child!(PodDisruptionBudget, pdbs);
child!(Pod, pods);

impl Child for Secret {
    fn store(_: &Stores) -> Option<&Store<Frozen<Self>>> {
        None
    }
}

use crate::controller::names::controlled_by;

/// Whether `live` still holds every field of `desired`.
pub fn in_sync<K: Serialize>(live: &K, desired: &K) -> Result<bool, Error> {
    let json = |o: &K| serde_json::to_value(o).map_err(|e| Error::Serialize("child", e));
    Ok(drift::covers(&json(live)?, &json(desired)?))
}

/// What applying a Redis's children did.
#[derive(Debug, Clone, Copy)]
pub struct Applied {
    /// The StatefulSet's size is held above the spec: the primary sits on
    /// an ordinal a scale-down removes.
    pub hold: bool,
    /// A StatefulSet's spec changed: which pods run an outdated template is
    /// known once its controller has seen it (the next pass, which the
    /// write wakes), not from what this pass observed before.
    pub template_changed: bool,
}

impl Reconciler {
    /// Applies `desired` unless the live object already holds every field
    /// of it. Refuses objects that belong to someone else; adopts ones that
    /// carry our labels. Returns whether it wrote.
    pub(super) async fn apply<K: Child>(
        &mut self,
        kind: &'static str,
        desired: &K,
        live: Option<&K>,
    ) -> Result<bool, Error> {
        let name = desired
            .meta()
            .name
            .clone()
            .ok_or(Error::Incomplete("name"))?;
        if let Some(live) = live {
            let meta = live.meta();
            if let Some(e) = self.foreign(kind, Some(meta)) {
                return Err(e);
            }
            let ours = controlled_by(meta, self.uid());
            if ours && in_sync(live, desired)? {
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
            } else if names::stamped_hash(live) == names::stamped_hash(desired) {
                // Same desired content as last applied, yet the live object
                // differs: someone changed a field the operator owns.
                tracing::info!(redis = %self.oref, kind, child = %name, "repairing drift");
                self.event(
                    EventType::Normal,
                    "DriftRepaired",
                    "Apply",
                    format!(
                        "{kind} {name} was changed outside the operator; its fields were put back"
                    ),
                )
                .await;
            }
        }
        self.ctx.metrics.kube("apply");
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.api::<K>()
            .patch(&name, &pp, &Patch::Apply(desired))
            .await?;
        self.report.wrote();
        Ok(true)
    }

    /// Applies a child; an object the API server refuses as invalid becomes
    /// a Degraded note and an event instead of an error (retrying would not
    /// help). A conflict with a foreign object ends the pass
    /// ([`Error::Conflict`]).
    pub(super) async fn apply_or_degrade<K: Child>(
        &mut self,
        kind: &'static str,
        desired: &K,
        live: Option<&K>,
    ) -> Result<bool, Error> {
        let (reason, msg) = match self.apply(kind, desired, live).await {
            Ok(w) => return Ok(w),
            // A name someone else holds stops the pass: nothing more is
            // written, and the Redis is Degraded naming it (`run`).
            Err(e @ Error::Conflict { .. }) => return Err(e),
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
        self.report.note(msg);
        Ok(false)
    }

    /// The pod template's restart hash (settings that need a restart) and
    /// the server image.
    pub(super) fn template_inputs(&self) -> (String, String) {
        let (engine, version) = self.engine_version();
        let restart = super::conf::restart_hash(&self.redis, |k| {
            crate::redis::config::is_dynamic(k, engine, version)
        });
        (restart, self.ctx.images.image_for(&self.redis.spec))
    }

    /// Applies `services`, the PodDisruptionBudget (one voluntary
    /// disruption at a time, every mode) and the NetworkPolicy when asked.
    pub(super) async fn apply_services_and_pdb(
        &mut self,
        services: Vec<Service>,
    ) -> Result<(), Error> {
        for svc in services {
            let name = svc.metadata.name.clone().unwrap_or_default();
            let live: Option<Service> = self.lookup(&name).await?;
            self.apply_or_degrade("Service", &svc, live.as_ref())
                .await?;
        }
        let pdb = build::pdb(&self.redis, &self.names);
        let live_pdb: Option<PodDisruptionBudget> = self.lookup(&self.names.pdb()).await?;
        self.apply_or_degrade("PodDisruptionBudget", &pdb, live_pdb.as_ref())
            .await?;
        self.apply_network_policy().await?;
        Ok(())
    }

    /// Applies the ConfigMap, the Services, the PDB and the StatefulSet, in
    /// that order; `hibernating` (the data is saved): with no replica and
    /// no published primary.
    pub(super) async fn apply_children(
        &mut self,
        live_sts: &Option<StatefulSet>,
        facts: &[PodFacts],
        primary: Option<&str>,
        secret_name: &str,
        hibernating: bool,
    ) -> Result<Applied, Error> {
        // Only an instance seen acting as primary is published: instances
        // that start read the address and follow it, and an empty pod
        // re-created under the recorded primary's name must not be it.
        let primary_ip = primary
            .and_then(|p| facts.iter().find(|f| f.name == p))
            .filter(|f| f.reachable && f.role == Some(super::facts::Role::Primary))
            .and_then(|f| f.ip.clone());
        let live_cm: Option<ConfigMap> = self.lookup(&self.names.config()).await?;
        // Keep the last known primary address while the primary has none
        // (restarting), so a restarting replica still finds it.
        let cm_primary = primary_ip.filter(|_| !hibernating).or_else(|| {
            live_cm
                .as_ref()
                .and_then(|c| c.data.as_ref()?.get(names::PRIMARY_KEY).cloned())
                .and_then(|v| v.split_whitespace().next().map(String::from))
                .filter(|_| !hibernating)
        });
        // While TLS is turned off, a Replication Redis keeps its
        // certificate files until no instance listens with TLS.
        let view = self.children_view(facts);
        let cm = conf::config_map(
            &view,
            &self.names,
            cm_primary.as_deref(),
            self.bootstrapped(),
        );
        self.apply_or_degrade("ConfigMap", &cm, live_cm.as_ref())
            .await?;
        self.config_applied = Some(cm);

        self.apply_services_and_pdb(build::services(&self.redis, &self.names))
            .await?;

        let (restart, image) = self.template_inputs();
        let memory_limit = self.template_memory_limit(facts);
        let mut sts = statefulset::statefulset(
            &view,
            &self.names,
            secret_name,
            &restart,
            &image,
            memory_limit,
        );
        if let Some(bs) = &self.records.bootstrap {
            let first = self.names.pod(0);
            super::bootstrap::add_restore(
                &mut sts,
                bs,
                (&bs.key, crate::backup::archive::MAIN_LINE),
                &first,
                &self.names,
                &self.redis,
            );
        }
        let live_sts = match live_sts {
            Some(s) => Some(s.clone()),
            None => self.lookup(&self.names.statefulset()).await?,
        };
        let kept;
        (sts, kept) = self.keep_operator_revisions(live_sts.as_ref(), sts, facts);
        // The memory autopilot's resize changes the template too; its pods
        // are resized in place (see `autopilot::resize`), not kept.
        let resized = super::autopilot::limits::record(&self.redis).is_some()
            && live_sts.as_ref().is_some_and(|l| {
                super::kept::server_resources(l) != super::kept::server_resources(&sts)
            });
        if let Some(r) = kept.newly.as_ref().filter(|_| !resized) {
            let n = facts
                .iter()
                .filter(|f| f.revision.as_ref() == Some(r))
                .count();
            self.event(
                EventType::Normal,
                "TemplateKept",
                "Upgrade",
                format!(
                    "this operator release builds a different pod template for the same spec; \
                     {n} running instance(s) keep theirs (revision {r}) and take the new one \
                     when next re-created"
                ),
            )
            .await;
        }
        // Never let a scale-down remove the primary: hold the size until the
        // primary has moved to a surviving ordinal.
        let desired = self.redis.spec.desired_instances();
        let current_replicas = live_sts
            .as_ref()
            .and_then(|s| s.spec.replicas)
            .unwrap_or(desired);
        let primary_ordinal = primary.and_then(|p| super::facts::ordinal(p, &self.names));
        let hold = matches!(primary_ordinal, Some(o) if o >= desired) && current_replicas > desired;
        if hold {
            sts.spec.replicas = Some(current_replicas);
            sts = names::stamp_hash(sts);
        }
        if hibernating {
            sts = super::hibernate::scaled_to_zero(sts);
        }
        if self.grow_volumes(&mut sts, live_sts.as_ref()).await? == super::volumes::Growth::Hold {
            return Ok(Applied {
                hold,
                template_changed: false,
            });
        }
        let sts_written = self
            .apply_or_degrade("StatefulSet", &sts, live_sts.as_ref())
            .await?;
        let template_changed = sts_written && live_sts.is_some();
        if template_changed {
            self.report.progress("StatefulSet updated".into());
        }
        Ok(Applied {
            hold,
            template_changed,
        })
    }
}

impl Reconciler {
    /// The memory limit a StatefulSet's template carries while the memory
    /// autopilot moves `facts`' instances in place: a size they run (see
    /// `autopilot::limits::template_limit`). `None` without the autopilot.
    pub(super) fn template_memory_limit(&self, facts: &[PodFacts]) -> Option<u64> {
        super::autopilot::limits::record(&self.redis).map(|rec| {
            let restart = rec.method.as_deref() == Some(super::autopilot::limits::RESTART);
            super::autopilot::limits::template_limit(facts, rec.limit_bytes as u64, restart)
        })
    }

    /// A template changed by the operator alone restarts nothing: `sts`
    /// with the kept revisions of `facts`' pods recorded (see `kept`).
    pub(super) fn keep_operator_revisions(
        &self,
        live: Option<&StatefulSet>,
        mut sts: StatefulSet,
        facts: &[PodFacts],
    ) -> (StatefulSet, kept::Kept) {
        let in_use: Vec<String> = facts.iter().filter_map(|f| f.revision.clone()).collect();
        let generation = self.redis.metadata.generation;
        let observed = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.observed_generation);
        let kept = kept::decide(live, &sts, generation, observed, &in_use);
        kept::annotate(&mut sts, generation, &kept);
        (names::stamp_hash(sts), kept)
    }
}
