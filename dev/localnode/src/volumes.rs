//! Materialises a pod's volumes as host directories; containers get them
//! bind-mounted at their `mountPath` by `exec-container`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
    Volume,
};
use kube::Api;
use kube::api::PostParams;

use crate::env::{Refs, field_value, resource_value};
use crate::error::{Error, IoContext, Result};

/// Inputs that volume contents depend on.
pub struct VolumeCtx<'a> {
    pub client: &'a kube::Client,
    pub pod: &'a Pod,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub dir: &'a Path,
    pub node_cpu_millis: i64,
    pub node_memory: i64,
}

fn verr(volume: &str, message: impl Into<String>) -> Error {
    Error::Volume {
        volume: volume.to_string(),
        message: message.into(),
    }
}

/// Prepares (or refreshes) every volume; returns volume name → host path.
pub async fn materialize(
    ctx: &VolumeCtx<'_>,
    refs: &mut Refs,
) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    let volumes = ctx
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for v in &volumes {
        let path = materialize_one(ctx, refs, v).await?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

async fn materialize_one(ctx: &VolumeCtx<'_>, refs: &mut Refs, v: &Volume) -> Result<PathBuf> {
    let own = ctx.dir.join(&v.name);
    let name = v.name.as_str();
    if v.empty_dir.is_some() {
        std::fs::create_dir_all(&own).at(&own)?;
        // Writable by any user, like the kubelet's emptyDir.
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).at(&own)?;
        return Ok(own);
    }
    if let Some(cm) = &v.config_map {
        let mut files = BTreeMap::new();
        let optional = cm.optional.unwrap_or(false);
        match refs.config_map(&cm.name).await? {
            Some(obj) => {
                let mut all: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                for (k, val) in obj.data.unwrap_or_default() {
                    all.insert(k, val.into_bytes());
                }
                for (k, val) in obj.binary_data.unwrap_or_default() {
                    all.insert(k, val.0);
                }
                select_items(
                    name,
                    &all,
                    cm.items.as_deref(),
                    optional,
                    cm.default_mode,
                    &mut files,
                )?;
            }
            None if optional => {}
            None => return Err(verr(name, format!("configmap \"{}\" not found", cm.name))),
        }
        write_files(&own, &files, fs_group(ctx.pod))?;
        return Ok(own);
    }
    if let Some(s) = &v.secret {
        let mut files = BTreeMap::new();
        let optional = s.optional.unwrap_or(false);
        let sname = s.secret_name.clone().unwrap_or_default();
        match refs.secret(&sname).await? {
            Some(obj) => {
                let mut all: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                for (k, val) in obj.data.unwrap_or_default() {
                    all.insert(k, val.0);
                }
                for (k, val) in obj.string_data.unwrap_or_default() {
                    all.insert(k, val.into_bytes());
                }
                select_items(
                    name,
                    &all,
                    s.items.as_deref(),
                    optional,
                    s.default_mode,
                    &mut files,
                )?;
            }
            None if optional => {}
            None => return Err(verr(name, format!("secret \"{sname}\" not found"))),
        }
        write_files(&own, &files, fs_group(ctx.pod))?;
        return Ok(own);
    }
    if let Some(d) = &v.downward_api {
        let mut files = BTreeMap::new();
        downward_items(
            ctx,
            name,
            d.items.as_deref().unwrap_or(&[]),
            d.default_mode,
            &mut files,
        )?;
        write_files(&own, &files, fs_group(ctx.pod))?;
        return Ok(own);
    }
    if let Some(p) = &v.projected {
        let mut files = BTreeMap::new();
        for src in p.sources.as_deref().unwrap_or(&[]) {
            if let Some(cm) = &src.config_map {
                let optional = cm.optional.unwrap_or(false);
                match refs.config_map(&cm.name).await? {
                    Some(obj) => {
                        let mut all: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                        for (k, val) in obj.data.unwrap_or_default() {
                            all.insert(k, val.into_bytes());
                        }
                        select_items(
                            name,
                            &all,
                            cm.items.as_deref(),
                            optional,
                            p.default_mode,
                            &mut files,
                        )?;
                    }
                    None if optional => {}
                    None => return Err(verr(name, format!("configmap \"{}\" not found", cm.name))),
                }
            }
            if let Some(s) = &src.secret {
                let optional = s.optional.unwrap_or(false);
                match refs.secret(&s.name).await? {
                    Some(obj) => {
                        let mut all: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                        for (k, val) in obj.data.unwrap_or_default() {
                            all.insert(k, val.0);
                        }
                        select_items(
                            name,
                            &all,
                            s.items.as_deref(),
                            optional,
                            p.default_mode,
                            &mut files,
                        )?;
                    }
                    None if optional => {}
                    None => return Err(verr(name, format!("secret \"{}\" not found", s.name))),
                }
            }
            if let Some(d) = &src.downward_api {
                downward_items(
                    ctx,
                    name,
                    d.items.as_deref().unwrap_or(&[]),
                    p.default_mode,
                    &mut files,
                )?;
            }
            if let Some(t) = &src.service_account_token {
                let token =
                    service_account_token(ctx, t.audience.clone(), t.expiration_seconds).await?;
                files.insert(
                    t.path.clone(),
                    (token.into_bytes(), mode_of(None, p.default_mode)),
                );
            }
        }
        write_files(&own, &files, fs_group(ctx.pod))?;
        return Ok(own);
    }
    if let Some(pvc) = &v.persistent_volume_claim {
        return claim_path(ctx, name, &pvc.claim_name).await;
    }
    if let Some(hp) = &v.host_path {
        let p = PathBuf::from(&hp.path);
        match hp.type_.as_deref() {
            Some("DirectoryOrCreate") => std::fs::create_dir_all(&p).at(&p)?,
            Some("FileOrCreate") if !p.exists() => std::fs::write(&p, b"").at(&p)?,
            _ => {}
        }
        if !p.exists() {
            return Err(verr(name, format!("hostPath {} does not exist", hp.path)));
        }
        return Ok(p);
    }
    Err(verr(
        name,
        "unsupported volume type (localnode supports emptyDir, configMap, secret, downwardAPI, projected, persistentVolumeClaim, hostPath)",
    ))
}

