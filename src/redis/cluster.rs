//! Redis Cluster on the data plane: the key-to-slot hash, the even spread
//! of the 16,384 slots over shards, what `CLUSTER NODES` and `CLUSTER INFO`
//! say, and the steps that form a cluster out of empty nodes (meet, assign
//! slots, attach replicas) and move a shard's primary (`CLUSTER FAILOVER`).
//!
//! Pure parts (hash, spread, parsing) are table-tested; the steps are
//! tested against real servers in `tests/redis_cluster.rs`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{ConnectOptions, Endpoint, Error, Node, Result};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// A contiguous range of slots, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotRange {
    /// First slot.
    pub start: u16,
    /// Last slot (included).
    pub end: u16,
}

impl SlotRange {
    /// How many slots the range holds.
    pub fn count(&self) -> u32 {
        u32::from(self.end) - u32::from(self.start) + 1
    }

    /// Whether `slot` is in the range.
    pub fn contains(&self, slot: u16) -> bool {
        (self.start..=self.end).contains(&slot)
    }
}

/// Parses a list of ranges as the status shows them (`0-5460,5462`):
/// `None` when any part is not a slot or a range of slots.
pub fn parse_ranges(text: &str) -> Option<Vec<SlotRange>> {
    let slot = |s: &str| s.trim().parse::<u16>().ok().filter(|n| *n < SLOTS);
    text.split([',', ' '])
        .filter(|p| !p.trim().is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => {
                let (start, end) = (slot(a)?, slot(b)?);
                (start <= end).then_some(SlotRange { start, end })
            }
            None => slot(p).map(|n| SlotRange { start: n, end: n }),
        })
        .collect()
}

impl std::fmt::Display for SlotRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// CRC16 (XMODEM: polynomial 0x1021, initial 0), the cluster's key hash.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`: the CRC16 of the key, or of its hash tag (the part
/// between the first `{` and the next `}` when not empty), modulo 16,384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// The slots spread evenly over `shards` shards: one contiguous range each,
/// the first `16384 % shards` one slot larger. Empty for 0 shards.
pub fn spread(shards: u16) -> Vec<SlotRange> {
    if shards == 0 {
        return Vec::new();
    }
    let base = SLOTS / shards;
    let extra = SLOTS % shards;
    let mut start = 0u16;
    (0..shards)
        .map(|i| {
            let len = base + u16::from(i < extra);
            let range = SlotRange {
                start,
                end: start + len - 1,
            };
            start += len;
            range
        })
        .collect()
}

/// Slots (in any order, repeats allowed) as ranges of consecutive slots,
/// in ascending order.
pub fn ranges(slots: impl IntoIterator<Item = u16>) -> Vec<SlotRange> {
    let mut out: Vec<SlotRange> = Vec::new();
    for s in slots
        .into_iter()
        .collect::<std::collections::BTreeSet<u16>>()
    {
        match out.last_mut() {
            Some(r) if u32::from(r.end) + 1 == u32::from(s) => r.end = s,
            _ => out.push(SlotRange { start: s, end: s }),
        }
    }
    out
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node ID (40 hex characters).
    pub id: String,
    /// The client address the node announces; `None` while it has none
    /// (`noaddr`, or `:0`).
    pub addr: Option<Endpoint>,
    /// The cluster bus port it announces.
    pub bus_port: Option<u16>,
    /// The line of the node that answered.
    pub myself: bool,
    /// Flagged `master`.
    pub primary: bool,
    /// The primary's ID, for a replica.
    pub replica_of: Option<String>,
    /// Flagged `fail` by a majority of primaries.
    pub fail: bool,
    /// Flagged `fail?` by the node that answered.
    pub pfail: bool,
    /// Still in the handshake of a `CLUSTER MEET`.
    pub handshake: bool,
    /// The node's bus link is connected.
    pub connected: bool,
    /// Its configuration epoch.
    pub config_epoch: u64,
    /// The slots it serves (ranges being imported or migrated left out).
    pub slots: Vec<SlotRange>,
}

