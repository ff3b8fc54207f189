//! The `RedisBackupSchedule` controller: a RedisBackup each time the cron
//! schedule comes due (in its time zone), never while one of its backups is
//! still running (that run is skipped and counted), then retention: expired
//! backups are deleted, and as the schedule's backups carry
//! `deletionPolicy: Delete`, their stored objects go with them.
//!
//! A schedule does not own its backups: deleting it (or the Redis) deletes
//! none of them. Runs missed while the operator was down collapse into one.
//! Backups are named after the time they were due, so a pass repeated after
//! a crash creates nothing twice.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::v1alpha1::{
    BackupPhase, RedisBackup, RedisBackupSchedule, RedisBackupScheduleStatus, ScheduledRun,
};
use crate::controller::base::{FIELD_MANAGER, rfc3339};
use crate::controller::error::Error;
use crate::controller::names;
use crate::telemetry::Metrics;

/// Label on a backup naming the schedule that started it.
pub const SCHEDULE_LABEL: &str = "redpilot.io/schedule";
/// Runs listed in the status.
const RUNS_SHOWN: usize = 10;

/// Shared by the schedule reconciles.
pub struct ScheduleContext {
    /// The API client.
    pub client: Client,
    /// Publishes events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
}

/// Runs the schedule controller in `ns` (all namespaces when `None`).
pub async fn run(client: Client, ns: Option<String>, ctx: Arc<ScheduleContext>) {
    let schedules: Api<RedisBackupSchedule> = crate::controller::base::scoped_api(&client, &ns);
    let backups: Api<RedisBackup> = crate::controller::base::scoped_api(&client, &ns);
    Controller::new(schedules, watcher::Config::default())
        // A backup of a schedule that ends lets the next run start and
        // retention prune.
        .watches(
            backups,
            watcher::Config::default().labels(SCHEDULE_LABEL),
            |b: RedisBackup| {
                let name = b.labels().get(SCHEDULE_LABEL)?.clone();
                Some(ObjectRef::new(&name).within(&b.namespace()?))
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "schedule reconcile");
            }
        })
        .await;
}

