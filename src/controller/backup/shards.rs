//! The backup of a Cluster Redis: one Job per shard, all at once, each on
//! the shard's best replica; the backup completes when every shard did and
//! fails with the first shard that failed, naming it.

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Part, Pass, job};
use crate::api::v1alpha1::{
    BackupOrigin, BackupPhase, BackupShardStatus, Redis, RedisBackupStatus, ReshardingPhase,
    ReshardingStatus,
};
use crate::controller::error::Error;

impl Pass {
    /// A backup of a Cluster Redis: one Job per shard, all at once, each
    /// on the shard's best replica, once every shard serves its slots. The
    /// shards (source, key, slots, Job) are in the status before any Job
    /// exists, so a pass after a crash re-creates the same Jobs.
    pub(super) async fn start_shards(&mut self, redis: &Redis) -> Result<Action, Error> {
        let spec = self.b.spec.clone();
        // Slots moving between shards: each shard's file would be read at
        // its own moment, so a key could be in two files or in none. The
        // backup waits for the resharding (which in turn never starts a
        // move while a backup runs: `Reconciler::backup_running`).
        if let Some(r) = moving(redis) {
            return self
                .pending(format!(
                    "waiting for the resharding of Redis {} to {} shards to finish ({:?}: {} of {} slots moved); a backup taken while slots move could hold a key twice or not at all",
                    spec.redis, r.to_shards, r.phase, r.slots_moved, r.slots_total
                ))
                .await;
        }
        let wanted = redis.spec.desired_shards();
        let serving: Vec<(i32, String)> = redis
            .status
            .as_ref()
            .map(|s| {
                s.shards
                    .iter()
                    .filter(|s| s.primary.is_some())
                    .filter_map(|s| Some((s.index, s.slots.clone()?)))
                    .collect()
            })
            .unwrap_or_default();
        if serving.len() != usize::try_from(wanted).unwrap_or(0) {
            return self
                .pending(format!(
                    "waiting for every shard of Redis {} to serve its slots ({} of {wanted} do)",
                    spec.redis,
                    serving.len()
                ))
                .await;
        }
        let restarting = self.restarting(redis).await?;
        let mut sources = Vec::new();
        for (index, slots) in serving {
            let usable = |n: &str| !restarting.contains(n);
            let candidates = job::shard_source_candidates(redis, index, usable);
            if candidates.is_empty() {
                if let Some(s) = job::choose_shard_source(redis, index) {
                    return self
                        .pending(format!(
                            "waiting for the ordered restart of Redis {} under way: {s}, like every \
                             instance of shard {index} that could serve, is about to restart",
                            spec.redis
                        ))
                        .await;
                }
                return self
                    .pending(format!(
                        "waiting for an instance of shard {index} of Redis {} to be ready",
                        spec.redis
                    ))
                    .await;
            }
            let at = Some((index, slots.as_str()));
            match self.confirm_source(redis, &candidates, at).await? {
                Ok(c) => sources.push((index, slots, c)),
                Err(why) => {
                    return self
                        .pending(format!(
                            "waiting for an instance of shard {index} of Redis {} whose server \
                             confirms it can serve: {why}",
                            spec.redis
                        ))
                        .await;
                }
            }
        }
        let now = chrono::Utc::now();
        let key = self.object_key(now).trim_end_matches(".rdb").to_string();
        let uid = self.uid()?;
        let shards: Vec<BackupShardStatus> = sources
            .iter()
            .map(|(index, slots, c)| BackupShardStatus {
                index: *index,
                slots: slots.clone(),
                source: c.pod.clone(),
                source_offset: c.offset,
                key: job::shard_key(&key, *index),
                job: job::job_name(&self.name, &uid, &format!("backup-s{index}")),
                phase: Some(BackupPhase::Running),
                ..Default::default()
            })
            .collect();
        let st = RedisBackupStatus {
            phase: Some(BackupPhase::Running),
            started_at: Some(crate::controller::base::rfc3339(now)),
            location: Some(self.target()?.location(&key)),
            key: Some(key.clone()),
            shards: shards.clone(),
            origin: Some(BackupOrigin::of(&redis.spec)),
            ..Default::default()
        };
        self.write_status(&st).await?;
        for (s, (_, _, c)) in shards.iter().zip(&sources) {
            let shard = Some((s.index, s.slots.as_str()));
            let from = (s.source.as_str(), c.host.as_str(), s.source_offset);
            if let Some(refused) = self.apply_job(&s.job, from, &s.key, shard).await? {
                return self.fail("JobRejected", refused).await;
            }
            // A test stops the operator here: one shard's Job exists, the
            // others only in the status.
            crate::failpoint::hit("backup-after-first-shard-job");
        }
        let from: Vec<String> = shards
            .iter()
            .map(|s| format!("shard {} ({}) from {}", s.index, s.slots, s.source))
            .collect();
        let note = format!(
            "backing up the {} shards of Redis {} to {}: {}",
            shards.len(),
            spec.redis,
            st.location.clone().unwrap_or_default(),
            from.join("; ")
        );
        self.event(EventType::Normal, "BackupStarted", note).await;
        Ok(Action::await_change())
    }

