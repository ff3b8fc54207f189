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
    OPERATOR_NAMESPACE, Operator, OperatorOptions, apply_redis, http_status, lease_holder,
    spawn_operator, start_operator, wait_ready,
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

/// Starts an operator, waits until it holds its lease, then has an
/// intruder take the lease (as a second operator would after a network
/// partition).
async fn lose_the_lease(client: &kube::Client, ns: &str, restart: bool) -> Operator {
    let mut opts = OperatorOptions::watching(&[ns]);
    if !restart {
        opts = opts.no_restart();
    }
    let op = start_operator(client, opts.clone()).await;
    wait_for(
        "the operator to hold the lease",
        Duration::from_secs(30),
        || async {
            (lease_holder(client, &opts.lease_name).await.as_deref() == Some(&op.opts.name))
                .then_some(())
        },
    )
    .await;
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
    op
}

#[tokio::test]
async fn an_operator_that_loses_its_lease_exits_non_zero() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-lease-lost", &[]).await;
    // Watched exiting: the harness must not restart it.
    let mut op = lose_the_lease(&client, &ns.name, false).await;
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

/// The test harness restarts an operator that exited after losing its
/// lease, as a cluster restarts its pod (other suites rely on it when a
/// loaded machine delays a renewal), and says so in the log.
#[tokio::test]
async fn the_harness_restarts_an_operator_that_lost_its_lease() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-lease-restart", &[]).await;
    let mut op = lose_the_lease(&client, &ns.name, true).await;
    let first = op.pid().expect("running");
    wait_for("a restarted operator", Duration::from_secs(30), || async {
        op.log_text()
            .contains("restarting it, as its pod would be")
            .then_some(())
    })
    .await;
    let second = op.pid().expect("restarted");
    assert_ne!(first, second);
    assert!(op.is_running(), "the restarted operator runs");
    println!("operator {first} lost its lease and was restarted as {second}");
}

/// Writes the Lease as a holder called `ghost` whose clock reads `renew`.
async fn ghost_renews(client: &kube::Client, lease: &str, renew: chrono::DateTime<Utc>) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let obj = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease, "namespace": OPERATOR_NAMESPACE},
        "spec": {
            "holderIdentity": "ghost",
            "leaseDurationSeconds": 6,
            "renewTime": renew.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        }
    });
    leases
        .patch(
            lease,
            &PatchParams::apply("ghost").force(),
            &Patch::Apply(&obj),
        )
        .await
        .expect("the ghost writes the lease");
}

#[tokio::test]
async fn lease_expiry_follows_the_local_clock_not_the_holders() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-lease-skew", &[]).await;
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    opts.env.push(("LEASE_DURATION_SECONDS".into(), "6".into()));
    // Another holder whose clock is an hour behind ours keeps renewing: its
    // renewTime always looks long expired, yet the lease is alive.
    ghost_renews(
        &client,
        &opts.lease_name,
        Utc::now() - chrono::Duration::hours(1),
    )
    .await;
    let op = start_operator(&client, opts.clone()).await;
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ghost_renews(
            &client,
            &opts.lease_name,
            Utc::now() - chrono::Duration::hours(1),
        )
        .await;
        assert_eq!(
            lease_holder(&client, &opts.lease_name).await.as_deref(),
            Some("ghost"),
            "a lease that is being renewed must not be taken, whatever its holder's clock says"
        );
    }
    assert_eq!(op.metric_sum("redpilot_leader").await, Some(0.0));
    // The holder stops, its last renewTime an hour ahead of our clock: the
    // lease expires one duration after its last change, not in an hour.
    ghost_renews(
        &client,
        &opts.lease_name,
        Utc::now() + chrono::Duration::hours(1),
    )
    .await;
    let stopped = Instant::now();
    wait_for(
        "the operator to take the lease a duration after the ghost stopped",
        Duration::from_secs(30),
        || async {
            (lease_holder(&client, &opts.lease_name).await.as_deref() == Some(&op.opts.name))
                .then_some(())
        },
    )
    .await;
    let took = stopped.elapsed();
    println!(
        "lease taken {:.1}s after the skewed holder stopped (duration 6s)",
        took.as_secs_f64()
    );
    assert!(
        took >= Duration::from_secs(5),
        "taken only after the lease could have expired: {took:?}"
    );
}

#[test]
fn nonsensical_lease_durations_are_refused_at_start() {
    for bad in ["0", "3", "4", "100000"] {
        let out = std::process::Command::new(support::operator::operator_binary())
            .args(["run", "--lease-duration", bad])
            .env_clear()
            .output()
            .expect("running the operator");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--lease-duration {bad} was accepted");
        assert!(
            err.contains("--lease-duration") && err.contains("5..=3600"),
            "the refusal names the flag and the range: {err}"
        );
    }
}

#[tokio::test]
async fn readyz_needs_the_api_server_and_synced_caches() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-readyz", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    wait_for(
        "/readyz of the leader to answer 200 once its caches are synced",
        Duration::from_secs(30),
        || async {
            let (code, _) = http_status(op.metrics_addr, "/readyz").await?;
            (code == 200).then_some(())
        },
    )
    .await;

    // An operator whose API server does not answer is not ready.
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: gone\n  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}\n\
         users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: gone, user: u}\ncurrent-context: c\n",
    )
    .expect("kubeconfig");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut child = std::process::Command::new(support::operator::operator_binary())
        .args(["run", "--metrics-addr", &addr.to_string()])
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting the operator");
    let answer = wait_for(
        "/readyz of an operator without an API server to answer",
        Duration::from_secs(20),
        || async { http_status(addr, "/readyz").await },
    )
    .await;
    // Give it a few leader-election attempts: it must stay unready.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = http_status(addr, "/readyz").await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answer.0, 503, "not ready without an API server: {answer:?}");
    let later = later.expect("/readyz still answers");
    assert_eq!(later.0, 503, "still not ready: {later:?}");
    assert!(
        later.1.contains("API server"),
        "/readyz says why: {}",
        later.1
    );
}
