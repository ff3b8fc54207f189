//! The servers' configuration as data, pure: the redis.conf the operator
//! writes (its own lines, the write fence, Cluster mode's lines, then
//! `spec.config`, then the settings `spec.tuning` applied) and the
//! ConfigMap that carries it, `maxmemory` from the memory limit, and the
//! hash of what needs a restart to take effect ([`restart_hash`]). The
//! `config` step applies the rest live with `CONFIG SET`; the rollout
//! restarts the instances when the hash changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::autopilot::limits::maxmemory_bytes;
use super::cluster::build::NODE_TIMEOUT_MS;
use crate::api::v1alpha1::{AofPolicy, Mode, Redis};
use crate::controller::layout::{CA_FILE, CERT_FILE, KEY_FILE};
use crate::controller::names::{
    AUTH_CONF_PATH, BOOTSTRAPPED_KEY, CONFIG_KEY, Names, PRIMARY_KEY, REDIS_PORT, TLS_DIR, meta,
    stable_hash, stamp_hash,
};
use crate::redis::info::{EngineKind, Version};

/// The ConfigMap: redis.conf and the current primary. A Standalone
/// publishes none: its one instance follows nobody, and a restarted pod
/// with a new address must not boot as a replica of its old one; unless
/// it follows a source, when it publishes the fence.
pub fn config_map(
    redis: &Redis,
    names: &Names,
    primary: Option<&str>,
    bootstrapped: Option<&str>,
) -> ConfigMap {
    let primary = primary.filter(|_| redis.spec.mode() == Mode::Replication);
    let mut data = BTreeMap::from([(CONFIG_KEY.to_string(), redis_conf(redis))]);
    if let Some(location) = bootstrapped {
        data.insert(BOOTSTRAPPED_KEY.to_string(), location.to_string());
    }
    // A Standalone Redis that follows a source (until its promotion is
    // done) boots following the fence: a restart must not make it
    // writable, nor let a source that restarted empty wipe it; the
    // operator points it at the source once it has checked the source's
    // history. Read at each start (an environment variable from here),
    // so it takes effect without a restart and ends with the promotion.
    let fenced =
        redis.spec.mode() == Mode::Standalone && super::facts::SourceAddress::of(redis).is_some();
    data.insert(
        PRIMARY_KEY.to_string(),
        if fenced {
            format!(
                "{} {}",
                crate::controller::layout::BOOT_FENCE_HOST,
                crate::controller::layout::SOURCE_FENCE_PORT
            )
        } else {
            primary
                .map(|ip| format!("{ip} {REDIS_PORT}"))
                .unwrap_or_default()
        },
    );
    stamp_hash(ConfigMap {
        metadata: meta(redis, names.config()),
        data: Some(data),
        ..Default::default()
    })
}

/// `cm` (as [`config_map`] made it) with the bootstrap's `location` added:
/// what [`config_map`] makes with it given.
pub fn with_bootstrapped(mut cm: ConfigMap, location: &str) -> ConfigMap {
    if let Some(a) = cm.metadata.annotations.as_mut() {
        a.remove(crate::controller::names::HASH_ANNOTATION);
        if a.is_empty() {
            cm.metadata.annotations = None;
        }
    }
    cm.data
        .get_or_insert_with(BTreeMap::new)
        .insert(BOOTSTRAPPED_KEY.to_string(), location.to_string());
    stamp_hash(cm)
}

