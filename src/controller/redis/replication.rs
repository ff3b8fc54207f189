//! The Standalone and Replication topology: one primary and its replicas
//! in one StatefulSet. A pass observes, decides the primary
//! ([`super::plan::choose_primary`]), replaces a lost one
//! ([`super::failover`]), wires the replicas ([`super::wiring`]), promotes
//! the first primary of a new Redis ([`super::recovery`]) and rolls
//! restarts with switchovers ([`super::rollout`]); the Cluster topology is
//! [`super::cluster`]. Both are entered from [`super::Reconciler`]'s `run`,
//! the only place that tells the modes apart for the pass as a whole.

use crate::controller::queue::Next;

use super::report::Outcomes;
use super::{Begun, Error, Reconciler, facts, plan};
use crate::api::v1alpha1::Mode;

impl Reconciler {
    /// One pass over a Standalone or Replication Redis.
    pub(super) async fn run_replication(&mut self) -> Result<Next, Error> {
        let paused = self.redis.spec.paused;
        let desired = self.redis.spec.desired_instances();

        // 1. The password: the desired one (the user's Secret or the
        // generated one) and the one the servers run (server-auth Secret).
        // 2. Observe pods and the live servers.
        let Begun {
            wanted: wanted_password,
            auth,
            opts,
            obs,
        } = match self.begin(paused).await? {
            Ok(b) => b,
            Err(action) => return Ok(action),
        };
        let facts = obs.facts;
        // What the steps decide for the status, as they return it.
        let mut out = Outcomes::default();

        // A Redis loaded from a backup: nothing is created before the
        // backup is resolved (its location is then fixed in the status).
        if !self.resolve_bootstrap().await? {
            return self.finish(&facts, None, desired, false, out).await;
        }

        // 3. Decide the primary.
        let previous_primary = self.redis.status.as_ref().and_then(|s| s.primary.clone());
        let target = self
            .redis
            .status
            .as_ref()
            .and_then(|s| s.target_primary.clone());
        let primary = plan::choose_primary(
            &facts,
            previous_primary.as_deref(),
            target.as_deref(),
            &self.names,
        )
        // In Replication mode every instance boots as a replica: a primary
        // is adopted only once a server answers as one (or it is the one on
        // record). Recording an instance that never served would make its
        // first start look like a lost primary.
        .filter(|p| {
            self.redis.spec.mode() != Mode::Replication
                || previous_primary.as_deref() == Some(p.as_str())
                || facts
                    .iter()
                    .any(|f| f.name == *p && f.reachable && f.role == Some(facts::Role::Primary))
        });

        if paused {
            self.report
                .progress("reconciliation is paused (spec.paused)".into());
            return self
                .finish(&facts, primary.as_deref(), desired, true, out)
                .await;
        }

        // Hibernation: save, then scale to zero; nothing else moves.
        if self.redis.spec.hibernate {
            self.watch_primary(&facts, None, "");
            let group = (
                previous_primary.as_deref().or(primary.as_deref()),
                facts.clone(),
            );
            out.hibernating = self.hibernate(&facts, &[group], &opts).await?;
            if out.hibernating {
                let secret = self.names.server_auth();
                self.apply_children(&obs.live_sts, &facts, None, &secret, true)
                    .await?;
                return self.finish(&facts, None, desired, false, out).await;
            }
            return self
                .finish(&facts, primary.as_deref(), desired, false, out)
                .await;
        }

        // A primary made read-only from outside (a Redis that followed this
        // one was promoted): nothing here becomes writable on its own.
        if obs.servers_observed && self.demoted(&facts, &opts).await? {
            self.watch_primary(&facts, None, "");
            return self
                .finish(&facts, primary.as_deref(), desired, false, out)
                .await;
        }

        // A lost primary is replaced before anything else: the monitor
        // asked for this pass as soon as it stopped answering.
        self.watch_primary(
            &facts,
            previous_primary.as_deref().or(primary.as_deref()),
            &auth.current,
        );
        if self.redis.spec.mode() == Mode::Replication
            && obs.servers_observed
            && let Some(recorded) = previous_primary.as_deref()
            && primary.as_deref().is_none_or(|p| p == recorded)
            && self.fail_over(&facts, recorded, &opts).await
        {
            let moved = self.report.primary().map(str::to_string);
            return self
                .finish(&facts, moved.as_deref(), desired, false, out)
                .await;
        }

        // Record a new primary before anything else changes, so the status
        // never lags behind a scale-down or a restart that depends on it.
        if let Some(p) = &primary
            && (previous_primary.as_deref() != Some(p.as_str())
                || target.as_deref() == Some(p.as_str()))
        {
            self.record_primary(p).await?;
        }

        // `spec.replicaOf` removed: the primary is promoted off its source
        // before anything else changes.
        if obs.servers_observed && self.promotion_due() {
            self.promote_off_source(&facts, primary.as_deref(), &auth, &opts)
                .await?;
            return self
                .finish(&facts, primary.as_deref(), desired, false, out)
                .await;
        }

        // After an unplanned promotion, the old source made read-only as
        // soon as it answers again.
        self.fence_old_source().await?;

        // A changed version starts an upgrade (recorded before the
        // StatefulSet changes); a failed one is rolled back.
        let settled = obs
            .live_sts
            .as_ref()
            .is_some_and(crate::controller::layout::sts_observed);
        out.upgrade = self
            .track_upgrade(
                obs.live_sts.as_ref(),
                settled,
                &facts,
                primary.as_deref().as_slice(),
            )
            .await?;

        // Which config keys are live; a removed one restarts the instances.
        self.track_live_config().await?;

        // The memory limit, decided before the template is built from it.
        out.memory = self
            .autopilot(&facts, primary.as_deref().as_slice())
            .await?;

        // With `spec.replicaOf`, the primary follows the source (or is held
        // off it): before anything that may end the pass early, so a
        // primary that takes writes is fenced whatever else is wrong.
        if obs.servers_observed {
            self.follow(&facts, primary.as_deref(), &auth, &opts)
                .await?;
        }

        // 4. Children, in a fixed order: ConfigMap, Services, PDB, StatefulSet.
        let applied = self
            .apply_children(
                &obs.live_sts,
                &facts,
                primary.as_deref(),
                &self.names.server_auth(),
                false,
            )
            .await?;
        if !self.report.notes().is_empty() {
            return self
                .finish(&facts, primary.as_deref(), desired, false, out)
                .await;
        }

        // A password change is rolled out live, step by step.
        if obs.servers_observed {
            self.rotate_password(&facts, &auth, &wanted_password)
                .await?;
            if super::auth::next_step(&auth, &wanted_password) == super::auth::Step::Steady {
                self.apply_users(&facts, &auth).await?;
            }
        }

        // 5. Replication wiring; with no primary to choose, recovery decides
        // (it promotes only when no server is primary and no link is up).
        match (&primary, obs.servers_observed) {
            (Some(p), true) => {
                self.wire(&facts, p, &opts).await;
                if applied.hold {
                    self.move_primary_for_scale_down(&facts, p, desired, &opts)
                        .await;
                }
            }
            (None, true) if !facts.is_empty() => self.recover_primary(&facts, &opts).await,
            _ => {}
        }
        // A switchover or recovery in step 5 made another instance primary:
        // what was observed is stale, so labels, restarts and the status
        // wait for the next pass, which observes the new topology. Only the
        // new primary is reported now (it is already recorded).
        if let Some(moved) = self.report.primary().map(str::to_string)
            && primary.as_deref() != Some(moved.as_str())
        {
            return self.finish(&facts, Some(&moved), desired, false, out).await;
        }

        // 6. Role labels (the Services select on them).
        self.label_roles(&facts, primary.as_deref()).await?;

        // 7. Live configuration.
        let (engine, _) = self.engine_version();
        out.refused = self.apply_live_config(&facts, &opts, engine).await;
        // A renewed certificate is read live.
        if obs.servers_observed {
            self.reload_certificates(&facts, &opts, &auth).await?;
        }

        // 8. The memory autopilot's limit reaches the instances (in place,
        // or by marking them for the restarts below).
        let mut facts = facts;
        if let Some(p) = &primary {
            self.autopilot_resize(&mut facts, &[p.as_str()], &opts, &mut out.memory)
                .await?;
        }

        // 9. A switchover the user asked for, then restarts for settings
        // that cannot change live.
        if let Some(p) = &primary {
            if self.requested_switchover(&facts, p, &opts).await {
                let moved = self.report.primary().map(str::to_string);
                return self
                    .finish(&facts, moved.as_deref(), desired, false, out)
                    .await;
            }
            // Not in a pass that changed the template: which pods are
            // outdated was observed against the revision before it (a
            // version rolled back would restart the instances already
            // back, after a switchover to one that is not).
            if !applied.template_changed {
                self.roll(&facts, p, desired, &opts).await?;
            }
        }

        // A switchover in step 9 moved the primary: report the new one.
        let moved = self.report.primary().map(str::to_string);
        let primary = moved.clone().or(primary);
        // 10. Tuning advice, now and then, when every server answers.
        if moved.is_none() {
            out.tuning = self.tune(&facts, primary.as_deref(), &opts, |_| None).await;
        }
        self.finish(&facts, primary.as_deref(), desired, false, out)
            .await
    }
}
