//! Topology observation: who is primary, who follows whom, how far behind.
//!
//! [`observe`] queries a set of instances concurrently (each bounded by the
//! connection and command timeouts); [`analyze`] is the pure part that turns
//! per-node observations into a [`Topology`] with [`Anomaly`]s.

use std::collections::BTreeSet;

use futures::future::join_all;

use super::conn::{ConnectOptions, Node};
use super::endpoint::Endpoint;
use super::error::{Error, ErrorCategory};
use super::info::{Info, LinkStatus, Role, Version};

/// What one instance reported about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStatus {
    /// The instance.
    pub endpoint: Endpoint,
    /// `None` when reachable; otherwise why not.
    pub error: Option<ObservationError>,
    /// Role, when reachable.
    pub role: Option<Role>,
    /// Engine version, when reachable.
    pub version: Option<Version>,
    /// Engine, when reachable.
    pub engine: Option<super::info::EngineKind>,
    /// Applied replication offset (replica offset, or the primary's own offset).
    pub offset: Option<i64>,
    /// Replication id (`master_replid`).
    pub replid: Option<String>,
    /// For replicas: the primary they follow.
    pub primary: Option<Endpoint>,
    /// For replicas: the link state to their primary.
    pub link: Option<LinkStatus>,
    /// For replicas: a full synchronisation is in progress.
    pub sync_in_progress: bool,
    /// For replicas: bytes behind their primary (when the primary is observed).
    pub lag_bytes: Option<i64>,
    /// For replicas: seconds since the last acknowledgement, as the primary sees it.
    pub lag_seconds: Option<i64>,
    /// For replicas: `replica-priority` (0 = never promote).
    pub priority: Option<u32>,
    /// The server is loading its dataset.
    pub loading: bool,
    /// Total keys.
    pub keys: Option<u64>,
    /// For replicas: seconds since the last byte from the primary
    /// (`master_last_io_seconds_ago`; -1 when never connected).
    pub last_io_seconds: Option<i64>,
    /// For replicas: seconds since the link went down
    /// (`master_link_down_since_seconds`; -1 when it was never up).
    pub link_down_seconds: Option<i64>,
    /// Bytes of memory the server uses (`used_memory`).
    pub used_memory: Option<u64>,
    /// Its `maxmemory` (0: no limit).
    pub maxmemory: Option<u64>,
    /// The part of `used_memory` the keys take (`used_memory_dataset`).
    pub dataset: Option<u64>,
    /// For primaries with a write fence: replicas that acknowledged within
    /// the lag bound (see [`super::info::ReplicationInfo::good_replicas`]).
    pub good_replicas: Option<u32>,
}

/// Why an instance could not be observed (message without secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservationError {
    /// Bounded category.
    pub category: ErrorCategory,
    /// Human-readable message.
    pub message: String,
}

impl NodeStatus {
    /// Builds a status from a parsed `INFO`.
    pub fn from_info(endpoint: Endpoint, info: &Info) -> Self {
        let r = &info.replication;
        Self {
            endpoint,
            error: None,
            role: r.role,
            version: info.server.version,
            engine: info.server.engine,
            offset: r.applied_offset(),
            replid: r.replid.clone(),
            primary: if r.role == Some(Role::Replica) {
                r.primary.clone()
            } else {
                None
            },
            link: if r.role == Some(Role::Replica) {
                r.link_status
            } else {
                None
            },
            sync_in_progress: r.sync_in_progress.unwrap_or(false),
            lag_bytes: None,
            lag_seconds: None,
            priority: r.replica_priority,
            loading: info.persistence.loading.unwrap_or(false),
            keys: Some(info.total_keys()),
            last_io_seconds: r.last_io_seconds_ago,
            link_down_seconds: r.link_down_since_seconds,
            used_memory: info.memory.used_memory,
            maxmemory: info.memory.maxmemory,
            dataset: info.memory.used_memory_dataset,
            good_replicas: r.good_replicas,
        }
    }

    /// A status for an instance that could not be reached.
    pub fn unreachable(endpoint: Endpoint, error: &Error) -> Self {
        Self {
            endpoint,
            error: Some(ObservationError {
                category: error.category(),
                message: error.to_string(),
            }),
            role: None,
            version: None,
            engine: None,
            offset: None,
            replid: None,
            primary: None,
            link: None,
            sync_in_progress: false,
            lag_bytes: None,
            lag_seconds: None,
            priority: None,
            loading: false,
            keys: None,
            last_io_seconds: None,
            link_down_seconds: None,
            used_memory: None,
            maxmemory: None,
            dataset: None,
            good_replicas: None,
        }
    }

    /// Whether the instance answered.
    pub fn reachable(&self) -> bool {
        self.error.is_none()
    }
}

