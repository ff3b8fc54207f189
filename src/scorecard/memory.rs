//! Auto Pilot, memory: a Redis filled past its scale-up level is grown in
//! place by the memory autopilot: the limit and `maxmemory` rise, the pod is
//! not replaced, nothing is evicted, and every key written is there.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::levels::{create_ready, topology};
use super::redis_failed;
use super::{Ctx, Failure};

/// Bytes per value, values per `MSET`, and how much is written: more than
/// the starting `maxmemory` (75 % of 64Mi = 48 MiB) holds.
const VALUE: usize = 8 << 10;
const BATCH: usize = 64;
const FILL: usize = 56 << 20;
/// One batch (512 KiB) every 250 ms: 2 MiB/s.
const PACE: Duration = Duration::from_millis(250);
/// The longest a batch may wait for room. The monitor samples the
/// primary's memory every 500 ms and the autopilot grows as soon as the
/// rate projects the scale-up level within its lookahead: at 2 MiB/s that
/// is seconds after the fill starts, while maxmemory (48 MiB) is reached
/// only after about 20 s, so no batch should wait at all.
const GROW_BOUND: Duration = Duration::from_secs(5);
/// How long a batch refused for memory is retried.
const RETRY_FOR: Duration = Duration::from_secs(60);

async fn pod_uid(ctx: &Ctx, pod: &str) -> Option<String> {
    ctx.pods()
        .get(pod)
        .await
        .ok()
        .and_then(|p: Pod| p.metadata.uid)
}

pub(super) async fn memory_autopilot(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("memory");
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Standalone", "engine": "Redis", "version": "7.0",
               "config": {"maxmemory-policy": "noeviction"},
               "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "64Mi"}},
               "autopilot": {"memory": {"maxMemory": "256Mi"}}}),
    )
    .await?;
    let (primary, _) = topology(&r)?;
    let uid = pod_uid(ctx, &primary).await;
    let password = ctx.password(&r).await?;
    let mut node = ctx.connect(&primary, &password).await?;
    let maxmemory = |v: Vec<String>| v.get(1).and_then(|m| m.parse::<u64>().ok()).unwrap_or(0);
    let before: Vec<String> = node
        .query("CONFIG", redis::cmd("CONFIG").arg("GET").arg("maxmemory"))
        .await
        .map_err(|e| redis_failed("CONFIG GET maxmemory", e))?;
    let before = maxmemory(before);

    // The fill, paced; a batch refused for memory waits and is sent again.
    let value = "v".repeat(VALUE);
    let batches = FILL / (VALUE * BATCH);
    let started = Instant::now();
    let mut refused = 0u32;
    let mut longest = Duration::ZERO;
    for b in 0..batches {
        let due = started + PACE * b as u32;
        tokio::time::sleep_until(due.into()).await;
        let mut cmd = redis::cmd("MSET");
        for i in 0..BATCH {
            cmd.arg(format!("scorecard:mem:{b}:{i}")).arg(&value);
        }
        let first = Instant::now();
        loop {
            match node.query::<()>("MSET", &cmd).await {
                Ok(()) => {
                    longest = longest.max(first.elapsed());
                    break;
                }
                Err(e) if e.to_string().contains("OOM") && first.elapsed() < RETRY_FOR => {
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(Failure::new(
                        format!(
                            "writing batch {b} of {batches} ({} MiB in): {e}",
                            (b * VALUE * BATCH) >> 20
                        ),
                        "the memory autopilot should grow the limit before maxmemory is reached; see status.autopilot.memory and the MemoryGrow events",
                    ));
                }
            }
        }
    }
    let keys = (batches * BATCH) as i64;
    ctx.note(format!(
        "wrote {} MiB in {keys} keys in {:.1}s at 2 MiB/s ({refused} refusals for memory, each retried; the longest wait for a batch {:.1}s)",
        FILL >> 20,
        started.elapsed().as_secs_f64(),
        longest.as_secs_f64()
    ));
    if longest > GROW_BOUND {
        return Err(Failure::new(
            format!(
                "writes were refused for memory for {:.1}s before the autopilot grew the limit (bound {}s)",
                longest.as_secs_f64(),
                GROW_BOUND.as_secs()
            ),
            "the operator samples the primary's memory every probe and grows before maxmemory is reached; see the MemoryGrow events and the operator's log",
        ));
    }

    let (grown, _) = ctx
        .wait_redis(
            &name,
            None,
            "the memory autopilot's grow recorded in status.autopilot.memory",
            "see status.autopilot.memory, the MemoryAtMaximum condition and the Memory* events",
            |r| {
                let a = r
                    .status
                    .and_then(|s| s.autopilot)
                    .and_then(|a| a.memory)
                    .ok_or_else(|| "no status.autopilot.memory".to_string())?;
                if a.limit_bytes > 64 << 20 {
                    Ok(a)
                } else {
                    Err(format!("limit {}", a.limit))
                }
            },
        )
        .await?;
    let decision = grown
        .last_decision
        .clone()
        .map(|d| format!("{} {} → {}: {}", d.action, d.from, d.to, d.reason));
    ctx.note(format!(
        "limit {}; last decision: {}",
        grown.limit,
        decision.unwrap_or_default()
    ));
    let after: Vec<String> = node
        .query("CONFIG", redis::cmd("CONFIG").arg("GET").arg("maxmemory"))
        .await
        .map_err(|e| redis_failed("CONFIG GET maxmemory", e))?;
    let after = maxmemory(after);
    if after <= before {
        return Err(Failure::new(
            format!(
                "maxmemory is still {after} bytes (was {before}) after the limit grew to {}",
                grown.limit
            ),
            "the operator sets maxmemory to 75 % of the new limit once the resize is in effect",
        ));
    }
    let dbsize: i64 = node
        .query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .map_err(|e| redis_failed("DBSIZE", e))?;
    let info = node
        .info_section("stats")
        .await
        .map_err(|e| redis_failed("INFO stats", e))?;
    let evicted = info.fields.get("evicted_keys").cloned().unwrap_or_default();
    if dbsize != keys || evicted != "0" {
        return Err(Failure::new(
            format!("{dbsize} keys of {keys} written, {evicted} evicted"),
            "with noeviction and the autopilot, every acknowledged key stays",
        ));
    }
    if pod_uid(ctx, &primary).await != uid {
        return Err(Failure::new(
            format!("pod {primary} was replaced to grow the memory"),
            "the autopilot resizes in place (pods/resize) where the cluster allows it",
        ));
    }
    ctx.note(format!(
        "maxmemory {} → {} MiB, {dbsize} keys, 0 evicted, pod {primary} not replaced",
        before >> 20,
        after >> 20
    ));
    Ok(())
}
