//! Resharding on the data plane (issue #28), with real servers: three
//! primaries formed into a cluster holding 20,000 keys, a fourth empty
//! primary met, and the slots moved to an even spread over four
//! ([`reshard::rebalance`]) while a writer overwrites 5,000 keys spread
//! over every slot, following `MOVED` and `ASK` as a cluster client does:
//! with the importing/migrating protocol ([`reshard::move_slot`]) on
//! Redis 7.0 and Valkey 8.1, with the atomic slot migration
//! ([`reshard::move_atomic`]) on Valkey 9.1.
//! Then: every node agrees on the new owners, no slot is left open, every
//! key is there with its value, and every key holds its last acknowledged
//! write (or a later attempt). A move stopped after its first batch (the
//! slot left migrating and importing, keys on both sides) is finished by
//! running it again. Prints keys and slots moved per second and what the
//! writer met (redirections followed; `TRYAGAIN` and other errors).

#[path = "support/cluster_client.rs"]
mod cluster_client;
#[path = "support/cluster_servers.rs"]
mod cluster_servers;
#[path = "support/pace.rs"]
mod pace;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster_client::{Client, Met};
use cluster_servers::{Cluster, PASSWORD, start_calm};
use redis_server::Engine;
use redpilot::redis::cluster::{self, Member, SlotRange};
use redpilot::redis::reshard::{self, Classic, OpenSlot};
use redpilot::redis::{ConnectOptions, Endpoint, Node};

/// Keys written before the move (20 per hash tag, 1,000 tags).
const FILL_TAGS: usize = 1_000;
const FILL_PER_TAG: usize = 20;
/// Hash tags (slots) the writer spreads its keys over: the slots that move
/// hold keys written during the move.
const WRITER_TAGS: u64 = 5_000;

