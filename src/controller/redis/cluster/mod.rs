//! Cluster mode: the topology seam of a Redis Cluster. The shared pipeline
//! (password, observation of pods and servers, server-side apply of the
//! children, live configuration, status writes) is the Replication mode's;
//! what differs is here:
//!
//! | step | where | what |
//! |---|---|---|
//! | children | [`build`] | one StatefulSet per shard, the client Service, the boot rule |
//! | observe | [`Reconciler::cluster_views`] | `CLUSTER NODES` and `CLUSTER INFO` from every node |
//! | decide | [`plan`] | pure: meet, assign slots, attach replicas, forget stale IDs |
//! | act | [`Reconciler::cluster_steps`] | the steps, each reported |
//! | unstick | [`elect`] | a shard whose replicas cannot elect one on their own: `FAILOVER FORCE` |
//! | status | [`summary`] | per-shard primaries, the cluster's state |
//!
//! Failover is the cluster's own: when a shard's primary fails, its
//! replicas elect one of themselves within about three node timeouts. The
//! operator finishes what the cluster cannot (empty nodes attached, stale
//! IDs forgotten, a replica too long unlinked to stand promoted: [`elect`])
//! and reports a shard that has no one left to take over.

pub mod build;
pub mod elect;
pub mod model;
pub mod moves;
pub mod plan;
pub mod reshard;
pub mod roll;
pub mod shrink;
pub mod summary;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::controller::queue::Next;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::EventType;

use super::facts::{PodFacts, Role};
use super::report::Outcomes;
use super::{Error, Reconciler};
use crate::redis::cluster as rc;
use crate::redis::{ConnectOptions, Endpoint, Node};

use self::model::{Member, Plan, Step, View};

/// A pod counts as ready when it is Ready and, as a replica, linked to its
/// primary with its sync done: the readiness probe of a node not yet
/// attached saw a primary, and a replica still in its first sync cannot
/// take over its shard (the engines refuse: "disconnected from primary for
/// longer than allowed").
fn serving(f: &PodFacts) -> bool {
    f.ready && (f.role != Some(Role::Replica) || f.link_up == Some(true))
}

/// How long a pass waits for a `CLUSTER FAILOVER` to complete (the
/// replica catches up with its paused primary, then takes the slots; the
/// servers themselves abort a manual failover not done within 5 s).
const FAILOVER_WAIT: Duration = Duration::from_secs(5);

