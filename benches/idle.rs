//! `make bench-idle`: what an idle operator costs, and how that grows with
//! the number of Redis it runs, on the dev cluster with real servers.
//!
//! One operator (the release build) watches one namespace. With 0, then 1,
//! then `IDLE_REDIS` (10) Replication Redis of 3 instances each, all Ready
//! and left alone, it is measured over an idle window (`IDLE_SECS`, 120 s,
//! after `IDLE_SETTLE_SECS`, 30 s, for the last changes to pass): its CPU
//! time (user + system, from /proc) and its resident memory at the end.
//! Everything the operator does on its own while nothing changes is in the
//! figure: the failure monitor's probes (2 a second per primary), the
//! periodic reconcile of each Redis (one a minute), the tuning looks, the
//! metrics it serves to nobody, its Lease renewals.
//!
//! Printed: CPU per Redis per idle minute, RSS with 0, 1 and N Redis, and
//! the RSS slope per Redis. `IDLE_TUNING_SECS` sets the tuning look's
//! interval (0 turns it off) to tell its share from the reconcile's;
//! `IDLE_OPERATOR_BIN` runs another build of the operator (to compare
//! builds or releases on the same machine and cluster). Each window also
//! prints the reconcile passes and Kubernetes requests per minute, from
//! the operator's counters; `IDLE_PERF=<dir>` records `perf` samples of
//! the window with the most Redis there.
//!
//! `IDLE_CALLGRIND=<dir>` runs the operator under valgrind's callgrind and
//! writes there every function the operator ran in the window with the
//! most Redis (the counters are zeroed when it starts, dumped when it
//! ends): `make hot-symbols` makes the release link's function order from
//! it (see `hack/hot-symbols.py`). CPU figures of such a run mean nothing.
//! `IDLE_FEW_SECS` shortens the windows with 0 and 1 Redis.

// The percentiles the other benches share are not needed here.
#[allow(dead_code)]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use common::knob;
use futures::{StreamExt, stream};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, cpu_seconds, metric_sum, start_operator, wait_ready,
};
use support::{TestNamespace, client};

struct Window {
    redis: usize,
    cpu_ms_per_min: f64,
    rss_mib: f64,
    /// `RssAnon`, `RssFile` (the binary's and libraries' pages) in MiB,
    /// and the thread count, from /proc/<pid>/status.
    anon_mib: f64,
    file_mib: f64,
    threads: u64,
    /// Of the binary's resident pages, those touched during the window
    /// (MiB; `Referenced` in /proc/<pid>/smaps after `clear_refs`).
    binary_touched_mib: f64,
    /// Pages the operator read from the disk on a touch in the window
    /// (major faults: its binary's, given back by `src/pages.rs`).
    major_faults: u64,
    /// Reconcile passes and Kubernetes requests per minute (from the
    /// operator's counters).
    reconciles_per_min: f64,
    kube_requests_per_min: f64,
}

/// Sums `field` (kB) over the mappings of the process's own binary in
/// /proc/<pid>/smaps.
fn binary_smaps_kib(pid: u32, field: &str) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let exe = exe.to_string_lossy();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut ours = false;
    let mut kib = 0;
    for line in smaps.lines() {
        // A mapping's header starts with its address range.
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            ours = line.ends_with(exe.as_ref());
        } else if ours && let Some(v) = line.strip_prefix(field).and_then(|v| v.strip_prefix(':')) {
            kib += v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    kib
}

/// The major faults of process `pid` so far (field 12 of /proc/<pid>/stat).
fn major_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis start at 3 (state).
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(9)?.parse().ok())
        .unwrap_or_else(|| panic!("majflt in /proc/{pid}/stat"))
}

/// A field of /proc/<pid>/status (`kB` values in KiB).
fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

