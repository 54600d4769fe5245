//! The store's filesystem seam: every file the store reads, maps, writes, fsyncs,
//! renames or removes goes through a [`Directory`], as tantivy's does.
//!
//! - [`DiskDirectory`] is the real one (`std::fs`, memory maps, `flock`).
//! - [`RamDirectory`] keeps files in memory and remembers what an fsync made durable,
//!   so a test can cut the power at any operation and reopen what a disk would have
//!   kept ([`RamDirectory::power_cut_image`]). The store's unit tests run on both.
//!
//! Paths are whole paths, as the store's error messages name them; a RAM directory
//! only needs them to be distinct.
//!
//! [`replace_file`] writes a file whole or not at all (snapshots, the manifest, the
//! next-id file, quarantined log segments, replication's state); the write-ahead log
//! appends through [`LogFile`]. Each step has its fault point ([`super::faults`]).

mod disk;
mod ram;

use std::io::Write;
use std::path::Path;

pub use disk::DiskDirectory;
pub use ram::RamDirectory;

use super::faults::{self, DurableFile, FaultPoint, ReplaceStep};

/// A place the store keeps its files: the disk, or memory in tests.
///
/// Errors are `std::io::Error`s with the kinds the disk gives (`NotFound` for a missing
/// file or directory), so callers handle both alike.
pub trait Directory: Send + Sync + std::fmt::Debug {
    /// Create `dir` and its parents, if they are missing.
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()>;
    /// The entries directly in `dir`, in no order; `NotFound` if it does not exist.
    fn entries(&self, dir: &Path) -> std::io::Result<Vec<Entry>>;
    /// What is at `path`: `None` when nothing is.
    fn kind(&self, path: &Path) -> std::io::Result<Option<EntryKind>>;
    /// The whole file.
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>>;
    /// The whole file as bytes that stay valid while the file is read-only (a memory
    /// map on disk; a copy in memory), aligned to 16 bytes as a page is.
    fn map(&self, path: &Path) -> std::io::Result<FileBytes>;
    /// A new empty file at `path` (an old one is truncated), open for writing.
    fn create(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>>;
    /// The existing file at `path`, open for writing at its start.
    fn open_write(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>>;
    /// Rename `from` over `to` atomically (durable once the directory is fsynced).
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()>;
    /// Delete the file at `path`.
    fn remove(&self, path: &Path) -> std::io::Result<()>;
    /// fsync `dir`, so that the names created, renamed or removed in it are durable.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
    /// Take the exclusive lock `path` for as long as the returned guard lives; `None`
    /// when someone else holds it (another process, or another store of this one).
    fn try_lock(&self, path: &Path) -> std::io::Result<Option<DirLock>>;
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its file name (entries whose name is not UTF-8 are left out: none is the store's).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Bytes, for a file.
    pub len: u64,
}

/// What a directory entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Anything else (a FIFO, a socket, a device): never opened, as a FIFO would block.
    Other,
}

/// A held directory lock; dropping it releases the lock.
pub struct DirLock(#[allow(dead_code, reason = "held for its drop")] Box<dyn Send + Sync>);

impl DirLock {
    /// A lock held for as long as `guard` lives.
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        DirLock(Box::new(guard))
    }
}

impl std::fmt::Debug for DirLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DirLock")
    }
}

/// A file's bytes, read in place: a read-only memory map, or a buffer in memory.
pub struct FileBytes(Box<dyn AsRef<[u8]> + Send + Sync>);

