//! What tuning advice reads from one server in one sweep: `INFO` (the
//! default sections and `commandstats`), the slow log, the latency monitor's
//! latest events, the settings the rules weigh, and, where asked, a bounded
//! sample of key sizes. The rules that turn samples into advice are pure and
//! live in `redis::advice`.
//!
//! Cost of a sweep without key sampling: five round trips (two `INFO`, one
//! `SLOWLOG GET`, one `LATENCY LATEST`, one pipeline of `CONFIG GET`s),
//! about 12 KiB read. Key sampling adds one `SCAN` and one pipeline of at
//! most [`KeyScan::count`] `MEMORY USAGE` calls (estimates from 5 samples
//! of each aggregate, so a big key costs the server no more than a small
//! one).

use std::collections::BTreeMap;

use redis::Value;

use super::info::Info;
use super::{Node, Result};

/// Slow log entries read per sweep (the server keeps 128 by default).
pub const SLOWLOG_ENTRIES: u32 = 64;

/// The settings a sweep reads (`CONFIG GET`, one name each, so servers
/// older than 7.0 that take one pattern per call answer too).
pub const SETTINGS: &[&str] = &[
    "maxmemory",
    "maxmemory-policy",
    "maxclients",
    "repl-backlog-size",
    "activedefrag",
    "latency-monitor-threshold",
    "slowlog-log-slower-than",
    "lazyfree-lazy-user-del",
];

/// One slow log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowEntry {
    /// The server's id of the entry (grows).
    pub id: i64,
    /// When it ran (Unix seconds, the server's clock).
    pub at: i64,
    /// How long it ran (microseconds).
    pub micros: u64,
    /// The command's name, upper case (never its arguments: they may hold
    /// values an application treats as secret).
    pub command: String,
}

/// One event of the latency monitor (`LATENCY LATEST`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyEvent {
    /// `command`, `fast-command`, `fork`, `expire-cycle`, `aof-fsync-always`...
    pub event: String,
    /// When it last went over the threshold (Unix seconds).
    pub at: i64,
    /// Its latest spike (ms).
    pub latest_ms: u64,
    /// Its largest spike since the server started or the monitor was reset (ms).
    pub max_ms: u64,
}

/// One key's size as `MEMORY USAGE` estimates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySize {
    /// The key's name (lossy UTF-8).
    pub key: String,
    /// Bytes.
    pub bytes: u64,
}

/// Where key sampling goes on from, and how much it may do per sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyScan {
    /// The `SCAN` cursor to go on from (0: start over).
    pub cursor: u64,
    /// Keys asked for per sweep (the `SCAN` `COUNT` hint, and the most
    /// `MEMORY USAGE` calls made).
    pub count: u32,
    /// Keys at least this large are kept in the sample.
    pub min_bytes: u64,
    /// Big keys earlier sweeps found: measured again each sweep (at most
    /// [`BIG_KEYS_KEPT`]), so one that shrank or went is forgotten.
    pub known: Vec<String>,
}

/// Big keys a sample keeps (the largest).
pub const BIG_KEYS_KEPT: usize = 10;

/// Everything one sweep of one server read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// When the sweep ran (Unix seconds, the server's clock from `INFO
    /// server`'s `server_time_usec`; this machine's when it does not say).
    pub at: i64,
    /// `INFO` and `INFO commandstats`, parsed together.
    pub info: Info,
    /// The newest slow log entries, newest first.
    pub slowlog: Vec<SlowEntry>,
    /// The latency monitor's latest events.
    pub latency: Vec<LatencyEvent>,
    /// [`SETTINGS`] as the server runs them (a name it does not know is absent).
    pub config: BTreeMap<String, String>,
    /// Keys of at least [`KeyScan::min_bytes`] met by this sweep's sampling.
    pub big_keys: Vec<KeySize>,
    /// Keys whose size this sweep estimated.
    pub keys_sized: u64,
    /// The server container's memory limit (bytes), when the caller knows
    /// it (the pod's, in the operator): what a setting that takes memory
    /// outside `maxmemory` must stay within.
    pub memory_limit: Option<u64>,
}

