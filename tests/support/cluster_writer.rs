//! A client of a Redis Cluster for the fault tests: one writer per shard
//! that follows the shard's primary through failovers and confirms each
//! write with `WAIT 1` (the `redis` crate's retries play no part: every
//! command is sent once on a plain connection and its outcome counted).
//! The including crate provides `crate::pace` (support/pace.rs).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redpilot::redis::cluster::{self, Member, SlotRange};
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use tokio::sync::Mutex;

/// A hash tag whose slot lies in `range`.
pub fn tag_in(range: &SlotRange, shard: usize) -> String {
    (0..)
        .map(|i| format!("s{shard}-{i}"))
        .find(|t| range.contains(cluster::key_slot(t.as_bytes())))
        .unwrap_or_default()
}

/// The node serving `slot` as primary now, as the first reachable member
/// sees it.
pub async fn primary_for(members: &[Member], opts: &ConnectOptions, slot: u16) -> Option<Endpoint> {
    for m in members {
        let Ok(mut n) = Node::connect(&m.endpoint, opts).await else {
            continue;
        };
        let Ok(nodes) = cluster::nodes(&mut n).await else {
            continue;
        };
        if let Some(p) = nodes
            .iter()
            .find(|k| k.primary && !k.fail && k.slots.iter().any(|r| r.contains(slot)))
        {
            return p.addr.clone();
        }
    }
    None
}

#[derive(Default)]
pub struct Tally {
    /// (key, acknowledged at) of writes `WAIT 1` confirmed.
    pub acked: Vec<(String, Instant)>,
    /// When each `SET` was answered OK (confirmed or not), and by which
    /// node.
    pub set_ok: Vec<(Instant, Endpoint)>,
    pub failed: u64,
}

/// Writes `{tag}:<n>` to whichever node serves the tag's slot, confirming
/// each with `WAIT 1 500`; on any error it finds the primary again (and
/// learns the cluster's current addresses from the node it asked). Once a
/// second it also learns them from the node it writes to, as a cluster
/// client refreshes its topology: a writer that kept one primary through a
/// roll would otherwise know only addresses the restarted pods gave up.
pub fn writer(
    members: Vec<Member>,
    ways: Vec<ConnectOptions>,
    tag: String,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let slot = cluster::key_slot(tag.as_bytes());
        let mut members = members;
        let mut conn: Option<Node> = None;
        let mut i = 0u64;
        let mut learned = Instant::now();
        let mut pace = crate::pace::pacer();
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            if let Some(node) = conn.as_mut()
                && learned.elapsed() >= Duration::from_secs(1)
            {
                learned = Instant::now();
                if let Ok(nodes) = cluster::nodes(node).await {
                    let bus = members.first().map_or(16379, |m| m.bus_port);
                    for k in nodes.iter().filter(|k| !k.fail && !k.handshake) {
                        if let Some(ep) = k.addr.clone()
                            && !members.iter().any(|m| m.endpoint == ep)
                        {
                            members.insert(
                                0,
                                Member {
                                    endpoint: ep,
                                    bus_port: k.bus_port.unwrap_or(bus),
                                },
                            );
                        }
                    }
                }
            }
            let Some(node) = conn.as_mut() else {
                if let Some((ep, mut known)) = discover_any(&members, &ways, slot).await {
                    conn = connect_any(&ep, &ways).await;
                    // What the node knows first; the rest after (a node
                    // asked early may not know every member yet).
                    for m in members.drain(..) {
                        if !known.iter().any(|k| k.endpoint == m.endpoint) {
                            known.push(m);
                        }
                    }
                    members = known;
                }
                if conn.is_none() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                continue;
            };
            i += 1;
            let key = format!("{{{tag}}}:{i}");
            let set = node
                .query::<()>("SET", redis::cmd("SET").arg(&key).arg(i))
                .await;
            if set.is_ok() {
                let by = node.endpoint().clone();
                tally.lock().await.set_ok.push((Instant::now(), by));
            }
            let confirmed = match set {
                Ok(()) => node
                    .query::<i64>("WAIT", redis::cmd("WAIT").arg(1).arg(500))
                    .await
                    .map(|n| n >= 1),
                Err(e) => Err(e),
            };
            match confirmed {
                Ok(true) => tally.lock().await.acked.push((key, Instant::now())),
                Ok(false) => tally.lock().await.failed += 1,
                Err(_) => {
                    tally.lock().await.failed += 1;
                    conn = None;
                }
            }
        }
    })
}

