//! Engine images from the operator's environment.
//!
//! OLM lists the Deployment's `RELATED_IMAGE_*` variables as the bundle's
//! related images, and a disconnected cluster mirrors them and rewrites the
//! variables to the mirror. So when `spec.image` is not set, the image of
//! engine `E` at version `V` is the value of `RELATED_IMAGE_<E>_<V>` (`E` is
//! `REDIS` or `VALKEY`, `V` the version with `.` and `-` written as `_`, e.g.
//! `RELATED_IMAGE_REDIS_7_0` for `version: "7.0"`), and only without such a
//! variable the public image (`redis:<V>`, `valkey/valkey:<V>`).
//!
//! The server container holds the Redis's password (in its environment)
//! and its TLS key (mounted): whoever chooses its image can read both. So a
//! `spec.image` runs only from an allowed repository ([`Images::allows`]):
//! those of `REDPILOT_ALLOWED_IMAGES` (comma-separated; a trailing `*`
//! allows a whole prefix), by default the official engine repositories
//! `redis` and `valkey/valkey`, and always those of the `RELATED_IMAGE_*`
//! variables (the mirrors OLM rewrites them to). Someone who may create a
//! Redis but not read Secrets cannot then read them through an image of
//! their own.

use std::collections::BTreeMap;

use crate::api::v1alpha1::{Engine, RedisSpec};

/// Prefix of the variables read.
pub const PREFIX: &str = "RELATED_IMAGE_";

/// The variable listing the repositories `spec.image` may name.
pub const ALLOWED_VAR: &str = "REDPILOT_ALLOWED_IMAGES";

/// The repositories `spec.image` may name when [`ALLOWED_VAR`] is unset:
/// the official engine images.
pub const DEFAULT_ALLOWED: &[&str] = &["redis", "valkey/valkey"];

/// A `RELATED_IMAGE_*` variable that cannot be an image reference.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("environment variable {name}: {reason}")]
pub struct InvalidImage {
    /// The variable's name.
    pub name: String,
    /// Why its value is refused.
    pub reason: &'static str,
}

/// The engine images the operator was given, keyed by variable name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Images {
    by_name: BTreeMap<String, String>,
    /// Repositories (or prefixes ending in `*`) `spec.image` may name,
    /// normalised ([`repository`]); `None`: [`DEFAULT_ALLOWED`].
    allowed: Option<Vec<String>>,
}

impl Images {
    /// Reads every `RELATED_IMAGE_*` variable of the process.
    pub fn from_env() -> Result<Self, InvalidImage> {
        Self::from_vars(std::env::vars())
    }

