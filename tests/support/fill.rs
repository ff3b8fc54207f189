//! A steady fill of a Redis and a memory poller, for the memory autopilot's
//! suites: the filler writes `MSET` batches of fixed-size values to the
//! primary at a set rate and counts what was written and what was refused
//! (`OOM command not allowed`); the poller reads every instance's
//! `used_memory` and `maxmemory` every 100 ms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redpilot::redis::{ConnectOptions, Endpoint, Node};

/// Bytes per value.
pub const VALUE: usize = 8 << 10;

/// What the filler saw.
#[derive(Debug, Default, Clone)]
pub struct FillTally {
    /// Keys written (answered OK): `prefix:0 .. prefix:written`.
    pub written: u64,
    /// Batches refused with OOM.
    pub oom: u64,
    /// The first OOM reply, from the start.
    pub first_oom: Option<Duration>,
    /// Other failures.
    pub failed: u64,
    /// The first other failure's text.
    pub first_failure: Option<String>,
    /// When the filler stopped, from the start.
    pub elapsed: Duration,
}

/// A running filler.
pub struct Filler {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<FillTally>>,
    task: tokio::task::JoinHandle<()>,
    /// When it started.
    pub started: Instant,
}

impl Filler {
    /// Writes `bytes` of values (keys `prefix:N`, from `first`) at
    /// `rate` bytes per second to `primary` (an IP). Stops after the first
    /// OOM when `stop_at_oom`.
    pub fn start(
        primary: String,
        password: String,
        prefix: &str,
        first: u64,
        bytes: u64,
        rate: u64,
        stop_at_oom: bool,
    ) -> Filler {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(FillTally::default()));
        let started = Instant::now();
        let (s, t, prefix) = (stop.clone(), tally.clone(), prefix.to_string());
        let task = tokio::spawn(async move {
            let opts = ConnectOptions::default()
                .with_password(password)
                .with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
            let ep = Endpoint::new(&primary, 6379);
            let value = "v".repeat(VALUE);
            let total = bytes / VALUE as u64;
            let tick = Duration::from_millis(50);
            let per_tick = ((rate as f64 * tick.as_secs_f64()) / VALUE as f64).max(1.0);
            let mut owed = 0.0f64;
            let mut next = first;
            let mut node: Option<Node> = None;
            let mut ticker = tokio::time::interval(tick);
            while !s.load(Ordering::Relaxed) && next - first < total {
                ticker.tick().await;
                owed += per_tick;
                let n = (owed.floor() as u64).min(total - (next - first));
                if n == 0 {
                    continue;
                }
                if node.is_none() {
                    node = Node::connect(&ep, &opts).await.ok();
                }
                let Some(conn) = node.as_mut() else { continue };
                let mut cmd = redis::cmd("MSET");
                for k in next..next + n {
                    cmd.arg(format!("{prefix}:{k}")).arg(&value);
                }
                let result = conn.query::<()>("MSET", &cmd).await;
                let mut tally = t.lock().unwrap();
                match result {
                    Ok(()) => {
                        owed -= n as f64;
                        next += n;
                        tally.written = next - first;
                    }
                    Err(e) if e.to_string().contains("OOM") => {
                        owed -= n as f64;
                        tally.oom += 1;
                        tally.first_oom.get_or_insert(started.elapsed());
                        if stop_at_oom {
                            break;
                        }
                    }
                    Err(e) => {
                        tally.failed += 1;
                        tally.first_failure.get_or_insert(e.to_string());
                        node = None;
                    }
                }
            }
            t.lock().unwrap().elapsed = started.elapsed();
        });
        Filler {
            stop,
            tally,
            task,
            started,
        }
    }

    /// Waits until it wrote everything (or stopped on OOM), at most `within`.
    pub async fn finish(self, within: Duration) -> FillTally {
        let deadline = Instant::now() + within;
        while !self.task.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.tally.lock().unwrap().clone()
    }
}

/// One reading of one instance.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    /// Since the poller started.
    pub at: Duration,
    /// `used_memory`.
    pub used: u64,
    /// `maxmemory`.
    pub maxmemory: u64,
}

/// Reads every instance's memory every 100 ms.
pub struct Poller {
    stop: Arc<AtomicBool>,
    readings: Arc<Mutex<Vec<Vec<Reading>>>>,
    task: tokio::task::JoinHandle<()>,
    /// When it started.
    pub started: Instant,
}

impl Poller {
    /// Polls the instances at `ips` (index = ordinal).
    pub fn start(ips: Vec<String>, password: String) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let readings = Arc::new(Mutex::new(vec![Vec::new(); ips.len()]));
        let started = Instant::now();
        let (s, r) = (stop.clone(), readings.clone());
        let task = tokio::spawn(async move {
            let opts = ConnectOptions::default()
                .with_password(password)
                .with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
            let mut nodes: Vec<Option<Node>> = ips.iter().map(|_| None).collect();
            while !s.load(Ordering::Relaxed) {
                for (i, ip) in ips.iter().enumerate() {
                    if nodes[i].is_none() {
                        nodes[i] = Node::connect(&Endpoint::new(ip, 6379), &opts).await.ok();
                    }
                    let Some(node) = nodes[i].as_mut() else {
                        continue;
                    };
                    match node.info_section("memory").await {
                        Ok(info) => r.lock().unwrap()[i].push(Reading {
                            at: started.elapsed(),
                            used: info.memory.used_memory.unwrap_or(0),
                            maxmemory: info.memory.maxmemory.unwrap_or(0),
                        }),
                        Err(_) => nodes[i] = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Poller {
            stop,
            readings,
            task,
            started,
        }
    }

    /// Stops and returns the readings per instance.
    pub async fn stop(self) -> Vec<Vec<Reading>> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.readings.lock().unwrap().clone()
    }
}

/// For each time the primary's `used_memory` reached `up` of its
/// `maxmemory`: the time until every instance ran a larger `maxmemory`
/// (`None`: never within the readings). With the primary's readings at
/// `primary` of `readings`.
pub fn crossings_to_resize(
    readings: &[Vec<Reading>],
    primary: usize,
    up: f64,
) -> Vec<(Duration, u64, Option<Duration>)> {
    let mut out = Vec::new();
    let mut level_done: Option<u64> = None;
    for r in &readings[primary] {
        if r.maxmemory == 0 || (r.used as f64) < up * r.maxmemory as f64 {
            continue;
        }
        if level_done == Some(r.maxmemory) {
            continue;
        }
        level_done = Some(r.maxmemory);
        // Per instance, the first reading after the crossing with more.
        let all = readings
            .iter()
            .map(|inst| {
                inst.iter()
                    .find(|x| x.at >= r.at && x.maxmemory > r.maxmemory)
                    .map(|x| x.at)
            })
            .collect::<Option<Vec<Duration>>>();
        let done = all.and_then(|ts| ts.into_iter().max()).map(|t| t - r.at);
        out.push((r.at, r.maxmemory, done));
    }
    out
}
