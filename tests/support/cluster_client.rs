//! A Redis Cluster client for the tests that move slots: one connection
//! per node, every command sent once per node it goes to, `MOVED` and
//! `ASK` followed (at most five hops), `TRYAGAIN` counted and waited on.
//! The `redis` crate's own cluster client and retries play no part, so
//! what the client met is counted here.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use redpilot::redis::cluster;
use redpilot::redis::{ConnectOptions, Endpoint, Node};

/// A client error's kind, for counting: its first word (a server's error
/// code, `MOVED`, `UNCONFIRMED`, or the client's own first word).
pub fn error_kind(e: &str) -> String {
    e.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .find(|w| !w.is_empty())
        .unwrap_or("other")
        .to_string()
}

/// What a client following redirections met.
#[derive(Debug, Default, Clone)]
pub struct Met {
    pub moved: u64,
    pub ask: u64,
    pub tryagain: u64,
    /// Commands sent again through the seed because the node the map named
    /// could not be reached and nothing had been sent to it.
    pub rerouted: u64,
}

/// A cluster client for the test: one connection per node, every command
/// sent once per node it is sent to, `MOVED` and `ASK` followed (at most
/// five hops), `TRYAGAIN` waited on. Slot owners are learnt from the
/// redirections, as a cluster client does.
pub struct Client {
    opts: ConnectOptions,
    conns: HashMap<String, Node>,
    owners: BTreeMap<u16, Endpoint>,
    seed: Endpoint,
    pub met: Met,
    /// `WAIT <replicas> <ms>` after each command, on the node that ran it:
    /// a command whose write fewer replicas confirmed is an error
    /// (`UNCONFIRMED`), so a confirmed write is one a failover keeps.
    pub confirm: Option<(u32, u64)>,
}

/// `host:port` at the end of a `MOVED` or `ASK` reply.
pub fn redirect_target(message: &str) -> Option<Endpoint> {
    let addr = message
        .split_whitespace()
        .rev()
        .find(|t| t.contains(':'))?
        .trim_end_matches(|c: char| !c.is_ascii_digit());
    let (host, port) = addr.rsplit_once(':')?;
    Some(Endpoint::new(host, port.parse().ok()?))
}

impl Client {
    pub fn new(seed: Endpoint, opts: ConnectOptions) -> Self {
        Client {
            opts,
            conns: HashMap::new(),
            owners: BTreeMap::new(),
            seed,
            met: Met::default(),
            confirm: None,
        }
    }

    /// Asks `seed` next for the owner of a slot it does not know (the
    /// old seed gone: a pod restarted at a new address).
    pub fn set_seed(&mut self, seed: Endpoint) {
        self.seed = seed;
    }

    pub async fn node(&mut self, at: &Endpoint) -> Result<&mut Node, String> {
        let key = at.to_string();
        if !self.conns.contains_key(&key) {
            let n = Node::connect(at, &self.opts)
                .await
                .map_err(|e| e.to_string())?;
            self.conns.insert(key.clone(), n);
        }
        self.conns
            .get_mut(&key)
            .ok_or_else(|| "no connection".to_string())
    }

