//! Cluster mode on the dev cluster (issue #27), with real Valkey servers
//! and one writer per shard that follows its shard's primary and confirms
//! every write with `WAIT 1`:
//! - a 3 x 2 Cluster Redis is created, formed by the operator (meet, even
//!   slots, replicas attached) and reported Ready with each shard's primary;
//! - shard 0's primary server is `kill -9`ed and restarts in place (same
//!   pod, same IP, its `nodes.conf` kept): the cluster elects the replica,
//!   the restarted node waits at boot until it sees that (the boot rule),
//!   and rejoins as the new primary's replica;
//! - shard 1's primary pod is deleted (no storage: it comes back as a new,
//!   empty node): the cluster elects the replica, the operator attaches the
//!   new node to it and forgets the old node ID on every node;
//! - through both, the other shards keep taking writes, and no write any
//!   shard confirmed is lost;
//! - (a second Redis, in parallel) a planned failover of one shard, then an
//!   ordered restart of every pod (every shard's replicas, then shard by
//!   shard a failover and the old primary), without a confirmed write lost;
//! - (another) an upgrade from Redis 7.0 to a Valkey image that cannot be
//!   pulled, rolled back without a primary touched; then Redis 7.0 to Valkey
//!   8.1 under the writers, no confirmed write lost;
//! - (another) one shard filled past the memory autopilot's level: every
//!   instance of every shard grows in place, replicas before primaries, no
//!   OOM reply and no pod replaced;
//! - (a third, in parallel) the operator stopped right after it gave the
//!   first shard its slots, and the next operator process finishing the
//!   cluster from there; then a shard primary's network cut and healed;
//! - (another) a RedisBackup of every shard under the writers, the operator
//!   stopped after the first shard's Job and the next one finishing it;
//!   then a new Cluster Redis restored from it holding every write
//!   confirmed before the backup was asked for, and a restore into another
//!   shard count refused;
//! - (another, with volumes and the user's password Secret) hibernation
//!   and waking on six new addresses with every confirmed write, then a
//!   live password rotation on every node and a replica killed afterwards
//!   relinking with the new password;
//! - (another, with volumes) a shard's replica restarted while its primary
//!   is stopped, never linked: the cluster will not elect it; nothing is
//!   forced while the primary's pod may come back; once it is deleted with
//!   its claim the operator forces the takeover, no key lost.

#[path = "support/cluster_client.rs"]
mod cluster_client;
#[path = "support/cluster_writer.rs"]
mod cluster_writer;
mod support;
// `crate::pace`, as cluster_writer asks for it.
use support::pace;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster_writer::{
    Writers, first_write_elsewhere, longest_gap, longest_gap_at, missing, tag_in,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use redpilot::api::v1alpha1::Redis;
use redpilot::redis::cluster::{self, Member, spread};
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde_json::json;
use support::faults::{InsideWriter, Partition, pod_netns};
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, info_u64, kill_9, pod_ip, recent_events, redis_api,
    redis_password, spawn_operator, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

/// The cluster members, from the pods' IPs.
async fn members(client: &kube::Client, ns: &str) -> Vec<Member> {
    support::operator::cluster_members(client, ns, "cache").await
}

fn shard_primary(r: &Redis, shard: usize) -> Option<String> {
    r.status.as_ref()?.shards.get(shard)?.primary.clone()
}

/// Waits until the Redis is Ready with `check` true of it.
async fn wait_until(
    client: &kube::Client,
    ns: &str,
    what: &str,
    check: impl Fn(&Redis) -> bool,
) -> Redis {
    let api = redis_api(client, ns);
    wait_for(what, READY, || async {
        let r = api.get("cache").await.ok()?;
        (support::operator::is_ready(&r) && check(&r)).then_some(r)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_redis_forms_and_heals_a_killed_primary_and_a_lost_pod() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let t = Instant::now();
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1"}),
    )
    .await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    println!(
        "3 shards x 2 instances: created → Ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let st = r.status.clone().expect("status");
    assert_eq!(st.ready.as_deref(), Some("6/6"), "{st:?}");
    let c = st.cluster.clone().expect("status.cluster");
    assert_eq!(
        (c.state.as_str(), c.slots_ok, c.known_nodes),
        ("ok", 16384, 6),
        "{c:?}"
    );
    let want = spread(3);
    assert_eq!(st.shards.len(), 3, "{:?}", st.shards);
    for (i, s) in st.shards.iter().enumerate() {
        assert!(s.primary.is_some(), "shard {i}: {s:?}");
        assert_eq!(s.replicas.len(), 1, "shard {i}: {s:?}");
        assert_eq!(
            s.slots.as_deref(),
            Some(want[i].to_string().as_str()),
            "shard {i}"
        );
        assert_eq!(s.ready, "2/2");
    }

    let password = redis_password(&client, &ns.name, "cache").await;
    let opts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let mut ms = members(&client, &ns.name).await;
    let writers = Writers::start(&ms, &opts, &want);
    let tallies = &writers.tallies;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (s, t) in tallies.iter().enumerate() {
        assert!(!t.lock().await.acked.is_empty(), "shard {s} takes writes");
    }

    // 1. kill -9 of shard 0's primary server: it restarts in place.
    let p0 = shard_primary(&r, 0).expect("shard 0 primary");
    let mut n = connect_pod(&client, &ns.name, &p0, &password)
        .await
        .expect("connect to shard 0's primary");
    let pid = info_u64(&mut n, "server", "process_id").await;
    drop(n);
    let dead = Endpoint::new(pod_ip(&client, &ns.name, &p0).await, 6379);
    let killed = Instant::now();
    kill_9(u32::try_from(pid).expect("pid"));
    let back = first_write_elsewhere(&tallies[0], killed, &dead, Duration::from_secs(30)).await;
    let outage0 = back - killed;
    println!(
        "shard 0 primary kill -9 → writable again in {:.0} ms",
        outage0.as_secs_f64() * 1000.0
    );
    let r = wait_until(
        &client,
        &ns.name,
        "shard 0 healed with the killed node as replica",
        |r| {
            let s = &r
                .status
                .as_ref()
                .map(|s| s.shards.clone())
                .unwrap_or_default();
            s.first().is_some_and(|s| {
                s.primary.as_deref() != Some(p0.as_str()) && s.replicas == vec![p0.clone()]
            })
        },
    )
    .await;
    let healed0 = killed.elapsed();
    println!(
        "shard 0 Ready again, the killed node a replica, in {:.1} s",
        healed0.as_secs_f64()
    );
    let log = std::fs::read_to_string(
        support::repo_root()
            .join(".dev/localnode/pods")
            .join(format!("{}_{p0}", ns.name))
            .join("redis.log"),
    )
    .unwrap_or_default();
    assert!(
        log.contains("waiting until the cluster hands its slots to a replica")
            && log.contains("the cluster moved this node's slots to a replica"),
        "the restarted primary did not wait for the takeover at boot:\n{log}"
    );
    let st = r.status.clone().expect("status");
    assert_eq!(
        st.cluster.as_ref().map(|c| c.known_nodes),
        Some(6),
        "{st:?}"
    );

    // `REDPILOT_CLUSTER_OP_RUNS` (default 1; `make bench-cluster` sets it)
    // repeats the kill of shard 0's primary, each time on the node that
    // serves it then, for a p50/p99 with the operator in charge.
    let runs: usize = std::env::var("REDPILOT_CLUSTER_OP_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut outages = vec![outage0.as_secs_f64()];
    let mut r = r;
    for run in 2..=runs {
        let p = shard_primary(&r, 0).expect("shard 0 primary");
        let mut n = connect_pod(&client, &ns.name, &p, &password)
            .await
            .expect("connect to shard 0's primary");
        let pid = info_u64(&mut n, "server", "process_id").await;
        drop(n);
        let dead = Endpoint::new(pod_ip(&client, &ns.name, &p).await, 6379);
        // The writer has settled on the current primary.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let killed = Instant::now();
        kill_9(u32::try_from(pid).expect("pid"));
        let back = first_write_elsewhere(&tallies[0], killed, &dead, Duration::from_secs(30)).await;
        outages.push((back - killed).as_secs_f64());
        r = wait_until(&client, &ns.name, "shard 0 healed again", |r| {
            r.status.as_ref().is_some_and(|s| {
                s.shards.first().is_some_and(|s| {
                    s.primary.as_deref() != Some(p.as_str()) && s.replicas == vec![p.clone()]
                })
            })
        })
        .await;
        println!(
            "run {run}: {p} kill -9 → writable again in {:.0} ms, healed in {:.1} s",
            outages[run - 1] * 1000.0,
            killed.elapsed().as_secs_f64()
        );
    }
    if runs > 1 {
        let (p50, p99) = support::faults::percentiles(&outages);
        println!(
            "shard primary kill -9 with the operator, {runs} runs: writable again p50 {:.0} ms, p99 {:.0} ms",
            p50 * 1000.0,
            p99 * 1000.0
        );
    }

    // 2. Shard 1's primary pod deleted: a new, empty node in its place.
    let p1 = shard_primary(&r, 1).expect("shard 1 primary");
    let dead1 = Endpoint::new(pod_ip(&client, &ns.name, &p1).await, 6379);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let deleted = Instant::now();
    pods.delete(&p1, &DeleteParams::default())
        .await
        .expect("delete pod");
    let back1 = first_write_elsewhere(&tallies[1], deleted, &dead1, Duration::from_secs(60)).await;
    println!(
        "shard 1 primary pod deleted → writable again in {:.0} ms",
        (back1 - deleted).as_secs_f64() * 1000.0
    );
    let r = wait_until(
        &client,
        &ns.name,
        "shard 1 healed with the new node as replica",
        |r| {
            let st = r.status.as_ref();
            let s = st.map(|s| s.shards.clone()).unwrap_or_default();
            s.get(1).is_some_and(|s| {
                s.primary.as_deref() != Some(p1.as_str()) && s.replicas == vec![p1.clone()]
            }) && st
                .and_then(|s| s.cluster.as_ref())
                .is_some_and(|c| c.known_nodes == 6)
        },
    )
    .await;
    println!(
        "shard 1 Ready again, the new node a replica, old ID forgotten, in {:.1} s",
        deleted.elapsed().as_secs_f64()
    );
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("NodeForgotten"), "{events}");
    assert!(events.contains("ReplicaAttached"), "{events}");
    // Every node knows exactly the six pods' nodes.
    ms = members(&client, &ns.name).await;
    for m in &ms {
        let mut n = Node::connect(&m.endpoint, &opts).await.expect("connect");
        let nodes = cluster::nodes(&mut n).await.expect("CLUSTER NODES");
        assert_eq!(nodes.len(), 6, "{}: {nodes:?}", m.endpoint);
        assert!(nodes.iter().all(|k| !k.fail), "{}: {nodes:?}", m.endpoint);
    }
    let until = Instant::now();
    let tallies = writers.stop().await;

    // The other shards kept writing; nothing confirmed is lost.
    for (s, t) in tallies.iter().enumerate() {
        let t = t.lock().await;
        let lost = missing(&ms, &opts, want[s].start, &t).await;
        println!(
            "shard {s}: {} confirmed writes, {} failed or unconfirmed, {lost} lost",
            t.acked.len(),
            t.failed
        );
        assert_eq!(lost, 0, "shard {s} lost {lost} confirmed writes");
        if s == 2 {
            let (at, gap) = longest_gap_at(&t.set_ok, killed, until);
            println!(
                "shard 2's longest gap while shards 0 and 1 failed over: {gap:?}, \
                 {at:?} after the kill"
            );
            assert!(
                gap < Duration::from_secs(1),
                "shard 2 took no write for {gap:?}, from {at:?} after the kill \
                 (the API server's slow reads then, if any: .dev/stalls/watch.log)"
            );
        }
    }
    let st = r.status.expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::Phase::Ready),
        "{st:?}"
    );
}

/// The pods of the 3 x 2 Redis `cache` and their UIDs.
async fn pod_uids(client: &kube::Client, ns: &str) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut out = BTreeMap::new();
    for s in 0..3 {
        for j in 0..2 {
            let name = format!("cache-s{s}-{j}");
            if let Ok(Some(p)) = pods.get_opt(&name).await
                && p.metadata.deletion_timestamp.is_none()
                && let Some(uid) = p.metadata.uid
            {
                out.insert(name, uid);
            }
        }
    }
    out
}

