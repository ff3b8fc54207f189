//! The backup Job (pure builders, table-tested): which instance a backup
//! is taken from, where it is stored, and the Job running the agent there.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile,
    SecretKeySelector, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use sha2::{Digest, Sha256};

use crate::api::v1alpha1::{Redis, RedisBackup};
use crate::controller::agent::{self, Target};
use crate::controller::names::{self, Names};

/// The agent's container in the Job.
pub const CONTAINER: &str = "backup";
/// Label on the Job's pods naming their RedisBackup.
pub const BACKUP_LABEL: &str = "redpilot.io/backup";
/// Exit status of an agent failure that running again cannot fix.
pub const EXIT_PERMANENT: i32 = 3;
/// Attempts after a failure worth retrying (the Job controller backs off
/// 10 s, 20 s, … between them).
pub const RETRIES: i32 = 2;

/// Why the backup agent, speaking TLS (`tls`: the Redis has `spec.tls`) or
/// plain text, cannot read the server of `pod` now: its template has the
/// server listen the other way (TLS being turned on or off, the ordered
/// restart has not reached it yet), or either way (a Cluster Redis between
/// its two rolls, switched live). `None` when it can, or when the pod says
/// nothing of it (no server container).
pub fn listens_otherwise(pod: &Pod, tls: bool) -> Option<String> {
    use crate::controller::layout::{probes_either, probes_tls};
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let c = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == crate::controller::names::SERVER_CONTAINER)?;
    if probes_either(c) {
        return Some(format!(
            "TLS is being turned {} on the cluster: {name} may listen either way until its last restart",
            if tls { "on" } else { "off" }
        ));
    }
    match (probes_tls(c), tls) {
        (false, true) => Some(format!(
            "TLS is being turned on: {name} still listens in plain text (the agent speaks TLS)"
        )),
        (true, false) => Some(format!(
            "TLS is being turned off: {name} still listens with TLS (the agent speaks plain text)"
        )),
        _ => None,
    }
}

/// The instance to back up, from the Redis's status: the ready replica with
/// a live link furthest ahead (never forking the primary when a replica can
/// serve), else the ready primary. `None` while no instance can serve.
pub fn choose_source(redis: &Redis) -> Option<String> {
    choose_source_where(redis, |_| true)
}

/// [`choose_source`] among the instances `usable` accepts (those no
/// ordered restart is about to take down).
pub fn choose_source_where(redis: &Redis, usable: impl Fn(&str) -> bool) -> Option<String> {
    source_candidates(redis, usable).into_iter().next()
}

/// Every instance [`choose_source_where`] could take, best first: the
/// ready replicas with a live link by offset, then the ready primary. The
/// status may be older than the servers (an operator that was cut off, a
/// server restarted since): the backup checks each on its server in turn.
pub fn source_candidates(redis: &Redis, usable: impl Fn(&str) -> bool) -> Vec<String> {
    let Some(status) = redis.status.as_ref() else {
        return Vec::new();
    };
    let candidates = || status.instances.iter().filter(|i| usable(&i.name));
    let mut out = ranked_replicas(candidates());
    out.extend(
        candidates()
            .filter(|i| i.role == "primary" && i.ready)
            .map(|i| i.name.clone()),
    );
    out
}

/// Whether the ordered restart under way will restart `pod`: its
/// StatefulSet is at a template revision the pod does not run and that
/// the operator does not keep for running instances (see `redis::kept`),
/// or its newest template is not observed yet (which revision that is,
/// and so whether the pod restarts, is not known: it counts as pending).
/// A backup read from such a pod would lose its source half way: the
/// restarted pod comes back at another address.
pub fn restart_pending(pod: &Pod, sts: &StatefulSet) -> bool {
    if !crate::controller::layout::sts_observed(sts) {
        return true;
    }
    let Some(want) = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref())
    else {
        return false;
    };
    let kept = crate::controller::redis::kept::kept_revisions(Some(sts));
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("controller-revision-hash"))
        .is_some_and(|have| have != want && !kept.iter().any(|k| k == have))
}

