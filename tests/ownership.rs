//! Ownership of children, against the dev cluster with real servers:
//! - children orphaned from a deleted Redis are adopted by a new Redis of the
//!   same name without restarting any pod;
//! - a foreign object in the way is never overwritten: the Redis turns
//!   Degraded and an event names the conflict;
//! - `spec.paused` stops changes to children while status stays fresh.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, patch_redis, poke, recent_events, redis_api, redis_pods,
    start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(120);

fn standalone() -> serde_json::Value {
    json!({"mode": "Standalone", "version": "7.0", "storage": {"size": "64Mi"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_children_are_adopted_without_restart() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "own-adopt", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;

    apply_redis(&client, &ns.name, "keep", standalone()).await;
    let first = wait_ready(&client, &ns.name, "keep", READY).await;
    let pods_before = redis_pods(&client, &ns.name, "keep").await;
    let uids_before: Vec<String> = pods_before
        .values()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(uids_before.len(), 1);
    let password_before = Api::<Secret>::namespaced(client.clone(), &ns.name)
        .get("keep-auth")
        .await
        .expect("generated Secret")
        .data
        .and_then(|d| d.get("password").cloned());
    assert!(password_before.is_some());

    // Delete the Redis but orphan its children: the garbage collector strips
    // their owner references and leaves them running.
    redis_api(&client, &ns.name)
        .delete("keep", &DeleteParams::orphan())
        .await
        .expect("delete with orphan propagation");
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    wait_for(
        "the StatefulSet to lose its owner reference",
        READY,
        || async {
            let sts = sts_api.get("keep").await.ok()?;
            sts.metadata
                .owner_references
                .unwrap_or_default()
                .is_empty()
                .then_some(())
        },
    )
    .await;
    // The garbage collector strips every child before it lets the Redis go:
    // applying the new one earlier would patch the one being deleted.
    wait_for("the deleted Redis to be gone", READY, || async {
        redis_api(&client, &ns.name)
            .get_opt("keep")
            .await
            .ok()
            .and_then(|r| r.is_none().then_some(()))
    })
    .await;

    // A new Redis of the same name adopts them.
    apply_redis(&client, &ns.name, "keep", standalone()).await;
    let second = wait_ready(&client, &ns.name, "keep", READY).await;
    assert_ne!(
        first.metadata.uid, second.metadata.uid,
        "a new Redis object"
    );
    let sts = sts_api.get("keep").await.expect("statefulset");
    let owner = sts
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.controller == Some(true))
        .expect("the StatefulSet has a controller again");
    assert_eq!(
        Some(owner.uid),
        second.metadata.uid,
        "owned by the new Redis"
    );

    // The generated password Secret is adopted too, password unchanged.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let secret = wait_for("the Secret to be owned again", READY, || async {
        let s = secrets.get("keep-auth").await.ok()?;
        let owned =
            s.metadata.owner_references.iter().flatten().any(|o| {
                o.controller == Some(true) && Some(&o.uid) == second.metadata.uid.as_ref()
            });
        owned.then_some(s)
    })
    .await;
    assert_eq!(
        secret.data.and_then(|d| d.get("password").cloned()),
        password_before,
        "adoption kept the password"
    );

    let pods_after = redis_pods(&client, &ns.name, "keep").await;
    let uids_after: Vec<String> = pods_after
        .values()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(uids_before, uids_after, "adoption restarted no pod");
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(events.contains("Adopted"), "an Adopted event:\n{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_object_in_the_way_is_never_overwritten() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "own-conflict", &[]).await;
    // Someone else's Service already has the name of the read-write Service.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let foreign: Service = serde_json::from_value(json!({
        "metadata": {"name": "blocked", "labels": {"team": "payments"}},
        "spec": {"selector": {"app": "payments"}, "ports": [{"port": 80}]}
    }))
    .expect("service json");
    let created = services
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create the foreign service");

    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(&client, &ns.name, "blocked", standalone()).await;

    let api = redis_api(&client, &ns.name);
    let degraded = wait_for("the Redis to report Degraded", READY, || async {
        let r = api.get("blocked").await.ok()?;
        let status = r.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    })
    .await;
    assert!(
        degraded.message.contains("Service blocked"),
        "the condition names the conflicting object: {}",
        degraded.message
    );

    let after = services.get("blocked").await.expect("the foreign service");
    assert_eq!(
        after.resource_version(),
        created.resource_version(),
        "the foreign Service was not written"
    );
    assert_eq!(
        after.spec.and_then(|s| s.selector),
        Some([("app".to_string(), "payments".to_string())].into()),
        "its selector is untouched"
    );
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(
        events.contains("Conflict") && events.contains("Service blocked"),
        "a Conflict event names the object:\n{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_leaves_children_alone_and_keeps_status_fresh() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "own-paused", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(&client, &ns.name, "calm", standalone()).await;
    wait_ready(&client, &ns.name, "calm", READY).await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let before = cms.get("calm-config").await.expect("configmap");
    patch_redis(&client, &ns.name, "calm", json!({"spec": {"paused": true}})).await;
    patch_redis(
        &client,
        &ns.name,
        "calm",
        json!({"spec": {"config": {"maxmemory-policy": "allkeys-lfu"}}}),
    )
    .await;
    let api = redis_api(&client, &ns.name);
    let status = wait_for(
        "status to show Paused for the new generation",
        READY,
        || async {
            let r = api.get("calm").await.ok()?;
            let s = r.status.clone()?;
            (s.observed_generation == r.metadata.generation
                && s.phase.is_some_and(|p| format!("{p:?}") == "Paused"))
            .then_some(s)
        },
    )
    .await;
    assert_eq!(
        status.ready.as_deref(),
        Some("1/1"),
        "status still observes the pod"
    );
    // One more observed pass of the paused Redis (not a pause): it still
    // leaves the ConfigMap alone.
    let seen = op.counters().await.reconciles;
    poke(&client, &ns.name, "calm", 1).await;
    wait_for("a reconcile of the paused Redis", READY, || async {
        (op.counters().await.reconciles > seen).then_some(())
    })
    .await;
    let during = cms.get("calm-config").await.expect("configmap");
    assert_eq!(
        during.resource_version(),
        before.resource_version(),
        "a paused Redis does not change its ConfigMap"
    );

    patch_redis(
        &client,
        &ns.name,
        "calm",
        json!({"spec": {"paused": false}}),
    )
    .await;
    wait_ready(&client, &ns.name, "calm", READY).await;
    let after = cms.get("calm-config").await.expect("configmap");
    let conf = after
        .data
        .and_then(|d| d.get("redis.conf").cloned())
        .unwrap_or_default();
    assert!(
        conf.contains("maxmemory-policy allkeys-lfu"),
        "unpausing applies the change:\n{conf}"
    );
}

