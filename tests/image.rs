//! The operator image, built without a container engine (`hack/image.sh`,
//! `bin/redpilot-image`): reproducible, saying what the Dockerfile and the
//! bundle's Deployment say, holding exactly the binary and what it loads,
//! and running from its own files as the nonroot user.
//!
//! Built here from the test build of the operator (the same shared
//! libraries as the release build `make image` packs, a larger file). Needs
//! `make tools-image` and root (the image's root filesystem is entered with
//! `chroot`).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_redpilot");
/// The metrics sidecar every Redis pod runs from the operator's image.
const EXPORTER: &str = env!("CARGO_BIN_EXE_redpilot-exporter");

/// Runs `hack/image.sh` on the test binary into `out` with every time set
/// to `epoch`; returns `out/image.json`.
fn build(out: &Path, epoch: u64) -> Value {
    let tool = support::repo_root().join("bin/redpilot-image");
    assert!(
        tool.exists(),
        "{} is missing: run `make tools-image` (make test does)",
        tool.display()
    );
    let o = Command::new("bash")
        .arg(support::repo_root().join("hack/image.sh"))
        .arg(BINARY)
        .arg(out)
        .env("EXPORTER", EXPORTER)
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .output()
        .expect("running hack/image.sh");
    assert!(
        o.status.success(),
        "hack/image.sh failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    read_json(&out.join("image.json"))
}

fn read_json(p: &Path) -> Value {
    let s = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_slice(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// A blob of the OCI layout at `oci`, by digest (`sha256:…`).
fn blob(oci: &Path, digest: &str) -> PathBuf {
    let hex = digest
        .strip_prefix("sha256:")
        .unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
    oci.join("blobs/sha256").join(hex)
}

/// The layout's one image: (manifest, config).
fn image(oci: &Path) -> (Value, Value) {
    let index = read_json(&oci.join("index.json"));
    let ms = index["manifests"].as_array().expect("index.manifests");
    assert_eq!(ms.len(), 1, "{index}");
    assert_eq!(
        ms[0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("quay.io/redpilot/redpilot:{}", version()),
        "{index}"
    );
    let manifest = read_json(&blob(oci, ms[0]["digest"].as_str().expect("digest")));
    let config = read_json(&blob(
        oci,
        manifest["config"]["digest"]
            .as_str()
            .expect("config digest"),
    ));
    (manifest, config)
}

/// The layers of `oci`'s image unpacked in order into `root`.
fn unpack(oci: &Path, root: &Path) {
    let (manifest, _) = image(oci);
    std::fs::create_dir_all(root).expect("mkdir");
    for l in manifest["layers"].as_array().expect("layers") {
        assert_eq!(
            l["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip",
            "{l}"
        );
        let st = Command::new("tar")
            .arg("-xzf")
            .arg(blob(oci, l["digest"].as_str().expect("digest")))
            .arg("-C")
            .arg(root)
            .status()
            .expect("tar");
        assert!(st.success(), "unpacking {l}");
    }
}

/// The final stage of the Dockerfile: (ENTRYPOINT, CMD, USER, EXPOSE).
fn dockerfile() -> (Value, Value, String, String) {
    let text =
        std::fs::read_to_string(support::repo_root().join("Dockerfile")).expect("Dockerfile");
    let last = text
        .rsplit_once("\nFROM ")
        .map(|(_, s)| s)
        .expect("a FROM line");
    let field = |k: &str| {
        last.lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("the Dockerfile's last stage has no {k}"))
    };
    let json = |k: &str| -> Value {
        serde_json::from_str(&field(k)).unwrap_or_else(|e| panic!("{k} is not JSON: {e}"))
    };
    let port = field("EXPOSE ");
    let port = if port.contains('/') {
        port
    } else {
        format!("{port}/tcp")
    };
    (json("ENTRYPOINT "), json("CMD "), field("USER "), port)
}

/// Host library names the binary loads, from `ldd`.
fn ldd_names(binary: &str) -> BTreeSet<String> {
    let o = Command::new("ldd").arg(binary).output().expect("ldd");
    assert!(o.status.success(), "ldd {binary}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.starts_with("linux-vdso"))
        .map(|n| n.rsplit('/').next().unwrap_or(n).to_string())
        .collect()
}

/// Every path under `root` (relative, `/`-led), with `@` after a symlink's.
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("entry");
            let p = e.path();
            let rel = format!("/{}", p.strip_prefix(root).expect("under root").display());
            let t = e.file_type().expect("file type");
            if t.is_symlink() {
                out.insert(format!("{rel}@"));
            } else if t.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

#[test]
fn the_image_is_reproducible_and_says_what_the_dockerfile_and_the_bundle_say() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = build(&tmp.path().join("a"), 1_700_000_000);
    let b = build(&tmp.path().join("b"), 1_700_000_000);
    println!(
        "image {}: {} layers, {} bytes compressed, {} uncompressed",
        a["digest"], a["layers"], a["compressed"], a["uncompressed"]
    );
    // Same inputs, same image: the digest and every byte of the tarball.
    assert_eq!(a["digest"], b["digest"], "two builds of the same inputs");
    let tar = format!("redpilot-{}.tar", version());
    let (ta, tb) = (
        std::fs::read(tmp.path().join("a").join(&tar)).expect("tarball a"),
        std::fs::read(tmp.path().join("b").join(&tar)).expect("tarball b"),
    );
    assert!(ta == tb, "the two docker tarballs differ");
    // The digest follows the inputs: another time, another image.
    let c = build(&tmp.path().join("c"), 1_700_000_001);
    assert_ne!(a["digest"], c["digest"], "a changed input left the digest");

    // What a runtime reads.
    let oci = tmp.path().join("a/oci");
    let (manifest, config) = image(&oci);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    assert_eq!(
        (&config["os"], &config["architecture"]),
        (&"linux".into(), &"amd64".into())
    );
    let cfg = &config["config"];
    let (entrypoint, cmd, user, port) = dockerfile();
    assert_eq!(cfg["Entrypoint"], entrypoint, "ENTRYPOINT: {cfg}");
    assert_eq!(cfg["Cmd"], cmd, "CMD: {cfg}");
    assert_eq!(cfg["User"], user.as_str(), "USER: {cfg}");
    let ports: Vec<&String> = cfg["ExposedPorts"]
        .as_object()
        .expect("ExposedPorts")
        .keys()
        .collect();
    assert_eq!(ports, vec![&port], "EXPOSE: {cfg}");
    assert!(
        cfg["Labels"]["dev.redpilot.image.packages"]
            .as_str()
            .is_some_and(|p| p.contains("libc6=") && p.contains("ca-certificates=")),
        "the Debian packages the files came from: {cfg}"
    );
    assert_eq!(cfg["Labels"]["org.opencontainers.image.version"], version());

    // The bundle's Deployment runs it the same way.
    let dep: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(support::repo_root().join("config/manifests/deployment.yaml"))
            .expect("deployment.yaml"),
    )
    .expect("deployment YAML");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let strings = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    assert_eq!(serde_json::json!(strings(&c["command"])), cfg["Entrypoint"]);
    assert_eq!(serde_json::json!(strings(&c["args"])), cfg["Cmd"]);
    let uid = pod["securityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    let gid = pod["securityContext"]["runAsGroup"]
        .as_u64()
        .expect("runAsGroup");
    assert_eq!(format!("{uid}:{gid}"), user);
    let cport = c["ports"][0]["containerPort"]
        .as_u64()
        .expect("containerPort");
    assert_eq!(format!("{cport}/tcp"), port);

    // The docker tarball holds the same image under the same name.
    let o = Command::new("tar")
        .args(["-xOf"])
        .arg(tmp.path().join("a").join(&tar))
        .arg("manifest.json")
        .output()
        .expect("tar");
    assert!(o.status.success(), "no manifest.json in the docker tarball");
    let saved: Value = serde_json::from_slice(&o.stdout).expect("manifest.json");
    assert_eq!(
        saved[0]["RepoTags"],
        serde_json::json!([format!("quay.io/redpilot/redpilot:{}", version())]),
        "{saved}"
    );
    assert_eq!(
        saved[0]["Config"].as_str().map(|s| s.replace(':', "")),
        manifest["config"]["digest"]
            .as_str()
            .map(|s| s.replace(':', "")),
        "the tarball's config is the layout's: {saved}"
    );
    assert_eq!(
        saved[0]["Layers"].as_array().map(Vec::len),
        manifest["layers"].as_array().map(Vec::len),
        "{saved}"
    );
}

#[test]
fn the_image_holds_only_what_the_binary_needs_and_runs_it_as_nonroot() {
    assert!(
        is_root(),
        "this test enters the image's root filesystem with chroot: run it as root"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    build(&tmp.path().join("img"), 1_700_000_000);
    let root = tmp.path().join("rootfs");
    unpack(&tmp.path().join("img/oci"), &root);

    // Exactly: the binary and the sidecar's (on the PATH), each library ldd
    // names for them (one copy of the loader, linked from /lib64 as the
    // binary asks), CA certificates, the user.
    let mut want: BTreeSet<String> = [
        "/redpilot",
        "/usr/",
        "/usr/local/",
        "/usr/local/bin/",
        "/usr/local/bin/redpilot-exporter",
        "/etc/",
        "/etc/group",
        "/etc/passwd",
        "/etc/nsswitch.conf",
        "/etc/ssl/",
        "/etc/ssl/certs/",
        "/etc/ssl/certs/ca-certificates.crt",
        "/home/",
        "/home/nonroot/",
        "/tmp/",
        "/lib/",
        "/lib/x86_64-linux-gnu/",
        "/lib64/",
        "/lib64/ld-linux-x86-64.so.2@",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for lib in ldd_names(BINARY).into_iter().chain(ldd_names(EXPORTER)) {
        want.insert(format!("/lib/x86_64-linux-gnu/{lib}"));
    }
    assert_eq!(tree(&root), want);
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let meta = std::fs::metadata(root.join("redpilot")).expect("redpilot");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o755
    );

    // It runs there, as 65532, from the image's own files.
    let run = |root: &Path| {
        Command::new("chroot")
            .arg("--userspec=65532:65532")
            .arg(root)
            .args(["/redpilot", "version"])
            .output()
            .expect("chroot")
    };
    let o = run(&root);
    assert!(
        o.status.success(),
        "the binary did not run in the image: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("redpilot {}", version())
    );
    // The sidecar's command names `redpilot-exporter`: found on the image's
    // PATH, it runs there too.
    let o = Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(&root)
        .args(["redpilot-exporter", "--help"])
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .output()
        .expect("chroot");
    assert!(
        o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("usage: redpilot-exporter"),
        "the sidecar's binary did not run in the image: {:?} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    // ...and only from them: without one of its libraries it cannot start.
    let lib = ldd_names(BINARY)
        .into_iter()
        .find(|l| l.starts_with("libgcc_s"))
        .expect("the binary loads libgcc_s");
    std::fs::remove_file(root.join("lib/x86_64-linux-gnu").join(&lib)).expect("rm");
    let o = run(&root);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains(&lib),
        "without {lib}: {:?} {err}",
        o.status
    );
}
