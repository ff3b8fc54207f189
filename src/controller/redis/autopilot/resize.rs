//! Moves the running instances to the autopilot's memory limit.
//!
//! In place (method `InPlace`): the pod's `resize` subresource (Kubernetes
//! 1.33 and later) changes the server container's memory, and `maxmemory`
//! follows live with `CONFIG SET`, never above 75 % of the limit the kubelet
//! reports in effect:
//! - a grow resizes the replicas first and the primary only once every
//!   replica runs the new limit, so a replica always has room for what the
//!   primary may hold; each `maxmemory` rises once its pod's new limit is in
//!   effect, the primary's last;
//! - a shrink lowers `maxmemory` first, returns freed pages to the system
//!   (`MEMORY PURGE`), then resizes.
//!
//! Where the cluster refuses in-place resize (no such subresource, or a pod
//! it cannot be applied to), the method becomes `Restart`: every instance
//! not at the limit counts as outdated, and the rollout restarts them in its
//! order (replicas, a zero-loss switchover, the old primary), each coming
//! back from the StatefulSet's template, which already has the limit. A
//! resize the node cannot take (`PodResizePending`: `Infeasible` or
//! `Deferred`) is reported in the `MemoryAtMaximum` condition; nothing is
//! restarted for it, as a new pod would not fit either.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::limits::{RESTART, record, resources};
use super::policy::{human, maxmemory_of};
use crate::controller::base::FIELD_MANAGER;
use crate::controller::names;
use crate::controller::redis::Reconciler;
use crate::controller::redis::facts::PodFacts;
use crate::controller::redis::report::Memory;
use crate::redis::{ConnectOptions, Endpoint};

/// A pod whose resize the node refuses or defers, said for people.
pub fn node_refusal(facts: &[PodFacts]) -> Option<String> {
    facts.iter().find_map(|f| {
        let (cond, reason, msg) = f.resize.as_ref()?;
        (cond == "PodResizePending" && (reason == "Infeasible" || reason == "Deferred")).then(
            || {
                format!(
                    "{}: the node cannot take the resize ({reason}): {msg}",
                    f.name
                )
            },
        )
    })
}

/// The `maxmemory` an instance may run now: 75 % of the smallest of the
/// target, its pod's limit and the limit the kubelet reports in effect.
pub fn allowed_maxmemory(f: &PodFacts, target: u64) -> Option<u64> {
    let pod = f.mem_limit?;
    let applied = f.mem_limit_applied.unwrap_or(pod);
    Some(maxmemory_of(target.min(pod).min(applied)))
}

/// Counts every instance not at `target` as outdated: the rollout
/// restarts it from the template, which has the target.
fn mark_for_restart(facts: &mut [PodFacts], target: u64) {
    for f in facts.iter_mut() {
        if f.mem_limit.is_some_and(|l| l != target) {
            f.outdated = true;
        }
    }
}

/// What a refused `pods/resize` call means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The cluster does not resize in place (no such subresource: 404,
    /// 405, 415) or not this pod (400, 422: invalid for it, e.g. a change
    /// of QoS class): this move goes by ordered restarts.
    InPlaceUnavailable,
    /// The node's allocatable memory (403 from the resize admission).
    NodeCapacity,
    /// A ResourceQuota of the namespace (403).
    ResourceQuota,
    /// Anything else (the operator's own RBAC, a conflict, the network):
    /// an error of this pass, tried again.
    Transient,
}

/// Classifies a refused `pods/resize` call (pure).
pub fn classify(e: &kube::Error) -> Refusal {
    let kube::Error::Api(s) = e else {
        return Refusal::Transient;
    };
    match s.code {
        400 | 404 | 405 | 415 | 422 => Refusal::InPlaceUnavailable,
        403 if s.message.contains("forbidden: User") => Refusal::Transient,
        403 if s.message.contains("quota") => Refusal::ResourceQuota,
        403 => Refusal::NodeCapacity,
        _ => Refusal::Transient,
    }
}

/// Whether every live instance runs `target` (in its spec and in effect).
fn settled(facts: &[PodFacts], target: u64) -> bool {
    let live: Vec<&PodFacts> = facts.iter().filter(|f| !f.terminating).collect();
    !live.is_empty()
        && live
            .iter()
            .all(|f| f.mem_limit == Some(target) && f.mem_limit_applied.is_none_or(|a| a == target))
}