/// Something wrong with the observed topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anomaly {
    /// No reachable instance is a primary.
    NoPrimary,
    /// More than one instance claims to be primary (split brain).
    MultiplePrimaries {
        /// The primaries, sorted.
        primaries: Vec<Endpoint>,
    },
    /// A replica follows an address outside the observed set.
    ReplicaOfUnknown {
        /// The replica.
        replica: Endpoint,
        /// What it follows.
        primary: Endpoint,
    },
    /// A replica follows another replica (chained replication).
    ReplicaOfReplica {
        /// The replica.
        replica: Endpoint,
        /// The replica it follows.
        upstream: Endpoint,
    },
    /// A replica's link to its primary is down (or still synchronising).
    BrokenLink {
        /// The replica.
        replica: Endpoint,
        /// Its configured primary.
        primary: Endpoint,
    },
    /// A replica follows a primary other than the elected one (only reported
    /// alongside [`Anomaly::MultiplePrimaries`]).
    ReplicaOfOtherPrimary {
        /// The replica.
        replica: Endpoint,
        /// The primary it follows.
        primary: Endpoint,
    },
    /// An instance did not answer.
    Unreachable {
        /// The instance.
        endpoint: Endpoint,
    },
}

/// The analysed state of a set of instances.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// One status per observed instance, in input order.
    pub nodes: Vec<NodeStatus>,
    /// The primary, if exactly one reachable instance is primary.
    pub primary: Option<Endpoint>,
    /// Everything that deviates from "one primary, every other instance a
    /// healthy replica of it".
    pub anomalies: Vec<Anomaly>,
}

impl Topology {
    /// Status of one instance.
    pub fn node(&self, endpoint: &Endpoint) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| &n.endpoint == endpoint)
    }

    /// Reachable replicas of the elected primary.
    pub fn replicas(&self) -> Vec<&NodeStatus> {
        match &self.primary {
            Some(p) => self
                .nodes
                .iter()
                .filter(|n| n.role == Some(Role::Replica) && n.primary.as_ref() == Some(p))
                .collect(),
            None => Vec::new(),
        }
    }

    /// One primary, every other instance a replica of it with its link up.
    pub fn is_healthy(&self) -> bool {
        self.primary.is_some() && self.anomalies.is_empty()
    }
}

/// Turns observations into a [`Topology`]. Pure.
pub fn analyze(mut nodes: Vec<NodeStatus>) -> Topology {
    let mut anomalies = Vec::new();
    let members: BTreeSet<Endpoint> = nodes.iter().map(|n| n.endpoint.clone()).collect();
    let primaries: BTreeSet<Endpoint> = nodes
        .iter()
        .filter(|n| n.reachable() && n.role == Some(Role::Primary))
        .map(|n| n.endpoint.clone())
        .collect();

    for n in nodes.iter().filter(|n| !n.reachable()) {
        anomalies.push(Anomaly::Unreachable {
            endpoint: n.endpoint.clone(),
        });
    }
    let primary = match primaries.len() {
        0 => {
            anomalies.push(Anomaly::NoPrimary);
            None
        }
        1 => primaries.iter().next().cloned(),
        _ => {
            anomalies.push(Anomaly::MultiplePrimaries {
                primaries: primaries.iter().cloned().collect(),
            });
            // Split brain: no primary is authoritative; the caller decides
            // (usually by fencing all but the one with the highest offset).
            None
        }
    };

    let primary_offsets: Vec<(Endpoint, Option<i64>)> = nodes
        .iter()
        .filter(|n| primaries.contains(&n.endpoint))
        .map(|n| (n.endpoint.clone(), n.offset))
        .collect();
    let replica_endpoints: BTreeSet<Endpoint> = nodes
        .iter()
        .filter(|n| n.reachable() && n.role == Some(Role::Replica))
        .map(|n| n.endpoint.clone())
        .collect();

    for n in nodes
        .iter_mut()
        .filter(|n| n.reachable() && n.role == Some(Role::Replica))
    {
        let Some(upstream) = n.primary.clone() else {
            anomalies.push(Anomaly::BrokenLink {
                replica: n.endpoint.clone(),
                primary: Endpoint::new("?", 0),
            });
            continue;
        };
        if !members.contains(&upstream) {
            anomalies.push(Anomaly::ReplicaOfUnknown {
                replica: n.endpoint.clone(),
                primary: upstream.clone(),
            });
        } else if replica_endpoints.contains(&upstream) {
            anomalies.push(Anomaly::ReplicaOfReplica {
                replica: n.endpoint.clone(),
                upstream: upstream.clone(),
            });
        } else if primaries.len() > 1 && primaries.contains(&upstream) {
            anomalies.push(Anomaly::ReplicaOfOtherPrimary {
                replica: n.endpoint.clone(),
                primary: upstream.clone(),
            });
        }
        if n.link != Some(LinkStatus::Up) || n.sync_in_progress {
            anomalies.push(Anomaly::BrokenLink {
                replica: n.endpoint.clone(),
                primary: upstream.clone(),
            });
        }
        if let Some((_, Some(p_off))) = primary_offsets.iter().find(|(e, _)| e == &upstream) {
            n.lag_bytes = n.offset.map(|o| (p_off - o).max(0));
        }
    }
    Topology {
        nodes,
        primary,
        anomalies,
    }
}

