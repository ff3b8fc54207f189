//! In-place pod resize (KEP-1287), the kubelet's arithmetic: comparing
//! desired and allocated resources, the fit check against the node's
//! allocatable (Infeasible / Deferred), the pod-level memory limit, and the
//! messages of the resize events. The worker (pod.rs) drives it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use crate::env::parse_quantity;

/// CPU (millicores) and memory (bytes) of a pod or container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_millis: i64,
    pub memory: i64,
}

impl std::ops::Add for Amounts {
    type Output = Amounts;
    fn add(self, o: Amounts) -> Amounts {
        Amounts {
            cpu_millis: self.cpu_millis + o.cpu_millis,
            memory: self.memory + o.memory,
        }
    }
}

/// A quantity in its base unit: millicores for cpu (rounded up, like
/// `MilliValue`), bytes for everything else.
pub fn amount(name: &str, q: &Quantity) -> Option<i64> {
    let v = parse_quantity(&q.0, name == "cpu").ok()?;
    Some(if name == "cpu" {
        // 0.1 * 1000 is 100.00000000000001 in floating point.
        (v * 1000.0 - 1e-6).ceil() as i64
    } else {
        v.round() as i64
    })
}

fn get(map: &Option<BTreeMap<String, Quantity>>, name: &str) -> Option<i64> {
    map.as_ref()?.get(name).and_then(|q| amount(name, q))
}

pub fn memory_limit(r: &ResourceRequirements) -> Option<i64> {
    get(&r.limits, "memory")
}

pub fn requests(r: &ResourceRequirements) -> Amounts {
    Amounts {
        cpu_millis: get(&r.requests, "cpu").unwrap_or(0),
        memory: get(&r.requests, "memory").unwrap_or(0),
    }
}

fn normalized(map: &Option<BTreeMap<String, Quantity>>) -> BTreeMap<&str, Option<i64>> {
    map.iter()
        .flatten()
        .map(|(k, q)| (k.as_str(), amount(k, q)))
        .collect()
}

/// Equal requests and limits, whatever the spelling ("1Gi" == "1024Mi").
pub fn same(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    normalized(&a.requests) == normalized(&b.requests)
        && normalized(&a.limits) == normalized(&b.limits)
}

/// One container's resources, for the pod-level sums.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub init: bool,
    pub resources: &'a ResourceRequirements,
}

/// The pod's requests: the larger of the regular containers' sum and the
/// largest init container (the scheduler's and kubelet's rule).
pub fn pod_requests(members: &[Member]) -> Amounts {
    let sum = members
        .iter()
        .filter(|m| !m.init)
        .fold(Amounts::default(), |acc, m| acc + requests(m.resources));
    let init = members
        .iter()
        .filter(|m| m.init)
        .map(|m| requests(m.resources))
        .fold(Amounts::default(), |acc, r| Amounts {
            cpu_millis: acc.cpu_millis.max(r.cpu_millis),
            memory: acc.memory.max(r.memory),
        });
    Amounts {
        cpu_millis: sum.cpu_millis.max(init.cpu_millis),
        memory: sum.memory.max(init.memory),
    }
}

/// The pod cgroup's memory limit: set only when every container has one
/// (the sum of the regular containers', or the largest init container's if
/// that is more), as the kubelet does; otherwise unlimited.
pub fn pod_memory_limit(members: &[Member]) -> Option<i64> {
    let mut sum = 0i64;
    let mut init_max = 0i64;
    for m in members {
        let l = memory_limit(m.resources)?;
        if m.init {
            init_max = init_max.max(l);
        } else {
            sum += l;
        }
    }
    Some(sum.max(init_max))
}

/// The outcome of the kubelet's fit check for a resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    Fits,
    /// More than the node has at all: not retried (reason `Infeasible`).
    Infeasible(String),
    /// Fits the node, not next to the other pods: retried (reason `Deferred`).
    Deferred(String),
}