/// Secrets of a Redis's names that someone else made (an ingress
/// certificate `web-tls`, a Secret `api-server-auth`) are never taken
/// over: the Redis is Degraded naming the Secret and its owner, the
/// Secret keeps its data and gains no owner, and nothing else of the Redis
/// is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_of_a_redis_name_made_by_someone_else_are_never_taken_over() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "own-secret", &[]).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let cert = "-----BEGIN CERTIFICATE-----\nnot-ours\n-----END CERTIFICATE-----\n";
    let key = "-----BEGIN PRIVATE KEY-----\nnot-ours\n-----END PRIVATE KEY-----\n";
    let ingress: Secret = serde_json::from_value(json!({
        "metadata": {"name": "web-tls", "labels": {"team": "web"}},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert, "tls.key": key}
    }))
    .expect("secret json");
    let server_auth: Secret = serde_json::from_value(json!({
        "metadata": {"name": "api-server-auth"},
        "stringData": {"token": "someone-elses"}
    }))
    .expect("secret json");
    let mut made = Vec::new();
    for s in [ingress, server_auth] {
        made.push(
            secrets
                .create(&PostParams::default(), &s)
                .await
                .expect("create the foreign Secret"),
        );
    }
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let mut web = standalone();
    web["tls"] = json!({});
    apply_redis(&client, &ns.name, "web", web).await;
    apply_redis(&client, &ns.name, "api", standalone()).await;

    let api = redis_api(&client, &ns.name);
    for (redis, secret) in [("web", "web-tls"), ("api", "api-server-auth")] {
        let degraded = wait_for("the Redis to report Degraded", READY, || async {
            let r = api.get(redis).await.ok()?;
            r.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Degraded" && c.status == "True")
        })
        .await;
        assert_eq!(degraded.reason, "Conflict", "{degraded:?}");
        assert!(
            degraded
                .message
                .contains(&format!("Secret {secret} already exists"))
                && degraded.message.contains("no owner"),
            "the condition names the Secret and its owner: {}",
            degraded.message
        );
        println!("{redis}: {}", degraded.message);
    }
    // Let a few more passes run (each would write, if any did).
    poke(&client, &ns.name, "web", 3).await;
    poke(&client, &ns.name, "api", 3).await;
    for before in &made {
        let name = before.name_any();
        let after = secrets.get(&name).await.expect("the foreign Secret");
        assert_eq!(
            after.resource_version(),
            before.resource_version(),
            "Secret {name} was not written"
        );
        assert!(
            after
                .metadata
                .owner_references
                .unwrap_or_default()
                .is_empty(),
            "Secret {name} gained no owner"
        );
        assert_eq!(after.data, before.data, "Secret {name} keeps its data");
    }
    // Nothing else of either Redis was written.
    for name in ["web-server-auth", "web-auth", "api-auth", "api-tls"] {
        assert!(
            secrets.get_opt(name).await.expect("get").is_none(),
            "Secret {name} was not made"
        );
    }
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for redis in ["web", "api"] {
        assert!(sts.get_opt(redis).await.expect("get").is_none(), "{redis}");
        assert!(
            cms.get_opt(&format!("{redis}-config"))
                .await
                .expect("get")
                .is_none(),
            "{redis}"
        );
    }
    // Deleting the Redis leaves the Secrets as they were.
    api.delete("web", &DeleteParams::default())
        .await
        .expect("delete web");
    wait_for("web gone", READY, || async {
        api.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        secrets.get_opt("web-tls").await.expect("get").is_some(),
        "the ingress certificate outlives the Redis"
    );
}

