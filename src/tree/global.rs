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

use rustc_hash::FxHashMap;

use super::wide_index::WideIndex;
use super::{Child, Expand, GlobalIndex, MAX_SUPPORTED_DEPTH, NIL, common_suffix_len};

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
/// storage that can be changed), or read-only slices of a snapshot (see
/// [`crate::store::snapshot`]).
pub trait Storage {
    /// Node records.
    type Nodes: std::ops::Deref<Target = [Node]>;
    /// Edge lengths and flags, parallel to the nodes.
    type Lens: std::ops::Deref<Target = [u8]>;
    /// The token pool.
    type Pool: std::ops::Deref<Target = [u32]>;
    /// The sequence table, in pool order.
    type Seqs: std::ops::Deref<Target = [SeqEntry]>;
    /// The child index of wide nodes.
    type Index: ChildIndex + ?Sized;
    /// How the index is held.
    type IndexRef: std::ops::Deref<Target = Self::Index>;
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
    pub(crate) max_depth: usize,
    pub(crate) nodes: S::Nodes,
    pub(crate) lens: S::Lens,
    pub(crate) free_head: u32,
    pub(crate) free_nodes: usize,
    pub(crate) child_index: S::IndexRef,
    pub(crate) pool: S::Pool,
    pub(crate) seqs: S::Seqs,
    pub(crate) seq_by_id: FxHashMap<u64, u32>,
    /// Where the sequence holding a pool position is: see [`SeqBlocks`].
    pub(crate) seq_blocks: SeqBlocks,
    pub(crate) live_tokens: u64,
    pub(crate) dead_tokens: u64,
    pub(crate) version: u64,
    /// The children lists of wide (indexed) nodes are in descending count order, not
    /// just headed by their largest. Builds and snapshots are; any insert or removal
    /// clears it. A reader may leave such a list at the first child below what it needs.
    pub(crate) wide_lists_sorted: bool,
}

impl Clone for GlobalTree {
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
            version: next_version(),
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

pub(crate) fn next_version() -> u64 {
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
            nodes: self.nodes.len() - self.free_nodes,
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

    /// Store `tokens` as sequence `id`: every suffix, cut at the depth limit, is counted.
    pub fn insert(&mut self, id: u64, tokens: &[u32]) -> Result<(), TreeError> {
        let entry = self.push_sequence(id, tokens)?;
        self.insert_suffixes_of(entry);
        Ok(())
    }

    /// Put `tokens` in the pool and the sequence table, without indexing its suffixes.
    fn push_sequence(&mut self, id: u64, tokens: &[u32]) -> Result<SeqEntry, TreeError> {
        if self.seq_by_id.contains_key(&id) {
            return Err(TreeError::DuplicateId(id));
        }
        let base = self.pool.len();
        if base + tokens.len() >= u32::MAX as usize {
            return Err(TreeError::PoolFull);
        }
        grow(&mut self.pool, tokens.len());
        self.pool.extend_from_slice(tokens);
        self.seq_by_id.insert(id, self.seqs.len() as u32);
        let entry = SeqEntry {
            id,
            offset: base as u32,
            len: tokens.len() as u32,
            live: 1,
            reserved: 0,
        };
        self.seq_blocks
            .note(self.seqs.len(), &entry, self.pool.len());
        self.seqs.push(entry);
        self.live_tokens += tokens.len() as u64;
        self.version = next_version();
        self.wide_lists_sorted = false;
        Ok(entry)
    }

    /// Count every suffix of the pooled sequence `e`, in order.
    fn insert_suffixes_of(&mut self, e: SeqEntry) {
        let n = e.len as usize;
        for i in 0..n {
            self.insert_suffix(e.offset + i as u32, (n - i).min(self.max_depth));
        }
    }

    /// A tree holding `sequences`, in order: the same tree as inserting them one by one,
    /// built on every available core. See [`GlobalTree::build_with_threads`].
    pub fn build<T: AsRef<[u32]>>(
        max_depth: usize,
        sequences: impl IntoIterator<Item = (u64, T)>,
    ) -> Result<Self, TreeError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::build_split(
            max_depth,
            sequences,
            threads.min(MAX_BUILD_THREADS),
            MIN_TOKENS_PER_THREAD,
        )
    }

    /// A tree holding `sequences`, in order, built by `threads` threads.
    ///
    /// Every subtree below the root holds the suffixes that start with one token, and
    /// only those. So the suffixes are dealt out by first token (largest groups first, to
    /// the least loaded thread), each thread builds its subtrees over a copy of the pool
    /// in the usual insertion order, and the arenas are concatenated under one root. Each
    /// subtree comes out exactly as sequential inserts would shape it; only node numbers
    /// and the order of the root's children (never read) differ.
    pub fn build_with_threads<T: AsRef<[u32]>>(
        max_depth: usize,
        sequences: impl IntoIterator<Item = (u64, T)>,
        threads: usize,
    ) -> Result<Self, TreeError> {
        Self::build_split(max_depth, sequences, threads, 1)
    }

