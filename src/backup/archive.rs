//! The continuous archive's layout in a store, and how a point in time is
//! found in it. No I/O here: the archiver (`redpilot archive`) writes what
//! is described, a restore to a time reads it.
//!
//! An archive keeps, per *line* (`main` for a Standalone or Replication
//! Redis, `shard-<i>` for a Cluster Redis's shard), *runs*: one run is what
//! one archiver received from one primary without a break. A run starts
//! either with a full resync (its base: the snapshot at its first offset)
//! or as the continuation of an earlier run at an offset the primary still
//! held (a failover's new primary continues the old one's history, so the
//! offsets go on). Under `<root>/<line>/<run>/`:
//!
//! - `run.json`: [`RunInfo`];
//! - `base-<ms>` and `base-<ms>.manifest.json`: a snapshot (RDB) and the
//!   backup manifest naming its replication offset;
//! - `seg-<start>-<end>-<t0>-<t1>`: the stream's bytes after offset
//!   `start` up to and including `end`, always whole commands, preceded
//!   by one JSON line ([`SegmentHeader`]); `t0`/`t1` are the first and last
//!   checkpoint times in it (ms since the epoch, 0 when it has none).
//!
//! A *checkpoint* `(t, o)` is the primary's clock and replication offset
//! read in one `MULTI`/`EXEC`: every write the primary executed before `t`
//! is at or before `o`, every one after is past it. Restoring to `X` loads
//! the stream up to the offset of the last checkpoint at or before `X`.

use serde::{Deserialize, Serialize};

/// Format of what this release writes.
pub const FORMAT: u32 = 1;
/// The line of a Redis that is not sharded.
pub const MAIN_LINE: &str = "main";

/// The line of shard `i` of a Cluster Redis.
pub fn shard_line(i: i32) -> String {
    format!("shard-{i}")
}

/// How a run began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunInfo {
    /// [`FORMAT`].
    pub format: u32,
    /// The run's name (`<start ms>-<pod>`): its directory.
    pub run: String,
    /// The instance it was received from.
    pub pod: String,
    /// When it began (RFC 3339).
    pub started_at: String,
    /// Replication id of the history it received.
    pub replid: String,
    /// The offset it starts after.
    pub start: i64,
    /// The database selected at `start` (the stream names it again only
    /// when it changes).
    pub db: u32,
    /// The run it continues, when it began with `+CONTINUE`; else it began
    /// with a full resync whose snapshot is its first base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<String>,
    /// Read from the primary itself (`--alone`, or a Cluster shard's
    /// primary while no replica of it was online) rather than a replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub primary: bool,
}

/// The JSON line at the head of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentHeader {
    /// Replication id of the history the bytes belong to.
    pub replid: String,
    /// Offset the bytes start after.
    pub start: i64,
    /// Offset of the last byte.
    pub end: i64,
    /// The database selected at `start`.
    pub db: u32,
    /// Checkpoints `[ms, offset]` taken while the bytes arrived; each
    /// offset is within `start..=end`.
    pub checkpoints: Vec<(i64, i64)>,
    /// A Cluster Redis's shard: the slots its primary served, read with
    /// each checkpoint; a mark at the segment's first checkpoint and one
    /// at each checkpoint where they changed (empty for a Redis that is
    /// not sharded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layout: Vec<LayoutMark>,
}

/// The slots a shard's primary served at a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayoutMark {
    /// The checkpoint's time (ms).
    pub at: i64,
    /// Its slot ranges (`0-5460 10923`, empty for none).
    pub slots: String,
    /// Slots were moving in or out of the shard (a slot open for
    /// migration or import): its data was not the whole of its slots.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub moving: bool,
}

/// `marks` (in time order) without those that repeat the one before.
pub fn compress(marks: impl IntoIterator<Item = LayoutMark>) -> Vec<LayoutMark> {
    let mut out: Vec<LayoutMark> = Vec::new();
    for m in marks {
        if out
            .last()
            .is_none_or(|l| l.slots != m.slots || l.moving != m.moving)
        {
            out.push(m);
        }
    }
    out
}

/// The layout in force at `ms`: the last mark at or before it.
pub fn layout_at(marks: &[LayoutMark], ms: i64) -> Option<&LayoutMark> {
    marks.iter().rfind(|m| m.at <= ms)
}