/// A planned failover of one shard (`spec.failover.switchoverTo`), then a
/// change that needs every pod restarted, under one writer per shard:
/// the failover moves shard 1's slots with `CLUSTER FAILOVER`; the restart
/// goes one pod at a time, every shard's replicas first, then shard by
/// shard each primary only after its slots moved to a restarted replica; shard 1 ends
/// on the requested pod again; no confirmed write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_rolls_shard_by_shard_and_a_requested_failover_moves_one_shard() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-roll", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1",
               "storage": {"size": "64Mi"}, "resources": {"requests": {"cpu": "50m"}}}),
    )
    .await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let want = spread(3);
    let password = redis_password(&client, &ns.name, "cache").await;
    let opts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let ms = members(&client, &ns.name).await;
    let writers = Writers::start(&ms, &opts, &want);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();

    // 1. The failover a user asks for: shard 1's replica takes its slots.
    let st = r.status.clone().expect("status");
    let old1 = st.shards[1].primary.clone().expect("shard 1 primary");
    let target = st.shards[1].replicas[0].clone();
    let asked = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"failover": {"switchoverTo": target}}}),
    )
    .await;
    wait_until(
        &client,
        &ns.name,
        "shard 1 served by the requested pod",
        |r| {
            shard_primary(r, 1).as_deref() == Some(target.as_str())
                && r.status
                    .as_ref()
                    .is_some_and(|s| s.shards[1].replicas == vec![old1.clone()])
        },
    )
    .await;
    println!(
        "requested failover: shard 1 moved from {old1} to {target} in {:.1} s (status Ready)",
        asked.elapsed().as_secs_f64()
    );
    let events = recent_events(&client, &ns.name, 30).await;
    assert!(
        events.contains("ClusterFailover") && events.contains("switchoverTo"),
        "{events}"
    );

    // 2. A change that needs every pod restarted.
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("redis");
    let primaries_before: Vec<String> = (0..3)
        .map(|s| shard_primary(&r, s).expect("primary"))
        .collect();
    let before = pod_uids(&client, &ns.name).await;
    assert_eq!(before.len(), 6);
    let changed = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"resources": {"requests": {"cpu": "60m"}}}}),
    )
    .await;
    // Watch the pods go: the order, and who served each shard then.
    let mut order: Vec<(String, Vec<Option<String>>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now = pod_uids(&client, &ns.name).await;
        let r = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("redis");
        let primaries: Vec<Option<String>> = (0..3).map(|s| shard_primary(&r, s)).collect();
        for (pod, uid) in &before {
            if now.get(pod) != Some(uid) && !order.iter().any(|(p, _)| p == pod) {
                order.push((pod.clone(), primaries.clone()));
            }
        }
        if order.len() == 6
            && support::operator::is_ready(&r)
            && shard_primary(&r, 1).as_deref() == Some(target.as_str())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the roll did not finish: restarted {order:?}\n{}",
            recent_events(&client, &ns.name, 40).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rolled = changed.elapsed();
    // Ready is not the end of it: each shard confirms writes again (its
    // replica resynced) and every replica's link is up.
    writers.confirm_again(50, Duration::from_secs(30)).await;
    cluster_writer::replicas_linked(&members(&client, &ns.name).await, &opts, 3).await;
    let until = Instant::now();
    let tallies = writers.stop().await;
    let shard_of = |pod: &str| -> usize {
        pod.strip_prefix("cache-s")
            .and_then(|r| r.split('-').next())
            .and_then(|s| s.parse().ok())
            .expect("shard")
    };
    let sequence: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    println!(
        "restart-only change → every pod restarted and Ready in {:.1} s, in order {sequence:?}",
        rolled.as_secs_f64()
    );
    // Every shard's replicas first, shard by shard, then each shard's old
    // primary (after its failover), shard by shard.
    let (replicas, primaries): (Vec<&str>, Vec<&str>) = sequence
        .iter()
        .partition(|p| !primaries_before.iter().any(|q| q == *p));
    assert_eq!(
        sequence,
        [replicas.clone(), primaries.clone()].concat(),
        "every replica before any primary"
    );
    for part in [&replicas, &primaries] {
        let shards: Vec<usize> = part.iter().map(|p| shard_of(p)).collect();
        assert!(
            shards.windows(2).all(|w| w[0] < w[1]),
            "not shard by shard: {sequence:?}"
        );
    }
    // No pod restarted while it served its shard's slots: each shard's
    // primary handed over first.
    for (pod, primaries) in &order {
        let s = shard_of(pod);
        assert_ne!(
            primaries[s].as_deref(),
            Some(pod.as_str()),
            "{pod} restarted while it was shard {s}'s primary ({order:?})"
        );
    }
    for (s, p) in primaries_before.iter().enumerate() {
        let last_of_shard = sequence
            .iter()
            .rev()
            .find(|q| shard_of(q) == s)
            .expect("restarted");
        assert_eq!(
            last_of_shard, p,
            "shard {s}: its primary {p} restarts last, after the failover ({sequence:?})"
        );
    }
    // Nothing confirmed is lost; how long each shard went without a write.
    let ms = members(&client, &ns.name).await;
    let events = recent_events(&client, &ns.name, 40).await;
    for (s, t) in tallies.iter().enumerate() {
        let t = t.lock().await;
        let lost = missing(&ms, &opts, want[s].start, &t).await;
        let (gap_at, gap) = longest_gap_at(&t.set_ok, started, until);
        println!(
            "shard {s}: {} confirmed writes, {} failed or unconfirmed, {lost} lost, longest gap {:.0} ms",
            t.acked.len(),
            t.failed,
            gap.as_secs_f64() * 1000.0
        );
        assert_eq!(lost, 0, "shard {s} lost {lost} confirmed writes");
        assert!(
            gap < Duration::from_secs(3),
            "shard {s} took no write for {gap:?}, from {:.1} s after the writers started \
             (the roll began at {:.1} s; restarts {order:?})\n{events}",
            gap_at.as_secs_f64(),
            (changed - started).as_secs_f64()
        );
    }
}

