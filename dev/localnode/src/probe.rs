//! Container probes (exec, tcpSocket, httpGet), run the way the kubelet does:
//! exec inside the container's namespaces and root, network probes from the
//! host to the pod address.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where and how to probe one running container.
#[derive(Debug, Clone)]
pub struct Target {
    pub pod_ip: IpAddr,
    pub pid: u32,
    pub env: Vec<(String, String)>,
    pub container: Container,
}

/// The result of one probe attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Success,
    Failure(String),
}

pub fn timeout_of(p: &Probe) -> Duration {
    Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64)
}

/// Runs one probe attempt.
pub async fn run(p: &Probe, t: &Target) -> Outcome {
    let timeout = timeout_of(p);
    if let Some(e) = &p.exec {
        return exec(e.command.as_deref().unwrap_or(&[]), t, timeout).await;
    }
    if let Some(tcp) = &p.tcp_socket {
        let port = match resolve_port(&tcp.port, &t.container) {
            Ok(p) => p,
            Err(e) => return Outcome::Failure(e),
        };
        let ip = tcp
            .host
            .as_deref()
            .and_then(|h| h.parse().ok())
            .unwrap_or(t.pod_ip);
        let addr = SocketAddr::new(ip, port);
        return match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(_)) => Outcome::Success,
            Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
            Err(_) => Outcome::Failure(format!("dial tcp {addr}: timeout")),
        };
    }
    if let Some(h) = &p.http_get {
        let port = match resolve_port(&h.port, &t.container) {
            Ok(p) => p,
            Err(e) => return Outcome::Failure(e),
        };
        let ip = h
            .host
            .as_deref()
            .and_then(|h| h.parse().ok())
            .unwrap_or(t.pod_ip);
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = h
            .http_headers
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect();
        let https = h.scheme.as_deref() == Some("HTTPS");
        return match tokio::time::timeout(
            timeout,
            http_get(SocketAddr::new(ip, port), &path, &headers, https),
        )
        .await
        {
            Ok(o) => o,
            Err(_) => Outcome::Failure(format!("GET {path}: timeout")),
        };
    }
    if p.grpc.is_some() {
        return Outcome::Failure("grpc probes are not supported by localnode".into());
    }
    Outcome::Failure("probe has no handler".into())
}

/// Runs a command inside the container (namespaces and root of its main
/// process) with the container's environment; exit 0 is success.
pub async fn exec(command: &[String], t: &Target, timeout: Duration) -> Outcome {
    let mut cmd = exec_command(command, t);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::Failure(format!("nsenter: {e}")),
    };
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) if out.status.success() => Outcome::Success,
        Ok(Ok(out)) => {
            let mut msg = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let err = String::from_utf8_lossy(&out.stderr);
            if !err.trim().is_empty() {
                msg.push(' ');
                msg.push_str(err.trim());
            }
            Outcome::Failure(format!(
                "command {:?} exited with {}: {}",
                command,
                out.status,
                msg.trim()
            ))
        }
        Ok(Err(e)) => Outcome::Failure(format!("exec: {e}")),
        Err(_) => Outcome::Failure(format!("command {command:?} timed out after {timeout:?}")),
    }
}

/// `nsenter` into a container's namespaces and root with its environment.
pub fn exec_command(command: &[String], t: &Target) -> tokio::process::Command {
    // A real image's root (oci.rs) may have no /usr/bin/env: nsenter then
    // execs the command itself, with the container's environment (its PATH
    // finds the program inside the root).
    let root_env = format!("/proc/{}/root/usr/bin/env", t.pid);
    if !std::path::Path::new(&root_env).exists() {
        let mut cmd = tokio::process::Command::new(host_program("nsenter"));
        cmd.arg("-t")
            .arg(t.pid.to_string())
            .args(["-m", "-u", "-n", "-r", "-w", "--"])
            .args(command)
            .env_clear()
            .envs(t.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        return cmd;
    }
    let mut cmd = tokio::process::Command::new("nsenter");
    cmd.arg("-t").arg(t.pid.to_string()).args([
        "-m",
        "-u",
        "-n",
        "-r",
        "-w",
        "--",
        "/usr/bin/env",
        "-i",
    ]);
    for (k, v) in &t.env {
        cmd.arg(format!("{k}={v}"));
    }
    // `env` would take a first word containing '=' as a variable.
    if command.first().is_some_and(|c| c.contains('=')) {
        cmd.arg("--");
    }
    cmd.args(command);
    cmd
}

/// The host's `name` on this process's `PATH` (a command whose environment
/// is the container's would otherwise look for it on the container's).
fn host_program(name: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| std::path::PathBuf::from(name))
}

fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("bad port {p}")),
        IntOrString::String(name) => {
            if let Ok(p) = name.parse::<u16>() {
                return Ok(p);
            }
            c.ports
                .as_deref()
                .unwrap_or(&[])
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("named port {name} not found in container {}", c.name))
        }
    }
}

async fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    https: bool,
) -> Outcome {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return Outcome::Failure(format!("GET http://{addr}{path}: {e}")),
    };
    if https {
        // No TLS client here: a listening HTTPS port counts as healthy.
        return Outcome::Success;
    }
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    if let Err(e) = s.write_all(req.as_bytes()).await {
        return Outcome::Failure(format!("GET http://{addr}{path}: {e}"));
    }
    let mut buf = vec![0u8; 512];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]).await {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if buf[..got].contains(&b'\n') {
                    break;
                }
            }
            Err(e) => return Outcome::Failure(format!("GET http://{addr}{path}: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&buf[..got]);
    let code: Option<u16> = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok());
    match code {
        Some(c) if (200..400).contains(&c) => Outcome::Success,
        Some(c) => Outcome::Failure(format!("HTTP probe failed with statuscode: {c}")),
        None => Outcome::Failure(format!("GET http://{addr}{path}: malformed response")),
    }
}
