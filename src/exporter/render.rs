//! Pure part of the exporter: the text of one `INFO ALL` reply in, the
//! Prometheus text exposition out.
//!
//! Metric names and labels follow the widely used Redis exporter
//! (`redis_` prefix, `_bytes`/`_seconds`/`_total` suffixes, `db`, `cmd`,
//! `err` and `slave_*` labels), so dashboards and alerts written for it
//! work unchanged with the sidecar. Only `INFO` is asked: no key is ever
//! read, and nothing the server is told changes. The few series of that
//! exporter whose names break Prometheus' naming rules (counters without
//! `_total`, a gauge with it) are left out, so `promtool check metrics`
//! finds nothing to report.
//!
//! Length: most of the file is the two field tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::redis::info::kv_list;

/// How a value of `INFO` becomes a sample.
#[derive(Clone, Copy)]
enum Conv {
    /// The number as sent.
    Num,
    /// `ok` → 1, anything else → 0.
    Ok,
    /// Microseconds → seconds.
    Micros,
}

/// `INFO` fields exported as gauges: field, metric (without `redis_`),
/// conversion.
const GAUGES: &[(&str, &str, Conv)] = &[
    // Server
    ("uptime_in_seconds", "uptime_in_seconds", Conv::Num),
    ("process_id", "process_id", Conv::Num),
    ("io_threads_active", "io_threads_active", Conv::Num),
    // Clients
    ("connected_clients", "connected_clients", Conv::Num),
    ("blocked_clients", "blocked_clients", Conv::Num),
    ("tracking_clients", "tracking_clients", Conv::Num),
    (
        "clients_in_timeout_table",
        "clients_in_timeout_table",
        Conv::Num,
    ),
    ("pubsub_clients", "pubsub_clients", Conv::Num),
    ("watching_clients", "watching_clients", Conv::Num),
    ("total_watched_keys", "total_watched_keys", Conv::Num),
    ("total_blocking_keys", "total_blocking_keys", Conv::Num),
    (
        "client_recent_max_output_buffer",
        "client_recent_max_output_buffer_bytes",
        Conv::Num,
    ),
    (
        "client_recent_max_input_buffer",
        "client_recent_max_input_buffer_bytes",
        Conv::Num,
    ),
    ("maxclients", "max_clients", Conv::Num),
    // Memory
    ("used_memory", "memory_used_bytes", Conv::Num),
    ("used_memory_rss", "memory_used_rss_bytes", Conv::Num),
    ("used_memory_peak", "memory_used_peak_bytes", Conv::Num),
    ("used_memory_lua", "memory_used_lua_bytes", Conv::Num),
    (
        "used_memory_vm_eval",
        "memory_used_vm_eval_bytes",
        Conv::Num,
    ),
    (
        "used_memory_scripts",
        "memory_used_scripts_bytes",
        Conv::Num,
    ),
    (
        "used_memory_overhead",
        "memory_used_overhead_bytes",
        Conv::Num,
    ),
    (
        "used_memory_startup",
        "memory_used_startup_bytes",
        Conv::Num,
    ),
    (
        "used_memory_dataset",
        "memory_used_dataset_bytes",
        Conv::Num,
    ),
    ("maxmemory", "memory_max_bytes", Conv::Num),
    (
        "total_system_memory",
        "total_system_memory_bytes",
        Conv::Num,
    ),
    (
        "mem_fragmentation_ratio",
        "mem_fragmentation_ratio",
        Conv::Num,
    ),
    (
        "mem_fragmentation_bytes",
        "mem_fragmentation_bytes",
        Conv::Num,
    ),
    ("mem_clients_slaves", "mem_clients_slaves", Conv::Num),
    ("mem_clients_normal", "mem_clients_normal", Conv::Num),
    (
        "mem_not_counted_for_evict",
        "mem_not_counted_for_eviction_bytes",
        Conv::Num,
    ),
    (
        "mem_replication_backlog",
        "mem_replication_backlog_bytes",
        Conv::Num,
    ),
    ("allocator_active", "allocator_active_bytes", Conv::Num),
    (
        "allocator_allocated",
        "allocator_allocated_bytes",
        Conv::Num,
    ),
    ("allocator_resident", "allocator_resident_bytes", Conv::Num),
    (
        "lazyfree_pending_objects",
        "lazyfree_pending_objects",
        Conv::Num,
    ),
    ("active_defrag_running", "active_defrag_running", Conv::Num),
    // Persistence
    ("loading", "loading_dump_file", Conv::Num),
    ("async_loading", "async_loading", Conv::Num),
    (
        "rdb_changes_since_last_save",
        "rdb_changes_since_last_save",
        Conv::Num,
    ),
    (
        "rdb_bgsave_in_progress",
        "rdb_bgsave_in_progress",
        Conv::Num,
    ),
    (
        "rdb_last_save_time",
        "rdb_last_save_timestamp_seconds",
        Conv::Num,
    ),
    ("rdb_last_bgsave_status", "rdb_last_bgsave_status", Conv::Ok),
    (
        "rdb_last_bgsave_time_sec",
        "rdb_last_bgsave_duration_sec",
        Conv::Num,
    ),
    (
        "rdb_current_bgsave_time_sec",
        "rdb_current_bgsave_duration_sec",
        Conv::Num,
    ),
    ("rdb_last_cow_size", "rdb_last_cow_size_bytes", Conv::Num),
    ("aof_enabled", "aof_enabled", Conv::Num),
    (
        "aof_rewrite_in_progress",
        "aof_rewrite_in_progress",
        Conv::Num,
    ),
    ("aof_rewrite_scheduled", "aof_rewrite_scheduled", Conv::Num),
    (
        "aof_last_rewrite_time_sec",
        "aof_last_rewrite_duration_sec",
        Conv::Num,
    ),
    (
        "aof_current_rewrite_time_sec",
        "aof_current_rewrite_duration_sec",
        Conv::Num,
    ),
    ("aof_last_cow_size", "aof_last_cow_size_bytes", Conv::Num),
    (
        "aof_last_bgrewrite_status",
        "aof_last_bgrewrite_status",
        Conv::Ok,
    ),
    ("aof_last_write_status", "aof_last_write_status", Conv::Ok),
    // Stats
    (
        "instantaneous_ops_per_sec",
        "instantaneous_ops_per_sec",
        Conv::Num,
    ),
    (
        "instantaneous_input_kbps",
        "instantaneous_input_kbps",
        Conv::Num,
    ),
    (
        "instantaneous_output_kbps",
        "instantaneous_output_kbps",
        Conv::Num,
    ),
    ("pubsub_channels", "pubsub_channels", Conv::Num),
    ("expired_stale_perc", "expired_stale_percentage", Conv::Num),
    ("pubsub_patterns", "pubsub_patterns", Conv::Num),
    ("pubsub_shardchannels", "pubsub_shardchannels", Conv::Num),
    ("latest_fork_usec", "latest_fork_seconds", Conv::Micros),
    // Replication
    ("connected_slaves", "connected_slaves", Conv::Num),
    ("repl_backlog_size", "replication_backlog_bytes", Conv::Num),
    ("repl_backlog_active", "repl_backlog_is_active", Conv::Num),
    (
        "repl_backlog_first_byte_offset",
        "repl_backlog_first_byte_offset",
        Conv::Num,
    ),
    (
        "repl_backlog_histlen",
        "repl_backlog_history_bytes",
        Conv::Num,
    ),
    ("master_repl_offset", "master_repl_offset", Conv::Num),
    ("second_repl_offset", "second_repl_offset", Conv::Num),
    (
        "slave_expires_tracked_keys",
        "slave_expires_tracked_keys",
        Conv::Num,
    ),
    ("slave_priority", "slave_priority", Conv::Num),
    ("sync_full", "replica_resyncs_full", Conv::Num),
    (
        "sync_partial_ok",
        "replica_partial_resync_accepted",
        Conv::Num,
    ),
    (
        "sync_partial_err",
        "replica_partial_resync_denied",
        Conv::Num,
    ),
    ("replica_priority", "slave_priority", Conv::Num),
    (
        "master_link_down_since_seconds",
        "master_link_down_since_seconds",
        Conv::Num,
    ),
    // Cluster (`INFO`'s `cluster_enabled`; the rest from `CLUSTER INFO`,
    // which the exporter appends when the server runs in cluster mode).
    ("cluster_enabled", "cluster_enabled", Conv::Num),
    ("cluster_state", "cluster_state", Conv::Ok),
    (
        "cluster_slots_assigned",
        "cluster_slots_assigned",
        Conv::Num,
    ),
    ("cluster_slots_ok", "cluster_slots_ok", Conv::Num),
    ("cluster_slots_pfail", "cluster_slots_pfail", Conv::Num),
    ("cluster_slots_fail", "cluster_slots_fail", Conv::Num),
    ("cluster_known_nodes", "cluster_known_nodes", Conv::Num),
    ("cluster_size", "cluster_size", Conv::Num),
    ("cluster_current_epoch", "cluster_current_epoch", Conv::Num),
    ("cluster_my_epoch", "cluster_my_epoch", Conv::Num),
];

