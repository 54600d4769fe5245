//! Snapshot files: the global trees of every namespace, frozen into one rkyv archive that
//! is read zero-copy from an mmap. The byte layout is in `docs/snapshot-format.md`.
//!
//! Shaped after fst: [`Snapshot`] is immutable and generic over where its bytes live
//! (an mmap or a heap buffer); [`Snapshot::open`] checks only the header, the footer and
//! the archive's structure, which costs the same for any size; [`Snapshot::verify`]
//! reads everything (checksum, then every tree invariant); [`write_snapshot`] is the
//! separate builder.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rkyv::rancor;

use crate::tree::{GlobalTree, Node, SeqEntry, Storage, TreeParts, WideChild};

use super::fs::{Directory, DiskDirectory, FileBytes};

/// The first eight bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"SUFFIXD\0";
/// The last eight bytes of every snapshot file.
pub const FOOTER_MAGIC: [u8; 8] = *b"SFXDEND\0";
/// The format version this build writes. It reads this version and every older one.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes in the header; the archive starts here (a multiple of rkyv's alignment).
pub const HEADER_LEN: usize = 128;
/// Bytes in the footer.
pub const FOOTER_LEN: usize = 32;
/// Header flag (bytes 76..80, bit 0): the children lists of wide (indexed) nodes are in
/// descending count order.
pub const FLAG_WIDE_LISTS_SORTED: u32 = 1;

pub use crate::vocab::TokenizerId;

mod write;
pub use write::{write_snapshot, write_snapshot_to};

/// Errors from opening or verifying a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file could not be read.
    #[error("cannot read snapshot {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("snapshot {0} is empty (zero bytes): it was never written completely; delete it")]
    Empty(PathBuf),
    /// The file does not start with the snapshot magic.
    #[error("{0} is not a suffixd snapshot (wrong magic bytes)")]
    ForeignFile(PathBuf),
    /// The file is from a newer suffixd.
    #[error(
        "snapshot {path} has format version {found}; this suffixd reads up to {FORMAT_VERSION}: upgrade suffixd"
    )]
    NewerVersion {
        /// The file.
        path: PathBuf,
        /// Its format version.
        found: u32,
    },
    /// The file is shorter than its header says.
    #[error(
        "snapshot {path} is truncated: {actual} bytes, the header says {expected}; restore it, or rebuild it with `suffixd build` into a new directory"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        actual: u64,
        /// The length the header gives.
        expected: u64,
    },
    /// A checksum or structural check failed.
    #[error(
        "snapshot {path} is corrupt: {what}; restore it, or rebuild it with `suffixd build` into a new directory"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What failed.
        what: String,
    },
    /// The snapshot was built with a different tokenizer than the model's.
    #[error(
        "snapshot {path} was built for {found}, but the model's tokenizer is {expected}; rebuild it with this model's tokenizer or point --snapshot-dir elsewhere"
    )]
    TokenizerMismatch {
        /// The file.
        path: PathBuf,
        /// Its tokenizer.
        found: TokenizerId,
        /// The model's.
        expected: TokenizerId,
    },
}

/// Errors from writing a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The file or its directory could not be written.
    #[error(
        "cannot write snapshot {path}: {source}; check the directory exists and has free space"
    )]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The fixed-size header, as decoded.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// Format version of the file.
    pub format_version: u32,
    /// Tokenizer of the token ids.
    pub tokenizer: TokenizerId,
    /// Depth limit of every tree.
    pub max_depth: u32,
    /// Namespaces.
    pub namespaces: u32,
    /// Cached tokens, all namespaces.
    pub tokens: u64,
    /// Cached sequences, all namespaces.
    pub sequences: u64,
    /// When it was written, in ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// The last write-ahead-log record folded into this snapshot (0: none).
    pub wal_seq: u64,
    /// The id of the log `wal_seq` counts in ([`crate::store::wal::Wal::log_id`]); 0 for
    /// snapshots built from files and for files written before the field existed.
    pub log_id: u64,
    /// Bytes in the archive.
    pub archive_len: u64,
    /// Every tree's wide children lists are in descending count order (flag bit 0).
    /// Files written before the flag existed have it clear and are read as unsorted.
    pub wide_lists_sorted: bool,
}