/// The operator stopped (as a crash would) right after it gave the first
/// shard its slots: the cluster stands half formed, a writer of that shard
/// already writes. A new operator process (after the lease expires)
/// finishes where it stopped: every slot assigned once, evenly, replicas
/// attached. Then shard 0's primary is cut off the network: its replica
/// takes over, the isolated primary stops taking writes within the node
/// timeout, and once healed it follows the new primary. No write confirmed
/// with `WAIT 1` is lost through either fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_creation_is_finished_by_the_next_one() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-crash", &[]).await;
    let opts = OperatorOptions::watching(&[&ns.name])
        .named("op-crash")
        .crash_lease();
    // Either process is started again if it loses its short lease on a
    // loaded machine, as its Deployment would; the one stopped at the
    // failpoint (exit 86) is left down.
    let mut crashing = opts.clone();
    crashing
        .env
        .push(("REDPILOT_FAILPOINTS".into(), "cluster-after-slots".into()));
    let mut first = start_operator(&client, crashing).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1"}),
    )
    .await;
    support::operator::wait_failpoint(&mut first, READY).await;
    let stopped = Instant::now();

    // Half formed: some slots have an owner, not all.
    let password = redis_password(&client, &ns.name, "cache").await;
    let opts_c = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let ms = members(&client, &ns.name).await;
    let mut assigned = 0;
    for m in &ms {
        if let Ok(mut n) = Node::connect(&m.endpoint, &opts_c).await
            && let Ok(info) = cluster::info(&mut n).await
        {
            assigned = assigned.max(info.slots_assigned);
        }
    }
    assert!(
        assigned > 0 && assigned < 16384,
        "the operator stopped with {assigned} slots assigned, not in the middle"
    );
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("redis");
    assert!(!support::operator::is_ready(&r), "half formed is not Ready");
    println!("operator stopped at the failpoint with {assigned} of 16384 slots assigned");

    // Writers on every shard: the assigned one writes while no operator runs.
    let want = spread(3);
    let writers = Writers::start(&ms, &opts_c, &want);
    let tallies = &writers.tallies;
    let _next = spawn_operator(&client, opts.named("op-next")).await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let finished = stopped.elapsed();
    let st = r.status.clone().expect("status");
    let c = st.cluster.clone().expect("status.cluster");
    assert_eq!(
        (
            c.state.as_str(),
            c.slots_assigned,
            c.slots_ok,
            c.known_nodes
        ),
        ("ok", 16384, 16384, 6),
        "{c:?}"
    );
    for (i, s) in st.shards.iter().enumerate() {
        assert_eq!(
            s.slots.as_deref(),
            Some(want[i].to_string().as_str()),
            "shard {i}: {s:?}"
        );
        assert_eq!(s.replicas.len(), 1, "shard {i}: {s:?}");
    }
    println!(
        "the next operator finished the cluster {:.1} s after the first stopped",
        finished.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Then shard 0's primary is cut off the network (its host-side veth
    // down) while a client inside its pod writes to it.
    let p0 = shard_primary(&r, 0).expect("shard 0 primary");
    let ip0 = pod_ip(&client, &ns.name, &p0).await;
    let mut part = Partition::of(&ip0);
    let inside = InsideWriter::start(
        &pod_netns(&ip0),
        &password,
        &format!("{{{}}}-inside", tag_in(&want[0], 0)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut = Instant::now();
    part.cut();
    let dead = Endpoint::new(ip0.clone(), 6379);
    let back = first_write_elsewhere(&tallies[0], cut, &dead, Duration::from_secs(30)).await;
    println!(
        "shard 0 primary cut off → writable again on its replica in {:.0} ms",
        (back - cut).as_secs_f64() * 1000.0
    );
    // The client inside writes for a fixed time from the cut, however soon
    // the replica took over: the isolated primary must be seen refusing.
    tokio::time::sleep_until(tokio::time::Instant::from_std(cut + Duration::from_secs(8))).await;
    let inside = inside.stop();
    let refused = inside.errors.get("CLUSTERDOWN").copied().unwrap_or(0);
    assert!(
        refused > 0,
        "the isolated primary was never seen refusing a write (CLUSTERDOWN) in the 8 s after the cut: \
         {} acknowledged, errors {:?}",
        inside.acks.len(),
        inside.errors
    );
    let taken: Vec<Instant> = inside
        .acks
        .iter()
        .map(|a| a.acked)
        .filter(|t| *t > cut)
        .collect();
    assert!(
        !taken.is_empty(),
        "the client inside the cut pod wrote nothing after the cut: the fault did not happen"
    );
    let last = taken.iter().max().map(|t| *t - cut).unwrap_or_default();
    println!(
        "the isolated primary took {} unconfirmed writes from inside its pod, the last {:.0} ms after the cut, then refused them ({} refused)",
        taken.len(),
        last.as_secs_f64() * 1000.0,
        inside.failed
    );
    assert!(
        last < Duration::from_secs(3),
        "the isolated primary kept taking writes for {last:?}"
    );
    part.heal();
    let healed = Instant::now();
    // The cluster heals itself: the cut node sees the higher epoch of its
    // slots and follows the new primary. (The operator's status follows on
    // its next pass, which the backoff after an unreachable instance may
    // delay; the data plane is what is timed here.)
    let mut n0 = wait_for(
        "the cut node linked to its shard's new primary",
        Duration::from_secs(60),
        || async {
            let mut n = connect_pod(&client, &ns.name, &p0, &password).await.ok()?;
            let info: String = n
                .query("INFO", redis::cmd("INFO").arg("replication"))
                .await
                .ok()?;
            (info.contains("role:slave") && info.contains("master_link_status:up")).then_some(n)
        },
    )
    .await;
    let nodes = cluster::nodes(&mut n0).await.expect("CLUSTER NODES");
    assert!(
        nodes.iter().all(|k| !k.fail),
        "a node still flagged failing: {nodes:?}"
    );
    println!(
        "healed: the cut node follows the new primary with its link up {:.1} s after the heal",
        healed.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tallies = writers.stop().await;
    let ms = members(&client, &ns.name).await;
    let mut before_ready = 0;
    for (s, t) in tallies.iter().enumerate() {
        let t = t.lock().await;
        let lost = missing(&ms, &opts_c, want[s].start, &t).await;
        // Before Ready a shard's replica may not follow yet: its writes
        // are taken (SET answered) but not confirmed by WAIT.
        let early = t
            .set_ok
            .iter()
            .filter(|(at, _)| *at < stopped + finished)
            .count();
        before_ready += early;
        println!(
            "shard {s}: {} confirmed writes, {early} writes taken before Ready, {lost} lost",
            t.acked.len()
        );
        assert!(!t.acked.is_empty(), "shard {s} takes writes once Ready");
        assert_eq!(lost, 0, "shard {s} lost {lost} confirmed writes");
    }
    assert!(
        before_ready > 0,
        "no write was taken while the cluster was half formed"
    );
}

/// `pick` of each pod's server container, by pod name.
async fn per_server(
    client: &kube::Client,
    ns: &str,
    pick: impl Fn(&k8s_openapi::api::core::v1::Container) -> String,
) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut out = BTreeMap::new();
    for p in pods.list(&Default::default()).await.expect("pods").items {
        let Some(spec) = p.spec else { continue };
        if let (Some(name), Some(c)) = (
            p.metadata.name,
            spec.containers.iter().find(|c| c.name == "redis"),
        ) {
            out.insert(name, pick(c));
        }
    }
    out
}

/// Each pod's server image, by pod name.
async fn pod_images(client: &kube::Client, ns: &str) -> BTreeMap<String, String> {
    per_server(client, ns, |c| c.image.clone().unwrap_or_default()).await
}

/// A Cluster upgrade: first to an image the node cannot pull (the first
/// upgraded replica fails, every upgraded pod is put back, no primary is
/// touched, the status says why), to a server that exits at start and to
/// one that is never Ready (the same), then Redis 7.0 → Valkey 8.1: every
/// shard's replicas first, then shard by shard a `CLUSTER FAILOVER` to an
/// upgraded replica and the old primary, the operator killed half way and
/// the next one finishing; writers on every shard lose no confirmed write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_rolls_back_a_failed_image_then_moves_redis_to_valkey_across_an_operator_crash()
{
    use redpilot::api::v1alpha1::{Engine, UpgradePhase};
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-up", &[]).await;
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    // The operator's Valkey 8.1 image is one the local node does not have.
    opts.env.push((
        "RELATED_IMAGE_VALKEY_8_1".into(),
        "mirror.invalid/valkey:8.1".into(),
    ));
    // The test's broken images are allowed as `spec.image` here.
    opts.env.push((
        "REDPILOT_ALLOWED_IMAGES".into(),
        "redis,valkey/valkey,redpilot-test/*".into(),
    ));
    let mut op = start_operator(&client, opts.clone()).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Redis", "version": "7.0",
               "storage": {"size": "64Mi"}, "upgrade": {"timeoutSeconds": 60}}),
    )
    .await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let primaries: Vec<String> = (0..3)
        .map(|s| shard_primary(&r, s).expect("primary"))
        .collect();
    let uids = pod_uids(&client, &ns.name).await;
    let old_images = pod_images(&client, &ns.name).await;
    assert!(
        old_images.values().all(|i| i.contains("redis:7.0")),
        "{old_images:?}"
    );
    let want = spread(3);
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let ms = members(&client, &ns.name).await;
    let writers = Writers::start(&ms, &copts, &want);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();

    // 1. Three versions that fail on the first upgraded replica, each a new
    // spec change: an image the node cannot pull, a server that exits at
    // start, one that starts but is never Ready (rolled back once
    // spec.upgrade.timeoutSeconds, 30 here, has passed). Each is rolled
    // back with no primary touched and every pod on Redis 7.0 again.
    for (patch, timeout, reason, target) in [
        (
            json!({"engine": "Valkey", "version": "8.1"}),
            60,
            "ImagePullFailed",
            "mirror.invalid/valkey:8.1",
        ),
        (
            json!({"image": "redpilot-test/exits-at-start:7.0"}),
            60,
            "CrashLoop",
            "redpilot-test/exits-at-start:7.0",
        ),
        (
            json!({"image": "redpilot-test/never-ready:7.0"}),
            30,
            "NotReadyInTime",
            "redpilot-test/never-ready:7.0",
        ),
    ] {
        let before = pod_uids(&client, &ns.name).await;
        let mut spec = patch;
        spec["upgrade"] = json!({"timeoutSeconds": timeout});
        support::operator::patch_redis(&client, &ns.name, "cache", json!({ "spec": spec })).await;
        let t = Instant::now();
        let r = wait_until(&client, &ns.name, "the failed upgrade rolled back", |r| {
            r.status
                .as_ref()
                .and_then(|s| s.upgrade.as_ref())
                .is_some_and(|u| u.phase == UpgradePhase::RolledBack && u.to.image.contains(target))
        })
        .await;
        let u = r
            .status
            .as_ref()
            .and_then(|s| s.upgrade.clone())
            .expect("upgrade");
        println!(
            "{target}: {:?} {:?} in {:.1} s: {}",
            u.phase,
            u.reason,
            t.elapsed().as_secs_f64(),
            u.message.clone().unwrap_or_default()
        );
        assert_eq!(u.reason.as_deref(), Some(reason), "{u:?}");
        assert_eq!(
            (u.from.engine, u.from.version.as_str()),
            (Engine::Redis, "7.0")
        );
        if reason == "NotReadyInTime" {
            assert!(
                t.elapsed() >= Duration::from_secs(30),
                "not before the timeout"
            );
        }
        let cond = r
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "UpgradeFailed"))
            .expect("UpgradeFailed condition");
        assert_eq!(cond.status, "True", "{cond:?}");
        let now = pod_uids(&client, &ns.name).await;
        for p in &primaries {
            assert_eq!(
                now.get(p),
                uids.get(p),
                "{target}: primary {p} was restarted"
            );
        }
        assert_eq!(
            pod_images(&client, &ns.name).await,
            old_images,
            "{target}: every pod runs Redis 7.0 again"
        );
        let restarted: Vec<&String> = before
            .keys()
            .filter(|p| now.get(*p) != before.get(*p))
            .collect();
        assert!(
            !restarted.is_empty(),
            "{target}: the attempt restarted no replica"
        );
        println!("put back on Redis 7.0: {restarted:?}; primaries untouched");
    }
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"upgrade": {"timeoutSeconds": 60}}}),
    )
    .await;

    // 2. Redis 7.0 → Valkey 8.1 from an image the node has (a new spec
    // change, a new attempt), watching the order of the restarts. The
    // operator is killed (SIGKILL) once the first old primary restarts,
    // and another one finishes the upgrade.
    let before = pod_uids(&client, &ns.name).await;
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("redis");
    let primaries_before: Vec<String> = (0..3)
        .map(|s| shard_primary(&r, s).expect("primary"))
        .collect();
    let asked = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"image": "valkey/valkey:8.1"}}),
    )
    .await;
    let mut order: Vec<(String, Vec<Option<String>>)> = Vec::new();
    let mut next_op = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    let r = loop {
        let now = pod_uids(&client, &ns.name).await;
        let r = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("redis");
        let primaries: Vec<Option<String>> = (0..3).map(|s| shard_primary(&r, s)).collect();
        for (pod, uid) in &before {
            if now.get(pod) != Some(uid) && !order.iter().any(|(p, _)| p == pod) {
                order.push((pod.clone(), primaries.clone()));
            }
        }
        if next_op.is_none()
            && order
                .iter()
                .any(|(p, _)| primaries_before.iter().any(|q| q == p))
        {
            op.kill();
            let sequence: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
            println!("operator killed mid-upgrade, after restarts {sequence:?}");
            let mut o = OperatorOptions::watching(&[&ns.name]);
            o.env = opts.env.clone();
            next_op = Some(start_operator(&client, o).await);
        }
        let done = r
            .status
            .as_ref()
            .and_then(|s| s.upgrade.as_ref())
            .is_some_and(|u| {
                u.phase == UpgradePhase::Succeeded && u.to.image == "valkey/valkey:8.1"
            });
        if done && support::operator::is_ready(&r) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the upgrade did not finish: restarted {order:?}; status {:?}\n{}",
            r.status.as_ref().map(|s| (&s.upgrade, &s.conditions)),
            recent_events(&client, &ns.name, 40).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = asked.elapsed();
    writers.confirm_again(50, Duration::from_secs(30)).await;
    cluster_writer::replicas_linked(&members(&client, &ns.name).await, &copts, 3).await;
    let until = Instant::now();
    let tallies = writers.stop().await;
    let st = r.status.clone().expect("status");
    let sequence: Vec<&str> = order.iter().map(|(p, _)| p.as_str()).collect();
    println!(
        "Redis 7.0 → Valkey 8.1: Succeeded and Ready in {:.1} s, restarts in order {sequence:?}; versions {:?}",
        took.as_secs_f64(),
        st.current_version
    );
    assert!(
        st.current_version
            .as_deref()
            .is_some_and(|v| v.starts_with("8.1") && !v.contains(',')),
        "every server runs Valkey 8.1: {:?}",
        st.current_version
    );
    assert!(next_op.is_some(), "the operator was killed mid-upgrade");
    let u = st.upgrade.clone().expect("upgrade");
    assert_eq!(
        (u.from.engine, u.from.version.as_str(), u.done, u.total),
        (Engine::Redis, "7.0", 6, 6),
        "the next operator went on with the same upgrade: {u:?}"
    );
    assert_eq!(sequence.len(), 6, "every pod restarted once: {order:?}");
    for (pod, primaries) in &order {
        let s: usize = pod[7..8].parse().expect("shard");
        assert_ne!(
            primaries[s].as_deref(),
            Some(pod.as_str()),
            "{pod} restarted while it was shard {s}'s primary ({order:?})"
        );
    }
    let first_primary = sequence
        .iter()
        .position(|p| primaries_before.iter().any(|q| q == p))
        .expect("a primary restarted");
    assert_eq!(
        first_primary, 3,
        "every replica before any primary: {sequence:?}"
    );
    let images = pod_images(&client, &ns.name).await;
    assert!(
        images
            .values()
            .all(|i| i.contains("valkey") && i.contains("8.1")),
        "{images:?}"
    );
    let ms = members(&client, &ns.name).await;
    // What the servers themselves say they run, not the operator's status.
    assert_eq!(ms.len(), 6);
    for m in &ms {
        let mut n = Node::connect(&m.endpoint, &copts)
            .await
            .unwrap_or_else(|e| panic!("connecting to {:?}: {e}", m.endpoint));
        let server = n.info_section("server").await.expect("INFO server").server;
        assert_eq!(
            (server.engine, server.version.map(|v| (v.major, v.minor))),
            (
                Some(redpilot::redis::info::EngineKind::Valkey),
                Some((8, 1))
            ),
            "{:?} runs {:?} {:?}",
            m.endpoint,
            server.engine,
            server.version
        );
    }
    let mut gaps = Vec::new();
    for (s, t) in tallies.iter().enumerate() {
        let t = t.lock().await;
        let lost = missing(&ms, &copts, want[s].start, &t).await;
        let gap = longest_gap(&t.set_ok, started, until);
        gaps.push(gap);
        println!(
            "shard {s}: {} confirmed writes, {} failed or unconfirmed, {lost} lost, longest gap {:.0} ms",
            t.acked.len(),
            t.failed,
            gap.as_secs_f64() * 1000.0
        );
        assert!(t.acked.len() > 100, "shard {s}: the writer wrote");
        assert_eq!(lost, 0, "shard {s} lost {lost} confirmed writes");
        assert!(
            gap < Duration::from_secs(3),
            "shard {s} took no write for {gap:?}"
        );
    }
    let events = recent_events(&client, &ns.name, 100).await;
    for reason in [
        "UpgradeStarted",
        "UpgradeFailed",
        "UpgradeRolledBack",
        "UpgradeSucceeded",
        "ClusterFailover",
    ] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }

    // `REDPILOT_CLUSTER_UPGRADE_RUNS` (default 1; `make bench-cluster` sets
    // it): that many upgrades in all, each further one of a new 3 x 2
    // Redis 7.0 to Valkey 8.1 under per-shard writers, for the spread.
    let runs: usize = std::env::var("REDPILOT_CLUSTER_UPGRADE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut times = vec![took];
    for run in 1..runs {
        let (t, shards) = measured_upgrade(&client, &ns.name, &format!("more-{run}")).await;
        println!(
            "upgrade run {}: Succeeded and Ready in {:.1} s",
            run + 1,
            t.as_secs_f64()
        );
        for (s, (acked, gap)) in shards.iter().enumerate() {
            println!(
                "  shard {s}: {acked} confirmed writes, 0 lost, longest gap {:.0} ms",
                gap.as_secs_f64() * 1000.0
            );
            gaps.push(*gap);
        }
        times.push(t);
    }
    gaps.sort();
    times.sort();
    let ms_of = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{runs} upgrade(s) of a 3 x 2 Cluster Redis, Redis 7.0 to Valkey 8.1: per-shard longest write gap p50 {:.0} ms, max {:.0} ms over {} shard runs; 0 confirmed writes lost; time to Succeeded p50 {:.1} s, max {:.1} s",
        ms_of(gaps[gaps.len() / 2]),
        ms_of(gaps[gaps.len() - 1]),
        gaps.len(),
        times[times.len() / 2].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
}

