//! Pure builder of the StatefulSet: the pod template, its start-up and
//! probe scripts, volumes and claims.
//!
//! Length: ~410 lines of code: the pod template is one large literal
//! (containers, probes, volumes, security context), with the two shell
//! scripts it runs kept beside it.

use crate::controller::layout::{TLS_VOLUME, tls_mount, tls_volume};
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    ExecAction, Lifecycle, LifecycleHandler, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, SecretKeySelector, TCPSocketAction, Volume,
    VolumeMount, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::v1alpha1::{Engine, Mode, Redis};
use crate::controller::layout::{BOOT_FENCE_HOST, BOOT_FENCE_PORT, restricted_security_context};
use crate::controller::names::{
    AUTH_CONF_KEY, AUTH_CONF_PATH, CONFIG_KEY, ENGINE_ANNOTATION, Names, PASSWORD_KEY, PRIMARY_KEY,
    PROBE_PASSWORD_KEY, REDIS_PORT, RESTART_HASH_ANNOTATION, SERVER_CONTAINER, VERSION_ANNOTATION,
    labels, meta, selector_labels, stamp_hash,
};

/// Part of the start-up script: `maxmemory` never above 75 % of the memory
/// limit the container runs under (its cgroup's). redis.conf has 75 % of the
/// memory autopilot's target, which a container restarting before its pod's
/// resize is in effect (or re-created at the template's smaller size) does
/// not have yet; the operator raises it live once the limit is in effect.
/// `REDPILOT_CGROUP_ROOT` and `REDPILOT_CGROUP_FILE` stand in for
/// `/sys/fs/cgroup` and `/proc/self/cgroup` in tests.
pub(crate) const MAXMEMORY_CAP: &str = r#"cg=${REDPILOT_CGROUP_ROOT:-/sys/fs/cgroup}
limit=
while IFS=: read -r _ ctrl path; do
  case "$ctrl" in
    memory) dir=$cg/memory; file=memory.limit_in_bytes ;;
    '') dir=$cg; file=memory.max ;;
    *) continue ;;
  esac
  # The path is the host's; the mount may start further down it (a
  # container's own cgroup): drop leading parts until the file is there.
  p=$path
  while :; do
    if [ -r "$dir$p/$file" ]; then
      v=$(cat "$dir$p/$file" 2>/dev/null || true)
      case "$v" in ''|*[!0-9]*) ;; *) limit=$v ;; esac
      break
    fi
    case "$p" in
      /*/*) p=/${p#/*/} ;;
      /?*) p= ;;
      *) break ;;
    esac
  done
  [ -z "$limit" ] || break
done < "${REDPILOT_CGROUP_FILE:-/proc/self/cgroup}"
if [ -n "$limit" ]; then
  conf=$(sed -n 's/^maxmemory \([0-9][0-9]*\)$/\1/p' "$1" 2>/dev/null || true)
  cap=$((limit / 4 * 3))
  if [ -n "$conf" ] && [ "$cap" -lt "$conf" ]; then
    set -- "$@" --maxmemory "$cap"
  fi
fi"#;

