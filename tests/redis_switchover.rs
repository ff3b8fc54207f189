//! Planned switchover under concurrent writers: every acknowledged write must
//! survive. 20 switchovers per engine version, rotating the primary.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis_server::{Engine, RedisServer, ServerConfig, median_max};
use redpilot::redis::actions::{SwitchoverOptions, switchover, wait_caught_up};
use redpilot::redis::topology::observe;
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use tokio::sync::watch;

const RUNS: usize = 20;
const WRITERS: usize = 4;

/// Serialises the engines so the measured durations are not distorted by
/// the other tests of this binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes unique keys to whatever `primary` currently names; records a key
/// only when the server answered OK.
async fn writer(
    id: usize,
    primary: watch::Receiver<Endpoint>,
    opts: ConnectOptions,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
    errors: Arc<AtomicU64>,
) {
    let mut conn: Option<(Endpoint, Node)> = None;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let target = primary.borrow().clone();
        if conn.as_ref().map(|(e, _)| e) != Some(&target) {
            conn = Node::connect(&target, &opts)
                .await
                .ok()
                .map(|n| (target, n));
        }
        let Some((_, node)) = conn.as_mut() else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let key = format!("w{id}:{seq}");
        seq += 1;
        match node
            .query::<redis::Value>("SET", redis::cmd("SET").arg(&key).arg(seq))
            .await
        {
            Ok(redis::Value::Okay) => acked.lock().unwrap().push(key),
            Ok(other) => panic!("unexpected SET reply {other:?}"),
            Err(_) => {
                // READONLY (demoted), UNBLOCKED, timeouts: not acknowledged.
                errors.fetch_add(1, Ordering::Relaxed);
                conn = None;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// Starts [`WRITERS`] writers following `primary`: the stop switch, the
/// acknowledged keys, the count of failed writes and the tasks.
#[allow(clippy::type_complexity)]
fn spawn_writers(
    primary: &watch::Receiver<Endpoint>,
    opts: &ConnectOptions,
) -> (
    Arc<AtomicBool>,
    Arc<Mutex<Vec<String>>>,
    Arc<AtomicU64>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let writer_opts = opts
        .clone()
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
    let tasks = (0..WRITERS)
        .map(|id| {
            tokio::spawn(writer(
                id,
                primary.clone(),
                writer_opts.clone(),
                stop.clone(),
                acked.clone(),
                errors.clone(),
            ))
        })
        .collect();
    (stop, acked, errors, tasks)
}

/// Returns the acknowledged keys missing on `ep`.
async fn missing_on(ep: &Endpoint, opts: &ConnectOptions, keys: &[String]) -> Vec<String> {
    let client = redpilot::redis::redis_client(ep, opts).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut missing = Vec::new();
    for chunk in keys.chunks(2000) {
        let mut p = redis::pipe();
        for k in chunk {
            p.cmd("EXISTS").arg(k);
        }
        let found: Vec<i64> = p.query_async(&mut c).await.unwrap();
        missing.extend(
            chunk
                .iter()
                .zip(found)
                .filter(|(_, f)| *f == 0)
                .map(|(k, _)| k.clone()),
        );
    }
    missing
}

async fn switchover_runs(engine: Engine) {
    let _serial = SERIAL.lock().await;
    let servers = RedisServer::start_group(engine, 3, ServerConfig::default().password("sw-pw"));
    let opts = servers[0].connect_options();
    let members: Vec<Endpoint> = servers.iter().map(|s| s.endpoint()).collect();
    let (tx, rx) = watch::channel(members[0].clone());
    let (stop, acked, errors, tasks) = spawn_writers(&rx, &opts);

    let sw = SwitchoverOptions::default();
    let mut durations = Vec::new();
    let mut pauses = Vec::new();
    let mut primary = members[0].clone();
    for run in 0..RUNS {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = acked.lock().unwrap().len();
        let target = members
            .iter()
            .filter(|m| **m != primary)
            .nth(run % 2)
            .unwrap()
            .clone();
        let report = switchover(&members, &target, &opts, &sw)
            .await
            .unwrap_or_else(|e| panic!("{engine:?} run {run}: switchover failed: {e}"));
        assert_eq!(report.new_primary, target);
        assert_eq!(report.old_primary, primary);
        assert!(
            report.repoint_failures.is_empty(),
            "{:?}",
            report.repoint_failures
        );
        assert_eq!(report.repointed.len(), 2);
        tx.send(target.clone()).unwrap();
        durations.push(report.duration);
        pauses.push(report.write_pause);
        primary = target;

        // Every write acknowledged so far (by any primary) is on the new one.
        let snapshot = acked.lock().unwrap().clone();
        assert!(
            snapshot.len() > before,
            "writers made no progress in run {run}"
        );
        let missing = missing_on(&primary, &opts, &snapshot).await;
        assert!(
            missing.is_empty(),
            "{engine:?} run {run}: {} acknowledged writes lost, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        let t = observe(&members, &opts).await;
        assert_eq!(t.primary.as_ref(), Some(&primary), "{:?}", t.anomalies);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    // Final check on the primary and, after catch-up, on every replica.
    let all = acked.lock().unwrap().clone();
    let mut lost = missing_on(&primary, &opts, &all).await.len();
    for m in members.iter().filter(|m| **m != primary) {
        wait_caught_up(m, &primary, &opts, Duration::from_secs(20))
            .await
            .unwrap();
        lost += missing_on(m, &opts, &all).await.len();
    }
    assert_eq!(lost, 0, "{engine:?}: acknowledged writes lost");
    let t = observe(&members, &opts).await;
    assert!(t.is_healthy(), "{:?}", t.anomalies);

    let (dmed, dmax) = median_max(&durations);
    let (pmed, pmax) = median_max(&pauses);
    println!(
        "switchover {}: {RUNS} runs, {} acknowledged writes, {} rejected/unacknowledged, 0 lost; duration median {:.1} ms max {:.1} ms; write pause median {:.1} ms max {:.1} ms",
        engine.name(),
        all.len(),
        errors.load(Ordering::Relaxed),
        dmed.as_secs_f64() * 1e3,
        dmax.as_secs_f64() * 1e3,
        pmed.as_secs_f64() * 1e3,
        pmax.as_secs_f64() * 1e3,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_62_switchover_loses_no_acknowledged_write() {
    switchover_runs(Engine::Redis62).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_70_switchover_loses_no_acknowledged_write() {
    switchover_runs(Engine::Redis70).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_81_switchover_loses_no_acknowledged_write() {
    switchover_runs(Engine::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_91_switchover_loses_no_acknowledged_write() {
    switchover_runs(Engine::Valkey91).await;
}

/// A switchover whose old primary cannot be demoted (here it refuses
/// REPLICAOF to the operator's user; a server frozen mid-switchover fails
/// the same way) must fail and leave exactly one writable primary, the old
/// one, with the target following it again, and no acknowledged write lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_whose_old_primary_cannot_be_demoted_is_rolled_back() {
    let _serial = SERIAL.lock().await;
    let servers = RedisServer::start_group(
        Engine::Redis70,
        2,
        ServerConfig::default().password("sw-pw"),
    );
    let opts = servers[0].connect_options();
    let members: Vec<Endpoint> = servers.iter().map(|s| s.endpoint()).collect();
    let (old, target) = (members[0].clone(), members[1].clone());
    wait_caught_up(&target, &old, &opts, Duration::from_secs(20))
        .await
        .unwrap();
    let mut admin = Node::connect(&old, &opts).await.unwrap();
    let _: redis::Value = admin
        .query(
            "ACL",
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("default")
                .arg("-replicaof")
                .arg("-slaveof"),
        )
        .await
        .unwrap();

    let (_tx, rx) = watch::channel(old.clone());
    let (stop, acked, _errors, tasks) = spawn_writers(&rx, &opts);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let sw = SwitchoverOptions {
        max_write_pause: Duration::from_secs(1),
        ..Default::default()
    };
    let err = switchover(&members, &target, &opts, &sw)
        .await
        .expect_err("a switchover that cannot demote the old primary must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("could not be demoted") && msg.contains("follows"),
        "the error says what happened: {msg}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = observe(&members, &opts).await;
    assert_eq!(
        t.primary.as_ref(),
        Some(&old),
        "one primary, the old one: {:?}",
        t.anomalies
    );
    let tn = t.node(&target).expect("target observed");
    assert_eq!(
        tn.primary.as_ref(),
        Some(&old),
        "the target follows the old primary again"
    );

    let before = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let all = acked.lock().unwrap().clone();
    assert!(all.len() > before, "the old primary takes writes again");
    assert!(missing_on(&old, &opts, &all).await.is_empty());
    wait_caught_up(&target, &old, &opts, Duration::from_secs(20))
        .await
        .unwrap();
    let lost = missing_on(&target, &opts, &all).await;
    assert!(
        lost.is_empty(),
        "{} acknowledged writes missing on the target",
        lost.len()
    );
    println!(
        "failed demotion: switchover refused ({msg}); {} acknowledged writes, 0 lost",
        all.len()
    );
}
