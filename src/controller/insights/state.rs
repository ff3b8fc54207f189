//! Series about the objects the operator manages, computed at each scrape
//! from the watch caches: how many Redis are in each phase (operator-wide,
//! by phase only), and per Redis (`namespace`, `redis` labels; one series
//! per managed object, gone with it) its phase, instances, whether a
//! primary takes writes, and its last backup. The alert rules read these.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;

use crate::api::v1alpha1::{BackupPhase, Phase, Redis, RedisBackup};
use crate::exporter::render::Exposition;

const PHASES: &[Phase] = &[
    Phase::Pending,
    Phase::Creating,
    Phase::Ready,
    Phase::Recovering,
    Phase::Updating,
    Phase::Degraded,
    Phase::Paused,
    Phase::Hibernated,
];

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Pending => "Pending",
        Phase::Creating => "Creating",
        Phase::Ready => "Ready",
        Phase::Recovering => "Recovering",
        Phase::Updating => "Updating",
        Phase::Degraded => "Degraded",
        Phase::Paused => "Paused",
        Phase::Hibernated => "Hibernated",
    }
}

fn unix(t: &str) -> Option<f64> {
    chrono::DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|t| t.timestamp() as f64)
}

/// Per Redis: when the newest completed backup finished, and when the
/// newest finished one finished and whether it failed.
type LastBackups = (Option<f64>, Option<(f64, bool)>);

/// Adds the series of `redis` and `backups` to `out`.
pub fn series(out: &mut Exposition, redis: &[Arc<Redis>], backups: &[Arc<RedisBackup>]) {
    let mut by_phase: BTreeMap<&str, f64> = PHASES.iter().map(|p| (phase_name(*p), 0.0)).collect();
    for r in redis {
        let ns = r.namespace().unwrap_or_default();
        let name = r.name_any();
        let status = r.status.clone().unwrap_or_default();
        let phase = phase_name(status.phase.unwrap_or(Phase::Pending));
        *by_phase.entry(phase).or_default() += 1.0;
        let at = [("namespace", ns.as_str()), ("redis", name.as_str())];
        out.add(
            "redpilot_redis_phase",
            "gauge",
            "1 for the phase each Redis is in",
            &[at[0], at[1], ("phase", phase)],
            1.0,
        );
        // Tuning advice standing now, by rule and severity (instances with
        // the finding); a rule with none has no series.
        let mut findings: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for i in &status.insights {
            *findings
                .entry((i.rule.as_str(), i.severity.as_str()))
                .or_default() += 1.0;
        }
        for ((rule, severity), n) in findings {
            out.add(
                "redpilot_redis_findings",
                "gauge",
                "Tuning advice standing (status.insights): instances with each finding, by rule and severity",
                &[at[0], at[1], ("rule", rule), ("severity", severity)],
                n,
            );
        }
        out.add(
            "redpilot_redis_desired_instances",
            "gauge",
            "Instances each Redis asks for",
            &at,
            f64::from(r.spec.desired_instances()),
        );
        out.add(
            "redpilot_redis_ready_instances",
            "gauge",
            "Ready instances of each Redis",
            &at,
            f64::from(status.ready_instances),
        );
        // A hibernated or paused Redis is not expected to take writes.
        if !matches!(status.phase, Some(Phase::Hibernated) | Some(Phase::Paused)) {
            let available = status
                .conditions
                .iter()
                .any(|c| c.type_ == "PrimaryAvailable" && c.status == "True");
            out.add(
                "redpilot_redis_primary_available",
                "gauge",
                "1 when a primary of the Redis takes writes (condition PrimaryAvailable)",
                &at,
                if available { 1.0 } else { 0.0 },
            );
            let fenced = status.conditions.iter().any(|c| {
                c.type_ == "PrimaryAvailable"
                    && c.status == "False"
                    && c.reason == crate::controller::layout::FENCED
            });
            out.add(
                "redpilot_redis_primary_fenced",
                "gauge",
                "1 when the primary answers but refuses writes because no replica acknowledges it (condition PrimaryAvailable, reason Fenced)",
                &at,
                if fenced { 1.0 } else { 0.0 },
            );
        }
        // The memory autopilot's bound, with its reason (AtMaximum,
        // ResourceQuota, NodeCapacity, BelowMaximum).
        let at_maximum = status
            .conditions
            .iter()
            .find(|c| c.type_ == crate::controller::layout::MEMORY_AT_MAXIMUM)
            .filter(|_| r.spec.memory_autopilot().is_some());
        if let Some(c) = at_maximum {
            out.add(
                "redpilot_redis_memory_at_maximum",
                "gauge",
                "1 when the memory autopilot of the Redis cannot grow it further (condition MemoryAtMaximum), with the reason",
                &[at[0], at[1], ("reason", c.reason.as_str())],
                if c.status == "True" { 1.0 } else { 0.0 },
            );
        }
        if let Some(a) = status.autopilot.as_ref().and_then(|a| a.shards.as_ref()) {
            out.add(
                "redpilot_redis_shards_at_maximum",
                "gauge",
                "1 while the shard autopilot of a Cluster Redis is at maxShards and the fullest shard is still over scaleUpPercent",
                &at,
                if a.at_maximum { 1.0 } else { 0.0 },
            );
        }
        shard_series(out, r, &status, &at);
    }
    for (phase, n) in &by_phase {
        out.add(
            "redpilot_managed_redis",
            "gauge",
            "Redis managed by this operator, by phase",
            &[("phase", phase)],
            *n,
        );
    }
    // The newest completed backup, and whether the newest finished one failed.
    let mut last: BTreeMap<(String, String), LastBackups> = BTreeMap::new();
    for b in backups {
        let Some(status) = &b.status else { continue };
        let key = (b.namespace().unwrap_or_default(), b.spec.redis.clone());
        let entry = last.entry(key).or_default();
        let finished = status
            .completed_at
            .as_deref()
            .and_then(unix)
            .or_else(|| status.started_at.as_deref().and_then(unix));
        match status.phase {
            Some(BackupPhase::Completed) => {
                if let Some(t) = finished {
                    entry.0 = Some(entry.0.map_or(t, |have: f64| have.max(t)));
                    if entry.1.is_none_or(|(have, _)| t >= have) {
                        entry.1 = Some((t, false));
                    }
                }
            }
            Some(BackupPhase::Failed) => {
                let t = finished.unwrap_or_else(|| {
                    b.creation_timestamp()
                        .map(|t| t.0.as_second() as f64)
                        .unwrap_or(0.0)
                });
                if entry.1.is_none_or(|(have, _)| t >= have) {
                    entry.1 = Some((t, true));
                }
            }
            _ => {}
        }
    }
    for ((ns, redis), (completed, newest)) in &last {
        let at = [("namespace", ns.as_str()), ("redis", redis.as_str())];
        if let Some(t) = completed {
            out.add(
                "redpilot_backup_last_success_timestamp_seconds",
                "gauge",
                "When the newest completed backup of each Redis finished",
                &at,
                *t,
            );
        }
        if let Some((_, failed)) = newest {
            out.add(
                "redpilot_backup_last_failed",
                "gauge",
                "1 when the newest finished backup of each Redis failed",
                &at,
                if *failed { 1.0 } else { 0.0 },
            );
        }
    }
}

