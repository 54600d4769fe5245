//! The live store: the mmapped snapshot (base), the sequences appended since (delta), the
//! base sequences evicted since, and the write-ahead log, per namespace.
//!
//! - Open: the current snapshot, then the WAL replayed after the snapshot's last record.
//! - Append: WAL first (durable before the call returns, by default), then the delta.
//! - Evict: by least recent use within a token budget and a maximum age, or explicitly
//!   by id, namespace or age. It takes effect for speculation at once, for base data too
//!   (through the evicted tree); the space comes back at compaction.
//! - Snapshot / compaction: the live sequences are copied out at a cut, a new snapshot
//!   is built and written with no lock held, then swapped in; what changed meanwhile is
//!   carried over.
//! - Readers (speculation, stats) never wait: the state is double-buffered
//!   ([`DoubleBuffered`]), and every change is applied to the copy nobody reads first.
//!   Writers wait for each other, and for the last readers of the old copy.
//!
//! `open.rs` opens a directory, `compact.rs` writes and verifies snapshots; the state,
//! appends and evictions are here.

mod compact;
mod open;
mod touches;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::tree::{GlobalTree, TreeError};

use super::change::{Change, EvictScope};
use super::double_buffer::{DoubleBuffered, Writer};
use super::fs::{DirLock, Directory, DiskDirectory};
use super::last_use::LastUse;
use super::layered::Layered;
use super::layers::Layers;
use super::manifest::{DirError, current_snapshot, next_snapshot_path, publish, snapshot_files};
use super::snapshot::{
    NamespaceInput, OpenError, SeqMeta, Snapshot, TokenizerId, WriteError, write_snapshot,
};
use super::wal::{
    Damage, FsyncPolicy, Wal, WalCheck, WalError, check_dir, quarantine, read_segment, segments,
};

/// How a store behaves.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The store directory (snapshots and logs).
    pub dir: PathBuf,
    /// Where `dir` is: the disk ([`DiskDirectory`]), or memory in tests.
    pub directory: Arc<dyn Directory>,
    /// Depth limit of new trees (a snapshot's own depth wins when one is opened).
    pub max_depth: usize,
    /// Tokenizer of the model: snapshots and logs of another are refused.
    pub tokenizer: TokenizerId,
    /// When the log is fsynced.
    pub fsync: FsyncPolicy,
    /// Most cached tokens over all namespaces; least recently used go first.
    pub budget_tokens: Option<u64>,
    /// Evict sequences not used for this long.
    pub max_age_ms: Option<u64>,
    /// The replica tag this store's own appends carry in their ids (see [`own_ids`]);
    /// 0 for a store that does not replicate.
    pub id_origin: u16,
}

impl StoreConfig {
    /// A store in `dir` for `tokenizer`'s ids, as `suffixd serve` runs it by default:
    /// trees of depth 24, every append fsynced before it is acknowledged, no budget or
    /// age limit, not replicating, on disk. Change the rest with struct update syntax.
    pub fn new(dir: impl Into<PathBuf>, tokenizer: TokenizerId) -> Self {
        StoreConfig {
            dir: dir.into(),
            directory: Arc::new(DiskDirectory),
            max_depth: crate::tree::DEFAULT_MAX_DEPTH,
            tokenizer,
            fsync: FsyncPolicy::Always,
            budget_tokens: None,
            max_age_ms: None,
            id_origin: 0,
        }
    }
}

/// Bits of a sequence id below the replica tag: a replica appends up to 2^40 sequences.
pub const ID_ORIGIN_SHIFT: u32 = 40;

/// The largest replica tag: ids stay below 2^52, exact as JSON numbers in any client.
pub const MAX_ID_ORIGIN: u16 = (1 << 12) - 1;

/// The ids a store with replica tag `origin` hands out to its own appends. Replicas share
/// ids: a sequence is known by the same id everywhere, so applying a record twice is a
/// no-op and an eviction by id means the same sequence on every replica.
pub fn own_ids(origin: u16) -> std::ops::Range<u64> {
    let first = (origin as u64) << ID_ORIGIN_SHIFT;
    first..first + (1 << ID_ORIGIN_SHIFT)
}

/// Bytes of resident memory one cached token takes in the live store, rounded up from
/// a measurement: the 15,266 ShareGPT responses (5.1 M tokens) appended through
/// `suffixd ingest` raised its peak RSS by 350 MB (69 bytes a token).
pub const BYTES_PER_CACHED_TOKEN: u64 = 80;

