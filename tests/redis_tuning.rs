//! Tuning advice from real servers: each rule of `redpilot::redis::advice`
//! fired by a workload that produces it (slow and walking commands, a
//! latency spike, a fragmenting workload, evictions, a full server, idle
//! clients, a replica forced into full resyncs, a big hash, a slow
//! subscriber, a failed snapshot), then cleared by the fix.
//!
//! Where a production threshold needs more than a test can spend (a 500 ms
//! fork, 64 MiB of fragmented data), the test lowers that threshold and
//! says so; the numbers the rule reads are the server's own.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::redis::Node;
use redpilot::redis::advice::{self, Advice, Severity, Subject, Thresholds, Verdict};
use redpilot::redis::tuning::{self, KeyScan, Sample};

const MIB: u64 = 1024 * 1024;

async fn node(s: &RedisServer) -> Node {
    Node::connect(&s.endpoint(), &s.connect_options())
        .await
        .expect("connect")
}

async fn cmd<T: redis::FromRedisValue>(n: &mut Node, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    n.query_within("TEST", &c, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

async fn look(n: &mut Node) -> Sample {
    tuning::sample(n).await.expect("sample")
}

fn verdicts(cur: &Sample, base: Option<&Sample>, t: &Thresholds) -> Vec<(&'static str, Verdict)> {
    advice::evaluate(&Subject { cur, base, t })
}

fn verdict(cur: &Sample, base: Option<&Sample>, t: &Thresholds, rule: &str) -> Verdict {
    verdicts(cur, base, t)
        .into_iter()
        .find(|(r, _)| *r == rule)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no rule {rule}"))
}

fn fired(cur: &Sample, base: Option<&Sample>, t: &Thresholds, rule: &str) -> Advice {
    match verdict(cur, base, t, rule) {
        Verdict::Fires(a) => {
            println!("{rule}: {} | {}", a.evidence, a.advice);
            a
        }
        other => panic!("{rule} did not fire: {other:?}"),
    }
}

fn clear(cur: &Sample, base: Option<&Sample>, t: &Thresholds, rule: &str) {
    assert_eq!(verdict(cur, base, t, rule), Verdict::Clear, "{rule}");
}

/// Writes `n` string keys `prefix:<i>` of `size` bytes, in pipelines.
async fn fill(node: &mut Node, prefix: &str, n: usize, size: usize) {
    let value = "x".repeat(size);
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("SET")
                .arg(format!("{prefix}:{i}"))
                .arg(&value)
                .ignore();
        }
        let _: () = node.pipeline("SET", &p).await.expect("fill");
    }
}

