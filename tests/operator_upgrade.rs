//! Version upgrades against the dev cluster, real servers of each version,
//! under four writers through the read-write Service (its ready
//! EndpointSlice endpoint, as kube-proxy routes) and a reader through the
//! read-only Service:
//!
//! - one Redis walked through every hop the test ground has: Redis 6.2 →
//!   7.0 → Valkey 8.1 → Valkey 9.1 (the move from Redis to Valkey is the
//!   same ordered upgrade). Per hop: acknowledged writes lost (must be 0),
//!   the longest stretch without an accepted write, the upgrade's duration,
//!   reads served.
//! - the operator killed in the middle of an upgrade (after a replica was
//!   upgraded), and the next one stopped right after the switchover: a third
//!   one finishes it.
//! - an upgrade to an image that cannot be pulled, one to a server that
//!   exits at start, and one to a server that never becomes Ready: rolled
//!   back, the primary never restarted, the reason in the status; a new
//!   spec change then upgrades.
//! - a Standalone upgrade: one restart, its window reported.
//! - a spec change during an upgrade: the newer target wins.
//!
//! `REDPILOT_UPGRADE_RUNS=N` repeats the walk N times (`make bench-upgrade`).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use redpilot::api::v1alpha1::{Redis, UpgradePhase};
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde_json::json;
use support::faults::{ServiceWriter, Tally, missing, percentiles, ready_endpoint};
use support::operator::{
    OperatorOptions, apply_redis, is_ready, patch_redis, recent_events, redis_api, redis_password,
    redis_pods, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(240);

/// Each writer pauses this long after a write: the suite's six tests run
/// side by side on two cores with the control plane, and unpaced writers
/// starved the API server long enough for an operator to lose its lease.
/// About 400 writes/s per writer still times a window to a few ms.
const PACE: Duration = Duration::from_millis(2);

fn runs() -> usize {
    std::env::var("REDPILOT_UPGRADE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Reads through the read-only Service; counts answers and the longest
/// stretch without one.
struct Reader {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    answers: Arc<Mutex<Vec<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    fn start(client: &kube::Client, ns: &str, svc: &str, pw: &str) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let (svc, pw) = (svc.to_string(), pw.to_string());
        let (s, o, f, a) = (stop.clone(), ok.clone(), failed.clone(), answers.clone());
        let task = tokio::spawn(async move {
            let opts = ConnectOptions::default()
                .with_password(pw)
                .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
            let mut conn: Option<Node> = None;
            while !s.load(Ordering::SeqCst) {
                let Some(node) = conn.as_mut() else {
                    if let Some(ip) = ready_endpoint(&slices, &svc).await
                        && let Ok(n) = Node::connect(&Endpoint::new(&ip, 6379), &opts).await
                    {
                        conn = Some(n);
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    continue;
                };
                let get = node
                    .query::<Option<String>>("GET", redis::cmd("GET").arg("w0:1"))
                    .await;
                if get.is_ok() {
                    o.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut v) = a.lock() {
                        v.push(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    f.fetch_add(1, Ordering::SeqCst);
                    conn = None;
                }
            }
        });
        Reader {
            stop,
            ok,
            failed,
            answers,
            task,
        }
    }

    async fn stop(self) -> (u64, u64, Vec<Instant>) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        let answers = self.answers.lock().map(|v| v.clone()).unwrap_or_default();
        (
            self.ok.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
            answers,
        )
    }
}

/// The longest time within `[from, to]` without an instant of `times`.
fn longest_gap(mut times: Vec<Instant>, from: Instant, to: Instant) -> Duration {
    times.retain(|t| *t >= from && *t <= to);
    times.sort();
    let mut prev = from;
    let mut worst = Duration::ZERO;
    for t in times.into_iter().chain([to]) {
        worst = worst.max(t.duration_since(prev));
        prev = t;
    }
    worst
}

struct Hop {
    name: String,
    took: Duration,
    window: Duration,
    acked: usize,
    lost: usize,
    failed: u64,
    reads_ok: u64,
    reads_failed: u64,
    read_gap: Duration,
}

/// Patches the spec to `engine`/`version` and waits for the upgrade to
/// succeed under four writers and a reader; checks nothing was lost.
async fn hop(
    client: &kube::Client,
    ns: &str,
    pw: &str,
    engine: &str,
    version: &str,
    expect_version: &str,
    run: usize,
) -> Hop {
    let name = format!("{engine} {version}");
    let writers: Vec<ServiceWriter> = (0..4)
        .map(|i| {
            ServiceWriter::paced(
                client,
                ns,
                "cache",
                pw,
                &format!("w{i}-{run}-{version}"),
                0,
                PACE,
            )
        })
        .collect();
    let reader = Reader::start(client, ns, "cache-ro", pw);
    let t0 = Instant::now();
    while writers.iter().any(|w| w.acked() < 50) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "writers never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = redis_api(client, ns).get("cache").await.expect("get");
    let old_primary = before.status.as_ref().and_then(|s| s.primary.clone());
    let generation = spec_change(client, ns, json!({"engine": engine, "version": version})).await;
    let start = Instant::now();
    let done = wait_upgraded(client, ns, generation, expect_version).await;
    let took = start.elapsed();
    let end = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut tallies: Vec<Tally> = Vec::new();
    for w in writers {
        tallies.push(w.stop().await);
    }
    let (reads_ok, reads_failed, answers) = reader.stop().await;
    let acks: Vec<Instant> = tallies
        .iter()
        .flat_map(|t| t.acks.iter().map(|a| a.acked))
        .collect();
    let window = longest_gap(acks, start, end);
    let keys: Vec<String> = tallies.iter().flat_map(|t| t.keys()).collect();
    let pods = redis_pods(client, ns, "cache").await;
    let mut lost = 0;
    for (pod, p) in &pods {
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("pod ip");
        let gone = missing(&ip, pw, &keys).await;
        assert!(
            gone.is_empty(),
            "{name}: {pod} lacks {} acknowledged writes, e.g. {:?}",
            gone.len(),
            &gone[..gone.len().min(5)]
        );
        lost += gone.len();
    }
    let s = done.status.expect("status");
    let u = s.upgrade.expect("status.upgrade");
    assert_eq!((u.done, u.total), (3, 3), "{u:?}");
    assert!(u.finished_at.is_some(), "{u:?}");
    assert_ne!(
        s.primary, old_primary,
        "{name}: the primary was switched over"
    );
    let failed: u64 = tallies.iter().map(|t| t.failed).sum();
    let errors: std::collections::BTreeMap<String, u64> = tallies
        .iter()
        .flat_map(|t| t.errors.clone())
        .fold(Default::default(), |mut m, (k, v)| {
            *m.entry(k).or_default() += v;
            m
        });
    println!(
        "hop to {name}: {:.1}s; {} writes acknowledged, {lost} lost, {failed} failed {errors:?}; \
         longest stretch without an accepted write {:.3}s; reads {reads_ok} answered, \
         {reads_failed} failed, longest gap {:.3}s",
        took.as_secs_f64(),
        keys.len(),
        window.as_secs_f64(),
        longest_gap(answers.clone(), start, end).as_secs_f64(),
    );
    Hop {
        name,
        took,
        window,
        acked: keys.len(),
        lost,
        failed,
        reads_ok,
        reads_failed,
        read_gap: longest_gap(answers, start, end),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hop_upgrades_without_losing_a_write() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-hops", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let mut hops: Vec<Hop> = Vec::new();
    for run in 0..runs() {
        let name = "cache";
        let pw = replication_62(&client, &ns.name, json!({})).await;
        hops.push(hop(&client, &ns.name, &pw, "Redis", "7.0", "7.0.", run).await);
        hops.push(hop(&client, &ns.name, &pw, "Valkey", "8.1", "8.1.", run).await);
        hops.push(hop(&client, &ns.name, &pw, "Valkey", "9.1", "9.1.", run).await);
        let events = recent_events(&client, &ns.name, 80).await;
        for reason in [
            "UpgradeStarted",
            "UpgradeProgress",
            "UpgradeSucceeded",
            "SwitchedOver",
        ] {
            assert!(events.contains(reason), "no {reason} event:\n{events}");
        }
        if run + 1 == runs() {
            break;
        }
        redis_api(&client, &ns.name)
            .delete(name, &Default::default())
            .await
            .expect("delete");
        wait_for("the Redis gone", READY, || async {
            redis_api(&client, &ns.name)
                .get_opt(name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
        wait_for("its pods gone", READY, || async {
            redis_pods(&client, &ns.name, name)
                .await
                .is_empty()
                .then_some(())
        })
        .await;
    }
    drop(op);
    let lost: usize = hops.iter().map(|h| h.lost).sum();
    assert_eq!(lost, 0);
    for name in ["Redis 7.0", "Valkey 8.1", "Valkey 9.1"] {
        let of: Vec<&Hop> = hops.iter().filter(|h| h.name == name).collect();
        let windows: Vec<f64> = of.iter().map(|h| h.window.as_secs_f64()).collect();
        let took: Vec<f64> = of.iter().map(|h| h.took.as_secs_f64()).collect();
        let (w50, _) = percentiles(&windows);
        let (t50, _) = percentiles(&took);
        println!(
            "{name}: {} runs; write window p50 {w50:.3}s max {:.3}s; upgrade p50 {t50:.1}s max \
             {:.1}s; {} writes acknowledged, {} lost, {} failed; reads {} ok {} failed, longest \
             read gap {:.3}s",
            of.len(),
            windows.iter().cloned().fold(0.0, f64::max),
            took.iter().cloned().fold(0.0, f64::max),
            of.iter().map(|h| h.acked).sum::<usize>(),
            of.iter().map(|h| h.lost).sum::<usize>(),
            of.iter().map(|h| h.failed).sum::<u64>(),
            of.iter().map(|h| h.reads_ok).sum::<u64>(),
            of.iter().map(|h| h.reads_failed).sum::<u64>(),
            of.iter()
                .map(|h| h.read_gap.as_secs_f64())
                .fold(0.0, f64::max),
        );
    }
}

/// Creates Redis `cache`: Replication, 3 instances of Redis 6.2 without
/// persistence, plus `extra` spec fields; waits for Ready; returns the
/// password.
async fn replication_62(client: &kube::Client, ns: &str, extra: serde_json::Value) -> String {
    let mut spec = json!({"mode": "Replication", "instances": 3, "version": "6.2",
                          "persistence": {"rdb": false}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    apply_redis(client, ns, "cache", spec).await;
    wait_ready(client, ns, "cache", READY).await;
    redis_password(client, ns, "cache").await
}

/// Merges `spec` into Redis `cache`'s spec; returns the new generation.
async fn spec_change(client: &kube::Client, ns: &str, spec: serde_json::Value) -> Option<i64> {
    patch_redis(client, ns, "cache", json!({ "spec": spec }))
        .await
        .metadata
        .generation
}

/// Waits until the Redis is Ready at spec generation `generation` with a
/// status that satisfies `ok`.
async fn wait_status(
    client: &kube::Client,
    ns: &str,
    generation: Option<i64>,
    what: &str,
    ok: impl Fn(&redpilot::api::v1alpha1::RedisStatus) -> bool,
) -> Redis {
    wait_for(what, READY, || async {
        let r = redis_api(client, ns).get("cache").await.ok()?;
        let s = r.status.as_ref()?;
        (is_ready(&r) && s.observed_generation == generation && ok(s)).then_some(r)
    })
    .await
}

/// Waits until the upgrade for spec generation `generation` succeeded and
/// every server reports a version starting with `version`.
async fn wait_upgraded(
    client: &kube::Client,
    ns: &str,
    generation: Option<i64>,
    version: &str,
) -> Redis {
    let what = format!("the upgrade to {version} to succeed");
    wait_status(client, ns, generation, &what, |s| {
        s.upgrade
            .as_ref()
            .is_some_and(|u| u.phase == UpgradePhase::Succeeded)
            && s.current_version
                .as_deref()
                .is_some_and(|v| v.starts_with(version) && !v.contains(','))
    })
    .await
}

/// Every key `tally` had acknowledged is on every instance; returns how
/// many there were.
async fn assert_kept(client: &kube::Client, ns: &str, pw: &str, tally: &Tally) -> usize {
    let keys = tally.keys();
    for (pod, p) in redis_pods(client, ns, "cache").await {
        let ip = p.status.and_then(|s| s.pod_ip).expect("ip");
        let gone = missing(&ip, pw, &keys).await;
        assert!(
            gone.is_empty(),
            "{pod} lacks {} acknowledged writes",
            gone.len()
        );
    }
    keys.len()
}

/// Each pod of Redis `cache`: name, UID, image, restart count.
async fn pod_state(client: &kube::Client, ns: &str) -> Vec<(String, String, String, i32)> {
    support::operator::pod_states(client, ns, "cache").await
}

/// Waits for a rolled-back upgrade with `reason`; checks the primary was
/// never restarted and every instance runs `image` again.
async fn expect_rolled_back(
    client: &kube::Client,
    ns: &str,
    generation: Option<i64>,
    reason: &str,
    image: &str,
    primary: &(String, String, String, i32),
) -> Redis {
    let t = Instant::now();
    let what = format!("the upgrade rolled back ({reason})");
    let r = wait_status(client, ns, generation, &what, |s| {
        s.upgrade.as_ref().is_some_and(|u| {
            u.phase == UpgradePhase::RolledBack && u.reason.as_deref() == Some(reason)
        })
    })
    .await;
    let s = r.status.as_ref().expect("status");
    let cond = s
        .conditions
        .iter()
        .find(|c| c.type_ == "UpgradeFailed")
        .expect("UpgradeFailed condition");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", reason)
    );
    assert!(
        cond.message.contains("is not served") && cond.message.contains("cache-"),
        "names the instance: {}",
        cond.message
    );
    let state = pod_state(client, ns).await;
    assert!(
        state.iter().all(|(_, _, img, _)| img == image),
        "every instance back on {image}: {state:?}"
    );
    let now = state
        .iter()
        .find(|(n, ..)| *n == primary.0)
        .expect("the primary's pod");
    assert_eq!(
        (&now.1, now.3),
        (&primary.1, primary.3),
        "the primary was never restarted"
    );
    assert_eq!(s.primary.as_deref(), Some(primary.0.as_str()));
    println!(
        "{reason}: rolled back in {:.1}s: {}",
        t.elapsed().as_secs_f64(),
        cond.message
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_is_rolled_back_without_touching_the_primary() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-rollback", &[]).await;
    // The mirror lacks the 7.0 image.
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    opts.env.push((
        "RELATED_IMAGE_REDIS_7_0".into(),
        "mirror.invalid/redis:7.0".into(),
    ));
    // The test's broken images are allowed as `spec.image` here.
    opts.env.push((
        "REDPILOT_ALLOWED_IMAGES".into(),
        "redis,valkey/valkey,redpilot-test/*".into(),
    ));
    let _op = start_operator(&client, opts).await;
    let pw = replication_62(
        &client,
        &ns.name,
        json!({"upgrade": {"timeoutSeconds": 60}}),
    )
    .await;
    let redis = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get");
    let primary = redis.status.and_then(|s| s.primary).expect("primary");
    let writer = ServiceWriter::paced(&client, &ns.name, "cache", &pw, "rb", 0, PACE);
    let state = pod_state(&client, &ns.name).await;
    let p0 = state
        .iter()
        .find(|(n, ..)| *n == primary)
        .cloned()
        .expect("primary pod");

    // 1. An image that cannot be pulled.
    let g = spec_change(&client, &ns.name, json!({"version": "7.0"})).await;
    expect_rolled_back(&client, &ns.name, g, "ImagePullFailed", "redis:6.2", &p0).await;
    // The spec is left as written; the status says 7.0 is not served.
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get");
    assert_eq!(r.spec.version.as_deref(), Some("7.0"));
    assert!(
        r.status
            .as_ref()
            .and_then(|s| s.current_version.clone())
            .is_some_and(|v| v.starts_with("6.2.")),
        "{:?}",
        r.status
    );

    // 2. A server that exits at start: a new spec change, a new attempt.
    let g = spec_change(
        &client,
        &ns.name,
        json!({"image": "redpilot-test/exits-at-start:7.0"}),
    )
    .await;
    expect_rolled_back(&client, &ns.name, g, "CrashLoop", "redis:6.2", &p0).await;

    // 3. A server that starts but never becomes Ready: rolled back once
    // spec.upgrade.timeoutSeconds (40 here) has passed, and soon after:
    // the operator looks again when the timeout runs out, not at its next
    // backed-off pass (2, 4, 8, 16, 32 s apart by then: about 70 s in).
    let g = spec_change(
        &client,
        &ns.name,
        json!({"image": "redpilot-test/never-ready:7.0", "upgrade": {"timeoutSeconds": 40}}),
    )
    .await;
    let t = Instant::now();
    expect_rolled_back(&client, &ns.name, g, "NotReadyInTime", "redis:6.2", &p0).await;
    let took = t.elapsed();
    println!(
        "never ready: rolled back {:.1} s after the change (timeout 40 s)",
        took.as_secs_f64()
    );
    assert!(took >= Duration::from_secs(40), "not before the timeout");
    assert!(
        took < Duration::from_secs(65),
        "rolled back {took:?} after the change: the timeout's end was not looked at"
    );

    // 4. A working image: upgraded.
    let g = spec_change(&client, &ns.name, json!({"image": "redis:7.0"})).await;
    wait_upgraded(&client, &ns.name, g, "7.0.").await;
    let tally = writer.stop().await;
    let kept = assert_kept(&client, &ns.name, &pw, &tally).await;
    let events = recent_events(&client, &ns.name, 100).await;
    for reason in [
        "UpgradeFailed",
        "UpgradeRollback",
        "UpgradeRolledBack",
        "UpgradeSucceeded",
    ] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    println!("{kept} writes acknowledged, none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_interrupted_by_the_operators_death_is_finished_by_the_next() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-killed", &[]).await;
    let opts = OperatorOptions::watching(&[&ns.name]);
    let mut op = start_operator(&client, opts.clone()).await;
    let pw = replication_62(&client, &ns.name, json!({})).await;
    let writer = ServiceWriter::paced(&client, &ns.name, "cache", &pw, "k", 0, PACE);
    let g = spec_change(&client, &ns.name, json!({"version": "7.0"})).await;
    let started = wait_for("one replica upgraded", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let u = r.status?.upgrade?;
        (u.done >= 1).then_some(u.started_at)
    })
    .await;
    op.kill();
    let mid = pod_state(&client, &ns.name).await;
    println!("operator killed with {mid:?}");
    // The next one stops as a crash would right after the switchover,
    // before the new primary is published and the old one restarted.
    let mut crashing = opts.clone().named("op-crash");
    crashing
        .env
        .push(("REDPILOT_FAILPOINTS".into(), "after-switchover".into()));
    let mut crashing = start_operator(&client, crashing).await;
    let exit = wait_for("the operator to stop after the switchover", READY, || {
        let code = crashing.exit_status().and_then(|s| s.code());
        async move { code }
    })
    .await;
    assert_eq!(exit, 86, "{}", crashing.log_tail(20));
    let mid = pod_state(&client, &ns.name).await;
    println!("operator stopped after the switchover with {mid:?}");
    let _op = start_operator(&client, opts.named("op-next")).await;
    let r = wait_upgraded(&client, &ns.name, g, "7.0.").await;
    let u = r.status.and_then(|s| s.upgrade).expect("upgrade");
    assert_eq!(u.started_at, started, "the same upgrade, not a new one");
    assert_eq!(u.from.version, "6.2");
    let tally = writer.stop().await;
    let kept = assert_kept(&client, &ns.name, &pw, &tally).await;
    println!("{kept} writes acknowledged, none lost");
}

/// An upgrade that loses its primary midway, to a failover that promotes
/// the upgraded replica, while the other replica (6.2) crashes too, then
/// meets a restart-needing change: the older replica cannot follow a newer
/// primary (an older server refuses a newer
/// one's snapshot), so a roll waiting for every instance to be ready would
/// wait for ever; the one that cannot follow restarts next, and the
/// upgrade finishes with nothing acknowledged lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_primary_fails_over_to_the_upgraded_replica_finishes() {
    use support::operator::{connect_pod, kill_9, server_pid, signal};
    let _ = signal;
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-stranded", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let pw = replication_62(&client, &ns.name, json!({})).await;
    let writer = ServiceWriter::paced(&client, &ns.name, "cache", &pw, "k", 1, PACE);
    spec_change(&client, &ns.name, json!({"version": "7.0"})).await;
    // One replica runs 7.0 and follows the 6.2 primary.
    let (primary, upgraded, older) = wait_for("one replica upgraded", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let primary = r.status.as_ref()?.primary.clone()?;
        let states = pod_state(&client, &ns.name).await;
        let upgraded = states
            .iter()
            .find(|(n, _, image, _)| image.as_str() == "redis:7.0" && *n != primary)?;
        let mut node = connect_pod(&client, &ns.name, &upgraded.0, &pw)
            .await
            .ok()?;
        let up = node.replication().await.ok()?;
        if up.link_status != Some(redpilot::redis::info::LinkStatus::Up) {
            return None;
        }
        let older = states
            .iter()
            .find(|(n, _, image, _)| image.as_str() == "redis:6.2" && *n != primary)?;
        Some((primary, upgraded.0.clone(), older.0.clone()))
    })
    .await;
    // The 6.2 replica falls behind (stopped), so the failover promotes
    // the 7.0 one; then the primary crashes.
    let mut stopped = connect_pod(&client, &ns.name, &older, &pw)
        .await
        .expect("connect");
    let older_pid = server_pid(&mut stopped).await;
    drop(stopped);
    signal(older_pid, "-STOP");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut p = connect_pod(&client, &ns.name, &primary, &pw)
        .await
        .expect("connect");
    let ppid = server_pid(&mut p).await;
    drop(p);
    kill_9(ppid);
    let promoted = wait_for("a failover", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let p = r.status?.primary?;
        (p != primary).then_some(p)
    })
    .await;
    assert_eq!(
        promoted, upgraded,
        "the fault: the failover promoted the upgraded replica"
    );
    // The 6.2 replica crashes too: restarted empty (no persistence), it
    // needs a full sync, which a 6.2 server cannot take from 7.0.
    kill_9(older_pid);
    println!(
        "{primary} (6.2) killed; {upgraded} (7.0) promoted; {older} (6.2) killed, cannot resync from it"
    );
    // A restart-needing change on top.
    let g = spec_change(&client, &ns.name, json!({"databases": 32})).await;
    wait_upgraded(&client, &ns.name, g, "7.0.").await;
    let events = recent_events(&client, &ns.name, 200).await;
    println!("{events}");
    assert!(
        events.contains("runs an older server than the primary"),
        "the stranded replica was restarted by the rule:\n{events}"
    );
    let tally = writer.stop().await;
    let kept = assert_kept(&client, &ns.name, &pw, &tally).await;
    println!("upgrade finished after the failover: {kept} writes acknowledged, none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_upgrade_restarts_once_and_reports_its_window() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-standalone", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Standalone", "version": "6.2", "storage": {"size": "1Gi"},
               "persistence": {"rdb": false, "aof": "Always"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let pw = redis_password(&client, &ns.name, "cache").await;
    let writer = ServiceWriter::paced(&client, &ns.name, "cache", &pw, "s", 0, PACE);
    let t0 = Instant::now();
    while writer.acked() < 100 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "writer never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = pod_state(&client, &ns.name).await;
    // Every pod UID seen during the upgrade (polled every 100 ms).
    let seen = Arc::new(Mutex::new(vec![before[0].1.clone()]));
    let polling = Arc::new(AtomicBool::new(true));
    let poller = {
        let (client, ns, seen, polling) = (
            client.clone(),
            ns.name.clone(),
            seen.clone(),
            polling.clone(),
        );
        tokio::spawn(async move {
            while polling.load(Ordering::Relaxed) {
                for (_, uid, _, _) in pod_state(&client, &ns).await {
                    let mut s = seen.lock().unwrap();
                    if !s.contains(&uid) {
                        s.push(uid);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let start = Instant::now();
    let g = spec_change(&client, &ns.name, json!({"version": "7.0"})).await;
    let r = wait_upgraded(&client, &ns.name, g, "7.0.").await;
    let end = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = writer.stop().await;
    polling.store(false, Ordering::Relaxed);
    let _ = poller.await;
    let after = pod_state(&client, &ns.name).await;
    let uids = seen.lock().unwrap().clone();
    assert_eq!(
        uids.len(),
        2,
        "exactly one restart: the pod before and one new pod ({uids:?})"
    );
    assert_eq!(after[0].1, uids[1], "the new pod is the one running");
    assert_eq!(after[0].3, 0, "its container never restarted");
    let u = r.status.and_then(|s| s.upgrade).expect("upgrade");
    let reported = u.unavailable_seconds.expect("unavailableSeconds");
    let window = longest_gap(tally.acks.iter().map(|a| a.acked).collect(), start, end);
    let keys = tally.keys();
    let ip = redis_pods(&client, &ns.name, "cache")
        .await
        .into_values()
        .next()
        .and_then(|p| p.status?.pod_ip)
        .expect("ip");
    let gone = missing(&ip, &pw, &keys).await;
    println!(
        "standalone 6.2 -> 7.0: reported unavailable {reported:.1}s; the writer saw {:.3}s \
         without an accepted write; {} writes acknowledged, {} lost",
        window.as_secs_f64(),
        keys.len(),
        gone.len()
    );
    assert!(gone.is_empty(), "AOF on the volume keeps every write");
    assert!(reported > 0.0 && reported < 60.0, "{reported}");
    // The reported window is what the writer lived through: never more
    // than the writer's own gap (it would claim an outage nobody saw),
    // and not a small part of it (it would hide one).
    let seen_gap = window.as_secs_f64();
    assert!(
        reported <= seen_gap + 0.5 && seen_gap - reported <= 3.0,
        "reported {reported:.2}s against the writer's {seen_gap:.2}s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_spec_wins_over_the_upgrade_in_progress() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-retarget", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let pw = replication_62(&client, &ns.name, json!({})).await;
    let writer = ServiceWriter::paced(&client, &ns.name, "cache", &pw, "n", 0, PACE);
    spec_change(&client, &ns.name, json!({"version": "7.0"})).await;
    wait_for("one replica on 7.0", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        (r.status?.upgrade?.done >= 1).then_some(())
    })
    .await;
    let g = spec_change(
        &client,
        &ns.name,
        json!({"engine": "Valkey", "version": "8.1"}),
    )
    .await;
    let r = wait_upgraded(&client, &ns.name, g, "8.1.").await;
    let u = r.status.and_then(|s| s.upgrade).expect("upgrade");
    assert_eq!(u.from.version, "6.2", "where it came from is kept");
    assert_eq!(u.to.version, "8.1");
    let events = recent_events(&client, &ns.name, 100).await;
    assert!(events.contains("UpgradeRetargeted"), "{events}");
    let tally = writer.stop().await;
    let kept = assert_kept(&client, &ns.name, &pw, &tally).await;
    println!("retargeted 6.2 -> 7.0 -> Valkey 8.1: {kept} writes acknowledged, none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_rolled_back_over_a_newer_dump_resyncs_instead_of_crashing() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "upgrade-dump", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let pw = replication_62(
        &client,
        &ns.name,
        json!({"storage": {"size": "1Gi"}, "persistence": {"rdb": true}}),
    )
    .await;
    let writer = ServiceWriter::paced(&client, &ns.name, "cache", &pw, "d", 0, PACE);
    spec_change(&client, &ns.name, json!({"version": "7.0"})).await;
    // The first upgraded replica (on 7.0 and Ready in status; the second
    // replica's pod may already carry the 7.0 image while its server is
    // still starting) saves a dump in its own format (RDB 10), as its
    // periodic save would.
    let (upgraded, mut node) = wait_for("one replica on 7.0, Ready", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let s = r.status?;
        (s.upgrade?.done >= 1).then_some(())?;
        let primary = s.primary?;
        let ready: Vec<String> = s
            .instances
            .iter()
            .filter(|i| i.ready && i.name != primary)
            .map(|i| i.name.clone())
            .collect();
        for (n, _, image, _) in pod_state(&client, &ns.name).await {
            if image == "redis:7.0"
                && ready.contains(&n)
                && let Ok(node) = support::operator::connect_pod(&client, &ns.name, &n, &pw).await
            {
                return Some((n, node));
            }
        }
        None
    })
    .await;
    let _: String = node.query("SAVE", &redis::cmd("SAVE")).await.expect("SAVE");
    // Back to 6.2 before the primary moves: the upgraded replicas restart
    // on 6.2, which cannot read RDB 10.
    let g = spec_change(&client, &ns.name, json!({"version": "6.2"})).await;
    wait_status(&client, &ns.name, g, "every instance back on 6.2", |s| {
        s.upgrade
            .as_ref()
            .is_some_and(|u| u.phase == UpgradePhase::RolledBack)
            && s.current_version
                .as_deref()
                .is_some_and(|v| v.starts_with("6.2.") && !v.contains(','))
    })
    .await;
    let state = pod_state(&client, &ns.name).await;
    assert!(
        state.iter().all(|(_, _, image, _)| image == "redis:6.2"),
        "{state:?}"
    );
    let log = std::fs::read_to_string(
        support::repo_root()
            .join(".dev/localnode/pods")
            .join(format!("{}_{upgraded}", ns.name))
            .join("redis.log"),
    )
    .unwrap_or_default();
    assert!(
        log.contains("moved aside dump.rdb in RDB format 10"),
        "{upgraded} kept a dump it cannot read:\n{log}"
    );
    let tally = writer.stop().await;
    let kept = assert_kept(&client, &ns.name, &pw, &tally).await;
    println!(
        "{upgraded} moved aside its RDB 10 dump and resynced; {kept} writes acknowledged, none lost"
    );
}

/// A spec the operator cannot serve (an explicit image of an older server
/// than the primary runs: admission lets the user's image through) is said
/// in the `UpgradeFailed` condition, reason `NoWayBack`, not as progress;
/// the Redis keeps serving what it runs and no pod is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_that_cannot_be_served_is_said_in_a_condition() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "nowayback", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 2, "version": "7.0",
               "persistence": {"rdb": false}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let before = support::operator::pod_uids(&client, &ns.name, "cache").await;
    let g = spec_change(
        &client,
        &ns.name,
        json!({"version": "6.2", "image": "redis:6.2"}),
    )
    .await;
    let r = wait_status(&client, &ns.name, g, "UpgradeFailed NoWayBack", |s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "UpgradeFailed" && c.status == "True" && c.reason == "NoWayBack")
    })
    .await;
    let st = r.status.expect("status");
    let cond = |t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let (_, _, msg) = cond("UpgradeFailed").expect("UpgradeFailed");
    println!("UpgradeFailed NoWayBack: {msg}");
    assert!(
        msg.contains("spec.version") && msg.contains("6.2") && msg.contains("7.0"),
        "{msg}"
    );
    // Settled, it is not said as progress (the pass that took the new
    // generation may have updated the StatefulSet's annotations).
    let _ = cond;
    wait_status(
        &client,
        &ns.name,
        g,
        "Progressing False with NoWayBack",
        |s| {
            let c = |t: &str| s.conditions.iter().find(|c| c.type_ == t);
            c("Progressing").is_some_and(|c| c.status == "False")
                && c("UpgradeFailed").is_some_and(|c| c.status == "True" && c.reason == "NoWayBack")
        },
    )
    .await;
    assert!(
        st.current_version
            .as_deref()
            .is_some_and(|v| v.starts_with("7.0")),
        "{:?}",
        st.current_version
    );
    assert_eq!(
        support::operator::pod_uids(&client, &ns.name, "cache").await,
        before,
        "no pod touched"
    );
}
