//! The memory autopilot's decision, pure: what the primary's dataset uses
//! and how fast it grows, the limit the instances run, the policy and the
//! cluster's bound in; keep, grow, shrink, at maximum or bounded out.
//!
//! Sizes are container memory limits; `maxmemory` is 75 % of the limit
//! (the operator's rule, see `limits::maxmemory_bytes`).
//!
//! Hysteresis: a grow is sized so that the projected use lands at the
//! middle of the band between the two thresholds, and a shrink so that the
//! current use lands there too; so neither is followed by the other, and a
//! shrink needs the use below the lower threshold for a whole cooldown
//! (any sample above it starts the wait again), and the cooldown since the
//! last change.

use crate::api::v1alpha1::MemoryAutopilotSpec;

/// Sizes are rounded up to this.
pub const ROUND: u64 = 1 << 20;

/// The policy, in numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Grow at this fraction of maxmemory.
    pub up: f64,
    /// Shrink below this fraction of maxmemory.
    pub down: f64,
    /// The smallest grow, as a fraction of the limit.
    pub step: f64,
    /// The smallest limit.
    pub min: u64,
    /// The largest limit.
    pub max: u64,
    /// Seconds below `down` (and since the last change) before a shrink.
    pub cooldown: i64,
    /// Seconds the growth rate is projected.
    pub lookahead: i64,
}

impl Policy {
    /// The policy of `spec`, with `base` (the spec's limit) as the default
    /// minimum; a `maxMemory` below `base` counts as `base` (the schema
    /// cannot compare the two within the API server's validation budget).
    /// `None` when a size does not parse.
    pub fn from_spec(spec: &MemoryAutopilotSpec, base: u64) -> Option<Policy> {
        let bytes = crate::controller::redis::facts::quantity_bytes;
        let max = bytes(&spec.max_memory)?.max(base);
        let min = match &spec.min_memory {
            Some(q) => bytes(q)?,
            None => base,
        };
        Some(Policy {
            up: f64::from(spec.scale_up_percent) / 100.0,
            down: f64::from(spec.scale_down_percent) / 100.0,
            step: f64::from(spec.step_percent) / 100.0,
            min: min.min(max),
            max,
            cooldown: i64::from(spec.scale_down_cooldown_seconds),
            lookahead: i64::from(spec.lookahead_seconds),
        })
    }

    /// Where a resize puts the use: the middle of the band.
    fn settle(&self) -> f64 {
        (self.up + self.down) / 2.0
    }
}

/// `maxmemory` for a limit (75 %).
pub fn maxmemory_of(limit: u64) -> u64 {
    limit / 4 * 3
}

/// The smallest limit whose maxmemory holds `bytes` at `fraction`.
fn limit_for(bytes: f64, fraction: f64) -> u64 {
    let max_mem = bytes / fraction;
    let limit = (max_mem * 4.0 / 3.0).ceil() as u64;
    limit.div_ceil(ROUND) * ROUND
}

/// What was observed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Observed {
    /// The primary's `used_memory`.
    pub used: u64,
    /// Its growth, bytes per second (from the monitor's samples), when known.
    pub rate: Option<f64>,
    /// The limit the instances run (or are moving to).
    pub limit: u64,
    /// Now, Unix seconds.
    pub now: i64,
    /// Since when `used` is below the lower threshold (Unix seconds).
    pub below_since: Option<i64>,
    /// The last grow or shrink (Unix seconds).
    pub last_change: Option<i64>,
    /// The largest limit the cluster takes (a ResourceQuota), and which.
    pub bound: Option<(u64, Bound)>,
}

/// What bounds the cluster puts on a grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A ResourceQuota of the namespace.
    Quota,
    /// The node's allocatable memory.
    Node,
}

impl Bound {
    /// For messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Quota => "the namespace's ResourceQuota",
            Bound::Node => "the node's allocatable memory",
        }
    }
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing to do.
    Keep,
    /// Grow to `to`.
    Grow {
        /// The new limit.
        to: u64,
        /// The numbers behind it.
        why: String,
    },
    /// Shrink to `to`.
    Shrink {
        /// The new limit.
        to: u64,
        /// The numbers behind it.
        why: String,
    },
    /// The policy's maximum is reached and the use calls for more.
    AtMaximum {
        /// What the use calls for.
        wanted: u64,
        /// The numbers behind it.
        why: String,
    },
    /// The cluster takes no more than the limit the instances run.
    Bounded {
        /// What the use calls for.
        wanted: u64,
        /// What bounds it.
        by: Bound,
        /// The numbers behind it.
        why: String,
    },
}

