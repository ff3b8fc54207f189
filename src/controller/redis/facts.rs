//! What a pass knows, at the bottom of the Redis controller: the facts of
//! each pod and server ([`PodFacts`], built from the pod objects and the
//! servers' replies), the conditions a pass decides ([`Cond`]) and the pure
//! helpers on them. Observation fills them in, the topologies (Replication
//! and Cluster) decide from them, status reports them; this module imports
//! none of those.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::controller::layout::{probes_either, probes_tls};
use crate::controller::names::{Names, ROLE_LABEL, SERVER_CONTAINER};
use crate::redis::info;
use crate::redis::topology::Topology;

/// Whether resource version `seen` is at least `wrote`. Resource versions
/// are opaque by contract; the API server backed by etcd hands out its
/// revision, a growing integer, and that is what this relies on. When
/// either does not parse, only equality counts.
pub fn caught_up(seen: Option<&str>, wrote: &str) -> bool {
    match (
        seen.and_then(|s| s.parse::<u64>().ok()),
        wrote.parse::<u64>(),
    ) {
        (Some(s), Ok(w)) => s >= w,
        _ => seen == Some(wrote),
    }
}

/// Parses a Kubernetes quantity of bytes ("1Gi", "512M", "1e9", "100").
pub fn quantity_bytes(q: &Quantity) -> Option<u64> {
    quantity_value(&q.0).map(|v| v as u64)
}

/// The value of a Kubernetes quantity ("1Gi", "512M", "1e9", "100m"), when
/// it is one and is finite and not negative.
pub fn quantity_value(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let value: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "m" => 1e-3,
        s if s.starts_with('e') || s.starts_with('E') => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let v = value * mult;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// One condition as the reconciler sees it, before times are attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    /// `Ready`, `Progressing`, `Degraded`, `PrimaryAvailable` or
    /// `UpgradeFailed`.
    pub type_: &'static str,
    /// True or false.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human message.
    pub message: String,
}

impl Cond {
    /// A condition.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Cond {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Merges `desired` into `previous`: a condition whose status did not change
/// keeps its `lastTransitionTime`; others get `now`.
pub fn merge(
    previous: &[Condition],
    desired: &[Cond],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let old = previous.iter().find(|c| c.type_ == d.type_);
            let last = match old {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => Time(now),
            };
            Condition {
                type_: d.type_.to_string(),
                status: status.to_string(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time: last,
            }
        })
        .collect()
}

/// Replication role as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Accepts writes.
    Primary,
    /// Follows a primary.
    Replica,
}

