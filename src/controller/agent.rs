//! Running the operator's own image as a backup or restore agent
//! (`redpilot backup` in a Job, `redpilot restore` in an init container):
//! the arguments and environment naming the bucket, the restricted
//! container settings, and reading the outcome the agent leaves in its
//! termination message. Shared by the backup controller and the Redis
//! bootstrap, so both speak to the agent the same way.

use k8s_openapi::api::core::v1::{
    ContainerStatus, EnvVar, EnvVarSource, PersistentVolumeClaimVolumeSource, SecretKeySelector,
    SecurityContext, Volume, VolumeMount,
};

use crate::api::v1alpha1::{S3Location, VolumeLocation};
use crate::backup::Manifest;

/// Where the agent writes its outcome, read back as the container's
/// termination message (an emptyDir is mounted at `/tmp`).
pub const RESULT_PATH: &str = "/tmp/termination-log";

/// The image the agent runs: the operator's own (`OPERATOR_IMAGE`, set in
/// the operator's Deployment), else this release's public image.
pub fn operator_image() -> String {
    std::env::var("OPERATOR_IMAGE")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| format!("redpilot/redpilot:{}", crate::VERSION))
}

/// Where a volume target is mounted in the agent's container.
pub const VOLUME_MOUNT: &str = "/backup";
/// The pod volume of a volume target.
pub const VOLUME_NAME: &str = "backup-target";

/// Where a backup is: a bucket, or a directory on a claim.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// An S3-compatible bucket.
    S3(&'a S3Location),
    /// A PersistentVolumeClaim.
    Volume(&'a VolumeLocation),
}

impl<'a> Target<'a> {
    /// The one that is set (admission makes sure exactly one is).
    pub fn of(s3: Option<&'a S3Location>, volume: Option<&'a VolumeLocation>) -> Option<Self> {
        match (s3, volume) {
            (Some(s), _) => Some(Target::S3(s)),
            (None, Some(v)) => Some(Target::Volume(v)),
            (None, None) => None,
        }
    }

    /// The agent's options naming the store and the key.
    pub fn args(&self, key: &str) -> Vec<String> {
        match self {
            Target::S3(s3) => store_args(s3, key),
            Target::Volume(v) => vec![
                "--dir".into(),
                volume_dir(v),
                "--key".into(),
                key.to_string(),
                "--result-file".into(),
                RESULT_PATH.into(),
            ],
        }
    }

    /// The access key's variables (by reference), for a bucket.
    pub fn env(&self, optional: bool) -> Vec<EnvVar> {
        match self {
            Target::S3(s3) => credential_env(s3, optional),
            Target::Volume(_) => Vec::new(),
        }
    }

    /// The claim as a pod volume and its mount, for a volume target.
    pub fn volume(&self, read_only: bool) -> Option<(Volume, VolumeMount)> {
        let Target::Volume(v) = self else {
            return None;
        };
        Some((
            Volume {
                name: VOLUME_NAME.into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: v.claim_name.clone(),
                    read_only: Some(read_only),
                }),
                ..Default::default()
            },
            VolumeMount {
                name: VOLUME_NAME.into(),
                mount_path: VOLUME_MOUNT.into(),
                read_only: Some(read_only),
                ..Default::default()
            },
        ))
    }

    /// `s3://bucket/key` or `pvc://claim/path/key`.
    pub fn location(&self, key: &str) -> String {
        match self {
            Target::S3(s3) => format!("s3://{}/{key}", s3.bucket),
            Target::Volume(v) => match v.path.as_deref().map(|p| p.trim_matches('/')) {
                Some(p) if !p.is_empty() => format!("pvc://{}/{p}/{key}", v.claim_name),
                _ => format!("pvc://{}/{key}", v.claim_name),
            },
        }
    }
}

