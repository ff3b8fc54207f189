//! Automatic failover against the dev cluster, with real servers and
//! clients that count what they were promised. Each fault runs under four
//! writers of plain `SET`s and one writer that counts a write only once
//! `WAIT 1` confirms a replica holds it, all through the read-write Service
//! (its ready EndpointSlice endpoint, as kube-proxy routes):
//!
//! - the primary's server `kill -9`ed (it restarts in place, as a replica);
//! - the primary's pod deleted;
//! - the primary's pod cut off the node's bridge, with a client inside the
//!   partition still writing to it.
//!
//! Measured per run: the time from the fault to the first write
//! acknowledged by the new primary ("P4"), the writes lost. Asserted: no
//! `WAIT`-acknowledged write is lost; plain writes lost were all sent in
//! the last second before the fault (they had not reached a replica); in the partition, every write the isolated primary accepted
//! was accepted before the new primary accepted its first (no moment with
//! two primaries taking writes), and none later than the fencing bound.
//! A slow primary (a 3 s script, a 3 s SIGSTOP) is not failed over.
//!
//! `REDPILOT_FAILOVER_RUNS=N` repeats each fault N times on one Redis and
//! prints p50/p99 (`make bench-failover`). `REDPILOT_FAILOVER_DEBUG=1`
//! prints the new primary's replicas for 5 s after each failover (it showed
//! that a replica still in its first sync forces full syncs, and the fenced
//! new primary refuses writes until one completes).

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;
use support::faults::{InsideWriter, Partition, ServiceWriter, Tally, missing, percentiles};
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, http_get, kill_9, metric_sum, patch_redis, pod_ip,
    recent_events, redis_api, redis_password, server_pid, signal, start_operator, wait_ready,
};
use support::writer::assert_everywhere;
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);
const WRITERS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Kill,
    Delete,
    Partition,
}

/// What one run measured.
struct Run {
    p4: f64,
    /// Seconds: fault → the monitor's verdict, → the promotion's start,
    /// the promotion, the role labels, → the first write through the
    /// Service (from `status.lastFailover.timeline`).
    phases: [Option<f64>; 5],
    plain_acked: usize,
    plain_lost: usize,
    wait_acked: usize,
    inside_after_fault: usize,
}

