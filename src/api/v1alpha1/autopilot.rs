//! `spec.autopilot` of a Redis: the memory autopilot's policy, and what it
//! did (`status.autopilot`).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Automatic scaling.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutopilotSpec {
    /// Grow the memory of every instance before the dataset reaches
    /// `maxmemory`, and give it back once the data is gone. Needs
    /// `spec.resources.limits.memory` (the size it starts from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryAutopilotSpec>,
    /// Cluster mode: add shards when the shards' memory runs short and
    /// the memory autopilot (when set) can grow them no further, and
    /// remove them once the data is gone. The operator then sets
    /// `spec.shards` itself (as a HorizontalPodAutoscaler sets replicas),
    /// within `minShards`..`maxShards`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardAutopilotSpec>,
}

/// The shard autopilot's policy (Cluster mode). Percentages are of each
/// shard primary's `maxmemory`; the fullest shard decides.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.scaleDownPercent < self.scaleUpPercent")
        .message("spec.autopilot.shards.scaleDownPercent must be below scaleUpPercent, or every added shard would be removed again")
        .field_path(".scaleDownPercent"),
    validation = Rule::new("self.minShards <= self.maxShards")
        .message("spec.autopilot.shards.minShards must not exceed maxShards")
        .field_path(".minShards"),
)]
pub struct ShardAutopilotSpec {
    /// Whether it acts (default true). Switched off, `spec.shards` stays
    /// where it was.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The fewest shards (default 3).
    #[serde(default = "default_min_shards")]
    #[schemars(range(min = 3, max = 100))]
    pub min_shards: i32,
    /// The most shards. Reaching it while still short sets the condition
    /// `ShardsAtMaximum` (and its alert).
    #[schemars(range(min = 3, max = 100))]
    pub max_shards: i32,
    /// Add shards when the fullest shard primary uses this percent of its
    /// `maxmemory` (default 80).
    #[serde(default = "default_up")]
    #[schemars(range(min = 20, max = 95))]
    pub scale_up_percent: i32,
    /// Remove a shard once every shard stayed below this percent for
    /// `cooldownSeconds` and the others have room for its data (default
    /// 30).
    #[serde(default = "default_down")]
    #[schemars(range(min = 5, max = 90))]
    pub scale_down_percent: i32,
    /// How long use must stay low, and how long after the last change,
    /// before a shard is removed (default 600, 30 to 86400 seconds).
    #[serde(default = "default_cooldown")]
    #[schemars(range(min = 30, max = 86400))]
    pub cooldown_seconds: i32,
}

fn default_min_shards() -> i32 {
    3
}

/// The memory autopilot's policy. Sizes are container memory limits;
/// `maxmemory` stays 75 % of the limit, and requests keep their ratio to it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.scaleDownPercent < self.scaleUpPercent")
        .message("spec.autopilot.memory.scaleDownPercent must be below scaleUpPercent, or every grow would be followed by a shrink")
        .field_path(".scaleDownPercent"),
    validation = Rule::new("isQuantity(self.maxMemory) && quantity(self.maxMemory).isGreaterThan(quantity('0'))")
        .message("spec.autopilot.memory.maxMemory must be a positive quantity such as 4Gi")
        .field_path(".maxMemory"),
    validation = Rule::new("!has(self.minMemory) || (isQuantity(self.minMemory) && quantity(self.minMemory).isGreaterThan(quantity('0')))")
        .message("spec.autopilot.memory.minMemory must be a positive quantity such as 256Mi")
        .field_path(".minMemory"),
    validation = Rule::new("!has(self.minMemory) || !isQuantity(self.minMemory) || !isQuantity(self.maxMemory) || quantity(self.minMemory).compareTo(quantity(self.maxMemory)) <= 0")
        .message(Message::Expression("'spec.autopilot.memory.minMemory (' + self.minMemory + ') must not exceed maxMemory (' + self.maxMemory + ')'".into()))
        .field_path(".minMemory"),
)]
pub struct MemoryAutopilotSpec {
    /// Whether the autopilot acts (default true). Switched off, the
    /// instances keep the size it last gave them.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Grow when the primary's used memory reaches this percent of
    /// `maxmemory`, or will within `lookaheadSeconds` at its current growth
    /// rate (default 80).
    #[serde(default = "default_up")]
    #[schemars(range(min = 20, max = 95))]
    pub scale_up_percent: i32,
    /// Shrink once used memory stayed below this percent of `maxmemory` for
    /// `scaleDownCooldownSeconds` (default 30).
    #[serde(default = "default_down")]
    #[schemars(range(min = 5, max = 90))]
    pub scale_down_percent: i32,
    /// A grow adds at least this percent of the current limit, more when
    /// the growth rate asks for it (default 50).
    #[serde(default = "default_step")]
    #[schemars(range(min = 10, max = 400))]
    pub step_percent: i32,
    /// The smallest limit a shrink goes to (default: the limit in
    /// `spec.resources`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::quantity_string")]
    pub min_memory: Option<Quantity>,
    /// The largest limit a grow goes to (at least the limit in
    /// `spec.resources`). Reaching it sets the condition `MemoryAtMaximum`.
    #[schemars(schema_with = "super::quantity_string")]
    pub max_memory: Quantity,
    /// How long used memory must stay below `scaleDownPercent`, and how
    /// long after the last change, before a shrink (default 600, 30 to
    /// 86400 seconds).
    #[serde(default = "default_cooldown")]
    #[schemars(range(min = 30, max = 86400))]
    pub scale_down_cooldown_seconds: i32,
    /// How far ahead the growth rate is projected: a fill that would reach
    /// `scaleUpPercent` within this many seconds grows now, and a grow is
    /// sized for it (default 60, 0 to 3600).
    #[serde(default = "default_lookahead")]
    #[schemars(range(min = 0, max = 3600))]
    pub lookahead_seconds: i32,
}

