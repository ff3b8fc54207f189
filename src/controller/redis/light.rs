//! The light periodic pass: a calm Redis that nothing changed is looked at
//! by reading what its last full pass read past the caches, and nothing
//! else.
//!
//! A Ready Redis is reconciled once a minute when nothing changes
//! ([`crate::controller::queue::STEADY_REQUEUE`]); that pass exists for
//! what no watch reports: the Secrets (never watched: the operator may not
//! list them) and the servers. Of a Replication Redis the failure monitor
//! already hears the primary every five seconds, and each of those probes
//! asks whether every replica still has a live link to it (a calm primary,
//! see [`crate::controller::monitor`]). So the periodic pass of such a
//! Redis is light when all of this holds:
//!
//! - the last full pass found nothing to do (it asked for the steady
//!   requeue and left the Redis Ready) less than [`FULL_PASS_EVERY`] ago,
//!   from the Redis as it is now (same `resourceVersion`), no tuning look
//!   is due, and no change reached the controller since
//!   it began: not to the Redis, a child, a pod, nor a trigger of the
//!   failure monitor (every one goes through
//!   [`crate::controller::queue::Queue::triggered`], which drops the mark);
//! - the monitor holds the primary calm: probed at the calm rate, its
//!   last answer within two calm intervals, and its last `INFO
//!   replication` named every replica the last full pass saw;
//! - every object that pass read past the caches (its Secrets) has the
//!   same `resourceVersion` (read as metadata only: no Secret's data);
//! - the Redis is one whose passes depend on nothing else: Replication of
//!   two or more, without TLS (a renewed certificate is compared with what
//!   the servers present), an archive, a followed source, or the memory
//!   autopilot (their steps watch servers or clocks each pass).
//!
//! Then the pass ends there (one read per Secret instead of two reads and
//! three server connections, `INFO` and `CONFIG GET`, and every child
//! built and compared). A hand change on a server that no replica link
//! shows (a `CONFIG SET`, an ACL edit), or on an object that is not
//! watched (the PodMonitor and PrometheusRule), is put back by the next
//! full pass, at most [`FULL_PASS_EVERY`] later instead of a minute.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::runtime::reflector::ObjectRef;

use super::children::Child;
use super::{Mode, Reconciler, Redis};
use crate::controller::Context;
use crate::controller::queue::{FULL_PASS_EVERY, Mark, Next, STEADY_REQUEUE};

/// How early a periodic pass may come and still count as on time for a
/// full pass or a tuning look that is due.
const EARLY: Duration = Duration::from_secs(10);

/// `name`'s `resourceVersion` now (`None`: gone), from its metadata.
pub fn version_now<K: Child>(
    client: kube::Client,
    ns: String,
    name: String,
) -> BoxFuture<'static, Result<Option<String>, kube::Error>> {
    async move {
        Ok(Api::<K>::namespaced(client, &ns)
            .get_metadata_opt(&name)
            .await?
            .and_then(|m| m.metadata.resource_version))
    }
    .boxed()
}

/// Whether `redis`'s passes may be light (see the module's text).
pub fn eligible(redis: &Redis) -> bool {
    let spec = &redis.spec;
    spec.mode() == Mode::Replication
        && spec.desired_instances() >= 2
        && spec.tls.is_none()
        && spec.archive.is_none()
        && spec.replica_of.is_none()
        && spec.memory_autopilot().is_none()
        && !spec.paused
        && !spec.hibernate
        && redis.status.as_ref().is_some_and(|s| s.ready())
}

/// Whether this pass may end here: see the module's text. Reads the
/// marked objects' versions (one request each); any difference or error
/// means a full pass (and the caller drops the mark).
pub async fn unchanged(redis: &Redis, oref: &ObjectRef<Redis>, ns: &str, ctx: &Context) -> bool {
    if !eligible(redis) || ctx.written_version(oref).is_some() {
        return false;
    }
    let Some(mark) = ctx.metrics.queue.mark(oref) else {
        return false;
    };
    // The Redis this pass has is the one the full pass worked from (a
    // change that came while that pass waited to start is not in its epoch).
    if mark.version != redis.metadata.resource_version {
        return false;
    }
    // A full pass at least every FULL_PASS_EVERY, and when a tuning look is
    // due (or due within the few seconds a pass may come early).
    let tuning = ctx.settings.tuning_interval;
    let look_due = !tuning.is_zero()
        && ctx
            .tuning
            .lock()
            .ok()
            .and_then(|all| all.get(oref).and_then(super::tuning::Memory::last_look))
            .is_none_or(|last| last.elapsed() + EARLY >= tuning);
    if look_due || mark.at.elapsed() + EARLY >= FULL_PASS_EVERY || !ctx.monitor.holds_calm(oref) {
        return false;
    }
    for read in &mark.reads {
        ctx.metrics.kube("get_metadata");
        let now = (read.check)(ctx.client.clone(), ns.to_string(), read.name.clone()).await;
        if !matches!(now, Ok(ref v) if *v == read.version) {
            return false;
        }
    }
    true
}

/// After a full pass: when it found nothing to do, its mark for the light
/// passes after it (kept only if no change came since `epoch`).
pub(super) fn leave_mark(r: &Reconciler, epoch: u64, next: Next) {
    if next.delay() != Some(STEADY_REQUEUE) || !eligible(&r.redis) {
        return;
    }
    let reads = r.reads.lock().map(|r| r.clone()).unwrap_or_default();
    r.ctx.metrics.queue.leave_mark(
        &r.oref,
        epoch,
        Mark {
            at: Instant::now(),
            version: r.redis.metadata.resource_version.clone(),
            reads,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn redis(spec: Value, ready: &str) -> Redis {
        serde_json::from_value(json!({
            "apiVersion": "redpilot.io/v1alpha1",
            "kind": "Redis",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": spec,
            "status": {"conditions": [{
                "type": "Ready", "status": ready, "reason": "r", "message": "",
                "lastTransitionTime": "2026-12-07T00:00:00Z"
            }]},
        }))
        .unwrap_or_else(|e| panic!("a Redis: {e}"))
    }

    #[test]
    fn only_a_ready_replication_whose_passes_watch_no_clock_or_server_may_be_light() {
        let base = json!({"mode": "Replication", "instances": 3});
        assert!(eligible(&redis(base.clone(), "True")));
        assert!(!eligible(&redis(base.clone(), "False")), "not Ready");
        let with = |k: &str, v: Value| {
            let mut s = base.clone();
            s[k] = v;
            eligible(&redis(s, "True"))
        };
        assert!(!with("instances", json!(1)), "one instance: no monitor");
        assert!(!with("mode", json!("Standalone")));
        assert!(!with("tls", json!({})), "certificates compared each pass");
        assert!(!with("paused", json!(true)));
        assert!(!with("hibernate", json!(true)));
        assert!(
            !with("replicaOf", json!({"host": "10.0.0.1", "secretName": "s"})),
            "a followed source"
        );
    }
}