/// redis.conf lines the operator owns.
fn base_config(redis: &Redis) -> Vec<String> {
    let p = redis.spec.persistence();
    let mut lines = vec![
        "# Managed by Redpilot. Change spec.config of the Redis resource instead.".to_string(),
    ];
    lines.extend(port_lines(redis));
    lines.extend([
        "bind * -::*".to_string(),
        "protected-mode no".to_string(),
        "dir /data".to_string(),
        "daemonize no".to_string(),
        "logfile \"\"".to_string(),
    ]);
    if p.rdb {
        lines.push("save 3600 1 300 100 60 10000".to_string());
    } else {
        lines.push("save \"\"".to_string());
    }
    match p.aof {
        AofPolicy::Disabled => lines.push("appendonly no".to_string()),
        AofPolicy::EverySec => {
            lines.push("appendonly yes".to_string());
            lines.push("appendfsync everysec".to_string());
        }
        AofPolicy::Always => {
            lines.push("appendonly yes".to_string());
            lines.push("appendfsync always".to_string());
        }
    }
    if let Some(bytes) = maxmemory_bytes(redis) {
        lines.push(format!("maxmemory {bytes}"));
    }
    // The write fence, so a booting server has it from its first write; it
    // is also kept live (`CONFIG SET`, see `apply_live_config`) and set on a
    // replica before it is promoted.
    if redis.spec.mode() == Mode::Replication {
        for (k, v) in fencing_config(redis) {
            lines.push(format!("{k} {v}"));
        }
    }
    if redis.spec.mode() == Mode::Cluster {
        lines.extend(config_lines());
    }
    // The password (requirepass, masterauth) from the server-auth Secret.
    lines.push(format!("include {}", AUTH_CONF_PATH));
    lines
}

/// The listening port: plain, or with `spec.tls` TLS only on the same
/// port (`port 0`), with replication and the cluster bus over TLS too.
fn port_lines(redis: &Redis) -> Vec<String> {
    let Some(tls) = redis.spec.tls.as_ref() else {
        return vec![format!("port {}", REDIS_PORT)];
    };
    let dir = TLS_DIR;
    if tls.files_only {
        // TLS being turned off: plain text on the port, the files kept to
        // follow a primary that still listens with TLS (the operator sets
        // `tls-replication` to how the primary listens).
        return vec![
            format!("port {}", REDIS_PORT),
            format!("tls-cert-file {dir}/{}", CERT_FILE),
            format!("tls-key-file {dir}/{}", KEY_FILE),
            format!("tls-ca-cert-file {dir}/{}", CA_FILE),
        ];
    }
    let mut lines = vec![
        "port 0".to_string(),
        format!("tls-port {}", REDIS_PORT),
        format!("tls-cert-file {dir}/{}", CERT_FILE),
        format!("tls-key-file {dir}/{}", KEY_FILE),
        format!("tls-ca-cert-file {dir}/{}", CA_FILE),
        // Clients authenticate with a password or an ACL user, and with a
        // certificate when `spec.tls.clientAuth` asks for one.
        format!("tls-auth-clients {}", tls.client_auth().config_value()),
        "tls-replication yes".to_string(),
    ];
    // The cluster bus over TLS too. The nodes authenticate each other on
    // it whatever `tls-auth-clients` says, each with its own certificate
    // (`tls-cert-file`, checked against `tls-ca-cert-file`).
    if redis.spec.mode() == Mode::Cluster {
        lines.push("tls-cluster yes".to_string());
    }
    lines
}