/// No way back in a Cluster: a Valkey 8.1 → 9.1 upgrade under per-shard
/// writers is turned back to 8.1 the moment a shard's primary runs 9.1
/// (read from the server: `role:master`, `valkey_version` 9.1). An older
/// server cannot follow a newer primary, so nothing is put back: the
/// operator says so (`UpgradeFailed`, reason `NoWayBack`, naming
/// `spec.version`; event `NoWayBack`), finishes the upgrade, every server
/// ends on 9.1 (read from each), no confirmed write is lost; the spec set
/// to 9.1 again clears the condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_upgrade_turned_back_after_a_shard_primary_moved_only_goes_forward() {
    use redpilot::api::v1alpha1::UpgradePhase;
    use redpilot::redis::info::Role;
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-fwd", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1",
               "storage": {"size": "64Mi"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let pw = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(pw.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let want = spread(3);
    let writers = Writers::start(&members(&client, &ns.name).await, &copts, &want);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"version": "9.1"}}),
    )
    .await;
    let api = redis_api(&client, &ns.name);
    // The first moment a shard's primary, as the status names it, runs
    // 9.1 while the upgrade is under way.
    let (moved, u) = wait_for(
        "a shard's primary on 9.1 during the upgrade",
        Duration::from_secs(300),
        || async {
            let r = api.get("cache").await.ok()?;
            let u = r.status.as_ref()?.upgrade.clone()?;
            if u.phase != UpgradePhase::Upgrading || u.to.version != "9.1" {
                return None;
            }
            let images = pod_images(&client, &ns.name).await;
            let p = (0..3).find_map(|s| {
                let p = shard_primary(&r, s)?;
                images.get(&p)?.ends_with(":9.1").then_some(p)
            })?;
            Some((p, u))
        },
    )
    .await;
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"version": "8.1"}}),
    )
    .await;
    let turned = started.elapsed();
    // The server itself: a primary running 9.1.
    let mut n = connect_pod(&client, &ns.name, &moved, &pw)
        .await
        .expect("connect to the moved primary");
    let info = n.info().await.expect("INFO");
    println!(
        "turned back to 8.1 {:.1} s into the upgrade ({}/{} instances done): {moved} is {:?} on {:?}",
        turned.as_secs_f64(),
        u.done,
        u.total,
        info.replication.role,
        info.server.version
    );
    assert_eq!(info.replication.role, Some(Role::Primary), "{moved}");
    assert_eq!(
        info.server.version.map(|v| (v.major, v.minor)),
        Some((9, 1)),
        "{moved}"
    );
    assert!(u.done < u.total, "turned back mid-way: {u:?}");
    let cond = wait_for(
        "UpgradeFailed NoWayBack",
        Duration::from_secs(60),
        || async {
            let r = api.get("cache").await.ok()?;
            r.status?.conditions.into_iter().find(|c| {
                c.type_ == "UpgradeFailed" && c.status == "True" && c.reason == "NoWayBack"
            })
        },
    )
    .await;
    println!("UpgradeFailed NoWayBack: {}", cond.message);
    assert!(
        cond.message.contains("spec.version")
            && cond.message.contains("8.1")
            && cond.message.contains("9.1"),
        "{}",
        cond.message
    );
    // Forward: the upgrade to 9.1 ends, every pod on 9.1, Ready.
    wait_for(
        "the upgrade to 9.1 finished, every pod on 9.1, Ready",
        Duration::from_secs(300),
        || async {
            let r = api.get("cache").await.ok()?;
            let u = r.status.as_ref()?.upgrade.as_ref()?;
            let images = pod_images(&client, &ns.name).await;
            (u.phase == UpgradePhase::Succeeded
                && u.to.version == "9.1"
                && images.len() == 6
                && images.values().all(|i| i.ends_with(":9.1"))
                && support::operator::is_ready(&r))
            .then_some(())
        },
    )
    .await;
    println!(
        "upgrade to 9.1 Succeeded and Ready {:.1} s after it began",
        started.elapsed().as_secs_f64()
    );
    let events = recent_events(&client, &ns.name, 100).await;
    for reason in ["NoWayBack", "UpgradeSucceeded"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    assert!(
        !events.contains("UpgradeRetargeted") && !events.contains("UpgradeRolledBack"),
        "nothing was put back:\n{events}"
    );
    let ms = support::operator::cluster_members(&client, &ns.name, "cache").await;
    assert_eq!(ms.len(), 6);
    for m in &ms {
        let mut n = Node::connect(&m.endpoint, &copts).await.expect("connect");
        let v = n.info().await.expect("INFO").server.version;
        assert_eq!(
            v.map(|v| (v.major, v.minor)),
            Some((9, 1)),
            "{}: {v:?}",
            m.endpoint
        );
    }
    writers.confirm_again(50, Duration::from_secs(30)).await;
    cluster_writer::replicas_linked(&ms, &copts, 3).await;
    let tallies = writers.stop().await;
    for (s, t) in tallies.iter().enumerate() {
        let t = t.lock().await;
        let lost = missing(&ms, &copts, want[s].start, &t).await;
        println!("shard {s}: {} confirmed writes, {lost} lost", t.acked.len());
        assert_eq!(lost, 0, "shard {s} lost {lost} confirmed writes");
    }
    // The spec set to what runs clears the condition.
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"version": "9.1"}}),
    )
    .await;
    wait_for(
        "UpgradeFailed cleared once the spec asks for 9.1",
        Duration::from_secs(60),
        || async {
            let r = api.get("cache").await.ok()?;
            (!r.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "UpgradeFailed" && c.status == "True"))
            .then_some(())
        },
    )
    .await;
}

