//! Failover: replacing a lost primary, and planned switchovers on request
//! (`spec.failover`).
//!
//! Detection is the monitor's ([`crate::controller::monitor`]): it asks for
//! a reconcile as soon as the primary stops answering, and this module
//! decides with what the pass observed ([`decide`], pure, table-tested):
//! - the primary's server is **down** (nothing listens), **restarted**
//!   (it answers as a replica: instances boot as replicas) or **gone** (its
//!   pod was deleted or re-created): it is replaced at once;
//! - its pod is **being deleted** while it serves (a drain, an eviction):
//!   it is handed over by a switchover to an in-sync replica while the
//!   pod's `preStop` hook holds the server's shutdown (see
//!   `statefulset::handover_script`): nothing is lost, and the write gap is
//!   a switchover's;
//! - it is **silent**: replaced only once it has been silent for
//!   `maxLagSeconds + 3` s. By then a primary that is alive but cut off has
//!   fenced itself ([`fencing_config`]): it refuses writes and has dropped
//!   its replicas once none acknowledged for `maxLagSeconds` (the server
//!   counts whole seconds and checks once a second, hence 2 s of margin; a
//!   third covers the probe interval). A primary that is merely slow for
//!   less than that is left alone, and so is one that answers a last
//!   direct look (up to 1 s) taken before it is replaced;
//! - never while a replica still hears from it (a link up with recent
//!   traffic): then only the operator is cut off, not the clients.
//!
//! Promotion takes the replica whose link was up most recently and, among
//! those, the highest replication offset. The intent is recorded first;
//! then `REPLICAOF NO ONE`; then the new primary is published (role labels,
//! which the read-write Service selects on; the ConfigMap instances start
//! from; `status.primary` and `status.lastFailover`) before the other
//! replicas are re-pointed. The old primary, when it returns, boots as a
//! replica and is wired to the new one by [`super::wiring`].
//!
//! Length: ~440 lines of code: detection verdicts, the decision table and
//! the promotion sequence stay in one module (the recovery module);
//! `decide` is pure and table-tested in `failover/tests.rs`.

use std::time::Duration;

use kube::runtime::events::EventType;

use super::Reconciler;
use super::conf::fencing_config;
use super::facts::{PodFacts, Role, ordinal};
use crate::api::v1alpha1::{FailoverRecord, FailoverSpec, FailoverTimeline, Mode};
use crate::controller::monitor::{Health, Target, Verdict};
use crate::controller::names::{self, Names};
use crate::redis::{ConnectOptions, Endpoint};

/// Whether a replica whose last byte from the primary is `age` seconds old
/// may still be acknowledging it, and so keeping its write fence open: the
/// primary pings every second and counts a replica as good while its last
/// acknowledgement is at most `maxLagSeconds` old (see [`fencing_config`]).
pub fn live_link(age: i64, spec: &FailoverSpec) -> bool {
    age <= i64::from(spec.max_lag_seconds.clamp(2, 60))
}

/// How long the last look at a silent primary may take.
const LAST_LOOK: Duration = Duration::from_secs(1);

/// Replicas whose links went down within this many seconds of the most
/// recent one count as equally recent.
const RECENCY_SLACK_SECS: i64 = 2;

/// How long a primary may be silent before it is replaced.
pub fn silence_bound(spec: &FailoverSpec) -> Duration {
    Duration::from_secs(spec.max_lag_seconds.clamp(2, 60) as u64 + 3)
}

/// Why the primary is being replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Nothing listens on its address.
    Down,
    /// It answers as a replica (restarted in place).
    Restarted,
    /// Its pod is gone, or re-created and not yet serving.
    Gone,
    /// Silent for longer than the bound.
    Unresponsive,
    /// Its pod was deleted while it served: handed over to an in-sync
    /// replica by a switchover (nothing lost).
    Deleted,
}

impl Loss {
    /// The reason recorded in the status and events.
    pub fn reason(self) -> &'static str {
        match self {
            Loss::Down => "PrimaryDown",
            Loss::Restarted => "PrimaryRestarted",
            Loss::Gone => "PrimaryGone",
            Loss::Unresponsive => "PrimaryUnresponsive",
            Loss::Deleted => "PrimaryPodDeleted",
        }
    }
}