/// What the reconciler knows about one pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodFacts {
    /// Pod name.
    pub name: String,
    /// Pod IP, once assigned.
    pub ip: Option<String>,
    /// Pod Ready condition.
    pub ready: bool,
    /// Running an older template revision than the StatefulSet's (and not
    /// one it keeps, see the `kept` module).
    pub outdated: bool,
    /// The template revision the pod runs.
    pub revision: Option<String>,
    /// The pod is being deleted (it may still serve until it stops).
    pub terminating: bool,
    /// Current value of the role label.
    pub role_label: Option<String>,
    /// The server answered INFO.
    pub reachable: bool,
    /// Observed role.
    pub role: Option<Role>,
    /// For replicas: the primary address (IP) they follow.
    pub following: Option<String>,
    /// For replicas: link to the primary is up.
    pub link_up: Option<bool>,
    /// Replication offset.
    pub offset: Option<i64>,
    /// For replicas: bytes behind.
    pub lag_bytes: Option<i64>,
    /// Server version.
    pub version: Option<String>,
    /// Server engine.
    pub engine: Option<info::EngineKind>,
    /// For replicas: seconds since the primary was last heard from — 0 to
    /// a few while the link is up, the time since it went down otherwise;
    /// `None` when the link never came up (or the server did not say).
    pub link_age: Option<i64>,
    /// For replicas: a full synchronisation is in progress (the dataset is
    /// being replaced).
    pub syncing: bool,
    /// The server container's image.
    pub image: Option<String>,
    /// Why the server container is waiting (`ErrImagePull`,
    /// `CrashLoopBackOff`, ...) and the kubelet's message.
    pub waiting: Option<(String, String)>,
    /// How often the server container restarted, and how the last run ended.
    pub restarts: i32,
    /// Exit code of the server container's last run, when it ended.
    pub last_exit: Option<i32>,
    /// Bytes of memory the server uses, and its maxmemory (0: no limit).
    pub used_memory: Option<u64>,
    /// See `used_memory`.
    pub maxmemory: Option<u64>,
    /// The part of `used_memory` the keys take (`used_memory_dataset`).
    pub dataset: Option<u64>,
    /// The server container's memory limit in the pod's spec (an in-place
    /// resize changes it first).
    pub mem_limit: Option<u64>,
    /// The memory limit the kubelet reports in effect (`status.
    /// containerStatuses[].resources`); `None` when it reports none.
    pub mem_limit_applied: Option<u64>,
    /// A resize the kubelet has not finished: the condition
    /// (`PodResizePending`, `PodResizeInProgress`), its reason and message.
    pub resize: Option<(String, String, String)>,
    /// The node the pod runs on.
    pub node: Option<String>,
    /// For a primary with a write fence: replicas that acknowledged within
    /// `maxLagSeconds`; 0 means it refuses writes (`NOREPLICAS`).
    pub good_replicas: Option<u32>,
    /// Seconds the pod has been not Ready without a break (since its Ready
    /// condition last turned false, or since it was created); `None` while
    /// Ready.
    pub unready_secs: Option<i64>,
    /// Since when (Unix seconds) the pod has been Ready; `None` while not.
    pub ready_since: Option<i64>,
    /// The pod's server listens with TLS: as its template starts it (its
    /// readiness probe speaks TLS; pods of two templates differ while TLS
    /// is turned on or off), or, for a template of a Cluster Redis turning
    /// TLS on or off (`either`), as a handshake showed.
    pub listens_tls: bool,
    /// The pod's template is one of a Cluster Redis turning TLS on or off:
    /// the operator switches its server live (port, bus, replication), and
    /// its readiness probe answers either way.
    pub either: bool,
    /// For a pod of that template (`either`): neither a TLS handshake nor
    /// a plain-text `PING` got an answer (down, or too slow to tell), so
    /// `listens_tls` is only how it started; decisions that depend on how
    /// it listens now leave it out.
    pub listen_unknown: bool,
    /// For the primary of a Redis that follows a source
    /// (`spec.replicaOf`): its link to the source. Such a server is a
    /// replica to Redis, and the primary of this Redis to the operator
    /// (`role` says Primary; `following` and `link_up` are its own
    /// replicas' concern, so `None`).
    pub upstream: Option<Upstream>,
    /// The server follows the fence a Redis's primary is held at while it
    /// may not follow its source (`layout::SOURCE_FENCE_PORT`): for a Redis
    /// without a source, the sign its primary was demoted from outside.
    pub fenced_off_source: bool,
}

/// The link of a Redis's primary to the source it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Upstream {
    /// Pointed at the fence (see `layout::SOURCE_FENCE_PORT`), not at the
    /// source.
    pub fenced: bool,
    /// The link is up and not in a full synchronisation.
    pub link_up: bool,
    /// A full synchronisation is in progress.
    pub syncing: bool,
    /// Seconds since the source was last heard from (link up) or since the
    /// link went down.
    pub link_age: Option<i64>,
}

/// The source a Redis follows, as its primary's `INFO` names it: a server
/// following it (or the fence held in its place) is that Redis's primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceAddress {
    /// As given in `spec.replicaOf.host`.
    pub host: String,
    /// Its port.
    pub port: u16,
}

impl SourceAddress {
    /// The source of `redis`: `spec.replicaOf`, or, once that is removed
    /// and until the promotion is done, the one recorded in
    /// `status.replicaOf`.
    pub fn of(redis: &crate::api::v1alpha1::Redis) -> Option<Self> {
        if let Some(r) = &redis.spec.replica_of {
            return Some(SourceAddress {
                host: r.host.clone(),
                port: r.port(),
            });
        }
        let recorded = redis.status.as_ref()?.replica_of.as_ref()?;
        let (host, port) = recorded.source.rsplit_once(':')?;
        Some(SourceAddress {
            host: host.to_string(),
            port: port.parse().ok()?,
        })
    }

    /// Whether a replica following `e` follows the source (`Some(false)`),
    /// the fence held in its place (`Some(true)`), or neither.
    pub fn fenced(&self, e: &crate::redis::Endpoint) -> Option<bool> {
        use crate::controller::layout::{BOOT_FENCE_HOST, SOURCE_FENCE_PORT};
        if e.host() == BOOT_FENCE_HOST && e.port() == SOURCE_FENCE_PORT {
            Some(true)
        } else if e.host().eq_ignore_ascii_case(&self.host) && e.port() == self.port {
            Some(false)
        } else {
            None
        }
    }
}

