//! Point-in-time recovery on the dev cluster, with real servers and a real
//! S3 server: a Redis with `spec.archive` ships its replication stream as
//! it is written, and a new Redis bootstrapped with
//! `fromBackup.pointInTime` holds exactly the writes its primary executed
//! before the archive's last checkpoint at or before that time.
//!
//! A writer of unique keys records when each write was sent and when it
//! was acknowledged (the pods are local processes: the client's clock is
//! the servers' clock). For a restore to checkpoint `c` (whole
//! milliseconds): every key acknowledged before `c` must be there with
//! its value, and no key sent after `c` may be.
//!
//! - Replication (3 instances): the primary `kill -9`ed under the writer
//!   between the two times restored; the archive continues through the
//!   failover with no hole, and a restore after it holds the writes from
//!   both sides of it. The operator is killed while the second restore is
//!   being loaded.
//! - Standalone: the store is down for a minute under the writer; the lag
//!   is seen growing (status and the sidecar's metric), the archive
//!   catches up with no hole, and a restore to a time inside the outage is
//!   exact.
//! - An upgrade (Valkey 8.1 -> 9.1, Replication of three) under the writer:
//!   every instance restarts, the archiving one among them, and the
//!   archive goes on with no hole; times before and after restore exactly.
//! - Cluster (3 shards, a primary and a replica each, Valkey 8.1): each
//!   shard is archived from its replica, with the slots its primary serves
//!   recorded at every checkpoint. 3 -> 4 shards under the writer; a time
//!   before the resharding restores three shards with the layout of then,
//!   a time after it four shards with the slots each served (no even
//!   spread); a time at which slots were moving is refused with the
//!   reason. Every shard is at its own last checkpoint at or before the
//!   time: keys acknowledged before the earliest of them are there, none
//!   sent after the time is.

#[path = "support/cluster_client.rs"]
mod cluster_client;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::{Api, PostParams};
use redpilot::api::v1alpha1::Redis;
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, kill_9, pod_ip, redis_api, redis_password,
    server_pid, start_operator, wait_ready,
};
use support::s3_server::{ACCESS_KEY, S3Server, SECRET_KEY};
use support::{TestNamespace, client, wait_for};

/// The local node's bridge address: pods reach the host there.
const NODE_IP: &str = "10.244.0.1";
const BUCKET: &str = "archive";
const READY: Duration = Duration::from_secs(240);

async fn s3_secret(client: &Client, ns: &str) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s3", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("creating the credentials Secret");
}

fn s3_location(s3: &S3Server) -> Value {
    json!({"endpoint": s3.endpoint(), "bucket": BUCKET, "prefix": "pitr", "pathStyle": true,
           "credentials": {"secretName": "s3"}})
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn parse_ms(t: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(t)
        .unwrap_or_else(|e| panic!("{t:?}: {e}"))
        .timestamp_millis()
}

/// One write: its key, when it was sent, when it was acknowledged.
#[derive(Debug, Clone)]
struct Stamp {
    key: String,
    sent: i64,
    acked: Option<i64>,
}

/// Writes `prefix:N` = `N` one at a time to the Redis's primary (re-read
/// from `status.primary` after an error), about 500 a second, with no
/// retry: a write that errs is recorded as not acknowledged.
struct TimedWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Stamp>>,
    acked: Arc<std::sync::atomic::AtomicU64>,
}

impl TimedWriter {
    fn start(client: &Client, ns: &str, name: &str, pw: &str, prefix: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (client, ns, name, pw, prefix) = (
            client.clone(),
            ns.to_string(),
            name.to_string(),
            pw.to_string(),
            prefix.to_string(),
        );
        let (s, a) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            let mut stamps = Vec::new();
            let mut node: Option<Node> = None;
            let mut n = 0u64;
            while !s.load(Ordering::SeqCst) {
                if node.is_none() {
                    let primary = redis_api(&client, &ns)
                        .get(&name)
                        .await
                        .ok()
                        .and_then(|r| r.status?.primary);
                    if let Some(p) = primary {
                        let ip = pod_ip(&client, &ns, &p).await;
                        let opts = ConnectOptions::default()
                            .with_password(pw.clone())
                            .with_timeouts(Duration::from_millis(500), Duration::from_millis(500));
                        node = Node::connect(&Endpoint::new(ip, 6379), &opts).await.ok();
                    }
                    if node.is_none() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
                let Some(conn) = node.as_mut() else { continue };
                n += 1;
                let key = format!("{prefix}:{n}");
                let sent = now_ms();
                let r: redpilot::redis::Result<String> =
                    conn.query("SET", redis::cmd("SET").arg(&key).arg(n)).await;
                let acked = match r {
                    Ok(ok) if ok == "OK" => {
                        a.fetch_add(1, Ordering::SeqCst);
                        Some(now_ms())
                    }
                    _ => {
                        node = None;
                        None
                    }
                };
                stamps.push(Stamp { key, sent, acked });
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            stamps
        });
        TimedWriter { stop, task, acked }
    }

    async fn wait_acked(&self, more_than: u64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.acked.load(Ordering::SeqCst) <= more_than {
            assert!(
                Instant::now() < deadline,
                "the writer had {} acknowledged writes after {within:?}, wanted more than {more_than}",
                self.acked.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) -> Vec<Stamp> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("writer")
    }
}

/// `status.archive` once it satisfies `ok`.
async fn archive_status(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&redpilot::api::v1alpha1::ArchiveStatus) -> bool,
) -> redpilot::api::v1alpha1::ArchiveStatus {
    let api = redis_api(client, ns);
    wait_for(what, within, || async {
        let a = api.get(name).await.ok()?.status?.archive?;
        ok(&a).then_some(a)
    })
    .await
}

/// `status.archive` once its newest restorable time is at least `ms`.
async fn archived_past(
    client: &Client,
    ns: &str,
    name: &str,
    ms: i64,
) -> redpilot::api::v1alpha1::ArchiveStatus {
    archive_status(
        client,
        ns,
        name,
        &format!("{name}'s archive to reach {}", rfc3339(ms)),
        Duration::from_secs(90),
        |a| a.newest.as_deref().is_some_and(|n| parse_ms(n) >= ms),
    )
    .await
}

