//! The read-only Service sends reads only to replicas that hold current data:
//! a replica whose link to the primary is down (it may be stale, or empty
//! after a full sync starts) leaves the Service's ready endpoints within the
//! readiness bound, and returns once the operator has re-pointed it and its
//! link is up again. Against the dev cluster's endpoint controller.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use redpilot::api::v1alpha1::Phase;
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, patch_redis, redis_api, redis_password,
    start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

/// The pods behind the ready endpoints of Service `svc`.
async fn ready_endpoints(slices: &Api<EndpointSlice>, svc: &str) -> Vec<String> {
    let list = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut pods: Vec<String> = list
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .filter_map(|e| e.target_ref.as_ref().and_then(|t| t.name.clone()))
        .collect();
    pods.sort();
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_a_live_link_serves_no_reads() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "read-svc", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 3}),
    )
    .await;
    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let status = redis.status.expect("status");
    let primary = status.primary.clone().expect("primary");
    let read_svc = status.read_service.clone().expect("read service");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns.name);
    let all = wait_for("both replicas behind the read Service", READY, || async {
        let e = ready_endpoints(&slices, &read_svc).await;
        (e.len() == 2).then_some(e)
    })
    .await;
    assert!(!all.contains(&primary), "{all:?}");
    let victim = all[0].clone();

    // Pause the operator's repairs (it would re-point the replica within a
    // pass), then cut the replica's link behind its back.
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"paused": true}}),
    )
    .await;
    wait_for("the operator to acknowledge the pause", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        (r.status?.phase == Some(Phase::Paused)).then_some(())
    })
    .await;
    let pw = redis_password(&client, &ns.name, "cache").await;
    let mut node = connect_pod(&client, &ns.name, &victim, &pw)
        .await
        .expect("connect to the replica");
    let _: redis::Value = node
        .query("REPLICAOF", redis::cmd("REPLICAOF").arg("127.0.0.1").arg(1))
        .await
        .expect("REPLICAOF");
    let t = Instant::now();
    wait_for(
        &format!("{victim} to leave the read Service"),
        Duration::from_secs(30),
        || async {
            let e = ready_endpoints(&slices, &read_svc).await;
            (!e.contains(&victim)).then_some(())
        },
    )
    .await;
    let left = t.elapsed();
    // Resumed, the operator re-points it; it serves reads again once linked.
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"paused": false}}),
    )
    .await;
    wait_for(
        &format!("{victim} to be back behind the read Service"),
        READY,
        || async {
            let e = ready_endpoints(&slices, &read_svc).await;
            (e.len() == 2).then_some(())
        },
    )
    .await;
    let info: String = node
        .query("INFO", redis::cmd("INFO").arg("replication"))
        .await
        .expect("INFO replication");
    assert!(info.contains("master_link_status:up"), "{info}");
    println!(
        "{victim}: link cut; out of the read Service after {:.1}s, back (re-pointed, linked) after {:.1}s",
        left.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}
