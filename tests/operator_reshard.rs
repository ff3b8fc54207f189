//! Online resharding on the dev cluster (issue #28), with real Valkey 8.1
//! servers (the classic importing/migrating path) and cluster clients that
//! follow `MOVED` and `ASK` themselves (no library retries):
//! - a 3 x 2 Cluster Redis is filled with keys of four types (strings,
//!   hashes, lists, sets), then four writers overwrite their own keys and
//!   four readers read the filled strings, counting every error by kind;
//! - `spec.shards` goes to 4: the operator creates shard 3, joins it and
//!   moves a quarter of the slots to it; the operator process is stopped
//!   right after a move's first `MIGRATE` batch (the slot left migrating
//!   and importing, keys on both sides, the new shard already owning the
//!   one slot it takes alone first: proven before going on), then the
//!   source's and the target's primaries are `kill -9`ed and their
//!   replicas take over (proven before going on; a slotless target would
//!   get no election and come back empty), and `spec.shards` is set back to 3 while no
//!   operator runs; the next operator process finishes the open slot
//!   first (from the new primary, toward shard 3, where part of its keys
//!   already are), then empties shard 3 again and removes it;
//! - `spec.shards` goes to 4 again and the quarter of the slots moves with
//!   nothing stopped;
//! - back to 3, and while slots move the primary taking them is `kill
//!   -9`ed (its replica takes over: proven);
//! - `spec.shards` goes back to 3: shard 3 is emptied onto the others, its
//!   StatefulSet removed and its node IDs forgotten everywhere;
//! - then every filled key is there with its content, every writer key
//!   holds its last acknowledged value (or a later attempt), no reader saw
//!   a filled key missing, and no node has a slot open.
//!
//! Sizes come from `REDPILOT_RESHARD_TAGS` (hash tags, 4 keys each;
//! default 2,500 = 10,000 keys) and `REDPILOT_RESHARD_VALUE` (bytes per
//! value; default 64); `make bench-reshard` runs it at 200 MiB.

#[path = "support/cluster_client.rs"]
mod cluster_client;
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster_client::{Client, Met, fill, value, whole};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use redpilot::api::v1alpha1::{Redis, ReshardingPhase};
use redpilot::redis::cluster::{self, spread};
use redpilot::redis::reshard::{self, open_slots};
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, info_u64, kill_9, pod_ip, recent_events, redis_api,
    redis_password, spawn_operator, start_operator, wait_failpoint, wait_ready,
    wait_resharding_done,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(240);
const WRITERS: usize = 4;
const READERS: usize = 4;
/// Keys each writer overwrites in turn.
/// Each writer spreads its keys over this many hash tags (slots), so the
/// slots every move takes hold keys written during it.
const WRITER_TAGS: u64 = 1_024;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The last client errors of the test, as met (shown when a phase that
/// must have none had some).
static LAST_ERRORS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note_error(e: &str) {
    if let Ok(mut v) = LAST_ERRORS.lock() {
        if v.len() >= 10 {
            v.remove(0);
        }
        v.push(e.to_string());
    }
}

/// A client's errors, by kind.
#[derive(Debug, Default)]
struct Errors {
    by_kind: BTreeMap<String, u64>,
}

impl Errors {
    fn add(&mut self, e: &str) {
        *self
            .by_kind
            .entry(cluster_client::error_kind(e))
            .or_default() += 1;
    }

    fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }
}

/// What a writer did: every key is written once, with itself as its value,
/// so a write lost at a fault cannot be covered by a later one.
#[derive(Default)]
struct Writes {
    acked: Vec<String>,
    errors: Errors,
}

