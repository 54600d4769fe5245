//! The persistent store: the third stage of the data flow.
//!
//! - [`snapshot`]: the file format, an rkyv archive of every namespace's tree, mmapped
//!   and read in place.
//! - [`dir`]: a store directory, its numbered snapshots and the `CURRENT` manifest.
//! - [`double_buffer`]: two copies of the live state, so that readers never wait.
//! - [`layered`]: base (snapshot) + delta (appended since) − evicted, read as one tree.

pub mod build;
pub mod dir;
pub mod double_buffer;
pub(crate) mod faults;
pub mod fuzzing;
pub mod layered;
pub mod live;
pub mod snapshot;
pub mod wal;

pub use layered::{Layered, LayeredCursor};
pub use snapshot::{FrozenTree, OpenError, Snapshot, TokenizerId, WriteError};
