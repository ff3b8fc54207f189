//! The archive sidecar (`redpilot archive`) and a restore to a point in
//! time (`redpilot restore --point-in-time`), as the pods run them, against
//! real servers of every engine on loopback and a store on a directory
//! (what a volume target is).
//!
//! A primary with one replica; the archiver reads the replica's stream
//! (as in a pod beside it) and takes checkpoints from the primary. A
//! writer writes unique keys and records when each was sent and
//! acknowledged, also in another database, inside `MULTI`, with expiries
//! and counters. Restored to a time, a new server started on the restored
//! append-only file holds every key acknowledged before the checkpoint it
//! was restored to and none sent after (times in whole milliseconds: a
//! write acknowledged within the checkpoint's own millisecond may be on
//! either side), in the right database, with the
//! counter at the value it had.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::redis::Node;

const PASSWORD: &str = "archive-test-pw-7d1e";

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn bin() -> String {
    env!("CARGO_BIN_EXE_redpilot").to_string()
}

struct Archiver {
    child: Child,
    status: String,
}

impl Archiver {
    fn start(replica: &RedisServer, store: &std::path::Path) -> Self {
        Self::start_with(replica, store, &[])
    }

    fn start_with(replica: &RedisServer, store: &std::path::Path, more: &[&str]) -> Self {
        let port = redis_server::free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(bin())
            .args([
                "archive",
                "--port",
                &replica.port().to_string(),
                "--pod-ip",
                "127.0.0.1",
                "--pod",
                "r-1",
                "--dir",
                &store.display().to_string(),
                "--key",
                "root",
                "--listen",
                &listen,
                "--interval-ms",
                "200",
                "--checkpoint-ms",
                "50",
            ])
            .args(more)
            .env("REDIS_PASSWORD", PASSWORD)
            .env("REDPILOT_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting redpilot archive");
        Archiver {
            child,
            status: listen,
        }
    }

