//! The archiver (`redpilot archive`, a sidecar of every instance of a Redis
//! with `spec.archive`): one of them at a time receives the replication
//! stream and ships it to the store as it arrives, with checkpoints that
//! tie the primary's clock to offsets (see [`super::archive`]).
//!
//! Which sidecar archives: with replicas, the one whose server is an
//! online replica with the lowest address among the primary's replicas,
//! reading its own server's stream (a replica passes on the primary's
//! stream byte for byte, with the same offsets). Never the primary's own
//! link: a replica link that acknowledges would count toward the primary's
//! write fence (`min-replicas-to-write`), and a primary cut off from its
//! replicas must stop taking writes even with its own sidecar beside it.
//! Without replicas (`--alone`: one instance per primary) the primary's
//! sidecar reads the primary. So does a Cluster shard primary's sidecar
//! while its shard has no replica online (the replica restarting in a
//! roll, or resyncing): a Cluster has no write fence, and the primary's
//! backlog still holds what the replica's sidecar had not stored, so the
//! archive continues instead of leaving a hole until the replica is back.
//! It hands back once a replica is online: the replica's sidecar waits
//! while the primary's archives, and starts after it stored all it
//! received (past the replica's sync, where the replica's backlog begins).
//!
//! Checkpoints come from the primary (`MULTI`, `TIME`, `INFO
//! replication`, `EXEC`) every `checkpoint_every`; a segment is cut every
//! `interval` at a command boundary and queued for upload; uploads run in
//! order, retried until the store takes them (memory bounded by
//! [`Settings::queue_limit`]: beyond it the stream is not read, and the
//! primary, or replica, drops a link that falls too far behind). The link
//! acknowledges what is uploaded every 500 ms.
//!
//! A session ends when the sidecar is no longer the one to archive or the
//! link breaks; the next one continues the newest run where its server
//! still has the history (`PSYNC <replid> <offset>`), else takes a full
//! resync whose snapshot is the new run's base.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;

use super::agent::{BackupError, Source, UploadWriter};
use super::archive::{
    self, Entry, LayoutMark, Listing, RunInfo, SegmentHeader, base_key, run_key, segment_key,
};
use crate::redis::info::Role;
use crate::redis::rdb::RdbOptions;
use crate::redis::replstream::{self, Began, ReplStream};
use crate::redis::{ConnectOptions, Endpoint, Node};

/// What the archiver is given.
#[derive(Clone)]
pub struct Settings {
    /// The pod's own server.
    pub own: Endpoint,
    /// This pod's address as the primary lists its replicas.
    pub pod_ip: String,
    /// This pod's name (runs are named after it).
    pub pod: String,
    /// How to connect to the own server.
    pub own_options: ConnectOptions,
    /// How to connect to the primary (another pod).
    pub peer_options: ConnectOptions,
    /// One instance per primary: archive the primary itself.
    pub alone: bool,
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// `s3://bucket` or `file://dir`, for messages.
    pub location: String,
    /// `<root>/<line>`.
    pub prefix: String,
    /// A Cluster Redis's shard: recorded in bases' manifests, and each
    /// checkpoint also reads the slots its primary serves (`CLUSTER
    /// NODES`), recorded in the segments.
    pub shard: Option<i32>,
    /// How often a segment is cut.
    pub interval: Duration,
    /// How often a checkpoint is taken.
    pub checkpoint_every: Duration,
    /// How often a new base is taken within a run.
    pub base_every: Duration,
    /// How long what is no longer needed for a restore inside it is kept.
    pub retention: Duration,
    /// Bytes queued for upload beyond which the stream is not read.
    pub queue_limit: usize,
    /// The port the sidecars serve `/status` on (each asks the others
    /// before it starts).
    pub status_port: u16,
}

/// What `/status` answers and `/metrics` shows.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// Whether this sidecar archives now.
    pub archiving: bool,
    /// Why not, or what it does.
    pub activity: String,
    /// The run being written.
    pub run: Option<String>,
    /// The replication offset received (whole commands).
    pub received_offset: i64,
    /// The offset the store holds.
    pub uploaded_offset: i64,
    /// The newest checkpoint the store holds (ms since the epoch).
    pub newest_ms: i64,
    /// The earliest time a restore can reach (ms), from the last listing.
    pub earliest_ms: i64,
    /// Bytes waiting for upload.
    pub queued_bytes: usize,
    /// Bytes uploaded by this sidecar.
    pub uploaded_bytes: u64,
    /// Segments uploaded by this sidecar.
    pub segments: u64,
    /// Bases taken by this sidecar.
    pub bases: u64,
    /// Upload failures (each retried).
    pub upload_failures: u64,
    /// The last error, bounded category and message (no secret).
    pub last_error: Option<String>,
    /// Times no checkpoint of the archive covers, `[from, to]` in ms: a
    /// new run that began with a full resync after another run ended.
    pub holes: Vec<(i64, i64)>,
    /// Bytes the archive holds under this line (from the last listing).
    pub archive_bytes: u64,
    /// The lag beyond which the archive is behind (three segment
    /// intervals and 10 s): what the `RedisArchiveBehind` alert compares.
    pub lag_bound_seconds: f64,
}

/// Shared with the HTTP endpoint.
pub type Shared = Arc<Mutex<State>>;

fn set(state: &Shared, f: impl FnOnce(&mut State)) {
    if let Ok(mut s) = state.lock() {
        f(&mut s);
    }
}