/// `cluster.members[..3]` formed into three primaries with the even
/// spread, the fourth met as an empty primary; the node IDs in member
/// order.
async fn three_and_an_empty_fourth(engine: Engine) -> (Cluster, Vec<String>) {
    let c = start_calm(engine, 4);
    let shards: Vec<Vec<Member>> = c.members[..3].iter().map(|m| vec![m.clone()]).collect();
    cluster::form(&shards, &c.opts, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: forming 3 primaries: {e}"));
    let mut first = Node::connect(&c.members[0].endpoint, &c.opts)
        .await
        .expect("connect");
    cluster::meet(&mut first, &c.members[3])
        .await
        .expect("meet");
    let mut ids = Vec::new();
    for m in &c.members {
        let mut n = Node::connect(&m.endpoint, &c.opts).await.expect("connect");
        ids.push(cluster::myid(&mut n).await.expect("myid"));
    }
    // Every node knows the fourth, and the fourth says the cluster is ok
    // (a node that just joined reports it down for up to the rejoin delay,
    // and takes no key from a MIGRATE until then), before any slot moves.
    let deadline = Instant::now() + Duration::from_secs(20);
    for m in &c.members {
        let mut n = Node::connect(&m.endpoint, &c.opts).await.expect("connect");
        loop {
            let nodes = cluster::nodes(&mut n).await.expect("CLUSTER NODES");
            let ok = cluster::info(&mut n).await.expect("CLUSTER INFO").ok;
            if ok
                && nodes.len() == 4
                && nodes
                    .iter()
                    .all(|k| k.myself || (k.connected && !k.handshake))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{engine:?}: {} never knew all 4 nodes with the cluster ok",
                m.endpoint
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    (c, ids)
}

/// Each node's slots as `CLUSTER NODES` on `at` says.
async fn owned(at: &Endpoint, opts: &ConnectOptions, ids: &[String]) -> Vec<Vec<SlotRange>> {
    let mut n = Node::connect(at, opts).await.expect("connect");
    let nodes = cluster::nodes(&mut n).await.expect("CLUSTER NODES");
    ids.iter()
        .map(|id| {
            nodes
                .iter()
                .find(|k| &k.id == id)
                .map(|k| k.slots.clone())
                .unwrap_or_default()
        })
        .collect()
}

async fn fill(client: &mut Client) -> usize {
    for t in 0..FILL_TAGS {
        let mut cmd = redis::cmd("MSET");
        for j in 0..FILL_PER_TAG {
            cmd.arg(format!("{{t{t}}}:{j}"))
                .arg(format!("v{t}-{j}-{}", "x".repeat(64)));
        }
        let _: redis::Value = client
            .run(&format!("{{t{t}}}:0"), &cmd)
            .await
            .unwrap_or_else(|e| panic!("filling tag {t}: {e}"));
    }
    FILL_TAGS * FILL_PER_TAG
}

/// The writer's outcome: the keys acknowledged (each written once, with
/// itself as its value, so a lost write cannot be covered by a later one).
#[derive(Default)]
struct Writes {
    acked: Vec<String>,
    /// When each write was acknowledged.
    at: Vec<Instant>,
    failed: Vec<String>,
}

fn writer(
    seed: Endpoint,
    opts: ConnectOptions,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Writes, Met)> {
    tokio::spawn(async move {
        let mut client = Client::new(seed, opts);
        let mut w = Writes::default();
        let mut i: u64 = 0;
        let mut pace = pace::pacer();
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            let key = format!("{{w{}}}:{i}", i % WRITER_TAGS);
            let mut cmd = redis::cmd("SET");
            cmd.arg(&key).arg(&key);
            match client.run::<redis::Value>(&key, &cmd).await {
                Ok(_) => {
                    w.at.push(Instant::now());
                    w.acked.push(key);
                }
                Err(e) => w.failed.push(e),
            }
            i += 1;
        }
        (w, client.met)
    })
}

/// How the slots move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Importing/migrating with `MIGRATE` batches, slot by slot.
    Classic,
    /// Valkey 9's `CLUSTER MIGRATESLOTS`, one job per move.
    Atomic,
}

async fn dbsize(at: &Endpoint, opts: &ConnectOptions) -> u64 {
    let mut n = Node::connect(at, opts).await.expect("connect");
    n.query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE")
}

async fn moves_every_slot_to_an_even_spread_under_a_writer(engine: Engine, path: Path) {
    let (c, ids) = three_and_an_empty_fourth(engine).await;
    let seed = c.members[0].endpoint.clone();
    let mut client = Client::new(seed.clone(), c.opts.clone());
    let filled = fill(&mut client).await;
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(seed.clone(), c.opts.clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = owned(&seed, &c.opts, &ids).await;
    let plan = reshard::rebalance(&before, 4);
    let slots: u32 = plan.iter().map(reshard::SlotMove::count).sum();
    assert_eq!(slots, 4096, "{engine:?}: 3 to 4 shards moves a quarter");
    let how = Classic {
        password: Some(PASSWORD.to_string()),
        ..Classic::default()
    };
    let started = Instant::now();
    let mut keys_moved = 0u64;
    for m in &plan {
        let mut source = Node::connect(&c.members[m.from].endpoint, &c.opts)
            .await
            .expect("source");
        let mut target = Node::connect(&c.members[m.to].endpoint, &c.opts)
            .await
            .expect("target");
        if path == Path::Atomic {
            let had = dbsize(&c.members[m.to].endpoint, &c.opts).await;
            reshard::move_atomic(&mut source, &m.slots, &ids[m.to], Duration::from_secs(120))
                .await
                .unwrap_or_else(|e| panic!("{engine:?}: moving {:?}: {e}", m.slots));
            keys_moved += dbsize(&c.members[m.to].endpoint, &c.opts)
                .await
                .saturating_sub(had);
            continue;
        }
        for range in &m.slots {
            for slot in range.start..=range.end {
                keys_moved += reshard::move_slot(
                    &mut source,
                    &mut target,
                    (&ids[m.from], &ids[m.to]),
                    &c.members[m.to].endpoint,
                    slot,
                    &how,
                )
                .await
                .unwrap_or_else(|e| panic!("{engine:?}: moving slot {slot}: {e}"))
                .keys;
            }
        }
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (writes, met) = w.await.expect("writer");

    // Every node agrees on the new spread, and nothing is left open.
    let deadline = Instant::now() + Duration::from_secs(20);
    for m in &c.members {
        loop {
            let now = owned(&m.endpoint, &c.opts, &ids).await;
            let counts: Vec<u32> = now
                .iter()
                .map(|r| r.iter().map(SlotRange::count).sum())
                .collect();
            if counts == [4096, 4096, 4096, 4096] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{engine:?}: {} sees {counts:?}",
                m.endpoint
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut n = Node::connect(&m.endpoint, &c.opts).await.expect("connect");
        let open = reshard::open_slots_of(&mut n).await.expect("open slots");
        assert!(
            open.is_empty(),
            "{engine:?}: {} left open: {open:?}",
            m.endpoint
        );
    }
    // Every key, with its value.
    let mut reader = Client::new(seed.clone(), c.opts.clone());
    for t in 0..FILL_TAGS {
        let mut cmd = redis::cmd("MGET");
        for j in 0..FILL_PER_TAG {
            cmd.arg(format!("{{t{t}}}:{j}"));
        }
        let got: Vec<Option<String>> = reader
            .run(&format!("{{t{t}}}:0"), &cmd)
            .await
            .expect("MGET");
        for (j, v) in got.iter().enumerate() {
            assert_eq!(
                v.as_deref(),
                Some(format!("v{t}-{j}-{}", "x".repeat(64)).as_str()),
                "{engine:?}: {{t{t}}}:{j}"
            );
        }
    }
    let missing = cluster_client::missing_keys(&mut reader, &writes.acked).await;
    let lost = missing.len();
    println!(
        "{engine:?}, {path:?}: 3 → 4 shards: {slots} slots and {keys_moved} keys moved in {:.1} s ({:.0} slots/s, {:.0} keys/s), {filled} keys filled",
        took.as_secs_f64(),
        f64::from(slots) / took.as_secs_f64(),
        keys_moved as f64 / took.as_secs_f64()
    );
    println!(
        "{engine:?}, {path:?}: writer: {} writes acknowledged, {} failed ({:?}); followed {} MOVED and {} ASK, {} TRYAGAIN; {lost} acknowledged writes lost",
        writes.at.len(),
        writes.failed.len(),
        writes.failed.iter().take(3).collect::<Vec<_>>(),
        met.moved,
        met.ask,
        met.tryagain
    );
    let during = writes
        .at
        .iter()
        .filter(|t| **t >= started && **t <= started + took)
        .count();
    println!("{engine:?}, {path:?}: {during} writes acknowledged during the move");
    assert!(
        during >= 50,
        "{engine:?}: the writer wrote only {during} times during the move"
    );
    assert!(
        met.ask + met.moved > 0,
        "{engine:?}: the writer met the move"
    );
    if path == Path::Atomic {
        assert_eq!(
            met.ask, 0,
            "{engine:?}: an atomic move sends no client to ASK"
        );
    }
    assert_eq!(
        lost,
        0,
        "{engine:?}: acknowledged writes lost, the first: {:?}",
        &missing[..lost.min(10)]
    );
    assert!(writes.failed.is_empty(), "{engine:?}: {:?}", writes.failed);
    assert!(
        keys_moved > 4_000,
        "{engine:?}: a quarter of the keys moved: {keys_moved}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_70_moves_a_quarter_of_the_slots_to_a_new_primary_under_a_writer() {
    moves_every_slot_to_an_even_spread_under_a_writer(Engine::Redis70, Path::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_81_moves_a_quarter_of_the_slots_to_a_new_primary_under_a_writer() {
    moves_every_slot_to_an_even_spread_under_a_writer(Engine::Valkey81, Path::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_91_moves_a_quarter_of_the_slots_atomically_under_a_writer() {
    moves_every_slot_to_an_even_spread_under_a_writer(Engine::Valkey91, Path::Atomic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_stopped_after_its_first_batch_is_finished_by_running_it_again() {
    let engine = Engine::Valkey81;
    let (c, ids) = three_and_an_empty_fourth(engine).await;
    let seed = c.members[0].endpoint.clone();
    let mut client = Client::new(seed.clone(), c.opts.clone());
    // A slot of shard 0 with 50 keys.
    let tag = (0..)
        .map(|i| format!("open{i}"))
        .find(|t| cluster::key_slot(t.as_bytes()) < 100)
        .unwrap_or_default();
    let slot = cluster::key_slot(tag.as_bytes());
    let mut cmd = redis::cmd("MSET");
    for j in 0..50 {
        cmd.arg(format!("{{{tag}}}:{j}")).arg(j);
    }
    let _: redis::Value = client
        .run(&format!("{{{tag}}}:0"), &cmd)
        .await
        .expect("MSET");
    let mut source = Node::connect(&c.members[0].endpoint, &c.opts)
        .await
        .expect("source");
    let mut target = Node::connect(&c.members[3].endpoint, &c.opts)
        .await
        .expect("target");

    // A first run stopped after one batch of 10: what an operator killed
    // mid-move leaves.
    let _: redis::Value = target
        .query(
            "CLUSTER SETSLOT",
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&ids[0]),
        )
        .await
        .expect("importing");
    let _: redis::Value = source
        .query(
            "CLUSTER SETSLOT",
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&ids[3]),
        )
        .await
        .expect("migrating");
    let keys: Vec<String> = source
        .query(
            "CLUSTER GETKEYSINSLOT",
            redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(10),
        )
        .await
        .expect("keys");
    let mut migrate = redis::cmd("MIGRATE");
    migrate
        .arg(c.members[3].endpoint.host())
        .arg(c.members[3].endpoint.port())
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("AUTH")
        .arg(PASSWORD)
        .arg("KEYS");
    for k in &keys {
        migrate.arg(k);
    }
    let _: redis::Value = source.query("MIGRATE", &migrate).await.expect("MIGRATE");
    // The fault happened: the slot is open on both sides, keys on both.
    assert_eq!(
        reshard::open_slots_of(&mut source).await.expect("open"),
        vec![OpenSlot::Migrating {
            slot,
            to: ids[3].clone()
        }]
    );
    assert_eq!(
        reshard::open_slots_of(&mut target).await.expect("open"),
        vec![OpenSlot::Importing {
            slot,
            from: ids[0].clone()
        }]
    );
    assert_eq!(
        reshard::keys_in_slot(&mut source, slot)
            .await
            .expect("count"),
        40
    );
    assert_eq!(
        reshard::keys_in_slot(&mut target, slot)
            .await
            .expect("count"),
        10
    );

    // Running the move again finishes it.
    let how = Classic {
        password: Some(PASSWORD.to_string()),
        batch: 7,
        ..Classic::default()
    };
    let moved = reshard::move_slot(
        &mut source,
        &mut target,
        (&ids[0], &ids[3]),
        &c.members[3].endpoint,
        slot,
        &how,
    )
    .await
    .expect("moving again");
    assert_eq!(moved.keys, 40);
    assert!(
        reshard::open_slots_of(&mut source)
            .await
            .expect("open")
            .is_empty()
    );
    assert!(
        reshard::open_slots_of(&mut target)
            .await
            .expect("open")
            .is_empty()
    );
    assert_eq!(
        reshard::keys_in_slot(&mut target, slot)
            .await
            .expect("count"),
        50
    );
    let mut reader = Client::new(seed, c.opts.clone());
    for j in 0..50u64 {
        let key = format!("{{{tag}}}:{j}");
        let got: Option<u64> = reader
            .run(&key, redis::cmd("GET").arg(&key))
            .await
            .expect("GET");
        assert_eq!(got, Some(j), "{key}");
    }
    println!(
        "slot {slot}: a move stopped after 10 of 50 keys finished by running it again ({} more moved)",
        moved.keys
    );
}