/// What to do about the recorded primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It serves (or nothing can be said yet): nothing to do here.
    Serving,
    /// Not serving; waiting, for the reason given.
    Wait(String),
    /// Lost and not replaceable: automatic failover is off, or no replica
    /// can take over. Reported as Degraded.
    Blocked(String),
    /// The primary's pod is being deleted while it still serves: move the
    /// primary to `to` now, as a switchover (writes paused while `to`
    /// catches up, nothing lost), while the pod's `preStop` hook holds the
    /// server's shutdown until it is no longer primary.
    Handover {
        /// The in-sync replica to take over.
        to: String,
    },
    /// Promote `candidate`.
    Promote {
        /// The instance to promote.
        candidate: String,
        /// Why the primary is replaced.
        loss: Loss,
    },
}

/// Decides about the recorded `primary`. `health` is the monitor's view of
/// it (when it watches that pod).
pub fn decide(
    facts: &[PodFacts],
    primary: &str,
    health: Option<&Health>,
    spec: &FailoverSpec,
    names: &Names,
) -> Decision {
    let pf = facts.iter().find(|f| f.name == primary);
    let loss = match pf {
        Some(f) if f.reachable && f.role == Some(Role::Primary) => {
            if f.terminating {
                // Its pod is being deleted (a drain, an eviction, a user):
                // the hook holds the shutdown while a replica takes over.
                // Without automatic failover, or with no in-sync replica,
                // it lets its replicas catch up, exits, and is replaced
                // once nothing listens.
                if spec.enabled
                    && let Some(to) = super::plan::best_replica(facts, |r| r.name != primary)
                {
                    return Decision::Handover { to };
                }
                return Decision::Wait(format!("primary {primary} is shutting down"));
            }
            return Decision::Serving;
        }
        None => Loss::Gone,
        Some(f) if f.ip.is_none() => Loss::Gone,
        Some(f) if f.reachable => Loss::Restarted,
        Some(f) => match health.filter(|h| h.pod == primary && f.ip.as_deref() == Some(&h.ip)) {
            Some(h) if h.verdict == Verdict::Down => Loss::Down,
            Some(h) if h.verdict == Verdict::Restarted => Loss::Restarted,
            Some(h) if h.verdict == Verdict::Healthy => return Decision::Serving,
            Some(h) if h.silent_for >= silence_bound(spec) => Loss::Unresponsive,
            Some(h) => {
                return Decision::Wait(format!(
                    "primary {primary} has not answered for {:.1}s; it is replaced after {}s \
                     of silence (spec.failover.maxLagSeconds + 3)",
                    h.silent_for.as_secs_f64(),
                    silence_bound(spec).as_secs()
                ));
            }
            None => return Decision::Wait(format!("watching primary {primary}")),
        },
    };
    let primary_ip = pf.and_then(|f| f.ip.as_deref());
    if let Some(r) = facts
        .iter()
        .find(|f| primary_ip.is_some_and(|ip| hears_from(f, ip, spec)))
    {
        return Decision::Wait(format!(
            "primary {primary} does not answer the operator, but replica {} still hears from it",
            r.name
        ));
    }
    // A silent primary may be alive beyond the operator's reach, serving
    // the clients on its side. It has fenced itself only if no replica
    // acknowledges it; a replica the operator cannot see may be doing just
    // that (a partition that leaves the primary and some replicas on the
    // other side), and promoting then makes two primaries that both take
    // writes. So with the fence on, a silent primary is replaced only when
    // every other instance answers the operator and none still hears from
    // it: then the old primary has no replica left and refuses writes.
    if loss == Loss::Unresponsive && spec.fence {
        let unseen: Vec<&str> = facts
            .iter()
            .filter(|f| f.name != primary && f.ip.is_some() && !f.reachable)
            .map(|f| f.name.as_str())
            .collect();
        if !unseen.is_empty() {
            return Decision::Wait(format!(
                "primary {primary} does not answer the operator, and neither does {}: \
                 they may still acknowledge it and keep its write fence open, so promoting \
                 now could leave two primaries taking writes; waiting until they answer \
                 or are gone",
                unseen.join(", ")
            ));
        }
    }
    if !spec.enabled {
        // The user named the instance to promote.
        if let Some(t) = spec.switchover_to.as_deref()
            && t != primary
            && facts.iter().any(|f| {
                f.name == t && f.reachable && !f.terminating && f.role == Some(Role::Replica)
            })
        {
            return Decision::Promote {
                candidate: t.to_string(),
                loss,
            };
        }
        // Bringing the same server back is no failover: allowed when it
        // lost nothing (its offset is not behind any replica's).
        if loss == Loss::Restarted
            && let Some(p) = pf
            && facts
                .iter()
                .filter(|f| f.reachable && f.name != primary)
                .all(|f| f.offset.unwrap_or(0) <= p.offset.unwrap_or(0))
        {
            return Decision::Promote {
                candidate: primary.to_string(),
                loss,
            };
        }
        return Decision::Blocked(format!(
            "primary {primary} is lost ({}) and automatic failover is off \
             (spec.failover.enabled: false); name the instance to promote in \
             spec.failover.switchoverTo",
            loss.reason()
        ));
    }
    match candidate(facts, primary, names) {
        // The lost primary itself, restarted in place, is brought back only
        // when every other instance with an address answers: one that does
        // not (cut off, stopped) may hold writes the restarted server lacks
        // (a server without persistence comes back empty), and would wipe
        // them copying from it once it is back. Waiting keeps them: the
        // restarted server boots following nothing, so that instance keeps
        // its data until the operator sees it and promotes it (chaos seed
        // 423: a kill -9 of the primary as its only replica was cut off).
        Some(candidate) if candidate == primary => {
            let unseen: Vec<&str> = facts
                .iter()
                .filter(|f| f.name != primary && f.ip.is_some() && !f.reachable)
                .map(|f| f.name.as_str())
                .collect();
            // Nor while another instance answers further ahead than it (a
            // replica in the middle of being re-pointed, say): promoting
            // the restarted one would have that instance copy from it and
            // drop what it holds (the shrunk schedule of seed 423: the
            // primary's pod deleted as the old primary, back from a cut
            // with every write, was being re-pointed to it).
            let own = pf.and_then(|f| f.offset).unwrap_or(0);
            let ahead: Vec<String> = facts
                .iter()
                .filter(|f| f.name != primary && f.reachable && f.offset.unwrap_or(0) > own)
                .map(|f| format!("{} at offset {}", f.name, f.offset.unwrap_or(0)))
                .collect();
            // One of them still a primary (an old primary back from a cut,
            // never demoted): it holds the data, and takes over as it is.
            let stale_primary = facts
                .iter()
                .filter(|f| f.name != primary && f.reachable && !f.terminating)
                .filter(|f| f.role == Some(Role::Primary) && f.offset.unwrap_or(0) > own)
                .max_by_key(|f| f.offset.unwrap_or(0));
            if let Some(f) = stale_primary {
                Decision::Promote {
                    candidate: f.name.clone(),
                    loss,
                }
            } else if !ahead.is_empty() {
                Decision::Wait(format!(
                    "primary {primary} is lost ({}) and came back at offset {own}, behind {}; \
                     waiting until that instance can take over rather than lose what it holds",
                    loss.reason(),
                    ahead.join(", ")
                ))
            } else if unseen.is_empty() {
                Decision::Promote { candidate, loss }
            } else {
                Decision::Wait(format!(
                    "primary {primary} is lost ({}) and only it could take over again, while {} \
                     does not answer and may hold writes it lacks; waiting until {} answers or \
                     is gone",
                    loss.reason(),
                    unseen.join(", "),
                    if unseen.len() == 1 { "it" } else { "they" }
                ))
            }
        }
        Some(candidate) => Decision::Promote { candidate, loss },
        None => Decision::Blocked(format!(
            "primary {primary} is lost ({}) and no replica can take over \
             (none answers with a complete dataset)",
            loss.reason()
        )),
    }
}

