//! Pure builders: desired child objects of a `Redis`, from its spec and the
//! facts the reconciler observed. Nothing here talks to the network.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::v1alpha1::{Mode, Redis};

pub use crate::controller::layout::restricted_security_context;
pub use crate::controller::names::*;

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
pub fn server_auth_secret(
    redis: &Redis,
    names: &Names,
    auth: &super::credentials::ServerAuth,
) -> Secret {
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
    for u in super::users::system_users(auth) {
        conf.push_str(&u.conf_line());
    }
    conf.push_str(&auth.users);
    if !password.is_empty() && auth.users_applied.is_some() {
        conf.push_str(&format!("masteruser {}\n", conf_quoted(OPERATOR_USER)));
        conf.push_str(&super::users::default_line(&redis.spec.default_user(), auth).conf_line());
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

/// The ConfigMap: redis.conf and the current primary. A Standalone
/// publishes none: its one instance follows nobody, and a restarted pod
/// with a new address must not boot as a replica of its old one.
pub fn config_map(
    redis: &Redis,
    names: &Names,
    primary: Option<&str>,
    bootstrapped: Option<&str>,
) -> ConfigMap {
    let primary = primary.filter(|_| redis.spec.mode() == crate::api::v1alpha1::Mode::Replication);
    let mut data = BTreeMap::from([(CONFIG_KEY.to_string(), super::config::redis_conf(redis))]);
    if let Some(location) = bootstrapped {
        data.insert(BOOTSTRAPPED_KEY.to_string(), location.to_string());
    }
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
    if redis.spec.mode() == Mode::Replication {
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

/// A Redis `cache` in namespace `shop`, as the builders' tests use it.
#[cfg(test)]
pub(crate) fn test_redis(spec: crate::api::v1alpha1::RedisSpec) -> Redis {
    let mut r = Redis::new("cache", spec);
    r.metadata.namespace = Some("shop".into());
    r.metadata.uid = Some("uid-1".into());
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::RedisSpec;

    use super::test_redis as redis;

    #[test]
    fn hash_changes_with_content_and_is_stable() {
        let r = redis(RedisSpec {
            mode: Some(crate::api::v1alpha1::Mode::Replication),
            ..Default::default()
        });
        let names = Names::new("cache");
        let a = config_map(&r, &names, Some("10.0.0.1"), None);
        let b = config_map(&r, &names, Some("10.0.0.1"), None);
        let c = config_map(&r, &names, Some("10.0.0.2"), None);
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
    fn only_replication_publishes_a_primary() {
        let primary = |mode| {
            let r = test_redis(crate::api::v1alpha1::RedisSpec {
                mode: Some(mode),
                ..Default::default()
            });
            config_map(&r, &Names::new("c"), Some("10.0.0.7"), None)
                .data
                .and_then(|d| d.get(PRIMARY_KEY).cloned())
        };
        assert_eq!(
            primary(crate::api::v1alpha1::Mode::Replication).as_deref(),
            Some("10.0.0.7 6379")
        );
        assert_eq!(
            primary(crate::api::v1alpha1::Mode::Standalone).as_deref(),
            Some("")
        );
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
