//! Pod networking: one network namespace per pod, joined by a veth pair to
//! the `rpnode0` bridge that carries the node address. Pod addresses come
//! from a private /16 owned by this node, so nothing leaves the machine
//! (IP forwarding is left as it is; pods reach each other across the bridge
//! and the host through its bridge address).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use crate::cmd::run;
use crate::error::{Error, Result};

/// Names of everything this node creates on the host, derived from one
/// short prefix (default `rp`: bridge `rpnode0`, namespaces `rp-<id>`,
/// veths `rpv<id>`), so a second node on the same machine (the teardown
/// test) never touches the first one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The prefix itself (the node's memory cgroups live under it).
    pub prefix: String,
    pub bridge: String,
    pub netns_prefix: String,
    pub veth_prefix: String,
}

impl Names {
    pub fn new(prefix: &str) -> Result<Self> {
        let ok = (1..=4).contains(&prefix.len())
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !ok {
            return Err(Error::Network(format!(
                "instance prefix {prefix:?} must be 1-4 lowercase letters or digits"
            )));
        }
        Ok(Self {
            prefix: prefix.to_string(),
            bridge: format!("{prefix}node0"),
            netns_prefix: format!("{prefix}-"),
            veth_prefix: format!("{prefix}v"),
        })
    }

    fn veth(&self, id: &str) -> String {
        let room = 15usize.saturating_sub(self.veth_prefix.len());
        format!("{}{}", self.veth_prefix, &id[..id.len().min(room)])
    }
}

/// The node's pod network.
#[derive(Debug)]
pub struct Network {
    pub names: Names,
    /// The bridge (node) address; pods use the subnet around it.
    pub gateway: Ipv4Addr,
    prefix_len: u8,
    alloc: Mutex<Alloc>,
}

#[derive(Debug)]
struct Alloc {
    used: BTreeSet<u32>,
    next: u32,
}

/// A pod's network sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNet {
    pub netns: String,
    pub veth: String,
    pub ip: Ipv4Addr,
}

impl Network {
    pub fn new(names: Names, gateway: Ipv4Addr, prefix_len: u8) -> Self {
        let g = u32::from(gateway);
        Self {
            names,
            gateway,
            prefix_len,
            alloc: Mutex::new(Alloc {
                used: BTreeSet::new(),
                next: g + 1,
            }),
        }
    }

    fn host_range(&self) -> (u32, u32) {
        let mask = u32::MAX << (32 - u32::from(self.prefix_len));
        let net = u32::from(self.gateway) & mask;
        (net + 1, (net | !mask) - 1)
    }

    /// Creates the bridge with the node address (idempotent).
    pub async fn ensure_bridge(&self) -> Result<()> {
        let bridge = self.names.bridge.as_str();
        if run("ip", &["link", "show", bridge]).await.is_err() {
            run("ip", &["link", "add", bridge, "type", "bridge"]).await?;
        }
        let cidr = format!("{}/{}", self.gateway, self.prefix_len);
        let addrs = run("ip", &["-4", "-o", "addr", "show", "dev", bridge]).await?;
        if !addrs.contains(&cidr) {
            run("ip", &["addr", "add", &cidr, "dev", bridge]).await?;
        }
        run("ip", &["link", "set", bridge, "up"]).await?;
        Ok(())
    }

    /// Picks the next free address, round robin so a freed address is not
    /// handed out again at once (neighbour caches would still point at the
    /// old veth).
    fn allocate(&self) -> Result<Ipv4Addr> {
        let (lo, hi) = self.host_range();
        let gw = u32::from(self.gateway);
        let mut a = self
            .alloc
            .lock()
            .map_err(|_| Error::Network("address allocator poisoned".into()))?;
        let span = hi - lo + 1;
        for _ in 0..span {
            let cand = if a.next < lo || a.next > hi {
                lo
            } else {
                a.next
            };
            a.next = cand + 1;
            if cand != gw && !a.used.contains(&cand) {
                a.used.insert(cand);
                return Ok(Ipv4Addr::from(cand));
            }
        }
        Err(Error::Network("pod address range exhausted".into()))
    }

    fn release(&self, ip: Ipv4Addr) {
        if let Ok(mut a) = self.alloc.lock() {
            a.used.remove(&u32::from(ip));
        }
    }

    /// Creates the namespace, the veth pair and the address for a pod.
    pub async fn create(&self, id: &str) -> Result<PodNet> {
        let ip = self.allocate()?;
        let net = PodNet {
            netns: format!("{}{id}", self.names.netns_prefix),
            veth: self.names.veth(id),
            ip,
        };
        if let Err(e) = self.setup(&net).await {
            self.destroy(&net, &[]).await;
            return Err(e);
        }
        Ok(net)
    }