/// The replica to promote in place of `primary`: among reachable replicas
/// not in a full sync, those whose link was up most recently (within
/// [`RECENCY_SLACK_SECS`] of the most recent), then the highest offset,
/// then the lowest ordinal. The old primary itself only when no replica
/// qualifies (it restarted in place, with whatever it persisted).
pub fn candidate(facts: &[PodFacts], primary: &str, names: &Names) -> Option<String> {
    let usable = |f: &&PodFacts| {
        f.reachable && !f.terminating && !f.syncing && f.role == Some(Role::Replica)
    };
    let replicas: Vec<&PodFacts> = facts
        .iter()
        .filter(usable)
        .filter(|f| f.name != primary)
        .collect();
    let age = |f: &PodFacts| f.link_age.unwrap_or(i64::MAX);
    let freshest = replicas.iter().map(|f| age(f)).min();
    let best = replicas
        .iter()
        .filter(|f| freshest.is_some_and(|m| age(f) <= m.saturating_add(RECENCY_SLACK_SECS)))
        .max_by_key(|f| {
            (
                f.offset.unwrap_or(0),
                std::cmp::Reverse(ordinal(&f.name, names).unwrap_or(i32::MAX)),
            )
        });
    match best {
        Some(f) => Some(f.name.clone()),
        None => facts
            .iter()
            .filter(usable)
            .find(|f| f.name == primary)
            .map(|f| f.name.clone()),
    }
}

