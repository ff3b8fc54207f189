//! `spec.monitoring` of a Redis: the metrics sidecar, the Prometheus
//! objects the operator creates when the prometheus-operator CRDs exist, and
//! the bounds of the alerts in them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Metrics and alerts of a Redis.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Run the metrics sidecar (`exporter`, port 9121 named `metrics`) in
    /// every pod (default true). Changing it restarts the instances in
    /// order, as any pod change does.
    #[serde(default = "yes")]
    pub exporter: bool,
    /// Image of the sidecar. By default the operator's own image runs
    /// `redpilot exporter` (no extra image to mirror). Another image runs
    /// its own entrypoint, configured as the common Redis exporter is:
    /// `REDIS_ADDR`, `REDIS_PASSWORD` (read at start: a rotated password
    /// reaches it when the pod restarts), port 9121.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub exporter_image: Option<String>,
    /// Resources of the sidecar (default: requests 10m CPU and 16Mi, limit
    /// 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter_resources: Option<ResourceRequirements>,
    /// Create a PodMonitor and a PrometheusRule for this Redis when the
    /// cluster serves `monitoring.coreos.com/v1` (default true). Without
    /// those CRDs nothing is created and nothing fails.
    #[serde(default = "yes")]
    pub prometheus: bool,
    /// Extra labels on the PodMonitor and PrometheusRule, for a Prometheus
    /// that selects them by label (e.g. `release: prometheus`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Bounds of the alerts.
    #[serde(default)]
    pub alerts: AlertBounds,
}

impl Default for MonitoringSpec {
    fn default() -> Self {
        MonitoringSpec {
            exporter: true,
            exporter_image: None,
            exporter_resources: None,
            prometheus: true,
            labels: BTreeMap::new(),
            alerts: AlertBounds::default(),
        }
    }
}

/// Where the alerts of a Redis fire.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AlertBounds {
    /// Memory used, in percent of maxmemory, above which
    /// `RedisMemoryNearLimit` fires (default 90, 50 to 100).
    #[serde(default = "default_memory_percent")]
    #[schemars(range(min = 50, max = 100))]
    pub memory_percent: i32,
    /// Bytes a replica may be behind its primary before
    /// `RedisReplicationLagging` fires (default 10 MiB).
    #[serde(default = "default_lag_bytes")]
    #[schemars(range(min = 1))]
    pub replication_lag_bytes: i64,
    /// Hours since the last completed backup after which
    /// `RedisBackupTooOld` fires (default 26: a daily schedule with slack).
    #[serde(default = "default_backup_hours")]
    #[schemars(range(min = 1, max = 8760))]
    pub backup_max_age_hours: i32,
}

impl Default for AlertBounds {
    fn default() -> Self {
        AlertBounds {
            memory_percent: default_memory_percent(),
            replication_lag_bytes: default_lag_bytes(),
            backup_max_age_hours: default_backup_hours(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_memory_percent() -> i32 {
    90
}
fn default_lag_bytes() -> i64 {
    10 * 1024 * 1024
}
fn default_backup_hours() -> i32 {
    26
}