    /// [`GlobalTree::build_with_threads`], with at least `min_tokens` tokens per thread.
    fn build_split<T: AsRef<[u32]>>(
        max_depth: usize,
        sequences: impl IntoIterator<Item = (u64, T)>,
        threads: usize,
        min_tokens: usize,
    ) -> Result<Self, TreeError> {
        let mut tree = GlobalTree::new(max_depth)?;
        for (id, tokens) in sequences {
            tree.push_sequence(id, tokens.as_ref())?;
        }
        tree.pool.shrink_to_fit();
        let threads = threads
            .min(tree.pool.len() / min_tokens.max(1))
            .clamp(1, u8::MAX as usize);
        let order = tree.suffix_order(threads);
        if threads == 1 {
            return Ok(build_part(tree, order.part(0)));
        }
        // Each part's tables are allocated here, large enough for its share, rather than
        // grown in its thread: glibc does not give back the top of a thread's arena, and
        // tables grown there stayed resident (about 10 bytes per token) once freed.
        let parts: Vec<GlobalTree> = (0..threads).map(|_| tree.empty_part(threads)).collect();
        let parts: Vec<GlobalTree> = std::thread::scope(|scope| {
            let order = &order;
            let handles: Vec<_> = parts
                .into_iter()
                .enumerate()
                .map(|(i, part)| scope.spawn(move || build_part(part, order.part(i))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a build thread panicked"))
                .collect()
        });
        tree.adopt_parts(parts);
        // The parts sorted their own lists; only the root's is a concatenation.
        let mut guard = tree.nodes.len();
        sort_list(&mut tree.nodes, ROOT, &mut Vec::new(), &mut guard);
        tree.wide_lists_sorted = true;
        Ok(tree)
    }

    /// Put the children lists of wide nodes in descending count order (equal counts keep
    /// their order, so the head stays the head and every reader's answer is unchanged),
    /// and say so: readers of the store's view, where evictions hide part of the base,
    /// can then stop at the first child too small instead of scanning lists thousands
    /// long. Narrow lists stay as they are: sorting them costs a pass over every node,
    /// and scanning them costs at most [`INDEX_FANOUT`] steps.
    pub fn sort_wide_lists(&mut self) {
        sort_wide_lists(&mut self.nodes, &self.lens);
        self.wide_lists_sorted = true;
    }

    /// The order in which a build inserts the suffixes of the pool: grouped by first
    /// token, each group in pool order, and the groups dealt out to `parts` parts (the
    /// largest first, each to the least loaded part).
    ///
    /// All the suffixes of a group go to one subtree of the root, and only they do, so
    /// the subtree comes out exactly as inserting every suffix in pool order shapes it.
    /// Inserting a group at a time keeps one subtree's nodes in cache while it grows,
    /// where pool order jumps to a different subtree at every suffix.
    fn suffix_order(&self, parts: usize) -> SuffixOrder {
        let mut groups: FxHashMap<u32, u32> = FxHashMap::default();
        for &t in self.pool.iter() {
            *groups.entry(t).or_default() += 1;
        }
        let mut by_size: Vec<(u32, u32)> = groups.iter().map(|(&t, &n)| (t, n)).collect();
        by_size.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut load = vec![0usize; parts];
        let mut part_of = Vec::with_capacity(by_size.len());
        for &(_, size) in &by_size {
            let lightest = (0..parts).min_by_key(|&p| (load[p], p)).expect("parts > 0");
            load[lightest] += size as usize;
            part_of.push(lightest);
        }
        let mut bounds = vec![0usize; parts + 1];
        for p in 0..parts {
            bounds[p + 1] = bounds[p] + load[p];
        }
        // Where each group starts: its part's start plus the groups dealt there before.
        let mut next = bounds[..parts].to_vec();
        for (&(token, size), &part) in by_size.iter().zip(&part_of) {
            groups.insert(token, next[part] as u32);
            next[part] += size as usize;
        }
        let mut positions = vec![0u32; self.pool.len()];
        let mut lens = vec![0u8; self.pool.len()];
        for e in self.seqs.iter() {
            let n = e.len as usize;
            for i in 0..n {
                let pos = e.offset as usize + i;
                let slot = groups
                    .get_mut(&self.pool[pos])
                    .expect("every token was counted");
                positions[*slot as usize] = pos as u32;
                lens[*slot as usize] = (n - i).min(self.max_depth) as u8;
                *slot += 1;
            }
        }
        SuffixOrder {
            positions,
            lens,
            bounds,
        }
    }

    /// An arena for one of `parts` parts, with a copy of the pool, and room for its
    /// share of nodes (about 1.3 per token on chat data) and of the child index.
    fn empty_part(&self, parts: usize) -> GlobalTree {
        let mut sub = GlobalTree::new(self.max_depth).expect("depth was validated");
        sub.pool = self.pool.clone();
        let share = self.pool.len() / parts;
        sub.nodes.reserve_exact(share + share / 2);
        sub.lens.reserve_exact(share + share / 2);
        sub.child_index.reserve(share / 4);
        sub
    }

    /// Concatenate the arenas of `parts` under this tree's (empty) root, renumbering
    /// their nodes so that every node's children are numbered together (see
    /// [`lay_out_part`]); one thread per part, each into its own range of the arrays.
    /// The child index is then rebuilt from the new lists.
    fn adopt_parts(&mut self, parts: Vec<GlobalTree>) {
        // Where each part's nodes start, and for each part the root's list it joins:
        // a part's root children go in front of the lists of the parts before it, and
        // are the first nodes of its range.
        let mut bases = Vec::with_capacity(parts.len());
        let mut joins = Vec::with_capacity(parts.len());
        let mut root_list = self.nodes[ROOT as usize].first_child;
        let mut next = self.nodes.len();
        for part in &parts {
            debug_assert_eq!(part.free_head, NIL, "a fresh part frees no node");
            bases.push(next as u32);
            joins.push(root_list);
            if part.nodes[ROOT as usize].first_child != NIL {
                root_list = next as u32;
            }
            next += part.nodes.len() - 1;
            self.nodes[ROOT as usize].count += part.nodes[ROOT as usize].count;
        }
        let first = self.nodes.len();
        self.nodes.resize(next, Node::OUTSIDE);
        self.lens.resize(next, 0);
        std::thread::scope(|scope| {
            let mut nodes = &mut self.nodes[first..];
            let mut lens = &mut self.lens[first..];
            for (part, (&base, &join)) in parts.iter().zip(bases.iter().zip(&joins)) {
                let n = part.nodes.len() - 1;
                let (part_nodes, rest_nodes) = std::mem::take(&mut nodes).split_at_mut(n);
                let (part_lens, rest_lens) = std::mem::take(&mut lens).split_at_mut(n);
                (nodes, lens) = (rest_nodes, rest_lens);
                scope.spawn(move || lay_out_part(part, base, join, part_nodes, part_lens));
            }
        });
        self.nodes[ROOT as usize].first_child = root_list;
        let entries = parts.iter().map(|p| p.child_index.len()).sum();
        drop(parts);
        self.child_index.reserve(entries);
        for n in 0..self.nodes.len() as u32 {
            if self.lens[n as usize] & INDEXED != 0 {
                self.index_children(n);
            }
        }
    }

    /// Remove sequence `id`; returns false when it was not stored.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(idx) = self.seq_by_id.remove(&id) else {
            return false;
        };
        let e = self.seqs[idx as usize];
        self.version = next_version();
        self.wide_lists_sorted = false;
        self.seqs[idx as usize].live = 0;
        self.live_tokens -= e.len as u64;
        self.dead_tokens += e.len as u64;
        let dead = e.offset..e.offset + e.len;
        let mut path = Vec::with_capacity(self.max_depth);
        for i in 0..e.len {
            let rem = ((e.len - i) as usize).min(self.max_depth);
            self.remove_suffix(e.offset + i, rem, &dead, &mut path);
        }
        true
    }

