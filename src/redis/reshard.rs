//! Moving hash slots between the primaries of a Redis Cluster (resharding):
//! which slots move where to reach an even spread over a new shard count
//! ([`rebalance`], pure and table-tested), and the moves themselves against
//! real servers (`tests/redis_cluster.rs`).

use std::time::Duration;

use super::cluster::{SLOTS, SlotRange, ranges};
use super::{Endpoint, Error, Node, Result};

/// One move of a rebalance: `slots` from shard `from`'s primary to shard
/// `to`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMove {
    /// The shard giving the slots.
    pub from: usize,
    /// The shard taking them.
    pub to: usize,
    /// The slots, as ranges in ascending order.
    pub slots: Vec<SlotRange>,
}

impl SlotMove {
    /// How many slots move.
    pub fn count(&self) -> u32 {
        self.slots.iter().map(SlotRange::count).sum()
    }
}

/// How many slots shard `i` of `shards` holds once even: 16,384 / shards,
/// the first 16,384 % shards one more (as [`super::cluster::spread`]).
pub fn even_count(i: usize, shards: usize) -> u32 {
    if shards == 0 || i >= shards {
        return 0;
    }
    let total = u32::from(SLOTS);
    let n = shards as u32;
    total / n + u32::from((i as u32) < total % n)
}

/// The moves that take the slots `owned` (per shard, by index) to an even
/// spread over shards `0..shards`: every shard below `shards` ends with
/// [`even_count`] slots and every shard at or past it with none (a shard
/// to remove is emptied). Only what must move moves: a shard over its
/// count gives away its highest slots, in order, to the shards under
/// theirs, lowest index first. Slots that nobody owns are not placed here.
pub fn rebalance(owned: &[Vec<SlotRange>], shards: usize) -> Vec<SlotMove> {
    let width = owned.len().max(shards);
    let held: Vec<u32> = (0..width)
        .map(|i| {
            owned
                .get(i)
                .map(|r| r.iter().map(SlotRange::count).sum())
                .unwrap_or(0)
        })
        .collect();
    // What each shard gives, highest slots first, and what each takes.
    let mut surplus: Vec<(usize, Vec<u16>)> = Vec::new();
    let mut need: Vec<(usize, u32)> = Vec::new();
    for (i, have) in held.iter().enumerate() {
        let want = even_count(i, shards);
        if *have > want {
            let mut slots: Vec<u16> = owned[i].iter().flat_map(|r| r.start..=r.end).collect();
            slots.sort_unstable();
            let give = slots.split_off(want as usize);
            surplus.push((i, give));
        } else if *have < want {
            need.push((i, want - have));
        }
    }
    let mut moves = Vec::new();
    let mut takers = need.into_iter();
    let mut taker = takers.next();
    for (from, slots) in surplus {
        let mut rest = slots.as_slice();
        while !rest.is_empty() {
            let Some((to, wanted)) = taker.as_mut() else {
                // More given than taken: slots owned twice or outside the
                // counts; nothing sensible to place them on.
                break;
            };
            let n = (*wanted as usize).min(rest.len());
            let (now, later) = rest.split_at(n);
            moves.push(SlotMove {
                from,
                to: *to,
                slots: ranges(now.iter().copied()),
            });
            *wanted -= n as u32;
            rest = later;
            if *wanted == 0 {
                taker = takers.next();
            }
        }
    }
    moves
}

/// A slot a classic move left open on a node, from the bracketed entries
/// of its own `CLUSTER NODES` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenSlot {
    /// `[slot->-target]`: the node owns the slot and sends it to `to`.
    Migrating {
        /// The slot.
        slot: u16,
        /// The node ID it goes to.
        to: String,
    },
    /// `[slot-<-source]`: the node takes the slot from `from`.
    Importing {
        /// The slot.
        slot: u16,
        /// The node ID it comes from.
        from: String,
    },
}

