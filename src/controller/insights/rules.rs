//! The alert rules: per Redis (selected by `namespace` and `redis`, with
//! the bounds of `spec.monitoring.alerts`) and for the operator. The same
//! text is written, fleet-wide, to `config/prometheus/rules.yaml`
//! (`redpilot rules`), which `promtool test rules` checks alert by alert.

use serde_json::{Value, json};

use crate::api::v1alpha1::AlertBounds;

/// Which Redis a rule group is about.
pub enum Scope<'a> {
    /// One Redis: its namespace and name.
    One { namespace: &'a str, redis: &'a str },
    /// Every Redis a Prometheus scrapes (the shipped rules file).
    Fleet,
}

impl Scope<'_> {
    fn selector(&self) -> String {
        match self {
            Scope::One { namespace, redis } => {
                format!("namespace=\"{namespace}\",redis=\"{redis}\"")
            }
            Scope::Fleet => "redis!=\"\"".to_string(),
        }
    }
}

fn alert(
    name: &str,
    expr: String,
    for_: &str,
    severity: &str,
    summary: &str,
    description: &str,
) -> Value {
    json!({
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    })
}

/// The rule group of the Redis in `scope`.
pub fn redis_group(scope: &Scope<'_>, bounds: &AlertBounds) -> Value {
    let s = scope.selector();
    let name = match scope {
        Scope::One { namespace, redis } => format!("redpilot.redis.{namespace}.{redis}"),
        Scope::Fleet => "redpilot.redis".to_string(),
    };
    let pct = bounds.memory_percent;
    let lag = bounds.replication_lag_bytes;
    let backup_secs = i64::from(bounds.backup_max_age_hours) * 3600;
    json!({
        "name": name,
        "rules": [
            alert(
                "RedisDown",
                format!("redis_up{{{s}}} == 0 or up{{{s}}} == 0"),
                "1m",
                "critical",
                "Redis instance {{ $labels.namespace }}/{{ $labels.pod }} is down",
                "The server in pod {{ $labels.pod }} of Redis {{ $labels.redis }} has not answered its metrics sidecar (or the sidecar has not answered Prometheus) for a minute.",
            ),
            alert(
                "RedisNoWritablePrimary",
                format!("redpilot_redis_primary_available{{{s}}} == 0"),
                "1m",
                "critical",
                "Redis {{ $labels.namespace }}/{{ $labels.redis }} has no primary that takes writes",
                "The operator has seen no writable primary for a minute (condition PrimaryAvailable is False): writes fail. See `kubectl describe redis {{ $labels.redis }} -n {{ $labels.namespace }}`.",
            ),
            alert(
                "RedisPrimaryFenced",
                format!("redpilot_redis_primary_fenced{{{s}}} == 1"),
                "30s",
                "critical",
                "Redis {{ $labels.namespace }}/{{ $labels.redis }} refuses writes: no replica acknowledges its primary",
                "The primary answers but refuses every write with NOREPLICAS (min-replicas-to-write), because no replica acknowledged it within spec.failover.maxLagSeconds: its replicas are down, restarting or cut off. With 2 instances this happens whenever the one replica restarts; run 3 to keep writes during restarts, or set spec.failover.fence: false to trade split-brain safety for availability.",
            ),
            alert(
                "RedisReplicationLinkDown",
                format!("redis_master_link_up{{{s}}} == 0"),
                "1m",
                "warning",
                "Replica {{ $labels.namespace }}/{{ $labels.pod }} has lost its primary",
                "The replication link of {{ $labels.pod }} to {{ $labels.master_host }} has been down for a minute: the replica serves stale reads and cannot take over without loss.",
            ),
            alert(
                "RedisReplicationLagging",
                format!("(redis_master_repl_offset{{{s}}} - on(namespace, pod) group_right() redis_connected_slave_offset_bytes{{{s}}}) > {lag}"),
                "2m",
                "warning",
                "A replica of Redis {{ $labels.namespace }}/{{ $labels.redis }} is behind",
                "The replica at {{ $labels.slave_ip }} is {{ $value | humanize1024 }}B behind its primary {{ $labels.pod }} (bound: spec.monitoring.alerts.replicationLagBytes).",
            ),
            alert(
                "RedisMemoryNearLimit",
                format!("100 * redis_memory_used_bytes{{{s}}} / (redis_memory_max_bytes{{{s}}} > 0) > {pct}"),
                "1m",
                "warning",
                "Redis instance {{ $labels.namespace }}/{{ $labels.pod }} is near maxmemory",
                "{{ $labels.pod }} uses {{ $value | printf \"%.0f\" }}% of maxmemory (bound: spec.monitoring.alerts.memoryPercent): it will evict keys or refuse writes soon.",
            ),
            alert(
                "RedisEvictingKeys",
                format!("increase(redis_evicted_keys_total{{{s}}}[5m]) > 0"),
                "1m",
                "warning",
                "Redis instance {{ $labels.namespace }}/{{ $labels.pod }} is evicting keys",
                "{{ $labels.pod }} evicted {{ $value | printf \"%.0f\" }} keys in 5 minutes to stay under maxmemory.",
            ),
            alert(
                "RedisRejectedConnections",
                format!("increase(redis_rejected_connections_total{{{s}}}[5m]) > 0"),
                "0m",
                "warning",
                "Redis instance {{ $labels.namespace }}/{{ $labels.pod }} rejects connections",
                "{{ $labels.pod }} rejected {{ $value | printf \"%.0f\" }} connections in 5 minutes (maxclients reached).",
            ),
            alert(
                "RedisBackupTooOld",
                format!("time() - redpilot_backup_last_success_timestamp_seconds{{{s}}} > {backup_secs}"),
                "10m",
                "warning",
                "The last backup of Redis {{ $labels.namespace }}/{{ $labels.redis }} is too old",
                "The newest completed backup finished {{ $value | humanizeDuration }} ago (bound: spec.monitoring.alerts.backupMaxAgeHours).",
            ),
            alert(
                "RedisArchiveBehind",
                format!("redpilot_archive_lag_seconds{{{s}}} > redpilot_archive_lag_bound_seconds{{{s}}}"),
                "15s",
                "warning",
                "The archive of Redis {{ $labels.namespace }}/{{ $labels.redis }} is behind",
                "The newest write time the archive can restore is {{ $value | humanizeDuration }} old (bound: three of spec.archive.intervalSeconds and 10 s): the store is slow or unreachable, and writes since are only on the servers. See status.archive.message.",
            ),
            alert(
                "RedisArchiveStopped",
                format!("max by (namespace, redis) (redpilot_archive_archiving{{{s}}}) == 0"),
                "2m",
                "warning",
                "No instance of Redis {{ $labels.namespace }}/{{ $labels.redis }} archives its writes",
                "spec.archive is set but no archive sidecar has streamed for 2 minutes (with replicas, a replica archives: are they all down?). Writes since are not restorable. See status.archive.message.",
            ),
            alert(
                "RedisMemoryAtMaximum",
                format!("redpilot_redis_memory_at_maximum{{{s}}} == 1"),
                "5m",
                "warning",
                "The memory autopilot of Redis {{ $labels.namespace }}/{{ $labels.redis }} cannot grow it further",
                "{{ $labels.redis }} needs more memory and the autopilot cannot give it ({{ $labels.reason }}: spec.autopilot.memory.maxMemory, a ResourceQuota or the node); writes will be refused or keys evicted once maxmemory is reached. See the MemoryAtMaximum condition.",
            ),
            alert(
                "RedisShardsAtMaximum",
                format!("redpilot_redis_shards_at_maximum{{{s}}} == 1"),
                "5m",
                "warning",
                "The shard autopilot of Redis {{ $labels.namespace }}/{{ $labels.redis }} is at maxShards and still short",
                "The fullest shard of {{ $labels.redis }} is over spec.autopilot.shards.scaleUpPercent of its maxmemory, the memory autopilot (if any) can grow it no further, and spec.autopilot.shards.maxShards is reached: writes will be refused or keys evicted once maxmemory is reached. Raise maxShards or the memory bounds; status.autopilot.shards.lastDecision has the numbers.",
            ),
            alert(
                "RedisClusterStateFail",
                format!("redis_cluster_state{{{s}}} == 0"),
                "1m",
                "critical",
                "Cluster node {{ $labels.namespace }}/{{ $labels.pod }} reports cluster_state:fail",
                "For a minute the node in pod {{ $labels.pod }} of Cluster Redis {{ $labels.redis }} has reported cluster_state:fail and refuses every key command. The operator runs require-full-coverage no, so this means the node cannot reach a majority of the shard primaries (a partition, or most primaries down). See `kubectl redpilot status {{ $labels.redis }} -n {{ $labels.namespace }}`.",
            ),
            alert(
                "RedisClusterSlotsNotOk",
                format!("max by (namespace, redis) (16384 - redis_cluster_slots_ok{{{s}}}) > 0"),
                "1m",
                "critical",
                "Cluster Redis {{ $labels.namespace }}/{{ $labels.redis }} has slots that are not served",
                "For a minute {{ $value | printf \"%.0f\" }} of the 16384 hash slots of {{ $labels.redis }} have had no healthy owner (unassigned, or their primary failing): keys in them can be neither read nor written. status.shards names the shard without a primary.",
            ),
            alert(
                "RedisClusterShardWithoutReplica",
                format!("redpilot_redis_shard_replicas{{{s}}} == 0 and on (namespace, redis, shard) redpilot_redis_shard_desired_instances{{{s}}} > 1"),
                "5m",
                "warning",
                "Shard {{ $labels.shard }} of Redis {{ $labels.namespace }}/{{ $labels.redis }} has no replica",
                "For 5 minutes no replica has followed the primary of shard {{ $labels.shard }} although spec.instances asks for some: if that primary fails, the shard's slots stay unserved until it comes back, and without storage its data is lost. See the Ready condition and `kubectl get pods -n {{ $labels.namespace }} -l app.kubernetes.io/instance={{ $labels.redis }},redpilot.io/shard={{ $labels.shard }}`.",
            ),
            alert(
                "RedisTuningCritical",
                format!("max by (namespace, redis, rule) (redpilot_redis_findings{{severity=\"critical\",{s}}}) > 0"),
                "10m",
                "critical",
                "Redis {{ $labels.namespace }}/{{ $labels.redis }}: {{ $labels.rule }}",
                "For 10 minutes the operator's look at the servers of {{ $labels.redis }} has found {{ $labels.rule }} on {{ $value | printf \"%.0f\" }} instance(s): writes fail or data is at risk. `kubectl redpilot advise {{ $labels.redis }} -n {{ $labels.namespace }}` shows the evidence and the change to apply.",
            ),
            alert(
                "RedisBackupFailed",
                format!("redpilot_backup_last_failed{{{s}}} == 1"),
                "0m",
                "warning",
                "The last backup of Redis {{ $labels.namespace }}/{{ $labels.redis }} failed",
                "The newest finished RedisBackup of {{ $labels.redis }} failed; see its status.reason and status.message.",
            ),
        ],
    })
}