    /// Runs `cmd` on the key's slot owner; the reply.
    pub async fn run<T: redis::FromRedisValue>(
        &mut self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, String> {
        let slot = cluster::key_slot(key.as_bytes());
        let mut at = self.owners.get(&slot).cloned().unwrap_or(self.seed.clone());
        let mut asking = false;
        let mut rerouted = false;
        let confirm = self.confirm;
        for _ in 0..5 {
            let result = {
                let node = match self.node(&at).await {
                    Ok(n) => n,
                    Err(e) => {
                        // Unreachable: forget every slot it was known to
                        // own, not only this one (a node restarted at a
                        // new address owns none of them there).
                        self.owners.retain(|_, owner| *owner != at);
                        // Nothing was sent: once per command, ask the seed
                        // who owns the slot now, as a cluster client
                        // refreshes its map (a removed shard's address).
                        if !rerouted && at != self.seed {
                            rerouted = true;
                            self.met.rerouted += 1;
                            at = self.seed.clone();
                            asking = false;
                            continue;
                        }
                        return Err(e);
                    }
                };
                if asking {
                    let _: redis::Value = node
                        .query("ASKING", &redis::cmd("ASKING"))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                let r = node.query::<T>("COMMAND", cmd).await;
                match (r, confirm) {
                    (Ok(v), Some((n, ms))) => {
                        let got: Result<u32, _> =
                            node.query("WAIT", redis::cmd("WAIT").arg(n).arg(ms)).await;
                        match got {
                            Ok(k) if k >= n => Ok(v),
                            Ok(k) => {
                                return Err(format!(
                                    "UNCONFIRMED: {k} of {n} replicas within {ms} ms"
                                ));
                            }
                            Err(e) => Err(e),
                        }
                    }
                    (r, _) => r,
                }
            };
            match result {
                Ok(v) => {
                    if !asking {
                        self.owners.insert(slot, at);
                    }
                    return Ok(v);
                }
                Err(e) => {
                    let code = e.server_code().map(str::to_string);
                    let text = e.to_string();
                    match code.as_deref() {
                        Some("MOVED") => {
                            self.met.moved += 1;
                            at = redirect_target(&text).ok_or(text)?;
                            asking = false;
                        }
                        Some("ASK") => {
                            self.met.ask += 1;
                            at = redirect_target(&text).ok_or(text)?;
                            asking = true;
                        }
                        Some("TRYAGAIN") => {
                            self.met.tryagain += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        _ => {
                            // The connection may be broken, or the node gone
                            // (a removed shard): open a new one next time, and
                            // ask the seed who owns the slot.
                            self.conns.remove(&at.to_string());
                            self.owners.remove(&slot);
                            // A kept connection found closed before the
                            // command went out (the write failed): nothing
                            // was sent, so it goes once more as above.
                            if text.contains("broken pipe") && !rerouted && at != self.seed {
                                self.owners.retain(|_, owner| *owner != at);
                                rerouted = true;
                                self.met.rerouted += 1;
                                at = self.seed.clone();
                                asking = false;
                                continue;
                            }
                            return Err(text);
                        }
                    }
                }
            }
        }
        Err(format!("{key}: more than five redirections"))
    }
}

/// The string value of filled tag `t` (`size` bytes).
pub fn value(t: usize, size: usize) -> String {
    let head = format!("v{t}-");
    format!("{head}{}", "x".repeat(size.saturating_sub(head.len())))
}

/// Fills `tags` hash tags with a string, a hash, a list and a set each.
pub async fn fill(client: &mut Client, tags: usize, size: usize) {
    let per = 4;
    let field = "f".repeat(size / per);
    for t in 0..tags {
        let v = value(t, size);
        let k = |suffix: &str| format!("{{t{t}}}:{suffix}");
        let cmds = [
            (k("s"), redis::cmd("SET").arg(k("s")).arg(&v).clone()),
            (
                k("h"),
                redis::cmd("HSET")
                    .arg(k("h"))
                    .arg("a")
                    .arg(&field)
                    .arg("b")
                    .arg(&field)
                    .arg("c")
                    .arg(&field)
                    .arg("d")
                    .arg(&field)
                    .clone(),
            ),
            (
                k("l"),
                redis::cmd("RPUSH")
                    .arg(k("l"))
                    .arg(&field)
                    .arg(&field)
                    .arg(&field)
                    .arg(&field)
                    .clone(),
            ),
            (
                k("z"),
                redis::cmd("SADD")
                    .arg(k("z"))
                    .arg(format!("1{field}"))
                    .arg(format!("2{field}"))
                    .arg(format!("3{field}"))
                    .arg(format!("4{field}"))
                    .clone(),
            ),
        ];
        for (key, cmd) in cmds {
            let _: redis::Value = client
                .run(&key, &cmd)
                .await
                .unwrap_or_else(|e| panic!("filling {key}: {e}"));
        }
    }
}

/// Whether filled tag `t` is whole (its string holds its value, its hash,
/// list and set four elements each); `None` when a read failed.
pub async fn whole(client: &mut Client, t: usize, size: usize) -> Option<bool> {
    let k = |s: &str| format!("{{t{t}}}:{s}");
    let s: Option<String> = client
        .run(&k("s"), redis::cmd("GET").arg(k("s")))
        .await
        .ok()?;
    let h: u64 = client
        .run(&k("h"), redis::cmd("HLEN").arg(k("h")))
        .await
        .ok()?;
    let l: u64 = client
        .run(&k("l"), redis::cmd("LLEN").arg(k("l")))
        .await
        .ok()?;
    let z: u64 = client
        .run(&k("z"), redis::cmd("SCARD").arg(k("z")))
        .await
        .ok()?;
    Some(s.as_deref() == Some(value(t, size).as_str()) && (h, l, z) == (4, 4, 4))
}

/// Which of `keys` are not there with themselves as their value (the
/// unique-key writers write `SET k k`): read with `MGET`, a slot's keys 200
/// at a time, so a check of many thousand writes takes a few round trips per
/// slot. Call it when no slot is open (a resharding done): a multi-key read
/// of an open slot is refused with `TRYAGAIN`.
pub async fn missing_keys(client: &mut Client, keys: &[String]) -> Vec<String> {
    try_missing_keys(client, keys)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`missing_keys`], saying why when the cluster cannot be read (a node
/// that still refuses after a few tries) rather than failing the test.
pub async fn try_missing_keys(client: &mut Client, keys: &[String]) -> Result<Vec<String>, String> {
    let mut by_slot: BTreeMap<u16, Vec<&String>> = BTreeMap::new();
    for k in keys {
        by_slot
            .entry(cluster::key_slot(k.as_bytes()))
            .or_default()
            .push(k);
    }
    let mut out = Vec::new();
    for group in by_slot.values() {
        for chunk in group.chunks(200) {
            let mut cmd = redis::cmd("MGET");
            for k in chunk {
                cmd.arg(k.as_str());
            }
            // A read may meet a node that is busy a moment (a restart just
            // done, a loaded machine): asked again a few times before the
            // check gives up (reads change nothing, so asking again is safe).
            let mut tries = 0;
            let got: Vec<Option<String>> = loop {
                match client.run(chunk[0], &cmd).await {
                    Ok(got) => break got,
                    Err(e) if tries < 4 => {
                        tries += 1;
                        eprintln!(
                            "MGET of {} keys from {}: {e}; asking again",
                            chunk.len(),
                            chunk[0]
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => {
                        return Err(format!(
                            "MGET of {} keys from {}: {e}",
                            chunk.len(),
                            chunk[0]
                        ));
                    }
                }
            };
            for (k, v) in chunk.iter().zip(got) {
                if v.as_deref() != Some(k.as_str()) {
                    out.push((*k).clone());
                }
            }
        }
    }
    Ok(out)
}
