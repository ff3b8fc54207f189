//! Redis Cluster on the data plane, with real servers: six empty nodes
//! formed into 3 shards of a primary and a replica (`cluster::form`), for
//! every engine that has `cluster-port` (Redis 7.0, Valkey 8.1 and 9.1).
//! Then a shard primary is `kill -9`ed under one writer per shard, each
//! confirming its writes with `WAIT 1`: the cluster promotes the shard's
//! replica by itself; the test measures how long that shard took no
//! write, checks the other shards kept writing, that no confirmed write is
//! lost, and that the killed node comes back as a replica of the new
//! primary (it keeps its node ID from `nodes.conf`).
//!
//! `REDPILOT_CLUSTER_RUNS` (default 1) repeats the kill for a p50/p99.

#[path = "support/cluster_servers.rs"]
mod cluster_servers;
#[path = "support/cluster_writer.rs"]
mod cluster_writer;
#[path = "support/pace.rs"]
mod pace;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster_servers::{Cluster, node_timeout_ms, start};
use cluster_writer::{Tally, first_write_elsewhere, longest_gap, missing, tag_in, writer};
use redis_server::Engine;
use redpilot::redis::Node;
use redpilot::redis::cluster::{self, Member};
use tokio::sync::Mutex;

/// Six servers formed into 3 shards x 2: `calm` (a test that fails no
/// node) with a node timeout of 5 s, so a loaded machine does not fail a
/// shard's primary over while the test reads the topology it formed.
async fn form_3x2(engine: Engine, calm: bool) -> (Cluster, cluster::Formed) {
    let c = if calm {
        cluster_servers::start_calm(engine, 6)
    } else {
        start(engine, 6)
    };
    let shards: Vec<Vec<Member>> = c.members.chunks(2).map(<[Member]>::to_vec).collect();
    let formed = cluster::form(&shards, &c.opts, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: forming 3 x 2: {e}"));
    (c, formed)
}

async fn formed_cluster_serves_every_slot(engine: Engine) {
    let (c, formed) = form_3x2(engine, true).await;
    println!(
        "{engine:?}: 3 shards x 2 formed in {:.0} ms",
        formed.duration.as_secs_f64() * 1000.0
    );
    for (i, m) in c.members.iter().enumerate() {
        let mut n = Node::connect(&m.endpoint, &c.opts).await.unwrap();
        let info = cluster::info(&mut n).await.unwrap();
        assert!(info.ok, "{engine:?} node {i}: {info:?}");
        assert_eq!((info.slots_ok, info.known_nodes, info.size), (16_384, 6, 3));
        // `form` waits for every node to serve every slot; which primary
        // a replica follows reaches the other nodes by gossip, a moment
        // later on a loaded machine: wait for it (bounded), then check.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let nodes = loop {
            let nodes = cluster::nodes(&mut n).await.unwrap();
            let known = formed.shards.iter().all(|ids| {
                nodes
                    .iter()
                    .any(|k| k.id == ids[1] && k.replica_of.as_deref() == Some(ids[0].as_str()))
            });
            if known || std::time::Instant::now() > deadline {
                break nodes;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for (shard, ids) in formed.shards.iter().enumerate() {
            let p = nodes.iter().find(|k| k.id == ids[0]).expect("primary");
            assert!(
                p.primary,
                "{engine:?}: shard {shard}'s first node is primary"
            );
            assert_eq!(
                p.slots,
                vec![formed.slots[shard]],
                "{engine:?}: shard {shard}"
            );
            let r = nodes.iter().find(|k| k.id == ids[1]).expect("replica");
            assert_eq!(r.replica_of.as_deref(), Some(ids[0].as_str()), "{engine:?}");
            assert!(r.slots.is_empty());
        }
    }
    // The key hash agrees with the server's.
    let mut n = Node::connect(&c.members[0].endpoint, &c.opts)
        .await
        .unwrap();
    for key in [
        "foo",
        "bar",
        "hello",
        "{user1000}.following",
        "foo{}{bar}",
        "é€",
    ] {
        let server: u16 = n
            .query(
                "CLUSTER KEYSLOT",
                redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
            )
            .await
            .unwrap();
        assert_eq!(cluster::key_slot(key.as_bytes()), server, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_70_cluster_forms_and_serves_every_slot() {
    formed_cluster_serves_every_slot(Engine::Redis70).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_81_cluster_forms_and_serves_every_slot() {
    formed_cluster_serves_every_slot(Engine::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_91_cluster_forms_and_serves_every_slot() {
    formed_cluster_serves_every_slot(Engine::Valkey91).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_primary_is_replaced_by_the_cluster_losing_no_confirmed_write() {
    let runs: usize = std::env::var("REDPILOT_CLUSTER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut outages = Vec::new();
    for run in 0..runs {
        let (mut c, formed) = form_3x2(Engine::Valkey81, false).await;
        let stop = Arc::new(AtomicBool::new(false));
        let tallies: Vec<Arc<Mutex<Tally>>> = (0..3).map(|_| Arc::default()).collect();
        let tasks: Vec<_> = (0..3)
            .map(|s| {
                writer(
                    c.members.clone(),
                    vec![c.opts.clone()],
                    tag_in(&formed.slots[s], s),
                    stop.clone(),
                    tallies[s].clone(),
                )
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (s, t) in tallies.iter().enumerate() {
            assert!(
                !t.lock().await.acked.is_empty(),
                "run {run}: shard {s} takes writes"
            );
        }
        // Shard 0's primary is the first member.
        let killed = Instant::now();
        c.servers[0].kill9();
        // Writable again: the first write on shard 0 answered OK by another
        // node after the kill (confirming it needs a replica, which the
        // shard gets back only when the killed node returns).
        let dead = c.members[0].endpoint.clone();
        let back = first_write_elsewhere(&tallies[0], killed, &dead, Duration::from_secs(30)).await;
        let outage = back - killed;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let until = Instant::now();
        // The killed node comes back with its node ID (nodes.conf) and
        // follows the new primary.
        c.servers[0].restart();
        let old_id = formed.shards[0][0].clone();
        let new_id = formed.shards[0][1].clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut n = Node::connect(&c.members[0].endpoint, &c.opts)
                .await
                .unwrap();
            let nodes = cluster::nodes(&mut n).await.unwrap();
            let me = nodes.iter().find(|k| k.myself).expect("myself");
            if me.id == old_id && me.replica_of.as_deref() == Some(new_id.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "run {run}: the restarted node ({}) is not a replica of {new_id}: {nodes:?}",
                me.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        // The other shards kept writing; nothing confirmed is lost.
        for (s, t) in tallies.iter().enumerate() {
            let t = t.lock().await;
            if s > 0 {
                let gap = longest_gap(&t.set_ok, killed, until);
                println!("run {run}: shard {s}'s longest gap while shard 0 failed over: {gap:?}");
                // A write takes a few ms; with full coverage required the
                // whole cluster refuses writes for about a second here.
                assert!(
                    gap < Duration::from_millis(250),
                    "run {run}: shard {s} took no write for {gap:?} while shard 0 failed over"
                );
            }
            let missing = missing(&c.members, &c.opts, formed.slots[s].start, &t).await;
            assert_eq!(
                missing,
                0,
                "run {run}: shard {s} lost {missing} of {} confirmed writes",
                t.acked.len()
            );
            println!(
                "run {run} shard {s}: {} confirmed writes, {} failed or unconfirmed, 0 lost",
                t.acked.len(),
                t.failed
            );
        }
        println!(
            "run {run}: shard 0 writable again {:.0} ms after its primary's kill -9",
            outage.as_secs_f64() * 1000.0
        );
        outages.push(outage);
    }
    outages.sort();
    let at = |q: f64| outages[((outages.len() - 1) as f64 * q).round() as usize];
    println!(
        "shard primary kill -9 → writable again, {} run(s): p50 {:.0} ms, p99 {:.0} ms (cluster-node-timeout {} ms)",
        outages.len(),
        at(0.5).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
        node_timeout_ms()
    );
}