impl ClusterNode {
    /// How many slots it serves.
    pub fn slot_count(&self) -> u32 {
        self.slots.iter().map(SlotRange::count).sum()
    }
}

fn bad(what: &str, line: &str) -> Error {
    Error::State(format!("unexpected CLUSTER NODES line ({what}): {line}"))
}

/// Parses `CLUSTER NODES`.
pub fn parse_nodes(text: &str) -> Result<Vec<ClusterNode>> {
    let mut nodes = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            return Err(bad("fewer than 8 fields", line));
        }
        // ip:port@cport[,hostname]
        let address = f[1].split(',').next().unwrap_or_default();
        let (client, bus) = address.split_once('@').unwrap_or((address, ""));
        let (host, port) = client
            .rsplit_once(':')
            .ok_or_else(|| bad("address", line))?;
        let port: u16 = port.parse().map_err(|_| bad("port", line))?;
        let flags: Vec<&str> = f[2].split(',').collect();
        let has = |flag: &str| flags.contains(&flag);
        let addr =
            (!host.is_empty() && port != 0 && !has("noaddr")).then(|| Endpoint::new(host, port));
        let mut slots = Vec::new();
        for &s in &f[8..] {
            if s.starts_with('[') {
                continue;
            }
            let (a, b) = s.split_once('-').unwrap_or((s, s));
            let start: u16 = a.parse().map_err(|_| bad("slot", line))?;
            let end: u16 = b.parse().map_err(|_| bad("slot", line))?;
            if start > end || end >= SLOTS {
                return Err(bad("slot range", line));
            }
            slots.push(SlotRange { start, end });
        }
        nodes.push(ClusterNode {
            id: f[0].to_string(),
            addr,
            bus_port: bus.parse().ok().filter(|p| *p != 0),
            myself: has("myself"),
            primary: has("master"),
            replica_of: (f[3] != "-").then(|| f[3].to_string()),
            fail: has("fail"),
            pfail: has("fail?"),
            handshake: has("handshake"),
            connected: f[7] == "connected",
            config_epoch: f[6].parse().map_err(|_| bad("config epoch", line))?,
            slots,
        });
    }
    Ok(nodes)
}

/// What `CLUSTER INFO` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterInfo {
    /// `cluster_state:ok`.
    pub ok: bool,
    /// `cluster_slots_assigned`.
    pub slots_assigned: u32,
    /// `cluster_slots_ok`.
    pub slots_ok: u32,
    /// `cluster_slots_pfail`.
    pub slots_pfail: u32,
    /// `cluster_slots_fail`.
    pub slots_fail: u32,
    /// `cluster_known_nodes`.
    pub known_nodes: u32,
    /// `cluster_size`: primaries serving at least one slot.
    pub size: u32,
    /// `cluster_current_epoch`.
    pub current_epoch: u64,
}

/// Parses `CLUSTER INFO`.
pub fn parse_info(text: &str) -> ClusterInfo {
    let fields: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .collect();
    let num = |k: &str| fields.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
    ClusterInfo {
        ok: fields.get("cluster_state") == Some(&"ok"),
        slots_assigned: num("cluster_slots_assigned"),
        slots_ok: num("cluster_slots_ok"),
        slots_pfail: num("cluster_slots_pfail"),
        slots_fail: num("cluster_slots_fail"),
        known_nodes: num("cluster_known_nodes"),
        size: num("cluster_size"),
        current_epoch: fields
            .get("cluster_current_epoch")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    }
}

/// A node's client and cluster bus addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Where clients connect.
    pub endpoint: Endpoint,
    /// The cluster bus port (the client port + 10,000 unless configured).
    pub bus_port: u16,
}

