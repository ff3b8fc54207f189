//! A rolling restart (a parameter that cannot change live) under a writer:
//! replicas restart first, the primary is switched over with writes paused
//! and restarted last, and no write the writer was promised (OK and held by
//! a replica) is lost. The README's zero-loss claim for rolls, at the level
//! a user sees it: through the operator, on the dev cluster, real servers.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, is_ready, patch_redis, pod_uids, recent_events, redis_api,
    redis_password, start_operator, wait_ready,
};
use support::writer::{Writer, assert_everywhere};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_no_acknowledged_write() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "roll-writes", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 3, "persistence": {"rdb": false}}),
    )
    .await;
    let redis = wait_ready(&client, &ns.name, "cache", READY).await;
    let old_primary = redis.status.and_then(|s| s.primary).expect("primary");
    let pw = redis_password(&client, &ns.name, "cache").await;
    let before = pod_uids(&client, &ns.name, "cache").await;

    let writer = Writer::start(&client, &ns.name, "cache", &pw, "roll", 1);
    writer.wait_progress(300, Duration::from_secs(60)).await;
    // `databases` is read only at start-up: every instance restarts.
    let changed = patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"config": {"databases": "32"}}}),
    )
    .await;
    let generation = changed.metadata.generation;
    let t = Instant::now();
    let redis = wait_for("every pod replaced and Ready", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let s = r.status.as_ref()?;
        let after = pod_uids(&client, &ns.name, "cache").await;
        let replaced = before.iter().all(|(n, uid)| after.get(n) != Some(uid));
        (replaced
            && is_ready(&r)
            && s.observed_generation == generation
            && s.ready.as_deref() == Some("3/3"))
        .then_some(r)
    })
    .await;
    let rolled = t.elapsed();
    writer.wait_progress(300, Duration::from_secs(60)).await;
    let tally = writer.stop().await;
    let new_primary = redis.status.and_then(|s| s.primary).expect("primary");
    println!(
        "roll of 3 instances in {:.1}s (primary {old_primary} -> {new_primary}); {} writes \
         acknowledged, {} answered OK but unreplicated, {} failed or refused",
        rolled.as_secs_f64(),
        tally.acked.len(),
        tally.unreplicated,
        tally.failed
    );
    assert_everywhere(&client, &ns.name, "cache", 3, &pw, &tally.acked).await;
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("SwitchedOver"), "{events}");
    assert_ne!(new_primary, old_primary, "the primary was switched over");
}
