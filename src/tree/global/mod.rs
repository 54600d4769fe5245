//! The global suffix tree: a depth-limited, path-compressed suffix trie in a flat arena.
//!
//! Layout (all links are `u32` indices, no allocation per node):
//! - `pool`: every stored token, once. Sequences are contiguous ranges of it.
//! - `nodes`: 16-byte records `{start, count, first_child, next_sibling}`. An edge is the
//!   token range `pool[start .. start + len]`; `len` lives in the parallel byte array
//!   `lens` (7 bits of length, 1 bit "children indexed").
//! - `child_index`: a hash from `(node, token)` to child ([`WideIndex`]), only for nodes
//!   with many children (the root always), so that lookups stay O(1) where lists would be
//!   long.
//!
//! Invariants (checked by [`GlobalTree::check_integrity`]):
//! - Every suffix of every stored sequence, cut at `max_depth`, ends exactly at a node
//!   end, and COUNT(node) is the number of such suffixes passing through the node.
//! - A node's `start` points at a real occurrence of its whole path:
//!   `pool[start - depth(parent) .. start + len]` spells the path from the root. This lets
//!   extended speculation read on past the depth limit from a unique occurrence.
//! - Children lists are self-organising: a child that catches up with the head moves to
//!   the front, so the most likely continuation is found after a short scan.
//!
//! Removal decrements counts and frees nodes whose count reaches zero. The removed
//! tokens stay in the pool until [`GlobalTree::compact`] rebuilds the arena.
//!
//! Here: the types and the storage. Beside it: `build` (a tree from many sequences at
//! once, in parallel), `edit` (insert, remove, compact), `read` (walking, counts and
//! children, the [`GlobalIndex`] speculation reads), `check` (the integrity check),
//! `parts` (the tables a snapshot stores, lent and taken back) and `seq_blocks` (which
//! sequence holds a pool position).

use rustc_hash::FxHashMap;

use super::wide_index::WideIndex;
use super::{Child, Expand, GlobalIndex, MAX_SUPPORTED_DEPTH, NIL, common_suffix_len};

mod build;
mod check;
mod edit;
mod parts;
mod read;
mod seq_blocks;

pub use check::IntegrityError;

pub(crate) use seq_blocks::SeqBlocks;

const ROOT: u32 = 0;

const INDEXED: u8 = 0x80;

const LEN_MASK: u8 = 0x7f;

/// Children lists longer than this get a hash index. Measured on ShareGPT: 24 costs
/// 4 bytes per token less than 12 for about the same speed; 48 slows lookups.
const INDEX_FANOUT: usize = 24;

/// Threads [`GlobalTree::build`] uses at most: inserts wait on memory, and more threads
/// than this add copies of the pool for little gain.
const MAX_BUILD_THREADS: usize = 8;

/// Below this many tokens per thread, starting threads and copying the pool costs more
/// than it saves.
const MIN_TOKENS_PER_THREAD: usize = 1 << 15;

/// Errors from changing a [`GlobalTree`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    /// The sequence id is already stored.
    #[error("sequence id {0} is already in the tree; remove it first or use a new id")]
    DuplicateId(u64),
    /// The token pool would pass 2^32 tokens.
    #[error("the token pool is full (2^32 tokens); compact the tree or raise the eviction budget")]
    PoolFull,
    /// The depth limit is outside what the arena supports.
    #[error("max_depth must be between 1 and {MAX_SUPPORTED_DEPTH}, got {0}")]
    BadDepth(usize),
}

/// One arena node. `repr(C)` so that the same bytes can be archived for snapshots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub(crate) start: u32,
    pub(crate) count: u32,
    pub(crate) first_child: u32,
    pub(crate) next_sibling: u32,
}

impl Node {
    /// What a read of a node index outside the arena sees: an empty leaf, so that a
    /// damaged snapshot ends a walk instead of panicking or reading out of bounds.
    const OUTSIDE: Node = Node {
        start: 0,
        count: 0,
        first_child: NIL,
        next_sibling: NIL,
    };
}

