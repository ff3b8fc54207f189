//! The servers' passwords and users as data, pure: what the operator-owned
//! server-auth Secret holds ([`ServerAuth`], [`server_auth_secret`]), the
//! next step of a password rotation ([`next_step`]), and the ACL `user`
//! lines of the operator's own users, the default user and `spec.users`
//! ([`system_users`], [`default_line`], [`args`]). The steps that bring
//! the servers to them are `credentials` (the password, rotated live) and
//! `users` (the ACL users, checked and applied live).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};

use crate::api::v1alpha1::{Mode, Redis, UserSpec};
use crate::controller::names::{
    self, AUTH_CONF_KEY, BACKUP_PASSWORD_KEY, EXPORTER_PASSWORD_KEY, Names, OPERATOR_USER,
    PASSWORD_KEY, PREVIOUS_KEY, PROBE_PASSWORD_KEY, PROBE_USER, TLS_CA_APPLIED_KEY, TLS_SERVED_KEY,
    USERS_APPLIED_KEY, USERS_CONF_KEY, meta,
};

/// The server-auth Secret as the operator last wrote it.
#[derive(Debug, Clone, Default)]
pub struct ServerAuth {
    /// The password the servers run and pods start with.
    pub current: String,
    /// During a rotation: the password being retired.
    pub previous: Option<String>,
    /// The readiness probe's password ([`names::PROBE_USER`]): generated
    /// once, never rotated; empty until generated.
    pub probe: String,
    /// The metrics sidecar's password ([`names::EXPORTER_USER`]).
    pub exporter: String,
    /// The backup agent's password ([`names::BACKUP_USER`]).
    pub backup: String,
    /// The `user` lines (the sidecar's, the agent's and `spec.users`) the
    /// servers start with (see the `users` step).
    pub users: String,
    /// The hash of `users` once every instance runs them.
    pub users_applied: Option<String>,
    /// With `spec.tls`: the CA bundle of the certificate every instance
    /// was last seen to serve ([`names::TLS_CA_APPLIED_KEY`]).
    pub tls_ca: Option<String>,
    /// With `spec.tls`: the hash of the certificate Secret's `tls.crt` and
    /// `ca.crt` (`material::files_hash`) once every instance was seen
    /// to serve them ([`names::TLS_SERVED_KEY`]).
    pub tls_served: Option<String>,
}

fn key(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

/// The server-auth Secret's contents.
pub fn read_server_auth(secret: &Secret) -> Option<ServerAuth> {
    Some(ServerAuth {
        current: key(secret, names::PASSWORD_KEY)?,
        previous: key(secret, names::PREVIOUS_KEY),
        probe: key(secret, names::PROBE_PASSWORD_KEY).unwrap_or_default(),
        exporter: key(secret, names::EXPORTER_PASSWORD_KEY).unwrap_or_default(),
        backup: key(secret, names::BACKUP_PASSWORD_KEY).unwrap_or_default(),
        users: key(secret, names::USERS_CONF_KEY).unwrap_or_default(),
        users_applied: key(secret, names::USERS_APPLIED_KEY),
        tls_ca: key(secret, names::TLS_CA_APPLIED_KEY),
        tls_served: key(secret, names::TLS_SERVED_KEY),
    })
}

/// What one rotation step does next, from the recorded state and the
/// desired password (pure; table-tested).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to rotate.
    Steady,
    /// Add the desired password next to the current one everywhere.
    Add,
    /// Remove `previous` everywhere, then drop it from the Secret.
    Retire,
}

/// The next rotation step. A rotation requested while one is retiring its
/// old password finishes that first.
pub fn next_step(auth: &ServerAuth, desired: &str) -> Step {
    if auth.previous.is_some() {
        Step::Retire
    } else if auth.current != desired {
        Step::Add
    } else {
        Step::Steady
    }
}

/// The scratch user a server parses rules with (it never logs in).
pub const CHECK_USER: &str = "redpilot-check";

/// One user as the servers should run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The user's name.
    pub name: String,
    /// `ACL SETUSER <name>`'s arguments: `reset`, `on`/`off`, the password
    /// hashes, the rules.
    pub args: Vec<String>,
}

impl Desired {
    /// The user's line in `users.conf`.
    pub fn conf_line(&self) -> String {
        let mut line = format!("user {}", conf_quoted(&self.name));
        for a in &self.args {
            line.push(' ');
            line.push_str(&conf_quoted(a));
        }
        line.push('\n');
        line
    }
}

/// The arguments of `u` with the passwords `passwords` (plain text, hashed
/// here).
pub fn args(u: &UserSpec, passwords: &[String]) -> Vec<String> {
    let mut args = vec![
        "reset".to_string(),
        if u.enabled.unwrap_or(true) {
            "on"
        } else {
            "off"
        }
        .to_string(),
    ];
    args.extend(passwords.iter().map(|p| password_hash(p)));
    args.extend(u.rules.iter().cloned());
    args
}

