//! The shard autopilot (Cluster mode): more shards when the fullest shard
//! primary nears its `maxmemory` and the memory autopilot can grow no
//! further, fewer once the data is gone. It sets `spec.shards` (server-side
//! apply, as a HorizontalPodAutoscaler sets replicas); the resharding that
//! follows is [`crate::controller::redis::cluster::reshard`]'s.
//!
//! Hysteresis, as for the memory autopilot: an increase is sized so that
//! the fullest shard lands in the middle of the band between the two
//! thresholds once the slots are spread; a shard is removed only when the
//! fullest shard would still land below that middle without it, after use
//! stayed below the lower threshold for a whole cooldown and a cooldown
//! passed since the last change. Nothing is decided while a resharding,
//! an upgrade or any other change is under way.

use kube::runtime::events::EventType;

use crate::api::v1alpha1::{ReshardingPhase, ShardAutopilotSpec, ShardDecision};
use crate::controller::redis::cluster::model::Plan;
use crate::controller::redis::facts::PodFacts;
use crate::controller::redis::report::Memory;
use crate::controller::redis::{Error, Reconciler};

/// The policy, in numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Add shards at this fraction of maxmemory (the fullest shard).
    pub up: f64,
    /// Remove one below this fraction (every shard).
    pub down: f64,
    /// Fewest shards.
    pub min: i32,
    /// Most shards.
    pub max: i32,
    /// Seconds below `down`, and since the last change, before removing.
    pub cooldown: i64,
}

impl Policy {
    /// The policy of `spec`.
    pub fn from_spec(spec: &ShardAutopilotSpec) -> Policy {
        Policy {
            up: f64::from(spec.scale_up_percent) / 100.0,
            down: f64::from(spec.scale_down_percent) / 100.0,
            min: spec.min_shards.clamp(3, 100),
            max: spec
                .max_shards
                .clamp(3, 100)
                .max(spec.min_shards.clamp(3, 100)),
            cooldown: i64::from(spec.cooldown_seconds),
        }
    }

    fn settle(&self) -> f64 {
        (self.up + self.down) / 2.0
    }
}

/// What was observed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// The fullest shard primary's used memory, as a fraction of its
    /// maxmemory.
    pub fullest: f64,
    /// The largest share of maxmemory a shard primary's keys take
    /// (`used_memory_dataset`; the rest, such as the replication backlog,
    /// does not move with the slots).
    pub dataset: f64,
    /// `spec.shards`.
    pub shards: i32,
    /// The memory autopilot is on and can still grow the instances.
    pub vertical_room: bool,
    /// Now, and since when use is below `down`, and the last change
    /// (Unix seconds).
    pub now: i64,
    /// See `now`.
    pub below_since: Option<i64>,
    /// See `now`.
    pub last_change: Option<i64>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing.
    Keep,
    /// More shards.
    Add {
        /// The new count.
        to: i32,
        /// Why.
        why: String,
    },
    /// One shard fewer.
    Remove {
        /// The new count.
        to: i32,
        /// Why.
        why: String,
    },
    /// Short of memory at `maxShards`.
    AtMaximum {
        /// The count wanted.
        wanted: i32,
        /// Why.
        why: String,
    },
}

/// Decides (pure, table-tested).
pub fn decide(p: &Policy, o: &Observed) -> Decision {
    let pct = |f: f64| (f * 100.0).round() as i64;
    if o.shards < p.min {
        return Decision::Add {
            to: p.min,
            why: format!("spec.shards {} is below minShards {}", o.shards, p.min),
        };
    }
    if o.fullest >= p.up {
        if o.vertical_room {
            return Decision::Keep;
        }
        let n = f64::from(o.shards);
        let wanted = ((n * o.fullest / p.settle()).ceil() as i32).max(o.shards + 1);
        let why = |to: i32| {
            format!(
                "the fullest shard uses {}% of its maxmemory (scale up at {}%); {to} shards bring it to about {}%",
                pct(o.fullest),
                pct(p.up),
                pct(o.fullest * n / f64::from(to))
            )
        };
        if o.shards >= p.max {
            return Decision::AtMaximum {
                wanted,
                why: format!("{}, but maxShards is {}", why(wanted), p.max),
            };
        }
        let to = wanted.min(p.max);
        return Decision::Add { to, why: why(to) };
    }
    if o.dataset < p.down && o.shards > p.min {
        let since = o.below_since.unwrap_or(o.now);
        let quiet = o.now - since >= p.cooldown;
        let settled = o.last_change.is_none_or(|t| o.now - t >= p.cooldown);
        let n = f64::from(o.shards);
        // Each of the others takes a share of the removed shard's keys.
        let projected = o.fullest + o.dataset / (n - 1.0);
        if quiet && settled && projected < p.settle() {
            return Decision::Remove {
                to: o.shards - 1,
                why: format!(
                    "every shard's keys stayed below {}% of its maxmemory for {} s (at most {}%, \
                     {}% used in all); without one shard the fullest would use about {}%",
                    pct(p.down),
                    o.now - since,
                    pct(o.dataset),
                    pct(o.fullest),
                    pct(projected)
                ),
            };
        }
    }
    Decision::Keep
}