/// One stored sequence, in pool order. Plain integers only (`live` is 0 or 1), so that
/// any bit pattern read from a snapshot is a valid value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqEntry {
    pub(crate) id: u64,
    pub(crate) offset: u32,
    pub(crate) len: u32,
    pub(crate) live: u32,
    pub(crate) reserved: u32,
}

/// A `(node, token) → child` entry of the child index of wide nodes, as frozen into a
/// snapshot: sorted by `(node, token)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WideChild {
    pub(crate) node: u32,
    pub(crate) token: u32,
    pub(crate) child: u32,
}

/// Lookup of the child of an indexed (wide) node.
pub trait ChildIndex {
    /// The child of `node` whose edge starts with `token`.
    fn child_of(&self, node: u32, token: u32) -> Option<u32>;

    /// Start loading what [`ChildIndex::child_of`] will read first. Only a hint.
    fn prefetch(&self, _node: u32, _token: u32) {}
}

impl ChildIndex for WideIndex {
    #[inline]
    fn child_of(&self, node: u32, token: u32) -> Option<u32> {
        self.get(node, token)
    }

    #[inline]
    fn prefetch(&self, node: u32, token: u32) {
        WideIndex::prefetch(self, node, token)
    }
}

impl ChildIndex for [WideChild] {
    #[inline]
    fn child_of(&self, node: u32, token: u32) -> Option<u32> {
        self.binary_search_by(|w| (w.node, w.token).cmp(&(node, token)))
            .ok()
            .map(|i| self[i].child)
    }
}

/// Where the tables of a [`GlobalTree`] live: growable vectors ([`Owned`], the only
/// storage that can be changed), read-only slices of a snapshot (see
/// [`crate::store::snapshot`]), or tables borrowed from an owned tree to be written
/// ([`Borrowed`]).
pub trait Storage {
    /// Node records.
    type Nodes: std::ops::Deref<Target = [Node]> + Clone;
    /// Edge lengths and flags, parallel to the nodes.
    type Lens: std::ops::Deref<Target = [u8]> + Clone;
    /// The token pool.
    type Pool: std::ops::Deref<Target = [u32]> + Clone;
    /// The sequence table, in pool order.
    type Seqs: std::ops::Deref<Target = [SeqEntry]> + Clone;
    /// The child index of wide nodes.
    type Index: ChildIndex + ?Sized;
    /// How the index is held.
    type IndexRef: std::ops::Deref<Target = Self::Index> + Clone;
    /// Whether trees on this storage can change. A clone of a changeable tree can then
    /// differ from its source, so it takes a new [`GlobalTree::version`]; a clone of a
    /// read-only one keeps it, and cursors taken on either stay valid on both.
    const EDITABLE: bool;
}

/// In-memory, growable storage: the only kind that accepts inserts and removals.
#[derive(Clone, Debug)]
pub struct Owned;

impl Storage for Owned {
    type Nodes = Vec<Node>;
    type Lens = Vec<u8>;
    type Pool = Vec<u32>;
    type Seqs = Vec<SeqEntry>;
    type Index = WideIndex;
    type IndexRef = Box<WideIndex>;
    const EDITABLE: bool = true;
}

/// The tables of an [`Owned`] tree, borrowed in the form a snapshot stores: wide
/// children lists in descending count order, and the child index as a list sorted by
/// `(node, token)` (see [`GlobalTree::parts`]).
#[derive(Clone, Debug)]
pub struct Borrowed<'a>(std::marker::PhantomData<&'a ()>);

impl<'a> Storage for Borrowed<'a> {
    type Nodes = std::borrow::Cow<'a, [Node]>;
    type Lens = &'a [u8];
    type Pool = &'a [u32];
    type Seqs = &'a [SeqEntry];
    type Index = [WideChild];
    type IndexRef = std::borrow::Cow<'a, [WideChild]>;
    const EDITABLE: bool = false;
}

