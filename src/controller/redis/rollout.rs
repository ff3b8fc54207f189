//! Rollout: pods running an outdated template restart one at a time,
//! replicas first (highest ordinal first), then the primary after a
//! switchover to an up-to-date replica that loses no acknowledged write;
//! and the switchover a user asks for (`spec.failover.switchoverTo`).
//! Version upgrades ride on this restart; [`super::upgrade`] tracks them
//! and rolls them back.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::events::EventType;

use super::facts::{PodFacts, Role, ordinal};
use super::{Error, Reconciler, plan};
use crate::api::v1alpha1::{BackupPhase, RedisBackup};
use crate::controller::names;
use crate::redis::{ConnectOptions, Endpoint};

/// Progressing reason while a restart that would empty the only instance
/// waits for `spec.allowDataLossOnRestart`.
pub const RESTART_WOULD_LOSE_DATA: &str = "RestartWouldLoseData";

/// Whether backup `b` of Redis `redis` is reading from `pod` now: Running,
/// with `pod` its source (a Cluster backup: the source of a shard not yet
/// Completed). A restart of that pod would cut the read (the backup's Job
/// reads it at its address, which the restart changes) and fail the
/// backup `SourceFailed`.
pub fn reads_from(b: &RedisBackup, redis: &str, pod: &str) -> bool {
    let Some(st) = b.status.as_ref() else {
        return false;
    };
    b.spec.redis == redis
        && st.phase == Some(BackupPhase::Running)
        && (st.source.as_deref() == Some(pod)
            || st.shards.iter().any(|s| {
                s.source == pod
                    && !matches!(s.phase, Some(BackupPhase::Completed | BackupPhase::Failed))
            }))
}

/// The replica to restart although not every instance is ready: one of an
/// outdated template that runs an older server version than the primary
/// and is not linked to it (it cannot be: an older server refuses a newer
/// one's snapshot), highest ordinal first; none while a pod is being
/// deleted (one restart at a time).
pub fn stranded(facts: &[PodFacts], primary: &str, names: &names::Names) -> Option<String> {
    use crate::redis::info::Version;
    let version = |f: &PodFacts| f.version.as_deref().and_then(|v| v.parse::<Version>().ok());
    let p = facts.iter().find(|f| f.name == primary)?;
    let newer = version(p)?;
    if facts.iter().any(|f| f.terminating) {
        return None;
    }
    facts
        .iter()
        .filter(|f| f.outdated && f.name != primary)
        .filter(|f| f.link_up != Some(true) || f.syncing)
        .filter(|f| version(f).is_some_and(|v| (v.major, v.minor) < (newer.major, newer.minor)))
        .max_by_key(|f| ordinal(&f.name, names).unwrap_or(0))
        .map(|f| f.name.clone())
}

impl Reconciler {
    /// Restarts pods running an outdated template, one at a time: replicas
    /// first (highest ordinal first), then the primary after a switchover to
    /// an up-to-date replica. Only when every instance is ready and caught up.
    pub(super) async fn roll(
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
        // Each restarted instance is proven (Ready; a replica linked and
        // caught up) before the next one restarts.
        let all_ready = facts.len() as i32 == desired
            && facts.iter().all(|f| super::upgrade::proven(f, &[primary]));
        self.report.progress(format!(
            "rolling restart: {} of {} instances outdated",
            outdated.len(),
            facts.len()
        ));
        if !all_ready {
            // A replica that cannot follow the primary because the primary
            // runs a newer server (a failover mid-upgrade promoted an
            // upgraded replica; an older server cannot load a newer one's
            // snapshot) is never ready on its template: it restarts next,
            // onto the new one, or the roll would wait for ever.
            if let Some(name) = stranded(facts, primary, &self.names) {
                self.restart_pod(&name).await?;
                // A reason of its own: the recorder folds repeats of one
                // reason and action into the first event's series.
                self.event(
                    EventType::Normal,
                    "RestartedToFollow",
                    "Restart",
                    format!(
                        "restarted {name}: it runs an older server than the primary {primary} and cannot follow it"
                    ),
                )
                .await;
            }
            return Ok(());
        }
        let next = plan::next_to_restart(facts, primary, &self.names);
        let next_pod = match &next {
            Some(plan::Restart::Replica(name)) => name.as_str(),
            Some(_) => primary,
            None => return Ok(()),
        };
        if self.backup_holds_restart(next_pod).await?
            || self.archive_holds_restart(facts, next_pod).await
        {
            return Ok(());
        }
        let victim = match next {
            Some(plan::Restart::Replica(name)) => name,
            Some(plan::Restart::PrimaryAfterSwitchover { target }) => {
                if self
                    .switchover(facts, primary, &target, opts, "rolling restart")
                    .await
                    .is_none()
                {
                    return Ok(());
                }
                crate::failpoint::hit("after-switchover");
                // The old primary must restart as a replica of the new one:
                // publish the new primary before deleting it.
                self.publish_primary(facts, &target).await?;
                primary.to_string()
            }
            Some(plan::Restart::Primary) => {
                if self.redis.spec.storage.is_none() && !self.redis.spec.allow_data_loss_on_restart
                {
                    self.hold_restart_that_loses_data(primary).await;
                    return Ok(());
                }
                primary.to_string()
            }
            None => return Ok(()),
        };
        if victim == primary {
            self.note_primary_restart().await;
        }
        self.restart_pod(&victim).await?;
        self.event(
            EventType::Normal,
            "RollingRestart",
            "Restart",
            format!("restarted {victim} to apply settings that need a restart"),
        )
        .await;
        Ok(())
    }

