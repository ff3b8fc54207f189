//! Insights on the dev cluster with a real Prometheus.
//!
//! 1. Without the prometheus-operator CRDs a Redis becomes Ready and the
//!    operator asks for nothing it cannot have (no MonitoringFailed event).
//! 2. Once the CRDs are installed, the operator creates a PodMonitor and a
//!    PrometheusRule for the Redis (owned by it).
//! 3. A real Prometheus scrapes what those objects describe (the PodMonitor
//!    translated as the prometheus-operator would) and the operator, and
//!    evaluates the PrometheusRule: a named list of series is present, and
//!    every query of both Grafana dashboards returns series.
//! 4. A replica whose server is stopped (SIGSTOP: it hangs, the pod stays)
//!    raises RedisDown within 2 minutes; memory filled past 90 % of
//!    maxmemory raises RedisMemoryNearLimit; both resolve once the server
//!    runs again and the data is deleted.
//! 5. `spec.monitoring.prometheus: false` removes both objects.
//!
//! A Cluster Redis (3 shards of 1 instance) runs beside it: its series carry
//! the `shard` label, the cluster series and the per-shard operator series
//! are scraped, every query of the dashboard's Shards row returns series,
//! and a shard primary stopped (with no replica to take over: the whole
//! shard lost) raises RedisClusterSlotsNotOk with its slot count and turns
//! the Redis Degraded naming those slots while another shard still takes
//! writes; all of it resolves when the server runs again.
//!
//! The suite prints the exporter's scrape size, scrape time and RSS.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use redpilot::redis::cluster::{SlotRange, key_slot, parse_ranges};
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, patch_redis, recent_events, redis_password,
    server_pid, signal, start_operator, wait_ready,
};
use support::prometheus::{Prometheus, dashboard_exprs, dashboard_row_exprs, monitoring_crd_files};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind),
        plural,
    )
}

