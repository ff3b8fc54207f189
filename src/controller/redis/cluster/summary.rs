//! The status of a Cluster Redis: per-shard primaries and replicas, the
//! cluster's state as its nodes report it, the resharding's progress, and
//! the conditions and phase from the rules the Replication mode uses too
//! ([`crate::controller::redis::status::record`]); then the requeue (at
//! once while slots move).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::model::{Member, Plan, View};
use super::plan;
use super::serving;
use crate::api::v1alpha1::{ClusterStatus, InstanceStatus, Phase, RedisStatus, ShardStatus};
use crate::controller::queue::Next;
use crate::controller::redis::facts::{self, Cond, PodFacts, Role};
use crate::controller::redis::report::Outcomes;
use crate::controller::redis::status;
use crate::controller::redis::{Error, Reconciler};

impl Reconciler {
    /// The status of a Cluster Redis.
    pub(super) async fn cluster_finish(
        &mut self,
        facts: &[PodFacts],
        members: &[Member],
        plan: &Plan,
        paused: bool,
        mut out: Outcomes,
    ) -> Result<Next, Error> {
        let redis = self.redis.clone();
        let spec = &redis.spec;
        let instances = spec.desired_instances();
        // Pods of shards being emptied count until they are gone.
        let width = i32::try_from(plan.shards.len()).unwrap_or(0);
        let total = width.max(spec.desired_shards()) * instances;
        self.track_cluster_bootstrap(facts, &plan.shards, plan.healthy)
            .await;
        self.report.notes_from(plan.problems.iter().cloned());
        self.report.progress_from(plan.waiting.iter().cloned());
        let ready_count = facts.iter().filter(|f| serving(f)).count() as i32;
        let all_ready = ready_count == total
            && facts.len() as i32 == total
            && plan.healthy
            && facts.iter().all(|f| f.reachable);
        let degraded = !self.report.notes().is_empty();
        self.track_wake(all_ready).await;
        let hibernated = out.hibernating && facts.is_empty();
        let progressing = (!self.report.progressing().is_empty() || !all_ready) && !hibernated;
        let single = instances == 1;
        let mut conds = vec![
            if hibernated {
                status::record::hibernated_cond()
            } else if all_ready && !degraded {
                Cond::new(
                    "Ready",
                    true,
                    "ClusterReady",
                    format!(
                        "{ready_count}/{total} instances ready, {} shards serving all 16384 slots{}",
                        spec.desired_shards(),
                        if single {
                            "; spec.instances is 1: a shard whose primary is lost loses its slots' data"
                        } else {
                            ""
                        }
                    ),
                )
            } else {
                status::record::not_ready_cond(degraded, ready_count, total)
            },
            self.progressing_cond(paused, progressing, ready_count, total),
            if degraded {
                Cond::new(
                    "Degraded",
                    true,
                    self.report.degraded_reason().unwrap_or("ClusterDegraded"),
                    self.report.notes().join("; "),
                )
            } else {
                Cond::new("Degraded", false, "AsExpected", "no problems found")
            },
        ];
        conds.extend(self.capability_conditions(&mut out));
        let looked = out.tuning.insights.is_some();
        let insights = self.insights_for_status(&mut out.tuning);
        conds.extend(self.tuned_condition(&insights, looked));
        let without = plan.without_primary();
        conds.push(if without.is_empty() {
            Cond::new(
                "PrimaryAvailable",
                true,
                "EveryShardHasAPrimary",
                "every shard has a primary serving its slots",
            )
        } else {
            Cond::new(
                "PrimaryAvailable",
                false,
                "ShardWithoutPrimary",
                format!("shard(s) {} have no primary", without.join(", ")),
            )
        });
        let old = self.redis.status.clone().unwrap_or_default();
        let phase = if paused {
            Phase::Paused
        } else if degraded {
            Phase::Degraded
        } else if hibernated {
            Phase::Hibernated
        } else if all_ready {
            Phase::Ready
        } else {
            status::record::not_ready_phase(
                old.phase,
                facts.is_empty(),
                !self.report.progressing().is_empty(),
            )
        };
        let role_of = |m: &Member| match m.view.as_ref().and_then(View::myself) {
            Some(n) if n.primary && !n.slots.is_empty() => "primary",
            Some(n) if n.replica_of.is_some() => "replica",
            _ => "unknown",
        };
        let by_pod: BTreeMap<&str, &Member> = members.iter().map(|m| (m.pod.as_str(), m)).collect();
        let instances_status: Vec<InstanceStatus> = facts
            .iter()
            .map(|f| InstanceStatus {
                name: f.name.clone(),
                role: by_pod
                    .get(f.name.as_str())
                    .map_or("unknown", |m| role_of(m))
                    .to_string(),
                ready: serving(f),
                offset: f.offset,
                lag_bytes: f.lag_bytes,
                link_up: (f.role == Some(Role::Replica)).then_some(f.link_up == Some(true)),
            })
            .collect();
        let views: Vec<&View> = members.iter().filter_map(|m| m.view.as_ref()).collect();
        let cluster = (!views.is_empty()).then(|| ClusterStatus {
            state: if views.iter().all(|v| v.info.ok) {
                "ok".into()
            } else {
                "fail".into()
            },
            slots_assigned: views
                .iter()
                .map(|v| v.info.slots_assigned)
                .min()
                .unwrap_or(0),
            slots_ok: views.iter().map(|v| v.info.slots_ok).min().unwrap_or(0),
            known_nodes: views.iter().map(|v| v.info.known_nodes).max().unwrap_or(0),
        });
        let shards: Vec<ShardStatus> = plan
            .shards
            .iter()
            .map(|s| ShardStatus {
                index: s.index,
                primary: s.primary.clone(),
                replicas: s.replicas.clone(),
                slots: (!s.slots.is_empty()).then(|| plan::show(&s.slots)),
                ready: format!("{}/{instances}", s.ready),
            })
            .collect();
        let mut versions: Vec<&str> = Vec::new();
        for v in facts.iter().filter_map(|f| f.version.as_deref()) {
            if !versions.contains(&v) {
                versions.push(v);
            }
        }
        let user_secret = spec.auth_secret_name().map(String::from);
        let mut st = RedisStatus {
            observed_generation: self.redis.metadata.generation,
            phase: Some(phase),
            current_version: if versions.is_empty() {
                old.current_version.clone()
            } else {
                Some(versions.join(", "))
            },
            ready: Some(format!("{ready_count}/{total}")),
            ready_instances: ready_count,
            instances: instances_status,
            write_service: Some(self.names.write_service()),
            auth_secret: Some(user_secret.unwrap_or_else(|| self.names.generated_secret())),
            live_config_keys: old.live_config_keys.clone(),
            config_resets: old.config_resets,
            cluster: cluster.or_else(|| old.cluster.clone()),
            shards,
            upgrade: self.records.upgrade.clone(),
            bootstrap: self.records.bootstrap.clone(),
            hibernation: self.records.hibernation.clone(),
            // Written by the autopilot's own patch this pass: kept as read.
            autopilot: old.autopilot.clone(),
            resharding: self.records.resharding.clone(),
            insights,
            tuning: self.tuning_for_status(&mut out.tuning, std::mem::take(&mut out.refused)),
            archive: self.archive_for_status(facts, old.archive.as_ref()).await,
            ..Default::default()
        };
        st.conditions = facts::merge(
            &old.conditions,
            &conds,
            self.redis.metadata.generation,
            Timestamp::now(),
        );
        // A roll under way is not steady though every instance serves: its
        // next step waits on a replica's link, which nothing else wakes
        // (passes a minute apart sampled an idle primary's 10 s pings at
        // the same phase, and the roll waited for good).
        let rolling = facts.iter().any(|f| f.outdated);
        let steady =
            all_ready && !degraded && !rolling && !self.upgrade_in_flight() && !self.moving_slots();
        if !status::record::status_differs(&old, &st) {
            return Ok(self.cluster_requeue(steady, &st, out.memory.due));
        }
        self.patch_status(status::record::merge_patch_value(&old, &st)?)
            .await?;
        if old.phase != st.phase {
            let (t, note) = match phase {
                Phase::Ready => (
                    EventType::Normal,
                    format!(
                        "all {total} instances ready; {} shards serve all 16384 slots",
                        spec.desired_shards()
                    ),
                ),
                Phase::Degraded => (EventType::Warning, self.report.notes().join("; ")),
                p => (EventType::Normal, format!("phase {p:?}")),
            };
            self.event(t, &format!("{phase:?}"), "Reconcile", note)
                .await;
        }
        if single && old.phase.is_none() {
            self.event(
                EventType::Warning,
                "NoReplicas",
                "Reconcile",
                "spec.instances is 1: no shard has a replica, so a lost primary loses its \
                 slots' data and they stay unserved until the Redis is re-created"
                    .into(),
            )
            .await;
        }
        Ok(self.cluster_requeue(steady, &st, out.memory.due))
    }

    /// Slots are moving (not paused, not done).
    pub(super) fn moving_slots(&self) -> bool {
        use crate::api::v1alpha1::ReshardingPhase;
        self.records
            .resharding
            .as_ref()
            .is_some_and(|r| r.phase == ReshardingPhase::Moving)
    }

    /// The next pass comes at once while slots move.
    fn cluster_requeue(&self, steady: bool, st: &RedisStatus, due: Option<Duration>) -> Next {
        if self.moving_slots() && self.report.notes().is_empty() {
            return Next::after(Duration::from_millis(200));
        }
        self.requeue(steady, st, due)
    }
}