/// The start-up script. The password is never on the command line: redis.conf
/// includes it from the server-auth Secret. No Replication instance makes itself primary at boot: one
/// that is not the published primary follows it, and the published primary
/// itself (restarting in place, or back under the same address) or any
/// instance of a new Redis boots fenced (see [`BOOT_FENCE_HOST`]) until the
/// operator compares offsets and promotes one. A Standalone instance has no
/// replica to wipe and boots writable.
///
/// An instance that boots as a replica of the published primary moves aside
/// (never deletes) a `dump.rdb` newer than its server can load (`max_rdb`):
/// a replica rolled back from a failed upgrade may have saved one, the old
/// server would exit on it, and the primary sends the data again anyway.
fn start_script(server: &str, fence_at_boot: bool, max_rdb: Option<u32>, pitr: &str) -> String {
    let guard = match max_rdb {
        Some(max) => format!(
            r#"
  if [ -f /data/dump.rdb ]; then
    h=$(head -c 9 /data/dump.rdb)
    case "$h" in
      REDIS0*) v=${{h#REDIS}} ;;
      VALKEY*) v=${{h#VALKEY}} ;;
      *) v=0 ;;
    esac
    v=$(expr "$v" + 0 2>/dev/null || echo 0)
    if [ "$v" -gt {max} ]; then
      mv /data/dump.rdb "/data/dump.rdb.format-$v"
      echo "redpilot: moved aside dump.rdb in RDB format $v (this server reads up to {max}); the primary resends the data" >&2
    fi
  fi"#
        ),
        None => String::new(),
    };
    let own = if fence_at_boot {
        format!(
            r#"
else
  set -- "$@" --replicaof {BOOT_FENCE_HOST} {BOOT_FENCE_PORT}"#
        )
    } else {
        String::new()
    };
    format!(
        r#"set -eu
umask 077
printf '%s' "${{REDIS_AUTH_CONF:-}}" > {AUTH_CONF_PATH}
primary="${{REDPILOT_PRIMARY:-}}"
set -- /etc/redis/{CONFIG_KEY} --replica-announce-ip "$POD_IP"
if [ -n "$primary" ] && [ "${{primary%% *}}" != "$POD_IP" ]; then
  set -- "$@" --replicaof ${{primary%% *}} ${{primary##* }}{guard}{own}
fi
{pitr}{MAXMEMORY_CAP}
exec {server} "$@"
"#
    )
}

/// The restored append-only file of a restore to a point in time
/// (`bootstrap.fromBackup.pointInTime`), in `/data`.
pub const PITR_FILE: &str = "redpilot-pitr.aof";

/// For a Redis restored to a point in time: while the restore's marker
/// (`<file>.restored`) is in `/data`, the server starts on the restored
/// append-only file (`appendonly yes` on it alone). The operator saves the
/// data as `dump.rdb` once it is loaded; the restore container then
/// removes the file and the marker, and later starts are as configured.
pub(crate) fn pitr_clause(spec: &crate::api::v1alpha1::RedisSpec) -> String {
    let pitr = spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.from_backup.point_in_time.is_some());
    if !pitr {
        return String::new();
    }
    // Redis 6.2 keeps one file in `dir`; 7.0+ a directory of parts, made
    // from the single file at the first start.
    let dir = if spec
        .version()
        .parse::<crate::redis::info::Version>()
        .is_ok_and(|v| spec.engine() == Engine::Redis && v.major < 7)
    {
        String::new()
    } else {
        format!(" --appenddirname {}", PITR_FILE.trim_end_matches(".aof"))
    };
    let stem = PITR_FILE.trim_end_matches(".aof");
    // Once the bootstrap is done and the data was saved as `dump.rdb`
    // after the restore, the restored file goes (a container restart runs
    // no init container, so the script looks too).
    format!(
        r#"if [ -f /data/{PITR_FILE}.restored ]; then
  if [ -n "${{REDPILOT_BOOTSTRAPPED:-}}" ] && [ /data/dump.rdb -nt /data/{PITR_FILE}.restored ]; then
    rm -rf /data/{stem} /data/{PITR_FILE} /data/{PITR_FILE}.restored
  else
    set -- "$@" --appendonly yes --appendfilename {PITR_FILE}{dir}
  fi
fi
"#
    )
}

/// The newest RDB format the server of `spec`'s engine and version reads
/// (the first line of a dump: `REDIS0009`, `VALKEY080`). Measured with the
/// test ground's servers: Redis 6.2 → 9, 7.0 → 10, Valkey 8.1 → 11,
/// Valkey 9.1 → 80; the others from their release notes. `None` when not
/// known.
pub(super) fn max_rdb(spec: &crate::api::v1alpha1::RedisSpec) -> Option<u32> {
    let v: crate::redis::info::Version = spec.version().parse().ok()?;
    match (spec.engine(), v.major, v.minor) {
        (Engine::Redis, 6, 2) => Some(9),
        (Engine::Redis, 7, 0) => Some(10),
        (Engine::Redis, 7, 2) => Some(11),
        (Engine::Redis, 7, 4) => Some(12),
        (Engine::Valkey, 7, 2) | (Engine::Valkey, 8, _) => Some(11),
        (Engine::Valkey, 9, _) => Some(80),
        _ => None,
    }
}

/// Readiness: the server answers, is not loading a dataset, and — for a
/// replica — has a live link to its primary and is not in a full sync. The
/// read-only Service selects ready replicas, so reads never land on an
/// instance that is empty, stale or still loading. Valkey 8.1+ names the
/// fields `role:replica` and `primary_*`.
///
/// It authenticates as [`crate::controller::names::PROBE_USER`] (only `PING` and `INFO`)
/// with a password that never rotates: its environment is resolved once,
/// when the container starts, and must stay valid after a live password
/// rotation. Without a password (auth off) it sends none.
fn probe_script(cli: &str, tls: &str, either: Option<&str>) -> String {
    let user = crate::controller::names::PROBE_USER;
    // With TLS (`tls`: the CLI's flags, `crate::controller::layout::cli_flags`) the CLI
    // checks nothing of the certificate: the server is the pod's own, on
    // its loopback, and while a CA changes the mounted CA runs ahead of
    // the certificate served until the operator has the server read its
    // files again; a check would take every instance out of its Services
    // for that time.
    // While a Cluster Redis turns TLS on or off (`either`: the other
    // way's flags), the server may listen the other way than it started:
    // the probe asks that way when the first gets no answer.
    let ask = |flags: &str| {
        format!(
            r#"i=$(REDISCLI_AUTH="$REDPILOT_PROBE_PASSWORD" VALKEYCLI_AUTH="$REDPILOT_PROBE_PASSWORD" {cli} $u{flags} -h 127.0.0.1 -p {REDIS_PORT} info 2>/dev/null | tr -d '\r')"#
        )
    };
    // Plain text first: a plain-text ask of a TLS port is refused at once,
    // while a TLS handshake sent to a plain-text port can wait for an
    // answer that never comes (the server reads it as an unfinished
    // command).
    let mut asks = ask(tls);
    if let Some(other) = either {
        let (mark, first, then) = if tls.is_empty() {
            (crate::controller::layout::EITHER_STARTS_PLAIN, tls, other)
        } else {
            (crate::controller::layout::EITHER_STARTS_TLS, other, tls)
        };
        asks = format!("{mark}\n{}\n[ -n \"$i\" ] || {}", ask(first), ask(then));
    }
    format!(
        r#"u=; [ -n "$REDPILOT_PROBE_PASSWORD" ] && u="--user {user}"
{asks}
echo "$i" | grep -qx 'loading:0' || exit 1
echo "$i" | grep -Eqx 'role:(slave|replica)' || exit 0
echo "$i" | grep -Eqx '(master|primary)_link_status:up' || exit 1
! echo "$i" | grep -Eqx '(master|primary)_sync_in_progress:1'"#
    )
}

/// How long a primary's `preStop` hook holds its shutdown, at most, for
/// the operator to move the primary elsewhere: polls of
/// [`HANDOVER_POLL_SECS`] each (10 s in all, well inside the 30 s grace
/// period; a handover takes well under a second).
pub const HANDOVER_POLLS: u32 = 50;
/// The hook's poll interval.
pub const HANDOVER_POLL_SECS: &str = "0.2";

/// The `preStop` hook of a Replication instance. When the pod of the
/// primary is deleted, the server would otherwise get SIGTERM at once:
/// it pauses writes, lets its replicas catch up and exits, and the
/// replacement waits for the failure monitor to see it gone (about a
/// second and a half of refused writes, measured). Instead the hook holds
/// the shutdown while the server is a primary with a replica connected,
/// the operator (which sees the pod's deletion) switches the primary over
/// to an in-sync replica, and the server, a replica by then, shuts down.
/// A replica, a primary without replicas, a server that does not answer,
/// or an operator that does not come within [`HANDOVER_POLLS`] polls: the
/// hook ends and the shutdown goes on as before.
fn handover_script(cli: &str, tls: &str) -> String {
    let user = crate::controller::names::PROBE_USER;
    format!(
        r#"u=; [ -n "$REDPILOT_PROBE_PASSWORD" ] && u="--user {user}"
n=0
while [ $n -lt {HANDOVER_POLLS} ]; do
  i=$(REDISCLI_AUTH="$REDPILOT_PROBE_PASSWORD" VALKEYCLI_AUTH="$REDPILOT_PROBE_PASSWORD" {cli} $u{tls} -h 127.0.0.1 -p {REDIS_PORT} info replication 2>/dev/null | tr -d '\r')
  echo "$i" | grep -Eqx 'role:(master|primary)' || exit 0
  echo "$i" | grep -Eqx 'connected_(slaves|replicas):0' && exit 0
  sleep {HANDOVER_POLL_SECS}
  n=$((n+1))
done"#
    )
}

/// `name` from key `key` of the Redis's ConfigMap, resolved when the
/// container starts (empty while the key is absent).
pub fn config_env(names: &Names, name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: names.config(),
                key: key.into(),
                optional: Some(true),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The StatefulSet. Updates use `OnDelete`: the operator restarts pods itself,
/// replicas first and the primary last after a switchover, so no
/// acknowledged write is lost to a restart. `image` is the server image
/// (see [`crate::controller::images::Images::image_for`]). `memory_limit`
/// replaces the memory autopilot's target in the server's resources (the
/// template keeps a size the instances run, see
/// [`super::autopilot::limits::template_limit`]).
pub fn statefulset(
    redis: &Redis,
    names: &Names,
    secret_name: &str,
    restart: &str,
    image: &str,
    memory_limit: Option<u64>,
) -> StatefulSet {
    let spec = &redis.spec;
    let (server, cli) = match spec.engine() {
        Engine::Redis => ("redis-server", "redis-cli"),
        Engine::Valkey => ("valkey-server", "valkey-cli"),
    };
    let tmpl = spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = tmpl.labels.clone();
    pod_labels.extend(labels(redis));
    let mut annotations = tmpl.annotations.clone();
    annotations.insert(RESTART_HASH_ANNOTATION.into(), restart.to_string());

    let env = vec![
        EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        EnvVar {
            name: "REDIS_PASSWORD".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name.to_string(),
                    key: PASSWORD_KEY.into(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        EnvVar {
            name: "REDPILOT_PROBE_PASSWORD".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name.to_string(),
                    key: PROBE_PASSWORD_KEY.into(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        EnvVar {
            name: "REDIS_AUTH_CONF".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name.to_string(),
                    key: AUTH_CONF_KEY.into(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        // Read at every container start (a mounted file can lag behind).
        config_env(names, "REDPILOT_PRIMARY", PRIMARY_KEY),
    ];
    let mut env = env;
    if !pitr_clause(spec).is_empty() {
        env.push(config_env(
            names,
            "REDPILOT_BOOTSTRAPPED",
            crate::controller::names::BOOTSTRAPPED_KEY,
        ));
    }
    let mut mounts = vec![
        VolumeMount {
            name: "config".into(),
            mount_path: "/etc/redis".into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    if spec.tls.is_some() {
        mounts.push(tls_mount(TLS_VOLUME));
    }
    let container = Container {
        name: SERVER_CONTAINER.into(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            start_script(
                server,
                spec.mode() == Mode::Replication,
                spec.image.is_none().then(|| max_rdb(spec)).flatten(),
                &pitr_clause(spec),
            ),
        ]),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("redis".into()),
            container_port: i32::from(REDIS_PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: super::autopilot::limits::resources_at(redis, memory_limit),
        volume_mounts: Some(mounts),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "sh".into(),
                    "-c".into(),
                    probe_script(
                        cli,
                        &crate::controller::layout::cli_flags(redis, false),
                        crate::controller::layout::either_flags(redis).as_deref(),
                    ),
                ]),
            }),
            period_seconds: Some(2),
            timeout_seconds: Some(2),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        liveness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("redis".into()),
                ..Default::default()
            }),
            initial_delay_seconds: Some(15),
            period_seconds: Some(10),
            failure_threshold: Some(6),
            ..Default::default()
        }),
        // A primary whose pod is deleted holds its shutdown while the
        // operator hands the primary to a replica (see `handover_script`).
        lifecycle: (spec.mode() == Mode::Replication).then(|| Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "sh".into(),
                        "-c".into(),
                        handover_script(cli, &crate::controller::layout::cli_flags(redis, false)),
                    ]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        security_context: Some(restricted_security_context()),
        ..Default::default()
    };

    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.config(),
                items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                    key: CONFIG_KEY.into(),
                    path: CONFIG_KEY.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        },
    ];
    if let Some(secret) = crate::controller::layout::secret_of(redis) {
        // The key too: readable by the pod's group only.
        let files = [
            crate::controller::layout::CERT_FILE,
            crate::controller::layout::KEY_FILE,
            crate::controller::layout::CA_FILE,
        ];
        volumes.push(tls_volume(TLS_VOLUME, &secret, &files, 0o440));
    }
    let mut claims = None;
    let mut retention = None;
    match &spec.storage {
        Some(storage) => {
            claims = Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".into()),
                    labels: Some(selector_labels(redis)),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: storage.storage_class_name.clone(),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            storage.size.clone(),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
            let policy = if storage.retain_on_delete {
                "Retain"
            } else {
                "Delete"
            };
            retention = Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some(policy.into()),
                when_scaled: Some(policy.into()),
            });
        }
        None => volumes.push(Volume {
            name: "data".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        }),
    }

    let affinity = tmpl.affinity.clone().or_else(|| {
        Some(k8s_openapi::api::core::v1::Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: PodAffinityTerm {
                            label_selector: Some(LabelSelector {
                                match_labels: Some(selector_labels(redis)),
                                ..Default::default()
                            }),
                            topology_key: "kubernetes.io/hostname".into(),
                            ..Default::default()
                        },
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        })
    });

    let mut containers = vec![container];
    if let Some((exporter, auth)) =
        crate::controller::insights::sidecar::sidecar(redis, secret_name)
    {
        containers.push(exporter);
        volumes.push(auth);
    }
    if let Some((archiver, extra)) = super::archive::sidecar(redis, secret_name) {
        containers.push(archiver);
        volumes.extend(extra);
    }
    let pod_spec = PodSpec {
        containers,
        volumes: Some(volumes),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(999),
            run_as_group: Some(999),
            fs_group: Some(999),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        affinity,
        node_selector: (!tmpl.node_selector.is_empty()).then(|| tmpl.node_selector.clone()),
        tolerations: (!tmpl.tolerations.is_empty()).then(|| tmpl.tolerations.clone()),
        topology_spread_constraints: (!tmpl.topology_spread_constraints.is_empty())
            .then(|| tmpl.topology_spread_constraints.clone()),
        priority_class_name: tmpl.priority_class_name.clone(),
        termination_grace_period_seconds: Some(30),
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        ..Default::default()
    };

    // What the template runs, for the upgrade that changes it next.
    let mut metadata = meta(redis, names.statefulset());
    let served = metadata.annotations.get_or_insert_with(BTreeMap::new);
    served.insert(ENGINE_ANNOTATION.into(), format!("{:?}", spec.engine()));
    served.insert(VERSION_ANNOTATION.into(), spec.version().to_string());
    stamp_hash(StatefulSet {
        metadata,
        spec: StatefulSetSpec {
            replicas: Some(spec.desired_instances()),
            service_name: Some(names.headless()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(redis)),
                ..Default::default()
            },
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..Default::default()
            }),
            persistent_volume_claim_retention_policy: retention,
            volume_claim_templates: claims,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            ..Default::default()
        },
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{RedisSpec, StorageSpec};
    use crate::controller::names::stamped_hash;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use crate::controller::redis::build::test_redis as redis;

    /// While TLS is turned off, the template the instances restart with
    /// listens in plain text (probe, hook, sidecar and config) and keeps
    /// the files for replication; a pod of each template tells how it
    /// listens.
    #[test]
    fn turning_tls_off_keeps_the_files_and_pods_tell_how_they_listen() {
        use crate::controller::redis::facts::pod_facts;
        let tls = |files_only| {
            redis(RedisSpec {
                mode: Some(crate::api::v1alpha1::Mode::Replication),
                tls: Some(crate::api::v1alpha1::TlsSpec {
                    secret_name: Some("cache-tls".into()),
                    client_auth: Some(crate::api::v1alpha1::ClientAuth::Required),
                    files_only,
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let plain = redis(RedisSpec {
            mode: Some(crate::api::v1alpha1::Mode::Replication),
            ..Default::default()
        });
        let pod_of = |r: &crate::api::v1alpha1::Redis, name: &str| {
            let sts = statefulset(
                r,
                &Names::new("cache"),
                "cache-auth",
                "h",
                "redis:7.0",
                None,
            );
            let t = sts.spec.template;
            k8s_openapi::api::core::v1::Pod {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: t.spec,
                ..Default::default()
            }
        };
        let (on, leaving, off) = (tls(false), tls(true), plain);
        let pods = [
            pod_of(&on, "cache-0"),
            pod_of(&leaving, "cache-1"),
            pod_of(&off, "cache-2"),
        ];
        // As the pod cache keeps them: slimmed.
        let slimmed: Vec<_> = pods
            .iter()
            .cloned()
            .map(|mut p| {
                crate::controller::cache::slim_pod(&mut p);
                p
            })
            .collect();
        let listens: Vec<bool> = pod_facts(&slimmed, None, &[])
            .iter()
            .map(|f| f.listens_tls)
            .collect();
        assert_eq!(listens, [true, false, false]);
        let secrets: Vec<Option<String>> = slimmed
            .iter()
            .map(crate::controller::redis::tls::mounted_secret)
            .collect();
        assert_eq!(
            secrets,
            [
                Some("cache-tls".to_string()),
                Some("cache-tls".to_string()),
                None
            ],
            "the slimmed pods still name the Secret they mount"
        );
        let spec = pods[1].spec.clone().expect("pod spec");
        assert!(
            spec.volumes.iter().flatten().any(|v| v.name == TLS_VOLUME),
            "the files stay mounted"
        );
        let text = serde_json::to_string(&spec.containers).expect("json");
        assert!(!text.contains("--tls"), "plain text everywhere: {text}");
        let conf = crate::controller::redis::conf::redis_conf(&leaving);
        assert!(conf.contains("\nport 6379\n"), "{conf}");
        assert!(
            conf.contains("tls-cert-file /etc/redis-tls/tls.crt"),
            "{conf}"
        );
        assert!(
            !conf.contains("tls-port")
                && !conf.contains("tls-replication")
                && !conf.contains("tls-auth-clients"),
            "{conf}"
        );
    }

    #[test]
    fn with_tls_every_container_gets_the_files_and_the_probe_and_sidecar_use_them() {
        let r = redis(RedisSpec {
            tls: Some(crate::api::v1alpha1::TlsSpec {
                secret_name: Some("cache-tls".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let sts = statefulset(
            &r,
            &Names::new("cache"),
            "cache-auth",
            "h",
            "redis:7.0",
            None,
        );
        let pod = sts.spec.template.spec.expect("pod spec");
        let vol = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "tls")
            .and_then(|v| v.secret.clone())
            .expect("the TLS volume");
        assert_eq!(vol.secret_name.as_deref(), Some("cache-tls"));
        assert_eq!(
            vol.default_mode,
            Some(0o440),
            "the key: the pod's group only"
        );
        for c in &pod.containers {
            assert!(
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == "tls" && m.mount_path == crate::controller::names::TLS_DIR),
                "{} mounts it",
                c.name
            );
        }
        let probe = pod.containers[0]
            .readiness_probe
            .as_ref()
            .and_then(|p| p.exec.as_ref())
            .and_then(|e| e.command.as_ref())
            .map(|c| c.join(" "))
            .expect("probe");
        assert!(
            probe.contains("redis-cli $u --tls --insecure -h 127.0.0.1"),
            "{probe}"
        );
        let exporter = pod.containers[1]
            .command
            .clone()
            .expect("exporter")
            .join(" ");
        assert!(
            exporter.contains("--tls-loopback") && !exporter.contains("--tls-client-dir"),
            "{exporter}"
        );
        assert!(!probe.contains("--cert"), "{probe}");
        // Clients must present a certificate: the probe, the handover hook
        // and the sidecar present the mounted one.
        let required = redis(RedisSpec {
            mode: Some(crate::api::v1alpha1::Mode::Replication),
            tls: Some(crate::api::v1alpha1::TlsSpec {
                secret_name: Some("cache-tls".into()),
                client_auth: Some(crate::api::v1alpha1::ClientAuth::Required),
                ..Default::default()
            }),
            ..Default::default()
        });
        let sts = statefulset(
            &required,
            &Names::new("cache"),
            "cache-auth",
            "h",
            "redis:7.0",
            None,
        );
        let pod = sts.spec.template.spec.expect("pod");
        let text = serde_json::to_string(&pod.containers).expect("json");
        let flags = "--tls --insecure --cert /etc/redis-tls/tls.crt --key /etc/redis-tls/tls.key -h 127.0.0.1";
        assert_eq!(text.matches(flags).count(), 2, "probe and hook: {text}");
        assert!(
            text.contains("--tls-client-dir=/etc/redis-tls"),
            "the sidecar: {text}"
        );
        // Without TLS: none of it.
        let plain = statefulset(
            &redis(RedisSpec::default()),
            &Names::new("cache"),
            "cache-auth",
            "h",
            "redis:7.0",
            None,
        );
        let text = serde_json::to_string(&plain).expect("json");
        assert!(!text.contains("tls"), "{text}");
    }

    #[test]
    fn statefulset_is_restricted_and_owned() {
        let r = redis(RedisSpec {
            storage: Some(StorageSpec {
                size: Quantity("1Gi".into()),
                storage_class_name: None,
                retain_on_delete: true,
            }),
            ..Default::default()
        });
        let names = Names::new("cache");
        let sts = statefulset(
            &r,
            &names,
            "cache-auth",
            "h",
            "mirror.local/redis:7.0",
            None,
        );
        let owner = &sts.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.kind, "Redis");
        assert!(stamped_hash(&sts).is_some());
        let spec = sts.spec;
        assert_eq!(
            spec.update_strategy.and_then(|u| u.type_).as_deref(),
            Some("OnDelete")
        );
        assert_eq!(
            spec.persistent_volume_claim_retention_policy
                .and_then(|p| p.when_deleted)
                .as_deref(),
            Some("Retain")
        );
        let pod = spec.template.spec.expect("pod spec");
        assert_eq!(
            pod.containers[0].image.as_deref(),
            Some("mirror.local/redis:7.0")
        );
        let sc = pod.containers[0].security_context.clone().expect("sc");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            pod.security_context
                .and_then(|s| s.seccomp_profile)
                .map(|p| p.type_),
            Some("RuntimeDefault".to_string())
        );
    }

    /// Runs the start script with `echo` as the server and returns the
    /// arguments it would start the server with.
    fn boot_args(fence: bool, published: Option<&str>, pod_ip: &str) -> String {
        let conf = std::env::temp_dir().join(format!(
            "redpilot-boot-{}-{}.conf",
            std::process::id(),
            pod_ip.replace('.', "-")
        ));
        let script = start_script("echo", fence, None, "")
            .replace(AUTH_CONF_PATH, &conf.display().to_string());
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("POD_IP", pod_ip)
            .env("REDPILOT_PRIMARY", published.unwrap_or(""))
            .env("REDIS_AUTH_CONF", "requirepass \"x\"\n")
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{out:?}");
        // The password went to the file, not to the command line.
        let written = std::fs::read_to_string(&conf).expect("auth conf");
        assert_eq!(written, "requirepass \"x\"\n");
        let _ = std::fs::remove_file(&conf);
        let args = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!args.contains("requirepass"), "{args}");
        args
    }

    /// Runs the start script (server `echo`) with redis.conf saying
    /// `maxmemory` and a cgroup tree under `dir` whose `cgroup_line` (the
    /// `/proc/self/cgroup` line) names a limit of `limit`.
    fn boot_capped(
        dir: &std::path::Path,
        maxmemory: &str,
        cgroup_line: &str,
        limit: &str,
    ) -> String {
        std::fs::create_dir_all(dir.join("etc")).expect("dir");
        std::fs::write(
            dir.join("etc").join(CONFIG_KEY),
            format!("port 6379\n{maxmemory}\n"),
        )
        .expect("conf");
        std::fs::write(dir.join("self-cgroup"), format!("{cgroup_line}\n")).expect("cgroup");
        let (_, ctrl_path) = cgroup_line.split_once(':').expect("line");
        let (ctrl, path) = ctrl_path.split_once(':').expect("line");
        let file = match ctrl {
            "memory" => dir.join(format!("cg/memory{path}/memory.limit_in_bytes")),
            _ => dir.join(format!("cg{path}/memory.max")),
        };
        std::fs::create_dir_all(file.parent().expect("parent")).expect("dir");
        std::fs::write(&file, format!("{limit}\n")).expect("limit");
        run_capped(dir)
    }

    /// Runs the start script (server `echo`) against the tree `boot_capped`
    /// wrote under `dir`.
    fn run_capped(dir: &std::path::Path) -> String {
        let script = start_script("echo", true, None, "")
            .replace(AUTH_CONF_PATH, &dir.join("auth.conf").display().to_string())
            .replace("/etc/redis/", &format!("{}/etc/", dir.display()));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("POD_IP", "10.0.0.5")
            .env("REDPILOT_CGROUP_ROOT", dir.join("cg"))
            .env("REDPILOT_CGROUP_FILE", dir.join("self-cgroup"))
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn maxmemory_never_starts_above_the_containers_own_limit() {
        let dir = std::env::temp_dir().join(format!("redpilot-cap-{}", std::process::id()));
        // redis.conf has 72Mi (the autopilot's 96Mi target); the cgroup
        // still holds the container to 64Mi: 48Mi.
        let v1 = boot_capped(&dir, "maxmemory 75497472", "4:memory:/pod/c1", "67108864");
        assert!(v1.ends_with("--maxmemory 50331648"), "{v1}");
        // The host's path starts above the mount: its tail is found.
        let nested = dir.join("nested");
        let line = "4:memory:/sandbox/s1/pod/c1";
        let _ = boot_capped(&nested, "maxmemory 75497472", line, "67108864");
        std::fs::rename(
            nested.join("cg/memory/sandbox/s1/pod"),
            nested.join("cg/memory/pod"),
        )
        .expect("move");
        let args = run_capped(&nested);
        assert!(args.ends_with("--maxmemory 50331648"), "{args}");
        let v2 = boot_capped(&dir, "maxmemory 75497472", "0::/kubepods/c2", "67108864");
        assert!(v2.ends_with("--maxmemory 50331648"), "{v2}");
        // At or above the target: redis.conf's value stands.
        let at = boot_capped(&dir, "maxmemory 75497472", "0::/kubepods/c3", "100663296");
        assert!(!at.contains("--maxmemory"), "{at}");
        // No limit, or no maxmemory managed: nothing added.
        let max = boot_capped(&dir, "maxmemory 75497472", "0::/kubepods/c4", "max");
        assert!(!max.contains("--maxmemory"), "{max}");
        let none = boot_capped(&dir, "", "0::/kubepods/c5", "67108864");
        assert!(!none.contains("--maxmemory"), "{none}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs the start script (server `echo`) with /data at `dir`.
    fn boot_with_dump(dir: &std::path::Path, max: u32, published: &str, pod_ip: &str) {
        let conf = dir.join("auth.conf");
        let script = start_script("echo", true, Some(max), "")
            .replace(AUTH_CONF_PATH, &conf.display().to_string())
            .replace("/data/", &format!("{}/", dir.display()));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("POD_IP", pod_ip)
            .env("REDPILOT_PRIMARY", published)
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{out:?}");
    }

    #[test]
    fn a_replica_moves_aside_a_dump_newer_than_its_server_reads() {
        let dir = std::env::temp_dir().join(format!("redpilot-rdb-guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let dump = dir.join("dump.rdb");
        let write = |head: &str| std::fs::write(&dump, format!("{head}rest")).expect("write");
        // A Redis 6.2 replica (reads up to 9) finds a 7.0 dump (10).
        write("REDIS0010");
        boot_with_dump(&dir, 9, "10.0.0.1 6379", "10.0.0.2");
        assert!(!dump.exists() && dir.join("dump.rdb.format-10").exists());
        // One it can read stays.
        write("REDIS0009");
        boot_with_dump(&dir, 9, "10.0.0.1 6379", "10.0.0.2");
        assert!(dump.exists());
        // Valkey 9's header.
        write("VALKEY080");
        boot_with_dump(&dir, 11, "10.0.0.1 6379", "10.0.0.2");
        assert!(!dump.exists() && dir.join("dump.rdb.format-80").exists());
        // The published primary itself (and any instance with no primary to
        // follow) keeps its data whatever the format: no one resends it.
        write("REDIS0010");
        boot_with_dump(&dir, 9, "10.0.0.2 6379", "10.0.0.2");
        assert!(dump.exists());
        boot_with_dump(&dir, 9, "", "10.0.0.2");
        assert!(dump.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn replication_instances_never_boot_writable() {
        let fence = format!("--replicaof {BOOT_FENCE_HOST} {BOOT_FENCE_PORT}");
        // A new Redis: nothing published yet.
        assert!(boot_args(true, None, "10.0.0.5").ends_with(&fence));
        // The published primary restarting in place (same address).
        assert!(boot_args(true, Some("10.0.0.5 6379"), "10.0.0.5").ends_with(&fence));
        // Any other instance follows the published primary.
        assert!(
            boot_args(true, Some("10.0.0.5 6379"), "10.0.0.6")
                .ends_with("--replicaof 10.0.0.5 6379")
        );
        // Standalone: no replica to wipe, boots writable.
        let standalone = boot_args(false, Some("10.0.0.7 6379"), "10.0.0.7");
        assert!(!standalone.contains("--replicaof"), "{standalone}");
    }

    /// Runs the `preStop` hook against a fake client that answers as a
    /// primary with `replicas` connected for `primary_calls` calls, then as
    /// a replica; the number of calls the hook made.
    fn handover_calls(replicas: u32, primary_calls: u32) -> u32 {
        let dir = std::env::temp_dir().join(format!(
            "redpilot-handover-{}-{replicas}-{primary_calls}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let count = dir.join("count");
        std::fs::write(&count, "0").expect("write count");
        let cli = dir.join("cli");
        std::fs::write(
            &cli,
            format!(
                "n=$(($(cat {c}) + 1)); echo $n > {c}\n\
                 if [ $n -le {primary_calls} ]; then printf 'role:master\\r\\nconnected_slaves:{replicas}\\r\\n'; \
                 else printf 'role:slave\\r\\nmaster_link_status:up\\r\\n'; fi\n",
                c = count.display()
            ),
        )
        .expect("write cli");
        let script = handover_script(&format!("sh {}", cli.display()), "");
        let ok = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("REDPILOT_PROBE_PASSWORD", "")
            .status()
            .expect("run sh")
            .success();
        assert!(ok, "the hook never fails the shutdown");
        let calls = std::fs::read_to_string(&count).expect("count");
        let _ = std::fs::remove_dir_all(&dir);
        calls.trim().parse().expect("a count")
    }

    #[test]
    fn the_pre_stop_hook_holds_a_primary_with_replicas_until_it_is_handed_over() {
        // Primary with a replica for three looks, then a replica: four looks.
        assert_eq!(handover_calls(1, 3), 4);
        // A primary without replicas has nothing to hand over to.
        assert_eq!(handover_calls(0, 100), 1);
        // A replica goes at once.
        assert_eq!(handover_calls(2, 0), 1);
    }

    /// Runs the readiness probe against a fake client printing `info`
    /// (with the server's CRLF line ends); true when it passes.
    fn probe_passes(info: &str) -> bool {
        let dir = std::env::temp_dir().join(format!(
            "redpilot-probe-{}-{}",
            std::process::id(),
            crate::controller::names::stable_hash(&[info])
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let info_file = dir.join("info");
        std::fs::write(&info_file, info.replace('\n', "\r\n")).expect("write info");
        let cli = dir.join("cli");
        std::fs::write(&cli, format!("cat {}\n", info_file.display())).expect("write cli");
        let script = probe_script(&format!("sh {}", cli.display()), "", None);
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("REDPILOT_PROBE_PASSWORD", "")
            .output()
            .expect("run sh");
        out.status.success()
    }

    #[test]
    fn only_loaded_primaries_and_linked_replicas_are_ready() {
        assert!(probe_passes(
            "# Persistence\nloading:0\n# Replication\nrole:master\n"
        ));
        assert!(!probe_passes("loading:1\nrole:master\n"));
        assert!(!probe_passes("")); // no answer
        let replica = |link: &str, sync: &str| {
            format!(
                "loading:0\nrole:slave\nmaster_link_status:{link}\nmaster_sync_in_progress:{sync}\n"
            )
        };
        assert!(probe_passes(&replica("up", "0")));
        assert!(!probe_passes(&replica("down", "0")));
        assert!(!probe_passes(&replica("down", "1")));
        // Valkey 8.1+ field names.
        assert!(probe_passes(
            "loading:0\nrole:replica\nprimary_link_status:up\nprimary_sync_in_progress:0\n"
        ));
        assert!(!probe_passes(
            "loading:0\nrole:replica\nprimary_link_status:down\nprimary_sync_in_progress:0\n"
        ));
    }

    /// A Cluster TLS flip's probe against a fake client that answers only
    /// when asked with (`tls_server`) or without `--tls`: it passes either
    /// way, whichever way the template starts the server; a plain probe
    /// fails against a server that listens with TLS.
    #[test]
    fn a_cluster_flip_probe_answers_either_way() {
        let run = |tls: &str, either: Option<&str>, tls_server: bool| {
            let dir = std::env::temp_dir().join(format!(
                "redpilot-either-{}-{}",
                std::process::id(),
                crate::controller::names::stable_hash(&[
                    tls,
                    either.unwrap_or("-"),
                    &tls_server.to_string()
                ])
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let cli = dir.join("cli");
            let (with, without) = if tls_server {
                ("printf 'loading:0\\r\\nrole:master\\r\\n'", "exit 1")
            } else {
                ("exit 1", "printf 'loading:0\\r\\nrole:master\\r\\n'")
            };
            std::fs::write(
                &cli,
                format!("case \"$*\" in *--tls*) {with};; *) {without};; esac\n"),
            )
            .expect("write cli");
            let script = probe_script(&format!("sh {}", cli.display()), tls, either);
            std::process::Command::new("sh")
                .args(["-c", &script])
                .env("REDPILOT_PROBE_PASSWORD", "")
                .output()
                .expect("run sh")
                .status
                .success()
        };
        let tls = " --tls --insecure";
        for server_tls in [false, true] {
            assert!(run("", Some(tls), server_tls), "starts plain, {server_tls}");
            assert!(run(tls, Some(""), server_tls), "starts TLS, {server_tls}");
        }
        assert!(!run("", None, true), "a plain probe, a TLS server");
        assert!(!run(tls, None, false), "a TLS probe, a plain server");
    }

    /// The templates of a Cluster TLS flip: the files mounted, a probe that
    /// answers either way, and pods of them tell how they start (the
    /// slimmed cache keeps it); the operator's change between them rolls.
    #[test]
    fn a_cluster_flip_template_says_how_it_starts() {
        use crate::controller::redis::facts::pod_facts;
        let flip = |files_only| {
            redis(RedisSpec {
                mode: Some(crate::api::v1alpha1::Mode::Cluster),
                tls: Some(crate::api::v1alpha1::TlsSpec {
                    secret_name: Some("cache-tls".into()),
                    files_only,
                    either: true,
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let sts_of = |r: &crate::api::v1alpha1::Redis| {
            statefulset(
                r,
                &Names::new("cache"),
                "cache-auth",
                "h",
                "redis:7.0",
                None,
            )
        };
        let mut last = None;
        for (files_only, starts_tls) in [(true, false), (false, true)] {
            let sts = sts_of(&flip(files_only));
            let mut pod = k8s_openapi::api::core::v1::Pod {
                metadata: ObjectMeta {
                    name: Some("cache-0".into()),
                    ..Default::default()
                },
                spec: sts.spec.template.spec.clone(),
                ..Default::default()
            };
            crate::controller::cache::slim_pod(&mut pod);
            let f = pod_facts(&[pod], None, &[]).remove(0);
            assert!(f.either, "{files_only}");
            assert_eq!(f.listens_tls, starts_tls, "{files_only}");
            assert!(
                sts.spec
                    .template
                    .spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .any(|v| v.name == TLS_VOLUME),
                "the files are mounted"
            );
            let conf = crate::controller::redis::conf::redis_conf(&flip(files_only));
            assert_eq!(conf.contains("tls-cluster yes"), starts_tls, "{conf}");
            last = Some(sts);
        }
        // From the flip's template to the one that starts TLS: a roll even
        // in the same generation (both mount the files).
        use crate::controller::redis::kept::{Kept, annotate, decide};
        let mut live = last.expect("template");
        annotate(&mut live, Some(1), &Kept::default());
        live.metadata.generation = Some(4);
        live.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
            observed_generation: Some(4),
            update_revision: Some("r1".into()),
            ..Default::default()
        });
        let in_use = ["r1".to_string()];
        // Another change of the operator's to the flip's template: kept.
        let mut other = sts_of(&flip(false));
        other
            .spec
            .template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations
            .get_or_insert_with(Default::default)
            .insert("example".into(), "changed".into());
        let kept = decide(Some(&live), &other, Some(1), None, &in_use);
        assert_eq!(kept.revisions, in_use);
        let mut on = flip(false);
        on.spec.tls.as_mut().expect("tls").either = false;
        let kept = decide(Some(&live), &sts_of(&on), Some(1), None, &in_use);
        assert_eq!(kept, Kept::default(), "onto the template that starts TLS");
    }
}