/// The host directory behind a bound PVC.
async fn claim_path(ctx: &VolumeCtx<'_>, volume: &str, claim: &str) -> Result<PathBuf> {
    let ns = ctx.pod.metadata.namespace.clone().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pvc = pvcs.get_opt(claim).await?.ok_or_else(|| {
        verr(
            volume,
            format!("persistentvolumeclaim \"{claim}\" not found"),
        )
    })?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|_| bound)
        .ok_or_else(|| {
            verr(
                volume,
                format!("persistentvolumeclaim \"{claim}\" is not bound yet"),
            )
        })?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let pv = pvs.get(&pv_name).await?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .host_path
        .map(|h| h.path)
        .or(spec.local.map(|l| l.path))
        .ok_or_else(|| {
            verr(
                volume,
                format!("persistentvolume {pv_name} is neither hostPath nor local"),
            )
        })?;
    let p = PathBuf::from(path);
    std::fs::create_dir_all(&p).at(&p)?;
    Ok(p)
}

async fn service_account_token(
    ctx: &VolumeCtx<'_>,
    audience: Option<String>,
    expiration: Option<i64>,
) -> Result<String> {
    let ns = ctx.pod.metadata.namespace.clone().unwrap_or_default();
    let sa = ctx
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ns);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a]),
            expiration_seconds: Some(expiration.unwrap_or(3607)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: ctx.pod.metadata.name.clone(),
                uid: ctx.pod.metadata.uid.clone(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let resp = api
        .create_token_request(&sa, &PostParams::default(), &req)
        .await?;
    Ok(resp.status.and_then(|s| s.token).unwrap_or_default())
}

fn mode_of(item: Option<i32>, default: Option<i32>) -> u32 {
    item.or(default).unwrap_or(0o644) as u32 & 0o7777
}

type Files = BTreeMap<String, (Vec<u8>, u32)>;

fn select_items(
    volume: &str,
    all: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    default_mode: Option<i32>,
    files: &mut Files,
) -> Result<()> {
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                match all.get(&it.key) {
                    Some(v) => {
                        files.insert(it.path.clone(), (v.clone(), mode_of(it.mode, default_mode)));
                    }
                    None if optional => {}
                    None => return Err(verr(volume, format!("key \"{}\" not found", it.key))),
                }
            }
        }
        _ => {
            for (k, v) in all {
                files.insert(k.clone(), (v.clone(), mode_of(None, default_mode)));
            }
        }
    }
    Ok(())
}

