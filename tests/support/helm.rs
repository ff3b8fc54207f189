//! Helm: `bin/helm` (built from tools/helm) against the dev cluster, and
//! the chart's objects as values.

use std::collections::BTreeMap;
use std::process::Command;

use super::{kubeconfig_path, repo_root};

/// Objects by kind, namespace and name.
pub type Objects = BTreeMap<(String, String, String), serde_json::Value>;

/// Runs `bin/helm` against the dev cluster, its own cache and config in a
/// temporary directory.
pub fn helm(args: &[&str]) -> std::process::Output {
    let bin = repo_root().join("bin/helm");
    assert!(
        bin.exists(),
        "bin/helm is missing: run `make tools` (it builds Helm from tools/helm)"
    );
    let home = std::env::temp_dir().join(format!("redpilot-helm-{}", std::process::id()));
    Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("run bin/helm")
}

pub fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.status.success(),
        "helm {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn chart() -> String {
    repo_root()
        .join("deploy/helm/redpilot")
        .display()
        .to_string()
}

/// The objects of a multi-document YAML text, by kind, namespace and name.
pub fn objects(text: &str) -> Objects {
    let mut out = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).expect("a YAML document");
        if v.is_null() {
            continue;
        }
        let s = |p: &str| {
            v.pointer(p)
                .and_then(|x| x.as_str())
                .unwrap_or("")
                .to_string()
        };
        out.insert(
            (s("/kind"), s("/metadata/namespace"), s("/metadata/name")),
            v,
        );
    }
    out
}

/// `helm template` of the chart in `redpilot-system` with `sets`.
pub fn render(sets: &[&str]) -> Objects {
    let chart = chart();
    let mut args = vec![
        "template",
        "redpilot",
        chart.as_str(),
        "-n",
        "redpilot-system",
        "--include-crds",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    objects(&helm_ok(&args))
}
