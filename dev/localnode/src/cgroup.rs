//! Memory limits through the cgroup v1 memory controller, as a container
//! runtime applies them for the kubelet.
//!
//! Layout: `/sys/fs/cgroup/memory/<prefix>/<pod-id>/<container>` (prefix:
//! the node's host-object prefix, `rp` by default; pod id: the first 12 hex
//! digits of the pod UID, like the network namespace). The pod directory
//! carries the pod-level limit (the sum of the containers' limits when every
//! container has one, as the kubelet sets it), each container directory the
//! container's `limits.memory`. A container's process joins its directory
//! before it execs its program (`exec-container` writes its pid to
//! `cgroup.procs`), so everything it forks is charged there too. The OOM
//! killer's `oom_kill` counter tells an OOM kill from any other SIGKILL.
//!
//! Without a writable v1 memory controller (a cgroup v2 host, no root), the
//! node logs one warning and runs pods without enforcement.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the v1 memory controller is mounted.
pub const MEMORY_MOUNT: &str = "/sys/fs/cgroup/memory";

/// The node's memory cgroups (or none, when the controller is unavailable).
#[derive(Debug, Clone)]
pub struct Memory {
    /// `<mount>/<prefix>`; `None`: no enforcement.
    root: Option<PathBuf>,
}

impl Memory {
    /// Sets up `<mount>/<prefix>`, or logs once why limits are not enforced.
    pub fn new(prefix: &str) -> Self {
        Self::at(Path::new(MEMORY_MOUNT), prefix)
    }

    fn at(mount: &Path, prefix: &str) -> Self {
        if !mount.join("memory.limit_in_bytes").exists() {
            tracing::warn!(
                mount = %mount.display(),
                "no cgroup v1 memory controller: memory limits are reported but not enforced"
            );
            return Self { root: None };
        }
        let root = mount.join(prefix);
        match std::fs::create_dir_all(&root) {
            Ok(()) => Self { root: Some(root) },
            Err(e) => {
                tracing::warn!(
                    dir = %root.display(), error = %e,
                    "cannot create the node's memory cgroup: memory limits are reported but not enforced"
                );
                Self { root: None }
            }
        }
    }

    pub fn pod_dir(&self, pod_id: &str) -> Option<PathBuf> {
        self.root.as_ref().map(|r| r.join(pod_id))
    }

    /// Removes a pod's cgroups; whatever still runs in them is killed first.
    pub async fn remove_pod(&self, pod_id: &str) {
        if let Some(dir) = self.pod_dir(pod_id) {
            remove_tree(&dir).await;
        }
    }
}

/// Creates a cgroup directory (and its parents).
pub fn ensure(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)
}

/// Writes `memory.limit_in_bytes`; `None` is unlimited.
pub fn set_limit(dir: &Path, limit: Option<i64>) -> io::Result<()> {
    let value = limit.map_or_else(|| "-1".to_string(), |l| l.to_string());
    std::fs::write(dir.join("memory.limit_in_bytes"), value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

fn read_number(dir: &Path, file: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `memory.usage_in_bytes`: what the cgroup is charged now (RSS and cache).
pub fn usage(dir: &Path) -> Option<i64> {
    read_number(dir, "memory.usage_in_bytes").and_then(|v| i64::try_from(v).ok())
}

/// How often the OOM killer has struck in this cgroup: the `oom_kill`
/// line of `memory.oom_control` (kernels since 4.13), or else how often the
/// limit was hit (`memory.failcnt`).
pub fn oom_events(dir: &Path) -> Option<u64> {
    let control = std::fs::read_to_string(dir.join("memory.oom_control")).ok()?;
    parse_oom_kill(&control).or_else(|| read_number(dir, "memory.failcnt"))
}

fn parse_oom_kill(control: &str) -> Option<u64> {
    control
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// Moves a process (and its threads) into the cgroup.
pub fn add_process(dir: &Path, pid: u32) -> io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), pid.to_string())
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills every process in a cgroup tree, then removes its directories,
/// deepest first. Best effort: failures are logged.
pub async fn remove_tree(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let mut dirs = Vec::new();
    collect_dirs(dir, &mut dirs);
    // Deepest first: a cgroup with children cannot be removed.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for d in &dirs {
        loop {
            let pids = procs(d);
            for pid in &pids {
                if let Some(p) = rustix::process::Pid::from_raw(*pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
            // A cgroup whose last process has just exited can still be busy
            // for a moment.
            match std::fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => {
                    if tokio::time::Instant::now() >= deadline {
                        tracing::warn!(dir = %d.display(), error = %e, ?pids, "cannot remove cgroup");
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

/// Removes every cgroup of a node (`<mount>/<prefix>`), at start-up, stop
/// and `localnode cleanup`.
pub async fn cleanup_all(prefix: &str) {
    remove_tree(&Path::new(MEMORY_MOUNT).join(prefix)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kill_counter_is_read_from_oom_control() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_oom_kill(text), Some(3));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n"), None);
    }

    #[test]
    fn a_missing_controller_disables_enforcement() {
        let dir = std::env::temp_dir().join(format!("localnode-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let m = Memory::at(&dir, "rp");
        assert_eq!(m.pod_dir("abc"), None);
        std::fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712").expect("write");
        let m = Memory::at(&dir, "rp");
        assert_eq!(m.pod_dir("abc"), Some(dir.join("rp/abc")));
        assert!(dir.join("rp").is_dir(), "the node's directory is created");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