    /// Whether the ordered restart of `pod` waits for a backup reading from
    /// it (see [`reads_from`]); says so in Progressing when it does. Only
    /// the roll's own restarts wait: a pod that is down or cannot follow
    /// its primary restarts at once.
    pub(super) async fn backup_holds_restart(&mut self, pod: &str) -> Result<bool, Error> {
        // From the API, once per restart the roll is about to make: the
        // backups are not among this controller's watches, and a backup
        // that started a moment ago must be seen.
        self.ctx.metrics.kube("list");
        let backups = self
            .api::<RedisBackup>()
            .list(&ListParams::default())
            .await?;
        let name = self.redis.name_any();
        let Some(b) = backups.items.iter().find(|b| reads_from(b, &name, pod)) else {
            return Ok(false);
        };
        self.report.progress(format!(
            "the ordered restart of {pod} waits for backup {}, which is reading from it",
            b.name_any()
        ));
        Ok(true)
    }

    /// How far behind an archive may be for a roll to wait for it
    /// ([`Self::archive_holds_restart`]).
    const ARCHIVE_HOLD_MAX_LAG_MS: i64 = 30_000;

    /// Whether the ordered restart of `pod`, the archive's sidecar that
    /// archives now, waits for the archive to pass the moment the last
    /// other instance became Ready. The instance that takes the archive
    /// over continues it from its own server's backlog, which starts where
    /// that server last synced: a restarted replica's backlog starts at its
    /// sync, so an archive still behind that point when its archiver stops
    /// has a hole (seen in a roll that restarted the archiver 0.2 s after
    /// another replica's sync). Says so in Progressing when it waits. In
    /// Cluster mode the last instance of any shard counts (a roll restarts
    /// one pod at a time, so it is the one restarted before).
    pub(super) async fn archive_holds_restart(&mut self, facts: &[PodFacts], pod: &str) -> bool {
        if self.redis.spec.archive.is_none() {
            return false;
        }
        let Some(ip) = super::facts::ip_of(facts, pod) else {
            return false;
        };
        let Some(status) = super::archive::fetch(&ip).await else {
            return false;
        };
        if !status.archiving {
            return false;
        }
        let Some((other, since)) = facts
            .iter()
            .filter(|f| f.name != pod && !f.terminating)
            .filter_map(|f| Some((f.name.as_str(), f.ready_since?)))
            .max_by_key(|(_, since)| *since)
        else {
            return false;
        };
        // Kubernetes times are whole seconds: a second past it.
        let after_ms = (since + 1) * 1000;
        if status.newest_ms >= after_ms {
            return false;
        }
        // An archive that does not advance (its store unreachable) holds no
        // roll: waiting would not close the hole, which is then reported.
        let now_ms = chrono::Utc::now().timestamp_millis();
        if now_ms - status.newest_ms > Self::ARCHIVE_HOLD_MAX_LAG_MS {
            return false;
        }
        self.report.progress(format!(
            "the ordered restart of {pod} waits for its archive to pass {} (when {other} became Ready), so the instance that takes the archive over holds its continuation",
            crate::controller::base::rfc3339(
                chrono::DateTime::from_timestamp_millis(after_ms).unwrap_or_default()
            )
        ));
        self.report
            .recheck_within(std::time::Duration::from_secs(1));
        true
    }