/// `INFO` fields exported as counters: field, metric (without `redis_`),
/// conversion.
const COUNTERS: &[(&str, &str, Conv)] = &[
    (
        "total_connections_received",
        "connections_received_total",
        Conv::Num,
    ),
    (
        "total_commands_processed",
        "commands_processed_total",
        Conv::Num,
    ),
    (
        "rejected_connections",
        "rejected_connections_total",
        Conv::Num,
    ),
    ("total_net_input_bytes", "net_input_bytes_total", Conv::Num),
    (
        "total_net_output_bytes",
        "net_output_bytes_total",
        Conv::Num,
    ),
    (
        "total_net_repl_input_bytes",
        "net_repl_input_bytes_total",
        Conv::Num,
    ),
    (
        "total_net_repl_output_bytes",
        "net_repl_output_bytes_total",
        Conv::Num,
    ),
    ("expired_keys", "expired_keys_total", Conv::Num),
    (
        "expired_time_cap_reached_count",
        "expired_time_cap_reached_total",
        Conv::Num,
    ),
    ("evicted_keys", "evicted_keys_total", Conv::Num),
    (
        "cluster_stats_messages_sent",
        "cluster_messages_sent_total",
        Conv::Num,
    ),
    (
        "cluster_stats_messages_received",
        "cluster_messages_received_total",
        Conv::Num,
    ),
    ("evicted_clients", "evicted_clients_total", Conv::Num),
    ("keyspace_hits", "keyspace_hits_total", Conv::Num),
    ("keyspace_misses", "keyspace_misses_total", Conv::Num),
    ("used_cpu_sys", "cpu_sys_seconds_total", Conv::Num),
    ("used_cpu_user", "cpu_user_seconds_total", Conv::Num),
    (
        "used_cpu_sys_children",
        "cpu_sys_children_seconds_total",
        Conv::Num,
    ),
    (
        "used_cpu_user_children",
        "cpu_user_children_seconds_total",
        Conv::Num,
    ),
];

