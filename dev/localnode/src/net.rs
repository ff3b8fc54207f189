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

pub const BRIDGE: &str = "rpnode0";
pub const NETNS_PREFIX: &str = "rp-";
pub const VETH_PREFIX: &str = "rpv";

/// The node's pod network.
#[derive(Debug)]
pub struct Network {
    /// The bridge (node) address; pods use the /16 around it.
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
    pub fn new(gateway: Ipv4Addr, prefix_len: u8) -> Self {
        let g = u32::from(gateway);
        Self {
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
        if run("ip", &["link", "show", BRIDGE]).await.is_err() {
            run("ip", &["link", "add", BRIDGE, "type", "bridge"]).await?;
        }
        let cidr = format!("{}/{}", self.gateway, self.prefix_len);
        let addrs = run("ip", &["-4", "-o", "addr", "show", "dev", BRIDGE]).await?;
        if !addrs.contains(&cidr) {
            run("ip", &["addr", "add", &cidr, "dev", BRIDGE]).await?;
        }
        run("ip", &["link", "set", BRIDGE, "up"]).await?;
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
            netns: format!("{NETNS_PREFIX}{id}"),
            veth: format!("{VETH_PREFIX}{id}"),
            ip,
        };
        if let Err(e) = self.setup(&net).await {
            self.destroy(&net).await;
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
        run("ip", &["link", "set", &net.veth, "master", BRIDGE, "up"]).await?;
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
    pub async fn destroy(&self, net: &PodNet) {
        kill_netns_processes(&net.netns).await;
        if let Err(e) = run("ip", &["link", "del", &net.veth]).await {
            tracing::debug!(error = %e, "veth already gone");
        }
        if let Err(e) = run("ip", &["netns", "del", &net.netns]).await {
            tracing::debug!(error = %e, "netns already gone");
        }
        self.release(net.ip);
    }
}

/// SIGKILLs every process in a network namespace.
pub async fn kill_netns_processes(netns: &str) {
    if let Ok(out) = run("ip", &["netns", "pids", netns]).await {
        for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Removes every namespace, veth and the bridge this node ever created
/// (start-up and `localnode cleanup`).
pub async fn cleanup_all() {
    if let Ok(out) = run("ip", &["netns", "list"]).await {
        for ns in out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(NETNS_PREFIX))
        {
            kill_netns_processes(ns).await;
            let _ = run("ip", &["netns", "del", ns]).await;
        }
    }
    if let Ok(out) = run("ip", &["-o", "link", "show"]).await {
        for name in out.lines().filter_map(|l| {
            let name = l.split(':').nth(1)?.trim();
            let name = name.split('@').next()?;
            name.starts_with(VETH_PREFIX).then(|| name.to_string())
        }) {
            let _ = run("ip", &["link", "del", &name]).await;
        }
    }
    let _ = run("ip", &["link", "del", BRIDGE]).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_round_robin_and_skips_gateway() {
        let n = Network::new(Ipv4Addr::new(10, 244, 0, 1), 16);
        let a = n.allocate().unwrap_or(Ipv4Addr::UNSPECIFIED);
        let b = n.allocate().unwrap_or(Ipv4Addr::UNSPECIFIED);
        assert_eq!(a, Ipv4Addr::new(10, 244, 0, 2));
        assert_eq!(b, Ipv4Addr::new(10, 244, 0, 3));
        n.release(a);
        let c = n.allocate().unwrap_or(Ipv4Addr::UNSPECIFIED);
        assert_eq!(c, Ipv4Addr::new(10, 244, 0, 4));
    }
}
