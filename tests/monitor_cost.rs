//! What failure detection costs the operator per Redis, and that it stays
//! flat as the number of Redis grows: the primary monitor is pointed at
//! real servers (one local server standing in for many primaries, each
//! target its own connection) with few and with many targets, and the
//! server counts connections and commands while the process counts its
//! CPU time. `REDPILOT_MONITOR_TARGETS` sets the larger count (default
//! 300; `make bench-failover` uses 1,000). Both at the full rate and at
//! the calm one (every replica hears from the primary). Also the last look the failover
//! module takes at a primary before replacing it for silence.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::api::v1alpha1::Redis;
use redpilot::controller::monitor::{Monitor, Target, Verdict, answers_as_primary};
use redpilot::redis::{ConnectOptions, Node};

/// CPU time of this process: the sum over its threads of the time each
/// ran on a CPU (/proc/self/task/*/schedstat, in nanoseconds; the clock
/// ticks of /proc/self/stat are 10 ms, too coarse for 30 primaries over
/// a few seconds). The threads of this test live through a measurement.
fn cpu_time() -> Duration {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("task").path().join("schedstat");
        // A thread that ended meanwhile has no file left.
        if let Ok(text) = std::fs::read_to_string(path) {
            ns += text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(ns)
}

async fn stats(node: &mut Node) -> (u64, u64) {
    let info: String = node
        .query("INFO", redis::cmd("INFO").arg("all"))
        .await
        .expect("INFO");
    let get = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{k} in INFO"))
    };
    (get("connected_clients"), get("total_commands_processed"))
}

struct Cost {
    targets: usize,
    connections: u64,
    probes_per_s: f64,
    cpu_ms_per_s: f64,
}

