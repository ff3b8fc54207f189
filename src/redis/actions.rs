//! Actions that change replication: promote, repoint, wait for catch-up,
//! planned switchover, failover of a dead primary and fencing.
//!
//! # Safety model
//! * **Switchover** never loses an acknowledged write: writes are paused on the
//!   old primary (`CLIENT PAUSE WRITE`, which the server releases by itself
//!   after a bound), the target must have applied the old primary's final
//!   offset before it is promoted, and the old primary is demoted *before* the
//!   pause is lifted, so held writes are answered `READONLY`.
//! * **Failover** promotes the reachable replica with the highest applied
//!   offset (ties: lowest address), after checking the old primary really is
//!   down. Writes the dead primary acknowledged but never replicated are lost;
//!   that is inherent to asynchronous replication.
//! * **Fencing**: an instance that returns after a failover must start with a
//!   `replicaof` directive pointing at the current primary (see
//!   [`replicaof_directive`]), so it is a read-only replica from its first
//!   accepted connection; [`fence`] repairs an instance that came back as a
//!   primary anyway.
//!
//! Length: ~620 lines of code: the replication actions share their safety
//! checks; each action is a top-level function with its own bound.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::conn::{ConnectOptions, Node};
use super::endpoint::Endpoint;
use super::error::{Error, Result};
use super::info::{LinkStatus, ReplicationInfo, Role};
use super::topology::observe;

/// `REPLICAOF NO ONE` on `endpoint`, then checks it reports the primary role.
/// `settings` are set first (`CONFIG SET`), so the new primary has them from
/// its first write: the operator passes its write fence
/// (`min-replicas-to-write`, `min-replicas-max-lag`, `repl-timeout`).
#[tracing::instrument(name = "redis.make_primary", skip_all, fields(endpoint = %endpoint))]
pub async fn make_primary(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    settings: &[(&str, String)],
) -> Result<()> {
    let mut node = Node::connect(endpoint, opts).await?;
    promote(&mut node, settings).await
}

/// `CONFIG SET` of each of `settings`, one at a time.
pub async fn set_each(node: &mut Node, settings: &[(&str, String)]) -> Result<()> {
    for (key, value) in settings {
        let _: redis::Value = node
            .query(
                "CONFIG SET",
                redis::cmd("CONFIG").arg("SET").arg(*key).arg(value),
            )
            .await?;
    }
    Ok(())
}

async fn promote(node: &mut Node, settings: &[(&str, String)]) -> Result<()> {
    set_each(node, settings).await?;
    node.replicaof(None).await?;
    let r = node.replication().await?;
    if r.role != Some(Role::Primary) {
        return Err(Error::State(format!(
            "{} still reports role {:?} after REPLICAOF NO ONE",
            node.endpoint(),
            r.role
        )));
    }
    Ok(())
}

/// The primary of a Redis that follows a source outside it: `settings`
/// first (as [`make_primary`]), then `REPLICAOF <fence>`, an address where
/// nothing listens, so it keeps its data, refuses writes, and serves its
/// replicas nothing until the operator points it at the source.
#[tracing::instrument(name = "redis.make_fenced_primary", skip_all, fields(endpoint = %endpoint))]
pub async fn make_fenced_primary(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    settings: &[(&str, String)],
    fence: &Endpoint,
) -> Result<()> {
    let mut node = Node::connect(endpoint, opts).await?;
    set_each(&mut node, settings).await?;
    node.replicaof(Some(fence)).await?;
    let r = node.replication().await?;
    if r.role != Some(Role::Replica) || r.primary.as_ref() != Some(fence) {
        return Err(Error::State(format!(
            "{endpoint} does not follow {fence} after REPLICAOF (role {:?})",
            r.role
        )));
    }
    Ok(())
}

/// `REPLICAOF <primary>` on `endpoint`, then checks it follows `primary`.
#[tracing::instrument(name = "redis.make_replica_of", skip_all, fields(endpoint = %endpoint, primary = %primary))]
pub async fn make_replica_of(
    endpoint: &Endpoint,
    primary: &Endpoint,
    opts: &ConnectOptions,
) -> Result<()> {
    let mut node = Node::connect(endpoint, opts).await?;
    repoint(&mut node, primary, opts).await
}

