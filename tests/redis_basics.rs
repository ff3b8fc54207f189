//! Connections, authentication, time bounds, typed INFO and live
//! configuration against real servers of every engine version.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::redis::config::{self, Mutability, PARAMS, apply_config, config_get};
use redpilot::redis::info::{EngineKind, Role};
use redpilot::redis::rdb::{RdbOptions, stream_rdb};
use redpilot::redis::{ConnectOptions, Endpoint, ErrorCategory, Node};

const PASSWORD: &str = "pw-Zq81-correct";
const WRONG: &str = "pw-Wx55-wrong";

async fn connections_and_info(engine: Engine) {
    let srv = RedisServer::start(engine, ServerConfig::default().password(PASSWORD));
    let ep = srv.endpoint();
    let opts = srv.connect_options();
    let mut node = Node::connect(&ep, &opts)
        .await
        .expect("connect with password");
    node.ping().await.expect("ping");

    // Data in two databases, so the keyspace section has two lines.
    for db in [0, 2] {
        let mut p = redis::pipe();
        p.cmd("SELECT").arg(db).ignore();
        for i in 0..25 {
            p.cmd("SET").arg(format!("k{i}")).arg(i).ignore();
        }
        p.cmd("EXPIRE").arg("k0").arg(1000).ignore();
        p.cmd("SELECT").arg(0).ignore();
        let mut c = redpilot::redis::redis_client(&ep, &opts)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = p.query_async(&mut c).await.expect("populate");
    }

    let info = node.info().await.expect("INFO");
    let s = &info.server;
    let expected_kind = match engine {
        Engine::Valkey81 | Engine::Valkey91 => EngineKind::Valkey,
        _ => EngineKind::Redis,
    };
    assert_eq!(s.engine, Some(expected_kind), "{engine:?}");
    let version = s.version.expect("version").to_string();
    assert!(
        version.starts_with(engine.version_prefix()),
        "{engine:?}: {version}"
    );
    assert_eq!(s.tcp_port, Some(srv.port()));
    assert_eq!(s.mode.as_deref(), Some("standalone"));
    assert!(s.uptime_seconds.is_some() && s.run_id.is_some() && s.process_id.is_some());
    assert!(info.clients.connected_clients.unwrap_or(0) >= 1);
    assert!(info.clients.maxclients.is_some());
    assert!(info.memory.used_memory.unwrap_or(0) > 0);
    assert!(info.memory.used_memory_rss.is_some());
    assert_eq!(info.memory.maxmemory, Some(0));
    assert_eq!(info.memory.maxmemory_policy.as_deref(), Some("noeviction"));
    assert_eq!(info.persistence.loading, Some(false));
    assert_eq!(info.persistence.aof_enabled, Some(false));
    assert_eq!(info.persistence.rdb_bgsave_in_progress, Some(false));
    assert!(info.persistence.rdb_changes_since_last_save.unwrap_or(0) >= 50);
    assert!(info.stats.total_connections_received.unwrap_or(0) >= 2);
    assert!(info.stats.total_commands_processed.unwrap_or(0) > 0);
    assert!(info.stats.keyspace_hits.is_some() && info.stats.evicted_keys.is_some());
    assert_eq!(info.replication.role, Some(Role::Primary));
    assert!(info.replication.repl_offset.is_some());
    assert!(
        info.replication
            .replid
            .as_ref()
            .is_some_and(|r| r.len() == 40)
    );
    assert_eq!(info.keyspace.len(), 2, "{:?}", info.keyspace);
    assert_eq!((info.keyspace[0].db, info.keyspace[0].keys), (0, 25));
    assert_eq!(info.keyspace[0].expires, 1);
    assert_eq!((info.keyspace[1].db, info.keyspace[1].keys), (2, 25));
    assert_eq!(info.total_keys(), 50);

    // Wrong password: a typed auth error that does not leak the password.
    let bad = ConnectOptions::default().with_password(WRONG);
    let err = Node::connect(&ep, &bad).await.expect_err("wrong password");
    assert_eq!(err.category(), ErrorCategory::Auth, "{engine:?}: {err}");
    assert!(!err.to_string().contains(WRONG) && !format!("{err:?}").contains(WRONG));

    // No password: the server answers NOAUTH, also an auth error.
    let err = async {
        let mut n = Node::connect(&ep, &ConnectOptions::default()).await?;
        n.ping().await
    }
    .await
    .expect_err("no password");
    assert_eq!(err.category(), ErrorCategory::Auth, "{engine:?}: {err}");

    // The snapshot path authenticates by itself.
    let mut sink = Vec::new();
    let err = stream_rdb(&ep, &bad, &RdbOptions::default(), &mut sink)
        .await
        .expect_err("wrong password for RDB");
    assert_eq!(err.category(), ErrorCategory::Auth, "{engine:?}: {err}");
    assert!(sink.is_empty());

    // ACL user.
    let _: redis::Value = node
        .query(
            "ACL SETUSER",
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("operator")
                .arg("on")
                .arg(">op-Secret-771")
                .arg("~*")
                .arg("+@all"),
        )
        .await
        .expect("ACL SETUSER");
    let acl = ConnectOptions::default().with_user("operator", "op-Secret-771");
    let mut as_user = Node::connect(&ep, &acl).await.expect("connect as ACL user");
    let who: String = as_user
        .query("ACL WHOAMI", redis::cmd("ACL").arg("WHOAMI"))
        .await
        .unwrap();
    assert_eq!(who, "operator");
    let err = Node::connect(&ep, &ConnectOptions::default().with_user("operator", WRONG))
        .await
        .expect_err("ACL user, wrong password");
    assert_eq!(err.category(), ErrorCategory::Auth, "{engine:?}: {err}");
    let err = Node::connect(
        &ep,
        &ConnectOptions::default().with_user("nobody", PASSWORD),
    )
    .await
    .expect_err("unknown ACL user");
    assert_eq!(err.category(), ErrorCategory::Auth, "{engine:?}: {err}");

    // Command timeout: DEBUG SLEEP (2 s) outlasts a 200 ms bound; the client
    // gives up long before the server answers (the margin absorbs scheduling
    // noise on a loaded 2-core machine).
    let short = opts
        .clone()
        .with_timeouts(Duration::from_secs(2), Duration::from_millis(200));
    let mut n = Node::connect(&ep, &short).await.unwrap();
    let t = Instant::now();
    let err = n
        .query::<redis::Value>("DEBUG SLEEP", redis::cmd("DEBUG").arg("SLEEP").arg("2"))
        .await
        .expect_err("DEBUG SLEEP must time out");
    assert_eq!(err.category(), ErrorCategory::Timeout, "{engine:?}: {err}");
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t.elapsed()
    );
    // A longer bound for one command (a SAVE, a MIGRATE) holds past the
    // connection's command timeout, and the next command gets the short
    // one back.
    let mut n = Node::connect(&ep, &short).await.unwrap();
    let t = Instant::now();
    let _: redis::Value = n
        .query_within(
            "DEBUG SLEEP",
            redis::cmd("DEBUG").arg("SLEEP").arg("1"),
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: a 1 s command within a 10 s bound: {e}"));
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    let err = n
        .query::<redis::Value>("DEBUG SLEEP", redis::cmd("DEBUG").arg("SLEEP").arg("1"))
        .await
        .expect_err("the command timeout is back after the longer bound");
    assert_eq!(err.category(), ErrorCategory::Timeout, "{engine:?}: {err}");
    println!("{}: INFO/auth/ACL/timeouts ok", engine.name());
}