    /// Rebuild the arena from the live sequences, in their order: reclaims removed tokens
    /// and freed nodes, and restores the canonical (fully merged) shape.
    pub fn compact(&mut self) {
        let live = self.seqs.iter().filter(|e| e.live != 0).map(|e| {
            (
                e.id,
                &self.pool[e.offset as usize..(e.offset + e.len) as usize],
            )
        });
        *self =
            GlobalTree::build(self.max_depth, live).expect("a live tree fits its own compaction");
    }
}

impl<S: Storage> GlobalTree<S> {
    /// Node `n`; outside the arena (only in a damaged snapshot), an empty leaf.
    #[inline]
    fn node(&self, n: u32) -> &Node {
        self.nodes.get(n as usize).unwrap_or(&Node::OUTSIDE)
    }

    #[inline]
    fn len_byte(&self, n: u32) -> u8 {
        self.lens.get(n as usize).copied().unwrap_or(0)
    }

    /// The pool token at `pos`; `NIL` outside the pool (only in a damaged snapshot).
    #[inline]
    fn token_at(&self, pos: usize) -> u32 {
        self.pool.get(pos).copied().unwrap_or(NIL)
    }

    #[inline]
    fn len_of(&self, n: u32) -> usize {
        (self.len_byte(n) & LEN_MASK) as usize
    }

    #[inline]
    fn first_token(&self, n: u32) -> u32 {
        self.token_at(self.node(n).start as usize)
    }
}

impl GlobalTree {
    fn alloc(&mut self, start: u32, len: usize, count: u32) -> u32 {
        let node = Node {
            start,
            count,
            first_child: NIL,
            next_sibling: NIL,
        };
        if self.free_head != NIL {
            let n = self.free_head;
            self.free_head = self.nodes[n as usize].next_sibling;
            self.free_nodes -= 1;
            self.nodes[n as usize] = node;
            self.lens[n as usize] = len as u8;
            n
        } else {
            grow(&mut self.nodes, 1);
            grow(&mut self.lens, 1);
            self.nodes.push(node);
            self.lens.push(len as u8);
            (self.nodes.len() - 1) as u32
        }
    }
}

impl<S: Storage> GlobalTree<S> {
    fn find_child(&self, node: u32, token: u32) -> Lookup {
        if self.len_byte(node) & INDEXED != 0 {
            return match self.child_index.child_of(node, token) {
                Some(child) => {
                    // The index holds no more than the child's number; what a walk
                    // reads of it next (its record, its edge length) is cold.
                    self.prefetch_node(child);
                    Lookup::Found { child, pred: NIL }
                }
                None => Lookup::Missing {
                    last: NIL,
                    fanout: 0,
                },
            };
        }
        let mut pred = NIL;
        let mut c = self.node(node).first_child;
        let mut fanout = 0;
        let mut guard = self.nodes.len(); // a damaged snapshot may link siblings in a cycle
        while c != NIL && guard > 0 {
            guard -= 1;
            if self.first_token(c) == token {
                self.prefetch_node(c);
                return Lookup::Found { child: c, pred };
            }
            pred = c;
            c = self.node(c).next_sibling;
            fanout += 1;
        }
        Lookup::Missing { last: pred, fanout }
    }

    /// Start loading node `n`'s record and edge length (two arrays, two cache lines):
    /// a cursor that has just reached `n` reads both at its next step, and a draft
    /// grown from it at once. Cursors stay from one speculation call to the next, so
    /// the loads have the rest of this call to arrive.
    #[inline]
    fn prefetch_node(&self, n: u32) {
        if let Some(node) = self.nodes.get(n as usize) {
            super::prefetch(node);
        }
        if let Some(len) = self.lens.get(n as usize) {
            super::prefetch(len);
        }
    }

    /// Child of `node` for `token`, if any.
    #[inline]
    fn child(&self, node: u32, token: u32) -> Option<u32> {
        match self.find_child(node, token) {
            Lookup::Found { child, .. } => Some(child),
            Lookup::Missing { .. } => None,
        }
    }

    fn predecessor(&self, parent: u32, child: u32) -> u32 {
        let mut pred = NIL;
        let mut c = self.node(parent).first_child;
        let mut guard = self.nodes.len(); // a damaged snapshot may link siblings in a cycle
        while c != child && guard > 0 {
            guard -= 1;
            pred = c;
            c = self.node(c).next_sibling;
        }
        pred
    }
}

impl GlobalTree {
    fn unlink(&mut self, parent: u32, child: u32, pred: u32) {
        let next = self.nodes[child as usize].next_sibling;
        if pred == NIL {
            self.nodes[parent as usize].first_child = next;
        } else {
            self.nodes[pred as usize].next_sibling = next;
        }
        self.nodes[child as usize].next_sibling = NIL;
    }

    /// Move `child` to the front when it has caught up with the head.
    fn promote(&mut self, parent: u32, child: u32, pred: u32) {
        let head = self.nodes[parent as usize].first_child;
        // The root's order is never read: drafts start below it.
        if parent == ROOT
            || head == child
            || self.nodes[child as usize].count < self.nodes[head as usize].count
        {
            return;
        }
        let pred = if pred == NIL {
            self.predecessor(parent, child)
        } else {
            pred
        };
        self.unlink(parent, child, pred);
        self.nodes[child as usize].next_sibling = head;
        self.nodes[parent as usize].first_child = child;
    }

    /// Move the child index entries of `from` to `to`, which took over its children.
    fn rekey_children(&mut self, from: u32, to: u32) {
        let mut c = self.nodes[to as usize].first_child;
        while c != NIL {
            let t = self.first_token(c);
            self.child_index.remove(from, t);
            self.child_index.insert(to, t, c);
            c = self.nodes[c as usize].next_sibling;
        }
    }

