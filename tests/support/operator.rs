//! Runs the operator as the suites' system under test: installs the CRDs and
//! `config/rbac/`, binds the operator's ClusterRole in each namespace it
//! watches (the RoleBinding of `config/rbac/role_binding.yaml`, one per
//! namespace: nothing is granted cluster-wide), then starts `redpilot run` as
//! a child process that authenticates as the ServiceAccount
//! `redpilot-system/redpilot-operator` (a TokenRequest token in a kubeconfig
//! of its own), so the suites prove the operator works with exactly the
//! permissions of `config/rbac/` and not as cluster admin.
//!
//! Also: helpers for `Redis` objects (apply, wait for Ready with diagnostics),
//! the generated password, connections to pod IPs, `bin/kubectl`, the
//! operator's Prometheus metrics, its log and its RSS.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use redpilot::api::v1alpha1::{Redis, ReshardingPhase};
use redpilot::redis::{ConnectOptions, Endpoint, Node};
use serde::de::DeserializeOwned;
use serde::{Deserialize as _, Serialize};
use serde_json::{Value, json};

use super::{kubeconfig_path, repo_root, unique_name, wait_for};

/// Field manager of everything the suites apply.
pub const FIELD_MANAGER: &str = "redpilot-tests";
/// Namespace of the operator's ServiceAccount and of its leader-election Lease.
pub const OPERATOR_NAMESPACE: &str = "redpilot-system";
/// The operator's ServiceAccount (config/rbac/service_account.yaml).
pub const SERVICE_ACCOUNT: &str = "redpilot-operator";
/// The files of `config/rbac/`, in the order they are applied.
pub const RBAC_FILES: &[&str] = &[
    "service_account.yaml",
    "role.yaml",
    "role_binding.yaml",
    "leader_election_role.yaml",
    "leader_election_role_binding.yaml",
];

fn ssa() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

// ---------------------------------------------------------------------------
// CRDs and RBAC
// ---------------------------------------------------------------------------

pub fn crds_path() -> PathBuf {
    match std::env::var_os("REDPILOT_TEST_CRDS") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join("crds/redis.yaml"),
    }
}

/// The CRDs of the checked-in `crds/redis.yaml` (or of the file named by
/// `REDPILOT_TEST_CRDS`, to try a candidate CRD without touching the tree).
pub fn checked_in_crds() -> Vec<CustomResourceDefinition> {
    let path = crds_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            CustomResourceDefinition::deserialize(doc)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .collect()
}

/// Installs (server-side applies) `crds/redis.yaml` and waits until every CRD
/// is Established. Fails with the apiserver's reason when it refuses them.
pub async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in checked_in_crds() {
        let name = crd.metadata.name.clone().expect("CRD has a name");
        api.patch(&name, &ssa(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the apiserver refused CRD {name} from {}: {e}\n\
                     (fix the type or rule in src/api/, then `cargo run -- crd --output crds/redis.yaml`)",
                    crds_path().display()
                )
            });
        wait_established(&api, &name, Duration::from_secs(30)).await;
    }
}

/// Installs (server-side applies) third-party CRD files, such as the
/// prometheus-operator's or cert-manager's, and waits until each is
/// Established.
pub async fn install_crd_files(client: &Client, files: &[std::path::PathBuf]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for f in files {
        let text =
            std::fs::read_to_string(f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", f.display()));
        let name = crd.metadata.name.clone().expect("CRD has a name");
        api.patch(&name, &ssa(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("installing {name}: {e}"));
        wait_established(&api, &name, Duration::from_secs(30)).await;
    }
}

/// Waits until the CRD `name` is Established (its type is served).
pub async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str, within: Duration) {
    wait_for(&format!("CRD {name} to be Established"), within, || async {
        let crd = api.get(name).await.ok()?;
        let conds = crd.status?.conditions?;
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
}

fn read_yaml_docs(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

async fn apply_typed<K>(api: Api<K>, doc: &Value)
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = doc["metadata"]["name"]
        .as_str()
        .expect("RBAC object has metadata.name");
    api.patch(name, &ssa(), &Patch::Apply(doc))
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", doc["kind"]));
}

/// The ClusterRoleBinding `config/rbac/` had in earlier releases (the ClusterRole
/// bound cluster-wide). A cluster that still has it grants the operator every
/// namespace, which would hide a missing per-namespace RoleBinding.
const LEGACY_CLUSTER_ROLE_BINDING: &str = "redpilot-operator";

/// Creates the operator namespace, applies every file of `config/rbac/` with
/// the admin client and deletes the legacy ClusterRoleBinding if a cluster
/// still has it. The operator may then act in its own namespace only; see
/// [`bind_watched_namespaces`] for the namespaces it watches.
pub async fn apply_rbac(client: &Client) {
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.patch(
        OPERATOR_NAMESPACE,
        &ssa(),
        &Patch::Apply(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": OPERATOR_NAMESPACE},
        })),
    )
    .await
    .unwrap_or_else(|e| panic!("creating namespace {OPERATOR_NAMESPACE}: {e}"));
    for file in RBAC_FILES {
        let path = repo_root().join("config/rbac").join(file);
        for doc in read_yaml_docs(&path) {
            let namespace = doc["metadata"]["namespace"]
                .as_str()
                .unwrap_or(OPERATOR_NAMESPACE)
                .to_string();
            match doc["kind"].as_str() {
                Some("ServiceAccount") => {
                    apply_typed::<ServiceAccount>(Api::namespaced(client.clone(), &namespace), &doc)
                        .await
                }
                Some("ClusterRole") => {
                    apply_typed::<ClusterRole>(Api::all(client.clone()), &doc).await
                }
                Some("ClusterRoleBinding") => {
                    apply_typed::<ClusterRoleBinding>(Api::all(client.clone()), &doc).await
                }
                Some("Role") => {
                    apply_typed::<Role>(Api::namespaced(client.clone(), &namespace), &doc).await
                }
                Some("RoleBinding") => {
                    apply_typed::<RoleBinding>(Api::namespaced(client.clone(), &namespace), &doc)
                        .await
                }
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            }
        }
    }
    match Api::<ClusterRoleBinding>::all(client.clone())
        .delete(LEGACY_CLUSTER_ROLE_BINDING, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            panic!("deleting the legacy ClusterRoleBinding {LEGACY_CLUSTER_ROLE_BINDING}: {e}")
        }
    }
}

