//! Volume growth on the dev cluster (the local node's provisioner expands
//! claims of its expandable class):
//!
//! - a Replication Redis on sized volumes (a tmpfs of the claim's size per
//!   volume, so `df` in the server's mount namespace shows it) has its
//!   `spec.storage.size` grow under a writer that
//!   counts acknowledged writes; the operator is stopped (as a crash
//!   would) right after it deleted the StatefulSet with its pods and
//!   claims orphaned; the next operator makes it anew with the new claim
//!   template. Every claim has the new capacity, no pod or claim was made
//!   anew, nothing restarted, no acknowledged write was lost. A shrink is
//!   refused at admission, naming the field.
//! - a Cluster Redis grows every claim of every shard, each shard's
//!   StatefulSet made anew, no pod made anew or restarted;
//! - on a StorageClass without `allowVolumeExpansion` the growth is
//!   refused, the event and the Degraded condition say why, and nothing
//!   else changes.
//!
//! It runs in the `operator_backup` binary, beside that suite's tests,
//! whose longest waits minutes on a schedule.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::operator::{
    OperatorOptions, SIZED_CLASS, apply_redis, connect_pod, patch_redis, pod_uids, recent_events,
    redis_api, redis_password, redis_pods, server_pid, sized_class, start_operator, wait_failpoint,
    wait_ready,
};
use crate::support::writer::{Writer, assert_everywhere};
use crate::support::{TestNamespace, client, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use redpilot::controller::redis::volumes::template_size;
use serde_json::json;

const READY: Duration = Duration::from_secs(180);

/// Claim name → (uid, requested, capacity).
async fn claims(client: &Client, ns: &str) -> BTreeMap<String, (String, String, String)> {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .expect("listing claims")
        .items
        .into_iter()
        .map(|c| {
            let size = |m: Option<
                &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
            >| {
                m.and_then(|m| m.get("storage"))
                    .map(|q| q.0.clone())
                    .unwrap_or_default()
            };
            let req = size(
                c.spec
                    .as_ref()
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.requests.as_ref()),
            );
            let cap = size(c.status.as_ref().and_then(|s| s.capacity.as_ref()));
            (
                c.metadata.name.clone().unwrap_or_default(),
                (c.metadata.uid.clone().unwrap_or_default(), req, cap),
            )
        })
        .collect()
}

/// The size of the file system each pod's server sees at `/data`
/// (`df` through the server process's own root, so inside its mount
/// namespace), in bytes.
async fn data_sizes(client: &Client, ns: &str, name: &str, pw: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for pod in redis_pods(client, ns, name).await.keys() {
        let mut n = connect_pod(client, ns, pod, pw).await.expect("connect");
        let pid = server_pid(&mut n).await;
        let df = std::process::Command::new("df")
            .args(["-B1", "--output=size"])
            .arg(format!("/proc/{pid}/root/data"))
            .output()
            .expect("df");
        let text = String::from_utf8_lossy(&df.stdout).to_string();
        let size = text
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "df of {pod}'s /data: {text} {}",
                    String::from_utf8_lossy(&df.stderr)
                )
            });
        out.insert(pod.clone(), size);
    }
    out
}

