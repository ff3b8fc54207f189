//! The backup agent (`redpilot backup`, what a backup Job runs) against a
//! real server and a real S3 server (versitygw): the snapshot lands in the
//! bucket with a manifest whose size, SHA-256 and key count match the
//! object, the object restores into a fresh server, and memory stays
//! bounded. Failures — wrong credentials, an unknown bucket, an unreachable
//! endpoint, a wrong Redis password, the S3 server killed mid-upload, the
//! source killed mid-stream — end with a reason naming the cause, never a
//! secret, and leave no object under the key. `redpilot restore` fetches a
//! backup into a file a fresh server loads, and refuses (leaving no file) a
//! missing backup, a corrupted object and an RDB too new for the server.

#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/s3_server.rs"]
mod s3_server;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis_server::{Engine, RedisServer, ServerConfig};
use s3_server::{ACCESS_KEY, S3Server, SECRET_KEY};
use sha2::{Digest, Sha256};

const BUCKET: &str = "backups";
const PASSWORD: &str = "source-password-9f2c";

/// One run of the agent.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
    peak_rss_kib: u64,
    secs: f64,
}

fn agent(server: &RedisServer, endpoint: &str, bucket: &str, key: &str, secret: &str) -> Run {
    let port = server.port().to_string();
    let args = [
        "backup",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--source-name",
        "cache-1",
    ];
    run_agent(&args, endpoint, bucket, key, secret)
}

/// `redpilot <args> --endpoint … --bucket … --key …`, with the secrets in
/// its environment.
fn run_agent(args: &[&str], endpoint: &str, bucket: &str, key: &str, secret: &str) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--endpoint", endpoint, "--bucket", bucket, "--key", key]);
    all.extend(["--path-style", "--retries", "1"]);
    run_agent_args(&all, secret)
}

/// `redpilot <args>` with the secrets in its environment; its peak RSS.
fn run_agent_args(args: &[&str], secret: &str) -> Run {
    let t = Instant::now();
    // `make bench-backup` measures the optimised build.
    let bin = std::env::var("REDPILOT_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_redpilot").to_string());
    let mut child = Command::new(bin)
        .args(args)
        .env("REDIS_PASSWORD", PASSWORD)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting redpilot backup");
    let pid = child.id();
    // The peak resident set, as the kernel counts it (VmHWM), read until
    // the process exits.
    let mut peak = 0;
    loop {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            peak = peak.max(kib);
        }
        if child.try_wait().expect("waiting").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("agent output");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        peak_rss_kib: peak,
        secs: t.elapsed().as_secs_f64(),
    }
}

/// `redis-cli` for the source.
fn cli(srv: &RedisServer) -> Command {
    let mut c = Command::new("redis-cli");
    c.args([
        "-p",
        &srv.port().to_string(),
        "--no-auth-warning",
        "-a",
        PASSWORD,
    ]);
    c
}

/// A Redis 7.0 source holding `fill_keys` keys of `value_size` bytes
/// (uncompressed in its snapshots when `compress` is false).
fn source_with(fill_keys: u64, value_size: u64, compress: bool) -> RedisServer {
    let srv = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default()
            .password(PASSWORD)
            .with("enable-debug-command", "yes")
            .with("rdbcompression", if compress { "yes" } else { "no" }),
    );
    let out = cli(&srv)
        .args([
            "DEBUG",
            "POPULATE",
            &fill_keys.to_string(),
            "key",
            &value_size.to_string(),
        ])
        .output()
        .expect("redis-cli");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("OK"),
        "DEBUG POPULATE: {out:?}"
    );
    srv
}

fn source(fill_keys: u64, value_size: u64) -> RedisServer {
    source_with(fill_keys, value_size, true)
}

