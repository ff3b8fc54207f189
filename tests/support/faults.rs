//! Faults for failover tests, and clients that see them as applications do:
//! - [`ServiceWriter`]: writes through the read-write Service the way a
//!   client behind kube-proxy does (to the ready endpoint of its
//!   EndpointSlice, re-resolved on every reconnect), and records when each
//!   write was sent and acknowledged, and by which address;
//! - [`InsideWriter`]: a client inside a pod's network namespace, writing to
//!   the server on 127.0.0.1 (it keeps writing when the pod is cut off);
//! - [`Partition`]: cuts a pod off the node's bridge (its host-side veth
//!   down) and heals it when dropped.

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use redpilot::redis::{ConnectOptions, Endpoint, Node};

/// One acknowledged write.
#[derive(Debug, Clone)]
pub struct Ack {
    /// The key written.
    pub key: String,
    /// The server's address.
    pub ip: String,
    /// When the write was sent.
    pub sent: Instant,
    /// When its acknowledgement arrived.
    pub acked: Instant,
}

/// What a writer saw.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Acknowledged writes (OK, and for a `WAIT` writer held by a replica).
    pub acks: Vec<Ack>,
    /// Answered OK but not confirmed by `WAIT` (no promise made).
    pub unreplicated: u64,
    /// Refused or failed.
    pub failed: u64,
    /// Times the writer found no ready endpoint, or none that took its
    /// connection, and waited to try again (no write was sent then).
    pub unreachable: u64,
    /// Failures by kind (the server's error code, or the client's category).
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Acknowledged writes by the connection options they went through
    /// (their index in [`ServiceWriter::trying`]'s list).
    pub acks_by_way: std::collections::BTreeMap<usize, u64>,
}

fn error_kind(e: &redpilot::redis::Error) -> String {
    match e {
        redpilot::redis::Error::Server { code, .. } => code.clone(),
        other => other.category().to_string(),
    }
}

impl Tally {
    /// The first write acknowledged by `ip` that was sent at or after `t`.
    pub fn first_ack_at(&self, ip: &str, t: Instant) -> Option<Instant> {
        self.acks
            .iter()
            .filter(|a| a.ip == ip && a.sent >= t)
            .map(|a| a.acked)
            .min()
    }

    /// Keys acknowledged.
    pub fn keys(&self) -> Vec<String> {
        self.acks.iter().map(|a| a.key.clone()).collect()
    }
}

/// A writer through the read-write Service.
pub struct ServiceWriter {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceWriter {
    /// Writes `prefix:N` through Service `svc` in `ns`; with `wait` > 0 a
    /// write counts only once `WAIT wait 500` confirms it.
    pub fn start(client: &Client, ns: &str, svc: &str, pw: &str, prefix: &str, wait: i64) -> Self {
        Self::paced(client, ns, svc, pw, prefix, wait, Duration::ZERO)
    }

    /// As [`ServiceWriter::start`], pausing `pause` after each write (a
    /// lighter load for suites that run side by side on two cores).
    pub fn paced(
        client: &Client,
        ns: &str,
        svc: &str,
        pw: &str,
        prefix: &str,
        wait: i64,
        pause: Duration,
    ) -> Self {
        let opts = ConnectOptions::default()
            .with_password(pw.to_string())
            .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
        Self::with_options(client, ns, svc, opts, prefix, wait, pause)
    }

    /// As [`ServiceWriter::paced`], connecting with `opts` (e.g. TLS).
    pub fn with_options(
        client: &Client,
        ns: &str,
        svc: &str,
        opts: ConnectOptions,
        prefix: &str,
        wait: i64,
        pause: Duration,
    ) -> Self {
        Self::trying(client, ns, svc, vec![opts], prefix, wait, pause)
    }

