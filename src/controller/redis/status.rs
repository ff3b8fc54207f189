//! Status: conditions (transition times kept while a condition keeps its
//! status), the phase and its event, one merge patch written only when
//! something worth a write changed, and the requeue with its per-object
//! backoff while nothing moves.
//!
//! Length: ~470 lines of code: the conditions, phase and patch belong
//! together (one write per pass); splitting the condition rules into a pure
//! module is the next step if it grows.

use std::time::Duration;

use crate::controller::queue::{Next, PROGRESS_REQUEUE, STEADY_REQUEUE};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::facts::{Cond, PodFacts, Role, merge};
use super::report::Outcomes;
use super::{Error, Reconciler, build, plan};
use crate::api::v1alpha1::{InstanceStatus, MemoryStatus, Mode, Phase, Redis, RedisStatus};
use crate::redis::info::EngineKind;

/// The longest a pass waiting for a certificate to be issued waits for
/// the next look.
const WAIT_RECHECK: Duration = Duration::from_secs(5);
/// The longest wait between passes of a Redis that is stuck (servers that
/// cannot be reached, a topology that does not settle).
pub const STUCK_REQUEUE_MAX: Duration = Duration::from_secs(120);
/// Identical passes at [`PROGRESS_REQUEUE`] before the backoff starts
/// (a replica's full sync has no Kubernetes event to wake the operator).
const PATIENT_PASSES: u32 = 5;

/// The wait before the next pass of a Redis that is not ready, after `n`
/// passes in a row that observed the same state and wrote nothing: the
/// progress interval at first, then doubling up to [`STUCK_REQUEUE_MAX`].
/// Any watch event (a pod becoming ready, a spec change) still starts a
/// pass at once; the backoff only spaces out the passes nothing asked for.
pub fn stuck_backoff(n: u32) -> Duration {
    if n < PATIENT_PASSES {
        return PROGRESS_REQUEUE;
    }
    let doublings = (n - PATIENT_PASSES + 1).min(16);
    PROGRESS_REQUEUE
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(STUCK_REQUEUE_MAX)
}

pub use crate::controller::layout::FENCED;

