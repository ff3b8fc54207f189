//! Five tests of the `redpilot` scorecard suite, one per capability level
//! (the memory autopilot's, the second Auto Pilot test, is in `memory.rs`).
//! Each creates its own Redis (and what else it needs), checks the level's
//! promise against the running servers, and leaves the deletion to the
//! runner.

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::writer::Writer;
use super::{Ctx, Failure, redis_failed};
use crate::api::v1alpha1::{BackupPhase, Redis};
use crate::redis::Node;

/// Keys each test writes and then looks for.
const KEYS: usize = 200;
/// The longest a promotion may take after the primary's pod is deleted.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);
/// The longest an application that finds the primary itself may go without
/// an acknowledged write during an upgrade: the switchover's write pause
/// and finding the new primary. Restarting the primary in place (or every
/// instance at once) leaves a gap of seconds.
const UPGRADE_GAP_BOUND: Duration = Duration::from_secs(1);

fn redis(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "redpilot.io/v1alpha1",
        "kind": "Redis",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "redpilot-scorecard"}},
        "spec": spec,
    })
}

fn key(i: usize) -> String {
    format!("scorecard:{i}")
}

/// Writes [`KEYS`] keys with values derived from `tag` on `node`.
async fn write_keys(node: &mut Node, tag: &str) -> Result<(), Failure> {
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(50) {
        let mut cmd = redis::cmd("MSET");
        for &i in chunk {
            cmd.arg(key(i)).arg(format!("{tag}-{i}"));
        }
        node.query::<()>("MSET", &cmd)
            .await
            .map_err(|e| redis_failed("writing the test keys", e))?;
    }
    Ok(())
}

/// Checks that `node` holds every key [`write_keys`] wrote with `tag`.
async fn check_keys(node: &mut Node, tag: &str, on: &str) -> Result<(), Failure> {
    let mut cmd = redis::cmd("MGET");
    for i in 0..KEYS {
        cmd.arg(key(i));
    }
    let got: Vec<Option<String>> = node
        .query("MGET", &cmd)
        .await
        .map_err(|e| redis_failed(&format!("reading the test keys on {on}"), e))?;
    let wrong: Vec<usize> = got
        .iter()
        .enumerate()
        .filter(|(i, v)| v.as_deref() != Some(format!("{tag}-{i}").as_str()))
        .map(|(i, _)| i)
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            format!(
                "{} of {KEYS} keys written before are missing or changed on {on} (first: {})",
                wrong.len(),
                key(wrong[0])
            ),
            "data was lost: see the Redis's events and the operator's log",
        ))
    }
}

/// The primary's pod name and the replicas' of a Ready Redis.
pub(super) fn topology(r: &Redis) -> Result<(String, Vec<String>), Failure> {
    let status = r.status.clone().unwrap_or_default();
    let primary = status.primary.clone().ok_or_else(|| {
        Failure::new(
            "a Ready Redis reports no status.primary",
            "the operator must publish the primary's pod in status.primary",
        )
    })?;
    let replicas = status
        .instances
        .iter()
        .filter(|i| i.role == "replica")
        .map(|i| i.name.clone())
        .collect();
    Ok((primary, replicas))
}

/// Creates Redis `name` with `spec` and waits until it is Ready.
pub(super) async fn create_ready(ctx: &mut Ctx, name: &str, spec: Value) -> Result<Redis, Failure> {
    ctx.apply(redis(name, spec)).await?;
    Ok(ctx.wait_ready(name).await?.0)
}

