//! Issue #5: scaling a Replication 3 → 5 → 2. New replicas join (and get
//! the data), removed ones leave, and a scale-down never removes the primary:
//! before scaling down, the primary is moved (by hand, while the Redis is
//! paused) to the highest ordinal, so the operator has to switch it over to a
//! surviving pod before the StatefulSet shrinks.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redpilot::redis::actions::{SwitchoverOptions, switchover};
use redpilot::redis::info::Role;
use redpilot::redis::{ConnectOptions, Endpoint};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, patch_redis, pod_ip, pod_uids, recent_events,
    redis_api, redis_password, redis_pods, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

#[tokio::test]
async fn scale_3_to_5_to_2_never_removes_the_primary() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-scale", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 3, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let mut p = connect_pod(&client, &ns.name, "cache-0", &password)
        .await
        .expect("connect to the primary");
    let _: () = p
        .query("SET", redis::cmd("SET").arg("k1").arg("v1"))
        .await
        .expect("SET");
    drop(p);

    // 3 → 5: two replicas join and get the data.
    let t = Instant::now();
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"instances": 5}}),
    )
    .await;
    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let status = redis.status.expect("status");
    assert_eq!(status.ready.as_deref(), Some("5/5"), "{status:?}");
    assert_eq!(status.instances.len(), 5, "{:?}", status.instances);
    let replicas: Vec<_> = status
        .instances
        .iter()
        .filter(|i| i.role == "replica")
        .collect();
    assert_eq!(replicas.len(), 4, "{:?}", status.instances);
    assert!(
        replicas.iter().all(|r| r.link_up == Some(true)),
        "{replicas:?}"
    );
    println!("3 → 5 Ready in {:.1}s", t.elapsed().as_secs_f64());
    for pod in ["cache-3", "cache-4"] {
        let v = wait_for(
            &format!("k1 on the new replica {pod}"),
            Duration::from_secs(15),
            || async {
                let mut n = connect_pod(&client, &ns.name, pod, &password).await.ok()?;
                n.query::<Option<String>>("GET", redis::cmd("GET").arg("k1"))
                    .await
                    .ok()
                    .flatten()
            },
        )
        .await;
        assert_eq!(v, "v1", "{pod}");
    }

    // Move the primary to cache-4 by hand while the operator is paused, then
    // let the operator adopt it.
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"paused": true}}),
    )
    .await;
    wait_for(
        "the Redis to report Paused",
        Duration::from_secs(30),
        || async {
            let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
            let phase = r.status?.phase?;
            (format!("{phase:?}") == "Paused").then_some(())
        },
    )
    .await;
    let mut members = Vec::new();
    for i in 0..5 {
        members.push(Endpoint::new(
            pod_ip(&client, &ns.name, &format!("cache-{i}")).await,
            6379,
        ));
    }
    let opts = ConnectOptions::default().with_password(password.as_str());
    let report = switchover(&members, &members[4], &opts, &SwitchoverOptions::default())
        .await
        .expect("manual switchover to cache-4");
    assert!(
        report.repoint_failures.is_empty(),
        "{:?}",
        report.repoint_failures
    );
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"paused": false}}),
    )
    .await;
    wait_for(
        "the operator to adopt cache-4 as primary",
        Duration::from_secs(60),
        || async {
            let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
            (support::operator::is_ready(&r) && r.status?.primary.as_deref() == Some("cache-4"))
                .then_some(())
        },
    )
    .await;
    let primary_uid = pod_uids(&client, &ns.name, "cache").await["cache-4"].clone();

    // 5 → 2: cache-2..4 leave; the primary must first move to cache-0 or
    // cache-1. Record what the status says whenever a pod starts leaving.
    let t = Instant::now();
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"instances": 2}}),
    )
    .await;
    let mut leaving_seen: BTreeSet<String> = BTreeSet::new();
    loop {
        let pods = redis_pods(&client, &ns.name, "cache").await;
        let redis = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("get");
        let primary = redis.status.as_ref().and_then(|s| s.primary.clone());
        for i in 2..5 {
            let name = format!("cache-{i}");
            let leaving = pods
                .get(&name)
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            if leaving && leaving_seen.insert(name.clone()) {
                assert_ne!(
                    primary.as_deref(),
                    Some(name.as_str()),
                    "{name} is being removed while it is the recorded primary"
                );
                if name == "cache-4" {
                    // The pod that was primary: it must have been demoted.
                    let ip = pods
                        .get(&name)
                        .and_then(|p| p.status.as_ref())
                        .and_then(|s| s.pod_ip.clone());
                    if let Some(ip) = ip
                        && let Ok(mut n) =
                            redpilot::redis::Node::connect(&Endpoint::new(ip, 6379), &opts).await
                        && let Ok(info) = n.replication().await
                    {
                        assert_ne!(
                            info.role,
                            Some(Role::Primary),
                            "cache-4 is removed while still a primary"
                        );
                    }
                }
            }
        }
        if support::operator::is_ready(&redis)
            && redis.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("2/2")
            && pods.len() == 2
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "scale-down to 2 did not finish; pods {:?}, status {:?}",
            pods.keys().collect::<Vec<_>>(),
            redis.status
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    println!("5 → 2 Ready in {:.1}s", t.elapsed().as_secs_f64());
    let redis = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get");
    let status = redis.status.expect("status");
    let primary = status.primary.clone().expect("a primary");
    assert!(
        primary == "cache-0" || primary == "cache-1",
        "the primary moved to a surviving pod: {status:?}"
    );
    let uids = pod_uids(&client, &ns.name, "cache").await;
    assert_eq!(
        uids.keys().cloned().collect::<Vec<_>>(),
        ["cache-0", "cache-1"],
        "the highest ordinals left"
    );
    assert!(
        !uids.values().any(|u| *u == primary_uid),
        "cache-4 (the old primary) is gone"
    );
    let mut p = connect_pod(&client, &ns.name, &primary, &password)
        .await
        .expect("connect to the primary");
    let info = p.replication().await.expect("INFO replication");
    println!("primary {primary} after scale-down: {info:?}");
    let v: Option<String> = p
        .query("GET", redis::cmd("GET").arg("k1"))
        .await
        .expect("GET");
    assert_eq!(v.as_deref(), Some("v1"), "no data lost");
    let _: () = p
        .query("SET", redis::cmd("SET").arg("k2").arg("v2"))
        .await
        .expect("the primary takes writes");
    let replica = if primary == "cache-0" {
        "cache-1"
    } else {
        "cache-0"
    };
    let v = wait_for(
        "k2 on the remaining replica",
        Duration::from_secs(15),
        || async {
            let mut n = connect_pod(&client, &ns.name, replica, &password)
                .await
                .ok()?;
            n.query::<Option<String>>("GET", redis::cmd("GET").arg("k2"))
                .await
                .ok()
                .flatten()
        },
    )
    .await;
    assert_eq!(v, "v2");
    // The positive witness that cache-4 was demoted before it was removed
    // (the check in the loop above can only run while its server still
    // answers): the switchover event of the scale-down.
    let events = recent_events(&client, &ns.name, 80).await;
    assert!(
        events.lines().any(|l| l.contains("SwitchedOver")
            && l.contains("primary cache-4 → ")
            && l.contains("scale-down")),
        "{events}"
    );
    println!(
        "scale: operator RSS {} KiB",
        op.rss_kib().unwrap_or_default()
    );
}