/// One [`writer`] per shard (shard `i` writes a tag in `ranges[i]`).
pub struct Writers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// What each shard's writer saw, by shard.
    pub tallies: Vec<Arc<Mutex<Tally>>>,
}

impl Writers {
    /// Starts them on `members`.
    pub fn start(members: &[Member], opts: &ConnectOptions, ranges: &[SlotRange]) -> Writers {
        Writers::start_trying(members, std::slice::from_ref(opts), ranges)
    }

    /// Starts them on `members`, each connecting every way of `ways` in
    /// turn until one is served (plain text or TLS, while a Redis turns
    /// TLS on or off).
    pub fn start_trying(
        members: &[Member],
        ways: &[ConnectOptions],
        ranges: &[SlotRange],
    ) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let tallies: Vec<Arc<Mutex<Tally>>> = ranges.iter().map(|_| Arc::default()).collect();
        let tasks = ranges
            .iter()
            .enumerate()
            .map(|(s, r)| {
                writer(
                    members.to_vec(),
                    ways.to_vec(),
                    tag_in(r, s),
                    stop.clone(),
                    tallies[s].clone(),
                )
            })
            .collect();
        Writers {
            stop,
            tasks,
            tallies,
        }
    }

    /// Confirmed writes so far, by shard.
    pub async fn confirmed(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for t in &self.tallies {
            out.push(t.lock().await.acked.len());
        }
        out
    }

    /// Waits (at most `within`) until every shard's writer has `more`
    /// confirmed writes past those it had when called: a shard whose replica
    /// never resynced confirms nothing (`WAIT 1` answers 0), however Ready
    /// the Redis says it is.
    pub async fn confirm_again(&self, more: usize, within: Duration) {
        let base = self.confirmed().await;
        let deadline = Instant::now() + within;
        loop {
            let now = self.confirmed().await;
            if now.iter().zip(&base).all(|(n, b)| *n >= b + more) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not every shard confirmed {more} more writes within {within:?}: \
                 confirmed by shard then {base:?}, now {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops them; what each saw.
    pub async fn stop(self) -> Vec<Arc<Mutex<Tally>>> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("writer");
        }
        self.tallies
    }
}

/// The longest time without an acknowledged write (`times`) between
/// `from` and `to`.
pub fn longest_gap(times: &[(Instant, Endpoint)], from: Instant, to: Instant) -> Duration {
    longest_gap_at(times, from, to).1
}

/// Like [`longest_gap`], with when the gap began (time since `from`).
pub fn longest_gap_at(
    times: &[(Instant, Endpoint)],
    from: Instant,
    to: Instant,
) -> (Duration, Duration) {
    let mut times: Vec<Instant> = times
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t >= from && *t <= to)
        .collect();
    times.sort();
    let mut prev = from;
    let mut gap = (Duration::ZERO, Duration::ZERO);
    for t in times.into_iter().chain([to]) {
        if t - prev > gap.1 {
            gap = (prev - from, t - prev);
        }
        prev = t;
    }
    gap
}

/// Like [`primary_for`], and also every node the answering member knows
/// (not failing), so a client follows pods that came back with new IPs.
/// A connection to `ep` the first way of `ways` it serves.
pub async fn connect_any(ep: &Endpoint, ways: &[ConnectOptions]) -> Option<Node> {
    for opts in ways {
        if let Ok(n) = Node::connect(ep, opts).await {
            return Some(n);
        }
    }
    None
}

