//! Tuning advice: every `--tuning-interval-seconds` the servers of a
//! healthy Redis are looked at ([`crate::redis::tuning::sample`]), the pure
//! rules ([`crate::redis::advice`]) turn what they said into findings, and
//! the status (`status.insights`, condition `Tuned`), events
//! (`TuningAdvice`, `TuningAdviceCleared`) and the metric
//! `redpilot_redis_findings` report them.
//!
//! What is kept per Redis between looks ([`Memory`]): per server up to four
//! baselines of its counters (one every 15 minutes, none older than an
//! hour; about a kilobyte each) for the rules over a window, and where key
//! sampling goes on. An operator that starts again starts without them:
//! rules over a window say nothing until a second look, and the findings
//! they made stand meanwhile.
//!
//! Key sizes are sampled on one replica (never on the primary, unless it
//! has no replica and serves fewer than 1,000 operations a second):
//! [`KEYS_PER_SWEEP`] keys a look, the known big keys measured again.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::Reconciler;
use super::facts::{Cond, PodFacts, Role};
use crate::api::v1alpha1::Insight;
use crate::redis::advice::{self, Advice, Severity, Subject, Thresholds, Verdict};
use crate::redis::tuning::{self, KeyScan, Sample};
use crate::redis::{ConnectOptions, Endpoint, Node};

/// The condition: False while a warning or critical finding stands.
pub const CONDITION: &str = "Tuned";
/// A new baseline of a server's counters this often...
const BASELINE_EVERY: Duration = Duration::from_secs(15 * 60);
/// ...and none kept longer than this (the rules' window).
const BASELINE_KEEP: Duration = Duration::from_secs(60 * 60);
/// A standing finding's evidence is taken again this often (not on every
/// look: each change is a status write).
const EVIDENCE_REFRESH: Duration = Duration::from_secs(10 * 60);
/// Findings the status holds at most.
pub const MAX_INSIGHTS: usize = 20;
/// Keys whose size one look estimates.
pub const KEYS_PER_SWEEP: u32 = 200;
/// A primary without replicas has its keys sampled only below this load.
const QUIET_OPS: f64 = 1000.0;
/// Events one look publishes at most (the status holds them all).
const MAX_EVENTS: usize = 5;

/// What is kept of one Redis between looks.
#[derive(Debug, Default)]
pub struct Memory {
    last: Option<Instant>,
    servers: HashMap<String, Server>,
}

#[derive(Debug, Default)]
struct Server {
    baselines: VecDeque<(Instant, Sample)>,
    scan: Option<KeyScan>,
}

impl Server {
    /// Keeps `cur`'s counters as a baseline when the newest is old enough,
    /// and lets those older than the window go (the newest always stays).
    fn remember(&mut self, cur: &Sample, now: Instant) {
        let due = self
            .baselines
            .back()
            .is_none_or(|(t, _)| now.duration_since(*t) >= BASELINE_EVERY);
        if due {
            self.baselines.push_back((now, cur.baseline()));
        }
        while self.baselines.len() > 1
            && self
                .baselines
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > BASELINE_KEEP)
        {
            self.baselines.pop_front();
        }
    }
}

/// One server's look: its pod, and the sample or why there is none.
struct Look {
    pod: String,
    sample: Result<Sample, crate::redis::Error>,
    scan: Option<KeyScan>,
}

async fn look(
    pod: String,
    endpoint: Endpoint,
    opts: ConnectOptions,
    scan: Option<KeyScan>,
    primary: bool,
) -> Look {
    let mut scan = scan;
    let sample = async {
        let mut node = Node::connect(&endpoint, &opts).await?;
        let mut s = tuning::sample(&mut node).await?;
        let quiet = s
            .num("instantaneous_ops_per_sec")
            .is_some_and(|ops| ops < QUIET_OPS);
        if let Some(k) = scan.as_mut()
            && (!primary || quiet)
        {
            tuning::sample_keys(&mut node, k, &mut s).await?;
        }
        Ok(s)
    }
    .await;
    Look { pod, sample, scan }
}

fn severity_rank(s: &str) -> u8 {
    match s {
        "critical" => 0,
        "warning" => 1,
        _ => 2,
    }
}

fn rule_rank(rule: &str) -> usize {
    advice::RULES
        .iter()
        .position(|r| *r == rule)
        .unwrap_or(usize::MAX)
}

fn insight(a: &Advice, pod: &str, since: Time, now: Time) -> Insight {
    Insight {
        rule: a.rule.to_string(),
        severity: a.severity.as_str().to_string(),
        instance: pod.to_string(),
        evidence: a.evidence.clone(),
        advice: a.advice.clone(),
        config_key: a.config.as_ref().map(|(k, _)| (*k).to_string()),
        config_value: a.config.as_ref().map(|(_, v)| v.clone()),
        since,
        observed: now,
    }
}

