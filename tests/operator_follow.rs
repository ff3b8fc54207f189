//! Following a Redis outside (`spec.replicaOf`), on the dev cluster with
//! real servers: the source is a server started on the node's bridge
//! address (as a VM beside the cluster would be), reached by the pods and
//! the operator by address only.
//!
//! - Moving in: a Replication Redis follows the source, refuses writes,
//!   and a planned promotion (the operator killed right after it made the
//!   source read-only) loses no write the source acknowledged to an
//!   application that moves to the new Redis when the source refuses it.
//! - A source `kill -9`ed and restarted empty does not wipe a Standalone
//!   follower: it is held, says why, and resynchronises only when told.
//! - Two Redpilot Redis under two operators (two "clusters"): the one that
//!   follows is promoted in a planned switch, the old one is demoted, takes
//!   no write on its own (not even after its primary's pod is deleted),
//!   and follows the new one once told.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::api::v1alpha1::Redis;
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, patch_redis, pod_ip, recent_events, redis_api, redis_password,
    start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const NODE_IP: &str = "10.244.0.1";
const READY: Duration = Duration::from_secs(240);
const SOURCE_PASSWORD: &str = "source-secret-pw";

/// A source server on the node's bridge address, with a password.
fn source() -> RedisServer {
    RedisServer::start(
        Engine::Redis70,
        ServerConfig::default()
            .password(SOURCE_PASSWORD)
            .with("bind", "0.0.0.0"),
    )
}

/// The Secret lending the source's password to the operator.
async fn source_secret(client: &Client, ns: &str) {
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "source-auth", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"password": SOURCE_PASSWORD}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("creating the source's Secret");
}

/// Redis `name` in `ns` following the source on `port` (Standalone, or
/// Replication with `instances`), with the source's Secret: Ready, link up.
async fn follow_source(client: &Client, ns: &str, name: &str, instances: Option<i32>, port: u16) {
    source_secret(client, ns).await;
    let source = json!({"host": NODE_IP, "port": port, "secretName": "source-auth"});
    let spec = match instances {
        Some(n) => json!({"mode": "Replication", "instances": n, "replicaOf": source}),
        None => json!({ "replicaOf": source }),
    };
    apply_redis(client, ns, name, spec).await;
    wait_ready(client, ns, name, READY).await;
    wait_link(client, ns, name, "Up", READY).await;
}

async fn fill(node: &mut Node, prefix: &str, n: usize) {
    for i in 0..n {
        let _: () = node
            .query(
                "SET",
                redis::cmd("SET").arg(format!("{prefix}:{i}")).arg("v"),
            )
            .await
            .expect("SET");
    }
}

async fn dbsize(node: &mut Node) -> i64 {
    node.query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE")
}

async fn status_of(client: &Client, ns: &str, name: &str) -> Option<Redis> {
    redis_api(client, ns).get(name).await.ok()
}

/// Waits for `status.replicaOf.link` to be `link`.
async fn wait_link(client: &Client, ns: &str, name: &str, link: &str, within: Duration) -> Redis {
    wait_for(
        &format!("{name}'s link to its source {link}"),
        within,
        || async {
            let r = status_of(client, ns, name).await?;
            (r.status.as_ref()?.replica_of.as_ref()?.link == link).then_some(r)
        },
    )
    .await
}

async fn primary_node(client: &Client, ns: &str, name: &str) -> (String, Node) {
    let r = status_of(client, ns, name).await.expect("redis");
    let primary = r.status.and_then(|s| s.primary).expect("a primary");
    let pw = redis_password(client, ns, name).await;
    let ip = pod_ip(client, ns, &primary).await;
    let node = Node::connect(
        &Endpoint::new(ip, 6379),
        &ConnectOptions::default().with_password(pw),
    )
    .await
    .expect("connect to the primary");
    (primary, node)
}

/// An application writing unique keys to the source until it refuses a
/// write, then to the new Redis: no retries (a refused or failed write is
/// not acknowledged), every acknowledged key kept.
struct MovingWriter {
    stop: Arc<AtomicBool>,
    moved: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<Moved>,
}

#[derive(Debug, Default)]
struct Moved {
    on_source: Vec<String>,
    on_target: Vec<String>,
    refused: u64,
    /// From the last write the source acknowledged to the first the new
    /// Redis did.
    gap: Option<Duration>,
}