/// Facts from the pod objects alone, sorted by ordinal. Pods being deleted
/// are kept (marked `terminating`): a primary that is shutting down is still
/// the primary until it stops, and must not be mistaken for a missing one.
pub fn pod_facts(pods: &[Pod], update_revision: Option<&str>, kept: &[String]) -> Vec<PodFacts> {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let mut out: Vec<PodFacts> = pods
        .iter()
        .map(|p| {
            let status = p.status.as_ref();
            let ready_cond = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
            let ready = ready_cond.is_some_and(|c| c.status == "True");
            let created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second());
            let unready_since = ready_cond
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.as_second())
                .or(created);
            let revision = p.labels().get("controller-revision-hash").cloned();
            let server_spec = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == SERVER_CONTAINER));
            let server = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == SERVER_CONTAINER));
            PodFacts {
                name: p.name_any(),
                ip: status
                    .and_then(|s| s.pod_ip.clone())
                    .filter(|s| !s.is_empty()),
                ready,
                outdated: match (update_revision, revision.as_deref()) {
                    (Some(want), Some(have)) => want != have && !kept.iter().any(|k| k == have),
                    _ => false,
                },
                revision: revision.clone(),
                role_label: p.labels().get(ROLE_LABEL).cloned(),
                terminating: p.metadata.deletion_timestamp.is_some(),
                image: server_spec.and_then(|c| c.image.clone()),
                waiting: server.and_then(|c| {
                    let w = c.state.as_ref()?.waiting.as_ref()?;
                    Some((w.reason.clone()?, w.message.clone().unwrap_or_default()))
                }),
                restarts: server.map_or(0, |c| c.restart_count),
                last_exit: server
                    .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
                    .map(|t| t.exit_code),
                unready_secs: if ready {
                    None
                } else {
                    unready_since.map(|t| now.saturating_sub(t))
                },
                ready_since: if ready { unready_since } else { None },
                mem_limit: server_spec.and_then(|c| memory_limit(c.resources.as_ref())),
                mem_limit_applied: server.and_then(|c| memory_limit(c.resources.as_ref())),
                resize: status
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| {
                        cs.iter().find(|c| {
                            (c.type_ == "PodResizePending" || c.type_ == "PodResizeInProgress")
                                && c.status == "True"
                        })
                    })
                    .map(|c| {
                        (
                            c.type_.clone(),
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default(),
                        )
                    }),
                node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                listens_tls: server_spec.is_some_and(probes_tls),
                either: server_spec.is_some_and(probes_either),
                ..Default::default()
            }
        })
        .collect();
    out.sort_by_key(|f| ordinal_of(&f.name).unwrap_or(i32::MAX));
    out
}

/// The memory limit (or, without one, the request) of a container.
pub fn memory_limit(r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>) -> Option<u64> {
    let r = r?;
    let q = r
        .limits
        .as_ref()
        .and_then(|l| l.get("memory"))
        .or_else(|| r.requests.as_ref().and_then(|l| l.get("memory")))?;
    quantity_bytes(q)
}

pub(crate) fn ordinal_of(name: &str) -> Option<i32> {
    name.rsplit_once('-')?.1.parse().ok()
}

/// The StatefulSet ordinal of a pod of this Redis.
pub fn ordinal(pod: &str, names: &Names) -> Option<i32> {
    pod.strip_prefix(&names.statefulset())?
        .strip_prefix('-')?
        .parse()
        .ok()
}