/// Runs the archiver until the process is stopped.
pub async fn run(settings: Settings, state: Shared) {
    set(&state, |s| {
        s.lag_bound_seconds = 3.0 * settings.interval.as_secs_f64() + 10.0;
    });
    // Since when no sidecar has been seen archiving while this one could.
    let mut unattended: Option<Instant> = None;
    loop {
        match turn(&settings).await {
            Ok(Turn::Mine(kind)) => {
                unattended = None;
                set(&state, |s| {
                    s.archiving = true;
                    s.activity = match kind {
                        Kind::Fallback => format!(
                            "archiving from {} (the shard's primary, while no replica is online)",
                            settings.own
                        ),
                        _ => format!("archiving from {}", settings.own),
                    };
                });
                if let Err(e) = session(&settings, &state, &settings.own, kind).await {
                    tracing::warn!(error = %e, "archive session ended");
                    set(&state, |s| s.last_error = Some(e.to_string()));
                }
                set(&state, |s| {
                    s.archiving = false;
                    s.run = None;
                });
                continue;
            }
            Ok(Turn::Lowest(ip)) => {
                // The lowest-addressed replica starts; another one only
                // when it has not for a while (its sidecar may be down).
                let since = *unattended.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(10) {
                    unattended = None;
                    set(&state, |s| {
                        s.activity = format!("replica {ip} did not start archiving; taking over")
                    });
                    continue_as_mine(&settings, &state).await;
                    continue;
                }
                set(&state, |s| {
                    s.archiving = false;
                    s.activity = format!("replica {ip} is to archive");
                });
            }
            Err(why) => {
                unattended = None;
                set(&state, |s| {
                    s.archiving = false;
                    s.activity = why;
                });
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs a session although another replica was to start (it did not).
async fn continue_as_mine(settings: &Settings, state: &Shared) {
    set(state, |s| s.archiving = true);
    if let Err(e) = session(settings, state, &settings.own, Kind::Replica).await {
        tracing::warn!(error = %e, "archive session ended");
        set(state, |s| s.last_error = Some(e.to_string()));
    }
    set(state, |s| {
        s.archiving = false;
        s.run = None;
    });
}

/// Whose turn it is to archive.
enum Turn {
    /// This sidecar's, reading its server as `Kind` says.
    Mine(Kind),
    /// The replica at this address is to start (none archives yet).
    Lowest(String),
}

/// How this sidecar's server may be archived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The primary, alone (`--alone`).
    Primary,
    /// A Cluster shard's primary while no replica of it is online.
    Fallback,
    /// An online replica: its stream, checkpoints from its primary.
    Replica,
}

impl Kind {
    /// Whether the server archived is the primary itself (checkpoints
    /// read from it).
    fn direct(self) -> bool {
        self != Kind::Replica
    }
}

/// Whether this sidecar's server may be archived now: a primary alone, a
/// Cluster shard's primary with no write fence and no replica online, or
/// an online replica of a real primary (not a fence). The primary's
/// address for a replica.
async fn eligible(s: &Settings) -> Result<(Kind, Option<Endpoint>), String> {
    let mut own = Node::connect(&s.own, &s.own_options)
        .await
        .map_err(|e| format!("waiting for the server: {e}"))?;
    let info = own
        .replication()
        .await
        .map_err(|e| format!("waiting for the server: {e}"))?;
    if s.alone {
        return match info.role {
            Some(Role::Primary) => Ok((Kind::Primary, None)),
            _ => Err("not the primary".into()),
        };
    }
    if info.role == Some(Role::Primary) {
        // A replica link that acknowledges counts toward a write fence:
        // only where there is none (a Cluster's shard). This sidecar's
        // own link, once it archives, is listed too (port 0: it names no
        // listening port, as a server does).
        let online = info.replicas.iter().any(real_replica);
        return if s.shard.is_some() && info.good_replicas.is_none() && !online {
            Ok((Kind::Fallback, None))
        } else {
            Err("not a replica with a live link".into())
        };
    }
    if info.role != Some(Role::Replica)
        || info.link_status != Some(crate::redis::info::LinkStatus::Up)
    {
        return Err("not a replica with a live link".into());
    }
    let primary = info.primary.ok_or("the server names no primary")?;
    {
        use crate::controller::layout::{BOOT_FENCE_HOST, BOOT_FENCE_PORT, SOURCE_FENCE_PORT};
        if primary.host() == BOOT_FENCE_HOST
            && [BOOT_FENCE_PORT, SOURCE_FENCE_PORT].contains(&primary.port())
        {
            return Err("the server follows a fence".into());
        }
    }
    Ok((Kind::Replica, Some(primary)))
}

/// An online replica server: not an archive's link, which names no
/// listening port (listed with port 0).
fn real_replica(r: &crate::redis::info::ReplicaEntry) -> bool {
    r.state == "online" && r.endpoint.port() != 0
}

/// Whose turn: none while another replica's sidecar archives (the one
/// archiving keeps its turn while its server stays an online replica: a
/// replica that just resynced in full could not continue the archive from
/// its backlog), nor while the primary's own sidecar does (a Cluster
/// shard's, until it has stored what it received); else the online
/// replica with the lowest address.
async fn turn(s: &Settings) -> Result<Turn, String> {
    let (kind, primary) = eligible(s).await?;
    let Some(primary) = primary else {
        return Ok(Turn::Mine(kind));
    };
    let mut p = Node::connect(&primary, &s.peer_options)
        .await
        .map_err(|e| format!("asking the primary {primary}: {e}"))?;
    let pinfo = p
        .replication()
        .await
        .map_err(|e| format!("asking the primary {primary}: {e}"))?;
    // The primary's own sidecar's link (port 0) is not a replica to take
    // turns with.
    let online: Vec<String> = pinfo
        .replicas
        .iter()
        .filter(|r| real_replica(r))
        .map(|r| r.endpoint.host().to_string())
        .collect();
    for ip in online.iter().filter(|ip| **ip != s.pod_ip) {
        if fetch_status(ip, s.status_port)
            .await
            .is_some_and(|st| st["archiving"] == true)
        {
            return Err(format!("replica {ip} archives"));
        }
    }
    match online.into_iter().min_by_key(|h| sort_key(h)) {
        Some(first) if first == s.pod_ip => {
            if s.shard.is_some()
                && fetch_status(primary.host(), s.status_port)
                    .await
                    .is_some_and(|st| st["archiving"] == true)
            {
                return Err(format!(
                    "the primary's sidecar ({}) archives until it has stored what it received",
                    primary.host()
                ));
            }
            Ok(Turn::Mine(kind))
        }
        Some(first) => Ok(Turn::Lowest(first)),
        None => Err("the primary lists no online replica".into()),
    }
}

/// `GET /status` of the archive sidecar at `ip:port`, within 1 s.
pub async fn fetch_status(ip: &str, port: u16) -> Option<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: archive\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.take(1 << 20).read_to_end(&mut buf).await.ok()?;
        let at = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        serde_json::from_slice(&buf[at + 4..]).ok()
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
}

/// Addresses compared as IPv4 numbers when they are.
fn sort_key(host: &str) -> (u8, u128, String) {
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => (0, u128::from(u32::from(a)), String::new()),
        Ok(std::net::IpAddr::V6(a)) => (1, u128::from(a), String::new()),
        Err(_) => (2, 0, host.to_string()),
    }
}

/// Lists the line: runs (with their `run.json`), segments, bases (with
/// their manifests), and the bytes held.
pub async fn list(
    store: &dyn ObjectStore,
    location: &str,
    prefix: &str,
) -> Result<(Listing, u64), BackupError> {
    use futures::TryStreamExt;
    let path = Path::from(prefix);
    let objects: Vec<object_store::ObjectMeta> = store
        .list(Some(&path))
        .try_collect()
        .await
        .map_err(|error| BackupError::Store {
            action: "listing",
            location: format!("{location}/{prefix}"),
            error,
        })?;
    let mut listing = Listing::default();
    let mut bytes = 0;
    for o in &objects {
        bytes += o.size;
        match archive::classify(prefix, o.location.as_ref()) {
            Entry::Run(run) => {
                let body = get(store, location, &run_key(prefix, &run)).await?;
                match serde_json::from_slice::<RunInfo>(&body) {
                    Ok(r) => listing.runs.push(r),
                    Err(e) => tracing::warn!(run, error = %e, "a run.json that does not parse"),
                }
            }
            Entry::Segment(s) => listing.segments.push(s),
            Entry::Base { run, key } => {
                match super::agent::read_manifest(store, location, &key).await {
                    Ok(m) => {
                        let at_ms = chrono::DateTime::parse_from_rfc3339(&m.started_at)
                            .map(|t| t.timestamp_millis())
                            .unwrap_or(0);
                        if let Some(offset) = m.offset {
                            listing.bases.push(archive::BaseRef {
                                run,
                                key,
                                offset,
                                at_ms,
                            });
                        }
                    }
                    // A base whose manifest is not written yet is not one.
                    Err(e) if e.category() == "StoreNotFound" => {}
                    Err(e) => return Err(e),
                }
            }
            Entry::Other => {}
        }
    }
    listing
        .segments
        .sort_by(|a, b| (&a.run, a.start, a.end).cmp(&(&b.run, b.start, b.end)));
    Ok((listing, bytes))
}

/// An object's bytes.
pub async fn get(store: &dyn ObjectStore, location: &str, key: &str) -> Result<Bytes, BackupError> {
    let path = Path::parse(key).map_err(|e| BackupError::Invalid(format!("key {key:?}: {e}")))?;
    async { store.get(&path).await?.bytes().await }
        .await
        .map_err(|error| BackupError::Store {
            action: "reading",
            location: format!("{location}/{key}"),
            error,
        })
}

async fn put(
    store: &dyn ObjectStore,
    location: &str,
    key: &str,
    body: Vec<u8>,
) -> Result<(), BackupError> {
    let path = Path::parse(key).map_err(|e| BackupError::Invalid(format!("key {key:?}: {e}")))?;
    store
        .put(&path, PutPayload::from(body))
        .await
        .map(|_| ())
        .map_err(|error| BackupError::Store {
            action: "writing",
            location: format!("{location}/{key}"),
            error,
        })
}

/// The database selected at `offset` of `run`: the segment holding it,
/// read from its start.
pub async fn db_at(
    store: &dyn ObjectStore,
    location: &str,
    listing: &Listing,
    run: &str,
    offset: i64,
) -> Result<u32, BackupError> {
    let Some(seg) = listing
        .segments
        .iter()
        .find(|s| s.run == run && s.start <= offset && offset <= s.end)
    else {
        return Err(BackupError::Invalid(format!(
            "run {run} has no segment holding offset {offset}"
        )));
    };
    let body = get(store, location, &seg.key).await?;
    let (h, bytes) = archive::split_segment(&body).map_err(BackupError::Invalid)?;
    let mut db = h.db;
    let upto = usize::try_from(offset - h.start)
        .unwrap_or(0)
        .min(bytes.len());
    archive::scan(&bytes[..upto], &mut db, |_| {})
        .map_err(|e| BackupError::Invalid(format!("segment {}: {e}", seg.key)))?;
    Ok(db)
}

/// The newest run's last byte: `(run, replid, end)`.
async fn newest_end(
    s: &Settings,
    listing: &Listing,
) -> Result<Option<(String, String, i64)>, BackupError> {
    let Some(last) = listing
        .segments
        .iter()
        .max_by(|a, b| (a.t1, &a.run, a.end).cmp(&(b.t1, &b.run, b.end)))
    else {
        return Ok(None);
    };
    // The run's furthest segment (a run's last one may hold no checkpoint).
    let Some(far) = listing
        .segments
        .iter()
        .filter(|x| x.run == last.run)
        .max_by_key(|x| x.end)
    else {
        return Ok(None);
    };
    let body = get(s.store.as_ref(), &s.location, &far.key).await?;
    let (h, _) = archive::split_segment(&body).map_err(BackupError::Invalid)?;
    Ok(Some((far.run.clone(), h.replid, h.end)))
}

/// One session: open the link (continuing the newest run when the server
/// still has its history), then receive, cut, upload and checkpoint until
/// the link breaks or this sidecar's turn ends.
async fn session(
    s: &Settings,
    state: &Shared,
    from: &Endpoint,
    kind: Kind,
) -> Result<(), BackupError> {
    let source_err = |error: crate::redis::Error| BackupError::Source {
        source_name: from.to_string(),
        error,
    };
    let (listing, bytes) = list(s.store.as_ref(), &s.location, &s.prefix).await?;
    let mut holes = holes(&listing);
    set(state, |st| {
        st.earliest_ms = listing.window().map_or(0, |w| w.0);
        st.archive_bytes = bytes;
        st.holes = holes.clone();
    });
    let mut own = Node::connect(from, &s.own_options)
        .await
        .map_err(source_err)?;
    let info = own.replication().await.map_err(source_err)?;
    let resume = match newest_end(s, &listing).await? {
        Some((run, replid, end)) => {
            let at = if info.replid.as_deref() == Some(replid.as_str()) {
                Some(end)
            } else if info.replid2.as_deref() == Some(replid.as_str()) {
                info.second_repl_offset.map(|second| end.min(second - 1))
            } else {
                None
            };
            at.map(|at| (run, replid, at))
        }
        None => None,
    };
    // A server a little behind the archive's end (the primary's stand-in
    // stored what this replica had not received yet) could not continue
    // it: wait for the server to get there, a few seconds at most.
    if let Some((_, _, at)) = &resume {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let now = own.replication().await.map_err(source_err)?;
            if now.repl_offset.is_none_or(|o| o >= *at) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let started = chrono::Utc::now();
    let run = format!("{:013}-{}", started.timestamp_millis(), s.pod);
    let base = base_key(&s.prefix, &run, started.timestamp_millis());
    let mut upload = UploadWriter::new(s.store.clone(), &base)?;
    let rdb = RdbOptions::default();
    let opened = replstream::open(
        from,
        &s.own_options,
        &rdb,
        resume.as_ref().map(|(_, id, at)| (id.as_str(), *at)),
        &mut upload,
    )
    .await;
    let (mut link, began) = match opened {
        Ok(v) => v,
        Err(e) => {
            upload.abort().await;
            return Err(source_err(e));
        }
    };
    let info = match &began {
        Began::Full {
            replid,
            offset,
            header,
            size,
            ..
        } => {
            let source = Source {
                name: s.pod.clone(),
                endpoint: from.clone(),
                options: s.own_options.clone(),
                shard: s.shard.map(|i| (i, String::new())),
                min_offset: None,
            };
            upload
                .complete(
                    &source,
                    &s.location,
                    header,
                    *size,
                    Some(replid.clone()),
                    Some(*offset),
                    started,
                )
                .await?;
            if let Some((prev, _, _)) = &resume {
                // The server could not continue the newest run: what it
                // held after it is not in the archive.
                let last = listing
                    .segments
                    .iter()
                    .filter(|x| &x.run == prev)
                    .map(|x| x.t1)
                    .max()
                    .unwrap_or(0);
                holes.push((last, started.timestamp_millis()));
            } else if let Some(last) = listing.segments.iter().map(|x| x.t1).max() {
                holes.push((last, started.timestamp_millis()));
            }
            set(state, |st| {
                st.bases += 1;
                st.archive_bytes += *size;
                st.holes = holes.clone();
            });
            RunInfo {
                format: archive::FORMAT,
                run: run.clone(),
                pod: s.pod.clone(),
                started_at: started.to_rfc3339(),
                replid: replid.clone(),
                start: *offset,
                // The database the stream has selected at the snapshot
                // (a replica serving the sync passes the primary's stream
                // on and names no database again until it changes).
                db: header
                    .aux
                    .get("repl-stream-db")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                continues: None,
                primary: kind.direct(),
            }
        }
        Began::Continued { replid } => {
            upload.abort().await;
            let (prev, _, at) = resume.clone().unwrap_or_default();
            let db = db_at(s.store.as_ref(), &s.location, &listing, &prev, at).await?;
            RunInfo {
                format: archive::FORMAT,
                run: run.clone(),
                pod: s.pod.clone(),
                started_at: started.to_rfc3339(),
                replid: replid.clone(),
                start: at,
                db,
                continues: Some(prev),
                primary: kind.direct(),
            }
        }
    };
    let body = serde_json::to_vec(&info)
        .map_err(|e| BackupError::Invalid(format!("encoding run.json: {e}")))?;
    put(
        s.store.as_ref(),
        &s.location,
        &run_key(&s.prefix, &run),
        body,
    )
    .await?;
    tracing::info!(run, start = info.start, continues = ?info.continues, ?kind, "archive run started");
    set(state, |st| {
        st.run = Some(run.clone());
        st.received_offset = info.start;
        st.uploaded_offset = info.start;
    });
    stream(s, state, &mut link, (&run, &info), from, kind).await
}

/// A segment waiting for upload.
struct Pending {
    key: String,
    body: Vec<u8>,
    end: i64,
    /// Its first and last checkpoint times (0: none).
    oldest: i64,
    newest: i64,
}

/// Receives the stream, cuts segments and uploads them, until an error
/// or the end of this sidecar's turn.
async fn stream(
    s: &Settings,
    state: &Shared,
    link: &mut ReplStream,
    (run, info): (&str, &RunInfo),
    from: &Endpoint,
    kind: Kind,
) -> Result<(), BackupError> {
    let source_err = |error: crate::redis::Error| BackupError::Source {
        source_name: from.to_string(),
        error,
    };
    let mut raw: Vec<u8> = Vec::new();
    // Whole commands received and not yet in a segment, from `seg_start`.
    let mut whole: Vec<u8> = Vec::new();
    let mut seg_start = info.start;
    let mut seg_db = info.db;
    let mut db = info.db;
    let mut checkpoints: Vec<(i64, i64)> = Vec::new();
    // A shard's layout at each checkpoint, with the checkpoint's offset.
    let mut marks: Marks = Vec::new();
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut queued = 0usize;
    let mut inflight = 0usize;
    let mut uploaded = info.start;
    let mut last_cut = Instant::now();
    let mut last_check = Instant::now() - s.checkpoint_every;
    let mut last_ack = Instant::now();
    let mut last_turn = Instant::now();
    let mut last_base = Instant::now();
    let mut base_task: Option<tokio::task::JoinHandle<Result<(), BackupError>>> = None;
    // The archiving sidecar applies the retention, a quarter of it apart
    // (at most every 10 minutes).
    let retention_every = (s.retention / 4).clamp(Duration::from_secs(5), Duration::from_secs(600));
    let mut last_retention = Instant::now();
    let mut retention_task: Option<tokio::task::JoinHandle<()>> = None;
    let mut primary: Option<Node> = None;
    let mut upload_task: Option<tokio::task::JoinHandle<(Pending, Result<(), BackupError>)>> = None;
    let mut failures_in_a_row = 0u32;
    let mut retry_at = Instant::now();
    let outcome = loop {
        // Receive (unless too much waits for the store).
        if queued < s.queue_limit {
            if let Err(e) = link.read(&mut raw, Duration::from_millis(20)).await {
                break Err(source_err(e));
            }
            let used = archive::scan(&raw, &mut db, |_| {})
                .map_err(|e| BackupError::Invalid(format!("the replication stream: {e}")))?;
            whole.extend_from_slice(&raw[..used]);
            raw.drain(..used);
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let received = seg_start + whole.len() as i64;
        // Checkpoint from the primary.
        if last_check.elapsed() >= s.checkpoint_every {
            last_check = Instant::now();
            match checkpoint(s, &mut primary, from, kind.direct()).await {
                Ok(Some(c)) if c.replid == link.replid => {
                    checkpoints.push((c.ms, c.offset));
                    if let Some((slots, moving)) = c.layout {
                        marks.push((
                            c.offset,
                            LayoutMark {
                                at: c.ms,
                                slots,
                                moving,
                            },
                        ));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    primary = None;
                    tracing::debug!(error = %e, "checkpoint");
                }
            }
        }
        // Cut a segment of the whole commands and the checkpoints they reach.
        if last_cut.elapsed() >= s.interval {
            last_cut = Instant::now();
            if let Some(p) = cut(
                &s.prefix,
                run,
                &link.replid,
                (seg_start, seg_db),
                &whole,
                (&mut checkpoints, &mut marks),
            ) {
                queue.push_back(p);
                whole.clear();
                seg_start = received;
                seg_db = db;
            }
        }
        // Upload in order, one at a time, retrying with a backoff.
        if let Some(t) = &upload_task
            && t.is_finished()
            && let Some(t) = upload_task.take()
        {
            match t.await {
                Ok((p, Ok(()))) => {
                    failures_in_a_row = 0;
                    uploaded = p.end;
                    set(state, |st| {
                        st.last_error = None;
                        // A first run's window opens with its first
                        // checkpoint stored after its base.
                        if st.earliest_ms == 0 && p.oldest > 0 {
                            st.earliest_ms = p.oldest;
                        }
                        st.uploaded_offset = p.end;
                        if p.newest > 0 {
                            st.newest_ms = p.newest;
                        }
                        st.uploaded_bytes += p.body.len() as u64;
                        st.archive_bytes += p.body.len() as u64;
                        st.segments += 1;
                    });
                }
                Ok((p, Err(e))) => {
                    failures_in_a_row += 1;
                    let wait = Duration::from_millis(250 * u64::from(failures_in_a_row.min(20)));
                    retry_at = Instant::now() + wait;
                    set(state, |st| {
                        st.upload_failures += 1;
                        st.last_error = Some(format!("{}: {e}", e.category()));
                    });
                    queue.push_front(p);
                }
                Err(join) => {
                    return Err(BackupError::Invalid(format!("the upload task: {join}")));
                }
            }
        }
        if upload_task.is_none()
            && Instant::now() >= retry_at
            && let Some(p) = coalesce(&mut queue, &s.prefix, run)
        {
            let store = s.store.clone();
            let location = s.location.clone();
            inflight = p.body.len();
            upload_task = Some(tokio::spawn(async move {
                let r = put(store.as_ref(), &location, &p.key, p.body.clone()).await;
                (p, r)
            }));
        }
        // What waits for the store: the queue and the upload in flight.
        queued = queue.iter().map(|p| p.body.len()).sum::<usize>()
            + if upload_task.is_some() { inflight } else { 0 };
        set(state, |st| {
            st.received_offset = received;
            st.queued_bytes = queued;
        });
        // Keep the link alive, acknowledging what the store holds.
        if last_ack.elapsed() >= Duration::from_millis(500) {
            last_ack = Instant::now();
            if let Err(e) = link.ack(uploaded).await {
                break Err(source_err(e));
            }
        }
        // A new base now and then, from the same server.
        if let Some(t) = &base_task
            && t.is_finished()
            && let Some(t) = base_task.take()
        {
            match t.await {
                Ok(Ok(())) => set(state, |st| st.bases += 1),
                Ok(Err(e)) => set(state, |st| st.last_error = Some(e.to_string())),
                Err(_) => {}
            }
        }
        if base_task.is_none() && last_base.elapsed() >= s.base_every {
            last_base = Instant::now();
            base_task = Some(tokio::spawn(take_base(
                s.clone(),
                run.to_string(),
                from.clone(),
            )));
        }
        if retention_task.as_ref().is_none_or(|t| t.is_finished())
            && last_retention.elapsed() >= retention_every
        {
            last_retention = Instant::now();
            let (settings, shared) = (s.clone(), state.clone());
            retention_task = Some(tokio::spawn(async move {
                if let Err(e) = apply_retention(&settings, &shared).await {
                    tracing::warn!(error = %e, "archive retention");
                }
            }));
        }
        // Still this sidecar's turn, reading the same kind of server? A
        // primary's stand-in looks each second, to hand back soon.
        let every = if kind == Kind::Fallback { 1 } else { 5 };
        if last_turn.elapsed() >= Duration::from_secs(every) {
            last_turn = Instant::now();
            match eligible(s).await {
                Ok((now, _)) if now == kind => {}
                Ok((now, _)) => {
                    tracing::info!(?kind, ?now, "archive turn ended: the server's role changed");
                    break Ok(());
                }
                Err(why) => {
                    tracing::info!(why, "archive turn ended");
                    break Ok(());
                }
            }
        }
    };
    // What was received goes too: the next run continues after it (less
    // to fetch again from a backlog that may no longer hold it).
    if let Some(p) = cut(
        &s.prefix,
        run,
        &link.replid,
        (seg_start, seg_db),
        &whole,
        (&mut checkpoints, &mut marks),
    ) {
        queue.push_back(p);
    }
    drain(s, state, queue, upload_task).await?;
    outcome
}

/// A shard's layout marks not yet in a segment, with their checkpoints'
/// offsets.
type Marks = Vec<(i64, LayoutMark)>;

/// A segment of the whole commands received since `start` (offset and
/// selected database) and the checkpoints they reach (taken out of
/// `checkpoints`, with their layout marks); `None` when there is neither.
fn cut(
    prefix: &str,
    run: &str,
    replid: &str,
    (start, db): (i64, u32),
    whole: &[u8],
    (checkpoints, marks): (&mut Vec<(i64, i64)>, &mut Marks),
) -> Option<Pending> {
    let end = start + whole.len() as i64;
    let reached: Vec<(i64, i64)> = checkpoints
        .iter()
        .copied()
        .filter(|(_, o)| *o <= end)
        .map(|(t, o)| (t, o.max(start)))
        .collect();
    checkpoints.retain(|(_, o)| *o > end);
    if whole.is_empty() && reached.is_empty() {
        return None;
    }
    // Every checkpoint has its mark: the segment's first one keeps its
    // own, later ones only where the layout changed.
    let layout = archive::compress(
        marks
            .iter()
            .filter(|(o, _)| *o <= end)
            .map(|(_, m)| m.clone())
            .collect::<Vec<_>>(),
    );
    marks.retain(|(o, _)| *o > end);
    let header = SegmentHeader {
        replid: replid.to_string(),
        start,
        end,
        db,
        checkpoints: reached,
        layout,
    };
    let (oldest, newest) = archive::times(&header.checkpoints);
    // A header of strings and numbers always encodes.
    let mut body = serde_json::to_vec(&header).unwrap_or_default();
    body.push(b'\n');
    body.extend_from_slice(whole);
    Some(Pending {
        key: segment_key(prefix, run, &header),
        body,
        end,
        oldest,
        newest,
    })
}

/// The next upload: the first queued segment, merged with those that
/// follow it (up to 8 MiB) when the store fell behind, so a queue built
/// up while it was away goes in a few requests rather than one per
/// interval.
fn coalesce(queue: &mut VecDeque<Pending>, prefix: &str, run: &str) -> Option<Pending> {
    const MAX: usize = 8 * 1024 * 1024;
    let first = queue.pop_front()?;
    if queue.is_empty() {
        return Some(first);
    }
    let Ok((mut header, bytes)) = archive::split_segment(&first.body) else {
        return Some(first);
    };
    let mut stream = bytes.to_vec();
    let mut newest = first.newest;
    while let Some(next) = queue.front() {
        if stream.len() + next.body.len() > MAX {
            break;
        }
        let Ok((h, b)) = archive::split_segment(&next.body) else {
            break;
        };
        if h.start != header.end || h.replid != header.replid {
            break;
        }
        header.end = h.end;
        header.checkpoints.extend(h.checkpoints);
        header.layout = archive::compress(
            std::mem::take(&mut header.layout)
                .into_iter()
                .chain(h.layout),
        );
        stream.extend_from_slice(b);
        newest = newest.max(next.newest);
        queue.pop_front();
    }
    let Ok(mut body) = serde_json::to_vec(&header) else {
        return Some(first);
    };
    body.push(b'\n');
    body.extend_from_slice(&stream);
    Some(Pending {
        key: segment_key(prefix, run, &header),
        body,
        end: header.end,
        oldest: archive::times(&header.checkpoints).0,
        newest,
    })
}

/// Uploads what is queued (within 30 s) when a turn ends on purpose.
async fn drain(
    s: &Settings,
    state: &Shared,
    mut queue: VecDeque<Pending>,
    task: Option<tokio::task::JoinHandle<(Pending, Result<(), BackupError>)>>,
) -> Result<(), BackupError> {
    if let Some(t) = task
        && let Ok((p, r)) = t.await
        && r.is_err()
    {
        queue.push_front(p);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(p) = queue.front() {
        if Instant::now() > deadline {
            break;
        }
        match put(s.store.as_ref(), &s.location, &p.key, p.body.clone()).await {
            Ok(()) => {
                let end = p.end;
                let newest = p.newest;
                queue.pop_front();
                set(state, |st| {
                    st.uploaded_offset = end;
                    if newest > 0 {
                        st.newest_ms = newest;
                    }
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    Ok(())
}

/// A checkpoint as read from the primary.
struct Checkpoint {
    /// The primary's clock (ms).
    ms: i64,
    /// Its replication id and offset.
    replid: String,
    offset: i64,
    /// A shard's slots and whether any is open ([`Settings::shard`]).
    layout: Option<(String, bool)>,
}

/// The primary's time and offset (and a shard's slots), read at once.
/// `None` when the server asked is not a primary.
async fn checkpoint(
    s: &Settings,
    primary: &mut Option<Node>,
    from: &Endpoint,
    direct: bool,
) -> crate::redis::Result<Option<Checkpoint>> {
    if primary.is_none() {
        let target = if direct {
            from.clone()
        } else {
            let mut own = Node::connect(&s.own, &s.own_options).await?;
            let info = own.replication().await?;
            match info.primary {
                Some(p) => p,
                None => return Ok(None),
            }
        };
        let opts = if direct {
            &s.own_options
        } else {
            &s.peer_options
        };
        *primary = Some(Node::connect(&target, opts).await?);
    }
    let Some(node) = primary.as_mut() else {
        return Ok(None);
    };
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("TIME").cmd("INFO").arg("replication");
    let ((secs, micros), text, layout) = if s.shard.is_some() {
        pipe.cmd("CLUSTER").arg("NODES");
        let (time, text, nodes): ((i64, i64), String, String) =
            node.pipeline("MULTI", &pipe).await?;
        (time, text, archive::own_layout(&nodes))
    } else {
        let (time, text): ((i64, i64), String) = node.pipeline("MULTI", &pipe).await?;
        (time, text, None)
    };
    let info = crate::redis::info::Info::parse(&text).replication;
    if info.role != Some(Role::Primary) {
        *primary = None;
        return Ok(None);
    }
    match (info.replid, info.repl_offset) {
        (Some(replid), Some(offset)) => Ok(Some(Checkpoint {
            ms: secs * 1000 + micros / 1000,
            replid,
            offset,
            layout,
        })),
        _ => Ok(None),
    }
}

/// A base within `run`: a snapshot of the archived server (the replica
/// passes on the primary's history, so its offsets are the run's).
async fn take_base(s: Settings, run: String, from: Endpoint) -> Result<(), BackupError> {
    let key = base_key(&s.prefix, &run, chrono::Utc::now().timestamp_millis());
    let source = Source {
        name: s.pod.clone(),
        endpoint: from,
        options: s.own_options.clone(),
        shard: s.shard.map(|i| (i, String::new())),
        min_offset: None,
    };
    super::agent::backup(&source, s.store.clone(), &s.location, &key)
        .await
        .map(|_| ())
}

/// Times no checkpoint covers: between a run's last checkpoint and the
/// first of a later run that did not continue it.
pub fn holes(l: &Listing) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for r in l.runs.iter().filter(|r| r.continues.is_none()) {
        let first = l
            .segments
            .iter()
            .filter(|x| x.run == r.run && x.t0 > 0)
            .map(|x| x.t0)
            .min();
        let before = l
            .segments
            .iter()
            .filter(|x| x.run != r.run && x.t1 > 0 && first.is_some_and(|f| x.t1 < f))
            .map(|x| x.t1)
            .max();
        if let (Some(a), Some(b)) = (before, first) {
            out.push((a, b));
        }
    }
    out.sort();
    out
}

/// Deletes what no restore inside the retention needs: runs that ended
/// before the newest base older than the retention, and what precedes
/// that base in its own run.
async fn apply_retention(s: &Settings, state: &Shared) -> Result<(), BackupError> {
    let (l, _) = list(s.store.as_ref(), &s.location, &s.prefix).await?;
    let cutoff = chrono::Utc::now().timestamp_millis()
        - i64::try_from(s.retention.as_millis()).unwrap_or(i64::MAX);
    let Some(base) = l
        .bases
        .iter()
        .filter(|b| b.at_ms <= cutoff)
        .max_by_key(|b| b.at_ms)
        .cloned()
    else {
        return Ok(());
    };
    let mut doomed: Vec<String> = Vec::new();
    for r in &l.runs {
        let newest = l
            .segments
            .iter()
            .filter(|x| x.run == r.run)
            .map(|x| x.t1)
            .max()
            .unwrap_or(0);
        if r.run != base.run && newest > 0 && newest < base.at_ms {
            doomed.push(run_key(&s.prefix, &r.run));
            doomed.extend(
                l.segments
                    .iter()
                    .filter(|x| x.run == r.run)
                    .map(|x| x.key.clone()),
            );
            for b in l.bases.iter().filter(|b| b.run == r.run) {
                doomed.push(super::manifest::key_for(&b.key));
                doomed.push(b.key.clone());
            }
        }
    }
    doomed.extend(
        l.segments
            .iter()
            .filter(|x| x.run == base.run && x.end < base.offset)
            .map(|x| x.key.clone()),
    );
    for b in l
        .bases
        .iter()
        .filter(|b| b.run == base.run && b.offset < base.offset)
    {
        doomed.push(super::manifest::key_for(&b.key));
        doomed.push(b.key.clone());
    }
    for key in &doomed {
        if let Ok(path) = Path::parse(key) {
            match s.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => {
                    return Err(BackupError::Store {
                        action: "deleting",
                        location: format!("{}/{key}", s.location),
                        error,
                    });
                }
            }
        }
    }
    if !doomed.is_empty() {
        tracing::info!(deleted = doomed.len(), "archive retention");
        let (l, bytes) = list(s.store.as_ref(), &s.location, &s.prefix).await?;
        set(state, |st| {
            st.earliest_ms = l.window().map_or(0, |w| w.0);
            st.archive_bytes = bytes;
        });
    }
    Ok(())
}

/// `/metrics` text of the state (names `redpilot_archive_*`).
pub fn metrics(st: &State, now_ms: i64) -> String {
    let lag = if st.archiving && st.newest_ms > 0 {
        (now_ms - st.newest_ms).max(0) as f64 / 1000.0
    } else {
        -1.0
    };
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, v: f64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
        ));
    };
    gauge(
        "redpilot_archive_archiving",
        "1 when this sidecar archives the stream now.",
        f64::from(u8::from(st.archiving)),
    );
    gauge(
        "redpilot_archive_lag_seconds",
        "Seconds since the newest checkpoint the store holds (-1 when this sidecar does not archive).",
        lag,
    );
    gauge(
        "redpilot_archive_lag_bound_seconds",
        "The lag beyond which the archive is behind (three segment intervals and 10 s).",
        st.lag_bound_seconds,
    );
    gauge(
        "redpilot_archive_newest_timestamp_seconds",
        "The newest restorable time.",
        st.newest_ms as f64 / 1000.0,
    );
    gauge(
        "redpilot_archive_earliest_timestamp_seconds",
        "The earliest restorable time.",
        st.earliest_ms as f64 / 1000.0,
    );
    gauge(
        "redpilot_archive_queued_bytes",
        "Bytes received and waiting for the store.",
        st.queued_bytes as f64,
    );
    gauge(
        "redpilot_archive_bytes",
        "Bytes the archive holds for this line.",
        st.archive_bytes as f64,
    );
    gauge(
        "redpilot_archive_upload_failures_total",
        "Segment uploads that failed (each is retried).",
        st.upload_failures as f64,
    );
    gauge(
        "redpilot_archive_holes",
        "Spans of time the archive cannot restore exactly.",
        st.holes.len() as f64,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::archive::SegmentKey;

    #[test]
    fn a_full_resync_after_another_run_is_a_hole_and_a_continuation_is_not() {
        let seg = |run: &str, t0, t1| SegmentKey {
            run: run.into(),
            start: 0,
            end: 1,
            t0,
            t1,
            key: String::new(),
        };
        let run = |name: &str, continues: Option<&str>| RunInfo {
            format: 1,
            run: name.into(),
            pod: "p".into(),
            started_at: String::new(),
            replid: "r".into(),
            start: 0,
            db: 0,
            continues: continues.map(str::to_string),
            primary: false,
        };
        let l = Listing {
            runs: vec![run("a", None), run("b", Some("a")), run("c", None)],
            segments: vec![seg("a", 100, 200), seg("b", 300, 400), seg("c", 900, 1000)],
            bases: vec![],
        };
        assert_eq!(holes(&l), vec![(400, 900)]);
        assert!(metrics(&State::default(), 0).contains("redpilot_archive_lag_seconds -1"));
    }

    #[test]
    fn ipv4_addresses_sort_as_numbers() {
        let mut v = vec!["10.0.0.10", "10.0.0.9", "10.0.1.1"];
        v.sort_by_key(|h| sort_key(h));
        assert_eq!(v, vec!["10.0.0.9", "10.0.0.10", "10.0.1.1"]);
    }
}