/// The slots `CLUSTER NODES` shows open on the node that answered (its
/// `myself` line).
pub fn open_slots(nodes_text: &str) -> Vec<OpenSlot> {
    let Some(line) = nodes_text.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|f| f.split(',').any(|x| x == "myself"))
    }) else {
        return Vec::new();
    };
    line.split_whitespace()
        .skip(8)
        .filter_map(|f| {
            let inner = f.strip_prefix('[')?.strip_suffix(']')?;
            if let Some((slot, to)) = inner.split_once("->-") {
                return Some(OpenSlot::Migrating {
                    slot: slot.parse().ok()?,
                    to: to.to_string(),
                });
            }
            let (slot, from) = inner.split_once("-<-")?;
            Some(OpenSlot::Importing {
                slot: slot.parse().ok()?,
                from: from.to_string(),
            })
        })
        .collect()
}

/// How a classic move sends keys.
#[derive(Debug, Clone)]
pub struct Classic {
    /// Keys asked for per `CLUSTER GETKEYSINSLOT` (the most one `MIGRATE`
    /// carries).
    pub batch: usize,
    /// Bytes one `MIGRATE` carries at most, by `MEMORY USAGE` (a key larger
    /// than this goes alone). `MIGRATE` blocks the source's event loop
    /// while it serialises and sends: with a few large values in one batch
    /// it could block past `cluster-node-timeout` and its peers would
    /// fail the source over mid-move.
    pub max_bytes: u64,
    /// How long one `MIGRATE` should block the source at most: a batch
    /// that took longer halves the byte bound for the next (down to one
    /// key), a quick one lets it grow back.
    pub target_block: Duration,
    /// `MIGRATE`'s timeout for one transfer to the target.
    pub timeout: Duration,
    /// The password the target requires, when it requires one.
    pub password: Option<String>,
}

impl Default for Classic {
    fn default() -> Self {
        Classic {
            batch: 500,
            max_bytes: 4 << 20,
            target_block: Duration::from_millis(100),
            timeout: Duration::from_secs(5),
            password: None,
        }
    }
}

/// Splits `sizes` (each key's bytes, in order) into consecutive batches of
/// at most `max_bytes` each; a key larger than that is a batch alone.
/// Returns the batches' lengths.
pub fn byte_batches(sizes: &[u64], max_bytes: u64) -> Vec<usize> {
    let mut out = Vec::new();
    let (mut n, mut bytes) = (0usize, 0u64);
    for &size in sizes {
        if n > 0 && bytes.saturating_add(size) > max_bytes {
            out.push(n);
            (n, bytes) = (0, 0);
        }
        n += 1;
        bytes = bytes.saturating_add(size);
    }
    if n > 0 {
        out.push(n);
    }
    out
}

/// What one classic slot move did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Keys sent.
    pub keys: u64,
    /// Bytes sent, by `MEMORY USAGE`.
    pub bytes: u64,
    /// `MIGRATE` calls.
    pub batches: u64,
    /// The longest one `MIGRATE` blocked the source, in milliseconds.
    pub longest_ms: u64,
}

/// `MIGRATE` commands one pipeline sends at most: the source runs a
/// pipeline's commands one after another before it serves anyone else, so
/// the group is bounded by count as well as by bytes.
pub const MIGRATES_PER_PIPELINE: usize = 32;

/// Moves `slot` from the primary `source` to the primary `target`: see
/// [`move_slots`].
pub async fn move_slot(
    source: &mut Node,
    target: &mut Node,
    ids: (&str, &str),
    target_at: &Endpoint,
    slot: u16,
    how: &Classic,
) -> Result<Moved> {
    move_slots(
        std::slice::from_mut(source),
        std::slice::from_mut(target),
        ids,
        target_at,
        &[slot],
        how,
    )
    .await
}

