//! Issue #5, Level 1 "Basic Install", end to end: the operator (as its
//! ServiceAccount, with only `config/rbac/`) turns `Redis` objects into real
//! redis-server pods on the dev cluster's local node.
//!
//! - Standalone: Ready; SET/GET with the generated password; a wrong password
//!   and no password are refused.
//! - Replication (the Replication sample) in a namespace enforcing the
//!   `restricted` Pod Security level: Ready; a write to the primary is read
//!   back on both replicas; status lists roles and offsets; `kubectl get
//!   redis` fills the columns.
//! - Deleting the Redis garbage-collects the children and keeps the volumes
//!   (`storage.retainOnDelete`, default true); with `retainOnDelete: false`
//!   the volumes go too.
//! - Idempotence: after Ready, three more reconciles change no child.
//! - Namespace scoping: `WATCH_NAMESPACE` limits what is reconciled.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, Resource, ResourceExt};
use redpilot::api::v1alpha1::Redis;
use redpilot::redis::{ConnectOptions, Endpoint, ErrorCategory, Node};
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, apply_redis, child_resource_versions, config_get, connect_pod, kubectl,
    pod_ip, poke, redis_api, redis_password, redis_pods, requests_per_reconcile, rv_diff,
    settled_children, start_operator, wait_ready,
};
use support::{TestNamespace, client, repo_root, wait_for};

/// The operator's resident memory bound with a handful of Redis, unoptimised
/// build (`make bench` measures the release build at 1,100 Redis: ~100 MiB).
const OPERATOR_RSS_BOUND_KIB: u64 = 150 * 1024;

const READY: Duration = Duration::from_secs(180);

/// The children every Redis has, labelled and owned by it (controller
/// reference). Returns the StatefulSet.
async fn assert_children(client: &Client, ns: &str, redis: &Redis, replication: bool) {
    let name = redis.name_any();
    let uid = redis.meta().uid.clone().expect("redis uid");
    let check = |kind: &str, meta: &kube::api::ObjectMeta| {
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/instance").map(String::as_str),
            Some(name.as_str()),
            "{kind} {:?} instance label: {labels:?}",
            meta.name
        );
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("redpilot"),
            "{kind} {:?} managed-by label: {labels:?}",
            meta.name
        );
        let owner = meta
            .owner_references
            .as_ref()
            .and_then(|o| o.iter().find(|o| o.controller == Some(true)))
            .unwrap_or_else(|| panic!("{kind} {:?} has no controller reference", meta.name));
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Redis", uid.as_str()),
            "{kind} {:?} is controlled by the Redis",
            meta.name
        );
    };
    let sts = Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("StatefulSet {name}: {e}"));
    check("StatefulSet", &sts.metadata);
    assert_eq!(
        sts.spec
            .update_strategy
            .as_ref()
            .and_then(|u| u.type_.as_deref()),
        Some("OnDelete"),
        "the operator rolls pods itself"
    );
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let mut expected_services = vec![format!("{name}-headless"), name.clone()];
    if replication {
        expected_services.push(format!("{name}-ro"));
    }
    for svc in &expected_services {
        let s = services
            .get(svc)
            .await
            .unwrap_or_else(|e| panic!("Service {svc}: {e}"));
        check("Service", &s.metadata);
        let selector = s.spec.and_then(|s| s.selector).unwrap_or_default();
        let role = selector.get("redpilot.io/role").map(String::as_str);
        if *svc == name {
            assert_eq!(role, Some("primary"), "Service {svc} selects the primary");
        } else if svc.ends_with("-ro") {
            assert_eq!(role, Some("replica"), "Service {svc} selects replicas");
        }
    }
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(&format!("{name}-config"))
        .await
        .unwrap_or_else(|e| panic!("ConfigMap {name}-config: {e}"));
    check("ConfigMap", &cm.metadata);
    let data = cm.data.unwrap_or_default();
    assert!(
        data.contains_key("redis.conf"),
        "ConfigMap keys: {:?}",
        data.keys()
    );
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{name}-auth"))
        .await
        .unwrap_or_else(|e| panic!("Secret {name}-auth: {e}"));
    check("Secret", &secret.metadata);
    let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("PodDisruptionBudget {name}: {e}"));
    check("PodDisruptionBudget", &pdb.metadata);
}