    /// After the head of `parent` lost one count (it had `old`), move a largest child to
    /// the front again. No sibling can have more than `old`, so the scan stops at the
    /// first one that has it, or once the children not yet seen hold less than `old`.
    fn restore_head(&mut self, parent: u32, old: u32) {
        let head = self.nodes[parent as usize].first_child;
        let mut unseen = (self.nodes[parent as usize].count as u64)
            .saturating_sub(self.nodes[head as usize].count as u64);
        let mut pred = head;
        let mut c = self.nodes[head as usize].next_sibling;
        while c != NIL && unseen >= old as u64 {
            let cnt = self.nodes[c as usize].count;
            if cnt == old {
                self.unlink(parent, c, pred);
                self.nodes[c as usize].next_sibling = head;
                self.nodes[parent as usize].first_child = c;
                return;
            }
            unseen = unseen.saturating_sub(cnt as u64);
            pred = c;
            c = self.nodes[c as usize].next_sibling;
        }
    }

    /// Add a new child at the end of the list (or second, where the list is indexed).
    fn attach(&mut self, parent: u32, child: u32, token: u32, last: u32, fanout: usize) {
        let indexed = self.lens[parent as usize] & INDEXED != 0;
        let head = self.nodes[parent as usize].first_child;
        if head == NIL {
            self.nodes[parent as usize].first_child = child;
        } else if indexed || last == NIL {
            self.nodes[child as usize].next_sibling = self.nodes[head as usize].next_sibling;
            self.nodes[head as usize].next_sibling = child;
        } else {
            self.nodes[last as usize].next_sibling = child;
        }
        if indexed {
            self.child_index.insert(parent, token, child);
        } else if fanout + 1 > INDEX_FANOUT {
            self.lens[parent as usize] |= INDEXED;
            self.index_children(parent);
        }
    }

    /// Enter every child of `parent` in the child index.
    fn index_children(&mut self, parent: u32) {
        let mut c = self.nodes[parent as usize].first_child;
        while c != NIL {
            self.child_index.insert(parent, self.first_token(c), c);
            c = self.nodes[c as usize].next_sibling;
        }
    }

    fn insert_suffix(&mut self, mut pos: u32, mut rem: usize) {
        let mut node = ROOT;
        self.nodes[ROOT as usize].count += 1;
        while rem > 0 {
            let token = self.pool[pos as usize];
            match self.find_child(node, token) {
                Lookup::Missing { last, fanout } => {
                    let leaf = self.alloc(pos, rem, 1);
                    self.attach(node, leaf, token, last, fanout);
                    return;
                }
                Lookup::Found { child, pred } => {
                    let clen = self.len_of(child);
                    let cstart = self.nodes[child as usize].start as usize;
                    let lim = clen.min(rem);
                    let p = pos as usize;
                    let mut k = 1;
                    while k < lim && self.pool[cstart + k] == self.pool[p + k] {
                        k += 1;
                    }
                    if k == clen {
                        self.nodes[child as usize].count += 1;
                        self.promote(node, child, pred);
                        node = child;
                        pos += k as u32;
                        rem -= k;
                        continue;
                    }
                    // The suffix leaves (or ends inside) the child's edge after k tokens:
                    // split the edge. The child keeps its place in the parent's list and
                    // becomes the first k tokens; a new node below it takes the rest of
                    // the edge and the child's children. Both keep the old occurrence, so
                    // every node still points at a real one.
                    let old = self.nodes[child as usize];
                    let flags = self.lens[child as usize] & INDEXED;
                    let bottom = self.alloc(old.start + k as u32, clen - k, old.count);
                    self.nodes[bottom as usize].first_child = old.first_child;
                    self.lens[bottom as usize] |= flags;
                    if flags != 0 {
                        self.rekey_children(child, bottom);
                    }
                    self.nodes[child as usize].first_child = bottom;
                    self.nodes[child as usize].count = old.count + 1;
                    self.lens[child as usize] = k as u8;
                    self.promote(node, child, pred);
                    if k < rem {
                        let leaf = self.alloc(pos + k as u32, rem - k, 1);
                        self.nodes[bottom as usize].next_sibling = leaf;
                    }
                    return;
                }
            }
        }
    }

    fn remove_suffix(
        &mut self,
        mut pos: u32,
        mut rem: usize,
        dead: &std::ops::Range<u32>,
        path: &mut Vec<u32>,
    ) {
        path.clear();
        let mut node = ROOT;
        self.nodes[ROOT as usize].count -= 1;
        while rem > 0 {
            let token = self.pool[pos as usize];
            let (child, pred) = match self.find_child(node, token) {
                Lookup::Found { child, pred } => (child, pred),
                Lookup::Missing { .. } => {
                    debug_assert!(false, "a stored suffix is missing from the tree");
                    return;
                }
            };
            self.nodes[child as usize].count -= 1;
            let old = self.nodes[child as usize].count + 1;
            let was_head = self.nodes[node as usize].first_child == child;
            if self.nodes[child as usize].count == 0 {
                let pred = if pred == NIL {
                    self.predecessor(node, child)
                } else {
                    pred
                };
                self.unlink(node, child, pred);
                if self.lens[node as usize] & INDEXED != 0 {
                    self.child_index.remove(node, token);
                }
                // A head that had count 1 was no larger than any sibling, so whichever
                // sibling is now first is a largest.
                self.free_subtree(child);
                break;
            }
            if was_head && node != ROOT {
                self.restore_head(node, old);
            }
            path.push(child);
            let len = self.len_of(child);
            node = child;
            pos += len as u32;
            rem -= len;
        }
        // Nodes that still count other suffixes but point into the removed sequence
        // borrow an occurrence from a child, deepest first.
        for &n in path.iter().rev() {
            if !dead.contains(&self.nodes[n as usize].start) {
                continue;
            }
            let len = self.len_of(n) as u32;
            let mut c = self.nodes[n as usize].first_child;
            while c != NIL {
                let s = self.nodes[c as usize].start;
                if !dead.contains(&s) {
                    self.nodes[n as usize].start = s - len;
                    break;
                }
                c = self.nodes[c as usize].next_sibling;
            }
        }
    }

    fn free_subtree(&mut self, root: u32) {
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            let mut c = self.nodes[n as usize].first_child;
            let indexed = self.lens[n as usize] & INDEXED != 0;
            while c != NIL {
                if indexed {
                    self.child_index.remove(n, self.first_token(c));
                }
                stack.push(c);
                c = self.nodes[c as usize].next_sibling;
            }
            self.nodes[n as usize] = Node {
                start: 0,
                count: 0,
                first_child: NIL,
                next_sibling: self.free_head,
            };
            self.lens[n as usize] = 0;
            self.free_head = n;
            self.free_nodes += 1;
        }
    }
}