/// Moves `slots` from the primary `source` (node ID `source_id`) to the
/// primary `target` (`target_id`, which the source reaches at `target_at`)
/// with the importing/migrating protocol, several slots at a time: the
/// target imports them all (one pipeline), the source migrates them all
/// (one pipeline), their keys are listed (one pipeline of
/// `CLUSTER GETKEYSINSLOT`) and sized (one of `MEMORY USAGE`), and go over
/// as `MIGRATE ... REPLACE KEYS` commands (one per slot and byte batch: a
/// `MIGRATE` carries keys of one slot only), pipelined in groups bounded by
/// bytes, count and time (see [`Classic`]; clients meanwhile follow `ASK`
/// to the target for keys already moved); then the target and the source
/// take the new owner of every slot (one pipeline each). A slot whose
/// listing came back shorter than asked is empty once its keys went: while
/// it migrates, a key it lacks is created on the target (`ASK`), never on
/// the source. Safe to run again on slots a stopped run left open: the
/// states are set again, the keys left go over (`REPLACE`: while a slot
/// migrates, the source's copy is the one clients see), and the owner is
/// set.
///
/// `sources` and `targets` are connections to the two primaries (at least
/// one each; the first carries everything but `CLUSTER SETSLOT`): Valkey 8
/// and later replicate each `SETSLOT` and answer it only once the
/// replicas acknowledge it, one command after another on a connection, so
/// the `SETSLOT`s of a group are spread over every connection given and
/// their waits overlap.
#[tracing::instrument(name = "redis.cluster_move_slots", skip_all, fields(source = %sources.first().map(|n| n.endpoint().to_string()).unwrap_or_default(), target = %target_at, first = slots.first().copied(), count = slots.len()))]
pub async fn move_slots(
    sources: &mut [Node],
    targets: &mut [Node],
    (source_id, target_id): (&str, &str),
    target_at: &Endpoint,
    slots: &[u16],
    how: &Classic,
) -> Result<Moved> {
    if slots.is_empty() || sources.is_empty() || targets.is_empty() {
        return Ok(Moved::default());
    }
    let began = std::time::Instant::now();
    setslots(targets, slots, "IMPORTING", source_id).await?;
    setslots(sources, slots, "MIGRATING", target_id).await?;
    let source = &mut sources[0];
    let opened = began.elapsed();
    // Tests stop the operator at each step of a move (`REDPILOT_FAILPOINTS`).
    crate::failpoint::hit("reshard-after-open");
    let mut moved = Moved::default();
    let timeout_ms = u64::try_from(how.timeout.as_millis()).unwrap_or(u64::MAX);
    let batch = how.batch.max(1);
    let mut max_bytes = how.max_bytes.max(1);
    let mut pending: Vec<u16> = slots.to_vec();
    let mut migrating = Duration::ZERO;
    while !pending.is_empty() {
        let mut list = redis::pipe();
        for &slot in &pending {
            list.cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(batch);
        }
        let listed: Vec<Vec<Vec<u8>>> = source.pipeline("CLUSTER GETKEYSINSLOT", &list).await?;
        // A slot listed in full may hold more: it is listed again.
        let again: Vec<u16> = pending
            .iter()
            .zip(&listed)
            .filter(|(_, keys)| keys.len() >= batch)
            .map(|(s, _)| *s)
            .collect();
        let keys: Vec<&Vec<Vec<u8>>> = listed.iter().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() {
            break;
        }
        // Each key's size in one round trip (an estimate for collections:
        // `MEMORY USAGE` samples them; a key gone meanwhile counts 0).
        let mut sizes_pipe = redis::pipe();
        for k in keys.iter().flat_map(|k| k.iter()) {
            sizes_pipe.cmd("MEMORY").arg("USAGE").arg(k.as_slice());
        }
        let sizes: Vec<Option<u64>> = source.pipeline("MEMORY USAGE", &sizes_pipe).await?;
        let mut sizes = sizes.into_iter().map(Option::unwrap_or_default);
        // Every `MIGRATE` to send: one slot's keys, bounded by bytes.
        let mut sends: Vec<(&[Vec<u8>], u64)> = Vec::new();
        for slot_keys in keys {
            let slot_sizes: Vec<u64> = sizes.by_ref().take(slot_keys.len()).collect();
            let mut at = 0usize;
            for n in byte_batches(&slot_sizes, max_bytes) {
                let bytes = slot_sizes[at..at + n].iter().sum();
                sends.push((&slot_keys[at..at + n], bytes));
                at += n;
            }
        }
        let mut next = 0usize;
        while next < sends.len() {
            // A group: at least one send, then more while the bytes and
            // the count allow.
            let mut end = next + 1;
            let mut bytes = sends[next].1;
            while end < sends.len()
                && end - next < MIGRATES_PER_PIPELINE
                && bytes.saturating_add(sends[end].1) <= max_bytes
            {
                bytes = bytes.saturating_add(sends[end].1);
                end += 1;
            }
            let mut pipe = redis::pipe();
            for (batch_keys, _) in &sends[next..end] {
                let cmd = pipe
                    .cmd("MIGRATE")
                    .arg(target_at.host())
                    .arg(target_at.port())
                    .arg("")
                    .arg(0)
                    .arg(timeout_ms)
                    .arg("REPLACE");
                // As the user the operator logged in to the source as: the
                // target has the same users, and its default user may be off.
                match (&how.password, source.user()) {
                    (Some(pw), Some(user)) => {
                        cmd.arg("AUTH2").arg(user).arg(pw);
                    }
                    (Some(pw), None) => {
                        cmd.arg("AUTH").arg(pw);
                    }
                    (None, _) => {}
                }
                cmd.arg("KEYS");
                for k in *batch_keys {
                    cmd.arg(k.as_slice());
                }
            }
            let count = u32::try_from(end - next).unwrap_or(u32::MAX);
            // Each transfer may take the whole timeout on top of the
            // commands' own.
            let within = how.timeout.saturating_mul(count) + Duration::from_secs(5);
            let started = std::time::Instant::now();
            let _: Vec<redis::Value> = source.pipeline_within("MIGRATE", &pipe, within).await?;
            let took = started.elapsed();
            migrating += took;
            moved.keys += sends[next..end]
                .iter()
                .map(|(k, _)| k.len() as u64)
                .sum::<u64>();
            moved.bytes += bytes;
            moved.batches += u64::from(count);
            moved.longest_ms = moved
                .longest_ms
                .max(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
            if took > how.target_block {
                max_bytes = (bytes / 2).max(1);
            } else if took * 4 < how.target_block {
                max_bytes = max_bytes.saturating_mul(2).min(how.max_bytes.max(1));
            }
            next = end;
            crate::failpoint::hit("reshard-after-batch");
        }
        pending = again;
    }
    let listed_and_sent = began.elapsed();
    setslots(targets, slots, "NODE", target_id).await?;
    crate::failpoint::hit("reshard-after-owner");
    setslots(sources, slots, "NODE", target_id).await?;
    tracing::debug!(
        slots = slots.len(),
        keys = moved.keys,
        open_us = opened.as_micros() as u64,
        migrate_us = migrating.as_micros() as u64,
        list_us = (listed_and_sent - opened - migrating).as_micros() as u64,
        owner_us = (began.elapsed() - listed_and_sent).as_micros() as u64,
        "slots moved"
    );
    Ok(moved)
}

/// `CLUSTER SETSLOT <slot> NODE <owner>` on another primary, so it
/// redirects to the new owner before gossip tells it.
pub async fn announce(node: &mut Node, slot: u16, owner_id: &str) -> Result<()> {
    setslot(node, slot, "NODE", owner_id).await
}

/// `CLUSTER SETSLOT <slot> STABLE`: clears a half-set importing or
/// migrating state (a move rolled back before any key moved).
pub async fn stable(node: &mut Node, slot: u16) -> Result<()> {
    let _: redis::Value = node
        .query(
            "CLUSTER SETSLOT",
            redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("STABLE"),
        )
        .await?;
    Ok(())
}

/// `CLUSTER SETSLOT <slot> <state> <id>` for every slot of `slots`: a
/// pipeline on each connection of `nodes` (all to one server), the slots
/// spread over them, all at once.
async fn setslots(nodes: &mut [Node], slots: &[u16], state: &str, id: &str) -> Result<()> {
    if let ([node, ..], [slot]) = (&mut *nodes, slots) {
        return setslot(node, *slot, state, id).await;
    }
    let per = slots.len().div_ceil(nodes.len().max(1)).max(1);
    let sends = nodes.iter_mut().zip(slots.chunks(per)).map(|(node, part)| {
        let mut pipe = redis::pipe();
        for &slot in part {
            pipe.cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .ignore();
        }
        async move {
            let _: () = node.pipeline("CLUSTER SETSLOT", &pipe).await?;
            Ok::<(), Error>(())
        }
    });
    futures::future::try_join_all(sends).await?;
    Ok(())
}

async fn setslot(node: &mut Node, slot: u16, state: &str, id: &str) -> Result<()> {
    let _: redis::Value = node
        .query(
            "CLUSTER SETSLOT",
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id),
        )
        .await?;
    Ok(())
}

