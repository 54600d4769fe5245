//! A directory in memory that knows what a disk would keep: for tests that cut the
//! power at every step of a workload, which a real disk cannot show (after kill -9 the
//! page cache still holds every write; after a power cut only fsynced data is there).
//!
//! What is durable, as POSIX promises it:
//! - a file's bytes as of its last `sync_data`/`sync_all` (a file never synced comes
//!   back empty);
//! - a name (a created, renamed or removed file) as of its directory's last fsync.
//!
//! Directories themselves are durable as soon as they are made: the store makes its
//! directories once, before anything that matters is written in them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{DirLock, Directory, Entry, EntryKind, FileBytes, LogFile};

/// Files in memory, with the durable state a power cut would leave. Clones share the
/// same files (as two handles on one disk do).
#[derive(Clone, Debug, Default)]
pub struct RamDirectory {
    ram: Arc<Mutex<Ram>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    File(u64),
    Dir,
}

#[derive(Clone, Debug, Default)]
struct RamFile {
    data: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct Ram {
    files: HashMap<u64, RamFile>,
    next_file: u64,
    /// Every name now.
    names: BTreeMap<PathBuf, Node>,
    /// The names as their directories' last fsync left them.
    durable_names: BTreeMap<PathBuf, Node>,
    locks: HashSet<PathBuf>,
    /// Operations that change something, counted from 1.
    operations: u64,
    /// Cut the power just before this operation: keep the image it would leave.
    cut_before: Option<u64>,
    image: Option<Box<Ram>>,
}

impl Ram {
    /// Count one changing operation; keep the power-cut image when it is the one chosen.
    fn operation(&mut self) {
        self.operations += 1;
        if self.cut_before == Some(self.operations) {
            self.image = Some(Box::new(self.power_cut()));
        }
    }

    /// What a power cut now would leave: durable names over durable bytes.
    fn power_cut(&self) -> Ram {
        let files = self
            .durable_names
            .values()
            .filter_map(|n| match n {
                Node::File(id) => {
                    let durable = self
                        .files
                        .get(id)
                        .map(|f| f.durable.clone())
                        .unwrap_or_default();
                    Some((
                        *id,
                        RamFile {
                            data: durable.clone(),
                            durable,
                        },
                    ))
                }
                Node::Dir => None,
            })
            .collect();
        Ram {
            files,
            next_file: self.next_file,
            names: self.durable_names.clone(),
            durable_names: self.durable_names.clone(),
            ..Ram::default()
        }
    }

    fn file_id(&self, path: &Path) -> std::io::Result<u64> {
        match self.names.get(path) {
            Some(Node::File(id)) => Ok(*id),
            Some(Node::Dir) => Err(Error::new(ErrorKind::IsADirectory, "is a directory")),
            None => Err(not_found(path)),
        }
    }

    fn file(&mut self, id: u64) -> &mut RamFile {
        self.files.entry(id).or_default()
    }