/// The RoleBinding of `config/rbac/role_binding.yaml`: the operator's
/// ClusterRole granted in one namespace.
fn watched_namespace_binding() -> Value {
    let path = repo_root().join("config/rbac/role_binding.yaml");
    let docs = read_yaml_docs(&path);
    assert!(
        docs.len() == 1 && docs[0]["kind"] == "RoleBinding",
        "{}: one RoleBinding expected (the operator is granted per namespace)",
        path.display()
    );
    docs[0].clone()
}

/// Applies the RoleBinding of `config/rbac/role_binding.yaml` in each of
/// `namespaces` (which must exist), as a user binds a namespace the operator
/// is to watch (`WATCH_NAMESPACE`). The bindings go with the namespaces.
pub async fn bind_watched_namespaces(client: &Client, namespaces: &[String]) {
    assert!(
        !namespaces.is_empty(),
        "the suites run the operator with explicit WATCH_NAMESPACE namespaces: \
         config/rbac/ grants it namespace by namespace, never cluster-wide"
    );
    let template = watched_namespace_binding();
    for ns in namespaces {
        let mut doc = template.clone();
        doc["metadata"]["namespace"] = json!(ns);
        apply_typed::<RoleBinding>(Api::namespaced(client.clone(), ns), &doc).await;
    }
    // The apiserver's authorizer learns of a new binding from a watch; wait
    // until it grants it, so the operator's first requests are not refused.
    for ns in namespaces {
        wait_for(
            &format!("the authorizer to let {SERVICE_ACCOUNT} read Secrets in {ns}"),
            Duration::from_secs(30),
            || async {
                operator_may(client, ns, "get", "", "secrets")
                    .await
                    .then_some(())
            },
        )
        .await;
    }
}

/// Whether the apiserver's authorizer lets the operator's ServiceAccount do
/// `verb` on `group`/`resource` (`resource/subresource` allowed) in `ns`
/// (cluster-wide when empty): a SubjectAccessReview, as the admin client.
pub async fn operator_may(
    client: &Client,
    ns: &str,
    verb: &str,
    group: &str,
    resource: &str,
) -> bool {
    service_account_may(
        client,
        OPERATOR_NAMESPACE,
        SERVICE_ACCOUNT,
        ns,
        verb,
        group,
        resource,
    )
    .await
}

/// Whether ServiceAccount `sa_namespace/sa` may do `verb` on
/// `group`/`resource` (`resource/subresource` allowed) in `ns` (cluster-wide
/// when empty), by a SubjectAccessReview with the ServiceAccount's groups.
pub async fn service_account_may(
    client: &Client,
    sa_namespace: &str,
    sa: &str,
    ns: &str,
    verb: &str,
    group: &str,
    resource: &str,
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{sa_namespace}:{sa}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{sa_namespace}"),
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
        .unwrap_or_else(|e| panic!("SubjectAccessReview for {sa_namespace}/{sa}: {e}"))
        .status
        .is_some_and(|s| s.allowed)
}

/// Writes a kubeconfig that authenticates as the operator's ServiceAccount
/// with a fresh one-hour TokenRequest token, against the server and CA of the
/// test cluster's kubeconfig.
pub async fn service_account_kubeconfig(client: &Client, dir: &Path) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {OPERATOR_NAMESPACE}/{SERVICE_ACCOUNT}: {e}"))
        .status
        .expect("TokenRequest has a status")
        .token;

    let admin_path = kubeconfig_path();
    let admin: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(&admin_path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", admin_path.display())),
    )
    .unwrap_or_else(|e| panic!("parsing {}: {e}", admin_path.display()));
    let current = admin["current-context"].as_str().unwrap_or_default();
    let cluster_name = admin["contexts"]
        .as_sequence()
        .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some(current)))
        .and_then(|c| c["context"]["cluster"].as_str())
        .unwrap_or_else(|| panic!("{}: no current context", admin_path.display()));
    let cluster = admin["clusters"]
        .as_sequence()
        .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some(cluster_name)))
        .map(|c| c["cluster"].clone())
        .unwrap_or_else(|| panic!("{}: no cluster {cluster_name}", admin_path.display()));
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": SERVICE_ACCOUNT}}],
        "current-context": "operator",
    });
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        serde_yaml::to_string(&config).expect("kubeconfig yaml"),
    )
    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

// ---------------------------------------------------------------------------
// The operator process
// ---------------------------------------------------------------------------

/// [`OperatorOptions::crash_lease`]: renewed every 3 s, given up after 8 s
/// without an answer.
pub const CRASH_LEASE_SECONDS: &str = "10";

/// How to start one operator process.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// A short name for logs and the process identity (`POD_NAME`).
    pub name: String,
    /// `WATCH_NAMESPACE`: the namespaces it reconciles.
    pub watch_namespaces: Vec<String>,
    /// The leader-election Lease in `redpilot-system`.
    pub lease_name: String,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Start it again when it exits because it lost its lease (as the
    /// Deployment's pod is restarted in a cluster). Any other exit is left
    /// for the test to see.
    pub restart_on_lost_lease: bool,
    /// Another build of the operator to run (a bench comparing builds);
    /// `None`: the one under test ([`operator_binary`]).
    pub binary: Option<PathBuf>,
    /// The API server's address as the operator reaches it (a relay that a
    /// test can cut, [`super::faults::ApiRelay`]); `None`: the cluster's own.
    pub api_server: Option<String>,
    /// Start it again, without `REDPILOT_FAILPOINTS`, when it exits at a
    /// failpoint (as the Deployment's pod would be restarted after a
    /// crash); the log says which point it stopped at. Without it such an
    /// exit is left for the test to see.
    pub restart_after_failpoint: bool,
}