/// `CLUSTER NODES` on `node`.
pub async fn nodes(node: &mut Node) -> Result<Vec<ClusterNode>> {
    let text: String = node
        .query("CLUSTER NODES", redis::cmd("CLUSTER").arg("NODES"))
        .await?;
    parse_nodes(&text)
}

/// `CLUSTER INFO` on `node`.
pub async fn info(node: &mut Node) -> Result<ClusterInfo> {
    let text: String = node
        .query("CLUSTER INFO", redis::cmd("CLUSTER").arg("INFO"))
        .await?;
    Ok(parse_info(&text))
}

/// `CLUSTER MYID` on `node`.
pub async fn myid(node: &mut Node) -> Result<String> {
    node.query("CLUSTER MYID", redis::cmd("CLUSTER").arg("MYID"))
        .await
}

/// `CLUSTER MEET`: `node` starts a handshake with `other`.
#[tracing::instrument(name = "redis.cluster_meet", skip_all, fields(endpoint = %node.endpoint(), other = %other.endpoint))]
pub async fn meet(node: &mut Node, other: &Member) -> Result<()> {
    let _: redis::Value = node
        .query(
            "CLUSTER MEET",
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg(other.endpoint.host())
                .arg(other.endpoint.port())
                .arg(other.bus_port),
        )
        .await?;
    Ok(())
}

/// `CLUSTER ADDSLOTSRANGE`: `node` serves `ranges`.
#[tracing::instrument(name = "redis.cluster_add_slots", skip_all, fields(endpoint = %node.endpoint(), ranges = ranges.len()))]
pub async fn add_slots(node: &mut Node, ranges: &[SlotRange]) -> Result<()> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("ADDSLOTSRANGE");
    for r in ranges {
        cmd.arg(r.start).arg(r.end);
    }
    let _: redis::Value = node.query("CLUSTER ADDSLOTSRANGE", &cmd).await?;
    Ok(())
}

/// `CLUSTER REPLICATE`: `node` becomes a replica of the node `primary_id`.
#[tracing::instrument(name = "redis.cluster_replicate", skip_all, fields(endpoint = %node.endpoint(), primary_id))]
pub async fn replicate(node: &mut Node, primary_id: &str) -> Result<()> {
    let _: redis::Value = node
        .query(
            "CLUSTER REPLICATE",
            redis::cmd("CLUSTER").arg("REPLICATE").arg(primary_id),
        )
        .await?;
    Ok(())
}

/// `CLUSTER FAILOVER` on a replica: the graceful, zero-loss hand-over
/// (its primary stops writes until the replica has caught up).
#[tracing::instrument(name = "redis.cluster_failover", skip_all, fields(endpoint = %node.endpoint()))]
pub async fn failover(node: &mut Node) -> Result<()> {
    let _: redis::Value = node
        .query("CLUSTER FAILOVER", redis::cmd("CLUSTER").arg("FAILOVER"))
        .await?;
    Ok(())
}

/// `CLUSTER FAILOVER FORCE` on a replica whose primary is gone: it asks
/// the primaries for votes at once, without its primary's agreement, and
/// without the check of its data's age that keeps it from standing on its
/// own (a replica that never linked to its primary since it started counts
/// as disconnected for ever). A majority of primaries must still vote.
#[tracing::instrument(name = "redis.cluster_failover_force", skip_all, fields(endpoint = %node.endpoint()))]
pub async fn failover_force(node: &mut Node) -> Result<()> {
    let _: redis::Value = node
        .query(
            "CLUSTER FAILOVER",
            redis::cmd("CLUSTER").arg("FAILOVER").arg("FORCE"),
        )
        .await?;
    Ok(())
}

/// `CLUSTER FORGET`: `node` drops `id` from its table (for a minute).
#[tracing::instrument(name = "redis.cluster_forget", skip_all, fields(endpoint = %node.endpoint(), id))]
pub async fn forget(node: &mut Node, id: &str) -> Result<()> {
    let _: redis::Value = node
        .query(
            "CLUSTER FORGET",
            redis::cmd("CLUSTER").arg("FORGET").arg(id),
        )
        .await?;
    Ok(())
}

