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
//! The pure parts (pod facts, the servers' topology merged in) are in
//! [`super::facts`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::auth;
use super::children::Child;
use super::facts::{PodFacts, caught_up, merge_topology, pod_facts};
use super::{Error, Reconciler};
use crate::api::v1alpha1::Redis;
use crate::controller::layout::sts_observed;
use crate::controller::monitor::Verdict;
use crate::controller::names;
use crate::controller::names::controlled_by;
use crate::redis::{ConnectOptions, Endpoint};

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

impl Reconciler {
    /// A child of this Redis from its watch cache.
    pub(super) fn cached<K: Child>(&self, name: &str) -> Option<K> {
        K::store(&self.ctx.stores)?
            .get(&ObjectRef::new(name).within(&self.ns))?
            .thaw()
    }

    /// A child from its cache, or from the API when the cache has none.
    pub(super) async fn lookup<K: Child>(&self, name: &str) -> Result<Option<K>, Error> {
        match self.cached(name) {
            Some(o) => Ok(Some(o)),
            None => self.fetch(name).await,
        }
    }

    /// A child read from the API, past the cache. What it found is noted
    /// for the periodic passes after this one (see [`super::light`]).
    pub(super) async fn fetch<K: Child>(&self, name: &str) -> Result<Option<K>, Error> {
        self.ctx.metrics.kube("get");
        let found: Option<K> = self.api::<K>().get_opt(name).await?;
        if let Ok(mut reads) = self.reads.lock() {
            reads.push(crate::controller::queue::Read {
                name: name.to_string(),
                version: found
                    .as_ref()
                    .and_then(|o| o.meta().resource_version.clone()),
                check: super::light::version_now::<K>,
            });
        }
        Ok(found)
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
    /// [`names::SELECTOR_NAME_ANNOTATION`]). In Cluster mode every shard's
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
        if name == names::engine_name(self.redis.spec.engine()) {
            return;
        }
        let mut redis = Redis::clone(&self.redis);
        redis
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(names::SELECTOR_NAME_ANNOTATION.into(), name);
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
                if let Some(e) = self.foreign("Secret", Some(&s.metadata)) {
                    return Ok(Auth::Failed(e));
                }
                let pw = match read_password(&s, &name) {
                    Ok(pw) => pw,
                    Err(e) => return Ok(Auth::Failed(e)),
                };
                if !controlled_by(&s.metadata, self.uid()) && !paused {
                    // Adopt it: the same password, now owned by this Redis
                    // (so it goes with it). The data is applied too, so the
                    // apply can never drop the password.
                    let secret = auth::auth_secret(&self.redis, &self.names, &pw);
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
                        auth::generate_password().map_err(|e| Error::Random(e.to_string()))?,
                        format!("generated a password in Secret {name}"),
                    ),
                };
                let secret = auth::auth_secret(&self.redis, &self.names, &pw);
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
    /// `opts` learns which servers listen with TLS while they differ
    /// (TLS being turned on or off).
    /// `applied_ca`: the CA bundle the instances last served (to reach
    /// those that still listen with TLS while it is turned off).
    pub(super) async fn observe_servers(
        &mut self,
        opts: &mut ConnectOptions,
        ask: bool,
        applied_ca: Option<&str>,
    ) -> Observed {
        let selector = names::selector_labels(&self.redis);
        let pods: Vec<Pod> = self
            .ctx
            .stores
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                kube::Resource::meta(p.as_ref()).namespace.as_deref() == Some(self.ns.as_str())
            })
            .filter(|p| {
                let labels = p.labels();
                selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
            .filter_map(|p| p.thaw())
            .collect();
        let live_sts: Option<StatefulSet> = self.cached(&self.names.statefulset());
        let update_revision = live_sts
            .as_ref()
            .filter(|s| sts_observed(s))
            .and_then(|s| s.status.as_ref()?.update_revision.clone());
        let kept = super::kept::kept_revisions(live_sts.as_ref());
        let mut facts = pod_facts(&pods, update_revision.as_deref(), &kept);
        // TLS turned off while an instance still listens with it: the
        // Secret its pod mounts, to reach it.
        if self.redis.spec.tls.is_none()
            && let Some(name) = facts
                .iter()
                .filter(|f| f.listens_tls || f.either)
                .filter_map(|f| pods.iter().find(|p| p.name_any() == f.name))
                .find_map(super::tls::mounted_secret)
        {
            self.reach.leaving_tls = self.leaving_material(&name, applied_ca).await;
            self.reach.leaving_secret = Some(name);
        }
        // A Cluster Redis turning TLS on or off: how each node of the
        // flip's template listens now (it may have been switched live).
        self.handshake_either(&mut facts, opts).await;
        opts.listeners = self.listeners_of(&facts).map(std::sync::Arc::new);
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
            .map(|ip| Endpoint::new(ip, names::REDIS_PORT))
            .collect();
        let servers_observed = ask && !endpoints.is_empty();
        if servers_observed {
            let topo = crate::redis::topology::observe(&endpoints, opts).await;
            let source = super::facts::SourceAddress::of(&self.redis);
            merge_topology(&mut facts, &topo, source.as_ref());
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
        .and_then(|d| d.get(names::PASSWORD_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(names::PASSWORD_KEY))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| Error::Secret {
            name: name.to_string(),
            reason: format!("has no '{}' key", names::PASSWORD_KEY),
        })?;
    let pw = String::from_utf8(bytes).map_err(|_| Error::Secret {
        name: name.to_string(),
        reason: format!("key '{}' is not UTF-8", names::PASSWORD_KEY),
    })?;
    if pw.is_empty() || pw.contains(['\n', '\r']) {
        return Err(Error::Secret {
            name: name.to_string(),
            reason: format!("key '{}' is empty or spans lines", names::PASSWORD_KEY),
        });
    }
    Ok(pw)
}