/// Per-sequence data the store keeps beside the tree, in the tree's sequence order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize)]
pub struct SeqMeta {
    /// Sequence id.
    pub id: u64,
    /// When it was inserted, ms since the Unix epoch.
    pub inserted_ms: u64,
    /// When it last contributed to an accepted draft (or was inserted), ms since the epoch.
    pub last_use_ms: u64,
}

/// One namespace's tree, as archived. Node and sequence tables are flat integer vectors
/// so that their archived form has exactly the in-memory layout of the arena on a
/// little-endian machine, and is used in place. The writer's fields borrow the tree's
/// own tables (seen as words), so writing a snapshot copies none of them.
#[derive(rkyv::Archive, rkyv::Serialize)]
struct NamespaceImage<'a> {
    #[rkyv(with = rkyv::with::AsString)]
    name: &'a str,
    max_depth: u32,
    live_tokens: u64,
    /// `Node` records, 4 × u32 each.
    #[rkyv(with = rkyv::with::AsVec)]
    nodes: &'a [u32],
    #[rkyv(with = rkyv::with::AsVec)]
    lens: &'a [u8],
    #[rkyv(with = rkyv::with::AsVec)]
    pool: &'a [u32],
    /// `WideChild` records, 3 × u32 each, sorted.
    #[rkyv(with = rkyv::with::AsVec)]
    wide: &'a [u32],
    /// `SeqEntry` records, 3 × u64 each.
    #[rkyv(with = rkyv::with::AsVec)]
    seqs: &'a [u64],
    #[rkyv(with = rkyv::with::AsVec)]
    meta: &'a [SeqMeta],
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct SnapshotImage<'a> {
    namespaces: Vec<NamespaceImage<'a>>,
}

/// The archived root, as a reader sees it.
type ArchivedRoot = ArchivedSnapshotImage<'static>;

/// One namespace to write: its tree and the metadata of its live sequences, in the
/// tree's sequence order.
pub struct NamespaceInput<'a> {
    /// Namespace name.
    pub name: &'a str,
    /// Its tree. Compacted trees only: removed sequences are not written.
    pub tree: &'a GlobalTree,
    /// Metadata of the live sequences, in the order of `tree.ids()`.
    pub meta: &'a [SeqMeta],
}

/// A namespace built to be written: its name, its tree, and the metadata of its live
/// sequences in the tree's order.
pub type BuiltNamespace = (String, GlobalTree, Vec<SeqMeta>);

impl<'a> NamespaceInput<'a> {
    /// Inputs that borrow namespaces built to be written.
    pub fn borrowing(built: &'a [BuiltNamespace]) -> Vec<Self> {
        built
            .iter()
            .map(|(name, tree, meta)| NamespaceInput { name, tree, meta })
            .collect()
    }
}

/// Records as the words they are made of: the inverse of [`cast`].
fn words<P, T: PlainRecord<P>>(records: &[T]) -> &[P] {
    let per = std::mem::size_of::<T>() / std::mem::size_of::<P>();
    // SAFETY: `PlainRecord` promises T is `repr(C)`, made of `P`s only, no padding, so
    // its bytes are `per` initialized `P`s, aligned for P (T's alignment is P's).
    unsafe { std::slice::from_raw_parts(records.as_ptr() as *const P, records.len() * per) }
}

