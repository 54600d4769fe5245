//! A store directory: numbered snapshot files and the `CURRENT` manifest that names the
//! live one, as tantivy's `meta.json` does. The manifest is replaced atomically, last, so
//! a crash at any point leaves it naming a complete snapshot (or none).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::faults::DurableFile;
use super::fs::{DirLock, Directory, EntryKind};

/// Name of the manifest file in a store directory.
pub const MANIFEST: &str = "CURRENT";

/// Name of the file that keeps the next id of the store's own appends, written at every
/// snapshot: the ids of sequences appended and evicted before a snapshot's cut are in
/// neither the snapshot nor the log, and must not be handed out again.
pub const NEXT_ID: &str = "NEXT_ID";

/// The folder in a store directory where a start sets aside snapshot files that
/// `CURRENT` does not name but that may hold what the store does not (a newer snapshot
/// left by a restore of an older one): moved, never deleted.
pub const QUARANTINE: &str = "quarantine";

/// Errors from reading or updating a store directory.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The directory or its manifest could not be read or written.
    #[error("store directory {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The manifest names something that is not a snapshot file of this directory.
    #[error(
        "store directory {path}: the manifest CURRENT names {name:?}, which is not a snapshot file name; write the name of the newest good snapshot into CURRENT (`suffixd inspect --verify` checks one), or move the directory aside"
    )]
    BadManifest {
        /// The directory.
        path: PathBuf,
        /// What it names.
        name: String,
    },
    /// Another process (or another `Store` in this one) has the directory open.
    #[error(
        "store directory {path} is in use: another suffixd process holds its LOCK file (two writers would interleave their logs and snapshots). Stop that process first, or use another directory"
    )]
    Locked {
        /// The directory.
        path: PathBuf,
    },
    /// Snapshot files without a manifest, holding data that the log does not.
    #[error(
        "store directory {path} holds snapshot files but no CURRENT manifest to say which one is live, and the write-ahead log does not hold all of their data, so suffixd will not start from the log alone (that would lose it). {advice}"
    )]
    NoManifest {
        /// The directory.
        path: PathBuf,
        /// What the operator can do.
        advice: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DirError + '_ {
    move |source| DirError::Io {
        path: path.into(),
        source,
    }
}

/// Number of a snapshot file name (`snap-000042.sfxd` → 42).
fn snapshot_number(name: &str) -> Option<u64> {
    name.strip_prefix("snap-")?
        .strip_suffix(".sfxd")?
        .parse()
        .ok()
}