/// The tables of a [`GlobalTree`], with nothing derived from them: what a snapshot
/// stores, what [`GlobalTree::parts`] lends and [`GlobalTree::from_parts`] checks and
/// assembles. Only compacted trees have parts (no free nodes).
pub struct TreeParts<S: Storage> {
    /// The depth limit.
    pub max_depth: usize,
    /// Node records; the root first.
    pub nodes: S::Nodes,
    /// Edge lengths and flags, one per node.
    pub lens: S::Lens,
    /// The child index of wide nodes.
    pub child_index: S::IndexRef,
    /// The token pool.
    pub pool: S::Pool,
    /// The sequence table, in pool order.
    pub seqs: S::Seqs,
    /// Whether the children lists of wide nodes are in descending count order.
    pub wide_lists_sorted: bool,
}

/// Why [`GlobalTree::from_parts`] refused a set of tables.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PartsError {
    /// The depth limit is outside what the arena supports.
    #[error("max_depth must be between 1 and {MAX_SUPPORTED_DEPTH}, got {0}")]
    BadDepth(usize),
    /// There is no root node, or the node and edge-length tables differ in length.
    #[error(
        "{nodes} node records but {lens} edge lengths (there must be as many, at least the root)"
    )]
    TablesDiffer {
        /// Node records.
        nodes: usize,
        /// Edge lengths.
        lens: usize,
    },
    /// Two live sequences have the same id.
    #[error("sequence id {0} appears twice")]
    DuplicateId(u64),
}

/// Sizes and occupancy of a [`GlobalTree`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TreeStats {
    /// Live sequences.
    pub sequences: usize,
    /// Tokens of live sequences.
    pub live_tokens: u64,
    /// Tokens of removed sequences still in the pool (reclaimed by compaction).
    pub dead_tokens: u64,
    /// Nodes in use, the root included.
    pub nodes: usize,
    /// Nodes whose children are hash-indexed.
    pub indexed_children: usize,
    /// Heap bytes held by the tree (allocated capacity, not just what is in use).
    pub heap_bytes: usize,
    /// Of which: node records and edge lengths.
    pub node_bytes: usize,
    /// Of which: the token pool.
    pub pool_bytes: usize,
    /// Of which: the child index of wide nodes.
    pub index_bytes: usize,
    /// Of which: the sequence table.
    pub sequence_bytes: usize,
}

/// A position in the global tree: `off` tokens into the edge of `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalCursor {
    node: u32,
    off: u8,
    depth: u8,
}

impl GlobalCursor {
    /// Length of the path from the root.
    pub fn depth(&self) -> usize {
        self.depth as usize
    }
}

enum Lookup {
    Found { child: u32, pred: u32 },
    Missing { last: u32, fanout: usize },
}

/// Depth-limited suffix trie over whole sequences, with counts, in a flat arena.
///
/// Generic over where its tables live (see [`Storage`]); reading works the same on
/// both, changing only on [`Owned`] storage.
pub struct GlobalTree<S: Storage = Owned> {
    max_depth: usize,
    nodes: S::Nodes,
    lens: S::Lens,
    free_head: u32,
    free_nodes: usize,
    child_index: S::IndexRef,
    pool: S::Pool,
    seqs: S::Seqs,
    seq_by_id: FxHashMap<u64, u32>,
    /// Where the sequence holding a pool position is: see [`SeqBlocks`].
    seq_blocks: SeqBlocks,
    live_tokens: u64,
    dead_tokens: u64,
    version: u64,
    /// The children lists of wide (indexed) nodes are in descending count order, not
    /// just headed by their largest. Builds and snapshots are; any insert or removal
    /// clears it. A reader may leave such a list at the first child below what it needs.
    wide_lists_sorted: bool,
}

impl<S: Storage> Clone for GlobalTree<S> {
    fn clone(&self) -> Self {
        Self {
            max_depth: self.max_depth,
            nodes: self.nodes.clone(),
            lens: self.lens.clone(),
            free_head: self.free_head,
            free_nodes: self.free_nodes,
            child_index: self.child_index.clone(),
            pool: self.pool.clone(),
            seqs: self.seqs.clone(),
            seq_by_id: self.seq_by_id.clone(),
            seq_blocks: self.seq_blocks.clone(),
            live_tokens: self.live_tokens,
            dead_tokens: self.dead_tokens,
            version: if S::EDITABLE {
                next_version()
            } else {
                self.version
            },
            wide_lists_sorted: self.wide_lists_sorted,
        }
    }
}

