//! OLM end to end on the dev cluster, as a user installs Redpilot:
//!
//! OLM's olm and catalog operators run from `bin/` as local processes
//! against the cluster, with OLM's CRDs applied; `bin/opm serve` serves
//! catalog/; a grpc CatalogSource points at it and a Subscription to `stable`
//! installs the operator into a namespace enforcing the restricted Pod
//! Security profile. The CSV must reach Succeeded (so the operator's pod,
//! run by the local node from the operator binary, is ready), with the CRD,
//! Deployment, ServiceAccount and RBAC as the CSV declares them.
//!
//! Installed for its own namespace (OwnNamespace), the operator's
//! ServiceAccount may read Secrets there and in no other namespace (issue
//! #10: the CSV's rules are `permissions`, not `clusterPermissions`), as the
//! apiserver's authorizer answers SubjectAccessReviews.
//!
//! The first install is the previous release (catalog/releases.txt): its
//! catalog, served from a catalog image of it (hack/catalog-image.sh), and
//! its operator built from its git commit (make release-bins).
//! Then the release is published as a release pipeline does
//! (hack/publish.sh, to a registry on loopback): each release's operator
//! image, bundle images naming it by digest, and a catalog image rendered by
//! `opm alpha render-template semver` from the pushed bundles. The
//! CatalogSource is pointed at the catalog image: OLM runs it as a pod,
//! unpacks the new bundle image in a Job with the published helper images,
//! and the new operator runs from its image, pulled and unpacked by the
//! local node (a missing library or a wrong path would fail it). The
//! Subscription upgrades, and the old CSV disappears. A backup taken after
//! the upgrade runs its agent from the same image, and a Redis made after it
//! its metrics sidecar. It stays
//! on `stable`, the channel 0.1.0's catalog offered: this tree's catalog
//! keeps it next to the semver template's `stable-v0`, with the same
//! entries. A Replication Redis created before the upgrade, under a writer,
//! keeps every pod (UID and restart count), stays Ready throughout, and the
//! writer sees no error: an operator upgrade restarts nothing.
//!
//! Every process the test starts is stopped when it ends, pass or fail.

mod olm_cluster;
mod olm_common;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use olm_cluster::*;
use olm_common::*;
use serde_json::{Value, json};
use support::faults::{ServiceWriter, missing};
use support::operator::{
    apply_redis, is_ready, redis_api, redis_password, redis_pods, service_account_may, wait_ready,
};

const CRD_NAME: &str = "redis.redpilot.io";

/// Deletes, when dropped, the cluster-scoped RBAC that OLM created for the
/// test namespace (it is labelled with the owner's namespace), so a stopped
/// OLM leaves nothing behind.
struct ClusterRbacCleanup {
    client: Client,
    namespace: String,
}

impl Drop for ClusterRbacCleanup {
    fn drop(&mut self) {
        let client = self.client.clone();
        let selector = format!("olm.owner.namespace={}", self.namespace);
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let lp = ListParams::default().labels(&selector);
                let dp = DeleteParams::default();
                let _ = Api::<ClusterRoleBinding>::all(client.clone())
                    .delete_collection(&dp, &lp)
                    .await;
                let _ = Api::<ClusterRole>::all(client)
                    .delete_collection(&dp, &lp)
                    .await;
            });
        })
        .join();
    }
}

