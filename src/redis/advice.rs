//! Tuning advice: pure rules that turn what a sweep read from one server
//! ([`Sample`], and an earlier sample as the baseline of counters) into
//! findings, each with a severity, the evidence in numbers and what to do.
//! No I/O; every rule is table-tested here and fired from real servers'
//! output in `tests/redis_tuning.rs`.
//!
//! A rule answers for every server: it fires, it is clear, or it cannot
//! tell (no baseline yet for a rule over a window, a setting the server did
//! not report). A finding that cannot be told stays as it was.

use std::collections::BTreeMap;

use super::tuning::Sample;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Worth knowing; nothing is at risk.
    Info,
    /// Latency or capacity suffers, or will.
    Warning,
    /// Writes fail or data is at risk now.
    Critical,
}

impl Severity {
    /// `info`, `warning` or `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// The rule's name (one of [`RULES`]).
    pub rule: &'static str,
    /// How much it matters.
    pub severity: Severity,
    /// What was seen, in numbers.
    pub evidence: String,
    /// What to do.
    pub advice: String,
    /// The `spec.config` change that carries the advice out, when one does.
    pub config: Option<(&'static str, String)>,
}

/// What a rule says of one server.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The finding stands.
    Fires(Advice),
    /// Nothing to say.
    Clear,
    /// Not enough to tell (the earlier finding, if any, stands).
    Unknown,
}

/// The rules, in the order they are reported.
pub const RULES: &[&str] = &[
    "persistence-failing",
    "noeviction-full",
    "rejected-connections",
    "clients-near-max",
    "dangerous-commands",
    "slow-commands",
    "latency-spikes",
    "latency-monitor-off",
    "slow-fork",
    "fragmentation",
    "low-hit-ratio",
    "volatile-without-ttl",
    "full-resyncs",
    "big-keys",
    "output-buffers",
];

/// Where the rules draw their lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    /// Slow log entries and latency events older than this (seconds) are
    /// not counted.
    pub window_secs: i64,
    /// A command in the slow log counts as slow from this long (ms).
    pub slow_ms: u64,
    /// A latency event counts from this long (ms).
    pub latency_ms: u64,
    /// The `latency-monitor-threshold` advised when the monitor is off (ms).
    pub monitor_ms: u64,
    /// A fork counts as slow from this long (ms).
    pub fork_ms: u64,
    /// `mem_fragmentation_ratio` from which memory counts as fragmented...
    pub fragmentation: f64,
    /// ...when the data takes at least this much (bytes).
    pub fragmentation_min_bytes: u64,
    /// A hit ratio below this, while keys are evicted, says the cache is too
    /// small...
    pub hit_ratio: f64,
    /// ...over at least this many lookups.
    pub hit_min_lookups: u64,
    /// Memory used, as a share of `maxmemory`, from which a server that
    /// cannot evict counts as full.
    pub memory_full: f64,
    /// Full resynchronisations over the window from which the backlog
    /// counts as too small.
    pub full_syncs: u64,
    /// Connected clients, as a share of `maxclients`: warning...
    pub clients_warning: f64,
    /// ...and critical.
    pub clients_critical: f64,
    /// A key counts as big from this size (bytes).
    pub big_key_bytes: u64,
    /// A client's output buffer counts as large from this size (bytes).
    pub output_buffer_bytes: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        const MIB: u64 = 1024 * 1024;
        Thresholds {
            window_secs: 3600,
            slow_ms: 50,
            latency_ms: 100,
            monitor_ms: 100,
            fork_ms: 500,
            fragmentation: 1.5,
            fragmentation_min_bytes: 64 * MIB,
            hit_ratio: 0.5,
            hit_min_lookups: 1000,
            memory_full: 0.9,
            full_syncs: 3,
            clients_warning: 0.8,
            clients_critical: 0.95,
            big_key_bytes: 16 * MIB,
            output_buffer_bytes: 32 * MIB,
        }
    }
}