    fn parent_exists(&self, path: &Path) -> std::io::Result<()> {
        match path.parent() {
            Some(p) if p.as_os_str().is_empty() || self.names.get(p) == Some(&Node::Dir) => Ok(()),
            None => Ok(()),
            Some(_) => Err(not_found(path)),
        }
    }
}

fn not_found(path: &Path) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl RamDirectory {
    /// An empty directory tree.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Ram> {
        // A test that panicked while holding it leaves the files as they were.
        self.ram.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn from_ram(ram: Ram) -> Self {
        RamDirectory {
            ram: Arc::new(Mutex::new(ram)),
        }
    }

    /// Changing operations so far (writes, fsyncs, renames, removals, truncations,
    /// new files and directories).
    pub fn operations(&self) -> u64 {
        self.lock().operations
    }

    /// Cut the power just before changing operation `n` (counted from 1): from then on,
    /// [`RamDirectory::power_cut_image`] returns what the disk held at that instant.
    /// The files themselves go on, so the workload runs to its end.
    pub fn cut_power_before(&self, n: u64) {
        self.lock().cut_before = Some(n);
    }

    /// What the disk held when the power was cut ([`RamDirectory::cut_power_before`]),
    /// as a new directory; `None` if the workload never reached that operation.
    pub fn power_cut_image(&self) -> Option<RamDirectory> {
        let image = self.lock().image.take()?;
        Some(Self::from_ram(*image))
    }

    /// What a power cut now would leave, as a new directory: fsynced bytes under fsynced
    /// names only.
    pub fn after_power_cut(&self) -> RamDirectory {
        Self::from_ram(self.lock().power_cut())
    }
}

impl Directory for RamDirectory {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        let mut ram = self.lock();
        ram.operation();
        for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
            match ram.names.get(d) {
                Some(Node::Dir) => {}
                Some(Node::File(_)) => {
                    return Err(Error::new(ErrorKind::AlreadyExists, "a file is there"));
                }
                None => {
                    ram.names.insert(d.into(), Node::Dir);
                    ram.durable_names.insert(d.into(), Node::Dir);
                }
            }
        }
        Ok(())
    }

    fn entries(&self, dir: &Path) -> std::io::Result<Vec<Entry>> {
        let ram = self.lock();
        if ram.names.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        let children = ram.names.range(dir.to_path_buf()..).skip(1);
        Ok(children
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, node)| {
                let name = p.file_name()?.to_str()?.to_string();
                Some(match node {
                    Node::File(id) => Entry {
                        name,
                        kind: EntryKind::File,
                        len: ram.files.get(id).map_or(0, |f| f.data.len() as u64),
                    },
                    Node::Dir => Entry {
                        name,
                        kind: EntryKind::Dir,
                        len: 0,
                    },
                })
            })
            .collect())
    }

    fn kind(&self, path: &Path) -> std::io::Result<Option<EntryKind>> {
        Ok(self.lock().names.get(path).map(|n| match n {
            Node::File(_) => EntryKind::File,
            Node::Dir => EntryKind::Dir,
        }))
    }

    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        let mut ram = self.lock();
        let id = ram.file_id(path)?;
        Ok(ram.file(id).data.clone())
    }

    fn map(&self, path: &Path) -> std::io::Result<FileBytes> {
        let data = self.read(path)?;
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(data.len());
        aligned.extend_from_slice(&data);
        Ok(FileBytes::new(aligned))
    }

    fn create(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>> {
        let mut ram = self.lock();
        ram.operation();
        ram.parent_exists(path)?;
        let id = match ram.names.get(path) {
            Some(Node::File(id)) => {
                let id = *id;
                ram.file(id).data.clear();
                id
            }
            Some(Node::Dir) => return Err(Error::new(ErrorKind::IsADirectory, "a directory")),
            None => {
                ram.next_file += 1;
                let id = ram.next_file;
                ram.names.insert(path.into(), Node::File(id));
                ram.files.insert(id, RamFile::default());
                id
            }
        };
        Ok(Box::new(RamHandle {
            ram: self.ram.clone(),
            id,
            at: 0,
        }))
    }

    fn open_write(&self, path: &Path) -> std::io::Result<Box<dyn LogFile>> {
        let id = self.lock().file_id(path)?;
        Ok(Box::new(RamHandle {
            ram: self.ram.clone(),
            id,
            at: 0,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let mut ram = self.lock();
        ram.operation();
        let id = ram.file_id(from)?;
        ram.parent_exists(to)?;
        ram.names.remove(from);
        ram.names.insert(to.into(), Node::File(id));
        Ok(())
    }

    fn remove(&self, path: &Path) -> std::io::Result<()> {
        let mut ram = self.lock();
        ram.operation();
        ram.file_id(path)?;
        ram.names.remove(path);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        let mut ram = self.lock();
        ram.operation();
        if ram.names.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        let in_dir = |p: &Path| p.parent() == Some(dir);
        let ram = &mut *ram;
        ram.durable_names.retain(|p, _| !in_dir(p));
        for (p, node) in ram.names.iter().filter(|(p, _)| in_dir(p)) {
            ram.durable_names.insert(p.clone(), *node);
        }
        Ok(())
    }

    fn try_lock(&self, path: &Path) -> std::io::Result<Option<DirLock>> {
        let mut ram = self.lock();
        if !ram.locks.insert(path.into()) {
            return Ok(None);
        }
        Ok(Some(DirLock::new(RamLock {
            ram: self.ram.clone(),
            path: path.into(),
        })))
    }
}

struct RamLock {
    ram: Arc<Mutex<Ram>>,
    path: PathBuf,
}

impl Drop for RamLock {
    fn drop(&mut self) {
        let mut ram = self.ram.lock().unwrap_or_else(|e| e.into_inner());
        ram.locks.remove(&self.path);
    }
}

/// An open file of a [`RamDirectory`]: it keeps writing to the file it opened, even
/// after the name is renamed or removed, as a file descriptor does.
struct RamHandle {
    ram: Arc<Mutex<Ram>>,
    id: u64,
    at: u64,
}

impl RamHandle {
    fn with<T>(&self, change: impl FnOnce(&mut RamFile) -> T) -> T {
        let mut ram = self.ram.lock().unwrap_or_else(|e| e.into_inner());
        ram.operation();
        change(ram.file(self.id))
    }
}

impl std::io::Write for RamHandle {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let at = self.at as usize;
        self.with(|f| {
            if f.data.len() < at {
                f.data.resize(at, 0);
            }
            let overlap = (f.data.len() - at).min(bytes.len());
            f.data[at..at + overlap].copy_from_slice(&bytes[..overlap]);
            f.data.extend_from_slice(&bytes[overlap..]);
        });
        self.at += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogFile for RamHandle {
    fn sync_data(&self) -> std::io::Result<()> {
        self.with(|f| f.durable.clone_from(&f.data));
        Ok(())
    }

    fn sync_all(&self) -> std::io::Result<()> {
        self.sync_data()
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.with(|f| f.data.resize(len as usize, 0));
        Ok(())
    }

    fn seek_to(&mut self, at: u64) -> std::io::Result<()> {
        self.at = at;
        Ok(())
    }

    fn try_clone(&self) -> std::io::Result<Box<dyn LogFile>> {
        Ok(Box::new(RamHandle {
            ram: self.ram.clone(),
            id: self.id,
            at: self.at,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_power_cut_keeps_fsynced_bytes_under_fsynced_names_only() {
        let fs = RamDirectory::new();
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let mut a = fs.create(&dir.join("a")).unwrap();
        a.write_all(b"kept").unwrap();
        a.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        a.write_all(b" lost").unwrap();
        let mut b = fs.create(&dir.join("b")).unwrap();
        b.write_all(b"synced, but its name was not").unwrap();
        b.sync_all().unwrap();
        fs.rename(&dir.join("a"), &dir.join("c")).unwrap();

        let cut = fs.after_power_cut();
        assert_eq!(cut.read(&dir.join("a")).unwrap(), b"kept");
        assert_eq!(cut.kind(&dir.join("b")).unwrap(), None);
        assert_eq!(
            cut.kind(&dir.join("c")).unwrap(),
            None,
            "the rename was not synced"
        );
        assert_eq!(
            fs.read(&dir.join("c")).unwrap(),
            b"kept lost",
            "the live files go on"
        );

        fs.sync_dir(dir).unwrap();
        let cut = fs.after_power_cut();
        assert_eq!(cut.kind(&dir.join("a")).unwrap(), None);
        assert_eq!(
            cut.read(&dir.join("b")).unwrap(),
            b"synced, but its name was not"
        );
        assert_eq!(cut.read(&dir.join("c")).unwrap(), b"kept");
    }

    #[test]
    fn the_image_is_taken_just_before_the_chosen_operation() {
        let fs = RamDirectory::new();
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap(); // 1
        let mut f = fs.create(&dir.join("f")).unwrap(); // 2
        fs.sync_dir(dir).unwrap(); // 3
        f.write_all(b"x").unwrap(); // 4
        fs.cut_power_before(6);
        f.sync_data().unwrap(); // 5
        f.write_all(b"y").unwrap(); // 6: the power goes before it
        f.sync_data().unwrap(); // 7
        assert_eq!(fs.operations(), 7);
        let image = fs.power_cut_image().expect("reached");
        assert_eq!(image.read(&dir.join("f")).unwrap(), b"x");
        assert!(fs.power_cut_image().is_none(), "taken once");
    }
}
