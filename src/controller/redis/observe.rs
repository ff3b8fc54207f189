//! Observation: the only reads of a reconcile. Children and pods come from
//! the watch caches (reflector stores fed by label-selected watches, see
//! [`crate::controller::Stores`]); the API is read only where a cache cannot
//! answer:
//! - the `Redis` itself, right after this operator wrote its status and
//!   before the watch delivered that write (a scale-down records the new
//!   primary, then the next pass must not start from the old one);
//! - a user-named auth Secret (`spec.auth.secretName`): it carries none of
//!   our labels, and the operator never watches Secrets it does not own;
//! - a child missing from its cache, before it is created: an object in the
//!   way that is not ours carries none of our labels either, and must be
//!   found and refused rather than overwritten.
//!
//! In the steady state a pass makes no read at all with a generated
//! password, one (the Secret) with a user-named one.
//!
//! The live servers are observed through [`crate::redis::topology`].
//!
//! Length: ~490 lines of code, past the ~400 guide, because every read a
//! pass makes is here on purpose (one place to count API reads); the pure
//! parts (pod facts, topology merge) are candidates to split out next.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::build::{self, Names, ROLE_LABEL};
use super::children::{Child, adoptable, controlled_by};
use super::{Error, Reconciler};
use crate::api::v1alpha1::Redis;
use crate::controller::monitor::Verdict;
use crate::redis::topology::Topology;
use crate::redis::{ConnectOptions, Endpoint, info};

/// The password, or why there is none.
pub enum Auth {
    /// The Secret to mount and the password in it (empty while paused
    /// before a Secret exists).
    Ok {
        /// Name of the Secret.
        secret_name: String,
        /// The password (never logged).
        password: String,
    },
    /// The Secret is unusable: reported in the status, then returned.
    Failed(Error),
}

/// What one pass saw.
pub struct Observed {
    /// Per pod, sorted by ordinal.
    pub facts: Vec<PodFacts>,
    /// The StatefulSet, from the cache.
    pub live_sts: Option<StatefulSet>,
    /// Whether the servers were asked (there were addresses and a password).
    pub servers_observed: bool,
}

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

impl Reconciler {
    /// A child of this Redis from its watch cache.
    pub(super) fn cached<K: Child>(&self, name: &str) -> Option<K> {
        K::store(&self.ctx.stores)?
            .get(&ObjectRef::new(name).within(&self.ns))
            .map(|o| K::clone(&o))
    }

    /// A child from its cache, or from the API when the cache has none.
    pub(super) async fn lookup<K: Child>(&self, name: &str) -> Result<Option<K>, Error> {
        match self.cached(name) {
            Some(o) => Ok(Some(o)),
            None => self.fetch(name).await,
        }
    }

    /// A child read from the API, past the cache.
    pub(super) async fn fetch<K: Child>(&self, name: &str) -> Result<Option<K>, Error> {
        self.ctx.metrics.kube("get");
        Ok(self.api::<K>().get_opt(name).await?)
    }

    /// Replaces the cached `Redis` with a fresh read when the cache has not
    /// yet seen this operator's last status write. Returns false when the
    /// Redis is gone.
    pub(super) async fn refresh(&mut self) -> Result<bool, Error> {
        let fresh = self.refresh_object().await?;
        self.keep_selector();
        Ok(fresh)
    }

    /// The live StatefulSet's selector names the pods: carry its
    /// `app.kubernetes.io/name` into the builders (see
    /// [`build::SELECTOR_NAME_ANNOTATION`]). In Cluster mode every shard's
    /// StatefulSet was created with the same one: shard 0's is read.
    fn keep_selector(&mut self) {
        let sts = if self.redis.spec.mode() == crate::api::v1alpha1::Mode::Cluster {
            super::cluster::build::shard_statefulset_name(&self.names, 0)
        } else {
            self.names.statefulset()
        };
        let live: Option<StatefulSet> = self.cached(&sts);
        let Some(name) = live.and_then(|s| {
            s.spec
                .selector
                .match_labels?
                .remove("app.kubernetes.io/name")
        }) else {
            return;
        };
        // The usual case (the engine never changed) needs no copy.
        if name == build::engine_name(self.redis.spec.engine()) {
            return;
        }
        let mut redis = Redis::clone(&self.redis);
        redis
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(build::SELECTOR_NAME_ANNOTATION.into(), name);
        self.redis = Arc::new(redis);
    }

