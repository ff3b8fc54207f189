//! The metrics sidecar of every Redis pod (`spec.monitoring.exporter`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ResourceRequirements, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::v1alpha1::Redis;
use crate::controller::layout::{CERT_FILE, KEY_FILE, asks_clients, ca_path, mounted};
use crate::controller::names::{PASSWORD_KEY, REDIS_PORT};

/// Name of the sidecar container.
pub const CONTAINER: &str = "exporter";
/// Port of `/metrics`, named [`PORT_NAME`].
pub const PORT: u16 = 9121;
/// Name of the metrics port (the PodMonitor scrapes it).
pub const PORT_NAME: &str = "metrics";
/// The pod volume holding the server-auth Secret for the sidecar.
const AUTH_VOLUME: &str = "exporter-auth";
const AUTH_MOUNT: &str = "/etc/redpilot/auth";

fn default_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), q("10m")),
            ("memory".to_string(), q("16Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), q("64Mi"))])),
        ..Default::default()
    }
}

/// The sidecar and the volume it reads the password from, or `None` when
/// `spec.monitoring.exporter` is false. `secret` is the server-auth Secret.
pub fn sidecar(redis: &Redis, secret: &str) -> Option<(Container, Volume)> {
    let m = redis.spec.monitoring();
    if !m.exporter {
        return None;
    }
    let tls = crate::controller::layout::listens(redis);
    let present = asks_clients(redis);
    let (image, command, env) = match &m.exporter_image {
        // The operator's image runs its own exporter (a small binary of its
        // own, `redpilot-exporter`), which follows a password rotation
        // through the mounted Secret.
        None => (
            super::super::agent::operator_image(),
            Some(
                [
                    "redpilot-exporter".to_string(),
                    format!("--port={REDIS_PORT}"),
                    format!("--password-dir={AUTH_MOUNT}"),
                ]
                .into_iter()
                // The pod's own loopback: nothing to check (the mounted CA
                // may run ahead of the served certificate during a CA
                // change, which must not blind the metrics).
                .chain(tls.then(|| "--tls-loopback".to_string()))
                // The servers ask clients for a certificate: the mounted
                // one, read at each connection (a renewal is followed).
                .chain(
                    present
                        .then(|| format!("--tls-client-dir={}", crate::controller::names::TLS_DIR)),
                )
                .collect(),
            ),
            vec![],
        ),
        // Another image: its entrypoint, configured by the environment.
        // With TLS, the redis_exporter convention: a rediss:// address and
        // the CA bundle's path.
        Some(image) => (
            image.clone(),
            None,
            vec![
                EnvVar {
                    name: "REDIS_ADDR".into(),
                    value: Some(format!(
                        "{}://127.0.0.1:{REDIS_PORT}",
                        if tls { "rediss" } else { "redis" }
                    )),
                    ..Default::default()
                },
                super::super::agent::secret_env("REDIS_PASSWORD", secret, PASSWORD_KEY, false),
            ]
            .into_iter()
            .chain(tls.then(|| EnvVar {
                name: "REDIS_EXPORTER_TLS_CA_CERT_FILE".into(),
                value: Some(ca_path()),
                ..Default::default()
            }))
            // The mounted certificate when the servers ask for one.
            .chain(
                [
                    ("REDIS_EXPORTER_TLS_CLIENT_CERT_FILE", CERT_FILE),
                    ("REDIS_EXPORTER_TLS_CLIENT_KEY_FILE", KEY_FILE),
                ]
                .into_iter()
                .filter(|_| present)
                .map(|(name, file)| EnvVar {
                    name: name.into(),
                    value: Some(mounted(file)),
                    ..Default::default()
                }),
            )
            .collect(),
        ),
    };
    let mut mounts = vec![VolumeMount {
        name: AUTH_VOLUME.into(),
        mount_path: AUTH_MOUNT.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    if tls {
        use crate::controller::layout::{TLS_VOLUME, tls_mount};
        mounts.push(tls_mount(TLS_VOLUME));
    }
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".into()),
        command,
        env: (!env.is_empty()).then_some(env),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: i32::from(PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(
            m.exporter_resources
                .clone()
                .unwrap_or_else(default_resources),
        ),
        volume_mounts: Some(mounts),
        security_context: Some(crate::controller::layout::restricted_security_context()),
        ..Default::default()
    };
    let volume = Volume {
        name: AUTH_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some((container, volume))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{MonitoringSpec, RedisSpec};

    fn redis(m: Option<MonitoringSpec>) -> Redis {
        Redis::new(
            "cache",
            RedisSpec {
                monitoring: m,
                ..Default::default()
            },
        )
    }

    #[test]
    fn the_sidecar_is_on_by_default_and_runs_the_operator_image() {
        let (c, v) = sidecar(&redis(None), "cache-server-auth").expect("on by default");
        assert_eq!(c.name, CONTAINER);
        let cmd = c.command.expect("command");
        assert_eq!(cmd[0], "redpilot-exporter");
        assert!(cmd.iter().any(|a| a == "--password-dir=/etc/redpilot/auth"));
        assert_eq!(c.ports.expect("ports")[0].container_port, 9121);
        assert_eq!(
            v.secret.and_then(|s| s.secret_name).as_deref(),
            Some("cache-server-auth")
        );
        assert_eq!(c.env, None, "no password in the environment");
    }

    #[test]
    fn the_sidecar_can_be_off_or_another_image() {
        let off = MonitoringSpec {
            exporter: false,
            ..Default::default()
        };
        assert!(sidecar(&redis(Some(off)), "s").is_none());
        let other = MonitoringSpec {
            exporter_image: Some("oliver006/redis_exporter:v1.80.0".into()),
            ..Default::default()
        };
        let (c, _) = sidecar(&redis(Some(other)), "s").expect("on");
        assert_eq!(c.image.as_deref(), Some("oliver006/redis_exporter:v1.80.0"));
        assert_eq!(c.command, None, "its own entrypoint");
        let env = c.env.expect("env");
        assert!(env.iter().any(|e| e.name == "REDIS_ADDR"));
        assert!(
            env.iter()
                .any(|e| e.name == "REDIS_PASSWORD" && e.value.is_none() && e.value_from.is_some())
        );
    }
}