/// Adds what the servers reported.
pub fn merge_topology(facts: &mut [PodFacts], topo: &Topology, source: Option<&SourceAddress>) {
    for f in facts.iter_mut() {
        let Some(ip) = &f.ip else { continue };
        let Some(node) = topo.nodes.iter().find(|n| n.endpoint.host() == ip) else {
            continue;
        };
        f.reachable = node.reachable();
        f.role = match node.role {
            Some(info::Role::Primary) => Some(Role::Primary),
            Some(info::Role::Replica) => Some(Role::Replica),
            _ => None,
        };
        f.following = node.primary.as_ref().map(|e| e.host().to_string());
        f.link_up = match f.role {
            Some(Role::Replica) => {
                Some(node.link == Some(info::LinkStatus::Up) && !node.sync_in_progress)
            }
            _ => None,
        };
        f.offset = node.offset;
        f.lag_bytes = node.lag_bytes;
        f.syncing = node.sync_in_progress;
        f.link_age = match (f.role, node.link) {
            (Some(Role::Replica), Some(info::LinkStatus::Up)) => {
                node.last_io_seconds.filter(|s| *s >= 0)
            }
            (Some(Role::Replica), _) => node.link_down_seconds.filter(|s| *s >= 0),
            _ => None,
        };
        f.version = node.version.map(|v| v.to_string());
        f.engine = node.engine;
        f.used_memory = node.used_memory;
        f.maxmemory = node.maxmemory;
        f.dataset = node.dataset;
        f.good_replicas = node.good_replicas;
        f.fenced_off_source = node.role == Some(info::Role::Replica)
            && node.primary.as_ref().is_some_and(|e| {
                e.host() == crate::controller::layout::BOOT_FENCE_HOST
                    && e.port() == crate::controller::layout::SOURCE_FENCE_PORT
            });
        if let (Some(source), Some(info::Role::Replica), Some(up)) =
            (source, node.role, node.primary.as_ref())
            && let Some(fenced) = source.fenced(up)
        {
            f.upstream = Some(Upstream {
                fenced,
                link_up: f.link_up == Some(true),
                syncing: node.sync_in_progress,
                link_age: f.link_age,
            });
            f.role = Some(Role::Primary);
            f.following = None;
            f.link_up = None;
            f.link_age = None;
            f.syncing = false;
        }
    }
}

/// The address of pod `pod`, when it has one.
pub fn ip_of(facts: &[PodFacts], pod: &str) -> Option<String> {
    facts.iter().find(|f| f.name == pod)?.ip.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse() {
        assert_eq!(quantity_bytes(&Quantity("1Gi".into())), Some(1 << 30));
        assert_eq!(quantity_bytes(&Quantity("512Mi".into())), Some(512 << 20));
        assert_eq!(quantity_bytes(&Quantity("1G".into())), Some(1_000_000_000));
        assert_eq!(quantity_bytes(&Quantity("1e3".into())), Some(1000));
        assert_eq!(quantity_bytes(&Quantity("12345".into())), Some(12345));
        assert_eq!(quantity_bytes(&Quantity("1Xi".into())), None);
        assert_eq!(quantity_bytes(&Quantity("".into())), None);
    }

    #[test]
    fn transition_time_is_kept_while_status_holds() {
        let t0 = Timestamp::from_second(1_000).expect("t0");
        let t1 = Timestamp::from_second(2_000).expect("t1");
        let first = merge(
            &[],
            &[Cond::new("Ready", false, "Creating", "0/3")],
            Some(1),
            t0,
        );
        assert_eq!(first[0].last_transition_time, Time(t0));
        let same = merge(
            &first,
            &[Cond::new("Ready", false, "Creating", "1/3")],
            Some(1),
            t1,
        );
        assert_eq!(same[0].last_transition_time, Time(t0));
        assert_eq!(same[0].message, "1/3");
        let flipped = merge(
            &same,
            &[Cond::new("Ready", true, "Ready", "3/3")],
            Some(2),
            t1,
        );
        assert_eq!(flipped[0].last_transition_time, Time(t1));
        assert_eq!(flipped[0].status, "True");
        assert_eq!(flipped[0].observed_generation, Some(2));
    }

    #[test]
    fn caught_up_compares_revisions_as_numbers() {
        assert!(caught_up(Some("120"), "99"));
        assert!(caught_up(Some("99"), "99"));
        assert!(!caught_up(Some("98"), "99"));
        assert!(!caught_up(None, "99"));
        assert!(caught_up(Some("abc"), "abc"));
        assert!(!caught_up(Some("abd"), "abc"));
    }

    #[test]
    fn pod_facts_sort_by_ordinal_and_read_revisions() {
        let pod = |name: &str, rev: &str, ip: &str| {
            serde_json::from_value::<Pod>(serde_json::json!({
                "metadata": {"name": name, "labels": {"controller-revision-hash": rev, ROLE_LABEL: "replica"}},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap_or_default()
        };
        let pods = vec![
            pod("cache-10", "a", "10.0.0.10"),
            pod("cache-2", "b", ""),
            pod("cache-0", "a", "10.0.0.1"),
        ];
        let facts = pod_facts(&pods, Some("a"), &[]);
        let names: Vec<&str> = facts.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["cache-0", "cache-2", "cache-10"]);
        assert!(!facts[0].outdated && facts[1].outdated);
        assert_eq!(facts[1].ip, None);
        assert!(facts[0].ready);
        assert_eq!(facts[0].role_label.as_deref(), Some("replica"));
        assert_eq!(ordinal("cache-10", &Names::new("cache")), Some(10));
        assert_eq!(ordinal("cachex-1", &Names::new("cache")), None);
    }
}
