//! Status: conditions (transition times kept while a condition keeps its
//! status), the phase and its event, one merge patch written only when
//! something worth a write changed, and the requeue with its per-object
//! backoff while nothing moves.
//!
//! The rules (conditions, phase, what is worth a write, the patch, the
//! backoff) are pure, in [`record`]; this module runs them for a pass and
//! writes the result.

use std::time::Duration;

use crate::controller::queue::{Next, PROGRESS_REQUEUE, STEADY_REQUEUE};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

pub mod record;

use self::record::{
    PATIENT_PASSES, hibernated_cond, memory_status, merge_patch_value, not_ready_cond,
    not_ready_phase, primary_condition, status_differs, strip_offsets, stuck_backoff,
};
use super::facts::{Cond, PodFacts, Role, merge};
use super::report::Outcomes;
use super::{Error, Reconciler, plan};
use crate::api::v1alpha1::{InstanceStatus, Mode, Phase, Redis, RedisStatus};
use crate::redis::info::EngineKind;

/// The longest a pass waiting for a certificate to be issued waits for
/// the next look.
const WAIT_RECHECK: Duration = Duration::from_secs(5);

impl Reconciler {
    pub(super) async fn fail_status(
        &mut self,
        reason: &'static str,
        err: Error,
    ) -> Result<Next, Error> {
        let msg = err.to_string();
        self.report.degraded(reason);
        self.event(EventType::Warning, reason, "Reconcile", msg.clone())
            .await;
        self.report.note(msg);
        self.finish_unobserved().await?;
        Err(err)
    }

    /// The status of a pass that observed nothing: the recorded primary is
    /// kept (such a pass says why in the conditions, it does not forget the
    /// topology), and no step decided anything.
    async fn finish_unobserved(&mut self) -> Result<Next, Error> {
        let desired = self.redis.spec.desired_instances();
        let recorded = self.redis.status.as_ref().and_then(|s| s.primary.clone());
        self.finish(
            &[],
            recorded.as_deref(),
            desired,
            false,
            Outcomes::default(),
        )
        .await
    }

    /// A pass that waits before touching anything (a certificate being
    /// issued, which no watch reports): Progressing with `what`, the
    /// recorded topology kept, and the next pass within [`WAIT_RECHECK`].
    pub(super) async fn wait_status(&mut self, what: String) -> Result<Next, Error> {
        self.report.progress(what);
        self.report.waiting_unless_set("WaitingForCertificate");
        let next = self.finish_unobserved().await?;
        Ok(match next.delay() {
            Some(d) if d > WAIT_RECHECK => Next::after(WAIT_RECHECK),
            _ => next,
        })
    }

    /// The Progressing condition: paused, the work under way (or the
    /// instances awaited), or nothing to do.
    pub(super) fn progressing_cond(
        &self,
        paused: bool,
        progressing: bool,
        ready: i32,
        desired: i32,
    ) -> Cond {
        if paused {
            Cond::new(
                "Progressing",
                false,
                "Paused",
                "spec.paused is true: children are not changed",
            )
        } else if progressing {
            let msg = if self.report.progressing().is_empty() {
                format!("waiting for instances: {ready}/{desired} ready")
            } else {
                self.report.progressing().join("; ")
            };
            Cond::new(
                "Progressing",
                true,
                self.report.progress_reason().unwrap_or("Reconciling"),
                msg,
            )
        } else {
            Cond::new("Progressing", false, "Reconciled", "nothing to do")
        }
    }