/// One more measured upgrade (`REDPILOT_CLUSTER_UPGRADE_RUNS`): a new 3 x 2
/// Redis 7.0 Cluster Redis `name` under per-shard writers confirming with
/// `WAIT 1`, moved to the Valkey 8.1 image; asserts no confirmed write is
/// lost and returns the time to Succeeded and Ready and, per shard, the
/// confirmed writes and the longest gap. The Redis is deleted afterwards.
async fn measured_upgrade(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> (Duration, Vec<(usize, Duration)>) {
    use redpilot::api::v1alpha1::UpgradePhase;
    apply_redis(
        client,
        ns,
        name,
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Redis", "version": "7.0",
               "storage": {"size": "64Mi"}}),
    )
    .await;
    wait_ready(client, ns, name, READY).await;
    let copts = ConnectOptions::default()
        .with_password(redis_password(client, ns, name).await)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let want = spread(3);
    let writers = Writers::start(
        &support::operator::cluster_members(client, ns, name).await,
        &copts,
        &want,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    support::operator::patch_redis(
        client,
        ns,
        name,
        json!({"spec": {"engine": "Valkey", "version": "8.1", "image": "valkey/valkey:8.1"}}),
    )
    .await;
    let api = redis_api(client, ns);
    wait_for(
        "the measured upgrade to succeed",
        Duration::from_secs(300),
        || async {
            let r = api.get(name).await.ok()?;
            let done = r.status.as_ref()?.upgrade.as_ref().is_some_and(|u| {
                u.phase == UpgradePhase::Succeeded && u.to.image == "valkey/valkey:8.1"
            });
            (done && support::operator::is_ready(&r)).then_some(())
        },
    )
    .await;
    let took = started.elapsed();
    writers.confirm_again(50, Duration::from_secs(30)).await;
    let ms = support::operator::cluster_members(client, ns, name).await;
    cluster_writer::replicas_linked(&ms, &copts, ms.len() / 2).await;
    let until = Instant::now();
    let tallies = writers.stop().await;
    let mut out = Vec::new();
    for (s, t) in tallies.iter().enumerate() {
        let t = t.lock().await;
        let lost = missing(&ms, &copts, want[s].start, &t).await;
        assert!(t.acked.len() > 100, "{name} shard {s}: the writer wrote");
        assert_eq!(lost, 0, "{name} shard {s} lost {lost} confirmed writes");
        out.push((t.acked.len(), longest_gap(&t.set_ok, started, until)));
    }
    api.delete(name, &DeleteParams::default())
        .await
        .expect("deleting the measured Redis");
    (took, out)
}

/// Each pod's server memory limit, by pod name.
async fn pod_memory(client: &kube::Client, ns: &str) -> BTreeMap<String, String> {
    per_server(client, ns, |c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref()?.get("memory").cloned())
            .map(|q| q.0)
            .unwrap_or_default()
    })
    .await
}

