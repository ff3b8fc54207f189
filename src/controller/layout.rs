//! The server pod as every part of the operator sees it, below the Redis
//! controller: the TLS files and how a container mounts and uses them, the
//! marks a readiness probe carries, the security context of every
//! container, the names of the conditions other parts read. The sidecar,
//! the cache, the backup agent and the monitor take these from here, not
//! from the controller's steps. Imports nothing of the controller but
//! [`super::names`].

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Volume, VolumeMount};

use super::names::{Names, TLS_DIR};

// Where a server is pointed to hold it off every primary.

/// The address a Replication instance follows when it boots with no other
/// primary to follow: nothing listens there, so the server stays a replica
/// whose link never comes up. A replica without a link refuses to serve a
/// sync (`NOMASTERLINK`), so an instance that restarted empty can never wipe
/// the replicas that hold the data; the operator decides who is primary.
pub const BOOT_FENCE_HOST: &str = "127.0.0.1";
/// The port of [`BOOT_FENCE_HOST`].
pub const BOOT_FENCE_PORT: u16 = 1;
/// The port a Redis that follows a source (`spec.replicaOf`) points its
/// primary at while the source is not to be trusted (unreachable, or its
/// history not yet checked): on [`BOOT_FENCE_HOST`], where nothing listens,
/// so the primary keeps its data and refuses writes. A server following
/// this address is the primary of the Redis, fenced off its source.
pub const SOURCE_FENCE_PORT: u16 = 2;

// The TLS files.

/// The server certificate file in the TLS volume.
pub const CERT_FILE: &str = "tls.crt";
/// Its private key.
pub const KEY_FILE: &str = "tls.key";
/// The CA bundle clients trust.
pub const CA_FILE: &str = "ca.crt";

/// Where a container finds the CA bundle of `spec.tls`.
pub fn ca_path() -> String {
    mounted(CA_FILE)
}

/// Where a container finds `file` of the TLS volume.
pub fn mounted(file: &str) -> String {
    format!("{}/{file}", TLS_DIR)
}

/// Whether the servers of `redis` ask clients for a certificate
/// (`spec.tls.clientAuth` `Optional` or `Required`): then the probe, the
/// sidecar, the Cluster boot rule and the backup agent present theirs.
pub fn asks_clients(redis: &crate::api::v1alpha1::Redis) -> bool {
    redis
        .spec
        .tls
        .as_ref()
        .is_some_and(|t| !t.files_only && t.client_auth().asks())
}

/// Whether the servers of `redis` listen with TLS: `spec.tls` is set and
/// is not being turned off (see `TlsSpec::files_only`).
pub fn listens(redis: &crate::api::v1alpha1::Redis) -> bool {
    redis.spec.tls.as_ref().is_some_and(|t| !t.files_only)
}

/// The TLS flags of `redis-cli` in a container of the Redis's pods, with a
/// leading space: none without `spec.tls`; `--tls`, then `--cacert` with
/// the mounted CA (`check`) or `--insecure` (the pod's own loopback), and
/// the mounted certificate and key when `spec.tls.clientAuth` asks
/// clients for one.
pub fn cli_flags(redis: &crate::api::v1alpha1::Redis, check: bool) -> String {
    if !listens(redis) {
        return String::new();
    }
    let mut out = if check {
        format!(" --tls --cacert {}", ca_path())
    } else {
        " --tls --insecure".to_string()
    };
    if asks_clients(redis) {
        out.push_str(&format!(
            " --cert {} --key {}",
            mounted(CERT_FILE),
            mounted(KEY_FILE)
        ));
    }
    out
}

/// While a Cluster Redis turns TLS on or off (`TlsSpec::either`): the
/// `redis-cli` flags of the other way than its servers start, with a
/// leading space (none for plain text); `None` otherwise.
pub fn either_flags(redis: &crate::api::v1alpha1::Redis) -> Option<String> {
    let tls = redis.spec.tls.as_ref().filter(|t| t.either)?;
    if !tls.files_only {
        return Some(String::new());
    }
    let mut out = " --tls --insecure".to_string();
    if tls.client_auth().asks() {
        out.push_str(&format!(
            " --cert {} --key {}",
            mounted(CERT_FILE),
            mounted(KEY_FILE)
        ));
    }
    Some(out)
}

