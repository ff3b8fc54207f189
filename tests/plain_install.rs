//! Installing without OLM: `deploy/install.yaml` is what `hack/install.sh`
//! generates from the bundle's sources (drift check), and applied with
//! `kubectl apply --server-side` to the dev cluster it runs the operator in
//! `redpilot-system` (a pod on the local node), which makes a Redis in
//! another namespace Ready.
//!
//! The Helm chart `deploy/helm/redpilot` is what `hack/helm.sh` generates
//! (drift check); `helm lint` passes; with its defaults it renders exactly
//! install.yaml's objects but the Namespace, and each value renders what it
//! says. (Its install, upgrade and uninstall on the dev cluster run in the
//! `operator_backup` binary: tests/helm/.)

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::json;
use support::helm::{chart, helm_ok, objects, render};
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
    // One document per object: the three CRDs are three (they once ran
    // together into one document, of which a parser keeps one CRD).
    let crds = objects(&checked_in)
        .keys()
        .filter(|k| k.0 == "CustomResourceDefinition")
        .count();
    assert_eq!(crds, 3, "install.yaml holds the three CRDs");
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

fn deployment_env(objs: &support::helm::Objects, name: &str) -> serde_json::Value {
    let d = objs
        .iter()
        .find(|(k, _)| k.0 == "Deployment")
        .map(|(_, v)| v)
        .expect("a Deployment");
    d.pointer("/spec/template/spec/containers/0/env")
        .and_then(|e| e.as_array())
        .and_then(|e| e.iter().find(|x| x["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("env {name}"))
}

#[test]
fn the_helm_chart_is_generated_from_the_sources() {
    let out = std::env::temp_dir().join(format!("helm-chart-{}", std::process::id()));
    let run = Command::new("bash")
        .arg(repo_root().join("hack/helm.sh"))
        .env("OUT", &out)
        .output()
        .expect("run hack/helm.sh");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let checked_in = repo_root().join("deploy/helm/redpilot");
    let files = |dir: &std::path::Path| {
        let mut v: Vec<(String, String)> = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(dir).expect("prefix").display().to_string();
                    v.push((rel, std::fs::read_to_string(&p).expect("read")));
                }
            }
        }
        v.sort();
        v
    };
    let (generated, kept) = (files(&out), files(&checked_in));
    let _ = std::fs::remove_dir_all(&out);
    assert!(!kept.is_empty(), "deploy/helm/redpilot is empty");
    assert!(
        generated == kept,
        "deploy/helm/redpilot is stale: run `make helm-chart` (files: {:?} vs {:?})",
        generated.iter().map(|f| &f.0).collect::<Vec<_>>(),
        kept.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
}

#[test]
fn the_helm_chart_lints_and_renders_install_yaml_by_default() {
    let chart = chart();
    let lint = helm_ok(&["lint", "--strict", chart.as_str()]);
    println!("{}", lint.trim());
    // The defaults: install.yaml's objects, but its Namespace (Helm
    // installs into a namespace, it does not own it).
    let rendered = render(&[]);
    let mut install = objects(
        &std::fs::read_to_string(repo_root().join("deploy/install.yaml")).expect("install.yaml"),
    );
    install.retain(|k, _| k.0 != "Namespace");
    let (a, b): (Vec<_>, Vec<_>) = (rendered.keys().collect(), install.keys().collect());
    assert_eq!(a, b, "the same objects");
    for (k, v) in &install {
        assert_eq!(&rendered[k], v, "{k:?} renders as install.yaml has it");
    }
    println!(
        "helm template (defaults): {} objects, equal to install.yaml's",
        rendered.len()
    );

    // Namespaces listed: a RoleBinding in each, no ClusterRoleBinding.
    let scoped = render(&["watchNamespaces={apps,cache}"]);
    assert!(!scoped.keys().any(|k| k.0 == "ClusterRoleBinding"));
    for ns in ["apps", "cache"] {
        let rb = &scoped[&(
            "RoleBinding".to_string(),
            ns.to_string(),
            "redpilot-operator".to_string(),
        )];
        assert_eq!(rb["subjects"][0]["namespace"], "redpilot-system", "{rb}");
        assert_eq!(rb["roleRef"]["kind"], "ClusterRole");
    }
    assert_eq!(
        deployment_env(&scoped, "WATCH_NAMESPACE")["value"],
        "apps,cache"
    );

    // An image by digest, for the operator and the Jobs it runs.
    let digest = format!("sha256:{}", "ab".repeat(32));
    let pinned = render(&[&format!("image.digest={digest}")]);
    let want = format!("quay.io/redpilot/redpilot@{digest}");
    let d = pinned
        .iter()
        .find(|(k, _)| k.0 == "Deployment")
        .expect("Deployment")
        .1;
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        want.as_str()
    );
    assert_eq!(
        deployment_env(&pinned, "OPERATOR_IMAGE")["value"],
        want.as_str()
    );

    // The prometheus-operator's objects, as config/prometheus/ has them.
    let monitored = render(&[
        "monitoring.podMonitor=true",
        "monitoring.prometheusRule=true",
    ]);
    let want = objects(
        &std::fs::read_to_string(repo_root().join("config/prometheus/podmonitor-operator.yaml"))
            .expect("podmonitor-operator.yaml"),
    );
    for (k, v) in &want {
        let got = monitored
            .iter()
            .find(|(mk, _)| mk.0 == k.0 && mk.2 == k.2)
            .unwrap_or_else(|| panic!("{k:?} rendered"))
            .1;
        assert_eq!(got, v, "{k:?}");
    }
    assert!(
        !render(&[])
            .keys()
            .any(|k| k.0 == "PodMonitor" || k.0 == "PrometheusRule")
    );

    // The ClusterRole managed apart.
    assert!(
        !render(&["rbac.clusterRole=false"])
            .keys()
            .any(|k| k.0 == "ClusterRole")
    );
}