impl<S: Storage> std::fmt::Debug for GlobalTree<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalTree")
            .field("max_depth", &self.max_depth)
            .field("nodes", &self.nodes.len())
            .field("pool", &self.pool.len())
            .field("sequences", &self.seqs.len())
            .finish()
    }
}

/// Source of [`GlobalTree::version`] values: unique across every tree of the process.
static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_version() -> u64 {
    VERSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Make room for `more` elements, growing by a quarter rather than doubling: the big
/// arrays then waste at most a fifth of what they hold.
#[inline]
fn grow<T>(v: &mut Vec<T>, more: usize) {
    if v.len() + more > v.capacity() {
        v.reserve_exact(more.max(v.len() / 4).max(1024));
    }
}

impl GlobalTree {
    /// An empty tree that keeps suffixes up to `max_depth` tokens.
    pub fn new(max_depth: usize) -> Result<Self, TreeError> {
        if max_depth == 0 || max_depth > MAX_SUPPORTED_DEPTH {
            return Err(TreeError::BadDepth(max_depth));
        }
        Ok(Self {
            max_depth,
            nodes: vec![Node {
                start: 0,
                count: 0,
                first_child: NIL,
                next_sibling: NIL,
            }],
            lens: vec![INDEXED],
            free_head: NIL,
            free_nodes: 0,
            child_index: Box::default(),
            pool: Vec::new(),
            seqs: Vec::new(),
            seq_by_id: FxHashMap::default(),
            seq_blocks: SeqBlocks::default(),
            live_tokens: 0,
            dead_tokens: 0,
            version: next_version(),
            wide_lists_sorted: false,
        })
    }
}

impl<S: Storage> GlobalTree<S> {
    /// The depth limit.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Changes whenever the tree changes, and differs between trees with different
    /// contents: a cursor taken at one version stays valid while the version is the same.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Nodes in use, the root included.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free_nodes
    }

    /// Every token in the pool, removed sequences' included, in pool order.
    pub fn pool_tokens(&self) -> &[u32] {
        &self.pool
    }

    /// Number of live sequences.
    pub fn len(&self) -> usize {
        self.seq_by_id.len()
    }

    /// True when no sequence is stored.
    pub fn is_empty(&self) -> bool {
        self.seq_by_id.is_empty()
    }

    /// Tokens in live sequences.
    pub fn cached_tokens(&self) -> u64 {
        self.live_tokens
    }

    /// Whether a sequence with this id is stored.
    pub fn contains(&self, id: u64) -> bool {
        self.seq_by_id.contains_key(&id)
    }

    /// The tokens of a stored sequence.
    pub fn sequence(&self, id: u64) -> Option<&[u32]> {
        let e = self.seqs[*self.seq_by_id.get(&id)? as usize];
        self.pool
            .get(e.offset as usize..(e.offset as usize + e.len as usize))
    }

    /// Ids of the live sequences, oldest first.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.seqs.iter().filter(|e| e.live != 0).map(|e| e.id)
    }

    /// Fraction of the pool held by removed sequences.
    pub fn dead_fraction(&self) -> f64 {
        let total = self.live_tokens + self.dead_tokens;
        if total == 0 {
            0.0
        } else {
            self.dead_tokens as f64 / total as f64
        }
    }
}

impl GlobalTree {
    /// Sizes and occupancy.
    pub fn stats(&self) -> TreeStats {
        TreeStats {
            sequences: self.len(),
            live_tokens: self.live_tokens,
            dead_tokens: self.dead_tokens,
            nodes: self.node_count(),
            indexed_children: self.lens.iter().filter(|l| **l & INDEXED != 0).count(),
            heap_bytes: self.heap_bytes(),
            node_bytes: self.node_bytes(),
            pool_bytes: self.pool.capacity() * 4,
            index_bytes: self.index_bytes(),
            sequence_bytes: self.sequence_bytes(),
        }
    }