    async fn status(&self) -> Option<serde_json::Value> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.status).await.ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\n\r\n").await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let at = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        serde_json::from_slice(&buf[at + 4..]).ok()
    }

    async fn wait_newest(&self, ms: i64, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.status().await
                && s["newestMs"].as_i64().unwrap_or(0) >= ms
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the archive did not reach {} within {within:?}: {:?}",
                rfc3339(ms),
                self.status().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Archiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A write and its times.
struct Stamp {
    db: u32,
    key: String,
    sent: i64,
    acked: i64,
}

async fn connect(s: &RedisServer) -> Node {
    Node::connect(&s.endpoint(), &s.connect_options())
        .await
        .expect("connect")
}

/// Writes for `secs` seconds: plain keys in db 0, keys in db 3 (every
/// tenth), a `MULTI` of two keys (every seventh), a counter `INCR`ed, and
/// keys with a one-hour expiry.
async fn write(primary: &RedisServer, secs: u64) -> (Vec<Stamp>, Vec<(i64, i64)>) {
    let mut node = connect(primary).await;
    let mut stamps = Vec::new();
    let mut counter = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let sent = now_ms();
        let (db, key) = if n.is_multiple_of(10) {
            (3, format!("d3:{n}"))
        } else {
            (0, format!("k:{n}"))
        };
        if n.is_multiple_of(7) {
            let mut p = redis::pipe();
            p.atomic()
                .cmd("SET")
                .arg(format!("m1:{n}"))
                .arg(n)
                .cmd("SET")
                .arg(format!("m2:{n}"))
                .arg(n);
            let _: () = node.pipeline("MULTI", &p).await.expect("MULTI");
            let acked = now_ms();
            for k in [format!("m1:{n}"), format!("m2:{n}")] {
                stamps.push(Stamp {
                    db: 0,
                    key: k,
                    sent,
                    acked,
                });
            }
            continue;
        }
        if db == 3 {
            let mut p = redis::pipe();
            p.cmd("SELECT")
                .arg(3)
                .cmd("SET")
                .arg(&key)
                .arg(n)
                .cmd("SELECT")
                .arg(0);
            let _: () = node.pipeline("SELECT", &p).await.expect("SET in db 3");
        } else if n.is_multiple_of(5) {
            let _: () = node
                .query(
                    "SET",
                    redis::cmd("SET").arg(&key).arg(n).arg("EX").arg(3600),
                )
                .await
                .expect("SET EX");
        } else {
            let _: () = node
                .query("SET", redis::cmd("SET").arg(&key).arg(n))
                .await
                .expect("SET");
        }
        let acked = now_ms();
        stamps.push(Stamp {
            db,
            key,
            sent,
            acked,
        });
        let v: i64 = node
            .query("INCR", redis::cmd("INCR").arg("counter"))
            .await
            .expect("INCR");
        counter.push((now_ms(), v));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (stamps, counter)
}

/// Restores the archive in `store` to `at` into a new server of `engine`.
fn restore(engine: Engine, store: &std::path::Path, at: i64) -> (RedisServer, serde_json::Value) {
    match try_restore(engine, store, at) {
        Ok(v) => v,
        Err(e) => panic!("restore failed: {e}"),
    }
}

/// As [`restore`], the agent's output when it fails.
fn try_restore(
    engine: Engine,
    store: &std::path::Path,
    at: i64,
) -> Result<(RedisServer, serde_json::Value), String> {
    let mut server = RedisServer::start(engine, ServerConfig::default().password(PASSWORD));
    let dest = server.dir().join("redpilot-pitr.aof");
    let out = Command::new(bin())
        .args([
            "restore",
            "--dir",
            &store.display().to_string(),
            "--key",
            "root",
            "--point-in-time",
            &rfc3339(at),
            "--dest",
            &dest.display().to_string(),
        ])
        .env("REDPILOT_LOG_FORMAT", "text")
        .output()
        .expect("redpilot restore");
    if !out.status.success() {
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).expect("outcome JSON");
    server
        .config
        .extra
        .push(("appendonly".into(), "yes".into()));
    server
        .config
        .extra
        .push(("appendfilename".into(), "redpilot-pitr.aof".into()));
    if engine != Engine::Redis62 {
        server
            .config
            .extra
            .push(("appenddirname".into(), "redpilot-pitr".into()));
    }
    server.restart();
    Ok((server, outcome))
}

async fn check(
    server: &RedisServer,
    stamps: &[Stamp],
    counter: &[(i64, i64)],
    c: i64,
) -> (usize, usize) {
    let mut node = connect(server).await;
    let (mut must, mut must_not) = (0, 0);
    for db in [0u32, 3] {
        let _: () = node
            .query("SELECT", redis::cmd("SELECT").arg(db))
            .await
            .expect("SELECT");
        let mine: Vec<&Stamp> = stamps.iter().filter(|s| s.db == db).collect();
        for chunk in mine.chunks(500) {
            let mut cmd = redis::cmd("MGET");
            for s in chunk {
                cmd.arg(&s.key);
            }
            let values: Vec<Option<String>> = node.query("MGET", &cmd).await.expect("MGET");
            for (s, v) in chunk.iter().zip(values) {
                if s.acked < c {
                    must += 1;
                    let want = s.key.rsplit(':').next().unwrap_or_default();
                    assert_eq!(
                        v.as_deref(),
                        Some(want),
                        "db {db} key {} acknowledged at {} is not restored to {}",
                        s.key,
                        rfc3339(s.acked),
                        rfc3339(c)
                    );
                } else if s.sent > c {
                    must_not += 1;
                    assert_eq!(
                        v,
                        None,
                        "db {db} key {} sent at {} is restored to {}",
                        s.key,
                        rfc3339(s.sent),
                        rfc3339(c)
                    );
                }
            }
        }
    }
    let _: () = node
        .query("SELECT", redis::cmd("SELECT").arg(0))
        .await
        .expect("SELECT");
    // The counter: at least its value acknowledged before c, at most the
    // last one before the first INCR sent after c.
    let got: i64 = node
        .query("GET", redis::cmd("GET").arg("counter"))
        .await
        .unwrap_or(0);
    let low = counter
        .iter()
        .filter(|(t, _)| *t < c)
        .map(|(_, v)| *v)
        .max()
        .unwrap_or(0);
    assert!(
        got >= low,
        "counter {got} below {low} acknowledged before the checkpoint"
    );
    let expiring = stamps
        .iter()
        .find(|s| {
            s.key
                .strip_prefix("k:")
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n.is_multiple_of(5) && !n.is_multiple_of(10))
                && s.acked < c
        })
        .map(|s| s.key.clone())
        .unwrap_or_default();
    let ttl: i64 = node
        .query("TTL", redis::cmd("TTL").arg(expiring))
        .await
        .expect("TTL");
    assert!(ttl > 3000 && ttl <= 3600, "an expiry restored as {ttl}");
    (must, must_not)
}

