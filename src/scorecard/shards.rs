//! Auto Pilot, Cluster mode: a Cluster Redis whose shards fill past the
//! shard autopilot's scale-up level (vertical growth not allowed) gets a
//! shard added by the operator, the slots rebalanced onto it online, and
//! every key written is there, read from the shard that owns it at the end.

use std::time::Instant;

use serde_json::json;

use super::cluster::keys_in;
use super::levels::create_ready;
use super::redis_failed;
use super::{Ctx, Failure};
use crate::api::v1alpha1::ReshardingPhase;
use crate::redis::cluster::{SLOTS, SlotRange, key_slot, parse_ranges};

/// Bytes per value, and the values written on each shard: 19 MiB of
/// values (about 60 % of maxmemory with the keys and allocator classes),
/// past half of the 48 MiB `maxmemory` a 64Mi pod gets; 4 shards bring
/// it back under half.
const VALUE: usize = 8 << 10;
const PER_SHARD: usize = 2_400;

/// A shard's slot ranges from status.
fn ranges_of(slots: Option<&str>) -> Vec<SlotRange> {
    slots.and_then(parse_ranges).unwrap_or_default()
}

pub(super) async fn shard_autopilot(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("shards");
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Cluster", "engine": "Valkey", "version": "9.1", "shards": 3, "instances": 2,
               "resources": {"limits": {"memory": "64Mi"}},
               "autopilot": {"shards": {"minShards": 3, "maxShards": 4, "scaleUpPercent": 50,
                                        "scaleDownPercent": 10, "cooldownSeconds": 3600}}}),
    )
    .await?;
    let status = r.status.clone().unwrap_or_default();
    let password = ctx.password(&r).await?;
    let tag = ctx.suffix.clone();
    let value = |k: &str| format!("{k}:{}", "v".repeat(VALUE));

    // The fill: each shard's primary gets keys of its own slots.
    let started = Instant::now();
    let mut written = Vec::new();
    for shard in &status.shards {
        let primary = shard.primary.clone().ok_or_else(|| {
            Failure::new(
                format!("shard {} reports no primary", shard.index),
                "status.shards[].primary names each shard's primary once Ready",
            )
        })?;
        let ranges = ranges_of(shard.slots.as_deref());
        let keys = keys_in(&ranges, &format!("{tag}:{}", shard.index), PER_SHARD);
        let mut p = ctx.connect(&primary, &password).await?;
        for k in &keys {
            let _: () = p
                .query("SET", redis::cmd("SET").arg(k).arg(value(k)))
                .await
                .map_err(|e| {
                    redis_failed(
                        &format!("writing {k} on {primary} (shard {})", shard.index),
                        e,
                    )
                })?;
        }
        written.extend(keys);
    }
    ctx.note(format!(
        "wrote {} keys of 8 KiB ({} MiB of values per shard; the autopilot adds shards at 50 % of each 48 MiB maxmemory) in {:.1}s",
        written.len(),
        (PER_SHARD * VALUE) >> 20,
        started.elapsed().as_secs_f64()
    ));

    // The autopilot adds a shard, and the resharding onto it ends.
    let (r, _) = ctx
        .wait_redis(
            &name,
            None,
            "the shard autopilot's shard added and the slots rebalanced onto 4 shards",
            "see status.autopilot.shards, status.resharding, the ShardsAdded and Resharding* events and `kubectl redpilot status`",
            |r| {
                let st = r.status.clone().unwrap_or_default();
                let autopilot = st.autopilot.as_ref().and_then(|a| a.shards.as_ref());
                let decision = autopilot.and_then(|s| s.last_decision.clone());
                let resharding = st.resharding.clone();
                let cluster = st.cluster.clone().unwrap_or_default();
                // The autopilot's change: AddShards to 4, or (when 4 still
                // leave the fullest shard above the level) AtMaximum at 4
                // with the change recorded.
                let changed = autopilot.is_some_and(|s| s.last_change.is_some());
                let done = r.spec.shards == Some(4)
                    && changed
                    && decision.as_ref().is_some_and(|d| {
                        (d.action == "AddShards" && d.to == 4)
                            || (d.action == "AtMaximum" && d.from == 4)
                    })
                    && resharding
                        .as_ref()
                        .is_some_and(|x| x.phase == ReshardingPhase::Done && x.to_shards == 4)
                    && st.shards.len() == 4
                    && cluster.state == "ok"
                    && cluster.slots_ok == u32::from(SLOTS);
                if done {
                    Ok(r)
                } else {
                    Err(format!(
                        "spec.shards {:?}, last decision {:?}, resharding {:?}, {} shards in status, cluster {} with {} slots ok",
                        r.spec.shards,
                        decision.map(|d| format!("{} {} → {}: {}", d.action, d.from, d.to, d.reason)),
                        resharding.map(|x| format!(
                            "{:?} {}/{} slots ({}) {}",
                            x.phase, x.slots_moved, x.slots_total, x.path, x.message.unwrap_or_default()
                        )),
                        st.shards.len(),
                        cluster.state,
                        cluster.slots_ok
                    ))
                }
            },
        )
        .await?;
    let st = r.status.clone().unwrap_or_default();
    if let Some(d) = st
        .autopilot
        .as_ref()
        .and_then(|a| a.shards.as_ref())
        .and_then(|s| s.last_decision.as_ref())
    {
        ctx.note(format!(
            "decision: {} {} → {}: {}",
            d.action, d.from, d.to, d.reason
        ));
    }
    if let Some(x) = st.resharding.as_ref() {
        ctx.note(format!(
            "resharding: {} slots, {} keys moved ({} path)",
            x.slots_moved, x.keys_moved, x.path
        ));
    }

    // Every key, read from the primary that owns its slot now.
    let mut primaries = Vec::new();
    for shard in &st.shards {
        let Some(primary) = shard.primary.as_deref() else {
            return Err(Failure::new(
                format!(
                    "shard {} reports no primary after the resharding",
                    shard.index
                ),
                "see `kubectl redpilot status`",
            ));
        };
        primaries.push(primary);
    }
    let ranges: Vec<Vec<SlotRange>> = st
        .shards
        .iter()
        .map(|s| ranges_of(s.slots.as_deref()))
        .collect();
    let mut keys_of: Vec<Vec<&String>> = vec![Vec::new(); st.shards.len()];
    let mut unowned = 0;
    for k in &written {
        let slot = key_slot(k.as_bytes());
        match ranges
            .iter()
            .position(|r| r.iter().any(|r| r.contains(slot)))
        {
            Some(i) => keys_of[i].push(k),
            None => unowned += 1,
        }
    }
    if unowned > 0 {
        return Err(Failure::new(
            format!("{unowned} keys fall in slots no shard in status.shards serves"),
            "status.shards[].slots should cover every slot",
        ));
    }
    let mut missing = 0usize;
    let mut on_new = 0usize;
    for ((shard, primary), keys) in st.shards.iter().zip(&primaries).zip(&keys_of) {
        let mut p = ctx.connect(primary, &password).await?;
        for k in keys {
            let v: Option<String> = p
                .query("GET", redis::cmd("GET").arg(k.as_str()))
                .await
                .map_err(|e| redis_failed(&format!("reading {k} on {primary}"), e))?;
            if v.as_deref() != Some(value(k).as_str()) {
                missing += 1;
            }
        }
        if shard.index == 3 {
            on_new += keys.len();
        }
    }
    if missing > 0 || on_new == 0 {
        return Err(Failure::new(
            format!(
                "{missing} of {} keys missing or wrong after the resharding ({on_new} now on the new shard)",
                written.len()
            ),
            "a resharding moves every key of a slot with it; see the Resharding* events",
        ));
    }
    ctx.note(format!(
        "every one of the {} keys read back from its owner, {on_new} of them on the new shard",
        written.len()
    ));
    Ok(())
}