impl<S: Storage> GlobalTree<S> {
    /// The root position.
    pub fn root(&self) -> GlobalCursor {
        GlobalCursor {
            node: ROOT,
            off: 0,
            depth: 0,
        }
    }

    /// Walk `path` from the root; `None` when it is not in the tree.
    pub fn walk(&self, path: &[u32]) -> Option<GlobalCursor> {
        if path.len() > self.max_depth {
            return None;
        }
        let mut c = self.root();
        for &t in path {
            c = self.step(c, t)?;
        }
        Some(c)
    }

    /// Follow one token down from `c`.
    #[inline]
    pub fn step(&self, c: GlobalCursor, token: u32) -> Option<GlobalCursor> {
        if (c.off as usize) < self.len_of(c.node) {
            let s = self.node(c.node).start as usize + c.off as usize;
            return (self.token_at(s) == token).then_some(GlobalCursor {
                node: c.node,
                off: c.off + 1,
                depth: c.depth + 1,
            });
        }
        let child = self.child(c.node, token)?;
        Some(GlobalCursor {
            node: child,
            off: 1,
            depth: c.depth + 1,
        })
    }

    /// COUNT of the path spelled by `path` (0 when absent).
    pub fn count_of(&self, path: &[u32]) -> u32 {
        self.walk(path).map_or(0, |c| self.node(c.node).count)
    }

    /// The id of a live sequence holding the path at `c` (the occurrence its node
    /// records), if any.
    pub fn sequence_at(&self, c: &GlobalCursor) -> Option<u64> {
        if c.node == ROOT {
            return None;
        }
        let pos = self.node(c.node).start as usize;
        let i = self
            .seq_blocks
            .first_ending_at_or_after(&self.seqs, pos + 1);
        let e = self.seqs.get(i)?;
        (e.live != 0 && e.offset as usize <= pos).then_some(e.id)
    }

    /// For a path that occurs once, where its occurrence lies: the pool index just past
    /// the path, and the pool range of the live sequence that holds it.
    pub(crate) fn unique_occurrence(
        &self,
        c: &GlobalCursor,
    ) -> Option<(usize, std::ops::Range<usize>)> {
        let n = &self.node(c.node);
        if n.count != 1 || c.node == ROOT {
            return None;
        }
        let after = n.start as usize + c.off as usize;
        let i = self.seq_blocks.first_ending_at_or_after(&self.seqs, after);
        let e = self.seqs.get(i)?;
        // Widened before adding: a damaged snapshot may hold offsets near u32::MAX.
        let range = e.offset as usize..e.offset as usize + e.len as usize;
        (e.live != 0 && after > 0 && range.contains(&(after - 1))).then_some((after, range))
    }

    /// How far the unique occurrence at `c` keeps matching `context` backwards, beyond the
    /// `c.depth()` tokens the tree already matched (at most `limit` tokens more).
    pub(crate) fn extend_match_back(
        &self,
        c: &GlobalCursor,
        context: &[u32],
        limit: usize,
    ) -> usize {
        let Some((after, range)) = self.unique_occurrence(c) else {
            return 0;
        };
        let d = c.depth as usize;
        if context.len() < d || after < range.start + d {
            return 0;
        }
        let occ_start = after - d;
        let ctx_start = context.len() - d;
        // Out of the pool only in a damaged snapshot: then nothing more matches.
        self.pool.get(range.start..occ_start).map_or(0, |before| {
            common_suffix_len(before, &context[..ctx_start], limit)
        })
    }

    /// Average entropy, in bits, of the next-token distribution at every node below the
    /// root that has children, weighted by how many stored suffixes continue from it (the paper's
    /// predictor: low values mean predictable outputs and large speculation gains).
    /// Nodes, not token positions: a path seen once is one node without children, so the
    /// many unique paths of open-ended text do not pass for certainty. The root is left
    /// out: it is the unigram distribution, and every draft starts below it.
    pub fn next_token_entropy(&self) -> f64 {
        let mut weighted = 0.0f64;
        let mut weight = 0.0f64;
        for n in 1..self.nodes.len() as u32 {
            let node = &self.node(n);
            if node.count == 0 {
                continue;
            }
            let mut total = 0u64;
            let mut c = node.first_child;
            let mut guard = self.nodes.len(); // a damaged snapshot may link siblings in a cycle
            while c != NIL && guard > 0 {
                guard -= 1;
                total += self.node(c).count as u64;
                c = self.node(c).next_sibling;
            }
            if total == 0 {
                continue;
            }
            let mut h = 0.0f64;
            let mut c = node.first_child;
            let mut guard = self.nodes.len(); // a damaged snapshot may link siblings in a cycle
            while c != NIL && guard > 0 {
                guard -= 1;
                let q = self.node(c).count as f64 / total as f64;
                h -= q * q.log2();
                c = self.node(c).next_sibling;
            }
            weighted += h * total as f64;
            weight += total as f64;
        }
        if weight == 0.0 {
            0.0
        } else {
            weighted / weight
        }
    }

