//! Following a Redis outside this one (`spec.replicaOf`), the promotion
//! off it, and the hold of a Redis whose primary was demoted from outside.
//!
//! - **Follow**: the primary (as the operator records it) replicates from
//!   the source; the replicas from the primary, as always. The primary is
//!   pointed at the source only after [`judge`] has compared the two
//!   histories; until then, and whenever the source is lost (the
//!   [`crate::controller::source_watch`] fences it within a probe), it
//!   follows the fence (`layout::SOURCE_FENCE_PORT`): it keeps its data,
//!   refuses writes, and its replicas keep following it. Every promotion
//!   inside the Redis (failover, first primary, switchover) makes the new
//!   primary follow the fence, and the next pass points it at the source.
//! - **Promote** (`spec.replicaOf` removed, the source recorded in
//!   `status.replicaOf`): planned when the source answers and the primary
//!   streams from it: the source's writes are paused (`CLIENT PAUSE WRITE`,
//!   which it lifts by itself after [`PAUSE_MS`]), the primary catches up
//!   with the source's final offset, the source is made a replica of the
//!   fence (read-only, held writes are answered `READONLY` when the pause
//!   ends), then the primary is promoted. Unplanned otherwise: the primary
//!   is promoted with what it has, and how far behind it was is recorded.
//!   Each step can be interrupted: the next pass finds the source paused
//!   (the pause ends on its own), fenced (the promotion goes on), or the
//!   primary promoted (only the record is left to write).
//! - **Demoted**: a Redis without `spec.replicaOf` whose primary follows
//!   the fence was demoted by a Redis that followed it and was promoted. It
//!   never takes writes again on its own: the status records it and the
//!   failover and first-primary steps hold until `spec.replicaOf` points it
//!   at the new primary or the annotation [`TAKE_WRITES_ANNOTATION`]
//!   carries the recorded time.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::auth::ServerAuth;
use super::facts::{PodFacts, Role, SourceAddress};
use super::{Error, Reconciler};
use crate::api::v1alpha1::{PromotionStatus, ReplicaOfStatus};
use crate::controller::layout::{BOOT_FENCE_HOST, BOOT_FENCE_PORT, SOURCE_FENCE_PORT};
use crate::controller::names::{self, OPERATOR_USER, PASSWORD_KEY, stable_hash};
use crate::controller::source_watch::SourceTarget;
use crate::controller::trust::{ALLOW_USE_LABEL, ALLOW_USE_VALUE};
use crate::redis::info::Info;
use crate::redis::{ConnectOptions, Endpoint, Node};

/// Annotation naming the run id of a source that came back empty: the
/// primary may resynchronise from it (and be emptied).
pub const ACCEPT_RESET_ANNOTATION: &str = "redpilot.io/accept-source-reset";
/// Annotation carrying `status.demoted`: the Redis may take writes again.
pub const TAKE_WRITES_ANNOTATION: &str = "redpilot.io/take-writes";
/// The key of the source's user name in its Secret.
pub const USERNAME_KEY: &str = "username";
/// How long a planned promotion pauses the source's writes at most (the
/// source lifts the pause by itself after it).
pub const PAUSE_MS: u64 = 10_000;
/// How long a planned promotion waits for the primary to catch up.
const CATCH_UP: Duration = Duration::from_secs(5);
/// A planned promotion pauses the source's writes only once the primary is
/// this close (bytes), so the pause is short.
const MAX_LAG_TO_PAUSE: i64 = 1 << 20;
/// After its own promotion, a Redis does not read a fenced instance as a
/// demotion for this long (seconds).
const PROMOTION_GRACE_SECS: i64 = 120;
/// Lag figures in `status.replicaOf` are refreshed at most this often
/// while nothing else changes.
const LAG_REFRESH_SECS: i64 = 30;

/// One side's replication history, as `INFO` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// `master_replid`.
    pub replid: Option<String>,
    /// `master_replid2`.
    pub replid2: Option<String>,
    /// `master_repl_offset`.
    pub offset: i64,
    /// `second_repl_offset` (-1 when none).
    pub second_offset: i64,
    /// Keys held.
    pub keys: u64,
}

impl History {
    fn of(info: &Info) -> Self {
        let r = &info.replication;
        History {
            replid: r.replid.clone().filter(|s| !s.is_empty()),
            replid2: r
                .replid2
                .clone()
                .filter(|s| !s.is_empty() && s.chars().any(|c| c != '0')),
            offset: r.repl_offset.unwrap_or(0),
            second_offset: r.second_repl_offset.unwrap_or(-1),
            keys: info.total_keys(),
        }
    }
}

/// What following the source would do to the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The source continues the primary's history (the same one, at or past
    /// its offset, or one promoted from it before the primary's offset):
    /// a partial resynchronisation, nothing lost.
    Continues,
    /// The primary holds no key: nothing to lose.
    Empty,
    /// Another history with keys: the primary is replaced by the source's
    /// dataset. `ahead` is how many bytes of writes the primary had past
    /// the point the two parted, when that is known.
    Diverged {
        /// See above.
        ahead: Option<i64>,
    },
    /// The source holds no key and the primary does: following would wipe
    /// it (a source restarted empty).
    SourceEmpty,
}

/// Compares the primary's history with the source's.
pub fn judge(primary: &History, source: &History) -> Judgement {
    if let Some(id) = primary.replid.as_deref() {
        if source.replid.as_deref() == Some(id) && source.offset >= primary.offset {
            return Judgement::Continues;
        }
        // A promoted server takes a partial resync from a replica of its
        // old primary up to its promotion: offset + 1 <= second_repl_offset.
        if source.replid2.as_deref() == Some(id) && primary.offset < source.second_offset {
            return Judgement::Continues;
        }
    }
    if primary.keys == 0 {
        return Judgement::Empty;
    }
    if source.keys == 0 {
        return Judgement::SourceEmpty;
    }
    let ahead = match primary.replid.as_deref() {
        Some(id) if source.replid2.as_deref() == Some(id) && source.second_offset >= 0 => {
            Some(primary.offset + 1 - source.second_offset)
        }
        Some(id) if source.replid.as_deref() == Some(id) => Some(primary.offset - source.offset),
        _ => None,
    };
    Judgement::Diverged { ahead }
}

