//! `spec.archive`: the `archive` sidecar in every instance's pod (see
//! [`crate::backup::archiver`] for which one archives), and
//! `status.archive`, read from the sidecars' `/status`.

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, PodSpec, Volume, VolumeMount};

use crate::api::v1alpha1::{ArchiveStatus, Redis};
use crate::controller::agent::{self, Target};
use crate::controller::names::{self, REDIS_PORT};

/// Name of the sidecar container.
pub const CONTAINER: &str = "archive";
/// Port of its `/status` and `/metrics`.
pub const PORT: u16 = names::ARCHIVE_PORT;
/// Name of that port.
pub const PORT_NAME: &str = names::ARCHIVE_PORT_NAME;

/// The archive's root key in its target: `<prefix>/<namespace>/<name>/archive`
/// in a bucket, `<namespace>/<name>/archive` on a volume.
pub fn root_key(redis: &Redis) -> Option<String> {
    let a = redis.spec.archive.as_ref()?;
    let ns = redis.metadata.namespace.as_deref().unwrap_or("default");
    let name = redis.metadata.name.as_deref().unwrap_or_default();
    let tail = format!("{ns}/{name}/archive");
    let prefix = a
        .target
        .s3
        .as_ref()
        .and_then(|s| s.prefix.as_deref())
        .map(|p| p.trim_matches('/'))
        .unwrap_or("");
    Some(if prefix.is_empty() {
        tail
    } else {
        format!("{prefix}/{tail}")
    })
}

/// The sidecar and the volumes it needs, or `None` without `spec.archive`.
/// `secret` is the server-auth Secret (the agent's ACL user's password).
/// A Cluster Redis's shard StatefulSets give it their shard with
/// [`for_shard`].
pub fn sidecar(redis: &Redis, secret: &str) -> Option<(Container, Vec<Volume>)> {
    let a = redis.spec.archive.as_ref()?;
    let target = Target::of(a.target.s3.as_ref(), a.target.volume.as_ref())?;
    let key = root_key(redis)?;
    let mut args = vec![
        "archive".to_string(),
        "--line".into(),
        crate::backup::archive::MAIN_LINE.into(),
        "--port".into(),
        REDIS_PORT.to_string(),
        "--interval-ms".into(),
        (i64::from(a.interval_seconds()) * 1000).to_string(),
        "--base-every-seconds".into(),
        (i64::from(a.base_interval_hours()) * 3600).to_string(),
        "--retention-seconds".into(),
        (i64::from(a.retention_days()) * 86_400).to_string(),
        "--listen".into(),
        format!("0.0.0.0:{PORT}"),
    ];
    if redis.spec.desired_instances() <= 1 {
        args.push("--alone".into());
    }
    let tls = crate::controller::layout::listens(redis);
    if tls {
        args.push("--tls-loopback".into());
        args.extend(["--tls-ca-file".into(), crate::controller::layout::ca_path()]);
        if crate::controller::layout::asks_clients(redis) {
            args.extend(["--tls-client-dir".into(), names::TLS_DIR.into()]);
        }
    }
    args.extend(target.args(&key));
    let mut env = vec![
        agent::field_env("POD_IP", "status.podIP"),
        agent::field_env("POD_NAME", "metadata.name"),
        EnvVar {
            name: "REDIS_USER".into(),
            value: Some(names::BACKUP_USER.into()),
            ..Default::default()
        },
        agent::secret_env("REDIS_PASSWORD", secret, names::BACKUP_PASSWORD_KEY, false),
    ];
    env.extend(target.env(false));
    let mut mounts = vec![VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    }];
    let mut volumes = Vec::new();
    if tls {
        mounts.push(crate::controller::layout::tls_mount(
            crate::controller::layout::TLS_VOLUME,
        ));
    }
    if let Some((v, m)) = target.volume(false) {
        volumes.push(v);
        mounts.push(m);
    }
    let mut c = agent::container(CONTAINER, args, env, mounts);
    c.ports = Some(vec![ContainerPort {
        name: Some(PORT_NAME.into()),
        container_port: i32::from(PORT),
        protocol: Some("TCP".into()),
        ..Default::default()
    }]);
    // The agent's user reads the pod's TLS key through the pod's group.
    if let Some(sc) = c.security_context.as_mut() {
        sc.run_as_group = Some(999);
    }
    Some((c, volumes))
}

/// Makes the sidecar of a pod template (if it has one) archive shard
/// `shard` of a Cluster Redis: its own line, and the slots its primary
/// serves recorded with each checkpoint.
pub fn for_shard(pod: &mut PodSpec, shard: i32) {
    let Some(c) = pod.containers.iter_mut().find(|c| c.name == CONTAINER) else {
        return;
    };
    let Some(args) = c.args.as_mut() else {
        return;
    };
    if let Some(i) = args.iter().position(|a| a == "--line")
        && let Some(line) = args.get_mut(i + 1)
    {
        *line = crate::backup::archive::shard_line(shard);
    }
    args.extend(["--shard".into(), shard.to_string()]);
}