/// A Valkey 9 atomic slot migration as `CLUSTER GETSLOTMIGRATIONS` shows
/// it (one entry per job, on the source and the target primaries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migration {
    /// The job's name.
    pub name: String,
    /// `EXPORT` on the source, `IMPORT` on the target.
    pub operation: String,
    /// The slots, as the server lists them.
    pub slots: Vec<SlotRange>,
    /// The job's state (`success` once done; `failed` or `cancelled`).
    pub state: String,
    /// Why it failed, when it did.
    pub message: String,
}

impl Migration {
    /// Whether the job is over, one way or the other.
    pub fn ended(&self) -> bool {
        matches!(self.state.as_str(), "success" | "failed" | "cancelled")
    }
}

/// Reads the field/value pairs of one `CLUSTER GETSLOTMIGRATIONS` entry.
fn migration_of(entry: &redis::Value) -> Option<Migration> {
    let pairs: Vec<(String, String)> = match entry {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?).unwrap_or_default())))
            .collect(),
        redis::Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v).unwrap_or_default())))
            .collect(),
        _ => return None,
    };
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    Some(Migration {
        name: get("name"),
        operation: get("operation"),
        slots: super::cluster::parse_ranges(&get("slot_ranges")).unwrap_or_default(),
        state: get("state"),
        message: get("message"),
    })
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(i) => Some(i.to_string()),
        redis::Value::Nil => None,
        other => Some(format!("{other:?}")),
    }
}