fn downward_items(
    ctx: &VolumeCtx<'_>,
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    files: &mut Files,
) -> Result<()> {
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            field_value(ctx.pod, ctx.pod_ip, ctx.host_ip, &f.field_path)?
        } else if let Some(r) = &it.resource_field_ref {
            let containers = ctx
                .pod
                .spec
                .as_ref()
                .map(|s| s.containers.clone())
                .unwrap_or_default();
            let c = containers
                .iter()
                .find(|c| Some(&c.name) == r.container_name.as_ref())
                .or(containers.first())
                .ok_or_else(|| verr(volume, "resourceFieldRef without a container"))?;
            resource_value(
                c,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
                ctx.node_cpu_millis,
                ctx.node_memory,
            )?
        } else {
            continue;
        };
        files.insert(
            it.path.clone(),
            (value.into_bytes(), mode_of(it.mode, default_mode)),
        );
    }
    Ok(())
}

/// The pod's `securityContext.fsGroup`: like the kubelet, the files of
/// configMap, secret, downwardAPI and projected volumes then belong to that
/// group and are readable by it, whatever their mode.
fn fs_group(pod: &Pod) -> Option<u32> {
    let g = pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(g).ok()
}

/// Writes key files into `dir` (atomically per file, only when changed) and
/// removes files that are no longer part of the volume; with `group`, each
/// file belongs to it and is readable by it.
fn write_files(dir: &Path, files: &Files, group: Option<u32>) -> Result<()> {
    std::fs::create_dir_all(dir).at(dir)?;
    for (rel, (content, mode)) in files {
        if rel.split('/').any(|c| c == "..") || rel.starts_with('/') {
            return Err(verr(
                &dir.display().to_string(),
                format!("bad item path {rel}"),
            ));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).at(parent)?;
        }
        let same = std::fs::read(&path).map(|c| &c == content).unwrap_or(false);
        if !same {
            let tmp = path.with_extension("localnode-tmp");
            std::fs::write(&tmp, content).at(&tmp)?;
            let mode = match group {
                Some(g) => {
                    std::os::unix::fs::chown(&tmp, None, Some(g)).at(&tmp)?;
                    *mode | 0o040
                }
                None => *mode,
            };
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).at(&tmp)?;
            std::fs::rename(&tmp, &path).at(&path)?;
        }
    }
    // Top-level entries that are no longer in the volume.
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let keep = files
                .keys()
                .any(|k| k == &n || k.starts_with(&format!("{n}/")));
            if !keep {
                let p = e.path();
                let _ = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_prunes() {
        let dir = std::env::temp_dir().join(format!("localnode-vol-{}", std::process::id()));
        let mut f = Files::new();
        f.insert("a".into(), (b"1".to_vec(), 0o600));
        f.insert("sub/b".into(), (b"2".to_vec(), 0o644));
        assert!(write_files(&dir, &f, None).is_ok());
        assert_eq!(std::fs::read(dir.join("sub/b")).ok(), Some(b"2".to_vec()));
        f.remove("a");
        assert!(write_files(&dir, &f, None).is_ok());
        assert!(!dir.join("a").exists());
        f.insert("../x".into(), (vec![], 0o644));
        assert!(write_files(&dir, &f, None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
