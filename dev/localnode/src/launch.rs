//! `localnode exec-container SPEC`: the last step before a container's
//! program runs. It is started as
//! `ip netns exec <pod-netns> unshare --mount --uts --propagation private localnode exec-container SPEC`,
//! so it already sits in the pod's network namespace and in fresh mount and
//! UTS namespaces. It first joins the container's memory cgroup (cgroup.rs),
//! then builds the container's root on a tmpfs mounted at
//! `/run/redpilot-localnode-root` (only visible in this mount namespace): every top-level host
//! directory becomes an overlay with the host directory as the read-only
//! lower layer and a per-container upper layer (the host's programs and
//! libraries are the "image"; what the container writes stays in its
//! layer), except /proc, /sys and /dev (bound) and the directory holding
//! the repository (bound: an overlay cannot hold its own upper layer);
//! `/tmp` becomes a private directory. Then it chroots, bind-mounts the
//! pod's volumes at their `mountPath`, links the image's programs into
//! `/.image/bin`, applies readOnlyRootFilesystem, sets the hostname and
//! execs.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;
use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

/// Everything `exec-container` needs, written as JSON by the node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchSpec {
    pub hostname: String,
    /// Host directory that becomes the container's `/tmp`.
    pub private_tmp: PathBuf,
    /// Host directory for the container's writable layers (overlay upper
    /// and work directories over the host's top-level directories).
    pub layer_dir: PathBuf,
    /// Host file bind-mounted over `/etc/hosts`.
    pub hosts_file: Option<PathBuf>,
    pub mounts: Vec<MountSpec>,
    /// Program name → host path, linked into `/.image/bin`.
    pub image_bins: Vec<(String, PathBuf)>,
    pub program: String,
    pub arg0: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    /// securityContext runAsUser / runAsGroup.
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    /// Supplementary groups: the pod's fsGroup and supplementalGroups, as
    /// the kubelet gives every container process (a file of a volume owned
    /// by fsGroup is readable through it whatever the user).
    #[serde(default)]
    pub groups: Vec<u32>,
    /// securityContext readOnlyRootFilesystem: everything but the volumes
    /// (and /proc, /sys, /dev) is read-only.
    #[serde(default)]
    pub read_only_root: bool,
    /// The container's memory cgroup, joined before anything else runs.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// A real image's unpacked root file system (oci.rs): the container's
    /// root is an overlay of it and a writable layer, instead of the host's
    /// directories.
    #[serde(default)]
    pub rootfs: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MountSpec {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// Mount point of the new root's tmpfs. Outside `/tmp`, so that host paths
/// under `/tmp` (a repository checked out there, its state directory, the
/// image programs) still resolve while the root is assembled.
const ROOT: &str = "/run/redpilot-localnode-root";
/// Where volume sources wait inside the new root until they are mounted.
const STAGING: &str = "/.localnode-volumes";

fn mount_err(what: &str, path: &Path, e: rustix::io::Errno) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(format!("{what}: {e}")),
    }
}

/// Builds the root and execs the program; returns only on failure.
pub fn exec_container(spec_path: &Path) -> Error {
    match prepare(spec_path) {
        Ok(mut cmd) => Error::Setup(format!("exec failed: {}", cmd.exec())),
        Err(e) => e,
    }
}

/// Takes on the container's groups and user before the exec. Here rather
/// than through `Command::uid`, which drops every supplementary group when
/// root changes user. This process is single-threaded (`exec-container`
/// runs before any runtime starts), so the per-thread calls are the
/// process's.
fn drop_privileges(spec: &LaunchSpec) -> Result<()> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    let setup = |what: &str, e: rustix::io::Errno| Error::Setup(format!("{what}: {e}"));
    if spec.uid.is_some() || !spec.groups.is_empty() {
        let groups: Vec<Gid> = spec.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        set_thread_groups(&groups).map_err(|e| setup("setgroups", e))?;
    }
    if let Some(gid) = spec.gid.or(spec.uid.map(|_| 0)) {
        let g = Gid::from_raw(gid);
        set_thread_res_gid(g, g, g).map_err(|e| setup("setresgid", e))?;
    }
    if let Some(uid) = spec.uid {
        let u = Uid::from_raw(uid);
        set_thread_res_uid(u, u, u).map_err(|e| setup("setresuid", e))?;
    }
    Ok(())
}