/// How long [`lock`] waits for a holder that is letting go. A `flock` belongs to the
/// open file, which a child process shares from its fork to its exec: while another
/// thread of this process starts one, a store just closed here still holds its lock for
/// that moment (tests/damage.rs reopened a store it had dropped and found it locked,
/// once, while another test started `suffixd`). A process that just exited lets go the
/// same way. A store truly in use is refused after this wait.
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// Take the directory's exclusive lock, `DIR/LOCK`, for as long as the returned guard
/// lives (on disk a `flock`, which the kernel releases when the process dies, kill -9
/// included, so a crash never leaves a stale lock).
pub fn lock(fs: &dyn Directory, dir: &Path) -> Result<DirLock, DirError> {
    let path = dir.join("LOCK");
    let started = Instant::now();
    loop {
        if let Some(lock) = fs.try_lock(&path).map_err(io(&path))? {
            return Ok(lock);
        }
        if started.elapsed() >= LOCK_WAIT {
            return Err(DirError::Locked { path: dir.into() });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The snapshot file that the manifest of `dir` names, if any.
pub fn current_snapshot(fs: &dyn Directory, dir: &Path) -> Result<Option<PathBuf>, DirError> {
    let manifest = dir.join(MANIFEST);
    fs.refuse_non_regular(&manifest, "manifest")
        .map_err(io(&manifest))?;
    let name = match fs.read_to_string_if_any(&manifest).map_err(io(&manifest))? {
        Some(s) => s.trim().to_string(),
        None => return Ok(None),
    };
    if snapshot_number(&name).is_none() {
        return Err(DirError::BadManifest {
            path: dir.into(),
            name,
        });
    }
    Ok(Some(dir.join(name)))
}

/// The snapshot files of `dir`, newest (highest number) first.
pub fn snapshot_files(fs: &dyn Directory, dir: &Path) -> Result<Vec<PathBuf>, DirError> {
    let mut found = Vec::new();
    for entry in fs.entries_if_any(dir).map_err(io(dir))? {
        if let Some(n) = snapshot_number(&entry.name) {
            found.push((n, dir.join(&entry.name)));
        }
    }
    found.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// Whether `dir` holds a store's data: a manifest, a snapshot file, a write-ahead log
/// segment or the next-id record. Operators' commands that would start a store afresh
/// must not run on such a directory.
pub fn holds_store(fs: &dyn Directory, dir: &Path) -> Result<bool, DirError> {
    for entry in fs.entries_if_any(dir).map_err(io(dir))? {
        let name = entry.name.as_str();
        let wal_segment = name.starts_with("wal-") && name.ends_with(".log");
        if name == MANIFEST || name == NEXT_ID || snapshot_number(name).is_some() || wal_segment {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A path for the next snapshot file of `dir`: one past the highest number present,
/// set-aside snapshots included, so that a number names one snapshot only.
pub fn next_snapshot_path(fs: &dyn Directory, dir: &Path) -> Result<PathBuf, DirError> {
    fs.create_dir_all(dir).map_err(io(dir))?;
    let highest = |dir: &Path| -> Result<u64, DirError> {
        Ok(snapshot_files(fs, dir)?
            .first()
            .and_then(|p| p.file_name()?.to_str().and_then(snapshot_number))
            .unwrap_or(0))
    };
    let highest = highest(dir)?.max(highest(&dir.join(QUARANTINE))?);
    Ok(dir.join(format!("snap-{:06}.sfxd", highest + 1)))
}

/// Move the snapshot file `path` of `dir` into its [`QUARANTINE`] folder (under a name
/// no file there has), durably. Returns where it went.
pub fn set_aside(fs: &dyn Directory, dir: &Path, path: &Path) -> Result<PathBuf, DirError> {
    let into = dir.join(QUARANTINE);
    fs.create_dir_all(&into).map_err(io(&into))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("snapshot");
    let mut to = into.join(name);
    let mut n = 1;
    while fs.kind(&to).map_err(io(&to))?.is_some() {
        to = into.join(format!("{name}.{n}"));
        n += 1;
    }
    fs.rename(path, &to).map_err(io(path))?;
    fs.sync_dir(&into).map_err(io(&into))?;
    fs.sync_dir(dir).map_err(io(dir))?;
    Ok(to)
}

/// Make `snapshot` (a file in `dir`) the current one: write the manifest to a temporary
/// file, fsync it, rename it over `CURRENT` and fsync the directory. Then delete the
/// snapshot files that are no longer current. Processes that still map an old file keep
/// reading it: on Unix its space returns when the last mapping goes.
pub fn publish(fs: &dyn Directory, dir: &Path, snapshot: &Path) -> Result<(), DirError> {
    let name = snapshot
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| snapshot_number(n).is_some())
        .ok_or_else(|| DirError::BadManifest {
            path: dir.into(),
            name: snapshot.display().to_string(),
        })?
        .to_string();
    fs.replace(&dir.join(MANIFEST), DurableFile::Manifest, |f| {
        f.write_all(format!("{name}\n").as_bytes())
    })
    .map_err(io(dir))?;
    remove_stale(fs, dir, Some(&name))?;
    Ok(())
}

/// Delete what no manifest names: every snapshot file but `current` (with `current`
/// None, none is deleted: without a manifest they may be all the store has), and every
/// `.tmp` file (a write a crash cut short; only a rename makes one live). Returns the
/// files and bytes removed. Only the store's writer (the holder of its `LOCK`) may call
/// it, and only once `current` holds all that the others do (a start sets aside the
/// snapshots it cannot prove so, [`set_aside`]). Best effort: a file that cannot be
/// removed costs disk space, not correctness.
pub fn remove_stale(
    fs: &dyn Directory,
    dir: &Path,
    current: Option<&str>,
) -> Result<(usize, u64), DirError> {
    let (mut files, mut bytes) = (0, 0);
    for entry in fs.entries(dir).map_err(io(dir))? {
        let file = entry.name.as_str();
        let stale_snapshot =
            current.is_some_and(|current| snapshot_number(file).is_some() && file != current);
        let stale_tmp = file.ends_with(".tmp");
        if (stale_snapshot || stale_tmp)
            && entry.kind == EntryKind::File
            && fs.remove(&dir.join(file)).is_ok()
        {
            files += 1;
            bytes += entry.len;
        }
    }
    Ok((files, bytes))
}

/// The next own id recorded at the last snapshot. None when there is none (a store
/// from before the file existed, or no snapshot yet) or it does not parse (logged):
/// the ids are then recovered from the snapshot and the log alone.
///
/// Something other than a regular file at its path is an error: ids recovered without
/// it could hand out an id that was evicted before the cut again.
pub fn read_next_id(fs: &dyn Directory, dir: &Path) -> Result<Option<u64>, DirError> {
    let path = dir.join(NEXT_ID);
    let text = match fs.read_to_string_if_any(&path) {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return Err(io(&path)(e)),
        Err(e) => {
            tracing::warn!(
                "cannot read {} ({e}): own ids are recovered from the snapshot and the log alone",
                path.display()
            );
            return Ok(None);
        }
    };
    let parsed = text.trim().parse().ok();
    if parsed.is_none() {
        tracing::warn!(
            "{} does not hold a number: own ids are recovered from the snapshot and the log alone",
            path.display()
        );
    }
    Ok(parsed)
}

/// Record `next` as the next own id, atomically (temporary file, fsync, rename).
pub fn write_next_id(fs: &dyn Directory, dir: &Path, next: u64) -> Result<(), DirError> {
    fs.replace(&dir.join(NEXT_ID), DurableFile::NextId, |f| {
        f.write_all(format!("{next}\n").as_bytes())
    })
    .map_err(io(dir))
}

/// Bytes of every file in `dir` (snapshots and logs), for stats.
pub fn disk_bytes(fs: &dyn Directory, dir: &Path) -> u64 {
    fs.entries(dir)
        .map(|entries| {
            entries
                .iter()
                .filter(|e| e.kind == EntryKind::File)
                .map(|e| e.len)
                .sum()
        })
        .unwrap_or(0)
}
