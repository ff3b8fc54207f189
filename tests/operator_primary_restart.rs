//! A primary that restarts in place must not wipe its replicas, and a
//! promotion interrupted by the operator's own death must not stop writes.
//! Against the dev cluster, with real servers and a writer that counts the
//! writes it was promised (OK and held by at least one replica):
//!
//! - the primary's server is `kill -9`ed and restarts inside the same pod,
//!   under the same address, with persistence off (it comes back empty) and
//!   with RDB + AOF on a volume (it comes back with its files): it boots as a
//!   replica that cannot serve a sync, the operator promotes the replica
//!   furthest ahead, and every acknowledged write is still there;
//! - the leader of two operators is stopped (a failpoint, exit code 86)
//!   right after it promoted a replica and before it published it: the
//!   standby takes the Lease, finds the promotion from the recorded intent
//!   (`status.targetPrimary`) and the servers, publishes it, and the Redis
//!   is Ready again with every write.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, container_restarts, is_ready, kill_9, lease_holder,
    recent_events, redis_api, redis_password, redis_pods, server_pid, spawn_operator,
    start_operator, wait_ready,
};
use support::writer::{Writer, assert_everywhere};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

/// `kill -9` of the server process of `pod`; returns its pid.
async fn kill_server(client: &kube::Client, ns: &str, pod: &str, password: &str) -> u32 {
    let mut node = connect_pod(client, ns, pod, password)
        .await
        .unwrap_or_else(|e| panic!("connecting to {pod}: {e}"));
    let pid = server_pid(&mut node).await;
    kill_9(pid);
    pid
}

