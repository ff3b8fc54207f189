//! The memory autopilot (`spec.autopilot.memory`, Level 5): decides the
//! memory limit every instance runs ([`policy`], pure), records it in
//! `status.autopilot.memory` before anything changes (the StatefulSet's
//! template and `maxmemory` follow it, see [`resources`]), and reports each
//! decision (event, metric, the `MemoryAtMaximum` condition). [`resize`]
//! moves the running instances to it: in place where the cluster allows
//! it, by an ordered rolling restart where it does not.
//!
//! The primary's growth rate comes from the monitor, which samples its
//! `used_memory` every second while the autopilot is on and asks for a
//! reconcile as soon as the use reaches the level where the policy acts.

pub mod limits;
pub mod policy;
pub mod resize;
pub mod shards;

use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::runtime::events::EventType;

use self::limits::{limit, record, resources, spec_limit};
use self::policy::{Bound, Decision, Observed, Policy, human, maxmemory_of, quantity};
use super::Reconciler;
use super::facts::Cond;
use super::facts::PodFacts;
use super::facts::quantity_bytes;
use super::report::Memory;
use crate::api::v1alpha1::{MemoryAutopilotStatus, MemoryDecision};
use crate::controller::monitor::LowMeasure;

use crate::controller::layout::MEMORY_AT_MAXIMUM as CONDITION;

/// What a decision other than `Keep` records, counts and says.
struct Report<'a> {
    /// `status.autopilot.memory.lastDecision.action`.
    action: &'static str,
    /// The limit it goes to (or, refused, the one wanted).
    to: u64,
    /// The numbers behind it.
    why: &'a str,
    /// Whether the limit changes.
    changes: bool,
    /// `redpilot_autopilot_decisions_total{direction,result}`.
    metric: [&'static str; 2],
    /// The event: type, reason, message.
    event: (EventType, &'static str, String),
}

fn report(decision: &Decision, from: u64) -> Option<Report<'_>> {
    let moved = |to: u64, why: &str| format!("memory limit {} → {}: {why}", human(from), human(to));
    Some(match decision {
        Decision::Keep => return None,
        Decision::Grow { to, why } => Report {
            action: "Grow",
            to: *to,
            why,
            changes: true,
            metric: ["grow", "applied"],
            event: (EventType::Normal, "MemoryGrow", moved(*to, why)),
        },
        Decision::Shrink { to, why } => Report {
            action: "Shrink",
            to: *to,
            why,
            changes: true,
            metric: ["shrink", "applied"],
            event: (EventType::Normal, "MemoryShrink", moved(*to, why)),
        },
        Decision::AtMaximum { wanted, why } => Report {
            action: "AtMaximum",
            to: *wanted,
            why,
            changes: false,
            metric: ["at_maximum", "refused"],
            event: (
                EventType::Warning,
                "MemoryAtMaximum",
                format!("memory limit stays {}: {why}", human(from)),
            ),
        },
        Decision::Bounded { wanted, why, .. } => Report {
            action: "Bounded",
            to: *wanted,
            why,
            changes: false,
            metric: ["grow", "refused"],
            event: (
                EventType::Warning,
                "MemoryBounded",
                format!(
                    "memory limit stays {} (wanted {}): {why}",
                    human(from),
                    human(*wanted)
                ),
            ),
        },
    })
}