/// A password as `ACL SETUSER` takes its hash: `#<sha256 hex>`.
fn password_hash(password: &str) -> String {
    format!(
        "#{}",
        crate::backup::agent::hex(&Sha256::digest(password.as_bytes()))
    )
}

/// The hashes of the `spec.auth` passwords the servers accept: the current
/// one and, during a rotation, the one being retired.
fn spec_auth_hashes(auth: &ServerAuth) -> Vec<String> {
    [Some(auth.current.as_str()), auth.previous.as_deref()]
        .into_iter()
        .flatten()
        .filter(|p| !p.is_empty())
        .map(password_hash)
        .collect()
}

/// The operator's own users, when the servers have a password: its own
/// (the `spec.auth` password, current and previous, every command but
/// those that wipe data), the metrics sidecar's and the backup agent's,
/// each with only the commands it runs. The backup agent's user of an
/// archived Cluster Redis (`cluster_archive`) also reads `CLUSTER NODES`
/// (each checkpoint records the slots of the shard's primary).
pub fn system_users(auth: &ServerAuth, cluster_archive: bool) -> Vec<Desired> {
    if auth.current.is_empty() {
        return Vec::new();
    }
    let user = |name: &str, password: &str, rules: &[&str]| {
        let mut args = vec![
            "reset".to_string(),
            "on".to_string(),
            password_hash(password),
            "-@all".to_string(),
        ];
        args.extend(rules.iter().map(|r| r.to_string()));
        Desired {
            name: name.to_string(),
            args,
        }
    };
    let mut operator = vec!["reset".to_string(), "on".to_string()];
    operator.extend(spec_auth_hashes(auth));
    operator.extend(
        [
            "allkeys",
            "allchannels",
            "+@all",
            "-flushall",
            "-flushdb",
            "-swapdb",
        ]
        .iter()
        .map(|r| r.to_string()),
    );
    let mut out = vec![Desired {
        name: names::OPERATOR_USER.to_string(),
        args: operator,
    }];
    if !auth.exporter.is_empty() {
        out.push(user(
            names::EXPORTER_USER,
            &auth.exporter,
            &["+ping", "+info", "+cluster|info"],
        ));
    }
    if !auth.backup.is_empty() {
        // The replication handshake (backups, the archive's stream);
        // `INFO` and `TIME` in `MULTI`/`EXEC` for the archive's
        // checkpoints. No key is readable or writable.
        let mut rules = vec![
            "+ping",
            "+replconf",
            "+psync",
            "+sync",
            "+info",
            "+time",
            "+multi",
            "+exec",
        ];
        if cluster_archive {
            rules.push("+cluster|nodes");
        }
        out.push(user(names::BACKUP_USER, &auth.backup, &rules));
    }
    out
}

/// A Cluster Redis with `spec.archive`: its archive reads each shard's
/// slots.
pub fn archives_shards(redis: &crate::api::v1alpha1::Redis) -> bool {
    redis.spec.archive.is_some() && redis.spec.mode() == crate::api::v1alpha1::Mode::Cluster
}

/// The default user's line: `on`/`off`, its rights, and the `spec.auth`
/// passwords it already has (a `user default` line at start-up resets the
/// user, so the line carries them; live, adding them again changes
/// nothing).
pub fn default_line(d: &crate::api::v1alpha1::DefaultUserSpec, auth: &ServerAuth) -> Desired {
    let flag = if d.enabled.unwrap_or(true) {
        "on"
    } else {
        "off"
    };
    let mut args = vec![flag.to_string()];
    args.extend(spec_auth_hashes(auth));
    if d.rules.is_empty() {
        args.extend(
            ["allkeys", "allchannels", "+@all"]
                .iter()
                .map(|r| r.to_string()),
        );
    } else {
        args.extend(
            ["resetkeys", "resetchannels", "-@all"]
                .iter()
                .map(|r| r.to_string()),
        );
        args.extend(d.rules.iter().cloned());
    }
    Desired {
        name: "default".to_string(),
        args,
    }
}

/// The rules among `ACL SETUSER` arguments (no flag, no password).
pub fn rules_of(args: &[String]) -> Vec<String> {
    args.iter()
        .filter(|a| !matches!(a.as_str(), "reset" | "on" | "off") && !a.starts_with('#'))
        .cloned()
        .collect()
}

/// The name of each line of a `users.conf`, with the line.
pub fn parse_conf(conf: &str) -> BTreeMap<String, String> {
    conf.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("user ")?;
            // The name is quoted by `conf_quoted`: `"name"`; names hold no
            // quote or backslash (admission).
            let name = rest.strip_prefix('"')?.split('"').next()?;
            Some((name.to_string(), format!("{l}\n")))
        })
        .collect()
}

/// `users.conf` from lines by name (sorted, so the same set is the same
/// text).
pub fn render(lines: &BTreeMap<String, String>) -> String {
    lines.values().map(String::as_str).collect()
}

/// The hash `users-applied` records for a `users.conf`.
pub fn conf_hash(conf: &str) -> String {
    names::stable_hash(&[conf])
}