#[tokio::test]
async fn every_engine_answers_a_look_and_a_quiet_server_has_nothing_to_fix() {
    let t = Thresholds::default();
    for engine in Engine::ALL {
        let s = RedisServer::start(engine, ServerConfig::default());
        let mut n = node(&s).await;
        fill(&mut n, "k", 2000, 100).await;
        let base = look(&mut n).await;
        fill(&mut n, "j", 500, 100).await;
        // The fill is this test's own load, not the server's: on a busy
        // machine one of its pipelined SETs can be descheduled past the
        // slow-command bar (68 ms was seen in CI), so its log is dropped.
        let _: () = cmd(&mut n, &["SLOWLOG", "RESET"]).await;
        let mut cur = look(&mut n).await;
        let mut scan = KeyScan {
            cursor: 0,
            count: 200,
            min_bytes: t.big_key_bytes,
            known: Vec::new(),
        };
        tuning::sample_keys(&mut n, &mut scan, &mut cur)
            .await
            .expect("sample keys");
        assert!(cur.keys_sized >= 100, "{engine:?}: {}", cur.keys_sized);
        // What one look costs the server: commands and bytes, from its own
        // counters read on a second connection around a look.
        let mut m = node(&s).await;
        let counters = |i: &redpilot::redis::info::Info| {
            let f = |k: &str| -> u64 {
                i.fields
                    .get(k)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_default()
            };
            (
                f("total_commands_processed"),
                f("total_net_output_bytes"),
                f("total_net_input_bytes"),
            )
        };
        // Ten looks between two readings, so the reading's own reply is a
        // tenth of an error.
        let before = counters(&m.info_section("stats").await.expect("info"));
        for _ in 0..10 {
            let _ = look(&mut n).await;
        }
        let after = counters(&m.info_section("stats").await.expect("info"));
        println!(
            "{engine:?}: one look = {:.1} commands, {:.0} bytes out, {:.0} bytes in",
            (after.0 - before.0 - 1) as f64 / 10.0,
            (after.1 - before.1) as f64 / 10.0,
            (after.2 - before.2) as f64 / 10.0
        );
        assert!(cur.at > 1_700_000_000, "{engine:?}: {}", cur.at);
        for name in tuning::SETTINGS {
            if *name == "lazyfree-lazy-user-del" && engine == Engine::Redis62 {
                continue;
            }
            assert!(cur.config.contains_key(*name), "{engine:?}: {name}");
        }
        for (rule, v) in verdicts(&cur, Some(&base), &t) {
            match (rule, v) {
                // The monitor is off by default: the one finding.
                ("latency-monitor-off", Verdict::Fires(a)) => {
                    assert_eq!(a.severity, Severity::Info)
                }
                // Fewer lookups than the rule weighs; no spikes recorded
                // with the monitor off.
                ("low-hit-ratio" | "latency-spikes", Verdict::Unknown) => {}
                (rule, v) => assert_eq!(v, Verdict::Clear, "{engine:?} {rule}"),
            }
        }
    }
}

#[tokio::test]
async fn walking_and_slow_commands_and_a_latency_spike() {
    let t = Thresholds::default();
    let s = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default()
            .with("slowlog-log-slower-than", "1000")
            .with("latency-monitor-threshold", "50"),
    );
    let mut n = node(&s).await;
    fill(&mut n, "k", 200_000, 10).await;
    // The fill can itself log a slow command or a latency event on a busy
    // machine (a 136 ms spike was seen in CI); the test starts from empty
    // logs.
    let _: () = cmd(&mut n, &["SLOWLOG", "RESET"]).await;
    let _: i64 = cmd(&mut n, &["LATENCY", "RESET"]).await;
    let before = look(&mut n).await;
    for rule in ["dangerous-commands", "slow-commands", "latency-spikes"] {
        clear(&before, None, &t, rule);
    }
    // KEYS walks 200,000 keys; a script holds the server 150 ms.
    let keys: Vec<String> = cmd(&mut n, &["KEYS", "*"]).await;
    assert_eq!(keys.len(), 200_000);
    let script = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
                  repeat local u = redis.call('TIME') until u[1] * 1000000 + u[2] - s > 150000 \
                  return 1";
    let _: i64 = cmd(&mut n, &["EVAL", script, "0"]).await;
    let after = look(&mut n).await;
    let a = fired(&after, None, &t, "dangerous-commands");
    assert!(
        a.evidence.starts_with("KEYS in the slow log 1 times"),
        "{}",
        a.evidence
    );
    assert!(
        a.advice.contains("use SCAN instead of KEYS"),
        "{}",
        a.advice
    );
    let b = fired(&after, None, &t, "slow-commands");
    assert!(b.evidence.contains("EVAL ×1"), "{}", b.evidence);
    let c = fired(&after, None, &t, "latency-spikes");
    assert!(c.evidence.contains("command "), "{}", c.evidence);
    // Nothing in the logs any more: clear.
    let _: () = cmd(&mut n, &["SLOWLOG", "RESET"]).await;
    let _: i64 = cmd(&mut n, &["LATENCY", "RESET"]).await;
    let fixed = look(&mut n).await;
    for rule in ["dangerous-commands", "slow-commands", "latency-spikes"] {
        clear(&fixed, None, &t, rule);
    }
}