    /// Builds the table from `(name, value)` pairs, keeping those whose name
    /// starts with [`PREFIX`]. An empty value or one with whitespace is an
    /// error naming the variable: a typo there would otherwise surface only
    /// as pods that never pull.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, InvalidImage> {
        let mut by_name = BTreeMap::new();
        let mut allowed = None;
        for (name, value) in vars {
            if name == ALLOWED_VAR {
                allowed = Some(
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(repository)
                        .collect(),
                );
                continue;
            }
            if !name.starts_with(PREFIX) {
                continue;
            }
            let value = value.trim().to_string();
            if value.is_empty() {
                return Err(InvalidImage {
                    name,
                    reason: "empty; unset it to use the public image",
                });
            }
            if value.chars().any(char::is_whitespace) {
                return Err(InvalidImage {
                    name,
                    reason: "an image reference has no whitespace",
                });
            }
            by_name.insert(name, value);
        }
        Ok(Images { by_name, allowed })
    }

    /// Whether `spec.image` (when set) names an allowed repository; the
    /// refusal names the field, the image and how to allow it.
    pub fn allows(&self, spec: &RedisSpec) -> Result<(), String> {
        let Some(image) = &spec.image else {
            return Ok(());
        };
        let repo = repository(image);
        let listed: Vec<String> = match &self.allowed {
            Some(a) => a.clone(),
            None => DEFAULT_ALLOWED.iter().map(|r| r.to_string()).collect(),
        };
        let related = self.by_name.values().map(|v| repository(v));
        let ok = listed.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => repo.starts_with(prefix),
            None => *p == repo,
        }) || related.into_iter().any(|r| r == repo);
        if ok {
            return Ok(());
        }
        Err(format!(
            "spec.image: {image} is not from an allowed repository ({}, and the operator's \
             RELATED_IMAGE_* images); the server container holds the Redis's password and TLS \
             key, so it runs only images the operator's installer allowed ({ALLOWED_VAR})",
            listed.join(", ")
        ))
    }

    /// The variable that names the image of `engine` at `version`.
    pub fn variable(engine: Engine, version: &str) -> String {
        let engine = match engine {
            Engine::Redis => "REDIS",
            Engine::Valkey => "VALKEY",
        };
        let version: String = version
            .chars()
            .map(|c| match c {
                '.' | '-' => '_',
                c => c.to_ascii_uppercase(),
            })
            .collect();
        format!("{PREFIX}{engine}_{version}")
    }

    /// The container image for `spec`: `spec.image`, else the related image
    /// of its engine and version, else the public image.
    pub fn image_for(&self, spec: &RedisSpec) -> String {
        if let Some(image) = &spec.image {
            return image.clone();
        }
        self.by_name
            .get(&Self::variable(spec.engine(), spec.version()))
            .cloned()
            .unwrap_or_else(|| spec.image())
    }

    /// How many variables were read (for the start-up log).
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no variable was read.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The repository of an image reference, without tag or digest and with
/// Docker Hub's implied names folded (`docker.io/library/redis:7.0` and
/// `redis` are both `redis`).
pub fn repository(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or(image);
    let name = match no_digest.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => no_digest,
    };
    let name = name
        .strip_prefix("docker.io/")
        .or_else(|| name.strip_prefix("index.docker.io/"))
        .unwrap_or(name);
    name.strip_prefix("library/").unwrap_or(name).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_image_runs_only_from_an_allowed_repository() {
        let images = Images::default();
        let ok = |i: &Images, image: &str| i.allows(&spec(Engine::Redis, "7.0", Some(image)));
        assert_eq!(images.allows(&spec(Engine::Redis, "7.0", None)), Ok(()));
        for image in [
            "redis:7.0",
            "docker.io/library/redis:7.0",
            "docker.io/redis@sha256:abc",
            "valkey/valkey:8.1",
            "docker.io/valkey/valkey:9.0",
        ] {
            assert_eq!(ok(&images, image), Ok(()), "{image}");
        }
        for image in [
            "evil.example/redis:7.0",
            "redis-stealer:1",
            "valkey/valkey-fork:8.1",
            "registry.example:5000/redis:7.0",
        ] {
            let e = ok(&images, image).expect_err(image);
            assert!(e.starts_with(&format!("spec.image: {image} is not")), "{e}");
            assert!(e.contains("REDPILOT_ALLOWED_IMAGES"), "{e}");
        }
        // The installer's list replaces the default; a trailing * allows a
        // prefix; the related images (a mirror) are always allowed.
        let images = Images::from_vars(vars(&[
            (
                ALLOWED_VAR,
                "registry.example:5000/redis, mirror.example/engines/*",
            ),
            ("RELATED_IMAGE_REDIS_7_0", "quay.example/mirror/redis:7.0"),
        ]))
        .expect("vars");
        assert_eq!(ok(&images, "registry.example:5000/redis:7.2"), Ok(()));
        assert_eq!(ok(&images, "mirror.example/engines/valkey:8.1"), Ok(()));
        assert_eq!(ok(&images, "quay.example/mirror/redis:7.2"), Ok(()));
        assert!(ok(&images, "redis:7.0").is_err());
    }

    fn spec(engine: Engine, version: &str, image: Option<&str>) -> RedisSpec {
        RedisSpec {
            engine: Some(engine),
            version: Some(version.into()),
            image: image.map(str::to_string),
            ..Default::default()
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn variable_names_follow_engine_and_version() {
        assert_eq!(
            Images::variable(Engine::Redis, "7.0"),
            "RELATED_IMAGE_REDIS_7_0"
        );
        assert_eq!(
            Images::variable(Engine::Valkey, "8.1.4"),
            "RELATED_IMAGE_VALKEY_8_1_4"
        );
        assert_eq!(
            Images::variable(Engine::Redis, "7.2-rc1"),
            "RELATED_IMAGE_REDIS_7_2_RC1"
        );
    }

    #[test]
    fn related_image_wins_over_the_public_one_and_spec_image_over_both() {
        let images = Images::from_vars(vars(&[
            ("RELATED_IMAGE_REDIS_7_0", "mirror.local/redis:7.0"),
            (
                "RELATED_IMAGE_VALKEY_9_1",
                " mirror.local/valkey@sha256:ab ",
            ),
            ("PATH", "/usr/bin"),
        ]))
        .unwrap_or_default();
        assert_eq!(images.len(), 2);
        assert_eq!(
            images.image_for(&spec(Engine::Redis, "7.0", None)),
            "mirror.local/redis:7.0"
        );
        assert_eq!(
            images.image_for(&spec(Engine::Valkey, "9.1", None)),
            "mirror.local/valkey@sha256:ab"
        );
        // No variable for this version: the public image.
        assert_eq!(
            images.image_for(&spec(Engine::Redis, "6.2", None)),
            "redis:6.2"
        );
        assert_eq!(
            images.image_for(&spec(Engine::Redis, "7.0", Some("own/redis:1"))),
            "own/redis:1"
        );
        assert!(Images::default().is_empty());
    }

    #[test]
    fn unusable_values_are_refused_by_name() {
        let err = Images::from_vars(vars(&[("RELATED_IMAGE_REDIS_7_0", "  ")]));
        assert_eq!(
            err.map_err(|e| e.name),
            Err("RELATED_IMAGE_REDIS_7_0".to_string())
        );
        let err = Images::from_vars(vars(&[("RELATED_IMAGE_VALKEY_8_1", "a b")]));
        assert!(
            err.is_err_and(|e| e.to_string().contains("RELATED_IMAGE_VALKEY_8_1")
                && e.reason.contains("whitespace"))
        );
    }
}