/// Waits (up to 2 s) until this process is in the memory cgroup `dir`,
/// as /proc/self/cgroup tells.
fn wait_joined(dir: &Path) -> bool {
    let Ok(rel) = dir.strip_prefix(crate::cgroup::MEMORY_MOUNT) else {
        return false;
    };
    let want = format!("/{}", rel.display());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let joined = std::fs::read_to_string("/proc/self/cgroup").is_ok_and(|s| {
            s.lines().any(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
                controllers.is_some_and(|c| c.split(',').any(|c| c == "memory"))
                    && path == Some(want.as_str())
            })
        });
        if joined {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The memory controller, read-only, at `<sys>/fs/cgroup/memory`, as a
/// container runtime shows a container its cgroup (the sysfs `ip netns
/// exec` mounts has none): a program can read the limit it runs under.
/// A failure is reported on the container's stderr and changes nothing else.
fn mount_memory_cgroup(sys: &Path) {
    let fs = sys.join("fs/cgroup");
    let memory = fs.join("memory");
    let made = rustix::mount::mount("tmpfs", &fs, "tmpfs", MountFlags::NOSUID, c"mode=755")
        .map_err(|e| e.to_string())
        .and_then(|()| std::fs::create_dir(&memory).map_err(|e| e.to_string()))
        .and_then(|()| {
            rustix::mount::mount(
                "cgroup",
                &memory,
                "cgroup",
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                c"memory",
            )
            .map_err(|e| e.to_string())
        });
    if let Err(e) = made {
        eprintln!(
            "localnode exec-container: mounting the memory cgroup at {}: {e}",
            memory.display()
        );
    }
}

fn prepare(spec_path: &Path) -> Result<std::process::Command> {
    let text = std::fs::read_to_string(spec_path).at(spec_path)?;
    let spec: LaunchSpec = serde_json::from_str(&text)?;
    // First of all, so that everything this process and the program
    // allocate is charged to (and limited by) the container's cgroup. A
    // failure leaves the container unlimited rather than not running.
    //
    // `ip netns exec` mounts a fresh sysfs over /sys, which hides the
    // cgroup tree: the write then fails with ENOENT, and the node (which
    // writes this pid into the cgroup right after spawning it) does it
    // instead; this process waits until /proc/self/cgroup shows it joined.
    // Only a real failure is reported, on the container's stderr (its log).
    if let Some(dir) = &spec.cgroup
        && let Err(e) = std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        && !(e.kind() == std::io::ErrorKind::NotFound && wait_joined(dir))
    {
        eprintln!(
            "localnode exec-container: joining memory cgroup {}: {e}",
            dir.display()
        );
    }
    let root = Path::new(ROOT);
    std::fs::create_dir_all(root).at(root)?;
    if let Some(rootfs) = &spec.rootfs {
        return prepare_image_root(&spec, rootfs, root);
    }

    // Host directory entries to carry into the new root (read before /tmp is covered).
    let mut entries: Vec<OsString> = Vec::new();
    for e in std::fs::read_dir("/").at("/")? {
        entries.push(e.at("/")?.file_name());
    }
    // The top-level directory holding the node's state (the repository) is
    // bind-mounted as it is: an overlay may not contain its own upper layer.
    let state_top = spec
        .layer_dir
        .components()
        .nth(1)
        .map(|c| c.as_os_str().to_os_string());

    rustix::mount::mount("tmpfs", root, "tmpfs", MountFlags::NOSUID, c"mode=755")
        .map_err(|e| mount_err("mount tmpfs", root, e))?;

    let mut top_dirs: Vec<String> = Vec::new();
    for name in entries {
        let host = Path::new("/").join(&name);
        let inside = root.join(&name);
        let meta = std::fs::symlink_metadata(&host).at(&host)?;
        let name_s = name.to_string_lossy().into_owned();
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&host).at(&host)?;
            std::os::unix::fs::symlink(&target, &inside).at(&inside)?;
            continue;
        }
        if !meta.is_dir() {
            continue;
        }
        std::fs::create_dir(&inside).at(&inside)?;
        match name_s.as_str() {
            "tmp" => rustix::mount::mount_bind(&spec.private_tmp, &inside)
                .map_err(|e| mount_err("bind private /tmp", &inside, e))?,
            "proc" | "sys" | "dev" => {
                rustix::mount::mount_bind_recursive(&host, &inside)
                    .map_err(|e| mount_err("bind host directory", &inside, e))?;
                if name_s == "sys" && spec.cgroup.is_some() {
                    mount_memory_cgroup(&inside);
                }
                continue;
            }
            // Not for containers (and possibly other mounts of the host).
            "mnt" | "media" | "lost+found" | "old_root" | "boot" => continue,
            _ if Some(&name) == state_top.as_ref() => {
                rustix::mount::mount_bind_recursive(&host, &inside)
                    .map_err(|e| mount_err("bind host directory", &inside, e))?
            }
            _ => {
                // The host directory as a read-only lower layer; the
                // container writes into its own upper layer, never the host.
                let upper = spec.layer_dir.join("upper").join(&name);
                let work = spec.layer_dir.join("work").join(&name);
                std::fs::create_dir_all(&upper).at(&upper)?;
                std::fs::create_dir_all(&work).at(&work)?;
                let opts = format!(
                    "lowerdir={},upperdir={},workdir={}",
                    host.display(),
                    upper.display(),
                    work.display()
                );
                let opts = std::ffi::CString::new(opts)
                    .map_err(|e| Error::Setup(format!("overlay options: {e}")))?;
                rustix::mount::mount(
                    "overlay",
                    &inside,
                    "overlay",
                    MountFlags::empty(),
                    opts.as_c_str(),
                )
                .map_err(|e| mount_err("mount overlay", &inside, e))?;
            }
        }
        top_dirs.push(name_s);
    }

    finish(&spec, root, &top_dirs, false)
}