impl Sample {
    /// A numeric `INFO` field.
    pub fn num(&self, field: &str) -> Option<f64> {
        self.info.fields.get(field)?.trim().parse().ok()
    }

    /// A numeric setting.
    pub fn setting(&self, name: &str) -> Option<u64> {
        self.config.get(name)?.trim().parse().ok()
    }
}

/// One sweep of `node` (key sizes aside: [`sample_keys`]).
pub async fn sample(node: &mut Node) -> Result<Sample> {
    let mut text: String = node.query("INFO", &redis::cmd("INFO")).await?;
    let commands: String = node
        .query("INFO", redis::cmd("INFO").arg("commandstats"))
        .await?;
    text.push('\n');
    text.push_str(&commands);
    let info = Info::parse(&text);
    let at = info
        .fields
        .get("server_time_usec")
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(|us| us / 1_000_000)
        .unwrap_or_else(now_secs);
    let slow: Value = node
        .query(
            "SLOWLOG",
            redis::cmd("SLOWLOG").arg("GET").arg(SLOWLOG_ENTRIES),
        )
        .await?;
    let latest: Value = node
        .query("LATENCY", redis::cmd("LATENCY").arg("LATEST"))
        .await?;
    let mut pipe = redis::pipe();
    for name in SETTINGS {
        pipe.cmd("CONFIG").arg("GET").arg(*name);
    }
    let settings: Vec<Value> = node.pipeline("CONFIG", &pipe).await?;
    Ok(Sample {
        at,
        info,
        slowlog: parse_slowlog(&slow),
        latency: parse_latency(&latest),
        config: parse_settings(&settings),
        ..Sample::default()
    })
}

/// Samples key sizes into `sample`: one `SCAN` step from `scan`'s cursor
/// (moved on; 0 again after a full pass) and the known big keys again.
pub async fn sample_keys(node: &mut Node, scan: &mut KeyScan, sample: &mut Sample) -> Result<()> {
    // A Cluster replica answers a keyed command with MOVED unless the
    // connection reads from replicas.
    if sample.info.fields.get("cluster_enabled").map(|v| v.trim()) == Some("1") {
        let _: () = node.query("READONLY", &redis::cmd("READONLY")).await?;
    }
    let (cursor, sized, big) = size_keys(node, scan).await?;
    scan.cursor = cursor;
    scan.known = big.iter().map(|k| k.key.clone()).collect();
    sample.keys_sized = sized;
    sample.big_keys = big;
    Ok(())
}

/// The `INFO` counters rules compare over a window: all a baseline keeps.
pub const COUNTERS: &[&str] = &[
    "uptime_in_seconds",
    "rejected_connections",
    "keyspace_hits",
    "keyspace_misses",
    "evicted_keys",
    "sync_full",
    "sync_partial_err",
    "master_repl_offset",
    "errorstat_OOM",
];