/// Can the pod grow to `wanted`, with `others` (the other pods' allocated
/// requests) on a node with `allocatable`? Memory is checked before cpu.
pub fn fit(wanted: Amounts, others: Amounts, allocatable: Amounts) -> Fit {
    if wanted.memory > allocatable.memory {
        return Fit::Infeasible(format!(
            "Node didn't have enough capacity: memory, requested: {}, capacity: {}",
            wanted.memory, allocatable.memory
        ));
    }
    if wanted.cpu_millis > allocatable.cpu_millis {
        return Fit::Infeasible(format!(
            "Node didn't have enough capacity: cpu, requested: {}, capacity: {}",
            wanted.cpu_millis, allocatable.cpu_millis
        ));
    }
    if wanted.memory + others.memory > allocatable.memory {
        return Fit::Deferred(format!(
            "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
            wanted.memory, others.memory, allocatable.memory
        ));
    }
    if wanted.cpu_millis + others.cpu_millis > allocatable.cpu_millis {
        return Fit::Deferred(format!(
            "Node didn't have enough resource: cpu, requested: {}, used: {}, capacity: {}",
            wanted.cpu_millis, others.cpu_millis, allocatable.cpu_millis
        ));
    }
    Fit::Fits
}

/// A named container's resources, for event messages.
pub struct Named<'a> {
    pub name: &'a str,
    pub init: bool,
    pub resources: &'a ResourceRequirements,
}

/// The kubelet's resize event text: `<prefix>: {"containers":[{"name":…,
/// "resources":{…}}],"generation":N[,"error":…]}`.
pub fn event_message(prefix: &str, ctrs: &[Named], generation: i64, error: Option<&str>) -> String {
    // Go's field order, not serde_json's sorted map keys.
    let entry = |c: &Named| json!({"name": c.name, "resources": c.resources});
    let mut parts = Vec::new();
    let inits: Vec<Value> = ctrs.iter().filter(|c| c.init).map(entry).collect();
    if !inits.is_empty() {
        parts.push(format!("\"initContainers\":{}", Value::Array(inits)));
    }
    let regular: Vec<Value> = ctrs.iter().filter(|c| !c.init).map(entry).collect();
    if !regular.is_empty() {
        parts.push(format!("\"containers\":{}", Value::Array(regular)));
    }
    parts.push(format!("\"generation\":{generation}"));
    if let Some(e) = error {
        parts.push(format!("\"error\":{}", Value::String(e.to_string())));
    }
    format!("{prefix}: {{{}}}", parts.join(","))
}

