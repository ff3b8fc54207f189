use super::*;
use crate::redis::info::Info;
use crate::redis::tuning::{KeySize, LatencyEvent, SlowEntry};

const NOW: i64 = 1_800_000_000;
const MIB: u64 = 1024 * 1024;

/// A sample from `INFO` lines and settings, taken at [`NOW`].
fn sample(info: &str, settings: &[(&str, &str)]) -> Sample {
    let mut text = String::from("uptime_in_seconds:10000\nrdb_last_bgsave_status:ok\n");
    text.push_str(info);
    Sample {
        at: NOW,
        info: Info::parse(&text),
        config: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Sample::default()
    }
}

fn verdict(rule: &str, cur: &Sample, base: Option<&Sample>) -> Verdict {
    let t = Thresholds::default();
    evaluate(&Subject { cur, base, t: &t })
        .into_iter()
        .find(|(r, _)| *r == rule)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no rule {rule}"))
}

fn fired(rule: &str, cur: &Sample, base: Option<&Sample>) -> Advice {
    match verdict(rule, cur, base) {
        Verdict::Fires(a) => a,
        other => panic!("{rule} did not fire: {other:?}"),
    }
}

#[test]
fn every_rule_answers_once_in_order() {
    let s = sample("", &[]);
    let t = Thresholds::default();
    let names: Vec<&str> = evaluate(&Subject {
        cur: &s,
        base: None,
        t: &t,
    })
    .into_iter()
    .map(|(r, _)| r)
    .collect();
    assert_eq!(names, RULES);
    assert!(RULES.len() >= 12);
}

#[test]
fn a_healthy_server_has_no_finding() {
    let base = sample(
        "role:master\nconnected_clients:5\nkeyspace_hits:100\nkeyspace_misses:10\nevicted_keys:0\n\
         rejected_connections:0\nsync_full:1\nsync_partial_err:0\nmaster_repl_offset:1000\n\
         used_memory:1048576\nused_memory_rss:2097152\nmem_fragmentation_ratio:2.0\n\
         latest_fork_usec:300\nclient_recent_max_output_buffer:0\n",
        &[],
    );
    let cur = sample(
        "role:master\nconnected_clients:6\nkeyspace_hits:5000\nkeyspace_misses:100\nevicted_keys:0\n\
         rejected_connections:0\nsync_full:1\nsync_partial_err:0\nmaster_repl_offset:90000\n\
         used_memory:1048576\nused_memory_rss:2097152\nmem_fragmentation_ratio:2.0\n\
         latest_fork_usec:300\nclient_recent_max_output_buffer:0\ndb0:keys=10,expires=0,avg_ttl=0\n",
        &[
            ("maxmemory", "0"),
            ("maxmemory-policy", "noeviction"),
            ("maxclients", "10000"),
            ("latency-monitor-threshold", "100"),
            ("slowlog-log-slower-than", "10000"),
            ("activedefrag", "no"),
            ("repl-backlog-size", "1048576"),
            ("lazyfree-lazy-user-del", "no"),
        ],
    );
    let mut cur = cur;
    cur.keys_sized = 10;
    let t = Thresholds::default();
    for (rule, v) in evaluate(&Subject {
        cur: &cur,
        base: Some(&base),
        t: &t,
    }) {
        assert_eq!(v, Verdict::Clear, "{rule}");
    }
}

#[test]
fn rules_over_a_window_wait_for_a_baseline() {
    let cur = sample(
        "role:master\nrejected_connections:5\nkeyspace_hits:1\nkeyspace_misses:5000\n\
         evicted_keys:10\nsync_full:9\nsync_partial_err:9\nmaster_repl_offset:10\n",
        &[("maxclients", "10")],
    );
    for rule in ["rejected-connections", "low-hit-ratio", "full-resyncs"] {
        assert_eq!(verdict(rule, &cur, None), Verdict::Unknown, "{rule}");
    }
}

#[test]
fn persistence_failing() {
    let ok = sample("aof_last_write_status:ok\n", &[]);
    assert_eq!(verdict("persistence-failing", &ok, None), Verdict::Clear);
    let bad = sample("rdb_last_bgsave_status:err\n", &[]);
    let a = fired("persistence-failing", &bad, None);
    assert_eq!(a.severity, Severity::Critical);
    assert!(a.evidence.contains("RDB snapshot"), "{}", a.evidence);
}