/// [`discover`], each way of `ways` in turn.
pub async fn discover_any(
    members: &[Member],
    ways: &[ConnectOptions],
    slot: u16,
) -> Option<(Endpoint, Vec<Member>)> {
    for opts in ways {
        if let Some(found) = discover(members, opts, slot).await {
            return Some(found);
        }
    }
    None
}

pub async fn discover(
    members: &[Member],
    opts: &ConnectOptions,
    slot: u16,
) -> Option<(Endpoint, Vec<Member>)> {
    for m in members {
        let Ok(mut n) = Node::connect(&m.endpoint, opts).await else {
            continue;
        };
        let Ok(nodes) = cluster::nodes(&mut n).await else {
            continue;
        };
        let Some(p) = nodes
            .iter()
            .find(|k| k.primary && !k.fail && k.slots.iter().any(|r| r.contains(slot)))
            .and_then(|p| p.addr.clone())
        else {
            continue;
        };
        let known = nodes
            .iter()
            .filter(|k| !k.fail && !k.handshake)
            .filter_map(|k| {
                Some(Member {
                    endpoint: k.addr.clone()?,
                    bus_port: k.bus_port.unwrap_or(m.bus_port),
                })
            })
            .collect();
        return Some((p, known));
    }
    None
}

/// How many of the acknowledged keys of `tally` the shard serving `slot`
/// does not have.
pub async fn missing(members: &[Member], opts: &ConnectOptions, slot: u16, tally: &Tally) -> usize {
    let primary = primary_for(members, opts, slot)
        .await
        .expect("a primary serving the slot");
    let mut n = Node::connect(&primary, opts)
        .await
        .unwrap_or_else(|e| panic!("connecting to {primary}: {e}"));
    let mut missing = 0;
    for chunk in tally.acked.chunks(500) {
        let mut cmd = redis::cmd("EXISTS");
        for (k, _) in chunk {
            cmd.arg(k);
        }
        let found: usize = n
            .query("EXISTS", &cmd)
            .await
            .unwrap_or_else(|e| panic!("EXISTS on {primary}: {e}"));
        missing += chunk.len() - found;
    }
    missing
}

/// When `tally` first had a write answered OK by a node other than `dead`
/// after `since`; fails after `within`.
pub async fn first_write_elsewhere(
    tally: &Mutex<Tally>,
    since: Instant,
    dead: &Endpoint,
    within: Duration,
) -> Instant {
    loop {
        if let Some((at, _)) = tally
            .lock()
            .await
            .set_ok
            .iter()
            .find(|(at, by)| *at > since && by != dead)
        {
            return *at;
        }
        assert!(
            since.elapsed() < within,
            "no write was taken by a node other than {dead} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts that every replica among `members` reports
/// `master_link_status:up` (a Redis counts a replica Ready by its
/// `CLUSTER NODES` line, not by its link), and that there are `replicas`
/// of them.
pub async fn replicas_linked(members: &[Member], opts: &ConnectOptions, replicas: usize) {
    use redpilot::redis::info::{LinkStatus, Role};
    let mut seen = Vec::new();
    let mut down = Vec::new();
    for m in members {
        // What is asked is each link; a connection slower than the
        // options' timeout on a busy machine is tried again (10 s).
        let began = Instant::now();
        let r = loop {
            let read = match Node::connect(&m.endpoint, opts).await {
                Ok(mut n) => n.info_section("replication").await,
                Err(e) => Err(e),
            };
            match read {
                Ok(i) => break i.replication,
                Err(e) if began.elapsed() > Duration::from_secs(10) => {
                    panic!("INFO replication of {:?} for 10 s: {e}", m.endpoint)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        if r.role == Some(Role::Replica) {
            seen.push(m.endpoint.clone());
            if r.link_status != Some(LinkStatus::Up) {
                down.push((m.endpoint.clone(), r.link_status));
            }
        }
    }
    assert!(down.is_empty(), "replicas without a live link: {down:?}");
    assert_eq!(seen.len(), replicas, "replicas: {seen:?}");
}
