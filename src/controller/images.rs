//! Engine images from the operator's environment.
//!
//! OLM lists the Deployment's `RELATED_IMAGE_*` variables as the bundle's
//! related images, and a disconnected cluster mirrors them and rewrites the
//! variables to the mirror. So when `spec.image` is not set, the image of
//! engine `E` at version `V` is the value of `RELATED_IMAGE_<E>_<V>` (`E` is
//! `REDIS` or `VALKEY`, `V` the version with `.` and `-` written as `_`, e.g.
//! `RELATED_IMAGE_REDIS_7_0` for `version: "7.0"`), and only without such a
//! variable the public image (`redis:<V>`, `valkey/valkey:<V>`).

use std::collections::BTreeMap;

use crate::api::v1alpha1::{Engine, RedisSpec};

/// Prefix of the variables read.
pub const PREFIX: &str = "RELATED_IMAGE_";

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
        for (name, value) in vars {
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
        Ok(Images { by_name })
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

#[cfg(test)]
mod tests {
    use super::*;

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