impl FileBytes {
    /// Bytes held by `owner`.
    pub fn new(owner: impl AsRef<[u8]> + Send + Sync + 'static) -> Self {
        FileBytes(Box::new(owner))
    }
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// A file open for writing: the write-ahead log's segments, and files being replaced.
/// `write` goes at the current position, as a `std::fs::File`'s does.
pub trait LogFile: Write + Send + Sync {
    /// fsync the file's data (and its length).
    fn sync_data(&self) -> std::io::Result<()>;
    /// fsync the file's data and metadata.
    fn sync_all(&self) -> std::io::Result<()>;
    /// Cut or extend the file to `len` bytes (the position does not move).
    fn set_len(&self, len: u64) -> std::io::Result<()>;
    /// Move the position to byte `at`.
    fn seek_to(&mut self, at: u64) -> std::io::Result<()>;
    /// A second handle to the same file, so one thread can fsync while another holds
    /// the first.
    fn try_clone(&self) -> std::io::Result<Box<dyn LogFile>>;
}

/// What the store builds on a directory's primitives, the same on every [`Directory`].
impl dyn Directory + '_ {
    /// Write a file whole or not at all: `write` fills `path` with `.tmp` for extension,
    /// which is fsynced, renamed over `path`, and the directory fsynced. A failure before
    /// the rename removes the temporary file (a half-written file would hold the space a
    /// full disk needs back). `file` names the fault points of each step.
    pub(crate) fn replace<T>(
        &self,
        path: &Path,
        file: DurableFile,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let point = |step| faults::check(FaultPoint::Replace(file, step));
        let tmp = path.with_extension("tmp");
        let replaced = self
            .create(&tmp)
            .and_then(|mut f| {
                let mut cut =
                    faults::Cut::new(FaultPoint::Replace(file, ReplaceStep::Write), &mut f);
                let written = write(&mut cut)?;
                cut.finish()?;
                point(ReplaceStep::Fsync)?;
                f.sync_all()?;
                Ok(written)
            })
            .and_then(|written| {
                point(ReplaceStep::Rename)?;
                self.rename(&tmp, path)?;
                Ok(written)
            });
        let written = match replaced {
            Ok(written) => written,
            Err(e) => {
                let _ = self.remove(&tmp);
                return Err(e);
            }
        };
        point(ReplaceStep::DirFsync)?;
        self.sync_dir(path.parent().unwrap_or(Path::new(".")))?;
        Ok(written)
    }

    /// An error unless `path` is a regular file or absent: opening a FIFO for reading
    /// waits for a writer, so a store looks before it opens. `what` names what the file
    /// should be.
    pub(crate) fn refuse_non_regular(&self, path: &Path, what: &str) -> std::io::Result<()> {
        match self.kind(path)? {
            Some(EntryKind::File) | None => Ok(()),
            Some(_) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a regular file, so not a {what}: move it aside"),
            )),
        }
    }

    /// The file at `path` as text; `None` when there is none.
    pub(crate) fn read_to_string_if_any(&self, path: &Path) -> std::io::Result<Option<String>> {
        match self.read(path) {
            Ok(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The entries of `dir`; none when it does not exist.
    pub(crate) fn entries_if_any(&self, dir: &Path) -> std::io::Result<Vec<Entry>> {
        match self.entries(dir) {
            Ok(entries) => Ok(entries),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two directories behave alike on what the store relies on.
    fn the_contract(fs: &dyn Directory, root: &Path) {
        let dir = root.join("a/b");
        assert_eq!(
            fs.entries(&dir).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        fs.create_dir_all(&dir).unwrap();
        assert_eq!(fs.kind(&dir).unwrap(), Some(EntryKind::Dir));
        assert!(fs.entries(&dir).unwrap().is_empty());
        let path = dir.join("f");
        assert_eq!(fs.kind(&path).unwrap(), None);
        assert_eq!(
            fs.read(&path).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );

        let mut f = fs.create(&path).unwrap();
        f.write_all(b"hello world").unwrap();
        f.set_len(5).unwrap();
        f.seek_to(5).unwrap();
        f.write_all(b"!").unwrap();
        f.sync_data().unwrap();
        assert_eq!(fs.read(&path).unwrap(), b"hello!");
        let clone = f.try_clone().unwrap();
        clone.sync_all().unwrap();
        drop((f, clone));
        let mut again = fs.open_write(&path).unwrap();
        again.write_all(b"J").unwrap();
        drop(again);
        assert_eq!(fs.map(&path).unwrap().as_ref(), b"Jello!");
        assert_eq!(
            fs.entries(&dir).unwrap(),
            vec![Entry {
                name: "f".into(),
                kind: EntryKind::File,
                len: 6
            }]
        );

        fs.replace(&path, DurableFile::Manifest, |w| w.write_all(b"new"))
            .unwrap();
        assert_eq!(fs.read(&path).unwrap(), b"new");
        assert_eq!(
            fs.entries(&dir).unwrap().len(),
            1,
            "the temporary file is gone"
        );
        let moved = dir.join("g");
        fs.rename(&path, &moved).unwrap();
        assert_eq!(fs.kind(&path).unwrap(), None);
        fs.remove(&moved).unwrap();
        assert_eq!(
            fs.remove(&moved).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        fs.sync_dir(&dir).unwrap();

        let lock = dir.join("LOCK");
        let held = fs.try_lock(&lock).unwrap().expect("free");
        assert!(fs.try_lock(&lock).unwrap().is_none(), "held");
        drop(held);
        assert!(fs.try_lock(&lock).unwrap().is_some(), "released");
    }

    #[test]
    fn the_disk_and_the_ram_directory_keep_the_same_contract() {
        let tmp = tempfile::tempdir().unwrap();
        the_contract(&DiskDirectory, tmp.path());
        the_contract(&RamDirectory::new(), Path::new("/ram"));
    }
}