/// Quotes a redis.conf value when it has spaces or quotes.
fn conf_value(v: &str) -> String {
    if !v.is_empty() && !v.contains([' ', '"', '\'', '\\', '\t']) {
        return v.to_string();
    }
    let mut out = String::from("\"");
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The whole redis.conf.
pub fn redis_conf(redis: &Redis) -> String {
    let mut lines = base_config(redis);
    if !redis.spec.config.is_empty() {
        lines.push("# spec.config".to_string());
        for (k, v) in &redis.spec.config {
            lines.push(format!("{k} {}", conf_value(v)));
        }
    }
    let tuned = tuned_settings(redis);
    if !tuned.is_empty() {
        lines.push("# spec.tuning (status.tuning.applied)".to_string());
        for (k, v) in &tuned {
            lines.push(format!("{k} {}", conf_value(v)));
        }
    }
    lines.join("\n") + "\n"
}

/// Hash of everything that needs a restart to take effect: the operator's
/// own lines, every user key that `is_dynamic` says cannot change live, and
/// the count of live keys removed from the spec (`status.configResets`).
pub fn restart_hash(redis: &Redis, is_dynamic: impl Fn(&str) -> bool) -> String {
    // maxmemory is set live, following each pod's limit in effect (see
    // `autopilot::resize`); the limit itself is in the template. The fence
    // is set live too.
    let live: Vec<String> = fencing_config(redis)
        .into_iter()
        .map(|(k, _)| format!("{k} "))
        .chain(["maxmemory ".to_string()])
        .collect();
    let mut parts: Vec<String> = base_config(redis)
        .into_iter()
        .filter(|l| !live.iter().any(|k| l.starts_with(k.as_str())))
        .collect();
    let resets = redis.status.as_ref().map_or(0, |s| s.config_resets);
    if resets > 0 {
        parts.push(format!("config-resets={resets}"));
    }
    for (k, v) in &redis.spec.config {
        if !is_dynamic(k) {
            parts.push(format!("{k}={v}"));
        }
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    stable_hash(&refs)
}

/// The keys of `spec.config` that change live on `engine` `version`, sorted.
pub fn live_keys(redis: &Redis, engine: EngineKind, version: Version) -> Vec<String> {
    redis
        .spec
        .config
        .keys()
        .filter(|k| crate::redis::config::is_dynamic(k, engine, version))
        .cloned()
        .collect()
}

/// What to record after comparing the live keys with the last record:
/// `None` when nothing changed; else the new key list, the new reset count,
/// and the keys removed (which need a restart to return to their defaults).
pub fn track_live_keys(
    recorded: Option<&[String]>,
    resets: i64,
    now: &[String],
) -> Option<(Vec<String>, i64, Vec<String>)> {
    if recorded == Some(now) {
        return None;
    }
    let removed: Vec<String> = recorded
        .unwrap_or_default()
        .iter()
        .filter(|k| !now.contains(k))
        .cloned()
        .collect();
    let resets = if removed.is_empty() {
        resets
    } else {
        resets + 1
    };
    Some((now.to_vec(), resets, removed))
}

/// The parameters the operator keeps on every instance (live, with
/// `CONFIG SET`). The primary pings its replicas every second, so they can
/// tell a live link from a dead one. With fencing on, a primary that hears
/// from no replica for `maxLagSeconds`:
/// - refuses writes (`min-replicas-to-write 1`, `min-replicas-max-lag`);
/// - drops its replicas' connections (`repl-timeout`). This matters when a
///   partition heals: the replicas' acknowledgements queued in the network
///   during the partition would otherwise reach it, count as live replicas
///   and let it take writes again for a moment, beside the new primary.
///   Dropped by then, those connections are refused, not counted.
///
/// Both happen within `maxLagSeconds + 2` s of the last acknowledgement (the
/// server counts whole seconds and checks once a second), before a silent
/// primary is replaced (`failover::silence_bound`). Replicas loading a large
/// dataset keep the connection alive (they send newlines while loading).
/// Off (`min-replicas-to-write 0`, `repl-timeout 60`, the default) for a
/// single instance, with failover disabled, or with `fence: false`.
pub fn fencing_config(redis: &Redis) -> Vec<(&'static str, String)> {
    let f = redis.spec.failover();
    let on = redis.spec.mode() == Mode::Replication
        && redis.spec.desired_instances() >= 2
        && f.enabled
        && f.fence;
    let mut out = vec![("repl-ping-replica-period", "1".to_string())];
    if on {
        let lag = f.max_lag_seconds.clamp(2, 60).to_string();
        out.push(("min-replicas-max-lag", lag.clone()));
        out.push(("repl-timeout", lag));
        out.push(("min-replicas-to-write", "1".to_string()));
    } else {
        out.push(("repl-timeout", "60".to_string()));
        out.push(("min-replicas-to-write", "0".to_string()));
    }
    out
}

/// `status.tuning.applied[].state` of a setting in effect, its finding
/// still standing...
pub const APPLIED: &str = "Applied";

/// ...in effect, its finding gone...
pub const CLEARED: &str = "Cleared";

/// ...or refused by a server (not in effect, not tried again).
pub const REFUSED: &str = "Refused";

/// The settings in effect for `spec.tuning`: of each key the last record
/// not refused, unless `spec.config` sets the key (the user's wins).
pub fn tuned_settings(redis: &Redis) -> Vec<(String, String)> {
    let Some(t) = redis.status.as_ref().and_then(|s| s.tuning.as_ref()) else {
        return Vec::new();
    };
    let mut out: BTreeMap<&str, &str> = BTreeMap::new();
    for a in t.applied.iter().filter(|a| a.state != REFUSED) {
        out.insert(&a.key, &a.to);
    }
    out.into_iter()
        .filter(|(k, _)| !redis.spec.config.contains_key(*k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// redis.conf lines of Cluster mode.
pub fn config_lines() -> Vec<String> {
    vec![
        "cluster-enabled yes".to_string(),
        // On the data volume: a node with storage keeps its ID.
        "cluster-config-file nodes.conf".to_string(),
        format!("cluster-node-timeout {NODE_TIMEOUT_MS}"),
        // A shard without a primary fails only its own slots.
        "cluster-require-full-coverage no".to_string(),
        // The operator, not gossip, decides which shard a replica serves.
        "cluster-allow-replica-migration no".to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::RedisSpec;
    use crate::controller::redis::autopilot::limits::maxmemory_bytes;
    use std::collections::BTreeMap;

    use crate::controller::redis::build::test_redis as redis;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn maxmemory_is_three_quarters_of_the_limit() {
        let r = redis(RedisSpec {
            resources: Some(memory_limit("1Gi")),
            ..Default::default()
        });
        assert_eq!(maxmemory_bytes(&r), Some((1u64 << 30) / 4 * 3));
        assert!(redis_conf(&r).contains(&format!("maxmemory {}", (1u64 << 30) / 4 * 3)));
    }

    fn memory_limit(q: &str) -> k8s_openapi::api::core::v1::ResourceRequirements {
        k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(BTreeMap::from([("memory".to_string(), Quantity(q.into()))])),
            ..Default::default()
        }
    }

    #[test]
    fn with_tls_the_port_is_tls_only_and_replication_uses_it() {
        let r = crate::controller::redis::build::test_redis(crate::api::v1alpha1::RedisSpec {
            tls: Some(crate::api::v1alpha1::TlsSpec::default()),
            ..Default::default()
        });
        let conf = redis_conf(&r);
        for line in [
            "port 0",
            "tls-port 6379",
            "tls-cert-file /etc/redis-tls/tls.crt",
            "tls-key-file /etc/redis-tls/tls.key",
            "tls-ca-cert-file /etc/redis-tls/ca.crt",
            "tls-replication yes",
            "tls-auth-clients no",
        ] {
            assert!(conf.lines().any(|l| l == line), "{line} in\n{conf}");
        }
        assert!(!conf.lines().any(|l| l == "port 6379"), "{conf}");
        let plain = redis_conf(&crate::controller::redis::build::test_redis(
            Default::default(),
        ));
        assert!(
            plain.lines().any(|l| l == "port 6379") && !plain.contains("tls"),
            "{plain}"
        );
    }

    #[test]
    fn client_auth_sets_tls_auth_clients() {
        use crate::api::v1alpha1::{ClientAuth, RedisSpec, TlsSpec};
        for (auth, line) in [
            (None, "tls-auth-clients no"),
            (Some(ClientAuth::None), "tls-auth-clients no"),
            (Some(ClientAuth::Optional), "tls-auth-clients optional"),
            (Some(ClientAuth::Required), "tls-auth-clients yes"),
        ] {
            let conf = redis_conf(&crate::controller::redis::build::test_redis(RedisSpec {
                tls: Some(TlsSpec {
                    client_auth: auth,
                    ..Default::default()
                }),
                ..Default::default()
            }));
            assert_eq!(
                conf.lines()
                    .filter(|l| l.starts_with("tls-auth-clients"))
                    .collect::<Vec<_>>(),
                [line],
                "{auth:?}"
            );
        }
    }

    #[test]
    fn with_tls_in_cluster_mode_the_bus_uses_it_too() {
        use crate::api::v1alpha1::{Mode, RedisSpec, TlsSpec};
        let conf = |mode, tls: Option<TlsSpec>| {
            redis_conf(&crate::controller::redis::build::test_redis(RedisSpec {
                mode: Some(mode),
                tls,
                ..Default::default()
            }))
        };
        let cluster = conf(Mode::Cluster, Some(TlsSpec::default()));
        assert!(
            cluster.lines().any(|l| l == "tls-cluster yes")
                && cluster.lines().any(|l| l == "cluster-enabled yes"),
            "{cluster}"
        );
        let replication = conf(Mode::Replication, Some(TlsSpec::default()));
        assert!(!replication.contains("tls-cluster"), "{replication}");
        let plain = conf(Mode::Cluster, None);
        assert!(!plain.contains("tls"), "{plain}");
    }

    #[test]
    fn config_values_are_quoted_when_needed() {
        let mut spec = RedisSpec::default();
        spec.config
            .insert("maxmemory-policy".into(), "allkeys-lru".into());
        spec.config
            .insert("notify-keyspace-events".into(), "".into());
        spec.config.insert(
            "client-output-buffer-limit".into(),
            "pubsub 32mb 8mb 60".into(),
        );
        let conf = redis_conf(&redis(spec));
        assert!(conf.contains("\nmaxmemory-policy allkeys-lru\n"));
        assert!(conf.contains("\nnotify-keyspace-events \"\"\n"));
        assert!(conf.contains("\nclient-output-buffer-limit \"pubsub 32mb 8mb 60\"\n"));
    }

    #[test]
    fn a_replication_server_boots_fenced_and_the_fence_restarts_nothing() {
        let spec = |instances: i32, lag: i32| {
            let mut s = RedisSpec {
                mode: Some(crate::api::v1alpha1::Mode::Replication),
                instances: Some(instances),
                ..Default::default()
            };
            let mut f = s.failover();
            f.max_lag_seconds = lag;
            s.failover = Some(f);
            redis(s)
        };
        let conf = redis_conf(&spec(3, 7));
        for line in [
            "min-replicas-to-write 1",
            "min-replicas-max-lag 7",
            "repl-timeout 7",
            "repl-ping-replica-period 1",
        ] {
            assert!(conf.contains(&format!("\n{line}\n")), "{line} in:\n{conf}");
        }
        // One instance: nothing to fence with.
        assert!(redis_conf(&spec(1, 7)).contains("\nmin-replicas-to-write 0\n"));
        // Standalone: no replication settings at all.
        assert!(!redis_conf(&redis(RedisSpec::default())).contains("min-replicas"));
        // Set live: changing the bound restarts nothing.
        let never = |_: &str| false;
        assert_eq!(
            restart_hash(&spec(3, 7), never),
            restart_hash(&spec(3, 20), never)
        );
    }

    #[test]
    fn restart_hash_ignores_dynamic_keys_only() {
        let base = redis(RedisSpec::default());
        let dynamic = |k: &str| k == "maxmemory-policy";
        let h0 = restart_hash(&base, dynamic);
        let mut spec = RedisSpec::default();
        spec.config
            .insert("maxmemory-policy".into(), "allkeys-lru".into());
        assert_eq!(restart_hash(&redis(spec.clone()), dynamic), h0);
        spec.config.insert("databases".into(), "32".into());
        assert_ne!(restart_hash(&redis(spec), dynamic), h0);
    }

    #[test]
    fn removing_a_live_key_counts_a_reset_and_nothing_else_does() {
        let keys = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // First record: no reset.
        assert_eq!(
            track_live_keys(None, 0, &keys(&["hz"])),
            Some((keys(&["hz"]), 0, vec![]))
        );
        // Unchanged: nothing to write.
        assert_eq!(
            track_live_keys(Some(&keys(&["hz"])), 0, &keys(&["hz"])),
            None
        );
        // Added: recorded, no restart.
        assert_eq!(
            track_live_keys(Some(&keys(&["hz"])), 2, &keys(&["hz", "timeout"])),
            Some((keys(&["hz", "timeout"]), 2, vec![]))
        );
        // Removed: one more reset, and the restart hash moves with it.
        assert_eq!(
            track_live_keys(Some(&keys(&["hz", "timeout"])), 2, &keys(&["timeout"])),
            Some((keys(&["timeout"]), 3, keys(&["hz"])))
        );
        let mut r = redis(RedisSpec::default());
        let h0 = restart_hash(&r, |_| true);
        r.status = Some(crate::api::v1alpha1::RedisStatus {
            config_resets: 1,
            ..Default::default()
        });
        assert_ne!(restart_hash(&r, |_| true), h0);
    }
}