/// The instance to back up shard `shard` of a Cluster Redis from: the
/// ready, linked replica of the shard furthest ahead, else its ready
/// primary (pods `<name>-s<shard>-<j>`).
pub fn choose_shard_source(redis: &Redis, shard: i32) -> Option<String> {
    choose_shard_source_where(redis, shard, |_| true)
}

/// [`choose_shard_source`] among the instances `usable` accepts.
pub fn choose_shard_source_where(
    redis: &Redis,
    shard: i32,
    usable: impl Fn(&str) -> bool,
) -> Option<String> {
    shard_source_candidates(redis, shard, usable)
        .into_iter()
        .next()
}

/// Every instance [`choose_shard_source_where`] could take, best first
/// (see [`source_candidates`]).
pub fn shard_source_candidates(
    redis: &Redis,
    shard: i32,
    usable: impl Fn(&str) -> bool,
) -> Vec<String> {
    let (Some(status), Some(name)) = (redis.status.as_ref(), redis.metadata.name.as_deref()) else {
        return Vec::new();
    };
    let prefix = format!("{name}-s{shard}-");
    let of_shard = |name: &str| {
        name.strip_prefix(&prefix)
            .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut out = ranked_replicas(
        status
            .instances
            .iter()
            .filter(|i| of_shard(&i.name) && usable(&i.name)),
    );
    let primary = status
        .shards
        .iter()
        .find(|s| s.index == shard)
        .and_then(|s| s.primary.as_ref());
    out.extend(
        status
            .instances
            .iter()
            .filter(|i| Some(&i.name) == primary && i.role == "primary" && i.ready)
            .filter(|i| usable(&i.name))
            .map(|i| i.name.clone()),
    );
    out
}

/// Of `instances`, the ready replicas with a live link, furthest ahead
/// first (by name among equals).
fn ranked_replicas<'a>(
    instances: impl Iterator<Item = &'a crate::api::v1alpha1::InstanceStatus>,
) -> Vec<String> {
    let mut r: Vec<_> = instances
        .filter(|i| i.role == "replica" && i.ready && i.link_up == Some(true))
        .collect();
    r.sort_by_key(|i| (std::cmp::Reverse(i.offset.unwrap_or(0)), i.name.clone()));
    r.into_iter().map(|i| i.name.clone()).collect()
}