async fn round_trip(engine: Engine) {
    let store = tempfile::tempdir().expect("store dir");
    let group = RedisServer::start_group(engine, 2, ServerConfig::default().password(PASSWORD));
    let (primary, replica) = (&group[0], &group[1]);
    let archiver = Archiver::start(replica, store.path());
    archiver
        .wait_newest(now_ms(), Duration::from_secs(30))
        .await;
    let started = now_ms();
    let (stamps, counter) = write(primary, 4).await;
    let last = stamps.last().map(|s| s.acked).unwrap_or(0);
    let st = archiver
        .wait_newest(last + 300, Duration::from_secs(30))
        .await;
    println!(
        "{}: {} writes in {:.1} s archived; {} bytes, {} segments, lag behind the stream {} ms",
        engine.name(),
        stamps.len(),
        (last - started) as f64 / 1000.0,
        st["uploadedBytes"],
        st["segments"],
        now_ms() - st["newestMs"].as_i64().unwrap_or(0)
    );
    assert_eq!(st["archiving"], true, "{st}");
    for frac in [0.3, 0.8] {
        let at = started + ((last - started) as f64 * frac) as i64;
        let (server, outcome) = restore(engine, store.path(), at);
        let c = chrono::DateTime::parse_from_rfc3339(
            outcome["checkpoint"].as_str().expect("checkpoint"),
        )
        .expect("time")
        .timestamp_millis();
        assert!(
            c <= at && at - c <= 150,
            "checkpoint {c} for {at}: {outcome}"
        );
        let (must, must_not) = check(&server, &stamps, &counter, c).await;
        println!(
            "{}: restored to {} (asked {}): {must} keys there as required, {must_not} absent as required; {} commands replayed",
            engine.name(),
            rfc3339(c),
            rfc3339(at),
            outcome["commands"]
        );
        assert!(must > 100 && must_not > 100, "too few writes on a side");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engine_restores_to_a_chosen_time_from_its_replicas_stream() {
    for engine in Engine::ALL {
        round_trip(engine).await;
    }
}

/// A base taken within a run (every 10 s here) is what a later restore
/// starts from, and the retention (20 s here) deletes what no restore
/// inside it needs: the earliest restorable time moves on, an earlier
/// time is refused with the window, a time inside it is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_bases_are_used_and_the_retention_drops_what_no_restore_needs() {
    let engine = Engine::Redis70;
    let store = tempfile::tempdir().expect("store dir");
    let group = RedisServer::start_group(engine, 2, ServerConfig::default().password(PASSWORD));
    let (primary, replica) = (&group[0], &group[1]);
    let archiver = Archiver::start_with(
        replica,
        store.path(),
        &["--base-every-seconds", "10", "--retention-seconds", "20"],
    );
    archiver
        .wait_newest(now_ms(), Duration::from_secs(30))
        .await;
    let started = now_ms();
    let (stamps, counter) = write(primary, 34).await;
    let last = stamps.last().map(|s| s.acked).unwrap_or(0);
    let st = archiver
        .wait_newest(last + 300, Duration::from_secs(30))
        .await;
    assert!(
        st["bases"].as_u64().unwrap_or(0) >= 3,
        "bases every 10 s over 34 s: {st}"
    );
    let earliest = st["earliestMs"].as_i64().unwrap_or(0);
    println!(
        "bases taken: {}, earliest restorable {} ({:.1} s after the writes began)",
        st["bases"],
        rfc3339(earliest),
        (earliest - started) as f64 / 1000.0
    );
    assert!(
        earliest > started + 5_000,
        "the retention must have dropped the first base and what only it needed: {st}"
    );
    // A time the retention dropped is refused, naming the window.
    let refused = try_restore(engine, store.path(), started + 1_000)
        .err()
        .expect("a restore before the window must fail");
    assert!(
        refused.contains("NotRestorable") && refused.contains("can restore from"),
        "{refused}"
    );
    // Near the end: from a base taken within the run.
    let at = last - 1_000;
    let (server, outcome) = restore(engine, store.path(), at);
    assert!(
        outcome["baseOffset"].as_i64().unwrap_or(0) > 0,
        "a base taken within the run: {outcome}"
    );
    let c =
        chrono::DateTime::parse_from_rfc3339(outcome["checkpoint"].as_str().expect("checkpoint"))
            .expect("time")
            .timestamp_millis();
    let (must, must_not) = check(&server, &stamps, &counter, c).await;
    println!(
        "restored to {} from base {} (offset {}), {} commands: {must} keys there as required, {must_not} absent",
        rfc3339(c),
        outcome["base"],
        outcome["baseOffset"],
        outcome["commands"]
    );
    assert!(must > 1000 && must_not > 100);
}

/// The stream names a database only when it changes: a run that begins
/// with a full resync from a replica whose stream had database 3 selected
/// keeps writing there without a `SELECT`. The restore must put them in
/// database 3 (the snapshot's `repl-stream-db`), not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_starts_with_another_database_selected_restores_into_it() {
    let engine = Engine::Redis70;
    let store = tempfile::tempdir().expect("store dir");
    let group = RedisServer::start_group(engine, 2, ServerConfig::default().password(PASSWORD));
    let (primary, replica) = (&group[0], &group[1]);
    let mut node = connect(primary).await;
    let _: () = node
        .query("SELECT", redis::cmd("SELECT").arg(3))
        .await
        .expect("SELECT");
    let _: () = node
        .query("SET", redis::cmd("SET").arg("before").arg(1))
        .await
        .expect("SET");
    replica.wait_link_up(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let archiver = Archiver::start(replica, store.path());
    archiver
        .wait_newest(now_ms(), Duration::from_secs(30))
        .await;
    // Still in database 3: the primary propagates no SELECT.
    for i in 0..50 {
        let _: () = node
            .query("SET", redis::cmd("SET").arg(format!("after:{i}")).arg(i))
            .await
            .expect("SET");
    }
    let done = now_ms();
    tokio::time::sleep(Duration::from_millis(200)).await;
    archiver
        .wait_newest(done + 200, Duration::from_secs(30))
        .await;
    let (server, outcome) = restore(engine, store.path(), done + 100);
    let mut check = connect(&server).await;
    let _: () = check
        .query("SELECT", redis::cmd("SELECT").arg(3))
        .await
        .expect("SELECT");
    let n: i64 = check
        .query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE");
    let _: () = check
        .query("SELECT", redis::cmd("SELECT").arg(0))
        .await
        .expect("SELECT");
    let zero: i64 = check
        .query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE");
    println!("database 3: {n} keys, database 0: {zero} keys ({outcome})");
    assert_eq!(
        (n, zero),
        (51, 0),
        "the writes after the snapshot belong to database 3"
    );
}
