//! Why a reconcile fails: one error type for every controller, each
//! variant in a bounded category (a metric label, an event reason).
//! Imports nothing of the controller.

/// Why a reconcile failed. Each variant maps to a bounded [`Error::category`]
/// used as a metric label and an event reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A Redis instance could not be observed or changed.
    #[error("redis: {0}")]
    Redis(#[from] crate::redis::Error),
    /// An object we would create exists and belongs to someone else.
    #[error(
        "{kind} {name} already exists and belongs to {owner}, not this Redis; nothing was written to it (rename the Redis, or remove or rename the {kind})"
    )]
    Conflict {
        /// Kind of the object.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Who holds it ([`holder`]).
        owner: String,
    },
    /// `spec.image` names a repository the operator may not run (see
    /// [`super::images::Images::allows`]).
    #[error("{0}")]
    ImageNotAllowed(String),
    /// The auth Secret named by the spec is missing or lacks its key.
    #[error("secret {name}: {reason}")]
    Secret {
        /// Secret name.
        name: String,
        /// What is wrong (never the value).
        reason: String,
    },
    /// An object could not be serialised.
    #[error("serialising {0}: {1}")]
    Serialize(&'static str, serde_json::Error),
    /// The OS random source failed.
    #[error("generating a password: {0}")]
    Random(String),
    /// The object lacks a namespace or name.
    #[error("object without {0}")]
    Incomplete(&'static str),
    /// A certificate could not be made (never a key's bytes).
    #[error("certificate: {0}")]
    Certificate(String),
    /// A stored backup could not be reached or changed.
    #[error("{message}")]
    Backup {
        /// The agent's bounded category.
        category: &'static str,
        /// What happened (never a secret).
        message: String,
    },
}

/// Who holds an object this operator will not write: its controller
/// (`Kind name`), else its first owner, else that it has none.
pub fn holder(meta: &kube::api::ObjectMeta) -> String {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    match refs
        .iter()
        .find(|o| o.controller == Some(true))
        .or(refs.first())
    {
        Some(o) => format!("{} {}", o.kind, o.name),
        None => "no owner (made by hand or by another tool)".into(),
    }
}

impl Error {
    /// A bounded, stable category for metrics and events.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kubernetes",
            Error::Redis(e) => redis_category(e),
            Error::Conflict { .. } => "conflict",
            Error::ImageNotAllowed(_) => "image",
            Error::Secret { .. } => "secret",
            Error::Serialize(..) => "internal",
            Error::Random(_) => "internal",
            Error::Incomplete(_) => "internal",
            Error::Backup { .. } => "backup_store",
            Error::Certificate(_) => "certificate",
        }
    }
}

/// The bounded category of a data-plane error, for metrics and conditions.
pub fn redis_category(e: &crate::redis::Error) -> &'static str {
    match e.category() {
        crate::redis::ErrorCategory::Auth => "redis_auth",
        crate::redis::ErrorCategory::Timeout | crate::redis::ErrorCategory::Connection => {
            "redis_unreachable"
        }
        _ => "redis",
    }
}