/// Polls `GET key` on pod `pod` until it has a value (replication is asynchronous).
async fn read_key_eventually(
    client: &Client,
    ns: &str,
    pod: &str,
    password: &str,
    key: &str,
) -> String {
    wait_for(
        &format!("{key} to reach {pod}"),
        Duration::from_secs(15),
        || async {
            let mut n = connect_pod(client, ns, pod, password).await.ok()?;
            n.query::<Option<String>>("GET", redis::cmd("GET").arg(key))
                .await
                .ok()
                .flatten()
        },
    )
    .await
}

fn sample_spec(file: &str) -> (String, Value) {
    let path = repo_root().join("config/samples").join(file);
    let doc: Value = serde_yaml::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = doc["metadata"]["name"].as_str().expect("name").to_string();
    (name, doc["spec"].clone())
}

#[tokio::test]
async fn standalone_is_ready_and_requires_the_generated_password() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-standalone", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;

    let (name, spec) = sample_spec("redpilot_v1alpha1_redis_standalone.yaml");
    apply_redis(&client, &ns.name, &name, spec).await;
    let redis = wait_ready(&client, &ns.name, &name, READY).await;
    let status = redis.status.clone().expect("status");
    let pod = format!("{name}-0");
    assert_eq!(status.primary.as_deref(), Some(pod.as_str()), "{status:?}");
    assert_eq!(status.ready.as_deref(), Some("1/1"), "{status:?}");
    assert_eq!(status.ready_instances, 1, "{status:?}");
    assert_eq!(status.write_service.as_deref(), Some(name.as_str()));
    let auth_secret = format!("{name}-auth");
    assert_eq!(status.auth_secret.as_deref(), Some(auth_secret.as_str()));
    assert!(
        status
            .current_version
            .as_deref()
            .is_some_and(|v| v.starts_with("7.0.")),
        "currentVersion from INFO: {status:?}"
    );
    assert_children(&client, &ns.name, &redis, false).await;

    let password = redis_password(&client, &ns.name, &name).await;
    assert!(
        password.len() >= 16,
        "generated password has {} chars",
        password.len()
    );
    let mut node = connect_pod(&client, &ns.name, &pod, &password)
        .await
        .expect("connecting to the primary with the generated password");
    let _: () = node
        .query("SET", redis::cmd("SET").arg("greeting").arg("hello"))
        .await
        .expect("SET");
    let got: String = node
        .query("GET", redis::cmd("GET").arg("greeting"))
        .await
        .expect("GET");
    assert_eq!(got, "hello");

    // A wrong password is refused (at AUTH, or at the first command).
    match connect_pod(&client, &ns.name, &pod, "not-the-password").await {
        Err(e) => assert_eq!(e.category(), ErrorCategory::Auth, "wrong password: {e}"),
        Ok(mut n) => {
            let r = n
                .query::<String>("GET", redis::cmd("GET").arg("greeting"))
                .await;
            let e = r.expect_err("GET with a wrong password must fail");
            assert_eq!(e.category(), ErrorCategory::Auth, "wrong password: {e}");
        }
    }
    // No password at all: NOAUTH.
    let ip = pod_ip(&client, &ns.name, &pod).await;
    let mut anonymous = Node::connect(&Endpoint::new(ip, 6379), &ConnectOptions::default())
        .await
        .expect("a TCP connection without credentials");
    let e = anonymous
        .query::<String>("GET", redis::cmd("GET").arg("greeting"))
        .await
        .expect_err("GET without a password must fail");
    assert_eq!(e.category(), ErrorCategory::Auth, "no password: {e}");

    println!(
        "standalone: operator RSS {} KiB",
        op.rss_kib().unwrap_or_default()
    );
}