/// A last direct look at a primary silent for the bound, before it is
/// replaced: a server that was paused (a stopped process, a long command)
/// answers as soon as it runs again, possibly before the monitor's next
/// probe. A primary that is truly lost is replaced at most [`LAST_LOOK`]
/// later.
async fn answers_late(health: Option<&Health>, opts: &ConnectOptions) -> bool {
    let Some(h) = health else { return false };
    let ep = Endpoint::new(&h.ip, names::REDIS_PORT);
    crate::controller::monitor::answers_as_primary(&ep, opts, LAST_LOOK).await
}

/// Whether every other instance answered this pass as a replica of
/// `primary` (at `ip`) with a live link to it: they hear from it every
/// second, so the monitor may probe it at its calm rate (see
/// `monitor::CALM_INTERVAL`). Any instance unseen, elsewhere or with a
/// stale link, and the monitor probes at its full rate.
pub fn replicas_hear(facts: &[PodFacts], primary: &str, ip: &str, spec: &FailoverSpec) -> bool {
    let others: Vec<&PodFacts> = facts.iter().filter(|f| f.name != primary).collect();
    !others.is_empty()
        && others
            .iter()
            .all(|f| !f.terminating && hears_from(f, ip, spec))
}

/// Whether instance `f` answered this pass as a replica of the primary at
/// `ip` whose link to it is up and fresh (within the lag bound).
fn hears_from(f: &PodFacts, ip: &str, spec: &FailoverSpec) -> bool {
    f.reachable
        && f.role == Some(Role::Replica)
        && f.link_up == Some(true)
        && f.link_age.is_some_and(|a| live_link(a, spec))
        && f.following.as_deref() == Some(ip)
}

impl Reconciler {
    /// Keeps the monitor on the recorded primary of a Replication with more
    /// than one instance (failure detection), and on the primary of any
    /// Redis whose memory autopilot is on (its memory samples: a Standalone
    /// filling up is caught within a probe, not at the next reconcile);
    /// stops it otherwise.
    pub(super) fn watch_primary(&self, facts: &[PodFacts], primary: Option<&str>, password: &str) {
        let monitor = &self.ctx.monitor;
        let spec = &self.redis.spec;
        let autopilot = spec.memory_autopilot().is_some();
        let watched =
            (spec.mode() == Mode::Replication && spec.desired_instances() >= 2) || autopilot;
        let Some(p) = primary.filter(|_| watched && !password.is_empty()) else {
            monitor.unwatch(&self.oref);
            return;
        };
        // A primary whose pod is gone or lost its address keeps being
        // watched at the old one, which then reports it down, but without
        // the password: the address may be another pod's by now.
        let (ip, authenticate) = match facts
            .iter()
            .find(|f| f.name == p)
            .and_then(|f| f.ip.clone())
        {
            Some(ip) => (ip, true),
            None => match monitor.health(&self.oref).filter(|h| h.pod == p) {
                Some(h) => (h.ip, false),
                None => return,
            },
        };
        let tls = self.tls_options_for(&ip);
        let calm = !autopilot && authenticate && replicas_hear(facts, p, &ip, &spec.failover());
        monitor.watch(
            &self.oref,
            Target {
                pod: p.to_string(),
                ip,
                port: names::REDIS_PORT,
                silence: silence_bound(&spec.failover()),
                password: password.to_string(),
                tls,
                authenticate,
                follows_source: super::facts::SourceAddress::of(&self.redis).is_some(),
                calm,
                replicas: facts.iter().filter(|f| f.name != p).count(),
            },
        );
    }