async fn repoint(node: &mut Node, primary: &Endpoint, opts: &ConnectOptions) -> Result<()> {
    if node.endpoint() == primary {
        return Err(Error::Config(format!(
            "{primary} cannot be a replica of itself"
        )));
    }
    if opts.listeners.is_some() {
        // A server without TLS files refuses `yes`: it is about to restart
        // with them, and follows once it has; that is logged, not an error.
        let tls = opts.tls_for(primary.host()).is_some();
        if let Err(e) = replicate_with_tls(node, tls).await {
            tracing::info!(endpoint = %node.endpoint(), error = %e, tls, "tls-replication not set");
        }
    }
    node.replicaof(Some(primary)).await?;
    let r = node.replication().await?;
    if r.role != Some(Role::Replica) || r.primary.as_ref() != Some(primary) {
        return Err(Error::State(format!(
            "{} does not follow {primary} after REPLICAOF (role {:?}, primary {:?})",
            node.endpoint(),
            r.role,
            r.primary
        )));
    }
    Ok(())
}

/// Sets `tls-replication` on a server about to follow another, to how
/// that one listens (the two differ while TLS is turned on or off).
pub async fn replicate_with_tls(node: &mut Node, tls: bool) -> Result<()> {
    let value = if tls { "yes" } else { "no" };
    node.query::<()>(
        "CONFIG SET",
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("tls-replication")
            .arg(value),
    )
    .await
}

/// `CONFIG SET` of several parameters in one command: the server applies
/// them all or none (Redis 7.0+, Valkey).
pub async fn config_set_all(node: &mut Node, params: &[(&str, String)]) -> Result<()> {
    let mut c = redis::cmd("CONFIG");
    c.arg("SET");
    for (k, v) in params {
        c.arg(*k).arg(v);
    }
    node.query::<()>("CONFIG SET", &c).await
}

/// The outcome of waiting for a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaughtUp {
    /// The offset the replica had to reach.
    pub target_offset: i64,
    /// The offset it had applied when the wait ended.
    pub replica_offset: i64,
    /// How long it took.
    pub waited: Duration,
}

/// Polls `node` until it follows `primary` with its link up and has applied
/// `target`, or `deadline` passes.
async fn wait_for_offset(
    node: &mut Node,
    primary: &Endpoint,
    target: i64,
    deadline: Instant,
    poll: Duration,
) -> Result<i64> {
    let start = Instant::now();
    loop {
        let r = node.replication().await?;
        let following = r.role == Some(Role::Replica)
            && r.primary.as_ref() == Some(primary)
            && r.link_status == Some(LinkStatus::Up)
            && r.sync_in_progress != Some(true);
        if following && let Some(off) = r.replica_offset.filter(|o| *o >= target) {
            return Ok(off);
        }
        if Instant::now() + poll > deadline {
            return Err(Error::Timeout {
                endpoint: node.endpoint().to_string(),
                operation: "replica catch-up",
                after: start.elapsed(),
            });
        }
        tokio::time::sleep(poll).await;
    }
}

/// Waits (at most `timeout`) until `replica` has applied everything `primary`
/// had written when the call started.
#[tracing::instrument(name = "redis.wait_caught_up", skip_all, fields(replica = %replica, primary = %primary))]
pub async fn wait_caught_up(
    replica: &Endpoint,
    primary: &Endpoint,
    opts: &ConnectOptions,
    timeout: Duration,
) -> Result<CaughtUp> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut p = Node::connect(primary, opts).await?;
    let target = primary_offset(&p.replication().await?, primary)?;
    let mut r = Node::connect(replica, opts).await?;
    let replica_offset = wait_for_offset(&mut r, primary, target, deadline, poll_for(timeout))
        .await
        .map_err(|e| match e {
            Error::Timeout { endpoint, .. } => Error::Timeout {
                endpoint,
                operation: "replica catch-up",
                after: timeout,
            },
            other => other,
        })?;
    Ok(CaughtUp {
        target_offset: target,
        replica_offset,
        waited: start.elapsed(),
    })
}

fn poll_for(timeout: Duration) -> Duration {
    (timeout / 100).clamp(Duration::from_millis(2), Duration::from_millis(100))
}