#[tokio::test]
async fn replication_in_restricted_namespace_replicates_and_reports() {
    let client = client().await;
    let ns = TestNamespace::new(
        &client,
        "op-replication",
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
        ],
    )
    .await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;

    let (name, spec) = sample_spec("redpilot_v1alpha1_redis_replication.yaml");
    assert_eq!(spec["mode"], "Replication");
    assert_eq!(spec["instances"], 3);
    apply_redis(&client, &ns.name, &name, spec).await;
    let redis = wait_ready(&client, &ns.name, &name, READY).await;
    let status = redis.status.clone().expect("status");
    let primary = format!("{name}-0");
    assert_eq!(
        status.primary.as_deref(),
        Some(primary.as_str()),
        "{status:?}"
    );
    assert_eq!(status.ready.as_deref(), Some("3/3"), "{status:?}");
    assert_eq!(status.ready_instances, 3, "{status:?}");
    let read_service = format!("{name}-ro");
    assert_eq!(status.read_service.as_deref(), Some(read_service.as_str()));
    assert_eq!(status.instances.len(), 3, "{:?}", status.instances);
    for inst in &status.instances {
        assert!(inst.ready, "{inst:?}");
        assert!(inst.offset.is_some(), "offset reported: {inst:?}");
        if inst.name == primary {
            assert_eq!(inst.role, "primary", "{inst:?}");
        } else {
            assert_eq!(inst.role, "replica", "{inst:?}");
            assert_eq!(inst.link_up, Some(true), "{inst:?}");
            assert!(inst.lag_bytes.is_some(), "lag reported: {inst:?}");
        }
    }
    assert_children(&client, &ns.name, &redis, true).await;

    // Pods carry their role for the Services.
    let pods = redis_pods(&client, &ns.name, &name).await;
    let roles: BTreeMap<String, String> = pods
        .iter()
        .map(|(n, p)| {
            let role = p
                .labels()
                .get("redpilot.io/role")
                .cloned()
                .unwrap_or_default();
            (n.clone(), role)
        })
        .collect();
    let expected: BTreeMap<String, String> = (0..3)
        .map(|i| {
            let role = if i == 0 { "primary" } else { "replica" };
            (format!("{name}-{i}"), role.to_string())
        })
        .collect();
    assert_eq!(roles, expected, "role labels");

    // A write at the primary is read back on both replicas.
    let password = redis_password(&client, &ns.name, &name).await;
    let mut p = connect_pod(&client, &ns.name, &primary, &password)
        .await
        .expect("connect to the primary");
    let _: () = p
        .query("SET", redis::cmd("SET").arg("order:1").arg("shipped"))
        .await
        .expect("SET at the primary");
    for i in 1..3 {
        let pod = format!("{name}-{i}");
        let mut r = connect_pod(&client, &ns.name, &pod, &password)
            .await
            .unwrap_or_else(|e| panic!("connect to {pod}: {e}"));
        let value = read_key_eventually(&client, &ns.name, &pod, &password, "order:1").await;
        assert_eq!(value, "shipped", "{pod}");
        // Replicas refuse writes.
        let e = r
            .query::<()>("SET", redis::cmd("SET").arg("x").arg("1"))
            .await
            .expect_err("a replica refuses writes");
        let msg = e.to_string().to_lowercase();
        assert!(
            msg.contains("readonly") || msg.contains("read only"),
            "{pod}: {e}"
        );
        // spec.config reached every server.
        assert_eq!(
            config_get(&mut r, "maxmemory-policy").await.as_deref(),
            Some("allkeys-lru"),
            "{pod}"
        );
    }
    assert_eq!(
        config_get(&mut p, "maxmemory-policy").await.as_deref(),
        Some("allkeys-lru")
    );

    // kubectl get redis shows the columns filled in.
    let out = kubectl(&["get", "redis", "-n", &ns.name]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "kubectl get redis: {text}");
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "MODE", "SHARDS", "VERSION", "PRIMARY", "READY", "PHASE", "MEMORY", "SOURCE",
            "AGE"
        ],
        "{text}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // MEMORY is two words: `1.1Mi/192Mi (1%)`; SHARDS is blank outside
    // Cluster mode.
    assert_eq!(row.len(), 9, "every other column filled: {text}");
    assert!(
        row[6].ends_with("/192Mi") && row[7].starts_with('(') && row[7].ends_with("%)"),
        "MEMORY: used/maxmemory (75 % of the 256Mi limit) and percent: {text}"
    );
    assert_eq!(row[0], name, "{text}");
    assert_eq!(row[1], "Replication", "{text}");
    assert!(row[2].starts_with("7.0."), "{text}");
    assert_eq!(row[3], primary, "{text}");
    assert_eq!(row[4], "3/3", "{text}");
    assert_eq!(row[5], "Ready", "{text}");
    println!("kubectl get redis:\n{text}");
    println!(
        "replication: operator RSS {} KiB",
        op.rss_kib().unwrap_or_default()
    );
}

