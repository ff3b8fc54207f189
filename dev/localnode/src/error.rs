//! Error types of the local node.

use std::path::PathBuf;

/// Everything that can go wrong inside the local node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("image mapping {path}: {message}")]
    ImageMap { path: PathBuf, message: String },
    #[error("command `{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("pod network: {0}")]
    Network(String),
    #[error("volume {volume}: {message}")]
    Volume { volume: String, message: String },
    #[error("container config: {0}")]
    ContainerConfig(String),
    #[error("serialisation: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Setup(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a path to an I/O error.
pub trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            path: path.into(),
            source,
        })
    }
}
