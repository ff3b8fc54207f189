//! A real Prometheus (bin/prometheus, built by `make tools-prometheus`)
//! scraping the dev cluster the way the prometheus-operator would from the
//! PodMonitors the operator created, plus one operator process, and
//! evaluating the PrometheusRules the operator created.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::kubeconfig_path;
use super::operator::http_get;

/// The prometheus-operator CRDs this suite installs (from bin/prometheus-operator-crds).
pub const MONITORING_CRDS: &[&str] = &["podmonitors", "prometheusrules", "servicemonitors"];

/// The CRD files, or a failure naming the make target that provides them.
pub fn monitoring_crd_files() -> Vec<PathBuf> {
    let dir = super::repo_root().join("bin/prometheus-operator-crds");
    MONITORING_CRDS
        .iter()
        .map(|p| {
            let f = dir.join(format!("monitoring.coreos.com_{p}.yaml"));
            assert!(
                f.exists(),
                "{} is missing: run `make tools-prometheus-crds`",
                f.display()
            );
            f
        })
        .collect()
}

/// `bin/prometheus`, or a failure naming the make target.
pub fn prometheus_binary() -> PathBuf {
    let p = super::repo_root().join("bin/prometheus");
    assert!(
        p.exists(),
        "bin/prometheus is missing: run `make tools-prometheus`"
    );
    p
}

/// Prometheus label name of a Kubernetes label (`app.kubernetes.io/name` →
/// `app_kubernetes_io_name`).
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The scrape configuration the prometheus-operator generates for one
/// PodMonitor (the parts Redpilot's PodMonitors use): pods of its namespaces
/// matching its selector, the named port, its relabelings, and the target
/// labels namespace, pod, container, endpoint and job.
pub fn scrape_config_for_pod_monitor(pm: &Value, kubeconfig: &Path) -> Value {
    let ns = pm["metadata"]["namespace"].as_str().expect("namespace");
    let name = pm["metadata"]["name"].as_str().expect("name");
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    let mut relabel = Vec::new();
    for (k, v) in pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        relabel.push(json!({
            "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(k))],
            "regex": v,
            "action": "keep",
        }));
    }
    relabel.push(json!({
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": ep["port"],
        "action": "keep",
    }));
    for (target, source) in [
        ("namespace", "__meta_kubernetes_namespace"),
        ("container", "__meta_kubernetes_pod_container_name"),
        ("pod", "__meta_kubernetes_pod_name"),
    ] {
        relabel.push(json!({"source_labels": [source], "target_label": target}));
    }
    relabel.push(json!({"target_label": "job", "replacement": format!("{ns}/{name}")}));
    relabel.push(json!({"target_label": "endpoint", "replacement": ep["port"]}));
    for r in ep["relabelings"].as_array().into_iter().flatten() {
        let mut c = json!({});
        if let Some(s) = r.get("sourceLabels") {
            c["source_labels"] = s.clone();
        }
        for (from, to) in [
            ("targetLabel", "target_label"),
            ("action", "action"),
            ("regex", "regex"),
            ("replacement", "replacement"),
        ] {
            if let Some(v) = r.get(from) {
                c[to] = v.clone();
            }
        }
        relabel.push(c);
    }
    let namespaces: Vec<Value> = pm["spec"]["namespaceSelector"]["matchNames"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![json!(ns)]);
    json!({
        "job_name": format!("podMonitor/{ns}/{name}/0"),
        "scrape_interval": ep["interval"].as_str().unwrap_or("30s"),
        "metrics_path": ep["path"].as_str().unwrap_or("/metrics"),
        "honor_labels": ep["honorLabels"].as_bool().unwrap_or(false),
        "kubernetes_sd_configs": [{
            "role": "pod",
            "kubeconfig_file": kubeconfig.display().to_string(),
            "namespaces": {"names": namespaces},
        }],
        "relabel_configs": relabel,
    })
}

/// A running Prometheus, killed when dropped.
pub struct Prometheus {
    child: Child,
    /// Its HTTP API.
    pub addr: SocketAddr,
    /// Its log.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with `scrape_configs` and rule `groups`, evaluating
    /// every 5 s.
    pub async fn start(scrape_configs: Vec<Value>, groups: Vec<Value>) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = dir.path().join("rules.yaml");
        std::fs::write(
            &rules,
            serde_yaml::to_string(&json!({"groups": groups})).expect("rules yaml"),
        )
        .expect("write rules");
        let config = json!({
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "rule_files": [rules.display().to_string()],
            "scrape_configs": scrape_configs,
        });
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, serde_yaml::to_string(&config).expect("yaml")).expect("write config");
        let port = super::operator::free_loopback_port();
        let log = super::operator::log_dir().join(format!("prometheus-{port}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(prometheus_binary())
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
            _dir: dir,
        };
        super::wait_for(
            "Prometheus to be ready",
            Duration::from_secs(60),
            || async { http_get(p.addr, "/-/ready").await.map(|_| ()) },
        )
        .await;
        p
    }

    /// The scrape configuration for the operator's endpoint (labels kept).
    pub fn operator_scrape(addr: SocketAddr) -> Value {
        json!({
            "job_name": "redpilot",
            "honor_labels": true,
            "scrape_interval": "5s",
            "static_configs": [{"targets": [addr.to_string()]}],
        })
    }

    /// The scrape of every PodMonitor in `pms`, with the dev kubeconfig.
    pub fn pod_monitor_scrapes(pms: &[Value]) -> Vec<Value> {
        let kubeconfig = kubeconfig_path();
        pms.iter()
            .map(|pm| scrape_config_for_pod_monitor(pm, &kubeconfig))
            .collect()
    }

    async fn api(&self, path: &str) -> Option<Value> {
        let body = http_get(self.addr, path).await?;
        let v: Value = serde_json::from_str(&body).ok()?;
        (v["status"] == "success").then(|| v["data"].clone())
    }

    /// The result vector of an instant query (`None` when the query failed).
    pub async fn query(&self, q: &str) -> Option<Vec<Value>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(q)))
            .await?;
        data["result"].as_array().cloned()
    }

    /// The active alerts (pending and firing).
    pub async fn alerts(&self) -> Vec<Value> {
        self.api("/api/v1/alerts")
            .await
            .and_then(|d| d["alerts"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The scrape targets with their health.
    pub async fn targets(&self) -> Vec<Value> {
        self.api("/api/v1/targets")
            .await
            .and_then(|d| d["activeTargets"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The log's last lines, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query parameter.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn dashboard(file: &str) -> Value {
    let path = super::repo_root().join("config/grafana").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("dashboard JSON")
}

fn panel_exprs(panels: &Value) -> Vec<String> {
    panels
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect()
}

/// Every `expr` of the panels a dashboard in `config/grafana/` shows open
/// (not those inside a collapsed row).
pub fn dashboard_exprs(file: &str) -> Vec<String> {
    panel_exprs(&dashboard(file)["panels"])
}

/// Every `expr` inside the collapsed row titled `row` (empty when the
/// dashboard has no such row).
pub fn dashboard_row_exprs(file: &str, row: &str) -> Vec<String> {
    dashboard(file)["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "row" && p["title"] == row)
        .flat_map(|p| panel_exprs(&p["panels"]))
        .collect()
}

/// The titles of a dashboard's collapsed rows.
pub fn dashboard_collapsed_rows(file: &str) -> Vec<String> {
    dashboard(file)["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "row" && p["collapsed"] == true)
        .filter_map(|p| p["title"].as_str().map(String::from))
        .collect()
}