/// The memory autopilot in Cluster mode: shard 1's primary is filled past
/// 80 % of its `maxmemory`; the autopilot grows every instance of every
/// shard in place (the same limit everywhere), every replica before the
/// primaries; `maxmemory` follows on every node; the fill meets no OOM
/// reply; no pod is replaced or restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_autopilot_grows_every_shard_in_place_without_oom() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-mem", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1",
               "persistence": {"rdb": false}, "config": {"maxmemory-policy": "noeviction"},
               "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
               "monitoring": {"exporter": false},
               "autopilot": {"memory": {"maxMemory": "256Mi", "lookaheadSeconds": 0}}}),
    )
    .await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let primaries: Vec<String> = (0..3)
        .map(|s| shard_primary(&r, s).expect("primary"))
        .collect();
    let uids = pod_uids(&client, &ns.name).await;
    let start = pod_memory(&client, &ns.name).await;
    assert!(start.values().all(|l| l == "64Mi"), "{start:?}");
    let password = redis_password(&client, &ns.name, "cache").await;
    let want = spread(3);
    let tag = tag_in(&want[1], 1);
    let ip = pod_ip(&client, &ns.name, &primaries[1]).await;
    // 40 MiB at 2 MiB/s into shard 1: past 80 % of the 48 MiB maxmemory
    // the 64Mi limit gives.
    let filler = support::fill::Filler::start(
        ip,
        password.clone(),
        &format!("{{{tag}}}"),
        0,
        40 << 20,
        2 << 20,
        false,
    );
    // When each pod's limit first changed.
    let mut changed: BTreeMap<String, Duration> = BTreeMap::new();
    let t = Instant::now();
    let target = loop {
        let now = pod_memory(&client, &ns.name).await;
        // One time per look: pods seen changed in the same look changed
        // together as far as the test can tell (the order of the map is
        // not the order of the changes).
        let at = t.elapsed();
        for (pod, l) in &now {
            if l != "64Mi" && !changed.contains_key(pod) {
                changed.insert(pod.clone(), at);
            }
        }
        let r = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("redis");
        let target = r
            .status
            .as_ref()
            .and_then(|s| s.autopilot.as_ref()?.memory.as_ref())
            .map(|m| m.limit.clone());
        if let Some(target) = target.filter(|l| l != "64Mi")
            && now.len() == 6
            && now.values().all(|l| *l == target)
        {
            break target;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "every instance at the autopilot's limit within 120 s: {now:?}\n{}",
            recent_events(&client, &ns.name, 40).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let tally = filler.finish(Duration::from_secs(60)).await;
    println!(
        "fill of 40 MiB at 2 MiB/s into shard 1: {} keys, {} OOM replies, {} other failures; \
         every instance at {target} after {:.1} s; first change per pod: {changed:?}",
        tally.written,
        tally.oom,
        tally.failed,
        t.elapsed().as_secs_f64()
    );
    let events = recent_events(&client, &ns.name, 80).await;
    assert_eq!(tally.oom, 0, "OOM replies with the autopilot on\n{events}");
    assert_eq!(tally.failed, 0, "{:?}", tally.first_failure);
    assert_eq!(tally.written, (40 << 20) / support::fill::VALUE as u64);
    // Replicas first: no primary changed before every replica had.
    let last_replica = changed
        .iter()
        .filter(|(p, _)| !primaries.contains(p))
        .map(|(_, d)| *d)
        .max()
        .expect("replicas resized");
    let first_primary = changed
        .iter()
        .filter(|(p, _)| primaries.contains(p))
        .map(|(_, d)| *d)
        .min()
        .expect("primaries resized");
    assert!(
        last_replica <= first_primary,
        "a primary was resized before every replica: {changed:?} (primaries {primaries:?})"
    );
    // maxmemory follows the limit on every node (75 % of it).
    let want_max = redpilot::controller::redis::autopilot::policy::maxmemory_of(
        redpilot::controller::redis::facts::quantity_bytes(
            &k8s_openapi::apimachinery::pkg::api::resource::Quantity(target.clone()),
        )
        .expect("limit"),
    );
    wait_for(
        "maxmemory on every node",
        Duration::from_secs(30),
        || async {
            for pod in uids.keys() {
                let mut n = connect_pod(&client, &ns.name, pod, &password).await.ok()?;
                if info_u64(&mut n, "memory", "maxmemory").await != want_max {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    assert!(events.contains("MemoryGrow"), "{events}");
    assert!(!events.contains("RollingRestart"), "{events}");
    assert_eq!(
        pod_uids(&client, &ns.name).await,
        uids,
        "no pod was replaced"
    );
    let restarts: i32 = support::operator::redis_pods(&client, &ns.name, "cache")
        .await
        .values()
        .map(support::operator::container_restarts)
        .sum();
    assert_eq!(restarts, 0, "no server restarted");
}

/// The local node's bridge address: pods reach the host (the S3 server)
/// there.
const NODE_IP: &str = "10.244.0.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_takes_every_shard_across_an_operator_crash_and_restores_into_a_new_cluster() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Patch, PatchParams, PostParams};
    use redpilot::api::v1alpha1::{BackupPhase, Mode, RedisBackup};
    use support::s3_server::{ACCESS_KEY, S3Server, SECRET_KEY};
    const BUCKET: &str = "backups";
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-backup", &[]).await;
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    let creds: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3", "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &creds)
        .await
        .expect("creating the credentials Secret");
    let opts = OperatorOptions::watching(&[&ns.name])
        .named("op-cluster-backup")
        .crash_lease();
    // Started again if it loses its short lease on a loaded machine (as
    // its Deployment would); left down once stopped at the failpoint.
    let mut crashing = opts.clone();
    crashing.env.push((
        "REDPILOT_FAILPOINTS".into(),
        "backup-after-first-shard-job".into(),
    ));
    let mut first = start_operator(&client, crashing.clone()).await;
    let spec = json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey",
                      "version": "8.1", "config": {"maxmemory-policy": "allkeys-lru"}});
    apply_redis(&client, &ns.name, "cache", spec.clone()).await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let primaries: Vec<String> = (0..3)
        .map(|s| shard_primary(&r, s).expect("primary"))
        .collect();
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let want = spread(3);
    let writers = Writers::start(&members(&client, &ns.name).await, &copts, &want);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 1. A backup of every shard, under the writers; the operator stops
    // (as a crash would) once the first shard's Job exists.
    let asked = Instant::now();
    let b = json!({"apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
                   "metadata": {"name": "b1"},
                   "spec": {"redis": "cache", "target": {"s3": {
                       "endpoint": s3.endpoint(), "bucket": BUCKET, "prefix": "e2e",
                       "pathStyle": true, "credentials": {"secretName": "s3"}}}}});
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), &ns.name);
    backups
        .patch("b1", &PatchParams::apply("e2e").force(), &Patch::Apply(&b))
        .await
        .expect("creating RedisBackup b1");
    support::operator::wait_failpoint(&mut first, Duration::from_secs(60)).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), &ns.name);
    let stopped = backups.get("b1").await.expect("b1");
    let st = stopped.status.clone().expect("status");
    assert_eq!(st.shards.len(), 3, "{st:?}");
    let mut existing = 0;
    for s in &st.shards {
        existing += usize::from(jobs.get_opt(&s.job).await.expect("job").is_some());
    }
    assert_eq!(
        existing, 1,
        "one shard's Job exists when the operator stops"
    );
    println!("operator stopped with 1 of 3 shard Jobs created");
    // Writes every shard confirmed before the backup was asked for are in it.
    let before: Vec<Vec<(String, Instant)>> = {
        let mut out = Vec::new();
        for t in &writers.tallies {
            let t = t.lock().await;
            out.push(
                t.acked
                    .iter()
                    .filter(|(_, at)| *at < asked)
                    .cloned()
                    .collect(),
            );
        }
        out
    };
    let next = spawn_operator(&client, opts.clone().named("op-cluster-backup-next")).await;
    let done = wait_for("b1 to end", Duration::from_secs(120), || async {
        let b = backups.get("b1").await.ok()?;
        let phase = b.status.as_ref()?.phase?;
        matches!(phase, BackupPhase::Completed | BackupPhase::Failed).then_some(b)
    })
    .await;
    let took = asked.elapsed();
    let tallies = writers.stop().await;
    let st = done.status.clone().expect("status");
    assert_eq!(
        st.phase,
        Some(BackupPhase::Completed),
        "{st:?}\n{}",
        recent_events(&client, &ns.name, 20).await
    );
    let mut total_keys = 0;
    for (i, s) in st.shards.iter().enumerate() {
        assert_eq!(s.index, i as i32);
        assert_eq!(s.slots, want[i].to_string(), "shard {i}");
        assert_eq!(s.phase, Some(BackupPhase::Completed), "shard {i}");
        // Taken from the shard's replica, never its primary.
        assert!(
            s.source.starts_with(&format!("cache-s{i}-")) && s.source != primaries[i],
            "shard {i} from {}",
            s.source
        );
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                s3.bucket_dir(BUCKET)
                    .join(format!("{}.manifest.json", s.key)),
            )
            .expect("the shard's manifest"),
        )
        .expect("manifest json");
        assert_eq!(manifest["shard"], json!(i), "{manifest}");
        assert_eq!(manifest["slots"], json!(want[i].to_string()), "{manifest}");
        let keys = s.keys.expect("keys");
        assert!(keys >= before[i].len() as i64, "shard {i}: {keys} keys");
        total_keys += keys;
    }
    assert_eq!(st.keys, Some(total_keys));
    let origin = st.origin.clone().expect("status.origin");
    assert_eq!(
        (
            origin.mode,
            origin.shards,
            origin.instances,
            origin.version.as_str()
        ),
        (Mode::Cluster, Some(3), 2, "8.1")
    );
    println!(
        "backup of 3 shards across an operator crash: Completed {:.1} s after it was asked; {} keys ({:?} per shard); confirmed before: {:?}",
        took.as_secs_f64(),
        total_keys,
        st.shards
            .iter()
            .map(|s| s.keys.unwrap_or(0))
            .collect::<Vec<_>>(),
        before.iter().map(Vec::len).collect::<Vec<_>>()
    );
    drop(tallies);

    // 2. Restored into a new Redis that names only the backup: it becomes
    // a Cluster Redis of the backed-up shape, engine, version and config.
    let t = Instant::now();
    let copy = json!({"bootstrap": {"fromBackup": {"backup": "b1"}}});
    apply_redis(&client, &ns.name, "copy", copy).await;
    let r = wait_ready(&client, &ns.name, "copy", READY).await;
    let bs = r
        .status
        .as_ref()
        .and_then(|s| s.bootstrap.clone())
        .expect("status.bootstrap");
    assert!(bs.done && bs.shards.len() == 3, "{bs:?}");
    println!(
        "restored into a new Redis naming only the backup: a 3 x 2 Cluster Redis Ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let shape = &r.spec;
    assert_eq!(
        (
            shape.mode,
            shape.shards,
            shape.instances,
            shape.engine,
            shape.version.as_deref()
        ),
        (
            Some(Mode::Cluster),
            Some(3),
            Some(2),
            Some(redpilot::api::v1alpha1::Engine::Valkey),
            Some("8.1")
        ),
        "the spec takes the backed-up Redis's shape"
    );
    assert_eq!(
        bs.origin.as_ref().map(|o| o.mode),
        Some(Mode::Cluster),
        "status.bootstrap.origin: {bs:?}"
    );
    let copy_pw = redis_password(&client, &ns.name, "copy").await;
    let copy_opts = ConnectOptions::default()
        .with_password(copy_pw)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let ms = support::operator::cluster_members(&client, &ns.name, "copy").await;
    let mut get_policy = redis::cmd("CONFIG");
    get_policy.arg("GET").arg("maxmemory-policy");
    for m in &ms {
        let mut n = Node::connect(&m.endpoint, &copy_opts)
            .await
            .expect("connect");
        let policy: Vec<String> = n
            .query("CONFIG GET", &get_policy)
            .await
            .expect("CONFIG GET");
        assert_eq!(
            policy.get(1).map(String::as_str),
            Some("allkeys-lru"),
            "{}: the backed-up Redis's config",
            m.endpoint
        );
    }
    let mut restored_keys = 0;
    for (i, acked) in before.into_iter().enumerate() {
        let slot = cluster::key_slot(cluster_writer::tag_in(&want[i], i).as_bytes());
        let tally = cluster_writer::Tally {
            acked,
            ..Default::default()
        };
        let lost = missing(&ms, &copy_opts, slot, &tally).await;
        assert_eq!(
            lost, 0,
            "shard {i}: confirmed writes missing from the restore"
        );
        let p = cluster_writer::primary_for(&ms, &copy_opts, slot)
            .await
            .expect("primary");
        let mut n = Node::connect(&p, &copy_opts).await.expect("connect");
        restored_keys += n
            .query::<i64>("DBSIZE", &redis::cmd("DBSIZE"))
            .await
            .expect("DBSIZE");
    }
    assert_eq!(
        restored_keys, total_keys,
        "the restore holds the backup's keys"
    );

    // 3. Another shard count is refused, naming the field.
    let mut wrong = spec.clone();
    wrong["shards"] = json!(4);
    wrong["bootstrap"] = json!({"fromBackup": {"backup": "b1"}});
    apply_redis(&client, &ns.name, "wrong", wrong).await;
    let api = redis_api(&client, &ns.name);
    let cond = wait_for(
        "the 4-shard restore refused",
        Duration::from_secs(60),
        || async {
            let r = api.get("wrong").await.ok()?;
            r.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Degraded" && c.status == "True")
        },
    )
    .await;
    assert_eq!(cond.reason, "ShardCountMismatch", "{cond:?}");
    assert!(
        cond.message.contains("spec.shards is 4"),
        "{}",
        cond.message
    );
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(client.clone(), &ns.name);
    assert!(
        sts.get_opt("wrong-s0").await.expect("get").is_none(),
        "nothing is created for a refused restore"
    );

    // 4. A Replication Redis is not filled from a shard per file.
    apply_redis(
        &client,
        &ns.name,
        "flat",
        json!({"mode": "Replication", "instances": 2,
               "bootstrap": {"fromBackup": {"backup": "b1"}}}),
    )
    .await;
    let cond = wait_for(
        "the Replication restore of a Cluster backup refused",
        Duration::from_secs(60),
        || async {
            let r = api.get("flat").await.ok()?;
            r.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Degraded" && c.status == "True")
        },
    )
    .await;
    println!("a Cluster backup into a Replication Redis: {cond:?}");
    assert_eq!(cond.reason, "BackupModeMismatch", "{cond:?}");
    assert!(
        cond.message.contains("spec.bootstrap.fromBackup.backup")
            && cond.message.contains("spec.mode Cluster and spec.shards 3"),
        "{}",
        cond.message
    );
    assert!(
        sts.get_opt("flat").await.expect("get").is_none(),
        "nothing is created for a refused restore"
    );

    // 5. One shard that cannot be read fails the whole backup, naming the
    // shard. The operator stops again once the first shard's Job exists
    // (every shard's source is in the status by then); shard 2's source is
    // stopped (SIGSTOP: it takes the agent's connection and answers
    // nothing), and the next operator creates the other Jobs: shard 2's
    // runs into its 30 s deadline.
    drop(next);
    let mut third = spawn_operator(&client, crashing.named("op-cluster-backup-3")).await;
    let mut b2 = b.clone();
    b2["metadata"]["name"] = json!("b2");
    b2["spec"]["timeoutSeconds"] = json!(30);
    backups
        .patch("b2", &PatchParams::apply("e2e").force(), &Patch::Apply(&b2))
        .await
        .expect("creating RedisBackup b2");
    support::operator::wait_failpoint(&mut third, Duration::from_secs(60)).await;
    let st = backups.get("b2").await.expect("b2").status.expect("status");
    assert_eq!(st.shards.len(), 3, "{st:?}");
    let source = st.shards[2].source.clone();
    let pw = redis_password(&client, &ns.name, "cache").await;
    let mut n = connect_pod(&client, &ns.name, &source, &pw)
        .await
        .expect("connect to shard 2's source");
    let pid = support::operator::server_pid(&mut n).await;
    drop(n);
    support::operator::signal(pid, "-STOP");
    let ip = pod_ip(&client, &ns.name, &source).await;
    let answered = redpilot::redis::rdb::answers_plain(
        &Endpoint::new(&ip, 6379),
        &ConnectOptions::default().with_timeouts(Duration::from_secs(1), Duration::from_secs(1)),
    )
    .await;
    let asked = Instant::now();
    let _last = spawn_operator(&client, opts.named("op-cluster-backup-4")).await;
    let ended = wait_for("b2 to end", Duration::from_secs(180), || async {
        let b = backups.get("b2").await.ok()?;
        let phase = b.status.as_ref()?.phase?;
        matches!(phase, BackupPhase::Completed | BackupPhase::Failed).then_some(b)
    })
    .await;
    support::operator::signal(pid, "-CONT");
    let st = ended.status.expect("status");
    println!(
        "shard 2's source {source} stopped (answered a PING: {answered}): b2 {:?} {:?} after {:.1} s: {}; shards {:?}",
        st.phase,
        st.reason,
        asked.elapsed().as_secs_f64(),
        st.message.clone().unwrap_or_default(),
        st.shards
            .iter()
            .map(|s| (s.index, s.phase))
            .collect::<Vec<_>>()
    );
    assert!(!answered, "{source} answered while stopped");
    assert_eq!(st.phase, Some(BackupPhase::Failed), "{st:?}");
    assert!(
        st.message
            .as_deref()
            .is_some_and(|m| m.starts_with("shard 2")),
        "the message names the shard: {st:?}"
    );
    assert_eq!(st.shards[2].phase, Some(BackupPhase::Failed), "{st:?}");
    assert!(
        st.keys.is_none() && st.size_bytes.is_none(),
        "no sums: {st:?}"
    );
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(events.contains("BackupFailed"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_saves_every_shard_wakes_on_new_addresses_and_a_password_rotates_live() {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
    use redpilot::api::v1alpha1::Phase;
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-sleep", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let (old_pw, new_pw) = ("first pass\\word", "second \"pass\" word");
    support::operator::create_user_secret(&client, &ns.name, "app-pw", old_pw).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1",
               "storage": {"size": "64Mi"}, "auth": {"secretName": "app-pw"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let copts = ConnectOptions::default()
        .with_password(old_pw)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let want = spread(3);
    let before = members(&client, &ns.name).await;
    let writers = Writers::start(&before, &copts, &want);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. Asleep: every shard saved, no pod, every claim kept.
    let t = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"hibernate": true}}),
    )
    .await;
    let api = redis_api(&client, &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let r = wait_for("the Redis to hibernate", READY, || async {
        let r = api.get("cache").await.ok()?;
        let none = pods
            .list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=cache"))
            .await
            .ok()?
            .items
            .is_empty();
        (none && r.status.as_ref()?.phase == Some(Phase::Hibernated)).then_some(r)
    })
    .await;
    println!("hibernated in {:.1} s", t.elapsed().as_secs_f64());
    let tallies = writers.stop().await;
    let h = r
        .status
        .and_then(|s| s.hibernation)
        .expect("status.hibernation");
    assert!(h.saved_at.is_some() && h.since.is_some(), "{h:?}");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .expect("claims")
        .items
        .len();
    assert_eq!(claims, 6, "every instance keeps its volume");
    let mut acked = Vec::new();
    for t in &tallies {
        let t = t.lock().await;
        assert!(!t.acked.is_empty(), "every shard took writes");
        acked.push(t.acked.clone());
    }

    // 2. Awake: new pods with new addresses; the cluster finds itself
    // again, and every write confirmed before the sleep is there.
    let t = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"hibernate": false}}),
    )
    .await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let woke = t.elapsed();
    let after = members(&client, &ns.name).await;
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.endpoint != a.endpoint)
        .count();
    assert_eq!(moved, 6, "every pod came back on a new address");
    let st = r.status.clone().expect("status");
    assert!(st.hibernation.is_none(), "{:?}", st.hibernation);
    let c = st.cluster.clone().expect("cluster");
    assert_eq!(
        (c.state.as_str(), c.slots_ok, c.known_nodes),
        ("ok", 16384, 6),
        "{c:?}"
    );
    let mut lost = Vec::new();
    for (i, acked) in acked.into_iter().enumerate() {
        let n = acked.len();
        let slot = cluster::key_slot(cluster_writer::tag_in(&want[i], i).as_bytes());
        let tally = cluster_writer::Tally {
            acked,
            ..Default::default()
        };
        lost.push((n, missing(&after, &copts, slot, &tally).await));
    }
    println!(
        "woke on 6 new addresses: Ready in {:.1} s; confirmed writes (confirmed, lost) per shard: {lost:?}",
        woke.as_secs_f64()
    );
    assert!(lost.iter().all(|(_, l)| *l == 0), "{lost:?}");
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(
        events.contains("Hibernated") && events.contains("Resumed"),
        "{events}"
    );

    // 3. The user's Secret gets a new password: every node takes it live
    // and then refuses the old one; a replica killed afterwards restarts
    // and relinks with it.
    let t = Instant::now();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .patch(
            "app-pw",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"stringData": {"password": new_pw}})),
        )
        .await
        .expect("rotate the user's Secret");
    support::operator::poke(&client, &ns.name, "cache", 1).await;
    wait_for("the rotation to complete", READY, || async {
        let events = recent_events(&client, &ns.name, 80).await;
        let data = secrets.get("cache-server-auth").await.ok()?.data?;
        let done = events.contains("PasswordRotated")
            && !data.contains_key("previous")
            && data.get("password").map(|b| b.0.as_slice()) == Some(new_pw.as_bytes());
        done.then_some(())
    })
    .await;
    let rotated = t.elapsed();
    let new_opts = ConnectOptions::default()
        .with_password(new_pw)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    for m in &after {
        let old = Node::connect(&m.endpoint, &copts).await.err();
        assert_eq!(
            old.as_ref().map(|e| e.category()),
            Some(redpilot::redis::ErrorCategory::Auth),
            "{} refuses the old password: {old:?}",
            m.endpoint
        );
        Node::connect(&m.endpoint, &new_opts)
            .await
            .unwrap_or_else(|e| panic!("{} accepts the new password: {e}", m.endpoint));
    }
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let replica = r.status.as_ref().expect("status").shards[0].replicas[0].clone();
    let mut n = connect_pod(&client, &ns.name, &replica, new_pw)
        .await
        .expect("connect to the replica");
    let pid = support::operator::server_pid(&mut n).await;
    drop(n);
    kill_9(pid);
    wait_for("the killed replica to relink", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let st = r.status.as_ref()?;
        let linked = st
            .instances
            .iter()
            .any(|i| i.name == replica && i.link_up == Some(true));
        let mut n = connect_pod(&client, &ns.name, &replica, new_pw)
            .await
            .ok()?;
        let fresh = support::operator::server_pid(&mut n).await != pid;
        (linked && fresh && support::operator::is_ready(&r)).then_some(())
    })
    .await;
    for (i, _) in want.iter().enumerate() {
        let slot = cluster::key_slot(cluster_writer::tag_in(&want[i], i).as_bytes());
        let tally = cluster_writer::Tally {
            acked: tallies[i].lock().await.acked.clone(),
            ..Default::default()
        };
        assert_eq!(
            missing(&after, &new_opts, slot, &tally).await,
            0,
            "shard {i}"
        );
    }
    println!(
        "password rotated on 6 nodes in {:.1} s; {replica} killed afterwards relinked with it",
        rotated.as_secs_f64()
    );
}