/// Basic Install: a Replication Redis becomes Ready and replicates.
pub(super) async fn basic_install(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("install");
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Replication", "engine": "Redis", "version": "7.0", "instances": 2}),
    )
    .await?;
    let (primary, replicas) = topology(&r)?;
    if replicas.len() != 1 {
        return Err(Failure::new(
            format!("status.instances lists {replicas:?} as replicas, expected one"),
            "status.instances should list each instance with its role",
        ));
    }
    let password = ctx.password(&r).await?;
    let mut p = ctx.connect(&primary, &password).await?;
    write_keys(&mut p, &ctx.suffix.clone()).await?;
    ctx.note(format!("wrote {KEYS} keys on the primary {primary}"));
    let mut rep = ctx.connect(&replicas[0], &password).await?;
    let tag = ctx.suffix.clone();
    let started = Instant::now();
    loop {
        match check_keys(&mut rep, &tag, &replicas[0]).await {
            Ok(()) => break,
            Err(f) if started.elapsed() > Duration::from_secs(30) => {
                return Err(Failure::new(
                    format!(
                        "the replica did not receive the primary's writes within 30s: {}",
                        f.error
                    ),
                    "see INFO replication on the replica and the Redis's Degraded condition",
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    ctx.note(format!(
        "replica {} has every key after {:.1}s",
        replicas[0],
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Seamless Upgrades: Redis 6.2 to 7.0 with every key kept, under a client
/// that follows the primary and never waits more than [`UPGRADE_GAP_BOUND`]
/// for an acknowledged write.
pub(super) async fn seamless_upgrades(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("upgrade");
    // Three instances: with two, the primary's write fence holds writes
    // while its only replica restarts (the README's documented choice).
    const INSTANCES: usize = 3;
    let spec = |v: &str| json!({"mode": "Replication", "engine": "Redis", "version": v, "instances": INSTANCES});
    let r = create_ready(ctx, &name, spec("6.2")).await?;
    let password = ctx.password(&r).await?;
    let (primary, _) = topology(&r)?;
    let tag = ctx.suffix.clone();
    write_keys(&mut ctx.connect(&primary, &password).await?, &tag).await?;
    ctx.note(format!("Redis 6.2 Ready, {KEYS} keys written on {primary}"));

    let pods = (0..INSTANCES).map(|i| format!("{name}-{i}")).collect();
    let writer = Writer::start(ctx.pods(), pods, &password, &format!("scorecard:up:{tag}"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The writer is stopped whatever happens to the upgrade.
    let waited = match ctx.apply(redis(&name, spec("7.0"))).await {
        Err(e) => Err(e),
        Ok(()) => ctx
        .wait_redis(
            &name,
            None,
            &format!("Redis {name} upgraded to 7.0 and Ready"),
            "see status.upgrade and the Redis's events: an upgrade that cannot finish stops and says why",
            |r| {
                let v = r
                    .status
                    .as_ref()
                    .and_then(|s| s.current_version.clone())
                    .unwrap_or_default();
                if super::ready(&r) && v.starts_with("7.0") {
                    Ok(r)
                } else {
                    Err(format!("currentVersion {v:?}; {}", super::describe(&r)))
                }
            },
        )
        .await,
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (tally, prefix) = writer.stop().await?;
    let (r, took) = waited?;
    ctx.note(format!(
        "upgrade took {:.1}s; a client following the primary had {} writes acknowledged \
         ({} failed or refused, retried), the longest time without one {:.0} ms",
        took.as_secs_f64(),
        tally.acked.len(),
        tally.failed,
        tally.longest_gap.as_secs_f64() * 1000.0
    ));
    if tally.acked.len() < 100 {
        return Err(Failure::new(
            format!(
                "the client had only {} writes acknowledged during the upgrade",
                tally.acked.len()
            ),
            "the primary should take writes throughout an upgrade; see the Redis's events",
        ));
    }
    if tally.longest_gap > UPGRADE_GAP_BOUND {
        return Err(Failure::new(
            format!(
                "a client following the primary had no write acknowledged for {:.0} ms during \
                 the upgrade (bound {} ms)",
                tally.longest_gap.as_secs_f64() * 1000.0,
                UPGRADE_GAP_BOUND.as_millis()
            ),
            "an upgrade restarts replicas first and moves the primary by a switchover; see the \
             SwitchedOver and UpgradeProgress events",
        ));
    }
    let (primary, _) = topology(&r)?;
    let mut p = ctx.connect(&primary, &password).await?;
    let _: i64 = p
        .query("WAIT", redis::cmd("WAIT").arg(1).arg(5_000))
        .await
        .map_err(|e| redis_failed("WAIT", e))?;
    for inst in r.status.clone().unwrap_or_default().instances {
        let mut node = ctx.connect(&inst.name, &password).await?;
        let info = node
            .info_section("server")
            .await
            .map_err(|e| redis_failed("INFO server", e))?;
        let v = info
            .fields
            .get("redis_version")
            .cloned()
            .unwrap_or_default();
        if !v.starts_with("7.0") {
            return Err(Failure::new(
                format!(
                    "instance {} still runs Redis {v} after the upgrade",
                    inst.name
                ),
                "every instance should be restarted on the new version",
            ));
        }
        check_keys(&mut node, &tag, &inst.name).await?;
        let lost = super::writer::missing(&mut node, &prefix, &tally.acked).await?;
        if lost > 0 {
            return Err(Failure::new(
                format!(
                    "instance {} lacks {lost} of the {} writes acknowledged during the upgrade",
                    inst.name,
                    tally.acked.len()
                ),
                "an upgrade moves the primary by a zero-loss switchover; see the SwitchedOver event",
            ));
        }
        ctx.note(format!(
            "{} ({}) runs {v} with every key, and all {} written during the upgrade",
            inst.name,
            inst.role,
            tally.acked.len()
        ));
    }
    Ok(())
}

/// Full Lifecycle: backup to a volume, restore into a new Redis.
pub(super) async fn full_lifecycle(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("backup");
    let claim = ctx.name("store");
    let backup = ctx.name("b1");
    let restored = ctx.name("restored");
    ctx.apply(
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": claim},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "256Mi"}}}}),
    )
    .await?;
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Standalone", "engine": "Redis", "version": "7.0"}),
    )
    .await?;
    let password = ctx.password(&r).await?;
    let (primary, _) = topology(&r)?;
    let tag = ctx.suffix.clone();
    write_keys(&mut ctx.connect(&primary, &password).await?, &tag).await?;

    ctx.apply(
        json!({"apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
               "metadata": {"name": backup},
               "spec": {"redis": name, "target": {"volume": {"claimName": claim, "path": "scorecard"}}}}),
    )
    .await?;
    let api = ctx.backups();
    let within = ctx.timeout;
    let (status, _) = ctx
        .wait(
            &format!("RedisBackup {backup} Completed"),
            within,
            "see the backup Job's log and the RedisBackup's status.reason/message",
            || {
                let api = api.clone();
                let backup = backup.clone();
                async move {
                    let b = api
                        .get(&backup)
                        .await
                        .map_err(|e| format!("reading it: {e}"))?;
                    let s = b.status.clone().unwrap_or_default();
                    match s.phase {
                        Some(BackupPhase::Completed) => Ok(Ok(s)),
                        Some(BackupPhase::Failed) => Ok(Err(format!(
                            "the backup failed: {}: {}",
                            s.reason.unwrap_or_default(),
                            s.message.unwrap_or_default()
                        ))),
                        p => Err(format!("phase {p:?}")),
                    }
                }
            },
        )
        .await?;
    let status = status
        .map_err(|e| Failure::new(e, "see the backup Job's log and the RedisBackup's status"))?;
    if status.keys != Some(KEYS as i64) {
        return Err(Failure::new(
            format!(
                "the backup reports {:?} keys, {KEYS} were written",
                status.keys
            ),
            "status.keys counts the keys in the stored snapshot",
        ));
    }
    ctx.note(format!(
        "backup {}: {} bytes, {} keys at {}",
        backup,
        status.size_bytes.unwrap_or_default(),
        status.keys.unwrap_or_default(),
        status.location.unwrap_or_default()
    ));

    let r2 = create_ready(
        ctx,
        &restored,
        json!({"mode": "Standalone", "engine": "Redis", "version": "7.0",
                   "bootstrap": {"fromBackup": {"backup": backup}}}),
    )
    .await?;
    let done = r2
        .status
        .as_ref()
        .and_then(|s| s.bootstrap.as_ref())
        .is_some_and(|b| b.done);
    if !done {
        return Err(Failure::new(
            format!(
                "Redis {restored} is Ready but status.bootstrap does not say the restore is done"
            ),
            "status.bootstrap.done records a finished restore",
        ));
    }
    let (p2, _) = topology(&r2)?;
    let pw2 = ctx.password(&r2).await?;
    check_keys(&mut ctx.connect(&p2, &pw2).await?, &tag, &p2).await?;
    ctx.note(format!("restored Redis {restored} has every key"));
    Ok(())
}

/// Plain HTTP GET of `path` on `ip:port`; the body of a 200 answer.
async fn http_get(ip: &str, port: u16, path: &str) -> Result<String, String> {
    let addr = format!("{ip}:{port}");
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("sending to {addr}: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("reading from {addr}: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| format!("{addr} did not answer within 10s"))??;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
        Ok(body.to_string())
    } else {
        Err(format!(
            "{addr}{path} answered {}",
            head.lines().next().unwrap_or("nothing")
        ))
    }
}

/// The value of an unlabelled sample `name` in a Prometheus text page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Deep Insights: the metrics sidecar and the status.
pub(super) async fn deep_insights(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("insights");
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Standalone", "engine": "Redis", "version": "7.0"}),
    )
    .await?;
    let (primary, _) = topology(&r)?;
    let ip = ctx.pod_ip(&primary).await?;
    let page = http_get(&ip, 9121, "/metrics").await.map_err(|e| {
        Failure::new(
            format!("the metrics sidecar of {primary} did not serve /metrics: {e}"),
            "spec.monitoring.exporter (default true) runs the sidecar on port 9121",
        )
    })?;
    for (metric, want_positive) in [
        ("redis_up", true),
        ("redis_memory_used_bytes", true),
        ("redis_connected_clients", false),
    ] {
        match sample(&page, metric) {
            Some(v) if !want_positive || v > 0.0 => ctx.note(format!("{metric} {v}")),
            other => {
                return Err(Failure::new(
                    format!("the metrics of {primary} have {metric} = {other:?}"),
                    "the sidecar reads INFO from the server in its pod; see its log (`kubectl logs <pod> -c exporter`)",
                ));
            }
        }
    }
    let (used, _) = ctx
        .wait_redis(
            &name,
            None,
            &format!("Redis {name} reporting status.memory"),
            "the operator reads INFO memory of the primary into status.memory",
            |r| {
                r.status
                    .and_then(|s| s.memory)
                    .map(|m| m.used_bytes)
                    .filter(|u| *u > 0)
                    .ok_or_else(|| "no status.memory".to_string())
            },
        )
        .await?;
    let conditions: Vec<String> = r
        .status
        .clone()
        .unwrap_or_default()
        .conditions
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    for want in ["Ready=True", "PrimaryAvailable=True"] {
        if !conditions.iter().any(|c| c == want) {
            return Err(Failure::new(
                format!("conditions are {conditions:?}, without {want}"),
                "a healthy Redis reports Ready and PrimaryAvailable",
            ));
        }
    }
    ctx.note(format!(
        "status.memory.usedBytes {used}; conditions {}",
        conditions.join(", ")
    ));
    Ok(())
}

/// Auto Pilot: the primary's pod deleted, a replica is promoted.
pub(super) async fn auto_pilot(ctx: &mut Ctx) -> Result<(), Failure> {
    let name = ctx.name("failover");
    let r = create_ready(
        ctx,
        &name,
        json!({"mode": "Replication", "engine": "Redis", "version": "7.0", "instances": 3}),
    )
    .await?;
    let password = ctx.password(&r).await?;
    let (old, _) = topology(&r)?;
    let tag = ctx.suffix.clone();
    let mut p = ctx.connect(&old, &password).await?;
    write_keys(&mut p, &tag).await?;
    // Acknowledged by both replicas before the fault.
    let acked: i64 = p
        .query("WAIT", redis::cmd("WAIT").arg(2).arg(10_000))
        .await
        .map_err(|e| redis_failed("WAIT", e))?;
    if acked < 2 {
        return Err(Failure::new(
            format!("only {acked} of 2 replicas acknowledged the writes within 10s"),
            "see INFO replication on the primary",
        ));
    }
    drop(p);
    ctx.pods()
        .delete(&old, &DeleteParams::default())
        .await
        .map_err(|e| {
            Failure::new(
                format!("deleting the primary's pod {old}: {e}"),
                "grant the scorecard's ServiceAccount `delete` on pods (scorecard/rbac.yaml)",
            )
        })?;
    let deleted = Instant::now();
    ctx.note(format!("deleted the primary's pod {old}"));
    let (new, took) = ctx
        .wait_redis(
            &name,
            Some(FAILOVER_BOUND),
            "a replica promoted",
            "the operator fails over when the primary's pod is gone; see status.lastFailover, the events and the operator's log",
            |r| {
                let s = r.status.clone().unwrap_or_default();
                match (&s.primary, &s.last_failover) {
                    (Some(p), Some(f)) if *p != old && f.from == old => Ok(p.clone()),
                    _ => Err(super::describe(&r)),
                }
            },
        )
        .await?;
    ctx.note(format!(
        "{new} promoted {:.1}s after the pod's deletion",
        took.as_secs_f64()
    ));
    let mut n = ctx.connect(&new, &password).await?;
    let role: String = n
        .replication()
        .await
        .map(|i| i.role.map(|r| format!("{r:?}")).unwrap_or_default())
        .map_err(|e| redis_failed("INFO replication", e))?;
    check_keys(&mut n, &tag, &new).await?;
    // A promoted primary refuses writes (NOREPLICAS) until a replica
    // follows it again, when `min-replicas-to-write` fences it; the bound
    // counts from the deletion.
    let mut cmd = redis::cmd("SET");
    cmd.arg("scorecard:after").arg(&tag);
    let written = loop {
        match n.query::<()>("SET", &cmd).await {
            Ok(()) => break deleted.elapsed(),
            Err(e) if deleted.elapsed() > FAILOVER_BOUND => {
                return Err(Failure::new(
                    format!(
                        "the new primary {new} ({role}) still refused writes {}s after the deletion: {e}",
                        FAILOVER_BOUND.as_secs()
                    ),
                    "the promoted replica takes writes once a replica follows it; see INFO replication on it and the events",
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    ctx.note(format!(
        "{new} ({role}) has every acknowledged key; first write acknowledged {:.1}s after the deletion",
        written.as_secs_f64()
    ));
    // The deleted pod comes back as a replica and the Redis is Ready again.
    ctx.wait_ready(&name).await?;
    Ok(())
}