fn runs() -> usize {
    std::env::var("REDPILOT_FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

async fn primary_of(client: &kube::Client, ns: &str) -> String {
    let r = redis_api(client, ns).get("cache").await.expect("redis");
    r.status.and_then(|s| s.primary).expect("a primary")
}

/// Waits for the Redis to be Ready with all 3 instances and no intent left,
/// and for its 3 pods to be there and Ready (a primary handed over from a
/// deleted pod moves before the status shows that pod gone: a Ready 3/3
/// read then is the one from before).
async fn settled(client: &kube::Client, ns: &str) {
    wait_for("Ready 3/3", READY, || async {
        let r = redis_api(client, ns).get("cache").await.ok()?;
        let s = r.status.as_ref()?;
        let pods = support::operator::redis_pods(client, ns, "cache").await;
        (support::operator::is_ready(&r)
            && s.ready.as_deref() == Some("3/3")
            && s.target_primary.is_none()
            && pods.len() == 3
            && pods.values().all(support::operator::pod_ready))
        .then_some(())
    })
    .await;
}

/// As [`settled`], and every replica's server says its link is up and no
/// sync is running (the status may predate a pod that was just replaced).
async fn synced(client: &kube::Client, ns: &str, pw: &str) {
    settled(client, ns).await;
    let primary = primary_of(client, ns).await;
    wait_for("every replica linked, no sync running", READY, || async {
        for pod in support::operator::redis_pods(client, ns, "cache")
            .await
            .keys()
        {
            if *pod == primary {
                continue;
            }
            let mut n = connect_pod(client, ns, pod, pw).await.ok()?;
            let info: String = n
                .query("INFO", redis::cmd("INFO").arg("replication"))
                .await
                .ok()?;
            let linked = info.contains("master_link_status:up")
                && info.contains("master_sync_in_progress:0");
            if !linked {
                return None;
            }
        }
        Some(())
    })
    .await;
}

async fn one_run(client: &kube::Client, ns: &str, pw: &str, fault: Fault, n: usize) -> Run {
    synced(client, ns, pw).await;
    let old = primary_of(client, ns).await;
    let old_ip = pod_ip(client, ns, &old).await;
    let svc = "cache";
    let plain: Vec<ServiceWriter> = (0..WRITERS)
        .map(|w| ServiceWriter::start(client, ns, svc, pw, &format!("r{n}w{w}"), 0))
        .collect();
    let waiting = ServiceWriter::start(client, ns, svc, pw, &format!("r{n}wait"), 1);
    let inside = (fault == Fault::Partition)
        .then(|| InsideWriter::start(&support::faults::pod_netns(&old_ip), pw, &format!("r{n}in")));
    // Every writer, the one beside the primary too (its writes are what
    // the fence is checked on), has written before the fault.
    wait_for("every writer to make progress", READY, || async {
        (plain.iter().all(|w| w.acked() >= 200)
            && waiting.acked() >= 100
            && inside.as_ref().is_none_or(|w| w.acked() >= 150))
        .then_some(())
    })
    .await;

    // The fault.
    let pid = match fault {
        Fault::Kill => {
            let mut node = connect_pod(client, ns, &old, pw).await.expect("connect");
            Some(server_pid(&mut node).await)
        }
        _ => None,
    };
    let mut partition = (fault == Fault::Partition).then(|| Partition::of(&old_ip));
    // The old primary's server log (the local node appends every run of
    // the container to one file): where this run's part starts.
    let log = server_log(ns, &old);
    let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    // The fault's moment: once it is in place (the signal delivered, the
    // deletion accepted, the link down). A write can still be acknowledged
    // while the command that makes the fault runs.
    let t0_wall = chrono::Utc::now();
    match fault {
        Fault::Kill => kill_9(pid.expect("pid")),
        Fault::Delete => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            pods.delete(&old, &DeleteParams::default())
                .await
                .expect("delete the primary's pod");
        }
        Fault::Partition => {
            if let Some(p) = partition.as_mut() {
                p.cut();
            }
        }
    }
    let t0 = Instant::now();
    // The same moment on the wall clock the operator's timeline uses (a
    // cut takes a few hundred ms of `ip` commands after `t0_wall`).
    let in_place = chrono::Utc::now();
    let new = wait_for("another primary in the status", READY, || async {
        let p = primary_of(client, ns).await;
        (p != old).then_some(p)
    })
    .await;
    let new_ip = pod_ip(client, ns, &new).await;
    if std::env::var("REDPILOT_FAILOVER_DEBUG").is_ok() {
        let mut n = connect_pod(client, ns, &new, pw).await.expect("connect");
        for _ in 0..25 {
            let info: String = n
                .query("INFO", redis::cmd("INFO").arg("replication"))
                .await
                .unwrap_or_default();
            let lines: Vec<&str> = info
                .lines()
                .filter(|l| l.starts_with("slave") || l.starts_with("connected_slaves"))
                .collect();
            println!("DEBUG {:.2}s {lines:?}", t0.elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    wait_for("writes acknowledged by the new primary", READY, || async {
        let n = plain.iter().map(|w| w.acked()).sum::<usize>();
        tokio::time::sleep(Duration::from_millis(300)).await;
        (plain.iter().map(|w| w.acked()).sum::<usize>() > n + 100).then_some(())
    })
    .await;
    if let Some(p) = partition.as_mut() {
        // Past the failover: the old primary comes back and must rejoin.
        tokio::time::sleep(Duration::from_secs(1)).await;
        p.heal();
    }
    let healed = Instant::now();
    settled(client, ns).await;
    if fault == Fault::Partition {
        println!(
            "partition: healed; the old primary rejoined as a replica and the Redis was Ready \
             3/3 {:.1}s later",
            healed.elapsed().as_secs_f64()
        );
    }
    let inside = inside.map(InsideWriter::stop);
    let mut plain_tallies = Vec::new();
    for w in plain {
        plain_tallies.push(w.stop().await);
    }
    let waited = waiting.stop().await;
    let elapsed = t0.elapsed();

    // P4: the first write the new primary acknowledged, from any writer.
    let first = plain_tallies
        .iter()
        .chain([&waited])
        .filter_map(|t| t.first_ack_at(&new_ip, t0))
        .min()
        .expect("the new primary acknowledged writes");
    let p4 = first.duration_since(t0).as_secs_f64();
    let mut errors = std::collections::BTreeMap::<String, u64>::new();
    for t in plain_tallies.iter().chain([&waited]) {
        for (k, v) in &t.errors {
            *errors.entry(k.clone()).or_default() += v;
        }
    }
    println!("{fault:?} run {n}: write errors by kind {errors:?}");

    // Nothing confirmed by WAIT is lost, anywhere.
    assert_everywhere(client, ns, "cache", 3, pw, &waited.keys()).await;
    // Plain writes lost: only those acknowledged just before the fault.
    let mut plain_lost = 0;
    let mut plain_acked = 0;
    for t in &plain_tallies {
        let lost = missing(&new_ip, pw, &t.keys()).await;
        for k in &lost {
            let ack = t.acks.iter().find(|a| &a.key == k).expect("ack");
            // Sent before the fault (its reply may arrive a few ms after
            // the kill returned), and no earlier than a second before it.
            assert!(
                ack.sent <= t0 && t0.duration_since(ack.sent) <= Duration::from_secs(1),
                "{fault:?}: lost write {k} was sent {:?} after the fault",
                ack.sent.checked_duration_since(t0)
            );
        }
        plain_lost += lost.len();
        plain_acked += t.acks.len();
    }
    let mut inside_after_fault = 0;
    let mut inside_lost = 0;
    if let Some(inside) = &inside {
        inside_after_fault = split_brain_check(inside, &plain_tallies, &waited, &new_ip, t0);
        let after: Vec<String> = inside
            .acks
            .iter()
            .filter(|a| a.sent >= t0)
            .map(|a| a.key.clone())
            .collect();
        inside_lost = missing(&new_ip, pw, &after).await.len();
    }
    // The detection and promotion bounds, with room for a loaded machine:
    // a dead primary within the p99 target; a silent one within its
    // silence bound (5 s), a calm probe interval (5 s: when the kernel
    // cannot even send the keepalive's probes, as with the pod's link
    // down here, the next calm probe finds the silence), and 1 s for the
    // promotion and the route.
    let bound = if fault == Fault::Partition { 11.0 } else { 5.0 };
    assert!(p4 < bound, "{fault:?}: P4 {p4:.2}s, bound {bound}s");
    let events = recent_events(client, ns, 80).await;
    if fault == Fault::Delete {
        // Handed over by a switchover while the hook held the shutdown.
        assert!(
            events.contains("SwitchedOver") && events.contains("its pod is being deleted"),
            "{events}"
        );
        assert_eq!(plain_lost, 0, "a handover loses no acknowledged write");
        // The hook held the shutdown: the server was a replica of the new
        // primary before it got SIGTERM. (Redis 7 waits a moment for its
        // replicas on SIGTERM, which a switchover may win without the
        // hook; this is what tells the two apart.)
        let text = std::fs::read(&log).expect("the old primary's server log");
        let text = String::from_utf8_lossy(&text[usize::try_from(log_from).unwrap_or(0)..]);
        let line_of = |needle: &dyn Fn(&str) -> bool| text.lines().position(needle);
        let demoted = line_of(&|l| l.contains("REPLICAOF") && l.contains("enabled"));
        let term = line_of(&|l| l.contains("Received SIGTERM"));
        assert!(
            matches!((demoted, term), (Some(d), Some(t)) if d < t),
            "the old primary got SIGTERM before it followed the new one (the preStop hook \
             did not hold it): {text}"
        );
    } else {
        assert!(events.contains("FailedOver"), "{events}");
    }
    if inside_after_fault > 0 {
        // The isolated primary's extra writes are discarded, not silently.
        assert!(events.contains("DivergedWritesDiscarded"), "{events}");
    }
    let r = redis_api(client, ns).get("cache").await.expect("redis");
    let status = r.status.expect("status");
    let record = status.last_failover.clone().expect("lastFailover");
    assert_eq!(
        (record.from.as_str(), record.to.as_str()),
        (old.as_str(), new.as_str())
    );
    if fault == Fault::Delete {
        assert_eq!(record.reason, "PrimaryPodDeleted");
    }
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "PrimaryAvailable")
        .expect("PrimaryAvailable");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", "FailedOver")
    );
    assert!(
        cond.message
            .contains(&format!("at replication offset {}", record.offset))
            && cond.message.contains(&record.time),
        "{}",
        cond.message
    );
    let phases = timeline(fault, &record, in_place, in_place + (first - t0));
    println!(
        "{fault:?} run {n}: where the time went: {}",
        PHASES
            .iter()
            .zip(phases)
            .map(|(name, s)| match s {
                Some(s) => format!("{name} {:.0} ms", s * 1000.0),
                None => format!("{name} -"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{fault:?} run {n}: primary {old} -> {new} ({}); promoted {:.2}s and first write \
         acknowledged (P4) {p4:.2}s after the fault; plain writes {plain_acked} \
         acked, {plain_lost} lost; WAIT writes {} acked, 0 lost; inside the partition {} \
         accepted after the cut, all before the fence, {} of them lost; run took {:.1}s",
        record.reason,
        chrono::DateTime::parse_from_rfc3339(&record.time)
            .map(|t| (t.with_timezone(&chrono::Utc) - t0_wall).num_milliseconds() as f64 / 1000.0)
            .unwrap_or(f64::NAN),
        waited.acks.len(),
        inside_after_fault,
        inside_lost,
        elapsed.as_secs_f64()
    );
    if fault == Fault::Kill && runs() > 1 {
        // Repeated kills restart the same containers, and restarts back off
        // (10 s, 20 s, ... as a kubelet does): a fresh pod for the next run.
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.delete(&old, &DeleteParams::default())
            .await
            .expect("delete the restarted pod");
        wait_for("the restarted pod to be replaced", READY, || async {
            let p = pods.get_opt(&old).await.ok()??;
            (support::operator::container_restarts(&p) == 0).then_some(())
        })
        .await;
    }
    Run {
        p4,
        phases,
        plain_acked,
        plain_lost,
        wait_acked: waited.acks.len(),
        inside_after_fault,
    }
}

const PHASES: [&str; 5] = ["detect", "decide", "promote", "labels", "route"];

/// The local node's log of `pod`'s server container (every run of the
/// container appended to one file).
fn server_log(ns: &str, pod: &str) -> std::path::PathBuf {
    support::repo_root()
        .join(".dev/localnode/pods")
        .join(format!("{ns}_{pod}"))
        .join("redis.log")
}

/// Where a failover's time went, in seconds (see [`Run::phases`]), from
/// the operator's timeline and the test's clock (one machine, one clock).
/// Checks the timeline: present, in order, and — for a fault the primary
/// cannot outlive (a kill, a cut) — with the lost primary's last answer
/// before the fault.
fn timeline(
    fault: Fault,
    record: &redpilot::api::v1alpha1::FailoverRecord,
    fault_at: chrono::DateTime<chrono::Utc>,
    first_write: chrono::DateTime<chrono::Utc>,
) -> [Option<f64>; 5] {
    let t = record
        .timeline
        .clone()
        .unwrap_or_else(|| panic!("{fault:?}: no timeline in {record:?}"));
    let ms = |n: u64| chrono::Duration::milliseconds(i64::try_from(n).unwrap_or(i64::MAX));
    let secs = |d: chrono::Duration| d.num_milliseconds() as f64 / 1000.0;
    let labelled = chrono::DateTime::parse_from_rfc3339(&record.time)
        .expect("lastFailover.time")
        .with_timezone(&chrono::Utc);
    let started = labelled - ms(t.labels_ms);
    assert!(t.promote_ms <= t.labels_ms, "{fault:?}: {t:?}");
    let promoted = [
        Some(t.promote_ms as f64 / 1000.0),
        Some((t.labels_ms - t.promote_ms) as f64 / 1000.0),
        Some(secs(first_write - labelled)),
    ];
    // A primary whose pod is deleted is handed over while it still
    // serves: nothing to detect, and "decide" runs from the deletion to
    // the switchover's start (the pod event, the debounce, the pass).
    if fault == Fault::Delete {
        assert!(
            t.noticed_ms.is_none() && t.silent_ms.is_none(),
            "{fault:?}: a handover has no silence: {t:?}"
        );
        return [
            None,
            Some(secs(started - fault_at)),
            promoted[0],
            promoted[1],
            promoted[2],
        ];
    }
    let Some(silent) = t.silent_ms else {
        return [None, None, promoted[0], promoted[1], promoted[2]];
    };
    // The monitor's verdict may not have come first (a restarted server's
    // pod event can start the pass); when it did, it came before.
    assert!(
        t.noticed_ms.is_none_or(|n| n <= silent),
        "{fault:?}: the monitor's verdict after the promotion: {t:?}"
    );
    let last_answer = started - ms(silent);
    // A killed or cut-off server cannot answer after the fault (10 ms for
    // the rounding of three durations to milliseconds).
    assert!(
        last_answer <= fault_at + chrono::Duration::milliseconds(10),
        "{fault:?}: the lost primary's last answer came {} ms after the fault: {t:?}",
        (last_answer - fault_at).num_milliseconds()
    );
    let noticed = t.noticed_ms.map(|n| last_answer + ms(n));
    [
        noticed.map(|n| secs(n - fault_at)),
        noticed.map(|n| secs(started - n)),
        promoted[0],
        promoted[1],
        promoted[2],
    ]
}

/// Every write the isolated primary accepted was accepted before the first
/// write the new primary accepted was sent, and within the fencing bound
/// after the cut. Returns how many it accepted after the cut.
fn split_brain_check(
    inside: &Tally,
    outside: &[Tally],
    waited: &Tally,
    new_ip: &str,
    t0: Instant,
) -> usize {
    // The writer beside the isolated primary really wrote up to the cut:
    // otherwise nothing below would be checked.
    let before = inside.acks.iter().filter(|a| a.sent < t0).count();
    assert!(
        before >= 100,
        "the writer inside the partition acknowledged only {before} writes before the cut \
         ({} refused): the fence was never put to the test",
        inside.failed
    );
    let after: Vec<_> = inside.acks.iter().filter(|a| a.sent >= t0).collect();
    let last_old = after.iter().map(|a| a.acked).max();
    let first_new = outside
        .iter()
        .chain([waited])
        .flat_map(|t| t.acks.iter())
        .filter(|a| a.ip == new_ip)
        .map(|a| a.sent)
        .min()
        .expect("new primary writes");
    // Writes go on beside it after the cut until its fence closes (2 s at
    // least): none means the writer stalled and the fence went untested.
    let last = last_old.expect("the isolated primary acknowledged writes after the cut");
    assert!(
        last < first_new,
        "split brain: the old primary accepted a write {:?} after the new one accepted its first",
        last.duration_since(first_new)
    );
    // maxLagSeconds 2: the primary fences itself within 2 s + 1 s
    // (whole-second counting) + 1 s (refresh) of the cut, the bound the
    // README states (maxLagSeconds + 2).
    let fenced_after = last.duration_since(t0);
    assert!(
        fenced_after <= Duration::from_secs(4),
        "the isolated primary accepted writes for {fenced_after:?} after the cut \
         (README: at most maxLagSeconds + 2 = 4 s)"
    );
    println!(
        "partition: the isolated primary accepted its last write {:.2}s after the cut; the \
         new primary its first {:.2}s after the cut",
        fenced_after.as_secs_f64(),
        first_new.duration_since(t0).as_secs_f64()
    );
    after.len()
}

/// A namespace, an operator watching it, and a Ready Replication Redis
/// `cache` of 3 instances without persistence, with `failover` as its
/// `spec.failover` (when given).
struct Fixture {
    client: kube::Client,
    ns: TestNamespace,
    op: support::operator::Operator,
    pw: String,
}

async fn fixture(prefix: &str, failover: Option<serde_json::Value>) -> Fixture {
    let client = client().await;
    let ns = TestNamespace::new(&client, prefix, &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let mut spec = json!({"mode": "Replication", "instances": 3, "persistence": {"rdb": false}});
    if let Some(f) = failover {
        spec["failover"] = f;
    }
    apply_redis(&client, &ns.name, "cache", spec).await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let pw = redis_password(&client, &ns.name, "cache").await;
    Fixture { client, ns, op, pw }
}

async fn fault_runs(prefix: &str, fault: Fault) {
    let Fixture { client, ns, op, pw } = fixture(prefix, None).await;
    let mut results = Vec::new();
    for n in 0..runs() {
        results.push(one_run(&client, &ns.name, &pw, fault, n).await);
    }
    let p4s: Vec<f64> = results.iter().map(|r| r.p4).collect();
    let (p50, p99) = percentiles(&p4s);
    let lost: usize = results.iter().map(|r| r.plain_lost).sum();
    let acked: usize = results.iter().map(|r| r.plain_acked).sum();
    let waited: usize = results.iter().map(|r| r.wait_acked).sum();
    let inside: usize = results.iter().map(|r| r.inside_after_fault).sum();
    println!(
        "{fault:?}: {} runs; P4 p50 {p50:.2}s p99 {p99:.2}s (max {:.2}s); plain writes lost \
         {lost} of {acked}; WAIT writes lost 0 of {waited}; accepted inside partitions {inside}",
        results.len(),
        p4s.iter().cloned().fold(0.0, f64::max)
    );
    let medians: Vec<String> = PHASES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let v: Vec<f64> = results.iter().filter_map(|r| r.phases[i]).collect();
            if v.is_empty() {
                return format!("{name} -");
            }
            let (p50, p99) = percentiles(&v);
            format!(
                "{name} p50 {:.0} ms p99 {:.0} ms",
                p50 * 1000.0,
                p99 * 1000.0
            )
        })
        .collect();
    println!("{fault:?}: where the time went: {}", medians.join(", "));
    let metrics = http_get(op.metrics_addr, "/metrics")
        .await
        .expect("metrics");
    let result = if fault == Fault::Delete {
        "handed_over"
    } else {
        "promoted"
    };
    let promoted = metric_sum(
        &metrics,
        &format!("redpilot_failovers_total{{result=\"{result}\"}}"),
    );
    // Each run already checked its failover in the status. The counter
    // covers them all only if one process lived through every run: a
    // process the harness restarted after a lost lease (a stalled test
    // ground) counts from zero, and counts no more than the runs.
    match op.restarts() {
        0 => assert_eq!(promoted, Some(results.len() as f64), "{metrics}"),
        n => {
            println!(
                "{fault:?}: the operator was restarted {n} time(s) after losing its lease; \
                 its counter shows {promoted:?} of {} promotions",
                results.len()
            );
            assert!(
                promoted.is_some_and(|p| p <= results.len() as f64),
                "{metrics}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_without_losing_an_acknowledged_write() {
    fault_runs("fo-kill", Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_primary_pod_is_replaced_without_losing_an_acknowledged_write() {
    fault_runs("fo-delete", Fault::Delete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_primary_fences_itself_before_a_replica_takes_over() {
    fault_runs("fo-partition", Fault::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_primary_is_not_failed_over() {
    // maxLagSeconds 5: a silence bound of 8 s, so the process can stop for
    // longer than a calm probe interval (5 s; the monitor probes a primary
    // whose replicas hear from it that often) and the monitor surely sees
    // it silent, still under the bound.
    let Fixture { client, ns, op, pw } =
        fixture("fo-slow", Some(json!({"maxLagSeconds": 5}))).await;
    let primary = primary_of(&client, &ns.name).await;
    let writer = ServiceWriter::start(&client, &ns.name, "cache", &pw, "slow", 0);
    // A connection whose replies may take longer than the script.
    let mut node = redpilot::redis::Node::connect(
        &redpilot::redis::Endpoint::new(pod_ip(&client, &ns.name, &primary).await, 6379),
        &redpilot::redis::ConnectOptions::default()
            .with_password(pw.clone())
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(15)),
    )
    .await
    .expect("connect");
    // A script that keeps the server busy for 3 s (under the 8 s bound).
    let t = Instant::now();
    let busy = r#"local t0 = redis.call('TIME') local s = tonumber(t0[1]) + tonumber(t0[2]) / 1e6
        while true do local t = redis.call('TIME')
          if tonumber(t[1]) + tonumber(t[2]) / 1e6 - s > 3 then break end end return 1"#;
    let _: i64 = node
        .query_within(
            "EVAL",
            redis::cmd("EVAL").arg(busy).arg(0),
            Duration::from_secs(10),
        )
        .await
        .expect("a 3 s script");
    println!(
        "busy script held the primary for {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // Writes flow again before the next stall (the two are separate
    // pauses, each under the bound, not one of 9 s).
    let pid = server_pid(&mut node).await;
    let before = writer.acked();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(writer.acked() > before, "writes flow after the script");
    // A stopped process (a CPU stall): 6 s, a calm probe's tick and its
    // 0.5 s for an answer inside it.
    let stopped = Instant::now();
    signal(pid, "-STOP");
    tokio::time::sleep(Duration::from_secs(6)).await;
    signal(pid, "-CONT");
    let resumed = Instant::now();
    println!(
        "the primary's process was stopped for {:.2}s",
        stopped.elapsed().as_secs_f64()
    );
    // Well past the bound: still the same primary, and no failover.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = writer.acked();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(writer.acked() > before, "writes flow again");
    let tally = writer.stop().await;
    let r = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("redis");
    let status = r.status.unwrap_or_default();
    assert_eq!(
        status.primary.as_deref(),
        Some(primary.as_str()),
        "failed over: {:?}",
        status.last_failover
    );
    assert!(status.last_failover.is_none());
    // The stall happened and was seen: the writer had no write acknowledged
    // for most of the stop, and the operator's monitor found the primary
    // silent (and still did not fail over).
    let mut acked: Vec<Instant> = tally
        .acks
        .iter()
        .map(|a| a.acked)
        .filter(|t| *t >= stopped && *t <= resumed)
        .collect();
    acked.sort();
    let mut gap = Duration::ZERO;
    let mut prev = stopped;
    for t in acked.iter().copied().chain([resumed]) {
        gap = gap.max(t.duration_since(prev));
        prev = t;
    }
    println!(
        "the writer saw no acknowledged write for {:.2}s of the stop",
        gap.as_secs_f64()
    );
    assert!(
        gap >= Duration::from_millis(2500),
        "the writer saw the stall: {gap:?}"
    );
    let log = op.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("primary failing") && l.contains("Silent")),
        "the monitor saw the primary silent:\n{}",
        op.log_tail(40)
    );
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(!events.contains("FailedOver"), "{events}");
    let metrics = http_get(op.metrics_addr, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(
        metric_sum(&metrics, "redpilot_failovers_total").unwrap_or(0.0),
        0.0
    );
    println!(
        "slow primary: kept through a 3 s script and a 3 s SIGSTOP; {} writes acked, {} failed",
        tally.acks.len(),
        tally.failed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_failover_off_the_user_promotes_and_switchovers_lose_nothing() {
    let Fixture {
        client,
        ns,
        op: _op,
        pw,
    } = fixture("fo-manual", Some(json!({"enabled": false}))).await;

    // A planned switchover on request: zero loss under a WAIT writer.
    let old = primary_of(&client, &ns.name).await;
    let target = if old == "cache-2" {
        "cache-1"
    } else {
        "cache-2"
    };
    let waiting = ServiceWriter::start(&client, &ns.name, "cache", &pw, "sw", 1);
    wait_for("writes", READY, || async {
        (waiting.acked() > 100).then_some(())
    })
    .await;
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"failover": {"enabled": false, "switchoverTo": target}}}),
    )
    .await;
    wait_for("the requested switchover", READY, || async {
        (primary_of(&client, &ns.name).await == target).then_some(())
    })
    .await;
    settled(&client, &ns.name).await;
    let before = waiting.acked();
    wait_for("writes to the new primary", READY, || async {
        (waiting.acked() > before + 100).then_some(())
    })
    .await;
    let tally = waiting.stop().await;
    assert_everywhere(&client, &ns.name, "cache", 3, &pw, &tally.keys()).await;
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("SwitchedOver"), "{events}");

    // The primary killed with failover off: nothing is promoted; the status
    // says why and what to do.
    let mut node = connect_pod(&client, &ns.name, target, &pw)
        .await
        .expect("connect");
    kill_9(server_pid(&mut node).await);
    let r = wait_for("Degraded: primary lost", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        let c = r
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")?
            .clone();
        (c.reason == "PrimaryLost").then_some(c)
    })
    .await;
    assert!(
        r.message.contains("spec.failover.switchoverTo"),
        "{}",
        r.message
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        primary_of(&client, &ns.name).await,
        target,
        "nothing promoted"
    );
    // The user names the instance to promote.
    let chosen = if target == "cache-1" {
        "cache-2"
    } else {
        "cache-1"
    };
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"failover": {"enabled": false, "switchoverTo": chosen}}}),
    )
    .await;
    wait_for("the named instance promoted", READY, || async {
        (primary_of(&client, &ns.name).await == chosen).then_some(())
    })
    .await;
    settled(&client, &ns.name).await;

    // A name that is not an instance is refused with the field named.
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"failover": {"switchoverTo": "cache-9"}}}),
    )
    .await;
    let c = wait_for("Degraded: bad switchover target", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        r.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.reason == "InvalidSwitchoverTarget")
            .cloned()
    })
    .await;
    assert!(
        c.message.contains("spec.failover.switchoverTo: cache-9"),
        "{}",
        c.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_while_the_operator_is_down_is_repaired_when_it_starts() {
    let Fixture {
        client,
        ns,
        mut op,
        pw,
    } = fixture("fo-opdown", None).await;
    let old = primary_of(&client, &ns.name).await;
    let waiting = ServiceWriter::start(&client, &ns.name, "cache", &pw, "down", 1);
    wait_for("writes", READY, || async {
        (waiting.acked() > 100).then_some(())
    })
    .await;
    op.kill();
    let mut node = connect_pod(&client, &ns.name, &old, &pw)
        .await
        .expect("connect");
    kill_9(server_pid(&mut node).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        primary_of(&client, &ns.name).await,
        old,
        "no operator, no change"
    );
    let t = Instant::now();
    let _op = support::operator::spawn_operator(
        &client,
        OperatorOptions::watching(&[&ns.name]).named("op-back"),
    )
    .await;
    let new = wait_for("a new primary", READY, || async {
        let p = primary_of(&client, &ns.name).await;
        (p != old).then_some(p)
    })
    .await;
    let took = t.elapsed();
    settled(&client, &ns.name).await;
    let tally = waiting.stop().await;
    assert_everywhere(&client, &ns.name, "cache", 3, &pw, &tally.keys()).await;
    println!(
        "operator down during the failure: {new} promoted {:.1}s after the operator started; \
         {} WAIT writes acked, 0 lost",
        took.as_secs_f64(),
        tally.acks.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_link_stays_down_is_repaired() {
    let Fixture {
        client,
        ns,
        op: _op,
        pw,
    } = fixture("fo-link", None).await;
    let primary = primary_of(&client, &ns.name).await;
    let victim = if primary == "cache-2" {
        "cache-1"
    } else {
        "cache-2"
    };
    let mut node = connect_pod(&client, &ns.name, victim, &pw)
        .await
        .expect("connect");
    // Wrong credentials for the primary, and the link dropped: the server
    // retries every second and fails every time.
    let _: redis::Value = node
        .query(
            "CONFIG SET",
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("masterauth")
                .arg("wrong"),
        )
        .await
        .expect("CONFIG SET masterauth");
    let _: redis::Value = node
        .query(
            "CLIENT KILL",
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("master"),
        )
        .await
        .expect("CLIENT KILL TYPE master");
    let t = Instant::now();
    let link = |up: bool| {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            let r = redis_api(&client, &ns).get("cache").await.ok()?;
            let i = r.status?.instances.into_iter().find(|i| i.name == victim)?;
            (i.link_up == Some(up)).then_some(())
        }
    };
    wait_for("the link to be reported down", READY, || link(false)).await;
    wait_for("the link repaired", READY, || link(true)).await;
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("ReplicaLinkRepaired"), "{events}");
    settled(&client, &ns.name).await;
    println!(
        "{victim}: link broken by wrong credentials, repaired after {:.1}s",
        t.elapsed().as_secs_f64()
    );
}

/// `ACL SETUSER ±replicaof ±slaveof` for the operator's user and `default` on
/// one instance.
async fn allow_replicaof(client: &kube::Client, ns: &str, pod: &str, pw: &str, allow: bool) {
    // The operator's own user (and `default`, which it falls back to) must
    // be on every instance first: the operator's next round of users would
    // otherwise put its rights back.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    wait_for("the operator's users on every instance", READY, || async {
        let s = secrets.get("cache-server-auth").await.ok()?;
        s.data?.contains_key("users-applied").then_some(())
    })
    .await;
    let mut n = connect_pod(client, ns, pod, pw).await.expect("connect");
    let (a, b) = if allow {
        ("+replicaof", "+slaveof")
    } else {
        ("-replicaof", "-slaveof")
    };
    for user in ["redpilot-operator", "default"] {
        let _: redis::Value = n
            .query(
                "ACL",
                redis::cmd("ACL").arg("SETUSER").arg(user).arg(a).arg(b),
            )
            .await
            .expect("ACL SETUSER");
    }
}