async fn remove_monitoring_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for p in support::prometheus::MONITORING_CRDS {
        let name = format!("{p}.monitoring.coreos.com");
        let _ = crds.delete(&name, &DeleteParams::default()).await;
        wait_for(
            &format!("CRD {name} to be gone"),
            Duration::from_secs(60),
            || async { crds.get_opt(&name).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }
}

async fn install_monitoring_crds(client: &kube::Client) {
    support::operator::install_crd_files(client, &monitoring_crd_files()).await;
}

/// Touches the Redis so the operator reconciles it again.
async fn nudge(client: &kube::Client, ns: &str, name: &str, n: u32) {
    patch_redis(
        client,
        ns,
        name,
        json!({"metadata": {"annotations": {"test.redpilot.io/nudge": n.to_string()}}}),
    )
    .await;
}

async fn firing(p: &Prometheus, alert: &str, pod: Option<&str>) -> bool {
    p.alerts().await.iter().any(|a| {
        a["labels"]["alertname"] == alert
            && a["state"] == "firing"
            && pod.is_none_or(|pod| a["labels"]["pod"] == pod)
    })
}

async fn active(p: &Prometheus, alert: &str) -> bool {
    p.alerts()
        .await
        .iter()
        .any(|a| a["labels"]["alertname"] == alert)
}

/// The exporter processes' resident memory, KiB (pods run as local processes).
fn exporter_rss_kib() -> Vec<u64> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("exporter") && cmd.contains("--password-dir=/etc/redpilot/auth") {
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            if let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                out.push(kib);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrapes_alerts_fire_and_dashboards_have_data() {
    let client = client().await;
    // 1. No monitoring CRDs: nothing breaks.
    remove_monitoring_crds(&client).await;
    let tns = TestNamespace::new(&client, "insights", &[]).await;
    let ns = tns.name.as_str();
    let op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(
        &client,
        ns,
        "cache",
        json!({"mode": "Replication", "instances": 3,
               "resources": {"limits": {"memory": "32Mi"}},
               "config": {"maxmemory-policy": "noeviction"}}),
    )
    .await;
    apply_redis(
        &client,
        ns,
        "shards",
        json!({"mode": "Cluster", "shards": 3, "instances": 1,
               "engine": "Valkey", "version": "8.1",
               "resources": {"limits": {"memory": "32Mi"}}}),
    )
    .await;
    wait_ready(&client, ns, "cache", READY).await;
    let cluster = wait_ready(&client, ns, "shards", READY).await;
    let events = recent_events(&client, ns, 50).await;
    assert!(
        !events.contains("MonitoringFailed"),
        "without the CRDs nothing may fail:\n{events}"
    );

    // 2. CRDs installed: the PodMonitor and PrometheusRule appear.
    install_monitoring_crds(&client).await;
    let pod_monitors: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ar("PodMonitor", "podmonitors"));
    let rules: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ar("PrometheusRule", "prometheusrules"));
    let installed = Instant::now();
    let mut n = 0;
    let (pm, rule, cluster_pm, cluster_rule) = wait_for(
        "the PodMonitors and PrometheusRules of cache and shards",
        Duration::from_secs(120),
        || {
            n += 1;
            let (client, pod_monitors, rules) =
                (client.clone(), pod_monitors.clone(), rules.clone());
            async move {
                nudge(&client, ns, "cache", n).await;
                nudge(&client, ns, "shards", n).await;
                let pm = pod_monitors.get_opt("cache").await.ok()??;
                let rule = rules.get_opt("cache").await.ok()??;
                let cluster_pm = pod_monitors.get_opt("shards").await.ok()??;
                let cluster_rule = rules.get_opt("shards").await.ok()??;
                Some((pm, rule, cluster_pm, cluster_rule))
            }
        },
    )
    .await;
    println!(
        "PodMonitor and PrometheusRule created {:.1} s after the CRDs were installed",
        installed.elapsed().as_secs_f64()
    );
    for obj in [&pm, &rule, &cluster_pm, &cluster_rule] {
        let owner = obj
            .metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .expect("owner reference");
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("Redis", Some(true))
        );
    }

    // 3. A real Prometheus, configured from those objects.
    let pm_value = serde_json::to_value(&pm).expect("json");
    let rule_value = serde_json::to_value(&rule).expect("json");
    let mut groups: Vec<Value> = rule_value["spec"]["groups"]
        .as_array()
        .cloned()
        .expect("groups");
    let cluster_rule_value = serde_json::to_value(&cluster_rule).expect("json");
    groups.extend(
        cluster_rule_value["spec"]["groups"]
            .as_array()
            .cloned()
            .expect("groups of shards"),
    );
    let shipped: Value = serde_yaml::from_str(
        &std::fs::read_to_string(support::repo_root().join("config/prometheus/rules.yaml"))
            .expect("rules.yaml"),
    )
    .expect("yaml");
    groups.extend(
        shipped["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["name"] == "redpilot.operator")
            .cloned(),
    );
    let cluster_pm_value = serde_json::to_value(&cluster_pm).expect("json");
    let mut scrapes = Prometheus::pod_monitor_scrapes(&[pm_value, cluster_pm_value]);
    scrapes.push(Prometheus::operator_scrape(op.metrics_addr));
    let prom = Prometheus::start(scrapes, groups).await;
    let sel = format!("namespace=\"{ns}\",redis=\"cache\"");
    let cluster_sel = format!("namespace=\"{ns}\",redis=\"shards\"");
    let scraped = Instant::now();
    loop {
        let up = prom
            .query(&format!("count(redis_up{{{sel}}} == 1)"))
            .await
            .unwrap_or_default();
        let cluster_up = prom
            .query(&format!("count(redis_up{{{cluster_sel}}} == 1)"))
            .await
            .unwrap_or_default();
        let ops = prom.query("redpilot_build_info").await.unwrap_or_default();
        if up.first().is_some_and(|u| u["value"][1] == "3")
            && cluster_up.first().is_some_and(|u| u["value"][1] == "3")
            && !ops.is_empty()
        {
            break;
        }
        if scraped.elapsed() > Duration::from_secs(90) {
            let targets: Vec<String> = prom
                .targets()
                .await
                .iter()
                .map(|t| format!("{} {} {}", t["scrapeUrl"], t["health"], t["lastError"]))
                .collect();
            panic!(
                "Prometheus does not scrape 3 + 3 sidecars and the operator: redis_up {up:?} {cluster_up:?}\ntargets:\n{}\nlog:\n{}",
                targets.join("\n"),
                prom.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "Prometheus scrapes every sidecar and the operator after {:.0} s",
        scraped.elapsed().as_secs_f64()
    );
    // Rates need two samples.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let named = [
        "redis_up",
        "redis_uptime_in_seconds",
        "redis_memory_used_bytes",
        "redis_memory_max_bytes",
        "redis_connected_clients",
        "redis_commands_processed_total",
        "redis_commands_total",
        "redis_keyspace_hits_total",
        "redis_db_keys",
        "redis_master_repl_offset",
        "redis_connected_slave_offset_bytes",
        "redis_master_link_up",
        "redis_instance_info",
        "redis_rdb_last_save_timestamp_seconds",
        "redis_evicted_keys_total",
        "redis_rejected_connections_total",
        "redpilot_redis_phase",
        "redpilot_redis_primary_available",
        "redpilot_redis_ready_instances",
    ];
    let password = redis_password(&client, ns, "cache").await;
    // A key, so the keyspace series exist.
    let mut primary = connect_pod(&client, ns, "cache-0", &password)
        .await
        .expect("connect");
    let role: String = primary
        .query("INFO", redis::cmd("INFO").arg("replication"))
        .await
        .expect("INFO");
    let primary_pod = if role.contains("role:master") {
        "cache-0".to_string()
    } else {
        let r: redpilot::api::v1alpha1::Redis = support::operator::redis_api(&client, ns)
            .get("cache")
            .await
            .expect("redis");
        r.status.and_then(|s| s.primary).expect("primary")
    };
    let mut primary = connect_pod(&client, ns, &primary_pod, &password)
        .await
        .expect("connect primary");
    let _: () = primary
        .query("SET", redis::cmd("SET").arg("hello").arg("world"))
        .await
        .expect("SET");
    let mut missing = Vec::new();
    for name in named {
        let ok = wait_for_series(&prom, &format!("{name}{{{sel}}}"), Duration::from_secs(30)).await;
        if !ok {
            missing.push(name);
        }
    }
    for name in [
        "redpilot_reconciliations_total",
        "redpilot_reconcile_duration_seconds_bucket",
        "redpilot_managed_redis",
        "redpilot_leader",
        "redpilot_kube_requests_total",
        "redpilot_failovers_total",
        "redpilot_trace_spans_total",
    ] {
        if !wait_for_series(&prom, name, Duration::from_secs(10)).await {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "series missing in Prometheus: {missing:?}"
    );
    println!(
        "series present: {} per Redis + 7 operator-wide",
        named.len()
    );

    // promtool finds nothing to report in either exposition.
    let ip = support::operator::pod_ip(&client, ns, &primary_pod).await;
    let sidecar: std::net::SocketAddr = format!("{ip}:9121").parse().expect("addr");
    let cluster_ip = support::operator::pod_ip(&client, ns, "shards-s0-0").await;
    let cluster_sidecar: std::net::SocketAddr = format!("{cluster_ip}:9121").parse().expect("addr");
    for (what, addr) in [
        ("operator", op.metrics_addr),
        ("exporter", sidecar),
        ("cluster node's exporter", cluster_sidecar),
    ] {
        let page = support::operator::http_get(addr, "/metrics")
            .await
            .unwrap_or_else(|| panic!("{what} /metrics"));
        let lint = promtool_check_metrics(&page);
        // The exporter keeps five names of the common Redis exporter that
        // dashboards query, although promtool dislikes their unit suffix;
        // anything else it reports fails.
        let unexpected: Vec<&str> = lint
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .filter(|l| {
                !(what != "operator"
                    && COMPATIBLE_NAMES.iter().any(|n| {
                        *l == format!("{n} metric names should not contain abbreviated units")
                    }))
            })
            .collect();
        assert!(
            unexpected.is_empty(),
            "promtool check metrics on the {what}:\n{lint}"
        );
        println!(
            "promtool check metrics on the {what} ({} lines): {} findings{}",
            page.lines().count(),
            lint.lines().filter(|l| !l.trim().is_empty()).count(),
            if what != "operator" {
                " (the kept unit-suffix names only)"
            } else {
                ""
            }
        );
    }

    // The exporter's cost.
    let size = prom
        .query(&format!("max(scrape_samples_scraped{{{sel}}})"))
        .await
        .unwrap_or_default();
    let took = prom
        .query(&format!("max(scrape_duration_seconds{{{sel}}})"))
        .await
        .unwrap_or_default();
    println!(
        "exporter: {} samples per scrape, slowest scrape {} s (Prometheus' scrape_duration_seconds); RSS KiB of the sidecars: {:?}",
        size.first()
            .map(|v| v["value"][1].clone())
            .unwrap_or_default(),
        took.first()
            .map(|v| v["value"][1].clone())
            .unwrap_or_default(),
        exporter_rss_kib()
    );

    // Every dashboard query returns series.
    let mut empty = Vec::new();
    let mut count = 0;
    for file in ["redpilot-fleet.json", "redpilot-redis.json"] {
        for expr in dashboard_exprs(file) {
            count += 1;
            let q = expr
                .replace("$namespace", ns)
                .replace("$redis", "cache")
                .replace("$__rate_interval", "1m");
            if !wait_for_series(&prom, &q, Duration::from_secs(20)).await {
                empty.push(format!("{file}: {q}"));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data ({} of {count}):\n{}",
        empty.len(),
        empty.join("\n")
    );
    println!("dashboards: all {count} panel queries returned series");

    // The Cluster Redis: its cluster series carry the shard, the operator
    // exports each shard, and the dashboard's Shards row has data.
    for (q, want) in [
        (
            format!("count(count by (shard) (redis_cluster_state{{{cluster_sel}}} == 1))"),
            3.0,
        ),
        (
            format!("min(redis_cluster_slots_ok{{{cluster_sel}}})"),
            16384.0,
        ),
        (
            format!("max(redis_cluster_known_nodes{{{cluster_sel}}})"),
            3.0,
        ),
        (
            format!("count(redis_cluster_messages_sent_total{{{cluster_sel}}} > 0)"),
            3.0,
        ),
        (
            format!("count(redpilot_redis_shard_primary_available{{{cluster_sel}}} == 1)"),
            3.0,
        ),
        (
            format!("sum(redpilot_redis_shard_desired_instances{{{cluster_sel}}})"),
            3.0,
        ),
    ] {
        wait_for_value(&prom, &q, want, Duration::from_secs(30)).await;
    }
    let shard_row = dashboard_row_exprs("redpilot-redis.json", "Shards (Cluster mode)");
    assert!(shard_row.len() >= 8, "the Shards row: {shard_row:?}");
    let mut empty = Vec::new();
    for expr in &shard_row {
        let q = expr
            .replace("$namespace", ns)
            .replace("$redis", "shards")
            .replace("$__rate_interval", "1m");
        if !wait_for_series(&prom, &q, Duration::from_secs(20)).await {
            empty.push(q);
        }
    }
    assert!(
        empty.is_empty(),
        "Shards row queries without data for the Cluster Redis:\n{}",
        empty.join("\n")
    );
    println!(
        "cluster: redis_cluster_* with a shard label on 3 nodes, 3 shards exported by the operator, all {} Shards-row queries returned series",
        shard_row.len()
    );

    // The Tuning advice row: "cache" runs with the latency monitor off, an
    // informational finding on each instance from the operator's first
    // look (status.insights, exported as redpilot_redis_findings).
    let tuning_row = dashboard_row_exprs("redpilot-redis.json", "Tuning advice");
    assert!(
        tuning_row.len() >= 2,
        "the Tuning advice row: {tuning_row:?}"
    );
    for expr in &tuning_row {
        let q = expr.replace("$namespace", ns).replace("$redis", "cache");
        assert!(
            wait_for_series(&prom, &q, Duration::from_secs(90)).await,
            "Tuning advice row query without data: {q}"
        );
    }
    println!(
        "tuning: all {} Tuning-advice-row queries returned series",
        tuning_row.len()
    );

    // 4. Faults: a hung replica and memory near the limit.
    let replica = ["cache-0", "cache-1", "cache-2"]
        .into_iter()
        .find(|p| *p != primary_pod)
        .expect("a replica");
    let mut node = connect_pod(&client, ns, replica, &password)
        .await
        .expect("connect replica");
    let pid = server_pid(&mut node).await;
    drop(node);
    let max: u64 = support::operator::info_u64(&mut primary, "memory", "maxmemory").await;
    assert!(max > 0, "maxmemory is derived from the 32Mi limit");
    let value = "x".repeat(1024);
    let mut i = 0u64;
    loop {
        let used: u64 = support::operator::info_u64(&mut primary, "memory", "used_memory").await;
        if used * 100 >= max * 93 {
            break;
        }
        let mut mset = redis::cmd("MSET");
        for _ in 0..200 {
            mset.arg(format!("fill:{i}")).arg(&value);
            i += 1;
        }
        let _: () = primary.query("MSET", &mset).await.expect("MSET");
    }
    println!("memory filled: {i} keys of 1 KiB, maxmemory {max} bytes");
    // The Cluster Redis loses shard 2 (its only instance stops): its slots.
    let lost = shard(&cluster, 2);
    let lost_pod = lost.primary.clone().expect("shard 2's primary");
    let lost_slots: u32 = parse_ranges(lost.slots.as_deref().expect("shard 2's slots"))
        .expect("shard 2's slots")
        .iter()
        .map(SlotRange::count)
        .sum();
    let cluster_password = redis_password(&client, ns, "shards").await;
    let mut node = connect_pod(&client, ns, &lost_pod, &cluster_password)
        .await
        .expect("connect shard 2");
    let lost_pid = server_pid(&mut node).await;
    drop(node);
    let stopped = Instant::now();
    signal(pid, "-STOP");
    signal(lost_pid, "-STOP");
    let mut fired = (None, None);
    let waited = wait_for_alerts(&prom, replica, stopped, &mut fired).await;
    let slots_alert = wait_for(
        "RedisClusterSlotsNotOk for shards",
        (stopped + Duration::from_secs(180)).saturating_duration_since(Instant::now()),
        || async {
            prom.alerts().await.into_iter().find(|a| {
                a["labels"]["alertname"] == "RedisClusterSlotsNotOk"
                    && a["labels"]["redis"] == "shards"
                    && a["state"] == "firing"
            })
        },
    )
    .await;
    let slots_fired = stopped.elapsed();
    // The whole shard is lost: the Redis is Degraded naming its slots, and
    // the other shards still take writes.
    let lost_ranges = lost.slots.clone().expect("shard 2's slots");
    let degraded = wait_for(
        "shards Degraded naming shard 2's slots",
        Duration::from_secs(30),
        || async {
            let r = support::operator::redis_api(&client, ns)
                .get("shards")
                .await
                .ok()?;
            r.status?
                .conditions
                .into_iter()
                .find(|c| {
                    c.type_ == "Degraded" && c.status == "True" && c.message.contains(&lost_ranges)
                })
                .map(|c| c.message)
        },
    )
    .await;
    let kept = shard(&cluster, 0);
    let kept_pod = kept.primary.clone().expect("shard 0's primary");
    let kept_ranges = parse_ranges(kept.slots.as_deref().unwrap_or("")).expect("shard 0's slots");
    let key = (0..)
        .map(|i| format!("still-served-{i}"))
        .find(|k| {
            let slot = key_slot(k.as_bytes());
            kept_ranges.iter().any(|r| r.contains(slot))
        })
        .expect("a key of shard 0");
    let mut node = connect_pod(&client, ns, &kept_pod, &cluster_password)
        .await
        .expect("connect shard 0");
    let _: () = node
        .query("SET", redis::cmd("SET").arg(&key).arg("1"))
        .await
        .expect("shard 0 takes writes while shard 2 is lost");
    drop(node);
    println!("shard 2 lost: {degraded:?}; shard 0 ({kept_pod}) still took a write");
    signal(pid, "-CONT");
    signal(lost_pid, "-CONT");
    let not_ok: f64 = slots_alert["value"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("alert value");
    assert_eq!(
        not_ok, lost_slots as f64,
        "RedisClusterSlotsNotOk counts the slots of the stopped shard: {slots_alert}"
    );
    assert!(
        !prom.alerts().await.iter().any(|a| {
            a["labels"]["alertname"] == "RedisClusterStateFail" && a["state"] == "firing"
        }),
        "the reachable nodes stay cluster_state:ok (require-full-coverage no)"
    );
    println!(
        "RedisClusterSlotsNotOk firing {:.0} s after shard 2's only server ({lost_pod}) stopped, counting its {lost_slots} slots",
        slots_fired.as_secs_f64()
    );
    let (down, memory) = fired;
    assert!(
        waited,
        "alerts did not fire: RedisDown {down:?}, RedisMemoryNearLimit {memory:?}\nalerts: {:#?}\n{}",
        prom.alerts().await,
        prom.log_tail()
    );
    let down = down.expect("RedisDown fired");
    println!(
        "RedisDown firing {:.0} s after the replica's server stopped; RedisMemoryNearLimit firing {:.0} s after the fill",
        down.as_secs_f64(),
        memory.expect("memory fired").as_secs_f64()
    );
    assert!(down <= Duration::from_secs(120), "RedisDown took {down:?}");

    // Both resolve.
    let _: () = primary
        .query("FLUSHALL", &redis::cmd("FLUSHALL"))
        .await
        .expect("FLUSHALL");
    let resolving = Instant::now();
    wait_for(
        "RedisDown, RedisMemoryNearLimit and RedisClusterSlotsNotOk to resolve",
        Duration::from_secs(120),
        || async {
            let down = active(&prom, "RedisDown").await;
            let mem = active(&prom, "RedisMemoryNearLimit").await;
            let slots = active(&prom, "RedisClusterSlotsNotOk").await;
            (!down && !mem && !slots).then_some(())
        },
    )
    .await;
    println!(
        "the three alerts resolved {:.0} s after the servers ran again and the data was deleted",
        resolving.elapsed().as_secs_f64()
    );

    // 5. Switched off: both objects go.
    patch_redis(
        &client,
        ns,
        "cache",
        json!({"spec": {"monitoring": {"prometheus": false}}}),
    )
    .await;
    wait_for(
        "the PodMonitor and PrometheusRule to be deleted",
        Duration::from_secs(60),
        || async {
            let pm = pod_monitors.get_opt("cache").await.ok()?;
            let rule = rules.get_opt("cache").await.ok()?;
            (pm.is_none() && rule.is_none()).then_some(())
        },
    )
    .await;
    drop(prom);
    drop(op);
    drop(tns);
    // Later suites run without the CRDs, as most clusters do.
    remove_monitoring_crds(&client).await;
}

/// Names of the common Redis exporter kept for its dashboards although
/// promtool reports their abbreviated units.
const COMPATIBLE_NAMES: &[&str] = &[
    "redis_aof_current_rewrite_duration_sec",
    "redis_aof_last_rewrite_duration_sec",
    "redis_instantaneous_ops_per_sec",
    "redis_rdb_current_bgsave_duration_sec",
    "redis_rdb_last_bgsave_duration_sec",
];

/// What `promtool check metrics` says about `page`, one finding per line
/// (empty: nothing).
fn promtool_check_metrics(page: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(support::repo_root().join("bin/promtool"))
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bin/promtool (make tools-prometheus)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && text.trim().is_empty() {
        return format!(
            "promtool failed with {:?} and said nothing",
            out.status.code()
        );
    }
    text
}

async fn wait_for_alerts(
    prom: &Prometheus,
    replica: &str,
    since: Instant,
    fired: &mut (Option<Duration>, Option<Duration>),
) -> bool {
    let deadline = since + Duration::from_secs(180);
    while Instant::now() < deadline {
        if fired.0.is_none() && firing(prom, "RedisDown", Some(replica)).await {
            fired.0 = Some(since.elapsed());
        }
        if fired.1.is_none() && firing(prom, "RedisMemoryNearLimit", None).await {
            fired.1 = Some(since.elapsed());
        }
        if fired.0.is_some() && fired.1.is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    false
}

/// Entry `index` of the Cluster Redis' `status.shards`.
fn shard(r: &redpilot::api::v1alpha1::Redis, index: i32) -> redpilot::api::v1alpha1::ShardStatus {
    r.status
        .as_ref()
        .and_then(|s| s.shards.iter().find(|sh| sh.index == index).cloned())
        .unwrap_or_else(|| panic!("status.shards[{index}]"))
}

/// Waits until the single result of `q` equals `want`.
async fn wait_for_value(prom: &Prometheus, q: &str, want: f64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = prom.query(q).await.unwrap_or_default();
        let value = got
            .first()
            .and_then(|v| v["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok());
        if value == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{q}: {got:?}, want {want}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn wait_for_series(prom: &Prometheus, q: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if prom.query(q).await.is_some_and(|r| !r.is_empty()) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