/// Creates Redis `name` restored to `at` from `source`'s archive; returns
/// the checkpoint it was restored to (ms).
async fn restore(
    client: &Client,
    ns: &str,
    name: &str,
    s3: &S3Server,
    key: &str,
    at: i64,
    shape: Value,
) -> i64 {
    let mut spec = shape;
    spec["bootstrap"] = json!({"fromBackup": {"s3": s3_location(s3), "key": key,
                                              "pointInTime": rfc3339(at)}});
    apply_redis(client, ns, name, spec).await;
    let bs = bootstrapped(client, ns, name).await;
    let to = parse_ms(
        bs.restored_to
            .as_deref()
            .unwrap_or_else(|| panic!("{name}: status.bootstrap.restoredTo: {bs:?}")),
    );
    assert!(
        to <= at && at - to <= 250,
        "{name}: restored to {} for a time of {} (checkpoints are 100 ms apart)",
        rfc3339(to),
        rfc3339(at)
    );
    println!(
        "{name}: restored to {} (asked {}), {} commands after the base",
        rfc3339(to),
        rfc3339(at),
        bs.commands.unwrap_or(-1)
    );
    to
}

/// What a restored Redis holds of the writes, key by key.
#[derive(Default)]
struct Verdict {
    missing: Vec<String>,
    wrong: Vec<String>,
    extra: Vec<String>,
    /// Keys that must be there, must not be, and either way.
    must: usize,
    must_not: usize,
    either: usize,
}

impl Verdict {
    /// Judges one write whose key holds `v` in a Redis restored to `at`
    /// whose data is at checkpoint `c` (at most `at`): acknowledged before
    /// `c`, it must be there with its value; sent after `at`, it must not.
    fn judge(&mut self, s: &Stamp, v: Option<String>, (c, at): (i64, i64)) {
        let n = s.key.rsplit(':').next().unwrap_or_default();
        if s.acked.is_some_and(|a| a < c) {
            self.must += 1;
            match v {
                None => self.missing.push(s.key.clone()),
                Some(v) if v != n => self.wrong.push(s.key.clone()),
                Some(_) => {}
            }
        } else if s.sent > at {
            self.must_not += 1;
            if v.is_some() {
                self.extra.push(s.key.clone());
            }
        } else {
            self.either += 1;
        }
    }

    /// Fails naming what is wrong; else the three counts.
    fn assert_exact(self, name: &str, (c, at): (i64, i64)) -> (usize, usize, usize) {
        assert!(
            self.missing.is_empty() && self.wrong.is_empty(),
            "{name} restored to {}: {} of {} keys acknowledged before {} are missing (first {:?}), {} hold another value",
            rfc3339(at),
            self.missing.len(),
            self.must,
            rfc3339(c),
            self.missing.first(),
            self.wrong.len()
        );
        assert!(
            self.extra.is_empty(),
            "{name} restored to {}: {} of {} keys written after it are there (first {:?})",
            rfc3339(at),
            self.extra.len(),
            self.must_not,
            self.extra.first()
        );
        (self.must, self.must_not, self.either)
    }
}

