//! Configuration: the redis.conf the operator writes (its own lines, then
//! `spec.config`), `maxmemory` from the memory limit, which parameters need
//! a restart ([`restart_hash`], rolled out by [`super::rollout`]), and the
//! live application of the others with `CONFIG SET` on every reachable
//! instance.

use kube::runtime::events::EventType;

use super::Reconciler;
use super::conf::{live_keys, track_live_keys};
use super::facts::PodFacts;
use crate::controller::names;
use crate::redis::info::{EngineKind, Version};
use crate::redis::{ConnectOptions, Endpoint};

impl Reconciler {
    /// Records which keys are applied live. Removing one cannot be undone
    /// live, so it bumps `status.configResets` (part of the restart hash):
    /// the instances then restart in order and come back at the default.
    pub(super) async fn track_live_config(&mut self) -> Result<(), super::Error> {
        let (engine, version) = self.engine_version();
        let now = live_keys(&self.redis, engine, version);
        let status = self.redis.status.clone().unwrap_or_default();
        let Some((keys, resets, removed)) = track_live_keys(
            status.live_config_keys.as_deref(),
            status.config_resets,
            &now,
        ) else {
            return Ok(());
        };
        self.patch_status(serde_json::json!({
            "liveConfigKeys": keys,
            "configResets": resets,
        }))
        .await?;
        if !removed.is_empty() {
            self.event(
                EventType::Normal,
                "ConfigKeysRemoved",
                "Configure",
                format!(
                    "{} left spec.config; instances restart in order to return to the \
                     server defaults",
                    removed.join(", ")
                ),
            )
            .await;
        }
        Ok(())
    }

    /// Applies the live keys with `CONFIG SET` on every reachable instance,
    /// each judged by the version that server reports (during an upgrade a
    /// key may be live on the new version and restart-only on the old).
    /// Returns the settings of `spec.tuning` a server refused: key, value,
    /// the server's message (recorded in `status.tuning`).
    pub(super) async fn apply_live_config(
        &mut self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
        engine: EngineKind,
    ) -> Vec<(String, String, String)> {
        // The operator's own live parameters (fencing) first; the user's
        // cannot name them (refused at admission).
        let fencing = if self.redis.spec.mode() == crate::api::v1alpha1::Mode::Replication {
            super::conf::fencing_config(&self.redis)
        } else {
            Vec::new()
        };
        let tuned = super::conf::tuned_settings(&self.redis);
        if self.redis.spec.config.is_empty() && fencing.is_empty() && tuned.is_empty() {
            return Vec::new();
        }
        let mut refused_all = Vec::new();
        for f in facts.iter().filter(|f| f.reachable && !f.terminating) {
            let Some(ip) = &f.ip else { continue };
            let Some(version) = f.version.as_deref().and_then(|v| v.parse::<Version>().ok()) else {
                continue;
            };
            // While Redis moves to Valkey the instances differ.
            let engine = f.engine.unwrap_or(engine);
            let dynamic: Vec<(&str, &str)> = fencing
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .chain(
                    self.redis
                        .spec
                        .config
                        .iter()
                        .filter(|(k, _)| crate::redis::config::is_dynamic(k, engine, version))
                        .map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .collect();
            let tuned: Vec<(&str, &str)> = tuned
                .iter()
                .filter(|(k, _)| crate::redis::config::is_dynamic(k, engine, version))
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if dynamic.is_empty() && tuned.is_empty() {
                continue;
            }
            let ep = Endpoint::new(ip, names::REDIS_PORT);
            let mut refused = Vec::new();
            let result = async {
                let mut node = crate::redis::Node::connect(&ep, opts).await?;
                let mut changes = crate::redis::config::apply_config(&mut node, &dynamic).await?;
                // The operator's own tuning, one key at a time: a value the
                // server refuses is recorded, not retried every pass.
                for kv in &tuned {
                    match crate::redis::config::apply_config(&mut node, &[*kv]).await {
                        Ok(c) => changes.extend(c),
                        Err(e @ crate::redis::Error::Server { .. }) => refused.push((*kv, e)),
                        Err(e) => return Err(e),
                    }
                }
                Ok(changes)
            }
            .await;
            for ((k, v), e) in refused {
                self.event(
                    EventType::Warning,
                    "TuningRefused",
                    "Tune",
                    format!(
                        "{} refused {k} {v} (spec.tuning): {e}; not tried again",
                        f.name
                    ),
                )
                .await;
                refused_all.push((k.to_string(), v.to_string(), e.to_string()));
            }
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
                Err(e) => {
                    self.data_plane_failed(format!("applying config on {}", f.name), &e)
                        .await
                }
            }
        }
        refused_all
    }
}