/// The fence a primary follows while it may not follow its source.
pub fn fence() -> Endpoint {
    Endpoint::new(BOOT_FENCE_HOST, SOURCE_FENCE_PORT)
}

/// How to reach the source and how the primary authenticates to it.
struct SourceAuth {
    opts: ConnectOptions,
    user: String,
    password: String,
}

/// Whether `status.replicaOf` as recorded differs from `new` enough to be
/// written: anything but the lag figures and the time, or lag figures
/// older than [`LAG_REFRESH_SECS`].
fn worth_writing(old: Option<&ReplicaOfStatus>, new: &ReplicaOfStatus, now: i64) -> bool {
    let Some(old) = old else { return true };
    let strip = |s: &ReplicaOfStatus| ReplicaOfStatus {
        lag_bytes: None,
        lag_seconds: None,
        source_full_syncs: None,
        observed_at: None,
        ..s.clone()
    };
    if strip(old) != strip(new) {
        return true;
    }
    let lag_changed = old.lag_bytes != new.lag_bytes
        || old.lag_seconds != new.lag_seconds
        || old.source_full_syncs != new.source_full_syncs;
    let age = old
        .observed_at
        .as_deref()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or(i64::MAX, |t| now - t.as_second());
    lag_changed && age >= LAG_REFRESH_SECS
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

impl Reconciler {
    /// The credentials of the source from Secret `secret`, or why they
    /// cannot be used (naming `field`; never a value).
    async fn source_auth(
        &self,
        secret: Option<&str>,
        field: &str,
    ) -> Result<Result<SourceAuth, String>, Error> {
        let timeouts =
            |o: ConnectOptions| o.with_timeouts(Duration::from_secs(2), Duration::from_secs(3));
        let Some(name) = secret else {
            return Ok(Ok(SourceAuth {
                opts: timeouts(ConnectOptions::default()),
                user: String::new(),
                password: String::new(),
            }));
        };
        let Some(s) = self.api::<Secret>().get_opt(name).await? else {
            return Ok(Err(format!(
                "{field}.secretName: Secret {name} does not exist in namespace {}",
                self.ns
            )));
        };
        let marked = s
            .labels()
            .get(ALLOW_USE_LABEL)
            .is_some_and(|v| v == ALLOW_USE_VALUE);
        if !marked {
            return Ok(Err(format!(
                "{field}.secretName: Secret {name} is not lent to Redpilot: label it \
                 {ALLOW_USE_LABEL}=\"{ALLOW_USE_VALUE}\" (only a Secret's owner can) to let the \
                 operator send it to the source"
            )));
        }
        let text = |key: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        let Some(password) = text(PASSWORD_KEY).filter(|p| !p.is_empty()) else {
            return Ok(Err(format!(
                "{field}.secretName: Secret {name} has no key {PASSWORD_KEY} (UTF-8, not empty)"
            )));
        };
        let user = text(USERNAME_KEY)
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "default".to_string());
        Ok(Ok(SourceAuth {
            opts: timeouts(ConnectOptions::default().with_user(user.clone(), password.clone())),
            user,
            password,
        }))
    }

    /// How the operator reaches the servers of this Redis from a task of
    /// its own (the source watch).
    fn own_opts(&self, auth: &ServerAuth, ip: &str) -> ConnectOptions {
        let o = ConnectOptions::default()
            .with_user_or_default(OPERATOR_USER, auth.current.clone())
            .with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
        match self.tls_options_for(ip) {
            Some(t) => o.with_tls(t),
            None => o,
        }
    }

    /// The `spec.replicaOf` step: keeps the primary on the source (see the
    /// module's documentation) and `status.replicaOf` up to date.
    pub(super) async fn follow(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
        auth: &ServerAuth,
        opts: &ConnectOptions,
    ) -> Result<(), Error> {
        let Some(spec) = self.redis.spec.replica_of.clone() else {
            if self.old_source_pending().is_none() {
                self.ctx.monitor.sources.unwatch(&self.oref);
            }
            return Ok(());
        };
        let source = Endpoint::new(&spec.host, spec.port());
        let address = spec.address();
        let sa = match self
            .source_auth(spec.secret_name.as_deref(), "spec.replicaOf")
            .await?
        {
            Ok(a) => a,
            Err(msg) => {
                // The watch of a source followed so far stays: it fences
                // if the source goes away.
                self.hold_writable_primary(facts, primary, opts).await;
                let status = ReplicaOfStatus {
                    source: address.clone(),
                    secret_name: spec.secret_name.clone(),
                    link: "Held".into(),
                    message: Some(msg.clone()),
                    observed_at: Some(now().to_string()),
                    ..Default::default()
                };
                self.record_following(status).await?;
                self.fail_once("SourceCredentials", "spec", msg).await;
                return Ok(());
            }
        };
        let Some(head) = primary
            .and_then(|p| facts.iter().find(|f| f.name == p))
            .filter(|f| f.reachable && !f.terminating)
        else {
            self.report
                .progress(format!("waiting for a primary to follow {address}"));
            return Ok(());
        };
        let Some(ip) = head.ip.clone() else {
            return Ok(());
        };
        let head_ep = Endpoint::new(&ip, names::REDIS_PORT);
        let head_opts = self.own_opts(auth, &ip);
        self.ctx.monitor.sources.watch(
            &self.oref,
            SourceTarget {
                key: stable_hash(&[
                    &address,
                    &sa.user,
                    &sa.password,
                    &ip,
                    &auth.current,
                    if head_opts.tls.is_some() { "tls" } else { "" },
                ]),
                source: source.clone(),
                source_opts: sa.opts.clone(),
                head: head_ep.clone(),
                head_opts,
                old_history: None,
            },
        );
        if self
            .redis
            .status
            .as_ref()
            .is_some_and(|s| s.demoted.is_some())
        {
            // Told to follow: the demotion is over.
            self.patch_status(serde_json::json!({ "demoted": null }))
                .await?;
        }

        let src_info = match Node::connect(&source, &sa.opts).await {
            Ok(mut n) => n.info().await.map_err(|e| e.category()),
            Err(e) => Err(e.category()),
        };
        let mut node = match Node::connect(&head_ep, opts).await {
            Ok(n) => n,
            Err(e) => {
                self.report.progress(format!(
                    "primary {} did not answer ({})",
                    head.name,
                    e.category().as_str()
                ));
                return Ok(());
            }
        };
        let head_info = node.info().await.map_err(Error::from)?;
        let mut status = ReplicaOfStatus {
            source: address.clone(),
            secret_name: spec.secret_name.clone(),
            link: "Fenced".into(),
            lag_bytes: None,
            lag_seconds: None,
            source_full_syncs: None,
            replid: None,
            message: None,
            observed_at: Some(now().to_string()),
        };
        if let Ok(src) = &src_info {
            status.source_full_syncs = src.stats.sync_full.map(|n| n as i64);
            status.replid = src.replication.replid.clone();
        }
        match head.upstream {
            Some(up) if !up.fenced => {
                // Following: the credentials may have changed, or a step
                // that sets every instance's may have run (a rotation).
                set_master_auth(&mut node, &sa.user, &sa.password, false)
                    .await
                    .map_err(Error::from)?;
                status.link = if up.syncing {
                    "Syncing"
                } else if up.link_up {
                    "Up"
                } else {
                    "Down"
                }
                .into();
                status.lag_seconds = up.link_age;
                if let Err(category) = &src_info {
                    // The watch fences at once; a pass that finds the
                    // source gone does too (the watch may have missed it).
                    fence_primary(&mut node).await.map_err(Error::from)?;
                    status.link = "Fenced".into();
                    status.message = Some(format!(
                        "the source does not answer ({}): the primary is held off it",
                        category.as_str()
                    ));
                } else if !up.link_up {
                    self.report.progress(format!(
                        "primary {} follows {address}; the link is {}",
                        head.name,
                        status.link.to_lowercase()
                    ));
                }
            }
            _ => {
                // Fenced, booted fenced, or a primary that took writes: the
                // source's history decides.
                let src = match src_info {
                    Ok(src) => src,
                    Err(category) => {
                        if head.upstream.is_none() {
                            fence_primary(&mut node).await.map_err(Error::from)?;
                        }
                        status.message = Some(format!(
                            "the source does not answer ({}): the primary is held off it",
                            category.as_str()
                        ));
                        self.report.progress(format!(
                            "{address} does not answer ({}); primary {} keeps its data and \
                             waits",
                            category.as_str(),
                            head.name
                        ));
                        self.record_following(status).await?;
                        return Ok(());
                    }
                };
                if let Some(up) = &src.replication.primary
                    && facts.iter().any(|f| f.ip.as_deref() == Some(up.host()))
                {
                    let msg = format!(
                        "spec.replicaOf: {address} is a replica of {up}, an instance of this \
                         Redis: following it would make a circle"
                    );
                    if head.upstream.is_none() {
                        fence_primary(&mut node).await.map_err(Error::from)?;
                    }
                    status.link = "Held".into();
                    status.message = Some(msg.clone());
                    self.record_following(status).await?;
                    self.fail_once("SourceCircle", "spec", msg).await;
                    return Ok(());
                }
                let ours = History::of(&head_info);
                let theirs = History::of(&src);
                let run_id = src.server.run_id.clone().unwrap_or_default();
                let accepted = self
                    .redis
                    .annotations()
                    .get(ACCEPT_RESET_ANNOTATION)
                    .is_some_and(|v| !run_id.is_empty() && *v == run_id);
                let verdict = judge(&ours, &theirs);
                let why = match &verdict {
                    Judgement::Continues => format!(
                        "{address} continues its history (offset {} → {})",
                        ours.offset, theirs.offset
                    ),
                    Judgement::Empty => "it holds no data yet".to_string(),
                    Judgement::Diverged { ahead } if accepted => format!(
                        "{address} has another history ({} keys) and \
                         {ACCEPT_RESET_ANNOTATION} accepts it: the primary's {} keys are \
                         replaced{}",
                        theirs.keys,
                        ours.keys,
                        ahead.map_or(String::new(), |a| format!(
                            " ({a} bytes of writes here after the two parted are dropped)"
                        ))
                    ),
                    Judgement::SourceEmpty if accepted => format!(
                        "{address} is empty (run id {run_id}) and {ACCEPT_RESET_ANNOTATION} \
                         accepts it: the primary's {} keys are dropped",
                        ours.keys
                    ),
                    Judgement::SourceEmpty | Judgement::Diverged { .. } => {
                        let what = if theirs.keys == 0 {
                            "answers with no data and another history".to_string()
                        } else {
                            format!(
                                "has another history ({} keys{})",
                                theirs.keys,
                                match &verdict {
                                    Judgement::Diverged { ahead: Some(a) } => format!(
                                        "; this Redis has {a} bytes of writes past the point \
                                         the two parted"
                                    ),
                                    _ => String::new(),
                                }
                            )
                        };
                        let msg = format!(
                            "{address} {what} (run id {run_id}; it restarted without its data, \
                             or is another Redis?) while primary {} holds {} keys: it is held \
                             off the source so it is not replaced. To follow the source \
                             anyway, annotate {ACCEPT_RESET_ANNOTATION}={run_id}",
                            head.name, ours.keys
                        );
                        if head.upstream.is_none() {
                            fence_primary(&mut node).await.map_err(Error::from)?;
                        }
                        status.link = "Held".into();
                        status.message = Some(msg.clone());
                        self.record_following(status).await?;
                        let reason = if theirs.keys == 0 {
                            "SourceEmpty"
                        } else {
                            "SourceHistoryChanged"
                        };
                        self.fail_once(reason, "state", msg).await;
                        return Ok(());
                    }
                };
                // The source may have restarted since it was judged: the
                // primary follows it only if it is still the same server.
                let again = match Node::connect(&source, &sa.opts).await {
                    Ok(mut n) => n.info().await.ok(),
                    Err(_) => None,
                };
                if again.as_ref().and_then(|i| i.server.run_id.clone()) != src.server.run_id
                    || again.as_ref().and_then(|i| i.replication.replid.clone())
                        != src.replication.replid
                {
                    self.report.progress(format!(
                        "{address} changed while it was checked; looked at again next pass"
                    ));
                    self.report.recheck_within(Duration::from_secs(1));
                    return Ok(());
                }
                set_master_auth(&mut node, &sa.user, &sa.password, false)
                    .await
                    .map_err(Error::from)?;
                node.replicaof(Some(&source)).await.map_err(Error::from)?;
                let (kind, reason) = match verdict {
                    Judgement::Diverged { .. } | Judgement::SourceEmpty => {
                        (EventType::Warning, "SourceResetAccepted")
                    }
                    _ => (EventType::Normal, "FollowingSource"),
                };
                self.event(
                    kind,
                    reason,
                    "Follow",
                    format!("primary {} follows {address}: {why}", head.name),
                )
                .await;
                status.link = "Down".into();
                self.report.progress(format!(
                    "primary {} now follows {address}; waiting for the link",
                    head.name
                ));
            }
        }
        self.record_following(status).await
    }

    /// Points the primary at the fence when it takes writes (a Redis just
    /// told to follow, whose source cannot be followed yet).
    async fn hold_writable_primary(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
        opts: &ConnectOptions,
    ) {
        let Some(f) = primary
            .and_then(|p| facts.iter().find(|f| f.name == p))
            .filter(|f| f.reachable && f.role == Some(Role::Primary) && f.upstream.is_none())
        else {
            return;
        };
        let Some(ip) = &f.ip else { return };
        let fenced = async {
            let mut n = Node::connect(&Endpoint::new(ip, names::REDIS_PORT), opts).await?;
            fence_primary(&mut n).await
        }
        .await;
        if let Err(e) = fenced {
            self.report.progress(format!(
                "primary {} still takes writes: fencing it failed ({})",
                f.name,
                e.category().as_str()
            ));
        }
    }

    /// Degraded with `reason`; the Warning event only when the status does
    /// not say so already (not one per pass).
    async fn fail_once(&mut self, reason: &'static str, category: &'static str, msg: String) {
        let already = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
            .is_some_and(|c| c.status == "True" && c.reason == reason);
        if already {
            self.report.degraded(reason);
            self.report.note(msg);
        } else {
            self.report_failure(reason, "Follow", category, msg).await;
        }
    }

    async fn record_following(&mut self, new: ReplicaOfStatus) -> Result<(), Error> {
        let old = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.replica_of.as_ref());
        if !worth_writing(old, &new, now().as_second()) {
            return Ok(());
        }
        self.patch_status(serde_json::json!({ "replicaOf": new }))
            .await
    }

    /// Makes the instance at `ep` the primary: `REPLICAOF NO ONE`, or, for
    /// a Redis that follows a source, the fence (the next pass points it
    /// at the source once it has checked its history).
    pub(super) async fn make_primary(
        &self,
        ep: &Endpoint,
        opts: &ConnectOptions,
        settings: &[(&str, String)],
    ) -> crate::redis::Result<()> {
        if SourceAddress::of(&self.redis).is_some() {
            crate::redis::actions::make_fenced_primary(ep, opts, settings, &fence()).await
        } else {
            crate::redis::actions::make_primary(ep, opts, settings).await
        }
    }

    /// Whether a promotion off the source is due (`spec.replicaOf`
    /// removed, the source still recorded).
    pub(super) fn promotion_due(&self) -> bool {
        self.redis.spec.replica_of.is_none()
            && self
                .redis
                .status
                .as_ref()
                .is_some_and(|s| s.replica_of.is_some())
    }

    /// Promotes the primary off the source (see the module's
    /// documentation). True when it is done.
    pub(super) async fn promote_off_source(
        &mut self,
        facts: &[PodFacts],
        primary: Option<&str>,
        auth: &ServerAuth,
        opts: &ConnectOptions,
    ) -> Result<bool, Error> {
        let Some(rec) = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.replica_of.clone())
        else {
            return Ok(true);
        };
        let Some(addr) = SourceAddress::of(&self.redis) else {
            return Ok(true);
        };
        let source = Endpoint::new(&addr.host, addr.port);
        let Some(head) = primary
            .and_then(|p| facts.iter().find(|f| f.name == p))
            .filter(|f| f.reachable && !f.terminating)
        else {
            self.report.progress(format!(
                "promotion off {}: waiting for the primary to answer",
                rec.source
            ));
            return Ok(false);
        };
        let Some(ip) = head.ip.clone() else {
            return Ok(false);
        };
        let head_ep = Endpoint::new(&ip, names::REDIS_PORT);
        let started = Instant::now();
        let mut node = Node::connect(&head_ep, opts).await.map_err(Error::from)?;
        let promoted_already = head.role == Some(Role::Primary) && head.upstream.is_none();
        let sa = self
            .source_auth(rec.secret_name.as_deref(), "status.replicaOf")
            .await?;
        let history = node
            .replication()
            .await
            .map_err(Error::from)?
            .replid
            .filter(|_| !promoted_already)
            .or_else(|| rec.replid.clone());
        let mut record = PromotionStatus {
            time: now().to_string(),
            source: rec.source.clone(),
            planned: false,
            offset: None,
            behind_bytes: None,
            link_down_seconds: None,
            message: String::new(),
            history,
            secret_name: rec.secret_name.clone(),
            source_fenced: None,
        };
        let mut src = match &sa {
            Ok(sa) => Node::connect(&source, &sa.opts).await.ok(),
            Err(_) => None,
        };
        let src_repl = match src.as_mut() {
            Some(n) => n.replication().await.ok(),
            None => None,
        };
        let following = head.upstream.is_some_and(|u| !u.fenced && u.link_up);
        let src_demoted = src_repl
            .as_ref()
            .is_some_and(|r| r.primary.as_ref() == Some(&fence()));
        if promoted_already {
            record.offset = head.offset;
            record.message = format!(
                "the primary was promoted by an earlier pass (offset {})",
                head.offset.unwrap_or(0)
            );
            record.planned = src_demoted;
        } else if let (Some(n), Some(_), false) = (src.as_mut(), src_repl.as_ref(), src_demoted)
            && !following
        {
            // The source answers, but the primary does not stream from it:
            // when the source continues its history, it is pointed back (or
            // its link awaited) and the promotion waits to be planned;
            // another history has nothing to catch up with.
            let ours = History::of(&node.info().await.map_err(Error::from)?);
            let theirs = History::of(&n.info().await.map_err(Error::from)?);
            if judge(&ours, &theirs) != Judgement::Continues {
                return self
                    .promote_unplanned(
                        &mut node,
                        head,
                        &rec,
                        record,
                        format!(
                            "the source answers with another history (it holds {} keys)",
                            theirs.keys
                        ),
                        auth,
                        started,
                    )
                    .await;
            }
            if head.upstream.is_some_and(|u| u.fenced)
                && let Ok(sa) = &sa
            {
                set_master_auth(&mut node, &sa.user, &sa.password, false)
                    .await
                    .map_err(Error::from)?;
                node.replicaof(Some(&source)).await.map_err(Error::from)?;
            }
            self.report.progress(format!(
                "promotion off {}: the primary's link to the source is not up; the planned \
                 promotion waits for it",
                rec.source
            ));
            return Ok(false);
        } else if let (Some(n), Some(r)) = (src.as_mut(), src_repl.as_ref()) {
            // Planned: pause, catch up, fence the source, check its final
            // offset, promote.
            let applied = node
                .replication()
                .await
                .map_err(Error::from)?
                .applied_offset()
                .unwrap_or(0);
            let behind = r.repl_offset.unwrap_or(0) - applied;
            if !src_demoted && behind > MAX_LAG_TO_PAUSE {
                self.report.progress(format!(
                    "promotion off {}: the primary is {behind} bytes behind; the source's \
                     writes are paused once it is within {MAX_LAG_TO_PAUSE}",
                    rec.source
                ));
                return Ok(false);
            }
            let paused = if src_demoted {
                None
            } else {
                let _: redis::Value = n
                    .query(
                        "CLIENT PAUSE",
                        redis::cmd("CLIENT").arg("PAUSE").arg(PAUSE_MS).arg("WRITE"),
                    )
                    .await
                    .map_err(Error::from)?;
                Some(Instant::now())
            };
            let target = n
                .replication()
                .await
                .map_err(Error::from)?
                .repl_offset
                .or(r.repl_offset)
                .unwrap_or(0);
            let reached = caught_up(&mut node, target, CATCH_UP).await?;
            if reached < target {
                self.let_source_go(n, src_demoted).await;
                self.report.progress(format!(
                    "promotion off {}: the primary reached offset {reached} of the source's \
                     {target} within {}s; the source's writes are let go and the promotion \
                     is tried again",
                    rec.source,
                    CATCH_UP.as_secs()
                ));
                return Ok(false);
            }
            if !src_demoted {
                n.replicaof(Some(&fence())).await.map_err(Error::from)?;
            }
            crate::failpoint::hit("after-source-fenced");
            // The source's last offset, now that it takes no write: had
            // the pause ended before it was fenced, writes it acknowledged
            // since would be missing here.
            let last = n
                .replication()
                .await
                .map_err(Error::from)?
                .repl_offset
                .unwrap_or(target);
            if last > reached {
                self.let_source_go(n, true).await;
                self.report.progress(format!(
                    "promotion off {}: the source took writes up to offset {last} after the \
                     primary's {reached} (its pause ended first); it is writable again and \
                     the promotion is tried again",
                    rec.source
                ));
                return Ok(false);
            }
            self.ctx.monitor.sources.unwatch(&self.oref);
            self.promote_head(&mut node, auth).await?;
            // Held writes are answered READONLY now (a pause an earlier
            // pass left ends here too, not after its bound).
            unpause(n).await;
            record.planned = true;
            record.offset = Some(last);
            record.message = match paused {
                Some(p) => format!(
                    "planned: the source's writes were paused {} ms, the primary matched \
                     its final offset {last}, and the source was made read-only (a replica \
                     of {}) before the pause ended: no write it acknowledged is missing here",
                    p.elapsed().as_millis(),
                    fence()
                ),
                None => format!(
                    "planned, finished after an interruption: an earlier pass had paused \
                     the source's writes and made it read-only (a replica of {}); the \
                     primary matched its final offset {last}: no write it acknowledged is \
                     missing here",
                    fence()
                ),
            };
        } else {
            // Unplanned: what the primary has.
            let why = match (&sa, src_repl.is_some()) {
                (Err(msg), _) => format!("the source's credentials cannot be used ({msg})"),
                (_, false) => "the source does not answer".to_string(),
                (_, true) => "the source is not a primary this Redis can catch up with".to_string(),
            };
            return self
                .promote_unplanned(&mut node, head, &rec, record, why, auth, started)
                .await;
        }
        self.record_promotion(head, &rec, record, started).await
    }

    /// The unplanned promotion: what the primary has, recorded with how far
    /// behind it was.
    #[allow(clippy::too_many_arguments)]
    async fn promote_unplanned(
        &mut self,
        node: &mut Node,
        head: &PodFacts,
        rec: &ReplicaOfStatus,
        mut record: PromotionStatus,
        why: String,
        auth: &ServerAuth,
        started: Instant,
    ) -> Result<bool, Error> {
        self.ctx.monitor.sources.unwatch(&self.oref);
        self.promote_head(node, auth).await?;
        record.offset = head.offset;
        record.behind_bytes = rec.lag_bytes;
        record.link_down_seconds = head.upstream.and_then(|u| u.link_age);
        record.message = format!(
            "unplanned: {why}; the primary was promoted with what it had (offset {}, {} bytes \
             behind when last recorded): writes the source acknowledged after that are not \
             here, and the source was not made read-only",
            head.offset.unwrap_or(0),
            rec.lag_bytes.map_or("?".to_string(), |b| b.to_string())
        );
        self.record_promotion(head, rec, record, started).await
    }

    /// `status.promotion`, `status.replicaOf` cleared, the event.
    async fn record_promotion(
        &mut self,
        head: &PodFacts,
        rec: &ReplicaOfStatus,
        mut record: PromotionStatus,
        started: Instant,
    ) -> Result<bool, Error> {
        record.source_fenced = Some(record.planned);
        if !record.planned {
            record.message.push_str(
                "; the operator fences the source the moment it answers again as a writable \
                 primary of this history",
            );
        }
        self.patch_status(serde_json::json!({ "replicaOf": null, "promotion": record }))
            .await?;
        let kind = if record.planned {
            EventType::Normal
        } else {
            EventType::Warning
        };
        self.event(
            kind,
            "Promoted",
            "Promote",
            format!(
                "{} no longer follows {} ({} ms): {}",
                head.name,
                rec.source,
                started.elapsed().as_millis(),
                record.message
            ),
        )
        .await;
        self.report
            .progress(format!("promoted {} off {}", head.name, rec.source));
        Ok(true)
    }

    /// After an unplanned promotion, the old source not yet made read-only:
    /// its address and the history this Redis was promoted from.
    fn old_source_pending(&self) -> Option<(Endpoint, String, Option<String>)> {
        if self.redis.spec.replica_of.is_some() {
            return None;
        }
        let p = self.redis.status.as_ref()?.promotion.as_ref()?;
        if p.source_fenced != Some(false) {
            return None;
        }
        let (host, port) = p.source.rsplit_once(':')?;
        Some((
            Endpoint::new(host, port.parse().ok()?),
            p.history.clone()?,
            p.secret_name.clone(),
        ))
    }

    /// After an unplanned promotion: the old source is made read-only as
    /// soon as it answers as a writable primary of the history this Redis
    /// was promoted from (the source watch asks every half second and
    /// fences it; this step records it).
    pub(super) async fn fence_old_source(&mut self) -> Result<(), Error> {
        let Some((source, history, secret)) = self.old_source_pending() else {
            return Ok(());
        };
        let sa = match self
            .source_auth(secret.as_deref(), "status.promotion")
            .await?
        {
            Ok(sa) => sa,
            Err(msg) => {
                self.report.progress(format!(
                    "the old source {source} is not made read-only: {msg}"
                ));
                return Ok(());
            }
        };
        let quick = sa
            .opts
            .clone()
            .with_timeouts(Duration::from_millis(300), Duration::from_millis(500));
        let found = crate::controller::source_watch::fence_old_source(&source, &quick, &history)
            .await
            .ok()
            .flatten();
        let Some(found) = found else {
            self.ctx.monitor.sources.watch(
                &self.oref,
                SourceTarget {
                    key: stable_hash(&[&source.to_string(), &sa.user, &sa.password, &history]),
                    source: source.clone(),
                    source_opts: sa.opts.clone(),
                    head: source.clone(),
                    head_opts: sa.opts,
                    old_history: Some(history),
                },
            );
            return Ok(());
        };
        self.ctx.monitor.sources.unwatch(&self.oref);
        let (fenced, note) = match found {
            crate::controller::source_watch::OldSource::Other => (
                false,
                format!(
                    "{source} answers with another history: it is not the old source; left alone"
                ),
            ),
            _ => (
                true,
                format!(
                    "the old source {source} answered again and is read-only (a replica of {}): \
                     it takes no write behind this Redis's back",
                    fence()
                ),
            ),
        };
        let reason = if fenced {
            "OldSourceFenced"
        } else {
            "OldSourceReplaced"
        };
        self.event(EventType::Warning, reason, "Promote", note)
            .await;
        // Another Redis at the address: nothing left to fence (the field
        // goes, so the operator stops asking).
        let value = if fenced {
            serde_json::json!(true)
        } else {
            serde_json::Value::Null
        };
        self.patch_status(serde_json::json!({ "promotion": { "sourceFenced": value } }))
            .await
    }

    /// A planned promotion that cannot finish leaves the source as it
    /// found it: writable (`REPLICAOF NO ONE` when this or an earlier pass
    /// fenced it), its pause lifted.
    async fn let_source_go(&mut self, n: &mut Node, fenced: bool) {
        if fenced && let Err(e) = n.replicaof(None).await {
            self.report.progress(format!(
                "the source stays read-only: making it a primary again failed ({})",
                e.category().as_str()
            ));
        }
        unpause(n).await;
    }

    /// `REPLICAOF NO ONE` on the primary, with the write fence and the
    /// credentials its replicas' primaries use inside this Redis (a later
    /// switchover makes it a replica of one of them).
    async fn promote_head(&mut self, node: &mut Node, auth: &ServerAuth) -> Result<(), Error> {
        let user = if auth.users_applied.is_some() {
            OPERATOR_USER
        } else {
            "default"
        };
        set_master_auth(node, user, &auth.current, self.redis.spec.tls.is_some())
            .await
            .map_err(Error::from)?;
        crate::redis::actions::set_each(node, &super::conf::fencing_config(&self.redis))
            .await
            .map_err(Error::from)?;
        node.replicaof(None).await.map_err(Error::from)?;
        Ok(())
    }

    /// Whether this Redis (without a source) holds because its primary
    /// was demoted from outside; records the demotion the first time.
    pub(super) async fn demoted(
        &mut self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
    ) -> Result<bool, Error> {
        if self.redis.spec.replica_of.is_some() || self.promotion_due() {
            return Ok(false);
        }
        let recorded = self.redis.status.as_ref().and_then(|s| s.demoted.clone());
        // This Redis's own promotion off a source: for a while after it an
        // instance may still boot fenced (the published fence reaches a
        // restarting pod late), which is not a demotion.
        let promoted_lately = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.promotion.as_ref())
            .and_then(|p| p.time.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .is_some_and(|t| now().as_second() - t.as_second() < PROMOTION_GRACE_SECS);
        let fenced = facts
            .iter()
            .find(|f| f.reachable && f.fenced_off_source)
            .filter(|_| !promoted_lately)
            .map(|f| f.name.clone());
        let since = match (recorded, fenced) {
            (Some(t), _) => t,
            (None, Some(pod)) => {
                let t = now().to_string();
                self.patch_status(serde_json::json!({ "demoted": t }))
                    .await?;
                self.event(
                    EventType::Warning,
                    "Demoted",
                    "Follow",
                    format!(
                        "{pod} was made read-only from outside (a Redis that followed this \
                         one was promoted): this Redis takes no writes on its own from now on"
                    ),
                )
                .await;
                t
            }
            (None, None) => return Ok(false),
        };
        if self
            .redis
            .annotations()
            .get(TAKE_WRITES_ANNOTATION)
            .is_some_and(|v| *v == since)
        {
            // The user accepts this Redis taking writes again: the
            // recorded primary is promoted in place; other fenced
            // instances go to the boot fence and follow it (wiring).
            let recorded_primary = self.redis.status.as_ref().and_then(|s| s.primary.clone());
            for f in facts.iter().filter(|f| f.reachable && f.fenced_off_source) {
                let Some(ip) = &f.ip else { continue };
                let ep = Endpoint::new(ip, names::REDIS_PORT);
                let result = if recorded_primary.as_deref() == Some(f.name.as_str()) {
                    let fence = super::conf::fencing_config(&self.redis);
                    crate::redis::actions::make_primary(&ep, opts, &fence).await
                } else {
                    let boot = Endpoint::new(BOOT_FENCE_HOST, BOOT_FENCE_PORT);
                    crate::redis::actions::make_replica_of(&ep, &boot, opts).await
                };
                if let Err(e) = result {
                    tracing::warn!(pod = %f.name, error = %e, "unfencing a demoted instance failed");
                }
            }
            self.patch_status(serde_json::json!({ "demoted": null }))
                .await?;
            return Ok(false);
        }
        self.report.degraded("Demoted");
        self.report.note(format!(
            "the primary was made read-only from outside at {since} (a Redis that followed \
             this one was promoted): set spec.replicaOf to that Redis's address to follow \
             it, or annotate {TAKE_WRITES_ANNOTATION}={since} to take writes here again"
        ));
        Ok(true)
    }
}

