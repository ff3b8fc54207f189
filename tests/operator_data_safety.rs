//! Data safety of restarts, against the dev cluster with real servers:
//! a Standalone Redis without a volume holds its data only in the pod, so a
//! restart (a version change, a parameter that cannot change live) would
//! empty it. The operator holds that restart, says why in a condition and a
//! Warning event, and restarts only once `spec.allowDataLossOnRestart` is
//! set.

mod support;

use std::time::Duration;

use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, config_get, connect_pod, patch_redis, pod_uids, recent_events,
    redis_api, redis_password, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_without_storage_is_not_restarted_into_an_empty_server() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "solo-safety", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(&client, &ns.name, "solo", json!({"mode": "Standalone"})).await;
    wait_ready(&client, &ns.name, "solo", READY).await;
    let password = redis_password(&client, &ns.name, "solo").await;
    let mut node = connect_pod(&client, &ns.name, "solo-0", &password)
        .await
        .expect("connect");
    let _: redis::Value = node
        .query("SET", redis::cmd("SET").arg("precious").arg("data"))
        .await
        .expect("SET");
    let uids = pod_uids(&client, &ns.name, "solo").await;

    // `databases` needs a restart.
    let changed = patch_redis(
        &client,
        &ns.name,
        "solo",
        json!({"spec": {"config": {"databases": "32"}}}),
    )
    .await;
    let generation = changed.metadata.generation;
    let api = redis_api(&client, &ns.name);
    let held = wait_for(
        "the restart to be held with reason RestartWouldLoseData for the new generation",
        Duration::from_secs(60),
        || async {
            let r = api.get("solo").await.ok()?;
            let c = r
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Progressing")?;
            (c.reason == "RestartWouldLoseData" && c.observed_generation == generation)
                .then_some(c.message)
        },
    )
    .await;
    assert!(
        held.contains("allowDataLossOnRestart"),
        "the message says how to proceed: {held}"
    );
    assert_eq!(
        pod_uids(&client, &ns.name, "solo").await,
        uids,
        "the pod was not restarted"
    );
    let v: Option<String> = node
        .query("GET", redis::cmd("GET").arg("precious"))
        .await
        .expect("GET");
    assert_eq!(v.as_deref(), Some("data"), "the data is still there");
    let events = recent_events(&client, &ns.name, 30).await;
    assert!(
        events.contains("RestartWouldLoseData"),
        "a Warning event says why: {events}"
    );

    // With the acknowledgement, the restart happens.
    patch_redis(
        &client,
        &ns.name,
        "solo",
        json!({"spec": {"allowDataLossOnRestart": true}}),
    )
    .await;
    wait_for("the pod to be restarted", READY, || async {
        let now = pod_uids(&client, &ns.name, "solo").await;
        (now.contains_key("solo-0") && now != uids).then_some(())
    })
    .await;
    wait_ready(&client, &ns.name, "solo", READY).await;
    let mut node = connect_pod(&client, &ns.name, "solo-0", &password)
        .await
        .expect("connect after the restart");
    assert_eq!(
        config_get(&mut node, "databases").await.as_deref(),
        Some("32")
    );
}