fn yes() -> bool {
    true
}
fn default_up() -> i32 {
    80
}
fn default_down() -> i32 {
    30
}
fn default_step() -> i32 {
    50
}
fn default_cooldown() -> i32 {
    600
}
fn default_lookahead() -> i32 {
    60
}

impl MemoryAutopilotSpec {
    /// A policy with the defaults and `max` as its maximum.
    pub fn with_max(max: &str) -> Self {
        MemoryAutopilotSpec {
            enabled: true,
            scale_up_percent: default_up(),
            scale_down_percent: default_down(),
            step_percent: default_step(),
            min_memory: None,
            max_memory: Quantity(max.to_string()),
            scale_down_cooldown_seconds: default_cooldown(),
            lookahead_seconds: default_lookahead(),
        }
    }
}

/// What the autopilot did (`status.autopilot`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutopilotStatus {
    /// The memory autopilot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryAutopilotStatus>,
    /// The shard autopilot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardAutopilotStatus>,
}

/// The shard autopilot's state and last decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardAutopilotStatus {
    /// True while the fullest shard is over `scaleUpPercent`, the memory
    /// autopilot cannot grow it, and `maxShards` is reached (the metric
    /// `redpilot_redis_shards_at_maximum` and its alert follow it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_maximum: bool,
    /// Since when every shard is below `scaleDownPercent` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_since: Option<String>,
    /// The last change of `spec.shards` it made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change: Option<String>,
    /// The last decision that changed something or was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<ShardDecision>,
}

/// One decision of the shard autopilot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardDecision {
    /// When (RFC 3339).
    pub time: String,
    /// `AddShards`, `RemoveShard` or `AtMaximum`.
    pub action: String,
    /// Shards before.
    pub from: i32,
    /// Shards after (for `AtMaximum`: the count wanted).
    pub to: i32,
    /// The numbers behind it.
    pub reason: String,
}

/// The memory autopilot's target and last decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryAutopilotStatus {
    /// The memory limit every instance runs or is moving to, e.g. `96Mi`.
    pub limit: String,
    /// The same, in bytes.
    pub limit_bytes: i64,
    /// `spec.resources.limits.memory` when the target was set: a change of
    /// it by hand starts the autopilot again from the new value.
    pub base: String,
    /// How the target reaches the instances: `InPlace` (pod resize and
    /// `CONFIG SET maxmemory`, no restart) or `Restart` (ordered rolling
    /// restart, where the cluster refuses in-place resize).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Since when used memory is below `scaleDownPercent` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_since: Option<String>,
    /// The last grow or shrink (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change: Option<String>,
    /// The last decision that changed something or was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<MemoryDecision>,
}

/// One decision of the memory autopilot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryDecision {
    /// When (RFC 3339).
    pub time: String,
    /// `Grow`, `Shrink`, `AtMaximum` or `Bounded` (the cluster's limits:
    /// a ResourceQuota or the node).
    pub action: String,
    /// The limit before, e.g. `64Mi`.
    pub from: String,
    /// The limit after (for `AtMaximum`/`Bounded`: the one wanted).
    pub to: String,
    /// The numbers behind it.
    pub reason: String,
}