async fn live_config(engine: Engine) {
    let srv = RedisServer::start(engine, ServerConfig::default());
    let mut node = Node::connect(&srv.endpoint(), &srv.connect_options())
        .await
        .unwrap();
    let server = node.info_section("server").await.unwrap().server;
    let (kind, version) = (server.engine.unwrap(), server.version.unwrap());
    // The typed table must match the server: every dynamic parameter can be
    // set (to its current value), every restart-only one is refused.
    let (mut dynamic, mut fixed) = (0, 0);
    let mut mismatches = Vec::new();
    for spec in PARAMS {
        let Some(mutability) = spec.mutability_on(kind, version) else {
            continue;
        };
        let Some(current) = config_get(&mut node, spec.name).await.unwrap() else {
            mismatches.push(format!("{} is missing", spec.name));
            continue;
        };
        let set = node
            .query::<redis::Value>(
                "CONFIG SET",
                redis::cmd("CONFIG").arg("SET").arg(spec.name).arg(&current),
            )
            .await;
        match mutability {
            Mutability::Dynamic => match set {
                Ok(_) => dynamic += 1,
                Err(e) => mismatches.push(format!("{} is not dynamic: {e}", spec.name)),
            },
            Mutability::RestartRequired => match set {
                Err(_) => fixed += 1,
                Ok(_) => mismatches.push(format!("{} is dynamic", spec.name)),
            },
        }
    }
    assert!(mismatches.is_empty(), "{engine:?}: {mismatches:#?}");

    let changes = apply_config(
        &mut node,
        &[
            ("maxmemory", "104857600"),
            ("maxmemory-policy", "allkeys-lru"),
            ("requirepass", "new-Secret-99"),
        ],
    )
    .await
    .expect("apply dynamic parameters");
    assert_eq!(changes.len(), 3, "{changes:?}");
    assert!(!format!("{changes:?}").contains("new-Secret-99"));
    assert_eq!(
        config_get(&mut node, "maxmemory").await.unwrap().as_deref(),
        Some("104857600")
    );
    let info = node.info().await.unwrap();
    assert_eq!(info.memory.maxmemory, Some(104857600));
    assert_eq!(info.memory.maxmemory_policy.as_deref(), Some("allkeys-lru"));
    // Idempotent: nothing changes the second time.
    let again = apply_config(&mut node, &[("maxmemory", "104857600")])
        .await
        .unwrap();
    assert!(again.is_empty());
    for bad in [("databases", "4"), ("no-such-param", "1")] {
        let err = apply_config(&mut node, &[("maxmemory", "1"), bad])
            .await
            .expect_err("rejected");
        assert_eq!(err.category(), ErrorCategory::Config, "{err}");
    }
    assert!(config::is_dynamic("maxmemory", kind, version));
    // Nothing was applied by the rejected calls.
    assert_eq!(
        config_get(&mut node, "maxmemory").await.unwrap().as_deref(),
        Some("104857600")
    );
    println!(
        "{}: {dynamic} dynamic and {fixed} restart-only parameters verified",
        engine.name()
    );
}