/// Which instances to resize now (pure): grows replicas first and the
/// primaries (in Cluster mode, every shard's) once every replica runs the
/// target; a shrink once the instance's `maxmemory` is below the target's.
/// `replicas` is how many replicas the spec asks for: one whose pod is
/// gone (deleted, not yet made again) is not among the facts, and is not
/// done either.
pub fn to_resize(
    facts: &[PodFacts],
    primaries: &[&str],
    target: u64,
    replicas: usize,
) -> Vec<String> {
    let primary = |f: &PodFacts| primaries.contains(&f.name.as_str());
    let live: Vec<&PodFacts> = facts
        .iter()
        .filter(|f| !f.terminating && f.ip.is_some() && f.mem_limit.is_some())
        .collect();
    // Every replica must run the target first. One being deleted, gone or
    // not yet started is not done (its pod comes back from the template
    // and needs the room the primary's grow would take: grown first, the
    // primary takes it and the new pod cannot be scheduled), nor is one
    // whose resize the kubelet has not finished, whatever limit its status
    // shows.
    let present = facts.iter().filter(|f| !primary(f)).count();
    let others_done = present >= replicas
        && facts.iter().filter(|f| !primary(f)).all(|f| {
            !f.terminating
                && f.ip.is_some()
                && f.resize.is_none()
                && f.mem_limit_applied
                    .or(f.mem_limit)
                    .is_some_and(|l| l >= target)
        });
    live.iter()
        .filter(|f| match f.mem_limit {
            Some(l) if l < target => !primary(f) || others_done,
            Some(l) if l > target => f
                .maxmemory
                .is_some_and(|m| m > 0 && m <= maxmemory_of(target)),
            _ => false,
        })
        .map(|f| f.name.clone())
        .collect()
}

impl Reconciler {
    /// Moves the instances to the autopilot's limit (see the module).
    pub(in crate::controller::redis) async fn autopilot_resize(
        &mut self,
        facts: &mut [PodFacts],
        primaries: &[&str],
        opts: &ConnectOptions,
        memory: &mut Memory,
    ) -> Result<(), super::super::Error> {
        let Some(rec) = record(&self.redis).cloned() else {
            return Ok(());
        };
        let target = rec.limit_bytes as u64;
        self.align_maxmemory(facts, target, opts).await;
        if rec.method.as_deref() == Some(RESTART) {
            // The method holds for one move: once every instance runs the
            // target, the next one tries in place again (a refusal for one
            // pod, or by a cluster since upgraded, is not for good).
            if settled(facts, target) {
                self.patch_status(serde_json::json!({"autopilot": {"memory": {"method": null}}}))
                    .await?;
                return Ok(());
            }
            mark_for_restart(facts, target);
            return Ok(());
        }
        let Some(res) = resources(&self.redis) else {
            return Ok(());
        };
        let per_shard = usize::try_from(self.redis.spec.desired_instances() - 1).unwrap_or(0);
        let replicas = primaries.len() * per_shard;
        for name in to_resize(facts, primaries, target, replicas) {
            let shrink = facts
                .iter()
                .find(|f| f.name == name)
                .and_then(|f| f.mem_limit)
                .is_some_and(|l| l > target);
            if shrink {
                self.purge(facts, &name, opts).await;
            }
            match self.resize_pod(&name, &res).await {
                Ok(()) => {
                    if !primaries.contains(&name.as_str()) {
                        crate::failpoint::hit("after-resize-replica");
                    }
                }
                Err(e) => {
                    let reason = match classify(&e) {
                        Refusal::InPlaceUnavailable => {
                            self.fall_back_to_restarts(&name, &e, facts, target).await?;
                            return Ok(());
                        }
                        // The API server checks the node's allocatable
                        // memory and the namespace's quotas: a restart
                        // would not fit either.
                        Refusal::NodeCapacity => "NodeCapacity",
                        Refusal::ResourceQuota => "ResourceQuota",
                        Refusal::Transient => return Err(e.into()),
                    };
                    let why = match &e {
                        kube::Error::Api(s) => s.message.clone(),
                        other => other.to_string(),
                    };
                    let msg = format!("resizing {name} to {} was refused: {why}", human(target));
                    self.report.progress(msg.clone());
                    memory.cond = Some(super::super::facts::Cond::new(
                        super::CONDITION,
                        true,
                        reason,
                        msg,
                    ));
                    return Ok(());
                }
            }
        }
        let moving: Vec<String> = facts
            .iter()
            .filter(|f| !f.terminating)
            .filter(|f| {
                f.mem_limit.is_some_and(|l| l != target)
                    || f.mem_limit_applied.is_some_and(|l| l != target)
            })
            .map(|f| f.name.clone())
            .collect();
        if !moving.is_empty() {
            self.report.progress(format!(
                "memory autopilot: resizing {} to {} in place",
                moving.join(", "),
                human(target)
            ));
        }
        if let Some(msg) = node_refusal(facts) {
            self.report.progress(msg);
        }
        Ok(())
    }