    /// Computes the status, patches it when it changed, and picks the requeue.
    pub(super) async fn finish(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
        desired: i32,
        paused: bool,
        mut out: Outcomes,
    ) -> Result<Next, Error> {
        self.track_bootstrap(facts, primary).await;
        let ready_count = facts.iter().filter(|f| f.ready).count() as i32;
        let replicas_linked = facts
            .iter()
            .filter(|f| Some(f.name.as_str()) != primary)
            .all(|f| f.link_up == Some(true));
        // A pod Kubernetes calls Ready whose server does not answer the
        // operator is not fine, whatever its probe says.
        let unreachable: Vec<&str> = facts
            .iter()
            .filter(|f| f.ready && f.ip.is_some() && !f.reachable && !f.terminating)
            .map(|f| f.name.as_str())
            .collect();
        let only_unreachable = self.report.notes().is_empty();
        let unreachable_note = self.reach.servers_observed && !unreachable.is_empty();
        if unreachable_note {
            self.report.note(format!(
                "{} not answering the operator although Ready (network, password or server problem)",
                unreachable.join(", ")
            ));
        }
        let all_ready = ready_count == desired
            && facts.len() as i32 == desired
            && primary.is_some()
            && replicas_linked
            && facts.iter().all(|f| !f.outdated && f.reachable);
        let degraded = !self.report.notes().is_empty();
        self.track_wake(all_ready).await;
        let hibernated = out.hibernating && facts.is_empty();
        let progressing = (!self.report.progressing().is_empty() || !all_ready) && !hibernated;

        let mut conds = Vec::new();
        conds.push(if hibernated {
            hibernated_cond()
        } else if all_ready && !degraded {
            Cond::new(
                "Ready",
                true,
                "AllInstancesReady",
                format!("{ready_count}/{desired} instances ready, replication healthy"),
            )
        } else {
            not_ready_cond(degraded, ready_count, desired)
        });
        conds.push(self.progressing_cond(paused, progressing, ready_count, desired));
        conds.push(if degraded {
            let reason = if unreachable_note && only_unreachable {
                "InstancesUnreachable"
            } else {
                self.report.degraded_reason().unwrap_or("ReconcileBlocked")
            };
            Cond::new("Degraded", true, reason, self.report.notes().join("; "))
        } else {
            Cond::new("Degraded", false, "AsExpected", "no problems found")
        });

        conds.extend(self.capability_conditions(&mut out));
        let looked = out.tuning.insights.is_some();
        let insights = self.insights_for_status(&mut out.tuning);
        conds.extend(self.tuned_condition(&insights, looked));
        let old = self.redis.status.clone().unwrap_or_default();
        conds.push(primary_condition(
            facts,
            primary,
            old.last_failover.as_ref(),
        ));
        let phase = if paused {
            Phase::Paused
        } else if degraded {
            Phase::Degraded
        } else if hibernated {
            Phase::Hibernated
        } else if all_ready {
            Phase::Ready
        } else {
            not_ready_phase(
                old.phase,
                facts.is_empty(),
                !self.report.progressing().is_empty(),
            )
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
        // What every instance runs, as the servers report it: one version,
        // or each distinct one in ordinal order while they differ.
        let mut seen: Vec<(Option<EngineKind>, &str)> = Vec::new();
        for f in facts {
            if let Some(v) = f.version.as_deref()
                && !seen.contains(&(f.engine, v))
            {
                seen.push((f.engine, v));
            }
        }
        // Engines differ only while Redis moves to Valkey: then say which.
        let mixed = seen.iter().any(|(e, _)| *e != seen[0].0);
        let versions: Vec<String> = seen
            .iter()
            .map(|(e, v)| match (mixed, e) {
                (true, Some(EngineKind::Valkey)) => format!("valkey {v}"),
                (true, _) => format!("redis {v}"),
                (false, _) => v.to_string(),
            })
            .collect();
        let current_version = if versions.is_empty() {
            old.current_version.clone()
        } else {
            Some(versions.join(", "))
        };
        let user_secret = self.redis.spec.auth_secret_name().map(String::from);
        // The intent to move the primary stays until the move is published,
        // or until the recorded primary is seen serving (the move did not
        // happen and is no longer wanted).
        let primary_serving = facts.iter().any(|f| {
            Some(f.name.as_str()) == primary && f.reachable && f.role == Some(Role::Primary)
        });
        let target_primary = old
            .target_primary
            .clone()
            .filter(|t| !primary_serving && Some(t.as_str()) != primary);
        let mut status = RedisStatus {
            observed_generation: self.redis.metadata.generation,
            phase: Some(phase),
            conditions: Vec::new(),
            primary: primary.map(String::from),
            target_primary,
            current_version,
            ready: Some(format!("{ready_count}/{desired}")),
            ready_instances: ready_count,
            instances,
            write_service: Some(self.names.write_service()),
            read_service: (self.redis.spec.mode() == Mode::Replication)
                .then(|| self.names.read_service()),
            auth_secret: Some(user_secret.unwrap_or_else(|| self.names.generated_secret())),
            live_config_keys: old.live_config_keys.clone(),
            config_resets: old.config_resets,
            last_failover: old.last_failover.clone(),
            upgrade: self.records.upgrade.clone(),
            bootstrap: self.records.bootstrap.clone(),
            hibernation: self.records.hibernation.clone(),
            memory: memory_status(facts, primary),
            autopilot: self.redis.status.as_ref().and_then(|s| s.autopilot.clone()),
            cluster: None,
            shards: Vec::new(),
            resharding: None,
            insights,
            tuning: self.tuning_for_status(&mut out.tuning, std::mem::take(&mut out.refused)),
            replica_of: old.replica_of.clone(),
            promotion: old.promotion.clone(),
            demoted: old.demoted.clone(),
            archive: self.archive_for_status(facts, old.archive.as_ref()).await,
        };
        status.conditions = merge(
            &old.conditions,
            &conds,
            self.redis.metadata.generation,
            Timestamp::now(),
        );
        // Offsets move with every write; compare without them so a busy but
        // healthy Redis does not cause a status write per reconcile.
        let steady = all_ready && !degraded && !self.upgrade_in_flight();
        if old.ready != status.ready {
            tracing::info!(
                redis = %self.oref,
                from = old.ready.as_deref().unwrap_or("-"),
                to = status.ready.as_deref().unwrap_or("-"),
                phase = ?status.phase,
                "readiness changed"
            );
        }
        if !status_differs(&old, &status) {
            return Ok(self.requeue(steady, &status, out.memory.due));
        }
        self.patch_status(merge_patch_value(&old, &status)?).await?;
        if old.phase != status.phase
            && let Some(p) = status.phase
        {
            {
                let (t, note) = match p {
                    Phase::Ready => (EventType::Normal, format!("all {desired} instances ready")),
                    Phase::Degraded => (EventType::Warning, self.report.notes().join("; ")),
                    _ => (EventType::Normal, format!("phase {p:?}")),
                };
                self.event(t, &format!("{p:?}"), "Reconcile", note).await;
            }
        }
        Ok(self.requeue(steady, &status, out.memory.due))
    }

    /// Merge-patches the status with `value` (the `status` object), and
    /// remembers the write.
    pub(super) async fn patch_status(&mut self, value: serde_json::Value) -> Result<(), Error> {
        self.ctx.metrics.kube("patch_status");
        let patch = serde_json::json!({ "status": value });
        let updated = self
            .api::<Redis>()
            .patch_status(
                &self.redis.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.wrote_status(updated);
        Ok(())
    }

    /// Remembers a status this pass wrote: the next pass reads the Redis
    /// fresh until the watch cache has caught up with it.
    fn wrote_status(&mut self, updated: Redis) {
        self.report.wrote();
        if let Some(rv) = updated.metadata.resource_version.clone() {
            self.ctx.remember_written(&self.oref, rv);
        }
        // Keep this pass's spec and in-memory annotations: an upgrade being
        // rolled back builds the children from the old version (see
        // `upgrade::serve`), and the selector stays the live one.
        let mut updated = updated;
        updated.spec = self.redis.spec.clone();
        updated.metadata.annotations = self.redis.metadata.annotations.clone();
        self.redis = std::sync::Arc::new(updated);
    }

    /// The next pass: [`STEADY_REQUEUE`] when Ready, else the progress
    /// interval with a per-object backoff while passes keep seeing the same
    /// state (see [`stuck_backoff`]).
    /// The upgrade's and the memory autopilot's conditions for this pass
    /// (every mode).
    pub(super) fn capability_conditions(&self, out: &mut Outcomes) -> Vec<Cond> {
        let upgrade = match out.upgrade.take() {
            Some(c) => Some(c),
            None => self.records.upgrade.as_ref().map(super::upgrade::condition),
        };
        upgrade
            .into_iter()
            .chain(self.autopilot_condition(out.memory.cond.take()))
            .collect()
    }

    /// The memory autopilot's condition for this pass; a pass that
    /// returned before the autopilot looked keeps the last one.
    fn autopilot_condition(&self, decided: Option<Cond>) -> Option<Cond> {
        let kept = || {
            let c = self
                .redis
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == crate::controller::layout::MEMORY_AT_MAXIMUM)?;
            Some(Cond::new(
                crate::controller::layout::MEMORY_AT_MAXIMUM,
                c.status == "True",
                c.reason.clone(),
                c.message.clone(),
            ))
        };
        match decided {
            Some(c) => Some(c),
            None => self.redis.spec.memory_autopilot().and_then(|_| kept()),
        }
    }

    /// An upgrade or its rollback is under way: its last instance may be
    /// Ready before it is proven (caught up), and nothing else wakes the
    /// pass that records the end, so it is not a steady state.
    pub(super) fn upgrade_in_flight(&self) -> bool {
        use crate::api::v1alpha1::UpgradePhase;
        self.records
            .upgrade
            .as_ref()
            .is_some_and(|u| matches!(u.phase, UpgradePhase::Upgrading | UpgradePhase::RollingBack))
    }

    /// `status.archive`: the sidecars' view, written again when what it
    /// says changed, or the window every 30 s (the newest time moves with
    /// every checkpoint; a write per pass would be a write per pass).
    pub(in crate::controller::redis) async fn archive_for_status(
        &mut self,
        facts: &[PodFacts],
        old: Option<&crate::api::v1alpha1::ArchiveStatus>,
    ) -> Option<crate::api::v1alpha1::ArchiveStatus> {
        self.redis.spec.archive.as_ref()?;
        let pods = facts
            .iter()
            .filter_map(|f| f.ip.clone().map(|ip| (f.name.clone(), ip)));
        // One line per shard of a Cluster Redis (the shards the spec keeps).
        let lines: Vec<Vec<(String, String)>> = if self.redis.spec.mode() == Mode::Cluster {
            let shards = self.redis.spec.desired_shards().max(0);
            let mut lines = vec![Vec::new(); usize::try_from(shards).unwrap_or(0)];
            for (name, ip) in pods {
                if let Some((s, _)) = super::cluster::build::shard_of(&self.names, &name)
                    && let Some(line) = usize::try_from(s).ok().and_then(|s| lines.get_mut(s))
                {
                    line.push((name, ip));
                }
            }
            lines
        } else {
            vec![pods.collect()]
        };
        let new = super::archive::observe(&self.redis, &lines).await?;
        self.report.recheck_within(Duration::from_secs(30));
        let Some(old) = old else {
            return Some(new);
        };
        let same_story = old.archiver == new.archiver
            && old.message == new.message
            && old.holes == new.holes
            && old.earliest == new.earliest
            && old.location == new.location;
        let fresh = old
            .observed_at
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .is_some_and(|t| {
                (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds() < 30
            });
        if same_story && fresh {
            Some(old.clone())
        } else {
            Some(new)
        }
    }

    pub(super) fn requeue(
        &self,
        steady: bool,
        status: &RedisStatus,
        autopilot_due: Option<Duration>,
    ) -> Next {
        if steady {
            self.ctx.forget_stuck(&self.oref);
            // The memory autopilot's cooldown may end sooner, or a step
            // that waits on the kubelet (a certificate reload) looks again.
            let due = match (autopilot_due, self.report.recheck()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            return Next::after(due.map_or(STEADY_REQUEUE, |d| {
                d.clamp(PROGRESS_REQUEUE, STEADY_REQUEUE)
            }));
        }
        let seen = serde_json::to_string(&strip_offsets(status)).unwrap_or_default();
        let fingerprint = crate::controller::names::stable_hash(&[
            &seen,
            &self.report.progressing().join("\n"),
            &self.report.notes().join("\n"),
        ]);
        let n = self
            .ctx
            .stuck_passes(&self.oref, fingerprint, self.report.has_written());
        // A step that asked to look again sooner (an upgrade's timeout
        // running out, a bootstrap's restore) is not held back by the
        // backoff.
        let wait = match self.report.recheck() {
            Some(d) => stuck_backoff(n).min(d.max(PROGRESS_REQUEUE)),
            None => stuck_backoff(n),
        };
        // Why this pass waits, once per state (and again when the backoff
        // stretches), so a Redis that stays unready says so in the log.
        if n == 0 || n >= PATIENT_PASSES && wait != stuck_backoff(n - 1) {
            // What the conditions this pass wrote say: Degraded's message
            // when it stands, else Progressing's, else Ready's.
            let message = |t: &str, only_true: bool| {
                status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == t && (!only_true || c.status == "True"))
                    .map(|c| c.message.as_str())
            };
            let why = message("Degraded", true)
                .or_else(|| message("Progressing", true))
                .or_else(|| message("Ready", false))
                .unwrap_or("");
            tracing::info!(
                redis = %self.oref,
                phase = ?status.phase,
                next_pass_in = ?wait,
                same_state_passes = n,
                "not ready: {why}"
            );
        }
        Next::after(wait)
    }
}
