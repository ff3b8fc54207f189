//! The file-based catalog (catalog/): generated from bundle/ and
//! catalog/releases.txt without drift, valid for `opm validate`, and with the
//! upgrade graph and package metadata OLM needs. The channels come from OLM's
//! semver catalog template (catalog/redpilot.semver.yaml, rendered by
//! bin/catalog-semver): candidate-v<major>, fast-v<major> and stable-v<major>,
//! and candidate, fast and stable with the same entries for subscriptions
//! made to them before.

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

/// The bundle image that names a release in the semver template.
const BUNDLE_IMAGE: &str = "quay.io/redpilot/redpilot-bundle";

/// The channel archetypes of OLM's semver template, least stable first.
const ARCHETYPES: [&str; 3] = ["candidate", "fast", "stable"];

/// A version as OLM orders bundles (semver precedence: a pre-release comes
/// before its release; numeric identifiers compare as numbers).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Version {
    major: u64,
    minor: u64,
    patch: u64,
    release: bool,
    pre: Vec<Ident>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ident {
    Num(u64),
    Alpha(String),
}

fn version(text: &str) -> Version {
    let text = text.split('+').next().unwrap_or_default();
    let (core, pre) = match text.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (text, None),
    };
    let nums: Vec<u64> = core
        .split('.')
        .map(|n| {
            n.parse()
                .unwrap_or_else(|_| panic!("{text:?} is not a version"))
        })
        .collect();
    assert_eq!(nums.len(), 3, "{text:?} is not a version x.y.z");
    Version {
        major: nums[0],
        minor: nums[1],
        patch: nums[2],
        release: pre.is_none(),
        pre: pre
            .map(|p| {
                p.split('.')
                    .map(|i| {
                        i.parse()
                            .map(Ident::Num)
                            .unwrap_or_else(|_| Ident::Alpha(i.to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Whether `v` is in an OLM skipRange (space-separated comparators, all of
/// which must hold).
fn in_range(v: &Version, range: &str) -> bool {
    range.split_whitespace().all(|c| {
        let (op, bound) = [">=", "<=", ">", "<", "="]
            .iter()
            .find_map(|op| c.strip_prefix(op).map(|b| (*op, b)))
            .unwrap_or(("=", c));
        let b = version(bound.trim_start_matches('v'));
        match op {
            ">=" => *v >= b,
            "<=" => *v <= b,
            ">" => *v > b,
            "<" => *v < b,
            _ => *v == b,
        }
    })
}

/// Walks the upgrade graph of one channel as OLM does: an installed entry
/// upgrades to an entry that replaces it, skips it or covers it with its
/// skipRange. Checks that every edge leads to a newer version, that there is
/// one head (an entry nothing upgrades out of) and it is the highest version,
/// that every entry reaches the head, and that every step of the head's
/// `replaces` chain is reachable from every older entry (an entry off that
/// chain is one the template skips: OLM upgrades past it). Returns the chain,
/// oldest first.
fn walk_channel(
    channel: &str,
    entries: &[Value],
    versions: &BTreeMap<String, Version>,
) -> Vec<String> {
    let names: Vec<String> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "channel {channel}: duplicate entries"
    );
    let ver = |n: &str| -> Version {
        versions
            .get(n)
            .unwrap_or_else(|| panic!("channel {channel}: {n} is not a bundle of the catalog"))
            .clone()
    };
    // upgrades[x]: the entries an installation of x may upgrade to.
    let mut upgrades: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (e, to) in entries.iter().zip(&names) {
        let mut from: Vec<&str> = Vec::new();
        if let Some(r) = e["replaces"].as_str() {
            assert!(
                names.iter().any(|n| n == r),
                "channel {channel}: {to} replaces {r}, which is not in the channel"
            );
            from.push(r);
        }
        for s in e["skips"].as_array().into_iter().flatten() {
            from.extend(s.as_str());
        }
        if let Some(range) = e["skipRange"].as_str() {
            from.extend(
                names
                    .iter()
                    .filter(|n| *n != to && in_range(&ver(n), range))
                    .map(String::as_str),
            );
        }
        for f in from {
            if !names.iter().any(|n| n == f) {
                continue;
            }
            assert!(
                ver(f) < ver(to),
                "channel {channel}: {f} upgrades to {to}, which is not newer"
            );
            upgrades.entry(f).or_default().insert(to.as_str());
        }
    }
    let heads: Vec<&String> = names
        .iter()
        .filter(|n| !upgrades.contains_key(n.as_str()))
        .collect();
    assert_eq!(
        heads.len(),
        1,
        "channel {channel}: one head expected (an entry nothing upgrades out of), found {heads:?}"
    );
    let head = heads[0].as_str();
    let highest = names.iter().max_by_key(|n| ver(n)).expect("entries");
    assert_eq!(
        head, highest,
        "channel {channel}: the head is not the highest version"
    );
    let reachable = |from| reachable_from(&upgrades, from);
    for n in &names {
        assert!(
            reachable(n).contains(head),
            "channel {channel}: {n} does not upgrade to the head {head}"
        );
    }
    let mut chain = vec![head.to_string()];
    while let Some(r) = entries
        .iter()
        .find(|e| e["name"] == chain[chain.len() - 1].as_str())
        .and_then(|e| e["replaces"].as_str())
    {
        assert!(
            !chain.iter().any(|c| c == r),
            "channel {channel}: the replaces chain loops at {r}"
        );
        chain.push(r.to_string());
    }
    chain.reverse();
    for step in &chain {
        for n in names.iter().filter(|n| ver(n) < ver(step)) {
            assert!(
                reachable(n).contains(step.as_str()),
                "channel {channel}: {step} is not reachable from the older {n}"
            );
        }
    }
    chain
}

/// Every entry an installation of `from` may reach, `from` included.
fn reachable_from<'a>(
    upgrades: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    from: &'a str,
) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::from([from]);
    let mut todo = vec![from];
    while let Some(x) = todo.pop() {
        for &y in upgrades.get(x).into_iter().flatten() {
            if seen.insert(y) {
                todo.push(y);
            }
        }
    }
    seen
}

/// The semver template as releases.txt says: each archetype lists, oldest
/// first, the bundle image of every release in that channel; major-version
/// channels only.
#[test]
fn semver_template_lists_the_releases() {
    let template = yaml_doc(&root().join("catalog/redpilot.semver.yaml"));
    assert_eq!(template["schema"], "olm.semver");
    assert_eq!(template["generateMajorChannels"], true);
    assert_eq!(template["generateMinorChannels"], false);
    let releases = releases();
    for a in ARCHETYPES {
        let listed: Vec<&str> = template[a]["bundles"]
            .as_array()
            .unwrap_or_else(|| panic!("the template has no {a} bundles"))
            .iter()
            .map(|b| b["image"].as_str().unwrap_or_default())
            .collect();
        let expected: Vec<String> = releases
            .iter()
            .filter(|(_, chs)| chs.iter().any(|c| c == a))
            .map(|(v, _)| format!("{BUNDLE_IMAGE}:{v}"))
            .collect();
        assert_eq!(listed, expected, "template channel {a} vs releases.txt");
        println!("template {a}: {}", listed.join(", "));
    }
}

/// The package `redpilot`, its default channel (the semver template's:
/// stable-v<major>), description and icon; every release is a bundle whose
/// manifests are embedded (olm.bundle.object), so OLM installs it from the
/// catalog without pulling a bundle image; the bundle in bundle/ is in it;
/// every embedded CSV keeps its rules namespaced (no clusterPermissions).
/// The channels: <archetype>-v<major> for each channel and major of
/// releases.txt, and each archetype alone with its major channel's entries;
/// each channel holds exactly its releases, and its graph walks (see
/// `walk_channel`) to the highest one.
#[test]
fn catalog_package_channels_and_upgrade_graph() {
    let metas = rendered();
    let of =
        |schema: &str| -> Vec<&Value> { metas.iter().filter(|m| m["schema"] == schema).collect() };
    let releases = releases();

    let packages = of("olm.package");
    assert_eq!(packages.len(), 1, "one olm.package expected");
    let pkg = packages[0];
    assert_eq!(pkg["name"], "redpilot");
    let stable_major = releases
        .iter()
        .filter(|(_, chs)| chs.iter().any(|c| c == "stable"))
        .map(|(v, _)| version(v).major)
        .max()
        .expect("a release in stable");
    assert_eq!(
        pkg["defaultChannel"],
        serde_json::json!(format!("stable-v{stable_major}")),
        "the default channel is the semver template's: the most stable archetype, newest major"
    );
    assert_eq!(pkg["icon"]["mediatype"], "image/svg+xml");
    assert!(pkg["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(
        of("olm.semver").is_empty(),
        "the semver template is served as part of the catalog (catalog/.indexignore)"
    );

    let bundles: BTreeMap<String, &Value> = of("olm.bundle")
        .into_iter()
        .map(|b| (b["name"].as_str().unwrap_or_default().to_string(), b))
        .collect();
    let published: Vec<String> = releases_with_commits()
        .into_iter()
        .filter_map(|(v, _, c)| c.map(|_| v))
        .collect();
    for (v, _) in &releases {
        let name = format!("redpilot.v{v}");
        let b = bundles
            .get(&name)
            .unwrap_or_else(|| panic!("release {v} has no olm.bundle"));
        assert_eq!(
            b["image"], "",
            "{name}: OLM installs it from its embedded manifests, not from an image"
        );
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
    let versions: BTreeMap<String, Version> = releases
        .iter()
        .map(|(v, _)| (format!("redpilot.v{v}"), version(v)))
        .collect();

    // channel name -> the releases it must hold.
    let mut expected: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for a in ARCHETYPES {
        let members: Vec<&String> = releases
            .iter()
            .filter(|(_, chs)| chs.iter().any(|c| c == a))
            .map(|(v, _)| v)
            .collect();
        let majors: BTreeSet<u64> = members.iter().map(|v| version(v).major).collect();
        assert!(
            majors.len() == 1,
            "channel {a}: releases of majors {majors:?}; `{a}` follows one major line"
        );
        for m in majors {
            let of_major = members
                .iter()
                .filter(|v| version(v).major == m)
                .copied()
                .collect();
            expected.insert(format!("{a}-v{m}"), of_major);
        }
        expected.insert(a.to_string(), members);
    }
    let channels: BTreeMap<String, &Value> = of("olm.channel")
        .into_iter()
        .map(|c| (c["name"].as_str().unwrap_or_default().to_string(), c))
        .collect();
    assert_eq!(
        channels.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "channels"
    );
    for (name, ch) in &channels {
        let entries = ch["entries"].as_array().expect("a channel without entries");
        let held: BTreeSet<String> = entries
            .iter()
            .map(|e| e["name"].as_str().unwrap_or_default().to_string())
            .collect();
        let want: BTreeSet<String> = expected[name]
            .iter()
            .map(|v| format!("redpilot.v{v}"))
            .collect();
        assert_eq!(held, want, "channel {name}: entries vs releases.txt");
        let chain = walk_channel(name, entries, &versions);
        println!(
            "channel {name}: {} entr{}, head {}, upgrade path {}",
            entries.len(),
            if entries.len() == 1 { "y" } else { "ies" },
            chain.last().expect("a head"),
            chain.join(" -> ")
        );
    }
    for a in ARCHETYPES {
        let major = channels
            .keys()
            .find(|n| n.starts_with(&format!("{a}-v")))
            .expect("a major channel");
        assert_eq!(
            channels[a]["entries"], channels[major]["entries"],
            "channel {a} holds the entries of {major}"
        );
    }
}

/// bin/catalog-semver on releases with patch versions (0.1.0, 0.1.1, 0.2.0,
/// 0.2.1, 0.3.0): the graph OLM's semver template makes, where patch
/// releases other than a minor's last are skipped, walks as
/// `walk_channel` requires, and `opm validate` accepts it. A release of a
/// second major is refused, saying why.
#[test]
fn semver_template_graph_with_patch_releases() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cat, ok) = render_synthetic(
        tmp.path(),
        &[
            ("candidate", &["0.1.0", "0.1.1", "0.2.0", "0.2.1", "0.3.0"]),
            ("fast", &["0.1.1", "0.2.1", "0.3.0"]),
            ("stable", &["0.1.1", "0.2.1"]),
        ],
    );
    assert!(ok.status.success(), "catalog-semver failed: {ok:?}");
    run_ok(Command::new(tool("opm")).arg("validate").arg(&cat));
    let pkg = yaml_doc(&cat.join("demo/package.yaml"));
    assert_eq!(pkg["defaultChannel"], "stable-v0");
    let versions: BTreeMap<String, Version> = ["0.1.0", "0.1.1", "0.2.0", "0.2.1", "0.3.0"]
        .iter()
        .map(|v| (format!("demo.v{v}"), version(v)))
        .collect();
    let chains: BTreeMap<String, Vec<String>> = yaml_docs(&cat.join("demo/channels.yaml"))
        .iter()
        .map(|ch| {
            let name = ch["name"].as_str().unwrap_or_default().to_string();
            let entries = ch["entries"].as_array().expect("entries");
            let chain = walk_channel(&name, entries, &versions);
            println!("synthetic channel {name}: {}", chain.join(" -> "));
            (name, chain)
        })
        .collect();
    assert_eq!(
        chains.keys().collect::<Vec<_>>(),
        [
            "candidate",
            "candidate-v0",
            "fast",
            "fast-v0",
            "stable",
            "stable-v0"
        ]
    );
    assert_eq!(
        chains["candidate-v0"],
        ["demo.v0.1.1", "demo.v0.2.1", "demo.v0.3.0"]
    );
    assert_eq!(chains["stable"], ["demo.v0.1.1", "demo.v0.2.1"]);

    let tmp2 = tempfile::tempdir().expect("tempdir");
    let (_, refused) = render_synthetic(
        tmp2.path(),
        &[
            ("candidate", &["0.1.0", "1.0.0"]),
            ("fast", &["0.1.0"]),
            ("stable", &["0.1.0"]),
        ],
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("more than one major version"),
        "a second major must be refused: {refused:?}"
    );
    println!("second major refused: {}", err.trim());
}

/// Writes bundles of package `demo` with the given versions and a semver
/// template listing them per archetype under `dir`, then runs
/// bin/catalog-semver into dir/catalog/demo/.
fn render_synthetic(
    dir: &std::path::Path,
    channels: &[(&str, &[&str])],
) -> (std::path::PathBuf, std::process::Output) {
    let semver = root().join("bin/catalog-semver");
    assert!(
        semver.exists(),
        "bin/catalog-semver is missing: run `make tools-opm`"
    );
    let cat = dir.join("catalog");
    let bundles = cat.join("demo/bundles");
    std::fs::create_dir_all(&bundles).expect("mkdir");
    let all: BTreeSet<&str> = channels
        .iter()
        .flat_map(|(_, vs)| vs.iter().copied())
        .collect();
    let docs: Vec<String> = all
        .iter()
        .map(|v| {
            serde_json::json!({
                "schema": "olm.bundle", "name": format!("demo.v{v}"), "package": "demo",
                "image": format!("example.com/demo-bundle:{v}"),
                "properties": [{"type": "olm.package", "value": {"packageName": "demo", "version": v}}],
            })
            .to_string()
        })
        .collect();
    std::fs::write(bundles.join("bundles.json"), docs.join("\n")).expect("writing bundles");
    let mut template = String::from(
        "schema: olm.semver\ngenerateMajorChannels: true\ngenerateMinorChannels: false\n",
    );
    for (a, vs) in channels {
        template += &format!("{a}:\n  bundles:\n");
        for v in *vs {
            template += &format!("  - image: example.com/demo-bundle:{v}\n");
        }
    }
    let file = dir.join("demo.semver.yaml");
    std::fs::write(&file, template).expect("writing the template");
    let out = run(Command::new(semver)
        .arg("-template")
        .arg(&file)
        .arg("-bundles")
        .arg(&bundles)
        .arg("-out")
        .arg(cat.join("demo"))
        .args(["-bundle-image", "example.com/demo-bundle"]));
    (cat, out)
}