/// The root of a container of a real image: one overlay with the image's
/// files as the read-only lower layer and the container's writable layer
/// above, then /proc, /sys and /dev as for any container; the image's own
/// /tmp stays.
fn prepare_image_root(
    spec: &LaunchSpec,
    rootfs: &Path,
    root: &Path,
) -> Result<std::process::Command> {
    let upper = spec.layer_dir.join("upper");
    let work = spec.layer_dir.join("work");
    std::fs::create_dir_all(&upper).at(&upper)?;
    std::fs::create_dir_all(&work).at(&work)?;
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        rootfs.display(),
        upper.display(),
        work.display()
    );
    let opts =
        std::ffi::CString::new(opts).map_err(|e| Error::Setup(format!("overlay options: {e}")))?;
    rustix::mount::mount(
        "overlay",
        root,
        "overlay",
        MountFlags::empty(),
        opts.as_c_str(),
    )
    .map_err(|e| mount_err("mount image overlay", root, e))?;
    // A bind mount of itself, so that readOnlyRootFilesystem can remount it
    // read-only for this container alone.
    rustix::mount::mount_bind(root, root).map_err(|e| mount_err("bind image root", root, e))?;
    for name in ["proc", "sys", "dev"] {
        let inside = root.join(name);
        std::fs::create_dir_all(&inside).at(&inside)?;
        let host = Path::new("/").join(name);
        rustix::mount::mount_bind_recursive(&host, &inside)
            .map_err(|e| mount_err("bind host directory", &inside, e))?;
        if name == "sys" && spec.cgroup.is_some() {
            mount_memory_cgroup(&inside);
        }
    }
    // The image's own /tmp (an image may ship files there) stays, in the
    // container's writable layer like the rest of its root; one the image
    // lacks is made world-writable, as a runtime would.
    let tmp = root.join("tmp");
    if !tmp.exists() {
        std::fs::create_dir_all(&tmp).at(&tmp)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).at(&tmp)?;
    }
    // /etc/hosts is the pod's, as a kubelet mounts it into every container.
    if spec.hosts_file.is_some() {
        let etc = root.join("etc");
        std::fs::create_dir_all(&etc).at(&etc)?;
        let hosts = etc.join("hosts");
        if !hosts.exists() {
            std::fs::write(&hosts, b"").at(&hosts)?;
        }
    }
    finish(spec, root, &[], true)
}

