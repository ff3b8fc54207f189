//! Issue #5: `config/rbac/` is least privilege. No wildcards; the operator's
//! ServiceAccount may do what the reconciler needs and nothing around it (the
//! apiserver's own authorizer is asked, through SubjectAccessReviews, after
//! applying the files). The other operator suites run the operator under this
//! ServiceAccount and fail on any RBAC refusal in its log.

mod support;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::Value;
use support::operator::{OPERATOR_NAMESPACE, RBAC_FILES, SERVICE_ACCOUNT, apply_rbac};
use support::{client, repo_root};

fn rbac_docs() -> Vec<(String, Value)> {
    RBAC_FILES
        .iter()
        .flat_map(|file| {
            let path = repo_root().join("config/rbac").join(file);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
                .map(|d| {
                    serde::Deserialize::deserialize(d)
                        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
                })
                .collect();
            docs.into_iter().map(|d| (file.to_string(), d))
        })
        .collect()
}

#[test]
fn rbac_files_have_no_wildcards_and_name_the_service_account() {
    let docs = rbac_docs();
    let kinds: Vec<&str> = docs
        .iter()
        .filter_map(|(_, d)| d["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding"
        ],
        "config/rbac/ holds the ServiceAccount, the ClusterRole and its binding, and the leader-election Role and binding"
    );
    for (file, doc) in &docs {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                for v in rule[field].as_array().into_iter().flatten() {
                    let v = v.as_str().unwrap_or_default();
                    assert!(!v.contains('*'), "{file}: wildcard in {field}: {rule}");
                    assert!(
                        !["escalate", "bind", "impersonate", "deletecollection"].contains(&v),
                        "{file}: {field} grants {v}: {rule}"
                    );
                }
            }
            assert!(
                rule["nonResourceURLs"].is_null(),
                "{file}: nonResourceURLs: {rule}"
            );
        }
        if let Some(subjects) = doc["subjects"].as_array() {
            assert_eq!(subjects.len(), 1, "{file}: one subject");
            assert_eq!(subjects[0]["kind"], "ServiceAccount", "{file}");
            assert_eq!(subjects[0]["name"], SERVICE_ACCOUNT, "{file}");
            assert_eq!(subjects[0]["namespace"], OPERATOR_NAMESPACE, "{file}");
        }
    }
    let sa = &docs[0].1;
    assert_eq!(sa["metadata"]["name"], SERVICE_ACCOUNT);
    assert_eq!(sa["metadata"]["namespace"], OPERATOR_NAMESPACE);
}

async fn allowed(client: &Client, ns: &str, verb: &str, group: &str, resource: &str) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!(
                "system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
            )),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{OPERATOR_NAMESPACE}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: (!ns.is_empty()).then(|| ns.to_string()),
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn the_service_account_may_do_what_the_operator_needs_and_no_more() {
    let client = client().await;
    apply_rbac(&client).await;
    let ns = "any-app-namespace";
    let must: &[(&str, &str, &str, &str)] = &[
        (ns, "watch", "redpilot.io", "redis"),
        (ns, "patch", "redpilot.io", "redis/status"),
        (ns, "update", "redpilot.io", "redis/finalizers"),
        (ns, "create", "apps", "statefulsets"),
        (ns, "patch", "apps", "statefulsets"),
        (ns, "watch", "apps", "statefulsets"),
        (ns, "patch", "", "services"),
        (ns, "patch", "", "configmaps"),
        (ns, "patch", "", "secrets"),
        (ns, "get", "", "secrets"),
        (ns, "patch", "policy", "poddisruptionbudgets"),
        (ns, "patch", "", "pods"),
        (ns, "delete", "", "pods"),
        (ns, "create", "events.k8s.io", "events"),
        (ns, "patch", "events.k8s.io", "events"),
        (OPERATOR_NAMESPACE, "get", "coordination.k8s.io", "leases"),
        (
            OPERATOR_NAMESPACE,
            "create",
            "coordination.k8s.io",
            "leases",
        ),
        (OPERATOR_NAMESPACE, "patch", "coordination.k8s.io", "leases"),
    ];
    let must_not: &[(&str, &str, &str, &str)] = &[
        (ns, "delete", "redpilot.io", "redis"),
        (ns, "create", "redpilot.io", "redis"),
        (ns, "patch", "redpilot.io", "redis"),
        (ns, "update", "apps", "statefulsets/scale"),
        (ns, "create", "", "pods"),
        (ns, "create", "", "pods/exec"),
        (ns, "get", "", "pods/log"),
        (ns, "delete", "", "persistentvolumeclaims"),
        (ns, "deletecollection", "", "secrets"),
        (ns, "create", "", "serviceaccounts/token"),
        (ns, "patch", "coordination.k8s.io", "leases"),
        (ns, "create", "apps", "deployments"),
        (ns, "create", "rbac.authorization.k8s.io", "roles"),
        (ns, "create", "rbac.authorization.k8s.io", "rolebindings"),
        ("", "list", "", "nodes"),
        ("", "delete", "", "namespaces"),
        (
            "",
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
        ),
        (
            "",
            "patch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
        ),
        (
            "",
            "create",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        ),
    ];
    let mut wrong = Vec::new();
    for &(ns, verb, group, resource) in must {
        if !allowed(&client, ns, verb, group, resource).await {
            wrong.push(format!(
                "denied but needed: {verb} {group}/{resource} in {ns:?}"
            ));
        }
    }
    for &(ns, verb, group, resource) in must_not {
        if allowed(&client, ns, verb, group, resource).await {
            wrong.push(format!(
                "allowed but not needed: {verb} {group}/{resource} in {ns:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "RBAC of {SERVICE_ACCOUNT}:\n{}",
        wrong.join("\n")
    );
}
