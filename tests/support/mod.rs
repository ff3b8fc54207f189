//! Harness shared by the integration suites that need a Kubernetes cluster.
//!
//! - [`client`] connects to the dev cluster (`.dev/kubeconfig`), or to the
//!   cluster named by `REDPILOT_KUBECONFIG`; when neither answers the test
//!   fails with a message saying to run `make cluster-up`.
//! - [`TestNamespace`] creates a fresh namespace and deletes it when dropped.
//! - [`wait_for`] polls a condition with a deadline and a clear timeout message.
//!
//! Include it from a test crate with `mod support;`.
#![allow(dead_code)]

pub mod audit;
pub mod diag;
pub mod faults;
pub mod fill;
pub mod helm;
pub mod operator;
pub mod pace;
pub mod prometheus;
pub mod s3_server;
pub mod writer;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The repository root (where Cargo.toml of the operator lives).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kubeconfig the suites use: `REDPILOT_KUBECONFIG` when set, else the dev
/// cluster's `.dev/kubeconfig`. `KUBECONFIG` is deliberately not consulted, so
/// a shell pointed at a real cluster never runs the suites against it.
pub fn kubeconfig_path() -> PathBuf {
    match std::env::var_os("REDPILOT_KUBECONFIG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join(".dev/kubeconfig"),
    }
}

/// Runs `kubectl redpilot <args>` (the plugin this package builds) against
/// the dev cluster; returns (success, stdout + stderr), and prints both.
pub fn kubectl_redpilot(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-redpilot"))
        .env("KUBECONFIG", kubeconfig_path())
        .args(args)
        .output()
        .expect("run kubectl-redpilot");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("$ kubectl redpilot {}\n{text}", args.join(" "));
    (out.status.success(), text)
}

fn no_cluster(path: &std::path::Path, why: impl std::fmt::Display) -> ! {
    panic!(
        "no Kubernetes cluster reachable through {} ({why}).\n\
         Run `make cluster-up` first (or set REDPILOT_KUBECONFIG to a test cluster's kubeconfig).",
        path.display()
    )
}

/// A client for the test cluster. Fails the test when no cluster answers.
pub async fn client() -> Client {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| no_cluster(&path, e));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| no_cluster(&path, e));
    let client = Client::try_from(config).unwrap_or_else(|e| no_cluster(&path, e));
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(_)) => client,
        Ok(Err(e)) => no_cluster(&path, e),
        Err(_) => no_cluster(&path, "the apiserver did not answer within 10s"),
    }
}

/// A name that is unique for this test run: `prefix-<time><counter>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}-{:x}{:x}{n}",
        std::process::id() % 0xfff,
        nanos % 0xfffff
    )
}

/// A namespace created for one test and deleted (in the background of the
/// apiserver) when this value is dropped, whether the test passed or not.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    /// Creates `prefix-<unique>` with the given labels.
    pub async fn new(client: &Client, prefix: &str, labels: &[(&str, &str)]) -> Self {
        let name = unique_name(prefix);
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("redpilot.io/test".to_string(), "true".to_string())])
            .collect();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {name}: {e}"));
        diag::track_namespace(&name);
        TestNamespace { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop cannot await, and the test's own client is driven by the test's
        // runtime, which is blocked here. So the namespace is deleted from a
        // short-lived runtime on another thread, with a client of its own.
        diag::untrack_namespace(&self.name);
        let name = self.name.clone();
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    let Some(client) = try_client().await else {
                        eprintln!("warning: cannot reach the cluster to delete namespace {name}");
                        return;
                    };
                    let api = Api::<Namespace>::all(client);
                    if let Err(e) = api.delete(&name, &DeleteParams::background()).await {
                        eprintln!("warning: deleting test namespace {name}: {e}");
                    }
                });
            }
        })
        .join();
        if joined.is_err() {
            eprintln!("warning: the namespace cleanup thread panicked");
        }
    }
}

pub(crate) async fn try_client() -> Option<Client> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig_path()).ok()?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .ok()?;
    Client::try_from(config).ok()
}

/// Polls `check` every 200 ms until it returns `Some`, for at most
/// `timeout`: that value, or `None` when the time ran out.
pub async fn try_wait_for<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `check` every 200 ms until it returns `Some`, and returns that value.
/// Fails the test after `timeout` with a message naming what was awaited.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match try_wait_for(timeout, check).await {
        Some(v) => v,
        None => panic!(
            "timed out after {:.1}s waiting for {what}{}",
            timeout.as_secs_f64(),
            diag::report().await
        ),
    }
}
