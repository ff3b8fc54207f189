//! `spec.users`: ACL users declared in the resource.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// An ACL user on every instance of the Redis. Its passwords come from
/// Secrets (any of them is accepted: list a second one while rotating, then
/// drop the first); its rules are the server's ACL rules. Applied live with
/// `ACL SETUSER` on every instance, in the same order everywhere, and kept
/// in what the servers load at start, so restarts and failovers keep it.
/// Removing the entry removes the user.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserSpec {
    /// The user's name: letters, digits, `.`, `_`, `-`; not `default` and
    /// not starting with `redpilot-` (the operator's own users).
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$') && self != 'default' && !self.startsWith('redpilot-')").message("spec.users[].name: letters, digits, '.', '_' and '-', not 'default' and not starting with 'redpilot-'"))]
    pub name: String,
    /// Secrets holding the user's passwords (1 to 4; each accepted).
    #[schemars(length(min = 1, max = 4))]
    pub passwords: Vec<PasswordRef>,
    /// ACL rules, one per item (at most 32): `~pattern` / `%R~pattern` (keys), `&pattern`
    /// (channels), `+@category`, `-command`, `+command|subcommand`,
    /// `allkeys`, `resetkeys`, `allchannels`, `(selector)`... Passwords and
    /// `on`/`off` are not rules here: they come from `passwords` and
    /// `enabled`. Checked by the server before anything is applied: a rule
    /// it refuses makes the Redis Degraded naming the user and the rule,
    /// and that user is left as it was.
    #[serde(default)]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256)))]
    #[x_kube(validation = kube::core::Rule::new("self.all(r, !r.contains(' ') && !(r.startsWith('>') || r.startsWith('<') || r.startsWith('#') || r.startsWith('!')) && !(r in ['on', 'off', 'nopass', 'resetpass', 'reset']))").message("spec.users[].rules: each rule is one ACL rule without spaces; passwords (>, <, #, !, nopass, resetpass), on/off and reset are set by the operator from passwords and enabled"))]
    pub rules: Vec<String>,
    /// Whether the user may authenticate (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A key of a Secret in the Redis's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The key holding the password (default `password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

impl PasswordRef {
    /// The key, with its default.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("password")
    }
}
