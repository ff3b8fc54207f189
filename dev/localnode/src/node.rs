//! The Node object: registration, status (allocatable, conditions,
//! addresses) and the heartbeat Lease in kube-node-lease.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::error::Result;

const MANAGER: &str = "localnode";
pub const LEASE_NS: &str = "kube-node-lease";

/// What the node reports about itself.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub address: String,
    /// Where the kubelet API listens (a loopback address): the Node's
    /// `Hostname` address, which the API server prefers by default
    /// (`--kubelet-preferred-address-types`).
    pub kubelet_address: String,
    pub kubelet_port: u16,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub max_pods: i64,
    pub unschedulable: bool,
}

/// Online CPUs.
pub fn host_cpus() -> i64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as i64)
        .unwrap_or(1)
}

/// MemTotal from /proc/meminfo, in bytes.
pub fn host_memory() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(1 << 30)
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "Linux".into())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Creates the Node if needed (no taints: the default home for pods).
pub async fn register(client: &kube::Client, info: &NodeInfo) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), info.name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), "amd64".to_string());
    labels.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("beta.kubernetes.io/arch".to_string(), "amd64".to_string());
    labels.insert("redpilot.io/localnode".to_string(), "true".to_string());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(info.name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "node.alpha.kubernetes.io/ttl".to_string(),
                "0".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            unschedulable: info.unschedulable.then_some(true),
            ..Default::default()
        }),
        status: None,
    };
    let node = match api.get_opt(&info.name).await? {
        Some(n) => n,
        None => api.create(&PostParams::default(), &node).await?,
    };
    update_status(client, info).await?;
    Ok(node)
}

/// Reports capacity, conditions, addresses and node info.
pub async fn update_status(client: &kube::Client, info: &NodeInfo) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let now = Time(Timestamp::now());
    let cpu = Quantity(format!("{}m", info.cpu_millis));
    let mem = Quantity(format!("{}Ki", info.memory_bytes / 1024));
    let pods = Quantity(info.max_pods.to_string());
    let storage = Quantity("100Gi".into());
    let resources = json!({"cpu": cpu, "memory": mem, "pods": pods, "ephemeral-storage": storage});
    let cond = |ty: &str, status: &str, reason: &str, message: &str| {
        json!({"type": ty, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let patch = json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "localnode has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "localnode has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "localnode has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "localnode is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": info.address},
                {"type": "Hostname", "address": info.kubelet_address},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": info.kubelet_port}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": boot_id(),
                "containerRuntimeVersion": format!("localnode://{}", env!("CARGO_PKG_VERSION")),
                "kernelVersion": kernel_release(),
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.37.2-localnode",
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": os_image(),
                "systemUUID": "",
            },
        }
    });
    // lastTransitionTime must not move on every heartbeat: keep existing ones.
    let mut patch = patch;
    if let Some(existing) = api.get_opt(&info.name).await?.and_then(|n| n.status)
        && let (Some(conds), Some(new)) = (
            existing.conditions,
            patch["status"]["conditions"].as_array_mut(),
        )
    {
        for c in new.iter_mut() {
            if let Some(old) = conds.iter().find(|o| {
                Some(o.type_.as_str()) == c["type"].as_str()
                    && Some(o.status.as_str()) == c["status"].as_str()
            }) && let Some(t) = &old.last_transition_time
            {
                c["lastTransitionTime"] = json!(t);
            }
        }
    }
    api.patch_status(
        &info.name,
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await?;
    Ok(())
}

/// Renews the node's Lease (creating it when missing).
pub async fn renew_lease(client: &kube::Client, node: &Node, info: &NodeInfo) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(info.name.clone()),
            namespace: Some(LEASE_NS.into()),
            owner_references: node.metadata.uid.clone().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: info.name.clone(),
                    uid,
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(info.name.clone()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    api.patch(
        &info.name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&lease),
    )
    .await?;
    Ok(())
}

/// Heartbeats forever: Lease every 10 s, node status every 60 s.
pub async fn heartbeat(client: kube::Client, node: Node, info: NodeInfo) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        if let Err(e) = renew_lease(&client, &node, &info).await {
            tracing::warn!(error = %e, "lease renewal failed");
        }
        if n % 6 == 5
            && let Err(e) = update_status(&client, &info).await
        {
            tracing::warn!(error = %e, "node status update failed");
        }
        n += 1;
    }
}