    /// Checks every invariant of the arena against the stored sequences; returns the first
    /// problem found. Costs O(tokens × depth): a tool for tests and `verify`, not serving.
    pub fn check_integrity(&self) -> Result<(), String> {
        // Counts: walk every suffix and tally.
        let mut visits: FxHashMap<u32, u32> = FxHashMap::default();
        let mut root_visits = 0u32;
        for e in self.seqs.iter().filter(|e| e.live != 0) {
            let s = self
                .pool
                .get(e.offset as usize..e.offset as usize + e.len as usize)
                .ok_or_else(|| format!("sequence {} lies outside the token pool", e.id))?;
            for i in 0..s.len() {
                root_visits += 1;
                let rem = (s.len() - i).min(self.max_depth);
                let mut node = ROOT;
                let mut j = 0;
                while j < rem {
                    let child = self.child(node, s[j + i]).ok_or_else(|| {
                        format!("sequence {} suffix {i}: no child at depth {j}", e.id)
                    })?;
                    let len = self.len_of(child);
                    let st = self.node(child).start as usize;
                    if len == 0 {
                        // Only a damaged snapshot has one, and the walk would never advance.
                        return Err(format!("node {child}: an edge of length 0"));
                    }
                    if j + len > rem {
                        return Err(format!("sequence {} suffix {i} ends inside an edge", e.id));
                    }
                    if self.pool.get(st..st + len) != Some(&s[i + j..i + j + len]) {
                        return Err(format!("sequence {} suffix {i}: edge tokens differ", e.id));
                    }
                    *visits.entry(child).or_default() += 1;
                    node = child;
                    j += len;
                }
            }
        }
        if self.node(ROOT).count != root_visits {
            return Err(format!(
                "root count {} but {} suffixes",
                self.node(ROOT).count,
                root_visits
            ));
        }
        // Structure: every reachable node's count equals its visits, and children are
        // consistent with the index.
        let mut stack = vec![(ROOT, 0usize)];
        let mut reachable = 1;
        while let Some((n, depth)) = stack.pop() {
            let indexed = self.len_byte(n) & INDEXED != 0;
            let mut c = self.node(n).first_child;
            let mut child_sum = 0u64;
            let mut fanout = 0;
            let mut previous = u32::MAX;
            let mut guard = self.nodes.len(); // a damaged snapshot may link siblings in a cycle
            while c != NIL && guard > 0 {
                guard -= 1;
                reachable += 1;
                if reachable > self.nodes.len() {
                    return Err("a node is reachable twice: the links form a cycle".into());
                }
                fanout += 1;
                let cnt = self.node(c).count;
                if self.wide_lists_sorted && indexed && cnt > previous {
                    return Err(format!(
                        "node {n}: wide children list out of count order, though the tree says it is sorted"
                    ));
                }
                previous = cnt;
                let want = visits.get(&c).copied().unwrap_or(0);
                if cnt != want || cnt == 0 {
                    return Err(format!(
                        "node {c}: count {cnt}, {want} suffixes pass through"
                    ));
                }
                let len = self.len_of(c);
                if len == 0 || depth + len > self.max_depth {
                    return Err(format!("node {c}: bad edge length {len} at depth {depth}"));
                }
                let st = self.node(c).start as usize;
                if st < depth || st + len > self.pool.len() {
                    return Err(format!("node {c}: occurrence out of the pool"));
                }
                if indexed && self.child_index.child_of(n, self.first_token(c)) != Some(c) {
                    return Err(format!("node {n}: child {c} missing from the index"));
                }
                child_sum += cnt as u64;
                stack.push((c, depth + len));
                c = self.node(c).next_sibling;
            }
            let head = self.node(n).first_child;
            if n != ROOT && head != NIL {
                let mut c = head;
                let mut guard = self.nodes.len(); // a damaged snapshot may link siblings in a cycle
                while c != NIL && guard > 0 {
                    guard -= 1;
                    if self.node(c).count > self.node(head).count {
                        return Err(format!("node {n}: head child {head} is not the largest"));
                    }
                    c = self.node(c).next_sibling;
                }
            }
            if child_sum > self.node(n).count as u64 {
                return Err(format!("node {n}: children count more than the node"));
            }
            if !indexed && fanout > INDEX_FANOUT {
                return Err(format!("node {n}: {fanout} children but no index"));
            }
        }
        if reachable + self.free_nodes != self.nodes.len() {
            return Err(format!(
                "{} nodes reachable, {} free, {} allocated",
                reachable,
                self.free_nodes,
                self.nodes.len()
            ));
        }
        Ok(())
    }
}

impl<S: Storage> GlobalTree<S> {
    /// Every child of `c` in list order (the head, the largest below the root, first).
    /// Inside an edge that is the edge's next token alone. Lets a caller stop early once
    /// what is left cannot matter to it.
    pub(crate) fn child_list(&self, c: &GlobalCursor) -> ChildList<'_, S> {
        let inside = self.within_edge(c);
        let next = if inside.is_some() {
            NIL
        } else {
            self.node(c.node).first_child
        };
        ChildList {
            tree: self,
            inside,
            next,
            depth: c.depth + 1,
            // A damaged snapshot may link siblings in a cycle.
            guard: self.nodes.len(),
        }
    }

    /// The children list at `c` is known to be in descending count order.
    pub(crate) fn list_sorted(&self, c: &GlobalCursor) -> bool {
        self.wide_lists_sorted
            && (c.off as usize) >= self.len_of(c.node)
            && self.len_byte(c.node) & INDEXED != 0
    }

    /// Inside an edge the only child is the edge's next token, with the same count.
    fn within_edge(&self, c: &GlobalCursor) -> Option<Child<GlobalCursor>> {
        let n = &self.node(c.node);
        ((c.off as usize) < self.len_of(c.node)).then(|| Child {
            token: self.token_at(n.start as usize + c.off as usize),
            count: n.count,
            cursor: GlobalCursor {
                node: c.node,
                off: c.off + 1,
                depth: c.depth + 1,
            },
        })
    }
}

/// Pool tokens per block of [`SeqBlocks`]: about one sequence of chat data.
const SEQ_BLOCK_SHIFT: u32 = 8;

/// A coarse index from pool positions to the sequence table, which is in pool order:
/// for every block of 2^[`SEQ_BLOCK_SHIFT`] pool positions, the first sequence that ends
/// at or after the block's start. Drafts ask which sequence holds a position (to read a
/// unique occurrence past the depth limit) on most calls; a binary search over the
/// whole table is a dozen dependent loads, cold ones among them, where this is one
/// load and a search over the few sequences of one block.
#[derive(Clone, Debug, Default)]
pub(crate) struct SeqBlocks {
    first: Vec<u32>,
}

impl SeqBlocks {
    /// The index over `seqs`, a table over a pool of `pool_len` tokens, as
    /// [`SeqBlocks::note`] would build it entry by entry. Ends past the pool (only in a
    /// damaged snapshot) count as the pool's end, so such a table costs no more memory
    /// than a sound one.
    pub(crate) fn over(seqs: &[SeqEntry], pool_len: usize) -> Self {
        let mut blocks = SeqBlocks::default();
        for (i, e) in seqs.iter().enumerate() {
            blocks.note(i, e, pool_len);
        }
        blocks
    }

    /// Account for sequence `index`, `e`, appended to the table of a pool of `pool_len`
    /// tokens. Blocks are added up to its end: no earlier sequence reached their start,
    /// or they would exist already.
    pub(crate) fn note(&mut self, index: usize, e: &SeqEntry, pool_len: usize) {
        let end = (e.offset as u64 + e.len as u64).min(pool_len as u64);
        while ((self.first.len() as u64) << SEQ_BLOCK_SHIFT) <= end {
            self.first.push(index as u32);
        }
    }

