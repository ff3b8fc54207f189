//! Online resharding: when `spec.shards` changes, slots move between the
//! shards' primaries until every shard below the count holds its even
//! share ([`rs::rebalance`]) and the shards past it hold none; those are
//! then removed ([`super::shrink`]: their StatefulSets deleted, their node IDs forgotten by
//! the plan's forget rule once no pod runs them).
//!
//! One step per pass, decided by [`super::moves::next`] (pure, table-tested):
//! 1. a slot a stopped classic move left open is finished (the move run
//!    again toward the recorded target) or settled (a node that still
//!    shows a state for a slot that already moved is told the owner);
//! 2. else a bounded chunk of the first move, its intent recorded in
//!    `status.resharding.current` before the first command;
//! 3. else the emptied shards past the count are removed.
//!
//! Nothing moves while a bound holds ([`Reconciler::reshard_bound`]): the
//! cluster not ok, a shard without its primary, a node not ready, an
//! upgrade or an ordered restart running, a hibernation. The phase is then
//! Paused and says why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::model::{Member, Plan};
use super::moves::{
    ATOMIC_CHUNK, CLASSIC_CHUNK, Next, Path, count, next, open_between, remaining, slots_left,
};
use super::plan;
use crate::api::v1alpha1::{ReshardingPhase, ReshardingStatus, SlotMoveIntent};
use crate::controller::redis::facts::PodFacts;
use crate::controller::redis::{Error, Reconciler};
use crate::redis::cluster::SlotRange;
use crate::redis::info::EngineKind;
use crate::redis::reshard as rs;
use crate::redis::{ConnectOptions, Endpoint, Node};

/// How long a pass keeps moving classic slots before it reports.
const PASS_BUDGET: Duration = Duration::from_secs(3);
/// Slots a classic move opens, empties and hands over together (each
/// step a pipeline): a pass of many small slots is bound by round trips,
/// not by the keys. A move stopped midway leaves up to this many slots
/// open; the next pass finishes them together.
const SLOTS_AT_ONCE: usize = 32;
/// Connections to each of the two primaries a classic move uses for its
/// `CLUSTER SETSLOT`s: Valkey 8 answers each only after its replicas
/// acknowledged it, so their waits overlap across connections.
const SETSLOT_LANES: usize = 8;
/// How long a pass waits for an atomic job before it reports (the job
/// goes on; the next pass waits for it).
const ATOMIC_WAIT: Duration = Duration::from_secs(10);

impl Reconciler {
    /// How slots move on the engine the Redis runs.
    fn reshard_path(&self) -> Path {
        match self.engine_version() {
            (EngineKind::Valkey, v) if v.major >= 9 => Path::Atomic,
            _ => Path::Classic,
        }
    }

    /// Why no slot may move now, if a bound holds. `step` is what the
    /// resharding would do.
    fn reshard_bound(
        &self,
        plan: &Plan,
        members: &[Member],
        facts: &[PodFacts],
        step: &Next,
    ) -> Option<String> {
        if self.redis.spec.hibernate {
            return Some("the Redis hibernates".into());
        }
        if self.upgrade_in_flight() {
            return Some("an upgrade runs".into());
        }
        if self.records.bootstrap.as_ref().is_some_and(|b| !b.done) {
            return Some("the restore from a backup is not finished".into());
        }
        let without = plan.without_primary();
        if !without.is_empty() {
            return Some(format!("shard(s) {} have no primary", without.join(", ")));
        }
        if let Some(m) = members
            .iter()
            .find(|m| m.view.as_ref().is_some_and(|v| !v.info.ok))
        {
            return Some(format!("the cluster is not ok on {}", m.pod));
        }
        if let Some(f) = facts.iter().find(|f| f.outdated) {
            return Some(format!(
                "an ordered restart runs ({} runs an older template)",
                f.name
            ));
        }
        if let Some(m) = members.iter().find(|m| !m.ready || m.view.is_none()) {
            return Some(format!("{} is not ready", m.pod));
        }
        // A slot a stopped move left open can itself keep the nodes from
        // agreeing on every slot: a node importing a slot ignores news of
        // its owner, so when the source's primary fails over mid-move the
        // target sees the slot served by no one, and no pass would ever
        // find the cluster healthy. Finishing or settling that slot is the
        // way out: it goes ahead when nothing else is wrong (every pod
        // answers and is ready, as checked above; no step and no problem in
        // the plan; every shard whole: `plan.whole`).
        let repair = matches!(step, Next::Finish { .. } | Next::Settle { .. }) && plan.whole;
        if !plan.healthy && !repair {
            let why = plan
                .problems
                .first()
                .or_else(|| plan.waiting.first())
                .cloned()
                .unwrap_or_else(|| "the cluster is still being formed".into());
            return Some(format!("waiting for the cluster to settle: {why}"));
        }
        None
    }

