//! Live configuration: which parameters may change at runtime, and applying them.
//!
//! [`PARAMS`] is a typed table of commonly managed parameters. Only
//! [`Mutability::Dynamic`] ones may be applied with [`apply_config`]; the others
//! need a restart (the caller rolls the instance instead). The table is checked
//! against every supported engine by the integration tests.

use std::fmt;

use super::conn::Node;
use super::error::{Error, Result};
use super::info::{EngineKind, Version};

/// Whether a parameter can change on a running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutability {
    /// `CONFIG SET` works.
    Dynamic,
    /// Only read at startup; change it by restarting with a new config.
    RestartRequired,
}

/// A known configuration parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// The `redis.conf` name.
    pub name: &'static str,
    /// Dynamic or restart-only.
    pub mutability: Mutability,
    /// First Redis version that has it (Valkey has everything Redis 7.2 had).
    pub since: Version,
    /// Its value is a credential: never logged or reported.
    pub secret: bool,
    /// How Valkey differs.
    pub valkey: ValkeyRule,
}

/// How a parameter differs on Valkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValkeyRule {
    /// As on Redis.
    Same,
    /// Removed by Valkey (8.0).
    Removed,
    /// Restart-only on Redis but dynamic since this Valkey version.
    DynamicSince(Version),
}

impl ParamSpec {
    /// The parameter's mutability on `engine` at `version` (the engine's own
    /// version, e.g. 8.1 for Valkey 8.1), or `None` if it does not exist there.
    pub fn mutability_on(&self, engine: EngineKind, version: Version) -> Option<Mutability> {
        match engine {
            EngineKind::Redis => (self.since <= version).then_some(self.mutability),
            EngineKind::Valkey => {
                if self.since > V72 {
                    return None;
                }
                match self.valkey {
                    ValkeyRule::Same => Some(self.mutability),
                    ValkeyRule::Removed => None,
                    ValkeyRule::DynamicSince(v) if v <= version => Some(Mutability::Dynamic),
                    ValkeyRule::DynamicSince(_) => Some(self.mutability),
                }
            }
        }
    }

    const fn removed_in_valkey(mut self) -> Self {
        self.valkey = ValkeyRule::Removed;
        self
    }

    const fn dynamic_in_valkey_since(mut self, v: Version) -> Self {
        self.valkey = ValkeyRule::DynamicSince(v);
        self
    }
}

const V62: Version = Version::new(6, 2, 0);
const V70: Version = Version::new(7, 0, 0);
const V72: Version = Version::new(7, 2, 0);
const VALKEY_90: Version = Version::new(9, 0, 0);

const fn dynamic(name: &'static str) -> ParamSpec {
    ParamSpec {
        name,
        mutability: Mutability::Dynamic,
        since: V62,
        secret: false,
        valkey: ValkeyRule::Same,
    }
}

const fn dynamic_since(name: &'static str, since: Version) -> ParamSpec {
    ParamSpec {
        name,
        mutability: Mutability::Dynamic,
        since,
        secret: false,
        valkey: ValkeyRule::Same,
    }
}

const fn secret(name: &'static str) -> ParamSpec {
    ParamSpec {
        name,
        mutability: Mutability::Dynamic,
        since: V62,
        secret: true,
        valkey: ValkeyRule::Same,
    }
}

const fn restart(name: &'static str) -> ParamSpec {
    ParamSpec {
        name,
        mutability: Mutability::RestartRequired,
        since: V62,
        secret: false,
        valkey: ValkeyRule::Same,
    }
}

const fn restart_since(name: &'static str, since: Version) -> ParamSpec {
    ParamSpec {
        name,
        mutability: Mutability::RestartRequired,
        since,
        secret: false,
        valkey: ValkeyRule::Same,
    }
}

