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
    start_operator, wait_failpoint, wait_ready,
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
    let mut op = start_operator(&client, opts).await;
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
    wait_failpoint(&mut op, Duration::from_secs(60)).await;
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
    source_secret(&client, &ns.name).await;
    apply_redis(
        &client,
        &ns.name,
        "standby",
        json!({"replicaOf": {"host": NODE_IP, "port": src.port(), "secretName": "source-auth"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "standby", READY).await;
    wait_link(&client, &ns.name, "standby", "Up", READY).await;
    let (_, mut p) = primary_node(&client, &ns.name, "standby").await;
    wait_for("500 keys followed", Duration::from_secs(30), || async {
        let mut p = primary_node(&client, &ns.name, "standby").await.1;
        (dbsize(&mut p).await == 500).then_some(())
    })
    .await;

    // kill -9, and back at once with nothing (no persistence).
    src.restart();
    let mut s = Node::connect(&src_ep, &src_opts)
        .await
        .expect("source back");
    assert_eq!(dbsize(&mut s).await, 0, "the source came back empty");
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
    assert!(events.contains("SourceEmpty"), "{events}");

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
        "the follower emptied as asked",
        Duration::from_secs(30),
        || async {
            let mut p = primary_node(&client, &ns.name, "standby").await.1;
            (dbsize(&mut p).await == 0).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_switch_between_two_clusters_leaves_the_old_primary_read_only() {
    let client = client().await;
    let a = TestNamespace::new(&client, "site-a", &[]).await;
    let b = TestNamespace::new(&client, "site-b", &[]).await;
    let _op_a = start_operator(&client, OperatorOptions::watching(&[&a.name]).named("op-a")).await;
    let _op_b = start_operator(&client, OperatorOptions::watching(&[&b.name]).named("op-b")).await;
    apply_redis(
        &client,
        &a.name,
        "main",
        json!({"mode": "Replication", "instances": 2}),
    )
    .await;
    wait_ready(&client, &a.name, "main", READY).await;
    let a_pw = redis_password(&client, &a.name, "main").await;
    let (a_primary, mut ap) = primary_node(&client, &a.name, "main").await;
    fill(&mut ap, "a", 1_000).await;
    let a_ip = pod_ip(&client, &a.name, &a_primary).await;

    // Site B follows A's primary by address, with A's password.
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "site-a-auth", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"password": a_pw.clone()}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), &b.name)
        .create(&PostParams::default(), &s)
        .await
        .expect("secret");
    apply_redis(
        &client,
        &b.name,
        "main",
        json!({"mode": "Replication", "instances": 2,
               "replicaOf": {"host": a_ip, "secretName": "site-a-auth"}}),
    )
    .await;
    wait_ready(&client, &b.name, "main", READY).await;
    wait_link(&client, &b.name, "main", "Up", READY).await;

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