impl Reconciler {
    /// One pass over a Cluster Redis.
    pub(super) async fn run_cluster(&mut self) -> Result<Next, Error> {
        let paused = self.redis.spec.paused;
        let super::Begun {
            wanted: wanted_password,
            auth,
            opts,
            obs,
        } = match self.begin(paused).await? {
            Ok(b) => b,
            Err(action) => return Ok(action),
        };
        let mut facts = obs.facts;
        // What the steps decide for the status, as they return it.
        let mut out = Outcomes::default();
        self.mark_outdated(&mut facts);
        let (views, mut conns) = if obs.servers_observed {
            self.cluster_views(&facts, &opts).await
        } else {
            (BTreeMap::new(), BTreeMap::new())
        };
        let members = self.members(&facts, &views);
        let shards = self.redis.spec.desired_shards();
        let instances = self.redis.spec.desired_instances();
        // A Redis restored from a backup: nothing is created before the
        // backup is resolved (its shard files are then fixed in the status).
        if !self.resolve_bootstrap().await? {
            let plan = plan::decide(&members, shards, instances);
            return self
                .cluster_finish(&facts, &members, &plan, paused, out)
                .await;
        }
        let restoring = self.records.bootstrap.as_ref().is_some_and(|b| !b.done);
        // Restored to a time: the shards' slots are known once every
        // shard's restore reported them; until then the pods start (their
        // restores run) and nothing is asked of the servers.
        let layout_known = self.pitr_layout().await;
        let recorded = self
            .redis
            .status
            .as_ref()
            .map(|s| {
                s.shards
                    .iter()
                    .map(|x| {
                        x.slots
                            .as_deref()
                            .and_then(rc::parse_ranges)
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        // While restoring, each shard's home is the backed-up layout (a
        // backup taken after a resharding holds no even spread).
        let homes = match &self.records.bootstrap {
            Some(b) if restoring && layout_known && !b.shards.is_empty() => b
                .shards
                .iter()
                .map(|s| rc::parse_ranges(&s.slots).unwrap_or_default())
                .collect(),
            _ => Vec::new(),
        };
        let mut plan = plan::decide_shape(
            &members,
            &plan::Shape {
                shards,
                instances,
                restoring,
                recorded,
                homes,
            },
        );
        if !layout_known {
            plan.steps.clear();
            plan.waiting.push(
                "waiting for every shard's restore to a point in time to report the slots it served"
                    .into(),
            );
        }

        if paused {
            self.report
                .progress("reconciliation is paused (spec.paused)".into());
            return self
                .cluster_finish(&facts, &members, &plan, true, out)
                .await;
        }

        // Hibernation: every shard saves (writes paused on its primary,
        // its replicas caught up), then every shard scales to zero; nothing
        // else moves.
        if self.redis.spec.hibernate {
            self.watch_shard_primaries(&facts, &[], "");
            let names = self.names.clone();
            let groups: Vec<(Option<&str>, Vec<PodFacts>)> = plan
                .shards
                .iter()
                .map(|s| {
                    let mine = facts
                        .iter()
                        .filter(|f| {
                            build::shard_of(&names, &f.name).is_some_and(|(i, _)| i == s.index)
                        })
                        .cloned()
                        .collect();
                    (s.primary.as_deref(), mine)
                })
                .collect();
            out.hibernating = self.hibernate(&facts, &groups, &opts).await?;
            if out.hibernating {
                self.apply_cluster_children(&facts, true).await?;
            }
            return self
                .cluster_finish(&facts, &members, &plan, false, out)
                .await;
        }

        // A changed version starts an upgrade (recorded before the
        // StatefulSets change); a failed one is rolled back. The restarts
        // are the ordered restart's ([`roll`]).
        let sts: Vec<Option<StatefulSet>> = (0..shards)
            .map(|s| self.cached(&build::shard_statefulset_name(&self.names, s)))
            .collect();
        let settled = sts.iter().all(|s| {
            s.as_ref()
                .is_some_and(crate::controller::layout::sts_observed)
        });
        let primaries: Vec<&str> = plan
            .shards
            .iter()
            .filter_map(|s| s.primary.as_deref())
            .collect();
        let first = sts.first().and_then(Option::as_ref);
        // An upgrade is of the shards the spec keeps. Counting a shard a
        // resharding empties to remove (it keeps the old template, the roll
        // never restarts it) left an upgrade begun during a scale-down
        // waiting for it for good, and the removal waiting for the upgrade
        // (chaos seed 15).
        let kept: Vec<PodFacts> = facts
            .iter()
            .filter(|f| build::in_kept_shard(&self.names, &f.name, shards))
            .cloned()
            .collect();
        out.upgrade = self
            .track_upgrade(first, settled, &kept, &primaries)
            .await?;

        self.track_live_config().await?;
        // The memory limit, decided before the templates are built from
        // it; the monitor samples every shard primary's memory.
        let by_shard: Vec<(usize, &str)> = plan
            .shards
            .iter()
            .filter_map(|s| Some((usize::try_from(s.index).ok()?, s.primary.as_deref()?)))
            .collect();
        self.watch_shard_primaries(&facts, &by_shard, &auth.current);
        out.memory = self.autopilot(&facts, &primaries).await?;
        // More or fewer shards (a change of spec.shards; the next pass
        // reshards).
        self.shard_autopilot(&plan, &facts, &mut out.memory).await?;
        let template_changed = self.apply_cluster_children(&facts, false).await?;
        if !self.report.notes().is_empty() {
            return self
                .cluster_finish(&facts, &members, &plan, false, out)
                .await;
        }
        if obs.servers_observed && layout_known {
            self.rotate_password(&facts, &auth, &wanted_password)
                .await?;
            if super::auth::next_step(&auth, &wanted_password) == super::auth::Step::Steady {
                self.apply_users(&facts, &auth).await?;
            }
            self.cluster_steps(&plan, &members, &mut conns).await;
            self.force_stuck_elections(&plan, &mut conns).await;
            // Slots moving after `spec.shards` changed: one step per pass,
            // and nothing else touches the servers in that pass.
            let resharded = plan.steps.is_empty()
                && self
                    .reshard(&plan, &members, &facts, &mut conns, (&auth.current, &opts))
                    .await?;
            // The memory autopilot's limit reaches the instances: in place,
            // every replica before the primaries, or by marking them for
            // the ordered restart below.
            if plan.steps.is_empty() && !resharded {
                self.autopilot_resize(&mut facts, &primaries, &opts, &mut out.memory)
                    .await?;
            }
            // Not in a pass that changed a template: the pods it would
            // call outdated were judged against the revision before.
            if plan.steps.is_empty() && !resharded && !template_changed {
                // The status tells who serves each shard after this pass.
                if let Some((shard, new, old)) = self
                    .cluster_roll(&plan, &members, &facts, &mut conns)
                    .await?
                {
                    roll::after_failover(&mut plan, shard, &new, &old);
                }
            }
            // TLS turned on or off: every node switched live at once.
            let healthy = plan.healthy && members.iter().all(|m| m.ready && !m.terminating);
            if plan.steps.is_empty()
                && !resharded
                && self.switch_cluster_tls(&facts, &opts, healthy).await
            {
                return self
                    .cluster_finish(&facts, &members, &plan, false, out)
                    .await;
            }
            let (engine, _) = self.engine_version();
            out.refused = self.apply_live_config(&facts, &opts, engine).await;
            // A renewed certificate is read live, on every node.
            self.reload_certificates(&facts, &opts, &auth).await?;
            // Tuning advice, now and then, when every server answers (keys
            // are sampled in every shard: on a replica, else on the
            // primary while it is quiet).
            if plan.steps.is_empty() && !resharded {
                let names = self.names.clone();
                out.tuning = self
                    .tune(&facts, None, &opts, |pod| {
                        build::shard_of(&names, pod).map(|(s, _)| s)
                    })
                    .await;
            }
        }
        self.cluster_finish(&facts, &members, &plan, false, out)
            .await
    }

    /// A pod runs an older template than its shard's StatefulSet.
    fn mark_outdated(&self, facts: &mut [PodFacts]) {
        for f in facts.iter_mut() {
            let Some((shard, _)) = build::shard_of(&self.names, &f.name) else {
                continue;
            };
            let sts: Option<StatefulSet> =
                self.cached(&build::shard_statefulset_name(&self.names, shard));
            let want = sts
                .as_ref()
                .filter(|s| crate::controller::layout::sts_observed(s))
                .and_then(|s| s.status.as_ref()?.update_revision.clone());
            // Revisions kept by the operator's own template changes (a new
            // release, the memory autopilot's in-place resize) are current.
            let kept = super::kept::kept_revisions(sts.as_ref());
            f.outdated =
                matches!((want, &f.revision), (Some(w), Some(h)) if &w != h && !kept.contains(h));
        }
    }

    /// `CLUSTER NODES` and `CLUSTER INFO` from every node that answered
    /// `INFO`, and the connections (reused for the steps).
    async fn cluster_views(
        &self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
    ) -> (BTreeMap<String, View>, BTreeMap<String, Node>) {
        let asks = facts
            .iter()
            .filter(|f| f.reachable && !f.terminating)
            .filter_map(|f| Some((f.name.clone(), f.ip.clone()?)))
            .map(|(pod, ip)| async move {
                let ep = Endpoint::new(&ip, crate::controller::names::REDIS_PORT);
                let mut node = Node::connect(&ep, opts).await.ok()?;
                let text: String = node
                    .query("CLUSTER NODES", redis::cmd("CLUSTER").arg("NODES"))
                    .await
                    .ok()?;
                let nodes = rc::parse_nodes(&text).ok()?;
                let open = crate::redis::reshard::open_slots(&text);
                let info = rc::info(&mut node).await.ok()?;
                Some((pod, View { nodes, info, open }, node))
            });
        let mut views = BTreeMap::new();
        let mut conns = BTreeMap::new();
        for (pod, view, node) in futures::future::join_all(asks).await.into_iter().flatten() {
            views.insert(pod.clone(), view);
            conns.insert(pod, node);
        }
        (views, conns)
    }

    fn members(&self, facts: &[PodFacts], views: &BTreeMap<String, View>) -> Vec<Member> {
        let mut out: Vec<Member> = facts
            .iter()
            .filter_map(|f| {
                let (shard, ordinal) = build::shard_of(&self.names, &f.name)?;
                Some(Member {
                    pod: f.name.clone(),
                    shard,
                    ordinal,
                    ip: f.ip.clone(),
                    ready: serving(f),
                    terminating: f.terminating,
                    view: views.get(&f.name).cloned(),
                    following: f.following.clone(),
                    link_up: f.link_up,
                })
            })
            .collect();
        out.sort_by_key(|m| (m.shard, m.ordinal));
        out
    }

    /// The ConfigMap, the Services, the PDB and one StatefulSet per shard;
    /// `hibernating`: with no pod. Returns whether a shard's StatefulSet
    /// spec changed (see [`super::children::Applied`]).
    async fn apply_cluster_children(
        &mut self,
        facts: &[PodFacts],
        hibernating: bool,
    ) -> Result<bool, Error> {
        let mut template_changed = false;
        // While TLS is turned on or off: the flip's templates.
        let view = self.children_view(facts);
        let mut cm = super::conf::config_map(&view, &self.names, None, self.bootstrapped());
        // Saved for hibernation: the nodes that start next (on waking) skip
        // the boot rule's wait; cleared once the Redis is Ready again.
        if let Some(saved) = self
            .records
            .hibernation
            .as_ref()
            .and_then(|h| h.saved_at.clone())
        {
            cm.data
                .get_or_insert_with(Default::default)
                .insert(crate::controller::names::WAKING_KEY.to_string(), saved);
            cm = crate::controller::names::stamp_hash(cm);
        }
        let live_cm: Option<ConfigMap> = self.lookup(&self.names.config()).await?;
        self.apply_or_degrade("ConfigMap", &cm, live_cm.as_ref())
            .await?;
        self.config_applied = Some(cm);
        self.apply_services_and_pdb(build::services(&self.redis, &self.names))
            .await?;

        let (restart, image) = self.template_inputs();
        let secret = self.names.server_auth();
        for shard in 0..self.redis.spec.desired_shards() {
            let mine: Vec<PodFacts> = facts
                .iter()
                .filter(|f| build::shard_of(&self.names, &f.name).is_some_and(|(s, _)| s == shard))
                .cloned()
                .collect();
            let memory_limit = self.template_memory_limit(&mine);
            let sts = build::shard_statefulset(
                &view,
                &self.names,
                shard,
                &secret,
                &restart,
                &image,
                memory_limit,
            );
            let mut sts = sts;
            if let Some(bs) = &self.records.bootstrap
                && let Some(file) = bs.shards.iter().find(|f| f.index == shard)
            {
                let first = build::first_of_shard(&self.names, shard);
                let line = crate::backup::archive::shard_line(file.index);
                super::bootstrap::add_restore(
                    &mut sts,
                    bs,
                    (&file.key, &line),
                    &first,
                    &self.names,
                    &view,
                );
            }
            let name = build::shard_statefulset_name(&self.names, shard);
            let live: Option<StatefulSet> = self.lookup(&name).await?;
            let (mut sts, _) = self.keep_operator_revisions(live.as_ref(), sts, &mine);
            if hibernating {
                sts = super::hibernate::scaled_to_zero(sts);
            }
            if self.grow_volumes(&mut sts, live.as_ref()).await? == super::volumes::Growth::Hold {
                continue;
            }
            let wrote = self
                .apply_or_degrade("StatefulSet", &sts, live.as_ref())
                .await?;
            if wrote && live.is_some() {
                template_changed = true;
                self.report.progress(format!("StatefulSet {name} updated"));
            }
        }
        Ok(template_changed)
    }

    /// Takes the plan's steps, reporting each kind once per pass.
    async fn cluster_steps(
        &mut self,
        plan: &Plan,
        members: &[Member],
        conns: &mut BTreeMap<String, Node>,
    ) {
        let mut met = Vec::new();
        let mut slotted = Vec::new();
        let mut attached = Vec::new();
        let mut forgotten = Vec::new();
        for step in &plan.steps {
            let done = match step {
                Step::Meet { from, to, ip } => {
                    let other = rc::Member {
                        endpoint: Endpoint::new(ip, crate::controller::names::REDIS_PORT),
                        bus_port: build::BUS_PORT,
                    };
                    let r = match conns.get_mut(from) {
                        Some(n) => rc::meet(n, &other).await,
                        None => continue,
                    };
                    r.map(|()| met.push(to.clone()))
                        .map_err(|e| (format!("{from} meeting {to}"), e))
                }
                Step::AddSlots { pod, ranges } => {
                    let r = match conns.get_mut(pod) {
                        Some(n) => rc::add_slots(n, ranges).await,
                        None => continue,
                    };
                    let r = r
                        .map(|()| slotted.push(format!("{pod}: {}", plan::show(ranges))))
                        .map_err(|e| (format!("assigning slots to {pod}"), e));
                    // A test stops the operator here: some slots assigned,
                    // the rest not, no event written yet.
                    crate::failpoint::hit("cluster-after-slots");
                    r
                }
                Step::Replicate {
                    pod,
                    primary,
                    primary_id,
                } => {
                    let r = match conns.get_mut(pod) {
                        Some(n) => rc::replicate(n, primary_id).await,
                        None => continue,
                    };
                    r.map(|()| attached.push(format!("{pod} follows {primary}")))
                        .map_err(|e| (format!("attaching {pod} to {primary}"), e))
                }
                Step::Forget { id } => {
                    // Every node must forget within a minute, or gossip
                    // brings the ID back; one that never knew it says so.
                    let mut failed = None;
                    for m in members {
                        let Some(n) = conns.get_mut(&m.pod) else {
                            continue;
                        };
                        if let Err(e) = rc::forget(n, id).await
                            && !e.to_string().contains("Unknown node")
                        {
                            failed = Some((format!("{} forgetting node {id}", m.pod), e));
                        }
                    }
                    match failed {
                        None => {
                            forgotten.push(id.clone());
                            Ok(())
                        }
                        Some(f) => Err(f),
                    }
                }
            };
            if let Err((what, e)) = done {
                self.data_plane_failed(what, &e).await;
            }
        }
        let report = |reason: &'static str, what: &str, list: Vec<String>| {
            (!list.is_empty()).then(|| (reason, format!("{what}: {}", list.join("; "))))
        };
        let reports: Vec<(&'static str, String)> = [
            report("ClusterMeet", "nodes joined the cluster", met),
            report("SlotsAssigned", "slots assigned", slotted),
            report("ReplicaAttached", "replicas attached", attached),
            report(
                "NodeForgotten",
                "node IDs no pod runs were forgotten on every node",
                forgotten,
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        for (reason, note) in reports {
            tracing::info!(redis = %self.oref, reason, "{note}");
            self.report.progress(note.clone());
            self.report.wrote();
            self.event(EventType::Normal, reason, "Cluster", note).await;
        }
    }

    /// A failover `spec.failover.switchoverTo` asks for, then the ordered
    /// restart of pods running an older template ([`roll`]): at most one
    /// action per pass. A failover done returns (shard, new primary, old
    /// primary).
    async fn cluster_roll(
        &mut self,
        plan: &Plan,
        members: &[Member],
        facts: &[PodFacts],
        conns: &mut BTreeMap<String, Node>,
    ) -> Result<Option<(i32, String, String)>, Error> {
        let outdated: BTreeSet<String> = facts
            .iter()
            .filter(|f| f.outdated)
            .map(|f| f.name.clone())
            .collect();
        if let Some(to) = self.redis.spec.failover().switchover_to {
            match roll::requested_failover(plan, members, &outdated, &to) {
                Err(msg) => {
                    self.report_failure("InvalidSwitchoverTarget", "Switchover", "spec", msg)
                        .await;
                }
                Ok(roll::Roll::Failover {
                    replica,
                    primary,
                    shard,
                }) => {
                    let done = self
                        .cluster_failover(
                            &replica,
                            &primary,
                            shard,
                            "requested in spec.failover.switchoverTo",
                            conns,
                        )
                        .await;
                    return Ok(done.then_some((shard, replica, primary)));
                }
                Ok(roll::Roll::Wait(w)) => self.report.progress(w),
                Ok(_) => {}
            }
        }
        let step = roll::next_restart(plan, members, &outdated, self.redis.spec.storage.is_some());
        // A lone restart is of a pod that does not answer: no backup reads
        // from it.
        let lone = matches!(step, roll::Roll::RestartLone { .. });
        match step {
            roll::Roll::Idle => {}
            roll::Roll::Wait(w) => self.report.progress(w),
            roll::Roll::Restart { pod, shard } | roll::Roll::RestartLone { pod, shard } => {
                if !lone
                    && (self.backup_holds_restart(&pod).await?
                        || self.archive_holds_restart(facts, &pod).await)
                {
                    return Ok(None);
                }
                self.restart_pod(&pod).await?;
                let note = format!(
                    "restarted {pod} (shard {shard}) {}; {} of {} instances ran an older template",
                    self.roll_purpose(),
                    outdated.len(),
                    members.len()
                );
                tracing::info!(redis = %self.oref, "{note}");
                self.report.progress(note.clone());
                self.event(EventType::Normal, "RollingRestart", "Restart", note)
                    .await;
            }
            roll::Roll::Failover {
                replica,
                primary,
                shard,
            } => {
                // The replica taking the slots is proven first: linked,
                // heard from within 2 s and caught up.
                let primaries = [primary.as_str()];
                if !facts
                    .iter()
                    .any(|f| f.name == replica && super::upgrade::proven(f, &primaries))
                {
                    self.report.progress(format!(
                        "shard {shard}: the failover to {replica} waits for it to catch up with {primary}"
                    ));
                    return Ok(None);
                }
                let why = format!("rolling restart {}", self.roll_purpose());
                let done = self
                    .cluster_failover(&replica, &primary, shard, &why, conns)
                    .await;
                return Ok(done.then_some((shard, replica, primary)));
            }
        }
        Ok(None)
    }

    /// Why the ordered restart runs, for its events.
    fn roll_purpose(&self) -> String {
        use crate::api::v1alpha1::UpgradePhase;
        match self.records.upgrade.as_ref() {
            Some(u) if u.phase == UpgradePhase::Upgrading => {
                format!("to upgrade it to {:?} {}", u.to.engine, u.to.version)
            }
            Some(u) if u.phase == UpgradePhase::RollingBack => {
                format!("to roll it back to {:?} {}", u.from.engine, u.from.version)
            }
            _ => "to apply settings that need a restart".into(),
        }
    }

    /// `CLUSTER FAILOVER` on `replica` (graceful: no acknowledged write is
    /// lost), then up to [`FAILOVER_WAIT`] for it to serve the slots. True
    /// once it does.
    async fn cluster_failover(
        &mut self,
        replica: &str,
        primary: &str,
        shard: i32,
        why: &str,
        conns: &mut BTreeMap<String, Node>,
    ) -> bool {
        let Some(node) = conns.get_mut(replica) else {
            self.report.progress(format!(
                "shard {shard}: failover to {replica} ({why}) waits for it to answer"
            ));
            return false;
        };
        let started = Instant::now();
        self.report.wrote();
        if let Err(e) = rc::failover(node).await {
            self.data_plane_failed(format!("failover of shard {shard} to {replica}"), &e)
                .await;
            return false;
        }
        let mut took_over = false;
        while started.elapsed() < FAILOVER_WAIT {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Ok(nodes) = rc::nodes(node).await
                && nodes.iter().any(|n| n.myself && n.primary)
            {
                took_over = true;
                break;
            }
        }
        let ms = started.elapsed().as_millis();
        if took_over {
            let note = format!(
                "shard {shard}: {replica} took over the slots from {primary} ({why}) in {ms} ms"
            );
            tracing::info!(redis = %self.oref, "{note}");
            self.report.progress(note.clone());
            self.event(EventType::Normal, "ClusterFailover", "Failover", note)
                .await;
        } else {
            self.report.progress(format!(
                "shard {shard}: failover from {primary} to {replica} ({why}) requested; not done after {ms} ms"
            ));
        }
        took_over
    }
}