impl Sample {
    /// What of this sample a later one is compared with ([`COUNTERS`]):
    /// about a kilobyte, where the whole sample is tens.
    pub fn baseline(&self) -> Sample {
        let mut info = Info::default();
        for k in COUNTERS {
            if let Some(v) = self.info.fields.get(*k) {
                info.fields.insert((*k).to_string(), v.clone());
            }
        }
        Sample {
            at: self.at,
            info,
            ..Sample::default()
        }
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One `SCAN` step and the sizes of the keys it returned.
async fn size_keys(node: &mut Node, scan: &KeyScan) -> Result<(u64, u64, Vec<KeySize>)> {
    let (cursor, keys): (u64, Vec<Vec<u8>>) = node
        .query(
            "SCAN",
            redis::cmd("SCAN")
                .arg(scan.cursor)
                .arg("COUNT")
                .arg(scan.count.max(1)),
        )
        .await?;
    let mut keys: Vec<Vec<u8>> = keys.into_iter().take(scan.count as usize).collect();
    for k in scan.known.iter().take(BIG_KEYS_KEPT) {
        if !keys.iter().any(|s| s == k.as_bytes()) {
            keys.push(k.as_bytes().to_vec());
        }
    }
    if keys.is_empty() {
        return Ok((cursor, 0, Vec::new()));
    }
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("MEMORY").arg("USAGE").arg(k);
    }
    let sizes: Vec<Option<u64>> = node.pipeline("MEMORY", &pipe).await?;
    let mut big: Vec<KeySize> = keys
        .iter()
        .zip(&sizes)
        .filter_map(|(k, s)| {
            let bytes = (*s)?;
            (bytes >= scan.min_bytes).then(|| KeySize {
                key: String::from_utf8_lossy(k).into_owned(),
                bytes,
            })
        })
        .collect();
    big.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.key.cmp(&b.key)));
    big.truncate(BIG_KEYS_KEPT);
    Ok((cursor, sizes.iter().flatten().count() as u64, big))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::SimpleString(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// Parses a `SLOWLOG GET` reply; entries it cannot read are left out.
pub fn parse_slowlog(reply: &Value) -> Vec<SlowEntry> {
    items(reply)
        .iter()
        .filter_map(|e| {
            let f = items(e);
            let command = f.get(3).and_then(|a| items(a).first()).and_then(string)?;
            Some(SlowEntry {
                id: int(f.first()?)?,
                at: int(f.get(1)?)?,
                micros: u64::try_from(int(f.get(2)?)?).ok()?,
                command: command.to_ascii_uppercase(),
            })
        })
        .collect()
}

/// Parses a `LATENCY LATEST` reply.
pub fn parse_latency(reply: &Value) -> Vec<LatencyEvent> {
    items(reply)
        .iter()
        .filter_map(|e| {
            let f = items(e);
            Some(LatencyEvent {
                event: string(f.first()?)?,
                at: int(f.get(1)?)?,
                latest_ms: u64::try_from(int(f.get(2)?)?).ok()?,
                max_ms: u64::try_from(int(f.get(3)?)?).ok()?,
            })
        })
        .collect()
}

/// Parses the replies of one `CONFIG GET <name>` per setting (a flat list
/// of pairs, or a map under RESP3).
pub fn parse_settings(replies: &[Value]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for r in replies {
        match r {
            Value::Map(pairs) => {
                for (k, v) in pairs {
                    if let (Some(k), Some(v)) = (string(k), string(v)) {
                        out.insert(k, v);
                    }
                }
            }
            other => {
                for pair in items(other).chunks(2) {
                    if let [k, v] = pair
                        && let (Some(k), Some(v)) = (string(k), string(v))
                    {
                        out.insert(k, v);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slow_log_entries_keep_the_command_name_only() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(7),
                Value::Int(1_700_000_000),
                Value::Int(183_000),
                Value::Array(vec![bulk("keys"), bulk("*")]),
                bulk("127.0.0.1:5000"),
                bulk(""),
            ]),
            // An entry the parser cannot read is skipped, not fatal.
            Value::Array(vec![Value::Int(6)]),
        ]);
        assert_eq!(
            parse_slowlog(&reply),
            vec![SlowEntry {
                id: 7,
                at: 1_700_000_000,
                micros: 183_000,
                command: "KEYS".into()
            }]
        );
    }

    #[test]
    fn latency_events_and_settings_parse() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("command"),
            Value::Int(1_700_000_100),
            Value::Int(250),
            Value::Int(900),
        ])]);
        assert_eq!(
            parse_latency(&reply),
            vec![LatencyEvent {
                event: "command".into(),
                at: 1_700_000_100,
                latest_ms: 250,
                max_ms: 900
            }]
        );
        let settings = parse_settings(&[
            Value::Array(vec![bulk("maxmemory"), bulk("0")]),
            Value::Map(vec![(bulk("activedefrag"), bulk("no"))]),
            Value::Array(vec![]),
        ]);
        assert_eq!(settings.get("maxmemory").map(String::as_str), Some("0"));
        assert_eq!(settings.get("activedefrag").map(String::as_str), Some("no"));
        assert_eq!(settings.len(), 2);
    }
}