#[test]
fn noeviction_full() {
    let settings = [
        ("maxmemory", "104857600"),
        ("maxmemory-policy", "noeviction"),
    ];
    let half = sample("used_memory:52428800\n", &settings);
    assert_eq!(verdict("noeviction-full", &half, None), Verdict::Clear);
    let full = sample("used_memory:99614720\n", &settings);
    let a = fired("noeviction-full", &full, None);
    assert_eq!(a.severity, Severity::Critical);
    assert!(a.evidence.contains("95%"), "{}", a.evidence);
    // Refused writes fire it below the line too.
    let base = sample("used_memory:52428800\nerrorstat_OOM:count=2\n", &settings);
    let refused = sample("used_memory:52428800\nerrorstat_OOM:count=9\n", &settings);
    let a = fired("noeviction-full", &refused, Some(&base));
    assert!(a.evidence.contains("7 writes refused"), "{}", a.evidence);
    // Any other policy evicts instead.
    let lru = sample(
        "used_memory:99614720\n",
        &[
            ("maxmemory", "104857600"),
            ("maxmemory-policy", "allkeys-lru"),
        ],
    );
    assert_eq!(verdict("noeviction-full", &lru, None), Verdict::Clear);
}

#[test]
fn connections_refused_and_near_the_limit() {
    let settings = [("maxclients", "100")];
    let base = sample("rejected_connections:3\nconnected_clients:10\n", &settings);
    let same = sample("rejected_connections:3\nconnected_clients:50\n", &settings);
    assert_eq!(
        verdict("rejected-connections", &same, Some(&base)),
        Verdict::Clear
    );
    assert_eq!(
        verdict("clients-near-max", &same, Some(&base)),
        Verdict::Clear
    );
    let more = sample("rejected_connections:7\nconnected_clients:85\n", &settings);
    let a = fired("rejected-connections", &more, Some(&base));
    assert!(
        a.evidence.starts_with("4 connections refused"),
        "{}",
        a.evidence
    );
    assert_eq!(a.config, Some(("maxclients", "200".into())));
    assert_eq!(
        fired("clients-near-max", &more, None).severity,
        Severity::Warning
    );
    let full = sample("connected_clients:99\n", &settings);
    assert_eq!(
        fired("clients-near-max", &full, None).severity,
        Severity::Critical
    );
}

#[test]
fn a_restart_counts_from_zero() {
    let settings = [("maxclients", "100")];
    let base = sample("rejected_connections:30\n", &settings);
    let mut cur = sample("rejected_connections:2\n", &settings);
    cur.info
        .fields
        .insert("uptime_in_seconds".into(), "50".into());
    let a = fired("rejected-connections", &cur, Some(&base));
    assert!(
        a.evidence
            .starts_with("2 connections refused in the last 50 s"),
        "{}",
        a.evidence
    );
}

fn slow(command: &str, ms: u64, ago: i64) -> SlowEntry {
    SlowEntry {
        id: 0,
        at: NOW - ago,
        micros: ms * 1000,
        command: command.into(),
    }
}

#[test]
fn commands_in_the_slow_log() {
    let mut s = sample("", &[("slowlog-log-slower-than", "10000")]);
    s.slowlog = vec![
        slow("KEYS", 180, 60),
        slow("KEYS", 20, 120),
        slow("EVAL", 230, 30),
        slow("GET", 12, 30),
        // Outside the hour: not counted.
        slow("SMEMBERS", 500, 7200),
    ];
    let a = fired("dangerous-commands", &s, None);
    assert!(
        a.evidence
            .contains("KEYS in the slow log 2 times (slowest 180 ms)"),
        "{}",
        a.evidence
    );
    assert!(!a.evidence.contains("SMEMBERS"), "{}", a.evidence);
    assert!(
        a.advice.contains("use SCAN instead of KEYS"),
        "{}",
        a.advice
    );
    let b = fired("slow-commands", &s, None);
    assert!(
        b.evidence.starts_with("1 commands ran 50 ms or longer"),
        "{}",
        b.evidence
    );
    assert!(
        b.evidence.contains("EVAL ×1 (slowest 230 ms)"),
        "{}",
        b.evidence
    );
    s.slowlog = vec![slow("GET", 12, 30)];
    assert_eq!(verdict("dangerous-commands", &s, None), Verdict::Clear);
    assert_eq!(verdict("slow-commands", &s, None), Verdict::Clear);
    // A slow log turned off says nothing either way.
    let off = sample("", &[("slowlog-log-slower-than", "-1")]);
    assert_eq!(verdict("dangerous-commands", &off, None), Verdict::Unknown);
}