/// The most changes [`Store::apply`] takes in one group: a namespace of a million
/// sequences is evicted in groups, so no append waits behind one long hold of the
/// writer's lock.
pub const GROUP_MAX: usize = 4096;

/// The most a default budget holds: 8 M tokens (about 640 MB resident), well above a
/// busy server's day of distinct responses.
pub const DEFAULT_BUDGET_CAP_TOKENS: u64 = 8_000_000;

/// The token budget of a server started without one: a sixteenth of the memory this
/// process may use (the cgroup's limit in a container, else the machine's), at
/// [`BYTES_PER_CACHED_TOKEN`], and at most [`DEFAULT_BUDGET_CAP_TOKENS`]. When the memory
/// cannot be read, the cap.
pub fn default_budget_tokens() -> u64 {
    match usable_memory_bytes() {
        Some(bytes) => (bytes / 16 / BYTES_PER_CACHED_TOKEN).clamp(1, DEFAULT_BUDGET_CAP_TOKENS),
        None => DEFAULT_BUDGET_CAP_TOKENS,
    }
}

/// The memory this process may use: the smaller of the cgroup v2 limit (`max` means
/// none) and the machine's total.
pub fn usable_memory_bytes() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    match (cgroup, total) {
        (Some(c), Some(t)) => Some(c.min(t)),
        (c, t) => c.or(t),
    }
}

/// Errors from opening a store ([`Store::open`]): it does not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreOpenError {
    /// The current snapshot could not be opened.
    #[error(transparent)]
    Snapshot(#[from] OpenError),
    /// The directory or manifest (a second process holding the store included).
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The write-ahead log could not be read.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// A logged change could not be replayed.
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// Errors from changing a store (append, evict, budgets). A change whose log write or
/// fsync failed was not applied and is not acknowledged; the store goes on.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The write-ahead log refused the change (a full or failing disk).
    #[error(transparent)]
    Wal(#[from] WalError),
    /// A tree refused the change.
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// Errors from writing a snapshot (also compaction) or from the check before it. The
/// live snapshot and the log stay as they were.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The new snapshot did not read back whole.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The new snapshot could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The directory or manifest.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The log could not be cut or trimmed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// A tree could not be built.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The live snapshot failed verification, so no new one is built from it.
    #[error(
        "not writing a snapshot: the live snapshot failed verification ({0}), and a new one would copy its damage and delete it. Restore it from a backup, or move it and CURRENT aside to start from the log"
    )]
    DamagedBase(Box<OpenError>),
}

/// A live sequence copied out for a snapshot: its metadata and tokens.
type SeqCopy = (SeqMeta, Vec<u32>);

/// Per-sequence bookkeeping.
#[derive(Clone, Copy, Debug)]
struct SeqInfo {
    inserted_ms: u64,
    last_use_ms: u64,
}

/// One namespace: its trees (base + delta − evicted) and its sequences' metadata.
#[derive(Clone)]
pub struct Namespace {
    trees: Layers,
    seqs: HashMap<u64, SeqInfo>,
}

impl Namespace {
    fn new(trees: Layers) -> Self {
        Namespace {
            trees,
            seqs: HashMap::new(),
        }
    }

    /// The view speculation reads.
    pub fn view(&self) -> Layered<'_> {
        self.trees.view()
    }

    /// Cached tokens.
    pub fn tokens(&self) -> u64 {
        self.trees.cached_tokens()
    }

    /// Cached sequences.
    pub fn sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Ids of the cached sequences, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.seqs.keys().copied()
    }

    /// The tokens of a cached sequence.
    pub fn tokens_of(&self, id: u64) -> Option<Vec<u32>> {
        self.trees.sequence(id).map(<[u32]>::to_vec)
    }

    fn remove(&mut self, id: u64) -> Result<bool, TreeError> {
        if self.seqs.remove(&id).is_none() {
            return Ok(false);
        }
        self.trees.remove(id)?;
        self.trees.compact_delta_if_dead();
        Ok(true)
    }
}