/// Parameters the operator manages, with their mutability.
pub const PARAMS: &[ParamSpec] = &[
    // Memory and eviction.
    dynamic("maxmemory"),
    dynamic("maxmemory-policy"),
    dynamic("maxmemory-samples"),
    dynamic("maxmemory-eviction-tenacity"),
    dynamic_since("maxmemory-clients", V70),
    dynamic("lazyfree-lazy-eviction"),
    dynamic("lazyfree-lazy-expire"),
    dynamic("lazyfree-lazy-server-del"),
    dynamic("lazyfree-lazy-user-del"),
    dynamic("lazyfree-lazy-user-flush"),
    dynamic("replica-lazy-flush"),
    dynamic("activedefrag"),
    // Clients and networking.
    dynamic("maxclients"),
    dynamic("timeout"),
    dynamic("tcp-keepalive"),
    dynamic("client-output-buffer-limit"),
    dynamic("client-query-buffer-limit"),
    dynamic("proto-max-bulk-len"),
    // Persistence.
    dynamic("save"),
    dynamic("appendonly"),
    dynamic("appendfsync"),
    dynamic("no-appendfsync-on-rewrite"),
    dynamic("auto-aof-rewrite-percentage"),
    dynamic("auto-aof-rewrite-min-size"),
    dynamic("aof-use-rdb-preamble"),
    dynamic("rdbcompression"),
    dynamic("stop-writes-on-bgsave-error"),
    // Replication.
    dynamic("repl-backlog-size"),
    dynamic("repl-backlog-ttl"),
    dynamic("repl-timeout"),
    dynamic("repl-diskless-sync"),
    dynamic("repl-diskless-sync-delay"),
    dynamic_since("repl-diskless-sync-max-replicas", V70),
    dynamic("repl-diskless-load"),
    dynamic("repl-ping-replica-period"),
    dynamic("min-replicas-to-write"),
    dynamic("min-replicas-max-lag"),
    dynamic("replica-priority"),
    dynamic("replica-read-only"),
    dynamic("replica-serve-stale-data"),
    dynamic("replica-announce-ip"),
    secret("masterauth"),
    dynamic("masteruser"),
    secret("requirepass"),
    // Observability and tuning.
    dynamic("loglevel"),
    dynamic("slowlog-log-slower-than"),
    dynamic("slowlog-max-len"),
    dynamic("latency-monitor-threshold"),
    dynamic_since("latency-tracking", V70),
    dynamic("notify-keyspace-events"),
    dynamic("hz"),
    dynamic("dynamic-hz").removed_in_valkey(),
    dynamic("activerehashing"),
    dynamic("lua-time-limit"),
    dynamic("hash-max-ziplist-entries"),
    dynamic("hash-max-ziplist-value"),
    dynamic("list-max-ziplist-size"),
    dynamic("set-max-intset-entries"),
    dynamic("zset-max-ziplist-entries"),
    dynamic("zset-max-ziplist-value"),
    dynamic("stream-node-max-bytes"),
    dynamic("stream-node-max-entries"),
    dynamic("tracking-table-max-keys"),
    dynamic("oom-score-adj"),
    dynamic("oom-score-adj-values"),
    // Restart required.
    restart("databases"),
    restart("rdbchecksum"),
    restart("daemonize"),
    restart("io-threads").dynamic_in_valkey_since(VALKEY_90),
    restart("supervised"),
    restart("logfile"),
    restart("syslog-enabled"),
    restart("cluster-enabled"),
    restart("unixsocket"),
    restart("tcp-backlog"),
    restart_since("enable-debug-command", V70),
    restart_since("enable-protected-configs", V70),
    restart_since("appenddirname", V70),
];

/// Looks a parameter up by name (case-insensitive).
pub fn lookup(name: &str) -> Option<&'static ParamSpec> {
    PARAMS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// Whether `name` is known, exists on `engine` `version` and can be changed at runtime.
pub fn is_dynamic(name: &str, engine: EngineKind, version: Version) -> bool {
    lookup(name).and_then(|p| p.mutability_on(engine, version)) == Some(Mutability::Dynamic)
}

/// A change made by [`apply_config`].
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigChange {
    /// Parameter name.
    pub name: &'static str,
    /// Value before (`None` for secrets).
    pub old: Option<String>,
    /// Value after (`None` for secrets).
    pub new: Option<String>,
}