/// One server's samples: the current one and, for counters over a window,
/// an earlier one of the same server.
pub struct Subject<'a> {
    /// The sweep just made.
    pub cur: &'a Sample,
    /// An earlier sweep (at least one interval old), when there is one.
    pub base: Option<&'a Sample>,
    /// Where the rules draw their lines.
    pub t: &'a Thresholds,
}

/// Commands that walk a whole keyspace or a whole value, and what to use
/// instead.
const DANGEROUS: &[(&str, &str)] = &[
    ("KEYS", "SCAN"),
    ("SMEMBERS", "SSCAN"),
    ("HGETALL", "HSCAN"),
    ("HKEYS", "HSCAN"),
    ("HVALS", "HSCAN"),
    ("LRANGE", "bounded LRANGE ranges"),
    ("ZRANGE", "bounded ZRANGE ranges or ZSCAN"),
    ("SORT", "a sorted set kept up to date"),
    ("SUNION", "SSCAN over the sets"),
    ("SINTER", "smaller sets or SINTERCARD with LIMIT"),
    ("FLUSHALL", "FLUSHALL ASYNC"),
    ("FLUSHDB", "FLUSHDB ASYNC"),
    ("DEL", "UNLINK"),
];

/// Every rule's verdict on one server, in [`RULES`] order.
pub fn evaluate(s: &Subject) -> Vec<(&'static str, Verdict)> {
    vec![
        ("persistence-failing", persistence_failing(s)),
        ("noeviction-full", noeviction_full(s)),
        ("rejected-connections", rejected_connections(s)),
        ("clients-near-max", clients_near_max(s)),
        ("dangerous-commands", dangerous_commands(s)),
        ("slow-commands", slow_commands(s)),
        ("latency-spikes", latency_spikes(s)),
        ("latency-monitor-off", latency_monitor_off(s)),
        ("slow-fork", slow_fork(s)),
        ("fragmentation", fragmentation(s)),
        ("low-hit-ratio", low_hit_ratio(s)),
        ("volatile-without-ttl", volatile_without_ttl(s)),
        ("full-resyncs", full_resyncs(s)),
        ("big-keys", big_keys(s)),
        ("output-buffers", output_buffers(s)),
    ]
}

