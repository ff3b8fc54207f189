//! Recovery of a Redis that has no recorded primary yet (being created:
//! every instance booted as a replica): promote ordinal 0, or the instance
//! furthest ahead. A recorded primary that is lost is the failover
//! module's ([`super::failover`]).

use kube::runtime::events::EventType;

use super::Reconciler;
use super::facts::{PodFacts, Role};
use super::plan;
use crate::controller::names;
use crate::redis::{ConnectOptions, Endpoint};

impl Reconciler {
    /// For a Redis without a recorded primary: when no reachable server is
    /// primary and none of the replicas has a live link, promotes ordinal 0
    /// (or the instance furthest ahead, [`plan::promotion_candidate`]) and
    /// publishes it. The intent is
    /// recorded first, so an operator stopped between the promotion and
    /// the publication finds the promoted server on its next pass.
    pub(super) async fn recover_primary(&mut self, facts: &[PodFacts], opts: &ConnectOptions) {
        let any_primary = facts
            .iter()
            .any(|f| f.reachable && f.role == Some(Role::Primary));
        let any_linked = facts.iter().any(|f| f.link_up == Some(true));
        if any_primary || any_linked {
            self.report
                .progress("waiting for the replication topology to settle".into());
            return;
        }
        if self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.primary.as_ref())
            .is_some()
        {
            return;
        }
        let restoring = self.records.bootstrap.as_ref().is_some_and(|b| !b.done);
        let best = match plan::promotion_candidate(facts, &self.names, restoring) {
            Ok(best) => best,
            Err(why) => {
                self.report.progress(why);
                return;
            }
        };
        let Some(chosen) = facts.iter().find(|f| f.name == best) else {
            return;
        };
        let Some(ip) = chosen.ip.clone() else {
            return;
        };
        if let Err(e) = self.record_intent(&best).await {
            self.report
                .progress(format!("recording the promotion of {best}: {e}"));
            return;
        }
        let ep = Endpoint::new(&ip, names::REDIS_PORT);
        let fence = super::conf::fencing_config(&self.redis);
        match self.make_primary(&ep, opts, &fence).await {
            Ok(()) => {
                crate::failpoint::hit("after-promote");
                let note = format!("{best} is the first primary");
                self.event(EventType::Normal, "PrimaryElected", "Promote", note)
                    .await;
                match self.publish_primary(facts, &best).await {
                    Ok(()) => self
                        .report
                        .progress(format!("promoted {best}; the others follow it next")),
                    Err(e) => self
                        .report
                        .progress(format!("recording new primary {best}: {e}")),
                }
            }
            Err(e) => {
                self.data_plane_failed(format!("promoting {best}"), &e)
                    .await
            }
        }
    }
}