/// The switchover of a Redis that follows a source: nothing takes writes
/// here, so nothing is paused. The target (a replica of the primary) is
/// held at the fence, keeping the history it shares with the primary and
/// the source; the old primary follows it with the credentials the
/// target uses inside this Redis (it will sync once the target is pointed
/// at the source by the next pass, after the history check).
pub(super) async fn switch_followed(
    old: &Endpoint,
    target: &Endpoint,
    opts: &ConnectOptions,
) -> crate::redis::Result<crate::redis::actions::RoleChangeReport> {
    let started = Instant::now();
    let mut t = Node::connect(target, opts).await?;
    let mut o = Node::connect(old, opts).await?;
    // The target first has all the old primary has (with the source gone,
    // an old primary ahead of it would resync from it and lose the rest).
    let want = o.replication().await?.applied_offset().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let offset = loop {
        let have = t.replication().await?.applied_offset().unwrap_or(0);
        if have >= want {
            break have;
        }
        if Instant::now() >= deadline {
            return Err(crate::redis::Error::State(format!(
                "{target} is at offset {have}, behind {old} at {want}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let get = |key: &'static str| redis::cmd("CONFIG").arg("GET").arg(key).clone();
    // The user the instances replicate as inside this Redis (a name); the
    // password is the operator's own, which masterauth is everywhere here.
    let user: Vec<String> = t.query("CONFIG GET", &get("masteruser")).await?;
    let tls: Vec<String> = t.query("CONFIG GET", &get("tls-replication")).await?;
    t.replicaof(Some(&fence())).await?;
    let password = opts
        .password
        .as_ref()
        .map(|p| p.expose().to_string())
        .unwrap_or_default();
    set_master_auth(
        &mut o,
        user.get(1).map_or("default", String::as_str),
        &password,
        tls.get(1).is_some_and(|v| v == "yes"),
    )
    .await?;
    o.replicaof(Some(target)).await?;
    Ok(crate::redis::actions::RoleChangeReport {
        old_primary: old.clone(),
        new_primary: target.clone(),
        offset,
        write_pause: Duration::ZERO,
        duration: started.elapsed(),
        repointed: vec![old.clone()],
        repoint_failures: Vec::new(),
        candidates: Vec::new(),
    })
}

/// `CONFIG SET masteruser … masterauth … tls-replication …` (an empty
/// password: none): how the server authenticates to the primary it is
/// about to follow, and whether it speaks TLS to it (never to a source).
async fn set_master_auth(
    node: &mut Node,
    user: &str,
    password: &str,
    tls: bool,
) -> crate::redis::Result<()> {
    // One key a command: Redis 6.2 takes no more.
    let user = if password.is_empty() { "" } else { user };
    let tls = if tls { "yes" } else { "no" };
    for (key, value) in [
        ("masteruser", user),
        ("masterauth", password),
        ("tls-replication", tls),
    ] {
        let _: redis::Value = node
            .query(
                "CONFIG SET",
                redis::cmd("CONFIG").arg("SET").arg(key).arg(value),
            )
            .await?;
    }
    Ok(())
}

/// Points a primary that took writes at the fence.
async fn fence_primary(node: &mut Node) -> crate::redis::Result<()> {
    node.replicaof(Some(&fence())).await
}

/// Waits up to `within` for the primary's applied offset to reach
/// `target`; the offset reached.
async fn caught_up(node: &mut Node, target: i64, within: Duration) -> Result<i64, Error> {
    let deadline = Instant::now() + within;
    loop {
        let reached = node
            .replication()
            .await
            .map_err(Error::from)?
            .applied_offset()
            .unwrap_or(0);
        if reached >= target || Instant::now() >= deadline {
            return Ok(reached);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn unpause(node: &mut Node) {
    let r: crate::redis::Result<redis::Value> = node
        .query("CLIENT UNPAUSE", redis::cmd("CLIENT").arg("UNPAUSE"))
        .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "CLIENT UNPAUSE on the source failed; its pause ends by itself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(replid: &str, replid2: &str, offset: i64, second: i64, keys: u64) -> History {
        History {
            replid: Some(replid.into()).filter(|s: &String| !s.is_empty()),
            replid2: Some(replid2.into()).filter(|s: &String| !s.is_empty()),
            offset,
            second_offset: second,
            keys,
        }
    }

    #[test]
    fn the_same_history_further_on_continues() {
        assert_eq!(
            judge(&h("a", "", 100, -1, 5), &h("a", "", 150, -1, 6)),
            Judgement::Continues
        );
        assert_eq!(
            judge(&h("a", "", 100, -1, 5), &h("a", "", 100, -1, 5)),
            Judgement::Continues
        );
    }

    #[test]
    fn a_source_behind_the_primary_is_not_its_history() {
        // The source restarted from an older snapshot with the same id.
        assert_eq!(
            judge(&h("a", "", 100, -1, 5), &h("a", "", 90, -1, 4)),
            Judgement::Diverged { ahead: Some(10) }
        );
    }

    #[test]
    fn a_source_promoted_from_the_primary_continues_it() {
        // B followed A and was promoted at offset 200 (second_repl_offset
        // 201): A at 180 or at 200 continues.
        assert_eq!(
            judge(&h("a", "", 180, -1, 5), &h("b", "a", 400, 201, 9)),
            Judgement::Continues
        );
        assert_eq!(
            judge(&h("a", "", 200, -1, 5), &h("b", "a", 400, 201, 9)),
            Judgement::Continues
        );
        // A took 50 more bytes of writes after B's promotion: Redis would
        // refuse the partial resync (offset + 1 > second_repl_offset).
        assert_eq!(
            judge(&h("a", "", 250, -1, 5), &h("b", "a", 400, 201, 9)),
            Judgement::Diverged { ahead: Some(50) }
        );
        assert_eq!(
            judge(&h("a", "", 201, -1, 5), &h("b", "a", 400, 201, 9)),
            Judgement::Diverged { ahead: Some(1) }
        );
    }

    #[test]
    fn an_empty_source_never_wipes_a_primary_with_data() {
        assert_eq!(
            judge(&h("a", "", 100, -1, 5), &h("z", "", 0, -1, 0)),
            Judgement::SourceEmpty
        );
        // Nothing to lose: an empty primary follows anything.
        assert_eq!(
            judge(&h("a", "", 0, -1, 0), &h("z", "", 0, -1, 0)),
            Judgement::Empty
        );
        assert_eq!(
            judge(&h("", "", 0, -1, 0), &h("z", "", 9, -1, 3)),
            Judgement::Empty
        );
    }

    #[test]
    fn another_history_with_data_replaces_the_primary() {
        assert_eq!(
            judge(&h("a", "", 100, -1, 5), &h("z", "", 10, -1, 3)),
            Judgement::Diverged { ahead: None }
        );
    }

    #[test]
    fn lag_alone_is_written_at_most_every_thirty_seconds() {
        let t0 = k8s_openapi::jiff::Timestamp::from_second(1_000).expect("t0");
        let old = ReplicaOfStatus {
            source: "s:1".into(),
            link: "Up".into(),
            lag_bytes: Some(10),
            observed_at: Some(t0.to_string()),
            ..Default::default()
        };
        let mut new = old.clone();
        new.lag_bytes = Some(20);
        assert!(!worth_writing(Some(&old), &new, 1_010));
        assert!(worth_writing(Some(&old), &new, 1_030));
        new.lag_bytes = Some(10);
        assert!(!worth_writing(Some(&old), &new, 1_100));
        new.link = "Down".into();
        assert!(worth_writing(Some(&old), &new, 1_001));
        assert!(worth_writing(None, &new, 1_001));
    }
}
