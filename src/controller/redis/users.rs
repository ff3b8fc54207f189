//! ACL users: those declared in `spec.users`, the operator's own (see
//! [`system_users`]: its own, the metrics sidecar's, the backup agent's),
//! and the default user's rights (`spec.auth.defaultUser`).
//!
//! What the servers run is recorded in the server-auth Secret: `users.conf`
//! holds one `user` line per user of `spec.users`; `auth.conf`, which a
//! server loads when it starts (so a restarted or new instance, and a
//! promoted replica, has every user), holds the operator's users, those
//! lines, and, once every instance has the operator's user, `masteruser`
//! and the default user's line; `users-applied` is the hash of all that as
//! every instance was last brought to it. A pass with nothing changed reads
//! the users' Secrets, finds the same hash, and touches no server. When it
//! differs:
//!
//! 1. **Check**: each changed user's rules (and the default user's) are
//!    parsed by a server first (`ACL SETUSER redpilot-check reset off
//!    <rules>` on a scratch user that cannot log in, deleted after). A rule
//!    it refuses makes the Redis Degraded naming the user and the rule;
//!    that user keeps the line it had (or stays absent) and the other users
//!    go on.
//! 2. **Record**: `users.conf` is written, so instances starting from now
//!    on load the new set.
//! 3. **Apply**: on every instance, in the same order: `ACL DELUSER` of
//!    removed users, one `ACL SETUSER <name> reset on|off #<sha256>…
//!    <rules>` per user (the operator's first, then by name; the server
//!    takes each whole or not at all), `CONFIG SET masteruser
//!    redpilot-operator`; then, once every instance took that, the default
//!    user's line. Then `users-applied` records the hash.
//!
//! Passwords travel and are stored only as SHA-256 hashes (`#<hex>`), and
//! no message carries a server reply to a command holding one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::EventType;

use super::auth::{
    CHECK_USER, Desired, ServerAuth, args, conf_hash, default_line, line_args, parse_conf, render,
    rules_of, system_users,
};
use super::facts::PodFacts;
use super::{Error, Reconciler};
use crate::controller::names;
use crate::redis::{Endpoint, Node};

