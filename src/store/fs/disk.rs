//! The real directory: `std::fs`, read-only memory maps and `flock`.

use std::fs::{File, OpenOptions};

use crate::files::{check_regular, check_regular_if_any, open_regular};
use std::io::{Seek, SeekFrom};
use std::path::Path;

use super::{DirLock, Directory, Entry, EntryKind, FileBytes, LogFile};

/// The disk, through `std::fs`. A unit struct: `&DiskDirectory` is the disk anywhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskDirectory;

fn kind_of(t: std::fs::FileType) -> EntryKind {
    if t.is_file() {
        EntryKind::File
    } else if t.is_dir() {
        EntryKind::Dir
    } else {
        EntryKind::Other
    }
}

impl Directory for DiskDirectory {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn entries(&self, dir: &Path) -> std::io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            // A file removed between the listing and this look is left out.
            let Ok(meta) = entry.metadata() else { continue };
            out.push(Entry {
                name,
                kind: kind_of(meta.file_type()),
                len: meta.len(),
            });
        }
        Ok(out)
    }

    fn kind(&self, path: &Path) -> std::io::Result<Option<EntryKind>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(kind_of(m.file_type()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        check_regular(path, "store file")?;
        std::fs::read(path)
    }

    fn map(&self, path: &Path) -> std::io::Result<FileBytes> {
        let file = open_regular(path, "store file")?;
        if file.metadata()?.len() == 0 {
            // mmap refuses an empty length; an empty file is its bytes.
            return Ok(FileBytes::new(Vec::new()));
        }
        // SAFETY: the store maps only files that are never modified after the rename
        // that publishes them (new snapshots are new files), so the mapping does not
        // change under its readers.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(FileBytes::new(map))
    }

    fn create(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>> {
        check_regular_if_any(path, "store file")?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)?;
        Ok(Box::new(file))
    }

    fn open_write(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>> {
        check_regular(path, "store file")?;
        Ok(Box::new(OpenOptions::new().write(true).open(path)?))
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }

    /// `flock` on `path` for as long as the file stays open: the kernel releases it when
    /// the process dies, kill -9 included, so a crash never leaves a stale lock.
    fn try_lock(&self, path: &Path) -> std::io::Result<Option<DirLock>> {
        // Opening a FIFO for writing waits for a reader: look first.
        check_regular_if_any(path, "lock file")?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(DirLock::new(file))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

impl LogFile for File {
    fn sync_data(&self) -> std::io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> std::io::Result<()> {
        File::sync_all(self)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        File::set_len(self, len)
    }

    fn seek_to(&mut self, at: u64) -> std::io::Result<()> {
        self.seek(SeekFrom::Start(at)).map(|_| ())
    }

    fn try_clone(&self) -> std::io::Result<Box<dyn LogFile>> {
        Ok(Box::new(File::try_clone(self)?))
    }
}