    async fn refresh_object(&mut self) -> Result<bool, Error> {
        let Some(wrote) = self.ctx.written_version(&self.oref) else {
            return Ok(true);
        };
        if caught_up(self.redis.metadata.resource_version.as_deref(), &wrote) {
            self.ctx.forget_written(&self.oref);
            return Ok(true);
        }
        self.ctx.metrics.kube("get");
        match self.api::<Redis>().get_opt(&self.redis.name_any()).await? {
            Some(fresh) => {
                self.redis = Arc::new(fresh);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The desired password: from the Secret the spec names, or from the
    /// operator's own Secret, generated (or adopted) when there is none.
    /// `running` is the password the servers run (from the server-auth
    /// Secret): a deleted generated Secret is re-created with it, so clients
    /// keep working and nothing needs rotating.
    pub(super) async fn auth(
        &mut self,
        paused: bool,
        running: Option<&str>,
    ) -> Result<Auth, Error> {
        if let Some(name) = self.redis.spec.auth_secret_name().map(String::from) {
            return Ok(match self.fetch::<Secret>(&name).await? {
                Some(s) => match read_password(&s, &name) {
                    Ok(password) => Auth::Ok {
                        secret_name: name,
                        password,
                    },
                    Err(e) => Auth::Failed(e),
                },
                None => Auth::Failed(Error::Secret {
                    name,
                    reason: "not found (spec.auth.secretName)".into(),
                }),
            });
        }
        let name = self.names.generated_secret();
        let password = match self.lookup::<Secret>(&name).await? {
            Some(s) => {
                let meta = &s.metadata;
                if !controlled_by(meta, self.uid()) && !adoptable(meta, &self.redis.name_any()) {
                    return Ok(Auth::Failed(Error::Conflict {
                        kind: "Secret",
                        name,
                    }));
                }
                let pw = match read_password(&s, &name) {
                    Ok(pw) => pw,
                    Err(e) => return Ok(Auth::Failed(e)),
                };
                if !controlled_by(&s.metadata, self.uid()) && !paused {
                    // Adopt it: the same password, now owned by this Redis
                    // (so it goes with it). The data is applied too, so the
                    // apply can never drop the password.
                    let secret = build::auth_secret(&self.redis, &self.names, &pw);
                    self.apply("Secret", &secret, Some(&s)).await?;
                }
                pw
            }
            None if paused => String::new(),
            None => {
                let (pw, note) = match running.filter(|p| !p.is_empty()) {
                    Some(p) => (
                        p.to_string(),
                        format!("re-created Secret {name} with the password the servers run"),
                    ),
                    None => (
                        build::generate_password().map_err(|e| Error::Random(e.to_string()))?,
                        format!("generated a password in Secret {name}"),
                    ),
                };
                let secret = build::auth_secret(&self.redis, &self.names, &pw);
                self.apply("Secret", &secret, None).await?;
                self.event(EventType::Normal, "SecretCreated", "Create", note)
                    .await;
                pw
            }
        };
        Ok(Auth::Ok {
            secret_name: name,
            password,
        })
    }

    /// Pods of this Redis from the cache, the StatefulSet's revision, and
    /// what the servers report.
    pub(super) async fn observe_servers(&self, opts: &ConnectOptions, ask: bool) -> Observed {
        let selector = build::selector_labels(&self.redis);
        let pods: Vec<Pod> = self
            .ctx
            .stores
            .pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(self.ns.as_str()))
            .filter(|p| {
                let labels = p.labels();
                selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
            .map(|p| Pod::clone(&p))
            .collect();
        let live_sts: Option<StatefulSet> = self.cached(&self.names.statefulset());
        let update_revision = live_sts
            .as_ref()
            .filter(|s| sts_observed(s))
            .and_then(|s| s.status.as_ref()?.update_revision.clone());
        let kept = super::kept::kept_revisions(live_sts.as_ref());
        let mut facts = pod_facts(&pods, update_revision.as_deref(), &kept);
        // A primary the monitor has heard nothing from for a second is not
        // dialled: its connect timeout would only delay the failover pass.
        let silent = self
            .ctx
            .monitor
            .health(&self.oref)
            .filter(|h| h.verdict == Verdict::Silent && h.silent_for >= Duration::from_secs(1))
            .map(|h| h.ip);
        let endpoints: Vec<Endpoint> = facts
            .iter()
            .filter_map(|f| f.ip.as_ref())
            .filter(|ip| Some(ip.as_str()) != silent.as_deref())
            .map(|ip| Endpoint::new(ip, build::REDIS_PORT))
            .collect();
        let servers_observed = ask && !endpoints.is_empty();
        if servers_observed {
            let topo = crate::redis::topology::observe(&endpoints, opts).await;
            merge_topology(&mut facts, &topo);
        }
        Observed {
            facts,
            live_sts,
            servers_observed,
        }
    }
}

fn read_password(secret: &Secret, name: &str) -> Result<String, Error> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(build::PASSWORD_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(build::PASSWORD_KEY))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| Error::Secret {
            name: name.to_string(),
            reason: format!("has no '{}' key", build::PASSWORD_KEY),
        })?;
    let pw = String::from_utf8(bytes).map_err(|_| Error::Secret {
        name: name.to_string(),
        reason: format!("key '{}' is not UTF-8", build::PASSWORD_KEY),
    })?;
    if pw.is_empty() || pw.contains(['\n', '\r']) {
        return Err(Error::Secret {
            name: name.to_string(),
            reason: format!("key '{}' is empty or spans lines", build::PASSWORD_KEY),
        });
    }
    Ok(pw)
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
    /// one it keeps, see [`super::kept`]).
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
            let server_spec = p.spec.as_ref().and_then(|s| {
                s.containers
                    .iter()
                    .find(|c| c.name == build::SERVER_CONTAINER)
            });
            let server = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == build::SERVER_CONTAINER));
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
    super::config::quantity_bytes(q)
}

/// Whether the StatefulSet controller has seen the StatefulSet's latest
/// spec (its status, e.g. the update revision, describes it).
pub fn sts_observed(s: &StatefulSet) -> bool {
    s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
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
pub fn merge_topology(facts: &mut [PodFacts], topo: &Topology) {
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
        f.good_replicas = node.good_replicas;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