impl OperatorOptions {
    /// An operator watching `namespaces`, with a Lease of its own (so suites
    /// running side by side do not elect each other's operators).
    pub fn watching(namespaces: &[&str]) -> Self {
        OperatorOptions {
            name: unique_name("op"),
            watch_namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            lease_name: unique_name("redpilot-leader"),
            env: Vec::new(),
            restart_on_lost_lease: true,
            binary: None,
            api_server: None,
            restart_after_failpoint: false,
        }
    }

    /// A lease short enough that a successor takes over soon after this
    /// process is killed at a failpoint (no release), long enough that a
    /// loaded API server (reads of 4 s seen under the test pool) does not
    /// take it first: a process that loses its lease before the failpoint
    /// is restarted and may resume past the step the failpoint marks, so
    /// the test would never see the crash it is about.
    pub fn crash_lease(mut self) -> Self {
        self.env
            .push(("LEASE_DURATION_SECONDS".into(), CRASH_LEASE_SECONDS.into()));
        self
    }

    /// Never restarted by the harness (for tests that watch it exit).
    pub fn no_restart(mut self) -> Self {
        self.restart_on_lost_lease = false;
        self
    }

    /// The same watch list and Lease under another process name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = unique_name(name);
        self
    }
}

/// A running `redpilot run`, killed when dropped. When the test panics, the
/// drop prints the log's path and its last lines; otherwise it fails the test
/// if the log shows a request refused by RBAC.
pub struct Operator {
    child: Arc<Mutex<Option<Child>>>,
    supervisor: Option<Supervisor>,
    /// Options it was started with.
    pub opts: OperatorOptions,
    /// stderr + stdout of the process.
    pub log_path: PathBuf,
    /// Where its Prometheus metrics are served.
    pub metrics_addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// A free loopback TCP port (bound and released; the caller binds it next).
pub fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The operator binary under test: this build's, or the one
/// `REDPILOT_TEST_OPERATOR_BIN` names (the benches run the release build of
/// the operator under test code built in the dev profile).
pub fn operator_binary() -> PathBuf {
    match std::env::var_os("REDPILOT_TEST_OPERATOR_BIN") {
        Some(bin) if !bin.is_empty() => PathBuf::from(bin),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_redpilot")),
    }
}

/// Directory for operator logs (`$CARGO_TARGET_TMPDIR/operator-logs`).
pub fn log_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operator-logs");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Installs the CRDs and RBAC, then starts one operator as the ServiceAccount.
pub async fn start_operator(client: &Client, opts: OperatorOptions) -> Operator {
    install_crds(client).await;
    apply_rbac(client).await;
    spawn_operator(client, opts).await
}

/// Starts one operator as the ServiceAccount (CRDs and RBAC must be in place;
/// its watched namespaces are bound here).
pub async fn spawn_operator(client: &Client, opts: OperatorOptions) -> Operator {
    bind_watched_namespaces(client, &opts.watch_namespaces).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = service_account_kubeconfig(client, dir.path()).await;
    if let Some(server) = &opts.api_server {
        let text = std::fs::read_to_string(&kubeconfig).expect("the operator's kubeconfig");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig yaml");
        config["clusters"][0]["cluster"]["server"] = serde_yaml::Value::from(server.as_str());
        std::fs::write(
            &kubeconfig,
            serde_yaml::to_string(&config).expect("kubeconfig yaml"),
        )
        .expect("writing the operator's kubeconfig");
    }
    let log_path = log_dir().join(format!("{}.log", opts.name));
    // A fresh log; restarts append to it.
    std::fs::File::create(&log_path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", log_path.display()));
    let metrics_addr: SocketAddr = format!("127.0.0.1:{}", free_loopback_port())
        .parse()
        .expect("socket addr");
    let bin = opts.binary.clone().unwrap_or_else(operator_binary);
    let command = {
        let (bin, kubeconfig, log_path, opts) = (
            bin.clone(),
            kubeconfig.clone(),
            log_path.clone(),
            opts.clone(),
        );
        move |disarmed: bool| {
            let mut opts = opts.clone();
            if disarmed {
                opts.env.retain(|(k, _)| k != "REDPILOT_FAILPOINTS");
            }
            operator_command(&bin, &kubeconfig, &log_path, &opts, metrics_addr)
        }
    };
    let child = command(false)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let child = Arc::new(Mutex::new(Some(child)));
    let supervisor = opts.restart_on_lost_lease.then(|| {
        let name = opts.name.clone();
        let after_failpoint = opts.restart_after_failpoint;
        Supervisor::start(
            child.clone(),
            log_path.clone(),
            name,
            after_failpoint,
            command,
        )
    });
    let mut op = Operator {
        child,
        supervisor,
        opts,
        log_path,
        metrics_addr,
        _dir: dir,
    };
    wait_serving(&mut op, &bin).await;
    op
}

/// The `redpilot run` command of `opts`, logging (appending) to `log_path`.
fn operator_command(
    bin: &std::path::Path,
    kubeconfig: &std::path::Path,
    log_path: &std::path::Path,
    opts: &OperatorOptions,
    metrics_addr: SocketAddr,
) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", log_path.display()));
    // Text logs unless the options ask for JSON (REDPILOT_LOG_FORMAT).
    let format = opts
        .env
        .iter()
        .find(|(k, _)| k == "REDPILOT_LOG_FORMAT")
        .map(|(_, v)| v.as_str())
        .unwrap_or("text");
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--log-format", format])
        .args(["--metrics-addr", &metrics_addr.to_string()])
        .args(["--leader-election-namespace", OPERATOR_NAMESPACE])
        .args(["--lease-name", &opts.lease_name])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("WATCH_NAMESPACE", opts.watch_namespaces.join(","))
        .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
        .env("POD_NAME", &opts.name)
        .env(
            "RUST_LOG",
            std::env::var("REDPILOT_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log);
    cmd
}

/// Restarts an operator that exited because it lost its lease (its last
/// log line says so), as the Deployment's pod would be restarted; says so
/// on stderr and in the log. With `after_failpoint`, one that exited at a
/// failpoint too, and from then on without failpoints (the log names the
/// point: `harness: operator … stopped at failpoint <name>`). Any other
/// exit is left alone.
struct Supervisor {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Supervisor {
    fn start(
        child: Arc<Mutex<Option<Child>>>,
        log_path: PathBuf,
        name: String,
        after_failpoint: bool,
        command: impl Fn(bool) -> Command + Send + 'static,
    ) -> Self {
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut disarmed = false;
            while !halt.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                let Ok(mut guard) = child.lock() else { return };
                if halt.load(Ordering::SeqCst) {
                    return;
                }
                let Some(status) = guard.as_mut().and_then(|c| c.try_wait().ok().flatten()) else {
                    continue;
                };
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                let failpoint = tail
                    .iter()
                    .find(|l| l.contains("failpoint reached"))
                    .and_then(|l| l.split("failpoint=").nth(1))
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(|p| p.trim_matches('"').to_string());
                let note = match failpoint {
                    Some(point) if after_failpoint => {
                        disarmed = true;
                        format!(
                            "harness: operator {name} stopped at failpoint {point} ({status}); \
                             restarting it without failpoints, as its pod would be"
                        )
                    }
                    _ if tail.iter().any(|l| l.contains("lost leadership")) => format!(
                        "harness: operator {name} exited ({status}) after losing its lease; \
                         restarting it, as its pod would be"
                    ),
                    _ => return,
                };
                eprintln!("warning: {note}");
                if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&log_path) {
                    let _ = writeln!(f, "--- {note} ---");
                }
                match command(disarmed).spawn() {
                    Ok(c) => *guard = Some(c),
                    Err(e) => {
                        eprintln!("warning: restarting operator {name}: {e}");
                        return;
                    }
                }
            }
        });
        Supervisor {
            stop,
            thread: Some(thread),
        }
    }