    /// Deletes pod `name` so the StatefulSet re-creates it from its current
    /// template (a pod already gone is fine).
    pub(super) async fn restart_pod(&mut self, name: &str) -> Result<(), kube::Error> {
        self.ctx.metrics.kube("delete");
        self.report.wrote();
        match self
            .api::<Pod>()
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The only instance has no volume: a restart would empty it. Say so
    /// (the event once, when the hold starts) and wait for the user.
    async fn hold_restart_that_loses_data(&mut self, instance: &str) {
        let msg = format!(
            "{instance} must restart to apply the new spec, and without spec.storage that \
             empties it; set spec.allowDataLossOnRestart: true to restart anyway, or create \
             a Redis with storage and move the data"
        );
        let already = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Progressing"))
            .is_some_and(|c| c.reason == RESTART_WOULD_LOSE_DATA);
        if !already {
            self.event(
                EventType::Warning,
                RESTART_WOULD_LOSE_DATA,
                "Restart",
                msg.clone(),
            )
            .await;
        }
        self.report.waiting(RESTART_WOULD_LOSE_DATA);
        self.report.progress(msg);
    }

    pub(super) async fn switchover(
        &mut self,
        facts: &[PodFacts],
        from: &str,
        to: &str,
        opts: &ConnectOptions,
        why: &str,
    ) -> Option<crate::redis::actions::RoleChangeReport> {
        let members: Vec<Endpoint> = facts
            .iter()
            .filter(|f| f.reachable)
            .filter_map(|f| f.ip.as_ref().map(|ip| Endpoint::new(ip, names::REDIS_PORT)))
            .collect();
        let target = facts
            .iter()
            .find(|f| f.name == to)
            .and_then(|f| f.ip.as_ref())
            .map(|ip| Endpoint::new(ip, names::REDIS_PORT))?;
        if let Err(e) = self.record_intent(to).await {
            self.report
                .note(format!("recording the switchover target {to}: {e}"));
            return None;
        }
        let sw = crate::redis::actions::SwitchoverOptions {
            promote_settings: super::conf::fencing_config(&self.redis),
            ..Default::default()
        };
        let old_ep = facts
            .iter()
            .find(|f| f.name == from)
            .and_then(|f| f.ip.as_ref())
            .map(|ip| Endpoint::new(ip, names::REDIS_PORT));
        let result = match old_ep {
            // A Redis that follows a source takes no writes: no pause.
            Some(old_ep) if super::facts::SourceAddress::of(&self.redis).is_some() => {
                super::follow::switch_followed(&old_ep, &target, opts).await
            }
            _ => crate::redis::actions::switchover(&members, &target, opts, &sw).await,
        };
        let outcome = if result.is_ok() { "done" } else { "error" };
        self.ctx
            .metrics
            .switchovers
            .with_label_values(&[outcome])
            .inc();
        match result {
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
                self.report.progress(format!("primary moved to {to}"));
                Some(report)
            }
            Err(e) => {
                // Nothing moved (a switchover that cannot demote the old
                // primary is rolled back): say so, and try again next pass.
                let msg = format!("switchover {from} → {to} ({why}) failed: {e}");
                let category = crate::controller::error::redis_category(&e);
                self.report_failure("SwitchoverFailed", "Switchover", category, msg)
                    .await;
                None
            }
        }
    }