impl Reconciler {
    /// The users of the spec whose passwords can be read, and, for the
    /// others, why not (naming the user and the field).
    async fn desired_users(&mut self) -> Result<(Vec<Desired>, Vec<String>), Error> {
        let mut secrets: BTreeMap<String, Option<Secret>> = BTreeMap::new();
        let mut out = Vec::new();
        let mut problems = Vec::new();
        for u in self.redis.spec.users.clone() {
            let mut passwords = Vec::new();
            let mut problem = None;
            for p in &u.passwords {
                if !secrets.contains_key(&p.secret_name) {
                    let s: Option<Secret> = self.fetch(&p.secret_name).await?;
                    secrets.insert(p.secret_name.clone(), s);
                }
                let value = secrets
                    .get(&p.secret_name)
                    .and_then(|s| s.as_ref())
                    .and_then(|s| s.data.as_ref())
                    .and_then(|d| d.get(p.key()))
                    .filter(|v| !v.0.is_empty())
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned());
                match value {
                    Some(v) => passwords.push(v),
                    None => {
                        problem = Some(format!(
                            "spec.users[{}].passwords: Secret {} does not exist or has no key {}",
                            u.name,
                            p.secret_name,
                            p.key()
                        ));
                        break;
                    }
                }
            }
            match problem {
                Some(p) => problems.push(p),
                None => out.push(Desired {
                    name: u.name.clone(),
                    args: args(&u, &passwords),
                }),
            }
        }
        Ok((out, problems))
    }

    /// Parses `rules` on a server, on the scratch user; `Some(message)`
    /// when it refuses them.
    async fn check_rules(node: &mut Node, rules: &[String]) -> Result<Option<String>, Error> {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(CHECK_USER).arg("reset").arg("off");
        for r in rules {
            cmd.arg(r.as_str());
        }
        match node.query::<redis::Value>("ACL SETUSER", &cmd).await {
            Ok(_) => Ok(None),
            Err(crate::redis::Error::Server { message, .. }) => Ok(Some(message)),
            Err(e) => Err(e.into()),
        }
    }

    /// Brings every instance to the users of `spec.users`, the operator's
    /// own and the default user's rights (see the module header); called
    /// once the servers were observed.
    pub(super) async fn apply_users(
        &mut self,
        facts: &[PodFacts],
        auth: &ServerAuth,
    ) -> Result<(), Error> {
        let system = system_users(auth, super::auth::archives_shards(&self.redis));
        if self.redis.spec.users.is_empty() && auth.users.is_empty() && system.is_empty() {
            return Ok(());
        }
        let (desired, mut problems) = self.desired_users().await?;
        let before = parse_conf(&auth.users);
        let default_user = default_line(&self.redis.spec.default_user(), auth);
        let opts = self.connect_options(&auth.current);
        let endpoints: Vec<(String, Endpoint)> = facts
            .iter()
            .filter_map(|f| {
                Some((
                    f.name.clone(),
                    Endpoint::new(f.ip.as_ref()?, names::REDIS_PORT),
                ))
            })
            .collect();
        // Users whose Secret cannot be read keep what they had.
        let mut lines: BTreeMap<String, String> = before
            .iter()
            .filter(|(name, _)| {
                self.redis.spec.users.iter().any(|u| &u.name == *name)
                    && !desired.iter().any(|d| &d.name == *name)
            })
            .map(|(n, l)| (n.clone(), l.clone()))
            .collect();
        let changed: Vec<&Desired> = desired
            .iter()
            .filter(|d| before.get(&d.name) != Some(&d.conf_line()))
            .collect();
        let full = |lines: &BTreeMap<String, String>| {
            let sys: String = system.iter().map(Desired::conf_line).collect();
            format!("{sys}{}{}", render(lines), default_user.conf_line())
        };
        // Nothing changed since every instance took it: no server touched.
        let unchanged = changed.is_empty()
            && problems.is_empty()
            && before.len() == desired.len()
            && auth.users_applied.as_deref() == Some(conf_hash(&full(&before)).as_str());
        if unchanged {
            return Ok(());
        }
        // 1. Check the changed users' rules, and the default user's, on a
        // server.
        let mut node = None;
        for (_, ep) in &endpoints {
            if let Ok(n) = Node::connect(ep, &opts).await {
                node = Some(n);
                break;
            }
        }
        let Some(mut node) = node else {
            self.report
                .progress("applying spec.users: waiting for a reachable instance".into());
            return Ok(());
        };
        // Users whose rules a server refused (those whose Secret cannot be
        // read are not in `desired`: they keep their line above).
        let mut refused: Vec<String> = Vec::new();
        for d in &changed {
            if let Some(message) = Self::check_rules(&mut node, &rules_of(&d.args)).await? {
                problems.push(format!(
                    "spec.users[{}].rules: refused by the server: {message}",
                    d.name
                ));
                refused.push(d.name.clone());
                if let Some(l) = before.get(&d.name) {
                    lines.insert(d.name.clone(), l.clone());
                }
            }
        }
        let mut default_ok = true;
        if !self.redis.spec.default_user().rules.is_empty()
            && let Some(message) =
                Self::check_rules(&mut node, &self.redis.spec.default_user().rules).await?
        {
            problems.push(format!(
                "spec.auth.defaultUser.rules: refused by the server: {message}"
            ));
            default_ok = false;
        }
        let _: Result<redis::Value, _> = node
            .query(
                "ACL DELUSER",
                redis::cmd("ACL").arg("DELUSER").arg(CHECK_USER),
            )
            .await;
        drop(node);
        for d in &desired {
            if !refused.contains(&d.name) {
                lines.insert(d.name.clone(), d.conf_line());
            }
        }
        for p in problems {
            self.report_failure("UserNotApplied", "ApplyUsers", "users", p)
                .await;
        }
        let conf = render(&lines);
        let hash = conf_hash(&full(&lines));
        if default_ok && conf == auth.users && auth.users_applied.as_deref() == Some(hash.as_str())
        {
            return Ok(());
        }
        // 2. Record what instances start with from now on.
        let mut recorded = ServerAuth {
            users: conf.clone(),
            ..auth.clone()
        };
        if conf != auth.users {
            self.write_server_auth(&recorded).await?;
        }
        // 3. Apply everywhere: removed users, the operator's users, every
        // user by name, replication as the operator's user; then, once
        // every instance has all that, the default user's rights.
        let removed: Vec<&String> = before.keys().filter(|n| !lines.contains_key(*n)).collect();
        let mut users: Vec<Desired> = system.clone();
        users.extend(lines.keys().filter_map(|n| {
            desired
                .iter()
                .find(|d| &d.name == n && !refused.contains(n))
                .cloned()
                .or_else(|| line_args(n, &lines[n]))
        }));
        let expected = self.redis.spec.total_instances() as usize;
        let mut done = endpoints.len() == expected && facts.len() == expected;
        let set = |u: &Desired| {
            let mut cmd = redis::cmd("ACL");
            cmd.arg("SETUSER").arg(&u.name);
            for a in &u.args {
                cmd.arg(a);
            }
            cmd
        };
        let has_password = !auth.current.is_empty();
        for (pod, ep) in &endpoints {
            let result = async {
                let mut node = Node::connect(ep, &opts).await?;
                for name in &removed {
                    let _: redis::Value = node
                        .query(
                            "ACL DELUSER",
                            redis::cmd("ACL").arg("DELUSER").arg(name.as_str()),
                        )
                        .await?;
                }
                for u in &users {
                    let _: redis::Value = node.query("ACL SETUSER", &set(u)).await?;
                }
                if has_password {
                    let _: redis::Value = node
                        .query(
                            "CONFIG SET",
                            redis::cmd("CONFIG")
                                .arg("SET")
                                .arg("masteruser")
                                .arg(names::OPERATOR_USER),
                        )
                        .await?;
                }
                Ok::<(), crate::redis::Error>(())
            }
            .await;
            if let Err(e) = result {
                done = false;
                self.users_failed("spec.users", pod, &e).await;
            }
        }
        if done && default_ok && has_password {
            for (pod, ep) in &endpoints {
                let result = async {
                    let mut node = Node::connect(ep, &opts).await?;
                    let _: redis::Value = node.query("ACL SETUSER", &set(&default_user)).await?;
                    Ok::<(), crate::redis::Error>(())
                }
                .await;
                if let Err(e) = result {
                    done = false;
                    self.users_failed("spec.auth.defaultUser", pod, &e).await;
                }
            }
        }
        if !done || !default_ok {
            self.report
                .progress("applying spec.users on every instance".into());
            return Ok(());
        }
        recorded.users_applied = Some(hash);
        self.write_server_auth(&recorded).await?;
        let names: Vec<&str> = lines.keys().map(String::as_str).collect();
        let mut note = format!(
            "{} user(s) on {} instance(s): {}",
            names.len(),
            endpoints.len(),
            names.join(", ")
        );
        if !removed.is_empty() {
            let gone: Vec<&str> = removed.iter().map(|s| s.as_str()).collect();
            note.push_str(&format!("; removed {}", gone.join(", ")));
        }
        let d = self.redis.spec.default_user();
        if !d.enabled.unwrap_or(true) {
            note.push_str("; the default user is disabled");
        } else if !d.rules.is_empty() {
            note.push_str("; the default user is limited by spec.auth.defaultUser.rules");
        }
        self.event(EventType::Normal, "UsersApplied", "ApplyUsers", note)
            .await;
        Ok(())
    }

    /// One instance refused a step: Degraded by category, without the
    /// server's reply (the command carried a password hash).
    async fn users_failed(&mut self, what: &str, pod: &str, e: &crate::redis::Error) {
        let category = crate::controller::error::redis_category(e);
        self.data_plane_category(
            format!("applying {what} on {pod} failed ({category})"),
            category,
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::UserSpec;

    fn user(json: serde_json::Value) -> UserSpec {
        serde_json::from_value(json).expect("user")
    }

    #[test]
    fn a_user_is_reset_then_given_hashed_passwords_and_its_rules() {
        let u = user(
            serde_json::json!({"name": "app", "passwords": [{"secretName": "a"}],
            "rules": ["~app:*", "+@read"]}),
        );
        let a = args(&u, &["secret".into()]);
        assert_eq!(a[0], "reset");
        assert_eq!(a[1], "on");
        assert_eq!(
            a[2],
            "#2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
        );
        assert_eq!(&a[3..], ["~app:*", "+@read"]);
        assert!(!a.iter().any(|x| x.contains("secret")), "no plain password");
        let off = user(
            serde_json::json!({"name": "app", "passwords": [{"secretName": "a"}], "enabled": false}),
        );
        assert_eq!(args(&off, &[])[1], "off");
    }

    #[test]
    fn lines_round_trip_through_the_recorded_conf() {
        let d = Desired {
            name: "app.v2".into(),
            args: vec![
                "reset".into(),
                "on".into(),
                "#ab".into(),
                "~a\"b*".into(),
                "+@all".into(),
            ],
        };
        let line = d.conf_line();
        assert_eq!(
            line,
            "user \"app.v2\" \"reset\" \"on\" \"#ab\" \"~a\\\"b*\" \"+@all\"\n"
        );
        let other = Desired {
            name: "b".into(),
            args: vec!["reset".into(), "off".into()],
        };
        let mut lines = BTreeMap::new();
        lines.insert(other.name.clone(), other.conf_line());
        lines.insert(d.name.clone(), line.clone());
        let conf = render(&lines);
        assert!(
            conf.starts_with("user \"app.v2\""),
            "sorted by name: {conf}"
        );
        let parsed = parse_conf(&conf);
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed["app.v2"], line);
        assert_eq!(line_args("app.v2", &parsed["app.v2"]), Some(d));
        assert_eq!(line_args("b", &parsed["b"]), Some(other));
        assert_eq!(conf_hash(&conf), conf_hash(&render(&parse_conf(&conf))));
    }
}
