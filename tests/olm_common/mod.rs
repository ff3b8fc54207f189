//! Helpers shared by the OLM packaging suites (`tests/olm_*.rs`): the tool
//! binaries in `bin/`, running commands, reading YAML and comparing trees.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The tests of bundle/tests/scorecard/config.yaml (basic and olm suites).
pub const SCORECARD_TESTS: [&str; 6] = [
    "basic-check-spec",
    "olm-bundle-validation",
    "olm-crds-have-validation",
    "olm-crds-have-resources",
    "olm-spec-descriptors",
    "olm-status-descriptors",
];

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The tool group of `tools/build.sh` that builds each binary.
fn group_of(name: &str) -> &'static str {
    match name {
        "operator-sdk" | "scorecard-test" => "operator-sdk",
        "opm" => "opm",
        "olm" | "catalog" | "package-server" | "olm-crds" => "olm",
        "kubectl" => "kube",
        _ => "?",
    }
}

/// `bin/<name>`; fails the test when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path = root().join("bin").join(name);
    if !path.exists() {
        panic!(
            "bin/{name} is missing: run `make tools` (or `make tools-{}`)",
            group_of(name)
        );
    }
    path
}

/// Runs `cmd` to completion; fails the test when it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}

/// Runs `cmd`, fails the test unless it exits 0, and returns its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let out = run(cmd);
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// All YAML documents of a file, as JSON values (YAML 1.2, as the crate
/// itself reads YAML). Empty documents are skipped.
pub fn yaml_docs(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    yaml_docs_str(&text, &path.display().to_string())
}

pub fn yaml_docs_str(text: &str, what: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("parsing YAML in {what}: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The single YAML document of a file.
pub fn yaml_doc(path: &Path) -> Value {
    let mut docs = yaml_docs(path);
    assert_eq!(
        docs.len(),
        1,
        "{} should hold exactly one YAML document",
        path.display()
    );
    docs.remove(0)
}

/// The `*.yaml` files of a directory, sorted, without kustomization.yaml.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    files
}

/// Every file under `dir` (relative path → bytes).
pub fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let rel = path
                    .strip_prefix(base)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let bytes = std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                out.insert(rel, bytes);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Fails the test with a list of the differences between two trees.
pub fn assert_same_tree(
    checked_in: &BTreeMap<String, Vec<u8>>,
    generated: &BTreeMap<String, Vec<u8>>,
    what: &str,
    fix: &str,
) {
    let mut problems = Vec::new();
    for (name, bytes) in generated {
        match checked_in.get(name) {
            None => problems.push(format!("  missing: {name}")),
            Some(b) if b != bytes => {
                problems.push(format!("  differs: {name}{}", first_difference(b, bytes)))
            }
            Some(_) => {}
        }
    }
    for name in checked_in.keys() {
        if !generated.contains_key(name) {
            problems.push(format!("  not generated any more: {name}"));
        }
    }
    assert!(
        problems.is_empty(),
        "the checked-in {what} drifted from what the repository generates:\n{}\nRun `{fix}` and commit the result.",
        problems.join("\n")
    );
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    let a = String::from_utf8_lossy(a);
    let b = String::from_utf8_lossy(b);
    for (i, (la, lb)) in a.lines().zip(b.lines()).enumerate() {
        if la != lb {
            return format!(
                " (line {}: checked in {:?}, generated {:?})",
                i + 1,
                cut(la),
                cut(lb)
            );
        }
    }
    format!(
        " ({} lines checked in, {} generated)",
        a.lines().count(),
        b.lines().count()
    )
}

fn cut(s: &str) -> String {
    s.chars().take(120).collect()
}

/// The bundle's ClusterServiceVersion.
pub fn bundle_csv() -> Value {
    yaml_doc(&root().join("bundle/manifests/redpilot.clusterserviceversion.yaml"))
}

/// The version of the checked-in bundle (its CSV's spec.version).
pub fn bundle_version() -> String {
    bundle_csv()["spec"]["version"]
        .as_str()
        .expect("the bundle's CSV has no spec.version")
        .to_string()
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("creating {}: {e}", to.display()));
    for entry in std::fs::read_dir(from)
        .unwrap_or_else(|e| panic!("reading {}: {e}", from.display()))
        .flatten()
    {
        let src = entry.path();
        let dst = to.join(entry.file_name());
        if src.is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
        }
    }
}

