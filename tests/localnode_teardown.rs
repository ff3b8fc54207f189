//! Stopping the local node leaves nothing behind: no pod process, network
//! namespace, veth, memory cgroup or bridge. `make cluster-down` stops the node with
//! `dev/localnode.sh stop`; this suite runs exactly that script against a
//! second, independent node (own name, state directory, host-object prefix
//! and pod subnet) so the shared dev node keeps serving the other suites.
//!
//! Needs the dev cluster (`make cluster-up`), root, and the localnode binary
//! (built by `make cluster-up`).

mod localnode_common;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use localnode_common::*;
use support::{TestNamespace, client, kubeconfig_path, repo_root, wait_for};

const NAME: &str = "localnode-teardown";
const PREFIX: &str = "rtd";

fn script(action: &str, state: &PathBuf) -> std::process::Output {
    Command::new("bash")
        .arg(repo_root().join("dev/localnode.sh"))
        .arg(action)
        .env("KUBECONFIG", kubeconfig_path())
        .env("LOCALNODE_NAME", NAME)
        .env("LOCALNODE_STATE", state)
        .env("LOCALNODE_PREFIX", PREFIX)
        .env("LOCALNODE_POD_NETWORK", "10.245.0.1/16")
        .env("LOCALNODE_PROVISIONER", "false")
        .env("LOCALNODE_UNSCHEDULABLE", "1")
        .env("LOCALNODE_NO_BUILD", "1")
        .output()
        .unwrap_or_else(|e| panic!("running dev/localnode.sh {action}: {e}"))
}

fn netns_pids(ns: &str) -> Vec<u32> {
    let out = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .expect("ip netns pids");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The node's memory cgroups (cgroup v1), under which every container runs.
fn cgroup_root() -> PathBuf {
    PathBuf::from("/sys/fs/cgroup/memory").join(PREFIX)
}

fn links_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_node_leaves_no_processes_namespaces_or_links() {
    let client = client().await;
    require_localnode(&client).await;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let bin = target.join("debug/localnode");
    assert!(
        bin.exists(),
        "{} is missing: run `make cluster-up` (or cargo build -p redpilot-localnode)",
        bin.display()
    );
    let state = repo_root().join(".dev/localnode-teardown-test");
    let _ = script("stop", &state);

    let out = script("start", &state);
    assert!(
        out.status.success(),
        "dev/localnode.sh start failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let ns = TestNamespace::new(&client, "ln-down", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let images = ["redis:7.0", "redis:6.2", "valkey/valkey:8.1"];
    for (i, image) in images.iter().enumerate() {
        let mut p = pod(&format!("down-{i}"), server(image));
        if let Some(spec) = p.spec.as_mut() {
            spec.node_selector = None;
            spec.node_name = Some(NAME.into());
        }
        create(&pods, &p).await;
    }
    let mut pids = Vec::new();
    for i in 0..images.len() {
        let p = wait_ready(&pods, &format!("down-{i}"), None, Duration::from_secs(60)).await;
        let ip = pod_ip(&p).expect("pod IP");
        assert!(
            ip.starts_with("10.245."),
            "pod IP {ip} from the second node's subnet"
        );
        let uid = p.metadata.uid.clone().expect("uid");
        pids.extend(netns_pids(&pod_netns(PREFIX, &uid)));
    }
    let namespaces = netns_with_prefix(&format!("{PREFIX}-"));
    assert_eq!(
        namespaces.len(),
        images.len(),
        "one network namespace per pod"
    );
    assert_eq!(
        pids.len(),
        images.len(),
        "one server process per pod: {pids:?}"
    );
    assert!(pids.iter().all(|p| process_alive(*p)));
    // Each container runs in a memory cgroup of its own under the node's.
    let mut cgroups: Vec<String> = pids
        .iter()
        .map(|p| memory_cgroup_of(*p).unwrap_or_default())
        .collect();
    assert!(
        cgroups
            .iter()
            .all(|c| c.starts_with(&format!("/{PREFIX}/"))),
        "memory cgroups of the pod processes: {cgroups:?}"
    );
    cgroups.sort();
    cgroups.dedup();
    assert_eq!(cgroups.len(), images.len(), "one cgroup per container");
    assert!(cgroup_root().is_dir());

    let out = script("stop", &state);
    assert!(
        out.status.success(),
        "dev/localnode.sh stop failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let alive: Vec<u32> = pids.iter().copied().filter(|p| process_alive(*p)).collect();
    assert!(alive.is_empty(), "pod processes left after stop: {alive:?}");
    assert!(
        netns_with_prefix(&format!("{PREFIX}-")).is_empty(),
        "network namespaces left: {:?}",
        netns_with_prefix(&format!("{PREFIX}-"))
    );
    assert!(
        links_with_prefix(PREFIX).is_empty(),
        "links left: {:?}",
        links_with_prefix(PREFIX)
    );
    assert!(
        !cgroup_root().exists(),
        "memory cgroups left under {}",
        cgroup_root().display()
    );
    assert!(!state.join("localnode.pid").exists(), "pid file removed");
    // The run directories (volumes) are gone; container logs stay.
    let leftovers: Vec<String> = std::fs::read_dir(state.join("pods"))
        .map(|rd| {
            rd.flatten()
                .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("run-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "pod runtime directories left: {leftovers:?}"
    );
    // Stopping again is a no-op.
    assert!(script("stop", &state).status.success(), "second stop");

    // The stopped node's pods and Node object go away (force: nobody runs them).
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for i in 0..images.len() {
        let _ = pods.delete(&format!("down-{i}"), &force).await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.delete(NAME, &DeleteParams::default()).await;
    wait_for("the test node deleted", Duration::from_secs(30), || async {
        nodes.get_opt(NAME).await.ok()?.is_none().then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&state);
}