    fn halt(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until the operator serves its metrics. A process that exits first
/// is a failure, with its log.
async fn wait_serving(op: &mut Operator, bin: &std::path::Path) {
    let start = Instant::now();
    loop {
        if let Some(status) = op.exit_status() {
            // Stopped at a failpoint already: the supervisor starts it
            // again without failpoints.
            if op.opts.restart_after_failpoint
                && status.code() == Some(redpilot::failpoint::EXIT_CODE)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            panic!(
                "the operator `{} run` exited at start with {status}; log {}:\n{}",
                bin.display(),
                op.log_path.display(),
                op.log_tail(40)
            );
        }
        if op.metrics().await.is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            eprintln!(
                "warning: operator {} does not serve metrics on {} after 20s; carrying on (log {})",
                op.opts.name,
                op.metrics_addr,
                op.log_path.display()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Operator {
    /// How many times the harness started it again after it lost its lease
    /// (each new process starts its metrics from zero).
    pub fn restarts(&self) -> usize {
        std::fs::read_to_string(&self.log_path)
            .map(|t| t.matches("--- harness: operator").count())
            .unwrap_or(0)
    }
}

impl Operator {
    fn take_child(&mut self) -> Option<Child> {
        if let Some(s) = self.supervisor.as_mut() {
            s.halt();
        }
        self.child.lock().ok()?.take()
    }

    /// Process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().ok()?.as_ref().map(|c| c.id())
    }

    /// The exit status if it has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .lock()
            .ok()?
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.pid().is_some() && self.exit_status().is_none()
    }

    /// SIGKILL (a crash: no lease release) and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.take_child() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (a graceful stop) and wait up to `timeout`; SIGKILL after.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.take_child()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        child.wait().ok()
    }

    /// CPU time used so far, user and system, in seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.pid().map(cpu_seconds)
    }

    /// Resident set size in KiB (`VmRSS` of /proc/<pid>/status).
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Everything the process logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_path) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Fails when the operator's log shows a request refused by RBAC (the
    /// ServiceAccount lacks a permission `config/rbac/` should grant).
    pub fn assert_no_rbac_denials(&self) {
        let denied: Vec<String> = self
            .log_text()
            .lines()
            // The API server's RBAC refusal ("... is forbidden: User ... cannot
            // ..."), not any 403 (an S3 store's refusal is a backup's event).
            .filter(|l| l.contains("is forbidden: User"))
            .map(str::to_string)
            .collect();
        assert!(
            denied.is_empty(),
            "operator {} was refused by RBAC (log {}):\n{}",
            self.opts.name,
            self.log_path.display(),
            denied.join("\n")
        );
    }

    /// The `/metrics` page, or `None` when it does not answer.
    pub async fn metrics(&self) -> Option<String> {
        http_get(self.metrics_addr, "/metrics").await
    }

    /// Sum of every sample of metric family `name` (all label sets), or `None`
    /// when the page or the family is missing.
    pub async fn metric_sum(&self, name: &str) -> Option<f64> {
        metric_sum(&self.metrics().await?, name)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- operator {} log: {} (last 60 lines) ---\n{}\n--- end of operator log ---",
                self.opts.name,
                self.log_path.display(),
                self.log_tail(60)
            );
        }
        self.kill();
        // Every suite proves config/rbac/ suffices: a request refused by RBAC
        // fails the test even when its assertions passed.
        if !std::thread::panicking() {
            self.assert_no_rbac_denials();
        }
    }
}