/// What every container's root gets once its directories are in place: the
/// mapped image's programs, /etc/hosts, the volumes, the read-only root,
/// the hostname; then the program to exec.
fn finish(
    spec: &LaunchSpec,
    root: &Path,
    top_dirs: &[String],
    image_root: bool,
) -> Result<std::process::Command> {
    // The image's programs: each executable bind-mounted as a file, so it
    // stays reachable whatever the volumes cover.
    let bin = root.join(crate::images::IMAGE_BIN.trim_start_matches('/'));
    if !spec.image_bins.is_empty() {
        std::fs::create_dir_all(&bin).at(&bin)?;
    }
    for (name, host) in &spec.image_bins {
        let file = bin.join(name);
        std::fs::write(&file, b"").at(&file)?;
        rustix::mount::mount_bind(host, &file)
            .map_err(|e| mount_err("bind image program", &file, e))?;
    }

    // Volume sources staged inside the new root while host paths still
    // resolve (a volume may later cover the directory they live in).
    let staging = root.join(STAGING.trim_start_matches('/'));
    let mut mounts = spec.mounts.clone();
    mounts.sort_by_key(|m| m.target.matches('/').count());
    let mut staged = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let src_meta = std::fs::metadata(&m.source).at(&m.source)?;
        let stage = staging.join(i.to_string());
        if src_meta.is_dir() {
            std::fs::create_dir_all(&stage).at(&stage)?;
        } else {
            std::fs::create_dir_all(&staging).at(&staging)?;
            std::fs::write(&stage, b"").at(&stage)?;
        }
        rustix::mount::mount_bind(&m.source, &stage)
            .map_err(|e| mount_err("stage volume", &stage, e))?;
        staged.push((Path::new(STAGING).join(i.to_string()), src_meta.is_dir()));
    }

    if let Some(hosts) = &spec.hosts_file {
        let target = root.join("etc/hosts");
        if target.exists() {
            rustix::mount::mount_bind(hosts, &target)
                .map_err(|e| mount_err("bind /etc/hosts", &target, e))?;
        }
    }

    // From here on paths are the container's: symlinks such as
    // /var/run -> /run resolve inside its root.
    rustix::process::chroot(root).map_err(|e| mount_err("chroot", root, e))?;
    std::env::set_current_dir("/").at("/")?;

    for (m, (stage, is_dir)) in mounts.iter().zip(&staged) {
        let target = PathBuf::from(&m.target);
        if *is_dir {
            std::fs::create_dir_all(&target).at(&target)?;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).at(parent)?;
            }
            if !target.exists() {
                std::fs::write(&target, b"").at(&target)?;
            }
        }
        rustix::mount::mount_bind(stage, &target)
            .map_err(|e| mount_err("bind volume", &target, e))?;
        if m.read_only {
            rustix::mount::mount_remount(&target, MountFlags::BIND | MountFlags::RDONLY, c"")
                .map_err(|e| mount_err("remount read-only", &target, e))?;
        }
    }
    for (stage, _) in &staged {
        rustix::mount::unmount(stage, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| mount_err("unmount staging", stage, e))?;
    }
    if !staged.is_empty() {
        let _ = std::fs::remove_dir_all(STAGING);
    }

    if spec.read_only_root && image_root {
        rustix::mount::mount_remount("/", MountFlags::BIND | MountFlags::RDONLY, c"")
            .map_err(|e| mount_err("remount root read-only", Path::new("/"), e))?;
    } else if spec.read_only_root {
        for name in top_dirs {
            let inside = Path::new("/").join(name);
            // A volume mounted right there (an emptyDir at /tmp) keeps its
            // own mode, as with a kubelet: only the root itself is read-only.
            if mounts.iter().any(|m| Path::new(&m.target) == inside) {
                continue;
            }
            rustix::mount::mount_remount(&inside, MountFlags::BIND | MountFlags::RDONLY, c"")
                .map_err(|e| mount_err("remount read-only", &inside, e))?;
        }
        rustix::mount::mount_remount("/", MountFlags::RDONLY | MountFlags::NOSUID, c"mode=755")
            .map_err(|e| mount_err("remount root read-only", Path::new("/"), e))?;
    }

    rustix::system::sethostname(spec.hostname.as_bytes())
        .map_err(|e| Error::Setup(format!("sethostname {}: {e}", spec.hostname)))?;
    let wd = spec.workdir.clone().unwrap_or_else(|| "/".into());
    std::env::set_current_dir(&wd).at(&wd)?;

    drop_privileges(spec)?;
    let mut cmd = std::process::Command::new(&spec.program);
    cmd.arg0(&spec.arg0).args(&spec.args).env_clear();
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    Ok(cmd)
}
