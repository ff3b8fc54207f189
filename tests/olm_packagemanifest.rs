//! OperatorHub's view of Redpilot: OLM's package server runs in the test
//! ground as an aggregated API server, and `kubectl get packagemanifests
//! redpilot -o yaml` shows what OperatorHub lists: the channels and their
//! heads, the default channel, the CSV's description, icon, capability
//! level, and the examples a user starts from.
//!
//! The test ground runs OLM's programs as local processes (as
//! `tests/olm_e2e.rs` does): `bin/opm serve` serves catalog/, OLM's catalog
//! operator connects a CatalogSource to it, and `bin/package-server` serves
//! `packages.operators.coreos.com/v1` on a loopback port. The API server
//! reaches it through its APIService: a Service of type ExternalName
//! (`localhost`; there is no kube-proxy to route a ClusterIP) and a CA bundle
//! for the certificate the test makes for the Service's name. The package
//! server delegates authentication and authorization to the API server from
//! its in-cluster identity; it gets one from a ServiceAccount token mounted,
//! in a private mount namespace, where in-cluster clients look for it.
//!
//! Everything the test creates, cluster-scoped too, is deleted when it ends.

mod olm_cluster;
mod olm_common;
#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::ByteString;
use olm_cluster::*;
use olm_common::*;
use serde_json::{Value, json};
use support::{TestNamespace, client, kubeconfig_path, repo_root};

const APISERVICE: &str = "v1.packages.operators.coreos.com";

/// `bin/kubectl` with the dev cluster's kubeconfig; `stdin` is piped in.
fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(tool("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running kubectl: {e}"));
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("writing to kubectl");
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().expect("waiting for kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn apply(objects: &[Value]) {
    let text = objects
        .iter()
        .map(|o| o.to_string())
        .collect::<Vec<_>>()
        .join("\n---\n");
    let (ok, out, err) = kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            FIELD_MANAGER,
            "-f",
            "-",
        ],
        Some(&text),
    );
    assert!(ok, "kubectl apply failed: {out}{err}");
}

/// Deletes, when dropped, the cluster-scoped objects and the kube-system
/// RoleBinding the test made (the namespace takes the rest with it).
struct Cleanup {
    objects: Vec<Vec<String>>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for args in self.objects.iter().rev() {
            let mut a: Vec<&str> = vec!["delete", "--ignore-not-found", "--wait=false"];
            a.extend(args.iter().map(String::as_str));
            let (ok, _, err) = kubectl(&a, None);
            if !ok {
                eprintln!("cleanup: kubectl {}: {err}", a.join(" "));
            }
        }
    }
}

