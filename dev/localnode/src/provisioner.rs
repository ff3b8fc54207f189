//! A default StorageClass and its dynamic provisioner: each claim gets a
//! hostPath PersistentVolume backed by a directory under the node's state
//! directory, pinned to this node. kube-controller-manager binds the claim;
//! released volumes are deleted (directory and PV) or kept according to
//! the reclaim policy.
//!
//! A class with `parameters: {sized: "true"}` makes sized volumes: the
//! directory is a tmpfs mount of the claim's size (`df` in the container
//! shows it, a full volume refuses writes), and an expansion remounts it
//! at the new size, live, as a file system grown online would.

use std::collections::BTreeMap;
use std::path::PathBuf;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;

use crate::error::{IoContext, Result};

pub const PROVISIONER: &str = "localnode.redpilot.io/hostpath";
pub const CLASS: &str = "standard";
const ANN_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

#[derive(Clone)]
pub struct Provisioner {
    pub client: kube::Client,
    pub node_name: String,
    pub volumes_dir: PathBuf,
}

impl Provisioner {
    /// Creates (or updates) the default StorageClass.
    pub async fn ensure_class(&self) -> Result<()> {
        let api: Api<StorageClass> = Api::all(self.client.clone());
        let class = StorageClass {
            metadata: ObjectMeta {
                name: Some(CLASS.into()),
                annotations: Some(BTreeMap::from([(
                    "storageclass.kubernetes.io/is-default-class".to_string(),
                    "true".to_string(),
                )])),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_string(),
                    "localnode".to_string(),
                )])),
                ..Default::default()
            },
            provisioner: PROVISIONER.into(),
            reclaim_policy: Some("Delete".into()),
            volume_binding_mode: Some("Immediate".into()),
            allow_volume_expansion: Some(true),
            ..Default::default()
        };
        api.patch(
            CLASS,
            &PatchParams::apply("localnode").force(),
            &Patch::Apply(&class),
        )
        .await?;
        Ok(())
    }

    fn dir_for(&self, pv_name: &str) -> PathBuf {
        self.volumes_dir.join(pv_name)
    }

    async fn is_ours(&self, pvc: &PersistentVolumeClaim) -> Result<Option<StorageClass>> {
        let ann = pvc.metadata.annotations.clone().unwrap_or_default();
        let by_ann = ann
            .get(ANN_PROVISIONER)
            .or(ann.get(ANN_PROVISIONER_BETA))
            .map(String::as_str)
            == Some(PROVISIONER);
        let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        let Some(class_name) = class_name else {
            return Ok(None);
        };
        let api: Api<StorageClass> = Api::all(self.client.clone());
        let class = api.get_opt(&class_name).await?;
        Ok(class.filter(|c| by_ann || c.provisioner == PROVISIONER))
    }

    /// Creates a PV for a pending claim of our class.
    pub async fn provision(&self, pvc: &PersistentVolumeClaim) -> Result<()> {
        let spec = pvc.spec.clone().unwrap_or_default();
        if let Some(pv_name) = spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
            return self.resize(pvc, pv_name).await;
        }
        if pvc.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let Some(class) = self.is_ours(pvc).await? else {
            return Ok(());
        };
        let (Some(uid), Some(ns), Some(name)) = (
            pvc.metadata.uid.clone(),
            pvc.metadata.namespace.clone(),
            pvc.metadata.name.clone(),
        ) else {
            return Ok(());
        };
        let pv_name = format!("pvc-{uid}");
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        if pvs.get_opt(&pv_name).await?.is_some() {
            return Ok(());
        }
        let size = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage").cloned())
            .unwrap_or_else(|| Quantity("1Gi".into()));
        let dir = self.dir_for(&pv_name);
        std::fs::create_dir_all(&dir).at(&dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).at(&dir)?;
        }
        if sized(&class) && !is_mount_point(&dir) {
            let bytes = crate::env::parse_quantity(&size.0, false).unwrap_or(0.0) as u64;
            mount_tmpfs(&dir, &format!("size={bytes},mode=0777"))?;
        }
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(pv_name.clone()),
                annotations: Some(BTreeMap::from([(
                    ANN_PROVISIONED_BY.to_string(),
                    PROVISIONER.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".to_string(), size)])),
                access_modes: spec.access_modes.clone(),
                volume_mode: spec.volume_mode.clone(),
                storage_class_name: Some(class.metadata.name.clone().unwrap_or_default()),
                persistent_volume_reclaim_policy: Some(
                    class
                        .reclaim_policy
                        .clone()
                        .unwrap_or_else(|| "Delete".into()),
                ),
                host_path: Some(HostPathVolumeSource {
                    path: dir.display().to_string(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: Some(ns.clone()),
                    name: Some(name.clone()),
                    uid: Some(uid),
                    ..Default::default()
                }),
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/hostname".into(),
                                operator: "In".into(),
                                values: Some(vec![self.node_name.clone()]),
                            }]),
                            ..Default::default()
                        }],
                    }),
                }),
                mount_options: class.mount_options.clone(),
                ..Default::default()
            }),
            status: None,
        };
        match pvs.create(&PostParams::default(), &pv).await {
            Ok(_) => {
                tracing::info!(pv = %pv_name, claim = %format!("{ns}/{name}"), "provisioned volume")
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Expansion, as an external resizer would do it: a directory has no
    /// size, so the new request is recorded on the PV and the claim.
    async fn resize(&self, pvc: &PersistentVolumeClaim, pv_name: &str) -> Result<()> {
        let requested = pvc
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage").cloned());
        let current = pvc
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage").cloned());
        let (Some(requested), Some(current)) = (requested, current) else {
            return Ok(());
        };
        let bytes = |q: &Quantity| crate::env::parse_quantity(&q.0, false).unwrap_or(0.0);
        if bytes(&requested) <= bytes(&current) {
            return Ok(());
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(pv) = pvs.get_opt(pv_name).await? else {
            return Ok(());
        };
        let ours = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_PROVISIONED_BY))
            .map(String::as_str)
            == Some(PROVISIONER);
        if !ours {
            return Ok(());
        }
        // A sized volume grows for real first: its tmpfs is remounted at
        // the new size (live; the pod's bind mount sees it at once).
        let dir = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| PathBuf::from(&h.path));
        if let Some(dir) = dir.filter(|d| d.starts_with(&self.volumes_dir) && is_mount_point(d)) {
            let new = bytes(&requested) as u64;
            mount_tmpfs(&dir, &format!("remount,size={new}"))?;
        }
        let patch = serde_json::json!({"spec": {"capacity": {"storage": requested}}});
        pvs.patch(pv_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let (Some(ns), Some(name)) = (&pvc.metadata.namespace, &pvc.metadata.name) else {
            return Ok(());
        };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let patch = serde_json::json!({"status": {
            "capacity": {"storage": requested},
            "allocatedResources": {"storage": requested},
            "allocatedResourceStatuses": null,
            "conditions": null,
        }});
        claims
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        tracing::info!(pv = %pv_name, size = %requested.0, "expanded volume");
        Ok(())
    }

    /// Deletes a released volume of ours whose policy says Delete.
    pub async fn reclaim(&self, pv: &PersistentVolume) -> Result<()> {
        let ours = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_PROVISIONED_BY))
            .map(String::as_str)
            == Some(PROVISIONER);
        if !ours || pv.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
        if !matches!(phase, Some("Released") | Some("Failed")) || policy != Some("Delete") {
            return Ok(());
        }
        let Some(name) = pv.metadata.name.clone() else {
            return Ok(());
        };
        let dir = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| PathBuf::from(&h.path))
            .unwrap_or_else(|| self.dir_for(&name));
        // Only ever remove directories inside our own volumes directory.
        if dir.starts_with(&self.volumes_dir) && dir.exists() {
            if is_mount_point(&dir) {
                umount(&dir)?;
            }
            std::fs::remove_dir_all(&dir).at(&dir)?;
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(pv = %name, "deleted released volume"),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Watches claims and volumes forever.
    pub async fn run(self) {
        let claims = {
            let p = self.clone();
            watch_each(
                Api::<PersistentVolumeClaim>::all(self.client.clone()),
                "claim",
                move |pvc| {
                    let p = p.clone();
                    async move { p.provision(&pvc).await }
                },
            )
        };
        let volumes = {
            let p = self.clone();
            watch_each(
                Api::<PersistentVolume>::all(self.client.clone()),
                "volume",
                move |pv| {
                    let p = p.clone();
                    async move { p.reclaim(&pv).await }
                },
            )
        };
        tokio::join!(claims, volumes);
    }
}