/// A minimal HTTP/1.0 GET on loopback; the status code and the body.
pub async fn http_status(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let code = head
            .lines()
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some((code, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .ok()
        .flatten()
}

/// A minimal HTTP/1.0 GET on loopback; the body on a 200.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    match http_status(addr, path).await? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// Sums the samples of a Prometheus text-format family (`name` and
/// `name{...}` lines; not `name_bucket` etc.).
pub fn metric_sum(page: &str, name: &str) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let after_labels = match rest.strip_prefix('{') {
            Some(r) => r.rfind('}').map(|i| &r[i + 1..]).unwrap_or(""),
            None => rest,
        };
        // `value [timestamp]`
        let value = after_labels
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value {
            found = true;
            sum += v;
        }
    }
    found.then_some(sum)
}

/// The holder of Lease `name` in `redpilot-system`.
pub async fn lease_holder(client: &Client, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    leases.get_opt(name).await.ok()??.spec?.holder_identity
}

// ---------------------------------------------------------------------------
// Redis objects
// ---------------------------------------------------------------------------

/// `Api<Redis>` in `ns`.
pub fn redis_api(client: &Client, ns: &str) -> Api<Redis> {
    Api::namespaced(client.clone(), ns)
}

/// Server-side applies Redis `name` with `spec` (JSON) as the test manager.
pub async fn apply_redis(client: &Client, ns: &str, name: &str, spec: Value) -> Redis {
    let obj = json!({
        "apiVersion": "redpilot.io/v1alpha1",
        "kind": "Redis",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    });
    redis_api(client, ns)
        .patch(name, &ssa(), &Patch::Apply(&obj))
        .await
        .unwrap_or_else(|e| panic!("applying Redis {ns}/{name}: {e}"))
}

/// Merge-patches Redis `name`.
pub async fn patch_redis(client: &Client, ns: &str, name: &str, patch: Value) -> Redis {
    redis_api(client, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patching Redis {ns}/{name} with {patch}: {e}"))
}

/// Whether `r` is Ready for its current generation.
pub fn is_ready(r: &Redis) -> bool {
    let Some(status) = r.status.as_ref() else {
        return false;
    };
    let ready_cond = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    status.observed_generation.is_some()
        && status.observed_generation == r.metadata.generation
        && ready_cond
        && status.phase.is_some_and(|p| format!("{p:?}") == "Ready")
}

/// Waits until Redis `name` is Ready for its current generation; on timeout
/// fails with its last status and the namespace's recent events.
pub async fn wait_ready(client: &Client, ns: &str, name: &str, timeout: Duration) -> Redis {
    let api = redis_api(client, ns);
    let start = Instant::now();
    let mut last: Option<Redis> = None;
    loop {
        match api.get_opt(name).await {
            Ok(Some(r)) if is_ready(&r) => return r,
            Ok(r) => last = r,
            Err(_) => {}
        }
        if start.elapsed() > timeout {
            let status = last
                .as_ref()
                .map(|r| {
                    format!(
                        "generation {:?}, status {}",
                        r.metadata.generation,
                        serde_json::to_string_pretty(&r.status).unwrap_or_default()
                    )
                })
                .unwrap_or_else(|| "not found".into());
            panic!(
                "Redis {ns}/{name} not Ready within {:.0}s: {status}\nrecent events in {ns}:\n{}{}",
                timeout.as_secs_f64(),
                recent_events(client, ns, 25).await,
                super::diag::report().await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The last `n` events of a namespace, one line each.
pub async fn recent_events(client: &Client, ns: &str, n: usize) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let mut list = match events.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => return format!("(listing events: {e})"),
    };
    // An event repeated (the same reason and text) is one Event whose
    // series says when it was last seen: sort by that, or a failover
    // reported as often before would count among the oldest.
    list.sort_by_key(|e| {
        [
            e.series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0),
            e.last_timestamp.as_ref().map(|t| t.0),
            e.event_time.as_ref().map(|t| t.0),
        ]
        .into_iter()
        .flatten()
        .max()
    });
    list.iter()
        .rev()
        .take(n)
        .rev()
        .map(|e| {
            format!(
                "  {} {}/{} {}: {}",
                e.type_.as_deref().unwrap_or("?"),
                e.involved_object.kind.as_deref().unwrap_or("?"),
                e.involved_object.name.as_deref().unwrap_or("?"),
                e.reason.as_deref().unwrap_or("?"),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The password in Secret `<redis>-auth` (key `password`).
pub async fn redis_password(client: &Client, ns: &str, redis: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = format!("{redis}-auth");
    let secret = secrets
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("reading Secret {ns}/{name}: {e}"));
    let bytes = secret
        .data
        .and_then(|d| d.get("password").cloned())
        .unwrap_or_else(|| panic!("Secret {ns}/{name} has no key `password`"));
    String::from_utf8(bytes.0).expect("password is UTF-8")
}

/// The IP of pod `pod`.
pub async fn pod_ip(client: &Client, ns: &str, pod: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("pod {ns}/{pod} to have an IP"),
        Duration::from_secs(30),
        || async {
            pods.get_opt(pod)
                .await
                .ok()??
                .status?
                .pod_ip
                .filter(|ip| !ip.is_empty())
        },
    )
    .await
}

/// The members of the 3 x 2 Cluster Redis `name` (pods `<name>-s<shard>-<j>`),
/// from its pods' IPs.
pub async fn cluster_members(
    client: &Client,
    ns: &str,
    name: &str,
) -> Vec<redpilot::redis::cluster::Member> {
    let mut out = Vec::new();
    for s in 0..3 {
        for j in 0..2 {
            let ip = pod_ip(client, ns, &format!("{name}-s{s}-{j}")).await;
            out.push(redpilot::redis::cluster::Member {
                endpoint: Endpoint::new(ip, 6379),
                bus_port: 16379,
            });
        }
    }
    out
}

/// Connects to port 6379 of pod `pod` with `password`.
pub async fn connect_pod(
    client: &Client,
    ns: &str,
    pod: &str,
    password: &str,
) -> redpilot::redis::Result<Node> {
    let ip = pod_ip(client, ns, pod).await;
    Node::connect(
        &Endpoint::new(ip, 6379),
        &ConnectOptions::default().with_password(password),
    )
    .await
}

/// Runs `bin/kubectl` against the test cluster; fails when it is missing.
pub fn kubectl(args: &[&str]) -> std::process::Output {
    let bin = repo_root().join("bin/kubectl");
    assert!(
        bin.exists(),
        "{} is missing: run `bash dev/cluster.sh up` (it builds the cluster's tools into bin/)",
        bin.display()
    );
    Command::new(&bin)
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()))
}

/// Pods of Redis `name` by pod name.
pub async fn redis_pods(client: &Client, ns: &str, name: &str) -> BTreeMap<String, Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
        .await
        .unwrap_or_else(|e| panic!("listing pods of {ns}/{name}: {e}"))
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
        .collect()
}

/// One server's life: its pod, the pod's UID, every container's restart
/// count and the server's `run_id`. A pod made anew changes the UID, a
/// container restarted in place its restart count, a server restarted
/// inside its container its run id: equal lives mean no restart of any kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Life {
    pub pod: String,
    pub uid: String,
    pub restarts: Vec<(String, i32)>,
    pub run_id: String,
}

