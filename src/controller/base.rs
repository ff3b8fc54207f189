//! What every controller shares and that holds no state: the field
//! manager, how a time is written, the scope of an API, the backoff.
//! Imports nothing of the controller.

use std::time::Duration;

use kube::{Api, Client};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "redpilot";

/// A time as the statuses write it: RFC 3339, whole seconds, UTC (`Z`).
pub fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The API of `K` in the watched namespace `ns`, or in all namespaces.
pub fn scoped_api<K>(client: &Client, ns: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Exponential backoff for the `n`th consecutive failure (n >= 1).
pub fn backoff(n: u32) -> Duration {
    let secs = 2u64.saturating_pow(n.clamp(1, 16)).min(300);
    Duration::from_secs(secs)
}

/// Which namespaces to watch, from `WATCH_NAMESPACE` (comma-separated; empty
/// or unset means all).
pub fn watch_namespaces(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}