    /// One resharding step (see the module). True when slots moved, a
    /// state was settled or a shard removed: the pass then does nothing
    /// else to the servers.
    pub(super) async fn reshard(
        &mut self,
        plan: &Plan,
        members: &[Member],
        facts: &[PodFacts],
        conns: &mut BTreeMap<String, Node>,
        (password, opts): (&str, &ConnectOptions),
    ) -> Result<bool, Error> {
        let shards = usize::try_from(self.redis.spec.desired_shards()).unwrap_or(0);
        let path = self.reshard_path();
        let chunk = match path {
            Path::Atomic => ATOMIC_CHUNK,
            Path::Classic => CLASSIC_CHUNK,
        };
        let intent = self
            .records
            .resharding
            .as_ref()
            .and_then(|r| r.current.clone());
        let step = next(plan, members, shards, intent.as_ref(), chunk);
        let draining: Vec<usize> = (shards..plan.shards.len()).collect();
        let open_job = intent.is_some() && path == Path::Atomic;
        if step == Next::Idle && draining.is_empty() && !open_job {
            self.reshard_done().await;
            return Ok(false);
        }
        self.reshard_begin(plan, shards, path).await;
        let bound = match self.reshard_bound(plan, members, facts, &step) {
            Some(why) => Some(why),
            // Only when a slot is about to move: one list of the backups.
            None if matches!(step, Next::Move { .. } | Next::Finish { .. }) => {
                self.backup_running().await?
            }
            None => None,
        };
        if let Some(why) = bound {
            self.reshard_pause(why).await;
            return Ok(false);
        }
        // An atomic job the last pass (or a stopped operator) left running
        // is waited for before anything else.
        if open_job
            && let Some(t) = intent.as_ref()
            && let Some(src) = shard_pod(plan, t.from_shard)
            && let Some(node) = conns.get_mut(&src)
        {
            match rs::migrations(node).await {
                Ok(jobs) if jobs.iter().any(|j| j.operation == "EXPORT" && !j.ended()) => {
                    self.reshard_note(format!(
                        "slots {} move from shard {} to shard {} (an atomic job runs)",
                        t.slots, t.from_shard, t.to_shard
                    ));
                    return Ok(true);
                }
                Ok(_) => {
                    if let Some(r) = self.records.resharding.as_mut() {
                        r.current = None;
                    }
                }
                Err(e) => {
                    self.data_plane_failed(format!("reading the slot migrations of {src}"), &e)
                        .await;
                    return Ok(true);
                }
            }
        }
        match step {
            Next::Idle => {
                if let Some(r) = self.records.resharding.as_mut()
                    && r.slots_moved_at.is_none()
                {
                    r.slots_moved_at = Some(Timestamp::now().to_string());
                }
                self.remove_emptied(plan, shards, conns).await
            }
            Next::Stuck(why) => {
                self.report_failure("ReshardingStuck", "Reshard", "redis", why)
                    .await;
                Ok(true)
            }
            Next::Settle { slot, shard, owner } => {
                let pod = plan.shards[shard].primary.clone().unwrap_or_default();
                if let Some(node) = conns.get_mut(&pod) {
                    self.report.wrote();
                    if let Err(e) = rs::announce(node, slot, &owner).await {
                        self.data_plane_failed(format!("settling slot {slot} on {pod}"), &e)
                            .await;
                    } else {
                        self.reshard_note(format!("slot {slot}: {pod} told its new owner"));
                    }
                }
                Ok(true)
            }
            Next::Finish { slot, from, to } => {
                let slots = open_between(plan, members, from, to, slot);
                self.move_classic(plan, members, conns, (password, opts), from, to, &slots)
                    .await?;
                Ok(true)
            }
            Next::Move { from, to, slots } => {
                match path {
                    Path::Classic => {
                        // A shard that owns no slot yet takes one slot
                        // alone first, keyless when the chunk has one: the
                        // cluster elects a replica only for a primary that
                        // owns slots, so a slotless primary killed while
                        // keys were arriving would come back empty with
                        // them. Once it owns a slot its replica takes over.
                        let slots = if plan.shards[to].slots.is_empty() {
                            // Any slot of this move will do; the chunk is
                            // its first slots.
                            let candidates = remaining(plan, shards)
                                .into_iter()
                                .find(|m| m.from == from && m.to == to)
                                .map_or(slots, |m| m.slots);
                            self.claim_slot(plan, conns, from, &candidates).await
                        } else {
                            slots
                        };
                        self.move_classic(plan, members, conns, (password, opts), from, to, &slots)
                            .await?;
                    }
                    Path::Atomic => self.move_atomic(plan, conns, from, to, &slots).await?,
                }
                Ok(true)
            }
        }
    }