/// The shard's own slots and whether any is open, from its primary's
/// `CLUSTER NODES` (the `myself` line: ranges, and `[slot->-id]` /
/// `[slot-<-id]` for slots migrating or importing).
pub fn own_layout(cluster_nodes: &str) -> Option<(String, bool)> {
    let line = cluster_nodes.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|f| f.split(',').any(|x| x == "myself"))
    })?;
    let mut slots = Vec::new();
    let mut moving = false;
    for field in line.split_whitespace().skip(8) {
        if field.starts_with('[') {
            moving = true;
        } else {
            slots.push(field);
        }
    }
    Some((slots.join(" "), moving))
}

/// A segment as its key names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentKey {
    /// The run.
    pub run: String,
    /// First offset after which it holds bytes.
    pub start: i64,
    /// Last offset it holds.
    pub end: i64,
    /// First checkpoint time (ms), 0 when none.
    pub t0: i64,
    /// Last checkpoint time (ms), 0 when none.
    pub t1: i64,
    /// Its full key.
    pub key: String,
}

/// A base (snapshot) as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseRef {
    /// The run.
    pub run: String,
    /// Key of the RDB object.
    pub key: String,
    /// The offset of the snapshot.
    pub offset: i64,
    /// When it was taken (ms).
    pub at_ms: i64,
}

/// `<root>/<line>` (no trailing `/`).
pub fn line_prefix(root: &str, line: &str) -> String {
    if root.is_empty() {
        line.to_string()
    } else {
        format!("{}/{line}", root.trim_end_matches('/'))
    }
}

/// The key of a run's `run.json`.
pub fn run_key(line_prefix: &str, run: &str) -> String {
    format!("{line_prefix}/{run}/run.json")
}

/// The key of a base taken at `ms`.
pub fn base_key(line_prefix: &str, run: &str, ms: i64) -> String {
    format!("{line_prefix}/{run}/base-{ms:013}")
}

/// The key of a segment.
pub fn segment_key(line_prefix: &str, run: &str, h: &SegmentHeader) -> String {
    let (t0, t1) = times(&h.checkpoints);
    format!(
        "{line_prefix}/{run}/seg-{:020}-{:020}-{t0:013}-{t1:013}",
        h.start, h.end
    )
}

/// First and last checkpoint times, 0 when there are none.
pub fn times(checkpoints: &[(i64, i64)]) -> (i64, i64) {
    (
        checkpoints.first().map_or(0, |c| c.0),
        checkpoints.last().map_or(0, |c| c.0),
    )
}

/// What a key under a line prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A run's `run.json`.
    Run(String),
    /// A segment.
    Segment(SegmentKey),
    /// A base's RDB object (its manifest is read separately).
    Base {
        /// The run.
        run: String,
        /// The key.
        key: String,
    },
    /// Anything else (a base's manifest, a file of a later format).
    Other,
}

/// Classifies `key`, found under `line_prefix/`.
pub fn classify(line_prefix: &str, key: &str) -> Entry {
    let Some(rest) = key
        .strip_prefix(line_prefix)
        .and_then(|r| r.strip_prefix('/'))
    else {
        return Entry::Other;
    };
    let Some((run, name)) = rest.split_once('/') else {
        return Entry::Other;
    };
    if name == "run.json" {
        return Entry::Run(run.to_string());
    }
    if let Some(seg) = name.strip_prefix("seg-") {
        let parts: Vec<&str> = seg.split('-').collect();
        if let [s, e, t0, t1] = parts.as_slice()
            && let (Ok(start), Ok(end), Ok(t0), Ok(t1)) = (
                s.parse::<i64>(),
                e.parse::<i64>(),
                t0.parse::<i64>(),
                t1.parse::<i64>(),
            )
        {
            return Entry::Segment(SegmentKey {
                run: run.to_string(),
                start,
                end,
                t0,
                t1,
                key: key.to_string(),
            });
        }
        return Entry::Other;
    }
    if let Some(ms) = name.strip_prefix("base-")
        && ms.bytes().all(|b| b.is_ascii_digit())
        && !ms.is_empty()
    {
        return Entry::Base {
            run: run.to_string(),
            key: key.to_string(),
        };
    }
    Entry::Other
}

