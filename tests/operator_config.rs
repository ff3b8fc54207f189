//! Issue #5: configuration changes on a running Replication.
//!
//! - Dynamic parameters (`maxmemory-policy`, `hz`, `notify-keyspace-events`,
//!   `timeout`, `slowlog-log-slower-than`) are applied live with CONFIG SET:
//!   every pod keeps its UID and restart count, the StatefulSet's
//!   `redpilot.io/restart-hash` stays the same, and the ConfigMap records the
//!   new values for the next start.
//! - A non-dynamic parameter (`databases`) rolls the pods one at a time:
//!   replicas first, the primary last after a switchover; at most one pod is
//!   unavailable at any moment and no data is lost.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{Api, Client};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, config_get, connect_pod, is_ready, patch_redis, pod_ready,
    pod_uids, recent_events, redis_api, redis_password, redis_pods, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

async fn restart_hash(client: &Client, ns: &str, name: &str) -> Option<String> {
    let sts = Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("StatefulSet");
    sts.spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get("redpilot.io/restart-hash").cloned())
}

fn restart_counts(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, i32> {
    pods.iter()
        .map(|(n, p)| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| cs.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            (n.clone(), restarts)
        })
        .collect()
}

async fn redis_conf(client: &Client, ns: &str, name: &str) -> String {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(&format!("{name}-config"))
        .await
        .expect("ConfigMap")
        .data
        .and_then(|d| d.get("redis.conf").cloned())
        .expect("redis.conf in the ConfigMap")
}

async fn replication_ready(client: &Client, ns: &str) {
    apply_redis(
        client,
        ns,
        "cache",
        json!({
            "mode": "Replication",
            "instances": 3,
            "storage": {"size": "1Gi"},
            "config": {"maxmemory-policy": "allkeys-lru"},
        }),
    )
    .await;
    wait_ready(client, ns, "cache", READY).await;
}

#[tokio::test]
async fn dynamic_config_is_applied_live_without_restarts() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-config-live", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    replication_ready(&client, &ns.name).await;
    let uids = pod_uids(&client, &ns.name, "cache").await;
    let restarts = restart_counts(&redis_pods(&client, &ns.name, "cache").await);
    let hash = restart_hash(&client, &ns.name, "cache").await;
    assert!(hash.is_some(), "the pod template carries a restart hash");

    let wanted = [
        ("maxmemory-policy", "volatile-lfu"),
        ("hz", "20"),
        ("notify-keyspace-events", "Ex"),
        ("timeout", "300"),
        ("slowlog-log-slower-than", "5000"),
    ];
    let config: serde_json::Map<String, serde_json::Value> = wanted
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": config}}),
    )
    .await;
    let changed_at = Instant::now();
    wait_ready(&client, &ns.name, "cache", READY).await;

    let password = redis_password(&client, &ns.name, "cache").await;
    for pod in uids.keys() {
        let got = wait_for(
            &format!("the new config on {pod}"),
            Duration::from_secs(30),
            || async {
                let mut n = connect_pod(&client, &ns.name, pod, &password).await.ok()?;
                let mut got = Vec::new();
                for (k, _) in &wanted {
                    got.push(config_get(&mut n, k).await?);
                }
                let all = wanted.iter().zip(&got).all(|((_, w), g)| {
                    // notify-keyspace-events is echoed in the server's order.
                    let mut a: Vec<char> = w.chars().collect();
                    let mut b: Vec<char> = g.chars().collect();
                    a.sort();
                    b.sort();
                    a == b
                });
                all.then_some(got)
            },
        )
        .await;
        println!("{pod}: {got:?}");
    }
    println!(
        "dynamic config live on every pod {:.1}s after the change",
        changed_at.elapsed().as_secs_f64()
    );

    let pods = redis_pods(&client, &ns.name, "cache").await;
    let uids_after: BTreeMap<String, String> = pods
        .iter()
        .map(|(n, p)| (n.clone(), p.metadata.uid.clone().unwrap_or_default()))
        .collect();
    assert_eq!(uids_after, uids, "no pod was re-created for dynamic config");
    assert_eq!(
        restart_counts(&pods),
        restarts,
        "no container restarted for dynamic config"
    );
    assert_eq!(
        restart_hash(&client, &ns.name, "cache").await,
        hash,
        "dynamic config does not change the restart hash"
    );
    let conf = redis_conf(&client, &ns.name, "cache").await;
    for (k, v) in wanted {
        assert!(
            conf.lines().any(|l| {
                let mut it = l.split_whitespace();
                it.next() == Some(k) && it.next().map(|x| x.trim_matches('"')) == Some(v)
            }),
            "redis.conf records {k} {v} for the next start:\n{conf}"
        );
    }
}

