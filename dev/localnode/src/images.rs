//! Maps container images to local executables (the checked-in `dev/images.yaml`).
//!
//! The node has no container runtime: an image only selects which local
//! programs a container may run. Each entry names the image's entrypoint (the
//! program the image runs when the pod gives no command) and the programs the
//! image provides; those are linked into `/.image/bin` inside the container's
//! root, which comes first on the default `PATH`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use serde::Deserialize;

use crate::error::{Error, IoContext, Result};

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MapFile {
    images: Vec<Entry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    patterns: Vec<String>,
    entrypoint: String,
    binaries: BTreeMap<String, String>,
    /// Environment variables that, when set, override a binary's path.
    #[serde(default)]
    override_env: BTreeMap<String, String>,
    /// redis.conf lines the image bakes in (the official images compile
    /// protected mode off); put in front of the pod's own configuration.
    #[serde(default)]
    default_config: Vec<String>,
    /// Arguments that mean "run the entrypoint" when they start the
    /// command line (besides any argument starting with `-`).
    #[serde(default)]
    entrypoint_arg_suffixes: Vec<String>,
}

/// The loaded image mapping. It is read again when the file changes (seen
/// at the next container start), so a mapping can be added or removed
/// without restarting the node; a file that no longer parses is reported
/// and the previous mapping kept.
#[derive(Debug)]
pub struct ImageMap {
    path: PathBuf,
    repo: PathBuf,
    loaded: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    /// Modification time and length of the file that was read.
    stamp: Option<(SystemTime, u64)>,
    entries: Vec<Entry>,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// What an image resolved to.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedImage {
    pub entrypoint: String,
    /// Program name → absolute host path.
    pub binaries: BTreeMap<String, PathBuf>,
    pub default_config: Vec<String>,
    pub entrypoint_arg_suffixes: Vec<String>,
    /// A real image pulled from a loopback registry (oci.rs): the container
    /// runs in its root file system, not the host's.
    pub oci: Option<crate::oci::OciImage>,
}

impl ResolvedImage {
    pub fn from_oci(oci: crate::oci::OciImage) -> Self {
        Self {
            entrypoint: String::new(),
            binaries: BTreeMap::new(),
            default_config: Vec::new(),
            entrypoint_arg_suffixes: Vec::new(),
            oci: Some(oci),
        }
    }
}

/// Why an image cannot run here (shown as the container's waiting message).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error(
        "localnode has no local executable for image \"{image}\": add a pattern to {map} (known: {known})"
    )]
    Unmapped {
        image: String,
        map: String,
        known: String,
    },
    #[error(
        "image \"{image}\" maps {program} to {path}, which does not exist or is not executable ({map})"
    )]
    Missing {
        image: String,
        program: String,
        path: String,
        map: String,
    },
    #[error("pulling image \"{image}\": {message}")]
    Pull { image: String, message: String },
}

