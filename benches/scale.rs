//! `make bench`: how one operator copes with many Redis, on the dev cluster.
//!
//! - P1a: 100 Standalone Redis with real server processes on the local node,
//!   applied at once → all Ready: seconds, p50/p99 per object.
//! - P1b: 1,000 Redis (half Standalone, half 3-instance Replication) whose
//!   pods go to the kwok fake node → all children applied and pods Running;
//!   then operator CPU seconds and API requests per minute over an idle
//!   window (their servers cannot be reached, so this shows the backoff).
//! - P2: operator RSS with 100 real and 1,000 fake Redis.
//! - P3: API writes per minute from the operator in that idle window.
//!
//! Requests are counted from the API server's audit log. Pod addresses on
//! the fake node are blackholed by dev/cluster.sh, so the operator's
//! connection attempts never leave the machine.
//!
//! Knobs: BENCH_REAL (100), BENCH_FAKE (1000), BENCH_IDLE_SECS (300),
//! BENCH_VARIANTS and BENCH_VARIANT_SETTLE_SECS (see [`variants`]).

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{knob, percentile};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use support::audit::operator_requests_all;
use support::operator::{
    OperatorOptions, apply_redis, cpu_seconds, is_ready, redis_api, start_operator,
};
use support::{TestNamespace, client};

async fn apply_all(client: &Client, ns: &str, specs: Vec<(String, serde_json::Value)>) {
    stream::iter(specs)
        .for_each_concurrent(16, |(name, spec)| async move {
            apply_redis(client, ns, &name, spec).await;
        })
        .await;
}