/// `n` targets, calm or not (a calm one expects `replicas` online), measured
/// over `window`.
async fn measure(
    server: &RedisServer,
    n: usize,
    (calm, replicas): (bool, usize),
    window: Duration,
) -> Cost {
    let opts = ConnectOptions::default().with_password("pw");
    let mut admin = Node::connect(&server.endpoint(), &opts)
        .await
        .expect("connect");
    // Connections of an earlier round are gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&mut admin).await.0 > 1 {
        assert!(Instant::now() < deadline, "earlier probes still connected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (monitor, _triggers) = Monitor::new();
    let refs: Vec<ObjectRef<Redis>> = (0..n)
        .map(|i| ObjectRef::new(&format!("redis-{i}")).within("cost"))
        .collect();
    for r in &refs {
        monitor.watch(
            r,
            Target {
                pod: "primary".into(),
                ip: "127.0.0.1".into(),
                port: server.port(),
                silence: Duration::from_secs(5),
                password: "pw".into(),
                authenticate: true,
                tls: None,
                follows_source: false,
                calm,
                replicas,
            },
        );
    }
    // Every probe connected and answered.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&mut admin).await.0 < n as u64 + 1 {
        assert!(Instant::now() < deadline, "{n} probes did not all connect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (clients, c0) = stats(&mut admin).await;
    let (cpu0, t0) = (cpu_time(), Instant::now());
    tokio::time::sleep(window).await;
    let (_, c1) = stats(&mut admin).await;
    let (cpu1, secs) = (cpu_time(), t0.elapsed().as_secs_f64());
    for r in &refs {
        let h = monitor.health(r).expect("watched");
        assert_eq!(h.verdict, Verdict::Healthy, "{r}");
    }
    drop(monitor);
    // The admin connection's own INFO is one command per measurement; a
    // replica's acknowledgement (`REPLCONF ACK`) one a second.
    let acks = if replicas > 0 { window.as_secs() } else { 0 };
    let probes = (c1 - c0).saturating_sub(1 + acks) as f64;
    Cost {
        targets: n,
        connections: clients - 1,
        probes_per_s: probes / secs / n as f64,
        cpu_ms_per_s: (cpu1 - cpu0).as_secs_f64() * 1000.0 / secs / n as f64,
    }
}

/// Prints what `c` measured of the `what` watched, and checks one
/// connection per primary and a probe rate per primary within `rate`.
fn check(c: &Cost, what: &str, rate: std::ops::RangeInclusive<f64>) {
    println!(
        "{:>5} {what} watched: {} connections ({:.2} per primary), {:.3} probes/s per \
         primary, {:.4} ms CPU per second per primary ({:.3} ms per minute)",
        c.targets,
        c.connections,
        c.connections as f64 / c.targets as f64,
        c.probes_per_s,
        c.cpu_ms_per_s,
        c.cpu_ms_per_s * 60.0
    );
    assert_eq!(
        c.connections, c.targets as u64,
        "one connection per primary"
    );
    assert!(
        rate.contains(&c.probes_per_s),
        "{:.3} probes/s per primary ({what}), expected {rate:?}",
        c.probes_per_s
    );
}

/// The larger count of primaries (`REDPILOT_MONITOR_TARGETS`, 300).
fn many_targets() -> usize {
    std::env::var("REDPILOT_MONITOR_TARGETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// The server standing in for every primary: room for a connection each.
fn server_config() -> ServerConfig {
    ServerConfig::default()
        .password("pw")
        .with("maxclients", "4000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detection_costs_one_connection_and_two_pings_a_second_per_redis() {
    let many = many_targets();
    let server = RedisServer::start(Engine::Redis70, server_config());
    let mut costs = Vec::new();
    for n in [30, many] {
        let c = measure(&server, n, (false, 0), Duration::from_secs(5)).await;
        check(&c, "primaries", 1.6..=2.2);
        costs.push(c);
    }
    let (few, lots) = (&costs[0], &costs[1]);
    assert!(
        (lots.probes_per_s - few.probes_per_s).abs() < 0.2,
        "probe rate per primary is flat: {:.2} vs {:.2}",
        few.probes_per_s,
        lots.probes_per_s
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calm_primaries_are_probed_every_five_seconds() {
    // Primaries whose replicas all report a live link (`Target::calm`):
    // one probe per `CALM_INTERVAL`, all on the same ticks, each an
    // `INFO replication` that must name the one replica online (here a
    // real one: the server stands in for every primary).
    let many = many_targets();
    let group = RedisServer::start_group(Engine::Redis70, 2, server_config());
    let server = &group[0];
    for n in [30, many] {
        // Three calm ticks.
        let c = measure(server, n, (true, 1), Duration::from_secs(15)).await;
        check(&c, "calm primaries", 0.13..=0.27);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_look_tells_a_paused_primary_from_a_running_one() {
    let mut group =
        RedisServer::start_group(Engine::Redis70, 2, ServerConfig::default().password("pw"));
    let opts = group[0].connect_options();
    let within = Duration::from_secs(1);
    assert!(answers_as_primary(&group[0].endpoint(), &opts, within).await);
    // A replica answers, but not as a primary.
    assert!(!answers_as_primary(&group[1].endpoint(), &opts, within).await);
    // Stopped: no answer, and the look gives up within its bound.
    let pid = group[0].pid().expect("running");
    redis_server::signal(pid, "-STOP");
    let t = Instant::now();
    let seen = answers_as_primary(&group[0].endpoint(), &opts, within).await;
    let took = t.elapsed();
    redis_server::signal(pid, "-CONT");
    assert!(!seen, "a stopped server does not answer");
    assert!(took < Duration::from_millis(1500), "the look took {took:?}");
    // Running again: it answers at once.
    let t = Instant::now();
    assert!(answers_as_primary(&group[0].endpoint(), &opts, within).await);
    println!(
        "last look: gave up on a stopped server after {:.0} ms, a resumed one answered in {:.0} ms",
        took.as_secs_f64() * 1000.0,
        t.elapsed().as_secs_f64() * 1000.0
    );
    // Gone: nothing listens.
    group[0].kill9();
    assert!(!answers_as_primary(&group[0].endpoint(), &opts, within).await);
}
