//! A client that writes during a change, as an application would: it finds
//! the primary itself (the instance whose `INFO replication` says
//! `role:master`), writes one key at a time, and on any error drops its
//! connection and looks for the primary again. It counts what the server
//! acknowledged and the longest time between two acknowledgements, so a
//! change that stops the world for a moment shows as a gap.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::Failure;
use super::redis_failed;
use crate::redis::info::Role;
use crate::redis::{ConnectOptions, Endpoint, Node};

/// What the writer saw.
pub(super) struct Tally {
    /// The numbers of the keys whose `SET` was acknowledged.
    pub acked: Vec<u64>,
    /// Writes that failed or were refused (each one retried as a new key).
    pub failed: u64,
    /// The longest time between two acknowledged writes.
    pub longest_gap: Duration,
}

/// A running writer; [`Writer::stop`] ends it.
pub(super) struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Tally>,
    prefix: String,
}

fn options(password: &str) -> ConnectOptions {
    ConnectOptions::default()
        .with_password(password)
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(1))
}

/// A connection to `ep` when it answers as primary.
async fn connect_primary(ep: &Endpoint, opts: &ConnectOptions) -> Option<Node> {
    let mut node = Node::connect(ep, opts).await.ok()?;
    matches!(node.replication().await, Ok(r) if r.role == Some(Role::Primary)).then_some(node)
}

/// The instance that answers as primary now, connected.
async fn find_primary(pods: &Api<Pod>, names: &[String], opts: &ConnectOptions) -> Option<Node> {
    for name in names {
        let Some(ip) = pods
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status?.pod_ip)
        else {
            continue;
        };
        if let Some(node) = connect_primary(&Endpoint::new(&ip, 6379), opts).await {
            return Some(node);
        }
    }
    None
}

impl Writer {
    /// Starts writing `<prefix>:<n>` to whichever of the pods `names` is the
    /// primary.
    pub fn start(pods: Api<Pod>, names: Vec<String>, password: &str, prefix: &str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, opts, p) = (stop.clone(), options(password), prefix.to_string());
        let task = tokio::spawn(async move {
            let mut tally = Tally {
                acked: Vec::new(),
                failed: 0,
                longest_gap: Duration::ZERO,
            };
            let mut last: Option<Instant> = None;
            let mut conn: Option<Node> = None;
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let Some(node) = conn.as_mut() else {
                    conn = find_primary(&pods, &names, &opts).await;
                    if conn.is_none() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    continue;
                };
                n += 1;
                let mut cmd = redis::cmd("SET");
                cmd.arg(format!("{p}:{n}")).arg(n);
                match node.query::<()>("SET", &cmd).await {
                    Ok(()) => {
                        let now = Instant::now();
                        if let Some(l) = last {
                            tally.longest_gap = tally.longest_gap.max(now - l);
                        }
                        last = Some(now);
                        tally.acked.push(n);
                        // About 200 writes a second: enough to see a gap of
                        // tens of milliseconds, light for any server.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(_) => {
                        tally.failed += 1;
                        // A primary demoted by a switchover names the new
                        // one: follow it as a client would, without asking
                        // the API server (whose latency is not the
                        // upgrade's).
                        let next = match node.replication().await {
                            Ok(r) if r.role == Some(Role::Replica) => r.primary,
                            _ => None,
                        };
                        conn = match next {
                            Some(ep) => connect_primary(&ep, &opts).await,
                            None => None,
                        };
                    }
                }
            }
            tally
        });
        Writer {
            stop,
            task,
            prefix: prefix.to_string(),
        }
    }

    /// Stops the writer: what it saw, and the prefix of its keys.
    pub async fn stop(self) -> Result<(Tally, String), Failure> {
        self.stop.store(true, Ordering::Relaxed);
        let tally = self
            .task
            .await
            .map_err(|e| Failure::new(format!("the writer failed: {e}"), "a scorecard bug"))?;
        Ok((tally, self.prefix))
    }
}

/// How many of the acknowledged keys `node` lacks.
pub(super) async fn missing(
    node: &mut Node,
    prefix: &str,
    acked: &[u64],
) -> Result<usize, Failure> {
    let mut found = 0usize;
    for chunk in acked.chunks(500) {
        let mut cmd = redis::cmd("EXISTS");
        for n in chunk {
            cmd.arg(format!("{prefix}:{n}"));
        }
        let c: usize = node
            .query("EXISTS", &cmd)
            .await
            .map_err(|e| redis_failed("EXISTS on the writer's keys", e))?;
        found += c;
    }
    Ok(acked.len() - found)
}