fn fires(
    rule: &'static str,
    severity: Severity,
    evidence: String,
    advice: impl Into<String>,
    config: Option<(&'static str, String)>,
) -> Verdict {
    Verdict::Fires(Advice {
        rule,
        severity,
        evidence,
        advice: advice.into(),
        config,
    })
}

/// Bytes for people: `340 MiB`, `1.2 GiB`, `512 KiB`, `900 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: &[(&str, f64)] = &[
        ("GiB", 1024.0 * 1024.0 * 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("KiB", 1024.0),
    ];
    for (unit, size) in UNITS {
        let v = n as f64 / size;
        if v >= 1.0 {
            return if v >= 10.0 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{n} B")
}

/// Seconds for people: `58 min`, `2.0 h`, `40 s`.
fn span(secs: i64) -> String {
    if secs >= 7200 {
        format!("{:.1} h", secs as f64 / 3600.0)
    } else if secs >= 120 {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

/// A counter's growth since the baseline and the seconds it covers; after
/// a restart (uptime went back) the counter's whole value since the start.
/// `None` without a baseline.
fn growth(s: &Subject, field: &str) -> Option<(f64, i64)> {
    let base = s.base?;
    let cur = s.cur.num(field)?;
    let up_now = s.cur.num("uptime_in_seconds")?;
    let up_then = base.num("uptime_in_seconds")?;
    if up_now < up_then {
        return Some((cur, up_now as i64));
    }
    let then = base.num(field)?;
    Some(((cur - then).max(0.0), (up_now - up_then) as i64))
}

/// `errorstat_<code>`'s count (`count=12`).
fn error_count(sample: &Sample, code: &str) -> Option<f64> {
    let v = sample.info.fields.get(&format!("errorstat_{code}"))?;
    crate::redis::info::kv_list(v).get("count")?.parse().ok()
}

fn persistence_failing(s: &Subject) -> Verdict {
    let f = &s.cur.info.fields;
    let failed: Vec<&str> = [
        ("rdb_last_bgsave_status", "the last RDB snapshot"),
        ("aof_last_bgrewrite_status", "the last AOF rewrite"),
        ("aof_last_write_status", "the last AOF write"),
    ]
    .iter()
    .filter(|(k, _)| f.get(*k).is_some_and(|v| v.trim() == "err"))
    .map(|(_, what)| *what)
    .collect();
    if f.get("rdb_last_bgsave_status").is_none() {
        return Verdict::Unknown;
    }
    if failed.is_empty() {
        return Verdict::Clear;
    }
    fires(
        "persistence-failing",
        Severity::Critical,
        format!("{} failed", failed.join(" and ")),
        "check the server's log and its volume (full, read-only); until a save succeeds a \
         restart loses what was written since the last good one, and with \
         stop-writes-on-bgsave-error (the default) the server refuses writes",
        None,
    )
}

fn noeviction_full(s: &Subject) -> Verdict {
    let (Some(max), Some(used), Some(policy)) = (
        s.cur.setting("maxmemory"),
        s.cur.num("used_memory"),
        s.cur.config.get("maxmemory-policy"),
    ) else {
        return Verdict::Unknown;
    };
    if max == 0 || policy != "noeviction" {
        return Verdict::Clear;
    }
    let share = used / max as f64;
    let ooms = match (s.base, error_count(s.cur, "OOM")) {
        (Some(b), Some(now)) => (now - error_count(b, "OOM").unwrap_or(0.0)).max(0.0),
        (None, Some(now)) => now,
        _ => 0.0,
    };
    if share < s.t.memory_full && ooms == 0.0 {
        return Verdict::Clear;
    }
    let mut evidence = format!(
        "{} used of maxmemory {} ({:.0}%) with maxmemory-policy noeviction",
        bytes(used as u64),
        bytes(max),
        share * 100.0
    );
    if ooms > 0.0 {
        evidence.push_str(&format!("; {ooms:.0} writes refused with OOM"));
    }
    fires(
        "noeviction-full",
        Severity::Critical,
        evidence,
        "writes fail with OOM once it is full: give it more memory (the memory autopilot, \
         spec.autopilot, grows it in place), or, if the data is a cache, an eviction policy \
         such as allkeys-lru",
        None,
    )
}

fn rejected_connections(s: &Subject) -> Verdict {
    let Some((n, secs)) = growth(s, "rejected_connections") else {
        return Verdict::Unknown;
    };
    if n < 1.0 {
        return Verdict::Clear;
    }
    let max = s.cur.setting("maxclients").unwrap_or(0);
    fires(
        "rejected-connections",
        Severity::Critical,
        format!(
            "{n:.0} connections refused in the last {} (maxclients {max})",
            span(secs)
        ),
        "clients are turned away: raise maxclients, or find the client that opens \
         connections without closing them (CLIENT LIST)",
        (max > 0).then(|| ("maxclients", (max * 2).to_string())),
    )
}

fn clients_near_max(s: &Subject) -> Verdict {
    let (Some(n), Some(max)) = (s.cur.num("connected_clients"), s.cur.setting("maxclients")) else {
        return Verdict::Unknown;
    };
    if max == 0 {
        return Verdict::Clear;
    }
    let share = n / max as f64;
    let severity = if share >= s.t.clients_critical {
        Severity::Critical
    } else if share >= s.t.clients_warning {
        Severity::Warning
    } else {
        return Verdict::Clear;
    };
    fires(
        "clients-near-max",
        severity,
        format!(
            "{n:.0} clients connected of maxclients {max} ({:.0}%)",
            share * 100.0
        ),
        "new connections will be refused soon: raise maxclients, or find the client that \
         leaks connections (CLIENT LIST)",
        Some(("maxclients", (max * 2).to_string())),
    )
}

/// Slow log entries inside the window, grouped by command: (count, slowest µs).
fn slow_by_command(s: &Subject, pick: impl Fn(&str, u64) -> bool) -> BTreeMap<String, (u64, u64)> {
    let since = s.cur.at - s.t.window_secs;
    let mut by: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for e in s.cur.slowlog.iter().filter(|e| e.at >= since) {
        if pick(&e.command, e.micros) {
            let g = by.entry(e.command.clone()).or_default();
            g.0 += 1;
            g.1 = g.1.max(e.micros);
        }
    }
    by
}

fn slowlog_off(s: &Subject) -> bool {
    s.cur
        .config
        .get("slowlog-log-slower-than")
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|v| v < 0)
}

fn dangerous_commands(s: &Subject) -> Verdict {
    if slowlog_off(s) {
        return Verdict::Unknown;
    }
    let by = slow_by_command(s, |c, _| DANGEROUS.iter().any(|(d, _)| *d == c));
    if by.is_empty() {
        return Verdict::Clear;
    }
    let evidence = by
        .iter()
        .map(|(c, (n, max))| format!("{c} in the slow log {n} times (slowest {} ms)", max / 1000))
        .collect::<Vec<_>>()
        .join(", ");
    let advice = by
        .keys()
        .filter_map(|c| DANGEROUS.iter().find(|(d, _)| d == c))
        .map(|(c, instead)| format!("use {instead} instead of {c}"))
        .collect::<Vec<_>>()
        .join("; ");
    fires(
        "dangerous-commands",
        Severity::Warning,
        format!("{evidence} in the last {}", span(s.t.window_secs)),
        format!("{advice}: each call blocks every other client while it runs"),
        None,
    )
}

fn slow_commands(s: &Subject) -> Verdict {
    if slowlog_off(s) {
        return Verdict::Unknown;
    }
    let floor = s.t.slow_ms * 1000;
    let by = slow_by_command(s, |c, us| {
        us >= floor && !DANGEROUS.iter().any(|(d, _)| *d == c)
    });
    if by.is_empty() {
        return Verdict::Clear;
    }
    let total: u64 = by.values().map(|(n, _)| n).sum();
    let list = by
        .iter()
        .map(|(c, (n, max))| format!("{c} ×{n} (slowest {} ms)", max / 1000))
        .collect::<Vec<_>>()
        .join(", ");
    fires(
        "slow-commands",
        Severity::Warning,
        format!(
            "{total} commands ran {} ms or longer in the last {}: {list}",
            s.t.slow_ms,
            span(s.t.window_secs)
        ),
        "a command that runs long blocks every client: split long scripts and large writes \
         into smaller steps",
        None,
    )
}

fn latency_spikes(s: &Subject) -> Verdict {
    let Some(threshold) = s.cur.setting("latency-monitor-threshold") else {
        return Verdict::Unknown;
    };
    if threshold == 0 && s.cur.latency.is_empty() {
        // The monitor is off: `latency-monitor-off` says so.
        return Verdict::Unknown;
    }
    let since = s.cur.at - s.t.window_secs;
    let events: Vec<_> = s
        .cur
        .latency
        .iter()
        .filter(|e| e.at >= since && e.latest_ms.max(e.max_ms) >= s.t.latency_ms)
        .collect();
    if events.is_empty() {
        return Verdict::Clear;
    }
    let evidence = events
        .iter()
        .map(|e| {
            format!(
                "{} {} ms ({} s ago, worst {} ms)",
                e.event,
                e.latest_ms,
                (s.cur.at - e.at).max(0),
                e.max_ms
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut advice: Vec<&str> = Vec::new();
    for e in &events {
        let a = match e.event.as_str() {
            "command" | "fast-command" => "commands: see the slow log (SLOWLOG GET)",
            "fork" => "fork: snapshots of a large dataset stall the server (see slow-fork)",
            "expire-cycle" => "expire-cycle: many keys expire at once; spread their TTLs",
            ev if ev.starts_with("eviction") => {
                "eviction: evicting takes long at maxmemory; give it more memory"
            }
            ev if ev.starts_with("aof") => "aof: the disk is slow; use faster storage",
            ev if ev.starts_with("active-defrag") => "active-defrag: lower active-defrag-cycle-max",
            _ => "see LATENCY DOCTOR",
        };
        if !advice.contains(&a) {
            advice.push(a);
        }
    }
    fires(
        "latency-spikes",
        Severity::Warning,
        format!("latency monitor: {evidence}"),
        advice.join("; "),
        None,
    )
}

fn latency_monitor_off(s: &Subject) -> Verdict {
    match s.cur.setting("latency-monitor-threshold") {
        None => Verdict::Unknown,
        Some(0) => fires(
            "latency-monitor-off",
            Severity::Info,
            "latency-monitor-threshold is 0: the server records no latency spikes".into(),
            format!(
                "turn the latency monitor on (it costs nothing measurable) so spikes can be \
                 found: latency-monitor-threshold {}",
                s.t.monitor_ms
            ),
            Some(("latency-monitor-threshold", s.t.monitor_ms.to_string())),
        ),
        Some(_) => Verdict::Clear,
    }
}

fn slow_fork(s: &Subject) -> Verdict {
    let Some(us) = s.cur.num("latest_fork_usec") else {
        return Verdict::Unknown;
    };
    if us < (s.t.fork_ms * 1000) as f64 {
        return Verdict::Clear;
    }
    let used = s.cur.num("used_memory").unwrap_or(0.0) as u64;
    fires(
        "slow-fork",
        Severity::Warning,
        format!(
            "the last fork (for a snapshot or an AOF rewrite) took {:.0} ms at {} used; \
             the server answers nothing while it forks",
            us / 1000.0,
            bytes(used)
        ),
        "fork less or fork less memory: fewer snapshots on the primary (save \"\" there, \
         persistence on replicas), a smaller dataset per instance (Cluster mode shards), and \
         transparent huge pages off on the node",
        None,
    )
}

fn fragmentation(s: &Subject) -> Verdict {
    let (Some(ratio), Some(used)) = (
        s.cur.num("mem_fragmentation_ratio"),
        s.cur.num("used_memory"),
    ) else {
        return Verdict::Unknown;
    };
    if ratio < s.t.fragmentation || (used as u64) < s.t.fragmentation_min_bytes {
        return Verdict::Clear;
    }
    let rss = s.cur.num("used_memory_rss").unwrap_or(used * ratio);
    let evidence = format!(
        "fragmentation {ratio:.2}: {} resident for {} used",
        bytes(rss as u64),
        bytes(used as u64)
    );
    let jemalloc = s
        .cur
        .info
        .fields
        .get("mem_allocator")
        .is_some_and(|a| a.starts_with("jemalloc"));
    let defrag_on = s.cur.config.get("activedefrag").map(String::as_str) == Some("yes");
    if !jemalloc {
        return fires(
            "fragmentation",
            Severity::Warning,
            evidence,
            "this build's allocator cannot defragment live: a restart (spec.restartAt; the \
             operator switches the primary over first) gives the memory back",
            None,
        );
    }
    if defrag_on {
        return fires(
            "fragmentation",
            Severity::Info,
            evidence,
            "active defragmentation is on and working on it",
            None,
        );
    }
    fires(
        "fragmentation",
        Severity::Warning,
        evidence,
        "turn active defragmentation on (it can be set live): activedefrag yes; a server \
         built with the system's jemalloc (some distribution packages) refuses it, and there a \
         restart (spec.restartAt) gives the memory back",
        Some(("activedefrag", "yes".into())),
    )
}

fn low_hit_ratio(s: &Subject) -> Verdict {
    let (Some((hits, secs)), Some((misses, _)), Some((evicted, _))) = (
        growth(s, "keyspace_hits"),
        growth(s, "keyspace_misses"),
        growth(s, "evicted_keys"),
    ) else {
        return Verdict::Unknown;
    };
    let lookups = hits + misses;
    if lookups < s.t.hit_min_lookups as f64 {
        return Verdict::Unknown;
    }
    let ratio = hits / lookups;
    if ratio >= s.t.hit_ratio || evicted < 1.0 {
        return Verdict::Clear;
    }
    let policy = s
        .cur
        .config
        .get("maxmemory-policy")
        .cloned()
        .unwrap_or_default();
    fires(
        "low-hit-ratio",
        Severity::Warning,
        format!(
            "hit ratio {:.0}% over the last {} ({lookups:.0} lookups) while {evicted:.0} keys \
             were evicted ({policy} at maxmemory {})",
            ratio * 100.0,
            span(secs),
            bytes(s.cur.setting("maxmemory").unwrap_or(0))
        ),
        "the cache is too small for what is read: give it more memory (the memory autopilot, \
         spec.autopilot, grows it in place)",
        None,
    )
}

fn volatile_without_ttl(s: &Subject) -> Verdict {
    let (Some(policy), Some(max)) = (
        s.cur.config.get("maxmemory-policy"),
        s.cur.setting("maxmemory"),
    ) else {
        return Verdict::Unknown;
    };
    if !policy.starts_with("volatile-") || max == 0 {
        return Verdict::Clear;
    }
    let keys = s.cur.info.total_keys();
    let expires: u64 = s.cur.info.keyspace.iter().map(|d| d.expires).sum();
    if keys < 100 || expires * 100 >= keys {
        return Verdict::Clear;
    }
    fires(
        "volatile-without-ttl",
        Severity::Warning,
        format!(
            "maxmemory-policy {policy}, but {expires} of {keys} keys have a TTL: at maxmemory \
             almost nothing can be evicted"
        ),
        "writes will fail with OOM as with noeviction: give the keys TTLs, or evict from all \
         keys (maxmemory-policy allkeys-lru)",
        Some(("maxmemory-policy", "allkeys-lru".into())),
    )
}

fn full_resyncs(s: &Subject) -> Verdict {
    if s.cur.info.fields.get("role").map(String::as_str) != Some("master") {
        return Verdict::Clear;
    }
    let (Some((full, secs)), Some((refused, _)), Some((written, _))) = (
        growth(s, "sync_full"),
        growth(s, "sync_partial_err"),
        growth(s, "master_repl_offset"),
    ) else {
        return Verdict::Unknown;
    };
    if full < s.t.full_syncs as f64 || refused < 1.0 {
        return Verdict::Clear;
    }
    let backlog = s.cur.setting("repl-backlog-size").unwrap_or(1024 * 1024);
    let rate = written / secs.max(1) as f64;
    // Room for a minute of writes, and at least four times the present size.
    const MIB: u64 = 1024 * 1024;
    let wanted = ((rate * 60.0) as u64).max(backlog * 4).div_ceil(MIB) * MIB;
    let holds = if rate > 0.0 {
        format!(", which holds {:.0} s of writes", backlog as f64 / rate)
    } else {
        String::new()
    };
    let evidence = format!(
        "{full:.0} full resynchronisations in the last {} ({refused:.0} partial ones \
         refused); backlog {}{holds}",
        span(secs),
        bytes(backlog)
    );
    // The backlog lives outside maxmemory: it may take at most what the
    // container's memory limit leaves beside the data (see `backlog_cap`).
    let cap = backlog_cap(s);
    let want = cap.map_or(wanted, |c| wanted.min(c));
    if want <= backlog {
        return fires(
            "full-resyncs",
            Severity::Warning,
            evidence,
            format!(
                "a replica that reconnects copies the whole dataset when the backlog no longer \
                 holds what it missed; a larger backlog ({}) does not fit: the memory limit \
                 {} leaves no more room beside the data. Raise the memory limit \
                 (spec.resources) or lower maxmemory",
                bytes(wanted),
                bytes(s.cur.memory_limit.unwrap_or(0)),
            ),
            None,
        );
    }
    let capped = if want < wanted {
        format!(
            "; capped from {} by the memory limit {} (half of what it leaves beside \
             maxmemory {} and the server's own memory)",
            bytes(wanted),
            bytes(s.cur.memory_limit.unwrap_or(0)),
            bytes(s.cur.setting("maxmemory").unwrap_or(0)),
        )
    } else {
        String::new()
    };
    fires(
        "full-resyncs",
        Severity::Warning,
        evidence,
        format!(
            "a replica that reconnects copies the whole dataset when the backlog no longer \
             holds what it missed: repl-backlog-size {want} ({}){capped}",
            bytes(want)
        ),
        Some(("repl-backlog-size", want.to_string())),
    )
}

/// The largest replication backlog the container's memory limit allows,
/// whole MiB: half of what the limit leaves beside the larger of
/// `maxmemory` and the memory in use (the other half for client buffers
/// and a fork's copied pages). `None` when the limit is not known.
fn backlog_cap(s: &Subject) -> Option<u64> {
    const MIB: u64 = 1024 * 1024;
    let limit = s.cur.memory_limit?;
    // The backlog in use is inside `used_memory`: it is room for the new one.
    let backlog = s.cur.setting("repl-backlog-size").unwrap_or(0);
    let used = (s.cur.num("used_memory").unwrap_or(0.0) as u64).saturating_sub(backlog);
    let data = s.cur.setting("maxmemory").unwrap_or(0).max(used);
    let room = limit.saturating_sub(data);
    Some(room / 2 / MIB * MIB)
}

fn big_keys(s: &Subject) -> Verdict {
    if s.cur.keys_sized == 0 && s.cur.big_keys.is_empty() {
        return Verdict::Unknown;
    }
    let mut big: Vec<_> = s
        .cur
        .big_keys
        .iter()
        .filter(|k| k.bytes >= s.t.big_key_bytes)
        .collect();
    if big.is_empty() {
        return Verdict::Clear;
    }
    big.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.key.cmp(&b.key)));
    let shown = big
        .iter()
        .take(3)
        .map(|k| format!("`{}` {}", k.key, bytes(k.bytes)))
        .collect::<Vec<_>>()
        .join(", ");
    let lazy = s
        .cur
        .config
        .get("lazyfree-lazy-user-del")
        .map(String::as_str)
        == Some("yes");
    fires(
        "big-keys",
        Severity::Warning,
        format!(
            "{} key(s) of {} or more: {shown}",
            big.len(),
            bytes(s.t.big_key_bytes)
        ),
        if lazy {
            "reading or deleting a big key blocks the server: split it into smaller keys"
        } else {
            "deleting a big key with DEL blocks the server: delete with UNLINK, or let DEL \
             free it in the background (lazyfree-lazy-user-del yes); better, split it"
        },
        (!lazy).then(|| ("lazyfree-lazy-user-del", "yes".into())),
    )
}

fn output_buffers(s: &Subject) -> Verdict {
    let Some(n) = s.cur.num("client_recent_max_output_buffer") else {
        return Verdict::Unknown;
    };
    if n < s.t.output_buffer_bytes as f64 {
        return Verdict::Clear;
    }
    fires(
        "output-buffers",
        Severity::Warning,
        format!(
            "a client's output buffer reached {} recently",
            bytes(n as u64)
        ),
        "a client reads slower than the server answers it (a Pub/Sub subscriber, MONITOR, or \
         large replies): find it with CLIENT LIST (omem) and bound such clients with \
         client-output-buffer-limit",
        None,
    )
}

#[cfg(test)]
mod tests;