/// The fullest shard primary's use of its maxmemory, and the largest
/// share its keys take, from the pass's facts.
pub fn fullest(plan: &Plan, facts: &[PodFacts]) -> Option<(f64, f64)> {
    plan.shards
        .iter()
        .filter_map(|s| s.primary.as_deref())
        .filter_map(|p| facts.iter().find(|f| f.name == p))
        .filter_map(|f| {
            let max = f.maxmemory.filter(|m| *m > 0)? as f64;
            let used = f.used_memory? as f64;
            Some((used / max, f.dataset.map_or(used, |d| d as f64) / max))
        })
        .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
}

impl Reconciler {
    /// Decides the shard count of a Cluster Redis with `spec.autopilot.
    /// shards`, and applies a change to `spec.shards`.
    pub(in crate::controller::redis) async fn shard_autopilot(
        &mut self,
        plan: &Plan,
        facts: &[PodFacts],
        memory: &mut Memory,
    ) -> Result<(), Error> {
        let Some(spec) = self.redis.spec.shard_autopilot().cloned() else {
            return Ok(());
        };
        let busy = self
            .records
            .resharding
            .as_ref()
            .is_some_and(|r| r.phase != ReshardingPhase::Done)
            || self.upgrade_in_flight()
            || !plan.healthy
            || self.redis.spec.hibernate
            || plan.shards.len() != usize::try_from(self.redis.spec.desired_shards()).unwrap_or(0);
        let policy = Policy::from_spec(&spec);
        // Without the memory autopilot, the monitor asks for a pass when a
        // shard primary crosses either threshold (else the next pass could
        // be a minute away while the data grows). No lookahead: this policy
        // decides on the level reached, so a pass asked for by a projection
        // would find it not yet reached, and the monitor asks only once per
        // crossing.
        if self.redis.spec.memory_autopilot().is_none()
            && let Some(max) = plan
                .shards
                .iter()
                .filter_map(|s| s.primary.as_deref())
                .filter_map(|p| facts.iter().find(|f| f.name == p)?.maxmemory)
                .filter(|m| *m > 0)
                .min()
        {
            let level = |f: f64| (f * max as f64) as u64;
            self.ctx.monitor.watch_memory(
                &self.oref,
                Some((level(policy.down), level(policy.up))),
                crate::controller::monitor::LowMeasure::Dataset,
                std::time::Duration::ZERO,
            );
        }
        let Some((fullest, dataset)) = fullest(plan, facts) else {
            return Ok(());
        };
        let rec = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.autopilot.as_ref()?.shards.clone());
        let now = chrono::Utc::now();
        let parse = |t: &Option<String>| {
            t.as_deref()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.timestamp())
        };
        let below_since = (dataset < policy.down).then(|| {
            rec.as_ref()
                .and_then(|r| parse(&r.below_since))
                .unwrap_or(now.timestamp())
        });
        let vertical_room = self.redis.spec.memory_autopilot().is_some()
            && memory.cond.as_ref().is_none_or(|c| !c.status);
        let observed = Observed {
            fullest,
            dataset,
            shards: self.redis.spec.desired_shards(),
            vertical_room,
            now: now.timestamp(),
            below_since,
            last_change: rec.as_ref().and_then(|r| parse(&r.last_change)),
        };
        let decision = if busy {
            Decision::Keep
        } else {
            decide(&policy, &observed)
        };
        if let Some(since) = below_since {
            let last = observed.last_change.unwrap_or(since);
            let due = since.max(last) + policy.cooldown - observed.now;
            let due = std::time::Duration::from_secs(due.max(0) as u64 + 1);
            memory.due = Some(memory.due.map_or(due, |d| d.min(due)));
        }
        let stamp = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut next = rec.clone().unwrap_or_default();
        next.below_since = below_since
            .and_then(|t| chrono::DateTime::from_timestamp(t, 0).map(|t| t.to_rfc3339()));
        let from = observed.shards;
        next.at_maximum = fullest >= policy.up && !vertical_room && observed.shards >= policy.max;
        let report = match &decision {
            Decision::Keep => None,
            Decision::Add { to, why } => {
                Some(("AddShards", *to, why, true, ["add_shards", "applied"]))
            }
            Decision::Remove { to, why } => {
                Some(("RemoveShard", *to, why, true, ["remove_shard", "applied"]))
            }
            Decision::AtMaximum { wanted, why } => Some((
                "AtMaximum",
                *wanted,
                why,
                false,
                ["shards_at_maximum", "refused"],
            )),
        };
        let mut event = None;
        let mut written = rec.clone();
        if let Some((action, to, why, changes, metric)) = report {
            let repeat = next
                .last_decision
                .as_ref()
                .is_some_and(|d| d.action == action && d.from == from);
            if changes || !repeat {
                next.last_decision = Some(ShardDecision {
                    time: stamp.clone(),
                    action: action.into(),
                    from,
                    to,
                    reason: why.clone(),
                });
            }
            if changes {
                // The record first, then the change: an operator stopped
                // between the two finds the cooldown running and nothing
                // changed (a removal waits one more cooldown; an addition,
                // which waits for none, is decided again at once). The other
                // order left a changed spec.shards with the old record, and
                // a second shard could go before the first one's cooldown.
                next.last_change = Some(stamp.clone());
                next.below_since = None;
                self.write_shard_record(&next).await?;
                crate::failpoint::hit("shards-after-record");
                if !self.set_shards(to, action).await? {
                    // Refused (reported): the record goes back as it was,
                    // so no cooldown runs for a change never made.
                    self.write_shard_record(&rec.clone().unwrap_or_default())
                        .await?;
                    return Ok(());
                }
                written = Some(next.clone());
            }
            if changes || !repeat {
                self.ctx.metrics.autopilot.with_label_values(&metric).inc();
                event = Some(match action {
                    "AtMaximum" => (
                        EventType::Warning,
                        "ShardsAtMaximum",
                        format!("shards stay {from}: {why}"),
                    ),
                    "AddShards" => (
                        EventType::Normal,
                        "ShardsAdded",
                        format!("spec.shards {from} → {to}: {why}"),
                    ),
                    _ => (
                        EventType::Normal,
                        "ShardsRemoved",
                        format!("spec.shards {from} → {to}: {why}"),
                    ),
                });
            }
        }
        if written.as_ref() != Some(&next) {
            self.write_shard_record(&next).await?;
        }
        if let Some((kind, reason, text)) = event {
            tracing::info!(redis = %self.oref, reason, "{text}");
            self.event(kind, reason, "Autoscale", text).await;
        }
        Ok(())
    }

    /// Writes `status.autopilot.shards` (every field, absent ones as null).
    async fn write_shard_record(
        &mut self,
        record: &crate::api::v1alpha1::ShardAutopilotStatus,
    ) -> Result<(), Error> {
        let mut value = serde_json::to_value(record)
            .map_err(|e| Error::Serialize("status.autopilot.shards", e))?;
        if let Some(o) = value.as_object_mut() {
            for key in ["belowSince", "lastChange", "lastDecision", "atMaximum"] {
                o.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        self.patch_status(serde_json::json!({"autopilot": {"shards": value}}))
            .await
    }

    /// Applies `spec.shards` with the operator's field manager. False when
    /// the API server refused it (reported).
    async fn set_shards(&mut self, to: i32, action: &str) -> Result<bool, Error> {
        use kube::ResourceExt;
        let body = serde_json::json!({
            "apiVersion": "redpilot.io/v1alpha1",
            "kind": "Redis",
            "metadata": {"name": self.redis.name_any()},
            "spec": {"shards": to},
        });
        self.ctx.metrics.kube("apply_redis_spec");
        let api: kube::Api<crate::api::v1alpha1::Redis> = self.api();
        let pp = kube::api::PatchParams::apply(crate::controller::base::FIELD_MANAGER).force();
        match api
            .patch(&self.redis.name_any(), &pp, &kube::api::Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                self.report.wrote();
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 422 => {
                self.report_failure(
                    "AutopilotRefused",
                    "Autoscale",
                    "kube",
                    format!(
                        "spec.shards: the shard autopilot's {action} to {to} was refused: {}",
                        e.message
                    ),
                )
                .await;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            up: 0.8,
            down: 0.3,
            min: 3,
            max: 6,
            cooldown: 600,
        }
    }

    fn at(fullest: f64, shards: i32) -> Observed {
        Observed {
            fullest,
            dataset: fullest,
            shards,
            vertical_room: false,
            now: 10_000,
            below_since: None,
            last_change: None,
        }
    }

    #[test]
    fn a_full_shard_adds_enough_shards_to_land_in_the_middle_of_the_band() {
        let p = policy();
        // 3 shards at 85%: 3 x 0.85 / 0.55 = 4.6 → 5 shards, ~51% each.
        match decide(&p, &at(0.85, 3)) {
            Decision::Add { to, .. } => assert_eq!(to, 5),
            d => panic!("{d:?}"),
        }
        // Just over the threshold: at least one more.
        assert!(matches!(
            decide(&p, &at(0.80, 3)),
            Decision::Add { to: 5, .. } | Decision::Add { to: 4, .. }
        ));
        // Below it: nothing.
        assert_eq!(decide(&p, &at(0.79, 3)), Decision::Keep);
        // Capped at maxShards, and at maxShards still short: said so.
        assert!(matches!(
            decide(&p, &at(0.95, 5)),
            Decision::Add { to: 6, .. }
        ));
        assert!(matches!(
            decide(&p, &at(0.9, 6)),
            Decision::AtMaximum { wanted: 10, .. }
        ));
    }

    #[test]
    fn the_memory_autopilot_grows_first_while_it_can() {
        let mut o = at(0.9, 3);
        o.vertical_room = true;
        assert_eq!(decide(&policy(), &o), Decision::Keep);
    }

    #[test]
    fn a_shard_goes_only_after_a_quiet_cooldown_and_when_the_rest_have_room() {
        let p = policy();
        let mut o = at(0.2, 5);
        // Low, but not for a whole cooldown.
        o.below_since = Some(o.now - 599);
        assert_eq!(decide(&p, &o), Decision::Keep);
        o.below_since = Some(o.now - 600);
        assert!(matches!(decide(&p, &o), Decision::Remove { to: 4, .. }));
        // A change within the cooldown holds it.
        o.last_change = Some(o.now - 100);
        assert_eq!(decide(&p, &o), Decision::Keep);
        o.last_change = Some(o.now - 700);
        // Never below minShards.
        o.shards = 3;
        assert_eq!(decide(&p, &o), Decision::Keep);
        // Without the shard the fullest would pass the middle: kept.
        let mut o = at(0.29, 3);
        o.shards = 4;
        o.below_since = Some(o.now - 700);
        // 0.29 x 4/3 = 0.39 < 0.55: removed.
        assert!(matches!(decide(&p, &o), Decision::Remove { to: 3, .. }));
        let tight = Policy {
            up: 0.4,
            down: 0.35,
            ..p
        };
        let mut o = at(0.34, 4);
        o.below_since = Some(o.now - 700);
        // 0.34 x 4/3 = 0.45 > 0.375: kept.
        assert_eq!(decide(&tight, &o), Decision::Keep);
    }

    #[test]
    fn no_decision_undoes_the_one_before() {
        // Hysteresis: after an add the fullest lands at or below the
        // middle, above `down`; after a remove below the middle, under `up`.
        let p = policy();
        for pct in 80..=99 {
            let f = f64::from(pct) / 100.0;
            for shards in 3..6 {
                if let Decision::Add { to, .. } = decide(&p, &at(f, shards)) {
                    let after = f * f64::from(shards) / f64::from(to);
                    let mut o = at(after, to);
                    o.below_since = Some(o.now - 10_000);
                    o.last_change = Some(o.now - 10_000);
                    assert!(
                        !matches!(decide(&p, &o), Decision::Remove { .. }),
                        "{pct}% on {shards} → {to} at {after:.2}"
                    );
                }
            }
        }
        for pct in 1..30 {
            let f = f64::from(pct) / 100.0;
            for shards in 4..=6 {
                let mut o = at(f, shards);
                o.below_since = Some(o.now - 10_000);
                if let Decision::Remove { to, .. } = decide(&p, &o) {
                    let after = f * f64::from(shards) / f64::from(to);
                    assert!(
                        !matches!(decide(&p, &at(after, to)), Decision::Add { .. }),
                        "{pct}% on {shards} → {to} at {after:.2}"
                    );
                }
            }
        }
    }

    #[test]
    fn memory_that_does_not_move_with_the_slots_does_not_hold_a_removal() {
        // A quarter of maxmemory is backlog and buffers; the keys take 2 %.
        let p = policy();
        let mut o = at(0.27, 5);
        o.dataset = 0.02;
        o.below_since = Some(o.now - 700);
        // 0.27 + 0.02 / 4 = 0.275 < 0.55.
        assert!(matches!(decide(&p, &o), Decision::Remove { to: 4, .. }));
        // Keys over `down`: not low.
        o.dataset = 0.31;
        assert_eq!(decide(&p, &o), Decision::Keep);
    }

    #[test]
    fn below_the_minimum_it_grows_to_it() {
        let mut p = policy();
        p.min = 4;
        assert!(matches!(
            decide(&p, &at(0.1, 3)),
            Decision::Add { to: 4, .. }
        ));
    }
}
