//! Container environment: literal values, `valueFrom` references, `envFrom`,
//! and `$(VAR)` expansion in values, command and args.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

use crate::error::{Error, Result};

/// Fetches ConfigMaps and Secrets of one namespace, once per name.
pub struct Refs {
    cms: Api<ConfigMap>,
    secrets: Api<Secret>,
    cm_cache: BTreeMap<String, Option<ConfigMap>>,
    secret_cache: BTreeMap<String, Option<Secret>>,
}

impl Refs {
    pub fn new(client: kube::Client, ns: &str) -> Self {
        Self {
            cms: Api::namespaced(client.clone(), ns),
            secrets: Api::namespaced(client, ns),
            cm_cache: BTreeMap::new(),
            secret_cache: BTreeMap::new(),
        }
    }

    pub async fn config_map(&mut self, name: &str) -> Result<Option<ConfigMap>> {
        if let Some(c) = self.cm_cache.get(name) {
            return Ok(c.clone());
        }
        let c = self.cms.get_opt(name).await?;
        self.cm_cache.insert(name.to_string(), c.clone());
        Ok(c)
    }

    pub async fn secret(&mut self, name: &str) -> Result<Option<Secret>> {
        if let Some(c) = self.secret_cache.get(name) {
            return Ok(c.clone());
        }
        let c = self.secrets.get_opt(name).await?;
        self.secret_cache.insert(name.to_string(), c.clone());
        Ok(c)
    }

    /// A ConfigMap key as text (data, then binaryData).
    pub async fn config_map_key(&mut self, name: &str, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.config_map(name).await?.and_then(|cm| {
            cm.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| v.clone().into_bytes())
                .or_else(|| {
                    cm.binary_data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .map(|v| v.0.clone())
                })
        }))
    }

    pub async fn secret_key(&mut self, name: &str, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.secret(name).await?.and_then(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| v.0.clone())
                .or_else(|| {
                    s.string_data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .map(|v| v.clone().into_bytes())
                })
        }))
    }
}

/// Values the pod's `fieldRef`s can name.
pub fn field_value(pod: &Pod, pod_ip: &str, host_ip: &str, path: &str) -> Result<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let lookup = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let bracket = |prefix: &str| -> Option<String> {
        let rest = path.strip_prefix(prefix)?.strip_prefix("['")?;
        Some(rest.strip_suffix("']")?.to_string())
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => pod_ip.to_string(),
        "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        _ => {
            if let Some(k) = bracket("metadata.labels") {
                lookup(&meta.labels, &k)
            } else if let Some(k) = bracket("metadata.annotations") {
                lookup(&meta.annotations, &k)
            } else if path == "metadata.labels" {
                render_map(&meta.labels)
            } else if path == "metadata.annotations" {
                render_map(&meta.annotations)
            } else {
                return Err(Error::ContainerConfig(format!(
                    "unsupported fieldRef fieldPath {path}"
                )));
            }
        }
    })
}

fn render_map(m: &Option<BTreeMap<String, String>>) -> String {
    m.as_ref()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}=\"{}\"", v.replace('"', "\\\"")))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// `resourceFieldRef` (limits/requests of cpu, memory, ephemeral-storage),
/// falling back from limits to node allocatable like the kubelet.
pub fn resource_value(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
    node_cpu_millis: i64,
    node_memory: i64,
) -> Result<String> {
    let res = c.resources.as_ref();
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| Error::ContainerConfig(format!("bad resourceFieldRef {resource}")))?;
    let map = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => None,
    };
    let q = map.and_then(|m| m.get(name)).map(|q| q.0.clone());
    let is_cpu = name == "cpu";
    let value = match q {
        Some(q) => parse_quantity(&q, is_cpu)?,
        None if is_cpu => node_cpu_millis as f64 / 1000.0,
        None => node_memory as f64,
    };
    let div = match divisor {
        Some(d) if !d.is_empty() => parse_quantity(d, is_cpu)?,
        _ => 1.0,
    };
    if div <= 0.0 {
        return Err(Error::ContainerConfig(format!(
            "bad divisor for {resource}"
        )));
    }
    Ok(format!("{}", (value / div).ceil() as i64))
}

/// Parses a Kubernetes quantity into a number (cores for cpu, bytes otherwise).
pub fn parse_quantity(q: &str, _cpu: bool) -> Result<f64> {
    let q = q.trim();
    let bad = || Error::ContainerConfig(format!("bad quantity {q}"));
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        s if s.starts_with('e') || s.starts_with('E') => {
            let exp: i32 = s[1..].parse().map_err(|_| bad())?;
            10f64.powi(exp)
        }
        _ => return Err(bad()),
    };
    Ok(n * mult)
}

/// Expands `$(NAME)` from `vars`; `$$` escapes; unknown names stay as written.
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes: Vec<char> = input.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == '$' && i + 1 < bytes.len() {
            if bytes[i + 1] == '$' {
                out.push('$');
                i += 2;
                continue;
            }
            if bytes[i + 1] == '('
                && let Some(end) = bytes[i + 2..].iter().position(|c| *c == ')')
            {
                let name: String = bytes[i + 2..i + 2 + end].iter().collect();
                match vars.get(&name) {
                    Some(v) => out.push_str(v),
                    None => {
                        out.push_str("$(");
                        out.push_str(&name);
                        out.push(')');
                    }
                }
                i += end + 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands() {
        let mut v = BTreeMap::new();
        v.insert("A".to_string(), "1".to_string());
        assert_eq!(expand("x$(A)y", &v), "x1y");
        assert_eq!(expand("$(B)", &v), "$(B)");
        assert_eq!(expand("$$(A)", &v), "$(A)");
        assert_eq!(expand("$", &v), "$");
        assert_eq!(expand("$(A", &v), "$(A");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1Gi", false).ok(), Some(1073741824.0));
        assert_eq!(parse_quantity("250m", true).ok(), Some(0.25));
        assert_eq!(parse_quantity("1e3", false).ok(), Some(1000.0));
        assert!(parse_quantity("x", false).is_err());
    }
}
