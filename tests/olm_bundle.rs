//! The OLM bundle (bundle/, bundle.Dockerfile): generated from the repository
//! without drift, valid for operator-sdk's operatorframework suite, passing
//! the scorecard's basic and olm suites, and saying what the repository says
//! (permissions = config/rbac/, alm-examples = config/samples/, owned CRD =
//! crds/, descriptors for the CRD's fields), with nothing granted
//! cluster-wide (no clusterPermissions, above all not on Secrets).

mod olm_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use olm_common::*;
use serde_json::{Value, json};

/// `make bundle` for the checked-in version, into a scratch directory, gives
/// exactly the checked-in bundle/ and bundle.Dockerfile.
#[test]
fn checked_in_bundle_matches_generation() {
    let version = bundle_version();
    let created = std::fs::read_to_string(root().join("config/manifests/created-at"))
        .expect("reading config/manifests/created-at");
    assert!(
        created
            .lines()
            .any(|l| l.split_whitespace().next() == Some(version.as_str())),
        "config/manifests/created-at has no line for the bundle's version {version}"
    );
    tool("operator-sdk");
    let tmp = tempfile::tempdir().expect("tempdir");
    let out_dir = tmp.path().join("bundle");
    let dockerfile = tmp.path().join("bundle.Dockerfile");
    run_ok(
        Command::new("bash")
            .arg(root().join("hack/bundle.sh"))
            .arg(&version)
            .env("BUNDLE_DIR", &out_dir)
            .env("BUNDLE_DOCKERFILE", &dockerfile)
            .env_remove("CREATED_AT")
            .env_remove("IMAGE_REPO")
            .env_remove("CHANNELS")
            .env_remove("DEFAULT_CHANNEL")
            .current_dir(root()),
    );
    assert_same_tree(
        &tree(&root().join("bundle")),
        &tree(&out_dir),
        "bundle/",
        "make bundle",
    );
    let generated = std::fs::read_to_string(&dockerfile)
        .expect("reading the generated bundle.Dockerfile")
        .replace(&format!("{}/", out_dir.display()), "bundle/");
    let checked_in = std::fs::read_to_string(root().join("bundle.Dockerfile"))
        .expect("reading bundle.Dockerfile");
    assert_eq!(
        checked_in, generated,
        "bundle.Dockerfile drifted from what `make bundle` writes; run `make bundle`"
    );
    println!("bundle: redpilot.v{version} regenerated identically");
}

