//! Issue #5 closing figures: time from apply to Ready for Standalone and for
//! a 3-instance Replication (created one after another, with 1Gi volumes
//! like the samples), apiserver requests per reconcile in steady state, and
//! the operator's RSS afterwards. `make test` creates one of each;
//! `make bench-timing` sets `REDPILOT_TIMING_RUNS=5` for medians and
//! `REDPILOT_TIMING_CLUSTER=1` to add Cluster Redis of 3 x 2 and 6 x 3, the
//! requests per reconcile of an idle Cluster Redis, and the operator's idle
//! CPU with one Replication Redis, then with one Cluster Redis of 3 x 2.

mod support;

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, apply_redis, median, redis_api, requests_per_reconcile, start_operator,
    wait_ready,
};
use support::{TestNamespace, client};

/// Creations of each kind (`REDPILOT_TIMING_RUNS`, default 1).
fn runs() -> usize {
    std::env::var("REDPILOT_TIMING_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

async fn measure(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    spec: Value,
    timeout: Duration,
) -> Vec<f64> {
    let mut secs = Vec::new();
    let runs = runs();
    for i in 0..runs {
        let name = format!("{prefix}-{i}");
        let start = Instant::now();
        apply_redis(client, ns, &name, spec.clone()).await;
        wait_ready(client, ns, &name, timeout).await;
        secs.push(start.elapsed().as_secs_f64());
        // Keep the node light for the next run (volumes are retained).
        if i + 1 < runs {
            redis_api(client, ns)
                .delete(&name, &DeleteParams::default())
                .await
                .expect("delete");
        }
    }
    secs
}

/// The operator's CPU over a 60 s idle window, in millicores, after 20 s
/// for what is left of the last change to settle.
async fn idle_cpu(op: &support::operator::Operator) -> f64 {
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before = op.cpu_seconds().unwrap_or_default();
    let window = Duration::from_secs(60);
    tokio::time::sleep(window).await;
    let used = op.cpu_seconds().unwrap_or_default() - before;
    used * 1000.0 / window.as_secs_f64()
}

fn summary(secs: &[f64]) -> String {
    let list: Vec<String> = secs.iter().map(|s| format!("{s:.1}")).collect();
    format!(
        "median {:.1}s, min {:.1}s, max {:.1}s (runs: {})",
        median(secs.to_vec()),
        secs.iter().cloned().fold(f64::INFINITY, f64::min),
        secs.iter().cloned().fold(0.0, f64::max),
        list.join(", ")
    )
}

#[tokio::test]
async fn apply_to_ready_latency_requests_and_footprint() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-timing", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;

    let standalone = measure(
        &client,
        &ns.name,
        "solo",
        json!({"mode": "Standalone", "storage": {"size": "1Gi"}}),
        Duration::from_secs(120),
    )
    .await;
    let replication = measure(
        &client,
        &ns.name,
        "repl",
        json!({
            "mode": "Replication",
            "instances": 3,
            "storage": {"size": "1Gi"},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "config": {"maxmemory-policy": "allkeys-lru"},
        }),
        Duration::from_secs(180),
    )
    .await;
    let last = format!("repl-{}", runs() - 1);
    let per_reconcile = requests_per_reconcile(&client, &op, &ns.name, &last, 5).await;
    let rss = op.rss_kib();

    println!(
        "apply → Ready, Standalone:            {}",
        summary(&standalone)
    );
    println!(
        "apply → Ready, Replication 3 instances: {}",
        summary(&replication)
    );
    println!(
        "steady state: {per_reconcile:.1} apiserver requests per reconcile (lease renewals included)"
    );
    println!(
        "operator RSS after {} Redis: {} KiB",
        2 * runs(),
        rss.unwrap_or_default()
    );
    if std::env::var_os("REDPILOT_TIMING_CLUSTER").is_some() {
        // The operator's CPU with one idle Replication Redis, then with one
        // idle Cluster Redis of 3 x 2 in its place (steady reconciles,
        // failure-detection probes of every primary, lease renewals).
        let api = redis_api(&client, &ns.name);
        api.delete(&format!("solo-{}", runs() - 1), &DeleteParams::default())
            .await
            .expect("delete");
        let repl_cpu = idle_cpu(&op).await;
        api.delete(&last, &DeleteParams::default())
            .await
            .expect("delete");
        for (shards, instances) in [(3, 2), (6, 3)] {
            let secs = measure(
                &client,
                &ns.name,
                &format!("sharded-{shards}x{instances}"),
                json!({"mode": "Cluster", "shards": shards, "instances": instances,
                       "engine": "Valkey", "version": "8.1"}),
                Duration::from_secs(300),
            )
            .await;
            println!(
                "apply → Ready, Cluster {shards} shards x {instances}: {}",
                summary(&secs)
            );
            if shards == 3 {
                let cluster_cpu = idle_cpu(&op).await;
                println!(
                    "operator CPU, idle: one Replication Redis of 3 {repl_cpu:.1} mCPU; one Cluster Redis of 3 x 2 {cluster_cpu:.1} mCPU"
                );
            }
        }
        let last = format!("sharded-6x3-{}", runs() - 1);
        let per = requests_per_reconcile(&client, &op, &ns.name, &last, 5).await;
        println!("steady state, Cluster 6 x 3: {per:.1} apiserver requests per reconcile");
    }
    assert!(median(standalone) < 60.0, "Standalone median under 60s");
    assert!(median(replication) < 90.0, "Replication median under 90s");
    assert!(rss.is_some(), "the operator is still running");
    // Unoptimised build; `make bench` holds the release figure at scale.
    let rss = rss.unwrap_or_default();
    assert!(
        rss < 150 * 1024,
        "operator RSS {rss} KiB after {} Redis: bound 150 MiB",
        2 * runs()
    );
}
