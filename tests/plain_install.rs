//! Installing without OLM: `deploy/install.yaml` is what `hack/install.sh`
//! generates from the bundle's sources (drift check), and applied with
//! `kubectl apply --server-side` to the dev cluster it runs the operator in
//! `redpilot-system` (a pod on the local node), which makes a Redis in
//! another namespace Ready.

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::json;
use support::operator::{apply_redis, kubectl, wait_ready};
use support::{TestNamespace, client, repo_root, wait_for};

#[test]
fn install_yaml_is_generated_from_the_bundle_sources() {
    let out = std::env::temp_dir().join(format!("install-{}.yaml", std::process::id()));
    let run = Command::new("bash")
        .arg(repo_root().join("hack/install.sh"))
        .env("OUT", &out)
        .output()
        .expect("run hack/install.sh");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let generated = std::fs::read_to_string(&out).expect("generated");
    let _ = std::fs::remove_file(&out);
    let checked_in = std::fs::read_to_string(repo_root().join("deploy/install.yaml"))
        .expect("deploy/install.yaml");
    assert!(
        generated == checked_in,
        "deploy/install.yaml is stale: run `make install-yaml`"
    );
    // The same Deployment and rules the CSV carries.
    for needle in [
        "kind: ClusterRoleBinding",
        "name: redpilot-operator\n  namespace: redpilot-system",
        "image: \"quay.io/redpilot/redpilot:",
        "resources: [\"pods/resize\"]",
        "name: redis.redpilot.io",
    ] {
        assert!(checked_in.contains(needle), "install.yaml lacks {needle:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_install_yaml_runs_the_operator() {
    let client = client().await;
    let file = repo_root().join("deploy/install.yaml");
    // The suites' harness applies the same CRDs and ClusterRole with its
    // own field manager: take them over, as a reinstall would.
    let out = kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Whatever happens, the operator goes again: a second operator watching
    // every namespace would act on the other suites' Redis.
    let _uninstall = Uninstall;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "redpilot-system");
    wait_for(
        "the operator Deployment available",
        Duration::from_secs(120),
        || async {
            let d = deployments.get("redpilot-operator").await.ok()?;
            (d.status?.available_replicas? >= 1).then_some(())
        },
    )
    .await;
    let ns = TestNamespace::new(&client, "plain-install", &[]).await;
    apply_redis(&client, &ns.name, "cache", json!({"mode": "Standalone"})).await;
    let r = wait_ready(&client, &ns.name, "cache", Duration::from_secs(180)).await;
    println!(
        "Redis {}/cache Ready through the installed operator: {:?}",
        ns.name,
        r.status.and_then(|s| s.current_version)
    );
    drop(ns);
}

/// Removes the installed operator (the Deployment and the binding; the
/// CRDs, the ClusterRole and the namespace are shared with the harness).
struct Uninstall;

impl Drop for Uninstall {
    fn drop(&mut self) {
        for args in [
            &[
                "delete",
                "deployment",
                "-n",
                "redpilot-system",
                "redpilot-operator",
                "--ignore-not-found",
                "--wait=true",
                "--timeout=60s",
            ][..],
            &[
                "delete",
                "clusterrolebinding",
                "redpilot-operator",
                "--ignore-not-found",
            ][..],
        ] {
            let out = kubectl(args);
            if !out.status.success() {
                eprintln!(
                    "uninstall: kubectl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}