#[tokio::test]
async fn non_dynamic_config_rolls_pods_one_at_a_time() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-config-roll", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    replication_ready(&client, &ns.name).await;
    let redis = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get");
    let old_primary = redis
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .expect("a primary");
    let uids = pod_uids(&client, &ns.name, "cache").await;
    let hash = restart_hash(&client, &ns.name, "cache").await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let mut p = connect_pod(&client, &ns.name, &old_primary, &password)
        .await
        .expect("connect to the primary");
    let _: () = p
        .query("SET", redis::cmd("SET").arg("before-roll").arg("kept"))
        .await
        .expect("SET");
    drop(p);

    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru", "databases": "32"}}}),
    )
    .await;
    let start = Instant::now();

    // Watch the roll: the order in which pods are replaced, and how many are
    // unavailable at once.
    let mut replaced: Vec<String> = Vec::new();
    let mut max_unavailable = 0usize;
    let mut worst_moment = String::new();
    loop {
        let pods = redis_pods(&client, &ns.name, "cache").await;
        let unavailable: BTreeSet<String> = uids
            .keys()
            .filter(|n| !pods.get(*n).is_some_and(pod_ready))
            .cloned()
            .collect();
        if unavailable.len() > max_unavailable {
            max_unavailable = unavailable.len();
            worst_moment = format!(
                "{:.1}s: unavailable {unavailable:?}",
                start.elapsed().as_secs_f64()
            );
        }
        for (name, uid) in &uids {
            let gone = pods.get(name).is_none_or(|p| {
                p.metadata.uid.as_deref() != Some(uid) || p.metadata.deletion_timestamp.is_some()
            });
            if gone && !replaced.contains(name) {
                replaced.push(name.clone());
            }
        }
        if replaced.len() == uids.len() {
            let redis = redis_api(&client, &ns.name).get("cache").await.ok();
            if redis.as_ref().is_some_and(support::operator::is_ready) {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the roll did not finish in 300s; replaced so far {replaced:?}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    println!(
        "non-dynamic change rolled {} pods in {:.1}s, order {replaced:?}; worst moment {worst_moment}",
        replaced.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        max_unavailable <= 1,
        "pods restart one at a time; worst moment {worst_moment}"
    );
    assert_eq!(
        replaced.last(),
        Some(&old_primary),
        "the primary is restarted last (after a switchover); order {replaced:?}"
    );
    assert_ne!(
        restart_hash(&client, &ns.name, "cache").await,
        hash,
        "a non-dynamic change changes the restart hash"
    );

    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let new_primary = redis
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .expect("a primary");
    for pod in uids.keys() {
        let mut n = connect_pod(&client, &ns.name, pod, &password)
            .await
            .unwrap_or_else(|e| panic!("connect to {pod}: {e}"));
        assert_eq!(
            config_get(&mut n, "databases").await.as_deref(),
            Some("32"),
            "{pod} runs with the new setting"
        );
        let v: Option<String> = n
            .query("GET", redis::cmd("GET").arg("before-roll"))
            .await
            .expect("GET");
        assert_eq!(v.as_deref(), Some("kept"), "{pod} kept the data");
    }
    let mut p = connect_pod(&client, &ns.name, &new_primary, &password)
        .await
        .expect("connect to the new primary");
    let _: () = p
        .query("SET", redis::cmd("SET").arg("after-roll").arg("1"))
        .await
        .expect("the primary takes writes after the roll");
    println!("primary before the roll {old_primary}, after {new_primary}");
}

/// `maxmemory-policy` is `want` on every pod of `pods`.
async fn assert_policy(
    client: &Client,
    ns: &str,
    password: &str,
    pods: impl Iterator<Item = &String>,
    want: &str,
) {
    for pod in pods {
        let mut n = connect_pod(client, ns, pod, password)
            .await
            .expect("connect");
        assert_eq!(
            config_get(&mut n, "maxmemory-policy").await.as_deref(),
            Some(want),
            "{pod}"
        );
    }
}

#[tokio::test]
async fn a_live_key_removed_from_the_spec_returns_to_the_default() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-config-rm", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    replication_ready(&client, &ns.name).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let uids = pod_uids(&client, &ns.name, "cache").await;
    assert_policy(&client, &ns.name, &password, uids.keys(), "allkeys-lru").await;
    let recorded = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get")
        .status
        .and_then(|s| s.live_config_keys);
    assert_eq!(recorded, Some(vec!["maxmemory-policy".to_string()]));

    // Remove the key: the servers cannot be told "back to the default" live.
    let t = Instant::now();
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": {"maxmemory-policy": null}}}),
    )
    .await;
    wait_for("every pod restarted and Ready", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let after = pod_uids(&client, &ns.name, "cache").await;
        let replaced = uids.iter().all(|(n, uid)| after.get(n) != Some(uid));
        (replaced && is_ready(&r) && r.status?.config_resets == 1).then_some(())
    })
    .await;
    // Back at the server default.
    assert_policy(&client, &ns.name, &password, uids.keys(), "noeviction").await;
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("ConfigKeysRemoved"), "{events}");
    println!(
        "maxmemory-policy removed: back at the default on every pod after an ordered restart \
         in {:.1}s",
        t.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn a_value_the_server_refuses_is_reported_as_degraded_with_its_category() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-config-bad", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(&client, &ns.name, "solo", json!({"mode": "Standalone"})).await;
    wait_ready(&client, &ns.name, "solo", READY).await;
    // Well-formed for admission, refused by the server's CONFIG SET.
    patch_redis(
        &client,
        &ns.name,
        "solo",
        json!({"spec": {"config": {"maxmemory-policy": "most-recently-liked"}}}),
    )
    .await;
    let degraded = wait_for("Degraded with a data-plane reason", READY, || async {
        let r = redis_api(&client, &ns.name).get("solo").await.ok()?;
        let s = r.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Degraded")?;
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        (c.status == "True" && c.reason == "RedisCommandFailed" && ready.status == "False")
            .then(|| c.message.clone())
    })
    .await;
    assert!(
        degraded.contains("applying config on solo-0"),
        "the message names the action and the instance: {degraded}"
    );
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(
        events.contains("Warning Redis/solo RedisCommandFailed"),
        "{events}"
    );
    let page = op.metrics().await.expect("metrics");
    let count = page
        .lines()
        .find(|l| {
            l.starts_with("redpilot_reconcile_errors_total") && l.contains("category=\"redis\"")
        })
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(count.is_some_and(|n| n >= 1.0), "{page}");

    // Fixed in the spec: Ready again, the error gone from the status.
    patch_redis(
        &client,
        &ns.name,
        "solo",
        json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}}),
    )
    .await;
    wait_ready(&client, &ns.name, "solo", READY).await;
}