/// The operator's own rule group.
pub fn operator_group() -> Value {
    json!({
        "name": "redpilot.operator",
        "rules": [
            alert(
                "RedpilotReconcileErrors",
                "sum(increase(redpilot_reconcile_errors_total[10m])) > 10".to_string(),
                "10m",
                "warning",
                "Redpilot reconciles keep failing",
                "More than 10 reconcile errors in 10 minutes, for 10 minutes; `sum by (category) (increase(redpilot_reconcile_errors_total[10m]))` says which kind.",
            ),
            alert(
                "RedpilotNoLeader",
                "max(redpilot_leader) == 0".to_string(),
                "5m",
                "critical",
                "No Redpilot operator holds the leader lease",
                "Every operator process is a standby: nothing reconciles, fails over or backs up.",
            ),
            alert(
                "RedpilotDown",
                "absent(redpilot_build_info)".to_string(),
                "5m",
                "critical",
                "The Redpilot operator is not scraped",
                "No operator process has answered Prometheus for 5 minutes: nothing reconciles, fails over or backs up.",
            ),
        ],
    })
}

/// The shipped rules file: every group, fleet-wide, with default bounds.
pub fn fleet_file() -> Value {
    json!({
        "groups": [redis_group(&Scope::Fleet, &AlertBounds::default()), operator_group()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_redis_is_selected_by_namespace_and_name() {
        let g = redis_group(
            &Scope::One {
                namespace: "prod",
                redis: "cache",
            },
            &AlertBounds {
                memory_percent: 80,
                ..Default::default()
            },
        );
        let rules = g["rules"].as_array().expect("rules");
        assert!(rules.len() >= 9);
        for r in rules {
            let e = r["expr"].as_str().expect("expr");
            assert!(e.contains("namespace=\"prod\",redis=\"cache\""), "{e}");
        }
        let mem = rules
            .iter()
            .find(|r| r["alert"] == "RedisMemoryNearLimit")
            .expect("memory");
        assert!(mem["expr"].as_str().unwrap_or_default().ends_with("> 80"));
    }
}
