//! Pure builders: desired child objects of a `Redis`, from its spec and the
//! facts the reconciler observed. Nothing here talks to the network.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::v1alpha1::{AofPolicy, Engine, Mode, Redis};

/// The port every instance listens on.
pub const REDIS_PORT: u16 = 6379;
/// Label naming the Redis a child belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Label naming the managing operator.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "redpilot";
/// Pod label the operator keeps equal to the instance's replication role.
pub const ROLE_LABEL: &str = "redpilot.io/role";
/// Annotation holding the hash of what an object was built from.
pub const HASH_ANNOTATION: &str = "redpilot.io/desired-hash";
/// Pod template annotation: hash of the settings that need a restart.
pub const RESTART_HASH_ANNOTATION: &str = "redpilot.io/restart-hash";
/// Key of the password in an auth Secret.
pub const PASSWORD_KEY: &str = "password";
/// ConfigMap key holding redis.conf.
pub const CONFIG_KEY: &str = "redis.conf";
/// ConfigMap key holding the current primary as `ip port` (read at start-up
/// so a restarted instance comes back as a replica of the current primary).
pub const PRIMARY_KEY: &str = "primary";

/// Names of the children of one Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// StatefulSet, PDB and read-write Service name (the Redis name).
    pub base: String,
}

impl Names {
    /// Names for a Redis called `name`.
    pub fn new(name: &str) -> Self {
        Names {
            base: name.to_string(),
        }
    }
    /// The StatefulSet.
    pub fn statefulset(&self) -> String {
        self.base.clone()
    }
    /// The headless Service giving pods stable DNS names.
    pub fn headless(&self) -> String {
        format!("{}-headless", self.base)
    }
    /// The read-write Service (current primary).
    pub fn write_service(&self) -> String {
        self.base.clone()
    }
    /// The read-only Service (replicas).
    pub fn read_service(&self) -> String {
        format!("{}-ro", self.base)
    }
    /// The ConfigMap with redis.conf.
    pub fn config(&self) -> String {
        format!("{}-config", self.base)
    }
    /// The generated auth Secret.
    pub fn generated_secret(&self) -> String {
        format!("{}-auth", self.base)
    }
    /// The PodDisruptionBudget.
    pub fn pdb(&self) -> String {
        self.base.clone()
    }
    /// Pod name of ordinal `i`.
    pub fn pod(&self, i: i32) -> String {
        format!("{}-{i}", self.base)
    }
}

/// Labels every child carries.
pub fn labels(redis: &Redis) -> BTreeMap<String, String> {
    let mut l = selector_labels(redis);
    l.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    l.insert("app.kubernetes.io/component".into(), "database".into());
    l.insert(
        "app.kubernetes.io/version".into(),
        label_safe(&redis.spec.version),
    );
    l
}

/// Labels selecting the pods of one Redis.
pub fn selector_labels(redis: &Redis) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            match redis.spec.engine {
                Engine::Redis => "redis".to_string(),
                Engine::Valkey => "valkey".to_string(),
            },
        ),
        (INSTANCE_LABEL.to_string(), redis.name_any()),
    ])
}

fn label_safe(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

/// The controller owner reference every child gets.
pub fn owner_reference(redis: &Redis) -> Option<OwnerReference> {
    redis.controller_owner_ref(&())
}

pub(crate) fn meta(redis: &Redis, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: redis.namespace(),
        labels: Some(labels(redis)),
        owner_references: owner_reference(redis).map(|o| vec![o]),
        ..Default::default()
    }
}

