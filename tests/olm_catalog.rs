//! The file-based catalog (catalog/): generated from bundle/ and
//! catalog/releases.txt without drift, valid for `opm validate`, and with the
//! upgrade graph and package metadata OLM needs.

mod olm_common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use olm_common::*;
use serde_json::Value;

/// `make catalog`, run on a copy of catalog/, changes nothing.
#[test]
fn checked_in_catalog_matches_generation() {
    tool("opm");
    let tmp = tempfile::tempdir().expect("tempdir");
    let copy = tmp.path().join("catalog");
    copy_dir(&root().join("catalog"), &copy);
    run_ok(
        Command::new("bash")
            .arg(root().join("hack/catalog.sh"))
            .env("CATALOG_DIR", &copy)
            .env("BUNDLE_DIR", root().join("bundle"))
            .env_remove("RELEASES")
            .current_dir(root()),
    );
    assert_same_tree(
        &tree(&root().join("catalog")),
        &tree(&copy),
        "catalog/",
        "make bundle catalog",
    );
}

/// `opm validate catalog` accepts the catalog.
#[test]
fn opm_validate_catalog() {
    let out = run(Command::new(tool("opm"))
        .args(["validate", "catalog"])
        .current_dir(root()));
    assert!(
        out.status.success(),
        "opm validate catalog failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("opm validate catalog: valid (exit 0)");
}

/// The catalog as opm reads it: `opm render catalog -o json`.
fn rendered() -> Vec<Value> {
    let out = run_ok(
        Command::new(tool("opm"))
            .args(["render", "catalog", "-o", "json"])
            .current_dir(root()),
    );
    serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .map(|v| v.expect("opm render printed invalid JSON"))
        .collect()
}

/// Each release: version, channels, and the commit it was published from
/// (for releases made before this tree).
fn releases_with_commits() -> Vec<(String, Vec<String>, Option<String>)> {
    std::fs::read_to_string(root().join("catalog/releases.txt"))
        .expect("reading catalog/releases.txt")
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim().to_string())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let v = w.next().unwrap_or_default().to_string();
            let ch = w
                .next()
                .unwrap_or_default()
                .split(',')
                .map(str::to_string)
                .collect();
            (v, ch, w.next().map(str::to_string))
        })
        .collect()
}

fn releases() -> Vec<(String, Vec<String>)> {
    releases_with_commits()
        .into_iter()
        .map(|(v, ch, _)| (v, ch))
        .collect()
}

/// A published release is never re-rendered: its bundle in catalog/ is the
/// one its commit (named in catalog/releases.txt) holds, byte for byte, and
/// the tag `v<version>`, when this clone has it, is that commit.
#[test]
fn published_releases_are_kept_as_published() {
    let published: Vec<(String, String)> = releases_with_commits()
        .into_iter()
        .filter_map(|(v, _, c)| Some((v, c?)))
        .collect();
    assert!(
        !published.is_empty(),
        "catalog/releases.txt names no published release"
    );
    for (v, commit) in published {
        let path = format!("catalog/redpilot/bundles/redpilot.v{v}.yaml");
        let then = run_ok(
            Command::new("git")
                .args(["show", &format!("{commit}:{path}")])
                .current_dir(root()),
        );
        let now = std::fs::read_to_string(root().join(&path)).expect("the rendered bundle");
        assert!(
            then == now,
            "{path} differs from the one published at {commit}"
        );
        let tag = run(Command::new("git")
            .args([
                "rev-parse",
                "-q",
                "--verify",
                &format!("refs/tags/v{v}^{{commit}}"),
            ])
            .current_dir(root()));
        if tag.status.success() {
            assert_eq!(
                String::from_utf8_lossy(&tag.stdout).trim(),
                commit,
                "tag v{v}"
            );
        }
        println!("release {v}: bundle as published at {commit}");
    }
}