    async fn setup(&self, net: &PodNet) -> Result<()> {
        let ns = net.netns.as_str();
        // Leftovers of an earlier run under the same name.
        let _ = run("ip", &["link", "del", &net.veth]).await;
        let _ = run("ip", &["netns", "del", ns]).await;
        run("ip", &["netns", "add", ns]).await?;
        run(
            "ip",
            &[
                "link", "add", &net.veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ],
        )
        .await?;
        run(
            "ip",
            &["link", "set", &net.veth, "master", &self.names.bridge, "up"],
        )
        .await?;
        let o = net.ip.octets();
        // A MAC derived from the address: a reused address keeps its MAC.
        let mac = format!("02:42:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]);
        let cidr = format!("{}/{}", net.ip, self.prefix_len);
        let gw = self.gateway.to_string();
        for args in [
            vec!["-n", ns, "link", "set", "eth0", "address", &mac],
            vec!["-n", ns, "addr", "add", &cidr, "dev", "eth0"],
            vec!["-n", ns, "link", "set", "eth0", "up"],
            vec!["-n", ns, "link", "set", "lo", "up"],
            vec!["-n", ns, "route", "add", "default", "via", &gw],
        ] {
            run("ip", &args).await?;
        }
        Ok(())
    }

    /// Kills whatever still runs in the namespace, then removes it with its
    /// veth. Never fails: teardown is best effort and logged.
    pub async fn destroy(&self, net: &PodNet, groups: &[i32]) {
        kill_netns_processes(&net.netns, groups).await;
        if let Err(e) = run("ip", &["link", "del", &net.veth]).await {
            tracing::debug!(error = %e, "veth already gone");
        }
        if let Err(e) = run("ip", &["netns", "del", &net.netns]).await {
            tracing::debug!(error = %e, "netns already gone");
        }
        self.release(net.ip);
    }
}

/// SIGKILLs every process in a network namespace or in one of `groups`
/// (process groups of the pod's containers) and waits, up to five seconds,
/// until none of them is left.
///
/// Both lists are needed. SIGKILL is delivered asynchronously, and a server
/// started in the background by a shell is orphaned when the shell exits, so
/// nothing waits for it as a child. A process on its way out leaves the
/// network namespace before it releases its mount namespace (the container's
/// overlays, which takes a while), so an empty namespace alone does not mean
/// its processes are gone; the process group still names them until they are
/// zombies.
pub async fn kill_netns_processes(netns: &str, groups: &[i32]) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let mut pids: BTreeSet<i32> = match run("ip", &["netns", "pids", netns]).await {
            Ok(out) => out
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .collect(),
            Err(_) => BTreeSet::new(),
        };
        pids.extend(live_members(groups));
        if pids.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(netns, ?pids, "pod processes still there after SIGKILL");
            return;
        }
        for pid in pids {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Processes (not yet zombies) whose process group is one of `groups`.
fn live_members(groups: &[i32]) -> Vec<i32> {
    if groups.is_empty() {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
                .is_some_and(|(state, pgid)| state != 'Z' && state != 'X' && groups.contains(&pgid))
        })
        .collect()
}

/// State and process group from a `/proc/<pid>/stat` line. The command
/// name may contain spaces and parentheses, so fields are counted after the
/// last `)`.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let _ppid = rest.next()?;
    let pgid = rest.next()?.parse().ok()?;
    Some((state, pgid))
}

/// Removes every namespace, veth and the bridge this node ever created
/// (start-up and `localnode cleanup`).
pub async fn cleanup_all(names: &Names) {
    if let Ok(out) = run("ip", &["netns", "list"]).await {
        for ns in out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&names.netns_prefix))
        {
            kill_netns_processes(ns, &[]).await;
            let _ = run("ip", &["netns", "del", ns]).await;
        }
    }
    if let Ok(out) = run("ip", &["-o", "link", "show"]).await {
        for name in out.lines().filter_map(|l| {
            let name = l.split(':').nth(1)?.trim();
            let name = name.split('@').next()?;
            name.starts_with(&names.veth_prefix)
                .then(|| name.to_string())
        }) {
            let _ = run("ip", &["link", "del", &name]).await;
        }
    }
    let _ = run("ip", &["link", "del", &names.bridge]).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_round_robin_and_skips_gateway() {
        let Ok(names) = Names::new("rp") else {
            panic!("prefix rp is valid")
        };
        assert_eq!(names.veth("0123456789abcdef"), "rpv0123456789ab");
        assert!(Names::new("toolong").is_err());
        let n = Network::new(names, Ipv4Addr::new(10, 244, 0, 1), 16);
        let a = n.allocate().unwrap_or(Ipv4Addr::UNSPECIFIED);
        let b = n.allocate().unwrap_or(Ipv4Addr::UNSPECIFIED);
        assert_eq!(a, Ipv4Addr::new(10, 244, 0, 2));
        assert_eq!(b, Ipv4Addr::new(10, 244, 0, 3));
        n.release(a);
        let c = n.allocate().unwrap_or(Ipv4Addr::UNSPECIFIED);
        assert_eq!(c, Ipv4Addr::new(10, 244, 0, 4));
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (redis (x) srv) S 1 4240 4240 0 -1 4194560 0 0";
        assert_eq!(parse_stat(line), Some(('S', 4240)));
        assert_eq!(parse_stat("7 (sh) Z 1 7 7"), Some(('Z', 7)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_group_is_seen_and_an_unknown_one_is_not() {
        let me = std::process::id() as i32;
        let Some((_, group)) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
        else {
            panic!("/proc/self/stat is readable")
        };
        assert!(live_members(&[group]).contains(&me));
        assert!(live_members(&[]).is_empty());
        assert!(live_members(&[i32::MAX]).is_empty());
    }
}
