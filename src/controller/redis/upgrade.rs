//! Upgrades: a change of the engine version (or the move from Redis to
//! Valkey) is rolled out by the rollout's ordered restart — replicas
//! one at a time, each proven (Ready, linked, caught up) before the next,
//! then a zero-loss switchover to an upgraded replica, then the old primary.
//! This module owns what makes that an upgrade: `status.upgrade` (from, to,
//! phase, progress), an event per step, and the rollback. An upgraded
//! instance that cannot pull its image, keeps exiting, or is not proven
//! within `spec.upgrade.timeoutSeconds` puts the upgraded replicas back on
//! the old version while the primary still runs it; the spec is left as the
//! user wrote it, and the status says the version is not served and why. A
//! new spec change starts a new attempt. The switchover is the point of no
//! return: an older server cannot follow a newer primary, so once the
//! primary runs the new version the upgrade only goes forward.
//!
//! The pure rules (proven, failed, the condition) are in `judge.rs`.
//!
//! What the instances run is recorded on the StatefulSet (annotations
//! [`crate::controller::names::ENGINE_ANNOTATION`], [`crate::controller::names::VERSION_ANNOTATION`] and the
//! container image), so an operator restarted mid-way finds the upgrade.
//!
//! Length: ~400 lines of code; its pure rules already live in `judge.rs`.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::facts::{Cond, PodFacts};
use super::{Error, Reconciler};
use crate::api::v1alpha1::{Mode, Redis, Served, UpgradePhase, UpgradeSpec, UpgradeStatus};

mod judge;
use judge::{CANCELLED, label, now, same};
pub use judge::{
    CAUGHT_UP_BYTES, condition, desired, failure, is_downgrade, primary_left, proven, running,
};

impl Reconciler {
    fn upgrade_timeout(&self) -> i64 {
        let t = self
            .redis
            .spec
            .upgrade
            .as_ref()
            .and_then(|u| u.timeout_seconds)
            .unwrap_or(UpgradeSpec::DEFAULT_TIMEOUT_SECONDS);
        i64::from(t)
    }

    /// Starts, follows, rolls back or finishes an upgrade. Runs after the
    /// observation and before the children are applied: while an upgrade is
    /// rolled back (or stays rolled back) the children are built from what
    /// the instances ran before (`status.upgrade.from`). Returns
    /// `UpgradeFailed` when the spec cannot be served (reported in place of
    /// the upgrade's own condition).
    ///
    /// `live_sts`: the StatefulSet whose template tells what runs (in
    /// Cluster mode, shard 0's: every shard's is built from the same spec);
    /// `settled`: every StatefulSet's controller has seen its template (a
    /// restarted pod takes it). `primaries`: each shard's primary.
    pub(super) async fn track_upgrade(
        &mut self,
        live_sts: Option<&StatefulSet>,
        settled: bool,
        facts: &[PodFacts],
        primaries: &[&str],
    ) -> Result<Option<Cond>, Error> {
        let mut failed = None;
        let old = self.redis.status.as_ref().and_then(|s| s.upgrade.clone());
        self.records.upgrade = old.clone();
        let Some(running) = live_sts.and_then(|s| running(s, &self.redis)) else {
            return Ok(failed);
        };
        let want = desired(&self.redis, self.ctx.images.image_for(&self.redis.spec));
        let total = self.redis.spec.total_instances();
        let mut u = match old {
            // The spec asks again for what a rolled-back upgrade wanted:
            // keep serving what runs.
            Some(u) if u.phase == UpgradePhase::RolledBack && same(&u.to, &want) => {
                self.serve(&u.from);
                return Ok(failed);
            }
            Some(u) if matches!(u.phase, UpgradePhase::Upgrading | UpgradePhase::RollingBack) => u,
            _ => {
                if same(&running, &want) {
                    return Ok(failed);
                }
                if is_downgrade(&running, &want) {
                    failed = Some(self.no_way_back(&want, &running).await);
                    self.serve(&running);
                    return Ok(failed);
                }
                let u = UpgradeStatus {
                    from: running.clone(),
                    to: want.clone(),
                    phase: UpgradePhase::Upgrading,
                    done: 0,
                    total,
                    started_at: now(),
                    finished_at: None,
                    reason: None,
                    message: None,
                    primary_restarted_at: None,
                    unavailable_seconds: None,
                };
                // Recorded before the StatefulSet changes, so an operator
                // restarted in between knows where the instances came from.
                self.record_upgrade(&u).await?;
                self.event(
                    EventType::Normal,
                    "UpgradeStarted",
                    "Upgrade",
                    format!(
                        "upgrading {total} instances from {} to {}: {}",
                        label(&u.from),
                        label(&u.to),
                        if self.redis.spec.mode() == Mode::Cluster {
                            "every shard's replicas first, then shard by shard a CLUSTER \
                             FAILOVER to an upgraded replica and the old primary"
                        } else {
                            "replicas first, then a switchover, then the old primary"
                        }
                    ),
                )
                .await;
                u
            }
        };

        // Past the switchover there is no way back: an older server cannot
        // follow a newer primary. The upgrade goes on, and says why.
        if !same(&u.to, &want) && same(&u.from, &want) && primary_left(facts, primaries, &u.from) {
            failed = Some(self.no_way_back(&want, &u.to.clone()).await);
            self.serve(&u.to.clone());
            self.follow_upgrade(&mut u, facts, primaries).await?;
            self.records.upgrade = Some(u);
            return Ok(failed);
        }
        // A newer spec wins: the upgrade heads for it (or back to where it
        // came from), keeping `from`.
        if !same(&u.to, &want) {
            let back = same(&u.from, &want);
            self.event(
                EventType::Normal,
                "UpgradeRetargeted",
                "Upgrade",
                format!(
                    "the spec changed during the upgrade to {}: now {}",
                    label(&u.to),
                    if back {
                        format!("returning to {}", label(&want))
                    } else {
                        format!("upgrading to {}", label(&want))
                    }
                ),
            )
            .await;
            u.to = want.clone();
            u.phase = if back {
                UpgradePhase::RollingBack
            } else {
                UpgradePhase::Upgrading
            };
            u.reason = back.then(|| CANCELLED.to_string());
            u.message = back.then(|| "the spec returned to the version served before".into());
            self.record_upgrade(&u).await?;
        }

        match u.phase {
            UpgradePhase::Upgrading => self.follow_upgrade(&mut u, facts, primaries).await?,
            UpgradePhase::RollingBack => {
                let settled = same(&running, &u.from) && settled;
                self.follow_rollback(&mut u, facts, primaries, settled)
                    .await
            }
            _ => {}
        }
        u.total = total;
        self.records.upgrade = Some(u);
        Ok(failed)
    }