async fn window(
    op: &support::operator::Operator,
    redis: usize,
    settle: Duration,
    idle: Duration,
) -> Window {
    let pid = op.pid().expect("operator pid");
    tokio::time::sleep(settle).await;
    let counters = || async {
        let page = op.metrics().await.unwrap_or_default();
        (
            metric_sum(&page, "redpilot_reconciliations_total").unwrap_or(0.0),
            metric_sum(&page, "redpilot_kube_requests_total").unwrap_or(0.0),
        )
    };
    let (passes0, requests0) = counters().await;
    // From here on, pages the operator touches are marked referenced again.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "1").expect("clear_refs");
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    let faults0 = major_faults(pid);
    // IDLE_CALLGRIND: the operator runs under callgrind; its counters
    // start from zero with the window with the most Redis.
    let callgrind = std::env::var("IDLE_CALLGRIND").ok().filter(|_| redis > 1);
    if callgrind.is_some() {
        callgrind_control(pid, "--zero");
    }
    // IDLE_PERF: a directory; `perf record` samples the operator over the
    // window with the most Redis (perf must be installed).
    let perf = std::env::var("IDLE_PERF")
        .ok()
        .filter(|_| redis > 1)
        .map(|dir| {
            let out = format!("{dir}/idle-{redis}.perf.data");
            println!("perf samples of this window: {out}");
            std::process::Command::new("perf")
                // The release build keeps no frame pointers: stacks are
                // unwound from its unwind tables.
                .args(["record", "-F", &knob("IDLE_PERF_HZ", 499).to_string()])
                .args(["--call-graph", "dwarf,16384"])
                .args(["-o", &out, "-p", &pid.to_string()])
                .args(["--", "sleep", &idle.as_secs().to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("perf record (install perf, or unset IDLE_PERF)")
        });
    tokio::time::sleep(idle).await;
    let cpu = cpu_seconds(pid) - cpu0;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let (passes1, requests1) = counters().await;
    if let Some(page) = op.metrics().await {
        // Which requests (by verb and resource), since the start.
        for line in page
            .lines()
            .filter(|l| l.starts_with("redpilot_kube_requests_total{"))
        {
            println!("    {line}");
        }
    }
    if let Some(mut perf) = perf {
        let _ = perf.wait();
    }
    if let Some(dir) = &callgrind {
        callgrind_control(pid, "--dump=idle window");
        println!("functions run in this window: {dir}/callgrind.out.{pid}.*");
    }
    let rss_mib = op.rss_kib().expect("operator RSS") as f64 / 1024.0;
    let w = Window {
        redis,
        cpu_ms_per_min: cpu * 1000.0 / minutes,
        rss_mib,
        anon_mib: status_field(pid, "RssAnon") as f64 / 1024.0,
        file_mib: status_field(pid, "RssFile") as f64 / 1024.0,
        threads: status_field(pid, "Threads"),
        binary_touched_mib: binary_smaps_kib(pid, "Referenced") as f64 / 1024.0,
        major_faults: major_faults(pid) - faults0,
        reconciles_per_min: (passes1 - passes0) / minutes,
        kube_requests_per_min: (requests1 - requests0) / minutes,
    };
    println!(
        "{redis:>3} Redis idle {:.1} min: operator CPU {:.0} ms/min{}, RSS {rss_mib:.1} MiB \
         (anonymous {:.1}, file {:.1}; of the binary's pages {:.1} touched in the window), \
         {} threads, {} major faults; {:.1} reconciles/min, {:.1} API requests/min",
        minutes,
        w.cpu_ms_per_min,
        if redis > 0 {
            format!(
                " ({:.2} ms per Redis per min)",
                w.cpu_ms_per_min / redis as f64
            )
        } else {
            String::new()
        },
        w.anon_mib,
        w.file_mib,
        w.binary_touched_mib,
        w.threads,
        w.major_faults,
        w.reconciles_per_min,
        w.kube_requests_per_min
    );
    w
}

/// Tells the callgrind of the operator `pid` to zero or dump its counters.
fn callgrind_control(pid: u32, what: &str) {
    let status = std::process::Command::new("callgrind_control")
        .args([what, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("callgrind_control (install valgrind, or unset IDLE_CALLGRIND)");
    assert!(status.success(), "callgrind_control {what} {pid}: {status}");
}

async fn add_redis(client: &kube::Client, ns: &str, from: usize, to: usize) {
    stream::iter(from..to)
        .for_each_concurrent(4, |i| async move {
            let name = format!("idle-{i}");
            apply_redis(
                client,
                ns,
                &name,
                json!({"mode": "Replication", "instances": 3}),
            )
            .await;
        })
        .await;
    for i in from..to {
        wait_ready(client, ns, &format!("idle-{i}"), Duration::from_secs(600)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = knob("IDLE_REDIS", 10) as usize;
    let idle = Duration::from_secs(knob("IDLE_SECS", 120));
    let settle = Duration::from_secs(knob("IDLE_SETTLE_SECS", 30));
    let client = client().await;
    let ns = TestNamespace::new(&client, "bench-idle", &[]).await;
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    // IDLE_TUNING_SECS: the tuning look's interval (0 turns it off), to
    // tell its share from the reconcile's; the operator's default when
    // unset.
    if let Ok(secs) = std::env::var("IDLE_TUNING_SECS") {
        println!("tuning looks every {secs} s (0: off)");
        opts.env
            .push(("REDPILOT_TUNING_INTERVAL_SECONDS".into(), secs));
    }
    // IDLE_OPERATOR_ENV: `NAME=value` pairs, comma-separated, added to the
    // operator's environment (to try a runtime setting).
    if let Ok(pairs) = std::env::var("IDLE_OPERATOR_ENV") {
        for pair in pairs.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .expect("IDLE_OPERATOR_ENV: NAME=value pairs");
            println!("operator environment: {k}={v}");
            opts.env.push((k.into(), v.into()));
        }
    }
    // IDLE_OPERATOR_BIN: another build to measure (an earlier release, or
    // the same tree built another way); this tree's release build when
    // unset.
    if let Ok(bin) = std::env::var("IDLE_OPERATOR_BIN") {
        println!("operator binary: {bin}");
        opts.binary = Some(bin.into());
    }
    // IDLE_CALLGRIND: the binary runs under valgrind's callgrind, its
    // output files in that directory.
    if let Ok(dir) = std::env::var("IDLE_CALLGRIND") {
        let bin = opts
            .binary
            .clone()
            .unwrap_or_else(support::operator::operator_binary);
        let wrapper = format!("{dir}/operator-under-callgrind");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec valgrind --tool=callgrind --demangle=no --dump-instr=no \\\n  \
                 --callgrind-out-file={dir}/callgrind.out.%p {} \"$@\"\n",
                bin.display()
            ),
        )
        .expect("write the callgrind wrapper");
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("make the callgrind wrapper executable");
        opts.binary = Some(wrapper.into());
    }
    let op = start_operator(&client, opts).await;

    // IDLE_FEW_SECS: the windows with 0 and 1 Redis.
    let few = Duration::from_secs(knob("IDLE_FEW_SECS", idle.as_secs()));
    let none = window(&op, 0, settle, few).await;
    add_redis(&client, &ns.name, 0, 1).await;
    let one = window(&op, 1, settle, few).await;
    add_redis(&client, &ns.name, 1, n).await;
    let many = window(&op, n, settle, idle).await;

    let per_redis_cpu = (many.cpu_ms_per_min - none.cpu_ms_per_min) / n as f64;
    let slope = (many.rss_mib - one.rss_mib) / (n - 1).max(1) as f64;
    println!();
    println!("| measure (idle, release build) | value |");
    println!("|---|---|");
    for w in [&none, &one, &many] {
        println!(
            "| operator with {} Redis: CPU / RSS (anonymous + file) | {:.0} ms/min / {:.1} MiB \
             ({:.1} + {:.1}) |",
            w.redis, w.cpu_ms_per_min, w.rss_mib, w.anon_mib, w.file_mib
        );
    }
    println!(
        "| CPU per Redis per idle minute ({n} Redis, above the operator with none) | {per_redis_cpu:.2} ms |"
    );
    println!(
        "| RSS per Redis (from 1 to {n}) | {:.0} KiB |",
        slope * 1024.0
    );
    println!(
        "| of the binary's resident pages, touched in the idle window ({n} Redis) | {:.1} MiB |",
        many.binary_touched_mib
    );
    println!(
        "| reconciles / API requests per Redis per idle minute ({n} Redis) | {:.2} / {:.2} |",
        many.reconciles_per_min / n as f64,
        many.kube_requests_per_min / n as f64
    );
}