/// Everything readers see; see [`DoubleBuffered`].
#[derive(Clone)]
pub struct State {
    /// Namespaces by name.
    pub namespaces: BTreeMap<String, Namespace>,
    snapshot: Option<Arc<Snapshot>>,
    /// Cached sequences in last-use order.
    lru: LastUse,
    next_id: u64,
    /// This store's own cached sequences (ids under its tag) and their namespaces, in id
    /// order: what replication publishes, found without scanning every namespace.
    own: BTreeMap<u64, String>,
    /// Changes since the last snapshot's cut, to carry over at the swap.
    since_cut: Vec<(u64, Change)>,
}

impl State {
    /// An empty state.
    fn new(cfg: &StoreConfig) -> State {
        State {
            namespaces: BTreeMap::new(),
            snapshot: None,
            lru: LastUse::new(),
            next_id: own_ids(cfg.id_origin).start + 1,
            own: BTreeMap::new(),
            since_cut: Vec::new(),
        }
    }

    /// The state `snap` holds: its namespaces over their frozen trees, with last-use
    /// times from the snapshot, or from `fresher` where it knows a later one. Own ids
    /// move `next_id` past them.
    fn from_snapshot(
        cfg: &StoreConfig,
        snap: Snapshot,
        next_id: u64,
        fresher: impl Fn(&str, u64) -> Option<u64>,
    ) -> Result<State, OpenError> {
        let mut state = State {
            next_id,
            ..State::new(cfg)
        };
        let mut used = Vec::new();
        for ns in snap.namespaces()? {
            let mut seqs = HashMap::new();
            for m in &ns.meta {
                let last_use =
                    fresher(&ns.name, m.id).map_or(m.last_use_ms, |t| t.max(m.last_use_ms));
                seqs.insert(
                    m.id,
                    SeqInfo {
                        inserted_ms: m.inserted_ms,
                        last_use_ms: last_use,
                    },
                );
                used.push((last_use, ns.name.clone(), m.id));
                state.next_id = next_own_id(cfg, state.next_id, m.id);
                if own_ids(cfg.id_origin).contains(&m.id) {
                    state.own.insert(m.id, ns.name.clone());
                }
            }
            let n = Namespace {
                trees: Layers::over(ns.tree).map_err(|e| OpenError::Corrupt {
                    path: snap.path().to_path_buf(),
                    what: format!("namespace {}: {e}", ns.name),
                })?,
                seqs,
            };
            state.namespaces.insert(ns.name, n);
        }
        state.lru = LastUse::from_times(used);
        state.snapshot = Some(Arc::new(snap));
        Ok(state)
    }
}

/// Counters for stats and metrics.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StoreCounters {
    /// Sequences appended since start.
    pub appended: u64,
    /// Sequences evicted since start.
    pub evicted: u64,
    /// Snapshots written since start.
    pub snapshots: u64,
    /// WAL records replayed at start.
    pub replayed: u64,
    /// Appends that failed (a full or failing disk): those responses were served but
    /// not cached.
    pub append_failures: u64,
}

/// What [`Store::stats`] reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StoreStats {
    /// Tokens of the cached sequences, all namespaces.
    pub cached_tokens: u64,
    /// Cached sequences, all namespaces.
    pub cached_sequences: usize,
    /// Per namespace.
    pub namespaces: BTreeMap<String, NamespaceStats>,
    /// The live snapshot, if there is one.
    pub snapshot: Option<SnapshotStats>,
    /// Read layers: the snapshot, if any, and the delta.
    pub segments: u32,
    /// Bytes of the store directory's files.
    pub disk_bytes: u64,
    /// Heap bytes of every delta and evicted tree: what the snapshot does not map.
    pub delta_resident_bytes: usize,
    /// Bytes of the current log segment.
    pub wal_bytes: u64,
    /// The last log sequence number written.
    pub wal_last_seq: u64,
    /// Counters since start.
    pub counters: StoreCounters,
    /// Damaged log segments found at open, recovered around.
    pub wal_damaged_at_open: Vec<DamagedSegment>,
    /// The token budget, if one is set.
    pub budget_tokens: Option<u64>,
}

/// One namespace in [`StoreStats`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct NamespaceStats {
    /// Cached sequences.
    pub sequences: usize,
    /// Their tokens.
    pub cached_tokens: u64,
    /// Tokens in the snapshot's tree, evicted ones included.
    pub base_tokens: u64,
    /// Tokens appended since the snapshot.
    pub delta_tokens: u64,
    /// Tokens evicted from the snapshot's tree, until a snapshot drops them.
    pub evicted_pending_compaction_tokens: u64,
    /// Heap bytes of the delta and evicted trees.
    pub delta_heap_bytes: usize,
}