fn volume_dir(v: &VolumeLocation) -> String {
    match v.path.as_deref().map(|p| p.trim_matches('/')) {
        Some(p) if !p.is_empty() => format!("{VOLUME_MOUNT}/{p}"),
        _ => VOLUME_MOUNT.to_string(),
    }
}

/// `--bucket … --key …` and the rest of the agent's store options.
pub fn store_args(s3: &S3Location, key: &str) -> Vec<String> {
    let mut args = vec![
        "--bucket".to_string(),
        s3.bucket.clone(),
        "--key".into(),
        key.to_string(),
        "--region".into(),
        s3.region.clone(),
    ];
    if let Some(e) = &s3.endpoint {
        args.extend(["--endpoint".into(), e.clone()]);
    }
    if s3.path_style {
        args.push("--path-style".into());
    }
    args.extend(["--result-file".into(), RESULT_PATH.into()]);
    args
}

/// The access key, from the user's Secret by reference (the operator never
/// copies it). `optional` lets a pod start once the Secret is gone, for an
/// agent that will not need it (a finished bootstrap).
pub fn credential_env(s3: &S3Location, optional: bool) -> Vec<EnvVar> {
    let from = |name: &str, key: &str| secret_env(name, &s3.credentials.secret_name, key, optional);
    vec![
        from("AWS_ACCESS_KEY_ID", &s3.credentials.access_key_id_key),
        from(
            "AWS_SECRET_ACCESS_KEY",
            &s3.credentials.secret_access_key_key,
        ),
    ]
}

/// Variable `name` from the pod's field `path` (`metadata.name`,
/// `status.podIP`).
pub fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Variable `name` from key `key` of Secret `secret` (by reference: the
/// operator never copies a secret into a spec).
pub fn secret_env(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.into(),
                optional: Some(optional),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container running the agent (`redpilot <args>`) from the operator's
/// image: restricted, with its resource bound, and its outcome written
/// where its termination message is read from.
pub fn container(
    name: &str,
    args: Vec<String>,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> k8s_openapi::api::core::v1::Container {
    k8s_openapi::api::core::v1::Container {
        name: name.into(),
        image: Some(operator_image()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/redpilot".into()]),
        args: Some(args),
        env: Some(env),
        volume_mounts: Some(mounts),
        resources: Some(resources()),
        termination_message_path: Some(RESULT_PATH.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(security_context()),
        ..Default::default()
    }
}

/// What an agent container asks for: memory is bounded by the upload parts
/// in flight (two of 8 MiB, plus the one filling), whatever the dataset
/// (the agent peaks near 50 MiB).
fn resources() -> k8s_openapi::api::core::v1::ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |v: &str| Quantity(v.into());
    k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_string(), q("100m")),
                ("memory".to_string(), q("64Mi")),
            ]
            .into(),
        ),
        limits: Some([("memory".to_string(), q("128Mi"))].into()),
        ..Default::default()
    }
}

/// Non-root, no privileges, read-only root.
fn security_context() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        ..super::layout::restricted_security_context()
    }
}

/// What an agent run ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The backup (or restored backup) its manifest describes.
    Done(Box<Manifest>),
    /// A bootstrap restore that had nothing to do.
    Skipped(String),
    /// A restore to a point in time: what it loaded.
    ToTime(Box<crate::backup::pitr::Outcome>),
    /// A failure: a bounded reason and a message (never a secret).
    Failed {
        /// Category (`StoreAccessDenied`, `ChecksumMismatch`, …).
        reason: String,
        /// What happened.
        message: String,
    },
}