fn encode_header(h: &Header) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&h.format_version.to_le_bytes());
    b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    b[16..20].copy_from_slice(&h.tokenizer.vocab_size.to_le_bytes());
    b[20..24].copy_from_slice(&h.max_depth.to_le_bytes());
    b[24..32].copy_from_slice(&h.tokenizer.vocab_hash.to_le_bytes());
    b[32..40].copy_from_slice(&h.tokens.to_le_bytes());
    b[40..48].copy_from_slice(&h.sequences.to_le_bytes());
    b[48..56].copy_from_slice(&h.created_unix_ms.to_le_bytes());
    b[56..64].copy_from_slice(&h.wal_seq.to_le_bytes());
    b[64..72].copy_from_slice(&h.archive_len.to_le_bytes());
    b[72..76].copy_from_slice(&h.namespaces.to_le_bytes());
    b[76..80].copy_from_slice(&(h.wide_lists_sorted as u32 * FLAG_WIDE_LISTS_SORTED).to_le_bytes());
    b[80..88].copy_from_slice(&h.log_id.to_le_bytes());
    let crc = crc32fast::hash(&b[..HEADER_LEN - 4]);
    b[HEADER_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decode and check the header and footer of a whole file's bytes.
fn decode_frame(path: &Path, b: &[u8]) -> Result<Header, OpenError> {
    if b.is_empty() {
        return Err(OpenError::Empty(path.into()));
    }
    if b.len() < 8 || b[..8] != MAGIC {
        return Err(OpenError::ForeignFile(path.into()));
    }
    let corrupt = |what: &str| OpenError::Corrupt {
        path: path.into(),
        what: what.into(),
    };
    if b.len() < HEADER_LEN {
        return Err(OpenError::Truncated {
            path: path.into(),
            actual: b.len() as u64,
            expected: HEADER_LEN as u64,
        });
    }
    let version = u32_at(b, 8);
    if version > FORMAT_VERSION {
        return Err(OpenError::NewerVersion {
            path: path.into(),
            found: version,
        });
    }
    if crc32fast::hash(&b[..HEADER_LEN - 4]) != u32_at(b, HEADER_LEN - 4) {
        return Err(corrupt("header checksum mismatch"));
    }
    if version == 0 || u32_at(b, 12) as usize != HEADER_LEN {
        return Err(corrupt("bad header version or length"));
    }
    let h = Header {
        format_version: version,
        tokenizer: TokenizerId {
            vocab_size: u32_at(b, 16),
            vocab_hash: u64_at(b, 24),
        },
        max_depth: u32_at(b, 20),
        tokens: u64_at(b, 32),
        sequences: u64_at(b, 40),
        created_unix_ms: u64_at(b, 48),
        wal_seq: u64_at(b, 56),
        archive_len: u64_at(b, 64),
        namespaces: u32_at(b, 72),
        wide_lists_sorted: u32_at(b, 76) & FLAG_WIDE_LISTS_SORTED != 0,
        log_id: u64_at(b, 80),
    };
    let expected = (HEADER_LEN as u64)
        .checked_add(h.archive_len)
        .and_then(|x| x.checked_add(FOOTER_LEN as u64))
        .ok_or_else(|| corrupt("archive length overflows"))?;
    if (b.len() as u64) < expected {
        return Err(OpenError::Truncated {
            path: path.into(),
            actual: b.len() as u64,
            expected,
        });
    }
    if (b.len() as u64) > expected {
        return Err(corrupt("trailing bytes after the footer"));
    }
    let f = &b[b.len() - FOOTER_LEN..];
    if f[24..32] != FOOTER_MAGIC || u64_at(f, 8) != h.archive_len {
        return Err(corrupt("bad footer"));
    }
    Ok(h)
}

/// A read-only slice of a snapshot's bytes, typed; keeps the bytes alive.
pub struct Mapped<T> {
    ptr: *const T,
    len: usize,
    /// The bytes' owner (a [`Snapshot`]'s `B`), kept alive, never read.
    _owner: Arc<dyn Send + Sync>,
}

impl<T> Clone for Mapped<T> {
    fn clone(&self) -> Self {
        Mapped {
            ptr: self.ptr,
            len: self.len,
            _owner: self._owner.clone(),
        }
    }
}

// SAFETY: the memory is immutable for the lifetime of `_owner`, which is Send + Sync.
unsafe impl<T: Sync> Send for Mapped<T> {}
unsafe impl<T: Sync> Sync for Mapped<T> {}

impl<T> std::ops::Deref for Mapped<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr..ptr+len` was checked to lie inside `_owner`'s bytes, aligned
        // for T, when the Mapped was made, and those bytes never move or change.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Tables read in place from a snapshot: the [`Storage`] of a frozen [`GlobalTree`].
#[derive(Clone, Debug)]
pub struct Frozen;

impl Storage for Frozen {
    type Nodes = Mapped<Node>;
    type Lens = Mapped<u8>;
    type Pool = Mapped<u32>;
    type Seqs = Mapped<SeqEntry>;
    type Index = [WideChild];
    type IndexRef = Mapped<WideChild>;
    const EDITABLE: bool = false;
}

/// A global tree read in place from a snapshot.
pub type FrozenTree = GlobalTree<Frozen>;

#[cfg(target_endian = "big")]
compile_error!("snapshots are read in place and assume a little-endian machine");

/// Marker for plain-integer records that any bit pattern makes valid.
///
/// # Safety
/// Implementors are `repr(C)`, made only of the integer type `P` (no padding), with
/// the size a multiple of `P`'s.
unsafe trait PlainRecord<P>: Sized {}
unsafe impl PlainRecord<u32> for Node {}
unsafe impl PlainRecord<u32> for WideChild {}
unsafe impl PlainRecord<u64> for SeqEntry {}
unsafe impl PlainRecord<u32> for u32 {}
unsafe impl PlainRecord<u8> for u8 {}

/// View an archived vector of little-endian integers as records of `T`.
fn cast<P, A, T: PlainRecord<P>, B: Send + Sync + 'static>(
    owner: &Arc<B>,
    archived: &rkyv::vec::ArchivedVec<A>,
    what: &str,
) -> Result<Mapped<T>, String> {
    const { assert!(std::mem::size_of::<A>() == std::mem::size_of::<P>()) };
    const { assert!(std::mem::align_of::<A>() == std::mem::align_of::<P>()) };
    let per = std::mem::size_of::<T>() / std::mem::size_of::<P>();
    if !archived.len().is_multiple_of(per) {
        return Err(format!(
            "{what}: {} words is not whole records",
            archived.len()
        ));
    }
    let ptr = archived.as_ptr() as *const T;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(format!("{what}: misaligned"));
    }
    Ok(Mapped {
        ptr,
        len: archived.len() / per,
        _owner: owner.clone() as Arc<dyn Send + Sync>,
    })
}

/// One namespace of an open snapshot.
pub struct FrozenNamespace {
    /// Namespace name.
    pub name: String,
    /// Its tree, read in place.
    pub tree: FrozenTree,
    /// Metadata of its sequences, in the tree's sequence order.
    pub meta: Vec<SeqMeta>,
}

/// An open snapshot, over bytes of type `B`: a read-only memory map of the file
/// ([`Snapshot::open`]), or any buffer ([`Snapshot::from_bytes`]: tests, fuzzing, a
/// file received whole).
pub struct Snapshot<B = FileBytes> {
    path: PathBuf,
    header: Header,
    bytes: Arc<B>,
}

impl Snapshot {
    /// Map the file at `path` and check its header, footer and archive structure. Cost
    /// does not grow with the file: token and node data are not read. When `expected`
    /// is given, a snapshot of another tokenizer is refused.
    pub fn open(path: &Path, expected: Option<TokenizerId>) -> Result<Self, OpenError> {
        Self::open_in(&DiskDirectory, path, expected)
    }

    /// [`Snapshot::open`] on the file at `path` in `fs`.
    pub fn open_in(
        fs: &dyn Directory,
        path: &Path,
        expected: Option<TokenizerId>,
    ) -> Result<Self, OpenError> {
        let io = |source| OpenError::Io {
            path: path.into(),
            source,
        };
        fs.refuse_non_regular(path, "snapshot").map_err(io)?;
        // Snapshot files are never modified after the rename that publishes them (new
        // snapshots are new files), so a mapping does not change under its readers.
        let bytes = fs.map(path).map_err(io)?;
        if bytes.as_ref().is_empty() {
            return Err(OpenError::Empty(path.into()));
        }
        Self::from_bytes(path, bytes, expected)
    }
}

impl<B: AsRef<[u8]> + Send + Sync + 'static> Snapshot<B> {
    /// A snapshot over bytes already in memory. `path` is only used in error messages.
    /// The archive must be aligned as the file's would be (16 bytes, as a page or
    /// rkyv's `AlignedVec<16>` is); misaligned bytes are refused as corrupt.
    pub fn from_bytes(
        path: &Path,
        bytes: B,
        expected: Option<TokenizerId>,
    ) -> Result<Self, OpenError> {
        let header = decode_frame(path, bytes.as_ref())?;
        if let Some(want) = expected
            && want != header.tokenizer
        {
            return Err(OpenError::TokenizerMismatch {
                path: path.into(),
                found: header.tokenizer,
                expected: want,
            });
        }
        let s = Snapshot {
            path: path.into(),
            header,
            bytes: Arc::new(bytes),
        };
        s.archive()?;
        Ok(s)
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file this snapshot was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the file.
    pub fn file_len(&self) -> u64 {
        (*self.bytes).as_ref().len() as u64
    }

    fn corrupt(&self, what: impl Into<String>) -> OpenError {
        OpenError::Corrupt {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    fn archive_bytes(&self) -> &[u8] {
        let b = (*self.bytes).as_ref();
        &b[HEADER_LEN..HEADER_LEN + self.header.archive_len as usize]
    }

    fn archive(&self) -> Result<&ArchivedRoot, OpenError> {
        rkyv::access::<ArchivedRoot, rancor::Error>(self.archive_bytes())
            .map_err(|e| self.corrupt(format!("archive structure: {e}")))
    }

    /// The trees of every namespace, read in place.
    pub fn namespaces(&self) -> Result<Vec<FrozenNamespace>, OpenError> {
        let archive = self.archive()?;
        let mut out = Vec::with_capacity(archive.namespaces.len());
        for ns in archive.namespaces.iter() {
            let c = |e: String| self.corrupt(format!("namespace {}: {e}", ns.name));
            let parts = TreeParts::<Frozen> {
                max_depth: ns.max_depth.to_native() as usize,
                nodes: cast(&self.bytes, &ns.nodes, "nodes").map_err(c)?,
                lens: cast(&self.bytes, &ns.lens, "lens").map_err(c)?,
                pool: cast(&self.bytes, &ns.pool, "pool").map_err(c)?,
                child_index: cast(&self.bytes, &ns.wide, "index").map_err(c)?,
                seqs: cast(&self.bytes, &ns.seqs, "sequences").map_err(c)?,
                wide_lists_sorted: self.header.wide_lists_sorted,
            };
            if ns.meta.len() != parts.seqs.len() {
                return Err(c(
                    "sequence metadata does not match the sequence table".into()
                ));
            }
            let tree = GlobalTree::from_parts(parts).map_err(|e| c(e.to_string()))?;
            if tree.cached_tokens() != ns.live_tokens.to_native() {
                return Err(c("live token count differs from the sequence table".into()));
            }
            let meta = ns
                .meta
                .iter()
                .map(|m| SeqMeta {
                    id: m.id.to_native(),
                    inserted_ms: m.inserted_ms.to_native(),
                    last_use_ms: m.last_use_ms.to_native(),
                })
                .collect();
            out.push(FrozenNamespace {
                name: ns.name.to_string(),
                tree,
                meta,
            });
        }
        Ok(out)
    }

    /// Read everything: the archive checksum, token ids against the vocabulary, then
    /// every tree invariant of every namespace. O(tokens × depth); for `suffixd inspect
    /// --verify`, the admin API, and before a snapshot is published or built upon.
    pub fn verify(&self) -> Result<(), OpenError> {
        self.verify_with(true)
    }

    /// [`Snapshot::verify`] without the tree invariants: the archive checksum, token ids
    /// and header counts, O(bytes). For a file received from elsewhere (a replica's
    /// published snapshot), which the checksum shows arrived as written; the invariants
    /// are then checked off the request path, as for a local snapshot at start.
    pub fn verify_received(&self) -> Result<(), OpenError> {
        self.verify_with(false)
    }

    fn verify_with(&self, invariants: bool) -> Result<(), OpenError> {
        let b = (*self.bytes).as_ref();
        let footer = &b[b.len() - FOOTER_LEN..];
        if crc32fast::hash(self.archive_bytes()) != u32_at(footer, 0) {
            return Err(self.corrupt("archive checksum mismatch"));
        }
        let mut tokens = 0u64;
        let mut sequences = 0u64;
        let vocab = self.header.tokenizer.vocab_size;
        for ns in self.namespaces()? {
            // A damaged id would reach the model as a draft token.
            if self.header.tokenizer != TokenizerId::UNKNOWN
                && let Some(bad) = ns.tree.pool_tokens().iter().find(|&&t| t >= vocab)
            {
                return Err(self.corrupt(format!(
                    "namespace {}: token id {bad} is outside the vocabulary of {vocab}",
                    ns.name
                )));
            }
            if invariants {
                ns.tree
                    .check_integrity()
                    .map_err(|e| self.corrupt(format!("namespace {}: {e}", ns.name)))?;
            }
            tokens += ns.tree.cached_tokens();
            sequences += ns.tree.len() as u64;
        }
        if tokens != self.header.tokens || sequences != self.header.sequences {
            return Err(self.corrupt("header counts differ from the trees"));
        }
        Ok(())
    }
}