/// A roll of a Cluster Redis no client writes to. Each shard primary is
/// idle and pings its replica once per `repl-ping-replica-period` (10 s):
/// the replica is heard from up to 10 s ago, level with its primary, and
/// that proves it for the primary's failover. (The proof asked for 2 s,
/// and a roll waiting with every instance serving passed once a minute,
/// sampling the pings at the same phase: found by the composition
/// harness, seed 6, a roll that waited for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_of_a_cluster_nobody_writes_to_finishes() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-idle-roll", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1"}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    // Idle for a while: the replicas' last sync is long past.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = pod_uids(&client, &ns.name).await;
    let t = Instant::now();
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": {"tcp-backlog": "600"}}}),
    )
    .await;
    wait_for(
        "every pod of the idle cluster restarted and the Redis Ready",
        Duration::from_secs(180),
        || async {
            let now = pod_uids(&client, &ns.name).await;
            let all_new = before
                .iter()
                .all(|(p, uid)| now.get(p).is_some_and(|u| u != uid));
            let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
            (all_new && support::operator::is_ready(&r)).then_some(())
        },
    )
    .await;
    println!(
        "an idle 3 x 2 cluster rolled in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// A shard of one instance without volumes keeps its old template: a
/// restart would hand its slots to an empty node (its `nodes.conf` and its
/// data live in the pod), and neither `spec.instances` nor `spec.storage`
/// can change on a Cluster Redis. The wait is said in `Progressing`, with
/// what the user can do; no pod is made anew and no server restarts while
/// it stands; the change taken back, the wait ends and every key is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_shard_instance_without_a_volume_waits_rather_than_lose_its_slots() {
    let (tags, size) = (200, 64);
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-lone", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let spec = json!({"mode": "Cluster", "shards": 3, "instances": 1, "engine": "Valkey", "version": "8.1"});
    apply_redis(&client, &ns.name, "cache", spec).await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379);
    let mut keys = cluster_client::Client::new(seed, copts.clone());
    cluster_client::fill(&mut keys, tags, size).await;
    let lives = || support::operator::lives(&client, &ns.name, "cache", &copts);
    let before = lives().await;
    assert_eq!(before.len(), 3, "{before:?}");

    // A setting that needs a restart.
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": {"tcp-backlog": "600"}}}),
    )
    .await;
    let api = redis_api(&client, &ns.name);
    let waiting = |r: &Redis| {
        r.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| {
                    c.type_ == "Progressing"
                        && c.status == "True"
                        && c.message.contains("is its only instance and has no volume")
                })
                .map(|c| c.message.clone())
        })
    };
    let said = wait_for(
        "the roll's wait said in Progressing",
        Duration::from_secs(60),
        || async { waiting(&api.get("cache").await.ok()?) },
    )
    .await;
    println!("the lone instances wait: {said}");
    assert!(
        said.contains("take the change back") && said.contains("new Cluster Redis"),
        "the message says what can be done: {said}"
    );
    // It stands: no pod made anew, no server restarted, every key there.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(lives().await, before, "no pod or server restarted");
    let r = api.get("cache").await.expect("redis");
    assert!(waiting(&r).is_some(), "still waiting: {:?}", r.status);
    for t in 0..tags {
        assert_eq!(
            cluster_client::whole(&mut keys, t, size).await,
            Some(true),
            "tag {t} while the roll waits"
        );
    }

    // The change taken back: nothing is outdated, the wait ends.
    support::operator::patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": null}}),
    )
    .await;
    let t = Instant::now();
    wait_for("the wait over and the Redis Ready", READY, || async {
        let r = api.get("cache").await.ok()?;
        (waiting(&r).is_none() && support::operator::is_ready(&r)).then_some(())
    })
    .await;
    println!(
        "the change taken back: the wait ended {:.1} s later",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(lives().await, before, "no pod or server restarted");
    for t in 0..tags {
        assert_eq!(
            cluster_client::whole(&mut keys, t, size).await,
            Some(true),
            "tag {t} after"
        );
    }
}