/// Samples grouped by metric family, in the order families first appear.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
    index: BTreeMap<String, usize>,
}

struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<(String, f64)>,
}

impl Exposition {
    /// Adds one sample of `name` (a gauge or counter) with `labels`.
    pub fn add(
        &mut self,
        name: &str,
        kind: &'static str,
        help: &str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let i = match self.index.get(name) {
            Some(i) => *i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    kind,
                    help: help.to_string(),
                    samples: Vec::new(),
                });
                self.index.insert(name.to_string(), self.families.len() - 1);
                self.families.len() - 1
            }
        };
        let mut l = String::new();
        for (k, v) in labels {
            if !l.is_empty() {
                l.push(',');
            }
            let _ = write!(l, "{k}=\"{}\"", escape(v));
        }
        let family = &mut self.families[i];
        // A repeated field (an alias) keeps its first value.
        if family.samples.iter().any(|(have, _)| *have == l) {
            return;
        }
        family.samples.push((l, value));
    }

    /// The text exposition format (version 0.0.4).
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(64 * self.families.len());
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (labels, v) in &f.samples {
                if labels.is_empty() {
                    let _ = writeln!(out, "{} {}", f.name, number(*v));
                } else {
                    let _ = writeln!(out, "{}{{{labels}}} {}", f.name, number(*v));
                }
            }
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn convert(value: &str, conv: Conv) -> Option<f64> {
    let value = value.trim();
    match conv {
        Conv::Ok => Some(if value == "ok" { 1.0 } else { 0.0 }),
        Conv::Num => match value {
            "ok" | "true" => Some(1.0),
            "err" | "fail" | "false" => Some(0.0),
            _ => value.parse::<f64>().ok(),
        },
        Conv::Micros => value.parse::<f64>().ok().map(|v| v / 1e6),
    }
    .filter(|v| v.is_finite())
}