/// What forming a cluster did.
#[derive(Debug, Clone)]
pub struct Formed {
    /// Per shard, the node IDs: the primary first.
    pub shards: Vec<Vec<String>>,
    /// The slots of each shard.
    pub slots: Vec<SlotRange>,
    /// How long it took.
    pub duration: Duration,
}

/// Asks `node` every 50 ms until `done` says yes; fails with `what` (or
/// the last error) once `deadline` has passed.
async fn until(
    node: &mut Node,
    deadline: Instant,
    what: &str,
    mut done: impl AsyncFnMut(&mut Node) -> Result<bool>,
) -> Result<()> {
    loop {
        let last = match done(node).await {
            Ok(true) => return Ok(()),
            Ok(false) => None,
            Err(e) => Some(e),
        };
        if Instant::now() >= deadline {
            let endpoint = node.endpoint();
            return Err(last.unwrap_or_else(|| {
                Error::State(format!("{endpoint}: {what}: not within the bound"))
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Forms a cluster from empty nodes: `shards[i][0]` becomes the primary of
/// shard `i` with the slots [`spread`] gives it, the others its replicas.
/// Every node meets the first, slots are assigned once every node knows
/// every other, and the call returns once every node says `cluster_state:ok`
/// and every replica follows its primary, or fails after `bound`.
pub async fn form(
    shards: &[Vec<Member>],
    opts: &ConnectOptions,
    bound: Duration,
) -> Result<Formed> {
    let start = Instant::now();
    let deadline = start + bound;
    let count = u16::try_from(shards.len())
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::Config(format!("{} shards", shards.len())))?;
    if shards.iter().any(Vec::is_empty) {
        return Err(Error::Config("a shard without a node".into()));
    }
    let all: Vec<&Member> = shards.iter().flatten().collect();
    let mut conns = Vec::with_capacity(all.len());
    let mut ids = Vec::with_capacity(all.len());
    for m in &all {
        let mut n = Node::connect(&m.endpoint, opts).await?;
        ids.push(myid(&mut n).await?);
        conns.push(n);
    }
    // Everyone meets the first node; gossip does the rest.
    let (first, rest) = conns.split_at_mut(1);
    for m in all.iter().skip(1) {
        meet(&mut first[0], m).await?;
    }
    let want = all.len();
    for n in rest.iter_mut().chain(first.iter_mut()) {
        let what = format!("knowing all {want} nodes");
        until(n, deadline, &what, async |n| {
            let known = nodes(n).await?;
            Ok(known.len() == want
                && known
                    .iter()
                    .all(|k| k.myself || (!k.handshake && k.connected)))
        })
        .await?;
    }
    // Each shard's first node serves its slots.
    let slots = spread(count);
    let mut shard_ids = Vec::with_capacity(shards.len());
    let mut offset = 0;
    for (shard, range) in shards.iter().zip(&slots) {
        add_slots(&mut conns[offset], std::slice::from_ref(range)).await?;
        shard_ids.push(ids[offset..offset + shard.len()].to_vec());
        offset += shard.len();
    }
    // Replicas attach once they know their primary as a primary with slots.
    offset = 0;
    for shard in &shard_ids {
        let primary_id = &shard[0];
        for n in &mut conns[offset + 1..offset + shard.len()] {
            until(n, deadline, "seeing its primary's slots", async |n| {
                let known = nodes(n).await?;
                Ok(known
                    .iter()
                    .any(|k| k.id == *primary_id && k.primary && !k.slots.is_empty()))
            })
            .await?;
            replicate(n, primary_id).await?;
        }
        offset += shard.len();
    }
    for n in conns.iter_mut() {
        until(n, deadline, "reporting cluster_state:ok", async |n| {
            let i = info(n).await?;
            Ok(i.ok
                && i.slots_ok == u32::from(SLOTS)
                && usize::try_from(i.known_nodes).is_ok_and(|k| k == want))
        })
        .await?;
    }
    Ok(Formed {
        shards: shard_ids,
        slots,
        duration: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_ranges_parse_back() {
        let r = parse_ranges("0-5460,5462").expect("ranges");
        assert_eq!(
            r,
            vec![
                SlotRange {
                    start: 0,
                    end: 5460
                },
                SlotRange {
                    start: 5462,
                    end: 5462
                }
            ]
        );
        assert_eq!(
            r.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(","),
            "0-5460,5462"
        );
        for bad in ["0-16384", "5-3", "x", "1-"] {
            assert!(parse_ranges(bad).is_none(), "{bad}");
        }
        assert_eq!(parse_ranges(""), Some(vec![]));
    }

    #[test]
    fn keys_hash_to_the_servers_slots() {
        // Values from `CLUSTER KEYSLOT` on a real server (checked again in
        // tests/redis_cluster.rs).
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
        // A hash tag hashes its content only; an empty one the whole key.
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn slots_spread_evenly_and_cover_all() {
        for shards in [1u16, 3, 5, 7, 100] {
            let s = spread(shards);
            assert_eq!(s.len(), usize::from(shards));
            assert_eq!(s[0].start, 0);
            assert_eq!(s[s.len() - 1].end, SLOTS - 1);
            for w in s.windows(2) {
                assert_eq!(w[0].end + 1, w[1].start, "{shards}: contiguous");
            }
            let (min, max) = s.iter().fold((u32::MAX, 0), |(a, b), r| {
                (a.min(r.count()), b.max(r.count()))
            });
            assert!(max - min <= 1, "{shards}: {min}..{max}");
            assert_eq!(s.iter().map(SlotRange::count).sum::<u32>(), 16_384);
        }
        assert_eq!(
            spread(3),
            vec![
                SlotRange {
                    start: 0,
                    end: 5461
                },
                SlotRange {
                    start: 5462,
                    end: 10922
                },
                SlotRange {
                    start: 10923,
                    end: 16383
                },
            ]
        );
        assert!(spread(0).is_empty());
    }

    #[test]
    fn cluster_nodes_lines_are_read() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383 [10924->-abc]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 slave,fail 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 0 1426238316232 5 disconnected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000
a1b2 :0@0 master,fail?,noaddr - 0 0 0 disconnected
";
        let n = parse_nodes(text).unwrap();
        assert_eq!(n.len(), 6);
        assert!(
            !n[0].primary
                && n[0].replica_of.as_deref() == Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert_eq!(n[0].addr, Some(Endpoint::new("127.0.0.1", 30004)));
        assert_eq!(n[0].bus_port, Some(31004));
        assert_eq!(
            n[1].slots,
            vec![SlotRange {
                start: 5461,
                end: 10922
            }]
        );
        assert_eq!(
            n[2].slots,
            vec![SlotRange {
                start: 10923,
                end: 16383
            }]
        );
        assert!(n[3].fail && !n[3].connected);
        assert!(n[4].myself && n[4].primary);
        assert_eq!(n[4].slot_count(), 5461 + 1);
        assert!(n[5].pfail && n[5].addr.is_none() && n[5].bus_port.is_none());
        assert!(parse_nodes("abc 1.2.3.4:6379@16379 master").is_err());
        assert!(parse_nodes("abc 1.2.3.4:6379@16379 master - 0 0 1 connected 9-3").is_err());
    }

    #[test]
    fn cluster_info_is_read() {
        let i = parse_info(
            "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n\
             cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:6\r\n\
             cluster_size:3\r\ncluster_current_epoch:6\r\n",
        );
        assert!(i.ok);
        assert_eq!(
            (i.slots_ok, i.known_nodes, i.size, i.current_epoch),
            (16384, 6, 3, 6)
        );
        assert!(!parse_info("cluster_state:fail\r\n").ok);
    }
}