/// A stable 64-bit FNV-1a hash, rendered in hex. Used to tell whether a child
/// must be re-applied and whether pods must restart; it must not change
/// between builds of the operator, so std's randomised hasher will not do.
pub fn stable_hash(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Sets [`HASH_ANNOTATION`] from the object's own JSON form (without the
/// annotation), so an unchanged object can be skipped without a write.
pub fn stamp_hash<K: serde::Serialize + Resource>(mut obj: K) -> K {
    let text = serde_json::to_string(&obj).unwrap_or_default();
    let hash = stable_hash(&[&text]);
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(HASH_ANNOTATION.into(), hash);
    obj
}

/// The hash an object was stamped with.
pub fn stamped_hash<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(HASH_ANNOTATION)
        .map(String::as_str)
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

/// Parses a Kubernetes quantity of bytes ("1Gi", "512M", "1e9", "100").
pub fn quantity_bytes(q: &Quantity) -> Option<u64> {
    quantity_value(&q.0).map(|v| v as u64)
}

/// The value of a Kubernetes quantity ("1Gi", "512M", "1e9", "100m"), when
/// it is one and is finite and not negative.
pub fn quantity_value(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let value: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "m" => 1e-3,
        s if s.starts_with('e') || s.starts_with('E') => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let v = value * mult;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// `maxmemory` for the server: 75% of the memory limit (or request), leaving
/// room for replication buffers and copy-on-write during snapshots. `None`
/// when the pod has no memory bound.
pub fn maxmemory_bytes(redis: &Redis) -> Option<u64> {
    let res = redis.spec.resources.as_ref()?;
    let q = res
        .limits
        .as_ref()
        .and_then(|l| l.get("memory"))
        .or_else(|| res.requests.as_ref().and_then(|r| r.get("memory")))?;
    quantity_bytes(q).map(|b| b / 4 * 3)
}

/// redis.conf lines the operator owns.
fn base_config(redis: &Redis) -> Vec<String> {
    let p = redis.spec.persistence();
    let mut lines = vec![
        "# Managed by Redpilot. Change spec.config of the Redis resource instead.".to_string(),
        format!("port {REDIS_PORT}"),
        "bind * -::*".to_string(),
        "protected-mode no".to_string(),
        "dir /data".to_string(),
        "daemonize no".to_string(),
        "logfile \"\"".to_string(),
    ];
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
    lines.join("\n") + "\n"
}

/// Hash of everything that needs a restart to take effect: the operator's
/// own lines and every user key that `is_dynamic` says cannot change live.
pub fn restart_hash(redis: &Redis, is_dynamic: impl Fn(&str) -> bool) -> String {
    let mut parts = base_config(redis);
    for (k, v) in &redis.spec.config {
        if !is_dynamic(k) {
            parts.push(format!("{k}={v}"));
        }
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    stable_hash(&refs)
}

/// The ConfigMap: redis.conf and the current primary.
pub fn config_map(redis: &Redis, names: &Names, primary: Option<&str>) -> ConfigMap {
    let mut data = BTreeMap::from([(CONFIG_KEY.to_string(), redis_conf(redis))]);
    data.insert(
        PRIMARY_KEY.to_string(),
        primary
            .map(|ip| format!("{ip} {REDIS_PORT}"))
            .unwrap_or_default(),
    );
    stamp_hash(ConfigMap {
        metadata: meta(redis, names.config()),
        data: Some(data),
        ..Default::default()
    })
}

fn port(name: &str) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port: i32::from(REDIS_PORT),
        target_port: Some(IntOrString::String("redis".into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// The Services: headless, read-write (primary) and, in Replication mode,
/// read-only (replicas).
pub fn services(redis: &Redis, names: &Names) -> Vec<Service> {
    let sel = selector_labels(redis);
    let mut out = vec![Service {
        metadata: meta(redis, names.headless()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(sel.clone()),
            ports: Some(vec![port("redis")]),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut primary_sel = sel.clone();
    primary_sel.insert(ROLE_LABEL.into(), "primary".into());
    out.push(Service {
        metadata: meta(redis, names.write_service()),
        spec: Some(ServiceSpec {
            selector: Some(primary_sel),
            ports: Some(vec![port("redis")]),
            ..Default::default()
        }),
        ..Default::default()
    });
    if redis.spec.mode == Mode::Replication {
        let mut replica_sel = sel;
        replica_sel.insert(ROLE_LABEL.into(), "replica".into());
        out.push(Service {
            metadata: meta(redis, names.read_service()),
            spec: Some(ServiceSpec {
                selector: Some(replica_sel),
                ports: Some(vec![port("redis")]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    out.into_iter().map(stamp_hash).collect()
}

/// The PodDisruptionBudget: at most one instance voluntarily down at a time.
pub fn pdb(redis: &Redis, names: &Names) -> PodDisruptionBudget {
    stamp_hash(PodDisruptionBudget {
        metadata: meta(redis, names.pdb()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(redis)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A strong random password: 32 bytes from the OS, hex-encoded.
pub fn generate_password() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::RedisSpec;

    fn redis(spec: RedisSpec) -> Redis {
        let mut r = Redis::new("cache", spec);
        r.metadata.namespace = Some("shop".into());
        r.metadata.uid = Some("uid-1".into());
        r
    }

    #[test]
    fn quantities_parse() {
        assert_eq!(quantity_bytes(&Quantity("1Gi".into())), Some(1 << 30));
        assert_eq!(quantity_bytes(&Quantity("512Mi".into())), Some(512 << 20));
        assert_eq!(quantity_bytes(&Quantity("1G".into())), Some(1_000_000_000));
        assert_eq!(quantity_bytes(&Quantity("1e3".into())), Some(1000));
        assert_eq!(quantity_bytes(&Quantity("12345".into())), Some(12345));
        assert_eq!(quantity_bytes(&Quantity("1Xi".into())), None);
        assert_eq!(quantity_bytes(&Quantity("".into())), None);
    }

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
    fn hash_changes_with_content_and_is_stable() {
        let r = redis(RedisSpec::default());
        let names = Names::new("cache");
        let a = config_map(&r, &names, Some("10.0.0.1"));
        let b = config_map(&r, &names, Some("10.0.0.1"));
        let c = config_map(&r, &names, Some("10.0.0.2"));
        assert_eq!(stamped_hash(&a), stamped_hash(&b));
        assert_ne!(stamped_hash(&a), stamped_hash(&c));
        // FNV-1a of "a\0" is fixed by the algorithm; a change here would
        // restart every pod after an operator upgrade.
        assert_eq!(stable_hash(&["a"]), "089be207b544f1e4");
        assert_ne!(stable_hash(&["ab"]), stable_hash(&["a", "b"]));
    }

    #[test]
    fn generated_passwords_are_long_and_distinct() {
        let a = generate_password().expect("random");
        let b = generate_password().expect("random");
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }

    #[test]
    fn standalone_has_no_read_service() {
        let r = redis(RedisSpec::default());
        let names = Names::new("cache");
        let svcs = services(&r, &names);
        let svc_names: Vec<_> = svcs
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        assert_eq!(svc_names, vec!["cache-headless", "cache"]);
    }
}