    /// The switchover `spec.failover.switchoverTo` asks for (zero loss),
    /// once the named instance is a ready replica with a live link. True
    /// when the primary moved.
    pub(super) async fn requested_switchover(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        opts: &ConnectOptions,
    ) -> bool {
        let Some(to) = self.redis.spec.failover().switchover_to else {
            return false;
        };
        if to == primary {
            return false;
        }
        let desired = self.redis.spec.desired_instances();
        if !ordinal(&to, &self.names).is_some_and(|o| (0..desired).contains(&o)) {
            let msg = format!(
                "spec.failover.switchoverTo: {to} is not an instance of this Redis \
                 ({} to {})",
                self.names.pod(0),
                self.names.pod(desired - 1)
            );
            self.report_failure("InvalidSwitchoverTarget", "Switchover", "spec", msg)
                .await;
            return false;
        }
        let ready = facts.iter().any(|f| {
            f.name == to
                && f.ready
                && f.reachable
                && !f.terminating
                && f.role == Some(Role::Replica)
                && f.link_up == Some(true)
        });
        if !ready {
            self.report.progress(format!(
                "switchover to {to} (spec.failover.switchoverTo) waits for it to be a ready \
                 replica with a live link"
            ));
            return false;
        }
        if self
            .switchover(
                facts,
                primary,
                &to,
                opts,
                "requested in spec.failover.switchoverTo",
            )
            .await
            .is_none()
        {
            return false;
        }
        if let Err(e) = self.publish_primary(facts, &to).await {
            self.report
                .progress(format!("recording new primary {to}: {e}"));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(i: i32, version: &str, role: Role, link: Option<bool>, outdated: bool) -> PodFacts {
        PodFacts {
            name: format!("cache-{i}"),
            ready: link != Some(false),
            reachable: true,
            role: Some(role),
            link_up: link,
            version: Some(version.into()),
            outdated,
            ..Default::default()
        }
    }

    #[test]
    fn a_replica_older_than_a_promoted_primary_restarts_although_not_ready() {
        let names = names::Names::new("cache");
        // Mid-upgrade 6.2 -> 7.0, the primary lost: cache-2 (7.0) was
        // promoted, the 6.2 instances cannot follow it; a second change
        // made every template outdated.
        let mut facts = vec![
            pod(0, "6.2.14", Role::Replica, Some(false), true),
            pod(1, "6.2.14", Role::Replica, Some(false), true),
            pod(2, "7.0.15", Role::Primary, None, true),
        ];
        assert_eq!(stranded(&facts, "cache-2", &names), Some("cache-1".into()));
        // One at a time.
        facts[1].terminating = true;
        assert_eq!(stranded(&facts, "cache-2", &names), None);
        facts[1] = pod(1, "7.0.15", Role::Replica, Some(true), false);
        assert_eq!(stranded(&facts, "cache-2", &names), Some("cache-0".into()));
        // A replica of the same version that is only slow is waited for.
        let same = vec![
            pod(0, "7.0.15", Role::Replica, Some(false), true),
            pod(2, "7.0.15", Role::Primary, None, true),
        ];
        assert_eq!(stranded(&same, "cache-2", &names), None);
        // An older replica that follows (an older primary) is not stranded.
        let linked = vec![
            pod(0, "6.2.14", Role::Replica, Some(true), true),
            pod(2, "7.0.15", Role::Primary, None, true),
        ];
        assert_eq!(stranded(&linked, "cache-2", &names), None);
    }

    fn backup(redis: &str, phase: BackupPhase, source: Option<&str>) -> RedisBackup {
        use crate::api::v1alpha1::{RedisBackupSpec, RedisBackupStatus};
        let spec: RedisBackupSpec =
            serde_json::from_value(serde_json::json!({"redis": redis, "target": {}}))
                .unwrap_or_else(|e| panic!("spec: {e}"));
        let mut b = RedisBackup::new("b1", spec);
        b.status = Some(RedisBackupStatus {
            phase: Some(phase),
            source: source.map(String::from),
            ..Default::default()
        });
        b
    }

    #[test]
    fn a_running_backup_holds_the_restart_of_its_source_only() {
        let running = backup("cache", BackupPhase::Running, Some("cache-1"));
        assert!(reads_from(&running, "cache", "cache-1"));
        assert!(!reads_from(&running, "cache", "cache-2"));
        assert!(!reads_from(&running, "other", "cache-1"));
        let done = backup("cache", BackupPhase::Completed, Some("cache-1"));
        assert!(!reads_from(&done, "cache", "cache-1"));
        // A Cluster backup: each shard's source until that shard is done.
        let mut shards = backup("cache", BackupPhase::Running, None);
        let st = shards.status.as_mut().unwrap_or_else(|| panic!("status"));
        for (i, phase) in [
            (0, Some(BackupPhase::Completed)),
            (1, Some(BackupPhase::Running)),
        ] {
            st.shards.push(crate::api::v1alpha1::BackupShardStatus {
                index: i,
                source: format!("cache-s{i}-1"),
                phase,
                ..Default::default()
            });
        }
        assert!(!reads_from(&shards, "cache", "cache-s0-1"));
        assert!(reads_from(&shards, "cache", "cache-s1-1"));
    }
}
