//! OLM's own programs run as local processes against the dev cluster, for
//! the suites that install through OLM (`tests/olm_e2e.rs`) or read what it
//! serves (`tests/olm_packagemanifest.rs`): a process handle that keeps a
//! log, `opm serve`, OLM's CRDs and its API objects.
#![allow(dead_code)]

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::olm_common::{tool, yaml_docs, yaml_files};

/// Field manager of what these helpers apply.
pub const FIELD_MANAGER: &str = "redpilot-olm-tests";
/// Namespace of OLM's global catalogs.
pub const OLM_NAMESPACE: &str = "olm";

/// A process started by the test, killed when dropped; output goes to a log.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn start(name: &str, cmd: &mut Command, logs: &Path) -> Proc {
        let log = logs.join(format!("{name}.log"));
        let out = File::create(&log).expect("creating a log file");
        let err = out.try_clone().expect("cloning a log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        format!(
            "--- {} (last {} lines of {})\n{}",
            self.name,
            lines.len() - from,
            self.log.display(),
            lines[from..]
                .iter()
                .map(|l| l.chars().take(400).collect::<String>())
                .collect::<Vec<_>>()
                .join("\n")
        )
    }

    /// Waits until 127.0.0.1:`port` accepts connections; fails the test if
    /// the process exits or `within` passes first.
    pub fn wait_listening(&mut self, port: u16, within: Duration) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.assert_running();
            assert!(
                start.elapsed() < within,
                "{} did not listen on 127.0.0.1:{port} within {}s:\n{}",
                self.name,
                within.as_secs(),
                self.tail(20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, self.tail(40));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// `bin/opm serve <dir>` on a free loopback port, once it accepts connections.
pub fn serve_catalog(dir: &Path, name: &str, logs: &Path) -> (Proc, u16) {
    let port = free_port();
    let mut proc = Proc::start(
        name,
        Command::new(tool("opm"))
            .arg("serve")
            .arg(dir)
            .args(["-p", &port.to_string(), "--pprof-addr", ""])
            .arg("-t")
            .arg(logs.join(format!("{name}.termination-log"))),
        logs,
    );
    proc.wait_listening(port, Duration::from_secs(60));
    (proc, port)
}

pub fn olm_api(
    client: &Client,
    ns: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operators.coreos.com", version, kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

pub fn csv_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    olm_api(
        client,
        ns,
        "v1alpha1",
        "ClusterServiceVersion",
        "clusterserviceversions",
    )
}

pub async fn create(api: &Api<DynamicObject>, obj: Value) {
    let obj: DynamicObject = serde_json::from_value(obj).expect("an object");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {:?}: {e}", obj.metadata.name));
}

/// OLM's CRDs (from the OLM module the binaries were built from), applied
/// server-side (the CSV CRD is too large for client-side apply), and the
/// namespace of OLM's global catalogs.
pub async fn install_olm_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for file in yaml_files(&tool("olm-crds")) {
        for doc in yaml_docs(&file) {
            let name = doc["metadata"]["name"]
                .as_str()
                .expect("a CRD name")
                .to_string();
            crds.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&doc),
            )
            .await
            .unwrap_or_else(|e| panic!("applying OLM CRD {name}: {e}"));
            names.push(name);
        }
    }
    for name in names {
        crate::support::wait_for(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || {
                let crds = crds.clone();
                let name = name.clone();
                async move { crds.get(&name).await.ok().filter(established).map(|_| ()) }
            },
        )
        .await;
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OLM_NAMESPACE}});
    nss.patch(
        OLM_NAMESPACE,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Apply(&ns),
    )
    .await
    .expect("creating the olm namespace");
}

pub fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}