/// The lives of Redis `name`'s servers, read from the pods and from each
/// server (`INFO server` on port 6379 with `options`), sorted by pod.
pub async fn lives(client: &Client, ns: &str, name: &str, options: &ConnectOptions) -> Vec<Life> {
    let mut out = Vec::new();
    for (pod, p) in redis_pods(client, ns, name).await {
        let mut restarts: Vec<(String, i32)> = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.restart_count))
            .collect();
        restarts.sort();
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_else(|| panic!("{pod} has no IP"));
        let mut node = Node::connect(&Endpoint::new(&ip, 6379), options)
            .await
            .unwrap_or_else(|e| panic!("connecting to {pod}: {e}"));
        let run_id = node
            .info_section("server")
            .await
            .unwrap_or_else(|e| panic!("INFO server of {pod}: {e}"))
            .server
            .run_id
            .unwrap_or_else(|| panic!("{pod} reports no run_id"));
        out.push(Life {
            pod,
            uid: p.metadata.uid.clone().unwrap_or_default(),
            restarts,
            run_id,
        });
    }
    out
}

/// Whether a pod is Ready.
pub fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

// ---------------------------------------------------------------------------
// Children
// ---------------------------------------------------------------------------

/// `kind/name → resourceVersion` of every child of Redis `name`: the
/// StatefulSet, Services, ConfigMap, Secret, PodDisruptionBudget and pods.
pub async fn child_resource_versions(
    client: &Client,
    ns: &str,
    name: &str,
) -> BTreeMap<String, String> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let mut out = BTreeMap::new();
    macro_rules! collect {
        ($kind:ty, $label:expr) => {
            let api: Api<$kind> = Api::namespaced(client.clone(), ns);
            for o in api
                .list(&lp)
                .await
                .unwrap_or_else(|e| panic!("listing {}s in {ns}: {e}", $label))
                .items
            {
                out.insert(
                    format!("{}/{}", $label, o.metadata.name.unwrap_or_default()),
                    o.metadata.resource_version.unwrap_or_default(),
                );
            }
        };
    }
    collect!(StatefulSet, "StatefulSet");
    collect!(Service, "Service");
    collect!(ConfigMap, "ConfigMap");
    collect!(Secret, "Secret");
    collect!(PodDisruptionBudget, "PodDisruptionBudget");
    collect!(Pod, "Pod");
    out
}

/// Describes how two resourceVersion maps differ (empty when equal).
pub fn rv_diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut diffs = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => diffs.push(format!("{k} disappeared")),
            Some(w) if w != v => diffs.push(format!("{k}: resourceVersion {v} → {w}")),
            _ => {}
        }
    }
    for k in after.keys().filter(|k| !before.contains_key(*k)) {
        diffs.push(format!("{k} appeared"));
    }
    diffs
}

/// Waits until no child of Redis `name` changes for `quiet`, and returns
/// their resourceVersions. Fails naming what keeps changing.
pub async fn settled_children(
    client: &Client,
    ns: &str,
    name: &str,
    quiet: Duration,
    timeout: Duration,
) -> BTreeMap<String, String> {
    let start = Instant::now();
    let mut last = child_resource_versions(client, ns, name).await;
    loop {
        tokio::time::sleep(quiet).await;
        let now = child_resource_versions(client, ns, name).await;
        let diff = rv_diff(&last, &now);
        if diff.is_empty() {
            return now;
        }
        if start.elapsed() > timeout {
            panic!(
                "children of {ns}/{name} never stayed unchanged for {quiet:?} within {timeout:?}; last changes:\n  {}",
                diff.join("\n  ")
            );
        }
        last = now;
    }
}

/// Pod name → UID of the pods of Redis `name`.
pub async fn pod_uids(client: &Client, ns: &str, name: &str) -> BTreeMap<String, String> {
    redis_pods(client, ns, name)
        .await
        .into_iter()
        .map(|(n, p)| (n, p.metadata.uid.unwrap_or_default()))
        .collect()
}

/// Annotates the Redis (metadata only: no spec change) to make the operator
/// reconcile it once more.
pub async fn poke(client: &Client, ns: &str, name: &str, n: usize) {
    patch_redis(
        client,
        ns,
        name,
        json!({"metadata": {"annotations": {"redpilot.io/test-poke": n.to_string()}}}),
    )
    .await;
}

