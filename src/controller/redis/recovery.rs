//! Recovery: when no server is primary any more (the primary's pod was
//! lost and every replica follows an address that is gone), promote the
//! instance that has lost the least. Level 5 failover builds here.

use kube::runtime::events::EventType;

use super::Reconciler;
use super::build;
use super::observe::{PodFacts, Role};
use super::plan;
use crate::redis::{ConnectOptions, Endpoint};

impl Reconciler {
    /// When no reachable server is primary and none of the replicas has a
    /// live link, promotes the instance furthest ahead
    /// ([`plan::promotion_candidate`]) and publishes it. The intent is
    /// recorded first, so an operator stopped between the promotion and
    /// the publication finds the promoted server on its next pass.
    pub(super) async fn recover_primary(&mut self, facts: &[PodFacts], opts: &ConnectOptions) {
        let any_primary = facts
            .iter()
            .any(|f| f.reachable && f.role == Some(Role::Primary));
        let any_linked = facts.iter().any(|f| f.link_up == Some(true));
        if any_primary || any_linked {
            self.progressing
                .push("waiting for the replication topology to settle".into());
            return;
        }
        let recorded = self.redis.status.as_ref().and_then(|s| s.primary.clone());
        let best = match plan::promotion_candidate(facts, recorded.as_deref(), &self.names) {
            Ok(best) => best,
            Err(why) => {
                self.progressing.push(why);
                return;
            }
        };
        let Some(chosen) = facts.iter().find(|f| f.name == best) else {
            return;
        };
        let Some(ip) = chosen.ip.clone() else {
            return;
        };
        let offset = chosen.offset.unwrap_or(0);
        if let Err(e) = self.record_intent(&best).await {
            self.progressing
                .push(format!("recording the promotion of {best}: {e}"));
            return;
        }
        let ep = Endpoint::new(&ip, build::REDIS_PORT);
        match crate::redis::actions::make_primary(&ep, opts).await {
            Ok(()) => {
                crate::failpoint::hit("after-promote");
                let (type_, reason, note) = match &recorded {
                    None => (
                        EventType::Normal,
                        "PrimaryElected",
                        format!("{best} is the first primary"),
                    ),
                    Some(old) => (
                        EventType::Warning,
                        "PrimaryRecovered",
                        format!(
                            "no instance was primary (last primary {old}); promoted {best}, \
                             the instance furthest ahead (offset {offset})"
                        ),
                    ),
                };
                self.event(type_, reason, "Promote", note).await;
                match self.publish_primary(facts, &best).await {
                    Ok(()) => self
                        .progressing
                        .push(format!("promoted {best}; the others follow it next")),
                    Err(e) => self
                        .progressing
                        .push(format!("recording new primary {best}: {e}")),
                }
            }
            Err(e) => {
                self.data_plane_failed(format!("promoting {best}"), &e)
                    .await
            }
        }
    }
}