/// A recorded line back into `ACL SETUSER` arguments (a user kept as it
/// was): the tokens after the name, unquoted.
pub fn line_args(name: &str, line: &str) -> Option<Desired> {
    let mut tokens = Vec::new();
    let mut chars = line.trim_end().chars().peekable();
    while chars.peek().is_some() {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        let mut t = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next()? {
                        'n' => t.push('\n'),
                        'r' => t.push('\r'),
                        't' => t.push('\t'),
                        'x' => {
                            let h: String = [chars.next()?, chars.next()?].iter().collect();
                            t.push(u8::from_str_radix(&h, 16).ok()? as char);
                        }
                        c => t.push(c),
                    },
                    c => t.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                t.push(c);
                chars.next();
            }
        }
        if !t.is_empty() {
            tokens.push(t);
        }
    }
    // `user <name> <args>…`
    (tokens.first().map(String::as_str) == Some("user")
        && tokens.get(1).map(String::as_str) == Some(name))
    .then(|| Desired {
        name: name.to_string(),
        args: tokens[2..].to_vec(),
    })
}

/// A generated auth Secret with `password`.
pub fn auth_secret(redis: &Redis, names: &Names, password: &str) -> Secret {
    Secret {
        metadata: meta(redis, names.generated_secret()),
        // `data`, not `stringData`: the API server stores and returns
        // `data`, so drift detection can compare it with the live Secret.
        data: Some(BTreeMap::from([(
            PASSWORD_KEY.to_string(),
            k8s_openapi::ByteString(password.as_bytes().to_vec()),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// A redis.conf value in double quotes, with the escapes the server's
/// parser understands (any byte is safe: passwords are user input).
pub fn conf_quoted(v: &str) -> String {
    let mut out = String::from("\"");
    for b in v.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    out
}

/// The server-auth Secret: the password the servers run (`password`), the
/// same as redis.conf lines (`auth.conf`, so it never appears on a command
/// line) with the readiness probe's user ([`PROBE_USER`], password
/// `probe-password`), and during a rotation the password being retired
/// (`previous`).
pub fn server_auth_secret(redis: &Redis, names: &Names, auth: &ServerAuth) -> Secret {
    let (password, previous, probe) = (
        auth.current.as_str(),
        auth.previous.as_deref(),
        auth.probe.as_str(),
    );
    let mut conf = if password.is_empty() {
        String::new()
    } else {
        let q = conf_quoted(password);
        let mut conf = format!("requirepass {q}\nmasterauth {q}\n");
        if !probe.is_empty() {
            let p = conf_quoted(&format!(">{probe}"));
            // In Cluster mode it also reads the cluster's view: a node that
            // served slots asks its peers at boot whether they moved.
            let cluster = if redis.spec.mode() == Mode::Cluster {
                " +cluster|nodes +cluster|info"
            } else {
                ""
            };
            conf.push_str(&format!(
                "user {PROBE_USER} on {p} -@all +ping +info{cluster}\n"
            ));
        }
        conf
    };
    // The operator's users and those of `spec.users` (see `users`): the
    // servers start with them. Replication as the operator's user and the
    // default user's rights only once every instance has that user (a
    // replica starting before would be refused by a primary without it).
    for u in system_users(auth, archives_shards(redis)) {
        conf.push_str(&u.conf_line());
    }
    conf.push_str(&auth.users);
    if !password.is_empty() && auth.users_applied.is_some() {
        conf.push_str(&format!("masteruser {}\n", conf_quoted(OPERATOR_USER)));
        conf.push_str(&default_line(&redis.spec.default_user(), auth).conf_line());
    }
    let bytes = |s: &str| k8s_openapi::ByteString(s.as_bytes().to_vec());
    let mut data = BTreeMap::from([
        (PASSWORD_KEY.to_string(), bytes(password)),
        (AUTH_CONF_KEY.to_string(), bytes(&conf)),
        (
            PROBE_PASSWORD_KEY.to_string(),
            bytes(if password.is_empty() { "" } else { probe }),
        ),
    ]);
    if let Some(p) = previous {
        data.insert(PREVIOUS_KEY.to_string(), bytes(p));
    }
    if !auth.users.is_empty() {
        data.insert(USERS_CONF_KEY.to_string(), bytes(&auth.users));
    }
    if !password.is_empty() {
        for (k, v) in [
            (EXPORTER_PASSWORD_KEY, &auth.exporter),
            (BACKUP_PASSWORD_KEY, &auth.backup),
        ] {
            if !v.is_empty() {
                data.insert(k.to_string(), bytes(v));
            }
        }
    }
    if let Some(h) = &auth.users_applied {
        data.insert(USERS_APPLIED_KEY.to_string(), bytes(h));
    }
    if let Some(ca) = &auth.tls_ca {
        data.insert(TLS_CA_APPLIED_KEY.to_string(), bytes(ca));
    }
    if let Some(h) = &auth.tls_served {
        data.insert(TLS_SERVED_KEY.to_string(), bytes(h));
    }
    Secret {
        metadata: meta(redis, names.server_auth()),
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// A strong random password: 32 bytes from the OS, hex-encoded.
pub fn generate_password() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
