//! The store's filesystem seam: the file operations that make a write durable, in one
//! place, each with its fault points ([`super::faults`]). Snapshots, the manifest, the
//! next-id file, quarantined log segments and replication's state files are replaced
//! whole through [`replace_file`]; the write-ahead log appends and seals its segments
//! with [`sync_dir`] after it makes one.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::faults::{self, DurableFile, FaultPoint, ReplaceStep};

/// Write a file whole or not at all: `write` fills `path` with `.tmp` for extension,
/// which is fsynced, renamed over `path`, and the directory fsynced. A failure before
/// the rename removes the temporary file (a half-written file would hold the space a
/// full disk needs back). `file` names the fault points of each step.
pub(crate) fn replace_file<T>(
    path: &Path,
    file: DurableFile,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let point = |step| faults::check(FaultPoint::Replace(file, step));
    let tmp = path.with_extension("tmp");
    let replaced = File::create(&tmp)
        .and_then(|mut f| {
            let mut cut = faults::Cut::new(FaultPoint::Replace(file, ReplaceStep::Write), &mut f);
            let written = write(&mut cut)?;
            cut.finish()?;
            point(ReplaceStep::Fsync)?;
            f.sync_all()?;
            Ok(written)
        })
        .and_then(|written| {
            point(ReplaceStep::Rename)?;
            std::fs::rename(&tmp, path)?;
            Ok(written)
        });
    let written = match replaced {
        Ok(written) => written,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    point(ReplaceStep::DirFsync)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(written)
}

/// fsync a directory, so that a rename or a new file in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An error unless `path` is a regular file or absent: opening a FIFO for reading waits
/// for a writer, so a store looks before it opens. `what` names what the file should be.
pub(crate) fn refuse_non_regular(path: &Path, what: &str) -> std::io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file, so not a {what}: move it aside"),
        )),
        _ => Ok(()),
    }
}
