//! `kubectl redpilot`: what the plugin shows and asks, kept apart from its
//! command line (`src/bin/kubectl-redpilot.rs`) so the screens are tested
//! as plain text.
//!
//! - [`status`] renders one screen of a Redis: topology, roles, offsets and
//!   lag, memory and the autopilot, the last failover and backup,
//!   conditions, recent events.
//! - [`switchover_target`] picks the replica a switchover goes to when the
//!   user names none.
//! - [`backup_target`] finds where a backup of a Redis goes: its schedule's
//!   target, or its newest backup's.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use crate::api::v1alpha1::{
    BackupPhase, BackupTarget, Redis, RedisBackup, RedisBackupSchedule, ReshardingPhase,
};

/// The tuning advice of a Redis (`status.insights`): one block per
/// finding, most severe first, with the `kubectl patch` that applies it
/// when a `spec.config` change does.
pub fn advise(redis: &Redis, now: DateTime<Utc>) -> String {
    use kube::ResourceExt;
    let name = redis.name_any();
    let ns = redis.namespace().unwrap_or_default();
    let status = redis.status.clone().unwrap_or_default();
    let tuned = status.conditions.iter().find(|c| c.type_ == "Tuned");
    let mut out = String::new();
    let Some(tuned) = tuned else {
        let _ = writeln!(
            out,
            "{ns}/{name}: not looked at for tuning yet (the operator looks at a Ready Redis \
             every --tuning-interval-seconds; 0 turns it off)"
        );
        return out;
    };
    let _ = writeln!(
        out,
        "{ns}/{name}: {} finding(s); Tuned={} ({})",
        status.insights.len(),
        tuned.status,
        tuned.reason
    );
    for i in &status.insights {
        let since = time_of(&i.since).map(|t| age(t, now)).unwrap_or_default();
        let _ = writeln!(
            out,
            "\n{:<8} {} on {} (for {since})",
            i.severity.to_uppercase(),
            i.rule,
            i.instance
        );
        let _ = writeln!(out, "  seen:   {}", i.evidence);
        let _ = writeln!(out, "  advice: {}", i.advice);
        if let (Some(k), Some(v)) = (&i.config_key, &i.config_value) {
            let patch = serde_json::json!({"spec": {"config": {k: v}}});
            let _ = writeln!(
                out,
                "  apply:  kubectl patch redis {name} -n {ns} --type merge -p '{patch}'"
            );
        }
    }
    let applied = status
        .tuning
        .as_ref()
        .map(|t| t.applied.as_slice())
        .unwrap_or_default();
    if !applied.is_empty() {
        let _ = writeln!(out, "\napplied by the operator (spec.tuning):");
        for a in applied {
            let at = time_of(&a.at).map(|t| age(t, now)).unwrap_or_default();
            let _ = writeln!(
                out,
                "  {} {} -> {} ({} ago, {}): {}{}",
                a.key,
                a.from,
                a.to,
                at,
                a.state,
                a.before,
                a.message
                    .as_deref()
                    .map(|m| format!("; {m}"))
                    .unwrap_or_default()
            );
        }
    }
    out
}

/// One event, as the screen shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventLine {
    /// When it last happened.
    pub time: Option<DateTime<Utc>>,
    /// `Normal` or `Warning`.
    pub type_: String,
    /// The reason.
    pub reason: String,
    /// The message.
    pub note: String,
}

/// `3m`, `2h`, `4d` since `t`.
pub fn age(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let s = (now - t).num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// A Kubernetes time (whole seconds, as the API server keeps them).
fn time_of(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), 0)
}

fn parse_time(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The newest backup of `redis` among `backups` (by completion, else start,
/// else creation).
pub fn newest_backup<'a>(redis: &str, backups: &'a [RedisBackup]) -> Option<&'a RedisBackup> {
    let when = |b: &RedisBackup| {
        let s = b.status.as_ref();
        s.and_then(|s| s.completed_at.as_deref().or(s.started_at.as_deref()))
            .and_then(parse_time)
            .or_else(|| b.metadata.creation_timestamp.as_ref().and_then(time_of))
    };
    backups
        .iter()
        .filter(|b| b.spec.redis == redis)
        .max_by_key(|b| when(b))
}