/// The live snapshot in [`StoreStats`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotStats {
    /// Its file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Tokens it holds.
    pub tokens: u64,
    /// When it was written.
    pub created_unix_ms: u64,
}

/// A log segment found damaged at open, in [`StoreStats`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct DamagedSegment {
    /// The segment.
    pub segment: PathBuf,
    /// Its damaged runs.
    pub damage: Vec<Damage>,
}

/// The live store.
pub struct Store {
    cfg: StoreConfig,
    state: DoubleBuffered<State>,
    /// The next sequence id to hand out; taken under the writer lock, so own ids become
    /// readable in id order.
    next_id: AtomicU64,
    /// The highest own id whose append is readable ([`Store::last_own_id`]): every own id
    /// at or below it is cached or was evicted, none is still on its way in.
    last_own_id: AtomicU64,
    wal: Wal,
    snapshotting: Mutex<()>,
    counters: Mutex<StoreCounters>,
    /// Damaged log segments found at open (recovered around, copied to `damaged/`).
    wal_damage: Vec<(PathBuf, Vec<Damage>)>,
    /// The last snapshot file verified, and the outcome: each file is read once.
    verified: Mutex<Option<(PathBuf, Result<(), String>)>>,
    /// Last-use marks not applied yet ([`Store::touch`]).
    touches: touches::PendingTouches,
    /// An empty tree: the view of a namespace that does not exist (yet).
    empty: GlobalTree,
    /// The directory's lock, held while the store is open: one writer per directory.
    _lock: DirLock,
}

/// What [`Store::verify`] found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Verification {
    /// Whether the snapshot and every log segment are sound.
    pub ok: bool,
    /// The live snapshot, if there is one.
    pub snapshot: Option<PathBuf>,
    /// Why it failed verification.
    pub snapshot_error: Option<String>,
    /// The log.
    pub wal: WalCheck,
}

/// A summary of one snapshot written.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotInfo {
    /// The file.
    pub path: PathBuf,
    /// Cached tokens in it.
    pub tokens: u64,
    /// Sequences in it.
    pub sequences: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// The next id to hand out once `id` is cached: past it if it is one of this store's own,
/// else unchanged (another replica's ids, or older ones under another tag).
fn next_own_id(cfg: &StoreConfig, next: u64, id: u64) -> u64 {
    if own_ids(cfg.id_origin).contains(&id) {
        next.max(id + 1)
    } else {
        next
    }
}

