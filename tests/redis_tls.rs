//! TLS (rustls) against servers started with `tls-port` and a throw-away CA.
//!
//! Every engine is probed for TLS support; Redis 7.0 (Debian, built with TLS)
//! must support it, so this suite can never pass vacuously. Engines built
//! without TLS are reported, not skipped silently.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use redis_server::{Engine, RedisServer, ServerConfig, TlsFiles};
use redpilot::redis::actions::{SwitchoverOptions, switchover};
use redpilot::redis::info::Role;
use redpilot::redis::rdb::{RdbOptions, stream_rdb};
use redpilot::redis::topology::observe;
use redpilot::redis::{ConnectOptions, ErrorCategory, Node, TlsOptions};

/// Starts a TLS-only server, or returns why the engine cannot.
fn try_tls_server(
    engine: Engine,
    tls: &TlsFiles,
    cfg: ServerConfig,
) -> Result<RedisServer, String> {
    let cfg = ServerConfig {
        tls: Some(tls.clone()),
        ..cfg
    };
    RedisServer::try_start(engine, cfg)
}

async fn wait_replicas_up(srv: &RedisServer, n: usize) {
    let opts = srv.connect_options();
    for _ in 0..500 {
        let r = Node::connect(&srv.endpoint(), &opts)
            .await
            .unwrap()
            .replication()
            .await
            .unwrap();
        if r.replicas.iter().filter(|e| e.state == "online").count() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("replicas never came online over TLS");
}

async fn tls_suite(engine: Engine, tls: &TlsFiles, other_ca: &TlsFiles) {
    let cfg = ServerConfig::default().password("tls-pw");
    let primary = try_tls_server(engine, tls, cfg.clone()).expect("TLS primary");
    let pe = primary.endpoint();
    let replicas: Vec<RedisServer> = (0..2)
        .map(|_| try_tls_server(engine, tls, cfg.clone().replica_of(&pe)).expect("TLS replica"))
        .collect();
    wait_replicas_up(&primary, 2).await;
    let opts = primary.connect_options();
    assert!(opts.tls.is_some());

    // Commands over TLS, with a password.
    let mut node = Node::connect(&pe, &opts).await.expect("TLS connect");
    let _: redis::Value = node
        .query("SET", redis::cmd("SET").arg("over").arg("tls"))
        .await
        .unwrap();
    let info = node.info().await.unwrap();
    assert_eq!(info.replication.role, Some(Role::Primary));
    assert_eq!(info.replication.replicas.len(), 2);

    // Topology and a switchover, all over TLS (replication uses TLS too).
    let mut members = vec![pe.clone()];
    members.extend(replicas.iter().map(|r| r.endpoint()));
    let t = observe(&members, &opts).await;
    assert!(t.is_healthy(), "{:?}", t.anomalies);
    let report = switchover(&members, &members[1], &opts, &SwitchoverOptions::default())
        .await
        .expect("switchover over TLS");
    assert!(report.repoint_failures.is_empty());
    let mut new_primary = Node::connect(&members[1], &opts).await.unwrap();
    let v: String = new_primary
        .query("GET", redis::cmd("GET").arg("over"))
        .await
        .unwrap();
    assert_eq!(v, "tls");

    // Snapshot over TLS.
    let mut buf = Vec::new();
    let r = stream_rdb(&members[1], &opts, &RdbOptions::default(), &mut buf)
        .await
        .expect("RDB over TLS");
    assert_eq!(r.size as usize, buf.len());

    // A CA that did not sign the server certificate: typed TLS error, on
    // both the command path and the snapshot path.
    let wrong = ConnectOptions::default()
        .with_password("tls-pw")
        .with_tls(other_ca.tls_options());
    let err = Node::connect(&pe, &wrong)
        .await
        .expect_err("untrusted certificate");
    assert_eq!(err.category(), ErrorCategory::Tls, "{err}");
    let err = stream_rdb(&pe, &wrong, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect_err("untrusted certificate");
    assert_eq!(err.category(), ErrorCategory::Tls, "{err}");

    // Wrong password over TLS is still an auth error.
    let bad = ConnectOptions::default()
        .with_password("nope")
        .with_tls(tls.tls_options());
    let err = Node::connect(&pe, &bad).await.expect_err("wrong password");
    assert_eq!(err.category(), ErrorCategory::Auth, "{err}");

    // Plain TCP against the TLS port fails within the bound.
    let plain = ConnectOptions::default()
        .with_password("tls-pw")
        .with_timeouts(Duration::from_millis(500), Duration::from_millis(500));
    let err = Node::connect(&pe, &plain)
        .await
        .expect_err("plain TCP on TLS port");
    assert!(
        matches!(
            err.category(),
            ErrorCategory::Connection | ErrorCategory::Timeout | ErrorCategory::Protocol
        ),
        "{err}"
    );

    // A malformed CA bundle is a TLS configuration error, not a panic.
    let garbage = ConnectOptions::default().with_tls(TlsOptions::with_ca(b"not a pem".to_vec()));
    let err = stream_rdb(&pe, &garbage, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect_err("bad CA");
    assert_eq!(err.category(), ErrorCategory::Tls, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_every_engine_that_supports_it() {
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsFiles::generate(&dir.path().join("ca1"));
    let other_ca = TlsFiles::generate(&dir.path().join("ca2"));
    let mut supported = Vec::new();
    let mut unsupported = Vec::new();
    for engine in Engine::ALL {
        match try_tls_server(engine, &tls, ServerConfig::default()) {
            Ok(_) => {
                tls_suite(engine, &tls, &other_ca).await;
                supported.push(engine.name());
            }
            Err(log) => {
                let reason = if log.contains("Missing implement of connection type tls")
                    || log.contains("Failed finding TLS support")
                {
                    "built without TLS (no tls connection type)"
                } else if log.contains("Bad directive") {
                    "built without TLS (tls-port is an unknown directive)"
                } else {
                    panic!(
                        "{} failed to start with TLS for another reason:\n{log}",
                        engine.name()
                    );
                };
                unsupported.push(format!("{}: {reason}", engine.name()));
            }
        }
    }
    println!("TLS tested on: {supported:?}; not available on: {unsupported:?}");
    assert!(
        supported.contains(&Engine::Redis70.name()),
        "Debian's redis-server 7.0 is built with TLS; it must pass the TLS suite"
    );
}

/// What the operator's live renewal relies on: a server re-reads its
/// certificate, key and CA files (same paths) on `CONFIG SET`, and only
/// then: new files alone change nothing. Connections opened before stay
/// up. Here the CA changes too (the new certificate is signed by another
/// CA; the CA file holds both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reads_renewed_files_on_config_set_and_keeps_its_clients() {
    use redpilot::redis::rdb::served_certificate;
    let dir = tempfile::tempdir().unwrap();
    let old = TlsFiles::generate(&dir.path().join("ca1"));
    let new = TlsFiles::generate(&dir.path().join("ca2"));
    let srv = try_tls_server(
        Engine::Redis70,
        &old,
        ServerConfig::default().password("tls-pw"),
    )
    .expect("Redis 7.0 is built with TLS");
    let ep = srv.endpoint();
    let both = [old.ca_pem.clone(), new.ca_pem.clone()].concat();
    let opts = ConnectOptions::default()
        .with_password("tls-pw")
        .with_tls(TlsOptions::servers_of_ca(both));
    let first = served_certificate(&ep, &opts).await.expect("handshake");
    let mut before = Node::connect(&ep, &opts).await.expect("client before");

    // New files in place (the kubelet's update of a mounted Secret).
    std::fs::write(&old.cert, std::fs::read(&new.cert).unwrap()).unwrap();
    std::fs::write(&old.key, std::fs::read(&new.key).unwrap()).unwrap();
    std::fs::write(
        &old.ca_cert,
        [old.ca_pem.clone(), new.ca_pem.clone()].concat(),
    )
    .unwrap();
    assert_eq!(
        served_certificate(&ep, &opts).await.expect("handshake"),
        first,
        "new files alone are not read"
    );
    let mut admin = Node::connect(&ep, &opts).await.expect("admin");
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET");
    for (k, f) in [
        ("tls-cert-file", &old.cert),
        ("tls-key-file", &old.key),
        ("tls-ca-cert-file", &old.ca_cert),
    ] {
        cmd.arg(k).arg(f.display().to_string());
    }
    let t = std::time::Instant::now();
    let _: () = admin.query("CONFIG SET", &cmd).await.expect("CONFIG SET");
    let took = t.elapsed();
    let now = served_certificate(&ep, &opts).await.expect("handshake");
    assert_ne!(now, first, "the renewed certificate is served");
    // Only the new CA is needed now.
    let only_new = ConnectOptions::default()
        .with_password("tls-pw")
        .with_tls(TlsOptions::servers_of_ca(new.ca_pem.clone()));
    Node::connect(&ep, &only_new)
        .await
        .expect("a client trusting only the new CA");
    let pong: String = before
        .query("PING", &redis::cmd("PING"))
        .await
        .expect("a client connected before the reload");
    assert_eq!(pong, "PONG");
    println!("reload: CONFIG SET of the three files took {took:?}");
}

/// Servers reached by address with certificates that name only DNS names
/// (as a user's certificate for the Services does): with the servers' own
/// CA and no name check ([`TlsOptions::servers_of_ca`]), commands and the
/// snapshot stream connect; with the name checked they are refused, and a
/// foreign CA is refused either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_reached_by_address_are_checked_by_chain_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsFiles::generate_for(&dir.path().join("ca"), &["cache.shop.svc"]);
    let foreign = TlsFiles::generate(&dir.path().join("other"));
    let srv = try_tls_server(Engine::Redis70, &tls, ServerConfig::default())
        .expect("Redis 7.0 is built with TLS");
    let ep = srv.endpoint();
    let chain_only =
        ConnectOptions::default().with_tls(TlsOptions::servers_of_ca(tls.ca_pem.clone()));
    let mut node = Node::connect(&ep, &chain_only)
        .await
        .expect("chain checked, any name");
    let pong: String = node.query("PING", &redis::cmd("PING")).await.expect("PING");
    assert_eq!(pong, "PONG");
    stream_rdb(&ep, &chain_only, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect("the snapshot stream too");
    let named = ConnectOptions::default().with_tls(TlsOptions::with_ca(tls.ca_pem.clone()));
    let err = Node::connect(&ep, &named)
        .await
        .expect_err("127.0.0.1 is not named");
    assert_eq!(err.category(), ErrorCategory::Tls, "{err}");
    let other =
        ConnectOptions::default().with_tls(TlsOptions::servers_of_ca(foreign.ca_pem.clone()));
    let err = Node::connect(&ep, &other).await.expect_err("another CA");
    assert_eq!(err.category(), ErrorCategory::Tls, "{err}");
    let err = stream_rdb(&ep, &other, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect_err("another CA, snapshot stream");
    assert_eq!(err.category(), ErrorCategory::Tls, "{err}");

    // The sidecar's mode: nothing checked, on the loopback only.
    let loopback = ConnectOptions::default().with_tls(TlsOptions::loopback());
    Node::connect(&ep, &loopback)
        .await
        .expect("the pod's own server, unchecked");
    let elsewhere = redpilot::redis::Endpoint::new("127.0.0.2", ep.port());
    let err = Node::connect(&elsewhere, &loopback)
        .await
        .expect_err("unchecked TLS to another address");
    assert!(err.to_string().contains("loopback only"), "{err}");
    let err = stream_rdb(&ep, &loopback, &RdbOptions::default(), &mut Vec::new())
        .await
        .expect_err("a snapshot stream always checks");
    assert!(err.to_string().contains("always checks"), "{err}");
}

/// How the operator tells the way a node of a Cluster Redis turning TLS on
/// or off listens now (its template answers either way): a plain-text
/// `PING` is answered by a plain-text server (`NOAUTH` before the
/// password) and by no TLS server, which refuses it at once; the TLS
/// handshake then confirms TLS. A stopped server answers neither, within
/// the connect timeout: the operator then leaves the node out of its
/// decisions rather than take it for the other way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_ping_tells_a_plain_server_from_a_tls_one_at_once() {
    use redpilot::redis::rdb::{answers_plain, served_certificate};
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsFiles::generate(&dir.path().join("ca"));
    let with_tls = try_tls_server(
        Engine::Redis70,
        &tls,
        ServerConfig::default().password("tls-pw"),
    )
    .expect("Redis 7.0 is built with TLS");
    let plain = RedisServer::start(Engine::Redis70, ServerConfig::default().password("pw"));
    let opts = ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    }
    .with_tls(TlsOptions::servers_of_ca(tls.ca_pem.clone()));

    let t = std::time::Instant::now();
    assert!(
        answers_plain(&plain.endpoint(), &opts).await,
        "a plain server answers"
    );
    assert!(
        !answers_plain(&with_tls.endpoint(), &opts).await,
        "a TLS server does not"
    );
    let both = t.elapsed();
    assert!(
        both < Duration::from_millis(500),
        "both told at once, not by a timeout: {both:?}"
    );
    served_certificate(&with_tls.endpoint(), &opts)
        .await
        .expect("the TLS server completes a handshake");

    // A stopped server: no answer either way, bounded by the timeout.
    plain.signal("-STOP");
    let t = std::time::Instant::now();
    let answered = answers_plain(&plain.endpoint(), &opts).await;
    let waited = t.elapsed();
    plain.signal("-CONT");
    assert!(!answered, "a stopped server answers nothing");
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(4),
        "bounded by the connect timeout: {waited:?}"
    );
}
