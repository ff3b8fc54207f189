//! Pure builders: the Services and the PodDisruptionBudget of a `Redis`,
//! from its spec. (The ConfigMap is `conf`'s, the Secrets `auth`'s, the
//! StatefulSets `statefulset`'s and `cluster::build`'s; the names, labels
//! and metadata they all use are [`crate::controller::names`].)

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::v1alpha1::{Mode, Redis};

use crate::controller::names::*;

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
    use crate::controller::redis::auth::generate_password;
    use crate::controller::redis::conf::config_map;

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
    fn the_bootstrap_added_to_an_applied_config_map_is_what_a_later_pass_makes() {
        let r = redis(RedisSpec {
            mode: Some(crate::api::v1alpha1::Mode::Replication),
            ..Default::default()
        });
        let names = Names::new("cache");
        let before = config_map(&r, &names, Some("10.0.0.1"), None);
        let added = crate::controller::redis::conf::with_bootstrapped(before.clone(), "s3://b/k");
        let later = config_map(&r, &names, Some("10.0.0.1"), Some("s3://b/k"));
        assert_eq!(added, later);
        assert_ne!(stamped_hash(&added), stamped_hash(&before));
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