fn primary_offset(r: &ReplicationInfo, endpoint: &Endpoint) -> Result<i64> {
    if r.role != Some(Role::Primary) {
        return Err(Error::State(format!(
            "{endpoint} is not a primary (role {:?})",
            r.role
        )));
    }
    r.repl_offset.ok_or_else(|| Error::Protocol {
        endpoint: endpoint.to_string(),
        message: "INFO replication lacks master_repl_offset".into(),
    })
}

/// Bounds of a planned switchover.
#[derive(Debug, Clone)]
pub struct SwitchoverOptions {
    /// Longest time writes may be held on the old primary. The server lifts the
    /// pause by itself after this, even if the caller disappears.
    pub max_write_pause: Duration,
    /// Bound on the catch-up wait done *before* pausing (keeps the pause short).
    pub catch_up_timeout: Duration,
    /// How often the target's offset is polled while writes are paused.
    pub poll_interval: Duration,
    /// Set on the target (`CONFIG SET`) before it is promoted (see
    /// [`make_primary`]).
    pub promote_settings: Vec<(&'static str, String)>,
}

impl Default for SwitchoverOptions {
    fn default() -> Self {
        Self {
            max_write_pause: Duration::from_secs(5),
            catch_up_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_millis(1),
            promote_settings: Vec::new(),
        }
    }
}

/// What a switchover or failover did.
#[derive(Debug)]
pub struct RoleChangeReport {
    /// The primary before.
    pub old_primary: Endpoint,
    /// The primary after.
    pub new_primary: Endpoint,
    /// Replication offset at which the new primary took over.
    pub offset: i64,
    /// How long writes were held (switchover only; zero for failover).
    pub write_pause: Duration,
    /// Duration of the whole action.
    pub duration: Duration,
    /// Instances now following the new primary.
    pub repointed: Vec<Endpoint>,
    /// Instances that could not be repointed (to be repaired by the caller).
    pub repoint_failures: Vec<(Endpoint, Error)>,
    /// Failover only: the candidates considered, with their offsets.
    pub candidates: Vec<Candidate>,
}

/// Planned switchover of the primary among `members` to `target`, with zero
/// acknowledged writes lost.
///
/// Steps: check that exactly one primary exists and `target` follows it with
/// its link up; let `target` catch up; `CLIENT PAUSE WRITE` the old primary;
/// read its final offset; wait until `target` applied it; promote `target`;
/// demote the old primary to a replica of `target`; `CLIENT UNPAUSE` (held
/// writes now get `READONLY`); repoint the remaining replicas.
///
/// If anything fails before the promotion, the pause is lifted and nothing has
/// changed. Calling it when `target` already is the primary is a no-op.
#[tracing::instrument(name = "redis.switchover", skip_all, fields(target = %target, members = members.len()))]
pub async fn switchover(
    members: &[Endpoint],
    target: &Endpoint,
    opts: &ConnectOptions,
    sw: &SwitchoverOptions,
) -> Result<RoleChangeReport> {
    let start = Instant::now();
    if !members.contains(target) {
        return Err(Error::Config(format!(
            "switchover target {target} is not a member"
        )));
    }
    let topo = observe(members, opts).await;
    let old = topo.primary.clone().ok_or_else(|| {
        Error::State(format!(
            "switchover needs exactly one primary; anomalies: {:?}",
            topo.anomalies
        ))
    })?;
    if &old == target {
        return Ok(RoleChangeReport {
            offset: topo.node(target).and_then(|n| n.offset).unwrap_or(0),
            old_primary: old,
            new_primary: target.clone(),
            write_pause: Duration::ZERO,
            duration: start.elapsed(),
            repointed: Vec::new(),
            repoint_failures: Vec::new(),
            candidates: Vec::new(),
        });
    }
    let t = topo
        .node(target)
        .ok_or_else(|| Error::State(format!("{target} was not observed")))?;
    if !t.reachable()
        || t.role != Some(Role::Replica)
        || t.primary.as_ref() != Some(&old)
        || t.link != Some(LinkStatus::Up)
        || t.sync_in_progress
    {
        return Err(Error::State(format!(
            "switchover target {target} is not an in-sync replica of {old} (reachable {}, role {:?}, primary {:?}, link {:?})",
            t.reachable(),
            t.role,
            t.primary,
            t.link
        )));
    }

    let mut p = Node::connect(&old, opts).await?;
    let mut tn = Node::connect(target, opts).await?;

    // Catch up without holding writes, so the pause only covers the tail.
    let pre = primary_offset(&p.replication().await?, &old)?;
    wait_for_offset(
        &mut tn,
        &old,
        pre,
        Instant::now() + sw.catch_up_timeout,
        sw.poll_interval.max(Duration::from_millis(1)),
    )
    .await?;

    p.pause_writes(sw.max_write_pause).await?;
    let paused_at = Instant::now();
    // Keep a margin so the role change finishes before the server lifts the pause.
    let deadline = paused_at + sw.max_write_pause.mul_f64(0.6);
    let caught_up: Result<i64> = async {
        let final_offset = primary_offset(&p.replication().await?, &old)?;
        wait_for_offset(&mut tn, &old, final_offset, deadline, sw.poll_interval).await?;
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                endpoint: target.to_string(),
                operation: "switchover",
                after: sw.max_write_pause,
            });
        }
        Ok(final_offset)
    }
    .await;
    let promoted = match caught_up {
        Ok(offset) => match promote(&mut tn, &sw.promote_settings).await {
            Ok(()) => Ok(offset),
            // The reply may have been lost after the target switched roles:
            // if it did, continue (the old primary must be demoted), else abort.
            Err(e) => match Node::connect(target, opts).await {
                Ok(mut check) => match check.replication().await {
                    Ok(r) if r.role == Some(Role::Primary) => Ok(offset),
                    _ => Err(e),
                },
                Err(_) => Err(e),
            },
        },
        Err(e) => Err(e),
    };
    let offset = match promoted {
        Ok(off) => off,
        Err(e) => {
            if let Err(unpause) = p.client_unpause().await {
                tracing::warn!(endpoint = %old, error = %unpause, "CLIENT UNPAUSE failed; the pause expires by itself");
            }
            return Err(e);
        }
    };

    // The target is primary now: demote the old one before releasing writes.
    // A failure on the connection in hand is retried on fresh connections
    // (pausing again, so the pause cannot lapse in between) while the pause
    // still holds.
    let mut repointed = Vec::new();
    let mut repoint_failures = Vec::new();
    let retry_until = paused_at + sw.max_write_pause.mul_f64(0.8);
    let mut demoted = repoint(&mut p, target, opts).await;
    while demoted.is_err() && Instant::now() < retry_until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let again = async {
            let mut fresh = Node::connect(&old, opts).await?;
            fresh.pause_writes(sw.max_write_pause).await?;
            repoint(&mut fresh, target, opts).await?;
            Ok::<Node, Error>(fresh)
        };
        demoted = match again.await {
            Ok(fresh) => {
                p = fresh;
                Ok(())
            }
            Err(e) => Err(e),
        };
    }
    if let Err(e) = demoted {
        // Two writable primaries must never outlive the pause: put the target
        // back under the old primary, then release writes there. The
        // switchover has not happened.
        tracing::error!(endpoint = %old, error = %e, "could not demote the old primary; rolling the switchover back");
        let rollback = make_replica_of(target, &old, opts).await;
        if let Err(unpause) = p.client_unpause().await {
            tracing::warn!(endpoint = %old, error = %unpause, "CLIENT UNPAUSE failed; the pause expires by itself");
        }
        let back = match rollback {
            Ok(()) => format!("{target} follows {old} again"),
            Err(r) => format!("returning {target} under {old} failed too: {r}"),
        };
        return Err(Error::State(format!(
            "switchover {old} → {target} aborted: the old primary could not be demoted ({e}); {back}"
        )));
    }
    repointed.push(old.clone());
    if let Err(e) = p.client_unpause().await {
        tracing::warn!(endpoint = %old, error = %e, "CLIENT UNPAUSE failed; the pause expires by itself");
    }
    let write_pause = paused_at.elapsed();

    let others: Vec<&Endpoint> = members
        .iter()
        .filter(|e| *e != target && **e != old)
        .collect();
    let results = join_all(others.iter().map(|e| make_replica_of(e, target, opts))).await;
    for (e, r) in others.into_iter().zip(results) {
        match r {
            Ok(()) => repointed.push(e.clone()),
            Err(err) => repoint_failures.push((e.clone(), err)),
        }
    }
    Ok(RoleChangeReport {
        old_primary: old,
        new_primary: target.clone(),
        offset,
        write_pause,
        duration: start.elapsed(),
        repointed,
        repoint_failures,
        candidates: Vec::new(),
    })
}