    /// A backup of this Redis that is reading its shards: no slot moves
    /// until it ends, so every shard's file is of one layout (the backup
    /// controller in turn waits for a resharding to be Done before it
    /// starts).
    async fn backup_running(&self) -> Result<Option<String>, Error> {
        use crate::api::v1alpha1::{BackupPhase, RedisBackup};
        self.ctx.metrics.kube("list_redisbackup");
        let backups = self
            .api::<RedisBackup>()
            .list(&kube::api::ListParams::default())
            .await?;
        let name = self.redis.name_any();
        Ok(backups
            .items
            .iter()
            .find(|b| {
                b.spec.redis == name
                    && b.status
                        .as_ref()
                        .is_some_and(|s| s.phase == Some(BackupPhase::Running))
            })
            .map(|b| format!("RedisBackup {} is reading the shards", b.name_any())))
    }

    /// Starts (or restarts, for a new shard count) the record.
    async fn reshard_begin(&mut self, plan: &Plan, shards: usize, path: Path) {
        let to = i32::try_from(shards).unwrap_or(i32::MAX);
        let fresh = self
            .records
            .resharding
            .as_ref()
            .is_none_or(|r| r.phase == ReshardingPhase::Done || r.to_shards != to);
        if !fresh {
            return;
        }
        let total = slots_left(plan, shards);
        let from = plan.shards.iter().filter(|s| !s.slots.is_empty()).count();
        let grows = shards > from;
        let from = i32::try_from(from).unwrap_or(0);
        // A new count while a move was recorded: the open slot (if any) is
        // finished first by `next`, whatever the record says.
        let current = self
            .records
            .resharding
            .as_ref()
            .and_then(|r| r.current.clone());
        self.records.resharding = Some(ReshardingStatus {
            phase: ReshardingPhase::Moving,
            path: path.name().into(),
            from_shards: from,
            to_shards: to,
            slots_moved: 0,
            slots_total: total,
            keys_moved: 0,
            current,
            started_at: Timestamp::now().to_string(),
            moving_since: None,
            slots_moved_at: None,
            finished_at: None,
            estimated_end: None,
            message: None,
        });
        let note = format!(
            "spec.shards is {to}: moving {total} slots {} from {from} shards with slots ({} path)",
            if grows {
                "onto the new shards"
            } else {
                "between the shards"
            },
            path.name()
        );
        tracing::info!(redis = %self.oref, "{note}");
        self.report.wrote();
        self.event(EventType::Normal, "ReshardingStarted", "Reshard", note)
            .await;
    }