fn writer(
    w: usize,
    seed: Endpoint,
    opts: ConnectOptions,
    stop: Arc<AtomicBool>,
    failures: Arc<AtomicU64>,
    every: Duration,
) -> tokio::task::JoinHandle<(Writes, Met)> {
    tokio::spawn(async move {
        let mut client = Client::new(seed, opts);
        // Acknowledged = on a replica too: a failover keeps it.
        client.confirm = Some((1, 500));
        let mut out = Writes::default();
        let mut i: u64 = 0;
        let mut pace = tokio::time::interval(every);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            let key = format!("{{w{w}t{}}}:{i}", i % WRITER_TAGS);
            match client
                .run::<redis::Value>(&key, redis::cmd("SET").arg(&key).arg(&key))
                .await
            {
                Ok(_) => out.acked.push(key),
                Err(e) => {
                    out.errors.add(&e);
                    failures.fetch_add(1, Ordering::Relaxed);
                    note_error(&e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            i += 1;
        }
        (out, client.met)
    })
}

#[derive(Default)]
struct Reads {
    ok: u64,
    /// A filled key read as absent or with another value.
    wrong: u64,
    /// The first wrong reads: seconds since the readers started, key,
    /// slot, what was read.
    first_wrong: Vec<(f64, String, u16, Option<usize>)>,
    errors: Errors,
}

fn reader(
    r: usize,
    seed: Endpoint,
    opts: ConnectOptions,
    tags: usize,
    size: usize,
    stop: Arc<AtomicBool>,
    failures: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<(Reads, Met)> {
    tokio::spawn(async move {
        let mut client = Client::new(seed, opts);
        let mut out = Reads::default();
        let mut t = r * 7919;
        let started = Instant::now();
        let mut pace = support::pace::pacer();
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            t = (t + 104_729) % tags.max(1);
            let key = format!("{{t{t}}}:s");
            match client
                .run::<Option<String>>(&key, redis::cmd("GET").arg(&key))
                .await
            {
                Ok(Some(v)) if v == value(t, size) => out.ok += 1,
                Ok(v) => {
                    out.wrong += 1;
                    if out.first_wrong.len() < 5 {
                        out.first_wrong.push((
                            started.elapsed().as_secs_f64(),
                            key.clone(),
                            cluster::key_slot(key.as_bytes()),
                            v.map(|v| v.len()),
                        ));
                    }
                }
                Err(e) => {
                    out.errors.add(&e);
                    failures.fetch_add(1, Ordering::Relaxed);
                    note_error(&e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        (out, client.met)
    })
}

/// Four writers and four readers on a filled cluster.
struct Load {
    stop: Arc<AtomicBool>,
    /// Errors any client met so far (a phase with no fault must add none).
    failures: Arc<AtomicU64>,
    writers: Vec<tokio::task::JoinHandle<(Writes, Met)>>,
    readers: Vec<tokio::task::JoinHandle<(Reads, Met)>>,
    tags: usize,
    size: usize,
}

impl Load {
    /// Starts the clients; each writer writes a new key at most once per
    /// `every` (the keys add up: a test near maxmemory writes slower).
    fn start(
        seed: &Endpoint,
        copts: &ConnectOptions,
        tags: usize,
        size: usize,
        every: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(AtomicU64::new(0));
        let writers = (0..WRITERS)
            .map(|w| {
                let f = failures.clone();
                writer(w, seed.clone(), copts.clone(), stop.clone(), f, every)
            })
            .collect();
        let readers = (0..READERS)
            .map(|r| {
                let f = failures.clone();
                reader(r, seed.clone(), copts.clone(), tags, size, stop.clone(), f)
            })
            .collect();
        Load {
            stop,
            failures,
            writers,
            readers,
            tags,
            size,
        }
    }

    /// Errors the clients met so far.
    fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Stops the clients, prints what they met, and asserts that every
    /// acknowledged write is there and every filled key is whole.
    async fn finish(self, seed: &Endpoint, copts: &ConnectOptions) {
        let Load {
            stop,
            failures: _,
            writers,
            readers,
            tags,
            size,
        } = self;
        stop.store(true, Ordering::Relaxed);

        // Every write acknowledged is there; every filled key is whole.
        let mut check = Client::new(seed.clone(), copts.clone());
        let mut lost = Vec::new();
        let (mut moved, mut ask, mut tryagain) = (0, 0, 0);
        for (w, h) in writers.into_iter().enumerate() {
            let (out, met) = h.await.expect("writer");
            (moved, ask, tryagain) = (moved + met.moved, ask + met.ask, tryagain + met.tryagain);
            let missing = cluster_client::missing_keys(&mut check, &out.acked).await;
            println!(
                "writer {w}: {} acknowledged (unique keys), {} of them missing, errors {:?}",
                out.acked.len(),
                missing.len(),
                out.errors.by_kind
            );
            assert!(out.acked.len() > 100, "writer {w} wrote");
            lost.extend(missing);
        }
        let mut wrong = 0;
        let mut read_errors = 0;
        for (i, h) in readers.into_iter().enumerate() {
            let (out, met) = h.await.expect("reader");
            (moved, ask, tryagain) = (moved + met.moved, ask + met.ask, tryagain + met.tryagain);
            wrong += out.wrong;
            read_errors += out.errors.total();
            println!(
                "reader {i}: {} reads right, {} wrong or missing, errors {:?}",
                out.ok, out.wrong, out.errors.by_kind
            );
            for (at, key, slot, got) in &out.first_wrong {
                println!(
                    "  wrong read {at:.1} s into the load: {key} (slot {slot}) read as {}",
                    got.map_or("absent".to_string(), |n| format!("{n} bytes"))
                );
            }
        }
        println!(
            "clients followed {moved} MOVED and {ask} ASK, waited on {tryagain} TRYAGAIN; {read_errors} read errors"
        );
        assert!(
            lost.is_empty(),
            "{} acknowledged writes lost, the first: {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        );
        assert_eq!(wrong, 0, "readers saw {wrong} filled keys missing or wrong");
        let mut broken = Vec::new();
        for t in 0..tags {
            if whole(&mut check, t, size).await != Some(true) {
                broken.push(t);
            }
        }
        assert!(
            broken.is_empty(),
            "{} tags not whole: {:?}",
            broken.len(),
            &broken[..broken.len().min(10)]
        );
    }
}

/// Waits until the other pod of `pod`'s shard serves slots as primary.
async fn took_over(client: &kube::Client, ns: &str, pod: &str, password: &str) {
    let other = partner(pod);
    wait_for(
        &format!("{other} to take over from {pod}"),
        READY,
        || async {
            let mut n = connect_pod(client, ns, &other, password).await.ok()?;
            let nodes = cluster::nodes(&mut n).await.ok()?;
            nodes
                .iter()
                .any(|k| k.myself && k.primary && !k.slots.is_empty())
                .then_some(())
        },
    )
    .await;
}

/// An operator that exits at `failpoint` (left down there), and the
/// options of the next one. Both are started again when they lose their
/// short lease on a loaded machine, as their Deployment would.
async fn stopping_at(
    client: &kube::Client,
    ns: &str,
    name: &str,
    failpoint: &str,
) -> (support::operator::Operator, OperatorOptions) {
    let opts = OperatorOptions::watching(&[ns]).named(name).crash_lease();
    let crashing = armed(&opts, name, failpoint);
    (start_operator(client, crashing).await, opts)
}

/// The first slot a move from 3 shards to 4 gives shard 3 (shard 0's
/// slots above its even share of 4).
const FIRST_MOVED_SLOT: u16 = 4096;

/// `n` keys of slot `slot`.
fn pinned_keys(slot: u16, n: usize) -> Vec<String> {
    let tag = (0u64..)
        .map(|i| format!("p{i}"))
        .find(|t| cluster::key_slot(t.as_bytes()) == slot)
        .expect("a tag of the slot");
    (0..n).map(|i| format!("{{{tag}}}:pin:{i}")).collect()
}

/// Options `opts` under another name, exiting at `failpoint`.
fn armed(opts: &OperatorOptions, name: &str, failpoint: &str) -> OperatorOptions {
    let mut o = opts.clone().named(name);
    o.env.push(("REDPILOT_FAILPOINTS".into(), failpoint.into()));
    o
}

/// The other pod of `pod`'s shard (two instances per shard).
fn partner(pod: &str) -> String {
    let (shard, ord) = pod
        .strip_prefix("cache-s")
        .and_then(|r| r.split_once('-'))
        .expect("pod name");
    format!("cache-s{shard}-{}", if ord == "0" { 1 } else { 0 })
}

fn resharding_done(r: &Redis, shards: i32) -> bool {
    let Some(st) = r.status.as_ref() else {
        return false;
    };
    st.resharding
        .as_ref()
        .is_some_and(|x| x.phase == ReshardingPhase::Done && x.to_shards == shards)
        && st.shards.len() == usize::try_from(shards).unwrap_or(0)
        && support::operator::is_ready(r)
}

/// Every pod's endpoint.
async fn endpoints(client: &kube::Client, ns: &str, shards: i32) -> Vec<(String, Endpoint)> {
    let mut out = Vec::new();
    for s in 0..shards {
        for j in 0..2 {
            let pod = format!("cache-s{s}-{j}");
            let ip = pod_ip(client, ns, &pod).await;
            out.push((pod, Endpoint::new(ip, 6379)));
        }
    }
    out
}

/// Slots open on any node, as `CLUSTER NODES` shows them.
/// Waits (60 s at most) until every node answers `PING`; a node that does
/// not fails the test.
async fn endpoints_answer(eps: &[(String, Endpoint)], opts: &ConnectOptions) {
    for (pod, ep) in eps {
        wait_for(
            &format!("{pod} to answer"),
            Duration::from_secs(60),
            || async {
                let mut n = Node::connect(ep, opts).await.ok()?;
                n.query::<String>("PING", &redis::cmd("PING")).await.ok()
            },
        )
        .await;
    }
}

/// The open slots every node reports; every node must answer (a node left
/// out could be the one with the slot open).
async fn open_anywhere(eps: &[(String, Endpoint)], opts: &ConnectOptions) -> Vec<String> {
    endpoints_answer(eps, opts).await;
    let mut out = Vec::new();
    for (pod, ep) in eps {
        let mut n = Node::connect(ep, opts)
            .await
            .unwrap_or_else(|e| panic!("{pod} answered a moment ago, now: {e}"));
        let text: String = n
            .query("CLUSTER NODES", redis::cmd("CLUSTER").arg("NODES"))
            .await
            .unwrap_or_else(|e| panic!("CLUSTER NODES of {pod}: {e}"));
        for o in open_slots(&text) {
            out.push(format!("{pod}: {o:?}"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_to_four_to_three_shards_under_writers_and_readers_across_an_operator_crash() {
    let tags = env_or("REDPILOT_RESHARD_TAGS", 2_500);
    let size = env_or("REDPILOT_RESHARD_VALUE", 64);
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-reshard", &[]).await;
    // The first process stops right after a move's first MIGRATE batch.
    let (mut first, opts) =
        stopping_at(&client, &ns.name, "op-reshard", "reshard-after-batch").await;
    let spec = |shards: i32| {
        json!({"mode": "Cluster", "shards": shards, "instances": 2, "engine": "Valkey", "version": "8.1",
               "resources": {"limits": {"memory": "1Gi"}}})
    };
    apply_redis(&client, &ns.name, "cache", spec(3)).await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379);
    let t = Instant::now();
    let mut filler = Client::new(seed.clone(), copts.clone());
    fill(&mut filler, tags, size).await;
    let mib = (tags * size * 4) as f64 / (1024.0 * 1024.0);
    println!(
        "filled {} keys ({mib:.1} MiB of values) in {:.1} s",
        tags * 4,
        t.elapsed().as_secs_f64()
    );

    // Keys in slot 4096, the first slot the move to a new shard 3 takes
    // from shard 0: without the rule that a slotless shard first takes a
    // keyless slot alone, the first batch of keys would go to a primary
    // that owns no slot.
    let pinned = pinned_keys(FIRST_MOVED_SLOT, 16);
    for k in &pinned {
        let _: () = filler
            .run(k, redis::cmd("SET").arg(k).arg(k))
            .await
            .unwrap_or_else(|e| panic!("writing {k}: {e}"));
    }

    let load = Load::start(&seed, &copts, tags, size, Duration::from_millis(2));
    let at = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 3 → 4, the operator stopped after a first batch.
    let asked = Instant::now();
    apply_redis(&client, &ns.name, "cache", spec(4)).await;
    wait_failpoint(&mut first, READY).await;
    let eps = endpoints(&client, &ns.name, 4).await;
    let open = open_anywhere(&eps, &copts).await;
    assert!(
        open.iter().any(|o| o.contains("Migrating"))
            && open.iter().any(|o| o.contains("Importing")),
        "the operator stopped mid-move, yet no slot is open: {open:?}"
    );
    println!(
        "{:.1} s: operator stopped mid-move with {open:?}",
        at.elapsed().as_secs_f64()
    );
    // The source's primary killed while the slot is open: its replica
    // takes over (proven before the next operator starts).
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("redis");
    let st = r.status.clone().expect("status");
    let intent = st
        .resharding
        .as_ref()
        .and_then(|x| x.current.clone())
        .expect("the move under way is recorded before its first command");
    let from = intent.from_shard;
    let primary_of = |i: i32| st.shards.get(usize::try_from(i).ok()?)?.primary.clone();
    let source = primary_of(from).expect("the source shard's primary");
    let target = primary_of(intent.to_shard).expect("the target shard's primary");
    // The target, new, already owns a slot (it took one alone before any
    // batch of keys), and holds keys of the slot it imports: the keys a
    // slotless primary would lose when killed, since the cluster elects a
    // replica only for a primary that owns slots.
    let mut t = connect_pod(&client, &ns.name, &target, &password)
        .await
        .expect("connect to the target primary");
    let owned: u32 = cluster::nodes(&mut t)
        .await
        .expect("CLUSTER NODES")
        .iter()
        .filter(|k| k.myself)
        .map(|k| k.slot_count())
        .sum();
    let importing: Vec<u16> = reshard::open_slots_of(&mut t)
        .await
        .expect("open slots")
        .iter()
        .filter_map(|o| match o {
            reshard::OpenSlot::Importing { slot, .. } => Some(*slot),
            reshard::OpenSlot::Migrating { .. } => None,
        })
        .collect();
    let mut held = 0;
    for slot in &importing {
        held += reshard::keys_in_slot(&mut t, *slot).await.expect("keys");
    }
    drop(t);
    assert!(
        owned >= 1 && held >= 1,
        "the target {target} owns {owned} slots and holds {held} keys of its importing slots {importing:?}"
    );
    println!(
        "{target} (new shard {}) owns {owned} slot(s) and holds {held} keys of slot(s) {importing:?} it imports",
        intent.to_shard
    );
    // Both primaries of the move killed while the slot is open, one after
    // the other (two of four primaries down at once leave no majority to
    // elect a replica): each one's replica takes over (proven before the
    // next kill and before the next operator starts).
    for pod in [&source, &target] {
        let mut n = connect_pod(&client, &ns.name, pod, &password)
            .await
            .expect("connect to a primary of the move");
        let pid = info_u64(&mut n, "server", "process_id").await;
        drop(n);
        kill_9(u32::try_from(pid).expect("pid"));
        let killed = Instant::now();
        took_over(&client, &ns.name, pod, &password).await;
        println!(
            "{:.1} s: kill -9 of {pod} mid-move (source shard {from}, target shard {}); its replica took over in {:.1} s",
            at.elapsed().as_secs_f64(),
            intent.to_shard,
            killed.elapsed().as_secs_f64()
        );
    }
    // While no operator runs, the user changes their mind: back to 3. The
    // next operator finishes the open slot toward shard 3 first (its keys
    // are split between the two), then empties shard 3 and removes it.
    apply_redis(&client, &ns.name, "cache", spec(3)).await;
    let api = redis_api(&client, &ns.name);
    // The next process stops right after the target took the owner (the
    // open slot finished toward shard 3's new primary, the source not yet
    // told): proven by the target's own view of the recorded slot.
    let mut owner = spawn_operator(
        &client,
        armed(&opts, "op-reshard-owner", "reshard-after-owner"),
    )
    .await;
    wait_failpoint(&mut owner, READY).await;
    let r = api.get("cache").await.expect("redis");
    let finishing = r
        .status
        .as_ref()
        .and_then(|s| s.resharding.as_ref())
        .and_then(|x| x.current.clone())
        .expect("the finishing move is recorded");
    let slots = cluster::parse_ranges(&finishing.slots).expect("the recorded slots");
    // Shard 3's primary now: the target's replica, which took over.
    let new_target = partner(&target);
    let mut t = connect_pod(&client, &ns.name, &new_target, &password)
        .await
        .expect("connect to shard 3's primary");
    let mine: Vec<cluster::SlotRange> = cluster::nodes(&mut t)
        .await
        .expect("CLUSTER NODES")
        .into_iter()
        .filter(|k| k.myself)
        .flat_map(|k| k.slots)
        .collect();
    drop(t);
    assert!(
        finishing.to_shard == intent.to_shard
            && slots
                .iter()
                .flat_map(|r| r.start..=r.end)
                .any(|x| mine.iter().any(|m| m.contains(x))),
        "stopped after the owner step, yet {new_target} owns {mine:?}, not the recorded {finishing:?}"
    );
    println!(
        "{:.1} s: operator stopped after {new_target} took slot {} (source not told yet)",
        at.elapsed().as_secs_f64(),
        finishing.slots
    );
    // The next one stops right after opening the next slot (importing and
    // migrating set, no key sent).
    let mut open_op = spawn_operator(
        &client,
        armed(&opts, "op-reshard-open", "reshard-after-open"),
    )
    .await;
    wait_failpoint(&mut open_op, READY).await;
    let open = open_anywhere(&endpoints(&client, &ns.name, 4).await, &copts).await;
    assert!(
        open.iter().any(|o| o.contains("Migrating"))
            && open.iter().any(|o| o.contains("Importing")),
        "stopped after opening a slot, yet none is open: {open:?}"
    );
    println!(
        "{:.1} s: operator stopped after opening a slot: {open:?}",
        at.elapsed().as_secs_f64()
    );
    let _next = spawn_operator(&client, opts.named("op-reshard-next")).await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let r = wait_for("back to 3 shards, shard 3 removed", READY, || async {
        let r = api.get("cache").await.ok()?;
        let known = r.status.as_ref()?.cluster.as_ref()?.known_nodes;
        let gone = sts.get_opt("cache-s3").await.ok()?.is_none();
        (resharding_done(&r, 3) && known == 6 && gone).then_some(r)
    })
    .await;
    let out = r.status.clone().expect("status");
    println!(
        "{:.1} s: the open slot finished, shard 3 emptied, removed and forgotten {:.1} s after the first spec change",
        at.elapsed().as_secs_f64(),
        asked.elapsed().as_secs_f64()
    );
    let eps = endpoints(&client, &ns.name, 3).await;
    assert_eq!(open_anywhere(&eps, &copts).await, Vec::<String>::new());
    // The fault happened: the killed primary now follows its replica.
    let now = &out.shards[usize::try_from(from).expect("shard")];
    assert_ne!(now.primary.as_deref(), Some(source.as_str()), "{now:?}");
    assert_eq!(now.replicas, vec![source.clone()], "{now:?}");
    for (i, s) in out.shards.iter().enumerate() {
        assert_eq!(
            s.slots.as_deref(),
            Some(spread(3)[i].to_string().as_str()),
            "shard {i}"
        );
    }

    // 3 → N (4; `REDPILOT_RESHARD_TO` in `make bench-reshard`) under the
    // load, nothing stopped.
    let grow = i32::try_from(env_or("REDPILOT_RESHARD_TO", 4)).expect("shards");
    let n = usize::try_from(grow).expect("shards");
    // The faults above are over: every node answers again before the
    // clients' error count is taken, and none may be added while slots
    // move with nothing stopped.
    endpoints_answer(&endpoints(&client, &ns.name, 3).await, &copts).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failures_before = load.failures();
    let asked = Instant::now();
    apply_redis(&client, &ns.name, "cache", spec(grow)).await;
    let r = wait_resharding_done(&client, &ns.name, "cache", grow, |r| {
        resharding_done(r, grow)
    })
    .await;
    let grew = asked.elapsed();
    assert_eq!(
        load.failures() - failures_before,
        0,
        "client errors while slots moved from 3 to {grow} shards with nothing stopped (the \
         test's last errors: {:?})",
        LAST_ERRORS.lock().map(|v| v.clone()).unwrap_or_default()
    );
    let out = r.status.clone().expect("status");
    let rs = out.resharding.clone().expect("status.resharding");
    println!(
        "3 → {grow} shards: {} slots, {} keys moved ({} path) in {:.1} s from the spec change",
        rs.slots_moved,
        rs.keys_moved,
        rs.path,
        grew.as_secs_f64()
    );
    let expected: i64 = (3..n).map(|i| i64::from(reshard::even_count(i, n))).sum();
    assert_eq!(rs.path, "Classic");
    assert_eq!(
        (rs.slots_moved, rs.slots_total),
        (expected, expected),
        "{rs:?}"
    );
    assert!(rs.current.is_none(), "{rs:?}");
    assert!(rs.keys_moved > 0, "{rs:?}");
    for (i, s) in out.shards.iter().enumerate() {
        let have: u32 = cluster::parse_ranges(s.slots.as_deref().unwrap_or(""))
            .unwrap_or_default()
            .iter()
            .map(|r| r.count())
            .sum();
        assert_eq!(have, reshard::even_count(i, n), "shard {i}: {s:?}");
        assert_eq!(s.replicas.len(), 1, "shard {i}: {s:?}");
    }
    let eps = endpoints(&client, &ns.name, grow).await;
    assert_eq!(open_anywhere(&eps, &copts).await, Vec::<String>::new());

    // N → 3: the shards past 3 emptied, then removed; while slots move,
    // the primary taking them is `kill -9`ed (a real fault, at whatever
    // step the operator is in).
    let asked = Instant::now();
    apply_redis(&client, &ns.name, "cache", spec(3)).await;
    let intent = wait_for("slots moving to 3 shards", READY, || async {
        let r = api.get("cache").await.ok()?;
        let x = r.status?.resharding?;
        (x.to_shards == 3 && x.phase == ReshardingPhase::Moving && x.slots_moved > 0)
            .then_some(x.current)
            .flatten()
    })
    .await;
    let st = api
        .get("cache")
        .await
        .expect("redis")
        .status
        .expect("status");
    let target = st.shards[usize::try_from(intent.to_shard).expect("shard")]
        .primary
        .clone()
        .expect("the target shard's primary");
    let mut n = connect_pod(&client, &ns.name, &target, &password)
        .await
        .expect("connect to the target primary");
    let pid = info_u64(&mut n, "server", "process_id").await;
    drop(n);
    kill_9(u32::try_from(pid).expect("pid"));
    let killed = Instant::now();
    took_over(&client, &ns.name, &target, &password).await;
    println!(
        "{:.1} s: kill -9 of {target} (target shard {}) while moving slots {}; its replica took over in {:.1} s",
        at.elapsed().as_secs_f64(),
        intent.to_shard,
        intent.slots,
        killed.elapsed().as_secs_f64()
    );
    let r = wait_resharding_done(&client, &ns.name, "cache", 3, |r| {
        let known = r
            .status
            .as_ref()
            .and_then(|s| s.cluster.as_ref())
            .map(|c| c.known_nodes);
        resharding_done(r, 3) && known == Some(6)
    })
    .await;
    let shrank = asked.elapsed();
    let rs = r
        .status
        .as_ref()
        .and_then(|s| s.resharding.clone())
        .expect("status.resharding");
    println!(
        "{grow} → 3 shards: {} slots, {} keys moved in {:.1} s, the shards past 3 removed and forgotten",
        rs.slots_moved,
        rs.keys_moved,
        shrank.as_secs_f64()
    );
    for i in 3..grow {
        assert!(
            sts.get_opt(&format!("cache-s{i}"))
                .await
                .expect("get")
                .is_none(),
            "shard {i}'s StatefulSet is gone"
        );
    }
    let mib = (tags * size * 4) as f64 / (1024.0 * 1024.0);
    println!(
        "classic path: {:.1} MiB/s and {:.0} slots/s growing, {:.1} MiB/s shrinking (values only, spec change to done)",
        mib * (expected as f64 / 16384.0) / grew.as_secs_f64(),
        expected as f64 / grew.as_secs_f64(),
        mib * (expected as f64 / 16384.0) / shrank.as_secs_f64(),
    );
    let events = recent_events(&client, &ns.name, 80).await;
    for reason in ["ReshardingStarted", "ReshardingDone", "ShardRemoved"] {
        assert!(events.contains(reason), "no {reason} event: {events}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    load.finish(&seed, &copts).await;
    let eps = endpoints(&client, &ns.name, 3).await;
    assert_eq!(open_anywhere(&eps, &copts).await, Vec::<String>::new());
    let mut check = Client::new(seed.clone(), copts.clone());
    for k in &pinned {
        let v: Option<String> = check
            .run(k, redis::cmd("GET").arg(k))
            .await
            .unwrap_or_else(|e| panic!("reading {k}: {e}"));
        assert_eq!(
            v.as_deref(),
            Some(k.as_str()),
            "key {k} of slot {FIRST_MOVED_SLOT}"
        );
    }
    for (pod, ep) in &eps {
        let mut n = Node::connect(ep, &copts).await.expect("connect");
        let nodes = cluster::nodes(&mut n).await.expect("CLUSTER NODES");
        assert_eq!(nodes.len(), 6, "{pod} knows {nodes:?}");
    }
}

/// Writes `{f<i>}` keys of `size` bytes from `from` on, until the
/// Redis's shard autopilot raised `spec.shards` (or `cap` keys); returns
/// the keys written and the OOM replies met (each write is sent once).
async fn fill_until_added(
    client: &mut Client,
    api: &Api<Redis>,
    size: usize,
    cap: usize,
) -> (usize, u64) {
    let value = "m".repeat(size);
    let mut oom = 0;
    for i in 0..cap {
        let key = format!("{{f{i}}}");
        if let Err(e) = client
            .run::<redis::Value>(&key, redis::cmd("SET").arg(&key).arg(&value))
            .await
            && e.starts_with("OOM")
        {
            oom += 1;
        }
        if i % 500 == 499 {
            let r = api.get("cache").await.expect("redis");
            if r.spec.shards.unwrap_or(3) > 3 {
                return (i + 1, oom);
            }
            // Paced: the autopilot sees the level crossed before the
            // shards fill up.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    (cap, oom)
}

/// Writes `{f<i>}` keys of `size` bytes for `i` in `range`, paced at
/// `rates.0` bytes a second, and at `rates.1` once `faster` is set;
/// returns the OOM replies met (each write is sent once; a failure other
/// than OOM fails the test).
async fn fill_paced(
    client: &mut Client,
    range: std::ops::Range<usize>,
    size: usize,
    rates: (f64, f64),
    faster: &AtomicBool,
) -> u64 {
    let value = "m".repeat(size);
    let t = Instant::now();
    let mut due = Duration::ZERO;
    let mut oom = 0;
    for i in range {
        let key = format!("{{f{i}}}");
        // A connection the server closed while the filler sat idle fails
        // once (the client opens another); the same SET again is harmless.
        let mut tries = 0;
        loop {
            match client
                .run::<redis::Value>(&key, redis::cmd("SET").arg(&key).arg(&value))
                .await
            {
                Ok(_) => break,
                Err(e) if e.starts_with("OOM") => {
                    oom += 1;
                    break;
                }
                Err(e) if tries < 3 => {
                    tries += 1;
                    println!("SET {key}: {e}; once more");
                }
                Err(e) => panic!("SET {key}: {e}"),
            }
        }
        let rate = if faster.load(Ordering::Relaxed) {
            rates.1
        } else {
            rates.0
        };
        due += Duration::from_secs_f64(size as f64 / rate);
        if let Some(ahead) = due.checked_sub(t.elapsed()) {
            tokio::time::sleep(ahead).await;
        }
    }
    oom
}

/// The shard autopilot on Valkey 9.1 (the atomic path): a fill past
/// `scaleUpPercent` of `maxmemory` adds shards (3 → 4 or 5), with no OOM
/// reply to the writer; the operator is stopped right after it records
/// the first move (before the first command) and the next one moves on,
/// while the fill goes on (about 1 MiB/s) through the resharding until the
/// data is more than 3 shards can hold, still with no OOM reply.
/// Then the fill is deleted and, after the cooldown, the autopilot takes
/// the shard count back to `minShards` one shard at a time. Four writers
/// and four readers run throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_autopilot_adds_shards_atomically_on_a_fill_and_removes_them_after_a_drain() {
    let (tags, size) = (500, 64);
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-shard-autopilot", &[]).await;
    let (mut first, opts) =
        stopping_at(&client, &ns.name, "op-shards", "reshard-after-intent").await;
    // maxmemory 48 MiB per node; shards added at 50 % of it.
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "9.1",
               "resources": {"limits": {"memory": "64Mi"}},
               "autopilot": {"shards": {"minShards": 3, "maxShards": 5, "scaleUpPercent": 50,
                                        "scaleDownPercent": 15, "cooldownSeconds": 30}}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379);
    fill(&mut Client::new(seed.clone(), copts.clone()), tags, size).await;
    // 50 new keys a second per writer: their memory (about 1 MiB a shard by
    // the end) stays far below the 15 % the drain waits for.
    let load = Load::start(&seed, &copts, tags, size, Duration::from_millis(20));

    // The fill: 4 KiB values until the autopilot adds shards.
    let api = redis_api(&client, &ns.name);
    let t = Instant::now();
    let mut filler = Client::new(seed.clone(), copts.clone());
    let (written, oom) = fill_until_added(&mut filler, &api, 4096, 40_000).await;
    let r = api.get("cache").await.expect("redis");
    let added_to = r.spec.shards.unwrap_or(3);
    let decision = r
        .status
        .as_ref()
        .and_then(|s| s.autopilot.as_ref()?.shards.as_ref()?.last_decision.clone());
    println!(
        "fill of {written} keys of 4 KiB: spec.shards 3 → {added_to} after {:.1} s ({decision:?})",
        t.elapsed().as_secs_f64()
    );
    assert!((4..=5).contains(&added_to), "{decision:?}");
    assert_eq!(
        decision.as_ref().map(|d| d.action.as_str()),
        Some("AddShards")
    );
    // Decided soon after the level was crossed (the monitor samples every
    // shard primary), not by a periodic pass with the shards nearly full.
    let level: u32 = decision
        .as_ref()
        .and_then(|d| d.reason.strip_prefix("the fullest shard uses "))
        .and_then(|r| r.split('%').next())
        .and_then(|n| n.parse().ok())
        .expect("the decision names the fullest shard's use");
    assert!(
        level < 70,
        "the autopilot decided at {level}% of maxmemory (scale up at 50%): {decision:?}"
    );
    wait_failpoint(&mut first, READY).await;
    let intent = api
        .get("cache")
        .await
        .expect("redis")
        .status
        .and_then(|s| s.resharding?.current)
        .expect("the intent is recorded first");
    println!("operator stopped after recording {intent:?}");
    let _next = spawn_operator(&client, opts.named("op-shards-next")).await;
    // On through the resharding (about 1 MiB/s; 4 MiB/s once it is done),
    // past what 3 shards hold (3 x 48 MiB of maxmemory): only the added
    // shards leave room for it.
    let past_three = ((3 * 48) << 20) * 21 / 20 / 4096;
    let t_more = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let watch = tokio::spawn({
        let (api, done) = (api.clone(), done.clone());
        async move {
            while !done.load(Ordering::Relaxed) {
                if let Ok(r) = api.get("cache").await
                    && r.spec
                        .shards
                        .is_some_and(|n| n > 3 && resharding_done(&r, n))
                {
                    done.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    let rates = (f64::from(1 << 20), f64::from(4 << 20));
    let more_oom = fill_paced(&mut filler, written..past_three, 4096, rates, &done).await;
    let done_during_fill = done.load(Ordering::Relaxed);
    watch.abort();
    println!(
        "filled on to {past_three} keys of 4 KiB ({} MiB) in {:.1} s: {more_oom} OOM replies; resharding done before the fill's end: {done_during_fill}",
        (past_three * 4096) >> 20,
        t_more.elapsed().as_secs_f64()
    );
    // The keys there were when the moves began (the fill then goes on).
    let at_decision = written;
    let written = past_three;
    let r = wait_for("the autopilot's resharding done", READY, || async {
        let r = api.get("cache").await.ok()?;
        let now = r.spec.shards?;
        resharding_done(&r, now).then_some(r)
    })
    .await;
    let added_to = r.spec.shards.unwrap_or(3);
    assert!(added_to >= 4, "{added_to}");
    let rs = r
        .status
        .as_ref()
        .and_then(|s| s.resharding.clone())
        .expect("status.resharding");
    println!(
        "3 → {added_to} shards: {} slots and {} keys moved ({} path) {:.1} s after the fill started",
        rs.slots_moved,
        rs.keys_moved,
        rs.path,
        t.elapsed().as_secs_f64()
    );
    assert_eq!(rs.path, "Atomic");
    // The atomic path counts the keys its slots held: the moved slots'
    // share of the keys there were when the moves began (the `{f<i>}`
    // keys' hash tags spread them evenly over the slots), less a margin. The paced fill goes on during the moves, so more may count.
    let share = at_decision as f64 * rs.slots_moved as f64 / 16_384.0;
    assert!(
        rs.keys_moved as f64 >= share * 0.75,
        "{} keys counted as moved; {at_decision} keys when the moves began, {:.0} in the moved slots: {rs:?}",
        rs.keys_moved,
        share
    );
    let n = usize::try_from(added_to).expect("shards");
    for (i, s) in r.status.as_ref().expect("status").shards.iter().enumerate() {
        let have: u32 = cluster::parse_ranges(s.slots.as_deref().unwrap_or(""))
            .unwrap_or_default()
            .iter()
            .map(|r| r.count())
            .sum();
        assert_eq!(have, reshard::even_count(i, n), "shard {i}: {s:?}");
    }
    assert_eq!(oom, 0, "the writer met {oom} OOM replies");
    assert_eq!(
        more_oom, 0,
        "the writer met {more_oom} OOM replies filling through the resharding"
    );
    // The data is more than 3 shards hold: what the servers report.
    let mut used = 0u64;
    for s in &r.status.as_ref().expect("status").shards {
        let p = s.primary.clone().expect("primary");
        let ep = Endpoint::new(pod_ip(&client, &ns.name, &p).await, 6379);
        let mut n = Node::connect(&ep, &copts).await.expect("connect");
        used += n
            .info_section("memory")
            .await
            .expect("INFO memory")
            .memory
            .used_memory
            .unwrap_or(0);
    }
    println!("{} MiB used over {added_to} shards", used >> 20);
    assert!(
        used > (3 * 48) << 20,
        "{used} bytes: no more than 3 shards hold"
    );

    // The drain: the fill deleted (four clients side by side); back to
    // minShards after the cooldown. Nothing pokes the operator: the
    // monitor sees the shards' data fall under scaleDownPercent.
    let t = Instant::now();
    let mut deleting = Vec::new();
    for part in 0..4 {
        let mut c = Client::new(seed.clone(), copts.clone());
        deleting.push(tokio::spawn(async move {
            for i in (part..written).step_by(4) {
                let key = format!("{{f{i}}}");
                // A connection the server closed meanwhile fails once (the
                // client opens another on the next call); DEL is idempotent
                // and counts nothing here.
                let mut tries = 0;
                loop {
                    match c
                        .run::<redis::Value>(&key, redis::cmd("DEL").arg(&key))
                        .await
                    {
                        Ok(_) => break,
                        Err(e) if tries < 3 => {
                            tries += 1;
                            println!("DEL {key}: {e}; once more");
                        }
                        Err(e) => panic!("DEL {key}: {e}"),
                    }
                }
            }
        }));
    }
    for d in deleting {
        d.await.expect("a deleting client");
    }
    println!(
        "deleted {written} keys in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let r = wait_for(
        "the autopilot back at 3 shards",
        Duration::from_secs(300),
        || async {
            let r = api.get("cache").await.ok()?;
            let known = r.status.as_ref()?.cluster.as_ref()?.known_nodes;
            (r.spec.shards == Some(3) && resharding_done(&r, 3) && known == 6).then_some(r)
        },
    )
    .await;
    let decision = r
        .status
        .as_ref()
        .and_then(|s| s.autopilot.as_ref()?.shards.as_ref()?.last_decision.clone())
        .expect("a decision");
    println!(
        "drained: {added_to} → 3 shards {:.1} s after the delete ({})",
        t.elapsed().as_secs_f64(),
        decision.reason
    );
    assert_eq!(decision.action, "RemoveShard");
    let events = recent_events(&client, &ns.name, 120).await;
    for reason in [
        "ShardsAdded",
        "ShardsRemoved",
        "ReshardingDone",
        "ShardRemoved",
    ] {
        assert!(events.contains(reason), "no {reason} event: {events}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    load.finish(&seed, &copts).await;
}

/// The shard autopilot removes at most one shard per cooldown, even when
/// the operator stops between recording a removal and changing
/// `spec.shards`: the record is written first, so the next operator finds
/// the cooldown running and nothing changed; it removes the shard once the
/// cooldown has passed, and the next one a whole cooldown later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_removal_stopped_between_its_record_and_spec_keeps_the_cooldown() {
    const COOLDOWN: i64 = 30;
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-shard-cooldown", &[]).await;
    let (mut first, opts) = stopping_at(&client, &ns.name, "op-cool", "shards-after-record").await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 5, "instances": 1, "engine": "Valkey", "version": "8.1",
               "resources": {"limits": {"memory": "64Mi"}},
               "autopilot": {"shards": {"minShards": 3, "maxShards": 5, "scaleUpPercent": 50,
                                        "scaleDownPercent": 15, "cooldownSeconds": COOLDOWN}}}),
    )
    .await;
    let api = redis_api(&client, &ns.name);
    // Empty, the five shards stay below 15 % for a cooldown: the first
    // operator records the removal of one and stops before spec.shards.
    wait_failpoint(&mut first, READY + Duration::from_secs(60)).await;
    let r = api.get("cache").await.expect("redis");
    let rec = r
        .status
        .as_ref()
        .and_then(|s| s.autopilot.as_ref()?.shards.clone())
        .expect("status.autopilot.shards");
    let decision = rec.last_decision.clone().expect("the decision is recorded");
    assert_eq!(
        (decision.action.as_str(), decision.from, decision.to),
        ("RemoveShard", 5, 4),
        "{decision:?}"
    );
    assert_eq!(
        r.spec.shards,
        Some(5),
        "the operator stopped between the record and spec.shards: {rec:?}"
    );
    let parse = |t: &str| {
        chrono::DateTime::parse_from_rfc3339(t)
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .with_timezone(&chrono::Utc)
    };
    let recorded = parse(rec.last_change.as_deref().expect("lastChange"));
    println!("stopped after recording {decision:?} at {recorded}");

    // The next operator: every change of spec.shards, as seen.
    let _next = spawn_operator(&client, opts.named("op-cool-next")).await;
    let mut changes: Vec<(i32, chrono::DateTime<chrono::Utc>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = 5;
    loop {
        assert!(
            Instant::now() < deadline,
            "not back at 3 shards within 300 s; changes {changes:?}"
        );
        let r = api.get("cache").await.expect("redis");
        let shards = r.spec.shards.unwrap_or(0);
        if shards != last {
            changes.push((shards, chrono::Utc::now()));
            last = shards;
        }
        if shards == 3 && resharding_done(&r, 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("spec.shards changes after the record: {changes:?}");
    assert_eq!(
        changes.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![4, 3],
        "one shard at a time"
    );
    // The record's time is whole seconds and the changes are seen within
    // a quarter of a second: a second of slack each way.
    let gap = |a: chrono::DateTime<chrono::Utc>, b: chrono::DateTime<chrono::Utc>| {
        (b - a).num_milliseconds() as f64 / 1000.0
    };
    let first_gap = gap(recorded, changes[0].1);
    let second_gap = gap(changes[0].1, changes[1].1);
    println!(
        "5 → 4 {first_gap:.1} s after the recorded decision, 4 → 3 {second_gap:.1} s after that (cooldown {COOLDOWN} s)"
    );
    assert!(
        first_gap >= (COOLDOWN - 1) as f64,
        "the first shard went {first_gap:.1} s after its recorded decision, inside the {COOLDOWN} s cooldown"
    );
    assert!(
        second_gap >= (COOLDOWN - 1) as f64,
        "the second shard went {second_gap:.1} s after the first, inside the {COOLDOWN} s cooldown"
    );
}

/// At `maxShards` and still short of room the shard autopilot adds nothing
/// and says so: the decision `AtMaximum` (with the count it wanted), the
/// event `ShardsAtMaximum`, `status.autopilot.shards.atMaximum` and the
/// metric `redpilot_redis_shards_at_maximum` 1; all of it clears once the
/// shards have room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_maximum_the_shard_autopilot_adds_nothing_and_says_so() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-shards-max", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    // maxmemory 48 MiB per node; at 50 % of it 3 shards want more.
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 1, "engine": "Valkey", "version": "8.1",
               "resources": {"limits": {"memory": "64Mi"}},
               "autopilot": {"shards": {"minShards": 3, "maxShards": 3, "scaleUpPercent": 50,
                                        "scaleDownPercent": 15, "cooldownSeconds": 30}}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379);
    let api = redis_api(&client, &ns.name);
    let at_max = |r: &Redis| {
        r.status
            .as_ref()
            .and_then(|s| s.autopilot.as_ref()?.shards.as_ref())
            .is_some_and(|s| s.at_maximum)
    };

    // 4 KiB values, paced, until the status says it is at its maximum.
    let mut filler = Client::new(seed, copts);
    let value = "m".repeat(4096);
    let t = Instant::now();
    let mut written = 0;
    let mut oom = 0;
    while !at_max(&api.get("cache").await.expect("redis")) {
        assert!(
            written < 36_000,
            "{written} keys of 4 KiB written (past what 3 shards hold) and not at the maximum: {}",
            recent_events(&client, &ns.name, 20).await
        );
        for i in written..written + 500 {
            let key = format!("{{f{i}}}");
            if let Err(e) = filler
                .run::<redis::Value>(&key, redis::cmd("SET").arg(&key).arg(&value))
                .await
            {
                assert!(e.starts_with("OOM"), "{key}: {e}");
                oom += 1;
            }
        }
        written += 500;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = api.get("cache").await.expect("redis");
    let decision = r
        .status
        .as_ref()
        .and_then(|s| s.autopilot.as_ref()?.shards.as_ref()?.last_decision.clone())
        .expect("a decision");
    println!(
        "{written} keys of 4 KiB in {:.1} s: {decision:?}",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(oom, 0, "writes refused before the decision");
    assert_eq!(
        (decision.action.as_str(), decision.from),
        ("AtMaximum", 3),
        "{decision:?}"
    );
    assert!(decision.to > 3, "the count it wanted: {decision:?}");
    assert!(
        decision.reason.contains("maxShards is 3"),
        "{}",
        decision.reason
    );
    // Nothing added, now or a few passes later.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let r = api.get("cache").await.expect("redis");
    assert_eq!(r.spec.shards, Some(3), "spec.shards stays at maxShards");
    assert!(r.status.as_ref().is_some_and(|s| s.resharding.is_none()));
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("ShardsAtMaximum"), "{events}");
    assert!(!events.contains("ShardsAdded"), "{events}");
    let series = format!(
        "redpilot_redis_shards_at_maximum{{namespace=\"{}\",redis=\"cache\"}} 1",
        ns.name
    );
    let page = op.metrics().await.expect("metrics");
    assert!(
        page.contains(&series),
        "no {series} in the operator's metrics"
    );

    // Room again: every key deleted, and it clears.
    for s in 0..3 {
        let mut n = connect_pod(&client, &ns.name, &format!("cache-s{s}-0"), &password)
            .await
            .expect("connect");
        let _: () = n
            .query("FLUSHALL", &redis::cmd("FLUSHALL"))
            .await
            .expect("FLUSHALL");
    }
    let t = Instant::now();
    wait_for("atMaximum cleared", READY, || async {
        let r = api.get("cache").await.ok()?;
        (!at_max(&r)).then_some(())
    })
    .await;
    // The series is computed from the operator's watch cache, which sees
    // the status write a moment after the API server answers with it.
    let cleared = format!("{} 0", series.trim_end_matches(" 1"));
    let mut page = String::new();
    let followed = Instant::now() + Duration::from_secs(10);
    while Instant::now() < followed {
        page = op.metrics().await.expect("metrics");
        if page.lines().any(|l| l == cleared) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        page.lines().any(|l| l == cleared),
        "the metric follows the status within 10 s: {}",
        page.lines()
            .filter(|l| l.contains("shards_at_maximum"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!(
        "cleared {:.1} s after the delete",
        t.elapsed().as_secs_f64()
    );
}

/// Resharding's bounds, met at once: a restart-only setting and a fourth
/// shard asked for in one change. The resharding is `Paused`, saying the
/// ordered restart runs, and moves no slot while any pod of the old
/// template is left; then it moves and ends `Done`. Back to three shards
/// with a replica's server stopped (`SIGSTOP`): `Paused`, naming the pod,
/// no slot moved, until it runs again. Every key stays whole. Valkey 9.1
/// (the atomic path: the bounds are checked before any move, whichever the
/// path; the classic path's moves of 4,096 nearly empty slots took 40 to
/// 150 s of this test on a loaded machine). A move is recorded in
/// `status.resharding.current` before its first command, so "no move
/// begun" is checked there as well as in the count of slots moved, which
/// an atomic move reports when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_waits_for_an_ordered_restart_and_a_stopped_server() {
    use support::operator::{patch_redis, pod_uids, server_pid, signal};
    let (tags, size) = (300, 64);
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-reshard-bounds", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "9.1"}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379);
    fill(&mut Client::new(seed, copts.clone()), tags, size).await;
    let api = redis_api(&client, &ns.name);
    let before = pod_uids(&client, &ns.name, "cache").await;
    assert_eq!(before.len(), 6, "{before:?}");

    // 1. A restart and a fourth shard at once.
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"shards": 4, "config": {"tcp-backlog": "600"}}}),
    )
    .await;
    let t = Instant::now();
    let mut paused = None;
    let mut restarted_at = None;
    loop {
        let r = api.get("cache").await.expect("redis");
        let now = pod_uids(&client, &ns.name, "cache").await;
        let old: Vec<&String> = before
            .iter()
            .filter(|(p, uid)| now.get(*p) == Some(*uid))
            .map(|(p, _)| p)
            .collect();
        if old.is_empty() && restarted_at.is_none() {
            restarted_at = Some(t.elapsed());
        }
        if let Some(rs) = r.status.as_ref().and_then(|s| s.resharding.as_ref()) {
            assert!(
                (rs.slots_moved == 0 && rs.current.is_none()) || old.is_empty(),
                "slots moved ({}) or a move begun while {old:?} ran the old template: {rs:?}",
                rs.slots_moved
            );
            if rs.phase == ReshardingPhase::Paused
                && let Some(m) = rs.message.as_deref()
                && m.contains("an ordered restart runs")
            {
                paused.get_or_insert_with(|| m.to_string());
            }
        }
        if resharding_done(&r, 4) && old.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < READY,
            "the restart and the resharding within {READY:?}: {:?}\n{}",
            r.status.as_ref().map(|s| (&s.resharding, &s.conditions)),
            recent_events(&client, &ns.name, 20).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let paused = paused.expect("the resharding was seen paused for the restart");
    println!(
        "restart + 4th shard: paused ({paused}); every old pod restarted at {:.1} s, Done at {:.1} s",
        restarted_at.unwrap_or_default().as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    let mut reader = Client::new(
        Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379),
        copts.clone(),
    );
    for t in 0..tags {
        assert_eq!(whole(&mut reader, t, size).await, Some(true), "tag {t}");
    }

    // 2. Back to three shards with a replica's server stopped.
    let r = api.get("cache").await.expect("redis");
    let replica = r.status.as_ref().expect("status").shards[0].replicas[0].clone();
    let mut n = connect_pod(&client, &ns.name, &replica, &password)
        .await
        .expect("connect");
    let pid = server_pid(&mut n).await;
    drop(n);
    signal(pid, "-STOP");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_for(
        "the stopped replica not ready",
        Duration::from_secs(60),
        || async {
            let p = pods.get(&replica).await.ok()?;
            let ready = p
                .status?
                .conditions?
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (!ready).then_some(())
        },
    )
    .await;
    patch_redis(&client, &ns.name, "cache", json!({"spec": {"shards": 3}})).await;
    let msg = wait_for(
        "the resharding paused for the stopped replica",
        Duration::from_secs(60),
        || async {
            let r = api.get("cache").await.ok()?;
            let rs = r.status?.resharding?;
            (rs.to_shards == 3 && rs.phase == ReshardingPhase::Paused)
                .then_some(rs.message.unwrap_or_default())
        },
    )
    .await;
    println!("4 → 3 with {replica} stopped: paused ({msg})");
    assert!(msg.contains(&replica), "{msg}");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let rs = api
        .get("cache")
        .await
        .expect("redis")
        .status
        .and_then(|s| s.resharding)
        .expect("resharding");
    assert_eq!(
        (rs.phase, rs.slots_moved, rs.current.is_none()),
        (ReshardingPhase::Paused, 0, true),
        "nothing moves while {replica} is stopped: {rs:?}"
    );
    assert_eq!(rs.path, "Atomic", "{rs:?}");
    signal(pid, "-CONT");
    let t = Instant::now();
    wait_for("4 → 3 done once it runs again", READY, || async {
        let r = api.get("cache").await.ok()?;
        resharding_done(&r, 3).then_some(())
    })
    .await;
    println!(
        "4 → 3 done {:.1} s after the replica ran again",
        t.elapsed().as_secs_f64()
    );
    let mut reader = Client::new(
        Endpoint::new(pod_ip(&client, &ns.name, "cache-s0-0").await, 6379),
        copts,
    );
    for t in 0..tags {
        assert_eq!(whole(&mut reader, t, size).await, Some(true), "tag {t}");
    }
}

/// `cluster_slots_assigned` as the node sees it.
async fn slots_assigned(n: &mut Node) -> u64 {
    let info: String = n
        .query("CLUSTER INFO", redis::cmd("CLUSTER").arg("INFO"))
        .await
        .expect("CLUSTER INFO");
    info.lines()
        .find_map(|l| l.trim().strip_prefix("cluster_slots_assigned:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("cluster_slots_assigned")
}

/// A classic move whose source primary is `kill -9`ed while a slot is open
/// (its replica takes over) leaves the target importing a slot whose owner
/// it can no longer learn: a node importing a slot ignores news of that
/// slot's owner, and the old owner, now a replica, owns nothing, so the
/// target sees the slot served by no one and the cluster never looks whole
/// again. Found by the composition harness (seed 204: a Redis 7.0 Cluster
/// whose shard 0 primary was killed mid-move stayed "waiting for the
/// cluster to settle" for good). The next operator finishes the slot toward
/// the source's new primary, and the resharding ends, losing no
/// acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_move_whose_source_fails_over_with_a_slot_open_finishes() {
    let (tags, size) = (500, 64);
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-reshard-src", &[]).await;
    let (mut first, opts) =
        stopping_at(&client, &ns.name, "op-reshard-src", "reshard-after-open").await;
    // With volumes: the killed primary comes back with its node ID, as a
    // replica (without one it would come back as a new node, and the
    // target would go on naming the failed old ID as the slot's owner).
    support::operator::sized_class(&client).await;
    let spec = |shards: i32| {
        json!({"mode": "Cluster", "shards": shards, "instances": 2, "engine": "Redis", "version": "7.0",
               "storage": {"size": "64Mi", "storageClassName": support::operator::SIZED_CLASS}})
    };
    apply_redis(&client, &ns.name, "cache", spec(3)).await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let copts = ConnectOptions::default()
        .with_password(password.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let seed = Endpoint::new(pod_ip(&client, &ns.name, "cache-s1-0").await, 6379);
    let mut filler = Client::new(seed.clone(), copts.clone());
    fill(&mut filler, tags, size).await;
    let load = Load::start(&seed, &copts, tags, size, Duration::from_millis(2));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 3 → 4: the operator stops right after opening a slot.
    apply_redis(&client, &ns.name, "cache", spec(4)).await;
    wait_failpoint(&mut first, READY).await;
    let api = redis_api(&client, &ns.name);
    let st = api
        .get("cache")
        .await
        .expect("redis")
        .status
        .expect("status");
    let intent = st
        .resharding
        .as_ref()
        .and_then(|x| x.current.clone())
        .expect("the move under way is recorded");
    let shard = |i: i32| st.shards.get(usize::try_from(i).ok()?)?.primary.clone();
    let source = shard(intent.from_shard).expect("the source's primary");
    let target = shard(intent.to_shard).expect("the target's primary");
    let open = open_anywhere(&endpoints(&client, &ns.name, 4).await, &copts).await;
    assert!(
        open.iter().any(|o| o.contains("Migrating"))
            && open
                .iter()
                .any(|o| o.starts_with(&format!("{target}: Importing"))),
        "the operator stopped after opening a slot, yet {target} imports none: {open:?}"
    );
    // The source's primary killed with the slot open; its replica takes over.
    let mut n = connect_pod(&client, &ns.name, &source, &password)
        .await
        .expect("connect to the source's primary");
    let pid = info_u64(&mut n, "server", "process_id").await;
    drop(n);
    kill_9(u32::try_from(pid).expect("pid"));
    took_over(&client, &ns.name, &source, &password).await;
    // An operator that stops once it has recorded the move that finishes
    // the open slot, before any command of it: by then it has made the old
    // primary a replica of the one that took over, and the target sees the
    // slot served by no one (the fault, proven here). Where the resharding
    // waited for the cluster to look whole first, it never got there.
    let mut repair = spawn_operator(
        &client,
        armed(&opts, "op-reshard-src-repair", "reshard-after-intent"),
    )
    .await;
    wait_failpoint(&mut repair, READY).await;
    let mut n = connect_pod(&client, &ns.name, &source, &password)
        .await
        .expect("connect to the old primary");
    let nodes = cluster::nodes(&mut n).await.expect("CLUSTER NODES");
    assert!(
        nodes.iter().any(|k| k.myself && !k.primary),
        "{source} is not a replica: {nodes:?}"
    );
    drop(n);
    let mut t = connect_pod(&client, &ns.name, &target, &password)
        .await
        .expect("connect to the target");
    let seen = slots_assigned(&mut t).await;
    drop(t);
    assert!(
        seen < u64::from(cluster::SLOTS),
        "{target} sees every slot assigned: the fault did not happen"
    );
    println!(
        "kill -9 of {source} with a slot open; {} took over; {target} sees {seen} slots assigned",
        partner(&source)
    );

    // The next operator finishes the slot and the resharding.
    let _next = spawn_operator(&client, opts.named("op-reshard-src-next")).await;
    let t = Instant::now();
    wait_for("the resharding to 4 shards done", READY, || async {
        let r = api.get("cache").await.ok()?;
        resharding_done(&r, 4).then_some(())
    })
    .await;
    println!(
        "resharding done {:.1} s after the next operator started",
        t.elapsed().as_secs_f64()
    );
    let eps = endpoints(&client, &ns.name, 4).await;
    assert_eq!(open_anywhere(&eps, &copts).await, Vec::<String>::new());
    for (pod, ep) in &eps {
        let mut n = Node::connect(ep, &copts)
            .await
            .unwrap_or_else(|e| panic!("{pod}: {e}"));
        assert_eq!(
            slots_assigned(&mut n).await,
            u64::from(cluster::SLOTS),
            "{pod} after the resharding"
        );
    }
    load.finish(&seed, &copts).await;
}
