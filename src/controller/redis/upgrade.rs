//! Upgrades: a change of the engine version (or the move from Redis to
//! Valkey) is rolled out by [`super::rollout`]'s ordered restart — replicas
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
//! What the instances run is recorded on the StatefulSet (annotations
//! [`build::ENGINE_ANNOTATION`], [`build::VERSION_ANNOTATION`] and the
//! container image), so an operator restarted mid-way finds the upgrade.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::runtime::events::EventType;

use super::observe::{PodFacts, Role};
use super::status::Cond;
use super::{Error, Reconciler, build};
use crate::api::v1alpha1::{Engine, Mode, Redis, Served, UpgradePhase, UpgradeSpec, UpgradeStatus};

/// A replica this far behind its primary (bytes) is caught up.
pub const CAUGHT_UP_BYTES: i64 = 1 << 20;

/// `status.upgrade.reason` when the spec returned to the old version.
const CANCELLED: &str = "Cancelled";

/// Restarts of an upgraded server that make a crash loop.
const CRASH_LOOP_RESTARTS: i32 = 2;

/// Waiting reasons that say the image will not run.
const IMAGE_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Whether an instance is proven: Ready and answering; a replica also
/// linked, not in a full sync, heard from its primary within 2 s and at
/// most [`CAUGHT_UP_BYTES`] behind.
pub fn proven(f: &PodFacts, primary: Option<&str>) -> bool {
    if !(f.ready && f.reachable && !f.terminating) {
        return false;
    }
    if Some(f.name.as_str()) == primary || f.role == Some(Role::Primary) {
        return true;
    }
    f.link_up == Some(true)
        && !f.syncing
        && f.link_age.is_some_and(|a| a <= 2)
        && f.lag_bytes.is_none_or(|l| l <= CAUGHT_UP_BYTES)
}

/// Why an upgraded instance failed, if it did: (reason, message).
pub fn failure(f: &PodFacts, timeout_secs: i64) -> Option<(String, String)> {
    if let Some((reason, msg)) = &f.waiting {
        if IMAGE_FAILURES.contains(&reason.as_str()) {
            return Some((
                "ImagePullFailed".into(),
                format!("{}: {reason}: {msg}", f.name),
            ));
        }
        if reason == "CrashLoopBackOff" {
            return Some(("CrashLoop".into(), crash_message(f)));
        }
    }
    if f.restarts >= CRASH_LOOP_RESTARTS {
        return Some(("CrashLoop".into(), crash_message(f)));
    }
    // Not Ready (a replica: linked, not loading, not in a full sync) for
    // the whole timeout. A Ready instance that is still catching up only
    // holds the next restart; a brief flap later is no failure.
    if f.unready_secs.is_some_and(|s| s >= timeout_secs) {
        let saw = match (f.reachable, f.link_up, f.syncing) {
            (false, _, _) => "not answering".to_string(),
            (_, _, true) => "still in a full sync".to_string(),
            (_, Some(false), _) => "its replication link is down".to_string(),
            _ => "its readiness probe fails".to_string(),
        };
        return Some((
            "NotReadyInTime".into(),
            format!("{}: not Ready for {timeout_secs}s: {saw}", f.name),
        ));
    }
    None
}

fn crash_message(f: &PodFacts) -> String {
    let exit = f
        .last_exit
        .map(|c| format!(", last exit code {c}"))
        .unwrap_or_default();
    format!(
        "{}: the server keeps exiting ({} restarts{exit})",
        f.name, f.restarts
    )
}

/// The serving target a spec asks for.
pub fn desired(redis: &Redis, image: String) -> Served {
    Served {
        engine: redis.spec.engine,
        version: redis.spec.version.clone(),
        image,
    }
}

