//! Real OCI images, pulled from a registry the test ground runs on loopback.
//!
//! An image reference whose registry is a loopback address with a port
//! (`127.0.0.1:5100/redpilot/redpilot@sha256:…`, `localhost:5100/…`) is not
//! looked up in `dev/images.yaml`: the node pulls it with `crane` (the
//! go-containerregistry client, `bin/crane`), unpacks its flattened file
//! system once per digest into `<state>/images/<digest>/rootfs`, and the
//! container runs in that root (an overlay with a writable layer per
//! container, see launch.rs) with the image's entrypoint, command,
//! environment, user and working directory, as a kubelet would. A missing
//! library or a wrong path in the image then fails the container, as on a
//! real node.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// An image unpacked on this node.
#[derive(Debug, Clone, PartialEq)]
pub struct OciImage {
    pub digest: String,
    pub rootfs: PathBuf,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `User` of the image config: `UID`, `UID:GID` or a name (resolved in
    /// the image's /etc/passwd).
    pub user: Option<String>,
    pub workdir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Config,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Config {
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    working_dir: Option<String>,
}

/// Whether the reference names a registry on loopback (`host:port/…` with
/// host 127.x.y.z or localhost).
pub fn is_registry_ref(image: &str) -> bool {
    let Some((host, rest)) = image.split_once('/') else {
        return false;
    };
    if rest.is_empty() {
        return false;
    }
    let Some((name, port)) = host.rsplit_once(':') else {
        return false;
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    name == "localhost"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// The repository part of a reference (without tag or digest).
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => no_digest,
    }
}

async fn crane(crane: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = tokio::process::Command::new(crane)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("running {}: {e}", crane.display()))?;
    if !out.status.success() {
        return Err(format!(
            "crane {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// Pulls and unpacks `image` (once per digest) under `cache`.
pub async fn pull(crane_bin: &Path, cache: &Path, image: &str) -> Result<OciImage, String> {
    if !crane_bin.exists() {
        return Err(format!(
            "pulling {image} needs {} (make tools-image)",
            crane_bin.display()
        ));
    }
    let digest = String::from_utf8_lossy(&crane(crane_bin, &["digest", image]).await?)
        .trim()
        .to_string();
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("{image}: unexpected digest {digest:?}"))?
        .to_string();
    let pinned = format!("{}@{digest}", repository(image));
    let dir = cache.join(&hex);
    if !dir.join(".complete").exists() {
        let tmp = cache.join(format!("{hex}.tmp.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let rootfs = tmp.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(|e| format!("{}: {e}", rootfs.display()))?;
        let config = crane(crane_bin, &["config", &pinned]).await?;
        std::fs::write(tmp.join("config.json"), &config)
            .map_err(|e| format!("writing the image config: {e}"))?;
        // The flattened file system (whiteouts applied) as one tar stream,
        // unpacked with owners and modes as the image has them.
        let script = "set -o pipefail; \"$0\" export \"$1\" - | tar -x --numeric-owner -C \"$2\"";
        let out = tokio::process::Command::new("bash")
            .args(["-c", script])
            .arg(crane_bin)
            .arg(&pinned)
            .arg(&rootfs)
            .output()
            .await
            .map_err(|e| format!("unpacking {pinned}: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(format!(
                "unpacking {pinned}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        std::fs::write(tmp.join(".complete"), b"").map_err(|e| format!("{e}"))?;
        // Another start may have unpacked the same digest meanwhile.
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        tracing::info!(image, %digest, "image pulled and unpacked");
    }
    let config = std::fs::read(dir.join("config.json")).map_err(|e| format!("{e}"))?;
    let cf: ConfigFile = serde_json::from_slice(&config)
        .map_err(|e| format!("{image}: the image config does not parse: {e}"))?;
    let c = cf.config;
    Ok(OciImage {
        digest,
        rootfs: dir.join("rootfs"),
        entrypoint: c.entrypoint.unwrap_or_default(),
        cmd: c.cmd.unwrap_or_default(),
        env: c
            .env
            .unwrap_or_default()
            .into_iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect(),
        user: c.user.filter(|u| !u.is_empty()),
        workdir: c.working_dir.filter(|w| !w.is_empty()),
    })
}

impl OciImage {
    /// The argument vector a container runs, the kubelet's way: `command`
    /// replaces the entrypoint (and drops the image's cmd), `args` replaces
    /// the cmd.
    pub fn argv(&self, command: &[String], args: &[String]) -> Vec<String> {
        let mut argv: Vec<String> = if command.is_empty() {
            self.entrypoint.clone()
        } else {
            command.to_vec()
        };
        if !args.is_empty() {
            argv.extend(args.iter().cloned());
        } else if command.is_empty() {
            argv.extend(self.cmd.iter().cloned());
        }
        argv
    }

    /// Where `program` is inside the image: itself when it has a slash,
    /// else the first match on `path` (the container's `PATH`).
    pub fn locate(&self, program: &str, path: &str) -> Option<String> {
        if program.contains('/') {
            return Some(program.to_string());
        }
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| format!("{}/{program}", d.trim_end_matches('/')))
            .find(|p| {
                let host = self.rootfs.join(p.trim_start_matches('/'));
                std::fs::metadata(host).is_ok_and(|m| m.is_file())
            })
    }

    /// The image's user as numeric IDs: a number is taken as it is, a name
    /// is looked up in the image's /etc/passwd (and /etc/group).
    pub fn user_ids(&self) -> Result<(Option<u32>, Option<u32>), String> {
        let Some(user) = &self.user else {
            return Ok((None, None));
        };
        let (u, g) = match user.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (user.as_str(), None),
        };
        let uid = match u.parse::<u32>() {
            Ok(n) => n,
            Err(_) => self
                .lookup("etc/passwd", u)
                .ok_or_else(|| format!("image user {u} is not in its /etc/passwd"))?,
        };
        let gid = match g {
            None => None,
            Some(g) => Some(match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => self
                    .lookup("etc/group", g)
                    .ok_or_else(|| format!("image group {g} is not in its /etc/group"))?,
            }),
        };
        Ok((Some(uid), gid))
    }

    fn lookup(&self, file: &str, name: &str) -> Option<u32> {
        let text = std::fs::read_to_string(self.rootfs.join(file)).ok()?;
        text.lines().find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(name)).then(|| f.nth(1)?.parse().ok())?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn only_loopback_registries_are_pulled() {
        assert!(is_registry_ref(
            "127.0.0.1:5100/redpilot/redpilot@sha256:ab"
        ));
        assert!(is_registry_ref("localhost:5000/a:1"));
        assert!(is_registry_ref("127.4.0.9:80/a"));
        assert!(!is_registry_ref("quay.io/redpilot/redpilot:0.2.0"));
        assert!(!is_registry_ref("redis:7.0"));
        assert!(!is_registry_ref("10.0.0.1:5000/a"));
        assert!(!is_registry_ref("localhost/a"));
        assert!(!is_registry_ref("127.0.0.1:5100/"));
    }

    #[test]
    fn the_repository_drops_tag_and_digest() {
        assert_eq!(repository("127.0.0.1:5100/a/b:1.0"), "127.0.0.1:5100/a/b");
        assert_eq!(
            repository("127.0.0.1:5100/a/b@sha256:00"),
            "127.0.0.1:5100/a/b"
        );
        assert_eq!(repository("127.0.0.1:5100/a/b"), "127.0.0.1:5100/a/b");
    }

    #[test]
    fn command_and_args_follow_the_kubelet() {
        let i = OciImage {
            digest: String::new(),
            rootfs: PathBuf::from("/nonexistent"),
            entrypoint: s(&["/bin/opm"]),
            cmd: s(&["serve", "/configs"]),
            env: vec![],
            user: None,
            workdir: None,
        };
        assert_eq!(i.argv(&[], &[]), s(&["/bin/opm", "serve", "/configs"]));
        assert_eq!(i.argv(&[], &s(&["version"])), s(&["/bin/opm", "version"]));
        assert_eq!(i.argv(&s(&["/bin/sh"]), &[]), s(&["/bin/sh"]));
        assert_eq!(
            i.argv(&s(&["/bin/sh"]), &s(&["-c", "x"])),
            s(&["/bin/sh", "-c", "x"])
        );
    }
}