#[tokio::test]
async fn the_latency_monitor_off_then_on() {
    let t = Thresholds::default();
    let s = RedisServer::start(Engine::Redis70, ServerConfig::default());
    let mut n = node(&s).await;
    let a = fired(&look(&mut n).await, None, &t, "latency-monitor-off");
    let (key, value) = a.config.expect("a setting to change");
    let _: () = cmd(&mut n, &["CONFIG", "SET", key, &value]).await;
    clear(&look(&mut n).await, None, &t, "latency-monitor-off");
}

#[tokio::test]
async fn fragmentation_after_most_keys_are_deleted() {
    // 64 MiB of live data is the production floor; this workload leaves
    // about 20 MiB live in 200 MiB resident.
    let t = Thresholds {
        fragmentation_min_bytes: 8 * MIB,
        ..Thresholds::default()
    };
    let s = RedisServer::start(Engine::Redis70, ServerConfig::default());
    let mut n = node(&s).await;
    fill(&mut n, "k", 400_000, 300).await;
    clear(&look(&mut n).await, None, &t, "fragmentation");
    // Keep every tenth key: the pages they sit on stay resident.
    for chunk in (0..400_000)
        .filter(|i| i % 10 != 0)
        .collect::<Vec<_>>()
        .chunks(5000)
    {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("DEL").arg(format!("k:{i}")).ignore();
        }
        let _: () = n.pipeline("DEL", &p).await.expect("delete");
    }
    // INFO's ratio is refreshed by the server's cron.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cur = look(&mut n).await;
    let a = fired(&cur, None, &t, "fragmentation");
    assert!(a.severity >= Severity::Info);
    // The fix this server supports: defragmentation where its jemalloc has
    // it, else a restart (the rule says which).
    let set: Result<(), _> = n
        .query(
            "CONFIG",
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("activedefrag")
                .arg("yes"),
        )
        .await;
    match (&a.config, set) {
        (Some(("activedefrag", v)), Ok(())) => {
            assert_eq!(v, "yes");
            println!("activedefrag turned on live");
        }
        (cfg, set) => {
            println!(
                "activedefrag not supported here ({set:?}); advice: {cfg:?} {}",
                a.advice
            );
        }
    }
    // A restart gives the memory back whatever the allocator (this
    // server keeps no snapshot: it comes back empty and is filled again).
    drop(n);
    let mut s = s;
    s.restart();
    let mut n = node(&s).await;
    fill(&mut n, "k", 150_000, 300).await;
    clear(&look(&mut n).await, None, &t, "fragmentation");
}

/// Reads every tenth of the 50,000 keys `fill` wrote as `k:<i>`.
async fn read_every_tenth(n: &mut Node) {
    let mut p = redis::pipe();
    for i in (0..50_000).step_by(10) {
        p.cmd("GET").arg(format!("k:{i}")).ignore();
    }
    let _: () = n.pipeline("GET", &p).await.expect("read");
}

#[tokio::test]
async fn a_cache_too_small_misses_while_it_evicts() {
    let t = Thresholds::default();
    let s = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default()
            .with("maxmemory", "4mb")
            .with("maxmemory-policy", "allkeys-lru"),
    );
    let mut n = node(&s).await;
    let base = look(&mut n).await;
    fill(&mut n, "k", 50_000, 200).await;
    read_every_tenth(&mut n).await;
    let cur = look(&mut n).await;
    let a = fired(&cur, Some(&base), &t, "low-hit-ratio");
    assert!(a.evidence.contains("keys were evicted"), "{}", a.evidence);
    // Room for the data: every read hits.
    let _: () = cmd(&mut n, &["CONFIG", "SET", "maxmemory", "200mb"]).await;
    fill(&mut n, "k", 50_000, 200).await;
    let base = look(&mut n).await;
    read_every_tenth(&mut n).await;
    clear(&look(&mut n).await, Some(&base), &t, "low-hit-ratio");
}

