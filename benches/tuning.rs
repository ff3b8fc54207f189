//! `make bench-tuning`: what tuning advice costs the operator and the servers.
//!
//! - T1: the operator's cost of its looks at 1, 100 and 1,000 servers
//!   (`BENCH_SERVERS`, the largest tier). Every server is a Redis 7.0
//!   holding `BENCH_KEYS` small keys and gets the look the operator gives
//!   each Redis's sampler (a replica, or a quiet primary): the sample and a
//!   step of key sampling, then the rules — the operator's own
//!   `controller::redis::tuning::look` and `advice::evaluate`, at most 32
//!   at once (the operator's default `MAX_CONCURRENT_RECONCILES`). Each tier
//!   runs full rounds over its servers; a round is what one tuning interval
//!   (60 s by default) asks of the operator. CPU is this process's user +
//!   system time over the rounds (it does nothing else meanwhile);
//!   commands and bytes are the servers' own `INFO stats` counters, reset
//!   before the tier and read after it (less the reset and the read).
//! - T2: key sampling's effect on a loaded replica's latency: a primary and
//!   a replica holding 100,000 keys and 20 hashes of 50,000 fields; 4
//!   connections read random keys from the replica, each one `GET` a
//!   millisecond; windows of `BENCH_WINDOW_SECS` without looks, with the
//!   operator's look (key sampling included) every second — 60 times the
//!   default interval — and without again. Client-side latency p50, p99,
//!   p99.9 and max per window, and how long each look took.
//!
//! Knobs: BENCH_SERVERS (1000), BENCH_KEYS (2000), BENCH_WINDOW_SECS (30).
//! Needs `bin/engines/redis-7.0` (`make engines`); no cluster.

mod common;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use common::{knob, percentile};
use futures::{StreamExt, stream};
use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::controller::redis::tuning::{KEYS_PER_SWEEP, look};
use redpilot::redis::advice::{Subject, Thresholds, evaluate};
use redpilot::redis::info::Info;
use redpilot::redis::tuning::{KeyScan, Sample};
use redpilot::redis::{ConnectOptions, Endpoint, Node};

/// Looks the operator runs at once by default (one per reconcile).
const AT_ONCE: usize = 32;

/// This process's user + system CPU seconds (/proc/self/stat, 10 ms ticks).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state is 0, utime 11, stime 12.
    (ticks(11) + ticks(12)) / 100.0
}

fn fresh_scan() -> KeyScan {
    KeyScan {
        cursor: 0,
        count: KEYS_PER_SWEEP,
        min_bytes: Thresholds::default().big_key_bytes,
        known: Vec::new(),
    }
}

async fn node(e: &Endpoint) -> Node {
    Node::connect(e, &ConnectOptions::default())
        .await
        .expect("connecting to a bench server")
}

/// Fills `e` with `keys` 64-byte strings (pipelines of 1,000).
async fn fill(e: &Endpoint, keys: u64, prefix: &str) {
    let mut n = node(e).await;
    let value = "v".repeat(64);
    let mut i = 0;
    while i < keys {
        let mut p = redis::pipe();
        for k in i..(i + 1000).min(keys) {
            p.cmd("SET")
                .arg(format!("{prefix}{k}"))
                .arg(&value)
                .ignore();
        }
        n.pipeline::<()>("SET", &p).await.expect("filling");
        i += 1000;
    }
}

/// One server as the operator keeps it between looks.
struct Looked {
    endpoint: Endpoint,
    scan: Option<KeyScan>,
    base: Option<Sample>,
    primary: bool,
}

/// One look at `s` and the rules over it: the look's wall time and the
/// keys it sized.
async fn look_at(s: &mut Looked) -> (Duration, u64) {
    let t = Thresholds::default();
    let start = Instant::now();
    let l = look(
        "bench".into(),
        s.endpoint.clone(),
        ConnectOptions::default(),
        s.scan.take().or_else(|| Some(fresh_scan())),
        s.primary,
    )
    .await;
    s.scan = l.scan;
    let cur = l.sample.expect("a bench server answers its look");
    let verdicts = evaluate(&Subject {
        cur: &cur,
        base: s.base.as_ref(),
        t: &t,
    });
    assert_eq!(verdicts.len(), redpilot::redis::advice::RULES.len());
    let sized = cur.keys_sized;
    if s.base.is_none() {
        s.base = Some(cur);
    }
    (start.elapsed(), sized)
}

