//! The backup Job (pure builders, table-tested): which instance a backup
//! is taken from, where it is stored, and the Job running the agent there.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile,
    SecretKeySelector, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use crate::api::v1alpha1::{Redis, RedisBackup};
use crate::controller::agent::{self, Target};
use crate::controller::redis::build::{self, Names};

/// The agent's container in the Job.
pub const CONTAINER: &str = "backup";
/// Label on the Job's pods naming their RedisBackup.
pub const BACKUP_LABEL: &str = "redpilot.io/backup";
/// Exit status of an agent failure that running again cannot fix.
pub const EXIT_PERMANENT: i32 = 3;
/// Attempts after a failure worth retrying (the Job controller backs off
/// 10 s, 20 s, … between them).
pub const RETRIES: i32 = 2;

/// The instance to back up, from the Redis's status: the ready replica with
/// a live link furthest ahead (never forking the primary when a replica can
/// serve), else the ready primary. `None` while no instance can serve.
pub fn choose_source(redis: &Redis) -> Option<String> {
    let status = redis.status.as_ref()?;
    let replica = status
        .instances
        .iter()
        .filter(|i| i.role == "replica" && i.ready && i.link_up == Some(true))
        .max_by_key(|i| (i.offset.unwrap_or(0), std::cmp::Reverse(i.name.clone())));
    if let Some(r) = replica {
        return Some(r.name.clone());
    }
    status
        .instances
        .iter()
        .find(|i| i.role == "primary" && i.ready)
        .map(|i| i.name.clone())
}

/// The Job's condition `type_` when it is true (`Complete`, `Failed`).
pub fn condition<'a>(
    j: &'a Job,
    type_: &str,
) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// The object key of a backup: `<prefix>/<namespace>/<redis>/<backup>-<time>.rdb`
/// (the time makes a re-created RedisBackup of the same name a new object).
pub fn object_key(
    prefix: Option<&str>,
    ns: &str,
    redis: &str,
    backup: &str,
    stamp: &str,
) -> String {
    let prefix = prefix.unwrap_or("").trim_matches('/');
    let tail = format!("{ns}/{redis}/{backup}-{stamp}.rdb");
    if prefix.is_empty() {
        tail
    } else {
        format!("{prefix}/{tail}")
    }
}

/// A Job's name: the backup's with `-<what>`, within 63 characters.
pub fn job_name(backup: &str, what: &str) -> String {
    let mut base: String = backup.chars().take(62 - what.len()).collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{what}")
}