/// Splits a segment object into its header and its stream bytes.
pub fn split_segment(object: &[u8]) -> Result<(SegmentHeader, &[u8]), String> {
    let nl = object
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("a segment without its header line")?;
    let header: SegmentHeader = serde_json::from_slice(&object[..nl])
        .map_err(|e| format!("a segment header that does not parse: {e}"))?;
    let body = &object[nl + 1..];
    if i64::try_from(body.len()).ok() != Some(header.end - header.start) {
        return Err(format!(
            "a segment of {} bytes whose header names offsets {}..{}",
            body.len(),
            header.start,
            header.end
        ));
    }
    Ok((header, body))
}

/// One command found by [`scan`]: its bytes and its name (lowercase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command<'a> {
    /// The whole command as sent (`*<n>\r\n$<len>\r\n...`).
    pub raw: &'a [u8],
    /// Its first argument, lowercased.
    pub name: String,
}

/// Scans the whole commands at the start of `buf` (the replication stream
/// sends RESP arrays of bulk strings only), calling `each` for every one,
/// and keeps `db` at the database the last `SELECT` chose. Returns the
/// bytes consumed: a command cut short at the end is left for later. An
/// error when the bytes are not such commands.
pub fn scan(buf: &[u8], db: &mut u32, mut each: impl FnMut(&Command<'_>)) -> Result<usize, String> {
    let mut pos = 0;
    loop {
        match command_at(buf, pos)? {
            None => return Ok(pos),
            Some((end, args)) => {
                let name = args
                    .first()
                    .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
                    .unwrap_or_default();
                if name == "select"
                    && let Some(n) = args
                        .get(1)
                        .and_then(|a| std::str::from_utf8(a).ok())
                        .and_then(|s| s.parse::<u32>().ok())
                {
                    *db = n;
                }
                each(&Command {
                    raw: &buf[pos..end],
                    name,
                });
                pos = end;
            }
        }
    }
}

/// A whole command: where it ends, and its first two arguments.
type Found<'a> = (usize, Vec<&'a [u8]>);

/// The command starting at `pos`. `None` when it is not all there yet.
fn command_at(buf: &[u8], pos: usize) -> Result<Option<Found<'_>>, String> {
    let Some((count, mut p)) = number_line(buf, pos, b'*')? else {
        return Ok(None);
    };
    let mut args = Vec::new();
    for _ in 0..count {
        let Some((len, q)) = number_line(buf, p, b'$')? else {
            return Ok(None);
        };
        let len = usize::try_from(len).map_err(|_| format!("a negative length at {p}"))?;
        let end = q.checked_add(len).ok_or("a length past memory")?;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(format!("an argument not ended by CRLF at {end}"));
        }
        if args.len() < 2 {
            args.push(&buf[q..end]);
        }
        p = end + 2;
    }
    Ok(Some((p, args)))
}

/// `<mark><digits>\r\n` at `pos`: the number and where the line ends.
fn number_line(buf: &[u8], pos: usize, mark: u8) -> Result<Option<(i64, usize)>, String> {
    let Some(first) = buf.get(pos) else {
        return Ok(None);
    };
    if *first != mark {
        return Err(format!(
            "expected {:?} at {pos}, found byte {first:#04x}",
            mark as char
        ));
    }
    let Some(cr) = buf[pos..].iter().take(24).position(|b| *b == b'\r') else {
        return if buf.len() - pos >= 24 {
            Err(format!("a length line too long at {pos}"))
        } else {
            Ok(None)
        };
    };
    let end = pos + cr;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    let n = std::str::from_utf8(&buf[pos + 1..end])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| format!("a length that is not a number at {pos}"))?;
    Ok(Some((n, end + 2)))
}

/// Whether a stream command is the link's own (a keep-alive `PING`, a
/// `REPLCONF GETACK`) rather than a change to the data.
pub fn link_only(name: &str) -> bool {
    matches!(name, "ping" | "replconf")
}

/// Everything a restore to a time needs, found from the listing and the
/// manifests alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The snapshot to start from.
    pub base: BaseRef,
    /// The segment whose checkpoints hold the target (read to find the
    /// exact offset).
    pub last: SegmentKey,
    /// The segments to read, in order, from the one holding the base's
    /// offset to `last`, with the offset each must be cut at (a run's
    /// bytes past the offset its successor continues from are not the
    /// history that went on).
    pub pieces: Vec<(SegmentKey, i64)>,
}