struct Counters {
    commands: f64,
    bytes_in: f64,
    bytes_out: f64,
}

async fn read_counters(servers: &[Looked]) -> Counters {
    let mut c = Counters {
        commands: 0.0,
        bytes_in: 0.0,
        bytes_out: 0.0,
    };
    for s in servers {
        let text: String = node(&s.endpoint)
            .await
            .query("INFO", redis::cmd("INFO").arg("stats"))
            .await
            .expect("INFO stats");
        let info = Info::parse(&text);
        let n = |k: &str| {
            info.fields
                .get(k)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // Less the reset (one command, "+OK\r\n" out) and this read's
        // request (`*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n`, 25 bytes in).
        c.commands += n("total_commands_processed") - 1.0;
        c.bytes_in += n("total_net_input_bytes") - 25.0;
        c.bytes_out += n("total_net_output_bytes") - 5.0;
    }
    c
}

async fn reset_counters(servers: &[Looked]) {
    for s in servers {
        let _: () = node(&s.endpoint)
            .await
            .query("CONFIG", redis::cmd("CONFIG").arg("RESETSTAT"))
            .await
            .expect("CONFIG RESETSTAT");
    }
}

async fn t1(largest: usize, keys: u64) {
    println!("T1: starting {largest} Redis 7.0 servers with {keys} keys each");
    let started = Instant::now();
    let servers: Vec<RedisServer> = (0..largest)
        .map(|_| RedisServer::start(Engine::Redis70, ServerConfig::default()))
        .collect();
    let mut looked: Vec<Looked> = servers
        .iter()
        .map(|s| Looked {
            endpoint: s.endpoint(),
            scan: None,
            base: None,
            // The look a Redis's sampler gets (a replica, or a quiet
            // primary): key sampling every time, even when back-to-back
            // rounds make the server busy.
            primary: false,
        })
        .collect();
    stream::iter(looked.iter().map(|l| fill(&l.endpoint, keys, "k:")))
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    println!(
        "T1: {largest} servers up and filled in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut rows: Vec<(usize, f64, f64, f64, f64, f64)> = Vec::new();
    for tier in [1usize, 100, 1000, largest] {
        if tier > largest || rows.iter().any(|(t, ..)| *t == tier) {
            continue;
        }
        let rounds = (200 / tier).clamp(2, 200);
        let set = &mut looked[..tier];
        // One round first so every server has a baseline and a cursor, as
        // in an operator that has been running.
        stream::iter(set.iter_mut().map(look_at))
            .buffer_unordered(AT_ONCE)
            .collect::<Vec<_>>()
            .await;
        reset_counters(set).await;
        let cpu0 = own_cpu();
        let mut walls = Vec::new();
        let mut round_secs = Vec::new();
        let mut sized = 0u64;
        for _ in 0..rounds {
            let r0 = Instant::now();
            let w: Vec<(Duration, u64)> = stream::iter(set.iter_mut().map(look_at))
                .buffer_unordered(AT_ONCE)
                .collect()
                .await;
            round_secs.push(r0.elapsed().as_secs_f64() * 1000.0);
            sized += w.iter().map(|(_, k)| k).sum::<u64>();
            walls.extend(w.into_iter().map(|(d, _)| d.as_secs_f64() * 1000.0));
        }
        let cpu = own_cpu() - cpu0;
        let c = read_counters(set).await;
        let looks = (tier * rounds) as f64;
        let (p50, p99) = (percentile(&mut walls, 50.0), percentile(&mut walls, 99.0));
        let round = percentile(&mut round_secs, 50.0);
        println!(
            "T1 {tier}: {rounds} rounds, {looks} looks: CPU {:.2} ms/look, {:.1} commands/look, \
             {:.0} B sent / {:.0} B read per look, {:.0} keys sized per look; \
             look wall p50 {p50:.1} ms p99 {p99:.1} ms; a round over {tier} servers {round:.0} ms",
            cpu * 1000.0 / looks,
            c.commands / looks,
            c.bytes_in / looks,
            c.bytes_out / looks,
            sized as f64 / looks,
        );
        rows.push((
            tier,
            cpu * 1000.0 / looks,
            c.commands / looks,
            c.bytes_in / looks,
            c.bytes_out / looks,
            round,
        ));
    }
    println!();
    println!(
        "| servers | operator CPU per server per minute | commands | bytes sent | bytes read | one round (all servers) |"
    );
    println!("|---|---|---|---|---|---|");
    for (tier, cpu, cmds, bin, bout, round) in rows {
        println!("| {tier} | {cpu:.2} ms | {cmds:.1} | {bin:.0} B | {bout:.0} B | {round:.0} ms |");
    }
    println!();
    drop(servers);
}

/// Reads random keys from `e` on one connection, one `GET` every
/// millisecond, until `stop`; each reply's latency in ms.
async fn reader(e: Endpoint, keys: u64, stop: Instant, seed: u64) -> Vec<f64> {
    let mut n = node(&e).await;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lat = Vec::new();
    let mut x = seed | 1;
    while Instant::now() < stop {
        tick.tick().await;
        // xorshift: a key spread over the keyspace.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("k:{}", x % keys);
        let t0 = Instant::now();
        let _: Option<String> = n
            .query("GET", redis::cmd("GET").arg(key))
            .await
            .expect("GET on the replica");
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    lat
}

async fn window(replica: &Endpoint, keys: u64, secs: u64, looks: bool, name: &str) {
    let stop = Instant::now() + Duration::from_secs(secs);
    let readers: Vec<_> = (0..4u64)
        .map(|i| tokio::spawn(reader(replica.clone(), keys, stop, 0x9e37_79b9 + i)))
        .collect();
    let mut look_ms = Vec::new();
    let mut keys_sized = 0;
    if looks {
        let mut s = Looked {
            endpoint: replica.clone(),
            scan: None,
            base: None,
            primary: false,
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while Instant::now() < stop {
            tick.tick().await;
            let (took, sized) = look_at(&mut s).await;
            look_ms.push(took.as_secs_f64() * 1000.0);
            keys_sized += sized;
        }
    }
    let mut lat = Vec::new();
    for r in readers {
        lat.extend(r.await.expect("reader task"));
    }
    let n = lat.len();
    let (p50, p99, p999) = (
        percentile(&mut lat, 50.0),
        percentile(&mut lat, 99.0),
        percentile(&mut lat, 99.9),
    );
    let max = lat.last().copied().unwrap_or(f64::NAN);
    let looks_note = if look_ms.is_empty() {
        "no looks".to_string()
    } else {
        format!(
            "{} looks sizing {keys_sized} keys, each p50 {:.1} ms max {:.1} ms",
            look_ms.len(),
            percentile(&mut look_ms, 50.0),
            look_ms.last().copied().unwrap_or(f64::NAN)
        )
    };
    println!(
        "| {name} | {n} | {p50:.3} ms | {p99:.3} ms | {p999:.3} ms | {max:.2} ms | {looks_note} |"
    );
}

async fn t2(secs: u64) {
    let keys = 100_000;
    let servers = RedisServer::start_group(Engine::Redis70, 2, ServerConfig::default());
    let (primary, replica) = (servers[0].endpoint(), servers[1].endpoint());
    fill(&primary, keys, "k:").await;
    let mut p = node(&primary).await;
    for h in 0..20 {
        for chunk in 0..50 {
            let mut pipe = redis::pipe();
            let cmd = pipe.cmd("HSET").arg(format!("h:{h}"));
            for f in 0..1000 {
                cmd.arg(format!("f{}", chunk * 1000 + f)).arg("some value");
            }
            p.pipeline::<()>("HSET", pipe.ignore())
                .await
                .expect("filling a hash");
        }
    }
    // The replica has it all once its offset reaches the primary's.
    let want = p.replication().await.expect("INFO replication");
    let mut r = node(&replica).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let have = r.replication().await.expect("INFO replication");
        if have.applied_offset() >= want.applied_offset() {
            break;
        }
        assert!(Instant::now() < deadline, "the replica did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "T2: replica of {keys} keys and 20 hashes of 50,000 fields; 4 readers, one GET a ms each"
    );
    println!("| window | GETs | p50 | p99 | p99.9 | max | looks |");
    println!("|---|---|---|---|---|---|---|");
    window(&replica, keys, secs, false, "no looks").await;
    window(&replica, keys, secs, true, "a look a second").await;
    window(&replica, keys, secs, false, "no looks again").await;
}

#[tokio::main]
async fn main() {
    let largest = knob("BENCH_SERVERS", 1000) as usize;
    let keys = knob("BENCH_KEYS", 2000);
    let secs = knob("BENCH_WINDOW_SECS", 30);
    t1(largest.max(1), keys).await;
    t2(secs).await;
}