/// The Job that runs `redpilot backup` against `host` (the pod IP of
/// `source`) and stores the snapshot under `key` in `target`.
pub fn job(b: &RedisBackup, target: Target<'_>, source: &str, host: &str, key: &str) -> Job {
    let redis = Names::new(&b.spec.redis);
    let mut args = vec![
        "backup".to_string(),
        "--host".into(),
        host.to_string(),
        "--port".into(),
        build::REDIS_PORT.to_string(),
        "--source-name".into(),
        source.to_string(),
    ];
    args.extend(target.args(key));
    let mut env = vec![EnvVar {
        name: "REDIS_PASSWORD".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: redis.server_auth(),
                key: build::PASSWORD_KEY.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    env.extend(target.env(false));
    agent_job(b, "backup", args, env, target)
}

/// The Job that removes a backup stored on a volume (`redpilot delete`),
/// for `deletionPolicy: Delete`.
pub fn delete_job(b: &RedisBackup, target: Target<'_>, key: &str) -> Job {
    let mut args = vec!["delete".to_string()];
    args.extend(target.args(key));
    agent_job(b, "delete", args, target.env(false), target)
}

/// A Job of the operator's image running the agent with `args`.
fn agent_job(
    b: &RedisBackup,
    what: &str,
    args: Vec<String>,
    env: Vec<EnvVar>,
    target: Target<'_>,
) -> Job {
    let name = b.metadata.name.clone().unwrap_or_default();
    let mut mounts = vec![VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    }];
    let mut volumes = vec![Volume {
        name: "tmp".into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    }];
    if let Some((v, m)) = target.volume(false) {
        volumes.push(v);
        mounts.push(m);
    }
    let container = agent::container(CONTAINER, args, env, mounts);
    let pod_labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "redpilot-backup".to_string(),
        ),
        (BACKUP_LABEL.to_string(), name.clone()),
    ]);
    let mut labels = pod_labels.clone();
    labels.insert(build::MANAGED_BY_LABEL.into(), build::MANAGED_BY.into());
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&name, what)),
            namespace: b.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: b.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(RETRIES),
            // A failure that retrying cannot fix ends the Job at once.
            pod_failure_policy: Some(PodFailurePolicy {
                rules: vec![PodFailurePolicyRule {
                    action: "FailJob".into(),
                    on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                        container_name: Some(CONTAINER.into()),
                        operator: "In".into(),
                        values: vec![EXIT_PERMANENT],
                    }),
                    ..Default::default()
                }],
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    automount_service_account_token: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{InstanceStatus, RedisStatus};

    fn inst(
        name: &str,
        role: &str,
        ready: bool,
        link: Option<bool>,
        offset: i64,
    ) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            role: role.into(),
            ready,
            offset: Some(offset),
            lag_bytes: None,
            link_up: link,
        }
    }

    fn redis(instances: Vec<InstanceStatus>) -> Redis {
        let mut r = Redis::new("cache", Default::default());
        r.status = Some(RedisStatus {
            instances,
            ..Default::default()
        });
        r
    }

    #[test]
    fn a_linked_replica_serves_before_the_primary() {
        let r = redis(vec![
            inst("cache-0", "primary", true, None, 100),
            inst("cache-1", "replica", true, Some(true), 90),
            inst("cache-2", "replica", true, Some(true), 95),
        ]);
        assert_eq!(choose_source(&r).as_deref(), Some("cache-2"));
        // A replica whose link is down, or that is not ready, is stale.
        let r = redis(vec![
            inst("cache-0", "primary", true, None, 100),
            inst("cache-1", "replica", true, Some(false), 90),
            inst("cache-2", "replica", false, Some(true), 95),
        ]);
        assert_eq!(choose_source(&r).as_deref(), Some("cache-0"));
        let r = redis(vec![inst("cache-0", "primary", false, None, 1)]);
        assert_eq!(choose_source(&r), None);
        assert_eq!(choose_source(&Redis::new("x", Default::default())), None);
    }

    #[test]
    fn keys_and_names() {
        assert_eq!(
            object_key(Some("/backups/"), "ns", "cache", "b1", "20261127T040000Z"),
            "backups/ns/cache/b1-20261127T040000Z.rdb"
        );
        assert_eq!(object_key(None, "ns", "c", "b", "t"), "ns/c/b-t.rdb");
        let long = "a".repeat(70);
        assert!(job_name(&long, "backup").len() <= 63);
        assert_eq!(job_name("nightly", "backup"), "nightly-backup");
    }

    #[test]
    fn the_job_is_owned_restricted_and_fails_fast_on_permanent_errors() {
        let mut b: RedisBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
            "metadata": {"name": "b1", "namespace": "ns", "uid": "u1"},
            "spec": {"redis": "cache", "target": {"s3": {"bucket": "bk", "credentials": {"secretName": "s3"}}}}
        }))
        .expect("backup");
        b.metadata.namespace = Some("ns".into());
        let target = Target::of(b.spec.target.s3.as_ref(), None).expect("target");
        let j = job(&b, target, "cache-1", "10.244.0.5", "ns/cache/b1-t.rdb");
        let owner = &j.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("RedisBackup", Some(true))
        );
        let spec = j.spec.expect("spec");
        let pod = spec.template.spec.expect("pod");
        let c = &pod.containers[0];
        let args = c.args.clone().unwrap_or_default().join(" ");
        assert!(
            args.starts_with(
                "backup --host 10.244.0.5 --port 6379 --source-name cache-1 --bucket bk"
            ),
            "{args}"
        );
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.pod_failure_policy.expect("policy").rules[0]
                .on_exit_codes
                .as_ref()
                .map(|r| r.values.clone()),
            Some(vec![EXIT_PERMANENT])
        );
        // Secrets by reference only.
        assert!(c.env.iter().flatten().all(|e| e.value.is_none()));
        // The Redis controller must not take the Job's pod for an instance.
        let pod_labels = spec
            .template
            .metadata
            .and_then(|m| m.labels)
            .unwrap_or_default();
        assert!(!pod_labels.contains_key(build::INSTANCE_LABEL));
        assert!(!pod_labels.contains_key(build::MANAGED_BY_LABEL));
    }
}