    async fn follow_upgrade(
        &mut self,
        u: &mut UpgradeStatus,
        facts: &[PodFacts],
        primaries: &[&str],
    ) -> Result<(), Error> {
        let on_new = |f: &&PodFacts| f.image.as_deref() == Some(u.to.image.as_str());
        let upgraded = |f: &&PodFacts| f.image.as_deref() != Some(u.from.image.as_str());
        // Until the primary moves, a failed instance rolls everything back.
        if !primary_left(facts, primaries, &u.from) || self.redis.spec.mode() == Mode::Standalone {
            let timeout = self.upgrade_timeout();
            // An upgraded instance not Ready yet is judged again when its
            // timeout runs out, not at the next backed-off pass (a minute
            // or more after it once the state stands still).
            if let Some(left) = facts
                .iter()
                .filter(upgraded)
                .filter(|f| !f.terminating)
                .filter_map(|f| f.unready_secs)
                .map(|s| timeout.saturating_sub(s))
                .filter(|left| *left >= 0)
                .min()
            {
                self.report
                    .recheck_within(std::time::Duration::from_secs(left.unsigned_abs() + 1));
            }
            if let Some((reason, msg)) = facts
                .iter()
                .filter(upgraded)
                .filter(|f| !f.terminating)
                .find_map(|f| failure(f, timeout))
            {
                u.phase = UpgradePhase::RollingBack;
                u.reason = Some(reason.clone());
                u.message = Some(msg.clone());
                self.record_upgrade(u).await?;
                self.event(
                    EventType::Warning,
                    "UpgradeFailed",
                    "Upgrade",
                    format!(
                        "upgrade to {} failed ({reason}): {msg}; rolling the upgraded \
                         instances back to {}",
                        label(&u.to),
                        label(&u.from)
                    ),
                )
                .await;
                self.serve(&u.from.clone());
                // The StatefulSet still has the new template: restarts
                // wait for the next pass.
                return Ok(());
            }
        }
        let proven_new: Vec<&PodFacts> = facts
            .iter()
            .filter(on_new)
            .filter(|f| proven(f, primaries))
            .collect();
        let done = proven_new.len() as i32;
        if done > u.done {
            let newest = proven_new
                .iter()
                .map(|f| format!("{} ({})", f.name, f.version.as_deref().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", ");
            self.event(
                EventType::Normal,
                "UpgradeProgress",
                "Upgrade",
                format!(
                    "{done}/{} instances run {} and are proven: {newest}",
                    u.total,
                    label(&u.to)
                ),
            )
            .await;
        }
        u.done = done;
        let total = self.redis.spec.total_instances();
        if done == total && facts.len() as i32 == total {
            u.phase = UpgradePhase::Succeeded;
            u.finished_at = Some(now());
            if self.redis.spec.mode() == Mode::Standalone
                && let Some(at) = u.primary_restarted_at.as_deref()
                && let Ok(at) = at.parse::<Timestamp>()
            {
                let ms = Timestamp::now().duration_since(at).as_millis();
                u.unavailable_seconds = Some((ms as f64 / 100.0).round() / 10.0);
            }
            let took = u
                .started_at
                .parse::<Timestamp>()
                .map(|t| {
                    format!(
                        " in {:.1}s",
                        Timestamp::now().duration_since(t).as_secs_f64()
                    )
                })
                .unwrap_or_default();
            let window = u
                .unavailable_seconds
                .map(|s| format!("; the instance was unavailable for {s:.1}s"))
                .unwrap_or_default();
            self.ctx
                .metrics
                .upgrades
                .with_label_values(&["succeeded"])
                .inc();
            self.event(
                EventType::Normal,
                "UpgradeSucceeded",
                "Upgrade",
                format!("every instance runs {}{took}{window}", label(&u.to)),
            )
            .await;
        } else {
            self.report.progress(format!(
                "upgrading to {}: {done}/{total} instances done",
                label(&u.to)
            ));
        }
        Ok(())
    }

    /// Rolls the upgraded instances back: the children are built from
    /// `from`; an upgraded instance that is not Ready is restarted at once
    /// (it serves nothing); ready ones follow the ordered restart.
    async fn follow_rollback(
        &mut self,
        u: &mut UpgradeStatus,
        facts: &[PodFacts],
        primaries: &[&str],
        settled: bool,
    ) {
        self.serve(&u.from.clone());
        let on_old = |f: &PodFacts| f.image.as_deref() == Some(u.from.image.as_str());
        let back = facts
            .iter()
            .filter(|f| on_old(f) && proven(f, primaries))
            .count() as i32;
        let total = self.redis.spec.total_instances();
        if back == total && facts.len() as i32 == total {
            u.phase = UpgradePhase::RolledBack;
            u.finished_at = Some(now());
            self.ctx
                .metrics
                .upgrades
                .with_label_values(&["rolled_back"])
                .inc();
            self.event(
                EventType::Warning,
                "UpgradeRolledBack",
                "Upgrade",
                format!(
                    "every instance runs {} again; {} is not served ({}). Change the spec \
                     to try again",
                    label(&u.from),
                    label(&u.to),
                    u.message.as_deref().unwrap_or("rolled back")
                ),
            )
            .await;
            return;
        }
        self.report.progress(format!(
            "rolling back to {}: {back}/{total} instances back",
            label(&u.from)
        ));
        // A restarted pod takes the StatefulSet's template: only once the
        // StatefulSet runs the old template again.
        if !settled {
            return;
        }
        let standalone = self.redis.spec.mode() == Mode::Standalone;
        for f in facts.iter().filter(|f| {
            !on_old(f)
                && !f.ready
                && !f.terminating
                && (standalone || !primaries.contains(&f.name.as_str()))
        }) {
            if let Err(e) = self.restart_pod(&f.name).await {
                self.report
                    .note(format!("restarting {} on the old version: {e}", f.name));
                continue;
            }
            self.event(
                EventType::Normal,
                "UpgradeRollback",
                "Upgrade",
                format!("restarted {} on {}", f.name, label(&u.from)),
            )
            .await;
        }
    }

    /// The spec asks for a version older than the primary runs: say so in
    /// `UpgradeFailed` (reason `NoWayBack`), and keep `runs`. Not
    /// Degraded: a Degraded pass stops before the restarts that may still
    /// finish an upgrade. The recorder folds repeats of the event into one
    /// series.
    async fn no_way_back(&mut self, want: &Served, runs: &Served) -> Cond {
        let msg = format!(
            "spec.version: {} cannot be served: the primary runs {} and an older server \
             cannot follow a newer primary; set the spec to {} or newer",
            label(want),
            label(runs),
            runs.version
        );
        self.event(EventType::Warning, "NoWayBack", "Upgrade", msg.clone())
            .await;
        Cond::new("UpgradeFailed", true, "NoWayBack", msg)
    }

    /// Builds the children from `served` instead of the spec's engine,
    /// version and image for the rest of this pass.
    fn serve(&mut self, served: &Served) {
        let spec = &self.redis.spec;
        if spec.engine() == served.engine
            && spec.version() == served.version
            && self.ctx.images.image_for(spec) == served.image
        {
            return;
        }
        let mut redis = Redis::clone(&self.redis);
        redis.spec.engine = Some(served.engine);
        redis.spec.version = Some(served.version.clone());
        // The image only when engine and version do not give it: the
        // template must come out exactly as it was (an explicit image
        // changes it), or the untouched primary would count as outdated.
        redis.spec.image = None;
        if self.ctx.images.image_for(&redis.spec) != served.image {
            redis.spec.image = Some(served.image.clone());
        }
        self.redis = Arc::new(redis);
    }

    /// The rolling restart is about to restart the primary (a Standalone's
    /// only instance) on the new version.
    pub(super) async fn note_primary_restart(&mut self) {
        if let Some(u) = self.records.upgrade.as_mut()
            && u.phase == UpgradePhase::Upgrading
            && u.primary_restarted_at.is_none()
        {
            u.primary_restarted_at = Some(now());
            let u = u.clone();
            if let Err(e) = self.record_upgrade(&u).await {
                self.report.note(format!("recording the upgrade: {e}"));
            }
        }
    }

    async fn record_upgrade(&mut self, u: &UpgradeStatus) -> Result<(), Error> {
        self.records.upgrade = Some(u.clone());
        let value = serde_json::to_value(u).map_err(|e| Error::Serialize("status", e))?;
        self.patch_status(serde_json::json!({ "upgrade": value }))
            .await
    }
}

#[cfg(test)]
mod tests;