/// `PrimaryAvailable`: whether the primary accepts writes, and, after a
/// failover to it, what happened, when, and the offsets involved.
fn primary_condition(
    facts: &[PodFacts],
    primary: Option<&str>,
    last: Option<&crate::api::v1alpha1::FailoverRecord>,
) -> Cond {
    let Some(p) = primary else {
        return Cond::new("PrimaryAvailable", false, "NoPrimary", "no primary yet");
    };
    let Some(serving) = facts
        .iter()
        .find(|f| f.name == p && f.reachable && f.role == Some(Role::Primary))
    else {
        return Cond::new(
            "PrimaryAvailable",
            false,
            "PrimaryNotServing",
            format!("primary {p} does not answer as primary"),
        );
    };
    // The write fence is closed: the server answers every write with
    // NOREPLICAS until a replica acknowledges it again.
    if serving.good_replicas == Some(0) {
        return Cond::new(
            "PrimaryAvailable",
            false,
            FENCED,
            format!(
                "primary {p} refuses writes (NOREPLICAS): no replica acknowledged it within \
                 spec.failover.maxLagSeconds (min-replicas-to-write 1); writes resume as soon \
                 as a replica follows it again"
            ),
        );
    }
    match last.filter(|l| l.to == p) {
        Some(l) => {
            let others = if l.candidates.is_empty() {
                String::new()
            } else {
                format!("; other instances then: {}", l.candidates.join(", "))
            };
            Cond::new(
                "PrimaryAvailable",
                true,
                "FailedOver",
                format!(
                    "{p} was promoted at {} when {} was lost ({}), at replication offset {}{others}",
                    l.time, l.from, l.reason, l.offset
                ),
            )
        }
        None => Cond::new(
            "PrimaryAvailable",
            true,
            "PrimaryServing",
            format!("{p} accepts writes"),
        ),
    }
}

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
        let desired = self.redis.spec.desired_instances();
        // Nothing was observed: keep the recorded primary (a failed pass
        // says so in the conditions, it does not forget the topology).
        let recorded = self.redis.status.as_ref().and_then(|s| s.primary.clone());
        self.finish(
            &[],
            recorded.as_deref(),
            desired,
            false,
            Outcomes::default(),
        )
        .await?;
        Err(err)
    }

    /// A pass that waits before touching anything (a certificate being
    /// issued, which no watch reports): Progressing with `what`, the
    /// recorded topology kept, and the next pass within [`WAIT_RECHECK`].
    pub(super) async fn wait_status(&mut self, what: String) -> Result<Next, Error> {
        self.report.progress(what);
        self.report.waiting_unless_set("WaitingForCertificate");
        let desired = self.redis.spec.desired_instances();
        let recorded = self.redis.status.as_ref().and_then(|s| s.primary.clone());
        let next = self
            .finish(
                &[],
                recorded.as_deref(),
                desired,
                false,
                Outcomes::default(),
            )
            .await?;
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
                .find(|c| c.type_ == super::autopilot::CONDITION)?;
            Some(Cond::new(
                super::autopilot::CONDITION,
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
        let fingerprint = build::stable_hash(&[
            &seen,
            &self.report.progressing().join("\n"),
            &self.report.notes().join("\n"),
        ]);
        let n = self
            .ctx
            .stuck_passes(&self.oref, fingerprint, self.report.has_written());
        let wait = stuck_backoff(n);
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

/// The instance list and conditions written with a new `status.primary`
/// (the rest of the status is written at the end of the pass): the new
/// primary is the only instance with the primary role (the one it replaced
/// is `unknown` until it is seen again), and a Ready condition that was
/// true becomes false (phase `Updating`), since the others still have to
/// follow the new primary. `None`: `primary` is already the recorded one.
pub(super) fn primary_moved(
    old: &RedisStatus,
    primary: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<PrimaryMoved> {
    if old.primary.as_deref() == Some(primary) {
        return None;
    }
    let instances = old
        .instances
        .iter()
        .map(|i| {
            let mut i = i.clone();
            if i.name == primary {
                i.role = "primary".to_string();
                i.lag_bytes = None;
                i.link_up = None;
            } else if i.role == "primary" {
                i.role = "unknown".to_string();
            }
            i
        })
        .collect();
    let was_ready = old
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    // Ready goes from true to false: a transition, at `now`.
    let conditions = was_ready.then(|| {
        let conditions = old
            .conditions
            .iter()
            .cloned()
            .map(|mut c| {
                if c.type_ == "Ready" {
                    c.status = "False".to_string();
                    c.reason = "PrimaryMoved".to_string();
                    c.message = format!(
                        "the primary moved to {primary}; the other instances follow it next"
                    );
                    c.observed_generation = generation;
                    c.last_transition_time = Time(now);
                }
                c
            })
            .collect();
        (conditions, Phase::Updating)
    });
    Some(PrimaryMoved {
        instances,
        conditions,
    })
}

/// What [`primary_moved`] writes beside `status.primary`.
#[derive(Debug)]
pub(super) struct PrimaryMoved {
    /// The instances with their roles as they are after the move.
    pub instances: Vec<InstanceStatus>,
    /// The conditions with Ready false, and the phase (`Updating`), when
    /// the Redis was Ready before the move; `None`: left as they are.
    pub conditions: Option<(
        Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        Phase,
    )>,
}

/// The Ready condition of a Redis that is not ready: Degraded, or waiting
/// for instances (`ready` of `desired`).
pub(super) fn not_ready_cond(degraded: bool, ready: i32, desired: i32) -> Cond {
    Cond::new(
        "Ready",
        false,
        if degraded {
            "Degraded"
        } else {
            "NotAllInstancesReady"
        },
        format!("{ready}/{desired} instances ready"),
    )
}

/// The phase of a Redis that is not Ready, not Degraded, not paused and not
/// The Ready condition of a Redis hibernated (no pod runs).
pub(super) fn hibernated_cond() -> Cond {
    Cond::new(
        "Ready",
        false,
        "Hibernated",
        "spec.hibernate is true: no pod runs; the volumes keep the data",
    )
}

/// hibernated: Pending/Creating until it was first Ready (`old` is the
/// phase the last pass wrote), then Updating while the operator carries out
/// a change and Recovering while it waits for instances to come back.
pub(super) fn not_ready_phase(old: Option<Phase>, no_instances: bool, changing: bool) -> Phase {
    let created = !matches!(old, None | Some(Phase::Pending | Phase::Creating));
    match (created, no_instances, changing) {
        (false, true, _) => Phase::Pending,
        (false, false, _) => Phase::Creating,
        (true, _, true) => Phase::Updating,
        (true, _, false) => Phase::Recovering,
    }
}

/// The status without replication offsets and lags (they move with every
/// write).
fn strip_offsets(s: &RedisStatus) -> RedisStatus {
    let mut s = s.clone();
    // Memory moves with every write too: compared apart (`memory_moved`).
    if let Some(m) = &mut s.memory {
        m.used_bytes = 0;
        m.percent = None;
        m.summary = String::new();
    }
    for i in &mut s.instances {
        i.offset = None;
        i.lag_bytes = None;
    }
    s
}

/// Offsets and lags are refreshed in the status once one has moved this far,
/// so a busy Redis does not cost a status write per reconcile.
const OFFSET_REFRESH_BYTES: u64 = 1 << 20;

/// Whether the status changed in a way worth a write: anything but the
/// replication offsets and lags, or one of those that moved by at least
/// [`OFFSET_REFRESH_BYTES`] (or appeared, or went away).
pub(super) fn status_differs(old: &RedisStatus, new: &RedisStatus) -> bool {
    if strip_offsets(old) != strip_offsets(new) {
        return true;
    }
    let moved = |a: Option<i64>, b: Option<i64>| match (a, b) {
        (Some(x), Some(y)) => x.abs_diff(y) >= OFFSET_REFRESH_BYTES,
        (x, y) => x.is_some() != y.is_some(),
    };
    memory_moved(old.memory.as_ref(), new.memory.as_ref())
        || old
            .instances
            .iter()
            .zip(&new.instances)
            .any(|(a, b)| moved(a.offset, b.offset) || moved(a.lag_bytes, b.lag_bytes))
}

/// Whether memory use moved enough to be written: by 1 % of maxmemory, or
/// by 1 MiB without a limit.
fn memory_moved(old: Option<&MemoryStatus>, new: Option<&MemoryStatus>) -> bool {
    match (old, new) {
        (Some(a), Some(b)) => match (a.percent, b.percent) {
            (Some(x), Some(y)) => x != y,
            _ => a.used_bytes.abs_diff(b.used_bytes) >= 1 << 20,
        },
        (a, b) => a.is_some() != b.is_some(),
    }
}

/// `status.memory`: the primary's memory, or the first instance that
/// answered when there is no primary.
fn memory_status(facts: &[PodFacts], primary: Option<&str>) -> Option<MemoryStatus> {
    let f = facts
        .iter()
        .find(|f| Some(f.name.as_str()) == primary && f.used_memory.is_some())
        .or_else(|| facts.iter().find(|f| f.used_memory.is_some()))?;
    let used = f.used_memory? as i64;
    let max = f.maxmemory.filter(|m| *m > 0).map(|m| m as i64);
    let percent = max.map(|m| ((used as f64) * 100.0 / (m as f64)).round() as i32);
    let summary = match (max, percent) {
        (Some(m), Some(p)) => format!("{}/{} ({p}%)", mebibytes(used), mebibytes(m)),
        _ => format!("{} (no limit)", mebibytes(used)),
    };
    Some(MemoryStatus {
        instance: f.name.clone(),
        used_bytes: used,
        max_bytes: max,
        percent,
        summary,
    })
}

fn mebibytes(bytes: i64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if mib >= 10.0 {
        format!("{mib:.0}Mi")
    } else {
        format!("{mib:.1}Mi")
    }
}

/// The status as a JSON merge patch: `new`, plus an explicit `null` for
/// every field the old status had and `new` leaves out (an omitted field
/// would keep its old value on the server).
pub(super) fn merge_patch_value(
    old: &RedisStatus,
    new: &RedisStatus,
) -> Result<serde_json::Value, Error> {
    let json = |s: &RedisStatus| serde_json::to_value(s).map_err(|e| Error::Serialize("status", e));
    let mut value = json(new)?;
    null_removed(&mut value, &json(old)?);
    Ok(value)
}

/// A JSON merge patch keeps what it does not name: every field the old
/// value had and the new one lacks is set to null, at every depth of the
/// objects both have (a nested field such as
/// `status.resharding.current` is removed too).
fn null_removed(new: &mut serde_json::Value, old: &serde_json::Value) {
    let (serde_json::Value::Object(map), serde_json::Value::Object(old_map)) = (new, old) else {
        return;
    };
    for (key, was) in old_map {
        match map.get_mut(key) {
            None => {
                map.insert(key.clone(), serde_json::Value::Null);
            }
            Some(now) => null_removed(now, was),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_nested_field_removed_is_nulled_in_the_patch() {
        use crate::api::v1alpha1::{ReshardingStatus, SlotMoveIntent};
        let old = RedisStatus {
            resharding: Some(ReshardingStatus {
                current: Some(SlotMoveIntent::default()),
                ..Default::default()
            }),
            primary: Some("cache-0".into()),
            ..Default::default()
        };
        let new = RedisStatus {
            resharding: Some(ReshardingStatus::default()),
            ..Default::default()
        };
        let v = merge_patch_value(&old, &new).expect("patch");
        assert_eq!(v["resharding"]["current"], serde_json::Value::Null);
        assert!(
            v["resharding"]
                .as_object()
                .is_some_and(|m| m.contains_key("current"))
        );
        assert_eq!(v["primary"], serde_json::Value::Null);
        assert!(v.as_object().is_some_and(|m| m.contains_key("primary")));
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

    fn instance(name: &str, role: &str) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            role: role.into(),
            ready: true,
            offset: Some(84),
            lag_bytes: (role == "replica").then_some(0),
            link_up: (role == "replica").then_some(true),
        }
    }

    fn ready_status() -> RedisStatus {
        let then = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        RedisStatus {
            primary: Some("cache-0".into()),
            phase: Some(Phase::Ready),
            instances: vec![
                instance("cache-0", "primary"),
                instance("cache-1", "replica"),
                instance("cache-2", "replica"),
            ],
            conditions: merge(
                &[],
                &[
                    Cond::new("Ready", true, "AllInstancesReady", "3/3"),
                    Cond::new("Degraded", false, "AsExpected", "none"),
                ],
                Some(1),
                then,
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_moved_primary_is_the_only_primary_and_ready_drops() {
        let old = ready_status();
        let now = Timestamp::from_second(2_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let Some(moved) = primary_moved(&old, "cache-1", Some(1), now) else {
            panic!("cache-1 is not the recorded primary");
        };
        let roles: Vec<(&str, &str)> = moved
            .instances
            .iter()
            .map(|i| (i.name.as_str(), i.role.as_str()))
            .collect();
        assert_eq!(
            roles,
            [
                ("cache-0", "unknown"),
                ("cache-1", "primary"),
                ("cache-2", "replica")
            ]
        );
        assert_eq!(moved.instances[1].link_up, None, "a primary has no link");
        let Some((conds, phase)) = moved.conditions else {
            panic!("a Ready Redis whose primary moved is not Ready");
        };
        assert_eq!(phase, Phase::Updating);
        let ready = conds.iter().find(|c| c.type_ == "Ready");
        assert_eq!(
            ready.map(|c| (
                c.status.as_str(),
                c.reason.as_str(),
                c.last_transition_time.0
            )),
            Some(("False", "PrimaryMoved", now))
        );
        // The others are kept as they were, times included.
        assert_eq!(conds[1], old.conditions[1]);
    }

    #[test]
    fn a_primary_moved_while_not_ready_leaves_the_conditions() {
        let mut old = ready_status();
        old.conditions = merge(
            &[],
            &[Cond::new("Ready", false, "NotAllInstancesReady", "2/3")],
            Some(1),
            Timestamp::UNIX_EPOCH,
        );
        let Some(moved) = primary_moved(&old, "cache-2", Some(1), Timestamp::UNIX_EPOCH) else {
            panic!("cache-2 is not the recorded primary");
        };
        assert!(moved.conditions.is_none());
        assert_eq!(moved.instances[2].role, "primary");
        assert_eq!(moved.instances[0].role, "unknown");
    }

    #[test]
    fn the_recorded_primary_recorded_again_moves_nothing() {
        let old = ready_status();
        assert!(primary_moved(&old, "cache-0", Some(1), Timestamp::UNIX_EPOCH).is_none());
    }

    #[test]
    fn creating_is_only_before_the_first_ready() {
        use Phase::*;
        // (phase last written, no instance, a change in progress) -> phase
        let cases = [
            (None, true, false, Pending),
            (Some(Pending), false, false, Creating),
            (Some(Creating), false, true, Creating),
            (Some(Ready), false, false, Recovering),
            (Some(Ready), false, true, Updating),
            (Some(Recovering), false, true, Updating),
            (Some(Updating), false, false, Recovering),
            (Some(Degraded), false, false, Recovering),
            (Some(Hibernated), true, true, Updating),
            (Some(Paused), false, false, Recovering),
        ];
        for (old, empty, changing, want) in cases {
            assert_eq!(
                not_ready_phase(old, empty, changing),
                want,
                "{old:?} {empty} {changing}"
            );
        }
    }

    #[test]
    fn stuck_backoff_is_patient_then_doubles_and_caps() {
        let waits: Vec<u64> = (0..12).map(|n| stuck_backoff(n).as_secs()).collect();
        assert_eq!(waits, [2, 2, 2, 2, 2, 4, 8, 16, 32, 64, 120, 120]);
        assert_eq!(stuck_backoff(u32::MAX), STUCK_REQUEUE_MAX);
    }

    #[test]
    fn memory_is_the_primarys_and_written_only_when_it_moved() {
        let fact = |name: &str, used: u64| PodFacts {
            name: name.into(),
            used_memory: Some(used),
            maxmemory: Some(48 << 20),
            ..Default::default()
        };
        let facts = [fact("cache-0", 1 << 20), fact("cache-1", 12 << 20)];
        let m = memory_status(&facts, Some("cache-1")).expect("memory");
        assert_eq!(m.instance, "cache-1");
        assert_eq!(
            (m.used_bytes, m.max_bytes, m.percent),
            (12 << 20, Some(48 << 20), Some(25))
        );
        assert_eq!(m.summary, "12Mi/48Mi (25%)");
        // No primary: the first instance that answered.
        assert_eq!(
            memory_status(&facts, None).map(|m| m.instance),
            Some("cache-0".into())
        );
        // Less than a percent: no write; a percent: a write.
        let a = memory_status(&[fact("p", 12 << 20)], Some("p"));
        let b = memory_status(&[fact("p", (12 << 20) + (100 << 10))], Some("p"));
        let c = memory_status(&[fact("p", 13 << 20)], Some("p"));
        assert!(!memory_moved(a.as_ref(), b.as_ref()));
        assert!(memory_moved(a.as_ref(), c.as_ref()));
        assert!(memory_moved(a.as_ref(), None));
        // Without a limit: 1 MiB.
        let unlimited = |used: u64| {
            memory_status(
                &[PodFacts {
                    name: "p".into(),
                    used_memory: Some(used),
                    maxmemory: Some(0),
                    ..Default::default()
                }],
                None,
            )
        };
        assert_eq!(
            unlimited(3 << 20).map(|m| m.summary),
            Some("3.0Mi (no limit)".into())
        );
        assert!(!memory_moved(
            unlimited(3 << 20).as_ref(),
            unlimited((3 << 20) + 1000).as_ref()
        ));
        assert!(memory_moved(
            unlimited(3 << 20).as_ref(),
            unlimited(5 << 20).as_ref()
        ));
    }
}
