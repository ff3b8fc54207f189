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
    /// live link, promotes the reachable replica with the highest offset
    /// (ties: lowest ordinal) and publishes it.
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
        let Some(best) = plan::most_advanced(facts) else {
            self.progressing
                .push("no reachable instance to promote".into());
            return;
        };
        let Some(ip) = facts
            .iter()
            .find(|f| f.name == best)
            .and_then(|f| f.ip.clone())
        else {
            return;
        };
        let ep = Endpoint::new(&ip, build::REDIS_PORT);
        match crate::redis::actions::make_primary(&ep, opts).await {
            Ok(()) => {
                self.event(
                    EventType::Warning,
                    "PrimaryRecovered",
                    "Promote",
                    format!(
                        "no instance was primary; promoted {best}, the instance furthest ahead"
                    ),
                )
                .await;
                match self.publish_primary(facts, &best).await {
                    Ok(()) => self
                        .progressing
                        .push(format!("promoted {best}; the others follow it next")),
                    Err(e) => self
                        .progressing
                        .push(format!("recording new primary {best}: {e}")),
                }
            }
            Err(e) => self.progressing.push(format!("promoting {best}: {e}")),
        }
    }
}
