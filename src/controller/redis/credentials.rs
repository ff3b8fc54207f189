//! Credentials: the password the servers run, and its rotation without a
//! restart and without locking anyone out.
//!
//! The desired password is the user's Secret (`spec.auth.secretName`) or the
//! generated one. What the servers run is kept apart, in the operator-owned
//! server-auth Secret ([`auth::server_auth_secret`]): pods start from it
//! (redis.conf includes its `auth.conf`, so the password is never on a
//! command line) and the operator connects with it. When the two differ, the
//! rotation goes in steps a restart can interrupt at any point:
//!
//! 1. **Add**: on every instance, the new password is added to the default
//!    user next to the old one (`ACL SETUSER default >new`) and replicas
//!    authenticate to their primary with it (`CONFIG SET masterauth`). Pods
//!    that restart meanwhile start with the old one, which still works.
//! 2. **Switch**: once every instance accepts both, the server-auth Secret
//!    holds the new password (and the old as `previous`): pods now start with
//!    the new one, and the operator connects with it.
//! 3. **Retire**: on every instance the old password is removed (`<old`),
//!    reaching it with the old password where an instance started in the
//!    window before step 2; then `previous` leaves the Secret.
//!
//! Error messages of these commands are not passed on (a server may echo its
//! arguments): only the action, the instance and the category are reported.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::auth::{self, ServerAuth, Step, next_step, read_server_auth};
use super::facts::PodFacts;
use super::{Error, Reconciler};
use crate::controller::base::FIELD_MANAGER;
use crate::controller::names;
use crate::redis::{ConnectOptions, Endpoint, Node};

/// `ACL SETUSER <user> <modifier>` for the default user and the
/// operator's own, which share the password (a server without the
/// operator's user yet gets it disabled, holding the password only, until
/// `apply_users` completes it).
async fn acl(node: &mut Node, modifier: String) -> crate::redis::Result<()> {
    for user in ["default", names::OPERATOR_USER] {
        let _: redis::Value = node
            .query(
                "ACL SETUSER",
                redis::cmd("ACL").arg("SETUSER").arg(user).arg(&modifier),
            )
            .await?;
    }
    Ok(())
}

pub(super) async fn set_masterauth(node: &mut Node, password: &str) -> crate::redis::Result<()> {
    let _: redis::Value = node
        .query(
            "CONFIG SET",
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("masterauth")
                .arg(password),
        )
        .await?;
    Ok(())
}