/// How many times events with `reason` whose message holds `about` were
/// recorded (a repeated event counts each time).
async fn event_count(client: &kube::Client, ns: &str, reason: &str, about: &str) -> i32 {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = events
        .list(&kube::api::ListParams::default())
        .await
        .expect("list events");
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.note.as_deref().is_some_and(|m| m.contains(about)))
        .map(|e| {
            let series = e.series.as_ref().map_or(0, |s| s.count);
            series.max(e.deprecated_count.unwrap_or(0)).max(1)
        })
        .sum()
}

/// A switchover the old primary refuses to complete (its `REPLICAOF` is
/// denied to the operator's user, so it cannot be demoted) is rolled back:
/// `SwitchoverFailed` and `Degraded` say why, the old primary keeps serving
/// writes and is the only writable instance, the target follows it again,
/// nothing restarts and no acknowledged write is lost. Once the server
/// allows it again, the requested switchover completes on a later pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_the_old_primary_refuses_is_rolled_back_and_reported() {
    let Fixture {
        client,
        ns,
        op: _op,
        pw,
    } = fixture("fo-swfail", None).await;
    synced(&client, &ns.name, &pw).await;
    let old = primary_of(&client, &ns.name).await;
    let target = if old == "cache-1" {
        "cache-2"
    } else {
        "cache-1"
    };
    let uids = support::operator::pod_uids(&client, &ns.name, "cache").await;
    let rewired = format!("{target} now replicates");
    let rewired_before = event_count(&client, &ns.name, "ReplicaConfigured", &rewired).await;
    allow_replicaof(&client, &ns.name, &old, &pw, false).await;
    let writer = ServiceWriter::start(&client, &ns.name, "cache", &pw, "swf", 1);
    wait_for("writes", READY, || async {
        (writer.acked() > 100).then_some(())
    })
    .await;
    patch_redis(
        &client,
        &ns.name,
        "cache",
        json!({"spec": {"failover": {"switchoverTo": target}}}),
    )
    .await;
    // The fault happened: the operator tried, and said why it failed.
    let events = wait_for("a SwitchoverFailed event", READY, || async {
        let e = recent_events(&client, &ns.name, 80).await;
        e.contains("SwitchoverFailed").then_some(e)
    })
    .await;
    assert!(
        events.contains("could not be demoted") && events.contains("follows"),
        "the event says the old primary could not be demoted and the target follows it again: \
         {events}"
    );
    let c = wait_for("Degraded: SwitchoverFailed", READY, || async {
        let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
        r.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
            .filter(|c| c.reason == "SwitchoverFailed")
            .cloned()
    })
    .await;
    println!("Degraded: {}", c.message);
    assert!(!c.message.contains(&pw), "no secret in the condition");
    // One writable primary, the old one; the target follows it again.
    let mut t = connect_pod(&client, &ns.name, target, &pw)
        .await
        .expect("connect");
    let info: String = t
        .query("INFO", redis::cmd("INFO").arg("replication"))
        .await
        .expect("INFO");
    let old_ip = pod_ip(&client, &ns.name, &old).await;
    assert!(
        info.contains("role:slave") && info.contains(&format!("master_host:{old_ip}")),
        "{target} follows {old} ({old_ip}) again: {info}"
    );
    let refused = t
        .query::<()>("SET", redis::cmd("SET").arg("swf-probe").arg("x"))
        .await;
    assert!(refused.is_err(), "{target} refuses writes");
    assert_eq!(
        primary_of(&client, &ns.name).await,
        old,
        "the status names the old primary"
    );
    // The switchover put the target back itself: no later pass had to
    // re-wire a second primary.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        event_count(&client, &ns.name, "ReplicaConfigured", &rewired).await,
        rewired_before,
        "{target} was left a primary and re-wired by a later pass: {}",
        recent_events(&client, &ns.name, 30).await
    );
    let before = writer.acked();
    wait_for("writes to the old primary go on", READY, || async {
        (writer.acked() > before + 100).then_some(())
    })
    .await;
    assert_eq!(
        support::operator::pod_uids(&client, &ns.name, "cache").await,
        uids,
        "nothing restarted"
    );

    // The server allows REPLICAOF again: the request is carried out (the
    // Redis touched, so the retry does not wait out the failure backoff).
    allow_replicaof(&client, &ns.name, &old, &pw, true).await;
    support::operator::poke(&client, &ns.name, "cache", 1).await;
    wait_for("the requested switchover", READY, || async {
        (primary_of(&client, &ns.name).await == target).then_some(())
    })
    .await;
    settled(&client, &ns.name).await;
    let before = writer.acked();
    wait_for("writes to the new primary", READY, || async {
        (writer.acked() > before + 100).then_some(())
    })
    .await;
    let tally = writer.stop().await;
    println!(
        "switchover refused then done: {} writes acknowledged, {} failed or refused",
        tally.acks.len(),
        tally.failed
    );
    assert_everywhere(&client, &ns.name, "cache", 3, &pw, &tally.keys()).await;
}