/// Why no plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The time is outside what the archive holds.
    #[error("{0}")]
    OutOfWindow(String),
    /// Bytes are missing between a base and the time.
    #[error("{0}")]
    Hole(String),
    /// The time falls between two checkpoints too far apart to place the
    /// writes made between them (the archive changed hands, or a hole).
    #[error("{0}")]
    Unplaced(String),
}

/// How far a restore's checkpoint may precede the time asked when writes
/// were made between it and the next checkpoint (ms). Checkpoints are
/// 100 ms apart while one sidecar archives; where the archive changed
/// hands (a restart or a failover: the next sidecar's first checkpoint) or
/// has a hole, they are seconds apart, and a write made in between could
/// have been acknowledged before the time asked or after it.
pub const MAX_BEHIND_MS: i64 = 1_000;

/// The checkpoint after the one a restore found, as far as the restore
/// can compare it: its time, and its offset when it is in the same run
/// (the same history, so offsets compare).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextCheckpoint {
    /// Its time (ms).
    pub ms: i64,
    /// Its offset, when in the same run as the restore's checkpoint.
    pub offset: Option<i64>,
}

/// Whether a restore to `ms` may use the checkpoint `(at, offset)`: it is
/// at most [`MAX_BEHIND_MS`] before `ms`, or nothing reached the stream
/// between it and the next checkpoint. Else the reason, naming the times
/// that restore exactly.
pub fn placed(
    ms: i64,
    (at, offset): (i64, i64),
    next: Option<NextCheckpoint>,
) -> Result<(), PlanError> {
    if ms - at <= MAX_BEHIND_MS {
        return Ok(());
    }
    match next {
        // No byte between the two: nothing was written.
        Some(NextCheckpoint {
            offset: Some(o), ..
        }) if o == offset => Ok(()),
        Some(n) => Err(PlanError::Unplaced(format!(
            "{} is {:.1} s past the archive's last checkpoint before it ({}) and the next one is at {}: writes were made between the two and the archive cannot tell which came before the time asked (the archive changed hands there, at a restart or a failover, or has a hole); choose a time at most {} s after {} or from {} on",
            show_ms(ms),
            (ms - at) as f64 / 1000.0,
            show_ms(at),
            show_ms(n.ms),
            MAX_BEHIND_MS / 1000,
            show_ms(at),
            show_ms(n.ms)
        ))),
        None => Err(PlanError::OutOfWindow(format!(
            "{} is after the newest archived checkpoint ({})",
            show_ms(ms),
            show_ms(at)
        ))),
    }
}

/// The runs of one line, and what each holds.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// Every run's `run.json`.
    pub runs: Vec<RunInfo>,
    /// Every segment.
    pub segments: Vec<SegmentKey>,
    /// Every base with a manifest.
    pub bases: Vec<BaseRef>,
}

impl Listing {
    fn run(&self, name: &str) -> Option<&RunInfo> {
        self.runs.iter().find(|r| r.run == name)
    }

    /// The runs from the one that began with a snapshot to `run`, oldest
    /// first (following `continues`).
    pub fn chain(&self, run: &str) -> Vec<&RunInfo> {
        let mut out = Vec::new();
        let mut at = self.run(run);
        while let Some(r) = at {
            if out.iter().any(|o: &&RunInfo| o.run == r.run) {
                break;
            }
            out.push(r);
            at = r.continues.as_deref().and_then(|c| self.run(c));
        }
        out.reverse();
        out
    }

    /// The segment whose first checkpoint is the earliest after `ms` (the
    /// first run by name on a tie).
    pub fn segment_after(&self, ms: i64) -> Option<&SegmentKey> {
        self.segments
            .iter()
            .filter(|s| s.t0 > ms)
            .min_by(|a, b| (a.t0, &a.run).cmp(&(b.t0, &b.run)))
    }

    /// The segment holding the last checkpoint at or before `ms`: the
    /// newest by first checkpoint (a later run on a tie).
    pub fn segment_at(&self, ms: i64) -> Option<&SegmentKey> {
        self.segments
            .iter()
            .filter(|s| s.t0 > 0 && s.t0 <= ms)
            .max_by(|a, b| (a.t0, &a.run).cmp(&(b.t0, &b.run)))
    }

