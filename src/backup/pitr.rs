//! Restoring to a point in time from a continuous archive: the newest base
//! before the time, then the archived stream up to the offset of the last
//! checkpoint at or before it, written as one append-only file (the
//! snapshot as its RDB preamble, then the commands) that the server loads
//! when it starts with `appendonly yes`: the server applies the commands
//! exactly as they were applied on the primary (no expiry runs while an
//! append-only file loads, as on a replica).
//!
//! The link's own commands (`PING`, `REPLCONF GETACK`) are left out; the
//! database selected at the base is selected first. The file is written to
//! `<dest>.partial` and renamed only when whole.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::agent::BackupError;
use super::archive::{self, Listing, PlanError};
use super::archiver::{self, get};
use super::restore::Loader;

/// What a restore to a time loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The time asked for (RFC 3339).
    pub point_in_time: String,
    /// The checkpoint the data is at: every write the primary executed
    /// before it is in, none after (RFC 3339, milliseconds).
    pub checkpoint: String,
    /// Its replication offset.
    pub offset: i64,
    /// The base loaded first, and its offset.
    pub base: String,
    /// Offset of the base.
    pub base_offset: i64,
    /// Its SHA-256 (checked against its manifest).
    pub sha256: String,
    /// Commands applied after the base.
    pub commands: u64,
    /// Bytes of the file written.
    pub size_bytes: u64,
    /// A Cluster Redis's shard: the slots its primary served at the
    /// checkpoint (the restored cluster's layout is made of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<String>,
}

/// The last checkpoint at or before `ms` among `checkpoints`.
pub fn checkpoint_at(checkpoints: &[(i64, i64)], ms: i64) -> Option<(i64, i64)> {
    checkpoints.iter().copied().rfind(|(t, _)| *t <= ms)
}

/// Writes the append-only file that restores line `prefix` of the archive
/// in `store` to `ms` into `dest`.
pub async fn restore_to(
    store: &dyn object_store::ObjectStore,
    location: &str,
    prefix: &str,
    ms: i64,
    dest: &Path,
    loader: Option<Loader>,
) -> Result<Outcome, BackupError> {
    let (listing, _) = archiver::list(store, location, prefix).await?;
    let plan = listing.plan(ms).map_err(not_restorable)?;
    let last = get(store, location, &plan.last.key).await?;
    let (header, _) = archive::split_segment(&last).map_err(BackupError::Invalid)?;
    let (at, target) = checkpoint_at(&header.checkpoints, ms).ok_or_else(|| {
        not_restorable(PlanError::OutOfWindow(format!(
            "{} precedes the checkpoints of {}",
            archive::show_ms(ms),
            plan.last.key
        )))
    })?;
    let next = next_checkpoint(store, location, &listing, &plan.last, &header, ms).await?;
    archive::placed(ms, (at, target), next).map_err(not_restorable)?;
    let slots = shard_slots(&header.layout, at, &plan.last.key)?;
    if target < plan.base.offset {
        return Err(not_restorable(PlanError::Hole(format!(
            "the base {} is at offset {}, past the target's {target}",
            plan.base.key, plan.base.offset
        ))));
    }
    let partial = with_suffix(dest, ".partial");
    let rdb = with_suffix(dest, ".partial.rdb");
    let manifest = super::restore::restore(store, location, &plan.base.key, &rdb, loader).await?;
    tokio::fs::rename(&rdb, &partial)
        .await
        .map_err(|e| io("renaming", &partial, e))?;
    let mut file = tokio::fs::OpenOptions::new()
        .append(true)
        .open(&partial)
        .await
        .map_err(|e| io("opening", &partial, e))?;
    let db = archiver::db_at(store, location, &listing, &plan.base.run, plan.base.offset).await?;
    if db != 0 {
        let select = format!(
            "*2\r\n$6\r\nSELECT\r\n${}\r\n{db}\r\n",
            db.to_string().len()
        );
        file.write_all(select.as_bytes())
            .await
            .map_err(|e| io("writing", &partial, e))?;
    }
    let mut commands = 0u64;
    let mut offset = plan.base.offset;
    for (seg, cut) in &plan.pieces {
        let cut = (*cut).min(target);
        if cut <= offset {
            continue;
        }
        let body = get(store, location, &seg.key).await?;
        let (h, bytes) = archive::split_segment(&body).map_err(BackupError::Invalid)?;
        let from = usize::try_from(offset - h.start).unwrap_or(usize::MAX);
        let to = usize::try_from(cut - h.start).unwrap_or(usize::MAX);
        let slice = bytes.get(from..to).ok_or_else(|| {
            BackupError::Invalid(format!(
                "segment {} holds {}..{}, not {offset}..{cut}",
                seg.key, h.start, h.end
            ))
        })?;
        let mut out: Vec<u8> = Vec::with_capacity(slice.len());
        let mut sel = 0;
        let used = archive::scan(slice, &mut sel, |c| {
            if !archive::link_only(&c.name) {
                out.extend_from_slice(c.raw);
                commands += 1;
            }
        })
        .map_err(|e| BackupError::Invalid(format!("segment {}: {e}", seg.key)))?;
        if used != slice.len() {
            return Err(BackupError::Invalid(format!(
                "segment {} ends inside a command at offset {}",
                seg.key,
                offset + used as i64
            )));
        }
        file.write_all(&out)
            .await
            .map_err(|e| io("writing", &partial, e))?;
        offset = cut;
    }
    if offset != target {
        return Err(not_restorable(PlanError::Hole(format!(
            "the archive holds the stream up to offset {offset}, short of {target}"
        ))));
    }
    file.sync_all()
        .await
        .map_err(|e| io("syncing", &partial, e))?;
    let size = file
        .metadata()
        .await
        .map_err(|e| io("reading", &partial, e))?
        .len();
    drop(file);
    tokio::fs::rename(&partial, dest)
        .await
        .map_err(|e| io("renaming", dest, e))?;
    Ok(Outcome {
        point_in_time: archive::show_ms(ms),
        checkpoint: archive::show_ms(at),
        offset: target,
        base: plan.base.key.clone(),
        base_offset: plan.base.offset,
        sha256: manifest.sha256,
        commands,
        size_bytes: size,
        slots,
    })
}