async fn restarts(client: &Client, ns: &str, name: &str) -> i32 {
    redis_pods(client, ns, name)
        .await
        .values()
        .flat_map(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default()
        })
        .map(|c| c.restart_count)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_grows_online_under_a_writer_across_an_operator_crash() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "grow-volumes", &[]).await;
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    opts.env
        .push(("REDPILOT_FAILPOINTS".into(), "volumes-orphaned".into()));
    let mut op1 = start_operator(&client, opts).await;
    sized_class(&client).await;
    apply_redis(
        &client,
        &ns.name,
        "grow",
        // Claims deleted with the Redis (whenDeleted: Delete): they carry
        // an owner reference to the StatefulSet, which the orphaning delete
        // must release, not follow.
        json!({"mode": "Replication", "instances": 2,
               "storage": {"size": "64Mi", "storageClassName": SIZED_CLASS, "retainOnDelete": false}}),
    )
    .await;
    wait_ready(&client, &ns.name, "grow", READY).await;
    let api = redis_api(&client, &ns.name);

    // A shrink is refused at admission, naming the field.
    let err = api
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"storage": {"size": "32Mi"}}})),
        )
        .await
        .expect_err("a shrink is refused");
    println!("shrink refused: {err}");
    assert!(err.to_string().contains("spec.storage.size"), "{err}");

    let pods_before = pod_uids(&client, &ns.name, "grow").await;
    let claims_before = claims(&client, &ns.name).await;
    assert_eq!(claims_before.len(), 2, "{claims_before:?}");
    let sts_api = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
    let sts_uid = sts_api
        .get("grow")
        .await
        .expect("StatefulSet")
        .metadata
        .uid
        .expect("uid");
    let password = redis_password(&client, &ns.name, "grow").await;
    let before = data_sizes(&client, &ns.name, "grow", &password).await;
    println!("df /data before: {before:?}");
    assert!(before.values().all(|&b| b == 64 << 20), "{before:?}");
    let writer = Writer::start(&client, &ns.name, "grow", &password, "g", 1);
    writer.wait_progress(200, Duration::from_secs(30)).await;

    let t0 = Instant::now();
    patch_redis(
        &client,
        &ns.name,
        "grow",
        json!({"spec": {"storage": {"size": "128Mi"}}}),
    )
    .await;
    // The first operator grows the claims, deletes the StatefulSet with
    // its pods and claims orphaned, and stops there.
    wait_failpoint(&mut op1, Duration::from_secs(120)).await;
    let stopped = t0.elapsed();
    let grown = claims(&client, &ns.name).await;
    println!(
        "operator stopped after {:.1} s; claims: {grown:?}",
        stopped.as_secs_f64()
    );
    let old_sts = sts_api.get_opt("grow").await.expect("get StatefulSet");
    assert!(
        old_sts
            .as_ref()
            .is_none_or(|s| s.metadata.uid.as_deref() != Some(&sts_uid)
                || s.metadata.deletion_timestamp.is_some()),
        "the StatefulSet was deleted before the operator stopped"
    );
    assert!(
        grown
            .values()
            .all(|(_, req, cap)| req == "128Mi" && cap == "128Mi"),
        "every claim grown before the StatefulSet went: {grown:?}"
    );
    let acked_while_down = writer.acked();

    // The next operator makes the StatefulSet anew; its pods and claims
    // are adopted.
    let _op2 = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let sts = wait_for(
        "the StatefulSet made anew with the grown claim template",
        Duration::from_secs(120),
        || async {
            let s = sts_api.get_opt("grow").await.ok()??;
            (s.metadata.uid.as_deref() != Some(&sts_uid)
                && s.metadata.deletion_timestamp.is_none()
                && template_size(&s).is_some_and(|q| q.0 == "128Mi"))
            .then_some(s)
        },
    )
    .await;
    let r = wait_ready(&client, &ns.name, "grow", READY).await;
    println!(
        "grown: StatefulSet made anew {:.1} s after the change; Ready (generation {:?})",
        t0.elapsed().as_secs_f64(),
        r.status.as_ref().and_then(|s| s.observed_generation)
    );
    writer
        .wait_progress(acked_while_down + 100, Duration::from_secs(30))
        .await;
    let tally = writer.stop().await;

    let after = data_sizes(&client, &ns.name, "grow", &password).await;
    println!("df /data after: {after:?}");
    assert!(
        after.values().all(|&b| b == 128 << 20),
        "each server sees the grown file system: {after:?}"
    );
    let pods_after = pod_uids(&client, &ns.name, "grow").await;
    assert_eq!(pods_after, pods_before, "no pod was made anew");
    assert_eq!(
        restarts(&client, &ns.name, "grow").await,
        0,
        "nothing restarted"
    );
    let claims_after = claims(&client, &ns.name).await;
    for (name, (uid, req, cap)) in &claims_after {
        assert_eq!(
            Some(uid),
            claims_before.get(name).map(|c| &c.0),
            "claim {name} kept (not made anew)"
        );
        assert_eq!((req.as_str(), cap.as_str()), ("128Mi", "128Mi"), "{name}");
    }
    // The pods belong to the new StatefulSet.
    let new_uid = sts.metadata.uid.clone().expect("uid");
    for (name, pod) in redis_pods(&client, &ns.name, "grow").await {
        let owner = pod
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid);
        assert_eq!(owner.as_deref(), Some(new_uid.as_str()), "{name} adopted");
    }
    // The claims are the new StatefulSet's again (whenDeleted: Delete
    // still holds for them).
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let owned = wait_for(
        "the claims owned by the new StatefulSet",
        Duration::from_secs(30),
        || async {
            let list = pvcs.list(&Default::default()).await.ok()?.items;
            list.iter()
                .all(|c| {
                    c.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == new_uid)
                })
                .then_some(list.len())
        },
    )
    .await;
    assert_eq!(owned, 2);
    let events = recent_events(&client, &ns.name, 60).await;
    for reason in ["VolumeGrowth", "VolumesGrown"] {
        assert!(events.contains(reason), "{reason}: {events}");
    }
    println!(
        "writer: {} acknowledged, {} unreplicated, {} failed",
        tally.acked.len(),
        tally.unreplicated,
        tally.failed
    );
    assert_everywhere(&client, &ns.name, "grow", 2, &password, &tally.acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_without_expansion_refuses_the_growth_and_says_why() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "grow-refused", &[]).await;
    let class = format!("fixed-{}", ns.name);
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": class},
        "provisioner": "localnode.redpilot.io/hostpath",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": false,
    }))
    .expect("StorageClass");
    classes
        .create(&PostParams::default(), &sc)
        .await
        .expect("creating a StorageClass without expansion");
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "fixed",
        json!({"mode": "Standalone", "storage": {"size": "64Mi", "storageClassName": class}}),
    )
    .await;
    wait_ready(&client, &ns.name, "fixed", READY).await;
    let pods_before = pod_uids(&client, &ns.name, "fixed").await;
    patch_redis(
        &client,
        &ns.name,
        "fixed",
        json!({"spec": {"storage": {"size": "128Mi"}}}),
    )
    .await;
    let api = redis_api(&client, &ns.name);
    let degraded = wait_for(
        "the refusal in the Degraded condition",
        Duration::from_secs(60),
        || async {
            let r = api.get("fixed").await.ok()?;
            r.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Degraded" && c.status == "True")
                .filter(|c| c.message.contains("spec.storage.size"))
                .map(|c| c.message)
        },
    )
    .await;
    println!("degraded: {degraded}");
    let events = recent_events(&client, &ns.name, 30).await;
    assert!(events.contains("VolumeGrowthRefused"), "{events}");
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("fixed")
        .await
        .expect("StatefulSet");
    assert_eq!(
        template_size(&sts).map(|q| q.0),
        Some("64Mi".to_string()),
        "the StatefulSet keeps its claim template"
    );
    let c = claims(&client, &ns.name).await;
    assert!(
        c.values()
            .all(|(_, req, cap)| req == "64Mi" && cap == "64Mi"),
        "{c:?}"
    );
    assert_eq!(pod_uids(&client, &ns.name, "fixed").await, pods_before);
    // The claims go with the namespace; the class goes now.
    let _ = classes.delete(&class, &DeleteParams::default()).await;
}