/// Polls `probe` every 500 ms for `within`; panics with `what` and the
/// last state (and the processes' logs) on timeout.
fn wait<T>(
    what: &str,
    within: Duration,
    procs: &mut [&mut Proc],
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        for p in procs.iter_mut() {
            p.assert_running();
        }
        match probe() {
            Ok(v) => {
                println!("{what}: {:.1}s", started.elapsed().as_secs_f64());
                return v;
            }
            Err(last) if started.elapsed() > within => {
                let logs: Vec<String> = procs.iter().map(|p| p.tail(25)).collect();
                panic!(
                    "{what} did not happen within {}s; last: {last}\n{}",
                    within.as_secs(),
                    logs.join("\n")
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The cluster's CA certificate and API server address, from the kubeconfig.
fn cluster_ca_and_server() -> (Vec<u8>, String) {
    let text = std::fs::read_to_string(kubeconfig_path()).expect("reading the kubeconfig");
    let kc: Value = serde_yaml::from_str(&text).expect("the kubeconfig is YAML");
    let cluster = &kc["clusters"][0]["cluster"];
    let ca = cluster["certificate-authority-data"]
        .as_str()
        .and_then(|b64| serde_json::from_value::<ByteString>(json!(b64)).ok())
        .map(|b| b.0)
        .expect("the kubeconfig has no certificate-authority-data");
    let server = cluster["server"].as_str().expect("no server").to_string();
    (ca, server)
}

/// Starts `bin/package-server` on `port`, in a private mount namespace whose
/// `/run` holds the in-cluster identity (`token`, the cluster's CA and the
/// namespace) at /run/secrets/kubernetes.io/serviceaccount.
fn start_package_server(
    identity: &Path,
    tls: &redis_server::TlsFiles,
    port: u16,
    ns: &str,
    logs: &Path,
) -> Proc {
    let (_, server) = cluster_ca_and_server();
    let hostport = server.trim_start_matches("https://");
    let (host, api_port) = hostport.rsplit_once(':').expect("server host:port");
    let script = r#"set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
cp "$1"/* /run/secrets/kubernetes.io/serviceaccount/
shift
exec "$@""#;
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
    ])
    .arg(identity)
    .arg(tool("package-server"))
    .arg("--kubeconfig")
    .arg(kubeconfig_path())
    .args([
        "--secure-port",
        &port.to_string(),
        "--bind-address",
        "127.0.0.1",
    ])
    .args(["--global-namespace", ns, "--interval", "5s"])
    .arg("--tls-cert-file")
    .arg(&tls.cert)
    .arg("--tls-private-key-file")
    .arg(&tls.key)
    .env("KUBERNETES_SERVICE_HOST", host)
    .env("KUBERNETES_SERVICE_PORT", api_port);
    Proc::start("package-server", &mut cmd, logs)
}

fn csv() -> Value {
    yaml_doc(&repo_root().join("bundle/manifests/redpilot.clusterserviceversion.yaml"))
}

/// The channels of the checked-in catalog: name → head (the entry no other
/// entry replaces or skips).
fn catalog_channels() -> (String, BTreeMap<String, String>) {
    let pkg = yaml_doc(&repo_root().join("catalog/redpilot/package.yaml"));
    let mut heads = BTreeMap::new();
    for ch in yaml_docs(&repo_root().join("catalog/redpilot/channels.yaml")) {
        let entries = ch["entries"].as_array().expect("entries");
        let replaced: BTreeSet<&str> = entries
            .iter()
            .flat_map(|e| {
                e["replaces"].as_str().into_iter().chain(
                    e["skips"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str()),
                )
            })
            .collect();
        let head: Vec<&str> = entries
            .iter()
            .filter_map(|e| e["name"].as_str())
            .filter(|n| !replaced.contains(n))
            .collect();
        assert_eq!(head.len(), 1, "channel {}: heads {head:?}", ch["name"]);
        heads.insert(
            ch["name"].as_str().expect("name").to_string(),
            head[0].to_string(),
        );
    }
    (
        pkg["defaultChannel"]
            .as_str()
            .expect("defaultChannel")
            .to_string(),
        heads,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packagemanifest_shows_what_operatorhub_lists() {
    for t in ["package-server", "catalog", "opm", "kubectl"] {
        tool(t);
    }
    let client = client().await;
    let ns = TestNamespace::new(&client, "olm-hub", &[]).await;
    let n = ns.name.as_str();
    install_olm_crds(&client).await;
    let work = tempfile::tempdir().expect("tempdir");
    let logs = work.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs dir");

    // The package server's identity and what it may do: delegated
    // authentication and authorization, and reading the API server's
    // client CA.
    let binding = format!("redpilot-test-packageserver-{n}");
    let _cleanup = Cleanup {
        objects: vec![
            vec!["clusterrolebinding".into(), binding.clone()],
            vec![
                "-n".into(),
                "kube-system".into(),
                "rolebinding".into(),
                binding.clone(),
            ],
            vec!["apiservice".into(), APISERVICE.into()],
        ],
    };
    let sa = json!({"kind": "ServiceAccount", "name": "packageserver", "namespace": n});
    apply(&[
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "packageserver", "namespace": n}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": binding},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "system:auth-delegator"},
               "subjects": [sa]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": binding, "namespace": "kube-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "extension-apiserver-authentication-reader"},
               "subjects": [sa]}),
    ]);
    let (ok, token, err) = kubectl(
        &[
            "-n",
            n,
            "create",
            "token",
            "packageserver",
            "--duration",
            "1h",
        ],
        None,
    );
    assert!(ok, "kubectl create token: {err}");
    let identity = work.path().join("identity");
    std::fs::create_dir_all(&identity).expect("identity dir");
    let (cluster_ca, _) = cluster_ca_and_server();
    std::fs::write(identity.join("token"), token.trim()).expect("token");
    std::fs::write(identity.join("ca.crt"), cluster_ca).expect("ca");
    std::fs::write(identity.join("namespace"), n).expect("namespace");

    // Served under the Service's name, with a CA of the test's own.
    let service = "packageserver";
    let tls = redis_server::TlsFiles::generate_for(
        &work.path().join("tls"),
        &[&format!("{service}.{n}.svc"), "localhost"],
    );
    let port = redis_server::free_port();
    let mut ps = start_package_server(&identity, &tls, port, n, &logs);
    apply(&[
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": service, "namespace": n},
               "spec": {"type": "ExternalName", "externalName": "localhost",
                        "ports": [{"name": "https", "port": port}]}}),
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": APISERVICE},
               "spec": {"group": "packages.operators.coreos.com", "version": "v1",
                        "groupPriorityMinimum": 2000, "versionPriority": 15,
                        "caBundle": base64(&tls.ca_pem),
                        "service": {"name": service, "namespace": n, "port": port}}}),
    ]);
    wait(
        &format!("APIService {APISERVICE} Available"),
        Duration::from_secs(60),
        &mut [&mut ps],
        || {
            let (_, out, err) = kubectl(&["get", "apiservice", APISERVICE, "-o", "json"], None);
            let v: Value = serde_json::from_str(&out).map_err(|_| err.clone())?;
            let conds = v["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            conds
                .iter()
                .find(|c| c["type"] == "Available" && c["status"] == "True")
                .map(|_| ())
                .ok_or_else(|| format!("{conds:?}"))
        },
    );

    // The catalog, as a CatalogSource OLM's catalog operator connects.
    let (_opm, opm_port) = serve_catalog(&repo_root().join("catalog"), "opm-serve", &logs);
    let mut catalog = Proc::start(
        "catalog",
        Command::new(tool("catalog"))
            .env("KUBECONFIG", kubeconfig_path())
            .args(["--namespace", n, "--writeStatusName", ""]),
        &logs,
    );
    apply(&[json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
        "metadata": {"name": "redpilot-catalog", "namespace": n},
        "spec": {"sourceType": "grpc", "address": format!("127.0.0.1:{opm_port}"),
                 "displayName": "Redpilot test catalog", "publisher": "Redpilot"}})]);

    let pm: Value = wait(
        "kubectl get packagemanifests redpilot",
        Duration::from_secs(120),
        &mut [&mut ps, &mut catalog],
        || {
            let (ok, out, err) = kubectl(
                &["-n", n, "get", "packagemanifests", "redpilot", "-o", "yaml"],
                None,
            );
            if !ok {
                return Err(err);
            }
            serde_yaml::from_str(&out).map_err(|e| format!("not YAML: {e}"))
        },
    );
    // As listed: one row, from the test's catalog.
    let (_, list, _) = kubectl(&["-n", n, "get", "packagemanifests"], None);
    println!("kubectl get packagemanifests -n {n}:\n{list}");

    // What OperatorHub shows.
    let csv = csv();
    let status = &pm["status"];
    let (default_channel, heads) = catalog_channels();
    assert_eq!(status["packageName"], "redpilot");
    assert_eq!(status["catalogSource"], "redpilot-catalog");
    assert_eq!(status["catalogSourceDisplayName"], "Redpilot test catalog");
    assert_eq!(status["catalogSourcePublisher"], "Redpilot");
    assert_eq!(status["provider"]["name"], csv["spec"]["provider"]["name"]);
    assert_eq!(status["defaultChannel"], default_channel.as_str());
    let channels: BTreeMap<String, &Value> = status["channels"]
        .as_array()
        .expect("status.channels")
        .iter()
        .map(|c| (c["name"].as_str().unwrap_or_default().to_string(), c))
        .collect();
    assert_eq!(
        channels.keys().collect::<Vec<_>>(),
        heads.keys().collect::<Vec<_>>(),
        "the package's channels are the catalog's"
    );
    let name = csv["metadata"]["name"].as_str().expect("CSV name");
    for (ch, c) in &channels {
        assert_eq!(c["currentCSV"], heads[ch].as_str(), "channel {ch}'s head");
        assert_eq!(c["currentCSV"], name, "channel {ch} leads to this release");
    }
    let desc = &channels[&default_channel]["currentCSVDesc"];
    let annotations = &desc["annotations"];
    for (field, want) in [
        ("displayName", &csv["spec"]["displayName"]),
        ("description", &csv["spec"]["description"]),
        ("version", &csv["spec"]["version"]),
        ("provider", &csv["spec"]["provider"]),
        ("keywords", &csv["spec"]["keywords"]),
        ("maintainers", &csv["spec"]["maintainers"]),
        ("links", &csv["spec"]["links"]),
        ("installModes", &csv["spec"]["installModes"]),
    ] {
        assert_eq!(&desc[field], want, "currentCSVDesc.{field}");
    }
    // The package server leaves the icon out of the object and serves it as
    // the `icon` subresource, which OperatorHub's UI shows.
    assert!(desc["icon"].is_null(), "the icon is served on its own");
    let icon_path = format!(
        "/apis/packages.operators.coreos.com/v1/namespaces/{n}/packagemanifests/redpilot/icon"
    );
    let (ok, icon, err) = kubectl(&["get", "--raw", &icon_path], None);
    assert!(ok, "GET {icon_path}: {err}");
    let svg = std::fs::read_to_string(repo_root().join("config/manifests/icon/redpilot.svg"))
        .expect("the icon");
    assert_eq!(icon, svg, "the packagemanifest's icon is Redpilot's");
    assert_eq!(csv["spec"]["icon"][0]["mediatype"], "image/svg+xml");
    assert_eq!(
        annotations["capabilities"], csv["metadata"]["annotations"]["capabilities"],
        "the capability level"
    );
    assert_eq!(annotations["capabilities"], "Auto Pilot");
    for a in ["categories", "containerImage", "description", "repository"] {
        assert_eq!(
            annotations[a], csv["metadata"]["annotations"][a],
            "annotation {a}"
        );
    }
    let examples: Value =
        serde_json::from_str(annotations["alm-examples"].as_str().expect("alm-examples"))
            .expect("alm-examples is JSON");
    let want: Value = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .expect("CSV alm-examples"),
    )
    .expect("CSV alm-examples is JSON");
    assert_eq!(examples, want, "the examples");
    let kinds: BTreeSet<&str> = examples
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["Redis", "RedisBackup", "RedisBackupSchedule"])
    );
    let owned: BTreeSet<&str> = desc["customresourcedefinitions"]["owned"]
        .as_array()
        .expect("owned CRDs")
        .iter()
        .filter_map(|c| c["kind"].as_str())
        .collect();
    assert_eq!(
        owned,
        BTreeSet::from(["Redis", "RedisBackup", "RedisBackupSchedule"])
    );
    println!(
        "packagemanifest redpilot: default channel {default_channel}, channels {:?}, {} {} ({}), icon {} bytes, {} examples",
        channels.keys().collect::<Vec<_>>(),
        desc["displayName"].as_str().unwrap_or_default(),
        desc["version"].as_str().unwrap_or_default(),
        annotations["capabilities"].as_str().unwrap_or_default(),
        icon.len(),
        kinds.len()
    );

    // A global catalog's package is listed in every namespace.
    let other = TestNamespace::new(&client, "olm-hub-user", &[]).await;
    let (ok, out, err) = kubectl(
        &[
            "-n",
            &other.name,
            "get",
            "packagemanifests",
            "redpilot",
            "-o",
            "name",
        ],
        None,
    );
    assert!(
        ok && out.trim() == "packagemanifest.packages.operators.coreos.com/redpilot",
        "{out}{err}"
    );
    ps.assert_running();
}

/// Base64, as the API carries bytes.
fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(ByteString(bytes.to_vec())).expect("base64")
}