/// `spec.image` runs only from an allowed repository: the server
/// container would hold the password and the TLS key, so an image someone
/// who may create a Redis (but not read Secrets) chose could read them.
/// Refused: Degraded naming the field, and no pod, StatefulSet or Secret of
/// the Redis exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_image_from_a_repository_not_allowed_never_reaches_a_pod() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "own-image", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let mut spec = standalone();
    spec["image"] = json!("evil.example/reads-secrets:7.0");
    spec["tls"] = json!({});
    apply_redis(&client, &ns.name, "stolen", spec).await;
    let api = redis_api(&client, &ns.name);
    let degraded = wait_for("the Redis to report Degraded", READY, || async {
        let r = api.get("stolen").await.ok()?;
        r.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    })
    .await;
    assert_eq!(degraded.reason, "ImageNotAllowed", "{degraded:?}");
    assert!(
        degraded.message.starts_with(
            "spec.image: evil.example/reads-secrets:7.0 is not from an allowed repository"
        ),
        "{}",
        degraded.message
    );
    poke(&client, &ns.name, "stolen", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        redis_pods(&client, &ns.name, "stolen").await.is_empty(),
        "no pod runs the image"
    );
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    assert!(sts.get_opt("stolen").await.expect("get").is_none());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    for name in ["stolen-auth", "stolen-server-auth", "stolen-tls"] {
        assert!(
            secrets.get_opt(name).await.expect("get").is_none(),
            "Secret {name} was not made"
        );
    }
    println!("refused: {}", degraded.message);
}