/// How a dead primary is detected.
#[derive(Debug, Clone)]
pub struct DetectionOptions {
    /// Probe period; each probe (connect + `PING`) is bounded by it as well.
    pub interval: Duration,
    /// Consecutive failed probes that declare the primary dead.
    pub misses: u32,
}

impl Default for DetectionOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(200),
            misses: 3,
        }
    }
}

/// The result of [`detect_failure`].
#[derive(Debug)]
pub struct Detection {
    /// Time from the first failed probe of the final streak to the verdict.
    pub elapsed_since_first_miss: Duration,
    /// Probes sent in total.
    pub probes: u64,
    /// The last probe's error.
    pub last_error: Error,
}

/// Probes `endpoint` every `det.interval` and returns once `det.misses`
/// consecutive probes failed. Never returns while the instance answers; wrap it
/// in a timeout or `select!` to stop watching.
pub async fn detect_failure(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    det: &DetectionOptions,
) -> Detection {
    let probe_opts = opts.clone().with_timeouts(det.interval, det.interval);
    let mut ticker = tokio::time::interval(det.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<Node> = None;
    let mut misses = 0u32;
    let mut probes = 0u64;
    let mut first_miss = Instant::now();
    loop {
        ticker.tick().await;
        probes += 1;
        let result = async {
            if conn.is_none() {
                conn = Some(Node::connect(endpoint, &probe_opts).await?);
            }
            match conn.as_mut() {
                Some(node) => node.ping().await,
                None => Err(Error::State("no connection".into())),
            }
        }
        .await;
        match result {
            Ok(()) => misses = 0,
            Err(e) => {
                conn = None;
                if misses == 0 {
                    first_miss = Instant::now();
                }
                misses += 1;
                if misses >= det.misses.max(1) {
                    return Detection {
                        elapsed_since_first_miss: first_miss.elapsed(),
                        probes,
                        last_error: e,
                    };
                }
            }
        }
    }
}

/// A replica considered for promotion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The replica.
    pub endpoint: Endpoint,
    /// Its applied replication offset.
    pub offset: i64,
    /// Its `replica-priority` (0 excludes it).
    pub priority: u32,
}