/// Adds the samples of one `INFO ALL` reply. `now` (Unix seconds) dates
/// `redis_start_time_seconds`.
pub fn info_samples(out: &mut Exposition, info: &str, now: f64) {
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    for line in info.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            fields.entry(k).or_insert(v);
        }
    }
    for (field, name, conv) in GAUGES {
        if let Some(v) = fields.get(field).and_then(|v| convert(v, *conv)) {
            let name = format!("redis_{name}");
            out.add(&name, "gauge", &format!("INFO field {field}"), &[], v);
        }
    }
    for (field, name, conv) in COUNTERS {
        if let Some(v) = fields.get(field).and_then(|v| convert(v, *conv)) {
            let name = format!("redis_{name}");
            out.add(&name, "counter", &format!("INFO field {field}"), &[], v);
        }
    }
    if let Some(up) = fields
        .get("uptime_in_seconds")
        .and_then(|v| v.parse::<f64>().ok())
    {
        out.add(
            "redis_start_time_seconds",
            "gauge",
            "Start time of the server, seconds since the epoch",
            &[],
            (now - up).floor(),
        );
    }
    instance_info(out, &fields);
    replication(out, &fields);
    for (key, value) in &fields {
        if let Some(db) = key.strip_prefix("db")
            && !db.is_empty()
            && db.bytes().all(|b| b.is_ascii_digit())
        {
            keyspace(out, key, value);
        } else if let Some(cmd) = key.strip_prefix("cmdstat_") {
            commandstats(out, cmd, value);
        } else if let Some(err) = key.strip_prefix("errorstat_") {
            let kv = kv_list(value);
            if let Some(n) = kv.get("count").and_then(|v| v.parse().ok()) {
                out.add(
                    "redis_errors_total",
                    "counter",
                    "Error replies by error prefix",
                    &[("err", err)],
                    n,
                );
            }
        }
    }
}

fn instance_info(out: &mut Exposition, fields: &BTreeMap<&str, &str>) {
    let get = |k: &str| fields.get(k).copied().unwrap_or("");
    let role = match get("role") {
        "primary" => "master",
        "replica" => "slave",
        other => other,
    };
    let mode = match get("redis_mode") {
        "" => get("server_mode"),
        m => m,
    };
    let mut labels = vec![
        ("role", role),
        ("redis_version", get("redis_version")),
        ("redis_build_id", get("redis_build_id")),
        ("redis_mode", mode),
        ("os", get("os")),
        ("maxmemory_policy", get("maxmemory_policy")),
        ("tcp_port", get("tcp_port")),
        ("run_id", get("run_id")),
        ("process_id", get("process_id")),
        ("master_replid", get("master_replid")),
    ];
    if let Some(v) = fields.get("valkey_version") {
        labels.push(("valkey_version", v));
    }
    out.add(
        "redis_instance_info",
        "gauge",
        "Information about the server",
        &labels,
        1.0,
    );
}