fn error_policy(s: Arc<RedisBackupSchedule>, err: &Error, ctx: Arc<ScheduleContext>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[err.category()])
        .inc();
    tracing::warn!(schedule = %ObjectRef::from_obj(s.as_ref()), error = %err, "schedule reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// When an object was created.
fn created(meta: &kube::api::ObjectMeta) -> Option<DateTime<Utc>> {
    let t = meta.creation_timestamp.as_ref()?;
    DateTime::<Utc>::from_timestamp(t.0.as_second(), 0)
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// One pass over one schedule.
pub async fn reconcile(
    s: Arc<RedisBackupSchedule>,
    ctx: Arc<ScheduleContext>,
) -> Result<Action, Error> {
    let ns = s.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = s.name_any();
    let api: Api<RedisBackupSchedule> = Api::namespaced(ctx.client.clone(), &ns);
    let backups: Api<RedisBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let old = s.status.clone().unwrap_or_default();
    let now = Utc::now();
    let mut st = old.clone();

    let tz = plan::time_zone(s.spec.time_zone.as_deref());
    let checked = tz.and_then(|tz| plan::next_after(&s.spec.schedule, tz, now).map(|_| tz));
    let tz = match checked {
        Ok(tz) => tz,
        Err(why) => {
            if old.message.as_deref() != Some(why.as_str()) {
                publish(&ctx, &s, EventType::Warning, "InvalidSchedule", why.clone()).await;
                st.message = Some(why);
                st.next_schedule_time = None;
                write_status(&ctx, &api, &name, &st).await?;
            }
            return Ok(Action::await_change());
        }
    };
    st.message = None;

    ctx.metrics.kube("list_redisbackups");
    let mine = backups
        .list(&ListParams::default().labels(&format!("{SCHEDULE_LABEL}={name}")))
        .await?
        .items;
    let phase = |b: &RedisBackup| b.status.as_ref().and_then(|s| s.phase);
    let running = mine
        .iter()
        .find(|b| {
            !matches!(
                phase(b),
                Some(BackupPhase::Completed) | Some(BackupPhase::Failed)
            )
        })
        .map(|b| b.name_any());

    let schedule_created = created(s.meta());
    let last = old
        .last_schedule_time
        .as_deref()
        .and_then(parse_time)
        .or(schedule_created)
        .unwrap_or(now);
    let due = plan::latest_due(&s.spec.schedule, tz, last, now).unwrap_or_default();
    let mut active = running.clone();
    if let Some(due) = due.filter(|_| !s.spec.suspend) {
        st.last_schedule_time = Some(rfc3339(due));
        match &running {
            Some(r) => {
                st.skipped += 1;
                let note = format!(
                    "the run due at {} is skipped: {r} is still running",
                    rfc3339(due)
                );
                publish(&ctx, &s, EventType::Warning, "RunSkipped", note).await;
            }
            None => {
                let b = backup_for(&s, &ns, due);
                let bname = b.name_any();
                ctx.metrics.kube("apply_redisbackup");
                backups
                    .patch(
                        &bname,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&b),
                    )
                    .await?;
                let note = format!("started {bname}, due at {}", rfc3339(due));
                publish(&ctx, &s, EventType::Normal, "BackupScheduled", note).await;
                active = Some(bname);
            }
        }
    } else if due.is_some() {
        // Suspended: the due time passes without a run.
        st.last_schedule_time = due.map(rfc3339);
    }

    // Retention.
    let runs: Vec<plan::Run> = mine
        .iter()
        .map(|b| plan::Run {
            name: b.name_any(),
            created: created(b.meta()).unwrap_or(now),
            completed: match phase(b) {
                Some(BackupPhase::Completed) => Some(true),
                Some(BackupPhase::Failed) => Some(false),
                _ => None,
            },
        })
        .collect();
    let expired = plan::expired(&runs, &s.spec.retention, now);
    for b in &expired {
        ctx.metrics.kube("delete_redisbackup");
        match backups.delete(b, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if !expired.is_empty() {
        let note = format!(
            "retention deleted {} (and their stored objects)",
            expired.join(", ")
        );
        publish(&ctx, &s, EventType::Normal, "BackupsPruned", note).await;
    }

    let kept: Vec<&RedisBackup> = mine
        .iter()
        .filter(|b| !expired.contains(&b.name_any()))
        .collect();
    st.kept = kept
        .iter()
        .filter(|b| phase(b) == Some(BackupPhase::Completed))
        .count() as i32;
    st.last_successful_time = kept
        .iter()
        .filter(|b| phase(b) == Some(BackupPhase::Completed))
        .filter_map(|b| b.status.as_ref()?.completed_at.clone())
        .max()
        .or(old.last_successful_time.clone());
    let mut listed: Vec<ScheduledRun> = kept
        .iter()
        .map(|b| {
            let bs = b.status.clone().unwrap_or_default();
            ScheduledRun {
                name: b.name_any(),
                phase: bs.phase.map(|p| format!("{p:?}")),
                scheduled_at: b.annotations().get(SCHEDULED_AT).cloned(),
                size_bytes: bs.size_bytes,
                reason: bs.reason,
            }
        })
        .collect();
    listed.sort_by(|a, b| {
        b.scheduled_at
            .cmp(&a.scheduled_at)
            .then_with(|| b.name.cmp(&a.name))
    });
    listed.truncate(RUNS_SHOWN);
    st.last_runs = listed;
    st.active = active;
    let from = st
        .last_schedule_time
        .as_deref()
        .and_then(parse_time)
        .map_or(now, |l| l.max(now));
    let next = plan::next_after(&s.spec.schedule, tz, from).ok();
    st.next_schedule_time = next.map(rfc3339);
    if st != old {
        write_status(&ctx, &api, &name, &st).await?;
    }
    let wait = next
        .map(|n| (n - Utc::now()).num_milliseconds().max(0) as u64 + 500)
        .unwrap_or(60_000)
        .min(3_600_000);
    Ok(Action::requeue(Duration::from_millis(wait)))
}

/// Annotation on a scheduled backup: when it was due.
pub const SCHEDULED_AT: &str = "redpilot.io/scheduled-at";

/// The RedisBackup for the run due at `due`: named after that time, with
/// `deletionPolicy: Delete` so that retention removes its stored object.
pub fn backup_for(s: &RedisBackupSchedule, ns: &str, due: DateTime<Utc>) -> RedisBackup {
    let mut base: String = s.name_any().chars().take(253 - 13).collect();
    while base.ends_with('-') {
        base.pop();
    }
    let name = format!("{base}-{}", due.format("%Y%m%d%H%M"));
    let mut b = RedisBackup::new(
        &name,
        crate::api::v1alpha1::RedisBackupSpec {
            redis: s.spec.redis.clone(),
            target: s.spec.target.clone(),
            deletion_policy: crate::api::v1alpha1::DeletionPolicy::Delete,
            timeout_seconds: s.spec.timeout_seconds,
        },
    );
    b.metadata.namespace = Some(ns.to_string());
    b.metadata.labels = Some(
        [
            (SCHEDULE_LABEL.to_string(), s.name_any()),
            (
                names::MANAGED_BY_LABEL.to_string(),
                names::MANAGED_BY.to_string(),
            ),
        ]
        .into(),
    );
    b.metadata.annotations = Some([(SCHEDULED_AT.to_string(), rfc3339(due))].into());
    b
}

async fn write_status(
    ctx: &ScheduleContext,
    api: &Api<RedisBackupSchedule>,
    name: &str,
    st: &RedisBackupScheduleStatus,
) -> Result<(), Error> {
    ctx.metrics.kube("patch_status");
    // The whole status, replacing lists and clearing what is gone.
    let patch = serde_json::json!({ "status": serde_json::to_value(st).map_err(|e| Error::Serialize("status", e))? });
    let mut full = patch.clone();
    for key in ["active", "message", "nextScheduleTime"] {
        if full["status"].get(key).is_none() {
            full["status"][key] = serde_json::Value::Null;
        }
    }
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&full))
        .await?;
    Ok(())
}

async fn publish(
    ctx: &ScheduleContext,
    s: &RedisBackupSchedule,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let obj = s.object_ref(&());
    crate::controller::events::publish_event(
        &ctx.recorder,
        &ctx.metrics,
        &obj,
        type_,
        reason,
        "Schedule",
        note,
    )
    .await;
}