/// Cluster mode grows shard by shard the same way: every claim of every
/// shard, each shard's StatefulSet made anew, no pod made anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_grows_the_volumes_of_every_shard() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "grow-cluster", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    sized_class(&client).await;
    apply_redis(
        &client,
        &ns.name,
        "shop",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1",
               "storage": {"size": "64Mi", "storageClassName": SIZED_CLASS}}),
    )
    .await;
    wait_ready(&client, &ns.name, "shop", READY).await;
    let password = redis_password(&client, &ns.name, "shop").await;
    let pods_before = pod_uids(&client, &ns.name, "shop").await;
    assert_eq!(pods_before.len(), 6);
    let sts_api = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
    let sts_uids = |all: &[StatefulSet]| -> std::collections::BTreeMap<String, String> {
        all.iter()
            .filter_map(|s| Some((s.metadata.name.clone()?, s.metadata.uid.clone()?)))
            .collect()
    };
    let sts_before = sts_uids(&sts_api.list(&Default::default()).await.expect("list").items);
    assert_eq!(sts_before.len(), 3, "{sts_before:?}");
    let t0 = Instant::now();
    patch_redis(
        &client,
        &ns.name,
        "shop",
        json!({"spec": {"storage": {"size": "96Mi"}}}),
    )
    .await;
    // A claim template cannot be changed in place: each shard's StatefulSet
    // is deleted (its pods orphaned, kept running) and made anew — a new
    // UID under the same name.
    let sts_after = wait_for(
        "every shard's StatefulSet made anew with 96Mi claims",
        Duration::from_secs(120),
        || async {
            let all = sts_api.list(&Default::default()).await.ok()?.items;
            (all.len() == 3
                && all.iter().all(|s| {
                    s.metadata.deletion_timestamp.is_none()
                        && template_size(s).is_some_and(|q| q.0 == "96Mi")
                }))
            .then(|| sts_uids(&all))
        },
    )
    .await;
    assert_eq!(
        sts_after.keys().collect::<Vec<_>>(),
        sts_before.keys().collect::<Vec<_>>()
    );
    for (name, uid) in &sts_after {
        assert_ne!(
            Some(uid),
            sts_before.get(name),
            "StatefulSet {name} was not made anew"
        );
    }
    wait_ready(&client, &ns.name, "shop", READY).await;
    println!(
        "cluster grown: 3 shards in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let c = claims(&client, &ns.name).await;
    assert_eq!(c.len(), 6, "{c:?}");
    assert!(
        c.values()
            .all(|(_, req, cap)| req == "96Mi" && cap == "96Mi"),
        "{c:?}"
    );
    let sizes = data_sizes(&client, &ns.name, "shop", &password).await;
    println!("df /data: {sizes:?}");
    assert!(sizes.values().all(|&b| b == 96 << 20), "{sizes:?}");
    assert_eq!(pod_uids(&client, &ns.name, "shop").await, pods_before);
    assert_eq!(restarts(&client, &ns.name, "shop").await, 0);
}