/// Picks the replica to promote: highest offset, ties broken by the lowest
/// address; priority-0 replicas are never chosen. Pure.
pub fn choose_candidate(candidates: &[Candidate]) -> Option<&Candidate> {
    candidates
        .iter()
        .filter(|c| c.priority != 0)
        .max_by_key(|c| (c.offset, Reverse(&c.endpoint)))
}

/// Promotes the best replica among `replicas` after `old_primary` died, and
/// repoints the others to it.
///
/// Refuses (with [`Error::State`]) if `old_primary` still answers as a primary,
/// so a false detection cannot create two primaries. If one of `replicas` is
/// already a primary (an earlier, interrupted failover), it is kept and the
/// others are repointed: the call is idempotent.
#[tracing::instrument(name = "redis.failover", skip_all, fields(old_primary = %old_primary, candidates = replicas.len()))]
pub async fn failover(
    old_primary: &Endpoint,
    replicas: &[Endpoint],
    opts: &ConnectOptions,
) -> Result<RoleChangeReport> {
    let start = Instant::now();
    let check = async {
        let mut n = Node::connect(old_primary, opts).await?;
        n.replication().await
    };
    if let Ok(r) = check.await
        && r.role == Some(Role::Primary)
    {
        return Err(Error::State(format!(
            "{old_primary} still answers as primary; refusing failover"
        )));
    }

    let infos = join_all(replicas.iter().map(|e| async move {
        let mut n = Node::connect(e, opts).await?;
        n.replication().await
    }))
    .await;
    let mut candidates = Vec::new();
    let mut already_primary = Vec::new();
    for (e, r) in replicas.iter().zip(infos) {
        let Ok(r) = r else { continue };
        match r.role {
            Some(Role::Primary) => already_primary.push((e.clone(), r.repl_offset.unwrap_or(0))),
            Some(Role::Replica) if r.sync_in_progress != Some(true) => {
                if let Some(offset) = r.replica_offset {
                    candidates.push(Candidate {
                        endpoint: e.clone(),
                        offset,
                        priority: r.replica_priority.unwrap_or(100),
                    });
                }
            }
            _ => {}
        }
    }
    let (chosen, offset) = match already_primary.as_slice() {
        [(e, off)] => (e.clone(), *off),
        [] => {
            let c = choose_candidate(&candidates).ok_or_else(|| {
                Error::State(format!(
                    "no promotable replica among {} for failover of {old_primary}",
                    replicas.len()
                ))
            })?;
            make_primary(&c.endpoint, opts, &[]).await?;
            (c.endpoint.clone(), c.offset)
        }
        many => {
            return Err(Error::State(format!(
                "several replicas already are primaries: {:?}",
                many.iter().map(|(e, _)| e).collect::<Vec<_>>()
            )));
        }
    };

    let others: Vec<&Endpoint> = replicas.iter().filter(|e| **e != chosen).collect();
    let results = join_all(others.iter().map(|e| make_replica_of(e, &chosen, opts))).await;
    let mut repointed = Vec::new();
    let mut repoint_failures = Vec::new();
    for (e, r) in others.into_iter().zip(results) {
        match r {
            Ok(()) => repointed.push(e.clone()),
            Err(err) => repoint_failures.push((e.clone(), err)),
        }
    }
    Ok(RoleChangeReport {
        old_primary: old_primary.clone(),
        new_primary: chosen,
        offset,
        write_pause: Duration::ZERO,
        duration: start.elapsed(),
        repointed,
        repoint_failures,
        candidates,
    })
}