/// Per shard of a Cluster Redis (`shard` label, from `status.shards`):
/// ready and desired instances, replicas following the primary, and
/// whether a node serves the shard's slots. Nothing for the other modes.
fn shard_series(
    out: &mut Exposition,
    r: &Redis,
    status: &crate::api::v1alpha1::RedisStatus,
    at: &[(&str, &str); 2],
) {
    if matches!(status.phase, Some(Phase::Hibernated) | Some(Phase::Paused)) {
        return;
    }
    let desired = f64::from(r.spec.desired_instances());
    for shard in &status.shards {
        let index = shard.index.to_string();
        let labels = [at[0], at[1], ("shard", index.as_str())];
        let ready = shard
            .ready
            .split_once('/')
            .and_then(|(n, _)| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        out.add(
            "redpilot_redis_shard_ready_instances",
            "gauge",
            "Ready instances of each shard of a Cluster Redis",
            &labels,
            ready,
        );
        out.add(
            "redpilot_redis_shard_desired_instances",
            "gauge",
            "Instances each shard of a Cluster Redis asks for",
            &labels,
            desired,
        );
        out.add(
            "redpilot_redis_shard_replicas",
            "gauge",
            "Replicas following the primary of each shard of a Cluster Redis",
            &labels,
            shard.replicas.len() as f64,
        );
        out.add(
            "redpilot_redis_shard_primary_available",
            "gauge",
            "1 when a node serves the slots of each shard of a Cluster Redis",
            &labels,
            if shard.primary.is_some() { 1.0 } else { 0.0 },
        );
    }
    if let Some(x) = &status.resharding {
        out.add(
            "redpilot_redis_resharding_slots_remaining",
            "gauge",
            "Slots a Cluster Redis's resharding has still to move (0 once done)",
            at,
            (x.slots_total - x.slots_moved).max(0) as f64,
        );
        out.add(
            "redpilot_redis_resharding_paused",
            "gauge",
            "1 while a Cluster Redis's resharding waits for a bound to clear",
            at,
            if x.phase == crate::api::v1alpha1::ReshardingPhase::Paused {
                1.0
            } else {
                0.0
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{
        BackupTarget, RedisBackupSpec, RedisBackupStatus, RedisSpec, RedisStatus,
    };

    fn backup(redis: &str, phase: BackupPhase, done: &str) -> Arc<RedisBackup> {
        let mut b = RedisBackup::new(
            &format!("{redis}-{done}"),
            RedisBackupSpec {
                redis: redis.into(),
                target: BackupTarget {
                    s3: None,
                    volume: None,
                },
                deletion_policy: Default::default(),
                timeout_seconds: None,
            },
        );
        b.metadata.namespace = Some("ns".into());
        b.status = Some(RedisBackupStatus {
            phase: Some(phase),
            completed_at: Some(done.into()),
            ..Default::default()
        });
        Arc::new(b)
    }

    #[test]
    fn phases_and_the_last_backup_are_exported() {
        let mut r = Redis::new("cache", RedisSpec::default());
        r.metadata.namespace = Some("ns".into());
        r.status = Some(RedisStatus {
            phase: Some(Phase::Ready),
            ready_instances: 1,
            ..Default::default()
        });
        let mut out = Exposition::default();
        series(
            &mut out,
            &[Arc::new(r)],
            &[
                backup("cache", BackupPhase::Completed, "2026-01-01T00:00:00Z"),
                backup("cache", BackupPhase::Failed, "2026-01-02T00:00:00Z"),
                backup("other", BackupPhase::Completed, "2026-01-03T00:00:00Z"),
            ],
        );
        let t = out.text();
        for line in [
            "redpilot_managed_redis{phase=\"Ready\"} 1",
            "redpilot_managed_redis{phase=\"Degraded\"} 0",
            "redpilot_redis_phase{namespace=\"ns\",redis=\"cache\",phase=\"Ready\"} 1",
            "redpilot_redis_ready_instances{namespace=\"ns\",redis=\"cache\"} 1",
            "redpilot_redis_primary_available{namespace=\"ns\",redis=\"cache\"} 0",
            "redpilot_redis_primary_fenced{namespace=\"ns\",redis=\"cache\"} 0",
            "redpilot_backup_last_success_timestamp_seconds{namespace=\"ns\",redis=\"cache\"} 1767225600",
            "redpilot_backup_last_failed{namespace=\"ns\",redis=\"cache\"} 1",
            "redpilot_backup_last_failed{namespace=\"ns\",redis=\"other\"} 0",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
    }

    #[test]
    fn each_shard_of_a_cluster_redis_has_its_series() {
        use crate::api::v1alpha1::{Mode, ShardStatus};
        let mut r = Redis::new(
            "shop",
            RedisSpec {
                mode: Some(Mode::Cluster),
                shards: Some(3),
                instances: Some(2),
                ..Default::default()
            },
        );
        r.metadata.namespace = Some("ns".into());
        let shard =
            |index: i32, primary: Option<&str>, replicas: &[&str], ready: &str| ShardStatus {
                index,
                primary: primary.map(String::from),
                replicas: replicas.iter().map(|s| s.to_string()).collect(),
                slots: None,
                ready: ready.into(),
            };
        r.status = Some(RedisStatus {
            phase: Some(Phase::Degraded),
            shards: vec![
                shard(0, Some("shop-s0-0"), &["shop-s0-1"], "2/2"),
                shard(1, Some("shop-s1-1"), &[], "1/2"),
                shard(2, None, &[], "0/2"),
            ],
            autopilot: Some(crate::api::v1alpha1::AutopilotStatus {
                shards: Some(crate::api::v1alpha1::ShardAutopilotStatus {
                    at_maximum: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            resharding: Some(crate::api::v1alpha1::ReshardingStatus {
                phase: crate::api::v1alpha1::ReshardingPhase::Paused,
                slots_moved: 1000,
                slots_total: 4096,
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut out = Exposition::default();
        series(&mut out, &[Arc::new(r)], &[]);
        let t = out.text();
        for line in [
            "redpilot_redis_shard_ready_instances{namespace=\"ns\",redis=\"shop\",shard=\"0\"} 2",
            "redpilot_redis_shard_ready_instances{namespace=\"ns\",redis=\"shop\",shard=\"1\"} 1",
            "redpilot_redis_resharding_slots_remaining{namespace=\"ns\",redis=\"shop\"} 3096",
            "redpilot_redis_resharding_paused{namespace=\"ns\",redis=\"shop\"} 1",
            "redpilot_redis_shards_at_maximum{namespace=\"ns\",redis=\"shop\"} 1",
            "redpilot_redis_shard_desired_instances{namespace=\"ns\",redis=\"shop\",shard=\"2\"} 2",
            "redpilot_redis_shard_replicas{namespace=\"ns\",redis=\"shop\",shard=\"0\"} 1",
            "redpilot_redis_shard_replicas{namespace=\"ns\",redis=\"shop\",shard=\"1\"} 0",
            "redpilot_redis_shard_primary_available{namespace=\"ns\",redis=\"shop\",shard=\"1\"} 1",
            "redpilot_redis_shard_primary_available{namespace=\"ns\",redis=\"shop\",shard=\"2\"} 0",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
    }
}
