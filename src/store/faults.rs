//! Fault points for the store's file operations (and replication's eviction outbox), so that tests can make a write, an
//! fsync, a rename or a removal fail at any step of append, snapshot and compaction
//! (`tests/faults.rs`). They are the `fail` crate's points, named by [`FaultPoint`]:
//! compiled in only when its `failpoints` feature is on, which the test build turns on
//! and a release build does not, so they cost nothing in production.
//!
//! A point configured with `return` fails with ENOSPC, the error a full disk gives;
//! `return(N)` on a write point ([`FaultPoint::writes`]) first writes N bytes, as a
//! write cut short by a full disk does.

use std::io::Write;

/// A file the store replaces whole ([`super::fs::Directory::replace`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DurableFile {
    /// A snapshot (`snap-NNNNNN.sfxd`).
    Snapshot,
    /// The manifest naming the live snapshot (`CURRENT`).
    Manifest,
    /// The next own id (`NEXT_ID`).
    NextId,
    /// A damaged log segment's copy in `damaged/`.
    Quarantine,
    /// Replication's positions and identity files.
    ReplicationState,
}

/// A step of replacing a file whole: write a temporary file, fsync it, rename it over
/// the old one, fsync the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplaceStep {
    /// Writing the temporary file.
    Write,
    /// Its fsync.
    Fsync,
    /// The rename over the old file.
    Rename,
    /// The directory's fsync, which makes the rename durable.
    DirFsync,
}

/// A place where a test can make the disk fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Writing a log record.
    WalWrite,
    /// The log's fsync before an append is acknowledged.
    WalFsync,
    /// Sealing a log segment (its fsync) when a snapshot rotates the log.
    WalRotateFsync,
    /// Writing a new log segment's header.
    WalNewSegment,
    /// Deleting a log segment a snapshot holds.
    WalRemove,
    /// Cutting a failed write's bytes back out of the log.
    WalTruncate,
    /// A step of replacing a file whole.
    Replace(DurableFile, ReplaceStep),
    /// Writing an entry of replication's eviction outbox.
    OutboxWrite,
    /// The outbox's fsync before an operator's eviction is acknowledged.
    OutboxFsync,
}

impl FaultPoint {
    /// Every fault point.
    pub fn all() -> Vec<FaultPoint> {
        use DurableFile::*;
        use ReplaceStep::*;
        let mut all = vec![
            FaultPoint::WalWrite,
            FaultPoint::WalFsync,
            FaultPoint::WalRotateFsync,
            FaultPoint::WalNewSegment,
            FaultPoint::WalRemove,
            FaultPoint::WalTruncate,
            FaultPoint::OutboxWrite,
            FaultPoint::OutboxFsync,
        ];
        for file in [Snapshot, Manifest, NextId, Quarantine, ReplicationState] {
            for step in [Write, Fsync, Rename, DirFsync] {
                all.push(FaultPoint::Replace(file, step));
            }
        }
        all
    }

    /// The `fail` crate's name of the point: `fail::cfg(point.name(), "return")`.
    pub fn name(self) -> String {
        let wal = |step: &str| format!("wal-{step}");
        match self {
            FaultPoint::WalWrite => wal("write"),
            FaultPoint::WalFsync => wal("fsync"),
            FaultPoint::WalRotateFsync => wal("rotate-fsync"),
            FaultPoint::WalNewSegment => wal("new-segment"),
            FaultPoint::WalRemove => wal("remove"),
            FaultPoint::WalTruncate => wal("truncate"),
            FaultPoint::OutboxWrite => "outbox-write".into(),
            FaultPoint::OutboxFsync => "outbox-fsync".into(),
            FaultPoint::Replace(file, step) => {
                let file = match file {
                    DurableFile::Snapshot => "snapshot",
                    DurableFile::Manifest => "manifest",
                    DurableFile::NextId => "next-id",
                    DurableFile::Quarantine => "quarantine",
                    DurableFile::ReplicationState => "replication-state",
                };
                let step = match step {
                    ReplaceStep::Write => "write",
                    ReplaceStep::Fsync => "fsync",
                    ReplaceStep::Rename => "rename",
                    ReplaceStep::DirFsync => "dir-fsync",
                };
                format!("{file}-{step}")
            }
        }
    }

    /// Whether the point is a write, which `return(N)` cuts short after N bytes.
    pub fn writes(self) -> bool {
        matches!(
            self,
            FaultPoint::WalWrite
                | FaultPoint::WalNewSegment
                | FaultPoint::OutboxWrite
                | FaultPoint::Replace(_, ReplaceStep::Write)
        )
    }
}

/// The injected error: what a full disk returns.
fn no_space(point: FaultPoint) -> std::io::Error {
    let os = std::io::Error::from_raw_os_error(28);
    std::io::Error::new(
        os.kind(),
        format!("{os} (injected at fault point {})", point.name()),
    )
}

/// Fail here if the test configured `point`.
#[allow(
    unused_variables,
    reason = "read only when the fault points are compiled in"
)]
pub(crate) fn check(point: FaultPoint) -> std::io::Result<()> {
    fail::fail_point!(&point.name(), |_| Err(no_space(point)));
    Ok(())
}

/// Bytes to write before failing, when the test configured `point`.
#[allow(
    unused_variables,
    reason = "read only when the fault points are compiled in"
)]
fn partial(point: FaultPoint) -> Option<usize> {
    fail::fail_point!(&point.name(), |arg: Option<String>| Some(
        arg.and_then(|a| a.parse().ok()).unwrap_or(0)
    ));
    None
}

/// `file.write_all(bytes)`, or, when the test configured `point`, a write cut short
/// after the configured number of bytes and an error.
pub(crate) fn write_all(
    point: FaultPoint,
    file: &mut (impl Write + ?Sized),
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut cut = Cut::new(point, file);
    cut.write_all(bytes)?;
    cut.finish()
}

/// A writer that, when the test configured `point`, lets the configured number of bytes
/// through and then fails: a write cut short by a full disk, however many calls the
/// file is written in. A configured write fails even when it is shorter
/// ([`Cut::finish`]), so that the point is always reached.
pub(crate) struct Cut<W> {
    inner: W,
    point: FaultPoint,
    left: Option<usize>,
}

impl<W> Cut<W> {
    pub(crate) fn new(point: FaultPoint, inner: W) -> Self {
        Cut {
            inner,
            point,
            left: partial(point),
        }
    }

    /// The end of the write: an error if the point is configured and nothing failed
    /// yet (the disk filled just as the write ended).
    pub(crate) fn finish(self) -> std::io::Result<()> {
        match self.left {
            Some(_) => Err(no_space(self.point)),
            None => Ok(()),
        }
    }
}

impl<W: Write> Write for Cut<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let Some(left) = self.left else {
            return self.inner.write(bytes);
        };
        if left == 0 {
            return Err(no_space(self.point));
        }
        let n = self.inner.write(&bytes[..left.min(bytes.len())])?;
        self.left = Some(left - n);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// For a unit test that configures a fault point or passes through one another test
/// configures: the points are process-wide, so such tests hold the `fail` crate's
/// scenario lock one at a time (and every point is cleared when it is dropped).
/// Without it, a test's injected full disk failed a neighbour's outbox write 9 times
/// in 300 runs.
#[cfg(test)]
pub(crate) fn one_test_at_a_time() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_has_its_own_name() {
        let all = FaultPoint::all();
        let names: std::collections::HashSet<String> = all.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), all.len());
        assert!(names.contains("wal-write") && names.contains("manifest-dir-fsync"));
    }
}
