//! The Cluster mode test of the `redpilot` scorecard suite (Basic Install):
//! a Cluster Redis of 3 shards × 2 instances becomes Ready with every slot
//! served; keys written on each shard's primary (keys of that shard's
//! slots) reach its replica, and a primary redirects a key of another
//! shard with `MOVED`.

use std::time::{Duration, Instant};

use serde_json::json;

use super::levels::create_ready;
use super::redis_failed;
use super::{Ctx, Failure};
use crate::redis::cluster::{SLOTS, SlotRange, key_slot, parse_ranges};

/// Keys written per shard.
const KEYS_PER_SHARD: usize = 50;
/// How long a replica may take to hold its primary's writes.
const REPLICATION_BOUND: Duration = Duration::from_secs(30);

/// `count` keys tagged `tag` whose slots are in `ranges`.
pub(super) fn keys_in(ranges: &[SlotRange], tag: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("sc:{tag}:{i}"))
        .filter(|k| {
            let slot = key_slot(k.as_bytes());
            ranges.iter().any(|r| r.contains(slot))
        })
        .take(count)
        .collect()
}

/// Basic Install in Cluster mode.
pub(super) async fn cluster_install(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("cluster");
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Cluster", "engine": "Valkey", "version": "8.1", "shards": 3, "instances": 2}),
    )
    .await?;
    let status = r.status.clone().unwrap_or_default();
    let cluster = status.cluster.clone().unwrap_or_default();
    if cluster.state != "ok" || cluster.slots_ok != u32::from(SLOTS) {
        return Err(Failure::new(
            format!(
                "Ready, but status.cluster reports state {:?} with {} of {SLOTS} slots ok",
                cluster.state, cluster.slots_ok
            ),
            "Ready in Cluster mode means cluster_state:ok with every slot served; see `kubectl redpilot status`",
        ));
    }
    if status.shards.len() != 3 {
        return Err(Failure::new(
            format!(
                "status.shards lists {} shards, expected 3",
                status.shards.len()
            ),
            "status.shards should have one entry per shard",
        ));
    }
    let password = ctx.password(&r).await?;
    let tag = ctx.suffix.clone();
    let mut covered = 0u32;
    let mut shard_keys = Vec::new();
    for shard in &status.shards {
        let (Some(primary), [replica]) = (shard.primary.clone(), shard.replicas.as_slice()) else {
            return Err(Failure::new(
                format!(
                    "shard {} reports primary {:?} and replicas {:?}, expected a primary and one replica",
                    shard.index, shard.primary, shard.replicas
                ),
                "each shard runs spec.instances instances, one primary and its replicas",
            ));
        };
        let ranges = shard
            .slots
            .as_deref()
            .and_then(parse_ranges)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| {
                Failure::new(
                    format!("shard {} reports slots {:?}", shard.index, shard.slots),
                    "status.shards[].slots lists the ranges each shard serves",
                )
            })?;
        covered += ranges.iter().map(SlotRange::count).sum::<u32>();
        let keys = keys_in(&ranges, &format!("{tag}:{}", shard.index), KEYS_PER_SHARD);
        let mut p = ctx.connect(&primary, &password).await?;
        for k in &keys {
            let _: () = p
                .query("SET", redis::cmd("SET").arg(k).arg(k))
                .await
                .map_err(|e| redis_failed(&format!("writing {k} on {primary}"), e))?;
        }
        shard_keys.push((shard.index, primary, replica.clone(), ranges, keys));
    }
    if covered != u32::from(SLOTS) {
        return Err(Failure::new(
            format!("the shards' slot ranges add up to {covered} slots, not {SLOTS}"),
            "every slot belongs to exactly one shard",
        ));
    }
    ctx.note(format!(
        "wrote {KEYS_PER_SHARD} keys on each of the 3 shard primaries"
    ));
    for (index, primary, replica, _, keys) in &shard_keys {
        let mut rep = ctx.connect(replica, &password).await?;
        let _: () = rep
            .query("READONLY", &redis::cmd("READONLY"))
            .await
            .map_err(|e| redis_failed(&format!("READONLY on {replica}"), e))?;
        let started = Instant::now();
        loop {
            let mut missing = 0;
            for k in keys {
                let v: Option<String> = rep
                    .query("GET", redis::cmd("GET").arg(k))
                    .await
                    .map_err(|e| redis_failed(&format!("reading {k} on {replica}"), e))?;
                if v.as_deref() != Some(k.as_str()) {
                    missing += 1;
                }
            }
            if missing == 0 {
                break;
            }
            if started.elapsed() > REPLICATION_BOUND {
                return Err(Failure::new(
                    format!(
                        "shard {index}: replica {replica} lacks {missing} of the {} keys written on {primary} after {}s",
                        keys.len(),
                        REPLICATION_BOUND.as_secs()
                    ),
                    "see `kubectl redpilot status` and INFO replication on the replica",
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        ctx.note(format!(
            "shard {index}: replica {replica} has every key of {primary} after {:.1}s",
            started.elapsed().as_secs_f64()
        ));
    }
    // A key of shard 1 asked of shard 0's primary is redirected there.
    let (_, primary0, _, _, _) = &shard_keys[0];
    let (_, primary1, _, ranges1, keys1) = &shard_keys[1];
    let ip1 = ctx.pod_ip(primary1).await?;
    let mut p0 = ctx.connect(primary0, &password).await?;
    let answer = p0
        .query::<Option<String>>("GET", redis::cmd("GET").arg(&keys1[0]))
        .await;
    match answer {
        Err(e)
            if e.server_code() == Some("MOVED") && e.to_string().contains(&format!("{ip1}:")) =>
        {
            ctx.note(format!(
                "{primary0} redirects {} (slot {}, in {}) to {primary1} with MOVED",
                keys1[0],
                key_slot(keys1[0].as_bytes()),
                ranges1
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            Ok(())
        }
        other => Err(Failure::new(
            format!(
                "{primary0} answered {other:?} for {}, a key of shard 1; expected a MOVED redirection to {primary1} ({ip1})",
                keys1[0]
            ),
            "every node must know the slot map (CLUSTER SLOTS)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_chosen_in_their_shards_slots() {
        let ranges = [SlotRange {
            start: 5462,
            end: 10922,
        }];
        let keys = keys_in(&ranges, "t", 20);
        assert_eq!(keys.len(), 20);
        for k in &keys {
            assert!(ranges[0].contains(key_slot(k.as_bytes())), "{k}");
        }
    }
}
