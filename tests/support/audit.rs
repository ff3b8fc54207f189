//! The API server's own record of the operator's requests: the dev cluster
//! writes an audit log of every request by the operator's ServiceAccount
//! (`dev/audit-policy.yaml`, `.dev/audit.log`, JSON lines). Suites count
//! reads and writes there, not with the operator's own counters.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::repo_root;

/// The audit log: `REDPILOT_AUDIT_LOG`, else `.dev/audit.log`.
pub fn audit_log_path() -> PathBuf {
    match std::env::var_os("REDPILOT_AUDIT_LOG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join(".dev/audit.log"),
    }
}

/// One completed request.
#[derive(Debug, Clone)]
pub struct Request {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub at: DateTime<Utc>,
}

impl Request {
    /// get and list (watches are long-running streams, not counted here).
    pub fn is_read(&self) -> bool {
        matches!(self.verb.as_str(), "get" | "list")
    }
    /// create, update, patch, delete, deletecollection.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
    /// `verb resource[/subresource] name` for messages.
    pub fn describe(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        format!("{} {}{sub} {}", self.verb, self.resource, self.name)
    }
}

/// Completed requests of the operator in namespace `ns` between `from` and
/// `to`. Fails when the audit log is missing (the cluster predates it).
pub fn operator_requests(ns: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<Request> {
    operator_requests_all(from, to)
        .into_iter()
        .filter(|r| r.namespace == ns)
        .collect()
}

/// Completed requests of the operator, in any namespace, between `from` and
/// `to`.
pub fn operator_requests_all(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<Request> {
    let path = audit_log_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading the API server's audit log {}: {e}. The dev cluster writes it since \
             dev/audit-policy.yaml exists: recreate it with `make cluster-down cluster-up`",
            path.display()
        )
    });
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["stage"] == "ResponseComplete")
        .filter_map(|v| {
            let s = |x: &Value| x.as_str().unwrap_or_default().to_string();
            let at = DateTime::parse_from_rfc3339(v["stageTimestamp"].as_str()?)
                .ok()?
                .with_timezone(&Utc);
            Some(Request {
                verb: s(&v["verb"]),
                resource: s(&v["objectRef"]["resource"]),
                subresource: s(&v["objectRef"]["subresource"]),
                namespace: s(&v["objectRef"]["namespace"]),
                name: s(&v["objectRef"]["name"]),
                at,
            })
        })
        .filter(|r| r.at >= from && r.at <= to)
        .collect()
}

/// Requests counted by `describe()`.
pub fn tally(requests: &[Request]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in requests {
        *m.entry(r.describe()).or_insert(0) += 1;
    }
    m
}
