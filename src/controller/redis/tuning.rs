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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::Reconciler;
use super::conf::{APPLIED, CLEARED, REFUSED};
use super::facts::{Cond, PodFacts, Role};
use super::report::Tuning;
use crate::api::v1alpha1::{AppliedTuning, Insight, TunableRule, TuningStatus};
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

impl Memory {
    /// When the servers were last looked at.
    pub fn last_look(&self) -> Option<Instant> {
        self.last
    }
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
pub struct Look {
    /// The pod looked at.
    pub pod: String,
    /// What the server said, or why it said nothing.
    pub sample: Result<Sample, crate::redis::Error>,
    /// Where key sampling goes on from next time (`None`: not sampled).
    pub scan: Option<KeyScan>,
}

/// Looks at one server on a connection of its own: the sample, and a step
/// of key sampling when `scan` asks for it and the server is a replica or a
/// quiet primary. (`make bench-tuning` times this same function.)
pub async fn look(
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

/// The servers whose keys a look samples: in each group of `facts` (a
/// Cluster's shard, by `shard`; the whole Redis when it says `None`) one
/// replica, else that group's primary (sampled only while quiet).
pub fn samplers(
    facts: &[PodFacts],
    primary: Option<&str>,
    shard: impl Fn(&str) -> Option<i32>,
) -> BTreeSet<String> {
    let is_primary =
        |f: &PodFacts| Some(f.name.as_str()) == primary || f.role == Some(Role::Primary);
    let mut groups: BTreeMap<Option<i32>, (Option<&str>, Option<&str>)> = BTreeMap::new();
    for f in facts {
        let (replica, prim) = groups.entry(shard(&f.name)).or_default();
        if is_primary(f) {
            prim.get_or_insert(f.name.as_str());
        } else if f.role == Some(Role::Replica) {
            replica.get_or_insert(f.name.as_str());
        }
    }
    groups
        .into_values()
        .filter_map(|(replica, prim)| replica.or(prim).map(str::to_string))
        .collect()
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

/// An applied setting stands this long before its rule may change the same
/// key again (a rule that keeps firing does not double a value each look).
const REAPPLY_AFTER: Duration = Duration::from_secs(60 * 60);
/// Records `status.tuning.applied` keeps at most.
pub const MAX_APPLIED: usize = 20;

/// The records after a look, and those it added. A finding of a rule in
/// `apply` whose advised key the user does not set gets a record unless the
/// key's last record has that value already (applied, cleared or refused)
/// or was applied less than [`REAPPLY_AFTER`] ago; `from` is the servers'
/// value (`current`). An applied record whose rule has no finding any more
/// is cleared.
pub fn plan_applied(
    old: &[AppliedTuning],
    insights: &[Insight],
    apply: &[TunableRule],
    user: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
    now: Timestamp,
) -> (Vec<AppliedTuning>, Vec<AppliedTuning>) {
    let mut out = old.to_vec();
    let mut added = Vec::new();
    for i in insights {
        let (Some(key), Some(value)) = (&i.config_key, &i.config_value) else {
            continue;
        };
        if !apply.iter().any(|r| r.as_str() == i.rule) || user.contains_key(key) {
            continue;
        }
        let last = out.iter().rev().find(|a| &a.key == key);
        let recent = |a: &AppliedTuning| {
            a.state != REFUSED
                && now
                    .duration_since(a.at.0)
                    .try_into()
                    .is_ok_and(|d: Duration| d < REAPPLY_AFTER)
        };
        if last.is_some_and(|l| &l.to == value || recent(l)) {
            continue;
        }
        let record = AppliedTuning {
            rule: i.rule.clone(),
            key: key.clone(),
            from: current
                .get(key)
                .cloned()
                .or_else(|| last.map(|l| l.to.clone()))
                .unwrap_or_default(),
            to: value.clone(),
            at: Time(now),
            before: format!("{} on {}: {}", i.rule, i.instance, i.evidence),
            state: APPLIED.to_string(),
            message: None,
        };
        out.push(record.clone());
        added.push(record);
    }
    for a in out.iter_mut().filter(|a| a.state == APPLIED) {
        if !insights.iter().any(|i| i.rule == a.rule) {
            a.state = CLEARED.to_string();
        }
    }
    let extra = out.len().saturating_sub(MAX_APPLIED);
    out.drain(..extra);
    (out, added)
}

/// Marks the record that set `key` to `value` refused, with the server's
/// `message`.
pub fn mark_refused(records: &mut [AppliedTuning], key: &str, value: &str, message: &str) {
    if let Some(a) = records
        .iter_mut()
        .rev()
        .find(|a| a.key == key && a.to == value && a.state != REFUSED)
    {
        a.state = REFUSED.to_string();
        a.message = Some(message.to_string());
    }
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
        shard: impl Fn(&str) -> Option<i32>,
    ) -> Tuning {
        let every = self.ctx.settings.tuning_interval;
        if every.is_zero() || self.redis.spec.paused {
            return Tuning::default();
        }
        // Looked at again on time even when that is sooner than the
        // periodic pass.
        self.report.recheck_within(every);
        let all_answer = !facts.is_empty()
            && facts
                .iter()
                .all(|f| f.reachable && f.ip.is_some() && !f.terminating);
        if !all_answer {
            return Tuning::default();
        }
        let now = Instant::now();
        let mut memory = {
            let Ok(mut all) = self.ctx.tuning.lock() else {
                return Tuning::default();
            };
            let due = all
                .get(&self.oref)
                .and_then(|m| m.last)
                .is_none_or(|l| now.duration_since(l) >= every);
            if !due {
                return Tuning::default();
            }
            // Forget Redis not looked at for long: deleted ones (no
            // finalizer tells of a deletion), or ones unhealthy for that
            // long, whose baselines are stale anyway.
            let stale = (every * 10).max(BASELINE_KEEP);
            all.retain(|_, m| m.last.is_some_and(|l| now.duration_since(l) < stale));
            all.remove(&self.oref).unwrap_or_default()
        };
        memory.last = Some(now);
        let samplers = samplers(facts, primary, shard);
        let t = Thresholds::default();
        let looks = join_all(facts.iter().filter_map(|f| {
            let ip = f.ip.clone()?;
            let mut scan = memory.servers.get_mut(&f.name).and_then(|s| s.scan.take());
            if samplers.contains(&f.name) && scan.is_none() {
                scan = Some(KeyScan {
                    cursor: 0,
                    count: KEYS_PER_SWEEP,
                    min_bytes: t.big_key_bytes,
                    known: Vec::new(),
                });
            }
            let is_primary = Some(f.name.as_str()) == primary || f.role == Some(Role::Primary);
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
        // The servers' settings, as the primary (else the first to answer)
        // runs them.
        let mut current: BTreeMap<String, String> = BTreeMap::new();
        for l in looks {
            let server = memory.servers.entry(l.pod.clone()).or_default();
            server.scan = l.scan;
            let result = if l.sample.is_ok() { "ok" } else { "failed" };
            self.ctx
                .metrics
                .tuning_looks
                .with_label_values(&[result])
                .inc();
            match l.sample {
                Ok(mut cur) => {
                    cur.memory_limit = facts
                        .iter()
                        .find(|f| f.name == l.pod)
                        .and_then(|f| f.mem_limit_applied.or(f.mem_limit));
                    if current.is_empty() || Some(l.pod.as_str()) == primary {
                        current = cur.config.clone();
                    }
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
        let now = Timestamp::now();
        let new = merge(&old, &verdicts, &pods, now);
        self.tuning_events(&old, &new).await;
        let status = self.apply_advice(&new, &current, now).await;
        Tuning {
            insights: Some(new),
            status,
        }
    }

    /// `spec.tuning`: records the settings to apply for this look's
    /// findings (set live by the next pass's live configuration, which
    /// comes soon), and clears those whose finding went.
    async fn apply_advice(
        &mut self,
        insights: &[Insight],
        current: &BTreeMap<String, String>,
        now: Timestamp,
    ) -> Option<TuningStatus> {
        let apply = self
            .redis
            .spec
            .tuning
            .as_ref()
            .map(|t| t.apply.clone())
            .unwrap_or_default();
        let old = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.tuning.clone())
            .unwrap_or_default();
        if apply.is_empty() && old.applied.is_empty() {
            return None;
        }
        let (records, added) = plan_applied(
            &old.applied,
            insights,
            &apply,
            &self.redis.spec.config,
            current,
            now,
        );
        for a in &added {
            let note = format!(
                "{} {} -> {} for {} (spec.tuning.apply); set live on every instance next",
                a.key, a.from, a.to, a.before
            );
            self.event(EventType::Normal, "TuningApplied", "Tune", note)
                .await;
        }
        if !added.is_empty() {
            self.report
                .recheck_in(crate::controller::queue::PROGRESS_REQUEUE);
        }
        (records != old.applied).then_some(TuningStatus { applied: records })
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

    /// `status.tuning`: this pass's records (else the last ones), with the
    /// settings a server refused this pass marked.
    pub(super) fn tuning_for_status(
        &self,
        tuning: &mut Tuning,
        refused: Vec<(String, String, String)>,
    ) -> Option<TuningStatus> {
        let mut t = tuning
            .status
            .take()
            .or_else(|| self.redis.status.as_ref().and_then(|s| s.tuning.clone()));
        for (key, value, message) in refused {
            if let Some(t) = t.as_mut() {
                mark_refused(&mut t.applied, &key, &value, &message);
            }
        }
        t
    }

    /// The findings for the status: this pass's look, else the last ones.
    pub(super) fn insights_for_status(&self, tuning: &mut Tuning) -> Vec<Insight> {
        match tuning.insights.take() {
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
    use crate::api::v1alpha1::Redis;
    use crate::controller::redis::conf::tuned_settings;

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

    fn near_max(pod: &str, value: &str) -> Insight {
        Insight {
            rule: "clients-near-max".into(),
            severity: "warning".into(),
            instance: pod.into(),
            evidence: "27 clients connected of maxclients 30 (90%)".into(),
            advice: "raise maxclients".into(),
            config_key: Some("maxclients".into()),
            config_value: Some(value.into()),
            since: Time(at(0)),
            observed: Time(at(0)),
        }
    }

    #[test]
    fn advice_is_applied_once_recorded_and_cleared_when_the_finding_goes() {
        let apply = [TunableRule::ClientsNearMax];
        let current = BTreeMap::from([("maxclients".to_string(), "30".to_string())]);
        let user = BTreeMap::new();
        // Two instances with the finding: one record.
        let findings = [near_max("c-0", "60"), near_max("c-1", "60")];
        let (records, added) = plan_applied(&[], &findings, &apply, &user, &current, at(0));
        assert_eq!(added.len(), 1);
        assert_eq!(records, added);
        let a = &records[0];
        assert_eq!(
            (
                a.key.as_str(),
                a.from.as_str(),
                a.to.as_str(),
                a.state.as_str()
            ),
            ("maxclients", "30", "60", APPLIED)
        );
        assert!(
            a.before.starts_with("clients-near-max on c-0: 27 clients"),
            "{}",
            a.before
        );
        // The same advice again: nothing new.
        let (again, added) = plan_applied(&records, &findings, &apply, &user, &current, at(60));
        assert!(added.is_empty());
        assert_eq!(again, records);
        // Still near the limit at 60 a minute later: not doubled again
        // within the hour; after it, it is.
        let higher = [near_max("c-0", "120")];
        let (_, added) = plan_applied(&records, &higher, &apply, &user, &current, at(600));
        assert!(added.is_empty());
        let (later, added) = plan_applied(&records, &higher, &apply, &user, &current, at(3600));
        assert_eq!(added.len(), 1);
        assert_eq!(later.len(), 2);
        // The finding went: cleared, still in effect.
        let (cleared, _) = plan_applied(&later, &[], &apply, &user, &current, at(3700));
        assert!(cleared.iter().all(|a| a.state == CLEARED), "{cleared:?}");
        let mut r = Redis::new("cache", Default::default());
        r.status = Some(crate::api::v1alpha1::RedisStatus {
            tuning: Some(TuningStatus { applied: cleared }),
            ..Default::default()
        });
        assert_eq!(
            tuned_settings(&r),
            vec![("maxclients".to_string(), "120".to_string())]
        );
        // The user's spec.config wins.
        r.spec.config.insert("maxclients".into(), "50".into());
        assert!(tuned_settings(&r).is_empty());
    }

    #[test]
    fn a_rule_not_listed_or_a_key_the_user_sets_is_left_alone() {
        let current = BTreeMap::new();
        let findings = [near_max("c-0", "60")];
        let (r, _) = plan_applied(
            &[],
            &findings,
            &[TunableRule::FullResyncs],
            &BTreeMap::new(),
            &current,
            at(0),
        );
        assert!(r.is_empty());
        let user = BTreeMap::from([("maxclients".to_string(), "30".to_string())]);
        let (r, _) = plan_applied(
            &[],
            &findings,
            &[TunableRule::ClientsNearMax],
            &user,
            &current,
            at(0),
        );
        assert!(r.is_empty());
    }

    #[test]
    fn a_refused_value_is_not_in_effect_and_not_tried_again() {
        let apply = [TunableRule::ClientsNearMax];
        let current = BTreeMap::new();
        let user = BTreeMap::new();
        let findings = [near_max("c-0", "60")];
        let (mut records, _) = plan_applied(&[], &findings, &apply, &user, &current, at(0));
        mark_refused(
            &mut records,
            "maxclients",
            "60",
            "c-0 rejected CONFIG SET: ERR no",
        );
        assert_eq!(records[0].state, REFUSED);
        let mut r = Redis::new("cache", Default::default());
        r.status = Some(crate::api::v1alpha1::RedisStatus {
            tuning: Some(TuningStatus {
                applied: records.clone(),
            }),
            ..Default::default()
        });
        assert!(tuned_settings(&r).is_empty());
        let (again, added) = plan_applied(&records, &findings, &apply, &user, &current, at(7200));
        assert!(added.is_empty());
        assert_eq!(again, records);
    }

    fn server(name: &str, role: Role) -> PodFacts {
        PodFacts {
            name: name.into(),
            role: Some(role),
            ..Default::default()
        }
    }

    #[test]
    fn keys_are_sampled_on_a_replica_of_every_shard_else_its_primary() {
        use crate::controller::names::Names;
        use crate::controller::redis::cluster::build::shard_of;
        let names = Names::new("cache");
        let shard = |p: &str| shard_of(&names, p).map(|(s, _)| s);
        // Shard 0 with two replicas, shard 1 without, shard 2 whose
        // replica was listed first.
        let facts = [
            server("cache-s0-0", Role::Primary),
            server("cache-s0-1", Role::Replica),
            server("cache-s0-2", Role::Replica),
            server("cache-s1-0", Role::Primary),
            server("cache-s2-1", Role::Replica),
            server("cache-s2-0", Role::Primary),
        ];
        let got: Vec<String> = samplers(&facts, None, shard).into_iter().collect();
        assert_eq!(got, ["cache-s0-1", "cache-s1-0", "cache-s2-1"]);
        // Replication: one group; the primary named by the status counts
        // even before its role is read.
        let facts = [
            PodFacts {
                name: "cache-0".into(),
                ..Default::default()
            },
            server("cache-1", Role::Replica),
        ];
        let got: Vec<String> = samplers(&facts, Some("cache-0"), |_| None)
            .into_iter()
            .collect();
        assert_eq!(got, ["cache-1"]);
        let got: Vec<String> = samplers(&facts[..1], Some("cache-0"), |_| None)
            .into_iter()
            .collect();
        assert_eq!(got, ["cache-0"], "a Standalone's only server");
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