    /// A bound holds: Paused, with why (an event when the pause starts).
    async fn reshard_pause(&mut self, why: String) {
        let Some(r) = self.records.resharding.as_mut() else {
            return;
        };
        let was = r.phase;
        r.phase = ReshardingPhase::Paused;
        r.message = Some(why.clone());
        self.report.waiting_unless_set("ReshardingPaused");
        self.report.progress(format!("resharding paused: {why}"));
        if was != ReshardingPhase::Paused {
            self.event(
                EventType::Normal,
                "ReshardingPaused",
                "Reshard",
                format!("resharding paused: {why}"),
            )
            .await;
        }
    }

    pub(super) fn reshard_note(&mut self, note: String) {
        if let Some(r) = self.records.resharding.as_mut() {
            r.phase = ReshardingPhase::Moving;
            r.message = Some(note.clone());
        }
        self.report.waiting_unless_set("Resharding");
        self.report.progress(note);
    }

    /// Nothing left to move and no shard to remove.
    async fn reshard_done(&mut self) {
        let Some(r) = self.records.resharding.as_mut() else {
            return;
        };
        if r.phase == ReshardingPhase::Done {
            return;
        }
        r.phase = ReshardingPhase::Done;
        r.current = None;
        r.estimated_end = None;
        r.slots_moved = r.slots_total;
        let now = Timestamp::now();
        r.finished_at = Some(now.to_string());
        let secs = r
            .started_at
            .parse::<Timestamp>()
            .ok()
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
        let moved_at = r
            .slots_moved_at
            .get_or_insert_with(|| now.to_string())
            .clone();
        let moves = r
            .moving_since
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .zip(moved_at.parse::<Timestamp>().ok())
            .map(|(a, b)| format!(", the moves {:.1} s", b.duration_since(a).as_secs_f64()))
            .unwrap_or_default();
        let note = format!(
            "resharding to {} shards done: {} slots and {} keys moved in {secs:.1} s{moves} ({} path)",
            r.to_shards, r.slots_moved, r.keys_moved, r.path
        );
        r.message = Some(note.clone());
        tracing::info!(redis = %self.oref, "{note}");
        self.report.wrote();
        self.event(EventType::Normal, "ReshardingDone", "Reshard", note)
            .await;
    }

    /// Writes the intent (the move about to start) to the status.
    async fn record_move(&mut self, intent: Option<SlotMoveIntent>) -> Result<(), Error> {
        let Some(r) = self.records.resharding.as_mut() else {
            return Ok(());
        };
        if intent.is_some() && r.moving_since.is_none() {
            r.moving_since = Some(Timestamp::now().to_string());
        }
        r.current = intent;
        r.phase = ReshardingPhase::Moving;
        r.message = None;
        let value =
            serde_json::to_value(&*r).map_err(|e| Error::Serialize("status.resharding", e))?;
        self.patch_status(serde_json::json!({ "resharding": value }))
            .await
    }

    /// Counts what a step moved and estimates the end. The slots moved
    /// are the total less what is `left` (so a pass a stopped operator
    /// never reported still counts); the keys are the reported passes'.
    fn reshard_progress(&mut self, keys: u64, left: i64) {
        let Some(r) = self.records.resharding.as_mut() else {
            return;
        };
        r.slots_total = r.slots_total.max(left);
        r.slots_moved = r.slots_total - left;
        r.keys_moved += i64::try_from(keys).unwrap_or(i64::MAX);
        let now = Timestamp::now();
        if let Ok(started) = r.started_at.parse::<Timestamp>()
            && r.slots_moved > 0
        {
            let spent = now.duration_since(started).as_secs_f64();
            let rest = spent * (left as f64) / (r.slots_moved as f64);
            let end = i64::try_from(std::time::Duration::from_secs_f64(rest.max(0.0)).as_millis())
                .ok()
                .and_then(|ms| now.checked_add(jiff_ms(ms)).ok());
            r.estimated_end = end.map(|t| t.to_string());
        }
    }