fn replication(out: &mut Exposition, fields: &BTreeMap<&str, &str>) {
    let get = |k: &str| fields.get(k).copied().unwrap_or("");
    let replica = matches!(get("role"), "slave" | "replica");
    if replica {
        let host = fields
            .get("master_host")
            .or_else(|| fields.get("primary_host"))
            .copied()
            .unwrap_or("");
        let port = fields
            .get("master_port")
            .or_else(|| fields.get("primary_port"))
            .copied()
            .unwrap_or("");
        let read_only = fields
            .get("slave_read_only")
            .or_else(|| fields.get("replica_read_only"))
            .copied()
            .unwrap_or("");
        out.add(
            "redis_slave_info",
            "gauge",
            "Information about the replica's primary",
            &[
                ("master_host", host),
                ("master_port", port),
                ("read_only", read_only),
            ],
            1.0,
        );
        let primary = [("master_host", host), ("master_port", port)];
        let link = fields
            .get("master_link_status")
            .or_else(|| fields.get("primary_link_status"))
            .copied();
        if let Some(link) = link {
            out.add(
                "redis_master_link_up",
                "gauge",
                "1 when the replication link to the primary is up",
                &primary,
                if link == "up" { 1.0 } else { 0.0 },
            );
        }
        for (field, name, help) in [
            (
                "master_last_io_seconds_ago",
                "redis_master_last_io_seconds_ago",
                "Seconds since the last interaction with the primary",
            ),
            (
                "master_sync_in_progress",
                "redis_master_sync_in_progress",
                "1 while the replica syncs from the primary",
            ),
            (
                "slave_repl_offset",
                "redis_slave_repl_offset",
                "Replication offset of the replica",
            ),
        ] {
            if let Some(v) = fields.get(field).and_then(|v| v.trim().parse::<f64>().ok()) {
                out.add(name, "gauge", help, &primary, v);
            }
        }
    }
    for (key, value) in fields {
        let Some(idx) = key
            .strip_prefix("slave")
            .or_else(|| key.strip_prefix("replica"))
        else {
            continue;
        };
        if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let kv = kv_list(value);
        let ip = kv.get("ip").copied().unwrap_or("");
        let port = kv.get("port").copied().unwrap_or("");
        let state = kv.get("state").copied().unwrap_or("");
        let labels = [
            ("slave_ip", ip),
            ("slave_port", port),
            ("slave_state", state),
        ];
        if let Some(offset) = kv.get("offset").and_then(|v| v.parse().ok()) {
            out.add(
                "redis_connected_slave_offset_bytes",
                "gauge",
                "Replication offset a replica acknowledged",
                &labels,
                offset,
            );
        }
        if let Some(lag) = kv.get("lag").and_then(|v| v.parse().ok()) {
            out.add(
                "redis_connected_slave_lag_seconds",
                "gauge",
                "Seconds since the replica's last acknowledgement",
                &labels,
                lag,
            );
        }
    }
}

fn keyspace(out: &mut Exposition, db: &str, value: &str) {
    let kv = kv_list(value);
    let n = |k: &str| kv.get(k).and_then(|v| v.parse::<f64>().ok());
    if let Some(keys) = n("keys") {
        out.add(
            "redis_db_keys",
            "gauge",
            "Keys in the database",
            &[("db", db)],
            keys,
        );
    }
    if let Some(expires) = n("expires") {
        out.add(
            "redis_db_keys_expiring",
            "gauge",
            "Keys with an expiry in the database",
            &[("db", db)],
            expires,
        );
    }
    if let Some(ttl) = n("avg_ttl") {
        out.add(
            "redis_db_avg_ttl_seconds",
            "gauge",
            "Average time to live of expiring keys",
            &[("db", db)],
            ttl / 1000.0,
        );
    }
}