    /// Cluster mode: with the memory or the shard autopilot on, the
    /// monitor samples every shard's primary (a fill on any shard is caught
    /// within a probe) and asks for a pass when one stops answering; with
    /// neither, nothing is watched.
    pub(super) fn watch_shard_primaries(
        &self,
        facts: &[PodFacts],
        primaries: &[(usize, &str)],
        password: &str,
    ) {
        let monitor = &self.ctx.monitor;
        let spec = &self.redis.spec;
        let autopilot = spec.memory_autopilot().is_some() || spec.shard_autopilot().is_some();
        if !autopilot || password.is_empty() {
            monitor.unwatch(&self.oref);
            return;
        }
        for (shard, pod) in primaries {
            let Some(ip) = facts
                .iter()
                .find(|f| f.name == *pod)
                .and_then(|f| f.ip.clone())
            else {
                continue;
            };
            let tls = self.tls_options_for(&ip);
            monitor.watch_at(
                &self.oref,
                *shard,
                Target {
                    pod: pod.to_string(),
                    ip,
                    port: names::REDIS_PORT,
                    silence: silence_bound(&spec.failover()),
                    password: password.to_string(),
                    tls,
                    authenticate: true,
                    follows_source: false,
                    calm: false,
                    replicas: 0,
                },
            );
        }
        monitor.unwatch_from(
            &self.oref,
            usize::try_from(spec.desired_shards()).unwrap_or(0),
        );
    }

    /// Replaces the recorded `primary` when [`decide`] says so. Returns
    /// true when the pass must end here (a primary was promoted: what was
    /// observed is stale), false to go on.
    pub(super) async fn fail_over(
        &mut self,
        facts: &[PodFacts],
        primary: &str,
        opts: &ConnectOptions,
    ) -> bool {
        let health = self.ctx.monitor.health(&self.oref);
        let spec = self.redis.spec.failover();
        match decide(facts, primary, health.as_ref(), &spec, &self.names) {
            Decision::Serving => false,
            Decision::Wait(why) => {
                self.report.progress(why);
                self.report.waiting("FailoverPending");
                false
            }
            Decision::Blocked(why) => {
                self.report_failure("PrimaryLost", "Failover", "failover", why)
                    .await;
                false
            }
            Decision::Handover { to } => self.hand_over(facts, primary, &to, opts).await,
            Decision::Promote {
                loss: Loss::Unresponsive,
                ..
            } if answers_late(health.as_ref(), opts).await => {
                self.report.progress(format!(
                    "primary {primary} was silent for the bound but answers again: slow, not lost"
                ));
                self.report.waiting("FailoverPending");
                false
            }
            Decision::Promote { candidate, loss } => {
                self.promote(facts, primary, &candidate, loss, opts).await;
                true
            }
        }
    }

    /// Moves the primary off a pod being deleted: a switchover to `to`,
    /// then the role labels at once (the read-write Service follows them),
    /// then the record. True when the primary moved.
    async fn hand_over(
        &mut self,
        facts: &[PodFacts],
        old: &str,
        to: &str,
        opts: &ConnectOptions,
    ) -> bool {
        let started = std::time::Instant::now();
        let candidates: Vec<String> = facts
            .iter()
            .filter(|f| f.reachable && f.name != to && f.name != old)
            .map(|f| format!("{}={}", f.name, f.offset.unwrap_or(0)))
            .collect();
        let Some(report) = self
            .switchover(facts, old, to, opts, "its pod is being deleted")
            .await
        else {
            return false;
        };
        let switched = started.elapsed();
        let after = self.relabel(facts, old, Some(Role::Replica), to).await;
        let labelled = started.elapsed();
        let record = record(
            old,
            to,
            Loss::Deleted,
            report.offset,
            candidates,
            FailoverTimeline {
                noticed_ms: None,
                silent_ms: None,
                promote_ms: ms(switched),
                labels_ms: ms(labelled),
            },
        );
        if let Err(e) = self.publish_failover(&after, to, &record).await {
            self.report
                .progress(format!("recording new primary {to}: {e}"));
        }
        self.count_failover("handed_over");
        tracing::info!(redis = %self.oref, from = old, to, offset = report.offset,
            write_pause_ms = report.write_pause.as_millis() as u64,
            labelled_ms = labelled.as_millis() as u64, "primary handed over from a pod being deleted");
        true
    }