async fn pvc_names(client: &Client, ns: &str) -> Vec<String> {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list PVCs")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

async fn delete_and_wait_for_children(client: &Client, ns: &str, name: &str) {
    redis_api(client, ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete Redis");
    wait_for(
        &format!("the children of {ns}/{name} to be garbage-collected"),
        Duration::from_secs(90),
        || async {
            let left = child_resource_versions(client, ns, name).await;
            left.is_empty().then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn deleting_the_redis_collects_children_and_keeps_volumes() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-delete", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 2, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let pvcs = pvc_names(&client, &ns.name).await;
    assert_eq!(pvcs.len(), 2, "one volume per instance: {pvcs:?}");

    delete_and_wait_for_children(&client, &ns.name, "cache").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut kept = pvc_names(&client, &ns.name).await;
    kept.sort();
    let mut expected = pvcs.clone();
    expected.sort();
    assert_eq!(
        kept, expected,
        "retainOnDelete defaults to true: the volumes stay"
    );
}

#[tokio::test]
async fn volumes_go_with_the_redis_when_retain_on_delete_is_false() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-delete-pvc", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Standalone", "storage": {"size": "1Gi", "retainOnDelete": false}}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    assert_eq!(pvc_names(&client, &ns.name).await.len(), 1);
    delete_and_wait_for_children(&client, &ns.name, "cache").await;
    wait_for(
        "the volume to be deleted with the Redis (retainOnDelete: false)",
        Duration::from_secs(60),
        || async { pvc_names(&client, &ns.name).await.is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn reconciling_a_ready_redis_again_changes_nothing() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-idem", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({
            "mode": "Replication",
            "instances": 3,
            "storage": {"size": "1Gi"},
            "config": {"maxmemory-policy": "allkeys-lru"},
        }),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let before = settled_children(
        &client,
        &ns.name,
        "cache",
        Duration::from_secs(4),
        Duration::from_secs(60),
    )
    .await;
    // StatefulSet, 3 Services, ConfigMap, 2 Secrets (generated, server-auth), PDB, 3 pods.
    assert_eq!(before.len(), 11, "children: {before:?}");

    let start = op.counters().await;
    for i in 0..3 {
        poke(&client, &ns.name, "cache", i).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_for(
        "3 reconciles after 3 annotation changes (redpilot_reconciliations_total)",
        Duration::from_secs(30),
        || async { (op.counters().await.reconciles >= start.reconciles + 3.0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = child_resource_versions(&client, &ns.name, "cache").await;
    let end = op.counters().await;
    let diff = rv_diff(&before, &after);
    assert!(
        diff.is_empty(),
        "reconciling a Ready Redis changed children:\n  {}",
        diff.join("\n  ")
    );
    let redis = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get");
    assert!(support::operator::is_ready(&redis), "still Ready");
    println!(
        "idempotence: {} reconciles, {} apiserver requests ({:.1} per reconcile), no child changed",
        end.reconciles - start.reconciles,
        end.requests - start.requests,
        (end.requests - start.requests) / (end.reconciles - start.reconciles)
    );
    let per = requests_per_reconcile(&client, &op, &ns.name, "cache", 5).await;
    println!("steady state: {per:.1} apiserver requests per reconcile (lease renewals included)");
    let rss = op.rss_kib().unwrap_or_default();
    println!("idempotence: operator RSS {rss} KiB");
    assert!(
        rss > 0 && rss < OPERATOR_RSS_BOUND_KIB,
        "operator RSS {rss} KiB managing one Redis (bound {OPERATOR_RSS_BOUND_KIB} KiB)"
    );
}

#[tokio::test]
async fn only_watched_namespaces_are_reconciled() {
    let client = client().await;
    let a = TestNamespace::new(&client, "op-scope-a", &[]).await;
    let b = TestNamespace::new(&client, "op-scope-b", &[]).await;
    let c = TestNamespace::new(&client, "op-scope-c", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&a.name, &b.name])).await;
    for ns in [&a, &b, &c] {
        apply_redis(&client, &ns.name, "cache", json!({"mode": "Standalone"})).await;
    }
    wait_ready(&client, &a.name, "cache", READY).await;
    wait_ready(&client, &b.name, "cache", READY).await;
    // A positive witness instead of a pause: a Redis applied after the
    // unwatched one, in a watched namespace, has been reconciled to Ready,
    // so the operator has acted on events newer than the unwatched Redis.
    apply_redis(&client, &a.name, "later", json!({"mode": "Standalone"})).await;
    wait_ready(&client, &a.name, "later", READY).await;
    let unwatched = redis_api(&client, &c.name).get("cache").await.expect("get");
    assert!(
        unwatched.status.is_none(),
        "a Redis outside WATCH_NAMESPACE got a status: {:?}",
        unwatched.status
    );
    let children = child_resource_versions(&client, &c.name, "cache").await;
    assert!(
        children.is_empty(),
        "a Redis outside WATCH_NAMESPACE got children: {children:?}"
    );
}

/// Without `spec.image`, the server image comes from the operator's
/// `RELATED_IMAGE_<ENGINE>_<VERSION>` variable (what OLM mirrors for a
/// disconnected cluster), and runs.
#[tokio::test]
async fn related_image_variable_sets_the_server_image() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-related", &[]).await;
    let mirrored = "docker.io/valkey/valkey:8.1";
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    opts.env
        .push(("RELATED_IMAGE_VALKEY_8_1".into(), mirrored.into()));
    let _op = start_operator(&client, opts).await;

    let (name, mut spec) = sample_spec("redpilot_v1alpha1_redis_standalone.yaml");
    spec["engine"] = json!("Valkey");
    spec["version"] = json!("8.1");
    apply_redis(&client, &ns.name, &name, spec).await;
    let redis = wait_ready(&client, &ns.name, &name, READY).await;
    let sts: StatefulSet = Api::namespaced(client.clone(), &ns.name)
        .get(&name)
        .await
        .expect("statefulset");
    let image = sts
        .spec
        .template
        .spec
        .and_then(|p| p.containers.into_iter().next())
        .and_then(|c| c.image);
    assert_eq!(image.as_deref(), Some(mirrored));
    let version = redis.status.and_then(|s| s.current_version);
    assert!(
        version.as_deref().is_some_and(|v| v.starts_with("8.1.")),
        "currentVersion {version:?}"
    );
}

/// A `RELATED_IMAGE_*` that cannot be an image stops the operator at start,
/// naming the variable (no cluster needed: it fails before connecting).
#[test]
fn unusable_related_image_variable_fails_the_start_by_name() {
    let out = std::process::Command::new(support::operator::operator_binary())
        .args([
            "run",
            "--log-format",
            "text",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env_clear()
        .env("RELATED_IMAGE_REDIS_7_0", "redis: 7.0")
        .env("KUBECONFIG", "/nonexistent")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running the operator");
    assert!(!out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("RELATED_IMAGE_REDIS_7_0") && text.contains("whitespace"),
        "{text}"
    );
}

/// The Cluster sample (the CSV's alm-example) is accepted and becomes
/// Ready: every slot served, 3 shards of a primary and a replica, a volume
/// per instance.
#[tokio::test]
async fn the_cluster_sample_becomes_ready_with_every_slot_served() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-cluster-sample", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let (name, spec) = sample_spec("redpilot_v1alpha1_redis_cluster.yaml");
    apply_redis(&client, &ns.name, &name, spec).await;
    let redis = wait_ready(&client, &ns.name, &name, READY).await;
    let status = redis.status.clone().expect("status");
    let cluster = status.cluster.clone().expect("status.cluster");
    assert_eq!(
        (
            cluster.state.as_str(),
            cluster.slots_ok,
            cluster.known_nodes
        ),
        ("ok", 16384, 6),
        "{status:?}"
    );
    assert_eq!(status.shards.len(), 3, "{status:?}");
    for shard in &status.shards {
        assert!(shard.primary.is_some(), "{shard:?}");
        assert_eq!(shard.replicas.len(), 1, "{shard:?}");
        assert_eq!(shard.ready, "2/2", "{shard:?}");
    }
    let pvcs = pvc_names(&client, &ns.name).await;
    assert_eq!(pvcs.len(), 6, "a volume per instance: {pvcs:?}");
    println!(
        "cluster sample {name}: Ready, shards {:?}, volumes {pvcs:?}",
        status
            .shards
            .iter()
            .map(|s| s.slots.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    );
}