/// The findings after a look: `verdicts` by pod over `old`. A finding a
/// rule fires again keeps its `since`, and its evidence until that is
/// [`EVIDENCE_REFRESH`] old or the severity changed; one a rule cannot
/// tell, or of a pod not looked at that still exists, stands.
pub fn merge(
    old: &[Insight],
    verdicts: &[(String, Vec<(&'static str, Verdict)>)],
    pods: &[String],
    now: Timestamp,
) -> Vec<Insight> {
    let now_t = Time(now);
    let fresh = |o: &Insight| {
        now.duration_since(o.observed.0)
            .try_into()
            .is_ok_and(|d: Duration| d < EVIDENCE_REFRESH)
    };
    let mut out: Vec<Insight> = Vec::new();
    for (pod, vs) in verdicts {
        for (rule, v) in vs {
            let before = old.iter().find(|o| o.rule == *rule && &o.instance == pod);
            match (v, before) {
                (Verdict::Fires(a), Some(o)) if o.severity == a.severity.as_str() && fresh(o) => {
                    out.push(o.clone());
                }
                (Verdict::Fires(a), Some(o)) => {
                    out.push(insight(a, pod, o.since.clone(), now_t.clone()));
                }
                (Verdict::Fires(a), None) => {
                    out.push(insight(a, pod, now_t.clone(), now_t.clone()));
                }
                (Verdict::Unknown, Some(o)) => out.push(o.clone()),
                (Verdict::Unknown, None) | (Verdict::Clear, _) => {}
            }
        }
    }
    // Pods that exist but were not looked at keep theirs.
    for o in old {
        let looked = verdicts.iter().any(|(p, _)| *p == o.instance);
        if !looked && pods.contains(&o.instance) {
            out.push(o.clone());
        }
    }
    out.sort_by(|a, b| {
        severity_rank(&a.severity)
            .cmp(&severity_rank(&b.severity))
            .then(rule_rank(&a.rule).cmp(&rule_rank(&b.rule)))
            .then(a.instance.cmp(&b.instance))
    });
    out.truncate(MAX_INSIGHTS);
    out
}

/// The `Tuned` condition for `insights`.
pub fn condition(insights: &[Insight], redis: &str) -> Cond {
    let standing: Vec<String> = insights
        .iter()
        .filter(|i| i.severity != Severity::Info.as_str())
        .map(|i| format!("{} on {} ({})", i.rule, i.instance, i.severity))
        .collect();
    if standing.is_empty() {
        let info = insights.len();
        let msg = if info == 0 {
            "the last look at the servers found nothing to tune".to_string()
        } else {
            format!("no warning; {info} informational finding(s) in status.insights")
        };
        return Cond::new(CONDITION, true, "NoWarnings", msg);
    }
    Cond::new(
        CONDITION,
        false,
        "AdviceStands",
        format!(
            "{} finding(s): {}; kubectl redpilot advise {redis}",
            standing.len(),
            standing.join(", ")
        ),
    )
}

impl Reconciler {
    /// Looks at the servers for tuning advice when the interval has passed
    /// since the last look (only a Redis whose instances all answer);
    /// leaves the findings for the status.
    pub(super) async fn tune(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
        opts: &ConnectOptions,
    ) {
        let every = self.ctx.settings.tuning_interval;
        if every.is_zero() || self.redis.spec.paused {
            return;
        }
        // Looked at again on time even when that is sooner than the
        // periodic pass.
        self.recheck_in = Some(self.recheck_in.map_or(every, |r| r.min(every)));
        let all_answer = !facts.is_empty()
            && facts
                .iter()
                .all(|f| f.reachable && f.ip.is_some() && !f.terminating);
        if !all_answer {
            return;
        }
        let now = Instant::now();
        let mut memory = {
            let Ok(mut all) = self.ctx.tuning.lock() else {
                return;
            };
            let due = all
                .get(&self.oref)
                .and_then(|m| m.last)
                .is_none_or(|l| now.duration_since(l) >= every);
            if !due {
                return;
            }
            // Forget Redis not looked at for long: deleted ones (no
            // finalizer tells of a deletion), or ones unhealthy for that
            // long, whose baselines are stale anyway.
            let stale = (every * 10).max(BASELINE_KEEP);
            all.retain(|_, m| m.last.is_some_and(|l| now.duration_since(l) < stale));
            all.remove(&self.oref).unwrap_or_default()
        };
        memory.last = Some(now);
        let sampler = facts
            .iter()
            .find(|f| Some(f.name.as_str()) != primary && f.role == Some(Role::Replica))
            .or_else(|| facts.iter().find(|f| Some(f.name.as_str()) == primary))
            .map(|f| f.name.clone());
        let t = Thresholds::default();
        let looks = join_all(facts.iter().filter_map(|f| {
            let ip = f.ip.clone()?;
            let mut scan = memory.servers.get_mut(&f.name).and_then(|s| s.scan.take());
            if sampler.as_deref() == Some(f.name.as_str()) && scan.is_none() {
                scan = Some(KeyScan {
                    cursor: 0,
                    count: KEYS_PER_SWEEP,
                    min_bytes: t.big_key_bytes,
                    known: Vec::new(),
                });
            }
            let is_primary = Some(f.name.as_str()) == primary;
            Some(look(
                f.name.clone(),
                Endpoint::new(ip, 6379),
                opts.clone(),
                scan,
                is_primary,
            ))
        }))
        .await;
        let mut verdicts = Vec::new();
        for l in looks {
            let server = memory.servers.entry(l.pod.clone()).or_default();
            server.scan = l.scan;
            match l.sample {
                Ok(cur) => {
                    let base = server.baselines.front().map(|(_, s)| s);
                    let v = advice::evaluate(&Subject {
                        cur: &cur,
                        base,
                        t: &t,
                    });
                    server.remember(&cur, now);
                    verdicts.push((l.pod, v));
                }
                Err(e) => {
                    tracing::debug!(redis = %self.oref, pod = %l.pod, error = %e, "tuning look failed");
                }
            }
        }
        memory
            .servers
            .retain(|pod, _| facts.iter().any(|f| &f.name == pod));
        if let Ok(mut all) = self.ctx.tuning.lock() {
            all.insert(self.oref.clone(), memory);
        }
        let old = self
            .redis
            .status
            .as_ref()
            .map(|s| s.insights.clone())
            .unwrap_or_default();
        let pods: Vec<String> = facts.iter().map(|f| f.name.clone()).collect();
        let new = merge(&old, &verdicts, &pods, Timestamp::now());
        self.tuning_events(&old, &new).await;
        self.insights = Some(new);
    }

    /// `TuningAdvice` for each finding that appeared, `TuningAdviceCleared`
    /// for each that went (at most [`MAX_EVENTS`] a look).
    async fn tuning_events(&self, old: &[Insight], new: &[Insight]) {
        let same = |a: &Insight, b: &Insight| a.rule == b.rule && a.instance == b.instance;
        let mut sent = 0;
        for n in new.iter().filter(|n| !old.iter().any(|o| same(o, n))) {
            if sent == MAX_EVENTS {
                return;
            }
            let t = if n.severity == Severity::Info.as_str() {
                EventType::Normal
            } else {
                EventType::Warning
            };
            let change = match (&n.config_key, &n.config_value) {
                (Some(k), Some(v)) => format!(" (spec.config {k}: {v})"),
                _ => String::new(),
            };
            let note = format!(
                "{} on {} ({}): {}. {}{change}",
                n.rule, n.instance, n.severity, n.evidence, n.advice
            );
            self.event(t, "TuningAdvice", "Tune", note).await;
            sent += 1;
        }
        for o in old.iter().filter(|o| !new.iter().any(|n| same(o, n))) {
            if sent == MAX_EVENTS {
                return;
            }
            let note = format!("{} on {} no longer found", o.rule, o.instance);
            self.event(EventType::Normal, "TuningAdviceCleared", "Tune", note)
                .await;
            sent += 1;
        }
    }

    /// The findings for the status: this pass's look, else the last ones.
    pub(super) fn insights_for_status(&mut self) -> Vec<Insight> {
        match self.insights.take() {
            Some(i) => i,
            None => self
                .redis
                .status
                .as_ref()
                .map(|s| s.insights.clone())
                .unwrap_or_default(),
        }
    }

    /// `Tuned`, once the servers were looked at (this pass or before).
    pub(super) fn tuned_condition(&self, insights: &[Insight], looked: bool) -> Option<Cond> {
        if self.ctx.settings.tuning_interval.is_zero() {
            return None;
        }
        let before = self
            .redis
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == CONDITION));
        (looked || before).then(|| condition(insights, &self.redis.name_any()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(rule: &'static str, severity: Severity, evidence: &str) -> Verdict {
        Verdict::Fires(Advice {
            rule,
            severity,
            evidence: evidence.into(),
            advice: "do this".into(),
            config: Some(("activedefrag", "yes".into())),
        })
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    #[test]
    fn a_standing_finding_keeps_its_evidence_until_it_is_old() {
        let pods = vec!["c-0".to_string(), "c-1".to_string()];
        let first = merge(
            &[],
            &[(
                "c-0".into(),
                vec![(
                    "fragmentation",
                    fired("fragmentation", Severity::Warning, "2.40"),
                )],
            )],
            &pods,
            at(0),
        );
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].config_value.as_deref(), Some("yes"));
        // A minute on, new numbers: the status keeps the old ones.
        let v = vec![(
            "c-0".to_string(),
            vec![(
                "fragmentation",
                fired("fragmentation", Severity::Warning, "2.41"),
            )],
        )];
        let again = merge(&first, &v, &pods, at(60));
        assert_eq!(again, first);
        // Ten minutes on they are taken again; `since` stays.
        let later = merge(&first, &v, &pods, at(600));
        assert_eq!(later[0].evidence, "2.41");
        assert_eq!(later[0].since, first[0].since);
        assert_eq!(later[0].observed, Time(at(600)));
        // A severity change is taken at once.
        let v2 = vec![(
            "c-0".to_string(),
            vec![(
                "fragmentation",
                fired("fragmentation", Severity::Info, "2.41"),
            )],
        )];
        assert_eq!(merge(&first, &v2, &pods, at(60))[0].severity, "info");
    }

    #[test]
    fn unknown_keeps_clear_drops_and_unseen_pods_keep_theirs() {
        let pods = vec!["c-0".to_string(), "c-1".to_string()];
        let old = merge(
            &[],
            &[
                (
                    "c-0".into(),
                    vec![
                        (
                            "low-hit-ratio",
                            fired("low-hit-ratio", Severity::Warning, "41%"),
                        ),
                        (
                            "fragmentation",
                            fired("fragmentation", Severity::Warning, "2.4"),
                        ),
                    ],
                ),
                (
                    "c-1".into(),
                    vec![("slow-fork", fired("slow-fork", Severity::Warning, "900 ms"))],
                ),
            ],
            &pods,
            at(0),
        );
        assert_eq!(old.len(), 3);
        let new = merge(
            &old,
            &[(
                "c-0".into(),
                vec![
                    ("low-hit-ratio", Verdict::Unknown),
                    ("fragmentation", Verdict::Clear),
                ],
            )],
            &pods,
            at(60),
        );
        let names: Vec<(&str, &str)> = new
            .iter()
            .map(|i| (i.rule.as_str(), i.instance.as_str()))
            .collect();
        assert_eq!(names, [("slow-fork", "c-1"), ("low-hit-ratio", "c-0")]);
        // A pod that is gone takes its findings along.
        let gone = merge(&new, &[], &["c-0".to_string()], at(120));
        assert_eq!(gone.len(), 1);
    }

    #[test]
    fn most_severe_first_and_bounded() {
        let pods: Vec<String> = (0..30).map(|i| format!("c-{i}")).collect();
        let verdicts: Vec<(String, Vec<(&'static str, Verdict)>)> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let sev = if i == 29 {
                    Severity::Critical
                } else {
                    Severity::Info
                };
                (
                    p.clone(),
                    vec![(
                        "latency-monitor-off",
                        fired("latency-monitor-off", sev, "0"),
                    )],
                )
            })
            .collect();
        let out = merge(&[], &verdicts, &pods, at(0));
        assert_eq!(out.len(), MAX_INSIGHTS);
        assert_eq!(out[0].instance, "c-29");
    }

    #[test]
    fn the_condition_counts_warnings_only() {
        let pods = vec!["c-0".to_string()];
        let info = merge(
            &[],
            &[(
                "c-0".into(),
                vec![(
                    "latency-monitor-off",
                    fired("latency-monitor-off", Severity::Info, "0"),
                )],
            )],
            &pods,
            at(0),
        );
        let c = condition(&info, "cache");
        assert!(c.status, "{c:?}");
        let warn = merge(
            &[],
            &[(
                "c-0".into(),
                vec![("slow-fork", fired("slow-fork", Severity::Warning, "900 ms"))],
            )],
            &pods,
            at(0),
        );
        let c = condition(&warn, "cache");
        assert!(!c.status);
        assert_eq!(c.reason, "AdviceStands");
        assert!(
            c.message.contains("slow-fork on c-0 (warning)"),
            "{}",
            c.message
        );
        assert!(
            c.message.ends_with("kubectl redpilot advise cache"),
            "{}",
            c.message
        );
    }

    #[test]
    fn baselines_every_quarter_hour_for_an_hour() {
        let mut s = Server::default();
        let t0 = Instant::now();
        let sample = Sample::default();
        for minute in 0..=90 {
            s.remember(&sample, t0 + Duration::from_secs(minute * 60));
        }
        // Taken at 0, 15, 30, 45, 60, 75, 90; older than an hour gone.
        assert_eq!(s.baselines.len(), 5);
        let first = s.baselines.front().map(|(t, _)| t.duration_since(t0));
        assert_eq!(first, Some(Duration::from_secs(30 * 60)));
    }
}
