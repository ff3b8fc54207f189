//! The last step of a resharding to fewer shards: a shard past
//! `spec.shards` whose slots all moved away is removed (its StatefulSet
//! deleted) once its primary is seen to hold no key; its node IDs are then
//! forgotten by the plan's forget rule once no pod runs them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::DeleteParams;
use kube::runtime::events::EventType;

use super::build;
use super::model::Plan;
use crate::controller::redis::{Error, Reconciler};
use crate::redis::Node;

impl Reconciler {
    /// The shards past `spec.shards` once empty: their StatefulSets go.
    pub(super) async fn remove_emptied(
        &mut self,
        plan: &Plan,
        shards: usize,
        conns: &mut BTreeMap<String, Node>,
    ) -> Result<bool, Error> {
        let mut acted = false;
        for s in plan.shards.iter().skip(shards) {
            if !s.slots.is_empty() {
                continue;
            }
            let name = build::shard_statefulset_name(&self.names, s.index);
            let live: Option<StatefulSet> = self.cached(&name);
            if live.is_none() {
                self.reshard_note(format!(
                    "shard {} removed; waiting for its pods to stop",
                    s.index
                ));
                continue;
            }
            // Keys left in a primary that serves no slot would be lost
            // with it: checked, not assumed.
            let pod = s.primary.clone().unwrap_or_default();
            let keys = match conns.get_mut(&pod) {
                Some(node) => node
                    .query::<u64>("DBSIZE", &redis::cmd("DBSIZE"))
                    .await
                    .ok(),
                None => None,
            };
            match keys {
                Some(0) => {}
                Some(n) => {
                    self.report_failure(
                        "ReshardingStuck",
                        "Reshard",
                        "redis",
                        format!(
                            "shard {} serves no slot but {pod} still holds {n} keys: it is not removed",
                            s.index
                        ),
                    )
                    .await;
                    continue;
                }
                None => {
                    self.reshard_note(format!(
                        "shard {}: waiting for {pod} to answer before it is removed",
                        s.index
                    ));
                    continue;
                }
            }
            self.ctx.metrics.kube("delete");
            self.report.wrote();
            match self
                .api::<StatefulSet>()
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            acted = true;
            let note = format!(
                "shard {} holds no slot and no key: StatefulSet {name} deleted",
                s.index
            );
            tracing::info!(redis = %self.oref, "{note}");
            self.reshard_note(note.clone());
            self.event(EventType::Normal, "ShardRemoved", "Reshard", note)
                .await;
        }
        Ok(acted)
    }
}
