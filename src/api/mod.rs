//! The custom resources Redpilot serves.

pub mod v1alpha1;

use kube::CustomResourceExt;

/// Every CRD of the operator, rendered as one multi-document YAML stream in a
/// stable order (the form checked in under `crds/`).
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let crds = [
        v1alpha1::Redis::crd(),
        v1alpha1::RedisBackup::crd(),
        v1alpha1::RedisBackupSchedule::crd(),
    ];
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
