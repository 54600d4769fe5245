//! The persistent store: the third stage of the data flow.
//!
//! - [`change`]: the vocabulary of changes (append, evict by scope) that the log,
//!   replication and the admin API share.
//! - [`snapshot`]: the file format, an rkyv archive of every namespace's tree, mmapped
//!   and read in place.
//! - [`manifest`]: a store directory, its numbered snapshots and the `CURRENT` manifest.
//! - [`double_buffer`]: two copies of the live state, so that readers never wait.
//! - [`layered`]: base (snapshot) + delta (appended since) − evicted, read as one tree;
//!   [`layers`]: the three trees of a namespace, owned and changed (the store's and
//!   `simulate`'s).
//! - [`wal`]: the write-ahead log of appends and evictions since the last snapshot.
//! - [`live`]: the live store: open (snapshot + log replay), append, evict, snapshot
//!   and compaction, budgets; one process per directory (`manifest::lock`).
//! - `last_use`: cached sequences in last-use order (the `lru` crate), for LRU and age
//!   eviction.
//! - [`from_logs`]: a snapshot built from request logs (`suffixd build`, warm starts).
//! - [`fs`]: the filesystem seam: the [`fs::Directory`] every file operation goes through,
//!   on disk or in memory (with power cuts, for tests); files replaced whole.
//! - [`faults`]: fault injection for the crash tests, typed points.

pub mod change;
pub mod double_buffer;
pub mod faults;
pub mod from_logs;
pub mod fs;
mod last_use;
pub mod layered;
pub mod layers;
pub mod live;
pub mod manifest;
pub mod snapshot;
pub mod wal;

pub use change::{Change, EvictScope};

/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 128;

/// Whether `name` can name a namespace: 1 to [`MAX_NAMESPACE_BYTES`] bytes of
/// printable ASCII without spaces, as requests address them (`x-suffixd-namespace`,
/// `user`). Every writer checks it, so that no store holds a namespace no request can
/// reach.
pub fn is_namespace(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAMESPACE_BYTES
        && name.bytes().all(|b| b.is_ascii_graphic())
}
pub use fs::{Directory, DiskDirectory, RamDirectory};
pub use layered::{Layered, LayeredCursor};
pub use layers::Layers;
pub use snapshot::{FrozenTree, OpenError, Snapshot, TokenizerId, WriteError};