/// One sidecar's `/status` (the fields the operator reads).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SidecarStatus {
    /// Whether it archives now.
    pub archiving: bool,
    /// What it does, or why not.
    pub activity: String,
    /// The newest checkpoint stored (ms).
    pub newest_ms: i64,
    /// The earliest restorable time (ms).
    pub earliest_ms: i64,
    /// Bytes held.
    pub archive_bytes: u64,
    /// Spans not restorable exactly (ms).
    pub holes: Vec<(i64, i64)>,
    /// The last error.
    pub last_error: Option<String>,
}

/// `GET /status` of the sidecar at `ip`, within 1 s.
pub async fn fetch(ip: &str) -> Option<SidecarStatus> {
    let v = crate::backup::archiver::fetch_status(ip, PORT).await?;
    serde_json::from_value(v).ok()
}

/// `status.archive` from the sidecars of the pods in `lines` (one group
/// of (pod name, address) per line: one for a Redis that is not sharded,
/// one per shard of a Cluster Redis). A Cluster Redis restores every
/// shard to the same time, so its window is what every shard can reach:
/// from the latest earliest to the earliest newest; its lag is the worst
/// shard's, its size the sum, its holes every shard's.
pub async fn observe(redis: &Redis, lines: &[Vec<(String, String)>]) -> Option<ArchiveStatus> {
    let a = redis.spec.archive.as_ref()?;
    let key = root_key(redis)?;
    let location = Target::of(a.target.s3.as_ref(), a.target.volume.as_ref())?.location(&key);
    let answers = futures::future::join_all(lines.iter().map(|pods| {
        futures::future::join_all(
            pods.iter()
                .map(|(name, ip)| async move { (name.clone(), fetch(ip).await) }),
        )
    }))
    .await;
    let now = chrono::Utc::now();
    let show = crate::backup::archive::show_ms;
    let mut out = ArchiveStatus {
        location,
        key,
        observed_at: Some(now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        ..Default::default()
    };
    let sharded = lines.len() > 1;
    let mut archivers = Vec::new();
    let mut messages = Vec::new();
    let mut newest: Option<i64> = None;
    let mut earliest: Option<i64> = None;
    let mut size: Option<u64> = None;
    let mut holes = Vec::new();
    let mut every_line_seen = true;
    for (i, line) in answers.iter().enumerate() {
        let tag = |m: String| {
            if sharded {
                format!("shard {i}: {m}")
            } else {
                m
            }
        };
        let Some((name, s)) = best(line) else {
            every_line_seen = false;
            messages.push(tag("no archive sidecar answered".into()));
            continue;
        };
        if s.archiving {
            archivers.push(name.clone());
        }
        if s.newest_ms > 0 {
            newest = Some(newest.map_or(s.newest_ms, |n| n.min(s.newest_ms)));
        } else {
            every_line_seen = false;
        }
        if s.earliest_ms > 0 {
            earliest = Some(earliest.map_or(s.earliest_ms, |e| e.max(s.earliest_ms)));
        }
        size = Some(size.unwrap_or(0) + s.archive_bytes);
        holes.extend(
            s.holes
                .iter()
                .map(|(a, b)| format!("{}/{}", show(*a), show(*b))),
        );
        if !s.archiving {
            messages.push(tag(format!(
                "no instance archives now ({name}: {})",
                s.activity
            )));
        } else if let Some(e) = &s.last_error {
            messages.push(tag(format!("last error: {e}")));
        }
    }
    if !archivers.is_empty() {
        out.archiver = Some(archivers.join(", "));
    }
    if let Some(n) = newest.filter(|_| every_line_seen) {
        out.newest = Some(show(n));
        out.lag_seconds = Some(((now.timestamp_millis() - n).max(0) as f64 / 100.0).round() / 10.0);
    }
    if let Some(e) = earliest.filter(|_| every_line_seen) {
        out.earliest = Some(show(e));
    }
    out.size_bytes = size.and_then(|s| i64::try_from(s).ok());
    holes.sort();
    holes.dedup();
    out.holes = holes;
    if !messages.is_empty() {
        out.message = Some(messages.join("; "));
    }
    Some(out)
}

/// The best view of a line's window: its archiving sidecar's, else the
/// freshest any of its sidecars has.
fn best(line: &[(String, Option<SidecarStatus>)]) -> Option<(&String, &SidecarStatus)> {
    let answered = line
        .iter()
        .filter_map(|(name, s)| s.as_ref().map(|s| (name, s)));
    answered
        .clone()
        .find(|(_, s)| s.archiving)
        .or_else(|| answered.max_by_key(|(_, s)| s.newest_ms))
}