    /// The first sequence of `seqs` whose end (`offset + len`) is at least `pos`, or
    /// `seqs.len()` if none is: `partition_point` over the whole table, narrowed to the
    /// sequences that can hold `pos`. On a damaged table (out of pool order) the answer
    /// may be wrong, but it is always within `0..=seqs.len()`.
    #[inline]
    pub(crate) fn first_ending_at_or_after(&self, seqs: &[SeqEntry], pos: usize) -> usize {
        let block = pos >> SEQ_BLOCK_SHIFT;
        let Some(&lo) = self.first.get(block) else {
            return seqs.len();
        };
        let hi = self
            .first
            .get(block + 1)
            .map_or(seqs.len(), |&h| h as usize + 1)
            .min(seqs.len());
        let lo = (lo as usize).min(hi);
        lo + seqs[lo..hi].partition_point(|e| (e.offset as usize + e.len as usize) < pos)
    }
}

/// Suffixes in the order a build inserts them (see [`GlobalTree::suffix_order`]).
struct SuffixOrder {
    /// Pool positions where the suffixes start, part by part, group by group.
    positions: Vec<u32>,
    /// The length of each suffix, cut at the depth limit.
    lens: Vec<u8>,
    /// Part `i` inserts the suffixes `bounds[i]..bounds[i + 1]`.
    bounds: Vec<usize>,
}

impl SuffixOrder {
    /// The positions and lengths of part `i`'s suffixes.
    fn part(&self, i: usize) -> (&[u32], &[u8]) {
        let range = self.bounds[i]..self.bounds[i + 1];
        (&self.positions[range.clone()], &self.lens[range])
    }
}

/// The subtrees of the suffixes `(positions, lens)` (a part of a [`SuffixOrder`]), built
/// in `sub`: the whole tree on one thread, or an arena from [`GlobalTree::empty_part`]
/// (node `start`s index its copy of the pool and the whole tree's).
fn build_part(mut sub: GlobalTree, (positions, lens): (&[u32], &[u8])) -> GlobalTree {
    for (&pos, &len) in positions.iter().zip(lens) {
        sub.insert_suffix(pos, len as usize);
    }
    sub.sort_wide_lists();
    sub
}

/// Copy the nodes below `part`'s root into `nodes`/`lens`, numbered from `base`. The
/// order is depth first, but with each node's whole children list, in list order, before
/// the subtree of its first child: siblings are then numbered together, so a lookup that
/// fails (it visits the whole list) reads one or two cache lines instead of one per
/// sibling, and a path drafted through first children stays near its start. The part's
/// root children come first; the last of them continues into `join`, the root's list
/// so far. Each node is read once, where its parent's list is walked; only the first
/// child link is written later, when the node's own list is laid out.
fn lay_out_part(part: &GlobalTree, base: u32, join: u32, nodes: &mut [Node], lens: &mut [u8]) {
    let mut next = base;
    // (old number, new number) of nodes whose children are still to be laid out.
    let mut stack = vec![(ROOT, ROOT)];
    let mut parents = Vec::new();
    while let Some((old, new)) = stack.pop() {
        let block = next;
        parents.clear();
        let mut c = part.nodes[old as usize].first_child;
        while c != NIL {
            let n = part.nodes[c as usize];
            let i = (next - base) as usize;
            let last = n.next_sibling == NIL;
            nodes[i] = Node {
                start: n.start,
                count: n.count,
                first_child: NIL,
                next_sibling: match (last, old == ROOT) {
                    (false, _) => next + 1,
                    (true, true) => join,
                    (true, false) => NIL,
                },
            };
            lens[i] = part.lens[c as usize];
            if n.first_child != NIL {
                parents.push((c, next));
            }
            next += 1;
            c = n.next_sibling;
        }
        if old != ROOT {
            nodes[(new - base) as usize].first_child = block;
        }
        // Reversed, so that the first child's subtree is laid out next.
        stack.extend(parents.iter().rev());
    }
}

/// Relink the children lists of wide nodes (those with a child index: the root and every
/// node with more than [`INDEX_FANOUT`] children) in descending count order; equal counts
/// keep their order. Freed nodes have no index flag, so a pass over `lens` finds them all.
pub(crate) fn sort_wide_lists(nodes: &mut [Node], lens: &[u8]) {
    let mut kids = Vec::new();
    let mut guard = nodes.len(); // a damaged arena may link siblings in a cycle
    for (n, &len) in lens.iter().enumerate() {
        if len & INDEXED != 0 && n < nodes.len() {
            sort_list(nodes, n as u32, &mut kids, &mut guard);
        }
    }
}

/// Relink the children of `n` in descending count order, stable.
fn sort_list(nodes: &mut [Node], n: u32, kids: &mut Vec<(u32, u32)>, guard: &mut usize) {
    kids.clear();
    let mut sorted = true;
    let mut c = nodes[n as usize].first_child;
    while c != NIL && (c as usize) < nodes.len() && *guard > 0 {
        *guard -= 1;
        let node = &nodes[c as usize];
        sorted &= kids.last().is_none_or(|&(prev, _)| prev >= node.count);
        kids.push((node.count, c));
        c = node.next_sibling;
    }
    if sorted {
        return;
    }
    kids.sort_by_key(|&(count, _)| std::cmp::Reverse(count));
    let mut next = NIL;
    for &(_, k) in kids.iter().rev() {
        nodes[k as usize].next_sibling = next;
        next = k;
    }
    nodes[n as usize].first_child = next;
}

/// The children of one position, in list order: see [`GlobalTree::child_list`].
pub(crate) struct ChildList<'a, S: Storage> {
    tree: &'a GlobalTree<S>,
    inside: Option<Child<GlobalCursor>>,
    next: u32,
    depth: u8,
    guard: usize,
}

impl<S: Storage> Iterator for ChildList<'_, S> {
    type Item = Child<GlobalCursor>;

    #[inline]
    fn next(&mut self) -> Option<Child<GlobalCursor>> {
        if let Some(k) = self.inside.take() {
            return Some(k);
        }
        if self.next == NIL || self.guard == 0 {
            return None;
        }
        self.guard -= 1;
        let node = self.next;
        let n = self.tree.node(node);
        self.next = n.next_sibling;
        Some(Child {
            token: self.tree.token_at(n.start as usize),
            count: n.count,
            cursor: GlobalCursor {
                node,
                off: 1,
                depth: self.depth,
            },
        })
    }
}