/// Seconds from `start` until each Redis of `ns` was first seen Ready.
async fn until_all_ready(client: &Client, ns: &str, n: usize, timeout: Duration) -> Vec<f64> {
    let start = Instant::now();
    let mut ready: BTreeMap<String, f64> = BTreeMap::new();
    let api = redis_api(client, ns);
    while ready.len() < n {
        assert!(
            start.elapsed() < timeout,
            "only {}/{n} Redis Ready in {ns} after {timeout:?}",
            ready.len()
        );
        if let Ok(list) = api.list(&ListParams::default()).await {
            for r in list.items.iter().filter(|r| is_ready(r)) {
                let name = r.metadata.name.clone().unwrap_or_default();
                ready
                    .entry(name)
                    .or_insert_with(|| start.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ready.into_values().collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let real = knob("BENCH_REAL", 100) as usize;
    let fake = knob("BENCH_FAKE", 1000) as usize;
    let idle = Duration::from_secs(knob("BENCH_IDLE_SECS", 300));
    let client = client().await;

    // Room on the fake node for every fake pod.
    let pods_needed = fake / 2 + (fake - fake / 2) * 3 + 10;
    Api::<Node>::all(client.clone())
        .patch_status(
            "kwok-node-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "allocatable": {"pods": pods_needed.to_string()},
                "capacity": {"pods": pods_needed.to_string()}
            }})),
        )
        .await
        .expect("raising the fake node's pod capacity");

    let real_ns = TestNamespace::new(&client, "bench-real", &[]).await;
    let fake_ns = TestNamespace::new(&client, "bench-fake", &[]).await;
    let op = start_operator(
        &client,
        OperatorOptions::watching(&[&real_ns.name, &fake_ns.name]),
    )
    .await;
    let pid = op.pid().expect("operator pid");

    // P1a.
    let specs = (0..real)
        .map(|i| (format!("r{i}"), json!({"mode": "Standalone"})))
        .collect();
    let t = Instant::now();
    apply_all(&client, &real_ns.name, specs).await;
    let mut per_object =
        until_all_ready(&client, &real_ns.name, real, Duration::from_secs(900)).await;
    let p1a_total = t.elapsed().as_secs_f64();
    let p1a_p50 = percentile(&mut per_object, 50.0);
    let p1a_p99 = percentile(&mut per_object, 99.0);
    println!(
        "P1a: {real} Standalone Ready in {p1a_total:.1}s (p50 {p1a_p50:.1}s, p99 {p1a_p99:.1}s)"
    );

    // P1b.
    let on_fake = json!({
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
    });
    let specs = (0..fake)
        .map(|i| {
            let spec = if i % 2 == 0 {
                json!({"mode": "Standalone", "podTemplate": on_fake})
            } else {
                json!({"mode": "Replication", "instances": 3, "podTemplate": on_fake})
            };
            (format!("f{i}"), spec)
        })
        .collect();
    let t = Instant::now();
    apply_all(&client, &fake_ns.name, specs).await;
    let applied = t.elapsed().as_secs_f64();
    let want_pods = fake / 2 + (fake - fake / 2) * 3;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &fake_ns.name);
    loop {
        // Two thousand pods per list while the API server is busiest: a
        // dropped response is retried, not the bench's end.
        let list = match pods
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=redpilot"))
            .await
        {
            Ok(l) => l,
            Err(e) => {
                eprintln!("listing fake pods (retried): {e}");
                assert!(
                    t.elapsed() < Duration::from_secs(1800),
                    "listing fake pods: {e}"
                );
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running >= want_pods {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1800),
            "only {running}/{want_pods} fake pods Running after 30 min"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let p1b_total = t.elapsed().as_secs_f64();
    println!(
        "P1b: {fake} Redis applied in {applied:.1}s; {want_pods} pods Running after {p1b_total:.1}s"
    );

    // Idle window: CPU, requests, writes.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let cpu0 = cpu_seconds(pid);
    let from = chrono::Utc::now();
    tokio::time::sleep(idle).await;
    let to = chrono::Utc::now();
    let cpu = cpu_seconds(pid) - cpu0;
    let minutes = idle.as_secs_f64() / 60.0;
    let requests: Vec<_> = operator_requests_all(from, to)
        .into_iter()
        .filter(|r| r.verb != "watch" && r.resource != "leases")
        .collect();
    let writes = requests.iter().filter(|r| r.is_write()).count();
    let rss_mib = op.rss_kib().unwrap_or_default() as f64 / 1024.0;

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| P1a {real} Standalone (real processes) → all Ready | {p1a_total:.1} s (per object p50 {p1a_p50:.1} s, p99 {p1a_p99:.1} s) |"
    );
    println!(
        "| P1b {fake} Redis on the fake node → children applied, {want_pods} pods Running | {p1b_total:.1} s |"
    );
    println!(
        "| operator CPU over {:.0} idle min | {cpu:.1} s ({:.2} s/min) |",
        minutes,
        cpu / minutes
    );
    println!(
        "| API requests per idle minute (leases and watches excluded) | {:.1} |",
        requests.len() as f64 / minutes
    );
    println!("| P2 operator RSS, {real} real + {fake} fake Redis | {rss_mib:.1} MiB |");
    println!(
        "| P3 API writes per idle minute | {:.1} |",
        writes as f64 / minutes
    );
    let mut verbs: BTreeMap<String, usize> = BTreeMap::new();
    for r in &requests {
        *verbs
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
    println!("idle requests by verb and resource: {verbs:?}");
    // Writes in the idle window by object (a status that changes with time
    // shows as one object written again and again; the last catching up
    // after a slow start as many objects written once or twice).
    let mut written: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| r.is_write()) {
        *written
            .entry(format!("{}/{}", r.namespace, r.describe()))
            .or_default() += 1;
    }
    let mut most: Vec<(&String, &usize)> = written.iter().collect();
    most.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    println!(
        "idle writes: {writes} to {} objects; most written: {:?}",
        written.len(),
        most.iter().take(10).collect::<Vec<_>>()
    );
    let mut op = op;
    let namespaces = [real_ns.name.as_str(), fake_ns.name.as_str()];
    for variant in variants() {
        op.terminate(Duration::from_secs(30));
        op = spawn_variant(&client, &namespaces, &variant).await;
    }
    drop(op);
}

/// Another operator build or allocator setting measured against the same
/// Redis (`BENCH_VARIANTS`, `;`-separated `label|binary|ENV=V ENV=V`, the
/// binary empty for the one under test): each started afresh after the
/// previous one stopped, given `BENCH_VARIANT_SETTLE_SECS` (180) to list
/// and reconcile everything, then its CPU over a minute and its RSS.
struct Variant {
    label: String,
    binary: Option<std::path::PathBuf>,
    env: Vec<(String, String)>,
}

fn variants() -> Vec<Variant> {
    let spec = std::env::var("BENCH_VARIANTS").unwrap_or_default();
    spec.split(';')
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            let mut parts = v.splitn(3, '|');
            let label = parts.next().unwrap_or_default().trim().to_string();
            let binary = parts
                .next()
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .map(std::path::PathBuf::from);
            let env = parts
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Variant { label, binary, env }
        })
        .collect()
}

async fn spawn_variant(
    client: &Client,
    namespaces: &[&str],
    variant: &Variant,
) -> support::operator::Operator {
    let mut opts = OperatorOptions::watching(namespaces);
    opts.binary = variant.binary.clone();
    opts.env = variant.env.clone();
    let op = support::operator::spawn_operator(client, opts).await;
    let pid = op.pid().expect("operator pid");
    tokio::time::sleep(Duration::from_secs(knob("BENCH_VARIANT_SETTLE_SECS", 180))).await;
    let cpu0 = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let cpu = cpu_seconds(pid) - cpu0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    println!(
        "| variant {} (started afresh) | RSS {:.1} MiB (anonymous {:.1}, file {:.1}), peak {:.1} MiB; {cpu:.2} s CPU/min |",
        variant.label,
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:"),
        field("VmHWM:"),
    );
    op
}
