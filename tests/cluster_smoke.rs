//! Proves the dev cluster is a real Kubernetes control plane: the apiserver
//! reports its pinned version, controllers turn a Deployment into Running pods
//! on the kwok node, CRDs work with server-side apply, and PodSecurity
//! admission enforces the `restricted` level.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use serde_json::json;
use support::{TestNamespace, client, wait_for};

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn apiserver_reports_pinned_version() {
    let client = client().await;
    let info = client.apiserver_version().await.expect("version");
    assert_eq!(info.git_version, "v1.37.2", "apiserver version");
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "37"));
}

#[tokio::test]
async fn kwok_node_is_ready_and_tainted() {
    let client = client().await;
    let node = Api::<Node>::all(client)
        .get("kwok-node-0")
        .await
        .expect("the kwok fake node kwok-node-0 exists");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "kwok-node-0 is Ready");
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "kwok.x-k8s.io/node" && t.effect == "NoSchedule"),
        "kwok-node-0 keeps its NoSchedule taint: {taints:?}"
    );
}

#[tokio::test]
async fn deployment_gets_replicaset_and_running_pods_on_kwok_node() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "smoke-deploy", &[]).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "web", "image": "example.invalid/web:1"}]
                }
            }
        }
    }))
    .expect("deployment json");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");

    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);
    let rs_name = wait_for("a ReplicaSet owned by deployment web", TIMEOUT, || async {
        let list = replicasets.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find_map(|rs| {
            let owned = rs
                .metadata
                .owner_references
                .as_ref()?
                .iter()
                .any(|o| o.kind == "Deployment" && o.name == "web");
            owned.then(|| rs.metadata.name.clone()).flatten()
        })
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let running = wait_for("3 Running pods on kwok-node-0", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("kwok-node-0")
            })
            .collect();
        (running.len() == 3).then_some(running)
    })
    .await;
    for pod in &running {
        let owner = pod
            .metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .expect("pod has an owner");
        assert_eq!(owner.kind, "ReplicaSet");
        assert_eq!(owner.name, rs_name);
    }
}

#[tokio::test]
async fn crd_is_established_and_custom_object_round_trips_through_ssa() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "smoke-crd", &[]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let group = "smoke.redpilot.io";
    let crd_name = format!("widgets.{group}");
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "color": {"type": "string"}
                        }
                    }}
                }}
            }]
        }
    }))
    .expect("crd json");
    let ssa = PatchParams::apply("redpilot-smoke").force();
    crds.patch(&crd_name, &ssa, &Patch::Apply(&crd))
        .await
        .expect("apply crd");
    wait_for("the Widget CRD to be Established", TIMEOUT, || async {
        let crd = crds.get(&crd_name).await.ok()?;
        let established = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await;

    let gvk = GroupVersionKind::gvk(group, "v1", "Widget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &resource);
    let object = json!({
        "apiVersion": format!("{group}/v1"),
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3, "color": "red"}
    });
    // The apiserver may need a moment after Established to serve the new type.
    let applied = wait_for("server-side apply of a Widget", TIMEOUT, || async {
        widgets
            .patch(
                "w1",
                &PatchParams::apply("redpilot-smoke"),
                &Patch::Apply(&object),
            )
            .await
            .ok()
    })
    .await;
    assert_eq!(applied.data["spec"], json!({"size": 3, "color": "red"}));
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, vec!["redpilot-smoke".to_string()]);

    let fetched = widgets.get("w1").await.expect("get widget");
    assert_eq!(fetched.data["spec"]["size"], json!(3));

    // Schema validation is real: size below its minimum is refused.
    let bad = json!({
        "apiVersion": format!("{group}/v1"),
        "kind": "Widget",
        "metadata": {"name": "w2"},
        "spec": {"size": 0}
    });
    let err = widgets
        .patch(
            "w2",
            &PatchParams::apply("redpilot-smoke"),
            &Patch::Apply(&bad),
        )
        .await
        .expect_err("size 0 violates minimum 1");
    assert!(
        err.to_string().contains("spec.size"),
        "error names the field: {err}"
    );

    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .expect("delete crd");
}

#[tokio::test]
async fn restricted_pod_security_rejects_privileged_pod() {
    let client: Client = client().await;
    let ns = TestNamespace::new(
        &client,
        "smoke-psa",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let privileged: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{
            "name": "c",
            "image": "example.invalid/c:1",
            "securityContext": {"privileged": true}
        }]}
    }))
    .expect("pod json");
    let err = pods
        .create(&PostParams::default(), &privileged)
        .await
        .expect_err("a privileged pod is refused under enforce=restricted");
    let text = err.to_string();
    assert!(
        text.contains("violates PodSecurity \"restricted"),
        "rejected by PodSecurity admission: {text}"
    );

    // A pod that meets the restricted level is admitted in the same namespace.
    let compliant: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "compliant"},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "c",
                "image": "example.invalid/c:1",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }
    }))
    .expect("pod json");
    pods.create(&PostParams::default(), &compliant)
        .await
        .expect("a restricted-compliant pod is admitted");
}
