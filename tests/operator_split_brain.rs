//! Split brain, against the dev cluster with real servers: the network
//! splits into {the operator, some replicas} | {the primary, the other
//! replicas}. The primary's side keeps acknowledging it, so its write fence
//! stays open and it keeps taking writes from the clients beside it. An
//! operator that promoted one of its own side's replicas would make a
//! second primary; when the split heals one side's writes are discarded.
//!
//! The operator must not promote: a silent primary is replaced only when
//! every other instance answers the operator and none still hears from it.
//! Checked for 5 instances (split 2 | 3) and 3 (split 1 | 2) under a writer
//! inside the primary's namespace that counts acknowledged writes: it keeps
//! writing through the split (the fault is real), the operator keeps the
//! primary, and after the heal every acknowledged write is on every
//! instance.
//!
//! The operator runs as its pod would: a pod on the local node (the
//! Deployment's template of `deploy/install.yaml`), in a network namespace
//! of its own. The split is made of blackhole routes inside the pods'
//! namespaces (`RouteSplit`): the primary's side and the operator's pod stop
//! reaching each other, and so do the two sides; the node still reaches
//! every pod, so the kubelet's probes and the API server's view of the pods
//! are what they would be in a real split.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::faults::{InsideWriter, RouteSplit, pod_netns};
use support::operator::{
    apply_redis, pod_ip, recent_events, redis_api, redis_password, start_operator_pod, wait_ready,
};
use support::writer::assert_everywhere;
use support::{TestNamespace, client};

const READY: Duration = Duration::from_secs(180);
/// How long the split holds: well past the silence bound
/// (`maxLagSeconds + 3` = 5 s) and the fence's (`maxLagSeconds + 2`).
const SPLIT: Duration = Duration::from_secs(15);

async fn split_keeps_the_primary(instances: usize) {
    let client = client().await;
    let ns = TestNamespace::new(&client, &format!("split{instances}"), &[]).await;
    let op = start_operator_pod(&client, &ns.name).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": instances, "persistence": {"rdb": false}}),
    )
    .await;
    let ready = wait_ready(&client, &ns.name, "cache", READY).await;
    let primary = ready.status.and_then(|s| s.primary).expect("primary");
    let pw = redis_password(&client, &ns.name, "cache").await;
    let mut pods = Vec::new();
    for i in 0..instances {
        let name = format!("cache-{i}");
        let ip = pod_ip(&client, &ns.name, &name).await;
        pods.push((name, ip));
    }
    // The primary and a minority of the replicas on one side; the
    // operator and the other replicas on the other.
    let replicas: Vec<&(String, String)> = pods.iter().filter(|(n, _)| *n != primary).collect();
    let with_primary = (instances - 1) / 2;
    let (far, near) = replicas.split_at(with_primary);
    let primary_ip = pod_ip(&client, &ns.name, &primary).await;
    let far_side: Vec<String> = far
        .iter()
        .map(|(_, ip)| ip.clone())
        .chain([primary_ip.clone()])
        .collect();
    let near_side: Vec<String> = near.iter().map(|(_, ip)| ip.clone()).collect();

    let inside = InsideWriter::start(&pod_netns(&primary_ip), &pw, "far");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut split = RouteSplit::default();
    let near_and_operator: Vec<String> = near_side.iter().cloned().chain([op.ip.clone()]).collect();
    for ip in &far_side {
        split.cut(ip, &near_and_operator);
    }
    for ip in &near_and_operator {
        split.cut(ip, &far_side);
    }
    let t0 = Instant::now();
    // The replicas on the operator's side, asked themselves: a promotion
    // shows there even if the status never said so.
    let opts = redpilot::redis::ConnectOptions::default()
        .with_password(pw.clone())
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
    let mut near_nodes = Vec::new();
    for ip in &near_side {
        let n = redpilot::redis::Node::connect(&redpilot::redis::Endpoint::new(ip, 6379), &opts)
            .await
            .unwrap_or_else(|e| panic!("connecting to the near-side replica {ip}: {e}"));
        near_nodes.push((ip.clone(), n));
    }
    let mut role_checks = 0;
    // Hold the split; the primary must stay the published one all along.
    while t0.elapsed() < SPLIT {
        for (ip, n) in near_nodes.iter_mut() {
            let role = n
                .info_section("replication")
                .await
                .unwrap_or_else(|e| panic!("INFO replication of {ip}: {e}"))
                .replication
                .role;
            assert_eq!(
                role,
                Some(redpilot::redis::info::Role::Replica),
                "{:.1}s into the split the near-side server {ip} is no replica",
                t0.elapsed().as_secs_f64()
            );
            role_checks += 1;
        }
        let r = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("get");
        let now = r.status.as_ref().and_then(|s| s.primary.clone());
        assert_eq!(
            now.as_deref(),
            Some(primary.as_str()),
            "{:.1}s into the split the operator moved the primary{}",
            t0.elapsed().as_secs_f64(),
            support::diag::report().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Why it waits, in the status.
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get");
    let progressing = r
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Progressing"))
        .map(|c| (c.reason.clone(), c.message.clone()))
        .expect("Progressing");
    assert!(
        progressing.0 == "FailoverPending" && progressing.1.contains("write fence open"),
        "{progressing:?}"
    );
    // Read all through the split (each round also reads the Redis from
    // the API server, which a loaded machine has taken 5 s to answer).
    assert!(
        role_checks >= near_side.len() * 5,
        "the near side's roles were read {role_checks} times"
    );
    split.heal();
    let healed = Instant::now();
    wait_ready(&client, &ns.name, "cache", READY).await;
    let inside = inside.stop();
    // The fault was real: the primary's side kept writing well past the
    // moment a fence would have closed (maxLagSeconds + 2 = 4 s).
    let late: Vec<_> = inside
        .acks
        .iter()
        .filter(|a| a.sent >= t0 + Duration::from_secs(8) && a.sent < t0 + SPLIT)
        .collect();
    assert!(
        late.len() > 100,
        "the primary's side acknowledged only {} writes 8-15 s into the split ({} in all, {} refused)",
        late.len(),
        inside.acks.len(),
        inside.failed
    );
    let events = recent_events(&client, &ns.name, 80).await;
    assert!(!events.contains("FailedOver"), "{events}");
    let keys = inside.keys();
    assert_everywhere(&client, &ns.name, "cache", instances, &pw, &keys).await;
    println!(
        "split of {instances} ({} with the primary | operator + {}): the primary kept serving \
         its side, {} writes acknowledged there ({} during 8-15 s), 0 lost; no promotion; \
         Ready {:.1}s after the heal",
        far_side.len(),
        near_side.len(),
        inside.acks.len(),
        late.len(),
        healed.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_side_operator_does_not_promote_with_five_instances() {
    split_keeps_the_primary(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_side_operator_does_not_promote_with_three_instances() {
    split_keeps_the_primary(3).await;
}
