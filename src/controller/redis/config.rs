//! Live configuration: parameters the running engine can change without a
//! restart are applied with `CONFIG SET` on every reachable instance.
//! Parameters that need a restart change the pod template instead (see
//! [`super::build::restart_hash`] and [`super::rollout`]).

use kube::runtime::events::EventType;

use super::Reconciler;
use super::build;
use super::observe::PodFacts;
use crate::redis::info::{EngineKind, Version};
use crate::redis::{ConnectOptions, Endpoint};

impl Reconciler {
    pub(super) async fn apply_live_config(
        &mut self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
        engine: EngineKind,
        version: Version,
    ) {
        let dynamic: Vec<(&str, &str)> = self
            .redis
            .spec
            .config
            .iter()
            .filter(|(k, _)| crate::redis::config::is_dynamic(k, engine, version))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if dynamic.is_empty() {
            return;
        }
        for f in facts.iter().filter(|f| f.reachable) {
            let Some(ip) = &f.ip else { continue };
            let ep = Endpoint::new(ip, build::REDIS_PORT);
            let result = async {
                let mut node = crate::redis::Node::connect(&ep, opts).await?;
                crate::redis::config::apply_config(&mut node, &dynamic).await
            }
            .await;
            match result {
                Ok(changes) if !changes.is_empty() => {
                    let list = changes
                        .iter()
                        .map(|c| c.name)
                        .collect::<Vec<_>>()
                        .join(", ");
                    self.event(
                        EventType::Normal,
                        "ConfigApplied",
                        "Configure",
                        format!("applied {list} live on {} without a restart", f.name),
                    )
                    .await;
                }
                Ok(_) => {}
                Err(e) => self
                    .progressing
                    .push(format!("applying config on {}: {e}", f.name)),
            }
        }
    }
}
