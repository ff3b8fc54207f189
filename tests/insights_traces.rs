//! Traces on the dev cluster with a real Jaeger (bin/jaeger, all-in-one:
//! OTLP in on 127.0.0.1:4318, query API on :16686).
//!
//! An operator with `OTEL_EXPORTER_OTLP_ENDPOINT` set runs a Replication
//! Redis and a planned switchover. Jaeger's query API then returns the
//! switchover's trace: a `reconcile` root span with the Redis name,
//! namespace and generation, the data-plane spans (`redis.switchover`, ...)
//! and the Kubernetes requests under it; every JSON log line written inside
//! that reconcile carries its trace id. With Jaeger stopped, reconciles keep
//! their latency (measured on 20 reconciles each way) and the drop counter
//! rises. A Cluster Redis created beside it leaves the trace of its forming:
//! `redis.cluster_meet` and `redis.cluster_add_slots` under a reconcile of
//! that Redis.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::operator::{
    Operator, OperatorOptions, apply_redis, http_get, metric_sum, patch_redis, redis_api,
    start_operator, wait_ready,
};
use support::{TestNamespace, client, unique_name, wait_for};

const READY: Duration = Duration::from_secs(180);
const QUERY: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 16686);

struct Jaeger(Child);

impl Jaeger {
    async fn start() -> Jaeger {
        let bin = support::repo_root().join("bin/jaeger");
        assert!(
            bin.exists(),
            "bin/jaeger is missing: run `make tools-jaeger`"
        );
        let log = support::operator::log_dir().join(format!("{}.log", unique_name("jaeger")));
        let child = Command::new(bin)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start jaeger");
        let j = Jaeger(child);
        wait_for("Jaeger's query API", Duration::from_secs(60), || async {
            http_get(QUERY, "/api/services").await.map(|_| ())
        })
        .await;
        j
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn traces(service: &str) -> Vec<Value> {
    let path = format!("/api/traces?service={service}&limit=2000&lookback=1h");
    let Some(body) = http_get(QUERY, &path).await else {
        return Vec::new();
    };
    serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["data"].as_array().cloned())
        .unwrap_or_default()
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn parent(span: &Value) -> Option<&str> {
    span["references"]
        .as_array()?
        .iter()
        .find(|r| r["refType"] == "CHILD_OF")?["spanID"]
        .as_str()
}

/// Mean reconcile duration over `n` reconciles, each asked for by touching
/// the Redis: (mean seconds, reconciles counted).
async fn reconcile_latency(
    op: &Operator,
    client: &kube::Client,
    ns: &str,
    n: u32,
    tag: &str,
) -> (f64, f64) {
    let before_sum = op
        .metric_sum("redpilot_reconcile_duration_seconds_sum")
        .await
        .unwrap_or(0.0);
    let before_n = op
        .metric_sum("redpilot_reconcile_duration_seconds_count")
        .await
        .unwrap_or(0.0);
    for i in 0..n {
        patch_redis(
            client,
            ns,
            "cache",
            json!({"metadata": {"annotations": {"test.redpilot.io/nudge": format!("{tag}-{i}")}}}),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let page = op.metrics().await.unwrap_or_default();
    let sum =
        metric_sum(&page, "redpilot_reconcile_duration_seconds_sum").unwrap_or(0.0) - before_sum;
    let count =
        metric_sum(&page, "redpilot_reconcile_duration_seconds_count").unwrap_or(0.0) - before_n;
    (sum / count.max(1.0), count)
}

fn spans_dropped(page: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with("redpilot_trace_spans_total{result=\"dropped\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switchover_is_traced_and_a_missing_collector_costs_nothing() {
    let client = client().await;
    let jaeger = Jaeger::start().await;
    let tns = TestNamespace::new(&client, "traces", &[]).await;
    let ns = tns.name.as_str();
    let service = unique_name("redpilot-test");
    let mut opts = OperatorOptions::watching(&[ns]);
    opts.env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            "http://127.0.0.1:4318".into(),
        ),
        ("OTEL_SERVICE_NAME".into(), service.clone()),
        ("REDPILOT_LOG_FORMAT".into(), "json".into()),
    ];
    let op = start_operator(&client, opts).await;
    apply_redis(
        &client,
        ns,
        "cache",
        json!({"mode": "Replication", "instances": 3}),
    )
    .await;
    apply_redis(
        &client,
        ns,
        "shards",
        json!({"mode": "Cluster", "shards": 3, "instances": 1,
               "engine": "Valkey", "version": "8.1"}),
    )
    .await;
    let r = wait_ready(&client, ns, "cache", READY).await;
    wait_ready(&client, ns, "shards", READY).await;
    let from = r.status.and_then(|s| s.primary).expect("primary");
    let to = if from == "cache-1" {
        "cache-2"
    } else {
        "cache-1"
    };
    patch_redis(
        &client,
        ns,
        "cache",
        json!({"spec": {"failover": {"switchoverTo": to}}}),
    )
    .await;
    wait_for("the switchover", READY, || async {
        let r = redis_api(&client, ns).get("cache").await.ok()?;
        (r.status?.primary.as_deref() == Some(to)).then_some(())
    })
    .await;

    // The switchover's trace, from Jaeger's query API.
    let trace = wait_for(
        "the switchover's trace in Jaeger",
        Duration::from_secs(60),
        || {
            let service = service.clone();
            async move {
                // Spans reach Jaeger in batches: the trace counts once its
                // root (the reconcile, ended last) is in too.
                traces(&service).await.into_iter().find(|t| {
                    t["spans"].as_array().is_some_and(|s| {
                        s.iter().any(|s| s["operationName"] == "redis.switchover")
                            && s.iter().any(|s| parent(s).is_none())
                    })
                })
            }
        },
    )
    .await;
    let spans = trace["spans"].as_array().expect("spans");
    let by_id: BTreeMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["spanID"].as_str().unwrap_or(""), s))
        .collect();
    let root = spans
        .iter()
        .find(|s| parent(s).is_none())
        .expect("a root span");
    assert_eq!(root["operationName"], "reconcile", "root: {root:#}");
    assert_eq!(tag(root, "redis.name"), Some(&json!("cache")));
    assert_eq!(tag(root, "redis.namespace"), Some(&json!(ns)));
    assert!(
        tag(root, "redis.generation")
            .and_then(|g| g.as_i64())
            .is_some_and(|g| g >= 2),
        "generation: {:?}",
        tag(root, "redis.generation")
    );
    // The switchover span hangs under the reconcile.
    let sw = spans
        .iter()
        .find(|s| s["operationName"] == "redis.switchover")
        .expect("switchover span");
    let mut at = sw;
    let mut depth = 0;
    while let Some(p) = parent(at) {
        at = by_id.get(p).expect("parent in the trace");
        depth += 1;
    }
    assert_eq!(
        at["spanID"], root["spanID"],
        "the switchover span is in the reconcile"
    );
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for s in spans {
        *names
            .entry(s["operationName"].as_str().unwrap_or("").to_string())
            .or_default() += 1;
    }
    let kube = spans
        .iter()
        .filter(|s| tag(s, "http.method").is_some())
        .count();
    let data_plane = spans
        .iter()
        .filter(|s| {
            s["operationName"]
                .as_str()
                .is_some_and(|n| n.starts_with("redis."))
        })
        .count();
    println!(
        "switchover trace: {} spans ({} Kubernetes requests, {} data-plane), switchover at depth {depth}: {names:?}",
        spans.len(),
        kube,
        data_plane
    );
    assert!(
        kube >= 1,
        "Kubernetes requests are spans of the reconcile: {names:?}"
    );
    // The Cluster Redis' forming: every cluster action is a span of a
    // reconcile of that Redis.
    let cluster_ops = wait_for(
        "the Cluster Redis' meet and slot assignment in Jaeger",
        Duration::from_secs(60),
        || {
            let service = service.clone();
            async move {
                let mut seen: BTreeMap<String, usize> = BTreeMap::new();
                for t in traces(&service).await {
                    let spans = t["spans"].as_array().cloned().unwrap_or_default();
                    let cluster: Vec<&Value> = spans
                        .iter()
                        .filter(|s| {
                            s["operationName"]
                                .as_str()
                                .is_some_and(|n| n.starts_with("redis.cluster_"))
                        })
                        .collect();
                    if cluster.is_empty() {
                        continue;
                    }
                    let root = spans.iter().find(|s| parent(s).is_none())?;
                    assert_eq!(root["operationName"], "reconcile", "root: {root:#}");
                    assert_eq!(tag(root, "redis.name"), Some(&json!("shards")));
                    for s in cluster {
                        *seen
                            .entry(s["operationName"].as_str().unwrap_or("").to_string())
                            .or_default() += 1;
                    }
                }
                (seen.contains_key("redis.cluster_meet")
                    && seen.contains_key("redis.cluster_add_slots"))
                .then_some(seen)
            }
        },
    )
    .await;
    println!("Cluster Redis forming traced: {cluster_ops:?}");

    // Every JSON log line inside that reconcile carries its trace id.
    let trace_id = trace["traceID"].as_str().expect("trace id");
    let log = op.log_text();
    let mut in_reconcile = 0;
    for line in log.lines().filter(|l| l.starts_with('{')) {
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let Some(spans) = v["spans"].as_array() else {
            continue;
        };
        let Some(rec) = spans.iter().find(|s| s["name"] == "reconcile") else {
            continue;
        };
        in_reconcile += 1;
        assert!(
            rec["trace_id"].is_string(),
            "a reconcile log line without trace_id: {line}"
        );
    }
    let with_id = log.lines().filter(|l| l.contains(trace_id)).count();
    println!(
        "{in_reconcile} JSON log lines inside reconciles, all with a trace id; {with_id} in the switchover's trace"
    );
    assert!(
        with_id >= 1,
        "no log line carries the switchover's trace id {trace_id}"
    );

    // Spans per reconcile, over what Jaeger holds.
    let all = traces(&service).await;
    let roots: Vec<usize> = all
        .iter()
        .filter(|t| {
            t["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["operationName"] == "reconcile"))
        })
        .map(|t| t["spans"].as_array().map(Vec::len).unwrap_or(0))
        .collect();
    if !roots.is_empty() {
        let mut sorted = roots.clone();
        sorted.sort_unstable();
        println!(
            "spans per reconcile over {} reconciles: min {}, median {}, max {}",
            sorted.len(),
            sorted[0],
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1]
        );
    }

    // The collector goes away: reconciles keep their latency, drops are counted.
    let (up, n_up) = reconcile_latency(&op, &client, ns, 20, "up").await;
    let dropped_before = spans_dropped(&op.metrics().await.unwrap_or_default());
    drop(jaeger);
    let (down, n_down) = reconcile_latency(&op, &client, ns, 20, "down").await;
    // The export thread tries every second; give it one round.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dropped_after = spans_dropped(&op.metrics().await.unwrap_or_default());
    println!(
        "reconcile mean with Jaeger up {:.1} ms ({n_up} reconciles), stopped {:.1} ms ({n_down}); spans dropped {dropped_before} -> {dropped_after}",
        up * 1000.0,
        down * 1000.0
    );
    assert!(
        n_up >= 10.0 && n_down >= 10.0,
        "too few reconciles measured"
    );
    // An exporter that waited for the collector would add its connect
    // timeout (seconds) to reconciles; the bound leaves room for a busy
    // machine's noise (0.049 -> 0.154 s once, with the test pool running).
    assert!(
        down <= up * 3.0 + 0.25,
        "reconciles slowed down without a collector: {up:.3} s -> {down:.3} s"
    );
    assert!(
        dropped_after > dropped_before,
        "the drop counter did not rise"
    );
    let _ = Instant::now();
}