#[tokio::test]
async fn redis_62_connections_and_info() {
    connections_and_info(Engine::Redis62).await;
}

#[tokio::test]
async fn redis_70_connections_and_info() {
    connections_and_info(Engine::Redis70).await;
}

#[tokio::test]
async fn valkey_81_connections_and_info() {
    connections_and_info(Engine::Valkey81).await;
}

#[tokio::test]
async fn valkey_91_connections_and_info() {
    connections_and_info(Engine::Valkey91).await;
}

#[tokio::test]
async fn redis_62_live_config() {
    live_config(Engine::Redis62).await;
}

#[tokio::test]
async fn redis_70_live_config() {
    live_config(Engine::Redis70).await;
}

#[tokio::test]
async fn valkey_81_live_config() {
    live_config(Engine::Valkey81).await;
}

#[tokio::test]
async fn valkey_91_live_config() {
    live_config(Engine::Valkey91).await;
}

/// A port with nothing listening: refused at once, a connection error.
#[tokio::test]
async fn refused_port_is_a_connection_error() {
    let port = redis_server::free_port();
    let ep = Endpoint::new("127.0.0.1", port);
    let opts = ConnectOptions::default()
        .with_timeouts(Duration::from_millis(500), Duration::from_millis(500));
    let t = Instant::now();
    let err = Node::connect(&ep, &opts).await.expect_err("refused");
    assert_eq!(err.category(), ErrorCategory::Connection, "{err}");
    assert!(t.elapsed() < Duration::from_millis(500));
    let err = stream_rdb(&ep, &opts, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect_err("refused");
    assert_eq!(err.category(), ErrorCategory::Connection, "{err}");
}

/// A host that accepts TCP but never answers (the loopback stand-in for an
/// unreachable host): every entry point gives up with a timeout within its bound.
#[tokio::test]
async fn silent_host_times_out_within_the_bound() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ep = Endpoint::new("127.0.0.1", listener.local_addr().unwrap().port());
    // Accept and hold connections without ever replying.
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let bound = Duration::from_millis(300);
    // Giving up within the bound plus scheduling slack; a missing timeout
    // would hang for the OS's TCP retries (minutes).
    let slack = Duration::from_millis(700);
    let opts = ConnectOptions::default()
        .with_password(PASSWORD)
        .with_timeouts(bound, bound);

    let t = Instant::now();
    let err = Node::connect(&ep, &opts).await.expect_err("silent host");
    let took = t.elapsed();
    assert_eq!(err.category(), ErrorCategory::Timeout, "{err}");
    assert!(took >= bound && took < bound + slack, "{took:?}");
    assert!(!err.to_string().contains(PASSWORD));

    let t = Instant::now();
    let err = stream_rdb(&ep, &opts, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect_err("silent host");
    let took = t.elapsed();
    assert_eq!(err.category(), ErrorCategory::Timeout, "{err}");
    assert!(took < bound + slack, "{took:?}");

    let t = Instant::now();
    let topo = redpilot::redis::topology::observe(std::slice::from_ref(&ep), &opts).await;
    assert!(t.elapsed() < bound + slack);
    assert_eq!(
        topo.nodes[0].error.as_ref().map(|e| e.category),
        Some(ErrorCategory::Timeout)
    );
    println!("silent host: connect timed out after {took:?} (bound {bound:?})");
    hold.abort();
}

/// The metrics exporter in front of a server that stalls (`CLIENT PAUSE
/// ALL` for 3 s): ten scrapes at once cost no more than the bound each
/// (one runs `INFO`, at most `MAX_WAITING` wait, the rest are refused at
/// once instead of queueing behind it), and the server answers the next
/// scrape once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_scrapes_behind_a_stalled_server_stay_bounded() {
    use redpilot::exporter::{Exporter, MAX_WAITING, Settings};
    use std::sync::Arc;
    let server = RedisServer::start(Engine::Redis70, ServerConfig::default());
    let ep = server.endpoint();
    let timeout = Duration::from_secs(1);
    let exporter = Arc::new(Exporter::new(Settings {
        endpoint: ep.clone(),
        password_dir: None,
        password: None,
        timeout,
        tls_loopback: false,
        tls_client_dir: None,
    }));
    let first = exporter.try_scrape().await.expect("not busy");
    assert!(first.contains("\nredis_up 1\n"), "{first}");

    let mut admin = Node::connect(&ep, &ConnectOptions::default())
        .await
        .expect("connect");
    let _: () = admin
        .query(
            "CLIENT PAUSE",
            redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("ALL"),
        )
        .await
        .expect("CLIENT PAUSE");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let e = exporter.clone();
        tasks.push(tokio::spawn(async move {
            let r = e.try_scrape().await;
            (r, start.elapsed())
        }));
    }
    let mut busy = 0;
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let (r, took) = t.await.expect("task");
        slowest = slowest.max(took);
        match r {
            Err(_) => busy += 1,
            Ok(text) => assert!(text.contains("\nredis_up 0\n"), "{text}"),
        }
    }
    println!(
        "10 scrapes against a paused server: {busy} refused at once, the slowest answered in {:.2} s",
        slowest.as_secs_f64()
    );
    assert_eq!(
        busy,
        10 - MAX_WAITING,
        "beyond {MAX_WAITING} waiting, refused"
    );
    // One INFO attempt and a reconnection, each bounded by the timeout:
    // never the 3 s pause, nor ten scrapes in a row.
    assert!(
        slowest < timeout * 2 + Duration::from_millis(700),
        "slowest scrape {slowest:?}"
    );
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(start.elapsed())).await;
    let back = wait_up(&exporter).await;
    assert!(back.contains("\nredis_up 1\n"), "{back}");

    // Scrapes whose clients hung up (their futures dropped mid-wait) give
    // their places back: the next scrape is not refused.
    let _: () = admin
        .query(
            "CLIENT PAUSE",
            redis::cmd("CLIENT").arg("PAUSE").arg(1500).arg("ALL"),
        )
        .await
        .expect("CLIENT PAUSE");
    let dropped: Vec<_> = (0..MAX_WAITING)
        .map(|_| {
            let e = exporter.clone();
            tokio::spawn(async move { e.try_scrape().await.is_ok() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for t in &dropped {
        t.abort();
    }
    for t in dropped {
        let _ = t.await;
    }
    assert!(
        exporter.try_scrape().await.is_ok(),
        "a scrape after {MAX_WAITING} dropped ones is not refused"
    );
}

async fn wait_up(exporter: &redpilot::exporter::Exporter) -> String {
    for _ in 0..50 {
        if let Ok(t) = exporter.try_scrape().await
            && t.contains("\nredis_up 1\n")
        {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the exporter never saw the server again");
}

/// A snapshot taken the way hibernation takes it (`BGSAVE`, waited for)
/// never blocks the server: a client pinging throughout sees no stall like
/// the one a foreground `SAVE` of the same data causes; the file is on
/// disk when it returns.
async fn background_save_never_blocks(engine: Engine) {
    let server = RedisServer::start(engine, ServerConfig::default());
    let opts = server.connect_options();
    let mut node = Node::connect(&server.endpoint(), &opts)
        .await
        .expect("connect");
    // 96 MiB in 384 values of 256 KiB, incompressible (the RDB file
    // compresses values).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let value: String = (0..256 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 90) as u8)
        })
        .collect();
    for chunk in 0..12 {
        let mut pipe = redis::pipe();
        for i in 0..32 {
            pipe.cmd("SET")
                .arg(format!("big:{chunk}:{i}"))
                .arg(&value)
                .ignore();
        }
        let _: () = node.pipeline("SET", &pipe).await.expect("fill");
    }
    // The longest a PING waits while `run` saves.
    async fn stall_during<F: std::future::Future<Output = ()>>(
        ep: &Endpoint,
        opts: &ConnectOptions,
        run: F,
    ) -> Duration {
        let mut pinger = Node::connect(ep, opts).await.expect("connect");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        let ping = async move {
            let mut longest = Duration::ZERO;
            while !d.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                pinger.ping().await.expect("PING");
                longest = longest.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            longest
        };
        let save = async move {
            run.await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        };
        let (longest, ()) = tokio::join!(ping, save);
        longest
    }
    let ep = server.endpoint();
    let mut saver = Node::connect(&ep, &opts).await.expect("connect");
    let before: i64 = saver
        .query("LASTSAVE", &redis::cmd("LASTSAVE"))
        .await
        .expect("LASTSAVE");
    let t = Instant::now();
    let background = stall_during(&ep, &opts, async {
        saver
            .save_in_background(Duration::from_secs(60))
            .await
            .expect("background save");
    })
    .await;
    let took = t.elapsed();
    let after: i64 = saver
        .query("LASTSAVE", &redis::cmd("LASTSAVE"))
        .await
        .expect("LASTSAVE");
    assert!(after > before, "a new snapshot: {before} -> {after}");
    let dump = server.dir().join("dump.rdb");
    let size = std::fs::metadata(&dump).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 90 * 1024 * 1024,
        "{} holds {size} bytes",
        dump.display()
    );
    let mut blocker = Node::connect(&ep, &opts).await.expect("connect");
    let foreground = stall_during(&ep, &opts, async {
        let _: redis::Value = blocker
            .query_within("SAVE", &redis::cmd("SAVE"), Duration::from_secs(60))
            .await
            .expect("SAVE");
    })
    .await;
    println!(
        "{}: background save of 96 MiB in {:.0} ms, longest PING {:.1} ms; a foreground SAVE stalled PING {:.1} ms",
        engine.name(),
        took.as_secs_f64() * 1000.0,
        background.as_secs_f64() * 1000.0,
        foreground.as_secs_f64() * 1000.0
    );
    assert!(
        foreground > background * 3 && foreground > Duration::from_millis(50),
        "the foreground SAVE is the stall the background one avoids: {foreground:?} vs {background:?}"
    );
    // The fork itself takes milliseconds; the bound leaves room for a busy
    // machine (168 ms once with the test pool's cluster jobs running).
    assert!(
        background < Duration::from_millis(300),
        "the background save blocked the server {background:?}"
    );
}

#[tokio::test]
async fn redis_62_background_save_never_blocks() {
    background_save_never_blocks(Engine::Redis62).await;
}

#[tokio::test]
async fn valkey_81_background_save_never_blocks() {
    background_save_never_blocks(Engine::Valkey81).await;
}