impl<S: Storage> Expand for GlobalTree<S> {
    type Cursor = GlobalCursor;

    #[inline]
    fn count(&self, c: &GlobalCursor) -> u32 {
        self.node(c.node).count
    }

    fn children(&self, c: &GlobalCursor, min_count: u32, out: &mut Vec<Child<GlobalCursor>>) {
        out.clear();
        let n = &self.node(c.node);
        if (c.off as usize) < self.len_of(c.node) {
            out.extend(self.within_edge(c).filter(|k| k.count >= min_count));
            return;
        }
        // Below the root the head is the largest child: if it falls short, all do.
        if c.node != ROOT && (n.first_child == NIL || self.node(n.first_child).count < min_count) {
            return;
        }
        // Scan until what is left unseen could not reach min_count.
        let mut unseen = n.count as u64;
        let sorted = self.list_sorted(c);
        for k in self.child_list(c) {
            if unseen < min_count.max(1) as u64 || (sorted && k.count < min_count) {
                break;
            }
            unseen = unseen.saturating_sub(k.count as u64);
            if k.count >= min_count {
                out.push(k);
            }
        }
        // Stable: equal counts keep list order.
        out.sort_by_key(|k| std::cmp::Reverse(k.count));
    }

    fn best_child(&self, c: &GlobalCursor, min_count: u32) -> Option<Child<GlobalCursor>> {
        let n = &self.node(c.node);
        if (c.off as usize) < self.len_of(c.node) {
            return self.within_edge(c).filter(|k| k.count >= min_count);
        }
        if c.node == ROOT {
            let mut all = Vec::new();
            self.children(c, min_count, &mut all);
            return all.into_iter().next();
        }
        // The head of every list below the root is its largest child.
        let best = n.first_child;
        if best == NIL {
            return None;
        }
        // Its edge length is the next thing a draft reads, from another array: start
        // that load now, beside the record's.
        self.prefetch_node(best);
        let best_count = self.node(best).count;
        if best_count < min_count {
            return None;
        }
        Some(Child {
            token: self.first_token(best),
            count: best_count,
            cursor: GlobalCursor {
                node: best,
                off: 1,
                depth: c.depth + 1,
            },
        })
    }

    fn child(&self, c: &GlobalCursor, token: u32) -> Option<Child<GlobalCursor>> {
        let next = self.step(*c, token)?;
        Some(Child {
            token,
            count: self.node(next.node).count,
            cursor: next,
        })
    }

    fn continuation_beyond_depth(&self, c: &GlobalCursor, max: usize) -> &[u32] {
        match self.unique_occurrence(c) {
            Some((after, range)) => self
                .pool
                .get(after..range.end.min(after + max))
                .unwrap_or(&[]),
            None => &[],
        }
    }
}

impl<S: Storage> GlobalIndex for GlobalTree<S> {
    fn max_depth(&self) -> usize {
        self.max_depth
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn root(&self) -> GlobalCursor {
        GlobalTree::root(self)
    }

    #[inline]
    fn step(&self, cursor: &GlobalCursor, token: u32) -> Option<GlobalCursor> {
        GlobalTree::step(self, *cursor, token)
    }

    #[inline]
    fn prefetch_step(&self, cursor: &GlobalCursor, token: u32) {
        let Some(node) = self.nodes.get(cursor.node as usize) else {
            return;
        };
        // The same three cases as `step`: inside the edge, an indexed node, a list.
        if (cursor.off as usize) < self.len_of(cursor.node) {
            if let Some(t) = self.pool.get(node.start as usize + cursor.off as usize) {
                super::prefetch(t);
            }
        } else if self.len_byte(cursor.node) & INDEXED != 0 {
            self.child_index.prefetch(cursor.node, token);
        } else if let Some(first) = self.nodes.get(node.first_child as usize) {
            super::prefetch(first);
        }
    }

    fn extend_match_back(&self, cursor: &GlobalCursor, context: &[u32], limit: usize) -> usize {
        GlobalTree::extend_match_back(self, cursor, context, limit)
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

    fn seq_table(lens: &[u32]) -> Vec<SeqEntry> {
        let mut offset = 0;
        lens.iter()
            .enumerate()
            .map(|(i, &len)| {
                let e = SeqEntry {
                    id: i as u64,
                    offset,
                    len,
                    live: 1,
                    reserved: 0,
                };
                offset += len;
                e
            })
            .collect()
    }

    proptest::proptest! {
        /// The block index answers as a binary search over the whole table would, for
        /// every position, whatever the sequence lengths (empty ones and ones spanning
        /// many blocks included).
        #[test]
        fn seq_blocks_agree_with_a_full_search(
            lens in proptest::collection::vec(
                proptest::prop_oneof![0u32..4, 0u32..300, 250u32..1200],
                0..40,
            ),
        ) {
            let seqs = seq_table(&lens);
            let total: u32 = lens.iter().sum();
            let blocks = SeqBlocks::over(&seqs, total as usize);
            for pos in 0..=total as usize + 2 {
                let want = seqs.partition_point(|e| ((e.offset + e.len) as usize) < pos);
                proptest::prop_assert_eq!(blocks.first_ending_at_or_after(&seqs, pos), want);
            }
        }
    }

    #[test]
    fn seq_blocks_stay_in_bounds_on_a_table_out_of_order() {
        let mut seqs = seq_table(&[300, 10, 700, 5]);
        seqs.swap(0, 2);
        let blocks = SeqBlocks::over(&seqs, 1015);
        for pos in 0..2000 {
            assert!(blocks.first_ending_at_or_after(&seqs, pos) <= seqs.len());
        }
        // A table for other sequences than the one searched: still no panic.
        let other = SeqBlocks::over(&seq_table(&[5000]), 5000);
        for pos in [0, 255, 256, 4999, 5000, 9000] {
            assert!(other.first_ending_at_or_after(&seqs[..1], pos) <= 1);
        }
        // Ends far past the pool: the index stays the pool's size.
        let mut huge = seq_table(&[10]);
        huge[0].offset = u32::MAX - 1;
        huge[0].len = u32::MAX;
        let capped = SeqBlocks::over(&huge, 10);
        assert_eq!(capped.first.len(), 1);
        assert!(capped.first_ending_at_or_after(&huge, 5) <= 1);
    }
}
