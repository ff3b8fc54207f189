//! The write fence (`spec.failover.fence`), against the dev cluster with real
//! servers:
//! - a primary whose fence is closed (no replica acknowledges it) is
//!   reported as refusing writes — condition `PrimaryAvailable` False with
//!   reason `Fenced`, the gauge `redpilot_redis_primary_fenced` — while a
//!   client really gets `NOREPLICAS`, and as available again once a replica
//!   follows it;
//! - a server boots with the fence from its redis.conf: with no operator
//!   running, a restarted instance already has `min-replicas-to-write 1`.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;
use support::faults::Partition;
use support::operator::{
    OperatorOptions, apply_redis, config_get, connect_pod, container_restarts, kill_9, pod_ip,
    redis_api, redis_password, server_pid, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(120);

/// `PrimaryAvailable` as (status, reason).
async fn primary_available(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Option<(String, String)> {
    let r = redis_api(client, ns).get(name).await.ok()?;
    let c = r
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "PrimaryAvailable")?;
    Some((c.status, c.reason))
}

/// One write to `pod`; the error text when refused.
async fn write(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    pw: &str,
    key: &str,
) -> Result<(), String> {
    let mut n = connect_pod(client, ns, pod, pw)
        .await
        .map_err(|e| e.to_string())?;
    n.query::<redis::Value>("SET", redis::cmd("SET").arg(key).arg("v"))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_primary_is_reported_as_refusing_writes() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "fenced", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "pair",
        json!({"mode": "Replication", "instances": 2, "persistence": {"rdb": false}}),
    )
    .await;
    let ready = wait_ready(&client, &ns.name, "pair", READY).await;
    let primary = ready.status.and_then(|s| s.primary).expect("primary");
    let replica = if primary == "pair-0" {
        "pair-1"
    } else {
        "pair-0"
    };
    let pw = redis_password(&client, &ns.name, "pair").await;
    write(&client, &ns.name, &primary, &pw, "before")
        .await
        .expect("the primary takes writes while its replica follows");
    assert_eq!(
        primary_available(&client, &ns.name, "pair").await,
        Some(("True".into(), "PrimaryServing".into()))
    );

    // The only replica is cut off: the primary's fence closes.
    let mut cut = Partition::of(&pod_ip(&client, &ns.name, replica).await);
    cut.cut();
    let t = Instant::now();
    // The fault happened: a client gets NOREPLICAS.
    let refused = wait_for(
        "the primary to refuse writes",
        Duration::from_secs(30),
        || async {
            match write(&client, &ns.name, &primary, &pw, "during").await {
                Err(e) if e.contains("NOREPLICAS") => Some(e),
                _ => None,
            }
        },
    )
    .await;
    let closed = t.elapsed();
    wait_for(
        "PrimaryAvailable False with reason Fenced",
        Duration::from_secs(30),
        || async {
            let (status, reason) = primary_available(&client, &ns.name, "pair").await?;
            (status == "False" && reason == "Fenced").then_some(())
        },
    )
    .await;
    let reported_after = t.elapsed();
    // The gauges are computed at each scrape from the operator's watch
    // cache, which sees its own status write a watch event after the API
    // does: they follow within seconds, not at the same instant.
    let fenced_line = format!(
        "redpilot_redis_primary_fenced{{namespace=\"{}\",redis=\"pair\"}} 1",
        ns.name
    );
    let unavailable_line = format!(
        "redpilot_redis_primary_available{{namespace=\"{}\",redis=\"pair\"}} 0",
        ns.name
    );
    let gauges_at = Instant::now();
    let mut last_page = String::new();
    let mut gauges_follow = false;
    while gauges_at.elapsed() < Duration::from_secs(10) {
        last_page = op.metrics().await.expect("operator metrics");
        if last_page.contains(&fenced_line) && last_page.contains(&unavailable_line) {
            gauges_follow = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        gauges_follow,
        "{fenced_line} and {unavailable_line} within 10 s of the condition, last page:\n{}",
        last_page
            .lines()
            .filter(|l| l.contains("primary_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let gauges_lag = gauges_at.elapsed();
    // Still refusing while reported so: the report is not stale.
    assert!(
        write(&client, &ns.name, &primary, &pw, "still")
            .await
            .is_err_and(|e| e.contains("NOREPLICAS"))
    );

    // The replica is back: writes resume and the report follows.
    cut.heal();
    let t = Instant::now();
    wait_for(
        "the primary to take writes again",
        Duration::from_secs(60),
        || async { write(&client, &ns.name, &primary, &pw, "after").await.ok() },
    )
    .await;
    wait_for(
        "PrimaryAvailable True again",
        Duration::from_secs(60),
        || async {
            let (status, _) = primary_available(&client, &ns.name, "pair").await?;
            (status == "True").then_some(())
        },
    )
    .await;
    println!(
        "fence closed {:.1}s after the cut ({refused}); Fenced reported {:.1}s after the cut, \
         the gauges {} ms after the condition; writable and reported again {:.1}s after the heal",
        closed.as_secs_f64(),
        reported_after.as_secs_f64(),
        gauges_lag.as_millis(),
        t.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_boots_with_the_fence_before_the_operator_looks() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "boot-fence", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "trio",
        json!({
            "mode": "Replication", "instances": 3, "persistence": {"rdb": false},
            "failover": {"maxLagSeconds": 4},
        }),
    )
    .await;
    let ready = wait_ready(&client, &ns.name, "trio", READY).await;
    let primary = ready.status.and_then(|s| s.primary).expect("primary");
    let victim = ["trio-0", "trio-1", "trio-2"]
        .into_iter()
        .find(|p| *p != primary)
        .expect("a replica");
    let pw = redis_password(&client, &ns.name, "trio").await;
    // No operator from here on: whatever the restarted server has, it has
    // from its own start.
    drop(op);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let before = pods.get(victim).await.expect("pod");
    let mut n = connect_pod(&client, &ns.name, victim, &pw)
        .await
        .expect("connect");
    let pid = server_pid(&mut n).await;
    drop(n);
    kill_9(pid);
    let mut n = wait_for(
        "the killed server to be restarted and answer",
        Duration::from_secs(60),
        || async {
            let p = pods.get(victim).await.ok()?;
            if container_restarts(&p) <= container_restarts(&before) {
                return None;
            }
            let mut n = connect_pod(&client, &ns.name, victim, &pw).await.ok()?;
            (server_pid(&mut n).await != pid).then_some(n)
        },
    )
    .await;
    assert_eq!(
        config_get(&mut n, "min-replicas-to-write").await.as_deref(),
        Some("1"),
        "the restarted server has the fence from its redis.conf"
    );
    assert_eq!(
        config_get(&mut n, "min-replicas-max-lag").await.as_deref(),
        Some("4")
    );
    assert_eq!(
        config_get(&mut n, "repl-timeout").await.as_deref(),
        Some("4")
    );
}