/// Whether volumes of `class` are sized tmpfs mounts.
fn sized(class: &StorageClass) -> bool {
    class
        .parameters
        .as_ref()
        .and_then(|p| p.get("sized"))
        .is_some_and(|v| v == "true")
}

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(Ok(up))) = (std::fs::metadata(dir), dir.parent().map(std::fs::metadata))
    else {
        return false;
    };
    me.dev() != up.dev()
}

/// `mount -t tmpfs -o OPTIONS tmpfs DIR` (a remount when OPTIONS says so).
fn mount_tmpfs(dir: &std::path::Path, options: &str) -> Result<()> {
    run_on(dir, "mount", &["-t", "tmpfs", "-o", options, "tmpfs"])
}

/// `umount -l DIR` (lazy: a pod still running on it keeps it until it ends).
fn umount(dir: &std::path::Path) -> Result<()> {
    run_on(dir, "umount", &["-l"])
}

/// Runs `program ARGS DIR`; its error output names the volume on failure.
fn run_on(dir: &std::path::Path, program: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(program)
        .args(args)
        .arg(dir)
        .output()
        .at(dir)?;
    if out.status.success() {
        return Ok(());
    }
    Err(crate::error::Error::Volume {
        volume: dir.display().to_string(),
        message: format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// Runs `handle` on every object the watch reports as present (initial list
/// and later changes), logging failures and retrying the watch after errors.
async fn watch_each<K, F, Fut>(api: Api<K>, what: &'static str, handle: F)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
    F: Fn(K) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    loop {
        match stream.try_next().await {
            Ok(Some(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                if let Err(e) = handle(obj).await {
                    tracing::warn!(error = %e, what, "handling failed");
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, what, "watch error");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}
