//! Real servers started cluster-enabled on loopback, for the data-plane
//! Cluster suites (`tests/redis_cluster.rs`, `tests/redis_reshard.rs`).
#![allow(dead_code)]

use std::time::Duration;

use redpilot::redis::ConnectOptions;
use redpilot::redis::cluster::Member;

use super::redis_server::{Engine, RedisServer, ServerConfig};

pub const PASSWORD: &str = "cluster-pw";
/// `cluster-node-timeout` (ms): `REDPILOT_CLUSTER_NODE_TIMEOUT`, default
/// 1000 (a shard primary silent for 1 s is failed).
pub fn node_timeout_ms() -> String {
    std::env::var("REDPILOT_CLUSTER_NODE_TIMEOUT").unwrap_or_else(|_| "1000".into())
}

pub struct Cluster {
    pub servers: Vec<RedisServer>,
    pub members: Vec<Member>,
    pub opts: ConnectOptions,
}

/// `n` empty cluster-enabled servers of `engine`, with the password.
pub fn start(engine: Engine, n: usize) -> Cluster {
    start_with(engine, n, &node_timeout_ms())
}

/// [`start`] for suites that kill no node: a node timeout of 5 s, and
/// timeouts of 2 s to connect and 5 s per command, so a loaded machine
/// (a CI run's builds beside the servers) stalls a test without failing
/// a node or a connection (at 1 s a stalled bus fails nodes and a target
/// answers `MIGRATE` with `CLUSTERDOWN`).
pub fn start_calm(engine: Engine, n: usize) -> Cluster {
    let mut c = start_with(engine, n, "5000");
    c.opts = c
        .opts
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
    c
}

fn start_with(engine: Engine, n: usize, node_timeout_ms: &str) -> Cluster {
    let mut servers = Vec::new();
    let mut members = Vec::new();
    for _ in 0..n {
        let s = RedisServer::start(
            engine,
            ServerConfig::default()
                .password(PASSWORD)
                .cluster_bus()
                .with("cluster-enabled", "yes")
                .with("cluster-node-timeout", node_timeout_ms)
                // Other shards keep serving while one has no primary.
                .with("cluster-require-full-coverage", "no"),
        );
        let bus = s.bus_port().expect("a bus port");
        members.push(Member {
            endpoint: s.endpoint(),
            bus_port: bus,
        });
        servers.push(s);
    }
    let opts = servers[0]
        .connect_options()
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    Cluster {
        servers,
        members,
        opts,
    }
}