/// What [`fence`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// It was a primary and is now a replica of the current primary.
    Demoted,
    /// It followed another instance and now follows the current primary.
    Repointed,
    /// It already followed the current primary.
    AlreadyFollowing,
}

/// Makes sure `endpoint` is a replica of `primary` (demoting it if it came back
/// as a primary). Idempotent.
#[tracing::instrument(name = "redis.fence", skip_all, fields(endpoint = %endpoint, primary = %primary))]
pub async fn fence(
    endpoint: &Endpoint,
    primary: &Endpoint,
    opts: &ConnectOptions,
) -> Result<FenceOutcome> {
    let mut node = Node::connect(endpoint, opts).await?;
    let r = node.replication().await?;
    let outcome = match (r.role, r.primary.as_ref()) {
        (Some(Role::Replica), Some(p)) if p == primary => {
            return Ok(FenceOutcome::AlreadyFollowing);
        }
        (Some(Role::Primary), _) => FenceOutcome::Demoted,
        _ => FenceOutcome::Repointed,
    };
    repoint(&mut node, primary, opts).await?;
    Ok(outcome)
}

/// The configuration directive every non-primary instance must boot with
/// (`replicaof <host> <port>`), so a returning former primary is a read-only
/// replica before it accepts its first client.
pub fn replicaof_directive(primary: &Endpoint) -> String {
    format!("replicaof {} {}", primary.host(), primary.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(port: u16, offset: i64, priority: u32) -> Candidate {
        Candidate {
            endpoint: Endpoint::new("127.0.0.1", port),
            offset,
            priority,
        }
    }

    #[test]
    fn highest_offset_wins() {
        let cs = [c(1, 10, 100), c(2, 30, 100), c(3, 20, 100)];
        assert_eq!(choose_candidate(&cs).map(|c| c.endpoint.port()), Some(2));
    }

    #[test]
    fn ties_go_to_lowest_address() {
        let cs = [c(3, 30, 100), c(2, 30, 100), c(4, 30, 1)];
        assert_eq!(choose_candidate(&cs).map(|c| c.endpoint.port()), Some(2));
    }

    #[test]
    fn priority_zero_is_never_promoted() {
        let cs = [c(1, 99, 0), c(2, 1, 100)];
        assert_eq!(choose_candidate(&cs).map(|c| c.endpoint.port()), Some(2));
        assert_eq!(choose_candidate(&[c(1, 99, 0)]), None);
        assert_eq!(choose_candidate(&[]), None);
    }

    #[test]
    fn directive() {
        assert_eq!(
            replicaof_directive(&Endpoint::new("10.0.0.1", 6379)),
            "replicaof 10.0.0.1 6379"
        );
    }
}