async fn primary_restarts_in_place(prefix: &str, spec: Value) {
    let client = client().await;
    let ns = TestNamespace::new(&client, prefix, &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(&client, &ns.name, "cache", spec).await;
    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let old = redis.status.and_then(|s| s.primary).expect("primary");
    let pw = redis_password(&client, &ns.name, "cache").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let before = pods.get(&old).await.expect("primary pod");

    let writer = Writer::start(&client, &ns.name, "cache", &pw, "w", 1);
    writer.wait_progress(300, Duration::from_secs(60)).await;
    let pid = kill_server(&client, &ns.name, &old, &pw).await;
    let t = Instant::now();
    // The same pod (same uid, same address) restarts its container.
    wait_for(
        "the primary's container to restart in place",
        READY,
        || async {
            let p = pods.get(&old).await.ok()?;
            (p.metadata.uid == before.metadata.uid
                && container_restarts(&p) > container_restarts(&before))
            .then_some(())
        },
    )
    .await;
    // Writes flow again, through whichever primary the status names.
    writer.wait_progress(300, READY).await;
    let resumed = t.elapsed();
    // A status written after the failover: Ready, and its instances show
    // the recorded primary serving (the promotion is published by its own
    // patch first, so a status read in between still lists the old roles).
    let redis = wait_for("Ready with every instance", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let st = r.status.as_ref()?;
        let p = st.primary.as_deref()?;
        let described = st
            .instances
            .iter()
            .any(|i| i.name == p && i.role == "primary");
        (is_ready(&r) && st.ready.as_deref() == Some("3/3") && described).then_some(r)
    })
    .await;
    let tally = writer.stop().await;
    let status = redis.status.expect("status");
    let new = status.primary.clone().expect("primary");
    println!(
        "{prefix}: server pid {pid} of primary {old} killed; writes acknowledged again after \
         {:.1}s; primary now {new}; {} writes acknowledged, {} answered OK but unreplicated, \
         {} failed",
        resumed.as_secs_f64(),
        tally.acked.len(),
        tally.unreplicated,
        tally.failed
    );
    // Nothing acknowledged is lost: checked first, as it is the promise.
    assert_everywhere(&client, &ns.name, "cache", 3, &pw, &tally.acked).await;
    assert_ne!(new, old, "a replica furthest ahead took over");
    assert_eq!(status.target_primary, None, "the intent is cleared");
    let role = |n: &str| {
        status
            .instances
            .iter()
            .find(|i| i.name == n)
            .map(|i| i.role.clone())
    };
    assert_eq!(
        role(&old).as_deref(),
        Some("replica"),
        "{:?}",
        status.instances
    );
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(events.contains("FailedOver"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_without_persistence_loses_no_acknowledged_write() {
    primary_restarts_in_place(
        "restart-mem",
        json!({"mode": "Replication", "instances": 3, "persistence": {"rdb": false}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_with_rdb_and_aof_on_a_volume_loses_no_acknowledged_write() {
    primary_restarts_in_place(
        "restart-disk",
        json!({
            "mode": "Replication",
            "instances": 3,
            "storage": {"size": "1Gi", "retainOnDelete": false},
            "persistence": {"rdb": true, "aof": "EverySec"},
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_interrupted_by_the_leaders_death_is_completed_by_the_standby() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "promote-crash", &[]).await;
    let mut op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 3, "persistence": {"rdb": false}}),
    )
    .await;
    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let old = redis.status.and_then(|s| s.primary).expect("primary");
    let pw = redis_password(&client, &ns.name, "cache").await;
    let writer = Writer::start(&client, &ns.name, "cache", &pw, "w", 1);
    writer.wait_progress(200, Duration::from_secs(60)).await;

    // Two operators sharing a Lease: the leader stops right after it
    // promoted a replica, before publishing; the standby takes over.
    op.kill();
    let mut opts = OperatorOptions::watching(&[&ns.name]).named("op-failpoint");
    opts.env.push(("LEASE_DURATION_SECONDS".into(), "8".into()));
    let mut leader = opts.clone();
    leader
        .env
        .push(("REDPILOT_FAILPOINTS".into(), "after-promote".into()));
    let mut crashing = spawn_operator(&client, leader).await;
    wait_for("the failpoint operator to lead", READY, || async {
        (lease_holder(&client, &opts.lease_name).await.as_deref() == Some(&crashing.opts.name))
            .then_some(())
    })
    .await;
    let standby = spawn_operator(&client, opts.named("op-standby")).await;
    kill_server(&client, &ns.name, &old, &pw).await;
    let deadline = Instant::now() + READY;
    let exit = loop {
        if let Some(exit) = crashing.exit_status() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the operator did not reach the failpoint in {READY:?}: {}",
            crashing.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(exit.code(), Some(86), "{}", crashing.log_tail(30));
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get Redis");
    let s = r.status.expect("status");
    let target = s.target_primary.clone().expect("the intent was recorded");
    assert_eq!(
        s.primary.as_deref(),
        Some(old.as_str()),
        "not yet published"
    );
    assert_ne!(target, old);

    let t = Instant::now();
    writer.wait_progress(200, READY).await;
    let redis = wait_for(
        "Ready with the promoted primary published",
        READY,
        || async {
            let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
            let s = r.status.as_ref()?;
            (is_ready(&r)
                && s.ready.as_deref() == Some("3/3")
                && s.primary.as_deref() == Some(&target))
            .then_some(r)
        },
    )
    .await;
    let tally = writer.stop().await;
    println!(
        "interrupted promotion of {target}: completed by the standby in {:.1}s; {} writes \
         acknowledged, {} unreplicated, {} failed",
        t.elapsed().as_secs_f64(),
        tally.acked.len(),
        tally.unreplicated,
        tally.failed
    );
    let s = redis.status.expect("status");
    assert_eq!(s.target_primary, None);
    let pods = redis_pods(&client, &ns.name, "cache").await;
    let label = pods[&target]
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("redpilot.io/role").cloned());
    assert_eq!(label.as_deref(), Some("primary"));
    assert_everywhere(&client, &ns.name, "cache", 3, &pw, &tally.acked).await;
    assert_eq!(
        lease_holder(&client, &standby.opts.lease_name)
            .await
            .as_deref(),
        Some(standby.opts.name.as_str()),
        "the standby completed it"
    );
}