/// The key of shard `shard`'s file in a Cluster Redis's backup stored
/// under the prefix `key` (an [`object_key`] without its `.rdb`).
pub fn shard_key(key: &str, shard: i32) -> String {
    format!("{key}/shard-{shard}.rdb")
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

/// A Job's name, `<prefix>-<hash>-<what>` within 63 characters (a Job's
/// name is also a label value on its pods): the prefix is the backup's name
/// cut to fit, the hash the first 8 hex digits of the SHA-256 of the
/// backup's full name and UID. Two backups whose names share a long prefix
/// (every run of a schedule with a long name), or a backup re-created under
/// the same name, never share a Job.
pub fn job_name(backup: &str, uid: &str, what: &str) -> String {
    let digest = Sha256::digest(format!("{backup}/{uid}").as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let room = 63usize.saturating_sub(what.len() + hash.len() + 2);
    let mut base: String = backup.chars().take(room).collect();
    while base.ends_with('-') || base.ends_with('.') {
        base.pop();
    }
    if base.is_empty() {
        format!("{hash}-{what}")
    } else {
        format!("{base}-{hash}-{what}")
    }
}

/// Whether the Job's controller owner reference is the backup with `uid`:
/// a Job of that name that another object controls is not this backup's,
/// and neither is its outcome.
pub fn controlled_by(j: &Job, uid: &str) -> bool {
    j.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Why a manifest cannot describe this backup: it names another key than
/// the one this backup's Job was given (`None` when it matches).
pub fn manifest_mismatch(expected: Option<&str>, m: &crate::backup::Manifest) -> Option<String> {
    match expected {
        Some(k) if k == m.key => None,
        Some(k) => Some(format!(
            "the Job's manifest describes key {}, not this backup's key {k}; the outcome is not this backup's",
            m.key
        )),
        None => Some(format!(
            "the Job's manifest describes key {} but this backup has no key in its status",
            m.key
        )),
    }
}

/// How long a Job's pod may stay unschedulable before the backup fails
/// (room for a cluster autoscaler to add a node).
pub const UNSCHEDULABLE_BOUND_SECONDS: i64 = 300;

/// How long a pod may wait with an image pull or container configuration
/// error (a registry hiccup clears by itself within this) before the
/// backup fails.
pub const START_ERROR_BOUND_SECONDS: i64 = 30;

/// Why a Job's pod cannot start, once it has been so for longer than its
/// bound at `now`: a bounded reason and a message naming the pod and what
/// the cluster said. `None` while it may still start (or has started).
pub fn cannot_start(
    pod: &k8s_openapi::api::core::v1::Pod,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<(&'static str, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref()?;
    let since = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.and_then(|t| chrono::DateTime::<chrono::Utc>::from_timestamp(t.0.as_second(), 0))
            .map(|t| (now - t).num_seconds())
    };
    let age = since(pod.metadata.creation_timestamp.as_ref()).unwrap_or(0);
    for c in status.container_statuses.iter().flatten() {
        let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = w.reason.as_deref().unwrap_or_default();
        let category = match reason {
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => {
                "ImagePullFailed"
            }
            "CreateContainerConfigError" | "CreateContainerError" => "PodConfigInvalid",
            _ => continue,
        };
        if age <= START_ERROR_BOUND_SECONDS {
            return None;
        }
        let what = w.message.as_deref().unwrap_or("no message");
        let image = c.image.as_str();
        return Some((
            category,
            format!(
                "pod {name} cannot start its container {} (image {image}): {reason}: {what}",
                c.name
            ),
        ));
    }
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    })?;
    let waited = since(unschedulable.last_transition_time.as_ref()).unwrap_or(age);
    (waited > UNSCHEDULABLE_BOUND_SECONDS).then(|| {
        (
            "Unschedulable",
            format!(
                "pod {name} could not be scheduled for {waited} s: {}",
                unschedulable.message.as_deref().unwrap_or("no message")
            ),
        )
    })
}

/// The instance a backup Job reads from.
#[derive(Debug, Clone, Copy)]
pub struct JobSource<'a> {
    /// The pod's name.
    pub pod: &'a str,
    /// Its IP.
    pub host: &'a str,
    /// In Cluster mode: the shard's index and its slots (`0-5460,…`).
    pub shard: Option<(i32, &'a str)>,
    /// The Redis's `spec.tls` Secret: the agent connects with TLS,
    /// trusting its `ca.crt` (the only file it mounts, unless
    /// `tls_present`).
    pub tls_secret: Option<&'a str>,
    /// `spec.tls.clientAuth` asks clients for a certificate: the agent
    /// mounts the Secret's `tls.crt` and `tls.key` too and presents them.
    pub tls_present: bool,
    /// The instance's replication offset when it was checked: the agent
    /// reads only a snapshot that reached it (`--min-offset`).
    pub min_offset: Option<i64>,
}

/// The Job `name` that runs `redpilot backup` against `from` and stores
/// the snapshot under `key` in `target`, stopped after the backup's
/// `spec.timeoutSeconds`; as the agent's own ACL user (`as_backup_user`)
/// unless the Redis has no password.
pub fn job(
    b: &RedisBackup,
    name: &str,
    target: Target<'_>,
    from: &JobSource<'_>,
    key: &str,
    as_backup_user: bool,
) -> Job {
    let (source, host, shard) = (from.pod, from.host, from.shard);
    let redis = Names::new(&b.spec.redis);
    let mut args = vec![
        "backup".to_string(),
        "--host".into(),
        host.to_string(),
        "--port".into(),
        names::REDIS_PORT.to_string(),
        "--source-name".into(),
        source.to_string(),
    ];
    if let Some((index, slots)) = shard {
        args.extend([
            "--shard".into(),
            index.to_string(),
            "--slots".into(),
            slots.to_string(),
        ]);
    }
    if let Some(o) = from.min_offset {
        args.extend(["--min-offset".to_string(), o.to_string()]);
    }
    if from.tls_secret.is_some() {
        args.extend([
            "--tls-ca-file".to_string(),
            crate::controller::layout::ca_path(),
        ]);
        if from.tls_present {
            use crate::controller::layout::{CERT_FILE, KEY_FILE, mounted};
            args.extend([
                "--tls-cert-file".to_string(),
                mounted(CERT_FILE),
                "--tls-key-file".to_string(),
                mounted(KEY_FILE),
            ]);
        }
    }
    args.extend(target.args(key));
    // The agent's own user, which may only run the replication handshake
    // (see `auth::system_users`); the default user only for a Redis
    // without a password.
    let (user, key_of_password) = if as_backup_user {
        (Some(names::BACKUP_USER), names::BACKUP_PASSWORD_KEY)
    } else {
        (None, names::PASSWORD_KEY)
    };
    let mut env = vec![EnvVar {
        name: "REDIS_PASSWORD".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: redis.server_auth(),
                key: key_of_password.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if let Some(u) = user {
        env.push(EnvVar {
            name: "REDIS_USER".into(),
            value: Some(u.into()),
            ..Default::default()
        });
    }
    env.extend(target.env(false));
    let mut j = agent_job(b, name, args, env, target);
    if let Some(spec) = j.spec.as_mut() {
        spec.active_deadline_seconds = Some(b.spec.timeout_seconds());
        if let (Some(secret), Some(pod)) = (from.tls_secret, spec.template.spec.as_mut()) {
            add_ca_volume(pod, secret, from.tls_present);
        }
    }
    j
}

/// Mounts `ca.crt` of the TLS Secret `secret` at [`names::TLS_DIR`] in
/// the agent's container: the CA only (no key), readable by any user (the
/// agent's user is the image's); with `present`, the certificate and its
/// key too, readable by the pod's group only ([`AGENT_KEY_GROUP`], which
/// the kubelet gives the files and the agent's process, whatever its user).
fn add_ca_volume(pod: &mut PodSpec, secret: &str, present: bool) {
    use crate::controller::layout::{CA_FILE, CERT_FILE, KEY_FILE, tls_mount, tls_volume};
    const VOLUME: &str = "tls-ca";
    let files: &[&str] = if present {
        &[CA_FILE, CERT_FILE, KEY_FILE]
    } else {
        &[CA_FILE]
    };
    let mode = if present {
        pod.security_context
            .get_or_insert_with(Default::default)
            .fs_group = Some(AGENT_KEY_GROUP);
        0o440
    } else {
        0o444
    };
    pod.volumes
        .get_or_insert_with(Vec::new)
        .push(tls_volume(VOLUME, secret, files, mode));
    for c in &mut pod.containers {
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(tls_mount(VOLUME));
    }
}

/// The group that owns the backup agent's TLS key (`fsGroup`) when it
/// presents a client certificate: the key is not readable by other users.
const AGENT_KEY_GROUP: i64 = 999;

/// The name of the Job that deletes a stored backup.
pub fn delete_job_name(b: &RedisBackup) -> String {
    let name = b.metadata.name.clone().unwrap_or_default();
    let uid = b.metadata.uid.clone().unwrap_or_default();
    job_name(&name, &uid, "delete")
}

/// The Job that removes a stored backup (`redpilot delete`, from a bucket
/// or a volume), for `deletionPolicy: Delete`: the files under `keys` (one, or one per
/// shard) and their manifests.
pub fn delete_job(b: &RedisBackup, target: Target<'_>, keys: &[String]) -> Job {
    let mut args = vec!["delete".to_string()];
    if let Some((first, more)) = keys.split_first() {
        args.extend(target.args(first));
        for k in more {
            args.extend(["--also-key".to_string(), k.clone()]);
        }
    }
    agent_job(b, &delete_job_name(b), args, target.env(false), target)
}

/// A Job of the operator's image running the agent with `args`.
fn agent_job(
    b: &RedisBackup,
    job_name: &str,
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
    labels.insert(names::MANAGED_BY_LABEL.into(), names::MANAGED_BY.into());
    Job {
        metadata: ObjectMeta {
            name: Some(job_name.to_string()),
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

    /// A pod of a Redis whose server's readiness probe runs `probe`.
    fn server_pod(probe: &str) -> Pod {
        use k8s_openapi::api::core::v1::{Container, ExecAction, Probe};
        Pod {
            metadata: ObjectMeta {
                name: Some("cache-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: crate::controller::names::SERVER_CONTAINER.into(),
                    readiness_probe: Some(Probe {
                        exec: Some(ExecAction {
                            command: Some(vec!["sh".into(), "-c".into(), probe.into()]),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_backup_waits_for_a_source_that_listens_as_the_agent_speaks() {
        use crate::controller::layout::{EITHER_STARTS_PLAIN, TLS_PROBE_FLAG};
        let plain = server_pod("redis-cli -h 127.0.0.1 -p 6379 info");
        let tls = server_pod(&format!(
            "redis-cli{TLS_PROBE_FLAG} --insecure -h 127.0.0.1 info"
        ));
        let either = server_pod(&format!(
            "{EITHER_STARTS_PLAIN}\nredis-cli info\nredis-cli{TLS_PROBE_FLAG} info"
        ));
        assert_eq!(listens_otherwise(&plain, false), None);
        assert_eq!(listens_otherwise(&tls, true), None);
        let on = listens_otherwise(&plain, true).expect("TLS on, not yet restarted");
        assert!(on.contains("turned on") && on.contains("cache-1"), "{on}");
        let off = listens_otherwise(&tls, false).expect("TLS off, not yet restarted");
        assert!(off.contains("turned off"), "{off}");
        for way in [true, false] {
            let e = listens_otherwise(&either, way).expect("either way: unknown");
            assert!(e.contains("either way"), "{e}");
        }
        // No server container: nothing to tell by.
        assert_eq!(listens_otherwise(&Pod::default(), true), None);
    }

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
    fn a_source_a_roll_is_about_to_restart_is_passed_over() {
        let r = redis(vec![
            inst("cache-0", "primary", true, None, 100),
            inst("cache-1", "replica", true, Some(true), 90),
            inst("cache-2", "replica", true, Some(true), 95),
        ]);
        // cache-2 (furthest ahead) restarts next: cache-1 serves.
        let rolled = |n: &str| n != "cache-2";
        assert_eq!(choose_source_where(&r, rolled).as_deref(), Some("cache-1"));
        // Both replicas restart: the primary, if it stays.
        let only_primary = |n: &str| n == "cache-0";
        assert_eq!(
            choose_source_where(&r, only_primary).as_deref(),
            Some("cache-0")
        );
        // Everything restarts: none (the backup waits).
        assert_eq!(choose_source_where(&r, |_| false), None);
    }

    fn pod_at(revision: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("cache-1".into()),
                labels: Some(BTreeMap::from([(
                    "controller-revision-hash".to_string(),
                    revision.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn set_at(generation: i64, observed: i64, update: &str, kept: Option<&str>) -> StatefulSet {
        use k8s_openapi::api::apps::v1::StatefulSetStatus;
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("cache".into()),
                generation: Some(generation),
                annotations: kept.map(|k| {
                    BTreeMap::from([(
                        crate::controller::redis::kept::KEPT_ANNOTATION.to_string(),
                        k.to_string(),
                    )])
                }),
                ..Default::default()
            },
            status: Some(StatefulSetStatus {
                observed_generation: Some(observed),
                update_revision: Some(update.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_behind_the_template_is_about_to_restart_unless_its_revision_is_kept() {
        assert!(!restart_pending(&pod_at("r2"), &set_at(2, 2, "r2", None)));
        assert!(restart_pending(&pod_at("r1"), &set_at(2, 2, "r2", None)));
        // An operator upgrade's template change keeps the running revision.
        assert!(!restart_pending(
            &pod_at("r1"),
            &set_at(2, 2, "r2", Some("r1"))
        ));
        // Not observed yet: the update revision does not describe the
        // newest template, so any pod may restart.
        assert!(restart_pending(&pod_at("r1"), &set_at(3, 2, "r2", None)));
        assert!(restart_pending(&pod_at("r2"), &set_at(3, 2, "r2", None)));
    }

    #[test]
    fn a_shard_is_backed_up_from_its_own_replica() {
        let mut r = redis(vec![
            inst("cache-s0-0", "primary", true, None, 100),
            inst("cache-s0-1", "replica", true, Some(true), 90),
            inst("cache-s1-0", "replica", true, Some(true), 500),
            inst("cache-s1-1", "primary", true, None, 510),
            inst("cache-s10-0", "replica", true, Some(true), 900),
        ]);
        r.metadata.name = Some("cache".into());
        if let Some(st) = r.status.as_mut() {
            st.shards = (0..2)
                .map(|i| crate::api::v1alpha1::ShardStatus {
                    index: i,
                    primary: Some(if i == 0 { "cache-s0-0" } else { "cache-s1-1" }.into()),
                    ..Default::default()
                })
                .collect();
        }
        assert_eq!(choose_shard_source(&r, 0).as_deref(), Some("cache-s0-1"));
        assert_eq!(choose_shard_source(&r, 1).as_deref(), Some("cache-s1-0"));
        // Shard 1's replica unlinked: its primary; shard 2 has no instance.
        if let Some(st) = r.status.as_mut() {
            st.instances[2].link_up = Some(false);
        }
        assert_eq!(choose_shard_source(&r, 1).as_deref(), Some("cache-s1-1"));
        assert_eq!(choose_shard_source(&r, 2), None);
        assert_eq!(
            shard_key("e2e/ns/cache/b1-T", 2),
            "e2e/ns/cache/b1-T/shard-2.rdb"
        );
    }

    #[test]
    fn keys_and_names() {
        assert_eq!(
            object_key(Some("/backups/"), "ns", "cache", "b1", "20261127T040000Z"),
            "backups/ns/cache/b1-20261127T040000Z.rdb"
        );
        assert_eq!(object_key(None, "ns", "c", "b", "t"), "ns/c/b-t.rdb");
        let long = "a".repeat(70);
        assert!(job_name(&long, "u1", "backup").len() <= 63);
        let short = job_name("nightly", "u1", "backup");
        assert!(
            short.starts_with("nightly-") && short.ends_with("-backup"),
            "{short}"
        );
        assert_eq!(short.len(), "nightly-".len() + 8 + "-backup".len());
        // Two runs of a schedule with a long name: the same first 56
        // characters, then the time they were due.
        let base = "a-schedule-whose-name-is-long-enough-to-fill-fifty-chars";
        let (one, two) = (
            format!("{base}-202611270400"),
            format!("{base}-202611270500"),
        );
        assert_ne!(
            job_name(&one, "u1", "backup"),
            job_name(&two, "u2", "backup")
        );
        assert_ne!(
            job_name(&one, "u1", "backup"),
            job_name(&two, "u1", "backup")
        );
        // A RedisBackup re-created under the same name gets another Job.
        assert_ne!(
            job_name(&one, "u1", "backup"),
            job_name(&one, "u3", "backup")
        );
        for n in [&one, &two, &"x.y-".repeat(20)] {
            let j = job_name(n, "u1", "delete");
            assert!(j.len() <= 63, "{j}");
            assert!(
                j.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
                "{j}"
            );
            assert!(!j.contains("--") && !j.contains(".-"), "{j}");
        }
    }

    #[test]
    fn only_a_job_this_backup_controls_and_a_manifest_of_its_key_are_trusted() {
        let mut j = Job::default();
        assert!(!controlled_by(&j, "u1"));
        let owner = |uid: &str, controller: Option<bool>| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "redpilot.io/v1alpha1".into(),
                kind: "RedisBackup".into(),
                name: "b1".into(),
                uid: uid.into(),
                controller,
                ..Default::default()
            }
        };
        j.metadata.owner_references = Some(vec![owner("u2", Some(true))]);
        assert!(!controlled_by(&j, "u1"), "another backup's Job");
        j.metadata.owner_references = Some(vec![owner("u1", None)]);
        assert!(
            !controlled_by(&j, "u1"),
            "an owner that is not the controller"
        );
        j.metadata.owner_references = Some(vec![owner("u2", None), owner("u1", Some(true))]);
        assert!(controlled_by(&j, "u1"));

        let m = crate::backup::Manifest {
            format: 1,
            key: "e2e/ns/c/first-20261127T040000Z.rdb".into(),
            size_bytes: 1,
            sha256: "ab".into(),
            keys: None,
            keys_db: None,
            rdb_version: 10,
            engine: "Redis".into(),
            engine_version: None,
            source: "c-0".into(),
            replid: None,
            offset: None,
            shard: None,
            slots: None,
            started_at: "t0".into(),
            completed_at: "t1".into(),
        };
        assert_eq!(manifest_mismatch(Some(m.key.as_str()), &m), None);
        let why = manifest_mismatch(Some("e2e/ns/c/second-20261127T040100Z.rdb"), &m)
            .expect("a mismatch");
        assert!(
            why.contains("first-20261127T040000Z.rdb")
                && why.contains("second-20261127T040100Z.rdb"),
            "{why}"
        );
        assert!(manifest_mismatch(None, &m).is_some());
    }

    fn waiting_pod(
        age_s: i64,
        waiting: Option<&str>,
        unschedulable_for: Option<i64>,
    ) -> (
        k8s_openapi::api::core::v1::Pod,
        chrono::DateTime<chrono::Utc>,
    ) {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodStatus,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-27T04:00:00Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        let at = |s: i64| {
            Time(
                k8s_openapi::jiff::Timestamp::from_second(
                    (now - chrono::Duration::seconds(s)).timestamp(),
                )
                .expect("timestamp"),
            )
        };
        let mut p = Pod::default();
        p.metadata.name = Some("b1-0a1b2c3d-backup-x7k2p".into());
        p.metadata.creation_timestamp = Some(at(age_s));
        p.status = Some(PodStatus {
            container_statuses: waiting.map(|r| {
                vec![ContainerStatus {
                    name: CONTAINER.into(),
                    image: "registry.example/redpilot:9".into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(r.into()),
                            message: Some("pull access denied".into()),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            conditions: unschedulable_for.map(|s| {
                vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("Unschedulable".into()),
                    message: Some(
                        "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims"
                            .into(),
                    ),
                    last_transition_time: Some(at(s)),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        (p, now)
    }

    #[test]
    fn a_pod_that_cannot_start_fails_the_backup_after_its_bound() {
        let check = |age, waiting, unsched| {
            let (p, now) = waiting_pod(age, waiting, unsched);
            cannot_start(&p, now)
        };
        // A pull error clears by itself within the bound; not after it.
        assert_eq!(check(10, Some("ErrImagePull"), None), None);
        let (reason, msg) = check(31, Some("ImagePullBackOff"), None).expect("failed");
        assert_eq!(reason, "ImagePullFailed");
        assert!(
            msg.contains("ImagePullBackOff") && msg.contains("registry.example/redpilot:9"),
            "{msg}"
        );
        assert_eq!(
            check(60, Some("CreateContainerConfigError"), None).map(|(r, _)| r),
            Some("PodConfigInvalid")
        );
        // Waiting for its image to be pulled, or starting: fine.
        assert_eq!(check(600, Some("ContainerCreating"), None), None);
        // Unschedulable: only past its own bound.
        assert_eq!(
            check(600, None, Some(UNSCHEDULABLE_BOUND_SECONDS - 5)),
            None
        );
        let (reason, msg) =
            check(600, None, Some(UNSCHEDULABLE_BOUND_SECONDS + 5)).expect("failed");
        assert_eq!(reason, "Unschedulable");
        assert!(
            msg.contains("unbound immediate PersistentVolumeClaims"),
            "{msg}"
        );
        assert_eq!(check(5, None, None), None);
    }

    /// RedisBackup `ns/b1` of Redis `cache` to S3 bucket `bk`.
    fn s3_backup() -> RedisBackup {
        let mut b: RedisBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
            "metadata": {"name": "b1", "namespace": "ns", "uid": "u1"},
            "spec": {"redis": "cache", "target": {"s3": {"bucket": "bk", "credentials": {"secretName": "s3"}}}}
        }))
        .expect("backup");
        b.metadata.namespace = Some("ns".into());
        b
    }

    #[test]
    fn the_job_is_owned_restricted_and_fails_fast_on_permanent_errors() {
        let b = s3_backup();
        let target = Target::of(b.spec.target.s3.as_ref(), None).expect("target");
        let j = job(
            &b,
            "b1-0a1b2c3d-backup",
            target,
            &JobSource {
                pod: "cache-1",
                host: "10.244.0.5",
                shard: None,
                tls_secret: None,
                tls_present: false,
                min_offset: Some(4711),
            },
            "ns/cache/b1-t.rdb",
            true,
        );
        assert_eq!(j.metadata.name.as_deref(), Some("b1-0a1b2c3d-backup"));
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
                "backup --host 10.244.0.5 --port 6379 --source-name cache-1 \
                 --min-offset 4711 --bucket bk"
            ),
            "{args}"
        );
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        // A Job that runs too long is stopped (spec.timeoutSeconds).
        assert_eq!(
            spec.active_deadline_seconds,
            Some(crate::api::v1alpha1::RedisBackupSpec::DEFAULT_TIMEOUT_SECONDS)
        );
        assert_eq!(
            spec.pod_failure_policy.expect("policy").rules[0]
                .on_exit_codes
                .as_ref()
                .map(|r| r.values.clone()),
            Some(vec![EXIT_PERMANENT])
        );
        // Secrets by reference only; the agent's own user, not the
        // default user's password.
        let env = c.env.clone().unwrap_or_default();
        assert!(
            env.iter()
                .all(|e| e.value.is_none() || e.name == "REDIS_USER")
        );
        let user = env.iter().find(|e| e.name == "REDIS_USER");
        assert_eq!(
            user.and_then(|e| e.value.as_deref()),
            Some("redpilot-backup")
        );
        let pw = env
            .iter()
            .find(|e| e.name == "REDIS_PASSWORD")
            .expect("password");
        let key = pw
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .map(|s| (s.name.as_str(), s.key.as_str()));
        assert_eq!(key, Some(("cache-server-auth", "backup-password")));
        // The Redis controller must not take the Job's pod for an instance.
        let pod_labels = spec
            .template
            .metadata
            .and_then(|m| m.labels)
            .unwrap_or_default();
        assert!(!pod_labels.contains_key(names::INSTANCE_LABEL));
        assert!(!pod_labels.contains_key(names::MANAGED_BY_LABEL));
    }

    #[test]
    fn with_client_certificates_the_agent_mounts_and_presents_the_servers() {
        let b = s3_backup();
        for present in [false, true] {
            let target = Target::of(b.spec.target.s3.as_ref(), None).expect("target");
            let j = job(
                &b,
                "b1-backup",
                target,
                &JobSource {
                    pod: "cache-1",
                    host: "10.244.0.5",
                    shard: None,
                    tls_secret: Some("cache-tls"),
                    tls_present: present,
                    min_offset: None,
                },
                "k",
                true,
            );
            let pod = j.spec.and_then(|s| s.template.spec).expect("pod");
            let args = pod.containers[0].args.clone().unwrap_or_default().join(" ");
            assert!(
                args.contains("--tls-ca-file /etc/redis-tls/ca.crt"),
                "{args}"
            );
            assert_eq!(
                args.contains(
                    "--tls-cert-file /etc/redis-tls/tls.crt --tls-key-file /etc/redis-tls/tls.key"
                ),
                present,
                "{args}"
            );
            let files: Vec<String> = pod
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| v.secret.as_ref())
                .filter(|s| s.secret_name.as_deref() == Some("cache-tls"))
                .flat_map(|s| s.items.iter().flatten().map(|i| i.key.clone()))
                .collect();
            let want: &[&str] = if present {
                &["ca.crt", "tls.crt", "tls.key"]
            } else {
                &["ca.crt"]
            };
            assert_eq!(files, want, "present: {present}");
            // The key readable by the pod's group, never by any user.
            let mode = pod
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| v.secret.as_ref())
                .find(|s| s.secret_name.as_deref() == Some("cache-tls"))
                .and_then(|s| s.default_mode);
            let group = pod.security_context.as_ref().and_then(|c| c.fs_group);
            let expected = if present {
                (Some(0o440), Some(AGENT_KEY_GROUP))
            } else {
                (Some(0o444), None)
            };
            assert_eq!((mode, group), expected, "present: {present}");
        }
    }
}
