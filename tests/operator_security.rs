//! Security on the dev cluster: the opt-in NetworkPolicy
//! (`spec.networkPolicy`).
//!
//! The local node does not enforce NetworkPolicies, so the test checks the
//! object the operator keeps (its selector, peers and ports), that the API
//! server's own validation accepts it (a server-side dry-run, which refuses
//! a broken copy), that it is put back after a hand edit, that a policy the
//! API server refuses is reported as Degraded naming it, and that removing
//! the field removes the policy.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::operator::{
    OperatorOptions, apply_redis, kubectl, poke, redis_api, start_operator, wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);
/// The namespace the test operators run in (its Lease lives there).
const OPERATOR_NAMESPACE: &str = "redpilot-system";

/// A server-side dry-run create of `obj` (renamed `name`); the output.
fn dry_run(ns: &str, name: &str, obj: &NetworkPolicy) -> std::process::Output {
    let mut v = serde_json::to_value(obj).expect("json");
    v["metadata"] = json!({"name": name, "namespace": ns});
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), v.to_string()).expect("write");
    let path = file.path().to_string_lossy().to_string();
    kubectl(&["create", "--dry-run=server", "-o", "name", "-f", &path])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_network_policy_is_kept_as_asked_and_removed_with_the_field() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "netpol", &[]).await;
    let ns = tns.name.as_str();
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    let web = json!({"podSelector": {"matchLabels": {"app": "web"}}});
    let api_pods = json!({"namespaceSelector": {"matchLabels": {"team": "payments"}},
                          "podSelector": {"matchLabels": {"app": "api"}}});
    let prometheus = json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}});
    let spec = json!({"mode": "Replication", "instances": 2,
        "networkPolicy": {"clients": [web, api_pods], "metrics": [prometheus]}});
    apply_redis(&client, ns, "np", spec.clone()).await;
    let redis = wait_ready(&client, ns, "np", READY).await;

    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let np = wait_for("the NetworkPolicy", Duration::from_secs(30), || async {
        policies.get_opt("np").await.ok().flatten()
    })
    .await;
    let owner = np
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .cloned();
    assert_eq!(owner.map(|o| o.uid), redis.uid(), "controlled by the Redis");
    let sts: StatefulSet = Api::namespaced(client.clone(), ns)
        .get("np")
        .await
        .expect("sts");
    let v = serde_json::to_value(&np).expect("json");
    assert_eq!(
        v["spec"]["podSelector"]["matchLabels"],
        serde_json::to_value(&sts.spec.selector.match_labels).expect("labels"),
        "it selects the Redis's pods"
    );
    assert_eq!(v["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = v["spec"]["ingress"].as_array().cloned().expect("rules");
    println!(
        "ingress: {}",
        serde_json::to_string(&rules).unwrap_or_default()
    );
    assert_eq!(rules.len(), 3);
    let port = |r: &Value| {
        r["ports"]
            .as_array()
            .map(|p| p.iter().map(|x| x["port"].clone()).collect::<Vec<_>>())
    };
    assert_eq!(
        port(&rules[0]),
        Some(vec![json!(6379)]),
        "replication between its pods"
    );
    assert_eq!(rules[0]["from"][0]["podSelector"], v["spec"]["podSelector"]);
    assert_eq!(port(&rules[1]), Some(vec![json!(6379)]), "the client port");
    assert_eq!(
        rules[1]["from"],
        json!([
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}}},
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "redpilot-backup"}}},
            web, api_pods
        ])
    );
    assert_eq!(port(&rules[2]), Some(vec![json!(9121)]), "the metrics port");
    assert_eq!(rules[2]["from"], json!([prometheus]));

    // The API server's validation accepts it; it would refuse a broken one.
    let out = dry_run(ns, "np-copy", &np);
    assert!(
        out.status.success(),
        "dry-run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        policies.get_opt("np-copy").await.expect("get").is_none(),
        "a dry-run creates nothing"
    );
    let mut broken = np.clone();
    if let Some(s) = broken.spec.as_mut() {
        s.policy_types = Some(vec!["Sideways".into()]);
    }
    let out = dry_run(ns, "np-broken", &broken);
    assert!(!out.status.success(), "a broken policy is refused");
    println!(
        "dry-run refuses a broken copy: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );

    // Reconciling again writes nothing.
    let rv = np.resource_version();
    poke(&client, ns, "np", 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let again = policies.get("np").await.expect("get");
    assert_eq!(
        again.resource_version(),
        rv,
        "a pass with nothing changed writes nothing"
    );

    // A hand edit that opens it up is put back on the next pass.
    policies
        .patch(
            "np",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingress": [{}]}})),
        )
        .await
        .expect("hand edit");
    poke(&client, ns, "np", 2).await;
    wait_for(
        "the hand edit to be undone",
        Duration::from_secs(60),
        || async {
            let p = policies.get("np").await.ok()?;
            let v = serde_json::to_value(&p).ok()?;
            (v["spec"]["ingress"].as_array()?.len() == 3 && v["spec"]["ingress"] == json!(rules))
                .then_some(())
        },
    )
    .await;

    // A peer the API server refuses: Degraded, naming the policy.
    let mut bad = spec.clone();
    bad["networkPolicy"]["clients"] = json!([{"ipBlock": {"cidr": "10.0.0.0/99"}}]);
    apply_redis(&client, ns, "np", bad).await;
    let cond = wait_for(
        "Degraded naming the NetworkPolicy",
        Duration::from_secs(60),
        || async {
            let r = redis_api(&client, ns).get("np").await.ok()?;
            r.status?.conditions.into_iter().find(|c| {
                c.type_ == "Degraded"
                    && c.status == "True"
                    && c.message.contains("NetworkPolicy np was refused")
            })
        },
    )
    .await;
    println!("refused: {}: {}", cond.reason, cond.message);
    apply_redis(&client, ns, "np", spec.clone()).await;
    wait_ready(&client, ns, "np", READY).await;

    // Without the field, the policy goes.
    let mut off = spec;
    off.as_object_mut().map(|o| o.remove("networkPolicy"));
    apply_redis(&client, ns, "np", off).await;
    wait_for(
        "the NetworkPolicy to be removed",
        Duration::from_secs(60),
        || async { policies.get_opt("np").await.ok()?.is_none().then_some(()) },
    )
    .await;
    wait_ready(&client, ns, "np", READY).await;
}