/// A shard's replica restarts while its primary does not answer (stopped),
/// and the primary is then lost for good (its pod and claim deleted): the
/// cluster does not elect a replica that never linked to its primary since
/// it started (`master_link_down_since_seconds:-1`, "disconnected from
/// primary for longer than allowed"), and the shard's slots went unserved
/// for good (chaos seed 324: a wake from hibernation, then the primary's
/// claim deleted). While the primary's pod is there but silent (it may be
/// restarting with its data) nothing is forced; once every pod of the shard
/// answers and none is the primary, the operator forces the takeover
/// (`CLUSTER FAILOVER FORCE`, the primaries still vote), the new node is
/// attached to it, and every key written before is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_linked_since_it_started_takes_over_a_primary_lost_for_good() {
    let (tags, size) = (120, 64);
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-force", &[]).await;
    support::operator::sized_class(&client).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let spec = json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey",
                      "version": "9.1",
                      "storage": {"size": "64Mi", "storageClassName": support::operator::SIZED_CLASS}});
    apply_redis(&client, &ns.name, "cache", spec).await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s1-0").await, 6379);
    let mut keys = cluster_client::Client::new(seed, copts.clone());
    cluster_client::fill(&mut keys, tags, size).await;
    let primary = shard_primary(&r, 0).expect("shard 0's primary");
    let replica = if primary == "cache-s0-0" {
        "cache-s0-1"
    } else {
        "cache-s0-0"
    };
    let mut p = connect_pod(&client, &ns.name, &primary, &password)
        .await
        .expect("connecting to shard 0's primary");
    let pid = support::operator::server_pid(&mut p).await;
    drop(p);

    // The primary stopped; the replica's pod deleted: it comes back from
    // its volume as the primary's replica, and cannot link to it.
    support::operator::signal(pid, "-STOP");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let uid = pods
        .get(replica)
        .await
        .expect("the replica's pod")
        .metadata
        .uid;
    pods.delete(replica, &DeleteParams::default())
        .await
        .expect("deleting the replica's pod");
    // The fault as meant: the new server up, a replica never linked.
    let down = wait_for(
        "the restarted replica answering, never linked to its primary",
        Duration::from_secs(90),
        || async {
            let p = pods.get(replica).await.ok()?;
            if p.metadata.uid == uid {
                return None;
            }
            let mut n = connect_pod(&client, &ns.name, replica, &password)
                .await
                .ok()?;
            let r = n.info_section("replication").await.ok()?.replication;
            (r.role == Some(redpilot::redis::info::Role::Replica))
                .then_some(r.link_down_since_seconds)
        },
    )
    .await;
    println!("{replica} restarted as a replica, link down since {down:?}");
    assert_eq!(down, Some(-1), "never linked to its stopped primary");
    let is_primary = || async {
        let mut n = connect_pod(&client, &ns.name, replica, &password)
            .await
            .ok()?;
        let nodes = cluster::nodes(&mut n).await.ok()?;
        nodes
            .iter()
            .find(|k| k.myself)
            .map(|k| k.primary && k.slot_count() > 0)
    };
    // The primary's pod is there, silent: it may come back with its data,
    // so nothing is forced (15 s: the cluster marked it failed long since).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        is_primary().await,
        Some(false),
        "{replica} is not promoted while {primary}'s pod may come back"
    );

    // The primary lost for good: its claim and pod deleted.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &ns.name);
    claims
        .delete(&format!("data-{primary}"), &DeleteParams::default())
        .await
        .expect("deleting the primary's claim");
    pods.delete(
        &primary,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("deleting the primary's pod");
    let lost = Instant::now();

    // The operator forces the takeover: the replica serves shard 0's slots.
    wait_for(
        "the replica to take over shard 0",
        Duration::from_secs(120),
        || async { is_primary().await.filter(|p| *p).map(|_| ()) },
    )
    .await;
    println!(
        "{replica} took over shard 0 {:.1} s after its primary's pod was deleted",
        lost.elapsed().as_secs_f64()
    );
    let events = recent_events(&client, &ns.name, 80).await;
    let forced: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("ForcedFailover"))
        .collect();
    println!("{forced:?}");
    assert!(
        forced.len() == 1 && forced[0].contains(replica),
        "one ForcedFailover event, naming {replica}:\n{events}"
    );

    // The new node (the primary's pod made anew, empty) follows it; the
    // Redis is Ready with it as shard 0's primary and every key whole.
    let r = wait_until(&client, &ns.name, "shard 0 served by the replica", |r| {
        shard_primary(r, 0).as_deref() == Some(replica)
    })
    .await;
    println!(
        "Ready again {:.1} s after the deletion; shard 0 served by {:?}",
        lost.elapsed().as_secs_f64(),
        shard_primary(&r, 0)
    );
    // A client that starts anew (its old one held a connection to the
    // deleted pod's address).
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s1-0").await, 6379);
    let mut keys = cluster_client::Client::new(seed, copts);
    for t in 0..tags {
        assert_eq!(
            cluster_client::whole(&mut keys, t, size).await,
            Some(true),
            "tag {t} after the forced takeover"
        );
    }
}