/// Keys a fresh Redis 7.0 loads from `dir/dump.rdb`.
fn keys_loaded_from(dir: &std::path::Path) -> u64 {
    let restored = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default().with("dir", dir.to_str().unwrap()),
    );
    let out = Command::new("redis-cli")
        .args(["-p", &restored.port().to_string(), "DBSIZE"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("DBSIZE: {out:?}"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The reason field of the agent's failure line.
fn reason(run: &Run) -> String {
    let line = run.stderr.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("the failure line is not JSON ({e}): {}", run.stderr));
    v["reason"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_backup_lands_in_s3_with_a_manifest_that_matches_and_restores() {
    let s3 = S3Server::start(&[BUCKET]);
    let keys = 200_000;
    let srv = source(keys, 100);
    let key = "prod/cache/nightly-1.rdb";
    let run = agent(&srv, &s3.endpoint(), BUCKET, key, SECRET_KEY);
    assert!(run.ok, "backup failed: {}\n{}", run.stderr, s3.log());
    let m: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("a JSON manifest");

    // The object and its manifest, as the S3 server stored them.
    let stored = std::fs::read(s3.bucket_dir(BUCKET).join(key)).expect("the object");
    let manifest_file = std::fs::read(s3.bucket_dir(BUCKET).join(format!("{key}.manifest.json")))
        .expect("the manifest object");
    let stored_manifest: serde_json::Value =
        serde_json::from_slice(&manifest_file).expect("manifest JSON");
    assert_eq!(stored_manifest, m, "the stored manifest is the one printed");
    assert_eq!(m["sizeBytes"], stored.len() as u64);
    assert_eq!(m["sha256"], sha256_hex(&stored));
    assert_eq!(m["keys"], keys);
    assert_eq!(m["keysDb"], 0);
    assert_eq!(m["engine"], "Redis");
    assert_eq!(m["engineVersion"], "7.0.15");
    assert_eq!(m["rdbVersion"], 10);
    assert_eq!(m["source"], "cache-1");
    assert!(m["offset"].as_i64().is_some(), "{m}");
    assert!(stored.starts_with(b"REDIS0010"));
    assert_eq!(s3.files(BUCKET).len(), 2, "{:?}", s3.files(BUCKET));

    // It restores: a fresh server loads the object.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dump.rdb"), &stored).unwrap();
    assert_eq!(keys_loaded_from(dir.path()), keys);

    let mib = stored.len() as f64 / (1024.0 * 1024.0);
    println!(
        "backup of {keys} keys ({mib:.1} MiB): {:.2} s, {:.1} MiB/s, agent peak RSS {:.1} MiB",
        run.secs,
        mib / run.secs,
        run.peak_rss_kib as f64 / 1024.0
    );
}

#[test]
fn bad_requests_fail_with_the_cause_and_leave_nothing() {
    let s3 = S3Server::start(&[BUCKET]);
    let srv = source(1_000, 10);
    let key = "bad/one.rdb";

    let wrong_secret = "not-the-secret-5a7d";
    let run = agent(&srv, &s3.endpoint(), BUCKET, key, wrong_secret);
    assert!(!run.ok);
    assert_eq!(reason(&run), "StoreAccessDenied", "{}", run.stderr);
    assert!(
        run.stderr.contains("secret access key is wrong"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(wrong_secret) && !run.stdout.contains(wrong_secret));
    assert!(!run.stderr.contains(PASSWORD));

    println!("wrong secret: {}", run.stderr.trim());
    let run = agent(&srv, &s3.endpoint(), "no-such-bucket", key, SECRET_KEY);
    println!("unknown bucket: {}", run.stderr.trim());
    assert!(!run.ok);
    assert_eq!(reason(&run), "StoreNotFound", "{}", run.stderr);
    assert!(
        run.stderr.contains("the bucket does not exist"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("no-such-bucket"), "{}", run.stderr);

    let closed = format!("http://127.0.0.1:{}", redis_server::free_port());
    let run = agent(&srv, &closed, BUCKET, key, SECRET_KEY);
    println!(
        "unreachable store ({:.1}s): {}",
        run.secs,
        run.stderr.trim()
    );
    assert!(!run.ok);
    assert_eq!(reason(&run), "StoreFailed", "{}", run.stderr);
    assert!(run.stderr.contains("cannot be reached"), "{}", run.stderr);
    assert!(
        run.secs < 30.0,
        "an unreachable store took {:.1}s",
        run.secs
    );

    // The source refuses the password.
    let other = RedisServer::start(
        Engine::Redis70,
        ServerConfig::default().password("another-password"),
    );
    let run = agent(&other, &s3.endpoint(), BUCKET, key, SECRET_KEY);
    println!("wrong Redis password: {}", run.stderr.trim());
    assert!(!run.ok);
    assert_eq!(reason(&run), "SourceFailed", "{}", run.stderr);
    assert!(!run.stderr.contains(PASSWORD));

    assert!(s3.files(BUCKET).is_empty(), "{:?}", s3.files(BUCKET));
    println!(
        "wrong secret, unknown bucket, unreachable store, wrong password: each failed by name"
    );
}

/// `master_repl_offset` of the server.
fn repl_offset(srv: &RedisServer) -> i64 {
    let out = cli(srv)
        .args(["INFO", "replication"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no master_repl_offset: {out:?}"))
}

/// The check of a source's replication offset (`--min-offset`, given by
/// the operator when it chose the source on what its server said): a
/// server still at or past it is read; one restarted empty since is behind
/// it, and the read fails `SourceChanged`, storing nothing.
#[test]
fn a_source_restarted_since_it_was_chosen_is_not_read() {
    let s3 = S3Server::start(&[BUCKET]);
    let mut srv = source(1_000, 10);
    let port = srv.port().to_string();
    let reading = |min: Option<i64>, key: &str| {
        let min = min.map(|m| m.to_string());
        let mut args = vec!["backup", "--host", "127.0.0.1", "--port", &port];
        args.extend(["--source-name", "cache-1"]);
        if let Some(m) = &min {
            args.extend(["--min-offset", m]);
        }
        run_agent(&args, &s3.endpoint(), BUCKET, key, SECRET_KEY)
    };
    // A first reader makes the server start its replication backlog; the
    // writes after it move the offset on.
    assert!(reading(None, "r/first.rdb").ok);
    for i in 0..100 {
        let out = cli(&srv)
            .args(["SET", &format!("after:{i}"), "v"])
            .output()
            .expect("redis-cli");
        assert!(out.status.success(), "{out:?}");
    }
    let chosen = repl_offset(&srv);
    assert!(chosen > 0, "the offset moved: {chosen}");
    let run = reading(Some(chosen), "r/same.rdb");
    assert!(run.ok, "{}", run.stderr);
    let m: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("a JSON manifest");
    assert!(m["offset"].as_i64().is_some_and(|o| o >= chosen), "{m}");
    assert_eq!(m["keys"], 1_100, "{m}");
    // The server restarts empty (no snapshot to load).
    srv.kill9();
    for f in ["dump.rdb", "appendonlydir"] {
        let _ = std::fs::remove_file(srv.dir().join(f));
        let _ = std::fs::remove_dir_all(srv.dir().join(f));
    }
    srv.restart();
    let run = reading(Some(chosen), "r/after.rdb");
    println!(
        "source restarted since it was chosen: {}",
        run.stderr.trim()
    );
    assert!(!run.ok, "a restarted source was read: {}", run.stdout);
    assert_eq!(reason(&run), "SourceChanged", "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("behind {chosen}")),
        "{}",
        run.stderr
    );
    let files = s3.files(BUCKET);
    assert!(!files.iter().any(|f| f.starts_with("r/after")), "{files:?}");
}

/// Waits until the S3 server holds more upload data than `before` bytes,
/// then runs `act`.
fn when_uploading(s3: &S3Server, before: u64, act: impl FnOnce()) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let bytes: u64 = walk_size(&s3.bucket_dir(BUCKET));
        if bytes > before {
            break;
        }
        assert!(Instant::now() < deadline, "no upload started");
        std::thread::sleep(Duration::from_millis(10));
    }
    act();
}

fn walk_size(dir: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk_size(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

#[test]
fn a_store_or_source_lost_mid_stream_leaves_no_object() {
    let key = "mid/stream.rdb";

    // The S3 server dies while parts are being uploaded.
    let mut s3 = S3Server::start(&[BUCKET]);
    // About 130 MB of snapshot: the store dies after the first 8 MiB part.
    let srv = source_with(600_000, 200, false);
    let ep = s3.endpoint();
    let run = std::thread::scope(|sc| {
        let h = sc.spawn(|| agent(&srv, &ep, BUCKET, key, SECRET_KEY));
        when_uploading(&s3, 0, || {});
        s3.kill();
        h.join().expect("agent thread")
    });
    assert!(!run.ok, "the backup cannot succeed without its store");
    assert_eq!(reason(&run), "StoreFailed", "{}", run.stderr);
    assert!(
        run.stderr.contains("uploading"),
        "not mid-stream: {}",
        run.stderr
    );
    println!("S3 killed mid-upload: {}", run.stderr.trim());
    s3.restart();
    let files = s3.files(BUCKET);
    assert!(
        !files
            .iter()
            .any(|f| f == key || f.ends_with(".manifest.json")),
        "{files:?}"
    );

    // The source dies mid-stream.
    let pid = srv.pid().expect("the source runs");
    let before = walk_size(&s3.bucket_dir(BUCKET));
    let run = std::thread::scope(|sc| {
        let h = sc.spawn(|| agent(&srv, &ep, BUCKET, key, SECRET_KEY));
        when_uploading(&s3, before, || {
            let killed = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .expect("kill");
            assert!(killed.success());
        });
        h.join().expect("agent thread")
    });
    assert!(!run.ok);
    assert_eq!(reason(&run), "SourceFailed", "{}", run.stderr);
    println!("source killed mid-stream: {}", run.stderr.trim());
    let files = s3.files(BUCKET);
    assert!(
        !files
            .iter()
            .any(|f| f == key || f.ends_with(".manifest.json")),
        "{files:?}"
    );
    println!("S3 killed mid-upload and source killed mid-stream: both failed, no object left");
}

/// Backup throughput against `redis-cli --rdb` to local disk from the same
/// server in the same run, and the agent's peak memory. The snapshot is
/// `REDPILOT_BACKUP_MB` MiB uncompressed (default 100; `make bench-backup`
/// uses 1024). At 1 GiB the target is 0.9× redis-cli or better.
#[test]
fn backup_throughput_compared_with_redis_cli_rdb() {
    let mb: u64 = std::env::var("REDPILOT_BACKUP_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let s3 = S3Server::start(&[BUCKET]);
    // A tenth of the dataset first: the agent's memory at two sizes.
    let small = source_with(mb * 1024 / 10, 1024, false);
    let small_run = agent(
        &small,
        &s3.endpoint(),
        BUCKET,
        "bench/small.rdb",
        SECRET_KEY,
    );
    assert!(small_run.ok, "{}", small_run.stderr);
    drop(small);
    let srv = source_with(mb * 1024, 1024, false);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cli.rdb");
    let t = Instant::now();
    let out = cli(&srv)
        .arg("--rdb")
        .arg(&file)
        .output()
        .expect("redis-cli --rdb");
    let cli_secs = t.elapsed().as_secs_f64();
    assert!(out.status.success(), "redis-cli --rdb: {out:?}");
    let cli_size = std::fs::metadata(&file).unwrap().len();

    let run = agent(&srv, &s3.endpoint(), BUCKET, "bench/big.rdb", SECRET_KEY);
    assert!(run.ok, "{}", run.stderr);
    let m: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let size = m["sizeBytes"].as_u64().unwrap();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let (cli_rate, ours) = (mib(cli_size) / cli_secs, mib(size) / run.secs);
    println!(
        "snapshot {:.0} MiB: redis-cli --rdb to disk {cli_secs:.2} s ({cli_rate:.0} MiB/s); \
         redpilot backup to S3 {:.2} s ({ours:.0} MiB/s) = {:.2}x; agent peak RSS {:.1} MiB",
        mib(size),
        run.secs,
        ours / cli_rate,
        run.peak_rss_kib as f64 / 1024.0
    );
    // The same snapshot onto a directory (a volume target): the agent's own
    // cost, without the S3 server competing for the same two cores.
    let vol = tempfile::tempdir().unwrap();
    let port = srv.port().to_string();
    let vdir = vol.path().to_str().unwrap().to_string();
    let local = run_agent_args(
        &[
            "backup",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--dir",
            &vdir,
            "--key",
            "bench/big.rdb",
        ],
        SECRET_KEY,
    );
    assert!(local.ok, "{}", local.stderr);
    let vol_rate = mib(size) / local.secs;
    println!(
        "redpilot backup to a directory {:.2} s ({vol_rate:.0} MiB/s) = {:.2}x of redis-cli --rdb; peak RSS {:.1} MiB",
        local.secs,
        vol_rate / cli_rate,
        local.peak_rss_kib as f64 / 1024.0
    );
    // On a small snapshot the fork and the disk's moods dominate both
    // timings (redis-cli took 0.5 to 3.5 s for the same 100 MiB here), so
    // the ratio is only held to its target at 1 GiB and more.
    if mb >= 1024 {
        assert!(
            ours / cli_rate >= 0.9,
            "backup at {:.2}x of redis-cli --rdb (target 0.9x)",
            ours / cli_rate
        );
    }
    // Memory does not grow with the dataset: parts of 8 MiB, two in flight.
    println!(
        "agent peak RSS: {:.1} MiB for {} MiB of data, {:.1} MiB for {mb} MiB",
        small_run.peak_rss_kib as f64 / 1024.0,
        mb / 10,
        run.peak_rss_kib as f64 / 1024.0
    );
    assert!(
        run.peak_rss_kib < 96 * 1024,
        "agent peak RSS {} KiB",
        run.peak_rss_kib
    );
    assert!(
        run.peak_rss_kib < small_run.peak_rss_kib + 16 * 1024,
        "ten times the data took {} KiB against {} KiB",
        run.peak_rss_kib,
        small_run.peak_rss_kib
    );
}

fn restore(s3: &S3Server, key: &str, dest: &std::path::Path, max: Option<u32>) -> Run {
    let dest = dest.to_str().unwrap().to_string();
    let max = max.map(|m| m.to_string());
    let mut args = vec!["restore", "--dest", &dest];
    if let Some(m) = &max {
        args.extend(["--max-rdb-version", m]);
    }
    run_agent(&args, &s3.endpoint(), BUCKET, key, SECRET_KEY)
}

#[test]
fn a_restore_checks_the_backup_before_a_server_loads_it() {
    let s3 = S3Server::start(&[BUCKET]);
    let keys = 50_000;
    let srv = source(keys, 64);
    let key = "restore/one.rdb";
    let run = agent(&srv, &s3.endpoint(), BUCKET, key, SECRET_KEY);
    assert!(run.ok, "{}", run.stderr);

    // Fetched, checked, and loaded by a fresh server.
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("dump.rdb");
    let run = restore(&s3, key, &dest, Some(10));
    assert!(run.ok, "restore failed: {}", run.stderr);
    let m: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(m["keys"], keys);
    assert_eq!(keys_loaded_from(dir.path()), keys);
    println!(
        "restore of {keys} keys: {:.2} s, loaded by a fresh server",
        run.secs
    );

    // Too new for the server that would load it (Redis 6.2 reads RDB 9).
    let other = tempfile::tempdir().unwrap();
    let dest = other.path().join("dump.rdb");
    let run = restore(&s3, key, &dest, Some(9));
    assert!(!run.ok);
    assert_eq!(reason(&run), "IncompatibleVersion", "{}", run.stderr);
    assert!(
        run.stderr.contains("RDB version 10") && run.stderr.contains("writes RDB 9"),
        "{}",
        run.stderr
    );
    println!("too new: {}", run.stderr.trim());

    // No such backup.
    let run = restore(&s3, "restore/missing.rdb", &dest, None);
    assert!(!run.ok);
    assert_eq!(reason(&run), "StoreNotFound", "{}", run.stderr);

    // One byte changed in the stored object.
    let stored = s3.bucket_dir(BUCKET).join(key);
    let mut bytes = std::fs::read(&stored).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&stored, &bytes).unwrap();
    let run = restore(&s3, key, &dest, None);
    assert!(!run.ok);
    assert_eq!(reason(&run), "ChecksumMismatch", "{}", run.stderr);
    println!("corrupted: {}", run.stderr.trim());

    let left: Vec<_> = std::fs::read_dir(other.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "a refused restore left {left:?}");
}