/// Package `redpilot` with default channel `stable`; channels candidate, fast
/// and stable; in each channel every entry replaces the one before and skips
/// back to the channel's first release; every entry is a bundle whose
/// manifests are embedded (olm.bundle.object), so OLM installs it from the
/// catalog without pulling a bundle image; the bundle in bundle/ is in it;
/// every embedded CSV keeps its rules namespaced (no clusterPermissions).
#[test]
fn catalog_package_channels_and_upgrade_graph() {
    let metas = rendered();
    let of =
        |schema: &str| -> Vec<&Value> { metas.iter().filter(|m| m["schema"] == schema).collect() };

    let packages = of("olm.package");
    assert_eq!(packages.len(), 1, "one olm.package expected");
    let pkg = packages[0];
    assert_eq!(pkg["name"], "redpilot");
    assert_eq!(pkg["defaultChannel"], "stable");
    assert_eq!(pkg["icon"]["mediatype"], "image/svg+xml");
    assert!(pkg["description"].as_str().is_some_and(|d| !d.is_empty()));

    let bundles: BTreeMap<String, &Value> = of("olm.bundle")
        .into_iter()
        .map(|b| (b["name"].as_str().unwrap_or_default().to_string(), b))
        .collect();
    let releases = releases();
    let published: Vec<String> = releases_with_commits()
        .into_iter()
        .filter_map(|(v, _, c)| c.map(|_| v))
        .collect();
    for (v, _) in &releases {
        let name = format!("redpilot.v{v}");
        let b = bundles
            .get(&name)
            .unwrap_or_else(|| panic!("release {v} has no olm.bundle"));
        let props = b["properties"]
            .as_array()
            .expect("a bundle without properties");
        let objects: Vec<Value> = props
            .iter()
            .filter(|p| p["type"] == "olm.bundle.object")
            .filter_map(|p| {
                let bytes = base64_decode(p["value"]["data"].as_str()?)?;
                serde_json::from_slice(&bytes).ok()
            })
            .collect();
        let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert!(
            kinds.contains("ClusterServiceVersion") && kinds.contains("CustomResourceDefinition"),
            "{name} does not embed its CSV and CRD (kinds: {kinds:?})"
        );
        // Issue #10: what OLM installs from the catalog grants nothing
        // cluster-wide. Releases published before that fix (0.1.0) are kept
        // as published (see `published_releases_are_kept_as_published`); an
        // installation of one upgrades to the channel head.
        let csv = objects
            .iter()
            .find(|o| o["kind"] == "ClusterServiceVersion")
            .expect("a CSV");
        if !published.contains(v) {
            assert_least_privilege(csv, &format!("the CSV of {name} in catalog/"));
        }
        let pkg_prop = props
            .iter()
            .find(|p| p["type"] == "olm.package")
            .expect("a bundle without olm.package");
        assert_eq!(pkg_prop["value"]["version"], serde_json::json!(v));
    }
    assert_eq!(
        bundles.len(),
        releases.len(),
        "bundles that are not releases: {:?}",
        bundles.keys()
    );
    let current = format!("redpilot.v{}", bundle_version());
    assert!(
        bundles.contains_key(&current),
        "the catalog lacks bundle/ ({current}): run `make catalog`"
    );

    let channels: BTreeMap<String, &Value> = of("olm.channel")
        .into_iter()
        .map(|c| (c["name"].as_str().unwrap_or_default().to_string(), c))
        .collect();
    assert_eq!(
        channels.keys().map(String::as_str).collect::<Vec<_>>(),
        ["candidate", "fast", "stable"]
    );
    for (name, ch) in &channels {
        let expected: Vec<&String> = releases
            .iter()
            .filter(|(_, chs)| chs.contains(name))
            .map(|(v, _)| v)
            .collect();
        let entries = ch["entries"].as_array().expect("a channel without entries");
        assert_eq!(
            entries.len(),
            expected.len(),
            "channel {name}: entries vs releases.txt"
        );
        for (i, (e, v)) in entries.iter().zip(&expected).enumerate() {
            assert_eq!(
                e["name"],
                serde_json::json!(format!("redpilot.v{v}")),
                "channel {name} entry {i}"
            );
            if i == 0 {
                assert!(
                    e["replaces"].is_null(),
                    "the first entry of {name} replaces nothing"
                );
            } else {
                assert_eq!(
                    e["replaces"],
                    serde_json::json!(format!("redpilot.v{}", expected[i - 1])),
                    "channel {name}: {v} must replace the previous release"
                );
                assert_eq!(
                    e["skipRange"],
                    serde_json::json!(format!(">={} <{v}", expected[0])),
                    "channel {name}: {v} must skip back to the channel's first release"
                );
            }
        }
        println!(
            "channel {name}: {} entr{}, head {}",
            entries.len(),
            if entries.len() == 1 { "y" } else { "ies" },
            entries
                .last()
                .map(|e| e["name"].to_string())
                .unwrap_or_default()
        );
    }
}