/// Where a new backup of `redis` goes: the target of a schedule of it, or
/// of its newest backup.
pub fn backup_target(
    redis: &str,
    schedules: &[RedisBackupSchedule],
    backups: &[RedisBackup],
) -> Option<BackupTarget> {
    schedules
        .iter()
        .find(|s| s.spec.redis == redis)
        .map(|s| s.spec.target.clone())
        .or_else(|| newest_backup(redis, backups).map(|b| b.spec.target.clone()))
}

/// The replica a switchover goes to when none is named: a ready replica
/// with a live link, the least behind (lowest ordinal on a tie).
pub fn switchover_target(redis: &Redis) -> Option<String> {
    let status = redis.status.as_ref()?;
    status
        .instances
        .iter()
        .filter(|i| i.role == "replica" && i.ready && i.link_up == Some(true))
        .min_by_key(|i| i.lag_bytes.unwrap_or(i64::MAX))
        .map(|i| i.name.clone())
}

/// One screen about `redis`.
pub fn status(
    redis: &Redis,
    backups: &[RedisBackup],
    events: &[EventLine],
    now: DateTime<Utc>,
) -> String {
    let mut out = String::new();
    let ns = redis.metadata.namespace.as_deref().unwrap_or("");
    let name = redis.metadata.name.as_deref().unwrap_or("");
    let spec = &redis.spec;
    let st = redis.status.clone().unwrap_or_default();
    let phase = st.phase.map_or("Unknown".to_string(), |p| format!("{p:?}"));
    let _ = writeln!(
        out,
        "Redis {ns}/{name}: {:?} {} ({}), {:?}, {phase}, {} ready, primary {}",
        spec.engine(),
        spec.version(),
        st.current_version.as_deref().unwrap_or("not running"),
        spec.mode(),
        st.ready.as_deref().unwrap_or("0/?"),
        st.primary.as_deref().unwrap_or("none"),
    );
    let services: Vec<String> = [
        (st.write_service.as_deref(), "read-write"),
        (st.read_service.as_deref(), "read-only"),
    ]
    .into_iter()
    .filter_map(|(name, kind)| Some(format!("{} ({kind})", name?)))
    .collect();
    if !services.is_empty() {
        let _ = writeln!(
            out,
            "Services: {}; password in Secret {}",
            services.join(", "),
            st.auth_secret.as_deref().unwrap_or("?")
        );
    }
    // A source followed, or the last promotion off one.
    if let Some(f) = &st.replica_of {
        let lag = match (f.lag_bytes, f.lag_seconds) {
            (Some(b), Some(s)) => format!(", {b} bytes behind, heard from {s}s ago"),
            (Some(b), None) => format!(", {b} bytes behind"),
            _ => String::new(),
        };
        let syncs = f.source_full_syncs.map_or(String::new(), |n| {
            format!(", {n} full syncs served by the source")
        });
        let _ = writeln!(
            out,
            "Follows {} (read-only): link {}{lag}{syncs}",
            f.source, f.link
        );
        if let Some(m) = &f.message {
            let _ = writeln!(out, "  {m}");
        }
    } else if let Some(p) = &st.promotion {
        let when = parse_time(&p.time).map_or(String::new(), |t| format!(" {} ago", age(t, now)));
        let _ = writeln!(
            out,
            "Promoted off {}{when} ({}): {}",
            p.source,
            if p.planned { "planned" } else { "unplanned" },
            p.message
        );
    }
    if let Some(t) = &st.demoted {
        let _ = writeln!(
            out,
            "Demoted at {t}: read-only until spec.replicaOf points at the Redis that took \
             over, or annotation redpilot.io/take-writes={t}"
        );
    }
    // The continuous archive: the window a restore can reach.
    if let Some(a) = &st.archive {
        let window = match (&a.earliest, &a.newest) {
            (Some(e), Some(n)) => format!("restorable from {e} to {n}"),
            _ => "nothing restorable yet".to_string(),
        };
        let lag = a
            .lag_seconds
            .map_or(String::new(), |l| format!(", {l:.1} s behind"));
        let by = a
            .archiver
            .as_deref()
            .map_or(String::new(), |p| format!(" by {p}"));
        let _ = writeln!(out, "Archive {}{by}: {window}{lag}", a.location);
        for h in &a.holes {
            let _ = writeln!(out, "  not restorable exactly: {h}");
        }
        if let Some(m) = &a.message {
            let _ = writeln!(out, "  {m}");
        }
        let _ = writeln!(
            out,
            "  restore with bootstrap.fromBackup: {{key: {}, pointInTime: <RFC 3339>}} and this bucket",
            a.key
        );
    }
    // Memory and the autopilot.
    let memory = st.memory.as_ref().map_or("unknown".to_string(), |m| {
        format!("{} on {}", m.summary, m.instance)
    });
    let _ = write!(out, "Memory: {memory}");
    match st.autopilot.as_ref().and_then(|a| a.memory.as_ref()) {
        Some(a) => {
            let _ = write!(
                out,
                "; autopilot limit {} ({})",
                a.limit,
                a.method.as_deref().unwrap_or("InPlace")
            );
            if let Some(d) = &a.last_decision {
                let when =
                    parse_time(&d.time).map_or(String::new(), |t| format!(" {} ago", age(t, now)));
                let _ = write!(
                    out,
                    ", last {} {} → {}{when}: {}",
                    d.action, d.from, d.to, d.reason
                );
            }
            let _ = writeln!(out);
        }
        None if spec.memory_autopilot().is_some() => {
            let _ = writeln!(out, "; autopilot on, no decision yet");
        }
        None => {
            let _ = writeln!(out, "; autopilot off");
        }
    }
    // Cluster mode: the cluster and one line per shard.
    if let Some(c) = &st.cluster {
        let _ = writeln!(
            out,
            "Cluster: state {}, {}/16384 slots ok, {} nodes known",
            c.state, c.slots_ok, c.known_nodes
        );
    }
    if let Some(x) = &st.resharding {
        let when = |t: &Option<String>| {
            t.as_deref().and_then(parse_time).map(|t| {
                if t > now {
                    format!("in {}", age(now, t))
                } else {
                    format!("{} ago", age(t, now))
                }
            })
        };
        let mut line = format!(
            "Resharding: {} → {} shards, {:?} ({} path): {}/{} slots, {} keys moved",
            x.from_shards, x.to_shards, x.phase, x.path, x.slots_moved, x.slots_total, x.keys_moved
        );
        if let Some(c) = &x.current {
            let _ = write!(
                line,
                "; moving {} from shard {} to {}",
                c.slots, c.from_shard, c.to_shard
            );
        }
        match (x.phase, when(&x.finished_at), when(&x.estimated_end)) {
            (ReshardingPhase::Done, Some(t), _) => {
                let _ = write!(line, "; finished {t}");
            }
            (ReshardingPhase::Moving, _, Some(t)) => {
                let _ = write!(line, "; ends {t} at this rate");
            }
            _ => {}
        }
        if x.phase == ReshardingPhase::Paused
            && let Some(m) = &x.message
        {
            let _ = write!(line, "; paused: {m}");
        }
        let _ = writeln!(out, "{line}");
    }
    if !st.shards.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<6} {:<24} {:<32} {:<18} {:<6}",
            "SHARD", "PRIMARY", "REPLICAS", "SLOTS", "READY"
        );
        for s in &st.shards {
            let replicas = if s.replicas.is_empty() {
                "-".to_string()
            } else {
                s.replicas.join(",")
            };
            let _ = writeln!(
                out,
                "{:<6} {:<24} {:<32} {:<18} {:<6}",
                s.index,
                s.primary.as_deref().unwrap_or("none"),
                replicas,
                s.slots.as_deref().unwrap_or("-"),
                s.ready
            );
        }
    }
    // Topology.
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<24} {:<8} {:<6} {:>14} {:>10} {:<5}",
        "INSTANCE", "ROLE", "READY", "OFFSET", "LAG", "LINK"
    );
    for i in &st.instances {
        let dash = || "-".to_string();
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:<6} {:>14} {:>10} {:<5}",
            i.name,
            i.role,
            if i.ready { "yes" } else { "no" },
            i.offset.map_or_else(dash, |o| o.to_string()),
            i.lag_bytes.map_or_else(dash, |l| format!("{l}B")),
            i.link_up
                .map_or_else(dash, |u| if u { "up" } else { "down" }.to_string()),
        );
    }
    if st.instances.is_empty() {
        let _ = writeln!(out, "(no instance observed yet)");
    }
    let _ = writeln!(out);
    if let Some(f) = &st.last_failover {
        let when = parse_time(&f.time).map_or(f.time.clone(), |t| format!("{} ago", age(t, now)));
        let _ = writeln!(
            out,
            "Last failover: {} → {} ({}) {when}",
            f.from, f.to, f.reason
        );
    }
    if let Some(u) = &st.upgrade {
        let _ = writeln!(
            out,
            "Upgrade: {:?} {} → {:?} {}: {:?} ({}/{})",
            u.from.engine, u.from.version, u.to.engine, u.to.version, u.phase, u.done, u.total
        );
    }
    match newest_backup(name, backups) {
        Some(b) => {
            let bs = b.status.clone().unwrap_or_default();
            let phase = bs.phase.map_or("Pending".to_string(), |p| format!("{p:?}"));
            let when = bs
                .completed_at
                .as_deref()
                .or(bs.started_at.as_deref())
                .and_then(parse_time)
                .map_or(String::new(), |t| format!(", {} ago", age(t, now)));
            let size = match (bs.phase, bs.size_bytes, bs.keys) {
                (Some(BackupPhase::Completed), Some(s), Some(k)) => {
                    format!(", {s} bytes, {k} keys")
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "Last backup: {} {phase}{when}{size}",
                b.metadata.name.as_deref().unwrap_or("?")
            );
        }
        None => {
            let _ = writeln!(out, "Last backup: none");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Conditions:");
    for c in &st.conditions {
        let _ = writeln!(
            out,
            "  {}={} {}: {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Recent events:");
    if events.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for e in events {
        let when = e.time.map_or("?".to_string(), |t| age(t, now));
        let _ = writeln!(out, "  {when:>4} {:<7} {}: {}", e.type_, e.reason, e.note);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{
        AutopilotStatus, InstanceStatus, MemoryAutopilotStatus, MemoryDecision, MemoryStatus,
        Phase, RedisSpec, RedisStatus,
    };

    fn redis() -> Redis {
        let mut r = Redis::new("cache", RedisSpec::default());
        r.metadata.namespace = Some("shop".into());
        r.status = Some(RedisStatus {
            phase: Some(Phase::Ready),
            ready: Some("2/2".into()),
            primary: Some("cache-0".into()),
            current_version: Some("7.0.15".into()),
            instances: vec![
                InstanceStatus {
                    name: "cache-0".into(),
                    role: "primary".into(),
                    ready: true,
                    offset: Some(1200),
                    ..Default::default()
                },
                InstanceStatus {
                    name: "cache-1".into(),
                    role: "replica".into(),
                    ready: true,
                    offset: Some(1100),
                    lag_bytes: Some(100),
                    link_up: Some(true),
                },
                InstanceStatus {
                    name: "cache-2".into(),
                    role: "replica".into(),
                    ready: true,
                    offset: Some(1200),
                    lag_bytes: Some(0),
                    link_up: Some(true),
                },
            ],
            memory: Some(MemoryStatus {
                instance: "cache-0".into(),
                used_bytes: 12 << 20,
                max_bytes: Some(48 << 20),
                percent: Some(25),
                summary: "12Mi/48Mi (25%)".into(),
            }),
            autopilot: Some(AutopilotStatus {
                memory: Some(MemoryAutopilotStatus {
                    limit: "96Mi".into(),
                    limit_bytes: 96 << 20,
                    base: "64Mi".into(),
                    last_decision: Some(MemoryDecision {
                        time: "2026-01-01T00:00:00Z".into(),
                        action: "Grow".into(),
                        from: "64Mi".into(),
                        to: "96Mi".into(),
                        reason: "used 39Mi is 82% of maxmemory 48Mi".into(),
                    }),
                    ..Default::default()
                }),
                shards: None,
            }),
            ..Default::default()
        });
        r
    }

    #[test]
    fn advice_shows_evidence_and_the_patch_to_apply() {
        use crate::api::v1alpha1::Insight;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let now = parse_time("2026-01-01T01:00:00Z").unwrap();
        let mut r = redis();
        assert!(advise(&r, now).contains("not looked at for tuning yet"));
        let t = |s: &str| Time(s.parse().expect("time"));
        let st = r.status.as_mut().expect("status");
        st.conditions.push(Condition {
            type_: "Tuned".into(),
            status: "False".into(),
            reason: "AdviceStands".into(),
            message: String::new(),
            last_transition_time: t("2026-01-01T00:40:00Z"),
            observed_generation: None,
        });
        st.insights = vec![Insight {
            rule: "fragmentation".into(),
            severity: "warning".into(),
            instance: "cache-1".into(),
            evidence: "fragmentation 2.40: 2.9 GiB resident for 1.2 GiB used".into(),
            advice: "turn active defragmentation on".into(),
            config_key: Some("activedefrag".into()),
            config_value: Some("yes".into()),
            since: t("2026-01-01T00:40:00Z"),
            observed: t("2026-01-01T00:50:00Z"),
        }];
        let text = advise(&r, now);
        assert_eq!(
            text,
            "shop/cache: 1 finding(s); Tuned=False (AdviceStands)\n\
             \nWARNING  fragmentation on cache-1 (for 20m)\n\
             \x20 seen:   fragmentation 2.40: 2.9 GiB resident for 1.2 GiB used\n\
             \x20 advice: turn active defragmentation on\n\
             \x20 apply:  kubectl patch redis cache -n shop --type merge -p \
             '{\"spec\":{\"config\":{\"activedefrag\":\"yes\"}}}'\n"
        );
    }

    #[test]
    fn the_screen_says_what_is_followed_and_how_a_promotion_went() {
        use crate::api::v1alpha1::{PromotionStatus, ReplicaOfStatus};
        let now = parse_time("2026-01-01T00:05:00Z").unwrap();
        let mut r = redis();
        let st = r.status.as_mut().expect("status");
        st.replica_of = Some(ReplicaOfStatus {
            source: "10.0.0.9:6379".into(),
            link: "Up".into(),
            lag_bytes: Some(120),
            lag_seconds: Some(0),
            source_full_syncs: Some(1),
            ..Default::default()
        });
        let text = status(&r, &[], &[], now);
        assert!(
            text.contains(
                "Follows 10.0.0.9:6379 (read-only): link Up, 120 bytes behind, heard from 0s \
                 ago, 1 full syncs served by the source\n"
            ),
            "{text}"
        );
        let st = r.status.as_mut().expect("status");
        st.replica_of = None;
        st.promotion = Some(PromotionStatus {
            time: "2026-01-01T00:03:00Z".into(),
            source: "10.0.0.9:6379".into(),
            planned: true,
            offset: Some(9000),
            message: "planned: nothing lost".into(),
            ..Default::default()
        });
        let text = status(&r, &[], &[], now);
        assert!(
            text.contains("Promoted off 10.0.0.9:6379 2m ago (planned): planned: nothing lost\n"),
            "{text}"
        );
    }

    #[test]
    fn the_screen_shows_the_restorable_window() {
        use crate::api::v1alpha1::ArchiveStatus;
        let now = parse_time("2026-01-01T00:05:00Z").unwrap();
        let mut r = redis();
        let st = r.status.as_mut().expect("status");
        st.archive = Some(ArchiveStatus {
            location: "s3://b/p/ns/cache/archive".into(),
            key: "p/ns/cache/archive".into(),
            archiver: Some("cache-1".into()),
            earliest: Some("2026-01-01T00:00:00.100Z".into()),
            newest: Some("2026-01-01T00:04:59.900Z".into()),
            lag_seconds: Some(0.4),
            holes: vec!["2026-01-01T00:01:00.000Z/2026-01-01T00:01:05.000Z".into()],
            ..Default::default()
        });
        let text = status(&r, &[], &[], now);
        assert!(
            text.contains(
                "Archive s3://b/p/ns/cache/archive by cache-1: restorable from \
                 2026-01-01T00:00:00.100Z to 2026-01-01T00:04:59.900Z, 0.4 s behind\n  not \
                 restorable exactly: 2026-01-01T00:01:00.000Z/2026-01-01T00:01:05.000Z\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_screen_shows_topology_memory_and_events() {
        let now = parse_time("2026-01-01T00:05:00Z").unwrap();
        let events = vec![EventLine {
            time: parse_time("2026-01-01T00:04:00Z"),
            type_: "Normal".into(),
            reason: "MemoryGrow".into(),
            note: "memory limit 64Mi → 96Mi".into(),
        }];
        let text = status(&redis(), &[], &events, now);
        assert!(text.contains("Redis shop/cache: Redis 7.0 (7.0.15), Standalone, Ready, 2/2 ready, primary cache-0"), "{text}");
        assert!(text.contains("Memory: 12Mi/48Mi (25%) on cache-0; autopilot limit 96Mi (InPlace), last Grow 64Mi → 96Mi 5m ago"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("cache-1")
                && l.contains("replica")
                && l.contains("100B")
                && l.contains("up")),
            "{text}"
        );
        assert!(text.contains("Last backup: none"), "{text}");
        assert!(
            text.contains("  1m Normal  MemoryGrow: memory limit 64Mi → 96Mi"),
            "{text}"
        );
    }

    #[test]
    fn a_switchover_goes_to_the_least_behind_linked_replica() {
        assert_eq!(switchover_target(&redis()).as_deref(), Some("cache-2"));
        let mut r = redis();
        if let Some(s) = r.status.as_mut() {
            s.instances[2].link_up = Some(false);
        }
        assert_eq!(switchover_target(&r).as_deref(), Some("cache-1"));
    }

    #[test]
    fn a_cluster_shows_one_line_per_shard() {
        use crate::api::v1alpha1::{ClusterStatus, Mode, ShardStatus};
        let mut r = redis();
        r.spec.mode = Some(Mode::Cluster);
        r.spec.shards = Some(3);
        if let Some(st) = r.status.as_mut() {
            st.cluster = Some(ClusterStatus {
                state: "ok".into(),
                slots_assigned: 16384,
                slots_ok: 16384,
                known_nodes: 6,
            });
            st.shards = (0..3)
                .map(|i| ShardStatus {
                    index: i,
                    primary: Some(format!("cache-s{i}-0")),
                    replicas: vec![format!("cache-s{i}-1")],
                    slots: Some(["0-5461", "5462-10922", "10923-16383"][i as usize].into()),
                    ready: "2/2".into(),
                })
                .collect();
        }
        let now = Utc::now();
        if let Some(st) = r.status.as_mut() {
            st.resharding = Some(crate::api::v1alpha1::ReshardingStatus {
                phase: ReshardingPhase::Paused,
                path: "Classic".into(),
                from_shards: 3,
                to_shards: 4,
                slots_moved: 1024,
                slots_total: 4096,
                keys_moved: 812,
                message: Some("shard(s) 3 have no primary".into()),
                ..Default::default()
            });
        }
        let screen = status(&r, &[], &[], now);
        assert!(
            screen.contains("Cluster: state ok, 16384/16384 slots ok, 6 nodes known"),
            "{screen}"
        );
        assert!(
            screen.contains(
                "Resharding: 3 → 4 shards, Paused (Classic path): 1024/4096 slots, 812 keys moved; \
                 paused: shard(s) 3 have no primary"
            ),
            "{screen}"
        );
        let line = screen
            .lines()
            .find(|l| l.starts_with("1 "))
            .unwrap_or_else(|| panic!("no line for shard 1:\n{screen}"));
        for part in ["cache-s1-0", "cache-s1-1", "5462-10922", "2/2"] {
            assert!(line.contains(part), "{line}");
        }
    }

    #[test]
    fn ages_read_for_people() {
        let t = parse_time("2026-01-01T00:00:00Z").unwrap();
        assert_eq!(age(t, t + chrono::Duration::seconds(42)), "42s");
        assert_eq!(age(t, t + chrono::Duration::hours(3)), "3h");
        assert_eq!(age(t, t + chrono::Duration::days(2)), "2d");
    }
}