    async fn promote(
        &mut self,
        facts: &[PodFacts],
        old: &str,
        to: &str,
        loss: Loss,
        opts: &ConnectOptions,
    ) {
        let started = std::time::Instant::now();
        // The monitor's view of the lost primary now (the decision's view
        // may be older by a last probe of a silent one), when it is the one
        // watched and was heard (not a pod made anew at another address).
        let health = self.ctx.monitor.health(&self.oref);
        let seen = health.as_ref().filter(|h| h.pod == old && h.answered);
        let Some(chosen) = facts.iter().find(|f| f.name == to) else {
            return;
        };
        let Some(ip) = chosen.ip.clone() else { return };
        let offset = chosen.offset.unwrap_or(0);
        let candidates: Vec<String> = facts
            .iter()
            .filter(|f| f.reachable && f.name != to)
            .map(|f| format!("{}={}", f.name, f.offset.unwrap_or(0)))
            .collect();
        if let Err(e) = self.record_intent(to).await {
            self.report
                .progress(format!("recording the promotion of {to}: {e}"));
            return;
        }
        let ep = Endpoint::new(&ip, names::REDIS_PORT);
        let fence = fencing_config(&self.redis);
        if let Err(e) = self.make_primary(&ep, opts, &fence).await {
            self.count_failover("error");
            self.data_plane_failed(format!("promoting {to}"), &e).await;
            return;
        }
        let promoted = started.elapsed();
        crate::failpoint::hit("after-promote");
        // Publish before anything else moves: the role labels (the
        // read-write Service), the ConfigMap, the status.
        let after = self.relabel(facts, old, None, to).await;
        let labelled = started.elapsed();
        let record = record(
            old,
            to,
            loss,
            offset,
            candidates.clone(),
            FailoverTimeline {
                noticed_ms: seen.and_then(|h| h.noticed_after).map(ms),
                silent_ms: seen.map(|h| ms(h.since_answer)),
                promote_ms: ms(promoted),
                labels_ms: ms(labelled),
            },
        );
        if let Err(e) = self.publish_failover(&after, to, &record).await {
            self.report
                .progress(format!("recording new primary {to}: {e}"));
        }
        let published = started.elapsed();
        // Then the other replicas follow it.
        self.wire(&after, to, opts).await;
        self.count_failover("promoted");
        tracing::info!(redis = %self.oref, from = old, to, reason = loss.reason(), offset,
            published_ms = published.as_millis() as u64, "failed over");
        let others = if candidates.is_empty() {
            String::new()
        } else {
            format!("; others: {}", candidates.join(", "))
        };
        let heard = match &record.timeline {
            Some(FailoverTimeline {
                silent_ms: Some(silent),
                noticed_ms,
                ..
            }) => format!(
                "; its last answer {silent} ms before the promotion{}",
                noticed_ms
                    .map(|n| format!(" (found failing {n} ms after it)"))
                    .unwrap_or_default()
            ),
            _ => String::new(),
        };
        self.event(
            EventType::Warning,
            "FailedOver",
            "Failover",
            format!(
                "primary {old} lost ({}); promoted {to} at offset {offset}{others}; \
                 published in {} ms{heard}",
                loss.reason(),
                published.as_millis()
            ),
        )
        .await;
        self.report
            .progress(format!("failed over from {old} to {to}"));
    }

    /// The facts as they are once `to` is the primary and `old` has
    /// `old_role` (a replica after a handover; unknown after a loss), with
    /// the role labels written from them: the read-write Service follows.
    async fn relabel(
        &mut self,
        facts: &[PodFacts],
        old: &str,
        old_role: Option<Role>,
        to: &str,
    ) -> Vec<PodFacts> {
        let mut after: Vec<PodFacts> = facts.to_vec();
        for f in after.iter_mut() {
            if f.name == to {
                f.role = Some(Role::Primary);
            } else if f.name == old {
                f.role = old_role;
            }
        }
        if let Err(e) = self.label_roles(&after, Some(to)).await {
            self.report
                .progress(format!("labelling new primary {to}: {e}"));
        }
        after
    }

    fn count_failover(&self, result: &str) {
        self.ctx
            .metrics
            .failovers
            .with_label_values(&[result])
            .inc();
    }
}

/// Milliseconds, for the failover timeline.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `status.lastFailover` record of a primary moved from `old` to `to`
/// now (the role labels were just written).
fn record(
    old: &str,
    to: &str,
    loss: Loss,
    offset: i64,
    candidates: Vec<String>,
    timeline: FailoverTimeline,
) -> FailoverRecord {
    FailoverRecord {
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        from: old.to_string(),
        to: to.to_string(),
        reason: loss.reason().to_string(),
        offset,
        candidates,
        timeline: Some(timeline),
    }
}

#[cfg(test)]
mod tests;
