//! Topology observation and replication actions on 1 primary + 2 replicas,
//! for every engine version and for the 6.2 → 7.0 upgrade pair.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use redis_server::{Engine, RedisServer, ServerConfig};
use redpilot::redis::actions::{make_primary, make_replica_of, wait_caught_up};
use redpilot::redis::info::{LinkStatus, Role};
use redpilot::redis::topology::{Anomaly, observe};
use redpilot::redis::{Endpoint, Node};

async fn write_keys(ep: &Endpoint, opts: &redpilot::redis::ConnectOptions, n: usize, prefix: &str) {
    let mut node = Node::connect(ep, opts).await.unwrap();
    for i in 0..n {
        let _: redis::Value = node
            .query("SET", redis::cmd("SET").arg(format!("{prefix}{i}")).arg(i))
            .await
            .unwrap();
    }
}

/// The commands a server ran, oldest first, from its slow log (set to
/// record every command by [`record_commands`]), each as its arguments.
async fn commands_run(ep: &Endpoint, opts: &redpilot::redis::ConnectOptions) -> Vec<Vec<String>> {
    let mut n = Node::connect(ep, opts).await.unwrap();
    let entries: Vec<redis::Value> = n
        .query("SLOWLOG", redis::cmd("SLOWLOG").arg("GET").arg(1000))
        .await
        .unwrap();
    let mut out: Vec<(i64, Vec<String>)> = entries
        .iter()
        .filter_map(|e| match e {
            redis::Value::Array(f) => {
                let id = redis::from_redis_value::<i64>(f.first()?.clone()).ok()?;
                let args = redis::from_redis_value::<Vec<String>>(f.get(3)?.clone()).ok()?;
                Some((id, args.into_iter().map(|a| a.to_lowercase()).collect()))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, a)| a).collect()
}

/// Makes the server's slow log record every command from now on.
async fn record_commands(ep: &Endpoint, opts: &redpilot::redis::ConnectOptions) {
    let mut n = Node::connect(ep, opts).await.unwrap();
    for cmd in [
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-max-len")
            .arg(1000)
            .clone(),
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .clone(),
        redis::cmd("SLOWLOG").arg("RESET").clone(),
    ] {
        let _: redis::Value = n.query("CONFIG", &cmd).await.unwrap();
    }
}

async fn topology_case(primary_engine: Engine, replica_engine: Engine) {
    let cfg = ServerConfig::default().password("topo-pw");
    let p = RedisServer::start(primary_engine, cfg.clone());
    let pe = p.endpoint();
    let r1 = RedisServer::start(replica_engine, cfg.clone().replica_of(&pe));
    let r2 = RedisServer::start(replica_engine, cfg.clone().replica_of(&pe));
    r1.wait_link_up(Duration::from_secs(20));
    r2.wait_link_up(Duration::from_secs(20));
    let opts = p.connect_options();
    let members = vec![pe.clone(), r1.endpoint(), r2.endpoint()];
    write_keys(&pe, &opts, 200, "a").await;
    for r in [&r1, &r2] {
        wait_caught_up(&r.endpoint(), &pe, &opts, Duration::from_secs(10))
            .await
            .expect("caught up");
    }

    // Healthy: one primary, two replicas with offsets, links up, no lag.
    let t = observe(&members, &opts).await;
    assert!(t.is_healthy(), "{:?}", t.anomalies);
    assert_eq!(t.primary.as_ref(), Some(&pe));
    let primary = t.node(&pe).unwrap();
    assert_eq!(primary.role, Some(Role::Primary));
    assert!(primary.offset.unwrap() > 0);
    assert!(
        primary
            .version
            .unwrap()
            .to_string()
            .starts_with(primary_engine.version_prefix())
    );
    let replicas = t.replicas();
    assert_eq!(replicas.len(), 2);
    for r in &replicas {
        assert_eq!(r.role, Some(Role::Replica));
        assert_eq!(r.primary.as_ref(), Some(&pe));
        assert_eq!(r.link, Some(LinkStatus::Up));
        assert_eq!(r.offset, primary.offset, "{r:?}");
        assert_eq!(r.lag_bytes, Some(0));
        assert!(r.lag_seconds.is_some(), "{r:?}");
        assert_eq!(r.keys, Some(200));
        assert!(
            r.version
                .unwrap()
                .to_string()
                .starts_with(replica_engine.version_prefix())
        );
    }

    // Two primaries (split brain). The settings given are in place before
    // the promotion (the operator passes its write fence): the server ran
    // them before `REPLICAOF NO ONE`.
    record_commands(&r2.endpoint(), &opts).await;
    make_primary(
        &r2.endpoint(),
        &opts,
        &[
            ("min-replicas-max-lag", "9".into()),
            ("min-replicas-to-write", "1".into()),
        ],
    )
    .await
    .unwrap();
    let seen = commands_run(&r2.endpoint(), &opts).await;
    let at = |args: &[&str]| {
        seen.iter()
            .position(|c| c.len() >= args.len() && c[..args.len()] == *args)
            .unwrap_or_else(|| panic!("{args:?} not run: {seen:?}"))
    };
    let promoted_at = at(&["replicaof", "no", "one"]);
    for key in ["min-replicas-to-write", "min-replicas-max-lag"] {
        assert!(
            at(&["config", "set", key]) < promoted_at,
            "{key} set before the promotion: {seen:?}"
        );
    }
    let mut promoted = Node::connect(&r2.endpoint(), &opts).await.unwrap();
    let fence: Vec<String> = promoted
        .query(
            "CONFIG GET",
            redis::cmd("CONFIG").arg("GET").arg("min-replicas-*"),
        )
        .await
        .unwrap();
    assert!(
        fence
            .windows(2)
            .any(|w| w == ["min-replicas-to-write", "1"])
            && fence.windows(2).any(|w| w == ["min-replicas-max-lag", "9"]),
        "{fence:?}"
    );
    let refused: redpilot::redis::Result<redis::Value> = promoted
        .query("SET", redis::cmd("SET").arg("fenced").arg("1"))
        .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("NOREPLICAS")),
        "a promoted server with no replica refuses writes: {refused:?}"
    );
    drop(promoted);
    let t = observe(&members, &opts).await;
    assert_eq!(t.primary, None);
    let mut both = vec![pe.clone(), r2.endpoint()];
    both.sort();
    assert!(
        t.anomalies
            .contains(&Anomaly::MultiplePrimaries { primaries: both }),
        "{:?}",
        t.anomalies
    );

    // Replica of an address outside the set (nothing listens there either).
    let stranger = Endpoint::new("127.0.0.1", redis_server::free_port());
    make_replica_of(&r2.endpoint(), &stranger, &opts)
        .await
        .unwrap();
    let t = observe(&members, &opts).await;
    assert_eq!(t.primary.as_ref(), Some(&pe));
    assert!(t.anomalies.contains(&Anomaly::ReplicaOfUnknown {
        replica: r2.endpoint(),
        primary: stranger.clone()
    }));
    assert!(t.anomalies.contains(&Anomaly::BrokenLink {
        replica: r2.endpoint(),
        primary: stranger.clone()
    }));

    // Chained replication.
    make_replica_of(&r2.endpoint(), &r1.endpoint(), &opts)
        .await
        .unwrap();
    let t = observe(&members, &opts).await;
    assert!(t.anomalies.contains(&Anomaly::ReplicaOfReplica {
        replica: r2.endpoint(),
        upstream: r1.endpoint()
    }));

    // Repair, catch up, healthy again.
    make_replica_of(&r2.endpoint(), &pe, &opts).await.unwrap();
    write_keys(&pe, &opts, 50, "b").await;
    let caught = wait_caught_up(&r2.endpoint(), &pe, &opts, Duration::from_secs(20))
        .await
        .expect("r2 catches up after repair");
    assert!(caught.replica_offset >= caught.target_offset);
    let t = observe(&members, &opts).await;
    assert!(t.is_healthy(), "{:?}", t.anomalies);

    // Broken links: the primary dies.
    let mut p = p;
    p.kill9();
    let t = observe(&members, &opts).await;
    assert_eq!(t.primary, None);
    assert!(t.anomalies.contains(&Anomaly::NoPrimary));
    assert!(t.anomalies.contains(&Anomaly::Unreachable {
        endpoint: pe.clone()
    }));
    for r in [&r1, &r2] {
        assert!(
            t.anomalies.contains(&Anomaly::BrokenLink {
                replica: r.endpoint(),
                primary: pe.clone()
            }),
            "{:?}",
            t.anomalies
        );
    }
    println!(
        "topology {} primary + 2x {} replicas: healthy, split brain, unknown primary, chain, broken links detected",
        primary_engine.name(),
        replica_engine.name()
    );
}

#[tokio::test]
async fn redis_62_topology() {
    topology_case(Engine::Redis62, Engine::Redis62).await;
}

#[tokio::test]
async fn redis_70_topology() {
    topology_case(Engine::Redis70, Engine::Redis70).await;
}

#[tokio::test]
async fn valkey_81_topology() {
    topology_case(Engine::Valkey81, Engine::Valkey81).await;
}

#[tokio::test]
async fn valkey_91_topology() {
    topology_case(Engine::Valkey91, Engine::Valkey91).await;
}

/// The upgrade path: a 6.2 primary replicated by 7.0 replicas.
#[tokio::test]
async fn mixed_62_primary_70_replicas_topology() {
    topology_case(Engine::Redis62, Engine::Redis70).await;
}