impl MovingWriter {
    fn start(
        source: Endpoint,
        source_opts: ConnectOptions,
        target: Endpoint,
        target_opts: ConnectOptions,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let moved = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let m = moved.clone();
        let task = tokio::spawn(async move {
            let mut out = Moved::default();
            let mut on_source = true;
            let mut last_source_ack = Instant::now();
            let mut node: Option<Node> = None;
            let mut i = 0u64;
            while !s.load(Ordering::SeqCst) {
                let (ep, opts) = if on_source {
                    (&source, &source_opts)
                } else {
                    (&target, &target_opts)
                };
                if node.is_none() {
                    node = Node::connect(ep, opts).await.ok();
                    if node.is_none() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
                let Some(n) = node.as_mut() else { continue };
                let key = format!("app:{i}");
                i += 1;
                let r: redpilot::redis::Result<()> = n
                    .query_within(
                        "SET",
                        redis::cmd("SET").arg(&key).arg("v"),
                        Duration::from_secs(15),
                    )
                    .await;
                match r {
                    Ok(()) if on_source => {
                        last_source_ack = Instant::now();
                        out.on_source.push(key);
                    }
                    Ok(()) => {
                        if out.gap.is_none() {
                            out.gap = Some(last_source_ack.elapsed());
                        }
                        out.on_target.push(key);
                        m.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => {
                        out.refused += 1;
                        // The source refuses writes once it is demoted: the
                        // application moves to the new Redis.
                        if on_source && read_only(&e) {
                            on_source = false;
                        }
                        node = None;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            out
        });
        MovingWriter { stop, moved, task }
    }

    /// Waits until the new Redis acknowledged `n` writes.
    async fn wait_moved(&self, n: u64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.moved.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) -> Moved {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("writer")
    }
}

/// A write refused by a replica (`READONLY`).
fn read_only(e: &redpilot::redis::Error) -> bool {
    let t = e.to_string().to_lowercase();
    t.contains("readonly") || t.contains("read only")
}

async fn missing(node: &mut Node, keys: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for chunk in keys.chunks(500) {
        let mut c = redis::cmd("EXISTS");
        for k in chunk {
            c.arg(k);
        }
        // One EXISTS per key keeps which one is missing.
        let n: i64 = node.query("EXISTS", &c).await.expect("EXISTS");
        if n as usize != chunk.len() {
            for k in chunk {
                let one: i64 = node
                    .query("EXISTS", redis::cmd("EXISTS").arg(k))
                    .await
                    .expect("EXISTS");
                if one == 0 {
                    out.push(k.clone());
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_redis_moves_in_and_a_planned_promotion_loses_no_write() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "follow-in", &[]).await;
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    opts.env
        .push(("REDPILOT_FAILPOINTS".into(), "after-source-fenced".into()));
    opts.restart_after_failpoint = true;
    let op = start_operator(&client, opts).await;
    let src = source();
    let src_ep = src.endpoint();
    let src_opts = src.connect_options();
    let mut s = Node::connect(&src_ep, &src_opts).await.expect("source");
    fill(&mut s, "old", 2_000).await;
    source_secret(&client, &ns.name).await;

    apply_redis(
        &client,
        &ns.name,
        "moved",
        json!({"mode": "Replication", "instances": 2,
               "replicaOf": {"host": NODE_IP, "port": src.port(), "secretName": "source-auth"}}),
    )
    .await;
    let t = Instant::now();
    wait_ready(&client, &ns.name, "moved", READY).await;
    let r = wait_link(&client, &ns.name, "moved", "Up", READY).await;
    println!(
        "followed the source: link up {:.1}s after create",
        t.elapsed().as_secs_f64()
    );
    let st = r.status.expect("status");
    assert_eq!(
        st.replica_of.as_ref().expect("replicaOf").source,
        format!("{NODE_IP}:{}", src.port())
    );

    let (primary, mut p) = primary_node(&client, &ns.name, "moved").await;
    wait_for(
        "the 2,000 keys on the new primary",
        Duration::from_secs(30),
        || async {
            let mut p = primary_node(&client, &ns.name, "moved").await.1;
            (dbsize(&mut p).await == 2_000).then_some(())
        },
    )
    .await;
    // It refuses writes while it follows.
    let refused: redpilot::redis::Result<()> =
        p.query("SET", redis::cmd("SET").arg("here").arg("x")).await;
    let e = refused.expect_err("a following Redis refuses writes");
    assert!(read_only(&e), "{e}");

    // An application writes to the source, and moves when it is refused.
    let pw = redis_password(&client, &ns.name, "moved").await;
    let target = Endpoint::new(pod_ip(&client, &ns.name, &primary).await, 6379);
    let writer = MovingWriter::start(
        src_ep.clone(),
        src_opts.clone(),
        target,
        ConnectOptions::default().with_password(pw.as_str()),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lag = status_of(&client, &ns.name, "moved")
        .await
        .and_then(|r| r.status?.replica_of?.lag_bytes);
    println!("lag under the writer (status): {lag:?} bytes");

    // Promotion: the operator stops right after it fenced the source (a
    // crash mid-promotion); the restarted one finishes it.
    let t = Instant::now();
    patch_redis(
        &client,
        &ns.name,
        "moved",
        json!({"spec": {"replicaOf": null}}),
    )
    .await;
    // The harness starts the operator again as soon as it stops at the
    // failpoint: the proof it stopped there is that restart.
    let deadline = Instant::now() + Duration::from_secs(60);
    while op.restarts() == 0 {
        assert!(
            Instant::now() < deadline,
            "the operator did not stop at the failpoint: {}",
            op.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        op.log_text().contains("after-source-fenced"),
        "it stopped at after-source-fenced"
    );
    let done = wait_for(
        "the promotion recorded",
        Duration::from_secs(90),
        || async {
            let r = status_of(&client, &ns.name, "moved").await?;
            let s = r.status?;
            (s.replica_of.is_none()).then_some(s.promotion?)
        },
    )
    .await;
    let promoted_in = t.elapsed();
    writer.wait_moved(200, Duration::from_secs(30)).await;
    let moved = writer.stop().await;
    println!(
        "promotion: {:.1}s (operator killed after fencing the source); planned {}; {}; \
         writes acknowledged by the source {}, by the new Redis {}, refused {}; write gap {:?}",
        promoted_in.as_secs_f64(),
        done.planned,
        done.message,
        moved.on_source.len(),
        moved.on_target.len(),
        moved.refused,
        moved.gap
    );
    assert!(done.planned, "{done:?}");
    assert!(
        moved.on_source.len() > 100,
        "the writer wrote to the source: {moved:?}"
    );
    assert!(
        !moved.on_target.is_empty(),
        "the writer moved to the new Redis"
    );
    let (_, mut p) = primary_node(&client, &ns.name, "moved").await;
    let lost = missing(&mut p, &moved.on_source).await;
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(missing(&mut p, &moved.on_target).await.is_empty());
    assert_eq!(
        missing(
            &mut p,
            &(0..2_000).map(|i| format!("old:{i}")).collect::<Vec<_>>()
        )
        .await
        .len(),
        0
    );
    // The source is read-only now: held at the fence.
    let mut s = Node::connect(&src_ep, &src_opts).await.expect("source");
    let r = s.replication().await.expect("INFO");
    assert_eq!(r.primary, Some(Endpoint::new("127.0.0.1", 2)), "{r:?}");
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(events.contains("Promoted"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_restarted_empty_does_not_wipe_its_follower() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "follow-empty", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let mut src = source();
    let src_ep = src.endpoint();
    let src_opts = src.connect_options();
    let mut s = Node::connect(&src_ep, &src_opts).await.expect("source");
    fill(&mut s, "k", 500).await;
    drop(s);
    follow_source(&client, &ns.name, "standby", None, src.port()).await;
    let (_, mut p) = primary_node(&client, &ns.name, "standby").await;
    wait_for("500 keys followed", Duration::from_secs(30), || async {
        let mut p = primary_node(&client, &ns.name, "standby").await.1;
        (dbsize(&mut p).await == 500).then_some(())
    })
    .await;

    // kill -9, and back at once with nothing (no persistence); an
    // application writes one key to it at once.
    src.restart();
    let mut s = Node::connect(&src_ep, &src_opts)
        .await
        .expect("source back");
    let _: () = s
        .query("SET", redis::cmd("SET").arg("session").arg("new"))
        .await
        .expect("SET");
    assert_eq!(
        dbsize(&mut s).await,
        1,
        "the source came back without its data"
    );
    let r = wait_link(
        &client,
        &ns.name,
        "standby",
        "Held",
        Duration::from_secs(60),
    )
    .await;
    let msg = r
        .status
        .and_then(|s| s.replica_of)
        .and_then(|r| r.message)
        .unwrap_or_default();
    println!("held: {msg}");
    assert!(msg.contains("accept-source-reset"), "{msg}");
    for _ in 0..5 {
        assert_eq!(dbsize(&mut p).await, 500, "the follower kept its data");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(events.contains("SourceHistoryChanged"), "{events}");
    assert!(msg.contains("another history (1 keys"), "{msg}");

    // Told to accept the empty source, it follows it (and is emptied).
    let run_id = s.info().await.expect("INFO").server.run_id.expect("run id");
    patch_redis(
        &client,
        &ns.name,
        "standby",
        json!({"metadata": {"annotations": {"redpilot.io/accept-source-reset": run_id}}}),
    )
    .await;
    wait_link(&client, &ns.name, "standby", "Up", Duration::from_secs(60)).await;
    wait_for(
        "the follower replaced by the source's one key, as asked",
        Duration::from_secs(30),
        || async {
            let mut p = primary_node(&client, &ns.name, "standby").await.1;
            (dbsize(&mut p).await == 1).then_some(())
        },
    )
    .await;
}

/// Two sites: Redis `main` (Replication, 2 instances) in `a` holding `keys`
/// keys, and Redis `main` in `b` following A's primary by its address with
/// A's password (a Secret in `b`), its link up. A's password, primary and
/// its address.
async fn two_sites(client: &Client, a: &str, b: &str, keys: usize) -> (String, String, String) {
    apply_redis(
        client,
        a,
        "main",
        json!({"mode": "Replication", "instances": 2}),
    )
    .await;
    wait_ready(client, a, "main", READY).await;
    let a_pw = redis_password(client, a, "main").await;
    let (a_primary, mut ap) = primary_node(client, a, "main").await;
    fill(&mut ap, "a", keys).await;
    let a_ip = pod_ip(client, a, &a_primary).await;
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "site-a-auth", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"password": a_pw.clone()}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), b)
        .create(&PostParams::default(), &s)
        .await
        .expect("secret");
    apply_redis(
        client,
        b,
        "main",
        json!({"mode": "Replication", "instances": 2,
               "replicaOf": {"host": a_ip, "secretName": "site-a-auth"}}),
    )
    .await;
    wait_ready(client, b, "main", READY).await;
    wait_link(client, b, "main", "Up", READY).await;
    (a_pw, a_primary, a_ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_switch_between_two_clusters_leaves_the_old_primary_read_only() {
    let client = client().await;
    let a = TestNamespace::new(&client, "site-a", &[]).await;
    let b = TestNamespace::new(&client, "site-b", &[]).await;
    let _op_a = start_operator(&client, OperatorOptions::watching(&[&a.name]).named("op-a")).await;
    let _op_b = start_operator(&client, OperatorOptions::watching(&[&b.name]).named("op-b")).await;
    let (a_pw, a_primary, a_ip) = two_sites(&client, &a.name, &b.name, 1_000).await;

    // An application on A; the planned switch; it moves to B.
    let b_pw = redis_password(&client, &b.name, "main").await;
    let (b_primary, _) = primary_node(&client, &b.name, "main").await;
    let b_ip = pod_ip(&client, &b.name, &b_primary).await;
    let writer = MovingWriter::start(
        Endpoint::new(&a_ip, 6379),
        ConnectOptions::default().with_password(a_pw.as_str()),
        Endpoint::new(&b_ip, 6379),
        ConnectOptions::default().with_password(b_pw.as_str()),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    patch_redis(
        &client,
        &b.name,
        "main",
        json!({"spec": {"replicaOf": null}}),
    )
    .await;
    let done = wait_for("B promoted", Duration::from_secs(60), || async {
        status_of(&client, &b.name, "main").await?.status?.promotion
    })
    .await;
    let switched = t.elapsed();
    writer.wait_moved(200, Duration::from_secs(30)).await;
    let moved = writer.stop().await;
    println!(
        "cross-cluster switch {:.1}s; planned {}; acknowledged on A {}, on B {}; gap {:?}",
        switched.as_secs_f64(),
        done.planned,
        moved.on_source.len(),
        moved.on_target.len(),
        moved.gap
    );
    assert!(done.planned, "{done:?}");
    let (_, mut bp) = primary_node(&client, &b.name, "main").await;
    assert!(
        missing(&mut bp, &moved.on_source).await.is_empty(),
        "writes acknowledged by A are on B"
    );

    // A's operator sees its primary demoted and holds.
    let demoted = wait_for(
        "A records the demotion",
        Duration::from_secs(60),
        || async { status_of(&client, &a.name, "main").await?.status?.demoted },
    )
    .await;
    // Its primary's pod deleted: A still takes no write.
    Api::<Pod>::namespaced(client.clone(), &a.name)
        .delete(&a_primary, &DeleteParams::default())
        .await
        .expect("delete A's primary pod");
    tokio::time::sleep(Duration::from_secs(20)).await;
    for pod in ["main-0", "main-1"] {
        let ip = pod_ip(&client, &a.name, pod).await;
        let mut n = Node::connect(
            &Endpoint::new(ip, 6379),
            &ConnectOptions::default().with_password(a_pw.as_str()),
        )
        .await
        .expect("A's instance");
        let w: redpilot::redis::Result<()> = n
            .query("SET", redis::cmd("SET").arg("stale").arg("x"))
            .await;
        assert!(w.is_err(), "{pod} of the demoted A took a write");
    }
    let r = status_of(&client, &a.name, "main").await.expect("A");
    assert_eq!(
        r.status.as_ref().and_then(|s| s.demoted.clone()),
        Some(demoted)
    );

    // Told to follow B, A follows it and holds what B holds.
    patch_redis(
        &client,
        &a.name,
        "main",
        json!({"spec": {"replicaOf": {"host": b_ip, "secretName": "site-b-auth"}}}),
    )
    .await;
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "site-b-auth", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"password": b_pw.clone()}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), &a.name)
        .create(&PostParams::default(), &s)
        .await
        .expect("secret");
    wait_link(&client, &a.name, "main", "Up", Duration::from_secs(120)).await;
    let (_, mut ap) = primary_node(&client, &a.name, "main").await;
    wait_for("A holds B's writes", Duration::from_secs(30), || async {
        let mut ap = primary_node(&client, &a.name, "main").await.1;
        missing(&mut ap, &moved.on_target)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(missing(&mut ap, &moved.on_source).await.is_empty());
    let r = status_of(&client, &a.name, "main").await.expect("A");
    assert!(
        r.status.and_then(|s| s.demoted).is_none(),
        "following clears the demotion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_unplanned_promotion_the_old_site_is_made_read_only_when_it_returns() {
    let client = client().await;
    let a = TestNamespace::new(&client, "lost-a", &[]).await;
    let b = TestNamespace::new(&client, "lost-b", &[]).await;
    let mut op_a =
        start_operator(&client, OperatorOptions::watching(&[&a.name]).named("op-a")).await;
    let _op_b = start_operator(&client, OperatorOptions::watching(&[&b.name]).named("op-b")).await;
    let (a_pw, _, a_ip) = two_sites(&client, &a.name, &b.name, 500).await;

    // Site A is lost: its operator stops and its primary is cut off.
    op_a.kill();
    let mut cut = support::faults::Partition::of(&a_ip);
    cut.cut();
    wait_link(&client, &b.name, "main", "Fenced", Duration::from_secs(60)).await;
    let t = Instant::now();
    patch_redis(
        &client,
        &b.name,
        "main",
        json!({"spec": {"replicaOf": null}}),
    )
    .await;
    let done = wait_for(
        "B promoted without its source",
        Duration::from_secs(60),
        || async { status_of(&client, &b.name, "main").await?.status?.promotion },
    )
    .await;
    println!(
        "unplanned promotion: {:.1}s; {}",
        t.elapsed().as_secs_f64(),
        done.message
    );
    assert!(!done.planned, "{done:?}");
    assert_eq!(done.source_fenced, Some(false));
    // Its replica links up again (it was cut off while the primary was
    // fenced), then the write fence lets writes through.
    wait_for("B takes writes", Duration::from_secs(30), || async {
        let (_, mut bp) = primary_node(&client, &b.name, "main").await;
        bp.query::<()>("SET", redis::cmd("SET").arg("b-writes").arg("1"))
            .await
            .ok()
    })
    .await;
    let (_, mut bp) = primary_node(&client, &b.name, "main").await;
    assert_eq!(dbsize(&mut bp).await, 501, "B has what A had");

    // Site A returns, its primary still writable, an application still
    // pointed at it: B's operator fences it as soon as it answers.
    let back = Instant::now();
    cut.heal();
    let a_opts = ConnectOptions::default()
        .with_password(a_pw.as_str())
        .with_timeouts(Duration::from_millis(500), Duration::from_millis(500));
    let mut behind_its_back = 0u64;
    let fenced_after = loop {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "A still takes writes after 30 s"
        );
        let Ok(mut n) = Node::connect(&Endpoint::new(&a_ip, 6379), &a_opts).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        match n
            .query::<()>(
                "SET",
                redis::cmd("SET")
                    .arg(format!("late:{behind_its_back}"))
                    .arg("x"),
            )
            .await
        {
            Ok(()) => behind_its_back += 1,
            Err(e) if read_only(&e) => break back.elapsed(),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!(
        "site A answered again: read-only {:.2}s after it returned; {behind_its_back} writes it \
         acknowledged meanwhile (not on B)",
        fenced_after.as_secs_f64()
    );
    wait_for(
        "B records the old source fenced",
        Duration::from_secs(60),
        || async {
            let p = status_of(&client, &b.name, "main")
                .await?
                .status?
                .promotion?;
            (p.source_fenced == Some(true)).then_some(())
        },
    )
    .await;
    let events = recent_events(&client, &b.name, 40).await;
    assert!(events.contains("OldSourceFenced"), "{events}");

    // A's operator comes back: it finds its primary demoted and holds.
    let _op_a2 = start_operator(
        &client,
        OperatorOptions::watching(&[&a.name]).named("op-a2"),
    )
    .await;
    wait_for(
        "A records the demotion",
        Duration::from_secs(60),
        || async { status_of(&client, &a.name, "main").await?.status?.demoted },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    for pod in ["main-0", "main-1"] {
        let ip = pod_ip(&client, &a.name, pod).await;
        let mut n = Node::connect(
            &Endpoint::new(ip, 6379),
            &ConnectOptions::default().with_password(a_pw.as_str()),
        )
        .await
        .expect("A's instance");
        let w: redpilot::redis::Result<()> = n
            .query("SET", redis::cmd("SET").arg("stale").arg("x"))
            .await;
        assert!(w.is_err(), "{pod} of the returned site A took a write");
    }
}

/// Bytes of data in the source for the catch-up measurement: 64 MiB in
/// `make test`, `REDPILOT_FOLLOW_MIB` (1024 in `make bench-follow`).
fn follow_mib() -> u64 {
    std::env::var("REDPILOT_FOLLOW_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_follower_catches_up_and_keeps_up_with_a_steady_writer() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "follow-rate", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let src = source();
    let src_ep = src.endpoint();
    let src_opts = src.connect_options();
    let mut s = Node::connect(&src_ep, &src_opts).await.expect("source");
    // 1 KiB values: MiB × 1024 keys.
    let keys = follow_mib() * 1024;
    let _: () = s
        .query_within(
            "DEBUG",
            redis::cmd("DEBUG")
                .arg("POPULATE")
                .arg(keys)
                .arg("fill")
                .arg(1024),
            Duration::from_secs(600),
        )
        .await
        .expect("DEBUG POPULATE");
    let dataset = s
        .info()
        .await
        .expect("INFO")
        .memory
        .used_memory_dataset
        .expect("used_memory_dataset");
    source_secret(&client, &ns.name).await;
    apply_redis(
        &client,
        &ns.name,
        "copy",
        json!({"replicaOf": {"host": NODE_IP, "port": src.port(), "secretName": "source-auth"}}),
    )
    .await;
    // Measured on the source, polled every 10 ms: from the full
    // synchronisation it starts for the follower (`sync_full`) to the
    // follower's link online (fork, RDB sent and loaded).
    let start = Instant::now();
    let mut pointed = None;
    let caught = loop {
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "not caught up in 900 s"
        );
        let info = s.info().await.expect("INFO");
        if pointed.is_none() && info.stats.sync_full.unwrap_or(0) >= 1 {
            pointed = Some(Instant::now());
        }
        if pointed.is_some()
            && info
                .replication
                .replicas
                .iter()
                .any(|r| r.state == "online")
        {
            break Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let pointed = pointed.expect("a full sync");
    wait_ready(&client, &ns.name, "copy", READY).await;
    let (_, mut p) = primary_node(&client, &ns.name, "copy").await;
    assert_eq!(dbsize(&mut p).await as u64, keys, "every key copied");
    let secs = caught.duration_since(pointed).as_secs_f64();
    let mib = dataset as f64 / (1 << 20) as f64;
    println!(
        "catch-up: {keys} keys, {mib:.0} MiB of data in {secs:.1}s = {:.1} MiB/s (the source's \
         full sync to the link online, polled every 10 ms)",
        mib / secs
    );

    // Lag under a steady writer: 1 KiB values, 1,000 a second, sampled
    // from both sides' offsets every 50 ms for 10 s.
    let writing = Arc::new(AtomicBool::new(true));
    let w = writing.clone();
    let (wep, wopts) = (src_ep.clone(), src_opts.clone());
    let writer = tokio::spawn(async move {
        let mut n = Node::connect(&wep, &wopts).await.expect("writer");
        let value = "x".repeat(1024);
        let mut i = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        while w.load(Ordering::SeqCst) {
            tick.tick().await;
            let _: () = n
                .query(
                    "SET",
                    redis::cmd("SET").arg(format!("steady:{i}")).arg(&value),
                )
                .await
                .expect("SET");
            i += 1;
        }
        i
    });
    let mut lags = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let so = s
            .replication()
            .await
            .expect("INFO")
            .repl_offset
            .unwrap_or(0);
        let ho = p
            .replication()
            .await
            .expect("INFO")
            .applied_offset()
            .unwrap_or(0);
        lags.push((so - ho).max(0) as f64);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writing.store(false, Ordering::SeqCst);
    let written = writer.await.expect("writer");
    lags.sort_by(f64::total_cmp);
    let pct = |q: f64| lags[((lags.len() - 1) as f64 * q) as usize];
    println!(
        "lag under {written} writes in 10 s ({:.0}/s, 1 KiB): p50 {:.0} B, p99 {:.0} B, max {:.0} B \
         ({} samples; the source's offset read first, then the follower's)",
        written as f64 / 10.0,
        pct(0.5),
        pct(0.99),
        pct(1.0),
        lags.len()
    );
    assert!(written > 1_000, "the writer wrote");
    // Every steady write reached the follower.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let so = s
            .replication()
            .await
            .expect("INFO")
            .repl_offset
            .unwrap_or(0);
        let ho = p
            .replication()
            .await
            .expect("INFO")
            .applied_offset()
            .unwrap_or(0);
        if ho >= so {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower is {} bytes behind after 30 s",
            so - ho
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dbsize(&mut p).await as u64, keys + written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_longer_than_the_backlog_ends_in_a_full_resync_with_every_key() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "follow-cut", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let src = source();
    let src_ep = src.endpoint();
    let src_opts = src.connect_options();
    let mut s = Node::connect(&src_ep, &src_opts).await.expect("source");
    // A 1 MiB backlog, and replicas cut off once 1 MiB waits for them.
    for (k, v) in [
        ("repl-backlog-size", "1mb"),
        ("client-output-buffer-limit", "replica 1mb 1mb 0"),
    ] {
        let _: () = s
            .query("CONFIG SET", redis::cmd("CONFIG").arg("SET").arg(k).arg(v))
            .await
            .expect("CONFIG SET");
    }
    fill(&mut s, "before", 1_000).await;
    follow_source(&client, &ns.name, "standby", None, src.port()).await;
    let syncs_before = s.info().await.expect("INFO").stats.sync_full.unwrap_or(0);

    // The follower is cut off while 5 MiB are written to the source.
    let at_cut = s
        .replication()
        .await
        .expect("INFO")
        .repl_offset
        .unwrap_or(0);
    let ip = pod_ip(&client, &ns.name, "standby-0").await;
    let mut cut = support::faults::Partition::of(&ip);
    cut.cut();
    let value = "y".repeat(1024);
    for i in 0..5_000 {
        let _: () = s
            .query(
                "SET",
                redis::cmd("SET").arg(format!("during:{i}")).arg(&value),
            )
            .await
            .expect("SET on the source");
    }
    let backlog_past = s.replication().await.expect("INFO");
    let first = backlog_past.backlog_first_byte_offset.unwrap_or(0);
    assert!(
        at_cut < first,
        "the follower's offset at the cut ({at_cut}) is out of the backlog (from {first})"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    cut.heal();
    let want = dbsize(&mut s).await;
    let (sep, sopts, cl, nsn) = (&src_ep, &src_opts, &client, &ns.name);
    wait_for(
        "a full resync with every key",
        Duration::from_secs(120),
        || async move {
            let (client, ns_name) = (cl, nsn);
            let mut s = Node::connect(sep, sopts).await.ok()?;
            let syncs = s.info().await.ok()?.stats.sync_full?;
            let mut p = primary_node(client, ns_name, "standby").await.1;
            (syncs > syncs_before && dbsize(&mut p).await == want).then_some(())
        },
    )
    .await;
    wait_link(&client, &ns.name, "standby", "Up", Duration::from_secs(60)).await;
    let syncs_after = s.info().await.expect("INFO").stats.sync_full.unwrap_or(0);
    println!(
        "link cut 3 s with 5 MiB written past a 1 MiB backlog: full syncs {syncs_before} -> \
         {syncs_after}, {want} keys on the follower"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_a_follower_keeps_following_and_loses_nothing() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "follow-roll", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let src = source();
    let src_ep = src.endpoint();
    let src_opts = src.connect_options();
    follow_source(&client, &ns.name, "standby", Some(2), src.port()).await;
    let (before, _) = primary_node(&client, &ns.name, "standby").await;
    let uids = support::operator::pod_uids(&client, &ns.name, "standby").await;

    // The source keeps taking writes while every instance restarts
    // (`databases` is read at start only), the primary after a switchover.
    let writing = Arc::new(AtomicBool::new(true));
    let w = writing.clone();
    let (wep, wopts) = (src_ep.clone(), src_opts.clone());
    let writer = tokio::spawn(async move {
        let mut n = Node::connect(&wep, &wopts).await.expect("writer");
        let mut acked = Vec::new();
        let mut i = 0u64;
        while w.load(Ordering::SeqCst) {
            let key = format!("roll:{i}");
            i += 1;
            let _: () = n
                .query("SET", redis::cmd("SET").arg(&key).arg("v"))
                .await
                .expect("SET on the source");
            acked.push(key);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        acked
    });
    patch_redis(
        &client,
        &ns.name,
        "standby",
        json!({"spec": {"config": {"databases": "32"}}}),
    )
    .await;
    wait_for("every pod replaced, Ready and following", READY, || async {
        let r = status_of(&client, &ns.name, "standby").await?;
        let after = support::operator::pod_uids(&client, &ns.name, "standby").await;
        let replaced = uids.iter().all(|(n, uid)| after.get(n) != Some(uid));
        let s = r.status.as_ref()?;
        (replaced && s.ready.as_deref() == Some("2/2") && s.replica_of.as_ref()?.link == "Up")
            .then_some(())
    })
    .await;
    writing.store(false, Ordering::SeqCst);
    let acked = writer.await.expect("writer");
    let (after, mut p) = primary_node(&client, &ns.name, "standby").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let lost = loop {
        let lost = missing(&mut p, &acked).await;
        if lost.is_empty() || Instant::now() > deadline {
            break lost;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "roll of a follower: primary {before} -> {after}; {} writes to the source, {} missing",
        acked.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "{:?}", &lost[..lost.len().min(5)]);
    assert_ne!(
        before, after,
        "the primary was switched over before its restart"
    );
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("SwitchedOver"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_primary_is_killed_follows_again_from_a_replica() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "follow-kill", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let src = source();
    let src_ep = src.endpoint();
    let src_opts = src.connect_options();
    let mut s = Node::connect(&src_ep, &src_opts).await.expect("source");
    fill(&mut s, "k", 1_000).await;
    follow_source(&client, &ns.name, "standby", Some(2), src.port()).await;
    let (before, mut p) = primary_node(&client, &ns.name, "standby").await;
    let pid = support::operator::server_pid(&mut p).await;
    support::operator::kill_9(pid);
    // Writes go on at the source meanwhile.
    fill(&mut s, "after", 1_000).await;
    // The fault happened: the server restarted in its pod.
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    wait_for(
        "the killed server restarted",
        Duration::from_secs(60),
        || async {
            let pod = pods.get(&before).await.ok()?;
            (support::operator::container_restarts(&pod) > 0).then_some(())
        },
    )
    .await;
    let r = wait_for("a primary following the source again", READY, || async {
        let r = status_of(&client, &ns.name, "standby").await?;
        let st = r.status.as_ref()?;
        let follows = st.replica_of.as_ref()?.link == "Up";
        (follows && st.ready.as_deref() == Some("2/2")).then_some(r)
    })
    .await;
    let after = r.status.and_then(|s| s.primary).expect("primary");
    let events = recent_events(&client, &ns.name, 60).await;
    let (_, mut p) = primary_node(&client, &ns.name, "standby").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while dbsize(&mut p).await != 2_000 {
        assert!(
            Instant::now() < deadline,
            "the follower has {} keys",
            dbsize(&mut p).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing inside it took a write on the way.
    let w: redpilot::redis::Result<()> =
        p.query("SET", redis::cmd("SET").arg("here").arg("x")).await;
    assert!(w.as_ref().is_err_and(read_only), "{w:?}");
    println!("primary {before} killed; now {after}, following again with 2,000 keys");
    assert!(events.contains("FollowingSource"), "{events}");
}
