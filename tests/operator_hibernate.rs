//! Hibernation on the dev cluster: a 3-instance Redis on volumes, with RDB
//! snapshots off (so only the operator's save keeps the data), under a
//! writer. `spec.hibernate: true` saves, removes every pod and keeps the
//! volumes and the Secret; `false` brings the same data back: every
//! acknowledged write on every instance, the same password.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use redpilot::api::v1alpha1::Phase;
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, patch_redis, pod_ip, recent_events, redis_api, redis_password,
    start_operator, wait_ready,
};
use support::writer::{Writer, missing_keys};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hibernation_keeps_the_data_and_brings_it_back() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "hibernate", &[]).await;
    let ns = tns.name.as_str();
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(
        &client,
        ns,
        "cache",
        json!({"mode": "Replication", "instances": 3, "storage": {"size": "1Gi"},
               "persistence": {"rdb": false}}),
    )
    .await;
    wait_ready(&client, ns, "cache", READY).await;
    let password = redis_password(&client, ns, "cache").await;
    let writer = Writer::start(&client, ns, "cache", &password, "h", 0);
    writer.wait_progress(2_000, Duration::from_secs(60)).await;

    // A replica down (its process stopped) while the writes go on: it
    // falls behind, cannot save, and must not be the one that wakes as
    // primary with less.
    let primary = redis_api(&client, ns)
        .get("cache")
        .await
        .expect("get")
        .status
        .and_then(|s| s.primary)
        .expect("primary");
    let down = (0..3)
        .map(|i| format!("cache-{i}"))
        .rfind(|p| *p != primary)
        .expect("a replica");
    let mut node = support::operator::connect_pod(&client, ns, &down, &password)
        .await
        .expect("connect");
    let pid = support::operator::info_u64(&mut node, "server", "process_id").await;
    drop(node);
    let signal = |sig: &str| support::operator::signal(pid as u32, sig);
    signal("-STOP");
    let behind = writer.acked();
    writer.wait_progress(2_000, Duration::from_secs(60)).await;
    println!(
        "{down} stopped; {} writes acknowledged since",
        writer.acked() - behind
    );

    // Asleep: no pod, the volumes and the Secret stay.
    let t = Instant::now();
    patch_redis(&client, ns, "cache", json!({"spec": {"hibernate": true}})).await;
    // Saved without the stopped replica; then it may go (its pending
    // SIGTERM is delivered when it runs again).
    wait_for("the dataset saved", Duration::from_secs(60), || async {
        let r = redis_api(&client, ns).get("cache").await.ok()?;
        r.status?.hibernation?.saved_at.map(|_| ())
    })
    .await;
    signal("-CONT");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels("app.kubernetes.io/instance=cache");
    wait_for(
        "the Redis to be Hibernated",
        Duration::from_secs(120),
        || async {
            let r = redis_api(&client, ns).get("cache").await.ok()?;
            let gone = pods.list(&lp).await.ok()?.items.is_empty();
            (gone && r.status?.phase == Some(Phase::Hibernated)).then_some(())
        },
    )
    .await;
    println!(
        "hibernated {:.1} s after the request",
        t.elapsed().as_secs_f64()
    );
    let tally = writer.stop().await;
    println!(
        "writer: {} writes acknowledged, {} refused or failed (the pods went away)",
        tally.acked.len(),
        tally.failed
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get("cache")
        .await
        .expect("sts");
    assert_eq!(sts.spec.replicas, Some(0));
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("claims")
        .items;
    assert_eq!(claims.len(), 3, "the volumes stay");
    assert!(
        Api::<Secret>::namespaced(client.clone(), ns)
            .get_opt("cache-auth")
            .await
            .expect("get")
            .is_some()
    );
    let r = redis_api(&client, ns).get("cache").await.expect("get");
    let st = r.status.expect("status");
    assert!(
        st.hibernation
            .as_ref()
            .is_some_and(|h| h.saved_at.is_some() && h.since.is_some()),
        "{:?}",
        st.hibernation
    );
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Hibernated")
    );

    // Awake: the same data, every acknowledged write on every instance.
    let t = Instant::now();
    patch_redis(&client, ns, "cache", json!({"spec": {"hibernate": false}})).await;
    let r = wait_ready(&client, ns, "cache", READY).await;
    println!(
        "ready again {:.1} s after waking",
        t.elapsed().as_secs_f64()
    );
    assert!(r.status.as_ref().is_some_and(|s| s.hibernation.is_none()));
    assert_eq!(
        redis_password(&client, ns, "cache").await,
        password,
        "the same Secret"
    );
    for i in 0..3 {
        let pod = format!("cache-{i}");
        let ip = pod_ip(&client, ns, &pod).await;
        let missing = missing_keys(&ip, &password, &tally.acked).await;
        assert!(
            missing.is_empty(),
            "{pod} lost {} of {} acknowledged writes (first {:?})\n{}",
            missing.len(),
            tally.acked.len(),
            missing.iter().take(5).collect::<Vec<_>>(),
            recent_events(&client, ns, 20).await
        );
    }
    println!(
        "all {} acknowledged writes on all 3 instances after the wake",
        tally.acked.len()
    );
    let events = recent_events(&client, ns, 40).await;
    assert!(
        events.contains("Hibernating")
            && events.contains("Hibernated")
            && events.contains("Resumed"),
        "{events}"
    );
}