#[test]
fn the_latency_monitor() {
    let off = sample("", &[("latency-monitor-threshold", "0")]);
    let a = fired("latency-monitor-off", &off, None);
    assert_eq!(a.severity, Severity::Info);
    assert_eq!(a.config, Some(("latency-monitor-threshold", "100".into())));
    assert_eq!(verdict("latency-spikes", &off, None), Verdict::Unknown);
    let mut on = sample("", &[("latency-monitor-threshold", "100")]);
    assert_eq!(verdict("latency-monitor-off", &on, None), Verdict::Clear);
    assert_eq!(verdict("latency-spikes", &on, None), Verdict::Clear);
    on.latency = vec![
        LatencyEvent {
            event: "command".into(),
            at: NOW - 40,
            latest_ms: 250,
            max_ms: 900,
        },
        LatencyEvent {
            event: "expire-cycle".into(),
            at: NOW - 9000,
            latest_ms: 300,
            max_ms: 300,
        },
    ];
    let a = fired("latency-spikes", &on, None);
    assert!(
        a.evidence
            .contains("command 250 ms (40 s ago, worst 900 ms)"),
        "{}",
        a.evidence
    );
    assert!(!a.evidence.contains("expire-cycle"), "{}", a.evidence);
    assert!(a.advice.contains("slow log"), "{}", a.advice);
}

#[test]
fn slow_forks() {
    let quick = sample("latest_fork_usec:4000\nused_memory:1073741824\n", &[]);
    assert_eq!(verdict("slow-fork", &quick, None), Verdict::Clear);
    let slow = sample("latest_fork_usec:900000\nused_memory:6442450944\n", &[]);
    let a = fired("slow-fork", &slow, None);
    assert!(
        a.evidence.contains("took 900 ms at 6.0 GiB used"),
        "{}",
        a.evidence
    );
}

#[test]
fn fragmentation_by_allocator_and_setting() {
    let frag = "mem_fragmentation_ratio:2.40\nused_memory:1288490188\nused_memory_rss:3092376453\n";
    let je = format!("{frag}mem_allocator:jemalloc-5.3.0\n");
    let a = fired(
        "fragmentation",
        &sample(&je, &[("activedefrag", "no")]),
        None,
    );
    assert_eq!(a.severity, Severity::Warning);
    assert_eq!(a.config, Some(("activedefrag", "yes".into())));
    assert!(
        a.evidence
            .starts_with("fragmentation 2.40: 2.9 GiB resident for 1.2 GiB used"),
        "{}",
        a.evidence
    );
    let on = fired(
        "fragmentation",
        &sample(&je, &[("activedefrag", "yes")]),
        None,
    );
    assert_eq!((on.severity, on.config), (Severity::Info, None));
    let libc = format!("{frag}mem_allocator:libc\n");
    let c = fired("fragmentation", &sample(&libc, &[]), None);
    assert!(c.advice.contains("restart"), "{}", c.advice);
    // A small dataset's ratio means nothing.
    let small = sample(
        "mem_fragmentation_ratio:6.0\nused_memory:1048576\nmem_allocator:jemalloc-5.3.0\n",
        &[("activedefrag", "no")],
    );
    assert_eq!(verdict("fragmentation", &small, None), Verdict::Clear);
}

#[test]
fn hit_ratio_counts_only_with_evictions() {
    let settings = [
        ("maxmemory", "104857600"),
        ("maxmemory-policy", "allkeys-lru"),
    ];
    let base = sample(
        "keyspace_hits:0\nkeyspace_misses:0\nevicted_keys:0\n",
        &settings,
    );
    let mut cur = sample(
        "keyspace_hits:4100\nkeyspace_misses:5900\nevicted_keys:3000\n",
        &settings,
    );
    cur.info
        .fields
        .insert("uptime_in_seconds".into(), "13120".into());
    let a = fired("low-hit-ratio", &cur, Some(&base));
    assert!(
        a.evidence
            .starts_with("hit ratio 41% over the last 52 min (10000 lookups) while 3000 keys"),
        "{}",
        a.evidence
    );
    let no_evictions = sample(
        "keyspace_hits:4100\nkeyspace_misses:5900\nevicted_keys:0\n",
        &settings,
    );
    assert_eq!(
        verdict("low-hit-ratio", &no_evictions, Some(&base)),
        Verdict::Clear
    );
    let few = sample(
        "keyspace_hits:1\nkeyspace_misses:90\nevicted_keys:5\n",
        &settings,
    );
    assert_eq!(
        verdict("low-hit-ratio", &few, Some(&base)),
        Verdict::Unknown
    );
}

#[test]
fn volatile_policy_with_keys_that_never_expire() {
    let settings = [
        ("maxmemory", "104857600"),
        ("maxmemory-policy", "volatile-lru"),
    ];
    let none = sample("db0:keys=52000,expires=0,avg_ttl=0\n", &settings);
    let a = fired("volatile-without-ttl", &none, None);
    assert!(a.evidence.contains("0 of 52000 keys"), "{}", a.evidence);
    let some = sample("db0:keys=52000,expires=20000,avg_ttl=100\n", &settings);
    assert_eq!(verdict("volatile-without-ttl", &some, None), Verdict::Clear);
}

