//! `RedisBackupSchedule`: RedisBackups taken on a cron schedule, never two
//! at once, pruned by retention.

use kube::CustomResource;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::backup::{MAX_BACKUP_NAME, name_length_message, name_length_rule};
use super::{BackupTarget, DNS_SUBDOMAIN};

/// What a schedule appends to its name to name a run:
/// `-<YYYYmmddHHMM>` (when it was due).
pub const RUN_SUFFIX_LEN: usize = 13;

/// The longest RedisBackupSchedule name: its runs' names (the name and
/// [`RUN_SUFFIX_LEN`]) must be RedisBackup names.
pub const MAX_SCHEDULE_NAME: usize = MAX_BACKUP_NAME - RUN_SUFFIX_LEN;

/// One cron field: `*` or a value or range, with an optional step, in a
/// comma-separated list.
macro_rules! cron_field {
    ($n:literal) => {
        concat!(
            "([*]|",
            $n,
            "(-",
            $n,
            ")?)(/[1-9][0-9]*)?(,([*]|",
            $n,
            "(-",
            $n,
            ")?)(/[1-9][0-9]*)?)*"
        )
    };
}

/// CEL: five fields (minute hour day-of-month month day-of-week) or a macro.
pub const CRON_RULE: &str = concat!(
    "self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|",
    cron_field!("[0-5]?[0-9]"),
    "[ ]+",
    cron_field!("(2[0-3]|[01]?[0-9])"),
    "[ ]+",
    cron_field!("(3[01]|[12][0-9]|0?[1-9])"),
    "[ ]+",
    cron_field!("(1[0-2]|0?[1-9])"),
    "[ ]+",
    cron_field!("([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))"),
    ")$')"
);

/// Backups of a Redis on a schedule.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "redpilot.io",
    version = "v1alpha1",
    kind = "RedisBackupSchedule",
    plural = "redisbackupschedules",
    singular = "redisbackupschedule",
    namespaced,
    shortname = "rbks",
    category = "redpilot",
    status = "RedisBackupScheduleStatus",
    validation = Rule::new(name_length_rule(MAX_SCHEDULE_NAME))
        .optional_old_self(true)
        .message(name_length_message("RedisBackupSchedule", MAX_SCHEDULE_NAME, "its backups are named <name>-<YYYYmmddHHMM>, and a RedisBackup name is at most 63 characters")),
    doc = "RedisBackups of a Redis taken on a cron schedule (never two at once), pruned by retention: expired backups are deleted from the bucket too.",
    printcolumn(name = "Redis", type_ = "string", json_path = ".spec.redis"),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(name = "Last", type_ = "date", json_path = ".status.lastScheduleTime"),
    printcolumn(
        name = "Next",
        type_ = "string",
        json_path = ".status.nextScheduleTime"
    ),
    printcolumn(name = "Kept", type_ = "integer", json_path = ".status.kept"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RedisBackupScheduleSpec {
    /// The Redis to back up (in this namespace).
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message("spec.redis must be the name of a Redis (a DNS label)"))]
    pub redis: String,
    /// When to take a backup: a cron expression of five fields (minute
    /// hour day-of-month month day-of-week, e.g. `0 3 * * *`) or `@hourly`,
    /// `@daily`, `@weekly`, `@monthly`, `@yearly`.
    #[schemars(length(min = 1, max = 120))]
    #[x_kube(validation = Rule::new(CRON_RULE).message(Message::Expression("'spec.schedule: \"' + self + '\" is not a cron expression: five fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-6 or sun-sat; each *, a value, a range a-b, a step /n, or a list) such as \"0 3 * * *\", or @hourly, @daily, @weekly, @monthly, @yearly'".into())))]
    pub schedule: String,
    /// The IANA time zone the schedule is read in (default `UTC`), e.g.
    /// `Europe/Paris`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$')").message("spec.timeZone must be an IANA time zone name such as UTC or Europe/Paris"))]
    pub time_zone: Option<String>,
    /// No new backup while true (those running go on).
    #[serde(default)]
    pub suspend: bool,
    /// Where the backups are stored.
    pub target: BackupTarget,
    /// Which backups to keep; the others are deleted, with their stored
    /// objects.
    #[serde(default)]
    pub retention: Retention,
    /// `timeoutSeconds` of its backups: seconds a backup Job may run
    /// before it is stopped and the backup fails (default 3600, 30 to
    /// 604800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 604800))]
    pub timeout_seconds: Option<i64>,
}

/// Which completed backups a schedule keeps. Without either bound, all.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Keep the newest N completed backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep_last: Option<i32>,
    /// Keep backups younger than this: a number of days, hours and
    /// minutes such as `30d`, `36h` or `1d12h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+d)?([0-9]+h)?([0-9]+m)?$') && self != ''").message("spec.retention.maxAge must be days, hours and minutes such as 30d, 36h or 1d12h"))]
    pub max_age: Option<String>,
}

/// One backup the schedule started.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledRun {
    /// The RedisBackup.
    pub name: String,
    /// Its phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When it was due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<String>,
    /// Stored size in bytes (completed backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Observed state of a schedule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisBackupScheduleStatus {
    /// The last time a backup was due (started, or skipped because one was
    /// still running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<String>,
    /// The next time one is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<String>,
    /// When a backup of this schedule last completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<String>,
    /// The backup running now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
    /// Runs skipped because the previous one was still running.
    #[serde(default)]
    pub skipped: i64,
    /// Completed backups kept by retention.
    #[serde(default)]
    pub kept: i32,
    /// The newest runs, newest first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_runs: Vec<ScheduledRun>,
    /// Why the schedule cannot run (an unknown time zone), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