/// Checks Redis `name` against the writes: every key acknowledged at or
/// before `c` holds its value, no key sent after `c` exists. Returns
/// (keys that must be there, keys that must not, keys sent before and
/// acknowledged after or never: either way).
async fn check(
    client: &Client,
    ns: &str,
    name: &str,
    stamps: &[Stamp],
    c: i64,
) -> (usize, usize, usize) {
    let primary = redis_api(client, ns)
        .get(name)
        .await
        .expect("redis")
        .status
        .and_then(|s| s.primary)
        .expect("primary");
    let pw = redis_password(client, ns, name).await;
    let mut node = connect_pod(client, ns, &primary, &pw)
        .await
        .expect("connect");
    let mut verdict = Verdict::default();
    for chunk in stamps.chunks(500) {
        let mut cmd = redis::cmd("MGET");
        for s in chunk {
            cmd.arg(&s.key);
        }
        let values: Vec<Option<String>> = node.query("MGET", &cmd).await.expect("MGET");
        for (s, v) in chunk.iter().zip(values) {
            verdict.judge(s, v, (c, c));
        }
    }
    verdict.assert_exact(name, (c, c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replication_redis_restores_to_a_chosen_time_across_a_primary_kill() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let mut op = start_operator(&client, OperatorOptions::watching(&[ns])).await;

    apply_redis(
        &client,
        ns,
        "src",
        json!({"mode": "Replication", "instances": 3,
               "archive": {"target": {"s3": s3_location(&s3)}}}),
    )
    .await;
    let src = wait_ready(&client, ns, "src", READY).await;
    let first = src.status.and_then(|s| s.primary).expect("primary");
    let a = archive_status(
        &client,
        ns,
        "src",
        "src to be archived",
        Duration::from_secs(90),
        |a| a.archiver.is_some() && a.newest.is_some(),
    )
    .await;
    let archiver = a.archiver.clone().unwrap_or_default();
    assert_ne!(
        archiver, first,
        "a Redis with replicas is archived from a replica, never its primary: {a:?}"
    );
    println!("archive: {} from {archiver}", a.location);

    let pw = redis_password(&client, ns, "src").await;
    let writer = TimedWriter::start(&client, ns, "src", &pw, "w");
    writer.wait_acked(500, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before_kill = now_ms();
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kill -9 the primary under the writer: a failover.
    let mut node = connect_pod(&client, ns, &first, &pw)
        .await
        .expect("connect");
    let pid = server_pid(&mut node).await;
    drop(node);
    let acked_at_kill = writer.acked.load(Ordering::SeqCst);
    kill_9(pid);
    let killed = now_ms();
    let api = redis_api(&client, ns);
    let second = wait_for("a failover", Duration::from_secs(60), || async {
        let p = api.get("src").await.ok()?.status?.primary?;
        (p != first).then_some(p)
    })
    .await;
    writer
        .wait_acked(acked_at_kill + 500, Duration::from_secs(60))
        .await;
    println!(
        "primary {first} killed; {second} took over {:.1} s later",
        (now_ms() - killed) as f64 / 1000.0
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_failover = now_ms();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stamps = writer.stop().await;
    let acked = stamps.iter().filter(|s| s.acked.is_some()).count();
    println!("writer: {} writes, {acked} acknowledged", stamps.len());

    let a = archived_past(&client, ns, "src", after_failover + 500).await;
    assert!(
        a.holes.is_empty(),
        "the archive has holes after the failover: {:?}",
        a.holes
    );
    println!(
        "archive after the failover: archiver {:?}, window {:?} .. {:?}, {} bytes, lag {:?} s",
        a.archiver,
        a.earliest,
        a.newest,
        a.size_bytes.unwrap_or(0),
        a.lag_seconds
    );

    // Before the kill, into a Standalone.
    let c1 = restore(
        &client,
        ns,
        "at-one",
        &s3,
        &a.key,
        before_kill,
        json!({"mode": "Standalone"}),
    )
    .await;
    let (must, must_not, either) = check(&client, ns, "at-one", &stamps, c1).await;
    println!(
        "at-one: {must} keys present as required, {must_not} absent as required, {either} either way"
    );
    assert!(
        must > 500 && must_not > 500,
        "too few writes on either side of the time"
    );
    // kill -9 of the restored server: it restarts in place from its own
    // RDB file (the restored append-only file was removed once saved).
    let pw1 = redis_password(&client, ns, "at-one").await;
    let mut node = connect_pod(&client, ns, "at-one-0", &pw1)
        .await
        .expect("connect");
    let old_pid = server_pid(&mut node).await;
    drop(node);
    kill_9(old_pid);
    let mut node = wait_for("at-one-0 to restart", Duration::from_secs(60), || async {
        let mut n = connect_pod(&client, ns, "at-one-0", &pw1).await.ok()?;
        let pid = server_pid(&mut n).await;
        (pid != old_pid).then_some(n)
    })
    .await;
    let aof: String = node
        .query(
            "CONFIG GET",
            redis::cmd("CONFIG").arg("GET").arg("appendonly"),
        )
        .await
        .map(|v: Vec<String>| v.join(" "))
        .expect("CONFIG GET");
    assert_eq!(
        aof, "appendonly no",
        "the restarted server must start as configured"
    );
    drop(node);
    let again = check(&client, ns, "at-one", &stamps, c1).await;
    assert_eq!(
        again.0, must,
        "after a kill -9 the restored keys are all there"
    );

    // After the failover, into a Replication Redis; the operator is
    // killed while the restored instance loads and restarted.
    let mut spec = json!({"mode": "Replication", "instances": 2});
    spec["bootstrap"] = json!({"fromBackup": {"s3": s3_location(&s3), "key": a.key,
                                              "pointInTime": rfc3339(after_failover)}});
    apply_redis(&client, ns, "at-two", spec).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for("at-two-0 to exist", Duration::from_secs(60), || async {
        pods.get_opt("at-two-0").await.ok().flatten().map(|_| ())
    })
    .await;
    op.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _op2 = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    let c2 = restore_done(&client, ns, "at-two", after_failover).await;
    let (must, must_not, either) = check(&client, ns, "at-two", &stamps, c2).await;
    println!(
        "at-two: {must} keys present as required, {must_not} absent as required, {either} either way"
    );
    let before = stamps
        .iter()
        .filter(|s| s.acked.is_some_and(|t| t < killed))
        .count();
    let after = stamps
        .iter()
        .filter(|s| s.acked.is_some_and(|t| t > killed && t <= c2))
        .count();
    assert!(
        before > 500 && after > 200,
        "the restore after the failover must hold writes from both sides of it ({before} before, {after} after)"
    );
    // The restored Redis keeps its data as a plain RDB Redis: the
    // restored append-only file is gone once it saved.
    let r = api.get("at-two").await.expect("at-two");
    println!(
        "at-two status.bootstrap: {:?}",
        r.status.and_then(|s| s.bootstrap)
    );
}

/// `status.bootstrap` of Redis `name` once it is Ready and its bootstrap
/// done (the restored data saved as the server's RDB file).
async fn bootstrapped(
    client: &Client,
    ns: &str,
    name: &str,
) -> redpilot::api::v1alpha1::BootstrapStatus {
    wait_ready(client, ns, name, READY).await;
    let api = redis_api(client, ns);
    wait_for(
        &format!("{name}'s bootstrap to be done"),
        Duration::from_secs(60),
        || async {
            let bs = api.get(name).await.ok()?.status?.bootstrap?;
            bs.done.then_some(bs)
        },
    )
    .await
}

/// Waits for a restore created earlier and checks its checkpoint.
async fn restore_done(client: &Client, ns: &str, name: &str, at: i64) -> i64 {
    let bs = bootstrapped(client, ns, name).await;
    let to = parse_ms(bs.restored_to.as_deref().expect("restoredTo"));
    assert!(
        to <= at && at - to <= 250,
        "{name}: restored to {} for {}",
        rfc3339(to),
        rfc3339(at)
    );
    to
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standalone_archive_catches_up_after_the_store_was_down_for_a_minute() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr-store", &[]).await;
    let ns = tns.name.as_str();
    let mut s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(
        &client,
        ns,
        "solo",
        json!({"mode": "Standalone", "archive": {"target": {"s3": s3_location(&s3)}}}),
    )
    .await;
    let r = wait_ready(&client, ns, "solo", READY).await;
    let pod = r.status.and_then(|s| s.primary).expect("primary");
    let a = archive_status(
        &client,
        ns,
        "solo",
        "solo to be archived",
        Duration::from_secs(90),
        |a| a.archiver.is_some() && a.newest.is_some(),
    )
    .await;
    assert_eq!(
        a.archiver.as_deref(),
        Some(pod.as_str()),
        "a Standalone archives its only instance"
    );
    let pw = redis_password(&client, ns, "solo").await;
    let writer = TimedWriter::start(&client, ns, "solo", &pw, "s");
    writer.wait_acked(300, Duration::from_secs(30)).await;

    // The store goes away for a minute.
    s3.kill();
    let down = now_ms();
    tokio::time::sleep(Duration::from_secs(25)).await;
    let inside = now_ms();
    let ip = pod_ip(&client, ns, &pod).await;
    let metrics = sidecar_metrics(&ip).await;
    let lag = metric(&metrics, "redpilot_archive_lag_seconds");
    let bound = metric(&metrics, "redpilot_archive_lag_bound_seconds");
    println!("25 s into the outage: lag {lag} s (alert bound {bound} s)");
    assert!(
        lag > bound,
        "the lag must be over the alert's bound while the store is down: {metrics}"
    );
    let seen = archive_status(
        &client,
        ns,
        "solo",
        "the status to show the lag",
        Duration::from_secs(60),
        |a| a.lag_seconds.is_some_and(|l| l > 20.0),
    )
    .await;
    println!(
        "status.archive during the outage: lag {:?} s, message {:?}",
        seen.lag_seconds, seen.message
    );
    tokio::time::sleep(Duration::from_secs(60 - 25)).await;
    s3.restart();
    let back = now_ms();
    println!("store down for {:.1} s", (back - down) as f64 / 1000.0);
    // Caught up: the sidecar's lag back under its bound.
    let lag = wait_for(
        "the archive to catch up",
        Duration::from_secs(60),
        || async {
            let m = sidecar_metrics(&ip).await;
            let lag = metric(&m, "redpilot_archive_lag_seconds");
            (lag >= 0.0 && lag < bound).then_some(lag)
        },
    )
    .await;
    let caught = now_ms();
    println!(
        "caught up {:.1} s after the store came back; lag then {lag} s",
        (caught - back) as f64 / 1000.0
    );
    let stamps = writer.stop().await;
    let a = archived_past(&client, ns, "solo", caught).await;
    assert!(a.holes.is_empty(), "the outage left a hole: {:?}", a.holes);

    let c = restore(
        &client,
        ns,
        "solo-at",
        &s3,
        &a.key,
        inside,
        json!({"mode": "Standalone"}),
    )
    .await;
    let (must, must_not, either) = check(&client, ns, "solo-at", &stamps, c).await;
    println!(
        "solo-at: {must} keys present as required, {must_not} absent as required, {either} either way"
    );
    assert!(must > 300 && must_not > 300);
    // A time outside the window is refused with the window in the message.
    let mut spec = json!({"mode": "Standalone"});
    spec["bootstrap"] = json!({"fromBackup": {"s3": s3_location(&s3), "key": a.key,
                                              "pointInTime": rfc3339(down - 3_600_000)}});
    apply_redis(&client, ns, "too-early", spec).await;
    let why = not_restorable(&client, ns, "too-early").await;
    println!("too-early: {why}");
    assert!(why.contains("can restore from"), "{why}");
}

async fn sidecar_metrics(ip: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((ip, 9122))
        .await
        .expect("sidecar");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {page}"))
}

/// `REDPILOT_PITR_BASE_MB` and `REDPILOT_PITR_WRITE_SECONDS` (`make
/// bench-pitr`); small by default.
fn bench_sizes() -> (u64, u64) {
    let get = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    (
        get("REDPILOT_PITR_BASE_MB", 8),
        get("REDPILOT_PITR_WRITE_SECONDS", 10),
    )
}

/// Writes 1 KiB values with 32 commands in flight for `secs` seconds over
/// at most 65,536 keys (overwritten in turn, so the data stays under
/// 100 MiB whatever the rate: a faster client once filled maxmemory);
/// returns the writes acknowledged.
async fn pipelined_writes(node: &mut Node, prefix: &str, secs: u64) -> u64 {
    let value = vec![b'v'; 1024];
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        let mut p = redis::pipe();
        for i in 0..32 {
            p.cmd("SET")
                .arg(format!("{prefix}:{}", (n + i) % 65_536))
                .arg(&value)
                .ignore();
        }
        let _: () = node.pipeline("SET", &p).await.expect("pipelined SET");
        n += 32;
    }
    n
}

/// Recovery point (how far the stored archive is behind a steady writer),
/// the archive's cost to the primary's throughput (the same writer with
/// and without `spec.archive`, a Standalone: the archive reads the primary
/// itself), and the time to restore a base plus the writes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_archive_keeps_up_costs_little_and_restores_a_base_and_its_writes() {
    let (base_mb, write_secs) = bench_sizes();
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr-bench", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    let memory = format!("{}Mi", (base_mb * 3).max(256) + 256);
    let shape = |archive: bool| {
        let mut s = json!({"mode": "Standalone",
                           "resources": {"limits": {"memory": memory}}});
        if archive {
            s["archive"] = json!({"target": {"s3": s3_location(&s3)}});
        }
        s
    };
    apply_redis(&client, ns, "plain", shape(false)).await;
    apply_redis(&client, ns, "arch", shape(true)).await;
    wait_ready(&client, ns, "plain", READY).await;
    wait_ready(&client, ns, "arch", READY).await;
    archive_status(
        &client,
        ns,
        "arch",
        "arch to be archived",
        Duration::from_secs(90),
        |a| a.archiver.is_some() && a.newest.is_some(),
    )
    .await;

    // Throughput with and without the archive, one after the other.
    let mut rates = Vec::new();
    for name in ["plain", "arch"] {
        let pw = redis_password(&client, ns, name).await;
        let mut node = connect_pod(&client, ns, &format!("{name}-0"), &pw)
            .await
            .expect("connect");
        let t = Instant::now();
        let n = pipelined_writes(&mut node, "t", 5).await;
        rates.push(n as f64 / t.elapsed().as_secs_f64());
        let _: () = node
            .query("FLUSHALL", &redis::cmd("FLUSHALL"))
            .await
            .expect("FLUSHALL");
    }
    println!(
        "throughput, 1 KiB SETs 32 in flight: {:.0} ops/s without the archive, {:.0} with ({:+.1} %)",
        rates[0],
        rates[1],
        (rates[1] / rates[0] - 1.0) * 100.0
    );

    // The base: a Replication Redis holding BASE_MB of 1 KiB values is
    // given an archive (its pods roll, by switchover), whose first run
    // begins with a full resync: a base holding them all.
    let big_shape = json!({"mode": "Replication", "instances": 2,
                           "resources": {"limits": {"memory": memory}}});
    apply_redis(&client, ns, "big", big_shape.clone()).await;
    let r = wait_ready(&client, ns, "big", READY).await;
    let primary = r.status.and_then(|s| s.primary).expect("primary");
    let pw = redis_password(&client, ns, "big").await;
    let mut node = connect_pod(&client, ns, &primary, &pw)
        .await
        .expect("connect");
    let keys = base_mb * 1024;
    let t = Instant::now();
    // Values that do not compress (the RDB file is LZF-compressed): a
    // xorshift stream.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
        let mut c = redis::cmd("MSET");
        for i in chunk {
            let mut v = Vec::with_capacity(1024);
            while v.len() < 1024 {
                v.extend_from_slice(&noise().to_le_bytes());
            }
            c.arg(format!("base:{i}")).arg(v);
        }
        node.query_within::<()>("MSET", &c, Duration::from_secs(60))
            .await
            .expect("MSET");
    }
    drop(node);
    println!(
        "base: {keys} keys of 1 KiB written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut with_archive = big_shape.clone();
    with_archive["archive"] = json!({"target": {"s3": s3_location(&s3)}});
    apply_redis(&client, ns, "big", with_archive).await;
    let t = Instant::now();
    archive_status(&client, ns, "big", "big to be archived", READY, |a| {
        a.archiver.is_some() && a.newest.is_some()
    })
    .await;
    wait_ready(&client, ns, "big", READY).await;
    println!(
        "archive on: pods rolled and the first base stored in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let archiver = redis_api(&client, ns)
        .get("big")
        .await
        .expect("big")
        .status
        .and_then(|s| s.archive?.archiver)
        .expect("archiver");

    // A steady writer; the stored archive's lag sampled every 200 ms.
    let ip = pod_ip(&client, ns, &archiver).await;
    let writer = TimedWriter::start(&client, ns, "big", &pw, "w");
    let mut lags = Vec::new();
    let end = Instant::now() + Duration::from_secs(write_secs);
    while Instant::now() < end {
        if let Some(s) = redpilot::controller::redis::archive::fetch(&ip).await
            && s.newest_ms > 0
        {
            lags.push((now_ms() - s.newest_ms) as f64 / 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let at = now_ms();
    let stamps = writer.stop().await;
    lags.sort_by(f64::total_cmp);
    let pick = |q: f64| lags[((lags.len() - 1) as f64 * q) as usize];
    println!(
        "recovery point under {:.0} writes/s: p50 {:.2} s, p99 {:.2} s, max {:.2} s ({} samples)",
        stamps.len() as f64 / write_secs as f64,
        pick(0.5),
        pick(0.99),
        pick(1.0),
        lags.len()
    );
    assert!(
        pick(0.99) < 5.0,
        "the archive fell behind a steady writer: {lags:?}"
    );
    let a = archived_past(&client, ns, "big", at + 500).await;
    println!("archive: {} bytes", a.size_bytes.unwrap_or(0));

    // Restore to the end of the writes: the base and everything after it.
    let t = Instant::now();
    let c = restore(
        &client,
        ns,
        "back",
        &s3,
        &a.key,
        at,
        json!({"mode": "Standalone",
        "resources": {"limits": {"memory": memory}}}),
    )
    .await;
    let took = t.elapsed();
    let (must, must_not, either) = check(&client, ns, "back", &stamps, c).await;
    let pw2 = redis_password(&client, ns, "back").await;
    let mut back = connect_pod(&client, ns, "back-0", &pw2)
        .await
        .expect("connect");
    let size: i64 = back
        .query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE");
    println!(
        "restore of a {base_mb} MiB base and {write_secs} s of writes to Ready and saved: {:.1} s; {size} keys, {must} written keys present as required, {must_not} absent, {either} either way",
        took.as_secs_f64()
    );
    assert!(
        size as u64 >= keys + must as u64,
        "the base's keys are not all there: {size}"
    );
}

/// Writes `prefix:N` = `N` one at a time through a cluster client (slot
/// owners learnt from redirections), with no retry: a write that errs is
/// recorded as not acknowledged.
fn cluster_writer(
    seed: Endpoint,
    pw: &str,
    prefix: &str,
    stop: Arc<AtomicBool>,
    acked: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<Vec<Stamp>> {
    cluster_writer_reseeded(seed, None, pw, prefix, stop, acked)
}

/// [`cluster_writer`] that, after a failed write, takes its seed again
/// from the pods `<redis>-s0-0` and `<redis>-s0-1` in turn (a roll gives
/// every pod a new address).
fn cluster_writer_reseeded(
    seed: Endpoint,
    reseed: Option<(Client, String, String)>,
    pw: &str,
    prefix: &str,
    stop: Arc<AtomicBool>,
    acked: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<Vec<Stamp>> {
    let opts = ConnectOptions::default()
        .with_password(pw.to_string())
        .with_timeouts(Duration::from_millis(500), Duration::from_millis(500));
    let prefix = prefix.to_string();
    tokio::spawn(async move {
        let mut c = cluster_client::Client::new(seed, opts);
        let mut stamps = Vec::new();
        let mut n = 0u64;
        let mut failed = 0u64;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let key = format!("{prefix}:{n}");
            let sent = now_ms();
            let r: Result<String, String> = c.run(&key, redis::cmd("SET").arg(&key).arg(n)).await;
            let ok = matches!(r.as_deref(), Ok("OK"));
            if ok {
                acked.fetch_add(1, Ordering::SeqCst);
            } else if let Some((client, ns, name)) = &reseed {
                failed += 1;
                let pod = format!("{name}-s0-{}", failed % 2);
                let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
                if let Some(ip) = pods
                    .get_opt(&pod)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|p| p.status?.pod_ip)
                {
                    c.set_seed(Endpoint::new(ip, 6379));
                }
            }
            stamps.push(Stamp {
                key,
                sent,
                acked: ok.then(now_ms),
            });
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stamps
    })
}

/// Checks Cluster Redis `name` restored to `at` (every shard at its own
/// last checkpoint at or before it, the earliest `c`): every key
/// acknowledged before `c` holds its value, no key sent after `at` exists.
async fn check_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    stamps: &[Stamp],
    (c, at): (i64, i64),
) -> (usize, usize, usize) {
    let pw = redis_password(client, ns, name).await;
    let seed = Endpoint::new(pod_ip(client, ns, &format!("{name}-s0-0")).await, 6379);
    let opts = ConnectOptions::default()
        .with_password(pw)
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let mut reader = cluster_client::Client::new(seed, opts);
    let mut verdict = Verdict::default();
    for s in stamps {
        let v: Option<String> = reader
            .run(&s.key, redis::cmd("GET").arg(&s.key))
            .await
            .unwrap_or_else(|e| panic!("{name}: GET {}: {e}", s.key));
        verdict.judge(s, v, (c, at));
    }
    verdict.assert_exact(name, (c, at))
}

/// The slot ranges of a Redis's shards as its status lists them.
async fn served_slots(client: &Client, ns: &str, name: &str) -> Vec<String> {
    let r = redis_api(client, ns).get(name).await.expect("redis");
    r.status
        .map(|s| {
            s.shards
                .iter()
                .map(|x| x.slots.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// Times at which a shard's archived layout says slots were moving (a
/// checkpoint's mark), read from the segments the S3 server holds.
fn moving_marks(s3: &S3Server, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    let mut dirs = vec![s3.bucket_dir(BUCKET).join(key)];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if !name.starts_with("seg-") {
                continue;
            }
            let body = std::fs::read(&p).expect("segment");
            let line = body.split(|b| *b == b'\n').next().unwrap_or_default();
            let h: Value = serde_json::from_slice(line).expect("segment header");
            for m in h["layout"].as_array().into_iter().flatten() {
                if m["moving"] == true {
                    out.push(m["at"].as_i64().expect("at"));
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// Cluster Redis `c` (3 shards of a primary and a replica, Valkey 8.1)
/// archived to `s3`, once Ready and each shard archived from its replica
/// (its primary's sidecar stands in only while no replica is online).
async fn archived_cluster(
    client: &Client,
    ns: &str,
    s3: &S3Server,
) -> redpilot::api::v1alpha1::ArchiveStatus {
    apply_redis(
        client,
        ns,
        "c",
        json!({"mode": "Cluster", "shards": 3, "instances": 2,
               "engine": "Valkey", "version": "8.1",
               "archive": {"target": {"s3": s3_location(s3)}}}),
    )
    .await;
    wait_ready(client, ns, "c", READY).await;
    // Each shard's replica as the status names it (the cluster's own
    // election may make either pod of a shard its primary at creation).
    let replicas: Vec<String> = redis_api(client, ns)
        .get("c")
        .await
        .expect("redis c")
        .status
        .map(|s| s.shards)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|s| s.replicas)
        .collect();
    assert_eq!(replicas.len(), 3, "one replica per shard: {replicas:?}");
    archive_status(
        client,
        ns,
        "c",
        "every shard of c to be archived from its replica, not its primary",
        Duration::from_secs(120),
        |a| {
            a.archiver.as_deref().is_some_and(|x| {
                x.split(", ").count() == 3 && x.split(", ").all(|p| replicas.iter().any(|r| r == p))
            }) && a.newest.is_some()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_shard_of_a_cluster_restores_to_one_time_with_the_layout_of_that_time() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr-cluster", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    let shape = |shards: i32| {
        json!({"mode": "Cluster", "shards": shards, "instances": 1,
               "engine": "Valkey", "version": "8.1"})
    };
    let a = archived_cluster(&client, ns, &s3).await;
    let archivers = a.archiver.clone().unwrap_or_default();
    println!("archive: {} from {archivers}", a.location);
    let before = served_slots(&client, ns, "c").await;

    let pw = redis_password(&client, ns, "c").await;
    let seed = Endpoint::new(pod_ip(&client, ns, "c-s0-0").await, 6379);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = cluster_writer(seed, &pw, "k", stop.clone(), acked.clone());
    let wait_acked = |more_than: u64| {
        let acked = acked.clone();
        async move {
            wait_for("the writer's writes", Duration::from_secs(60), || async {
                (acked.load(Ordering::SeqCst) > more_than).then_some(())
            })
            .await
        }
    };
    wait_acked(800).await;
    let t1 = now_ms();
    wait_acked(acked.load(Ordering::SeqCst) + 500).await;

    // 3 -> 4 shards under the writer.
    let started = Instant::now();
    support::operator::patch_redis(&client, ns, "c", json!({"spec": {"shards": 4}})).await;
    wait_for(
        "the resharding to finish",
        Duration::from_secs(240),
        || async {
            let r = redis_api(&client, ns).get("c").await.ok()?;
            let st = r.status?;
            let rs = st.resharding?;
            (rs.to_shards == 4
                && rs.phase == redpilot::api::v1alpha1::ReshardingPhase::Done
                && st.shards.len() == 4)
                .then_some(())
        },
    )
    .await;
    println!("3 -> 4 shards in {:.1} s", started.elapsed().as_secs_f64());
    wait_acked(acked.load(Ordering::SeqCst) + 500).await;
    let t2 = now_ms();
    wait_acked(acked.load(Ordering::SeqCst) + 300).await;
    stop.store(true, Ordering::SeqCst);
    let stamps = writer.await.expect("writer");
    let after = served_slots(&client, ns, "c").await;
    println!(
        "writer: {} writes, {} acknowledged; layout before {before:?}, after {after:?}",
        stamps.len(),
        stamps.iter().filter(|s| s.acked.is_some()).count()
    );
    assert_eq!(after.len(), 4, "{after:?}");
    let a = archived_past(&client, ns, "c", t2 + 500).await;
    assert!(a.holes.is_empty(), "holes: {:?}", a.holes);

    // Before the resharding: three shards with the layout of then; after
    // it: four shards, each with the slots it served then (no even spread:
    // the resharding moved slots from each of the three).
    for (name, at, layout, least) in [
        ("before", t1, &before, (500, 1000)),
        ("after", t2, &after, (1500, 200)),
    ] {
        let shards = i32::try_from(layout.len()).expect("shards");
        let c = restore(&client, ns, name, &s3, &a.key, at, shape(shards)).await;
        let (must, must_not, either) = check_cluster(&client, ns, name, &stamps, (c, at)).await;
        println!(
            "{name}: {must} keys present as required, {must_not} absent as required, {either} either way"
        );
        assert!(
            must > least.0 && must_not > least.1,
            "{name}: too few writes on either side of the time"
        );
        assert_eq!(
            &served_slots(&client, ns, name).await,
            layout,
            "{name}'s layout"
        );
        redis_api(&client, ns)
            .delete(name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }

    // While slots moved: refused, with the reason.
    let marks = moving_marks(&s3, &a.key);
    println!("{} checkpoints recorded slots moving", marks.len());
    let during = *marks
        .get(marks.len() / 2)
        .expect("the archive recorded the resharding's open slots");
    let mut spec = shape(4);
    spec["bootstrap"] = json!({"fromBackup": {"s3": s3_location(&s3), "key": a.key,
                                              "pointInTime": rfc3339(during)}});
    apply_redis(&client, ns, "during", spec).await;
    let why = not_restorable(&client, ns, "during").await;
    println!("during ({}): {why}", rfc3339(during));
    assert!(why.contains("slots were moving"), "{why}");
}

/// An upgrade under the archive: a Replication Redis of three (Valkey 8.1,
/// archived from a replica) upgraded to 9.1 under the writer; the rolls
/// restart every instance, the archiving one among them, and a switchover
/// moves the primary. The archive goes on with no hole, and times before
/// and after the upgrade restore exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_archive_continues_through_an_upgrade_with_no_hole() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr-upgrade", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(
        &client,
        ns,
        "up",
        json!({"mode": "Replication", "instances": 3, "engine": "Valkey", "version": "8.1",
               "archive": {"target": {"s3": s3_location(&s3)}}}),
    )
    .await;
    wait_ready(&client, ns, "up", READY).await;
    let a = archive_status(
        &client,
        ns,
        "up",
        "up to be archived",
        Duration::from_secs(90),
        |a| a.archiver.is_some() && a.newest.is_some(),
    )
    .await;
    println!("archive: {} from {:?}", a.location, a.archiver);
    let pw = redis_password(&client, ns, "up").await;
    let writer = TimedWriter::start(&client, ns, "up", &pw, "u");
    writer.wait_acked(500, Duration::from_secs(30)).await;
    let before = now_ms();
    let n = writer.acked.load(Ordering::SeqCst);
    writer.wait_acked(n + 300, Duration::from_secs(30)).await;

    let started = Instant::now();
    support::operator::patch_redis(&client, ns, "up", json!({"spec": {"version": "9.1"}})).await;
    let api = redis_api(&client, ns);
    wait_for(
        "the upgrade to 9.1 to succeed",
        Duration::from_secs(300),
        || async {
            let st = api.get("up").await.ok()?.status?;
            (st.upgrade
                .as_ref()
                .is_some_and(|u| u.phase == redpilot::api::v1alpha1::UpgradePhase::Succeeded)
                && st
                    .current_version
                    .as_deref()
                    .is_some_and(|v| v.starts_with("9.1") && !v.contains(',')))
            .then_some(())
        },
    )
    .await;
    println!("8.1 -> 9.1 in {:.1} s", started.elapsed().as_secs_f64());
    let n = writer.acked.load(Ordering::SeqCst);
    writer.wait_acked(n + 300, Duration::from_secs(60)).await;
    let after = now_ms();
    let n = writer.acked.load(Ordering::SeqCst);
    writer.wait_acked(n + 300, Duration::from_secs(30)).await;
    let stamps = writer.stop().await;
    let during = stamps
        .iter()
        .filter(|s| s.acked.is_some_and(|t| t > before && t < after))
        .count();
    println!(
        "writer: {} writes, {} acknowledged, {during} of them between the two times",
        stamps.len(),
        stamps.iter().filter(|s| s.acked.is_some()).count()
    );

    let a = archived_past(&client, ns, "up", after + 500).await;
    assert!(
        a.holes.is_empty(),
        "the archive has holes after the upgrade: {:?}",
        a.holes
    );
    println!(
        "archive after the upgrade: archiver {:?}, window {:?} .. {:?}, lag {:?} s",
        a.archiver, a.earliest, a.newest, a.lag_seconds
    );
    // The two restores side by side.
    for (name, at) in [("up-before", before), ("up-after", after)] {
        let mut spec = json!({"mode": "Standalone", "engine": "Valkey", "version": "9.1"});
        spec["bootstrap"] = json!({"fromBackup": {"s3": s3_location(&s3), "key": a.key,
                                                  "pointInTime": rfc3339(at)}});
        apply_redis(&client, ns, name, spec).await;
    }
    let c1 = restore_done(&client, ns, "up-before", before).await;
    let (must, must_not, either) = check(&client, ns, "up-before", &stamps, c1).await;
    println!(
        "up-before: {must} present as required, {must_not} absent as required, {either} either way"
    );
    let c2 = restore_done(&client, ns, "up-after", after).await;
    let (must, must_not, either) = check(&client, ns, "up-after", &stamps, c2).await;
    println!(
        "up-after: {must} present as required, {must_not} absent as required, {either} either way"
    );
    assert!(
        must > 500 + during / 2 && must_not > 200,
        "the restore after the upgrade must hold the writes made during it"
    );
}

/// The update revision of each of `sets` now (before a change that rolls
/// them).
async fn revisions(client: &Client, ns: &str, sets: &[String]) -> Vec<String> {
    let api: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns);
    let mut out = Vec::new();
    for set in sets {
        let s = api.get(set).await.expect("statefulset");
        out.push(
            s.status
                .and_then(|st| st.update_revision)
                .unwrap_or_default(),
        );
    }
    out
}

/// Waits until each of `sets` has a new update revision (not the one in
/// `before`) and its `instances` pods all run it and are Ready.
async fn rolled(client: &Client, ns: &str, sets: &[String], before: &[String], instances: usize) {
    let api: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for("the roll to finish", Duration::from_secs(300), || async {
        for (set, old) in sets.iter().zip(before) {
            let s = api.get(set).await.ok()?;
            let update = s.status.as_ref()?.update_revision.clone()?;
            if update == *old {
                return None;
            }
            for i in 0..instances {
                let p = pods.get(&format!("{set}-{i}")).await.ok()?;
                let rev = p
                    .metadata
                    .labels
                    .as_ref()?
                    .get("controller-revision-hash")?;
                if *rev != update || !support::operator::pod_ready(&p) {
                    return None;
                }
            }
        }
        Some(())
    })
    .await;
}

/// `Degraded`'s `NotRestorable` message of Redis `name`, once it has one.
async fn not_restorable(client: &Client, ns: &str, name: &str) -> String {
    wait_for(
        &format!("{name} to be refused"),
        Duration::from_secs(120),
        || async {
            let r: Redis = redis_api(client, ns).get(name).await.ok()?;
            r.status?
                .conditions
                .iter()
                .find(|c| {
                    c.type_ == "Degraded" && c.status == "True" && c.reason == "NotRestorable"
                })
                .map(|c| c.message.clone())
        },
    )
    .await
}

/// A roll of a Replication Redis of two restarts its only replica, the
/// archiving one: the restarted server resyncs in full (its backlog begins
/// after the archive's end), so the archive begins a new run and reports
/// the span between as a hole. No checkpoint places the writes made
/// inside it, so a time in the hole is refused, naming the nearest times
/// that restore exactly (before this, it restored to the last checkpoint
/// before the hole, seconds short of the time asked, and said nothing);
/// a time after the roll restores exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_time_inside_a_hole_a_roll_left_is_refused_and_one_after_restores_exactly() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr-hole", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(
        &client,
        ns,
        "two",
        json!({"mode": "Replication", "instances": 2,
               "archive": {"target": {"s3": s3_location(&s3)}}}),
    )
    .await;
    wait_ready(&client, ns, "two", READY).await;
    archive_status(
        &client,
        ns,
        "two",
        "two to be archived",
        Duration::from_secs(90),
        |a| a.archiver.is_some() && a.newest.is_some(),
    )
    .await;
    let pw = redis_password(&client, ns, "two").await;
    let writer = TimedWriter::start(&client, ns, "two", &pw, "h");
    writer.wait_acked(500, Duration::from_secs(30)).await;

    // A change only a restart applies: both instances restart in turn.
    let sets = vec!["two".to_string()];
    let before = revisions(&client, ns, &sets).await;
    support::operator::patch_redis(
        &client,
        ns,
        "two",
        json!({"spec": {"config": {"tcp-backlog": "600"}}}),
    )
    .await;
    rolled(&client, ns, &sets, &before, 2).await;
    // The fault: the restarted replica could not continue the archive; it
    // began again (a new run) once an instance was an online replica.
    let a = archive_status(
        &client,
        ns,
        "two",
        "a hole, and the archive going on after it",
        Duration::from_secs(120),
        |a| {
            a.holes.last().is_some_and(|h| {
                let to = h.split_once('/').map_or(i64::MAX, |(_, to)| parse_ms(to));
                a.newest
                    .as_deref()
                    .is_some_and(|n| parse_ms(n) > to + 2_000)
            })
        },
    )
    .await;
    println!("archive after the roll: holes {:?}", a.holes);
    let n = writer.acked.load(Ordering::SeqCst);
    writer.wait_acked(n + 500, Duration::from_secs(60)).await;
    let after = now_ms();
    let n = writer.acked.load(Ordering::SeqCst);
    writer.wait_acked(n + 300, Duration::from_secs(30)).await;
    let stamps = writer.stop().await;
    let a = archived_past(&client, ns, "two", after + 500).await;
    let hole = a.holes.first().expect("the hole seen above");
    let (from, to) = hole.split_once('/').expect("<from>/<to>");
    let (from, to) = (parse_ms(from), parse_ms(to));
    assert!(to - from > 2_000, "a hole of {} ms", to - from);
    let written_inside = stamps
        .iter()
        .filter(|s| s.acked.is_some_and(|t| t > from && t < to))
        .count();
    println!(
        "hole {:.1} s long, {written_inside} writes acknowledged inside it",
        (to - from) as f64 / 1000.0
    );
    assert!(written_inside > 100, "the writer wrote through the hole");

    // A time inside the hole: refused, with the times that restore.
    let inside = (from + to) / 2;
    let mut spec = json!({"mode": "Standalone"});
    spec["bootstrap"] = json!({"fromBackup": {"s3": s3_location(&s3), "key": a.key,
                                              "pointInTime": rfc3339(inside)}});
    apply_redis(&client, ns, "in-hole", spec).await;
    let why = not_restorable(&client, ns, "in-hole").await;
    println!("in-hole: {why}");
    assert!(
        why.contains("past the archive's last checkpoint before it") && why.contains("from "),
        "{why}"
    );
    // A time after the roll restores exactly.
    let c = restore(
        &client,
        ns,
        "after-roll",
        &s3,
        &a.key,
        after,
        json!({"mode": "Standalone"}),
    )
    .await;
    let (must, must_not, either) = check(&client, ns, "after-roll", &stamps, c).await;
    println!(
        "after-roll: {must} present as required, {must_not} absent as required, {either} either way"
    );
    assert!(must > 500 + written_inside && must_not > 200);
}

/// Every run of line `line` of the archive under `key` in the S3 server's
/// files: its `run.json` and the checkpoint times of its segments.
fn runs_of(s3: &S3Server, key: &str, line: &str) -> Vec<(Value, Vec<i64>)> {
    let dir = s3.bucket_dir(BUCKET).join(key).join(line);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
    {
        let run_dir = e.path();
        let Ok(info) = std::fs::read(run_dir.join("run.json")) else {
            continue;
        };
        let info: Value = serde_json::from_slice(&info).expect("run.json");
        let mut times = Vec::new();
        for f in std::fs::read_dir(&run_dir).expect("run dir").flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if !name.starts_with("seg-") {
                continue;
            }
            let body = std::fs::read(f.path()).expect("segment");
            let head = body.split(|b| *b == b'\n').next().unwrap_or_default();
            let h: Value = serde_json::from_slice(head).expect("segment header");
            for c in h["checkpoints"].as_array().into_iter().flatten() {
                times.push(c[0].as_i64().expect("checkpoint time"));
            }
        }
        times.sort_unstable();
        out.push((info, times));
    }
    out.sort_by_key(|(i, _)| i["run"].as_str().unwrap_or_default().to_string());
    out
}

/// A roll of a Cluster Redis with one replica per shard restarts each
/// shard's archiving replica, the only one: while it is away each shard's
/// primary archives its own stream (a Cluster has no write fence), from
/// where the replica's sidecar stopped, and hands back once the replica
/// is online again. The archive has no hole (before, every shard had one
/// per roll: the restarted replica resynced in full), and a time while a
/// primary archived restores exactly on every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_roll_is_archived_by_each_primary_while_its_replica_restarts() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "pitr-roll", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    s3_secret(&client, ns).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    archived_cluster(&client, ns, &s3).await;
    let pw = redis_password(&client, ns, "c").await;
    let seed = Endpoint::new(pod_ip(&client, ns, "c-s0-0").await, 6379);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = cluster_writer_reseeded(
        seed,
        Some((client.clone(), ns.to_string(), "c".to_string())),
        &pw,
        "r",
        stop.clone(),
        acked.clone(),
    );
    let wait_acked = |more_than: u64| {
        let acked = acked.clone();
        async move {
            wait_for("the writer's writes", Duration::from_secs(60), || async {
                (acked.load(Ordering::SeqCst) > more_than).then_some(())
            })
            .await
        }
    };
    wait_acked(500).await;

    // A change only a restart applies: every instance restarts in turn.
    let sets: Vec<String> = (0..3).map(|i| format!("c-s{i}")).collect();
    let before = revisions(&client, ns, &sets).await;
    let started = Instant::now();
    support::operator::patch_redis(
        &client,
        ns,
        "c",
        json!({"spec": {"config": {"tcp-backlog": "600"}}}),
    )
    .await;
    rolled(&client, ns, &sets, &before, 2).await;
    println!(
        "roll of 6 instances in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    wait_acked(acked.load(Ordering::SeqCst) + 500).await;
    let after = now_ms();
    stop.store(true, Ordering::SeqCst);
    let stamps = writer.await.expect("writer");
    println!(
        "writer: {} writes, {} acknowledged",
        stamps.len(),
        stamps.iter().filter(|s| s.acked.is_some()).count()
    );

    let a = archived_past(&client, ns, "c", after + 500).await;
    assert!(a.holes.is_empty(), "the roll left holes: {:?}", a.holes);
    // Each shard's primary archived while its replica was away.
    let mut stand_ins = Vec::new();
    for shard in 0..3 {
        let runs = runs_of(&s3, &a.key, &format!("shard-{shard}"));
        for (info, _) in &runs {
            println!(
                "shard {shard}: run {} from {} continues {:?}{}",
                info["run"],
                info["pod"],
                info["continues"],
                if info["primary"] == true {
                    " (primary)"
                } else {
                    ""
                }
            );
        }
        let (info, times) = runs
            .iter()
            .find(|(i, t)| i["primary"] == true && i["continues"].is_string() && t.len() >= 3)
            .unwrap_or_else(|| {
                panic!("shard {shard}: no run read from the primary while its replica restarted")
            });
        stand_ins.push((shard, info["pod"].clone(), times.clone()));
    }
    // A time in the middle of shard 0's stand-in run, with writes made
    // while that primary archived: every shard restores to it exactly.
    let (_, pod, times) = &stand_ins[0];
    let (first, last) = (times[0], times[times.len() - 1]);
    let at = times[times.len() / 2];
    let inside = stamps
        .iter()
        .filter(|s| s.acked.is_some_and(|t| t > first && t < last))
        .count();
    println!(
        "shard 0's primary {pod} archived from {} to {} ({inside} writes acknowledged meanwhile); restoring to {}",
        rfc3339(first),
        rfc3339(last),
        rfc3339(at)
    );
    assert!(inside > 20, "the writer wrote while the primary archived");
    let shape = json!({"mode": "Cluster", "shards": 3, "instances": 1,
                       "engine": "Valkey", "version": "8.1"});
    let c = restore(&client, ns, "mid-roll", &s3, &a.key, at, shape).await;
    let (must, must_not, either) = check_cluster(&client, ns, "mid-roll", &stamps, (c, at)).await;
    println!(
        "mid-roll: {must} keys present as required, {must_not} absent as required, {either} either way"
    );
    assert!(must > 500 && must_not > 200);
}