#[test]
fn full_resyncs_size_the_backlog_from_the_write_rate() {
    let settings = [("repl-backlog-size", "1048576")];
    let base = sample(
        "role:master\nsync_full:1\nsync_partial_err:0\nmaster_repl_offset:0\n",
        &settings,
    );
    let mut cur = sample(
        "role:master\nsync_full:4\nsync_partial_err:3\nmaster_repl_offset:360000000\n",
        &settings,
    );
    cur.info
        .fields
        .insert("uptime_in_seconds".into(), "13600".into());
    let a = fired("full-resyncs", &cur, Some(&base));
    // 360 MB in an hour: 100,000 B/s; a minute of it is 6 MB, four times
    // the backlog (4 MiB) is less: 6 MiB.
    assert_eq!(a.config, Some(("repl-backlog-size", (6 * MIB).to_string())));
    assert!(
        a.evidence
            .starts_with("3 full resynchronisations in the last 60 min"),
        "{}",
        a.evidence
    );
    assert!(
        a.evidence.contains("holds 10 s of writes"),
        "{}",
        a.evidence
    );
    let replica = sample("role:slave\nsync_full:0\n", &settings);
    assert_eq!(
        verdict("full-resyncs", &replica, Some(&base)),
        Verdict::Clear
    );
}

#[test]
fn full_resyncs_never_size_the_backlog_past_the_memory_limit() {
    // 3.6 GB written in an hour: 1 MB/s, a minute of it 60 MB.
    let settings = [("repl-backlog-size", "1048576"), ("maxmemory", "200000000")];
    let base = sample(
        "role:master\nsync_full:1\nsync_partial_err:0\nmaster_repl_offset:0\n",
        &settings,
    );
    let mut cur = sample(
        "role:master\nsync_full:4\nsync_partial_err:3\nmaster_repl_offset:3600000000\nused_memory:150000000\n",
        &settings,
    );
    cur.info
        .fields
        .insert("uptime_in_seconds".into(), "13600".into());
    // No limit known: a minute of writes.
    let a = fired("full-resyncs", &cur, Some(&base));
    assert_eq!(
        a.config,
        Some(("repl-backlog-size", (58 * MIB).to_string()))
    );
    // A 256 MiB limit beside maxmemory 200 MB leaves 68.4 MB; half of it,
    // whole MiB: 32 MiB.
    cur.memory_limit = Some(256 * MIB);
    let a = fired("full-resyncs", &cur, Some(&base));
    assert_eq!(
        a.config,
        Some(("repl-backlog-size", (32 * MIB).to_string()))
    );
    assert!(
        a.advice
            .contains("capped from 58 MiB by the memory limit 256 MiB"),
        "{}",
        a.advice
    );
    // A limit that leaves no room for more than the present backlog:
    // nothing to set, and the advice says why.
    cur.memory_limit = Some(200_000_000 + 2 * MIB);
    let a = fired("full-resyncs", &cur, Some(&base));
    assert_eq!(a.config, None);
    assert!(a.advice.contains("does not fit"), "{}", a.advice);
}

#[test]
fn big_keys_from_the_sample() {
    let mut s = sample("", &[("lazyfree-lazy-user-del", "no")]);
    assert_eq!(verdict("big-keys", &s, None), Verdict::Unknown);
    s.keys_sized = 200;
    assert_eq!(verdict("big-keys", &s, None), Verdict::Clear);
    s.big_keys = vec![
        KeySize {
            key: "session:index".into(),
            bytes: 340 * MIB,
        },
        KeySize {
            key: "small".into(),
            bytes: MIB,
        },
    ];
    let a = fired("big-keys", &s, None);
    assert_eq!(
        a.evidence,
        "1 key(s) of 16 MiB or more: `session:index` 340 MiB"
    );
    assert_eq!(a.config, Some(("lazyfree-lazy-user-del", "yes".into())));
}

#[test]
fn output_buffers() {
    let small = sample("client_recent_max_output_buffer:20504\n", &[]);
    assert_eq!(verdict("output-buffers", &small, None), Verdict::Clear);
    let large = sample("client_recent_max_output_buffer:41943040\n", &[]);
    assert!(
        fired("output-buffers", &large, None)
            .evidence
            .contains("40 MiB")
    );
}

#[test]
fn byte_sizes_read_well() {
    assert_eq!(bytes(900), "900 B");
    assert_eq!(bytes(512 * 1024), "512 KiB");
    assert_eq!(bytes(1288490188), "1.2 GiB");
    assert_eq!(bytes(340 * MIB), "340 MiB");
}