fn commandstats(out: &mut Exposition, cmd: &str, value: &str) {
    let kv = kv_list(value);
    let n = |k: &str| kv.get(k).and_then(|v| v.parse::<f64>().ok());
    let labels = [("cmd", cmd)];
    if let Some(calls) = n("calls") {
        out.add(
            "redis_commands_total",
            "counter",
            "Calls of the command",
            &labels,
            calls,
        );
    }
    if let Some(usec) = n("usec") {
        out.add(
            "redis_commands_duration_seconds_total",
            "counter",
            "Time spent in the command",
            &labels,
            usec / 1e6,
        );
    }
    if let Some(v) = n("rejected_calls") {
        out.add(
            "redis_commands_rejected_calls_total",
            "counter",
            "Calls of the command rejected before it ran",
            &labels,
            v,
        );
    }
    if let Some(v) = n("failed_calls") {
        out.add(
            "redis_commands_failed_calls_total",
            "counter",
            "Calls of the command that failed",
            &labels,
            v,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY: &str = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nos:Linux\r\nprocess_id:42\r\nrun_id:abc\r\ntcp_port:6379\r\nuptime_in_seconds:100\r\n# Clients\r\nconnected_clients:3\r\n# Memory\r\nused_memory:1048576\r\nmaxmemory:4194304\r\nmaxmemory_policy:noeviction\r\n# Persistence\r\nrdb_last_bgsave_status:ok\r\naof_last_write_status:err\r\n# Stats\r\nevicted_keys:7\r\nrejected_connections:2\r\nlatest_fork_usec:1500\r\n# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=10.0.0.2,port=6379,state=online,offset=500,lag=1\r\nmaster_repl_offset:600\r\n# Commandstats\r\ncmdstat_set:calls=10,usec=20,usec_per_call=2.00,rejected_calls=1,failed_calls=0\r\n# Errorstats\r\nerrorstat_OOM:count=4\r\n# Keyspace\r\ndb0:keys=5,expires=2,avg_ttl=3000\r\n";

    fn render(info: &str) -> String {
        let mut e = Exposition::default();
        info_samples(&mut e, info, 1000.0);
        e.text()
    }

    #[test]
    fn a_primary_is_exported_with_the_usual_names() {
        let t = render(PRIMARY);
        for line in [
            "redis_memory_used_bytes 1048576",
            "redis_memory_max_bytes 4194304",
            "redis_connected_clients 3",
            "redis_evicted_keys_total 7",
            "redis_rejected_connections_total 2",
            "redis_rdb_last_bgsave_status 1",
            "redis_aof_last_write_status 0",
            "redis_latest_fork_seconds 0.0015",
            "redis_connected_slaves 1",
            "redis_master_repl_offset 600",
            "redis_start_time_seconds 900",
            "redis_connected_slave_offset_bytes{slave_ip=\"10.0.0.2\",slave_port=\"6379\",slave_state=\"online\"} 500",
            "redis_connected_slave_lag_seconds{slave_ip=\"10.0.0.2\",slave_port=\"6379\",slave_state=\"online\"} 1",
            "redis_commands_total{cmd=\"set\"} 10",
            "redis_commands_duration_seconds_total{cmd=\"set\"} 0.00002",
            "redis_commands_rejected_calls_total{cmd=\"set\"} 1",
            "redis_errors_total{err=\"OOM\"} 4",
            "redis_db_keys{db=\"db0\"} 5",
            "redis_db_keys_expiring{db=\"db0\"} 2",
            "redis_db_avg_ttl_seconds{db=\"db0\"} 3",
            "# TYPE redis_evicted_keys_total counter",
            "# TYPE redis_memory_used_bytes gauge",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        assert!(t.contains("role=\"master\""), "{t}");
        assert!(t.contains("redis_version=\"7.0.15\""), "{t}");
        assert!(!t.contains("redis_master_link_up"), "a primary has no link");
    }

    #[test]
    fn a_valkey_replica_reports_its_link_and_version() {
        let t = render(
            "# Server\nredis_version:7.2.4\nvalkey_version:8.1.1\n# Replication\nrole:slave\nmaster_host:10.0.0.1\nmaster_port:6379\nmaster_link_status:down\nslave_repl_offset:90\nslave_read_only:1\n",
        );
        assert!(t.contains("redis_version=\"7.2.4\""), "{t}");
        assert!(t.contains("valkey_version=\"8.1.1\""), "{t}");
        let at = "{master_host=\"10.0.0.1\",master_port=\"6379\"}";
        assert!(t.contains(&format!("redis_master_link_up{at} 0")), "{t}");
        assert!(
            t.contains(&format!("redis_slave_repl_offset{at} 90")),
            "{t}"
        );
        assert!(
            t.contains(
                "redis_slave_info{master_host=\"10.0.0.1\",master_port=\"6379\",read_only=\"1\"} 1"
            ),
            "{t}"
        );
    }

    #[test]
    fn every_family_is_declared_once_and_values_are_numbers() {
        let t = render(PRIMARY);
        let mut seen = std::collections::BTreeSet::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap_or_default();
                assert!(seen.insert(name.to_string()), "{name} declared twice");
            } else if !line.starts_with('#') {
                let value = line.rsplit(' ').next().unwrap_or_default();
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
        // Garbage in: no panic, only the info series.
        let junk = render("\u{0}:\u{1}\nfoo\n:::\ndb:keys=x\ncmdstat_:calls=\n");
        assert!(junk.contains("redis_instance_info"), "{junk}");
    }

    #[test]
    fn a_cluster_node_reports_its_cluster_state_and_slots() {
        let ok = render(
            "# Server\r\nredis_version:8.1.1\r\n# Cluster\r\ncluster_enabled:1\r\n# ClusterInfo\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16000\r\ncluster_slots_pfail:384\r\ncluster_slots_fail:0\r\ncluster_known_nodes:6\r\ncluster_size:3\r\ncluster_current_epoch:7\r\ncluster_my_epoch:2\r\ncluster_stats_messages_sent:1200\r\ncluster_stats_messages_received:1100\r\n",
        );
        for line in [
            "redis_cluster_enabled 1",
            "redis_cluster_state 1",
            "redis_cluster_slots_assigned 16384",
            "redis_cluster_slots_ok 16000",
            "redis_cluster_slots_pfail 384",
            "redis_cluster_slots_fail 0",
            "redis_cluster_known_nodes 6",
            "redis_cluster_size 3",
            "redis_cluster_current_epoch 7",
            "redis_cluster_my_epoch 2",
            "redis_cluster_messages_sent_total 1200",
            "redis_cluster_messages_received_total 1100",
            "# TYPE redis_cluster_messages_sent_total counter",
        ] {
            assert!(ok.lines().any(|l| l == line), "missing {line:?} in\n{ok}");
        }
        let failing = render("cluster_enabled:1\r\ncluster_state:fail\r\n");
        assert!(
            failing.lines().any(|l| l == "redis_cluster_state 0"),
            "{failing}"
        );
        let plain = render(PRIMARY);
        assert!(!plain.contains("redis_cluster_state"), "{plain}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut e = Exposition::default();
        e.add("m", "gauge", "h", &[("a", "x\"y\\z\nw")], 1.0);
        assert!(e.text().contains(r#"m{a="x\"y\\z\nw"} 1"#), "{}", e.text());
    }
}