/// A claim kept after a scale-down (`retainOnDelete`: the StatefulSet keeps
/// the claims of removed ordinals) grows with the others: a Replication
/// Redis of 3 instances scaled to 2, `spec.storage.size` grown from 64Mi to
/// 96Mi, then scaled back to 3. The third pod binds its old claim again,
/// which must have the new size: the operator grows every claim of the
/// StatefulSet, not only those of the pods that run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_kept_after_a_scale_down_grows_with_the_others() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "grow-kept", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    sized_class(&client).await;
    let spec = |instances: u32, size: &str| {
        json!({"mode": "Replication", "instances": instances,
               "storage": {"size": size, "storageClassName": SIZED_CLASS, "retainOnDelete": true}})
    };
    apply_redis(&client, &ns.name, "kept", spec(3, "64Mi")).await;
    wait_ready(&client, &ns.name, "kept", READY).await;
    let third = "data-kept-2";
    apply_redis(&client, &ns.name, "kept", spec(2, "64Mi")).await;
    wait_for(
        "two pods, the third's claim kept",
        Duration::from_secs(120),
        || async {
            let pods = redis_pods(&client, &ns.name, "kept").await;
            let c = claims(&client, &ns.name).await;
            (pods.len() == 2 && c.contains_key(third)).then_some(())
        },
    )
    .await;
    wait_ready(&client, &ns.name, "kept", READY).await;
    let t0 = Instant::now();
    apply_redis(&client, &ns.name, "kept", spec(2, "96Mi")).await;
    let sts_api = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
    wait_for(
        "the StatefulSet made anew with 96Mi claims",
        Duration::from_secs(120),
        || async {
            let s = sts_api.get_opt("kept").await.ok()??;
            (s.metadata.deletion_timestamp.is_none()
                && template_size(&s).is_some_and(|q| q.0 == "96Mi"))
            .then_some(())
        },
    )
    .await;
    wait_ready(&client, &ns.name, "kept", READY).await;
    println!("grown in {:.1} s", t0.elapsed().as_secs_f64());
    let c = claims(&client, &ns.name).await;
    println!("claims: {c:?}");
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(
        c.values()
            .all(|(_, req, cap)| req == "96Mi" && cap == "96Mi"),
        "every claim grown, the kept one too: {c:?}"
    );
    apply_redis(&client, &ns.name, "kept", spec(3, "96Mi")).await;
    wait_for("three pods", Duration::from_secs(120), || async {
        (redis_pods(&client, &ns.name, "kept").await.len() == 3).then_some(())
    })
    .await;
    wait_ready(&client, &ns.name, "kept", READY).await;
    let password = redis_password(&client, &ns.name, "kept").await;
    let sizes = data_sizes(&client, &ns.name, "kept", &password).await;
    println!("df /data after the scale-up: {sizes:?}");
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert!(
        sizes.values().all(|&b| b == 96 << 20),
        "the third pod bound a volume of the old size: {sizes:?}"
    );
    assert_eq!(
        claims(&client, &ns.name)
            .await
            .get(third)
            .map(|c| c.0.clone()),
        c.get(third).map(|c| c.0.clone()),
        "the kept claim is bound again, not made anew"
    );
}