    /// The earliest and newest times a restore can reach: from the first
    /// checkpoint after the oldest base to the newest checkpoint.
    pub fn window(&self) -> Option<(i64, i64)> {
        let newest = self
            .segments
            .iter()
            .map(|s| s.t1)
            .max()
            .filter(|t| *t > 0)?;
        let earliest = self
            .bases
            .iter()
            .filter_map(|b| {
                self.segments
                    .iter()
                    .filter(|s| s.run == b.run && s.start >= b.offset && s.t0 > 0)
                    .map(|s| s.t0)
                    .min()
            })
            .min()?;
        Some((earliest, newest))
    }

    /// The plan for a restore to `ms` (the checkpoint's offset is found
    /// later, in `last`'s header).
    pub fn plan(&self, ms: i64) -> Result<Plan, PlanError> {
        let window = self.window();
        let outside = |why: &str| {
            PlanError::OutOfWindow(match window {
                Some((a, b)) => format!(
                    "{} is {why}: the archive can restore from {} to {}",
                    show_ms(ms),
                    show_ms(a),
                    show_ms(b)
                ),
                None => format!(
                    "{} is {why}: the archive holds no restorable time yet",
                    show_ms(ms)
                ),
            })
        };
        let last = self
            .segment_at(ms)
            .ok_or_else(|| outside("before the first archived checkpoint"))?
            .clone();
        if let Some((_, newest)) = window
            && ms > newest
        {
            return Err(outside("after the newest archived checkpoint"));
        }
        let chain = self.chain(&last.run);
        // Each run in the chain serves the offsets up to where the next one
        // continues (the last run up to the target).
        let mut limits: Vec<(&RunInfo, i64)> = Vec::new();
        for (i, r) in chain.iter().enumerate() {
            let limit = match chain.get(i + 1) {
                Some(next) => next.start,
                None => last.end,
            };
            limits.push((r, limit));
        }
        // The newest base in the chain at or before the target's segment
        // (the target's offset is in it, so never before such a base).
        let base =
            self.bases
                .iter()
                .filter(|b| {
                    limits.iter().any(|(r, limit)| {
                        r.run == b.run && b.offset >= r.start && b.offset <= *limit
                    }) && b.offset <= last.start
                })
                .max_by_key(|b| (b.offset, b.at_ms))
                .ok_or_else(|| {
                    outside("not covered by a base: the runs that lead to it have no snapshot left")
                })?
                .clone();
        let mut pieces = Vec::new();
        let mut at = base.offset;
        let first = limits
            .iter()
            .position(|(r, _)| r.run == base.run)
            .unwrap_or(0);
        for (r, limit) in &limits[first..] {
            // The segment holding `at` (its start at or before it), then
            // each one continuing it, until the run's limit.
            while at < *limit {
                let next = self
                    .segments
                    .iter()
                    .filter(|s| s.run == r.run && s.start <= at && s.end > at)
                    .max_by_key(|s| s.end)
                    .ok_or_else(|| {
                        PlanError::Hole(format!(
                            "run {} has no bytes after offset {at} (up to {limit} are needed): the archive has a hole there",
                            r.run
                        ))
                    })?;
                let cut = (*limit).min(next.end);
                pieces.push((next.clone(), cut));
                at = cut;
            }
        }
        // The target's own segment last, even when it adds no byte (its
        // checkpoints are read).
        if pieces.last().map(|(s, _)| &s.key) != Some(&last.key) {
            pieces.push((last.clone(), last.end));
        }
        Ok(Plan { base, last, pieces })
    }
}