/// The Secret the servers of `redis` mount for `spec.tls`: the user's, the
/// one cert-manager fills, or the one the operator issues.
pub fn secret_of(redis: &crate::api::v1alpha1::Redis) -> Option<String> {
    let tls = redis.spec.tls.as_ref()?;
    let names = Names::new(&kube::ResourceExt::name_any(redis));
    Some(match (&tls.secret_name, &tls.issuer_ref) {
        (Some(name), _) => name.clone(),
        (None, Some(_)) => names.certificate_secret(),
        (None, None) => names.issued_tls(),
    })
}

/// Whether the operator issues `redis`'s certificate itself (`spec.tls`
/// with neither `secretName` nor `issuerRef`): it then writes
/// `<name>-tls`.
pub fn issues_own(redis: &crate::api::v1alpha1::Redis) -> bool {
    redis
        .spec
        .tls
        .as_ref()
        .is_some_and(|t| t.secret_name.is_none() && t.issuer_ref.is_none())
}

/// A volume named `volume` with `files` of the Secret `secret` (each under
/// its own name), mode `mode`: the servers' TLS files, or the backup
/// agent's CA alone.
pub fn tls_volume(volume: &str, secret: &str, files: &[&str], mode: i32) -> Volume {
    let items = files
        .iter()
        .map(|k| k8s_openapi::api::core::v1::KeyToPath {
            key: k.to_string(),
            path: k.to_string(),
            ..Default::default()
        })
        .collect();
    Volume {
        name: volume.into(),
        secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            items: Some(items),
            default_mode: Some(mode),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The volume name of `spec.tls`'s Secret in the Redis pods.
pub const TLS_VOLUME: &str = "tls";

/// Where a container finds the files of the TLS volume `volume`
/// ([`TLS_DIR`]).
pub fn tls_mount(volume: &str) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: TLS_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

// Readiness probes.

/// The flag of `redis-cli` in a readiness probe that speaks TLS.
pub const TLS_PROBE_FLAG: &str = " --tls";

/// The line of a readiness probe that answers whichever way its server
/// listens (a Cluster Redis turning TLS on or off, switched live), when
/// the server starts in plain text.
pub const EITHER_STARTS_PLAIN: &str = "# either way; starts in plain text";
/// The same, when the server starts with TLS.
pub const EITHER_STARTS_TLS: &str = "# either way; starts with TLS";

fn probe_command(c: &k8s_openapi::api::core::v1::Container) -> &[String] {
    c.readiness_probe
        .as_ref()
        .and_then(|p| p.exec.as_ref())
        .and_then(|e| e.command.as_deref())
        .unwrap_or_default()
}

/// Whether a server container's readiness probe speaks TLS (`--tls`), or
/// first tries TLS: how the template it runs has the server start.
pub fn probes_tls(c: &k8s_openapi::api::core::v1::Container) -> bool {
    let cmd = probe_command(c);
    if cmd.iter().any(|a| a.contains(EITHER_STARTS_PLAIN)) {
        return false;
    }
    cmd.iter()
        .any(|a| a.contains(TLS_PROBE_FLAG) || a.contains(EITHER_STARTS_TLS))
}

/// Whether a server container's readiness probe answers either way: its
/// server may listen otherwise than it started, switched live.
pub fn probes_either(c: &k8s_openapi::api::core::v1::Container) -> bool {
    probe_command(c)
        .iter()
        .any(|a| a.contains(EITHER_STARTS_PLAIN) || a.contains(EITHER_STARTS_TLS))
}

/// Whether the StatefulSet controller has seen the StatefulSet's latest
/// spec (its status, e.g. the update revision, describes it).
pub fn sts_observed(s: &StatefulSet) -> bool {
    s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
}

// Containers.

/// The container security context every container the operator creates
/// runs with: non-root, no privilege escalation, no capabilities, a
/// read-only root filesystem.
pub fn restricted_security_context() -> k8s_openapi::api::core::v1::SecurityContext {
    k8s_openapi::api::core::v1::SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

// Condition names other parts read.

/// The condition the memory autopilot reports.
pub const MEMORY_AT_MAXIMUM: &str = "MemoryAtMaximum";

/// The `PrimaryAvailable` reason of a primary whose write fence is closed.
pub const FENCED: &str = "Fenced";