    /// `CONFIG SET maxmemory` where an instance's differs from what its
    /// pod's limit allows; the facts are updated.
    async fn align_maxmemory(
        &mut self,
        facts: &mut [PodFacts],
        target: u64,
        opts: &ConnectOptions,
    ) {
        let mut changed = Vec::new();
        for f in facts.iter_mut().filter(|f| f.reachable && !f.terminating) {
            let (Some(want), Some(ip), Some(have)) =
                (allowed_maxmemory(f, target), f.ip.clone(), f.maxmemory)
            else {
                continue;
            };
            if have == want {
                continue;
            }
            let ep = Endpoint::new(&ip, names::REDIS_PORT);
            let result = async {
                let mut node = crate::redis::Node::connect(&ep, opts).await?;
                node.query::<()>(
                    "CONFIG SET",
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("maxmemory")
                        .arg(want.to_string()),
                )
                .await
            }
            .await;
            match result {
                Ok(()) => {
                    changed.push(format!("{} {} → {}", f.name, human(have), human(want)));
                    f.maxmemory = Some(want);
                }
                Err(e) => {
                    self.data_plane_failed(format!("setting maxmemory on {}", f.name), &e)
                        .await
                }
            }
        }
        if !changed.is_empty() {
            self.event(
                EventType::Normal,
                "MaxmemorySet",
                "Autoscale",
                format!(
                    "maxmemory set live (75% of the limit in effect): {}",
                    changed.join(", ")
                ),
            )
            .await;
        }
    }

    /// `MEMORY PURGE` before a shrink, so freed pages leave the process
    /// before its limit drops (a failure only makes the kubelet wait).
    async fn purge(&mut self, facts: &[PodFacts], name: &str, opts: &ConnectOptions) {
        let Some(ip) = facts
            .iter()
            .find(|f| f.name == name)
            .and_then(|f| f.ip.clone())
        else {
            return;
        };
        let ep = Endpoint::new(&ip, names::REDIS_PORT);
        let result = async {
            let mut node = crate::redis::Node::connect(&ep, opts).await?;
            node.query::<()>("MEMORY PURGE", redis::cmd("MEMORY").arg("PURGE"))
                .await
        }
        .await;
        if let Err(e) = result {
            tracing::debug!(pod = name, error = %e, "MEMORY PURGE before a shrink");
        }
    }