/// `CONFIG GET key` on a connected node.
pub async fn config_get(node: &mut Node, key: &str) -> Option<String> {
    let pair: Vec<String> = node
        .query("CONFIG", redis::cmd("CONFIG").arg("GET").arg(key))
        .await
        .ok()?;
    pair.get(1).cloned()
}

/// Counter deltas across a window: `(reconciles, kube requests)`.
pub struct Counters {
    pub reconciles: f64,
    pub requests: f64,
}

impl Operator {
    /// Current `redpilot_reconciliations_total` and `redpilot_kube_requests_total`
    /// (a family without samples yet counts 0); fails when /metrics does not answer.
    pub async fn counters(&self) -> Counters {
        let page = self.metrics().await.unwrap_or_else(|| {
            panic!(
                "operator {} serves no /metrics on {}",
                self.opts.name, self.metrics_addr
            )
        });
        Counters {
            reconciles: metric_sum(&page, "redpilot_reconciliations_total").unwrap_or(0.0),
            requests: metric_sum(&page, "redpilot_kube_requests_total").unwrap_or(0.0),
        }
    }
}

/// Pokes Redis `name` `pokes` times (one reconcile each), waits until the
/// operator counted them, and returns the apiserver requests per reconcile
/// over that window (lease renewals included).
pub async fn requests_per_reconcile(
    client: &Client,
    op: &Operator,
    ns: &str,
    name: &str,
    pokes: usize,
) -> f64 {
    let before = op.counters().await;
    for i in 0..pokes {
        poke(client, ns, name, i).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let target = before.reconciles + pokes as f64;
    wait_for(
        &format!(
            "{pokes} reconciles of {ns}/{name} after as many annotation changes \
             (redpilot_reconciliations_total)"
        ),
        Duration::from_secs(30),
        || async { (op.counters().await.reconciles >= target).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = op.counters().await;
    (after.requests - before.requests) / (after.reconciles - before.reconciles)
}

/// The median of some durations (seconds).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// A numeric field of `INFO <section>`, read with the library's parser;
/// fails the test when the server does not report it.
pub async fn info_u64(node: &mut Node, section: &str, field: &str) -> u64 {
    let info = node
        .info_section(section)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.fields
        .get(field)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO {section}"))
}

/// The server's process id (`INFO server`): pods run as local processes.
pub async fn server_pid(node: &mut Node) -> u32 {
    info_u64(node, "server", "process_id").await as u32
}

/// `kill -9 pid`: a crash, no shutdown, no save.
pub fn kill_9(pid: u32) {
    signal(pid, "-9");
}

/// Waits (at most `within`) for `op`, run with a failpoint armed, to stop
/// at it (exit code 86).
pub async fn wait_failpoint(op: &mut Operator, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    let exit = loop {
        if let Some(exit) = op.exit_status() {
            // A supervised process that lost its lease on a loaded machine
            // is started again (failpoint still armed): keep waiting.
            let relapsed = exit.code() != Some(redpilot::failpoint::EXIT_CODE)
                && op.supervisor.is_some()
                && op.log_tail(5).contains("lost leadership");
            if !relapsed {
                break exit;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the operator did not reach the failpoint: {}",
            op.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        exit.code(),
        Some(redpilot::failpoint::EXIT_CODE),
        "{}",
        op.log_tail(30)
    );
    // The process is gone and nothing starts it again (a failpoint exit):
    // its Lease is deleted, a shortcut past the lease's expiry: the test's
    // next operator takes over at once (what these tests are about is the
    // work resumed; tests/operator_leader.rs covers the expiry).
    let client = super::client().await;
    let leases: Api<Lease> = Api::namespaced(client, OPERATOR_NAMESPACE);
    leases
        .delete(&op.opts.lease_name, &Default::default())
        .await
        .expect("deleting the stopped operator's Lease");
}

/// `kill <sig> pid` (e.g. `-STOP`, `-CONT`).
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// Container restarts of a pod, summed.
pub fn container_restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

/// Creates the user's Secret `name` with key `password` (what
/// `spec.auth.secretName` names).
pub async fn create_user_secret(client: &Client, ns: &str, name: &str, password: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"password": password}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating the user's Secret {ns}/{name}: {e}"));
}

/// Each pod of Redis `name`: pod name, UID, server image and restart count
/// (what a restart or an upgrade changes).
pub async fn pod_states(
    client: &Client,
    ns: &str,
    name: &str,
) -> Vec<(String, String, String, i32)> {
    redis_pods(client, ns, name)
        .await
        .into_iter()
        .map(|(name, p)| {
            let image = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            (name, p.metadata.uid.unwrap_or_default(), image, restarts)
        })
        .collect()
}

/// Creates a 1Gi ReadWriteOnce PersistentVolumeClaim `name` (a backup
/// target on a volume).
pub async fn create_claim(client: &Client, ns: &str, name: &str) {
    let pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("claim");
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap_or_else(|e| panic!("creating the claim {ns}/{name}: {e}"));
}

/// The operator run as a pod on the local node, in a network namespace of
/// its own as in production: the Deployment's pod template of
/// `deploy/install.yaml`, watching `ns` alone, under a ServiceAccount of
/// `ns` granted what `config/rbac/` grants (the ClusterRole by a RoleBinding
/// in `ns`, and the leader-election rules there, where its Lease lives).
/// Deleted with the namespace.
pub struct OperatorPod {
    pub name: String,
    pub ip: String,
}

pub async fn start_operator_pod(client: &Client, ns: &str) -> OperatorPod {
    apply_rbac(client).await;
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": ns}});
    apply_typed::<ServiceAccount>(Api::namespaced(client.clone(), ns), &sa).await;
    let mut binding = watched_namespace_binding();
    binding["metadata"]["namespace"] = json!(ns);
    binding["subjects"][0]["namespace"] = json!(ns);
    apply_typed::<RoleBinding>(Api::namespaced(client.clone(), ns), &binding).await;
    for file in [
        "leader_election_role.yaml",
        "leader_election_role_binding.yaml",
    ] {
        for mut doc in read_yaml_docs(&repo_root().join("config/rbac").join(file)) {
            doc["metadata"]["namespace"] = json!(ns);
            if doc["kind"] == "Role" {
                apply_typed::<Role>(Api::namespaced(client.clone(), ns), &doc).await;
            } else {
                doc["subjects"][0]["namespace"] = json!(ns);
                apply_typed::<RoleBinding>(Api::namespaced(client.clone(), ns), &doc).await;
            }
        }
    }
    let deployment = read_yaml_docs(&repo_root().join("deploy/install.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("deploy/install.yaml has the operator's Deployment");
    let mut template = deployment["spec"]["template"].clone();
    let name = unique_name("operator");
    template["metadata"]["name"] = json!(name);
    template["metadata"]["namespace"] = json!(ns);
    template["spec"]["serviceAccountName"] = json!(SERVICE_ACCOUNT);
    let env = template["spec"]["containers"][0]["env"]
        .as_array_mut()
        .expect("the operator container's env");
    for e in env.iter_mut() {
        if e["name"] == "WATCH_NAMESPACE" {
            *e = json!({"name": "WATCH_NAMESPACE", "value": ns});
        }
    }
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod"});
    pod["metadata"] = template["metadata"].clone();
    pod["spec"] = template["spec"].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(pod).expect("the operator's pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating the operator's pod {ns}/{name}: {e}"));
    let ip = wait_for(
        &format!("the operator's pod {ns}/{name} ready"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(&name).await.ok()?;
            let ready = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then(|| p.status?.pod_ip).flatten()
        },
    )
    .await;
    OperatorPod { name, ip }
}

/// utime + stime of a process, in seconds (clock ticks of 1/100 s, the
/// Linux `USER_HZ`).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state is 0, utime 11, stime 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// Creates (or updates) the RedisBackup `name` with `spec`.
pub async fn create_backup(client: &Client, ns: &str, name: &str, spec: Value) {
    let b = json!({"apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
                   "metadata": {"name": name}, "spec": spec});
    Api::<redpilot::api::v1alpha1::RedisBackup>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&b))
        .await
        .unwrap_or_else(|e| panic!("creating RedisBackup {name}: {e}"));
}

/// Waits for the backup to end (Completed or Failed) and returns it.
pub async fn ended(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> redpilot::api::v1alpha1::RedisBackup {
    let api: Api<redpilot::api::v1alpha1::RedisBackup> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        let b = api.get(name).await.expect("get backup");
        let phase = b.status.as_ref().and_then(|s| s.phase);
        if matches!(
            phase,
            Some(redpilot::api::v1alpha1::BackupPhase::Completed)
                | Some(redpilot::api::v1alpha1::BackupPhase::Failed)
        ) {
            return b;
        }
        if start.elapsed() > timeout {
            panic!(
                "RedisBackup {name} did not end within {timeout:?}: {:?}\nevents:\n{}",
                b.status,
                recent_events(client, ns, 15).await
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The local node's expandable StorageClass of sized volumes (each a tmpfs
/// of the claim's size, so `df` in the server's mount namespace shows it).
pub const SIZED_CLASS: &str = "redpilot-sized";

/// Makes [`SIZED_CLASS`] (an apply: any test may ask for it).
pub async fn sized_class(client: &Client) {
    let sc = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": SIZED_CLASS},
        "provisioner": "localnode.redpilot.io/hostpath",
        "parameters": {"sized": "true"},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": true,
    });
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone())
        .patch(
            SIZED_CLASS,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&sc),
        )
        .await
        .expect("the sized StorageClass");
}

/// A resharding that has moved nothing (phase, slots, keys) for this long
/// stands still.
pub const RESHARD_STALL: Duration = Duration::from_secs(120);
/// A resharding that moves may take this long on a busy machine.
pub const RESHARD_CAP: Duration = Duration::from_secs(900);

/// Waits for the Redis `name`'s resharding to `to_shards` to be Done and
/// `done` to hold of it, for as long as it moves: the wait fails when the
/// resharding's phase, slots moved and keys moved have not changed for
/// [`RESHARD_STALL`] (it stands still), or after [`RESHARD_CAP`] in all. A
/// machine slowed by other work makes a resharding slower, not stuck, so
/// its time alone does not fail a test; its standing still does.
pub async fn wait_resharding_done(
    client: &Client,
    ns: &str,
    name: &str,
    to_shards: i32,
    done: impl Fn(&Redis) -> bool,
) -> Redis {
    let api = redis_api(client, ns);
    let start = Instant::now();
    let mut mark = None;
    let mut moved_at = Instant::now();
    loop {
        if let Ok(r) = api.get(name).await {
            let rs = r.status.as_ref().and_then(|s| s.resharding.clone());
            if rs
                .as_ref()
                .is_some_and(|x| x.to_shards == to_shards && x.phase == ReshardingPhase::Done)
                && done(&r)
            {
                return r;
            }
            let now = rs.map(|x| (x.to_shards, x.phase, x.slots_moved, x.keys_moved));
            if now != mark {
                mark = now;
                moved_at = Instant::now();
            }
        }
        let still = moved_at.elapsed() >= RESHARD_STALL;
        if still || start.elapsed() >= RESHARD_CAP {
            panic!(
                "the resharding of {name} to {to_shards} shards is not Done after {:.1} s \
                 ({}; last seen {mark:?}){}",
                start.elapsed().as_secs_f64(),
                if still {
                    format!("it stood still for {:.0} s", RESHARD_STALL.as_secs_f64())
                } else {
                    format!("the cap is {:.0} s", RESHARD_CAP.as_secs_f64())
                },
                super::diag::report().await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