impl fmt::Debug for ConfigChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "<redacted>".into());
        write!(
            f,
            "{}: {} -> {}",
            self.name,
            show(&self.old),
            show(&self.new)
        )
    }
}

/// `CONFIG GET name` (single value).
pub async fn config_get(node: &mut Node, name: &str) -> Result<Option<String>> {
    let pairs: Vec<String> = node
        .query("CONFIG GET", redis::cmd("CONFIG").arg("GET").arg(name))
        .await?;
    Ok(pairs
        .chunks(2)
        .find(|kv| kv.first().is_some_and(|k| k.eq_ignore_ascii_case(name)))
        .and_then(|kv| kv.get(1).cloned()))
}

/// Applies dynamic parameters with `CONFIG SET`, skipping those already at the
/// wanted value. All names are validated before anything is changed: unknown,
/// restart-only or too-new parameters fail the whole call with
/// [`Error::Config`].
#[tracing::instrument(name = "redis.config_set", skip_all, fields(endpoint = %node.endpoint(), keys = params.len()))]
pub async fn apply_config(node: &mut Node, params: &[(&str, &str)]) -> Result<Vec<ConfigChange>> {
    let info = node.info_section("server").await?;
    let (engine, version) = match (info.server.engine, info.server.version) {
        (Some(e), Some(v)) => (e, v),
        _ => {
            return Err(Error::Protocol {
                endpoint: node.endpoint().to_string(),
                message: "INFO server lacks the engine version".into(),
            });
        }
    };
    let mut specs = Vec::with_capacity(params.len());
    for (name, value) in params {
        let spec = lookup(name)
            .ok_or_else(|| Error::Config(format!("unknown or unmanaged parameter {name:?}")))?;
        match spec.mutability_on(engine, version) {
            Some(Mutability::Dynamic) => {}
            Some(Mutability::RestartRequired) => {
                return Err(Error::Config(format!(
                    "parameter {} requires a restart",
                    spec.name
                )));
            }
            None => {
                return Err(Error::Config(format!(
                    "parameter {} does not exist on {engine:?} {version}",
                    spec.name
                )));
            }
        }
        specs.push((spec, *value));
    }
    let mut changes = Vec::new();
    for (spec, value) in specs {
        let old = config_get(node, spec.name).await?;
        if old.as_deref() == Some(value) {
            continue;
        }
        let _: redis::Value = node
            .query(
                "CONFIG SET",
                redis::cmd("CONFIG").arg("SET").arg(spec.name).arg(value),
            )
            .await?;
        changes.push(ConfigChange {
            name: spec.name,
            old: if spec.secret { None } else { old },
            new: if spec.secret {
                None
            } else {
                Some(value.to_string())
            },
        });
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lookups() {
        let redis = EngineKind::Redis;
        let valkey = EngineKind::Valkey;
        assert!(is_dynamic("maxmemory", redis, Version::new(6, 2, 14)));
        assert!(is_dynamic("MAXMEMORY-POLICY", redis, Version::new(7, 0, 0)));
        assert!(!is_dynamic(
            "maxmemory-clients",
            redis,
            Version::new(6, 2, 14)
        ));
        assert!(is_dynamic(
            "maxmemory-clients",
            valkey,
            Version::new(8, 1, 0)
        ));
        assert!(!is_dynamic("databases", redis, Version::new(7, 0, 0)));
        assert!(!is_dynamic("no-such-thing", redis, Version::new(7, 0, 0)));
        assert!(is_dynamic("dynamic-hz", redis, Version::new(7, 0, 0)));
        assert!(!is_dynamic("dynamic-hz", valkey, Version::new(8, 1, 0)));
        assert!(!is_dynamic("io-threads", valkey, Version::new(8, 1, 0)));
        assert!(is_dynamic("io-threads", valkey, Version::new(9, 1, 2)));
        let names: std::collections::BTreeSet<_> = PARAMS.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), PARAMS.len(), "duplicate entries");
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let c = ConfigChange {
            name: "requirepass",
            old: None,
            new: None,
        };
        assert_eq!(format!("{c:?}"), "requirepass: <redacted> -> <redacted>");
    }
}