/// Two faults at once (chaos seed 423): the primary's server `kill -9`ed
/// (no persistence: it restarts empty) just after its only replica, which
/// holds every confirmed write, was cut off the node's bridge. The
/// restarted server is not brought back as primary while the replica does
/// not answer; once the replica is back it takes over, and no `WAIT`-
/// confirmed write is lost. (Before, the operator promoted the restarted
/// server at offset 1 and the replica wiped itself copying from it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_empty_while_its_replica_is_cut_off_is_not_brought_back() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "fo-double", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let spec = json!({"mode": "Replication", "instances": 2, "persistence": {"rdb": false}});
    apply_redis(&client, &ns.name, "cache", spec).await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let pw = redis_password(&client, &ns.name, "cache").await;
    let old = primary_of(&client, &ns.name).await;
    let replica = if old == "cache-0" {
        "cache-1"
    } else {
        "cache-0"
    };
    // The writer's confirmations (`WAIT 1`) show the replica holds them.
    let waiting = ServiceWriter::start(&client, &ns.name, "cache", &pw, "double", 1);
    wait_for("writes", READY, || async {
        (waiting.acked() > 300).then_some(())
    })
    .await;
    let mut node = connect_pod(&client, &ns.name, &old, &pw)
        .await
        .expect("connect to the primary");
    let pid = server_pid(&mut node).await;
    let before = waiting.acked();
    let replica_ip = pod_ip(&client, &ns.name, replica).await;
    let mut partition = Partition::of(&replica_ip);
    partition.cut();
    kill_9(pid);
    // The faults happened: the primary's server is a new, empty process,
    // and the replica does not answer.
    let mut restarted = wait_for("the primary's server to start again", READY, || async {
        let mut n = connect_pod(&client, &ns.name, &old, &pw).await.ok()?;
        (server_pid(&mut n).await != pid).then_some(n)
    })
    .await;
    let keys: i64 = restarted
        .query("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE");
    assert_eq!(keys, 0, "{old} restarted empty");
    assert!(
        connect_pod(&client, &ns.name, replica, &pw).await.is_err(),
        "{replica} is cut off"
    );
    // While the replica is cut off, the restarted server is not made
    // primary again: nothing takes writes.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let role = restarted
        .replication()
        .await
        .expect("INFO replication")
        .role;
    let waited = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("cache")
        .status
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Progressing")
                .map(|c| c.message.clone())
        })
        .unwrap_or_default();
    partition.heal();
    assert_ne!(
        role,
        Some(redpilot::redis::info::Role::Primary),
        "{old} restarted empty was made primary again while {replica} was cut off"
    );
    println!("while {replica} was cut off: {old} is {role:?}; Progressing: {waited}");
    let new = wait_for("a new primary", READY, || async {
        let p = primary_of(&client, &ns.name).await;
        (p == replica).then_some(p)
    })
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    wait_for("writes through the new primary", READY, || async {
        (waiting.acked() > before + 100).then_some(())
    })
    .await;
    let tally = waiting.stop().await;
    assert_everywhere(&client, &ns.name, "cache", 2, &pw, &tally.keys()).await;
    println!(
        "{old} killed as {replica} was cut off: {new} took over once back; {} WAIT writes \
         acked ({before} before the faults), 0 lost",
        tally.acks.len()
    );
}