/// `ms` as RFC 3339 (milliseconds, UTC).
pub fn show_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        out
    }

    #[test]
    fn a_shards_layout_is_read_from_its_myself_line_with_open_slots_marked() {
        let nodes = "\
a1 10.0.0.1:6379@16379 master - 0 1 1 connected 0-5460
b2 10.0.0.2:6379@16379 myself,master - 0 0 2 connected 5461-10922 12000 [10923->-c3]
c3 10.0.0.3:6379@16379 master - 0 1 3 connected 10923-11999 12001-16383
";
        assert_eq!(
            own_layout(nodes),
            Some(("5461-10922 12000".to_string(), true))
        );
        let settled = nodes.replace(" [10923->-c3]", "");
        assert_eq!(
            own_layout(&settled),
            Some(("5461-10922 12000".to_string(), false))
        );
        // A primary that serves nothing yet.
        assert_eq!(
            own_layout("d4 10.0.0.4:6379@16379 myself,master - 0 0 0 connected\n"),
            Some((String::new(), false))
        );
        assert_eq!(own_layout(""), None);
        let marks = [
            LayoutMark {
                at: 100,
                slots: "0-8191".into(),
                moving: false,
            },
            LayoutMark {
                at: 300,
                slots: "0-8191".into(),
                moving: true,
            },
            LayoutMark {
                at: 500,
                slots: "0-4095".into(),
                moving: false,
            },
        ];
        assert_eq!(layout_at(&marks, 99), None);
        assert_eq!(layout_at(&marks, 299).map(|m| m.moving), Some(false));
        assert_eq!(layout_at(&marks, 300).map(|m| m.moving), Some(true));
        assert_eq!(
            layout_at(&marks, 900).map(|m| m.slots.as_str()),
            Some("0-4095")
        );
    }

    #[test]
    fn scan_stops_before_a_command_cut_short_and_tracks_select() {
        let mut buf = cmd(&["SELECT", "3"]);
        buf.extend(cmd(&["SET", "k", "v"]));
        let whole = buf.len();
        let tail = cmd(&["PING"]);
        buf.extend_from_slice(&tail[..5]);
        let mut db = 0;
        let mut names = Vec::new();
        let used = scan(&buf, &mut db, |c| names.push(c.name.clone())).unwrap();
        assert_eq!(used, whole);
        assert_eq!(db, 3);
        assert_eq!(names, vec!["select", "set"]);
        assert!(scan(b"+OK\r\n", &mut db, |_| {}).is_err());
        // Binary values with CRLF inside are read by length.
        let bin = cmd(&["SET", "k", "a\r\nb"]);
        assert_eq!(scan(&bin, &mut db, |_| {}).unwrap(), bin.len());
    }

    #[test]
    fn keys_round_trip() {
        let h = SegmentHeader {
            replid: "r".into(),
            start: 10,
            end: 99,
            db: 0,
            checkpoints: vec![(1_700_000_000_000, 20), (1_700_000_000_100, 99)],
            layout: Vec::new(),
        };
        let p = line_prefix("pre/ns/r/archive", MAIN_LINE);
        let k = segment_key(&p, "1700-r-0", &h);
        match classify(&p, &k) {
            Entry::Segment(s) => {
                assert_eq!(
                    (s.start, s.end, s.t0, s.t1),
                    (10, 99, 1_700_000_000_000, 1_700_000_000_100)
                );
                assert_eq!(s.run, "1700-r-0");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(classify(&p, &run_key(&p, "x")), Entry::Run("x".into()));
        assert!(matches!(
            classify(&p, &base_key(&p, "x", 5)),
            Entry::Base { .. }
        ));
        assert_eq!(
            classify(&p, &format!("{}.manifest.json", base_key(&p, "x", 5))),
            Entry::Other
        );
    }

    fn seg(run: &str, start: i64, end: i64, t0: i64, t1: i64) -> SegmentKey {
        SegmentKey {
            run: run.into(),
            start,
            end,
            t0,
            t1,
            key: format!("{run}/{start}-{end}"),
        }
    }

    fn run(name: &str, start: i64, continues: Option<&str>) -> RunInfo {
        RunInfo {
            format: FORMAT,
            run: name.into(),
            pod: "p".into(),
            started_at: String::new(),
            replid: "r".into(),
            start,
            db: 0,
            continues: continues.map(str::to_string),
            primary: false,
        }
    }

    #[test]
    fn a_plan_follows_a_failover_and_drops_the_old_primarys_lost_tail() {
        // Run a from a full sync at 100; it received up to 400 (the last
        // 50 bytes never reached the new primary). Run b continues a at 350.
        let l = Listing {
            runs: vec![run("a", 100, None), run("b", 350, Some("a"))],
            segments: vec![
                seg("a", 100, 200, 1000, 1900),
                seg("a", 200, 400, 2000, 2900),
                seg("b", 350, 500, 4000, 4900),
                seg("b", 500, 600, 5000, 5900),
            ],
            bases: vec![BaseRef {
                run: "a".into(),
                key: "a/base".into(),
                offset: 100,
                at_ms: 900,
            }],
        };
        assert_eq!(l.window(), Some((1000, 5900)));
        let p = l.plan(5500).unwrap();
        let cuts: Vec<(i64, i64, i64)> =
            p.pieces.iter().map(|(s, c)| (s.start, s.end, *c)).collect();
        assert_eq!(
            cuts,
            vec![
                (100, 200, 200),
                (200, 400, 350),
                (350, 500, 500),
                (500, 600, 600)
            ]
        );
        // Before the failover the old primary's whole run is the history.
        let p = l.plan(2500).unwrap();
        assert_eq!(p.last.start, 200);
        assert_eq!(p.pieces.last().map(|(_, c)| *c), Some(400));
        assert!(matches!(l.plan(500), Err(PlanError::OutOfWindow(_))));
        assert!(matches!(l.plan(9000), Err(PlanError::OutOfWindow(_))));
    }

    #[test]
    fn a_missing_segment_is_a_hole_with_its_offsets_and_a_newer_base_is_preferred() {
        let mut l = Listing {
            runs: vec![run("a", 0, None)],
            segments: vec![seg("a", 0, 100, 1000, 1100), seg("a", 200, 300, 3000, 3100)],
            bases: vec![BaseRef {
                run: "a".into(),
                key: "a/base0".into(),
                offset: 0,
                at_ms: 900,
            }],
        };
        match l.plan(3050) {
            Err(PlanError::Hole(m)) => assert!(m.contains("after offset 100"), "{m}"),
            other => panic!("{other:?}"),
        }
        l.bases.push(BaseRef {
            run: "a".into(),
            key: "a/base200".into(),
            offset: 200,
            at_ms: 3000,
        });
        let p = l.plan(3050).unwrap();
        assert_eq!(p.base.offset, 200);
        assert_eq!(p.pieces.len(), 1);
    }

    #[test]
    fn a_time_between_checkpoints_far_apart_is_refused_unless_nothing_was_written() {
        // Checkpoints 100 ms apart: any time restores to the last before it.
        let same = |ms, offset| {
            Some(NextCheckpoint {
                ms,
                offset: Some(offset),
            })
        };
        assert_eq!(placed(1_050, (1_000, 500), same(1_100, 520)), Ok(()));
        // A second after the checkpoint is still its granularity.
        assert_eq!(placed(2_000, (1_000, 500), same(9_000, 900)), Ok(()));
        // Seconds between two checkpoints (a handover) with writes between
        // them: refused, naming both.
        match placed(4_000, (1_000, 500), same(9_000, 900)) {
            Err(PlanError::Unplaced(m)) => {
                assert!(m.contains("3.0 s past"), "{m}");
                assert!(m.contains("1970-01-01T00:00:01.000Z"), "{m}");
                assert!(m.contains("from 1970-01-01T00:00:09.000Z on"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // The same gap with no byte between the two: exact.
        assert_eq!(placed(4_000, (1_000, 500), same(9_000, 500)), Ok(()));
        // The next checkpoint in another run (a new history): refused.
        let other = Some(NextCheckpoint {
            ms: 9_000,
            offset: None,
        });
        assert!(matches!(
            placed(4_000, (1_000, 500), other),
            Err(PlanError::Unplaced(_))
        ));
        // None after it: past the archive.
        assert!(matches!(
            placed(4_000, (1_000, 500), None),
            Err(PlanError::OutOfWindow(_))
        ));
    }

    #[test]
    fn the_segment_after_a_time_is_the_earliest_first_checkpoint_past_it() {
        let l = Listing {
            runs: vec![run("a", 0, None), run("b", 0, None)],
            segments: vec![
                seg("a", 0, 100, 1000, 1100),
                seg("a", 100, 200, 1200, 1300),
                seg("b", 0, 50, 8000, 8100),
            ],
            bases: vec![],
        };
        assert_eq!(l.segment_after(1050).map(|s| s.start), Some(100));
        assert_eq!(l.segment_after(1300).map(|s| s.run.as_str()), Some("b"));
        assert_eq!(l.segment_after(8000), None);
    }
}