#[tokio::test]
async fn a_full_server_that_cannot_evict_refuses_writes() {
    let t = Thresholds::default();
    let s = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default()
            .with("maxmemory", "4mb")
            .with("maxmemory-policy", "noeviction"),
    );
    let mut n = node(&s).await;
    let base = look(&mut n).await;
    clear(&base, None, &t, "noeviction-full");
    let mut refused = 0;
    for i in 0..100_000 {
        let r: Result<(), _> = n
            .query(
                "SET",
                redis::cmd("SET").arg(format!("k:{i}")).arg("x".repeat(200)),
            )
            .await;
        if r.is_err() {
            refused += 1;
            if refused == 5 {
                break;
            }
        }
    }
    assert_eq!(refused, 5, "the server never refused a write");
    let a = fired(&look(&mut n).await, Some(&base), &t, "noeviction-full");
    assert_eq!(a.severity, Severity::Critical);
    assert!(
        a.evidence.contains("5 writes refused with OOM"),
        "{}",
        a.evidence
    );
    let _: () = cmd(&mut n, &["CONFIG", "SET", "maxmemory", "100mb"]).await;
    let base = look(&mut n).await;
    clear(&look(&mut n).await, Some(&base), &t, "noeviction-full");
}

#[tokio::test]
async fn a_volatile_policy_over_keys_without_ttl() {
    let t = Thresholds::default();
    let s = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default()
            .with("maxmemory", "100mb")
            .with("maxmemory-policy", "volatile-lru"),
    );
    let mut n = node(&s).await;
    fill(&mut n, "k", 1000, 10).await;
    let a = fired(&look(&mut n).await, None, &t, "volatile-without-ttl");
    let (key, value) = a.config.expect("a policy to change to");
    let _: () = cmd(&mut n, &["CONFIG", "SET", key, &value]).await;
    clear(&look(&mut n).await, None, &t, "volatile-without-ttl");
}

#[tokio::test]
async fn clients_pile_up_and_are_refused() {
    let t = Thresholds::default();
    let s = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default().with("maxclients", "20"),
    );
    let mut n = node(&s).await;
    let base = look(&mut n).await;
    clear(&base, None, &t, "clients-near-max");
    // Idle clients: 17 and this one make 18 of 20.
    let mut idle: Vec<TcpStream> = (0..17)
        .map(|_| TcpStream::connect(("127.0.0.1", s.port())).expect("connect"))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let a = fired(&look(&mut n).await, Some(&base), &t, "clients-near-max");
    assert_eq!(a.severity, Severity::Warning);
    clear(&look(&mut n).await, Some(&base), &t, "rejected-connections");
    // Five more: two get in, three are turned away.
    for _ in 0..5 {
        let mut c = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
        let _ = c.write_all(b"PING\r\n");
        idle.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cur = look(&mut n).await;
    let b = fired(&cur, Some(&base), &t, "rejected-connections");
    assert!(
        b.evidence.starts_with("3 connections refused"),
        "{}",
        b.evidence
    );
    assert_eq!(
        fired(&cur, Some(&base), &t, "clients-near-max").severity,
        Severity::Critical
    );
    let (key, value) = b.config.expect("maxclients to raise");
    let _: () = cmd(&mut n, &["CONFIG", "SET", key, &value]).await;
    drop(idle);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = look(&mut n).await;
    let cur = look(&mut n).await;
    clear(&cur, Some(&base), &t, "clients-near-max");
    clear(&cur, Some(&base), &t, "rejected-connections");
}