/// Reads the agent's termination message (or, when it crashed before
/// writing one, the tail of its log, whose last line is the same JSON).
pub fn outcome(message: &str) -> Option<Outcome> {
    let line = message
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))?;
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    if let Some(why) = v.get("skipped").and_then(|s| s.as_str()) {
        return Some(Outcome::Skipped(why.into()));
    }
    if let (Some(reason), Some(msg)) = (
        v.get("reason").and_then(|s| s.as_str()),
        v.get("message").and_then(|s| s.as_str()),
    ) {
        return Some(Outcome::Failed {
            reason: bounded_reason(reason).into(),
            message: msg.into(),
        });
    }
    if v.get("checkpoint").is_some() {
        return serde_json::from_value::<crate::backup::pitr::Outcome>(v)
            .ok()
            .map(|o| Outcome::ToTime(Box::new(o)));
    }
    serde_json::from_value::<Manifest>(v)
        .ok()
        .map(|m| Outcome::Done(Box::new(m)))
}

/// The agent's categories, and `AgentFailed` for anything else (a reason
/// becomes a condition reason and a metric label: it must stay bounded).
pub fn bounded_reason(reason: &str) -> &'static str {
    match reason {
        "SourceFailed" => "SourceFailed",
        "SourceChanged" => "SourceChanged",
        "StoreAccessDenied" => "StoreAccessDenied",
        "StoreNotFound" => "StoreNotFound",
        "StoreFailed" => "StoreFailed",
        "InvalidRequest" => "InvalidRequest",
        "IncompatibleVersion" => "IncompatibleVersion",
        "ChecksumMismatch" => "ChecksumMismatch",
        "NotRestorable" => "NotRestorable",
        _ => "AgentFailed",
    }
}

/// The newest termination message of container `name` among `statuses`
/// (its current state, else its last one), with the exit code.
pub fn termination(statuses: &[ContainerStatus], name: &str) -> Option<(i32, Option<String>)> {
    let s = statuses.iter().find(|s| s.name == name)?;
    let t = s
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .or_else(|| s.last_state.as_ref().and_then(|st| st.terminated.as_ref()))?;
    Some((t.exit_code, t.message.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_read_from_the_message_or_the_log_tail() {
        let failed = "some log line\n{\"reason\":\"StoreAccessDenied\",\"message\":\"the access key id or secret access key is wrong\"}";
        assert_eq!(
            outcome(failed),
            Some(Outcome::Failed {
                reason: "StoreAccessDenied".into(),
                message: "the access key id or secret access key is wrong".into()
            })
        );
        let odd = "{\"reason\":\"Whatever\",\"message\":\"m\"}";
        assert!(
            matches!(outcome(odd), Some(Outcome::Failed { reason, .. }) if reason == "AgentFailed")
        );
        assert_eq!(
            outcome("{\"skipped\":\"a primary is published\"}"),
            Some(Outcome::Skipped("a primary is published".into()))
        );
        let m = Manifest {
            format: 1,
            key: "k.rdb".into(),
            size_bytes: 10,
            sha256: "ab".into(),
            keys: Some(3),
            keys_db: Some(0),
            rdb_version: 10,
            engine: "Redis".into(),
            engine_version: Some("7.0.15".into()),
            source: "cache-1".into(),
            replid: None,
            offset: Some(42),
            shard: None,
            slots: None,
            started_at: "t0".into(),
            completed_at: "t1".into(),
        };
        let text = serde_json::to_string(&m).expect("json");
        assert_eq!(outcome(&text), Some(Outcome::Done(Box::new(m))));
        assert_eq!(outcome("thread panicked at ..."), None);
    }

    #[test]
    fn store_args_name_the_bucket_but_no_credential() {
        let s3: S3Location = serde_json::from_value(serde_json::json!({
            "endpoint": "http://10.0.0.1:9000", "bucket": "b", "pathStyle": true,
            "credentials": {"secretName": "s3"}
        }))
        .expect("s3");
        let args = store_args(&s3, "p/k.rdb").join(" ");
        assert_eq!(
            args,
            "--bucket b --key p/k.rdb --region us-east-1 --endpoint http://10.0.0.1:9000 --path-style --result-file /tmp/termination-log"
        );
        let env = credential_env(&s3, true);
        assert!(env.iter().all(|e| e.value.is_none()));
    }
}