    /// Moves `slots` from shard `from`'s primary to shard `to`'s the
    /// classic way, one slot after another, for at most [`PASS_BUDGET`].
    #[allow(clippy::too_many_arguments)]
    async fn move_classic(
        &mut self,
        plan: &Plan,
        members: &[Member],
        conns: &mut BTreeMap<String, Node>,
        (password, opts): (&str, &ConnectOptions),
        from: usize,
        to: usize,
        slots: &[SlotRange],
    ) -> Result<(), Error> {
        let (Some(src), Some(dst)) = (&plan.shards[from].primary, &plan.shards[to].primary) else {
            return Ok(());
        };
        let (Some(src_id), Some(dst_id)) = (
            plan.shards[from].primary_id.clone(),
            plan.shards[to].primary_id.clone(),
        ) else {
            return Ok(());
        };
        let Some(ip) = members
            .iter()
            .find(|m| &m.pod == dst)
            .and_then(|m| m.ip.clone())
        else {
            return Ok(());
        };
        let target_at = Endpoint::new(&ip, crate::controller::names::REDIS_PORT);
        let (Some(source), Some(target)) = (conns.remove(src), conns.remove(dst)) else {
            return Ok(());
        };
        // More connections to both, for the `SETSLOT`s (see `move_slots`);
        // a pass goes on with fewer when some do not open.
        let source_at = source.endpoint().clone();
        let more = |at: Endpoint| {
            futures::future::join_all((1..SETSLOT_LANES).map(move |_| {
                let at = at.clone();
                async move { Node::connect(&at, opts).await.ok() }
            }))
        };
        let (more_sources, more_targets) =
            futures::join!(more(source_at), more(target.endpoint().clone()));
        let mut sources: Vec<Node> = std::iter::once(source)
            .chain(more_sources.into_iter().flatten())
            .collect();
        let mut targets: Vec<Node> = std::iter::once(target)
            .chain(more_targets.into_iter().flatten())
            .collect();
        self.record_move(Some(SlotMoveIntent {
            slots: plan::show(slots),
            from_shard: i32::try_from(from).unwrap_or(0),
            to_shard: i32::try_from(to).unwrap_or(0),
            source: src_id.clone(),
            target: dst_id.clone(),
        }))
        .await?;
        crate::failpoint::hit("reshard-after-intent");
        let how = rs::Classic {
            password: (!password.is_empty()).then(|| password.to_string()),
            ..Default::default()
        };
        let started = Instant::now();
        let (mut moved, mut keys, mut longest) = (0i64, 0u64, 0u64);
        let mut failed = None;
        let all: Vec<u16> = slots.iter().flat_map(|r| r.start..=r.end).collect();
        for group in all.chunks(SLOTS_AT_ONCE) {
            match rs::move_slots(
                &mut sources,
                &mut targets,
                (&src_id, &dst_id),
                &target_at,
                group,
                &how,
            )
            .await
            {
                Ok(k) => {
                    moved += i64::try_from(group.len()).unwrap_or(0);
                    keys += k.keys;
                    longest = longest.max(k.longest_ms);
                }
                Err(e) => {
                    failed = Some((
                        plan::show(&crate::redis::cluster::ranges(group.iter().copied())),
                        e,
                    ));
                    break;
                }
            }
            if started.elapsed() >= PASS_BUDGET {
                break;
            }
        }
        // The first of each goes back; the others close.
        if let Some(n) = sources.into_iter().next() {
            conns.insert(src.clone(), n);
        }
        if let Some(n) = targets.into_iter().next() {
            conns.insert(dst.clone(), n);
        }
        self.report.wrote();
        let left = slots_left(
            plan,
            usize::try_from(self.redis.spec.desired_shards()).unwrap_or(0),
        ) - moved;
        self.reshard_progress(keys, left.max(0));
        if let Some((slot, e)) = failed {
            // The slot stays open: the next pass finishes it.
            self.data_plane_failed(
                format!("moving slots {slot} from shard {from} to shard {to}"),
                &e,
            )
            .await;
        } else if let Some(r) = self.records.resharding.as_mut() {
            r.current = None;
        }
        self.reshard_note(format!(
            "resharding: {moved} slots ({keys} keys) moved from shard {from} to shard {to} in {} ms (longest MIGRATE {longest} ms); {} of {} slots moved",
            started.elapsed().as_millis(),
            self.records.resharding.as_ref().map_or(0, |r| r.slots_moved),
            self.records.resharding.as_ref().map_or(0, |r| r.slots_total),
        ));
        Ok(())
    }

