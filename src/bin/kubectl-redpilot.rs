//! `kubectl redpilot`: a kubectl plugin (krew's naming: an executable named
//! `kubectl-redpilot` on the PATH) for the Redis resources Redpilot manages.
//!
//! ```text
//! kubectl redpilot status <redis>            one screen: topology, memory, backups, conditions, events
//! kubectl redpilot switchover <redis> [to]   a zero-loss switchover (spec.failover.switchoverTo)
//! kubectl redpilot backup <redis>            a RedisBackup to the target its schedule or last backup uses
//! kubectl redpilot hibernate|wake <redis>    spec.hibernate
//! kubectl redpilot advise <redis>            tuning advice: findings, evidence, the change to apply
//! kubectl redpilot version                   the plugin's and the cluster's versions
//! ```
//!
//! The namespace is `-n`/`--namespace`, else the kubeconfig context's. The
//! writes are server-side applies of the one field a verb is about, with
//! the field manager `kubectl-redpilot`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use redpilot::api::v1alpha1::{BackupPhase, Phase, Redis, RedisBackup, RedisBackupSchedule};
use redpilot::plugin::{self, EventLine};
use serde_json::json;

const MANAGER: &str = "kubectl-redpilot";

/// Redpilot's kubectl plugin.
#[derive(Parser, Debug)]
#[command(name = "kubectl-redpilot", version = redpilot::VERSION, about)]
struct Cli {
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One screen about a Redis: topology, roles, offsets and lag, memory
    /// and the autopilot, the last failover and backup, conditions, recent
    /// events.
    Status {
        /// The Redis.
        redis: String,
    },
    /// Make another instance primary without losing an acknowledged write
    /// (sets spec.failover.switchoverTo, waits for it, and withdraws the
    /// request; with --timeout 0 the request stays, pinning the primary).
    Switchover {
        /// The Redis.
        redis: String,
        /// The instance (pod name) to promote; default: the ready replica
        /// least behind.
        to: Option<String>,
        /// Seconds to wait for the new primary (0: do not wait).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Back up a Redis now, to where its schedule (or its newest backup)
    /// stores backups; waits for the backup to finish.
    Backup {
        /// The Redis.
        redis: String,
        /// Name of the RedisBackup (default `<redis>-<UTC time>`).
        #[arg(long)]
        name: Option<String>,
        /// Seconds to wait for it (0: do not wait).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Save the data and remove the pods (spec.hibernate: true).
    Hibernate {
        /// The Redis.
        redis: String,
        /// Seconds to wait for phase Hibernated (0: do not wait).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Bring a hibernated Redis back (spec.hibernate: false).
    Wake {
        /// The Redis.
        redis: String,
        /// Seconds to wait for phase Ready (0: do not wait).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Stop following the source (removes spec.replicaOf): the operator
    /// pauses the source's writes, waits until this Redis has all of
    /// them, makes the source read-only and promotes; when the source
    /// cannot be reached it promotes with what this Redis has and records
    /// how far behind it was (status.promotion).
    Promote {
        /// The Redis.
        redis: String,
        /// Seconds to wait for the promotion (0: do not wait).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Tuning advice for a Redis (status.insights): each finding with its
    /// evidence, what to do, and the exact change to apply when one does.
    Advise {
        /// The Redis.
        redis: String,
    },
    /// The plugin's version and the cluster's.
    Version,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

async fn client(ns: Option<String>) -> Result<(Client, String)> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| format!("no cluster to talk to (KUBECONFIG, ~/.kube/config): {e}"))?;
    let ns = ns.unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| format!("connecting: {e}"))?;
    Ok((client, ns))
}

async fn get_redis(api: &Api<Redis>, ns: &str, name: &str) -> Result<Redis> {
    match api.get_opt(name).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(format!("Redis {ns}/{name} not found")),
        Err(e) => Err(format!("reading Redis {ns}/{name}: {e}")),
    }
}

/// Server-side applies `spec` (a part of the Redis's spec) as this plugin.
async fn apply_spec(api: &Api<Redis>, name: &str, spec: serde_json::Value) -> Result<()> {
    let body = json!({
        "apiVersion": "redpilot.io/v1alpha1",
        "kind": "Redis",
        "metadata": {"name": name},
        "spec": spec,
    });
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("updating Redis {name}: {e}"))
}

/// Polls the Redis until `done` says so (Ok) or fails (Err), for `timeout`.
async fn wait_redis(
    api: &Api<Redis>,
    name: &str,
    timeout: u64,
    what: &str,
    done: impl Fn(&Redis) -> Option<std::result::Result<String, String>>,
) -> Result<String> {
    let start = Instant::now();
    loop {
        if let Ok(r) = api.get(name).await
            && let Some(outcome) = done(&r)
        {
            return outcome;
        }
        if start.elapsed() > Duration::from_secs(timeout) {
            return Err(format!(
                "{what}: not done after {timeout} s; `kubectl redpilot status {name}` shows where it stands"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn phase(r: &Redis) -> Option<Phase> {
    r.status.as_ref()?.phase
}

async fn run(cli: Cli) -> Result<()> {
    if let Command::Version = cli.command {
        println!("kubectl-redpilot {}", redpilot::VERSION);
        match client(cli.namespace).await {
            Ok((c, _)) => match c.apiserver_version().await {
                Ok(v) => println!("Kubernetes {}", v.git_version),
                Err(e) => println!("Kubernetes: not reachable ({e})"),
            },
            Err(e) => println!("Kubernetes: {e}"),
        }
        return Ok(());
    }
    let (client, ns) = client(cli.namespace).await?;
    let redis_api: Api<Redis> = Api::namespaced(client.clone(), &ns);
    match cli.command {
        Command::Version => Ok(()),
        Command::Status { redis } => {
            let r = get_redis(&redis_api, &ns, &redis).await?;
            let backups: Vec<RedisBackup> = Api::<RedisBackup>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let events = events(&client, &ns, &redis).await;
            print!(
                "{}",
                plugin::status(&r, &backups, &events, chrono::Utc::now())
            );
            Ok(())
        }
        Command::Advise { redis } => {
            let r = get_redis(&redis_api, &ns, &redis).await?;
            print!("{}", plugin::advise(&r, chrono::Utc::now()));
            Ok(())
        }
        Command::Switchover { redis, to, timeout } => {
            let r = get_redis(&redis_api, &ns, &redis).await?;
            let primary = r.status.as_ref().and_then(|s| s.primary.clone());
            let to = match to {
                Some(t) => t,
                None => plugin::switchover_target(&r).ok_or_else(|| {
                    format!("{redis} has no ready replica with a live link to switch over to")
                })?,
            };
            if primary.as_deref() == Some(to.as_str()) {
                println!("{to} is already the primary of {redis}");
                return Ok(());
            }
            apply_spec(
                &redis_api,
                &redis,
                json!({"failover": {"switchoverTo": to}}),
            )
            .await?;
            println!(
                "switchover of {redis} to {to} requested (primary {})",
                primary.as_deref().unwrap_or("none")
            );
            if timeout == 0 {
                return Ok(());
            }
            let t = Instant::now();
            let target = to.clone();
            wait_redis(&redis_api, &redis, timeout, "the switchover", move |r| {
                let s = r.status.as_ref()?;
                (s.primary.as_deref() == Some(target.as_str()))
                    .then(|| Ok(format!("{target} is the primary")))
            })
            .await?;
            // A one-off move: the request is withdrawn once done, or the
            // operator would move the primary back to it after a failover.
            apply_spec(&redis_api, &redis, json!({})).await?;
            println!(
                "{to} is the primary of {redis} ({:.1} s)",
                t.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Backup {
            redis,
            name,
            timeout,
        } => {
            get_redis(&redis_api, &ns, &redis).await?;
            let backups_api: Api<RedisBackup> = Api::namespaced(client.clone(), &ns);
            let backups = backups_api
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing RedisBackups: {e}"))?
                .items;
            let schedules = Api::<RedisBackupSchedule>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing RedisBackupSchedules: {e}"))?
                .items;
            let target = plugin::backup_target(&redis, &schedules, &backups).ok_or_else(|| {
                format!(
                    "no target known for {redis}: it has no RedisBackupSchedule and no RedisBackup \
                     to copy one from; create a RedisBackup with spec.target once"
                )
            })?;
            // `<redis>-<YYYYmmddHHMMSS>`, the Redis's name cut so that the
            // whole is a RedisBackup name (at most 63 characters).
            let name = name.unwrap_or_else(|| {
                let stamp = chrono::Utc::now().format("%Y%m%d%H%M%S").to_string();
                let room = redpilot::api::v1alpha1::MAX_BACKUP_NAME - stamp.len() - 1;
                let base: String = redis.chars().take(room).collect();
                format!("{}-{stamp}", base.trim_end_matches(['-', '.']))
            });
            let body = json!({
                "apiVersion": "redpilot.io/v1alpha1",
                "kind": "RedisBackup",
                "metadata": {"name": name},
                "spec": {"redis": redis, "target": target},
            });
            backups_api
                .patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&body))
                .await
                .map_err(|e| format!("creating RedisBackup {name}: {e}"))?;
            println!("RedisBackup {name} created for {redis}");
            if timeout == 0 {
                return Ok(());
            }
            let start = Instant::now();
            loop {
                let b = backups_api
                    .get(&name)
                    .await
                    .map_err(|e| format!("reading RedisBackup {name}: {e}"))?;
                let s = b.status.clone().unwrap_or_default();
                match s.phase {
                    Some(BackupPhase::Completed) => {
                        println!(
                            "{name} Completed in {:.1} s: {} bytes, {} keys at {}",
                            start.elapsed().as_secs_f64(),
                            s.size_bytes.unwrap_or(0),
                            s.keys.unwrap_or(0),
                            s.location.as_deref().unwrap_or("?")
                        );
                        return Ok(());
                    }
                    Some(BackupPhase::Failed) => {
                        return Err(format!(
                            "{name} failed: {}",
                            b.status
                                .as_ref()
                                .and_then(|s| s.message.clone())
                                .unwrap_or_default()
                        ));
                    }
                    _ => {}
                }
                if start.elapsed() > Duration::from_secs(timeout) {
                    return Err(format!("{name} not finished after {timeout} s"));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Command::Hibernate { redis, timeout } => {
            let r = get_redis(&redis_api, &ns, &redis).await?;
            if r.spec.storage.is_none() {
                return Err(format!(
                    "{redis} has no spec.storage: hibernating would lose its data, and the API \
                     refuses it"
                ));
            }
            apply_spec(&redis_api, &redis, json!({"hibernate": true})).await?;
            println!("{redis}: hibernation requested");
            if timeout > 0 {
                let msg = wait_redis(&redis_api, &redis, timeout, "the hibernation", |r| {
                    (phase(r) == Some(Phase::Hibernated))
                        .then(|| Ok("hibernated: no pod runs; the volumes keep the data".into()))
                })
                .await?;
                println!("{redis}: {msg}");
            }
            Ok(())
        }
        Command::Promote { redis, timeout } => {
            let r = get_redis(&redis_api, &ns, &redis).await?;
            let Some(source) = r.spec.replica_of.as_ref().map(|s| s.address()) else {
                return Err(format!(
                    "{redis} follows no source (spec.replicaOf is not set)"
                ));
            };
            // A promotion recorded before this request is not its answer.
            let asked = chrono::Utc::now() - chrono::Duration::seconds(1);
            // A merge patch removes the field whoever set it (an apply
            // removes only what its own manager set).
            redis_api
                .patch(
                    &redis,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicaOf": null}})),
                )
                .await
                .map_err(|e| format!("updating Redis {redis}: {e}"))?;
            println!("{redis}: promotion off {source} requested");
            if timeout > 0 {
                let msg = wait_redis(&redis_api, &redis, timeout, "the promotion", |r| {
                    let s = r.status.as_ref()?;
                    if s.replica_of.is_some() {
                        return None;
                    }
                    let p = s.promotion.as_ref()?;
                    let at = chrono::DateTime::parse_from_rfc3339(&p.time).ok()?;
                    if at < asked {
                        return None;
                    }
                    Some(Ok(format!(
                        "promoted ({}): {}",
                        if p.planned { "planned" } else { "unplanned" },
                        p.message
                    )))
                })
                .await?;
                println!("{redis}: {msg}");
            }
            Ok(())
        }
        Command::Wake { redis, timeout } => {
            get_redis(&redis_api, &ns, &redis).await?;
            apply_spec(&redis_api, &redis, json!({"hibernate": false})).await?;
            println!("{redis}: wake requested");
            if timeout > 0 {
                let msg = wait_redis(&redis_api, &redis, timeout, "waking", |r| {
                    (phase(r) == Some(Phase::Ready)
                        && r.status.as_ref().and_then(|s| s.observed_generation)
                            == r.metadata.generation)
                        .then(|| {
                            Ok(format!(
                                "Ready, {}",
                                r.status
                                    .as_ref()
                                    .and_then(|s| s.ready.clone())
                                    .unwrap_or_default()
                            ))
                        })
                })
                .await?;
                println!("{redis}: {msg}");
            }
            Ok(())
        }
    }
}

/// The last 10 events about Redis `name`, oldest first.
async fn events(client: &Client, ns: &str, name: &str) -> Vec<EventLine> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Redis,involvedObject.name={name}"
    ));
    let mut list: Vec<EventLine> = api
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|e| EventLine {
            time: e
                .last_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .or_else(|| e.event_time.as_ref().map(|t| t.0.as_second()))
                .and_then(|s| chrono::DateTime::from_timestamp(s, 0)),
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            note: e.message.clone().unwrap_or_default(),
        })
        .collect();
    list.sort_by_key(|e| e.time);
    let skip = list.len().saturating_sub(10);
    list.into_iter().skip(skip).collect()
}