impl Reconciler {
    /// Writes the server-auth Secret with server-side apply, always (a key
    /// left out, such as `previous`, is removed from it).
    pub(super) async fn write_server_auth(&mut self, auth: &ServerAuth) -> Result<(), Error> {
        let secret = auth::server_auth_secret(&self.redis, &self.names, auth);
        self.ctx.metrics.kube("apply");
        self.report.wrote();
        self.api::<Secret>()
            .patch(
                &self.names.server_auth(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await?;
        Ok(())
    }

    /// The password the servers run: from the server-auth Secret, created
    /// with `desired` the first time (and repaired if edited).
    pub(super) async fn server_auth(
        &mut self,
        live: Option<&Secret>,
        desired: &str,
        paused: bool,
    ) -> Result<ServerAuth, Error> {
        let Some(live) = live else {
            let auth = ServerAuth {
                current: desired.to_string(),
                previous: None,
                probe: new_probe_password()?,
                exporter: new_probe_password()?,
                backup: new_probe_password()?,
                ..Default::default()
            };
            if !paused {
                self.write_server_auth(&auth).await?;
            }
            return Ok(auth);
        };
        let mut auth = read_server_auth(live).unwrap_or(ServerAuth {
            current: desired.to_string(),
            previous: None,
            probe: String::new(),
            ..Default::default()
        });
        // A Secret written before the probe had a user of its own (or
        // edited): the probe's password is made once here. Servers started
        // before it have the old probe, which needs none.
        if auth.probe.is_empty() {
            auth.probe = new_probe_password()?;
        }
        // The same for the sidecar's and the agent's users (added live by
        // `apply_users`).
        if auth.exporter.is_empty() {
            auth.exporter = new_probe_password()?;
        }
        if auth.backup.is_empty() {
            auth.backup = new_probe_password()?;
        }
        let want = auth::server_auth_secret(&self.redis, &self.names, &auth);
        if !paused && !super::children::in_sync(live, &want)? {
            self.write_server_auth(&auth).await?;
        }
        Ok(auth)
    }

    /// One step of a password rotation (see the module header).
    pub(super) async fn rotate_password(
        &mut self,
        facts: &[PodFacts],
        auth: &ServerAuth,
        desired: &str,
    ) -> Result<(), Error> {
        let step = next_step(auth, desired);
        if step == Step::Steady {
            return Ok(());
        }
        let expected = self.redis.spec.total_instances() as usize;
        let mut done = facts.len() == expected;
        for f in facts {
            let Some(ip) = f.ip.clone() else {
                done = false;
                continue;
            };
            let ep = Endpoint::new(&ip, names::REDIS_PORT);
            // The primary of a Redis that follows a source authenticates
            // to the source: its masterauth is the source's.
            let master = f.upstream.is_none();
            let result = match (&step, &auth.previous) {
                (Step::Retire, Some(old)) => retire(&ep, &auth.current, old, master, self).await,
                _ => add(&ep, &auth.current, desired, master, self).await,
            };
            if let Err((what, e)) = result {
                done = false;
                self.credential_failed(format!("{what} on {}", f.name), &e)
                    .await;
            }
        }
        if !done {
            self.report.progress(match step {
                Step::Add => "rotating the password: adding the new one on every instance".into(),
                _ => "rotating the password: retiring the old one on every instance".into(),
            });
            return Ok(());
        }
        match step {
            Step::Add => {
                self.write_server_auth(&ServerAuth {
                    current: desired.to_string(),
                    previous: Some(auth.current.clone()),
                    ..auth.clone()
                })
                .await?;
                self.event(
                    EventType::Normal,
                    "PasswordRotating",
                    "RotatePassword",
                    "every instance accepts the new password; instances now start with it; \
                     the old one is retired next"
                        .into(),
                )
                .await;
                self.report
                    .progress("rotating the password: retiring the old one next".into());
            }
            _ => {
                self.write_server_auth(&ServerAuth {
                    previous: None,
                    ..auth.clone()
                })
                .await?;
                self.event(
                    EventType::Normal,
                    "PasswordRotated",
                    "RotatePassword",
                    "the old password is refused by every instance; the rotation is complete"
                        .into(),
                )
                .await;
            }
        }
        Ok(())
    }

    /// A rotation step failed on one instance: Degraded by category, without
    /// the server's message (it could echo a password).
    async fn credential_failed(&mut self, what: String, e: &crate::redis::Error) {
        let category = crate::controller::error::redis_category(e);
        self.data_plane_category(format!("{what} failed ({category})"), category)
            .await;
    }
}

/// A new password for one of the operator's users (the readiness probe's,
/// the sidecar's, the backup agent's).
fn new_probe_password() -> Result<String, Error> {
    auth::generate_password().map_err(|e| Error::Random(e.to_string()))
}

type StepError = (&'static str, crate::redis::Error);

fn opts(r: &Reconciler, password: &str) -> ConnectOptions {
    r.connect_options(password)
}

/// Step 1 on one instance: reachable with `current`, it also accepts
/// `desired`, and authenticates to its primary with it.
async fn add(
    ep: &Endpoint,
    current: &str,
    desired: &str,
    master: bool,
    r: &Reconciler,
) -> Result<(), StepError> {
    let mut node = match Node::connect(ep, &opts(r, current)).await {
        Ok(n) => n,
        // Already done here (it started after the switch, or a pass before
        // this one added it and the Secret write failed).
        Err(_) => Node::connect(ep, &opts(r, desired))
            .await
            .map_err(|e| ("connecting", e))?,
    };
    if !desired.is_empty() {
        acl(&mut node, format!(">{desired}"))
            .await
            .map_err(|e| ("adding the new password", e))?;
    }
    if !master {
        return Ok(());
    }
    set_masterauth(&mut node, desired)
        .await
        .map_err(|e| ("setting masterauth", e))
}

/// Step 3 on one instance: the old password no longer works, the current
/// one does, and replication uses it.
async fn retire(
    ep: &Endpoint,
    current: &str,
    old: &str,
    master: bool,
    r: &Reconciler,
) -> Result<(), StepError> {
    match Node::connect(ep, &opts(r, old)).await {
        Ok(mut node) => {
            if !current.is_empty() {
                acl(&mut node, format!(">{current}"))
                    .await
                    .map_err(|e| ("adding the new password", e))?;
            }
            if master {
                set_masterauth(&mut node, current)
                    .await
                    .map_err(|e| ("setting masterauth", e))?;
            }
            if !old.is_empty() && old != current {
                acl(&mut node, format!("<{old}"))
                    .await
                    .map_err(|e| ("removing the old password", e))?;
            }
            Ok(())
        }
        // The old password is refused: make sure the current one works.
        Err(_) => Node::connect(ep, &opts(r, current))
            .await
            .map(|_| ())
            .map_err(|e| ("connecting with the new password", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(current: &str, previous: Option<&str>) -> ServerAuth {
        ServerAuth {
            current: current.into(),
            previous: previous.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn rotation_steps() {
        assert_eq!(next_step(&auth("a", None), "a"), Step::Steady);
        assert_eq!(next_step(&auth("a", None), "b"), Step::Add);
        assert_eq!(next_step(&auth("b", Some("a")), "b"), Step::Retire);
        // A new rotation during a retirement finishes the retirement first.
        assert_eq!(next_step(&auth("b", Some("a")), "c"), Step::Retire);
    }

    #[test]
    fn passwords_are_quoted_for_redis_conf() {
        assert_eq!(auth::conf_quoted("plain"), "\"plain\"");
        assert_eq!(
            auth::conf_quoted("a \"b\" \\c\nd\u{1}"),
            "\"a \\\"b\\\" \\\\c\\nd\\x01\""
        );
    }
}