    /// The one slot of `slots` a shard that owns none takes first: the
    /// first the source (shard `from`'s primary) holds no key of, else the
    /// one it holds the fewest keys of (read with `CLUSTER COUNTKEYSINSLOT`,
    /// one round trip per slot until a keyless one; the first slot when the
    /// source cannot be asked).
    async fn claim_slot(
        &mut self,
        plan: &Plan,
        conns: &mut BTreeMap<String, Node>,
        from: usize,
        slots: &[SlotRange],
    ) -> Vec<SlotRange> {
        let candidates: Vec<u16> = slots.iter().flat_map(|r| r.start..=r.end).collect();
        let mut best: Option<(u16, u64)> = None;
        if let Some(node) = plan.shards[from]
            .primary
            .as_ref()
            .and_then(|p| conns.get_mut(p))
        {
            for &slot in &candidates {
                match rs::keys_in_slot(node, slot).await {
                    Ok(n) if best.is_none_or(|(_, b)| n < b) => {
                        best = Some((slot, n));
                        if n == 0 {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        let slot = best.map(|(s, _)| s).or_else(|| candidates.first().copied());
        slot.map(|s| vec![SlotRange { start: s, end: s }])
            .unwrap_or_default()
    }

    /// Moves `slots` with one atomic job, waiting at most [`ATOMIC_WAIT`].
    async fn move_atomic(
        &mut self,
        plan: &Plan,
        conns: &mut BTreeMap<String, Node>,
        from: usize,
        to: usize,
        slots: &[SlotRange],
    ) -> Result<(), Error> {
        let (Some(src), Some(src_id), Some(dst_id)) = (
            plan.shards[from].primary.clone(),
            plan.shards[from].primary_id.clone(),
            plan.shards[to].primary_id.clone(),
        ) else {
            return Ok(());
        };
        if !conns.contains_key(&src) {
            return Ok(());
        }
        self.record_move(Some(SlotMoveIntent {
            slots: plan::show(slots),
            from_shard: i32::try_from(from).unwrap_or(0),
            to_shard: i32::try_from(to).unwrap_or(0),
            source: src_id,
            target: dst_id.clone(),
        }))
        .await?;
        crate::failpoint::hit("reshard-after-intent");
        let Some(node) = conns.get_mut(&src) else {
            return Ok(());
        };
        // The keys the slots hold as the job starts (the engine does not
        // say how many it moved); writes during the move are not counted.
        let keys = rs::keys_in_slots(node, slots).await.unwrap_or(0);
        let started = Instant::now();
        self.report.wrote();
        let result = rs::move_atomic(node, slots, &dst_id, ATOMIC_WAIT).await;
        let n = count(slots);
        match result {
            Ok(_) => {
                let left = slots_left(
                    plan,
                    usize::try_from(self.redis.spec.desired_shards()).unwrap_or(0),
                ) - n;
                self.reshard_progress(keys, left.max(0));
                if let Some(r) = self.records.resharding.as_mut() {
                    r.current = None;
                }
                self.reshard_note(format!(
                    "resharding: slots {} moved atomically from shard {from} to shard {to} in {} ms",
                    plan::show(slots),
                    started.elapsed().as_millis()
                ));
            }
            Err(e) => {
                // Not done within the wait: the job goes on and the next
                // pass waits for it; failed: the engine rolled it back and
                // the next pass plans again.
                self.data_plane_failed(
                    format!("moving slots {} atomically", plan::show(slots)),
                    &e,
                )
                .await;
            }
        }
        Ok(())
    }
}

/// The primary pod of shard `index`.
fn shard_pod(plan: &Plan, index: i32) -> Option<String> {
    plan.shards
        .iter()
        .find(|s| s.index == index)
        .and_then(|s| s.primary.clone())
}

fn jiff_ms(ms: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_millis(ms)
}