/// What changed, for people: `server limits.memory 64Mi → 96Mi`.
pub fn changes(name: &str, old: &ResourceRequirements, new: &ResourceRequirements) -> Vec<String> {
    let mut out = Vec::new();
    for (kind, o, n) in [
        ("requests", &old.requests, &new.requests),
        ("limits", &old.limits, &new.limits),
    ] {
        let keys: std::collections::BTreeSet<&String> = o
            .iter()
            .flatten()
            .chain(n.iter().flatten())
            .map(|(k, _)| k)
            .collect();
        for k in keys {
            let before = o.as_ref().and_then(|m| m.get(k));
            let after = n.as_ref().and_then(|m| m.get(k));
            let differs = match (before, after) {
                (Some(b), Some(a)) => amount(k, b) != amount(k, a),
                (None, None) => false,
                _ => true,
            };
            if differs {
                let show = |q: Option<&Quantity>| q.map_or("none".to_string(), |q| q.0.clone());
                out.push(format!(
                    "{name} {kind}.{k} {} → {}",
                    show(before),
                    show(after)
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rr(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }
    }

    const MI: i64 = 1024 * 1024;

    #[test]
    fn quantities_compare_by_value() {
        let a = rr(&[("memory", "1Gi"), ("cpu", "0.1")], &[("memory", "2Gi")]);
        let b = rr(
            &[("memory", "1024Mi"), ("cpu", "100m")],
            &[("memory", "2048Mi")],
        );
        assert!(same(&a, &b));
        let c = rr(&[("memory", "1Gi"), ("cpu", "100m")], &[("memory", "3Gi")]);
        assert!(!same(&a, &c));
        assert!(!same(&a, &rr(&[("memory", "1Gi"), ("cpu", "100m")], &[])));
        assert_eq!(requests(&a).cpu_millis, 100);
        assert_eq!(requests(&a).memory, 1024 * MI);
        assert_eq!(memory_limit(&a), Some(2048 * MI));
    }

    #[test]
    fn pod_totals_take_init_containers_as_the_scheduler_does() {
        let small = rr(
            &[("memory", "32Mi"), ("cpu", "100m")],
            &[("memory", "64Mi")],
        );
        let big_init = rr(&[("memory", "100Mi")], &[("memory", "200Mi")]);
        let members = [
            Member {
                init: true,
                resources: &big_init,
            },
            Member {
                init: false,
                resources: &small,
            },
            Member {
                init: false,
                resources: &small,
            },
        ];
        assert_eq!(
            pod_requests(&members),
            Amounts {
                cpu_millis: 200,
                memory: 100 * MI
            }
        );
        assert_eq!(pod_memory_limit(&members), Some(200 * MI));
        assert_eq!(pod_memory_limit(&members[1..]), Some(128 * MI));
        let unlimited = rr(&[("memory", "32Mi")], &[]);
        let mixed = [
            Member {
                init: false,
                resources: &small,
            },
            Member {
                init: false,
                resources: &unlimited,
            },
        ];
        assert_eq!(
            pod_memory_limit(&mixed),
            None,
            "one container without a limit"
        );
    }

    #[test]
    fn fit_is_infeasible_beyond_the_node_and_deferred_beyond_what_is_free() {
        let node = Amounts {
            cpu_millis: 8000,
            memory: 1024 * MI,
        };
        let others = Amounts {
            cpu_millis: 500,
            memory: 900 * MI,
        };
        let want = |mem_mi: i64, cpu: i64| Amounts {
            cpu_millis: cpu,
            memory: mem_mi * MI,
        };
        assert_eq!(fit(want(100, 100), others, node), Fit::Fits);
        assert_eq!(
            fit(want(2048, 100), others, node),
            Fit::Infeasible(format!(
                "Node didn't have enough capacity: memory, requested: {}, capacity: {}",
                2048 * MI,
                1024 * MI
            ))
        );
        assert_eq!(
            fit(want(200, 100), others, node),
            Fit::Deferred(format!(
                "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
                200 * MI,
                900 * MI,
                1024 * MI
            ))
        );
        assert!(
            matches!(fit(want(10, 9000), others, node), Fit::Infeasible(m) if m.contains("cpu"))
        );
        assert!(matches!(fit(want(10, 7600), others, node), Fit::Deferred(m) if m.contains("cpu")));
        // Exactly full fits.
        assert_eq!(fit(want(124, 7500), others, node), Fit::Fits);
    }

    #[test]
    fn event_messages_follow_the_kubelet() {
        let r = rr(&[("memory", "48Mi")], &[("memory", "96Mi")]);
        let ctrs = [Named {
            name: "server",
            init: false,
            resources: &r,
        }];
        assert_eq!(
            event_message("Pod resize completed", &ctrs, 2, None),
            r#"Pod resize completed: {"containers":[{"name":"server","resources":{"limits":{"memory":"96Mi"},"requests":{"memory":"48Mi"}}}],"generation":2}"#
        );
        assert!(
            event_message("Pod resize error", &ctrs, 3, Some("x"))
                .ends_with(r#""generation":3,"error":"x"}"#)
        );
        let old = rr(&[("memory", "32Mi")], &[("memory", "64Mi")]);
        assert_eq!(
            changes("server", &old, &r),
            vec![
                "server requests.memory 32Mi → 48Mi".to_string(),
                "server limits.memory 64Mi → 96Mi".to_string()
            ]
        );
    }
}
