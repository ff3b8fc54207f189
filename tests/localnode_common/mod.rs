//! Helpers for the local node suites (`tests/localnode_*.rs`): pods that run
//! real Redis/Valkey processes on Node/localnode, readiness waits, and a
//! minimal RESP client that talks to a pod address.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const NODE: &str = "localnode";

/// Fails unless Node/localnode exists and is Ready.
pub async fn require_localnode(client: &kube::Client) {
    let node = Api::<Node>::all(client.clone())
        .get_opt(NODE)
        .await
        .unwrap_or_else(|e| panic!("reading node/{NODE}: {e}"))
        .unwrap_or_else(|| {
            panic!("node/{NODE} does not exist: run `make cluster-up` (it starts dev/localnode.sh)")
        });
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(
        ready,
        "node/{NODE} is not Ready: is dev/localnode.sh running? (see .dev/localnode/localnode.log)"
    );
}

/// A pod pinned to the local node running one container.
pub fn pod(name: &str, container: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
        }
    }))
    .unwrap_or_else(|e| panic!("pod json: {e}"))
}

/// A redis/valkey server container with a tcpSocket readiness probe.
pub fn server(image: &str) -> Value {
    json!({
        "name": "server",
        "image": image,
        "args": ["--save", ""],
        "readinessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 1},
    })
}

pub async fn create(api: &Api<Pod>, pod: &Pod) -> Pod {
    api.create(&PostParams::default(), pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {:?}: {e}", pod.metadata.name))
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref().and_then(|s| s.pod_ip.clone())
}

pub fn restart_count(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

pub fn waiting_reason(p: &Pod) -> Option<(String, String)> {
    let st = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    Some((st.reason.clone()?, st.message.clone().unwrap_or_default()))
}

/// Waits until the pod is Ready (and, with `not_uid`, is not that old pod); returns it.
pub async fn wait_ready(
    api: &Api<Pod>,
    name: &str,
    not_uid: Option<&str>,
    timeout: Duration,
) -> Pod {
    let start = Instant::now();
    loop {
        if let Ok(Some(p)) = api.get_opt(name).await {
            let same = not_uid.is_none_or(|u| p.metadata.uid.as_deref() != Some(u));
            if same && is_ready(&p) && pod_ip(&p).is_some() {
                return p;
            }
            if start.elapsed() > timeout {
                panic!(
                    "pod {name} not Ready after {timeout:?}; status: {}",
                    serde_json::to_string(&p.status).unwrap_or_default()
                );
            }
        } else if start.elapsed() > timeout {
            panic!("pod {name} does not exist after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the pod no longer exists.
pub async fn wait_gone(api: &Api<Pod>, name: &str, uid: &str, timeout: Duration) {
    let start = Instant::now();
    loop {
        match api.get_opt(name).await {
            Ok(None) => return,
            Ok(Some(p)) if p.metadata.uid.as_deref() != Some(uid) => return,
            _ => {}
        }
        assert!(
            start.elapsed() < timeout,
            "pod {name} still exists after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One RESP reply, rendered as text (errors start with '-').
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
}

impl Reply {
    pub fn text(&self) -> String {
        match self {
            Reply::Simple(s) | Reply::Error(s) => s.clone(),
            Reply::Int(i) => i.to_string(),
            Reply::Bulk(b) => b.clone().unwrap_or_default(),
        }
    }
}

fn parse(buf: &[u8]) -> Option<Reply> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&buf[1..end]).into_owned();
    match buf.first()? {
        b'+' => Some(Reply::Simple(line)),
        b'-' => Some(Reply::Error(line)),
        b':' => line.parse().ok().map(Reply::Int),
        b'$' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some(Reply::Bulk(None));
            }
            let start = end + 2;
            let stop = start + n as usize;
            (buf.len() >= stop + 2).then(|| {
                Reply::Bulk(Some(
                    String::from_utf8_lossy(&buf[start..stop]).into_owned(),
                ))
            })
        }
        _ => Some(Reply::Error(format!("unexpected reply {line}"))),
    }
}

/// Sends one command to `ip:port` and reads the reply.
pub async fn command(ip: &str, port: u16, args: &[&str]) -> std::io::Result<Reply> {
    let t = Duration::from_secs(5);
    let mut s = tokio::time::timeout(t, TcpStream::connect((ip, port)))
        .await
        .map_err(|_| std::io::Error::other("connect timeout"))??;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(t, s.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::other("read timeout"))??;
        if n == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(r) = parse(&buf) {
            return Ok(r);
        }
    }
}

/// A field of `INFO server`.
pub async fn info_field(ip: &str, field: &str) -> Option<String> {
    let info = command(ip, 6379, &["INFO", "server"]).await.ok()?.text();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// True when a process with this pid exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// Network namespaces whose name starts with `prefix`.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The netns name localnode gives a pod (prefix + first 12 hex chars of its UID).
pub fn pod_netns(prefix: &str, uid: &str) -> String {
    let id: String = uid
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(12)
        .collect();
    format!("{prefix}-{id}")
}

/// The memory cgroup of a process, as /proc/<pid>/cgroup names it (e.g.
/// `/rp/0123456789ab/server`); `None` when the process is gone or has none.
pub fn memory_cgroup_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
}
