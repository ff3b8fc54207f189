//! Resharding paths compared on the same data (`make bench-reshard`): for
//! the classic path (Valkey 8.1: importing/migrating and `MIGRATE` batches)
//! and the atomic one (Valkey 9.1: `CLUSTER MIGRATESLOTS`), a 3 x 2
//! Cluster Redis is filled with the same keys (`RESHARD_TAGS` hash tags of
//! four keys of four types, `RESHARD_VALUE` bytes each), grown to
//! `RESHARD_TO` shards and brought back to 3 by the operator; it prints
//! per path and direction the time from the spec change to done (new
//! pods included), the slots moved, the keys moved (what the shards'
//! `DBSIZE` gained; nothing else writes) and their rates, and checks every
//! key whole at the end. Run on the dev cluster (`make cluster-up`).

#[path = "../tests/support/cluster_client.rs"]
mod cluster_client;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use cluster_client::{Client, fill, whole};
use redpilot::api::v1alpha1::{Redis, ReshardingPhase};
use redpilot::redis::{ConnectOptions, Endpoint};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, pod_ip, redis_api, redis_password, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(600);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn done(r: &Redis, shards: i32) -> bool {
    r.status.as_ref().is_some_and(|st| {
        st.resharding
            .as_ref()
            .is_some_and(|x| x.phase == ReshardingPhase::Done && x.to_shards == shards)
            && st.shards.len() == usize::try_from(shards).unwrap_or(0)
            && support::operator::is_ready(r)
    })
}

/// Keys each shard primary holds (`DBSIZE`), by pod, from status.
async fn keys_per_primary(
    client: &kube::Client,
    ns: &str,
    copts: &ConnectOptions,
) -> Vec<(String, u64)> {
    let r = redis_api(client, ns).get("cache").await.expect("redis");
    let mut out = Vec::new();
    for s in r.status.map(|s| s.shards).unwrap_or_default() {
        let Some(pod) = s.primary else { continue };
        let ep = Endpoint::new(pod_ip(client, ns, &pod).await, 6379);
        let mut n = redpilot::redis::Node::connect(&ep, copts)
            .await
            .expect("connect to a shard primary");
        let keys: u64 = n
            .query("DBSIZE", &redis::cmd("DBSIZE"))
            .await
            .expect("DBSIZE");
        out.push((pod, keys));
    }
    out
}

struct Row {
    path: String,
    step: String,
    secs: f64,
    slots: i64,
    keys: i64,
    mib: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tags = env_or("RESHARD_TAGS", 25_000);
    let size = env_or("RESHARD_VALUE", 2048);
    let to = i32::try_from(env_or("RESHARD_TO", 4)).expect("shard count");
    let client = client().await;
    let mut rows = Vec::new();
    for version in ["8.1", "9.1"] {
        let ns = TestNamespace::new(&client, "bench-reshard", &[]).await;
        let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
        let spec = |shards: i32| {
            json!({"mode": "Cluster", "shards": shards, "instances": 2, "engine": "Valkey",
                   "version": version, "resources": {"limits": {"memory": "1Gi"}}})
        };
        apply_redis(&client, &ns.name, "cache", spec(3)).await;
        wait_ready(&client, &ns.name, "cache", READY).await;
        let password = redis_password(&client, &ns.name, "cache").await;
        let copts = ConnectOptions::default()
            .with_password(password)
            .with_timeouts(Duration::from_secs(1), Duration::from_secs(5));
        let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379);
        let t = Instant::now();
        fill(&mut Client::new(seed.clone(), copts.clone()), tags, size).await;
        println!(
            "Valkey {version}: filled {} keys ({:.1} MiB of values) in {:.1} s",
            tags * 4,
            (tags * 4 * size) as f64 / 1048576.0,
            t.elapsed().as_secs_f64()
        );
        let api = redis_api(&client, &ns.name);
        for shards in [to, 3] {
            let before = keys_per_primary(&client, &ns.name, &copts).await;
            let asked = Instant::now();
            apply_redis(&client, &ns.name, "cache", spec(shards)).await;
            let r = wait_for(&format!("resharding to {shards} done"), READY, || async {
                let r = api.get("cache").await.ok()?;
                done(&r, shards).then_some(r)
            })
            .await;
            let secs = asked.elapsed().as_secs_f64();
            // Keys moved: what the shards gained (nothing else writes).
            let after = keys_per_primary(&client, &ns.name, &copts).await;
            let keys: u64 = after
                .iter()
                .map(|(pod, n)| {
                    let shard = pod.rsplit_once('-').map_or(pod.as_str(), |(s, _)| s);
                    let was = before
                        .iter()
                        .filter(|(p, _)| p.starts_with(&format!("{shard}-")))
                        .map(|(_, n)| *n)
                        .sum::<u64>();
                    n.saturating_sub(was)
                })
                .sum();
            let keys = i64::try_from(keys).unwrap_or(i64::MAX);
            let x = r
                .status
                .and_then(|s| s.resharding)
                .expect("status.resharding");
            rows.push(Row {
                path: x.path.clone(),
                step: format!("3 → {shards}").replace("3 → 3", &format!("{to} → 3")),
                secs,
                slots: x.slots_moved,
                keys,
                mib: keys as f64 * size as f64 / 1048576.0,
            });
        }
        let mut check = Client::new(seed.clone(), copts.clone());
        let mut broken = 0;
        for t in 0..tags {
            if whole(&mut check, t, size).await != Some(true) {
                broken += 1;
            }
        }
        assert_eq!(broken, 0, "Valkey {version}: {broken} tags not whole");
        println!("Valkey {version}: all {} keys whole", tags * 4);
    }
    println!(
        "\n{:<8} {:<7} {:>8} {:>6} {:>8} {:>9} {:>8} {:>8}",
        "path", "step", "seconds", "slots", "keys", "slots/s", "keys/s", "MiB/s"
    );
    for r in &rows {
        println!(
            "{:<8} {:<7} {:>8.1} {:>6} {:>8} {:>9.0} {:>8.0} {:>8.2}",
            r.path,
            r.step,
            r.secs,
            r.slots,
            r.keys,
            r.slots as f64 / r.secs,
            r.keys as f64 / r.secs,
            r.mib / r.secs
        );
    }
}