    /// Follows every shard's Job: a shard done is recorded at once; the
    /// backup completes when every shard did, and fails with the first
    /// shard that failed (naming it).
    pub(super) async fn follow_shards(&mut self, st: RedisBackupStatus) -> Result<Action, Error> {
        let mut shards = st.shards.clone();
        let mut waiting_for_a_pod = false;
        let mut failed = None;
        let mut manifests = Vec::new();
        for s in shards
            .iter_mut()
            .filter(|s| s.phase != Some(BackupPhase::Completed))
        {
            let at = Some((s.index, s.slots.as_str()));
            match self
                .follow_part(&s.job, Some(&s.source), s.source_offset, Some(&s.key), at)
                .await?
            {
                Part::Running { started } => waiting_for_a_pod |= !started,
                Part::Done(m) => {
                    s.phase = Some(BackupPhase::Completed);
                    s.size_bytes = i64::try_from(m.size_bytes).ok();
                    s.keys = m.keys.and_then(|k| i64::try_from(k).ok());
                    s.sha256 = Some(m.sha256.clone());
                    manifests.push(*m);
                }
                Part::Failed(reason, msg) => {
                    s.phase = Some(BackupPhase::Failed);
                    failed = Some((reason, format!("shard {}: {msg}", s.index)));
                    break;
                }
            }
        }
        let updated = RedisBackupStatus {
            shards: shards.clone(),
            ..st.clone()
        };
        if let Some((reason, msg)) = failed {
            self.write_status(&updated).await?;
            return self.fail(reason, msg).await;
        }
        if shards
            .iter()
            .all(|s| s.phase == Some(BackupPhase::Completed))
        {
            return self.complete_shards(updated, manifests).await;
        }
        if updated != st {
            self.write_status(&updated).await?;
        }
        if waiting_for_a_pod {
            Ok(Action::requeue(Duration::from_secs(10)))
        } else {
            Ok(Action::await_change())
        }
    }

    /// Every shard stored: the sums, and the engine and version of the
    /// last manifest read (every shard runs the same server).
    async fn complete_shards(
        &mut self,
        st: RedisBackupStatus,
        manifests: Vec<crate::backup::Manifest>,
    ) -> Result<Action, Error> {
        // A resharding that moved slots after this backup started (one
        // asked for in the moment between the backup's check and its
        // status): the files are no consistent cut.
        if let Some(why) = self
            .redis()
            .as_ref()
            .and_then(|r| moved_since(r, st.started_at.as_deref()))
        {
            return self.fail("SlotsMovedDuringBackup", why).await;
        }
        let size: i64 = st.shards.iter().filter_map(|s| s.size_bytes).sum();
        let keys: Option<i64> = st.shards.iter().map(|s| s.keys).sum();
        let last = manifests.last();
        let done = RedisBackupStatus {
            phase: Some(BackupPhase::Completed),
            completed_at: Some(crate::controller::base::rfc3339(chrono::Utc::now())),
            size_bytes: Some(size),
            keys,
            engine: last.map(|m| m.engine.clone()).or(st.engine.clone()),
            engine_version: last
                .and_then(|m| m.engine_version.clone())
                .or(st.engine_version.clone()),
            rdb_version: last.map(|m| i64::from(m.rdb_version)).or(st.rdb_version),
            reason: None,
            message: None,
            ..st
        };
        let note = format!(
            "stored {size} bytes ({} keys) in {} shard files at {}",
            keys.map(|k| k.to_string()).unwrap_or_else(|| "?".into()),
            done.shards.len(),
            done.location.clone().unwrap_or_default()
        );
        self.completed(&done, note).await
    }
}

/// The resharding of `redis` while one is under way (Moving or Paused).
fn moving(redis: &Redis) -> Option<&ReshardingStatus> {
    redis
        .status
        .as_ref()
        .and_then(|s| s.resharding.as_ref())
        .filter(|r| r.phase != ReshardingPhase::Done)
}

/// Why a backup started at `started` (RFC 3339) is no consistent cut of
/// `redis`: a resharding started after it and has moved slots.
fn moved_since(redis: &Redis, started: Option<&str>) -> Option<String> {
    let r = redis.status.as_ref()?.resharding.as_ref()?;
    let started: chrono::DateTime<chrono::Utc> = started?.parse().ok()?;
    let reshard: chrono::DateTime<chrono::Utc> = r.started_at.parse().ok()?;
    (reshard >= started && r.slots_moved > 0).then(|| {
        format!(
            "slots moved while the shards were read (a resharding to {} shards started at {}, {} slots moved): the shard files are no consistent cut; take the backup again once it is Done",
            r.to_shards, r.started_at, r.slots_moved
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::RedisStatus;

    fn resharding(phase: ReshardingPhase, started_at: &str, moved: i64) -> Redis {
        let mut r = Redis::new("c", Default::default());
        r.status = Some(RedisStatus {
            resharding: Some(ReshardingStatus {
                phase,
                started_at: started_at.into(),
                slots_moved: moved,
                to_shards: 4,
                ..Default::default()
            }),
            ..Default::default()
        });
        r
    }

    #[test]
    fn a_backup_waits_for_moving_slots_and_fails_if_they_moved_under_it() {
        let t = "2026-12-05T10:00:00Z";
        assert!(moving(&resharding(ReshardingPhase::Moving, t, 10)).is_some());
        assert!(moving(&resharding(ReshardingPhase::Paused, t, 0)).is_some());
        assert!(moving(&resharding(ReshardingPhase::Done, t, 4096)).is_none());
        assert!(moving(&Redis::new("c", Default::default())).is_none());
        // Started before the backup: the backup waited for it to be Done.
        let before = resharding(ReshardingPhase::Done, t, 4096);
        assert_eq!(moved_since(&before, Some("2026-12-05T10:05:00Z")), None);
        // Started after, slots moved: not a cut.
        let after = resharding(ReshardingPhase::Moving, "2026-12-05T10:05:01Z", 3);
        let why = moved_since(&after, Some("2026-12-05T10:05:00Z")).expect("refused");
        assert!(why.contains("3 slots moved"), "{why}");
        // Started after but held back (nothing moved yet): the cut holds.
        let held = resharding(ReshardingPhase::Paused, "2026-12-05T10:05:01Z", 0);
        assert_eq!(moved_since(&held, Some("2026-12-05T10:05:00Z")), None);
    }
}