/// `next` as a merge patch: a field that went away is sent as null (an
/// absent one would keep the old value).
fn patch_value(next: &MemoryAutopilotStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(next).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        for key in ["method", "belowSince", "lastChange", "lastDecision"] {
            o.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    v
}

/// How much more memory limit per instance the namespace's ResourceQuotas
/// allow: the smallest room left under `limits.memory` (and, for the
/// requests, `requests.memory`/`memory` scaled to limits), per instance.
fn quota_room(quotas: &[ResourceQuota], instances: u64, request_ratio: f64) -> Option<u64> {
    let mut room: Option<u64> = None;
    for q in quotas {
        let hard = q.status.as_ref().and_then(|s| s.hard.as_ref());
        let used = q.status.as_ref().and_then(|s| s.used.as_ref());
        for (key, per_limit) in [
            ("limits.memory", 1.0),
            ("requests.memory", request_ratio),
            ("memory", request_ratio),
        ] {
            let Some(h) = hard.and_then(|h| h.get(key)).and_then(quantity_bytes) else {
                continue;
            };
            let u = used
                .and_then(|u| u.get(key))
                .and_then(quantity_bytes)
                .unwrap_or(0);
            let left = h.saturating_sub(u) as f64 / per_limit.max(0.01);
            let per = (left / instances.max(1) as f64) as u64;
            room = Some(room.map_or(per, |r| r.min(per)));
        }
    }
    room
}

impl Reconciler {
    /// Decides the memory limit (before the children are applied, so the
    /// template and `maxmemory` follow the decision in the same pass) and
    /// points the monitor at the level to watch.
    /// `primaries`: each shard's primary (one outside Cluster mode); the
    /// fullest decides, as every instance runs the same limit.
    pub(super) async fn autopilot(
        &mut self,
        facts: &[PodFacts],
        primaries: &[&str],
    ) -> Result<Memory, super::Error> {
        let mut out = Memory::default();
        let Some(spec) = self.redis.spec.memory_autopilot().cloned() else {
            // The shard autopilot points the monitor itself.
            let shards = self
                .redis
                .spec
                .autopilot
                .as_ref()
                .is_some_and(|a| a.shards.is_some());
            if !shards {
                self.ctx
                    .monitor
                    .watch_memory(&self.oref, None, LowMeasure::Used, Duration::ZERO);
            }
            return Ok(out);
        };
        let (Some(base), Some(current)) = (spec_limit(&self.redis), limit(&self.redis)) else {
            return Ok(out);
        };
        let Some(policy) = Policy::from_spec(&spec, base) else {
            return Ok(out);
        };
        // Where the monitor asks for a pass: the scale-up level, and the
        // scale-down level (the cooldown starts when the data goes).
        let alert = (policy.up * maxmemory_of(current) as f64) as u64;
        let low = (policy.down * maxmemory_of(current) as f64) as u64;
        self.ctx.monitor.watch_memory(
            &self.oref,
            Some((low, alert)),
            LowMeasure::Used,
            Duration::from_secs(policy.lookahead.max(0) as u64),
        );
        let Some(used) = facts
            .iter()
            .filter(|f| primaries.contains(&f.name.as_str()) && f.reachable)
            .filter_map(|f| f.used_memory)
            .max()
        else {
            out.cond = Some(condition(None, facts));
            return Ok(out);
        };
        let rec = record(&self.redis).cloned();
        let now = chrono::Utc::now();
        let parse = |t: &Option<String>| {
            t.as_deref()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.timestamp())
        };
        let below = policy::below_down(&policy, used, current);
        let below_since = match (below, rec.as_ref().and_then(|r| parse(&r.below_since))) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(now.timestamp()),
            (false, _) => None,
        };
        let mut observed = Observed {
            used,
            rate: self.ctx.monitor.memory(&self.oref).and_then(|m| m.rate),
            limit: current,
            now: now.timestamp(),
            below_since,
            last_change: rec.as_ref().and_then(|r| parse(&r.last_change)),
            bound: None,
        };
        let mut decision = policy::decide(&policy, &observed);
        // Below the scale-down level: look again when the cooldowns end.
        if let Some(since) = below_since {
            let last = observed.last_change.unwrap_or(since);
            let due = since.max(last) + policy.cooldown - observed.now;
            out.due = Some(Duration::from_secs(due.max(0) as u64 + 1));
        }
        if matches!(decision, Decision::Grow { .. } | Decision::AtMaximum { .. }) {
            observed.bound = self.quota_bound(current).await;
            decision = policy::decide(&policy, &observed);
        }
        let mut next = rec.clone().unwrap_or_else(|| MemoryAutopilotStatus {
            limit: quantity(current),
            limit_bytes: current as i64,
            base: quantity(base),
            ..Default::default()
        });
        next.below_since = below_since
            .and_then(|t| chrono::DateTime::from_timestamp(t, 0).map(|t| t.to_rfc3339()));
        let stamp = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut event = None;
        if let Some(r) = report(&decision, current) {
            let repeat = next
                .last_decision
                .as_ref()
                .is_some_and(|d| d.action == r.action && d.from == quantity(current));
            if r.changes {
                next.limit = quantity(r.to);
                next.limit_bytes = r.to as i64;
                next.last_change = Some(stamp.clone());
                next.below_since = None;
            }
            if !repeat || r.changes {
                next.last_decision = Some(MemoryDecision {
                    time: stamp,
                    action: r.action.into(),
                    from: quantity(current),
                    to: quantity(r.to),
                    reason: r.why.to_string(),
                });
                self.ctx
                    .metrics
                    .autopilot
                    .with_label_values(&r.metric)
                    .inc();
                event = Some(r.event);
            }
        }
        if rec.as_ref() != Some(&next) {
            self.patch_status(serde_json::json!({"autopilot": {"memory": patch_value(&next)}}))
                .await?;
        }
        if let Some((kind, reason, text)) = event {
            self.event(kind, reason, "Autoscale", text).await;
        }
        out.cond = Some(condition(Some(&decision), facts));
        Ok(out)
    }

    /// The largest limit the namespace's ResourceQuotas take, when one
    /// bounds memory.
    async fn quota_bound(&mut self, current: u64) -> Option<(u64, Bound)> {
        self.ctx.metrics.kube("list");
        let quotas = match self.api::<ResourceQuota>().list(&Default::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, "listing ResourceQuotas for the memory autopilot");
                return None;
            }
        };
        let instances = self.redis.spec.total_instances().max(1) as u64;
        let r = resources(&self.redis);
        let req = r
            .as_ref()
            .and_then(|r| r.requests.as_ref()?.get("memory").and_then(quantity_bytes));
        let ratio = req.map_or(1.0, |q| q as f64 / current.max(1) as f64);
        quota_room(&quotas, instances, ratio).map(|room| (current + room, Bound::Quota))
    }
}

