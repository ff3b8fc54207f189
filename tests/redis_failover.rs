//! Failover after `kill -9` of the primary, and fencing of the returning
//! former primary, on every engine version.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis_server::{Engine, RedisServer, ServerConfig, median_max};
use redpilot::redis::actions::{
    Candidate, DetectionOptions, FenceOutcome, choose_candidate, detect_failure, failover, fence,
    make_primary, wait_caught_up,
};
use redpilot::redis::info::Role;
use redpilot::redis::topology::observe;
use redpilot::redis::{ConnectOptions, Endpoint, ErrorCategory, Node};

const RUNS: usize = 10;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn detection() -> DetectionOptions {
    DetectionOptions {
        interval: Duration::from_millis(100),
        misses: 3,
    }
}

async fn set(ep: &Endpoint, opts: &ConnectOptions, key: &str) -> redpilot::redis::Result<()> {
    let mut n = Node::connect(ep, opts).await?;
    let _: redis::Value = n.query("SET", redis::cmd("SET").arg(key).arg(1)).await?;
    Ok(())
}

/// Writes to the restarting former primary from before its process starts
/// until `stop` is set; every attempt must be refused (connection) or rejected
/// (`READONLY`, `LOADING`). Returns (attempts, refused, rejected).
async fn hammer_must_fail(
    ep: Endpoint,
    opts: ConnectOptions,
    stop: Arc<AtomicBool>,
) -> (u32, u32, u32) {
    let quick = opts.with_timeouts(Duration::from_millis(200), Duration::from_millis(200));
    let (mut attempts, mut refused, mut rejected) = (0, 0, 0);
    let mut node: Option<Node> = None;
    while !stop.load(Ordering::Relaxed) {
        attempts += 1;
        if node.is_none() {
            match Node::connect(&ep, &quick).await {
                Ok(n) => node = Some(n),
                Err(e) => {
                    assert!(
                        matches!(
                            e.category(),
                            ErrorCategory::Connection | ErrorCategory::Timeout
                        ) || e.server_code() == Some("LOADING"),
                        "unexpected connect error {e}"
                    );
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            }
        }
        if let Some(n) = node.as_mut() {
            match n
                .query::<redis::Value>("SET", redis::cmd("SET").arg("fenced").arg(attempts))
                .await
            {
                Ok(v) => panic!("the returning former primary {ep} accepted a write: {v:?}"),
                Err(e) if e.is_readonly() || e.server_code() == Some("LOADING") => rejected += 1,
                Err(e) => {
                    assert!(
                        matches!(
                            e.category(),
                            ErrorCategory::Connection | ErrorCategory::Timeout
                        ),
                        "unexpected write error {e}"
                    );
                    node = None;
                    refused += 1;
                }
            }
        }
    }
    (attempts, refused, rejected)
}

async fn failover_runs(engine: Engine) {
    let _serial = SERIAL.lock().await;
    let mut servers =
        RedisServer::start_group(engine, 3, ServerConfig::default().password("fo-pw"));
    let opts = servers[0].connect_options();
    let members: Vec<Endpoint> = servers.iter().map(|s| s.endpoint()).collect();
    let det = detection();
    let mut primary = 0usize;
    let mut kill_to_writable = Vec::new();
    let mut distinct_offsets = 0;
    let mut write_attempts_on_returning = 0;

    for run in 0..RUNS {
        let old = members[primary].clone();
        let replicas: Vec<usize> = (0..3).filter(|i| *i != primary).collect();
        let replica_eps: Vec<Endpoint> = replicas.iter().map(|i| members[*i].clone()).collect();

        // The detector runs continuously, as in the operator.
        let detector = {
            let (old, opts, det) = (old.clone(), opts.clone(), det.clone());
            tokio::spawn(async move { detect_failure(&old, &opts, &det).await })
        };
        tokio::time::sleep(Duration::from_millis(250)).await;

        // In two runs of three, one replica (alternating) is partitioned
        // from the primary before a burst of writes, so it falls behind; in
        // the third both are level and the address breaks the tie.
        if run % 3 != 2 {
            let laggard = &members[replicas[run % 2]];
            let nowhere = Endpoint::new("127.0.0.1", redis_server::free_port());
            let mut lag_node = Node::connect(laggard, &opts).await.unwrap();
            lag_node.replicaof(Some(&nowhere)).await.unwrap();
        }
        let client = redpilot::redis::redis_client(&old, &opts).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let mut p = redis::pipe();
        for i in 0..200 {
            p.cmd("SET").arg(format!("burst{run}:{i}")).arg(i).ignore();
        }
        let _: () = p.query_async(&mut c).await.unwrap();

        let killed_at = Instant::now();
        servers[primary].kill9();
        let detection = detector.await.unwrap();
        let detected_after = killed_at.elapsed();

        // Independent read of the candidates' offsets (not timed).
        let mut expected = Vec::new();
        for ep in &replica_eps {
            let r = Node::connect(ep, &opts)
                .await
                .unwrap()
                .replication()
                .await
                .unwrap();
            expected.push(Candidate {
                endpoint: ep.clone(),
                offset: r.replica_offset.unwrap(),
                priority: 100,
            });
        }
        if expected[0].offset != expected[1].offset {
            distinct_offsets += 1;
        }
        let want = choose_candidate(&expected).unwrap().endpoint.clone();

        let started = Instant::now();
        let report = failover(&old, &replica_eps, &opts).await.expect("failover");
        loop {
            if set(&report.new_primary, &opts, &format!("after{run}"))
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "new primary never writable"
            );
        }
        let writable = detected_after + started.elapsed();
        kill_to_writable.push(writable);
        assert_eq!(
            report.new_primary, want,
            "run {run}: offsets {expected:?}, report {report:?}"
        );
        assert!(report.repoint_failures.is_empty(), "{report:?}");
        assert!(
            detection.last_error.category() == ErrorCategory::Connection,
            "{}",
            detection.last_error
        );

        // The former primary returns, configured as a replica of the new one
        // (what the operator writes into every non-primary's config). From
        // before its process starts until it is synced, no write may succeed.
        let new_idx = members
            .iter()
            .position(|m| *m == report.new_primary)
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let hammer = tokio::spawn(hammer_must_fail(old.clone(), opts.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        servers[primary].config.replicaof = Some(report.new_primary.clone());
        servers[primary].respawn_nowait();
        servers[primary].await_ready();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let (attempts, refused, rejected) = hammer.await.unwrap();
        assert!(
            refused > 0 && rejected > 0,
            "hammer {attempts}/{refused}/{rejected}"
        );
        write_attempts_on_returning += attempts;
        assert_eq!(
            fence(&old, &report.new_primary, &opts).await.unwrap(),
            FenceOutcome::AlreadyFollowing
        );
        wait_caught_up(&old, &report.new_primary, &opts, Duration::from_secs(20))
            .await
            .expect("former primary resyncs");
        let t = observe(&members, &opts).await;
        assert!(t.is_healthy(), "run {run}: {:?}", t.anomalies);
        assert_eq!(t.primary.as_ref(), Some(&report.new_primary));
        primary = new_idx;
    }

    // A former primary that comes back *as a primary* (wrong config) is
    // demoted by fence(); from then on it rejects writes.
    let stray = members[(primary + 1) % 3].clone();
    make_primary(&stray, &opts, &[]).await.unwrap();
    assert_eq!(
        fence(&stray, &members[primary], &opts).await.unwrap(),
        FenceOutcome::Demoted
    );
    let err = set(&stray, &opts, "after-fence").await.expect_err("fenced");
    assert!(err.is_readonly(), "{err}");
    let r = Node::connect(&stray, &opts)
        .await
        .unwrap()
        .replication()
        .await
        .unwrap();
    assert_eq!(r.role, Some(Role::Replica));

    let (med, max) = median_max(&kill_to_writable);
    println!(
        "failover {}: {RUNS} runs (detection: PING every {:?}, {} misses), kill -9 -> new primary writable median {:.0} ms max {:.0} ms; highest-offset replica promoted every run ({distinct_offsets} runs with a lagging replica, the others tie-broken by address); returning primary: {write_attempts_on_returning} write attempts, none accepted",
        engine.name(),
        det.interval,
        det.misses,
        med.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_62_failover_and_fencing() {
    failover_runs(Engine::Redis62).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_70_failover_and_fencing() {
    failover_runs(Engine::Redis70).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_81_failover_and_fencing() {
    failover_runs(Engine::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_91_failover_and_fencing() {
    failover_runs(Engine::Valkey91).await;
}

/// Failover refuses to run while the primary still answers as a primary.
#[tokio::test]
async fn failover_refuses_when_the_primary_is_alive() {
    let servers = RedisServer::start_group(Engine::Redis70, 2, ServerConfig::default());
    let opts = servers[0].connect_options();
    let err = failover(&servers[0].endpoint(), &[servers[1].endpoint()], &opts)
        .await
        .expect_err("primary alive");
    assert_eq!(err.category(), ErrorCategory::State, "{err}");
}
