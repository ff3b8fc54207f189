//! Helm on the dev cluster: `helm install` runs the operator for one
//! namespace (a Redis Ready), `helm upgrade` with a new value rolls it (another
//! Redis Ready through the new pod), `helm uninstall` removes it and leaves
//! the CRDs and the Redis. (The chart's drift, lint and rendering are checked
//! in tests/plain_install.rs.)
//!
//! It runs in the `operator_backup` binary, beside that suite's tests, whose
//! longest waits minutes on a schedule.

use std::time::Duration;

use crate::support::helm::{chart, helm, helm_ok};
use crate::support::operator::{apply_rbac, apply_redis, redis_api, wait_ready};
use crate::support::{TestNamespace, client};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::json;

/// Uninstalls the release if the test stops half-way.
struct HelmRelease(String);

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let out = helm(&[
            "uninstall",
            "redpilot",
            "-n",
            &self.0,
            "--ignore-not-found",
            "--wait",
        ]);
        if !out.status.success() {
            eprintln!("helm uninstall: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_the_operator() {
    let client = client().await;
    // The ClusterRole is the harness's (other suites' operators use it at
    // the same time): the release binds it and leaves it alone.
    apply_rbac(&client).await;
    let op_ns = TestNamespace::new(&client, "helm-op", &[]).await;
    let app_ns = TestNamespace::new(&client, "helm-app", &[]).await;
    let chart = chart();
    let watch = format!("watchNamespaces={{{}}}", app_ns.name);
    let t0 = std::time::Instant::now();
    helm_ok(&[
        "install",
        "redpilot",
        chart.as_str(),
        "-n",
        &op_ns.name,
        "--set",
        &watch,
        "--set",
        "rbac.clusterRole=false",
        "--wait",
        "--timeout",
        "180s",
    ]);
    let _release = HelmRelease(op_ns.name.clone());
    println!(
        "helm install: {:.1} s to an available operator",
        t0.elapsed().as_secs_f64()
    );
    apply_redis(
        &client,
        &app_ns.name,
        "cache",
        json!({"mode": "Standalone"}),
    )
    .await;
    wait_ready(&client, &app_ns.name, "cache", Duration::from_secs(180)).await;

    // An upgrade with a new value rolls the operator; the new one works.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &op_ns.name);
    let before = deployments
        .get("redpilot-operator")
        .await
        .expect("Deployment")
        .metadata
        .generation;
    helm_ok(&[
        "upgrade",
        "redpilot",
        chart.as_str(),
        "-n",
        &op_ns.name,
        "--reuse-values",
        "--set",
        "resources.limits.memory=300Mi",
        "--wait",
        "--timeout",
        "180s",
    ]);
    let d = deployments
        .get("redpilot-operator")
        .await
        .expect("Deployment");
    assert_ne!(
        d.metadata.generation, before,
        "the upgrade changed the Deployment"
    );
    let limit = d
        .spec
        .template
        .spec
        .and_then(|p| p.containers.into_iter().next())
        .and_then(|c| c.resources)
        .and_then(|r| r.limits)
        .and_then(|l| l.get("memory").cloned())
        .map(|q| q.0);
    assert_eq!(limit.as_deref(), Some("300Mi"));
    apply_redis(
        &client,
        &app_ns.name,
        "second",
        json!({"mode": "Standalone"}),
    )
    .await;
    wait_ready(&client, &app_ns.name, "second", Duration::from_secs(180)).await;

    // Uninstalled: the operator and its bindings go; the CRDs and the
    // Redis stay.
    helm_ok(&["uninstall", "redpilot", "-n", &op_ns.name, "--wait"]);
    assert!(
        deployments
            .get_opt("redpilot-operator")
            .await
            .expect("get")
            .is_none()
    );
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &app_ns.name);
    assert!(
        bindings
            .get_opt("redpilot-operator")
            .await
            .expect("get")
            .is_none()
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(
        crds.get_opt("redis.redpilot.io")
            .await
            .expect("get")
            .is_some()
    );
    let redis = redis_api(&client, &app_ns.name);
    assert!(redis.get_opt("cache").await.expect("get").is_some());
    println!(
        "helm: install, upgrade and uninstall in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