/// `operator-sdk bundle validate ./bundle --select-optional
/// suite=operatorframework`: no errors and no warnings.
#[test]
fn bundle_validate_operatorframework_suite() {
    let sdk = tool("operator-sdk");
    let args = [
        "bundle",
        "validate",
        "./bundle",
        "--select-optional",
        "suite=operatorframework",
    ];
    // The human-readable run, for its summary line.
    let text = run(Command::new(&sdk).args(args).current_dir(root()));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&text.stdout),
        String::from_utf8_lossy(&text.stderr)
    );
    let summary = all
        .lines()
        .rev()
        .find(|l| l.contains("validation tests have completed") || l.contains("level=error"))
        .unwrap_or("(no summary line)");
    println!("operator-sdk bundle validate: {summary}");
    assert!(
        text.status.success(),
        "operator-sdk bundle validate failed:\n{all}"
    );

    // The machine-readable run, to count errors and warnings exactly.
    let json_out = run_ok(
        Command::new(&sdk)
            .args(args)
            .args(["-o", "json-alpha1"])
            .current_dir(root()),
    );
    let start = json_out
        .find('{')
        .expect("no JSON in operator-sdk's output");
    let report: Value = serde_json::from_str(&json_out[start..])
        .unwrap_or_else(|e| panic!("parsing operator-sdk's JSON: {e}\n{json_out}"));
    let outputs = report["outputs"].as_array().cloned().unwrap_or_default();
    let of = |kind: &str| -> Vec<String> {
        outputs
            .iter()
            .filter(|o| o["type"] == kind)
            .map(|o| o["message"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let (errors, warnings) = (of("error"), of("warning"));
    println!(
        "operator-sdk bundle validate: passed={} errors={} warnings={}",
        report["passed"],
        errors.len(),
        warnings.len()
    );
    for w in &warnings {
        println!("  warning: {w}");
    }
    assert_eq!(report["passed"], json!(true), "validation did not pass");
    assert!(
        errors.is_empty(),
        "validation errors:\n{}",
        errors.join("\n")
    );

    // tools/operator-sdk pins operator-framework/api v0.43, which no longer
    // reports RBAC rules on events.k8s.io/events as a removed API.
    assert!(
        warnings.is_empty(),
        "validation warnings (aim: none):\n{}",
        warnings.join("\n")
    );
}

/// The six tests of the scorecard's basic and olm suites, run with the
/// scorecard-test binary against the bundle. The binary reads the bundle from
/// /bundle (where the scorecard pod mounts it), so each test runs in a chroot
/// holding the binary (static) and a copy of bundle/. Every result must be
/// "pass"; the binary exits 0 on a failed test, so its JSON is what counts.
#[test]
fn scorecard_basic_and_olm_suites_pass() {
    let bin = tool("scorecard-test");
    let config = yaml_doc(&root().join("bundle/tests/scorecard/config.yaml"));
    let mut tests: Vec<(String, String)> = Vec::new();
    for stage in config["stages"]
        .as_array()
        .expect("scorecard config has no stages")
    {
        for t in stage["tests"].as_array().expect("a stage without tests") {
            let entry = t["entrypoint"]
                .as_array()
                .expect("a test without entrypoint");
            if t["labels"]["suite"] == "redpilot" {
                // Redpilot's own suite needs a cluster: tests/olm_scorecard.rs.
                continue;
            }
            assert_eq!(
                entry[0], "scorecard-test",
                "unexpected entrypoint {entry:?}"
            );
            tests.push((
                entry[1].as_str().unwrap_or_default().to_string(),
                t["labels"]["suite"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
    }
    let names: BTreeSet<&str> = tests.iter().map(|(n, _)| n.as_str()).collect();
    let expected: BTreeSet<&str> = SCORECARD_TESTS.into();
    assert_eq!(
        names, expected,
        "the scorecard config should run the basic and olm suites"
    );

    let jail = tempfile::tempdir().expect("tempdir");
    copy_dir(&root().join("bundle"), &jail.path().join("bundle"));
    std::fs::copy(&bin, jail.path().join("scorecard-test")).expect("copying scorecard-test");

    let mut failures = Vec::new();
    for (name, suite) in &tests {
        let out = run(Command::new("chroot")
            .arg(jail.path())
            .args(["/scorecard-test", name]));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let status: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "scorecard-test {name} printed no JSON ({e}; needs root for chroot):\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let results = status["results"].as_array().cloned().unwrap_or_default();
        assert!(!results.is_empty(), "scorecard-test {name} gave no result");
        for r in results {
            let state = r["state"].as_str().unwrap_or("?");
            println!(
                "scorecard {suite}/{}: {state}",
                r["name"].as_str().unwrap_or(name)
            );
            for s in r["suggestions"].as_array().into_iter().flatten() {
                println!("  suggestion: {}", s.as_str().unwrap_or_default());
            }
            if state != "pass" {
                failures.push(format!("{name}: {state}: {}", r["errors"]));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "scorecard tests failed:\n{}",
        failures.join("\n")
    );
    println!("scorecard: {} of {} tests pass", tests.len(), tests.len());
}

/// Rules of the Roles (or ClusterRoles) bound to a ServiceAccount by the
/// RoleBindings (or ClusterRoleBindings) of config/rbac/, in binding order.
fn bound_rules(objects: &[Value], binding_kind: &str, role_kind: &str, sa: &str) -> Vec<Value> {
    let mut rules = Vec::new();
    for b in objects.iter().filter(|o| o["kind"] == binding_kind) {
        let binds_sa = b["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa);
        if !binds_sa || b["roleRef"]["kind"] != role_kind {
            continue;
        }
        let role = objects
            .iter()
            .find(|o| o["kind"] == role_kind && o["metadata"]["name"] == b["roleRef"]["name"])
            .unwrap_or_else(|| {
                panic!(
                    "{binding_kind} {} names a missing {role_kind}",
                    b["metadata"]["name"]
                )
            });
        rules.extend(role["rules"].as_array().cloned().unwrap_or_default());
    }
    rules
}

fn permissions(csv: &Value, field: &str) -> BTreeMap<String, Vec<Value>> {
    csv["spec"]["install"]["spec"][field]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["serviceAccountName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["rules"].as_array().cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// The CSV's permissions and clusterPermissions are exactly the rules that
/// config/rbac/ binds to the operator's ServiceAccount.
#[test]
fn csv_permissions_are_config_rbac() {
    let csv = bundle_csv();
    let objects: Vec<Value> = yaml_files(&root().join("config/rbac"))
        .iter()
        .flat_map(|f| yaml_docs(f))
        .collect();
    let sa = objects
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("config/rbac/ has no ServiceAccount")
        .to_string();
    let cluster = bound_rules(&objects, "ClusterRoleBinding", "ClusterRole", &sa);
    let mut namespaced = bound_rules(&objects, "RoleBinding", "Role", &sa);
    namespaced.extend(bound_rules(&objects, "RoleBinding", "ClusterRole", &sa));
    assert!(
        cluster.is_empty(),
        "config/rbac/ binds a ClusterRole to {sa} cluster-wide (a ClusterRoleBinding): \
         its rules are namespaced and must be bound per namespace"
    );
    assert!(
        !namespaced.is_empty(),
        "config/rbac/ binds no Role or ClusterRole to {sa} with a RoleBinding"
    );

    let expected = |rules: Vec<Value>| -> BTreeMap<String, Vec<Value>> {
        if rules.is_empty() {
            BTreeMap::new()
        } else {
            BTreeMap::from([(sa.clone(), rules)])
        }
    };
    assert_eq!(
        permissions(&csv, "clusterPermissions"),
        expected(cluster),
        "the CSV's clusterPermissions differ from config/rbac/: run `make bundle`"
    );
    assert_eq!(
        permissions(&csv, "permissions"),
        expected(namespaced),
        "the CSV's permissions differ from config/rbac/: run `make bundle`"
    );
    let deployment = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"];
    assert_eq!(
        deployment["template"]["spec"]["serviceAccountName"],
        json!(sa),
        "the Deployment must run as config/rbac/'s ServiceAccount"
    );
}

/// Issue #10: the CSV grants nothing cluster-wide; the operator's rules
/// (Secrets included) are `permissions`, which OLM scopes to the
/// OperatorGroup's target namespaces.
#[test]
fn csv_grants_nothing_cluster_wide() {
    let csv = bundle_csv();
    assert_least_privilege(&csv, "bundle/manifests/redpilot.clusterserviceversion.yaml");
    assert!(
        csv["spec"]["install"]["spec"]["clusterPermissions"].is_null(),
        "the CSV should have no clusterPermissions field at all"
    );
}

/// alm-examples are the samples of config/samples/, and the owned CRD in the
/// bundle is crds/ as the operator generates it (read as YAML 1.2, like the
/// operator does: this catches values that other YAML readers take for
/// booleans or numbers).
#[test]
fn csv_examples_and_crd_are_the_repositorys() {
    let csv = bundle_csv();
    let examples: Vec<Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .expect("no alm-examples annotation"),
    )
    .expect("alm-examples is not JSON");
    let samples: Vec<Value> = yaml_files(&root().join("config/samples"))
        .iter()
        .flat_map(|f| yaml_docs(f))
        .collect();
    assert!(!samples.is_empty(), "config/samples/ holds no sample");
    let key = |v: &Value| format!("{}/{}", v["kind"], v["metadata"]["name"]);
    let by_key = |vs: &[Value]| -> BTreeMap<String, Value> {
        vs.iter().map(|v| (key(v), v.clone())).collect()
    };
    assert_eq!(
        by_key(&examples),
        by_key(&samples),
        "alm-examples differ from config/samples/: run `make bundle`"
    );

    let source = yaml_docs(&root().join("crds/redis.yaml"));
    let owned = csv["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        owned.len(),
        source.len(),
        "the CSV should own every CRD of crds/redis.yaml"
    );
    for crd in &source {
        let name = crd["metadata"]["name"]
            .as_str()
            .expect("a CRD without name");
        let bundled =
            yaml_doc(&root().join(format!("bundle/manifests/{}.yaml", bundle_file(name))));
        if let Some(path) = first_difference(&crd["spec"], &bundled["spec"], "spec") {
            panic!(
                "the bundle's CRD {name} differs from crds/redis.yaml at {path}; \
                 if crds/ holds values such as Off/On/Yes/No unquoted, YAML 1.1 readers \
                 (operator-sdk, kubectl, OLM) read them as booleans: they must be quoted. \
                 Otherwise run `make bundle`."
            );
        }
        let o = owned
            .iter()
            .find(|o| o["name"] == crd["metadata"]["name"])
            .unwrap_or_else(|| panic!("the CSV does not own {name}"));
        assert!(
            o["description"].as_str().is_some_and(|d| d.len() > 20),
            "the owned CRD {name} needs a description"
        );
    }
}

/// `redis.redpilot.io` → `redpilot.io_redis` (operator-sdk's file name).
fn bundle_file(crd: &str) -> String {
    match crd.split_once('.') {
        Some((plural, group)) => format!("{group}_{plural}"),
        None => crd.to_string(),
    }
}

fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(va), Some(vb)) => first_difference(va, vb, &format!("{path}.{k}")),
                (va, vb) => Some(format!("{path}.{k} ({va:?} vs {vb:?})")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (va, vb))| first_difference(va, vb, &format!("{path}[{i}]"))),
        // 15.0 and 15 are the same JSON number.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{path} ({a} vs {b})")),
    }
}

/// Every top-level field of the CRD's spec has a spec descriptor, the key
/// status fields have status descriptors, every descriptor names a field that
/// exists, and every descriptor carries x-descriptors for a console.
#[test]
fn csv_descriptors_cover_the_crd() {
    let csv = bundle_csv();
    let owned_all = csv["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!owned_all.is_empty());
    for owned in &owned_all {
        let name = owned["name"].as_str().expect("owned CRD without name");
        descriptors_cover(
            owned,
            &yaml_doc(&root().join(format!("bundle/manifests/{}.yaml", bundle_file(name)))),
        );
    }
}

fn descriptors_cover(owned: &Value, crd: &Value) {
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"]["properties"];
    assert_eq!(owned["version"], version["name"]);

    let field_exists = |root: &Value, path: &str| -> bool {
        let mut node = root;
        for part in path.split('.') {
            node = &node["properties"][part];
            if node.is_null() {
                return false;
            }
        }
        true
    };
    let check = |kind: &str, root: &Value| -> BTreeSet<String> {
        let mut paths = BTreeSet::new();
        for d in owned[kind].as_array().into_iter().flatten() {
            let path = d["path"].as_str().expect("a descriptor without path");
            assert!(
                field_exists(root, path),
                "{kind} {path} names no field of the CRD"
            );
            assert!(
                d["x-descriptors"].as_array().is_some_and(|x| !x.is_empty()),
                "{kind} {path} has no x-descriptors"
            );
            assert!(
                d["displayName"].as_str().is_some_and(|s| !s.is_empty()),
                "{kind} {path} has no displayName"
            );
            paths.insert(path.to_string());
        }
        paths
    };
    let spec_paths = check("specDescriptors", &schema["spec"]);
    let status_paths = check("statusDescriptors", &schema["status"]);

    let top: Vec<&String> = schema["spec"]["properties"]
        .as_object()
        .expect("the CRD has no spec properties")
        .keys()
        .collect();
    let missing: Vec<&&String> = top.iter().filter(|f| !spec_paths.contains(**f)).collect();
    assert!(
        missing.is_empty(),
        "spec fields without a spec descriptor in config/manifests/bases/: {missing:?}"
    );
    for key in [
        "phase",
        "conditions",
        "primary",
        "readyInstances",
        "currentVersion",
    ] {
        if !schema["status"]["properties"][key].is_null() {
            assert!(
                status_paths.contains(key),
                "status.{key} has no status descriptor"
            );
        }
    }
    println!(
        "descriptors: {} spec ({} top-level fields), {} status",
        spec_paths.len(),
        top.len(),
        status_paths.len()
    );
}

/// CSV metadata: what OperatorHub and a console need, and what OLM checks.
#[test]
fn csv_metadata_is_complete_and_honest() {
    let csv = bundle_csv();
    let version = bundle_version();
    let ann = &csv["metadata"]["annotations"];
    let spec = &csv["spec"];
    assert_eq!(
        csv["metadata"]["name"],
        json!(format!("redpilot.v{version}"))
    );
    // Level 2: engine upgrades with rollback (tests/operator_upgrade.rs) and
    // operator upgrades that restart nothing (tests/olm_e2e.rs). Level 3:
    // backups, schedules, restores (tests/operator_backup.rs). Level 4:
    // metrics, alerts, dashboards (tests/insights_prometheus.rs) and traces
    // (tests/insights_traces.rs). Level 5: the memory autopilot grows in
    // place before OOM, shrinks, and stops at its bounds
    // (tests/operator_autopilot.rs).
    assert_eq!(ann["capabilities"], "Auto Pilot");
    assert!(
        ann["categories"]
            .as_str()
            .is_some_and(|c| c.contains("Database"))
    );
    let created = std::fs::read_to_string(root().join("config/manifests/created-at")).unwrap();
    let recorded = created
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(version.as_str())).then(|| w.next().unwrap_or_default().to_string())
        })
        .expect("no createdAt recorded for the version");
    assert_eq!(ann["createdAt"], json!(recorded));
    let image = ann["containerImage"].as_str().expect("no containerImage");
    assert!(
        image.ends_with(&format!(":{version}")),
        "containerImage {image} is not the release's"
    );
    for f in ["displayName", "description", "maturity", "minKubeVersion"] {
        assert!(
            spec[f].as_str().is_some_and(|s| !s.is_empty()),
            "spec.{f} is empty"
        );
    }
    assert!(
        spec["description"].as_str().unwrap().len() > 500,
        "the description is too thin"
    );
    for f in ["keywords", "maintainers", "links"] {
        assert!(
            spec[f].as_array().is_some_and(|a| !a.is_empty()),
            "spec.{f} is empty"
        );
    }
    for m in spec["maintainers"].as_array().unwrap() {
        assert!(
            m["email"].as_str().is_some_and(|e| e.contains('@')),
            "maintainer without email"
        );
    }
    assert!(spec["provider"]["name"].as_str().is_some());

    // The icon is config/manifests/icon/redpilot.svg.
    let icon = &spec["icon"][0];
    assert_eq!(icon["mediatype"], "image/svg+xml");
    let svg = std::fs::read(root().join("config/manifests/icon/redpilot.svg")).unwrap();
    let b64 = run_ok(
        Command::new("base64")
            .arg("-w0")
            .arg(root().join("config/manifests/icon/redpilot.svg")),
    );
    assert_eq!(
        icon["base64data"].as_str(),
        Some(b64.trim()),
        "the icon is not the SVG"
    );
    assert!(String::from_utf8_lossy(&svg).contains("<svg"));

    // The operator reads OLM's target namespaces (WATCH_NAMESPACE), so every
    // install mode works.
    let modes: BTreeMap<String, bool> = spec["installModes"]
        .as_array()
        .expect("no installModes")
        .iter()
        .map(|m| {
            (
                m["type"].as_str().unwrap().to_string(),
                m["supported"] == true,
            )
        })
        .collect();
    for m in [
        "OwnNamespace",
        "SingleNamespace",
        "MultiNamespace",
        "AllNamespaces",
    ] {
        assert_eq!(modes.get(m), Some(&true), "install mode {m}");
    }
    let dep = &spec["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"];
    let container = &dep["containers"][0];
    let env = container["env"]
        .as_array()
        .expect("the operator has no env");
    let watch = env
        .iter()
        .find(|e| e["name"] == "WATCH_NAMESPACE")
        .expect("no WATCH_NAMESPACE");
    assert_eq!(
        watch["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.annotations['olm.targetNamespaces']"
    );

    // The Deployment: the release's image, resources, restricted security.
    assert_eq!(container["image"], json!(image));
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert_eq!(dep["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        dep["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &container["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert!(container["readinessProbe"].is_object() && container["livenessProbe"].is_object());

    // relatedImages: every engine image the operator runs, and the exporter.
    let related: Vec<&str> = spec["relatedImages"]
        .as_array()
        .expect("no relatedImages")
        .iter()
        .filter_map(|r| r["image"].as_str())
        .collect();
    for want in ["/library/redis:", "/valkey/valkey:", "/redis_exporter:"] {
        assert!(
            related.iter().any(|i| i.contains(want)),
            "no related image like {want}: {related:?}"
        );
    }
    for r in &related {
        let env_has = env.iter().any(|e| e["value"] == json!(r));
        assert!(
            env_has,
            "related image {r} is not a RELATED_IMAGE_* of the Deployment"
        );
    }
    assert!(Path::new(&root().join("Dockerfile")).exists());
}