/// Decodes standard base64 (with or without padding); None when invalid.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let data: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    for chunk in data.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

/// Whether `rules` (RBAC PolicyRules as JSON) grant `verb` on
/// `group`/`resource`, wildcards included.
pub fn grants(rules: &[Value], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|r| {
        let has = |field: &str, want: &str| {
            r[field]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == want || x == "*"))
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

/// Every rule of a CSV's `spec.install.spec.<field>` (`permissions` or
/// `clusterPermissions`), whatever the ServiceAccount.
pub fn csv_rules(csv: &Value, field: &str) -> Vec<Value> {
    csv["spec"]["install"]["spec"][field]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// What the operator must be granted in the namespaces it watches (and in
/// its own, for leader election): `(verb, group, resource)`.
pub const NAMESPACED_NEEDS: &[(&str, &str, &str)] = &[
    ("watch", "redpilot.io", "redis"),
    ("patch", "redpilot.io", "redis/status"),
    ("watch", "apps", "statefulsets"),
    ("patch", "apps", "statefulsets"),
    ("get", "", "secrets"),
    ("create", "", "secrets"),
    ("patch", "", "secrets"),
    ("watch", "", "configmaps"),
    ("watch", "", "services"),
    ("watch", "policy", "poddisruptionbudgets"),
    ("delete", "", "pods"),
    ("create", "events.k8s.io", "events"),
    ("patch", "coordination.k8s.io", "leases"),
];

/// Issue #10, least privilege. Everything the operator does is namespaced,
/// so a CSV declares it all in `permissions`, which OLM grants only in the
/// OperatorGroup's target namespaces (and makes cluster-wide itself only for
/// an AllNamespaces install). `clusterPermissions` would grant it in every
/// namespace whatever the install mode: an operator installed for one
/// namespace could read every Secret of the cluster. So: no cluster-wide
/// rule on Secrets (or on anything else), and the namespaced rules in
/// `permissions`.
pub fn assert_least_privilege(csv: &Value, what: &str) {
    let cluster = csv_rules(csv, "clusterPermissions");
    for verb in [
        "get", "list", "watch", "create", "patch", "update", "delete",
    ] {
        assert!(
            !grants(&cluster, verb, "", "secrets"),
            "{what}: clusterPermissions grant `{verb}` on Secrets in every namespace; \
             the operator's rules belong in permissions (bind the ClusterRole of \
             config/rbac/role.yaml with a RoleBinding, then `make bundle catalog`): {cluster:#?}"
        );
    }
    assert!(
        cluster.is_empty(),
        "{what}: clusterPermissions hold rules, but the operator needs nothing \
         cluster-scoped: {cluster:#?}"
    );
    let namespaced = csv_rules(csv, "permissions");
    for verb in ["list", "watch"] {
        assert!(
            !grants(&namespaced, verb, "", "secrets"),
            "{what}: permissions grant `{verb}` on Secrets: the operator reads the Secrets \
             it uses by name, and a list or watch would hand it every Secret of a namespace: \
             {namespaced:#?}"
        );
    }
    let missing: Vec<String> = NAMESPACED_NEEDS
        .iter()
        .filter(|(verb, group, resource)| !grants(&namespaced, verb, group, resource))
        .map(|(verb, group, resource)| format!("{verb} {group}/{resource}"))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: permissions lack {missing:?}: {namespaced:#?}"
    );
}