/// Adds each replica's acknowledgement lag (seconds) as reported by its primary.
fn add_lag_seconds(nodes: &mut [NodeStatus], infos: &[Option<Info>]) {
    let mut lags = Vec::new();
    for (n, info) in nodes.iter().zip(infos) {
        if let (Some(info), Some(Role::Primary)) = (info, n.role) {
            for r in &info.replication.replicas {
                lags.push((n.endpoint.clone(), r.endpoint.clone(), r.lag_seconds));
            }
        }
    }
    for n in nodes.iter_mut() {
        if let Some(p) = &n.primary {
            n.lag_seconds = lags
                .iter()
                .find(|(primary, replica, _)| primary == p && replica == &n.endpoint)
                .and_then(|(_, _, lag)| *lag);
        }
    }
}

/// Queries `INFO` on every endpoint concurrently and analyses the result.
///
/// Each query is bounded by `opts`' timeouts; unreachable instances become
/// [`Anomaly::Unreachable`] instead of failing the whole observation.
#[tracing::instrument(name = "redis.observe", skip_all, fields(instances = endpoints.len()))]
pub async fn observe(endpoints: &[Endpoint], opts: &ConnectOptions) -> Topology {
    let results = join_all(endpoints.iter().map(|e| async move {
        let mut node = Node::connect(e, opts).await?;
        node.info().await
    }))
    .await;
    let mut infos = Vec::with_capacity(results.len());
    let mut nodes = Vec::with_capacity(results.len());
    for (e, r) in endpoints.iter().zip(results) {
        match r {
            Ok(info) => {
                nodes.push(NodeStatus::from_info(e.clone(), &info));
                infos.push(Some(info));
            }
            Err(err) => {
                nodes.push(NodeStatus::unreachable(e.clone(), &err));
                infos.push(None);
            }
        }
    }
    add_lag_seconds(&mut nodes, &infos);
    analyze(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16) -> Endpoint {
        Endpoint::new("127.0.0.1", port)
    }

    fn primary(port: u16, offset: i64) -> NodeStatus {
        let mut n = NodeStatus::unreachable(ep(port), &Error::State(String::new()));
        n.error = None;
        n.role = Some(Role::Primary);
        n.offset = Some(offset);
        n
    }

    fn replica(port: u16, of: u16, offset: i64, link: LinkStatus) -> NodeStatus {
        let mut n = primary(port, offset);
        n.role = Some(Role::Replica);
        n.primary = Some(ep(of));
        n.link = Some(link);
        n
    }

    #[test]
    fn healthy_primary_with_two_replicas() {
        let t = analyze(vec![
            primary(1, 100),
            replica(2, 1, 100, LinkStatus::Up),
            replica(3, 1, 60, LinkStatus::Up),
        ]);
        assert!(t.is_healthy(), "{:?}", t.anomalies);
        assert_eq!(t.primary, Some(ep(1)));
        assert_eq!(t.replicas().len(), 2);
        assert_eq!(t.node(&ep(3)).and_then(|n| n.lag_bytes), Some(40));
    }

    #[test]
    fn detects_anomalies() {
        let t = analyze(vec![
            primary(1, 100),
            primary(2, 90),
            replica(3, 9, 0, LinkStatus::Up),
            replica(4, 1, 0, LinkStatus::Down),
            replica(5, 4, 0, LinkStatus::Up),
            NodeStatus::unreachable(ep(6), &Error::State("down".into())),
        ]);
        assert_eq!(t.primary, None);
        let a = &t.anomalies;
        assert!(a.contains(&Anomaly::MultiplePrimaries {
            primaries: vec![ep(1), ep(2)]
        }));
        assert!(a.contains(&Anomaly::ReplicaOfUnknown {
            replica: ep(3),
            primary: ep(9)
        }));
        assert!(a.contains(&Anomaly::BrokenLink {
            replica: ep(4),
            primary: ep(1)
        }));
        assert!(a.contains(&Anomaly::ReplicaOfReplica {
            replica: ep(5),
            upstream: ep(4)
        }));
        assert!(a.contains(&Anomaly::ReplicaOfOtherPrimary {
            replica: ep(4),
            primary: ep(1)
        }));
        assert!(a.contains(&Anomaly::Unreachable { endpoint: ep(6) }));
    }

    #[test]
    fn no_primary() {
        let t = analyze(vec![replica(2, 1, 0, LinkStatus::Down)]);
        assert!(t.anomalies.contains(&Anomaly::NoPrimary));
        assert!(t.replicas().is_empty());
    }
}
