//! A primary pod without persistence deleted at once (grace period 0, as
//! a force delete or a lost node: no `preStop` hook runs, so no handover)
//! comes back empty, on a new address, and boots as a replica of the
//! address it had (the recorded primary). No instance is primary then, and no replica has a live link:
//! the operator promotes the replica furthest ahead, records it, and wires
//! the others to it. Nothing written before the deletion is lost, and the
//! Redis converges to Ready with the new primary in its status.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::watcher;
use redpilot::api::v1alpha1::{Redis, RedisStatus};
use tokio::task::JoinHandle;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, recent_events, redis_api, redis_password,
    start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

#[tokio::test]
async fn deleted_primary_is_replaced_by_the_replica_furthest_ahead() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-recover", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    // No storage and no RDB: a restarted server starts empty.
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 3, "persistence": {"rdb": false}}),
    )
    .await;
    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let old_primary = redis.status.and_then(|s| s.primary).expect("primary");
    let password = redis_password(&client, &ns.name, "cache").await;
    let mut p = connect_pod(&client, &ns.name, &old_primary, &password)
        .await
        .expect("connect to the primary");
    for i in 0..100 {
        let _: () = p
            .query("SET", redis::cmd("SET").arg(format!("k{i}")).arg(i))
            .await
            .expect("SET");
    }
    // Both replicas acknowledged every write.
    let acked: i64 = p
        .query("WAIT", redis::cmd("WAIT").arg(2).arg(5000))
        .await
        .expect("WAIT");
    assert_eq!(acked, 2, "replicas acknowledging the writes");
    drop(p);

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let old_uid = pods
        .get(&old_primary)
        .await
        .expect("primary pod")
        .metadata
        .uid;
    // Every status written from here on: none may name a primary beside
    // an instance list that calls another instance primary, or be Ready
    // while its instances disagree with it.
    let statuses = record_statuses(redis_api(&client, &ns.name));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete(&old_primary, &at_once)
        .await
        .expect("delete the primary pod");
    // The pod comes back (a new object) before the Redis can be Ready again.
    wait_for("the primary pod to be recreated", READY, || async {
        let p = pods.get_opt(&old_primary).await.ok()??;
        (p.metadata.uid != old_uid).then_some(())
    })
    .await;
    let redis = wait_for("Ready with a new primary", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let s = r.status.clone()?;
        let ready = s
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && s.primary.as_deref() != Some(old_primary.as_str())).then_some(r)
    })
    .await;
    let status = redis.status.expect("status");
    let new_primary = status.primary.clone().expect("primary");
    println!(
        "primary {old_primary} deleted; {new_primary} promoted and Ready after {:.1}s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(status.ready.as_deref(), Some("3/3"), "{status:?}");
    for i in &status.instances {
        let want = if i.name == new_primary {
            "primary"
        } else {
            "replica"
        };
        assert_eq!(i.role, want, "{:?}", status.instances);
    }
    let events = recent_events(&client, &ns.name, 30).await;
    assert!(events.contains("FailedOver"), "{events}");
    statuses.1.abort();
    let seen = statuses.0.lock().map(|v| v.clone()).unwrap_or_default();
    check_statuses(&seen, &old_primary, &new_primary);

    // Every key is on the new primary and, via replication, on the
    // recreated pod that came back empty.
    for pod in [new_primary.as_str(), old_primary.as_str()] {
        let n = wait_for(
            &format!("all 100 keys on {pod}"),
            Duration::from_secs(30),
            || async {
                let mut c = connect_pod(&client, &ns.name, pod, &password).await.ok()?;
                let n: i64 = c.query("DBSIZE", &redis::cmd("DBSIZE")).await.ok()?;
                (n == 100).then_some(n)
            },
        )
        .await;
        assert_eq!(n, 100, "{pod}");
    }
    let mut c = connect_pod(&client, &ns.name, &new_primary, &password)
        .await
        .expect("connect to the new primary");
    let _: () = c
        .query("SET", redis::cmd("SET").arg("after").arg("1"))
        .await
        .expect("the new primary takes writes");
}

/// Watches the Redis `cache` and keeps every status it shows in the
/// list returned, until the task is aborted.
fn record_statuses(api: Api<Redis>) -> (Arc<Mutex<Vec<RedisStatus>>>, JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let stream = watcher(
            api,
            watcher::Config::default().fields("metadata.name=cache"),
        );
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            if let watcher::Event::Apply(r) | watcher::Event::InitApply(r) = event
                && let Some(s) = r.status
                && let Ok(mut v) = sink.lock()
            {
                v.push(s);
            }
        }
    });
    (seen, task)
}

/// Every status seen is consistent: the instance called primary (if any)
/// is `status.primary`, and a Ready status lists every instance with the
/// role it has under that primary. The move itself was seen.
fn check_statuses(seen: &[RedisStatus], old: &str, new: &str) {
    let moved: Vec<&RedisStatus> = seen
        .iter()
        .filter(|s| s.primary.as_deref() == Some(new))
        .collect();
    assert!(
        !moved.is_empty(),
        "the watch saw the primary move to {new} ({} statuses seen)",
        seen.len()
    );
    assert!(
        seen.iter().any(|s| s.primary.as_deref() == Some(old)),
        "the watch saw the status before the move"
    );
    for s in seen {
        let primaries: Vec<&str> = s
            .instances
            .iter()
            .filter(|i| i.role == "primary")
            .map(|i| i.name.as_str())
            .collect();
        assert!(
            primaries.iter().all(|p| Some(*p) == s.primary.as_deref()),
            "status.primary {:?} beside instances {primaries:?} called primary: {s:?}",
            s.primary
        );
        let ready = s
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready {
            assert_eq!(primaries, [s.primary.as_deref().unwrap_or("-")], "{s:?}");
        }
    }
    // The first status naming the new primary is not Ready: the replicas
    // still had to follow it.
    let first = moved[0];
    assert!(
        !first
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "Ready in the write that moved the primary: {first:?}"
    );
    println!(
        "{} statuses seen during the failover, each consistent",
        seen.len()
    );
}
