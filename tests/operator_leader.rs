//! Issue #5: leader election. Two operator processes share a Lease: only the
//! holder reconciles; when it is killed (SIGKILL: no release), the other takes
//! over once the lease expires and reconciles new objects. An operator whose
//! lease is taken exits non-zero.

mod support;

use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::operator::{
    OPERATOR_NAMESPACE, OperatorOptions, apply_redis, lease_holder, spawn_operator, start_operator,
    wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(120);

#[tokio::test]
async fn only_the_leader_reconciles_and_the_other_takes_over() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-leader", &[]).await;
    let opts = OperatorOptions::watching(&[&ns.name]);
    let mut ops = [
        start_operator(&client, opts.clone().named("op-a")).await,
        spawn_operator(&client, opts.clone().named("op-b")).await,
    ];
    let holder = wait_for(
        "one operator to hold the lease",
        Duration::from_secs(30),
        || async { lease_holder(&client, &opts.lease_name).await },
    )
    .await;
    let leader = ops
        .iter()
        .position(|o| o.opts.name == holder)
        .unwrap_or_else(|| panic!("the lease holder {holder:?} is neither operator"));
    let standby = 1 - leader;
    println!(
        "leader {}, standby {}",
        ops[leader].opts.name, ops[standby].opts.name
    );

    apply_redis(&client, &ns.name, "first", json!({"mode": "Standalone"})).await;
    wait_ready(&client, &ns.name, "first", READY).await;
    let leader_counters = ops[leader].counters().await;
    let standby_counters = ops[standby].counters().await;
    assert!(leader_counters.reconciles >= 1.0, "the leader reconciled");
    assert_eq!(
        standby_counters.reconciles, 0.0,
        "the standby must not reconcile while the other holds the lease"
    );
    assert_eq!(
        ops[leader].metric_sum("redpilot_leader").await,
        Some(1.0),
        "leader gauge of the leader"
    );
    assert_eq!(
        ops[standby].metric_sum("redpilot_leader").await,
        Some(0.0),
        "leader gauge of the standby"
    );
    assert_eq!(
        lease_holder(&client, &opts.lease_name).await.as_deref(),
        Some(holder.as_str()),
        "the lease did not move while the leader lived"
    );

    // Crash the leader; time until the standby holds the lease and
    // reconciles a Redis created right after the crash.
    ops[leader].kill();
    let killed = Instant::now();
    apply_redis(&client, &ns.name, "second", json!({"mode": "Standalone"})).await;
    let new_holder = ops[standby].opts.name.clone();
    wait_for(
        "the standby to take over the lease",
        Duration::from_secs(60),
        || async {
            (lease_holder(&client, &opts.lease_name).await.as_deref() == Some(&new_holder))
                .then_some(())
        },
    )
    .await;
    let took_lease = killed.elapsed();
    wait_ready(&client, &ns.name, "second", READY).await;
    let reconciled = killed.elapsed();
    println!(
        "takeover after SIGKILL of the leader: lease held by the standby after {:.1}s, \
         new Redis Ready after {:.1}s",
        took_lease.as_secs_f64(),
        reconciled.as_secs_f64()
    );
    assert!(ops[standby].is_running(), "the new leader keeps running");
    assert!(
        ops[standby].counters().await.reconciles >= 1.0,
        "the new leader reconciles"
    );
    assert!(
        took_lease < Duration::from_secs(30),
        "takeover within two lease durations"
    );
}

#[tokio::test]
async fn an_operator_that_loses_its_lease_exits_non_zero() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-lease-lost", &[]).await;
    let opts = OperatorOptions::watching(&[&ns.name]);
    let mut op = start_operator(&client, opts.clone()).await;
    wait_for(
        "the operator to hold the lease",
        Duration::from_secs(30),
        || async {
            (lease_holder(&client, &opts.lease_name).await.as_deref() == Some(&op.opts.name))
                .then_some(())
        },
    )
    .await;
    // Someone else takes the lease (as a second operator would after a
    // network partition).
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    leases
        .patch(
            &opts.lease_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": "intruder",
                "leaseDurationSeconds": 60,
                "renewTime": Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
            }})),
        )
        .await
        .expect("take the lease");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = op.exit_status() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the operator still runs 30s after losing its lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "operator exited {:.1}s after losing the lease: {status}",
        start.elapsed().as_secs_f64()
    );
    assert!(!status.success(), "exit status {status}");
}
