//! Backups: a consistent snapshot of one server streamed straight into an
//! S3-compatible object store, with a manifest beside it that makes the
//! backup self-describing (size, SHA-256, engine and version, keys, the
//! replication offset it was taken at).
//!
//! This is the agent's side (`redpilot backup`, run in a Job next to the
//! data, never in the operator process). The bytes flow from the server's
//! replication stream ([`crate::redis::rdb::stream_rdb`]) through a hasher
//! into a multipart upload; nothing is written to local disk and memory is
//! bounded by the part size times the uploads in flight
//! ([`agent::PART_SIZE`], [`agent::UPLOADS_IN_FLIGHT`]), whatever the size
//! of the dataset. The object appears under its name only when the upload
//! completes; a failed backup aborts its upload, so no partial object is
//! ever left under the final name.
//!
//! A restore ([`restore()`]) checks the manifest first, then streams the
//! object to the data directory, and keeps it only when its size and
//! SHA-256 match.

pub mod agent;
pub mod archive;
pub mod archiver;
pub mod manifest;
pub mod pitr;
pub mod restore;
pub mod store;

pub use agent::{BackupError, Source, backup};
pub use manifest::Manifest;
pub use restore::restore;
pub use store::{S3Target, open};