/// `CLUSTER GETSLOTMIGRATIONS` (Valkey 9): the jobs a primary knows of.
pub async fn migrations(node: &mut Node) -> Result<Vec<Migration>> {
    let reply: redis::Value = node
        .query(
            "CLUSTER GETSLOTMIGRATIONS",
            redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS"),
        )
        .await?;
    let entries = match reply {
        redis::Value::Array(items) => items,
        _ => Vec::new(),
    };
    Ok(entries.iter().filter_map(migration_of).collect())
}

/// Moves `slots` from the primary `source` to the node `target_id` with
/// Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`): the target
/// takes the slots' data and their ownership in one step, clients see no
/// `ASK`, and a failed job is rolled back by the engine. Waits until the
/// source reports the job ended, at most `bound`; an error names why a job
/// failed.
#[tracing::instrument(name = "redis.cluster_migrate_slots", skip_all, fields(source = %source.endpoint(), ranges = slots.len()))]
pub async fn move_atomic(
    source: &mut Node,
    slots: &[SlotRange],
    target_id: &str,
    bound: Duration,
) -> Result<Migration> {
    let before: Vec<String> = migrations(source)
        .await?
        .into_iter()
        .map(|m| m.name)
        .collect();
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("MIGRATESLOTS").arg("SLOTSRANGE");
    for r in slots {
        cmd.arg(r.start).arg(r.end);
    }
    cmd.arg("NODE").arg(target_id);
    let _: redis::Value = source.query("CLUSTER MIGRATESLOTS", &cmd).await?;
    let deadline = std::time::Instant::now() + bound;
    loop {
        let job = migrations(source)
            .await?
            .into_iter()
            .find(|m| m.operation == "EXPORT" && !before.contains(&m.name) && m.slots == slots);
        match job {
            Some(m) if m.state == "success" => return Ok(m),
            Some(m) if m.ended() => {
                return Err(Error::State(format!(
                    "{}: migrating slots to {target_id} {}: {}",
                    source.endpoint(),
                    m.state,
                    m.message
                )));
            }
            _ => {}
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::State(format!(
                "{}: migrating slots to {target_id}: not done within {bound:?}",
                source.endpoint()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Keys a node holds in `slot` (`CLUSTER COUNTKEYSINSLOT`).
pub async fn keys_in_slot(node: &mut Node, slot: u16) -> Result<u64> {
    node.query(
        "CLUSTER COUNTKEYSINSLOT",
        redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot),
    )
    .await
}

/// The keys `node` holds in `slots`, in one pipeline (`CLUSTER
/// COUNTKEYSINSLOT` per slot).
pub async fn keys_in_slots(node: &mut Node, slots: &[SlotRange]) -> Result<u64> {
    let mut pipe = redis::pipe();
    let mut n = 0usize;
    for r in slots {
        for slot in r.start..=r.end {
            pipe.cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot);
            n += 1;
        }
    }
    if n == 0 {
        return Ok(0);
    }
    let counts: Vec<u64> = node.pipeline("CLUSTER COUNTKEYSINSLOT", &pipe).await?;
    Ok(counts.iter().sum())
}

/// What a node says of the slots open on it.
pub async fn open_slots_of(node: &mut Node) -> Result<Vec<OpenSlot>> {
    let text: String = node
        .query("CLUSTER NODES", redis::cmd("CLUSTER").arg("NODES"))
        .await?;
    Ok(open_slots(&text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::cluster::spread;

    fn r(start: u16, end: u16) -> SlotRange {
        SlotRange { start, end }
    }

    #[test]
    fn batches_are_bounded_by_bytes_and_a_large_key_goes_alone() {
        const MB: u64 = 1 << 20;
        // 1 KiB keys: all in one batch under 4 MiB.
        assert_eq!(byte_batches(&[1024; 100], 4 * MB), vec![100]);
        // 5 MB values against a 4 MiB bound: one a batch.
        assert_eq!(byte_batches(&[5 * MB; 3], 4 * MB), vec![1, 1, 1]);
        // Mixed: small keys gather until the next would pass the bound.
        assert_eq!(
            byte_batches(&[MB, MB, MB, 2 * MB, 100, 5 * MB, 1], 4 * MB),
            vec![3, 2, 1, 1]
        );
        assert!(byte_batches(&[], MB).is_empty());
        // Every key is in exactly one batch.
        let sizes: Vec<u64> = (0..1000).map(|i| (i * 7919) % (3 * MB)).collect();
        assert_eq!(byte_batches(&sizes, 4 * MB).iter().sum::<usize>(), 1000);
    }

    /// Each shard's slots after the moves, as sorted slot lists.
    fn apply(owned: &[Vec<SlotRange>], moves: &[SlotMove], width: usize) -> Vec<Vec<u16>> {
        let mut held: Vec<Vec<u16>> = (0..width)
            .map(|i| {
                owned
                    .get(i)
                    .map(|rs| rs.iter().flat_map(|r| r.start..=r.end).collect())
                    .unwrap_or_default()
            })
            .collect();
        for m in moves {
            for range in &m.slots {
                for s in range.start..=range.end {
                    let at = held[m.from].iter().position(|x| *x == s);
                    assert!(at.is_some(), "{m:?}: shard {} does not own {s}", m.from);
                    if let Some(at) = at {
                        held[m.from].remove(at);
                    }
                    held[m.to].push(s);
                }
            }
        }
        for h in &mut held {
            h.sort_unstable();
        }
        held
    }

    #[test]
    fn a_rebalance_moves_only_what_must_move_to_an_even_spread() {
        let even =
            |n: u16| -> Vec<Vec<SlotRange>> { spread(n).into_iter().map(|r| vec![r]).collect() };
        // (from, to shards, slots that must move)
        let cases: [(Vec<Vec<SlotRange>>, usize, u32); 7] = [
            (even(3), 3, 0),
            (even(3), 4, 4096),
            (even(3), 5, 16_384 - 3 * 3277),
            (even(5), 3, 3277 + 3276),
            (even(4), 3, 4096),
            (vec![vec![r(0, 16_383)], vec![], vec![]], 3, 5461 + 5461),
            // Uneven and fragmented: 0 holds 10,000 in two pieces.
            (
                vec![
                    vec![r(0, 4_999), r(10_000, 14_999)],
                    vec![r(5_000, 9_999)],
                    vec![r(15_000, 16_383)],
                ],
                3,
                10_000 - 5462,
            ),
        ];
        for (i, (owned, shards, must)) in cases.iter().enumerate() {
            let moves = rebalance(owned, *shards);
            let moved: u32 = moves.iter().map(SlotMove::count).sum();
            assert_eq!(moved, *must, "case {i}: {moves:?}");
            let width = owned.len().max(*shards);
            let after = apply(owned, &moves, width);
            let mut all: Vec<u16> = after.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..16_384).collect::<Vec<u16>>(),
                "case {i}: every slot once"
            );
            for (s, held) in after.iter().enumerate() {
                assert_eq!(
                    held.len() as u32,
                    even_count(s, *shards),
                    "case {i}: shard {s}"
                );
            }
            for m in &moves {
                assert_ne!(m.from, m.to, "case {i}");
                assert!(
                    m.to < *shards,
                    "case {i}: a removed shard takes nothing: {m:?}"
                );
            }
        }
    }

    #[test]
    fn a_shard_gives_its_highest_slots_and_keeps_the_rest_contiguous() {
        let owned: Vec<Vec<SlotRange>> = spread(3).into_iter().map(|r| vec![r]).collect();
        let moves = rebalance(&owned, 4);
        assert_eq!(
            moves,
            vec![
                SlotMove {
                    from: 0,
                    to: 3,
                    slots: vec![r(4096, 5461)]
                },
                SlotMove {
                    from: 1,
                    to: 3,
                    slots: vec![r(9558, 10_922)]
                },
                SlotMove {
                    from: 2,
                    to: 3,
                    slots: vec![r(15_019, 16_383)]
                },
            ]
        );
        // Scale-in: the last shard is emptied into the others.
        let owned: Vec<Vec<SlotRange>> = spread(4).into_iter().map(|r| vec![r]).collect();
        let moves = rebalance(&owned, 3);
        assert!(moves.iter().all(|m| m.from == 3), "{moves:?}");
        assert_eq!(moves.iter().map(SlotMove::count).sum::<u32>(), 4096);
    }

    #[test]
    fn open_slots_are_read_from_the_own_line() {
        let text = "\
a1 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460 [5461->-b2] [93-<-c3]
b2 10.0.0.2:6379@16379 master - 0 1 2 connected 5461-10922 [5461-<-a1]
";
        assert_eq!(
            open_slots(text),
            vec![
                OpenSlot::Migrating {
                    slot: 5461,
                    to: "b2".into()
                },
                OpenSlot::Importing {
                    slot: 93,
                    from: "c3".into()
                },
            ]
        );
        assert!(open_slots("b2 10.0.0.2:6379@16379 master - 0 1 2 connected 1-2").is_empty());
    }

    #[test]
    fn slots_become_ranges() {
        assert_eq!(
            ranges([1, 2, 3, 7, 9, 10]),
            vec![r(1, 3), r(7, 7), r(9, 10)]
        );
        assert!(ranges([]).is_empty());
        assert_eq!(
            even_count(0, 3) + even_count(1, 3) + even_count(2, 3),
            16_384
        );
        assert_eq!(even_count(3, 3), 0);
    }
}