/// Bytes for people: `96Mi`, `1.5Gi`, `800Ki`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if (v - v.round()).abs() < 0.05 {
                format!("{}{unit}", v.round() as u64)
            } else {
                format!("{v:.1}{unit}")
            };
        }
    }
    format!("{bytes}")
}

/// A limit as a Kubernetes quantity (whole Mi when it is one).
pub fn quantity(bytes: u64) -> String {
    if bytes.is_multiple_of(ROUND) {
        format!("{}Mi", bytes / ROUND)
    } else {
        bytes.to_string()
    }
}

/// Whether the use is below the lower threshold at `limit`.
pub fn below_down(policy: &Policy, used: u64, limit: u64) -> bool {
    (used as f64) < policy.down * maxmemory_of(limit) as f64
}

/// Decides (pure).
pub fn decide(policy: &Policy, o: &Observed) -> Decision {
    let max_mem = maxmemory_of(o.limit) as f64;
    let used = o.used as f64;
    let rate = o.rate.unwrap_or(0.0).max(0.0);
    let projected = used + rate * policy.lookahead as f64;
    let pct = |b: f64, m: f64| if m > 0.0 { b * 100.0 / m } else { 0.0 };
    let grow_now = used >= policy.up * max_mem;
    let grow_soon = rate > 0.0 && projected >= policy.up * max_mem;
    if grow_now || grow_soon || o.limit < policy.min {
        let by_step = ((o.limit as f64) * (1.0 + policy.step)).ceil() as u64;
        let by_step = by_step.div_ceil(ROUND) * ROUND;
        let by_rate = limit_for(projected, policy.settle());
        let wanted = by_step.max(by_rate).max(policy.min);
        let why = if o.limit < policy.min {
            format!(
                "the limit {} is below minMemory {}",
                human(o.limit),
                human(policy.min)
            )
        } else if grow_now {
            format!(
                "used {} is {:.0}% of maxmemory {} (scale-up at {:.0}%)",
                human(o.used),
                pct(used, max_mem),
                human(maxmemory_of(o.limit)),
                policy.up * 100.0
            )
        } else {
            format!(
                "used {} grows {}/s: {:.0}% of maxmemory {} within {} s (scale-up at {:.0}%)",
                human(o.used),
                human(rate as u64),
                pct(projected, max_mem),
                human(maxmemory_of(o.limit)),
                policy.lookahead,
                policy.up * 100.0
            )
        };
        let mut to = wanted.min(policy.max);
        let mut bound = None;
        if let Some((cap, by)) = o.bound
            && cap < to
        {
            to = cap;
            bound = Some(by);
        }
        if to <= o.limit {
            return match bound {
                Some(by) => Decision::Bounded {
                    wanted,
                    by,
                    why: format!("{why}; {} allows no more than {}", by.as_str(), human(to)),
                },
                None => Decision::AtMaximum {
                    wanted,
                    why: format!("{why}; maxMemory {} reached", human(policy.max)),
                },
            };
        }
        let why = match (bound, to < wanted) {
            (Some(by), _) => format!(
                "{why}; {} allows {} of {}",
                by.as_str(),
                human(to),
                human(wanted)
            ),
            (None, true) => format!("{why}; capped at maxMemory {}", human(policy.max)),
            (None, false) => why,
        };
        return Decision::Grow { to, why };
    }
    if o.limit > policy.max {
        let fits = limit_for(used, policy.settle());
        if fits <= policy.max {
            return Decision::Shrink {
                to: policy.max,
                why: format!(
                    "the limit {} is above maxMemory {}",
                    human(o.limit),
                    human(policy.max)
                ),
            };
        }
    }
    // Shrink: below the lower threshold for the whole cooldown, none since
    // the last change, not growing, and by at least a tenth.
    let calm = o.below_since.is_some_and(|t| o.now - t >= policy.cooldown)
        && o.last_change.is_none_or(|t| o.now - t >= policy.cooldown)
        && below_down(policy, o.used, o.limit)
        && o.rate
            .is_none_or(|r| r <= 0.0 || projected < policy.down * max_mem);
    if calm {
        let to = limit_for(used, policy.settle()).max(policy.min);
        if (to as f64) <= (o.limit as f64) * 0.9 {
            return Decision::Shrink {
                to,
                why: format!(
                    "used {} stayed below {:.0}% of maxmemory {} for {} s; {} keeps it at {:.0}%",
                    human(o.used),
                    policy.down * 100.0,
                    human(maxmemory_of(o.limit)),
                    o.now - o.below_since.unwrap_or(o.now),
                    human(to),
                    pct(used, maxmemory_of(to) as f64)
                ),
            };
        }
    }
    Decision::Keep
}

#[cfg(test)]
mod tests;