    fn node_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>() + self.lens.capacity()
    }

    fn index_bytes(&self) -> usize {
        self.child_index.heap_bytes()
    }

    fn sequence_bytes(&self) -> usize {
        self.seqs.capacity() * std::mem::size_of::<SeqEntry>()
            + self.seq_by_id.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
    }

    /// Heap bytes held: allocated capacity of every table.
    pub fn heap_bytes(&self) -> usize {
        self.node_bytes() + self.pool.capacity() * 4 + self.index_bytes() + self.sequence_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(depth: usize, seqs: &[&[u32]]) -> GlobalTree {
        let mut t = GlobalTree::new(depth).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            t.insert(i as u64, s).unwrap();
        }
        t.check_integrity().unwrap();
        t
    }

    #[test]
    fn sequence_at_names_a_live_sequence_holding_the_path() {
        let mut t = tree(4, &[&[1, 2, 3], &[7, 8, 9], &[1, 2, 5]]);
        let c = t.walk(&[8, 9]).unwrap();
        assert_eq!(t.sequence_at(&c), Some(1));
        let c = t.walk(&[2, 5]).unwrap();
        assert_eq!(t.sequence_at(&c), Some(2));
        let c = t.walk(&[1, 2]).unwrap();
        assert!(matches!(t.sequence_at(&c), Some(0) | Some(2)));
        assert_eq!(t.sequence_at(&t.root()), None);
        t.remove(1);
        assert_eq!(t.walk(&[8, 9]), None);
    }

    #[test]
    fn counts_match_occurrences() {
        let t = tree(4, &[&[1, 2, 3, 1, 2, 4], &[2, 3, 1]]);
        assert_eq!(t.count_of(&[1, 2]), 2);
        assert_eq!(t.count_of(&[2, 3]), 2);
        assert_eq!(t.count_of(&[2, 3, 1]), 2);
        assert_eq!(t.count_of(&[1]), 3);
        assert_eq!(t.count_of(&[5]), 0);
        assert_eq!(t.count_of(&[]), 9);
        // Deeper than the depth limit is not in the tree.
        assert_eq!(t.count_of(&[1, 2, 3, 1, 2]), 0);
    }

    #[test]
    fn empty_tree_and_empty_sequence() {
        let mut t = GlobalTree::new(24).unwrap();
        assert_eq!(t.count_of(&[1]), 0);
        t.insert(7, &[]).unwrap();
        assert!(t.contains(7));
        assert_eq!(t.cached_tokens(), 0);
        assert!(t.remove(7));
        t.check_integrity().unwrap();
    }

    #[test]
    fn extreme_token_values() {
        let t = tree(3, &[&[u32::MAX, 0, u32::MAX, u32::MAX - 1]]);
        assert_eq!(t.count_of(&[u32::MAX]), 2);
        assert_eq!(t.count_of(&[u32::MAX, 0]), 1);
    }

    #[test]
    fn depth_one_counts_unigrams() {
        let t = tree(1, &[&[5, 5, 6]]);
        assert_eq!(t.count_of(&[5]), 2);
        assert_eq!(t.count_of(&[5, 5]), 0);
    }

    #[test]
    fn remove_restores_counts_and_absent_id_is_a_no_op() {
        let mut t = tree(4, &[&[1, 2, 3, 4], &[1, 2, 5]]);
        assert!(!t.remove(99));
        assert!(t.remove(1));
        t.check_integrity().unwrap();
        assert_eq!(t.count_of(&[1, 2]), 1);
        assert_eq!(t.count_of(&[2, 5]), 0);
        assert!(!t.remove(1));
        t.insert(1, &[1, 2, 5]).unwrap();
        t.check_integrity().unwrap();
        assert_eq!(t.count_of(&[1, 2]), 2);
    }

    #[test]
    fn duplicate_id_and_bad_depth_are_errors() {
        let mut t = tree(4, &[&[1]]);
        assert_eq!(t.insert(0, &[2]), Err(TreeError::DuplicateId(0)));
        assert_eq!(GlobalTree::new(0).unwrap_err(), TreeError::BadDepth(0));
        assert!(GlobalTree::new(200).is_err());
        assert!(GlobalTree::new(64).is_ok());
    }

    #[test]
    fn wide_nodes_get_an_index() {
        let seq: Vec<u32> = (0..100).flat_map(|i| [7, i]).collect();
        let mut t = tree(3, &[&seq]);
        assert_eq!(t.count_of(&[7, 42]), 1);
        assert!(t.stats().indexed_children >= 2);
        assert!(t.remove(0));
        t.check_integrity().unwrap();
        assert_eq!(t.stats().nodes, 1);
    }

    #[test]
    fn built_trees_keep_each_childrens_list_together() {
        // Pseudo-random text over a small vocabulary, so that lists have many lengths.
        let mut x = 12345u32;
        let seqs: Vec<Vec<u32>> = (0..40)
            .map(|_| {
                (0..60)
                    .map(|_| {
                        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                        (x >> 16) % 9
                    })
                    .collect()
            })
            .collect();
        for threads in [2, 3] {
            let t = GlobalTree::build_with_threads(
                6,
                seqs.iter()
                    .enumerate()
                    .map(|(i, s)| (i as u64, s.as_slice())),
                threads,
            )
            .unwrap();
            t.check_integrity().unwrap();
            let mut lists = 0;
            for n in 1..t.nodes.len() as u32 {
                let first = t.node(n).first_child;
                if first == NIL {
                    continue;
                }
                lists += 1;
                let (mut c, mut expected) = (first, first);
                while c != NIL {
                    assert_eq!(c, expected, "children of {n} are not numbered together");
                    (c, expected) = (t.node(c).next_sibling, expected + 1);
                }
            }
            assert!(lists > 100, "only {lists} lists checked");
        }
    }

    #[test]
    fn compact_reclaims_and_keeps_counts() {
        let mut t = tree(5, &[&[1, 2, 3], &[4, 5, 6], &[1, 2, 6]]);
        t.remove(1);
        assert!(t.dead_fraction() > 0.0);
        let before = t.count_of(&[1, 2]);
        t.compact();
        t.check_integrity().unwrap();
        assert_eq!(t.dead_fraction(), 0.0);
        assert_eq!(t.count_of(&[1, 2]), before);
        assert_eq!(t.ids().collect::<Vec<_>>(), vec![0, 2]);
    }

    #[test]
    fn entropy_weighs_branching_nodes() {
        let det = tree(4, &[&[1, 1, 1, 1]]);
        assert_eq!(det.next_token_entropy(), 0.0);
        // After 1: {2, 3}, one bit; nothing else below the root branches.
        let two = tree(2, &[&[1, 2], &[1, 3]]);
        assert_eq!(two.next_token_entropy(), 1.0);
        // After 1: {2: 2, 3: 1, 4: 1} -> 1.5 bits over 4; after 1 2 and after 2: {5, 6}
        // -> 1 bit over 2 each.
        let mixed = tree(3, &[&[1, 2, 5], &[1, 2, 6], &[1, 3], &[1, 4]]);
        assert!((mixed.next_token_entropy() - (1.5 * 4.0 + 2.0 + 2.0) / 8.0).abs() < 1e-12);
        // The same sequence many times: nothing below the root branches.
        let rep: Vec<&[u32]> = vec![&[1, 2, 3, 4]; 10];
        assert_eq!(tree(4, &rep).next_token_entropy(), 0.0);
    }

    #[test]
    fn unique_occurrence_reads_past_the_depth_limit() {
        let t = tree(2, &[&[1, 2, 3, 4, 5, 6]]);
        let c = t.walk(&[2, 3]).unwrap();
        assert_eq!(t.continuation_beyond_depth(&c, 10), &[4, 5, 6]);
        assert_eq!(t.continuation_beyond_depth(&c, 2), &[4, 5]);
        assert_eq!(t.extend_match_back(&c, &[9, 1, 2, 3], 10), 1);
    }
}