impl ImageMap {
    pub fn load(path: &Path, repo: &Path) -> Result<Self> {
        let stamp = stamp(path);
        let entries = Self::parse(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            repo: repo.to_path_buf(),
            loaded: RwLock::new(Loaded { stamp, entries }),
        })
    }

    /// Reads the file again if it changed since it was last read.
    fn refresh(&self) {
        let now = stamp(&self.path);
        if self.loaded.read().is_ok_and(|l| l.stamp == now) {
            return;
        }
        let Ok(mut loaded) = self.loaded.write() else {
            return;
        };
        if loaded.stamp == now {
            return;
        }
        loaded.stamp = now;
        match Self::parse(&self.path) {
            Ok(entries) => {
                tracing::info!(path = %self.path.display(), images = entries.len(), "image mapping reloaded");
                loaded.entries = entries;
            }
            Err(e) => {
                tracing::warn!(error = %e, "image mapping changed but cannot be used; keeping the previous one")
            }
        }
    }

    fn parse(path: &Path) -> Result<Vec<Entry>> {
        let text = std::fs::read_to_string(path).at(path)?;
        let file: MapFile = serde_yaml::from_str(&text).map_err(|e| Error::ImageMap {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        for e in &file.images {
            if !e.binaries.contains_key(&e.entrypoint) {
                return Err(Error::ImageMap {
                    path: path.to_path_buf(),
                    message: format!(
                        "entry {:?}: entrypoint {} is not among its binaries",
                        e.patterns, e.entrypoint
                    ),
                });
            }
        }
        Ok(file.images)
    }

    /// The repository the mapping's `{repo}` stands for.
    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// Resolves an image reference to local programs.
    pub fn resolve(&self, image: &str) -> Result<ResolvedImage, ImageError> {
        self.refresh();
        let loaded = self
            .loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entries = &loaded.entries;
        let norm = normalize(image);
        let Some(entry) = entries
            .iter()
            .find(|e| e.patterns.iter().any(|p| glob(&normalize(p), &norm)))
        else {
            let known = entries
                .iter()
                .flat_map(|e| e.patterns.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ImageError::Unmapped {
                image: image.to_string(),
                map: self.path.display().to_string(),
                known,
            });
        };
        let mut binaries = BTreeMap::new();
        for (name, raw) in &entry.binaries {
            let raw = entry
                .override_env
                .get(name)
                .and_then(|var| std::env::var(var).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| raw.clone());
            let expanded = raw.replace("{repo}", &self.repo.to_string_lossy());
            let mut path = PathBuf::from(expanded);
            if path.is_relative() {
                path = self.repo.join(path);
            }
            if !is_executable(&path) {
                return Err(ImageError::Missing {
                    image: image.to_string(),
                    program: name.clone(),
                    path: path.display().to_string(),
                    map: self.path.display().to_string(),
                });
            }
            binaries.insert(name.clone(), path);
        }
        Ok(ResolvedImage {
            entrypoint: entry.entrypoint.clone(),
            binaries,
            default_config: entry.default_config.clone(),
            entrypoint_arg_suffixes: entry.entrypoint_arg_suffixes.clone(),
            oci: None,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Normalises an image reference: drops a digest, the default registry and
/// `library/`, and adds `:latest` when there is no tag.
pub fn normalize(image: &str) -> String {
    let image = image.split('@').next().unwrap_or(image);
    let mut s = image;
    for prefix in ["docker.io/", "index.docker.io/", "registry-1.docker.io/"] {
        if let Some(rest) = s.strip_prefix(prefix) {
            s = rest;
        }
    }
    let s = s.strip_prefix("library/").unwrap_or(s);
    let last = s.rsplit('/').next().unwrap_or(s);
    if last.contains(':') || last.contains('*') {
        s.to_string()
    } else {
        format!("{s}:latest")
    }
}

/// Glob match where `*` matches any run of characters (including none).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The program a container runs, decided from the image and the pod's
/// command/args the way the Redis, Valkey and exporter images behave.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// argv\[0\] as the program sees it.
    pub arg0: String,
    /// The path to execute inside the container root.
    pub program: String,
    pub args: Vec<String>,
}

/// Where image programs appear inside the container.
pub const IMAGE_BIN: &str = "/.image/bin";

impl ResolvedImage {
    /// Decides what to execute.
    ///
    /// * no command: the image's entrypoint runs with the args, unless the
    ///   first arg names another program of the image (`redis-server`,
    ///   `redis-sentinel`, …) or something else entirely (`sh`), which then
    ///   runs as given — what `docker-entrypoint.sh` does;
    /// * command `docker-entrypoint.sh …`: the same, with the rest of the
    ///   command followed by the args;
    /// * a command naming one of the image's programs (by base name, with
    ///   or without a directory): that program;
    /// * any other command runs as given (looked up on `PATH`).
    pub fn invocation(&self, command: &[String], args: &[String]) -> Invocation {
        let image_prog = |name: &str| format!("{IMAGE_BIN}/{name}");
        let entrypoint_style = |words: Vec<String>| -> Invocation {
            match words.split_first() {
                None => Invocation {
                    arg0: self.entrypoint.clone(),
                    program: image_prog(&self.entrypoint),
                    args: vec![],
                },
                Some((first, rest)) => {
                    let base = basename(first);
                    if self.binaries.contains_key(base) {
                        Invocation {
                            arg0: base.to_string(),
                            program: image_prog(base),
                            args: rest.to_vec(),
                        }
                    } else if first.starts_with('-')
                        || self
                            .entrypoint_arg_suffixes
                            .iter()
                            .any(|s| first.ends_with(s.as_str()))
                    {
                        Invocation {
                            arg0: self.entrypoint.clone(),
                            program: image_prog(&self.entrypoint),
                            args: words.clone(),
                        }
                    } else {
                        Invocation {
                            arg0: first.clone(),
                            program: first.clone(),
                            args: rest.to_vec(),
                        }
                    }
                }
            }
        };
        match command.split_first() {
            None => entrypoint_style(args.to_vec()),
            Some((first, rest)) if basename(first) == "docker-entrypoint.sh" => {
                let mut words = rest.to_vec();
                words.extend(args.iter().cloned());
                entrypoint_style(words)
            }
            Some((first, rest)) => {
                let base = basename(first);
                let mut all = rest.to_vec();
                all.extend(args.iter().cloned());
                if self.binaries.contains_key(base) {
                    Invocation {
                        arg0: base.to_string(),
                        program: image_prog(base),
                        args: all,
                    }
                } else {
                    Invocation {
                        arg0: first.clone(),
                        program: first.clone(),
                        args: all,
                    }
                }
            }
        }
    }

    /// True when the invocation runs a server that reads redis.conf style
    /// options (so `default_config` applies).
    pub fn takes_default_config(&self, inv: &Invocation) -> bool {
        !self.default_config.is_empty()
            && inv.program.starts_with(IMAGE_BIN)
            && inv.arg0.ends_with("-server")
    }
}

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img() -> ResolvedImage {
        let mut binaries = BTreeMap::new();
        binaries.insert("redis-server".into(), PathBuf::from("/x/redis-server"));
        binaries.insert("redis-cli".into(), PathBuf::from("/x/redis-cli"));
        ResolvedImage {
            entrypoint: "redis-server".into(),
            binaries,
            default_config: vec!["protected-mode no".into()],
            entrypoint_arg_suffixes: vec![".conf".into()],
            oci: None,
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn normalizes_references() {
        assert_eq!(normalize("redis"), "redis:latest");
        assert_eq!(normalize("docker.io/library/redis:7.0"), "redis:7.0");
        assert_eq!(
            normalize("valkey/valkey:8.1@sha256:ab"),
            "valkey/valkey:8.1"
        );
        assert_eq!(normalize("localhost:5000/x"), "localhost:5000/x:latest");
    }

    #[test]
    fn globs() {
        assert!(glob("redis:7.0*", "redis:7.0.15"));
        assert!(glob("redis:7.0*", "redis:7.0"));
        assert!(!glob("redis:7.0*", "redis:7.2"));
        assert!(glob("valkey/valkey:8*", "valkey/valkey:8.1-alpine"));
        assert!(glob(
            "*redis_exporter:*",
            "quay.io/oliver006/redis_exporter:v1"
        ));
        assert!(!glob("redis:6.2*", "xredis:6.2"));
    }

    #[test]
    fn the_mapping_is_read_again_when_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("localnode-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("images.yaml");
        let one =
            "images:\n  - patterns: [\"a:*\"]\n    entrypoint: sh\n    binaries: {sh: /bin/sh}\n";
        std::fs::write(&file, one).unwrap();
        let map = ImageMap::load(&file, &dir).unwrap();
        assert!(map.resolve("a:1").is_ok());
        assert!(matches!(
            map.resolve("b:1"),
            Err(ImageError::Unmapped { .. })
        ));
        let two = format!(
            "{one}  - patterns: [\"b:*\"]\n    entrypoint: sh\n    binaries: {{sh: /bin/sh}}\n"
        );
        std::fs::write(&file, two).unwrap();
        assert!(map.resolve("b:1").is_ok());
        // A broken file keeps the mapping in force.
        std::fs::write(&file, "images: [oops").unwrap();
        assert!(map.resolve("b:1").is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn invocations() {
        let i = img();
        let inv = i.invocation(&[], &[]);
        assert_eq!(inv.program, "/.image/bin/redis-server");
        let inv = i.invocation(&s(&["redis-server"]), &s(&["/etc/redis/redis.conf"]));
        assert_eq!(inv.program, "/.image/bin/redis-server");
        assert_eq!(inv.args, s(&["/etc/redis/redis.conf"]));
        let inv = i.invocation(&s(&["/usr/local/bin/redis-server", "--port", "1"]), &[]);
        assert_eq!(inv.program, "/.image/bin/redis-server");
        assert_eq!(inv.args, s(&["--port", "1"]));
        let inv = i.invocation(&[], &s(&["--port", "1"]));
        assert_eq!(inv.program, "/.image/bin/redis-server");
        assert_eq!(inv.args, s(&["--port", "1"]));
        let inv = i.invocation(&[], &s(&["/etc/r.conf"]));
        assert_eq!(inv.arg0, "redis-server");
        let inv = i.invocation(&s(&["docker-entrypoint.sh"]), &s(&["redis-cli", "ping"]));
        assert_eq!(inv.program, "/.image/bin/redis-cli");
        let inv = i.invocation(&s(&["sh", "-c", "echo hi"]), &[]);
        assert_eq!(inv.program, "sh");
        assert_eq!(inv.args, s(&["-c", "echo hi"]));
        assert!(i.takes_default_config(&i.invocation(&[], &[])));
        assert!(!i.takes_default_config(&i.invocation(&s(&["redis-cli"]), &[])));
    }
}
