//! The schedule's decisions, pure and table-tested: when a run is due (in
//! the schedule's time zone), and which backups retention deletes.

use chrono::{DateTime, Duration, Utc};
use chrono_tz::Tz;

use crate::api::v1alpha1::Retention;

/// Failed runs kept for diagnosis (they hold no stored object).
pub const FAILED_KEPT: usize = 3;

/// A schedule's cron macro as five fields.
pub fn normalize(expr: &str) -> String {
    match expr.trim() {
        "@yearly" | "@annually" => "0 0 1 1 *".into(),
        "@monthly" => "0 0 1 * *".into(),
        "@weekly" => "0 0 * * 0".into(),
        "@daily" | "@midnight" => "0 0 * * *".into(),
        "@hourly" => "0 * * * *".into(),
        other => other.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

/// The time zone named by `spec.timeZone` (UTC when absent).
pub fn time_zone(name: Option<&str>) -> Result<Tz, String> {
    let name = name.unwrap_or("UTC");
    name.parse::<Tz>()
        .map_err(|_| format!("spec.timeZone: {name} is not a time zone this operator knows (an IANA name such as Europe/Paris)"))
}

/// The first time strictly after `after` that `expr` names, read in `tz`.
/// As in cron (and Kubernetes CronJobs), when both the day of the month
/// and the day of the week are restricted, a day matching either is a
/// match.
pub fn next_after(expr: &str, tz: Tz, after: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let local = after.with_timezone(&tz);
    let expr5 = normalize(expr);
    let bad = |e: cron_parser::ParseError| {
        format!("spec.schedule: {expr:?} is not a cron expression ({e})")
    };
    let fields: Vec<&str> = expr5.split(' ').collect();
    let next = |e: &str| cron_parser::parse(e, &local).map(|t| t.with_timezone(&Utc));
    match fields.as_slice() {
        [m, h, dom, mon, dow] if *dom != "*" && *dow != "*" => {
            let by_dom = next(&format!("{m} {h} {dom} {mon} *"));
            let by_dow = next(&format!("{m} {h} * {mon} {dow}"));
            match (by_dom, by_dow) {
                (Ok(a), Ok(b)) => Ok(a.min(b)),
                (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
                (Err(e), Err(_)) => Err(bad(e)),
            }
        }
        _ => next(&expr5).map_err(bad),
    }
}

/// The latest time `expr` names in `(last, now]`, if any: runs missed while
/// the operator was down collapse into one.
pub fn latest_due(
    expr: &str,
    tz: Tz,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, String> {
    // Far behind (a schedule created long ago, or an operator down for
    // days): look back a week at most.
    let mut t = last.max(now - Duration::days(7));
    let mut due = None;
    for _ in 0..20_000 {
        let n = next_after(expr, tz, t)?;
        if n > now {
            return Ok(due);
        }
        due = Some(n);
        t = n;
    }
    Ok(due)
}

/// `30d`, `36h`, `1d12h`, `90m`.
pub fn parse_age(s: &str) -> Option<Duration> {
    let mut total = Duration::zero();
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: i64 = num.parse().ok()?;
        num.clear();
        total += match c {
            'd' => Duration::days(n),
            'h' => Duration::hours(n),
            'm' => Duration::minutes(n),
            _ => return None,
        };
    }
    (num.is_empty() && total > Duration::zero()).then_some(total)
}

/// One backup of the schedule, as retention sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// RedisBackup name.
    pub name: String,
    /// When it was created.
    pub created: DateTime<Utc>,
    /// Completed (true), Failed (false), or still going (None).
    pub completed: Option<bool>,
}

/// The backups retention deletes: completed ones beyond the newest
/// `keepLast` or older than `maxAge` (the newest completed one is always
/// kept, so a schedule that stopped working never loses its last backup),
/// and failed ones beyond the newest [`FAILED_KEPT`]. Running ones stay.
pub fn expired(runs: &[Run], retention: &Retention, now: DateTime<Utc>) -> Vec<String> {
    let max_age = retention.max_age.as_deref().and_then(parse_age);
    let keep_last = retention.keep_last.map(|n| n.max(1) as usize);
    let mut done: Vec<&Run> = runs.iter().filter(|r| r.completed == Some(true)).collect();
    done.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.name.cmp(&a.name)));
    let mut out = Vec::new();
    for (i, r) in done.iter().enumerate() {
        if i == 0 {
            continue;
        }
        let beyond = keep_last.is_some_and(|n| i >= n);
        let old = max_age.is_some_and(|age| now - r.created > age);
        if beyond || old {
            out.push(r.name.clone());
        }
    }
    let mut failed: Vec<&Run> = runs.iter().filter(|r| r.completed == Some(false)).collect();
    failed.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.name.cmp(&a.name)));
    out.extend(failed.iter().skip(FAILED_KEPT).map(|r| r.name.clone()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn schedules_read_in_their_time_zone() {
        let paris = time_zone(Some("Europe/Paris")).expect("tz");
        // 03:00 in Paris in winter is 02:00 UTC.
        let n = next_after("0 3 * * *", paris, utc("2026-11-27T00:00:00Z")).expect("next");
        assert_eq!(n, utc("2026-11-27T02:00:00Z"));
        let n = next_after("0 3 * * *", Tz::UTC, utc("2026-11-27T00:00:00Z")).expect("next");
        assert_eq!(n, utc("2026-11-27T03:00:00Z"));
        assert_eq!(
            next_after("@hourly", Tz::UTC, utc("2026-11-27T00:10:00Z")),
            Ok(utc("2026-11-27T01:00:00Z"))
        );
        assert!(time_zone(Some("Mars/Olympus")).is_err());
        // Day of month or day of week: 2026-12-05 is the first Saturday of December.
        let n = next_after("0 0 31 12 6", Tz::UTC, utc("2026-11-27T00:00:00Z")).expect("next");
        assert_eq!(n, utc("2026-12-05T00:00:00Z"));
        let n = next_after("0 0 1 * 1", Tz::UTC, utc("2026-11-27T00:00:00Z")).expect("next");
        assert_eq!(n, utc("2026-11-30T00:00:00Z"));
        assert!(next_after("61 * * * *", Tz::UTC, Utc::now()).is_err());
    }

    #[test]
    fn missed_runs_collapse_into_the_latest() {
        let last = utc("2026-11-27T00:00:00Z");
        let now = utc("2026-11-27T00:07:30Z");
        assert_eq!(
            latest_due("*/2 * * * *", Tz::UTC, last, now),
            Ok(Some(utc("2026-11-27T00:06:00Z")))
        );
        assert_eq!(latest_due("0 * * * *", Tz::UTC, last, now), Ok(None));
        // A run exactly at `last` is not due again.
        assert_eq!(latest_due("0 0 * * *", Tz::UTC, last, last), Ok(None));
    }

    #[test]
    fn ages() {
        assert_eq!(parse_age("30d"), Some(Duration::days(30)));
        assert_eq!(parse_age("1d12h"), Some(Duration::hours(36)));
        assert_eq!(parse_age("90m"), Some(Duration::minutes(90)));
        assert_eq!(parse_age("12"), None);
        assert_eq!(parse_age("0h"), None);
        assert_eq!(parse_age("3w"), None);
    }

    fn run(name: &str, min: u32, completed: Option<bool>) -> Run {
        Run {
            name: name.into(),
            created: Utc
                .with_ymd_and_hms(2026, 11, 27, 0, min, 0)
                .single()
                .expect("time"),
            completed,
        }
    }

    #[test]
    fn retention_keeps_the_newest_and_never_the_last_one_alone() {
        let runs = vec![
            run("a", 1, Some(true)),
            run("b", 2, Some(true)),
            run("c", 3, Some(false)),
            run("d", 4, Some(true)),
            run("e", 5, None),
        ];
        let now = utc("2026-11-27T00:10:00Z");
        let keep2 = Retention {
            keep_last: Some(2),
            max_age: None,
        };
        assert_eq!(expired(&runs, &keep2, now), vec!["a".to_string()]);
        let young = Retention {
            keep_last: None,
            max_age: Some("7m".into()),
        };
        assert_eq!(
            expired(&runs, &young, now),
            vec!["b".to_string(), "a".to_string()]
        );
        // Everything is old: the newest completed backup stays.
        let tiny = Retention {
            keep_last: None,
            max_age: Some("1m".into()),
        };
        assert_eq!(
            expired(&runs, &tiny, now),
            vec!["b".to_string(), "a".to_string()]
        );
        assert!(expired(&runs, &Retention::default(), now).is_empty());
        let failed: Vec<Run> = (0..6)
            .map(|i| run(&format!("f{i}"), i, Some(false)))
            .collect();
        assert_eq!(
            expired(&failed, &Retention::default(), now),
            vec!["f2", "f1", "f0"]
        );
    }
}
