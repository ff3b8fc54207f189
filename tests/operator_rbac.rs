//! Issue #5: `config/rbac/` is least privilege. No wildcards; the operator's
//! ServiceAccount may do what the reconciler needs and nothing around it (the
//! apiserver's own authorizer is asked, through SubjectAccessReviews, after
//! applying the files). The other operator suites run the operator under this
//! ServiceAccount and fail on any RBAC refusal in its log.
//!
//! Issue #10: nothing is granted cluster-wide. The ClusterRole is bound by a
//! RoleBinding per watched namespace, so the operator cannot read Secrets (or
//! anything else) in a namespace it does not watch.
//!
//! Issue #26: even where it watches, the operator may not list or watch
//! Secrets; it reads the ones it uses by name.

mod support;

use serde_json::Value;
use support::operator::{
    OPERATOR_NAMESPACE, RBAC_FILES, SERVICE_ACCOUNT, apply_rbac, bind_watched_namespaces,
    operator_may,
};
use support::{TestNamespace, client, repo_root};

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
            "RoleBinding",
            "Role",
            "RoleBinding"
        ],
        "config/rbac/ holds the ServiceAccount, the ClusterRole and the RoleBinding that grants it \
         per namespace, and the leader-election Role and binding (no ClusterRoleBinding: nothing \
         is granted cluster-wide)"
    );
    // The ClusterRole is a template of namespaced rules: role_binding.yaml
    // grants it in one namespace, as a RoleBinding.
    let (_, binding) = docs
        .iter()
        .find(|(f, _)| f == "role_binding.yaml")
        .expect("config/rbac/role_binding.yaml");
    let (_, cluster_role) = docs
        .iter()
        .find(|(_, d)| d["kind"] == "ClusterRole")
        .expect("a ClusterRole");
    assert_eq!(binding["kind"], "RoleBinding", "role_binding.yaml");
    assert_eq!(
        binding["roleRef"]["kind"], "ClusterRole",
        "role_binding.yaml"
    );
    assert_eq!(
        binding["roleRef"]["name"], cluster_role["metadata"]["name"],
        "role_binding.yaml binds the ClusterRole of role.yaml"
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

#[tokio::test]
async fn the_service_account_may_do_what_the_operator_needs_and_no_more() {
    let client = client().await;
    apply_rbac(&client).await;
    // A namespace the operator watches (bound as role_binding.yaml says) and
    // one it does not.
    let watched = TestNamespace::new(&client, "rbac-watched", &[]).await;
    bind_watched_namespaces(&client, std::slice::from_ref(&watched.name)).await;
    let ns = watched.name.as_str();
    let other = "any-other-namespace";
    let must: &[(&str, &str, &str, &str)] = &[
        (ns, "watch", "redpilot.io", "redis"),
        // A Redis bootstrapped from a RedisBackup gets the fields it left
        // unset from the backup (server-side apply of those fields).
        (ns, "patch", "redpilot.io", "redis"),
        (ns, "patch", "redpilot.io", "redis/status"),
        (ns, "update", "redpilot.io", "redis/finalizers"),
        (ns, "create", "apps", "statefulsets"),
        (ns, "patch", "apps", "statefulsets"),
        (ns, "watch", "apps", "statefulsets"),
        (ns, "delete", "apps", "statefulsets"),
        (ns, "patch", "", "services"),
        (ns, "patch", "", "configmaps"),
        (ns, "patch", "", "secrets"),
        (ns, "get", "", "secrets"),
        (ns, "create", "", "secrets"),
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
        // Replacing a user's spec wholesale; the operator only applies the
        // fields a backup-bootstrapped Redis left unset (patch, above).
        (ns, "update", "redpilot.io", "redis"),
        (ns, "update", "apps", "statefulsets/scale"),
        (ns, "create", "", "pods"),
        (ns, "create", "", "pods/exec"),
        (ns, "get", "", "pods/log"),
        (ns, "delete", "", "persistentvolumeclaims"),
        (ns, "deletecollection", "", "secrets"),
        // Secrets are read one by one by name: listing or watching them
        // would hand the operator every Secret of a watched namespace.
        (ns, "list", "", "secrets"),
        (ns, "watch", "", "secrets"),
        (ns, "create", "", "serviceaccounts/token"),
        (ns, "patch", "coordination.k8s.io", "leases"),
        (ns, "create", "apps", "deployments"),
        (ns, "create", "rbac.authorization.k8s.io", "roles"),
        (ns, "create", "rbac.authorization.k8s.io", "rolebindings"),
        // Issue #10: nothing outside the watched namespaces, and nothing
        // cluster-wide; above all no Secret.
        (other, "get", "", "secrets"),
        (other, "list", "", "secrets"),
        (other, "watch", "", "secrets"),
        (other, "patch", "", "secrets"),
        (other, "list", "", "configmaps"),
        (other, "list", "", "pods"),
        (other, "delete", "", "pods"),
        (other, "watch", "redpilot.io", "redis"),
        (other, "create", "events.k8s.io", "events"),
        ("", "get", "", "secrets"),
        ("", "list", "", "secrets"),
        ("", "watch", "", "secrets"),
        ("", "list", "redpilot.io", "redis"),
        ("", "list", "apps", "statefulsets"),
        ("", "list", "", "pods"),
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
        if !operator_may(&client, ns, verb, group, resource).await {
            wrong.push(format!(
                "denied but needed: {verb} {group}/{resource} in {ns:?}"
            ));
        }
    }
    for &(ns, verb, group, resource) in must_not {
        if operator_may(&client, ns, verb, group, resource).await {
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
