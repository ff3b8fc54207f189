//! The memory limit the instances run, pure: the spec's, or the target the
//! autopilot recorded in `status.autopilot.memory` (made for the spec's
//! current limit), and `maxmemory` from it. The builders (the
//! StatefulSet's template, redis.conf) read these; the autopilot's steps
//! (`autopilot` and `autopilot::resize`) decide and move the instances to them.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::policy::{self, maxmemory_of, quantity};
use crate::api::v1alpha1::{MemoryAutopilotStatus, Redis};
use crate::controller::redis::facts::{PodFacts, memory_limit, quantity_bytes};

/// The memory limit of `spec.resources`.
pub fn spec_limit(redis: &Redis) -> Option<u64> {
    memory_limit(redis.spec.resources.as_ref())
}

/// The autopilot's record, when it applies: it was made for the spec's
/// current limit (a limit changed by hand starts over from the new one).
pub fn record(redis: &Redis) -> Option<&MemoryAutopilotStatus> {
    let st = redis.status.as_ref()?.autopilot.as_ref()?.memory.as_ref()?;
    let base = spec_limit(redis)?;
    (quantity_bytes(&Quantity(st.base.clone())) == Some(base) && st.limit_bytes > 0).then_some(st)
}

/// The memory limit the instances are to run: the autopilot's target, or
/// the spec's.
pub fn limit(redis: &Redis) -> Option<u64> {
    record(redis)
        .map(|r| r.limit_bytes as u64)
        .or_else(|| spec_limit(redis))
}

/// The server container's resources: the spec's, with the memory limit the
/// autopilot set; the request keeps its ratio to the limit (no request:
/// the same as the limit, as Kubernetes defaults it).
pub fn resources(redis: &Redis) -> Option<ResourceRequirements> {
    resources_at(redis, None)
}

/// [`resources`] with the memory limit `at` in place of the autopilot's
/// target (for the template: a size the instances run, see
/// [`template_limit`]).
pub fn resources_at(redis: &Redis, at: Option<u64>) -> Option<ResourceRequirements> {
    let mut r = redis.spec.resources.clone()?;
    let (Some(rec), Some(base)) = (record(redis), spec_limit(redis)) else {
        return Some(r);
    };
    let target = at.unwrap_or(rec.limit_bytes as u64);
    let request = r
        .requests
        .as_ref()
        .and_then(|q| q.get("memory"))
        .and_then(quantity_bytes)
        .filter(|req| *req < base)
        .map_or(target, |req| {
            let scaled = (req as f64 * target as f64 / base as f64).ceil() as u64;
            scaled.div_ceil(policy::ROUND) * policy::ROUND
        });
    r.limits
        .get_or_insert_with(Default::default)
        .insert("memory".into(), Quantity(quantity(target)));
    r.requests
        .get_or_insert_with(Default::default)
        .insert("memory".into(), Quantity(quantity(request.min(target))));
    Some(r)
}

/// The memory limit the StatefulSet's template carries while the
/// instances move to `target` in place: the smallest limit a live
/// instance has in effect, up to the target. A pod re-created mid-grow
/// then comes back at a size the node took before (and is resized again),
/// never at one the node may not hold: a resize the node defers or
/// refuses leaves the template where it was. A pod being deleted counts
/// too: its replacement comes from the template, and the room it frees
/// may go to another pod's deferred resize first (seen: the replacement
/// of a deleted replica asked for the grown size and could not be
/// scheduled). With the `Restart` method the template is how the
/// instances get the target, so it has it.
pub fn template_limit(facts: &[PodFacts], target: u64, restart: bool) -> u64 {
    if restart {
        return target;
    }
    facts
        .iter()
        .filter_map(|f| f.mem_limit_applied.or(f.mem_limit))
        .min()
        .map_or(target, |applied| applied.min(target))
}

/// `maxmemory` for the server: 75% of the memory limit (or request), leaving
/// room for replication buffers and copy-on-write during snapshots. `None`
/// when the pod has no memory bound.
/// The memory autopilot's limit, when it set one, stands for the spec's.
pub fn maxmemory_bytes(redis: &Redis) -> Option<u64> {
    limit(redis).map(maxmemory_of)
}

/// Method recorded when the cluster resizes pods in place.
pub const IN_PLACE: &str = "InPlace";

/// Method recorded when it does not: ordered rolling restarts.
pub const RESTART: &str = "Restart";