    /// As [`ServiceWriter::with_options`], each (re)connect trying the
    /// options of `ways` in turn until one connects (plain text, then TLS,
    /// as a client does while TLS is turned on or off).
    pub fn trying(
        client: &Client,
        ns: &str,
        svc: &str,
        ways: Vec<ConnectOptions>,
        prefix: &str,
        wait: i64,
        pause: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let (svc, prefix) = (svc.to_string(), prefix.to_string());
        let (s, t) = (stop.clone(), tally.clone());
        let task = tokio::spawn(async move {
            let mut i = 0u64;
            let mut conn: Option<(Node, String)> = None;
            let mut way = 0usize;
            let mut pace = super::pace::pacer();
            while !s.load(Ordering::SeqCst) {
                pace.tick().await;
                let Some((node, ip)) = conn.as_mut() else {
                    if let Some(ip) = ready_endpoint(&slices, &svc).await {
                        for (n, opts) in ways.iter().enumerate() {
                            if let Ok(c) = Node::connect(&Endpoint::new(&ip, 6379), opts).await {
                                conn = Some((c, ip));
                                way = n;
                                break;
                            }
                        }
                    }
                    if conn.is_none() {
                        if let Ok(mut t) = t.lock() {
                            t.unreachable += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    continue;
                };
                i += 1;
                let (key, sent, set) = set_next(node, &prefix, i).await;
                if let Err(e) = &set {
                    if let Ok(mut t) = t.lock() {
                        t.failed += 1;
                        *t.errors.entry(error_kind(e)).or_default() += 1;
                    }
                    conn = None;
                    continue;
                }
                let confirmed = if wait == 0 {
                    true
                } else {
                    matches!(
                        node.query::<i64>("WAIT", redis::cmd("WAIT").arg(wait).arg(500)).await,
                        Ok(n) if n >= wait
                    )
                };
                let acked = Instant::now();
                {
                    let Ok(mut tl) = t.lock() else { return };
                    if confirmed {
                        *tl.acks_by_way.entry(way).or_default() += 1;
                        tl.acks.push(Ack {
                            key,
                            ip: ip.clone(),
                            sent,
                            acked,
                        });
                    } else {
                        tl.unreplicated += 1;
                    }
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        });
        ServiceWriter { stop, tally, task }
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> usize {
        self.tally.lock().map(|t| t.acks.len()).unwrap_or(0)
    }

    /// [`Self::acked`] for another task to read while this one writes.
    pub fn acked_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let tally = self.tally.clone();
        move || tally.lock().map(|t| t.acks.len()).unwrap_or(0)
    }

    /// For a reader: with `within` n, the `pick % n`th of the last n writes
    /// acknowledged so far (of all of them with `None`); `None` before the
    /// first.
    pub fn acked_key(&self) -> impl Fn(u64, Option<u64>) -> Option<String> + Send + Sync + 'static {
        let tally = self.tally.clone();
        move |pick, within| {
            let t = tally.lock().ok()?;
            let all = t.acks.len() as u64;
            let n = within.unwrap_or(all).min(all);
            (n > 0).then(|| t.acks[(all - n + pick % n) as usize].key.clone())
        }
    }

    /// Stops it and returns what it saw.
    pub async fn stop(self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        self.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

/// Writes key `prefix:i`; returns the key, when it was sent and the reply.
async fn set_next(
    node: &mut Node,
    prefix: &str,
    i: u64,
) -> (String, Instant, redpilot::redis::Result<redis::Value>) {
    let key = format!("{prefix}:{i}");
    let sent = Instant::now();
    let set = node.query("SET", redis::cmd("SET").arg(&key).arg(i)).await;
    (key, sent, set)
}

/// The address of a ready endpoint of Service `svc`.
pub async fn ready_endpoint(slices: &Api<EndpointSlice>, svc: &str) -> Option<String> {
    let list = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .ok()?;
    list.items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .find_map(|e| e.addresses.first().cloned())
}

fn ip_cmd(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e} (install iproute2)"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The network namespace of the pod with address `ip` (the local node's).
pub fn pod_netns(ip: &str) -> String {
    for line in ip_cmd(&["netns", "list"]).lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let addrs = Command::new("ip")
            .args(["netns", "exec", ns, "ip", "-o", "-4", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if addrs.contains(&format!("inet {ip}/")) {
            return ns.to_string();
        }
    }
    panic!("no network namespace holds {ip}");
}

/// A pod cut off the node's bridge; healed when dropped.
pub struct Partition {
    veth: String,
    healed: bool,
}

impl Partition {
    /// Finds the host-side veth of the pod with address `ip`; [`Self::cut`]
    /// then cuts it off.
    pub fn of(ip: &str) -> Partition {
        let ns = pod_netns(ip);
        let iflink = Command::new("ip")
            .args(["netns", "exec", &ns, "cat", "/sys/class/net/eth0/iflink"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let veth = ip_cmd(&["-o", "link"])
            .lines()
            .find_map(|l| {
                let (idx, rest) = l.split_once(": ")?;
                (idx == iflink).then(|| rest.split(['@', ':']).next().map(str::to_string))?
            })
            .unwrap_or_else(|| panic!("no host veth with index {iflink:?} for {ip}"));
        Partition { veth, healed: true }
    }

    /// Cuts the pod off: its host-side veth goes down, so packets to and
    /// from it are dropped (no reset: peers time out).
    pub fn cut(&mut self) {
        ip_cmd(&["link", "set", "dev", &self.veth, "down"]);
        self.healed = false;
    }

    /// Brings the pod back.
    pub fn heal(&mut self) {
        if !self.healed {
            ip_cmd(&["link", "set", "dev", &self.veth, "up"]);
            self.healed = true;
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if !self.healed {
            let _ = Command::new("ip")
                .args(["link", "set", "dev", &self.veth, "up"])
                .status();
        }
    }
}

/// A writer inside a pod's network namespace, writing to 127.0.0.1.
pub struct InsideWriter {
    stop: Arc<AtomicBool>,
    acked: Arc<std::sync::atomic::AtomicUsize>,
    thread: std::thread::JoinHandle<Tally>,
}

impl InsideWriter {
    /// Writes `prefix:N` to the server of the pod whose namespace is `netns`.
    pub fn start(netns: &str, pw: &str, prefix: &str) -> InsideWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = acked.clone();
        let (s, netns, pw, prefix) = (
            stop.clone(),
            netns.to_string(),
            pw.to_string(),
            prefix.to_string(),
        );
        let thread = std::thread::spawn(move || {
            let f = std::fs::File::open(format!("/var/run/netns/{netns}"))
                .unwrap_or_else(|e| panic!("opening netns {netns}: {e}"));
            rustix::thread::move_into_link_name_space(
                f.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap_or_else(|e| panic!("entering netns {netns}: {e}"));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let opts = ConnectOptions::default()
                    .with_password(pw)
                    .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
                let ep = Endpoint::new("127.0.0.1", 6379);
                let mut tally = Tally::default();
                let mut conn: Option<Node> = None;
                let mut i = 0u64;
                while !s.load(Ordering::SeqCst) {
                    let Some(node) = conn.as_mut() else {
                        conn = Node::connect(&ep, &opts).await.ok();
                        if conn.is_none() {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        continue;
                    };
                    i += 1;
                    let (key, sent, set) = set_next(node, &prefix, i).await;
                    match set {
                        Ok(_) => {
                            tally.acks.push(Ack {
                                key,
                                ip: "127.0.0.1".into(),
                                sent,
                                acked: Instant::now(),
                            });
                            counted.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            tally.failed += 1;
                            *tally.errors.entry(error_kind(&e)).or_default() += 1;
                            // Refused writes (the primary fenced itself)
                            // keep the connection; pace the retries.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
                tally
            })
        });
        InsideWriter {
            stop,
            acked,
            thread,
        }
    }

    /// Writes acknowledged so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::SeqCst)
    }

    /// Stops it and returns what it saw.
    pub fn stop(self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

/// The keys of `keys` missing on the server at `ip`.
pub async fn missing(ip: &str, pw: &str, keys: &[String]) -> Vec<String> {
    super::writer::missing_keys(ip, pw, keys).await
}

/// p50 and p99 (nearest rank) of `xs`, in seconds.
pub fn percentiles(xs: &[f64]) -> (f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| {
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    };
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (at(0.5), at(0.99))
}

/// A network split made of blackhole routes inside pods' network
/// namespaces (removed when dropped). Unlike [`Partition`], the pods on one
/// side still reach each other: `cut(a, b)` only stops `a` from sending to
/// the addresses `b` (so no connection between them completes; cut both
/// ways). Exec probes run inside the pod's own namespace and are
/// unaffected, and the node still reaches every pod.
#[derive(Default)]
pub struct RouteSplit {
    /// (netns, destination) of every route added.
    routes: Vec<(String, String)>,
}

impl RouteSplit {
    /// Routes from the pod at `from` to each address of `to` go nowhere.
    pub fn cut(&mut self, from: &str, to: &[String]) {
        let ns = pod_netns(from);
        for ip in to {
            self.blackhole(&ns, ip);
        }
    }

    fn blackhole(&mut self, ns: &str, ip: &str) {
        ip_cmd(&[
            "netns",
            "exec",
            ns,
            "ip",
            "route",
            "add",
            "blackhole",
            &format!("{ip}/32"),
        ]);
        self.routes.push((ns.to_string(), ip.to_string()));
    }

    /// Removes every route added.
    pub fn heal(&mut self) {
        for (ns, ip) in self.routes.drain(..) {
            let _ = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns,
                    "ip",
                    "route",
                    "del",
                    "blackhole",
                    &format!("{ip}/32"),
                ])
                .status();
        }
    }
}

impl Drop for RouteSplit {
    fn drop(&mut self) {
        self.heal();
    }
}

/// A TCP relay between an operator and the API server that a test can cut
/// (the operator's kubeconfig names [`ApiRelay::url`]). While cut no byte
/// passes either way and new connections are held unanswered, as behind a
/// blackhole route: no reset, the client's own timeouts fire. A connection
/// that saw a cut is dropped once it heals, so the client connects again.
pub struct ApiRelay {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Even: open; odd: cut. Each cut and each heal adds one.
    state: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiRelay {
    /// A relay to the dev cluster's API server.
    pub async fn start() -> ApiRelay {
        let upstream = api_server_address();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the API relay");
        let url = format!(
            "https://{}",
            listener.local_addr().expect("the relay's address")
        );
        let state = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let (st, upstream) = (st.clone(), upstream.clone());
                tokio::spawn(async move {
                    let born = st.load(Ordering::SeqCst);
                    if born % 2 == 1 {
                        // Held unanswered until the cut heals, then dropped.
                        changed(&st, born).await;
                        return;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (cr, cw) = conn.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::select! {
                        _ = pump(cr, uw, &st, born) => {}
                        _ = pump(ur, cw, &st, born) => {}
                    }
                });
            }
        });
        ApiRelay { url, state, task }
    }

    /// Stops every byte (no-op when cut already).
    pub fn cut(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                (s % 2 == 0).then_some(s + 1)
            });
    }

    /// Lets bytes through again (no-op when not cut).
    pub fn heal(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                (s % 2 == 1).then_some(s + 1)
            });
    }
}

impl Drop for ApiRelay {
    fn drop(&mut self) {
        self.heal();
        self.task.abort();
    }
}

/// Waits until the relay's state is no longer `from`.
async fn changed(state: &std::sync::atomic::AtomicU64, from: u64) {
    while state.load(Ordering::SeqCst) == from {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Copies `from` to `to` while no cut has come since the connection began
/// (`born`); the bytes read during a cut are held, and the copy ends once
/// it heals.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: &std::sync::atomic::AtomicU64,
    born: u64,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let now = state.load(Ordering::SeqCst);
        if now != born {
            if now % 2 == 1 {
                changed(state, now).await;
            }
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `host:port` of the dev cluster's API server (from the admin kubeconfig).
fn api_server_address() -> String {
    let path = super::kubeconfig_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config: serde_yaml::Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no cluster server", path.display()));
    server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string()
}