    /// Applies the server container's memory through the pod's `resize`
    /// subresource (server-side apply, the operator's field manager).
    async fn resize_pod(
        &mut self,
        name: &str,
        res: &k8s_openapi::api::core::v1::ResourceRequirements,
    ) -> Result<(), kube::Error> {
        if crate::failpoint::armed_here("resize-refused") {
            return Err(kube::Error::Api(
                kube::core::Status::failure(
                    "the failpoint resize-refused stands for a cluster without in-place resize",
                    "NotFound",
                )
                .with_code(404)
                .boxed(),
            ));
        }
        let memory = |m: &Option<
            std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >| { m.as_ref().and_then(|m| m.get("memory")).cloned() };
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{
                "name": names::SERVER_CONTAINER,
                "resources": {
                    "limits": {"memory": memory(&res.limits)},
                    "requests": {"memory": memory(&res.requests)},
                },
            }]},
        });
        self.ctx.metrics.kube("patch");
        self.report.wrote();
        self.api::<Pod>()
            .patch_subresource(
                "resize",
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        Ok(())
    }

    /// The cluster refused an in-place resize: record the `Restart` method
    /// (the rollout restarts the instances in order from the template,
    /// which has the new limit) and say why.
    async fn fall_back_to_restarts(
        &mut self,
        name: &str,
        e: &kube::Error,
        facts: &mut [PodFacts],
        target: u64,
    ) -> Result<(), super::super::Error> {
        let why = match e {
            kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
            other => other.to_string(),
        };
        self.patch_status(serde_json::json!({"autopilot": {"memory": {"method": RESTART}}}))
            .await?;
        self.event(
            EventType::Warning,
            "ResizeRefused",
            "Autoscale",
            format!(
                "in-place resize of {name} to {} refused: {why}; the instances restart in order \
                 instead (replicas, a switchover, the old primary)",
                human(target)
            ),
        )
        .await;
        mark_for_restart(facts, target);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    fn pod(name: &str, spec: u64, applied: u64, maxmemory: u64) -> PodFacts {
        PodFacts {
            name: name.into(),
            ip: Some("10.0.0.1".into()),
            reachable: true,
            mem_limit: Some(spec * MI),
            mem_limit_applied: Some(applied * MI),
            maxmemory: Some(maxmemory * MI),
            ..Default::default()
        }
    }

    #[test]
    fn a_grow_resizes_replicas_first_and_the_primary_last() {
        let facts = vec![
            pod("c-0", 64, 64, 48),
            pod("c-1", 64, 64, 48),
            pod("c-2", 64, 64, 48),
        ];
        assert_eq!(to_resize(&facts, &["c-0"], 96 * MI, 2), vec!["c-1", "c-2"]);
        // Replicas patched, not yet in effect: the primary waits.
        let facts = vec![
            pod("c-0", 64, 64, 48),
            pod("c-1", 96, 64, 48),
            pod("c-2", 96, 96, 48),
        ];
        assert!(to_resize(&facts, &["c-0"], 96 * MI, 2).is_empty());
        let facts = vec![
            pod("c-0", 64, 64, 48),
            pod("c-1", 96, 96, 72),
            pod("c-2", 96, 96, 72),
        ];
        assert_eq!(to_resize(&facts, &["c-0"], 96 * MI, 2), vec!["c-0"]);
        // A replica whose resize the node defers keeps the primary waiting,
        // even when its status shows the new limit or none.
        for applied in [Some(96 * MI), None] {
            let mut deferred = pod("c-2", 96, 96, 48);
            deferred.mem_limit_applied = applied;
            deferred.resize = Some((
                "PodResizePending".into(),
                "Deferred".into(),
                "Node didn't have enough resource: memory".into(),
            ));
            let facts = vec![pod("c-0", 64, 64, 48), pod("c-1", 96, 96, 48), deferred];
            assert!(
                to_resize(&facts, &["c-0"], 96 * MI, 2).is_empty(),
                "{applied:?}"
            );
        }
        // A replica being deleted (it comes back from the template) keeps
        // the primary waiting too.
        let mut leaving = pod("c-2", 96, 64, 48);
        leaving.terminating = true;
        let facts = vec![pod("c-0", 64, 64, 48), pod("c-1", 96, 96, 48), leaving];
        assert!(to_resize(&facts, &["c-0"], 96 * MI, 2).is_empty());
        // A replica whose pod is gone (deleted, not yet made again) is not
        // among the facts: the primary waits for it all the same.
        let facts = vec![pod("c-0", 64, 64, 48), pod("c-1", 96, 96, 72)];
        assert!(to_resize(&facts, &["c-0"], 96 * MI, 2).is_empty());
        assert_eq!(to_resize(&facts, &["c-0"], 96 * MI, 1), vec!["c-0"]);
    }

    #[test]
    fn in_cluster_mode_every_shard_s_replicas_grow_before_any_primary() {
        // Two shards of one primary and one replica each.
        const REPLICAS_OF_PRIMARIES: usize = 2;
        let primaries = ["r-s0-0", "r-s1-0"];
        let facts = vec![
            pod("r-s0-0", 64, 64, 48),
            pod("r-s0-1", 64, 64, 48),
            pod("r-s1-0", 64, 64, 48),
            pod("r-s1-1", 64, 64, 48),
        ];
        assert_eq!(
            to_resize(&facts, &primaries, 96 * MI, REPLICAS_OF_PRIMARIES),
            vec!["r-s0-1", "r-s1-1"]
        );
        // Shard 0's replica done, shard 1's not yet in effect: no primary.
        let facts = vec![
            pod("r-s0-0", 64, 64, 48),
            pod("r-s0-1", 96, 96, 72),
            pod("r-s1-0", 64, 64, 48),
            pod("r-s1-1", 96, 64, 48),
        ];
        assert!(to_resize(&facts, &primaries, 96 * MI, REPLICAS_OF_PRIMARIES).is_empty());
        let facts = vec![
            pod("r-s0-0", 64, 64, 48),
            pod("r-s0-1", 96, 96, 72),
            pod("r-s1-0", 64, 64, 48),
            pod("r-s1-1", 96, 96, 72),
        ];
        assert_eq!(
            to_resize(&facts, &primaries, 96 * MI, REPLICAS_OF_PRIMARIES),
            vec!["r-s0-0", "r-s1-0"]
        );
    }

    #[test]
    fn maxmemory_follows_the_limit_in_effect() {
        // Growing: the pod's new limit is not in effect yet.
        assert_eq!(
            allowed_maxmemory(&pod("a", 96, 64, 48), 96 * MI),
            Some(48 * MI)
        );
        assert_eq!(
            allowed_maxmemory(&pod("a", 96, 96, 48), 96 * MI),
            Some(72 * MI)
        );
        // Shrinking: maxmemory drops before the pod's limit.
        assert_eq!(
            allowed_maxmemory(&pod("a", 96, 96, 72), 64 * MI),
            Some(48 * MI)
        );
    }

    #[test]
    fn a_shrink_resizes_once_maxmemory_is_down() {
        let facts = vec![pod("c-0", 96, 96, 72), pod("c-1", 96, 96, 48)];
        assert_eq!(to_resize(&facts, &["c-0"], 64 * MI, 1), vec!["c-1"]);
    }

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn refusals_of_a_resize_are_classified() {
        for code in [400, 404, 405, 415, 422] {
            assert_eq!(
                classify(&api_error(code, "x")),
                Refusal::InPlaceUnavailable,
                "{code}"
            );
        }
        assert_eq!(
            classify(&api_error(
                403,
                "pods \"c-1\" is forbidden: node didn't have enough allocatable resources: memory"
            )),
            Refusal::NodeCapacity
        );
        assert_eq!(
            classify(&api_error(
                403,
                "pods \"c-1\" is forbidden: exceeded quota: mem, requested: limits.memory=96Mi"
            )),
            Refusal::ResourceQuota
        );
        // The operator's own RBAC is not the cluster's verdict on a resize.
        assert_eq!(
            classify(&api_error(
                403,
                "pods \"c-1\" is forbidden: User \"system:serviceaccount:x:y\" cannot patch resource"
            )),
            Refusal::Transient
        );
        assert_eq!(classify(&api_error(409, "conflict")), Refusal::Transient);
        assert_eq!(classify(&api_error(500, "etcd")), Refusal::Transient);
    }

    #[test]
    fn restarts_end_once_every_instance_runs_the_target() {
        let facts = vec![pod("c-0", 96, 96, 72), pod("c-1", 64, 64, 48)];
        assert!(!settled(&facts, 96 * MI));
        let mut marked = facts.clone();
        mark_for_restart(&mut marked, 96 * MI);
        assert_eq!(
            marked.iter().map(|f| f.outdated).collect::<Vec<_>>(),
            vec![false, true]
        );
        let facts = vec![pod("c-0", 96, 96, 72), pod("c-1", 96, 96, 72)];
        assert!(settled(&facts, 96 * MI));
        assert!(!settled(&[], 96 * MI));
    }

    #[test]
    fn node_refusals_are_named() {
        let mut f = pod("c-1", 96, 64, 48);
        assert_eq!(node_refusal(std::slice::from_ref(&f)), None);
        f.resize = Some((
            "PodResizePending".into(),
            "Infeasible".into(),
            "Node didn't have enough capacity".into(),
        ));
        assert!(node_refusal(&[f]).is_some_and(|m| m.contains("c-1") && m.contains("Infeasible")));
    }
}