/// What the live StatefulSet's template runs, from its annotations and
/// container (a StatefulSet written before the annotations existed: the
/// spec's engine and version).
pub fn running(sts: &StatefulSet, redis: &Redis) -> Option<Served> {
    let image = sts
        .spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == build::SERVER_CONTAINER)?
        .image
        .clone()?;
    let ann = sts.metadata.annotations.as_ref();
    let engine = match ann
        .and_then(|a| a.get(build::ENGINE_ANNOTATION))
        .map(String::as_str)
    {
        Some("Valkey") => Engine::Valkey,
        Some("Redis") => Engine::Redis,
        _ => redis.spec.engine,
    };
    let version = ann
        .and_then(|a| a.get(build::VERSION_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| redis.spec.version.clone());
    Some(Served {
        engine,
        version,
        image,
    })
}

fn same(a: &Served, b: &Served) -> bool {
    a.engine == b.engine && a.image == b.image
}

fn label(s: &Served) -> String {
    format!("{:?} {} ({})", s.engine, s.version, s.image)
}

fn now() -> String {
    Timestamp::now().to_string()
}

/// `UpgradeFailed`: true while a failed upgrade is rolled back and after,
/// until the spec changes; says which instance failed and what it showed.
pub fn condition(u: &UpgradeStatus) -> Cond {
    let failed = u.reason.as_deref().filter(|r| *r != CANCELLED);
    match (u.phase, failed) {
        (UpgradePhase::RollingBack | UpgradePhase::RolledBack, Some(reason)) => Cond::new(
            "UpgradeFailed",
            true,
            reason,
            format!(
                "{} is not served: {}; {} to {}",
                label(&u.to),
                u.message.as_deref().unwrap_or("the upgrade failed"),
                if u.phase == UpgradePhase::RolledBack {
                    "rolled back"
                } else {
                    "rolling back"
                },
                label(&u.from)
            ),
        ),
        (UpgradePhase::Succeeded, _) => Cond::new(
            "UpgradeFailed",
            false,
            "Succeeded",
            format!("every instance runs {}", label(&u.to)),
        ),
        (phase, _) => Cond::new(
            "UpgradeFailed",
            false,
            format!("{phase:?}"),
            format!("{} to {}", label(&u.from), label(&u.to)),
        ),
    }
}

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
    /// the instances ran before (`status.upgrade.from`).
    pub(super) async fn track_upgrade(
        &mut self,
        live_sts: Option<&StatefulSet>,
        facts: &[PodFacts],
        primary: Option<&str>,
    ) -> Result<(), Error> {
        let old = self.redis.status.as_ref().and_then(|s| s.upgrade.clone());
        self.upgrade = old.clone();
        let Some(running) = live_sts.and_then(|s| running(s, &self.redis)) else {
            return Ok(());
        };
        let want = desired(&self.redis, self.ctx.images.image_for(&self.redis.spec));
        let total = self.redis.spec.desired_instances();
        let mut u = match old {
            // The spec asks again for what a rolled-back upgrade wanted:
            // keep serving what runs.
            Some(u) if u.phase == UpgradePhase::RolledBack && same(&u.to, &want) => {
                self.serve(&u.from);
                return Ok(());
            }
            Some(u) if matches!(u.phase, UpgradePhase::Upgrading | UpgradePhase::RollingBack) => u,
            _ => {
                if same(&running, &want) {
                    return Ok(());
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
                        "upgrading {total} instances from {} to {}: replicas first, then a \
                         switchover, then the old primary",
                        label(&u.from),
                        label(&u.to)
                    ),
                )
                .await;
                u
            }
        };

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
            UpgradePhase::Upgrading => self.follow_upgrade(&mut u, facts, primary).await?,
            UpgradePhase::RollingBack => {
                let settled = same(&running, &u.from)
                    && live_sts.is_some_and(|s| {
                        s.status.as_ref().and_then(|st| st.observed_generation)
                            == s.metadata.generation
                    });
                self.follow_rollback(&mut u, facts, primary, settled).await
            }
            _ => {}
        }
        u.total = total;
        self.upgrade = Some(u);
        Ok(())
    }

    async fn follow_upgrade(
        &mut self,
        u: &mut UpgradeStatus,
        facts: &[PodFacts],
        primary: Option<&str>,
    ) -> Result<(), Error> {
        let on_new = |f: &&PodFacts| f.image.as_deref() == Some(u.to.image.as_str());
        let upgraded = |f: &&PodFacts| f.image.as_deref() != Some(u.from.image.as_str());
        let primary_upgraded = facts
            .iter()
            .any(|f| Some(f.name.as_str()) == primary && upgraded(&f) && !f.terminating);
        // Until the primary moves, a failed instance rolls everything back.
        if !primary_upgraded || self.redis.spec.mode == Mode::Standalone {
            let timeout = self.upgrade_timeout();
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
        let done = facts
            .iter()
            .filter(on_new)
            .filter(|f| proven(f, primary))
            .count() as i32;
        if done > u.done {
            let newest = facts
                .iter()
                .filter(on_new)
                .filter(|f| proven(f, primary))
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
        let total = self.redis.spec.desired_instances();
        if done == total && facts.len() as i32 == total {
            u.phase = UpgradePhase::Succeeded;
            u.finished_at = Some(now());
            if self.redis.spec.mode == Mode::Standalone
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
            self.event(
                EventType::Normal,
                "UpgradeSucceeded",
                "Upgrade",
                format!("every instance runs {}{took}{window}", label(&u.to)),
            )
            .await;
        } else {
            self.progressing.push(format!(
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
        primary: Option<&str>,
        settled: bool,
    ) {
        self.serve(&u.from.clone());
        let on_old = |f: &PodFacts| f.image.as_deref() == Some(u.from.image.as_str());
        let back = facts
            .iter()
            .filter(|f| on_old(f) && proven(f, primary))
            .count() as i32;
        let total = self.redis.spec.desired_instances();
        if back == total && facts.len() as i32 == total {
            u.phase = UpgradePhase::RolledBack;
            u.finished_at = Some(now());
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
        self.progressing.push(format!(
            "rolling back to {}: {back}/{total} instances back",
            label(&u.from)
        ));
        // A restarted pod takes the StatefulSet's template: only once the
        // StatefulSet runs the old template again.
        if !settled {
            return;
        }
        let standalone = self.redis.spec.mode == Mode::Standalone;
        for f in facts.iter().filter(|f| {
            !on_old(f)
                && !f.ready
                && !f.terminating
                && (standalone || Some(f.name.as_str()) != primary)
        }) {
            self.ctx.metrics.kube("delete");
            self.wrote = true;
            match self
                .api::<Pod>()
                .delete(&f.name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    self.notes
                        .push(format!("restarting {} on the old version: {e}", f.name));
                    continue;
                }
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

    /// Builds the children from `served` instead of the spec's engine,
    /// version and image for the rest of this pass.
    fn serve(&mut self, served: &Served) {
        let spec = &self.redis.spec;
        if spec.engine == served.engine
            && spec.version == served.version
            && self.ctx.images.image_for(spec) == served.image
        {
            return;
        }
        let mut redis = Redis::clone(&self.redis);
        redis.spec.engine = served.engine;
        redis.spec.version = served.version.clone();
        redis.spec.image = Some(served.image.clone());
        self.redis = Arc::new(redis);
    }

    /// The rolling restart is about to restart the primary (a Standalone's
    /// only instance) on the new version.
    pub(super) async fn note_primary_restart(&mut self) {
        if let Some(u) = self.upgrade.as_mut()
            && u.phase == UpgradePhase::Upgrading
            && u.primary_restarted_at.is_none()
        {
            u.primary_restarted_at = Some(now());
            let u = u.clone();
            if let Err(e) = self.record_upgrade(&u).await {
                self.notes.push(format!("recording the upgrade: {e}"));
            }
        }
    }

    async fn record_upgrade(&mut self, u: &UpgradeStatus) -> Result<(), Error> {
        self.upgrade = Some(u.clone());
        let value = serde_json::to_value(u).map_err(|e| Error::Serialize("status", e))?;
        self.patch_status(serde_json::json!({ "upgrade": value }))
            .await
    }
}

#[cfg(test)]
mod tests;