/// `io-threads` changes live on Valkey 9 and only with a restart on 8.1.
/// Upgrading 8.1 → 9.1 while setting it: instances still on 8.1 are not sent
/// a `CONFIG SET` they refuse (which would report the Redis Degraded); each
/// gets the value when it restarts on 9.1.
#[tokio::test]
async fn live_keys_follow_the_version_each_server_runs() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-config-ver", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 2, "engine": "Valkey", "version": "8.1",
               "persistence": {"rdb": false}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let uids = pod_uids(&client, &ns.name, "cache").await;
    let changed = patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"version": "9.1", "config": {"io-threads": "2"}}}),
    )
    .await;
    let generation = changed.metadata.generation;
    let mut degraded = Vec::new();
    let deadline = Instant::now() + READY;
    loop {
        let r = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("get");
        let s = r.status.clone().unwrap_or_default();
        if let Some(c) = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
        {
            degraded.push(format!("{}: {}", c.reason, c.message));
        }
        let after = pod_uids(&client, &ns.name, "cache").await;
        let replaced = uids.iter().all(|(n, uid)| after.get(n) != Some(uid));
        if replaced
            && is_ready(&r)
            && s.observed_generation == generation
            && s.current_version
                .as_deref()
                .is_some_and(|v| v.starts_with("9.1"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the upgrade to 9.1 did not finish: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        degraded.is_empty(),
        "Degraded during the upgrade: {degraded:?}"
    );
    let password = redis_password(&client, &ns.name, "cache").await;
    for pod in uids.keys() {
        let mut n = connect_pod(&client, &ns.name, pod, &password)
            .await
            .expect("connect");
        assert_eq!(
            config_get(&mut n, "io-threads").await.as_deref(),
            Some("2"),
            "{pod}"
        );
    }
}