/// Now, in ms since the epoch (the store's clock for append and last-use times).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Store {
    /// Apply one logged change; idempotent (an id already present is not added twice).
    fn apply_to(cfg: &StoreConfig, state: &mut State, op: &Change) -> Result<bool, TreeError> {
        match op {
            Change::Append {
                namespace,
                id,
                time_ms,
                tokens,
            } => {
                let ns = match state.namespaces.get_mut(namespace) {
                    Some(n) => n,
                    None => state
                        .namespaces
                        .entry(namespace.clone())
                        .or_insert(Namespace::new(Layers::new(cfg.max_depth)?)),
                };
                state.next_id = next_own_id(cfg, state.next_id, *id);
                if ns.seqs.contains_key(id) {
                    return Ok(false);
                }
                ns.trees.insert(*id, tokens)?;
                ns.seqs.insert(
                    *id,
                    SeqInfo {
                        inserted_ms: *time_ms,
                        last_use_ms: *time_ms,
                    },
                );
                state.lru.used(namespace, *id, *time_ms);
                if own_ids(cfg.id_origin).contains(id) {
                    state.own.insert(*id, namespace.clone());
                }
                Ok(true)
            }
            Change::Evict(EvictScope::Id { namespace, id }) => {
                let Some(ns) = state.namespaces.get_mut(namespace) else {
                    return Ok(false);
                };
                let removed = ns.remove(*id)?;
                state.lru.remove(namespace, *id);
                if removed {
                    state.own.remove(id);
                }
                Ok(removed)
            }
            // Never logged (`Wal::write` refuses them: the store logs the sequences
            // they removed), so never applied.
            Change::Evict(EvictScope::Namespace { .. } | EvictScope::UnusedSince { .. }) => {
                Ok(false)
            }
        }
    }

    /// Log, apply, then wait for the log to be durable: [`Store::commit_group`] of one.
    fn commit(&self, make: impl FnOnce() -> Change) -> Result<bool, ChangeError> {
        Ok(self.commit_group(|| vec![make()])? > 0)
    }

    /// Log and apply `changes` as one group: one hold of the writer lock, one write to
    /// the log, one fsync; returns how many changed the store. Evictions go through it:
    /// a budget that drops a thousand sequences costs one fsync, not a thousand, before
    /// the client whose append caused it gets its answer. At most [`GROUP_MAX`] changes.
    pub fn apply(&self, changes: Vec<Change>) -> Result<usize, ChangeError> {
        assert!(
            changes.len() <= GROUP_MAX,
            "a group of {} changes",
            changes.len()
        );
        if changes.is_empty() {
            return Ok(0);
        }
        self.commit_group(|| changes)
    }

    /// Log, apply, then wait for the log to be durable. Logging and applying happen
    /// under the writer lock, so a snapshot's cut sees a change in both or in neither;
    /// the fsync happens after it, where group commit can share it.
    ///
    /// `make` builds the changes under the writer lock: an own append takes its id
    /// there, so own ids are applied in id order and [`Store::last_own_id`] never passes
    /// one still on its way in (a replica's publisher reads "at or below it and not
    /// cached" as evicted, and would skip it for good).
    fn commit_group(&self, make: impl FnOnce() -> Vec<Change>) -> Result<usize, ChangeError> {
        let (last, changed) = {
            let mut writer = self.writer();
            let changes = make();
            let last = self.wal.write_group(&changes)?;
            let first = last + 1 - changes.len() as u64;
            let changed = writer.apply(|st| {
                // Every change is logged, so every one is applied and cut with the
                // log, even after one fails.
                let mut changed = 0;
                let mut failed = None;
                for (seq, op) in (first..).zip(&changes) {
                    match Self::apply_to(&self.cfg, st, op) {
                        Ok(c) => changed += c as usize,
                        Err(e) => failed = failed.or(Some(e)),
                    }
                    st.since_cut.push((seq, op.clone()));
                }
                failed.map_or(Ok(changed), Err)
            })?;
            for change in &changes {
                if let Change::Append { id, .. } = change
                    && own_ids(self.cfg.id_origin).contains(id)
                {
                    self.last_own_id.fetch_max(*id, Ordering::Release);
                }
            }
            (last, changed)
        };
        self.wal.sync(last)?;
        Ok(changed)
    }

    /// Evict these sequences (namespace, id), in groups of up to [`GROUP_MAX`] with one
    /// fsync each; returns how many were cached. Those not cached are not logged.
    pub fn evict_sequences(&self, victims: &[(String, u64)]) -> Result<usize, ChangeError> {
        let mut evicted = 0;
        for group in victims.chunks(GROUP_MAX) {
            let changes: Vec<Change> = {
                let st = self.state.read();
                group
                    .iter()
                    .filter(|(ns, id)| {
                        st.namespaces
                            .get(ns)
                            .is_some_and(|n| n.seqs.contains_key(id))
                    })
                    .map(|(ns, id)| Change::evict(ns.clone(), *id))
                    .collect()
            };
            let n = self.apply(changes)?;
            self.counters.lock().expect("counters").evicted += n as u64;
            evicted += n;
        }
        Ok(evicted)
    }

    /// Add a completed request's response to `namespace`; durable when this returns
    /// (with the default fsync policy). Returns its sequence id.
    pub fn append(&self, namespace: &str, tokens: &[u32]) -> Result<u64, ChangeError> {
        let mut id = 0;
        let committed = self.commit(|| {
            id = self.next_id.fetch_add(1, Ordering::Relaxed);
            Change::Append {
                namespace: namespace.into(),
                id,
                time_ms: now_ms(),
                tokens: tokens.to_vec(),
            }
        });
        if committed.is_err() {
            self.counters.lock().expect("counters").append_failures += 1;
        }
        committed?;
        self.counters.lock().expect("counters").appended += 1;
        self.enforce_budget()?;
        Ok(id)
    }

    /// Cache a sequence another replica appended, under its id there; returns false when
    /// it is cached already (a record delivered twice) or the id is one of this store's
    /// own (which it never takes from outside).
    pub fn append_replicated(
        &self,
        namespace: &str,
        id: u64,
        time_ms: u64,
        tokens: &[u32],
    ) -> Result<bool, ChangeError> {
        let known = own_ids(self.cfg.id_origin).contains(&id) || {
            let st = self.state.read();
            st.namespaces
                .get(namespace)
                .is_some_and(|n| n.seqs.contains_key(&id))
        };
        if known {
            return Ok(false);
        }
        let added = self.commit(|| Change::Append {
            namespace: namespace.into(),
            id,
            time_ms,
            tokens: tokens.to_vec(),
        })?;
        self.enforce_budget()?;
        Ok(added)
    }

    /// The last id this store handed out to its own appends, once that append is readable
    /// (0: none yet). Every own id at or below it is cached, was evicted, or belongs to an
    /// append that failed: none is still on its way in.
    pub fn last_own_id(&self) -> u64 {
        self.last_own_id.load(Ordering::Acquire)
    }

    /// Up to `limit` of this store's own cached sequences with ids above `after`, in id
    /// order, as the appends that cached them: what a replica still has to publish.
    pub fn own_appends_after(&self, after: u64, limit: usize) -> Vec<Change> {
        let st = self.state.read();
        st.own
            .range(after.saturating_add(1)..)
            .take(limit)
            .filter_map(|(&id, namespace)| {
                let ns = st.namespaces.get(namespace)?;
                Some(Change::Append {
                    namespace: namespace.clone(),
                    id,
                    time_ms: ns.seqs.get(&id)?.inserted_ms,
                    tokens: ns.tokens_of(id)?,
                })
            })
            .collect()
    }

    /// Evict what `scope` names; returns how many sequences went. Each is logged as
    /// its own eviction, in groups of up to [`GROUP_MAX`] with one fsync each.
    pub fn evict(&self, scope: &EvictScope) -> Result<usize, ChangeError> {
        if matches!(scope, EvictScope::UnusedSince { .. }) {
            self.apply_touches();
        }
        let victims: Vec<(String, u64)> = {
            let st = self.state.read();
            match scope {
                EvictScope::Id { namespace, id } => vec![(namespace.clone(), *id)],
                EvictScope::Namespace { namespace } => st
                    .namespaces
                    .get(namespace)
                    .map(|n| n.seqs.keys().map(|&id| (namespace.clone(), id)).collect())
                    .unwrap_or_default(),
                EvictScope::UnusedSince { cutoff_ms } => st
                    .lru
                    .unused_since(*cutoff_ms)
                    .map(|(ns, id)| (ns.to_string(), id))
                    .collect(),
            }
        };
        self.evict_sequences(&victims)
    }

    /// Evict least recently used sequences while over the token budget, and those older
    /// than the maximum age: each in one group (one fsync) when it fits in one.
    pub fn enforce_budget(&self) -> Result<(), ChangeError> {
        if let Some(age) = self.cfg.max_age_ms {
            self.evict(&EvictScope::UnusedSince {
                cutoff_ms: now_ms().saturating_sub(age),
            })?;
        }
        let Some(budget) = self.cfg.budget_tokens else {
            return Ok(());
        };
        self.apply_touches();
        loop {
            // The coldest sequences whose tokens bring the store back within budget.
            // Appends racing with this may leave it over: then another round.
            let victims: Vec<(String, u64)> = {
                let st = self.state.read();
                let total: u64 = st.namespaces.values().map(Namespace::tokens).sum();
                let mut over = total.saturating_sub(budget);
                st.lru
                    .coldest_first()
                    .map_while(|(ns, id)| {
                        (over > 0).then(|| {
                            let tokens = st
                                .namespaces
                                .get(ns)
                                .and_then(|n| n.trees.sequence(id))
                                .map_or(0, <[u32]>::len);
                            over = over.saturating_sub(tokens.max(1) as u64);
                            (ns.to_string(), id)
                        })
                    })
                    .take(GROUP_MAX)
                    .collect()
            };
            if victims.is_empty() || self.evict_sequences(&victims)? == 0 {
                return Ok(());
            }
        }
    }

    /// Mark sequences as used now (they contributed to an accepted draft). It never
    /// takes the writer's lock, so it never waits for a write or a snapshot's fsync: the
    /// mark waits in a side table until the next writer applies it
    /// ([`touches::PendingTouches`]).
    pub fn touch(&self, namespace: &str, ids: &[u64]) {
        self.touches.mark(namespace, ids, now_ms());
    }

    /// The state's writer, with the pending last-use marks applied first, so every change
    /// and every eviction sees them.
    fn writer(&self) -> Writer<'_, State> {
        let mut writer = self.state.writer();
        if let Some(marks) = self.touches.take() {
            writer.apply(|st| touches::apply(st, &marks));
        }
        writer
    }

    /// Apply the pending last-use marks now: before eviction picks its victims.
    fn apply_touches(&self) {
        if self.touches.is_pending() {
            drop(self.writer());
        }
    }

    /// Run `f` over namespace `name` as it stands now (`None` when there is none):
    /// speculation's and the tests' read access. It never waits for writers, but a
    /// writer waits for `f` to return (it changes the copy `f` reads once the last reader
    /// leaves it), so `f` must not wait on anything itself.
    pub fn with_namespace<R>(&self, name: &str, f: impl FnOnce(Option<&Namespace>) -> R) -> R {
        f(self.state.read().namespaces.get(name))
    }

    /// Call `f` with the drafting view of namespace `name`, under the read lock as
    /// [`Store::with_namespace`]: an empty view when the namespace does not exist (yet).
    pub fn with_view<R>(&self, name: &str, f: impl FnOnce(&Layered<'_>) -> R) -> R {
        match self.state.read().namespaces.get(name) {
            Some(ns) => f(&ns.view()),
            None => f(&Layered::new(None, &self.empty, &self.empty)),
        }
    }

    /// The names of the namespaces, in order.
    pub fn namespace_names(&self) -> Vec<String> {
        self.state.read().namespaces.keys().cloned().collect()
    }

    /// The whole state, for the store's own modules: held as briefly as
    /// [`Store::with_namespace`]'s closure.
    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read()
    }

    /// Sizes, files and counters: the store's part of `GET /admin/stats`.
    pub fn stats(&self) -> StoreStats {
        // Directory I/O and other locks first (the log's is held through a rotation's
        // fsync): a writer waits for the last readers of the copy it changes, so nothing
        // that can wait happens under the read guard.
        let disk_bytes = super::manifest::disk_bytes(&*self.cfg.directory, &self.cfg.dir);
        let counters = self.counters();
        let (wal_bytes, wal_last_seq) = (self.wal.current_bytes(), self.wal.last_seq());
        let st = self.read();
        let namespaces: BTreeMap<String, NamespaceStats> = st
            .namespaces
            .iter()
            .map(|(name, ns)| {
                let t = &ns.trees;
                let stats = NamespaceStats {
                    sequences: ns.sequences(),
                    cached_tokens: ns.tokens(),
                    base_tokens: t.base().map_or(0, |b| b.cached_tokens()),
                    delta_tokens: t.delta().cached_tokens(),
                    evicted_pending_compaction_tokens: t.evicted().cached_tokens(),
                    delta_heap_bytes: t.delta().heap_bytes() + t.evicted().heap_bytes(),
                };
                (name.clone(), stats)
            })
            .collect();
        StoreStats {
            cached_tokens: namespaces.values().map(|n| n.cached_tokens).sum(),
            cached_sequences: namespaces.values().map(|n| n.sequences).sum(),
            delta_resident_bytes: namespaces.values().map(|n| n.delta_heap_bytes).sum(),
            namespaces,
            snapshot: st.snapshot.as_ref().map(|s| SnapshotStats {
                path: s.path().to_path_buf(),
                bytes: s.file_len(),
                tokens: s.header().tokens,
                created_unix_ms: s.header().created_unix_ms,
            }),
            segments: st.snapshot.is_some() as u32 + 1,
            disk_bytes,
            wal_bytes,
            wal_last_seq,
            counters,
            wal_damaged_at_open: self
                .wal_damage
                .iter()
                .map(|(segment, damage)| DamagedSegment {
                    segment: segment.clone(),
                    damage: damage.clone(),
                })
                .collect(),
            budget_tokens: self.cfg.budget_tokens,
        }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// The filesystem the store keeps its files on: others who keep durable files
    /// beside the store's (replication) keep them here too.
    pub fn directory(&self) -> Arc<dyn Directory> {
        self.cfg.directory.clone()
    }

    /// Counters since start.
    pub fn counters(&self) -> StoreCounters {
        self.counters.lock().expect("counters").clone()
    }
}

#[cfg(test)]
mod tests;