/// The first checkpoint after `ms`: in `last`'s own header when it has
/// one past `ms`, else the first of the next segment (its offset only when
/// that segment is of the same run, read from its header).
async fn next_checkpoint(
    store: &dyn object_store::ObjectStore,
    location: &str,
    listing: &Listing,
    last: &archive::SegmentKey,
    header: &archive::SegmentHeader,
    ms: i64,
) -> Result<Option<archive::NextCheckpoint>, BackupError> {
    if let Some((t, o)) = header.checkpoints.iter().find(|(t, _)| *t > ms) {
        return Ok(Some(archive::NextCheckpoint {
            ms: *t,
            offset: Some(*o),
        }));
    }
    let Some(seg) = listing.segment_after(ms) else {
        return Ok(None);
    };
    if seg.run != last.run {
        return Ok(Some(archive::NextCheckpoint {
            ms: seg.t0,
            offset: None,
        }));
    }
    let body = get(store, location, &seg.key).await?;
    let (h, _) = archive::split_segment(&body).map_err(BackupError::Invalid)?;
    Ok(h.checkpoints
        .iter()
        .find(|(t, _)| *t > ms)
        .map(|(t, o)| archive::NextCheckpoint {
            ms: *t,
            offset: Some(*o),
        }))
}

/// A shard's slots at the checkpoint `at` (`None` for a line that is not
/// a shard's). Refused while slots were open: part of a moving slot's
/// keys was on the other shard, and the two shards' checkpoints are not
/// the same instant.
fn shard_slots(
    layout: &[archive::LayoutMark],
    at: i64,
    segment: &str,
) -> Result<Option<String>, BackupError> {
    if layout.is_empty() {
        return Ok(None);
    }
    let mark = archive::layout_at(layout, at).ok_or_else(|| {
        BackupError::Invalid(format!(
            "segment {segment} records no slots at its checkpoint {}",
            archive::show_ms(at)
        ))
    })?;
    if mark.moving {
        return Err(not_restorable(PlanError::OutOfWindow(format!(
            "at the checkpoint {} slots were moving between this shard and another (a resharding, slots {}): a Cluster Redis restores to a time outside its reshardings; choose one before it began or after it ended",
            archive::show_ms(at),
            if mark.slots.is_empty() {
                "none"
            } else {
                mark.slots.as_str()
            }
        ))));
    }
    Ok(Some(mark.slots.clone()))
}

/// The window a line of the archive can restore, and its holes.
pub async fn window(
    store: &dyn object_store::ObjectStore,
    location: &str,
    prefix: &str,
) -> Result<(Listing, Option<(i64, i64)>), BackupError> {
    let (listing, _) = archiver::list(store, location, prefix).await?;
    let w = listing.window();
    Ok((listing, w))
}

fn not_restorable(e: PlanError) -> BackupError {
    BackupError::NotRestorable(e.to_string())
}

fn with_suffix(p: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    std::path::PathBuf::from(s)
}

fn io(what: &str, p: &Path, e: std::io::Error) -> BackupError {
    BackupError::Invalid(format!("{what} {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_restores_outside_a_resharding_only() {
        use archive::LayoutMark;
        let mark = |at, slots: &str, moving| LayoutMark {
            at,
            slots: slots.into(),
            moving,
        };
        let layout = [
            mark(1000, "0-5460", false),
            mark(1200, "0-5460", true),
            mark(1500, "0-4095", false),
        ];
        assert_eq!(shard_slots(&[], 1100, "s").unwrap(), None);
        assert_eq!(
            shard_slots(&layout, 1100, "s").unwrap().as_deref(),
            Some("0-5460")
        );
        assert_eq!(
            shard_slots(&layout, 1600, "s").unwrap().as_deref(),
            Some("0-4095")
        );
        match shard_slots(&layout, 1300, "s") {
            Err(BackupError::NotRestorable(m)) => {
                assert!(m.contains("slots were moving"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            shard_slots(&layout, 900, "s"),
            Err(BackupError::Invalid(_))
        ));
    }

    #[test]
    fn the_checkpoint_is_the_last_at_or_before_the_time() {
        let c = [(1000, 10), (1100, 20), (1200, 30)];
        assert_eq!(checkpoint_at(&c, 1150), Some((1100, 20)));
        assert_eq!(checkpoint_at(&c, 1200), Some((1200, 30)));
        assert_eq!(checkpoint_at(&c, 999), None);
    }
}