/// The primary drops its replica's link and takes `bytes` of writes before
/// the replica reconnects (it tries again once a second, asking for a
/// partial resync from where it was); returns when the link is up again.
async fn away_and_back(primary: &mut Node, replica: &RedisServer, bytes: usize) {
    let syncs =
        |s: &Sample| s.num("sync_full").unwrap_or(0.0) + s.num("sync_partial_ok").unwrap_or(0.0);
    let before = syncs(&look(primary).await);
    // The cut and the writes in one transaction: the replica cannot come
    // back halfway through them, so how it resyncs depends only on whether
    // the backlog holds what it missed.
    let value = "x".repeat(1000);
    let mut p = redis::pipe();
    p.atomic();
    p.cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .ignore();
    for i in 0..bytes / 1000 {
        p.cmd("SET").arg(format!("w:{i}")).arg(&value).ignore();
    }
    let _: () = primary.pipeline("TEST", &p).await.expect("cut and write");
    let deadline = Instant::now() + Duration::from_secs(20);
    while syncs(&look(primary).await) < before + 1.0 {
        assert!(Instant::now() < deadline, "the replica never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.wait_link_up(Duration::from_secs(20));
}

#[tokio::test]
async fn a_small_backlog_forces_full_resyncs() {
    let t = Thresholds::default();
    let servers = RedisServer::start_group(
        Engine::Redis70,
        2,
        ServerConfig::default().with("repl-backlog-size", "16kb"),
    );
    let mut n = node(&servers[0]).await;
    let base = look(&mut n).await;
    // Three outages, each missing 200 kB against a 16 kB backlog.
    for _ in 0..3 {
        away_and_back(&mut n, &servers[1], 200_000).await;
    }
    let cur = look(&mut n).await;
    let full = |s: &Sample| s.num("sync_full").unwrap_or(0.0);
    assert_eq!(full(&cur) - full(&base), 3.0, "full resyncs");
    let a = fired(&cur, Some(&base), &t, "full-resyncs");
    assert!(
        a.evidence.starts_with("3 full resynchronisations"),
        "{}",
        a.evidence
    );
    let (key, value) = a.config.expect("a backlog size");
    assert!(value.parse::<u64>().expect("bytes") >= 64 * 1024, "{value}");
    let _: () = cmd(&mut n, &["CONFIG", "SET", key, &value]).await;
    // With the backlog it advised, the same outages (200 kB missed each,
    // which the old 16 kB backlog could not hold) resync partially.
    let base = look(&mut n).await;
    for _ in 0..3 {
        away_and_back(&mut n, &servers[1], 200_000).await;
    }
    let cur = look(&mut n).await;
    let partial =
        cur.num("sync_partial_ok").unwrap_or(0.0) - base.num("sync_partial_ok").unwrap_or(0.0);
    assert_eq!(partial, 3.0, "partial resyncs");
    assert_eq!(
        cur.num("sync_full"),
        base.num("sync_full"),
        "full resyncs again"
    );
    clear(&cur, Some(&base), &t, "full-resyncs");
}

#[tokio::test]
async fn a_big_hash_is_found_by_sampling_and_forgotten_once_unlinked() {
    let t = Thresholds::default();
    let s = RedisServer::start(Engine::Redis70, ServerConfig::default());
    let mut n = node(&s).await;
    fill(&mut n, "small", 3000, 50).await;
    // 300,000 fields of 60 bytes: about 25 MiB.
    let script = "for i = ARGV[1], ARGV[2] do redis.call('HSET', KEYS[1], i, \
                  '012345678901234567890123456789012345678901234567890123456789') end return 1";
    for start in (0..300_000).step_by(50_000) {
        let (a, b) = (start.to_string(), (start + 49_999).to_string());
        let _: i64 = cmd(&mut n, &["EVAL", script, "1", "session:index", &a, &b]).await;
    }
    let mut scan = KeyScan {
        cursor: 0,
        count: 200,
        min_bytes: t.big_key_bytes,
        known: Vec::new(),
    };
    // One pass over the keyspace, 200 keys a look.
    let mut found = None;
    let mut looks = 0;
    while found.is_none() && looks < 40 {
        let mut cur = look(&mut n).await;
        tuning::sample_keys(&mut n, &mut scan, &mut cur)
            .await
            .expect("sample");
        looks += 1;
        if let Verdict::Fires(a) = verdict(&cur, None, &t, "big-keys") {
            found = Some(a);
        }
    }
    let a = found.expect("the big hash was never sampled");
    println!("big-keys after {looks} looks: {}", a.evidence);
    assert!(a.evidence.contains("`session:index`"), "{}", a.evidence);
    assert_eq!(a.config, Some(("lazyfree-lazy-user-del", "yes".into())));
    let start = Instant::now();
    let _: i64 = cmd(&mut n, &["UNLINK", "session:index"]).await;
    println!("UNLINK answered in {:?}", start.elapsed());
    // The next look that sizes any key says Clear (a look whose `SCAN`
    // page came back empty, as one did once after the UNLINK, sized none
    // and says Unknown).
    let mut tries = 0;
    let cur = loop {
        let mut cur = look(&mut n).await;
        tuning::sample_keys(&mut n, &mut scan, &mut cur)
            .await
            .expect("sample");
        assert!(scan.known.is_empty(), "{:?}", scan.known);
        tries += 1;
        if tries == 5 || verdict(&cur, None, &t, "big-keys") != Verdict::Unknown {
            break cur;
        }
    };
    clear(&cur, None, &t, "big-keys");
}

#[tokio::test]
async fn a_subscriber_that_does_not_read() {
    // 32 MiB is the production line; the pubsub hard limit (32 MiB) would
    // cut this client first, so the test draws it at 4 MiB.
    let t = Thresholds {
        output_buffer_bytes: 4 * MIB,
        ..Thresholds::default()
    };
    let s = RedisServer::start(Engine::Redis70, ServerConfig::default());
    let mut n = node(&s).await;
    clear(&look(&mut n).await, None, &t, "output-buffers");
    let mut sub = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
    sub.write_all(b"SUBSCRIBE news\r\n").expect("subscribe");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let message = "m".repeat(1024 * 1024);
    for _ in 0..8 {
        let _: i64 = cmd(&mut n, &["PUBLISH", "news", &message]).await;
    }
    // The server records each client's peak once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let a = fired(&look(&mut n).await, None, &t, "output-buffers");
    assert!(a.evidence.contains("MiB"), "{}", a.evidence);
    drop(sub);
    // "Recent" is the last few seconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if verdict(&look(&mut n).await, None, &t, "output-buffers") == Verdict::Clear {
            break;
        }
        assert!(Instant::now() < deadline, "the peak never went");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A look once the snapshot in progress ended.
async fn after_save(n: &mut Node) -> Sample {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = look(n).await;
        if s.num("rdb_bgsave_in_progress") == Some(0.0) {
            return s;
        }
        assert!(Instant::now() < deadline, "the snapshot never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_snapshot_that_fails_then_succeeds() {
    let t = Thresholds::default();
    let s = RedisServer::start(Engine::Redis70, ServerConfig::default());
    let mut n = node(&s).await;
    fill(&mut n, "k", 100, 10).await;
    clear(&look(&mut n).await, None, &t, "persistence-failing");
    // The snapshot cannot take its file's name: a directory has it.
    let names: Vec<String> = cmd(&mut n, &["CONFIG", "GET", "dbfilename"]).await;
    let blocked = s.dir().join(&names[1]);
    let _ = std::fs::remove_file(&blocked);
    std::fs::create_dir(&blocked).expect("mkdir");
    std::fs::write(blocked.join("keep"), b"x").expect("file");
    let _: String = cmd(&mut n, &["BGSAVE"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failed = after_save(&mut n).await;
    let a = fired(&failed, None, &t, "persistence-failing");
    assert_eq!(a.severity, Severity::Critical);
    std::fs::remove_dir_all(&blocked).expect("rm");
    let _: String = cmd(&mut n, &["BGSAVE"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    clear(&after_save(&mut n).await, None, &t, "persistence-failing");
    // The fork of that snapshot, read from the server: far below the
    // production line (500 ms), over a line of zero.
    let cur = look(&mut n).await;
    clear(&cur, None, &t, "slow-fork");
    let zero = Thresholds {
        fork_ms: 0,
        ..Thresholds::default()
    };
    let f = fired(&cur, None, &zero, "slow-fork");
    assert!(f.evidence.starts_with("the last fork"), "{}", f.evidence);
}