/// What the cluster looks like, for a failure message.
async fn diagnostics(client: &Client, ns: &str, procs: &[&Proc]) -> String {
    let mut out = String::new();
    let csvs = csv_api(client, ns).list(&ListParams::default()).await;
    for csv in csvs.map(|l| l.items).unwrap_or_default() {
        out += &format!(
            "CSV {}: {}\n",
            csv.metadata.name.unwrap_or_default(),
            csv.data["status"]["conditions"]
                .as_array()
                .map(|cs| cs
                    .iter()
                    .map(|c| format!("  {} {}: {}", c["phase"], c["reason"], c["message"]))
                    .collect::<Vec<_>>()
                    .join("\n"))
                .unwrap_or_default()
        );
    }
    let ips = olm_api(client, ns, "v1alpha1", "InstallPlan", "installplans")
        .list(&ListParams::default())
        .await;
    for ip in ips.map(|l| l.items).unwrap_or_default() {
        out += &format!(
            "InstallPlan {}: {} {}\n",
            ip.metadata.name.unwrap_or_default(),
            ip.data["status"]["phase"],
            ip.data["status"]["message"]
        );
    }
    let subs = olm_api(client, ns, "v1alpha1", "Subscription", "subscriptions")
        .list(&ListParams::default())
        .await;
    for s in subs.map(|l| l.items).unwrap_or_default() {
        out += &format!(
            "Subscription {}: state {} current {} installed {}\n",
            s.metadata.name.unwrap_or_default(),
            s.data["status"]["state"],
            s.data["status"]["currentCSV"],
            s.data["status"]["installedCSV"]
        );
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await;
    for p in pods.map(|l| l.items).unwrap_or_default() {
        let status = p.status.unwrap_or_default();
        out += &format!(
            "Pod {} on {:?}: {:?} {:?}\n",
            p.metadata.name.clone().unwrap_or_default(),
            p.spec.and_then(|s| s.node_name),
            status.phase,
            status
                .container_statuses
                .unwrap_or_default()
                .iter()
                .map(|c| (c.ready, c.restart_count, c.state.clone()))
                .collect::<Vec<_>>()
        );
        let pod_dir = root()
            .join(".dev/localnode/pods")
            .join(format!("{ns}_{}", p.metadata.name.unwrap_or_default()));
        if let Ok(log) = std::fs::read_to_string(pod_dir.join("operator.log")) {
            let lines: Vec<&str> = log.lines().collect();
            out += &format!(
                "  operator log (local node):\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
    }
    for p in procs {
        out += &p.tail(25);
        out.push('\n');
    }
    out
}

/// Waits for `check` (polled every 500 ms) or fails with diagnostics.
async fn wait_or_explain<T, F, Fut>(
    what: &str,
    timeout: Duration,
    client: &Client,
    ns: &str,
    procs: &mut [&mut Proc],
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        for p in procs.iter_mut() {
            p.assert_running();
        }
        if start.elapsed() >= timeout {
            let procs: Vec<&Proc> = procs.iter().map(|p| &**p).collect();
            panic!(
                "timed out after {}s waiting for {what}\n{}",
                timeout.as_secs(),
                diagnostics(client, ns, &procs).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn csv_phase(client: &Client, ns: &str, name: &str) -> Option<String> {
    let csv = csv_api(client, ns).get_opt(name).await.ok().flatten()?;
    csv.data["status"]["phase"].as_str().map(str::to_string)
}

/// Rules as comparable strings (JSON of each rule, order of rules ignored).
fn rule_set(rules: &[Value]) -> BTreeSet<String> {
    rules.iter().map(|r| r.to_string()).collect()
}

fn rules_of<T: serde::Serialize>(obj: &T) -> Vec<Value> {
    serde_json::to_value(obj).expect("serialisable")["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The CSV's install as it exists in the cluster: CRD, Deployment,
/// ServiceAccount, Roles and ClusterRoles with exactly the declared rules.
/// `least_privilege`: the CSV's rules are checked too (not for releases
/// published before issue #10 was fixed: 0.1.0 granted Secrets cluster-wide).
async fn assert_installed_as_declared(
    client: &Client,
    ns: &str,
    csv_name: &str,
    version: &str,
    least_privilege: bool,
    image: Option<&str>,
) {
    let csv = csv_api(client, ns)
        .get(csv_name)
        .await
        .expect("reading the CSV");
    let install = &csv.data["spec"]["install"]["spec"];

    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get(CRD_NAME)
        .await
        .expect("the CRD is not installed");
    assert!(established(&crd), "{CRD_NAME} is not Established");
    // OLM's catalog operator wrote it, for this CSV.
    let alongside = format!("{ns}/{csv_name}");
    assert!(
        crd.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .iter()
            .any(
                |(k, v)| k.starts_with("operatorframework.io/installed-alongside-")
                    && *v == alongside
            ),
        "{CRD_NAME} is not marked as installed alongside {alongside}"
    );
    assert!(
        crd.metadata
            .managed_fields
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|m| m.manager.as_deref() == Some("catalog")),
        "OLM's catalog operator did not write {CRD_NAME}"
    );
    let bundled = yaml_doc(&root().join("bundle/manifests/redpilot.io_redis.yaml"));
    let served: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        served,
        bundled["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect::<Vec<_>>()
    );

    let dep_spec = &install["deployments"][0];
    let dep_name = dep_spec["name"].as_str().expect("a deployment name");
    let dep = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(dep_name)
        .await
        .unwrap_or_else(|e| panic!("Deployment {dep_name}: {e}"));
    let status = dep.status.clone().unwrap_or_default();
    assert!(
        status.available_replicas.unwrap_or(0) >= 1,
        "Deployment {dep_name} is not available"
    );
    let pod_spec = dep.spec.template.spec.as_ref().expect("a pod template");
    let container = &pod_spec.containers[0];
    match image {
        // Published: the CSV names the image by the digest pushed.
        Some(want) => assert_eq!(
            container.image.as_deref(),
            Some(want),
            "the Deployment runs another image than the published {version} one"
        ),
        None => assert!(
            container
                .image
                .as_deref()
                .is_some_and(|i| i.ends_with(&format!(":{version}"))),
            "the Deployment runs {:?}, not the {version} image",
            container.image
        ),
    }
    // The operator really runs: its ready pod is on the local node (which
    // runs pods as processes), not on a simulated kwok node.
    let selector = dep
        .spec
        .selector
        .match_labels
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("listing the operator's pods");
    let mut real_ready = 0;
    for p in &pods.items {
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .get(&node)
            .await
            .expect("reading the pod's node");
        let local = node
            .metadata
            .labels
            .unwrap_or_default()
            .get("redpilot.io/localnode")
            .is_some_and(|v| v == "true");
        // A published image was pulled and run by its digest (the local
        // node reports the digest it unpacked, as a kubelet does).
        let image_id = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.first())
            .map(|c| c.image_id.clone())
            .unwrap_or_default();
        if ready && local && image.is_none_or(|want| image_id == want) {
            real_ready += 1;
        }
    }
    assert!(
        real_ready >= 1,
        "no ready operator pod on the local node running {image:?} (pods: {:?})",
        pods.items
            .iter()
            .map(|p| (
                &p.metadata.name,
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .map(|cs| cs.iter().map(|c| c.image_id.clone()).collect::<Vec<_>>())
            ))
            .collect::<Vec<_>>()
    );
    let annotations = dep
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    assert_eq!(
        annotations.get("olm.targetNamespaces").map(String::as_str),
        Some(ns),
        "OLM passes the OperatorGroup's namespaces to the pod"
    );

    for (field, cluster) in [("permissions", false), ("clusterPermissions", true)] {
        for perm in install[field].as_array().into_iter().flatten() {
            let sa = perm["serviceAccountName"]
                .as_str()
                .expect("a serviceAccountName");
            assert_eq!(
                pod_spec.service_account_name.as_deref(),
                Some(sa),
                "the Deployment runs as the CSV's ServiceAccount"
            );
            Api::<ServiceAccount>::namespaced(client.clone(), ns)
                .get(sa)
                .await
                .unwrap_or_else(|e| panic!("ServiceAccount {sa}: {e}"));
            let want = rule_set(perm["rules"].as_array().unwrap());
            let lp = ListParams::default().labels(&format!("olm.owner={csv_name}"));
            // The roles OLM made for this CSV, bound to the ServiceAccount.
            let mut found: Vec<BTreeSet<String>> = Vec::new();
            if cluster {
                let bindings = Api::<ClusterRoleBinding>::all(client.clone())
                    .list(&lp)
                    .await
                    .unwrap();
                for b in bindings.items {
                    let to_sa = b.subjects.unwrap_or_default().iter().any(|s| {
                        s.kind == "ServiceAccount"
                            && s.name == sa
                            && s.namespace.as_deref() == Some(ns)
                    });
                    if to_sa && b.role_ref.kind == "ClusterRole" {
                        let role = Api::<ClusterRole>::all(client.clone())
                            .get(&b.role_ref.name)
                            .await
                            .unwrap();
                        found.push(rule_set(&rules_of(&role)));
                    }
                }
            } else {
                let bindings = Api::<RoleBinding>::namespaced(client.clone(), ns)
                    .list(&lp)
                    .await
                    .unwrap();
                for b in bindings.items {
                    let to_sa = b
                        .subjects
                        .unwrap_or_default()
                        .iter()
                        .any(|s| s.kind == "ServiceAccount" && s.name == sa);
                    if to_sa && b.role_ref.kind == "Role" {
                        let role = Api::<Role>::namespaced(client.clone(), ns)
                            .get(&b.role_ref.name)
                            .await
                            .unwrap();
                        found.push(rule_set(&rules_of(&role)));
                    }
                }
            }
            assert!(
                found.contains(&want),
                "no {} bound to {sa} with the CSV's {field}: found {found:#?}, want {want:#?}",
                if cluster { "ClusterRole" } else { "Role" }
            );
        }
    }
    let sa = pod_spec
        .service_account_name
        .as_deref()
        .expect("the Deployment names its ServiceAccount");
    if least_privilege {
        assert_secrets_only_in_target_namespace(client, ns, &csv.data, sa).await;
    }
}

/// Issue #10: the CSV grants nothing cluster-wide, and OLM, installing it for
/// `ns` alone (OwnNamespace), lets ServiceAccount `sa` read and write Secrets
/// in `ns` and in no other namespace, nor cluster-wide.
async fn assert_secrets_only_in_target_namespace(client: &Client, ns: &str, csv: &Value, sa: &str) {
    assert_least_privilege(csv, &format!("the installed CSV in {ns}"));
    let mut wrong = Vec::new();
    for verb in ["get", "list", "watch", "patch"] {
        let by_name = matches!(verb, "get" | "patch");
        if service_account_may(client, ns, sa, ns, verb, "", "secrets").await != by_name {
            wrong.push(format!(
                "{} {verb} secrets in its target namespace {ns}",
                if by_name { "denied" } else { "allowed" }
            ));
        }
        for other in ["default", OLM_NAMESPACE, ""] {
            if service_account_may(client, ns, sa, other, verb, "", "secrets").await {
                wrong.push(format!(
                    "allowed {verb} secrets in {}",
                    if other.is_empty() {
                        "every namespace".to_string()
                    } else {
                        format!("namespace {other}")
                    }
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "ServiceAccount {ns}/{sa} of an OwnNamespace install:\n{}",
        wrong.join("\n")
    );
}

/// Each Redis pod's name, UID, image and server restart count.
async fn pod_identities(client: &Client, ns: &str) -> Vec<(String, String, String, i32)> {
    support::operator::pod_states(client, ns, "cache").await
}

/// The release before `version` in catalog/releases.txt, which names the
/// commit it was built from; its binary and catalog come from
/// hack/release-bin.sh (make release-bins).
fn previous_release(version: &str) -> (String, PathBuf) {
    let text = std::fs::read_to_string(root().join("catalog/releases.txt")).unwrap();
    let versions: Vec<&str> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let at = versions
        .iter()
        .position(|v| *v == version)
        .unwrap_or_else(|| panic!("{version} is not in catalog/releases.txt"));
    assert!(
        at > 0,
        "catalog/releases.txt lists no release before {version}"
    );
    let prev = versions[at - 1].to_string();
    let bin = root().join(format!("bin/releases/redpilot-{prev}"));
    let catalog = root().join(format!("bin/releases/catalog-{prev}"));
    assert!(
        bin.exists() && catalog.join("redpilot").is_dir(),
        "release {prev} is not built: run `make release-bins` (hack/release-bin.sh {prev} \
         builds its operator from its git commit and exports its catalog)"
    );
    (prev, catalog)
}

/// A registry on a free loopback port (`bin/crane registry serve`, blobs
/// under `dir`), once it answers.
fn start_registry(logs: &Path, dir: &Path) -> (Proc, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    std::fs::create_dir_all(dir).expect("the registry's directory");
    let mut proc = Proc::start(
        "registry",
        Command::new(tool("crane"))
            .args(["registry", "serve", "--address", &addr, "--disk"])
            .arg(dir),
        logs,
    );
    proc.wait_listening(port, Duration::from_secs(30));
    (proc, addr)
}

/// `hack/catalog-image.sh`: the catalog directory `dir` as an image pushed
/// to `reference`; returns it by digest.
fn catalog_image(dir: &Path, reference: &str) -> String {
    let out = run_ok(
        Command::new("bash")
            .arg(root().join("hack/catalog-image.sh"))
            .arg(dir)
            .arg(reference),
    );
    out.lines().last().unwrap_or_default().trim().to_string()
}

/// `hack/publish.sh` into `out` with this build's operator: every reference
/// it pushed (its images.env), by name.
fn publish(registry: &str, out: &Path) -> BTreeMap<String, String> {
    let started = Instant::now();
    run_ok(
        Command::new("bash")
            .arg(root().join("hack/publish.sh"))
            .env("REGISTRY", registry)
            .env("OUT", out)
            .env("OPERATOR_BIN", env!("CARGO_BIN_EXE_redpilot")),
    );
    let env = std::fs::read_to_string(out.join("images.env")).expect("images.env");
    let refs: BTreeMap<String, String> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    println!(
        "published to {registry} in {:.1}s: {refs:#?}",
        started.elapsed().as_secs_f64()
    );
    refs
}

/// The published catalog against the checked-in one: the same channels with
/// the same entries, each bundle named by the digest pushed, and each
/// bundle's related images holding its operator image by digest.
fn assert_published_catalog(out: &Path, refs: &BTreeMap<String, String>) {
    let text = std::fs::read_to_string(out.join("catalog/redpilot/catalog.json"))
        .expect("the published catalog");
    let docs: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .map(|d| d.expect("catalog JSON"))
        .collect();
    let channels = |docs: &[Value]| -> BTreeMap<String, Value> {
        docs.iter()
            .filter(|d| d["schema"] == "olm.channel")
            .map(|d| {
                (
                    d["name"].as_str().unwrap_or_default().to_string(),
                    d["entries"].clone(),
                )
            })
            .collect()
    };
    let checked_in = yaml_docs(&root().join("catalog/redpilot/channels.yaml"));
    assert_eq!(
        channels(&docs),
        channels(&checked_in),
        "the published catalog's channels differ from catalog/redpilot/channels.yaml"
    );
    let bundles: Vec<&Value> = docs
        .iter()
        .filter(|d| d["schema"] == "olm.bundle")
        .collect();
    assert!(!bundles.is_empty(), "no bundle in the published catalog");
    for b in bundles {
        let name = b["name"].as_str().expect("a bundle name");
        let key = name.trim_start_matches("redpilot.v").replace('.', "_");
        let want_bundle = &refs[&format!("BUNDLE_{key}")];
        let want_operator = &refs[&format!("OPERATOR_{key}")];
        assert_eq!(b["image"].as_str(), Some(want_bundle.as_str()), "{name}");
        assert!(want_bundle.contains("@sha256:"), "{want_bundle}");
        let related: Vec<&str> = b["relatedImages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["image"].as_str())
            .collect();
        assert!(
            related.contains(&want_operator.as_str()),
            "{name}: related images {related:?} lack the operator {want_operator}"
        );
    }
}

/// There is no cluster DNS nor kube-proxy here: OLM's catalog operator runs
/// in a mount namespace of its own whose /etc/hosts is `hosts`, and this
/// task maps the catalog Service's name (`<catalog source>.<ns>.svc`, the
/// address OLM dials) to the registry pod's IP while it runs, as cluster
/// DNS and the Service would route it.
fn map_catalog_service(
    client: &Client,
    ns: &str,
    source: &str,
    hosts: PathBuf,
    base: String,
) -> tokio::task::JoinHandle<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let name = format!("{source}.{ns}.svc");
    let selector = format!("olm.catalogSource={source}");
    tokio::spawn(async move {
        let mut mapped = String::new();
        loop {
            if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                // The newest ready pod (OLM replaces it when the image
                // changes), else the newest with an address.
                let mut live: Vec<&Pod> = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| p.status.as_ref().is_some_and(|s| s.pod_ip.is_some()))
                    .collect();
                live.sort_by_key(|p| p.metadata.creation_timestamp.clone());
                let ready = |p: &&&Pod| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                };
                let ip = live
                    .iter()
                    .rev()
                    .find(ready)
                    .or(live.last())
                    .and_then(|p| p.status.as_ref()?.pod_ip.clone());
                if let Some(ip) = ip
                    && ip != mapped
                {
                    // Written in place: the bind mount holds this inode.
                    let _ = std::fs::write(&hosts, format!("{base}{ip}\t{name}\n"));
                    mapped = ip;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_installs_then_upgrades_through_the_catalog() {
    let started = Instant::now();
    let (olm_bin, catalog_bin) = (tool("olm"), tool("catalog"));
    tool("opm");
    tool("operator-sdk");
    let client = support::client().await;
    let kubeconfig = support::kubeconfig_path();
    let work = tempfile::tempdir().expect("tempdir");
    let logs = work.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();

    // The previous release, as its users installed it: its own catalog
    // and its operator built from its git commit. Then this release as
    // published: every release's operator and bundle image and the catalog
    // image, pushed to a registry (hack/publish.sh).
    let next = bundle_version();
    let (version, prev_catalog) = previous_release(&next);
    let (mut registry, registry_addr) = start_registry(&logs, &work.path().join("registry"));
    let published_dir = work.path().join("publish");
    let published = publish(&registry_addr, &published_dir);
    let registry_log_at_publish = std::fs::metadata(&registry.log).map_or(0, |m| m.len());
    assert_published_catalog(&published_dir, &published);
    let next_key = next.replace('.', "_");
    let next_operator = published[&format!("OPERATOR_{next_key}")].clone();

    // OLM.
    install_olm_crds(&client).await;
    let mut olm = Proc::start(
        "olm",
        Command::new(&olm_bin).env("KUBECONFIG", &kubeconfig).args([
            "--namespace",
            OLM_NAMESPACE,
            "--writeStatusName",
            "",
            "--writePackageServerStatusName",
            "",
        ]),
        &logs,
    );
    // The catalog operator unpacks bundle images with the published helper
    // images, runs its workloads as UID 1001 (upstream OLM's setting, which
    // the restricted profile needs), and sees the hosts file below.
    let hosts = work.path().join("hosts");
    let hosts_base = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    std::fs::write(&hosts, &hosts_base).expect("writing the hosts file");
    let mut catalog = Proc::start(
        "catalog",
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
            .arg(&hosts)
            .arg(&catalog_bin)
            .env("KUBECONFIG", &kubeconfig)
            .args(["--namespace", OLM_NAMESPACE, "--writeStatusName", ""])
            .arg(format!("--util-image={}", published["OLM_UTIL"]))
            .arg(format!("--opmImage={}", published["OPM"]))
            .arg("--set-workload-user-id=true"),
        &logs,
    );
    // The previous release's catalog as an image too, as its users would
    // have had it published (its bundles embedded, so nothing to unpack).
    let prev_catalog_image = catalog_image(
        &prev_catalog,
        &format!("{registry_addr}/redpilot/redpilot-catalog:{version}"),
    );

    // The user's side: a namespace under the restricted Pod Security profile,
    // an OperatorGroup for it, the CatalogSource and a Subscription.
    let ns = support::TestNamespace::new(
        &client,
        "olm-e2e",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
    .await;
    let _rbac_cleanup = ClusterRbacCleanup {
        client: client.clone(),
        namespace: ns.name.clone(),
    };
    let n = ns.name.as_str();
    let mapping = map_catalog_service(&client, n, "redpilot", hosts.clone(), hosts_base.clone());
    create(
        &olm_api(&client, n, "v1", "OperatorGroup", "operatorgroups"),
        json!({
            "apiVersion": "operators.coreos.com/v1", "kind": "OperatorGroup",
            "metadata": {"name": "redpilot", "namespace": n},
            "spec": {"targetNamespaces": [n]}
        }),
    )
    .await;
    let catsrc = olm_api(&client, n, "v1alpha1", "CatalogSource", "catalogsources");
    create(
        &catsrc,
        json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
            "metadata": {"name": "redpilot", "namespace": n},
            "spec": {"sourceType": "grpc", "image": prev_catalog_image,
                     "grpcPodConfig": {"securityContextConfig": "restricted"},
                     "displayName": "Redpilot"}
        }),
    )
    .await;
    let subs = olm_api(&client, n, "v1alpha1", "Subscription", "subscriptions");
    create(
        &subs,
        json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
            "metadata": {"name": "redpilot", "namespace": n},
            "spec": {"channel": "stable", "name": "redpilot", "source": "redpilot",
                     "sourceNamespace": n, "installPlanApproval": "Automatic"}
        }),
    )
    .await;

    // Install.
    let csv1 = format!("redpilot.v{version}");
    let install_start = Instant::now();
    wait_or_explain(
        &format!("CSV {csv1} Succeeded"),
        Duration::from_secs(240),
        &client,
        n,
        &mut [&mut olm, &mut catalog, &mut registry],
        {
            let (c, ns, name) = (client.clone(), n.to_string(), csv1.clone());
            move || {
                let (c, ns, name) = (c.clone(), ns.clone(), name.clone());
                async move {
                    (csv_phase(&c, &ns, &name).await.as_deref() == Some("Succeeded")).then_some(())
                }
            }
        },
    )
    .await;
    let install_secs = install_start.elapsed().as_secs_f64();
    assert_installed_as_declared(&client, n, &csv1, &version, false, None).await;
    println!("OLM: {csv1} Succeeded in {install_secs:.1}s");

    // A Redis the installed operator runs, written to and watched through
    // the operator's upgrade.
    let op_ready = Duration::from_secs(240);
    apply_redis(
        &client,
        n,
        "cache",
        json!({"mode": "Replication", "instances": 3, "persistence": {"rdb": false}}),
    )
    .await;
    wait_ready(&client, n, "cache", op_ready).await;
    let pw = redis_password(&client, n, "cache").await;
    let pods_before = pod_identities(&client, n).await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), n);
    let old_holder = leases
        .get("redpilot-leader")
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity)
        .expect("the installed operator holds the lease");
    let writer = ServiceWriter::start(&client, n, "cache", &pw, "olm", 0);
    let watch = {
        let (c, ns) = (client.clone(), n.to_string());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let mut not_ready = Vec::new();
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                match redis_api(&c, &ns).get("cache").await {
                    Ok(r) if is_ready(&r) => {}
                    Ok(r) => not_ready.push(format!("{:?}", r.status.map(|s| s.conditions))),
                    Err(e) => not_ready.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            not_ready
        });
        (stop, task)
    };

    // Upgrade: point the CatalogSource at the published catalog image. OLM
    // runs it as a pod (opm serve from the image's /configs), unpacks the
    // new bundle image with a Job, and the new operator runs from its image.
    catsrc
        .patch(
            "redpilot",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "image": published["CATALOG"]
            }})),
        )
        .await
        .expect("pointing the CatalogSource at the catalog image");
    let csv2 = format!("redpilot.v{next}");
    let upgrade_start = Instant::now();
    let acked_at_upgrade = writer.acked();
    wait_or_explain(
        &format!("the Subscription to upgrade to {csv2} and {csv1} to be gone"),
        Duration::from_secs(240),
        &client,
        n,
        &mut [&mut olm, &mut catalog, &mut registry],
        {
            let (c, ns, old_name, new_name, subs) = (
                client.clone(),
                n.to_string(),
                csv1.clone(),
                csv2.clone(),
                subs.clone(),
            );
            move || {
                let (c, ns, old_name, new_name, subs) = (
                    c.clone(),
                    ns.clone(),
                    old_name.clone(),
                    new_name.clone(),
                    subs.clone(),
                );
                async move {
                    let phase = csv_phase(&c, &ns, &new_name).await;
                    let old = csv_api(&c, &ns).get_opt(&old_name).await.ok()?;
                    let sub = subs.get("redpilot").await.ok()?;
                    (phase.as_deref() == Some("Succeeded")
                        && old.is_none()
                        && sub.data["status"]["installedCSV"] == json!(new_name))
                    .then_some(())
                }
            }
        },
    )
    .await;
    let upgrade_secs = upgrade_start.elapsed().as_secs_f64();
    let acked_during_upgrade = writer.acked() - acked_at_upgrade;
    assert_installed_as_declared(&client, n, &csv2, &next, true, Some(&next_operator)).await;
    let csv = csv_api(&client, n).get(&csv2).await.unwrap();
    assert_eq!(
        csv.data["spec"]["replaces"],
        json!(csv1),
        "{csv2} replaces {csv1}"
    );
    mapping.abort();
    // What the local node asked the registry for after publishing: the
    // catalog image, the new bundle image (unpacked by OLM's Job with the
    // helper images) and the new operator image, each by the digest
    // published. A digest the node unpacked before (an earlier run of this
    // test) is only resolved (HEAD), not downloaded again.
    let log = std::fs::read(&registry.log).expect("the registry's log");
    let pulled = String::from_utf8_lossy(&log[registry_log_at_publish as usize..]).into_owned();
    for key in [
        "CATALOG".to_string(),
        format!("BUNDLE_{next_key}"),
        format!("OPERATOR_{next_key}"),
        "OLM_UTIL".to_string(),
        "OPM".to_string(),
    ] {
        let (repo, digest) = published[&key]
            .split_once('@')
            .expect("a reference by digest");
        let path = repo.split_once('/').map_or(repo, |(_, p)| p);
        let want = format!(" /v2/{path}/manifests/{digest}");
        assert!(
            pulled
                .lines()
                .any(|l| l.ends_with(&want) && (l.contains(" GET /") || l.contains(" HEAD /"))),
            "{key} was not asked of the registry (GET or HEAD{want}); the registry's log since publishing:\n{}",
            pulled.lines().take(60).collect::<Vec<_>>().join("\n")
        );
    }
    println!("OLM: upgraded {csv1} -> {csv2} in {upgrade_secs:.1}s; {csv1} is gone");

    // The new operator has taken over (its lease, its first passes): the
    // Redis kept its pods, never left Ready, and the writer saw no error.
    let new_pod = wait_or_explain(
        "the upgraded operator to lead",
        Duration::from_secs(120),
        &client,
        n,
        &mut [&mut olm, &mut catalog, &mut registry],
        {
            let (leases, old) = (leases.clone(), old_holder.clone());
            move || {
                let (leases, old) = (leases.clone(), old.clone());
                async move {
                    let holder = leases
                        .get("redpilot-leader")
                        .await
                        .ok()?
                        .spec?
                        .holder_identity?;
                    (!holder.is_empty() && holder != old).then_some(holder)
                }
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    watch.0.store(true, std::sync::atomic::Ordering::SeqCst);
    let not_ready = watch.1.await.expect("readiness watch");
    let tally = writer.stop().await;
    println!(
        "writer: {acked_during_upgrade} writes acknowledged during the {upgrade_secs:.1} s upgrade, {} in all, {} failed, {} rounds without a reachable endpoint",
        tally.acks.len(),
        tally.failed,
        tally.unreachable
    );
    assert!(
        acked_during_upgrade >= 100,
        "writes kept going during the upgrade: only {acked_during_upgrade} in {upgrade_secs:.1} s"
    );
    assert_eq!(
        tally.unreachable, 0,
        "the writer found no ready endpoint (or none took its connection) during the upgrade"
    );
    let pods_after = pod_identities(&client, n).await;
    assert_eq!(
        pods_after, pods_before,
        "every Redis pod keeps its UID and restart count through the operator upgrade"
    );
    // The new release builds another pod template: the running pods keep
    // theirs, and the operator says so.
    let events = support::operator::recent_events(&client, n, 600).await;
    let sts = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), n)
        .get("cache")
        .await
        .expect("the StatefulSet");
    assert!(
        events.contains("TemplateKept"),
        "no TemplateKept event (StatefulSet annotations {:?}, pods {pods_after:?}): {events}",
        sts.metadata.annotations
    );
    assert!(not_ready.is_empty(), "the Redis left Ready: {not_ready:?}");
    assert_eq!(
        (tally.failed, &tally.errors),
        (0, &Default::default()),
        "the writer saw errors"
    );
    let keys = tally.keys();
    for (pod, p) in redis_pods(&client, n, "cache").await {
        let ip = p.status.and_then(|s| s.pod_ip).expect("ip");
        let gone = missing(&ip, &pw, &keys).await;
        assert!(
            gone.is_empty(),
            "{pod} lacks {} acknowledged writes",
            gone.len()
        );
    }
    println!(
        "operator upgrade: {} Redis pods kept (UIDs, restart counts), Ready throughout, {} \
         writes acknowledged with no error; lease now held by {new_pod}",
        pods_after.len(),
        keys.len()
    );
    // The backup agent runs from the same published image: a backup to a
    // volume completes, and the Job's pod ran the operator image by digest.
    support::operator::create_claim(&client, n, "backups").await;
    let backups: Api<redpilot::api::v1alpha1::RedisBackup> = Api::namespaced(client.clone(), n);
    let backup = serde_json::from_value(json!({
        "apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
        "metadata": {"name": "after-upgrade"},
        "spec": {"redis": "cache", "target": {"volume": {"claimName": "backups"}}}
    }))
    .expect("a RedisBackup");
    backups
        .create(&kube::api::PostParams::default(), &backup)
        .await
        .expect("creating the RedisBackup");
    let agent_images = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let backup_started = Instant::now();
    let phase = wait_or_explain(
        "the backup after the upgrade to end",
        Duration::from_secs(120),
        &client,
        n,
        &mut [&mut olm, &mut catalog, &mut registry],
        {
            let (backups, pods, seen) = (
                backups.clone(),
                Api::<Pod>::namespaced(client.clone(), n),
                agent_images.clone(),
            );
            move || {
                let (backups, pods, seen) = (backups.clone(), pods.clone(), seen.clone());
                async move {
                    // The agent's pods (owned by a Job), while they exist.
                    for p in pods.list(&ListParams::default()).await.ok()?.items {
                        let by_job = p
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|o| o.kind == "Job");
                        let ids = p
                            .status
                            .and_then(|s| s.container_statuses)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|c| c.image_id)
                            .filter(|i| !i.is_empty());
                        if by_job && let Ok(mut seen) = seen.lock() {
                            seen.extend(ids);
                        }
                    }
                    let phase = backups.get("after-upgrade").await.ok()?.status?.phase?;
                    matches!(
                        phase,
                        redpilot::api::v1alpha1::BackupPhase::Completed
                            | redpilot::api::v1alpha1::BackupPhase::Failed
                    )
                    .then_some(phase)
                }
            }
        },
    )
    .await;
    let seen = agent_images.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(
        phase,
        redpilot::api::v1alpha1::BackupPhase::Completed,
        "the backup after the upgrade did not complete"
    );
    assert!(
        seen.contains(&next_operator),
        "the backup agent's pod did not run {next_operator}: image IDs seen {seen:?}"
    );
    println!(
        "backup agent from {next_operator}: Completed in {:.1}s",
        backup_started.elapsed().as_secs_f64()
    );

    // A Redis made by the upgraded operator runs its metrics sidecar from
    // the same image (the operator's own exporter); the pod is Ready only
    // when the sidecar is.
    apply_redis(&client, n, "fresh", json!({"mode": "Standalone"})).await;
    wait_ready(&client, n, "fresh", op_ready).await;
    let sidecars: Vec<(String, String)> = redis_pods(&client, n, "fresh")
        .await
        .into_values()
        .flat_map(|p| {
            p.status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
        })
        .filter(|c| c.name == "exporter")
        .map(|c| (c.image.clone(), c.image_id.clone()))
        .collect();
    assert!(
        !sidecars.is_empty() && sidecars.iter().all(|(_, id)| *id == next_operator),
        "the new Redis's metrics sidecars (image, imageID) are not {next_operator}: {sidecars:?}"
    );
    println!("metrics sidecar of a new Redis from {next_operator}");
    println!(
        "OLM e2e: {:.1}s in all (install {install_secs:.1}s, upgrade {upgrade_secs:.1}s)",
        started.elapsed().as_secs_f64()
    );
}