/// The `MemoryAtMaximum` condition for this pass: the policy's maximum, a
/// ResourceQuota, or a node that cannot take a resize.
fn condition(decision: Option<&Decision>, facts: &[PodFacts]) -> Cond {
    match decision {
        Some(Decision::AtMaximum { why, .. }) => {
            Cond::new(CONDITION, true, "AtMaximum", why.clone())
        }
        Some(Decision::Bounded { why, by, .. }) => Cond::new(
            CONDITION,
            true,
            match by {
                Bound::Quota => "ResourceQuota",
                Bound::Node => "NodeCapacity",
            },
            why.clone(),
        ),
        _ => match resize::node_refusal(facts) {
            Some(msg) => Cond::new(CONDITION, true, "NodeCapacity", msg),
            None => Cond::new(
                CONDITION,
                false,
                "BelowMaximum",
                "the autopilot can grow the memory further",
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::limits::{resources, template_limit};
    use super::*;
    use crate::api::v1alpha1::{AutopilotStatus, Redis, RedisStatus};
    use crate::controller::redis::build::test_redis;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn with_limit(limit: &str, request: Option<&str>) -> Redis {
        let mut spec = crate::api::v1alpha1::RedisSpec::default();
        let mut r = ResourceRequirements {
            limits: Some(BTreeMap::from([("memory".into(), Quantity(limit.into()))])),
            ..Default::default()
        };
        if let Some(req) = request {
            r.requests = Some(BTreeMap::from([("memory".into(), Quantity(req.into()))]));
        }
        spec.resources = Some(r);
        test_redis(spec)
    }

    fn targeted(mut r: Redis, base: &str, limit: u64) -> Redis {
        r.status = Some(RedisStatus {
            autopilot: Some(AutopilotStatus {
                memory: Some(MemoryAutopilotStatus {
                    limit: quantity(limit),
                    limit_bytes: limit as i64,
                    base: base.into(),
                    ..Default::default()
                }),
                shards: None,
            }),
            ..Default::default()
        });
        r
    }

    #[test]
    fn the_template_keeps_a_size_every_instance_runs() {
        let pod = |name: &str, spec: u64, applied: u64| PodFacts {
            name: name.into(),
            ip: Some("10.0.0.1".into()),
            mem_limit: Some(spec << 20),
            mem_limit_applied: Some(applied << 20),
            ..Default::default()
        };
        let target = 96 << 20;
        // A replica grown, the other's resize deferred by its node.
        let facts = vec![pod("c-0", 64, 64), pod("c-1", 96, 96), pod("c-2", 96, 64)];
        assert_eq!(template_limit(&facts, target, false), 64 << 20);
        // Every instance runs the target.
        let facts = vec![pod("c-0", 96, 96), pod("c-1", 96, 96)];
        assert_eq!(template_limit(&facts, target, false), target);
        // A pod being deleted before its deferred resize went through:
        // its replacement comes back at the size it ran.
        let mut leaving = pod("c-2", 96, 64);
        leaving.terminating = true;
        let facts = vec![pod("c-0", 96, 96), pod("c-1", 96, 96), leaving];
        assert_eq!(template_limit(&facts, target, false), 64 << 20);
        // A shrink: the template goes down at once.
        let facts = vec![pod("c-0", 128, 128), pod("c-1", 128, 128)];
        assert_eq!(template_limit(&facts, target, false), target);
        // Restarts bring the target from the template; no pod seen: target.
        let facts = vec![pod("c-0", 64, 64)];
        assert_eq!(template_limit(&facts, target, true), target);
        assert_eq!(template_limit(&[], target, false), target);
    }

    #[test]
    fn the_target_replaces_the_limit_and_scales_the_request() {
        let r = targeted(with_limit("64Mi", Some("32Mi")), "64Mi", 96 << 20);
        assert_eq!(limit(&r), Some(96 << 20));
        let res = resources(&r).unwrap();
        assert_eq!(res.limits.unwrap()["memory"].0, "96Mi");
        assert_eq!(res.requests.unwrap()["memory"].0, "48Mi");
        // No request: the same as the limit.
        let r = targeted(with_limit("64Mi", None), "64Mi", 96 << 20);
        assert_eq!(resources(&r).unwrap().requests.unwrap()["memory"].0, "96Mi");
        // maxmemory follows the target.
        assert_eq!(
            super::limits::maxmemory_bytes(&r),
            Some((96u64 << 20) / 4 * 3)
        );
    }

    #[test]
    fn fields_that_went_away_are_nulled_in_the_patch() {
        let v = patch_value(&MemoryAutopilotStatus {
            limit: "96Mi".into(),
            limit_bytes: 96 << 20,
            base: "64Mi".into(),
            ..Default::default()
        });
        assert_eq!(v["belowSince"], serde_json::Value::Null);
        assert!(v.as_object().is_some_and(|o| o.contains_key("belowSince")));
        assert_eq!(v["limit"], "96Mi");
    }

    #[test]
    fn a_limit_changed_by_hand_starts_over() {
        let r = targeted(with_limit("128Mi", None), "64Mi", 96 << 20);
        assert_eq!(limit(&r), Some(128 << 20));
        assert_eq!(resources(&r).unwrap().limits.unwrap()["memory"].0, "128Mi");
    }

    #[test]
    fn quota_room_is_shared_by_the_instances() {
        let q = |hard: &str, used: &str, key: &str| ResourceQuota {
            status: Some(k8s_openapi::api::core::v1::ResourceQuotaStatus {
                hard: Some(BTreeMap::from([(key.into(), Quantity(hard.into()))])),
                used: Some(BTreeMap::from([(key.into(), Quantity(used.into()))])),
            }),
            ..Default::default()
        };
        let mi = 1u64 << 20;
        assert_eq!(
            quota_room(&[q("512Mi", "200Mi", "limits.memory")], 3, 1.0),
            Some(104 * mi)
        );
        // Requests at half the limit: room for twice as much limit.
        assert_eq!(
            quota_room(&[q("512Mi", "200Mi", "requests.memory")], 3, 0.5),
            Some(208 * mi)
        );
        assert_eq!(
            quota_room(
                &[
                    q("512Mi", "200Mi", "limits.memory"),
                    q("1Gi", "1000Mi", "requests.memory")
                ],
                3,
                1.0
            ),
            Some(8 * mi)
        );
        assert_eq!(quota_room(&[], 3, 1.0), None);
    }
}
