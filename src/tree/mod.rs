//! Suffix trees: the first stage of the data flow.
//!
//! Two trees feed speculation:
//! - [`GlobalTree`]: a depth-limited, path-compressed suffix trie over the responses of
//!   earlier requests, kept in a flat arena of `u32`-indexed nodes so that the store can
//!   freeze it into a snapshot.
//! - [`RequestTree`]: an index over the current request's prompt and generated tokens,
//!   cheap to start over a long prompt and extended token by token.
//!
//! Both give the same counts: COUNT(path) is the number of places where `path` occurs in
//! the stored sequences, with `path` no longer than the depth limit. That is the number of
//! (depth-truncated) suffixes whose path passes through the node, as in the paper.
//! Speculation reads both through the [`Expand`] trait.

mod global;
mod request;
mod wide_index;

pub use global::{
    Borrowed, ChildIndex, GlobalCursor, GlobalTree, IntegrityError, Node, Owned, PartsError,
    SeqEntry, Storage, TreeError, TreeParts, TreeStats, WideChild,
};
pub(crate) use request::for_most_recent;
pub use request::{
    LONG_MATCH, MAX_CURSOR_ENDS, MAX_OCCURRENCES, Match, RequestCursor, RequestTree,
};
#[cfg(test)]
pub(crate) use request::{repetitive_prompt, tree_and_cursor_at_end};
pub use wide_index::WideIndex;

/// The "no node" index in the arena's `u32` links.
pub const NIL: u32 = u32::MAX;

/// The largest supported depth limit; edge lengths are stored in 7 bits.
pub const MAX_SUPPORTED_DEPTH: usize = 127;

/// The depth limit of trees when nothing else says (the paper's 24; also the default of
/// `SpecParams::max_depth`).
pub const DEFAULT_MAX_DEPTH: usize = 24;

/// How many tokens `a` and `b` have in common at their ends, counting at most `max`.
///
/// Matching a context against earlier occurrences is mostly this comparison, and copies
/// make it long, so it compares eight tokens at a time while it can.
pub(crate) fn common_suffix_len(a: &[u32], b: &[u32], max: usize) -> usize {
    const CHUNK: usize = 8;
    let max = max.min(a.len()).min(b.len());
    let (a, b) = (&a[a.len() - max..], &b[b.len() - max..]);
    // Most comparisons (every occurrence of a common token) end at the first token.
    if max == 0 || a[max - 1] != b[max - 1] {
        return 0;
    }
    let mut l = 0;
    while l + CHUNK <= max {
        let end = max - l;
        let x: &[u32; CHUNK] = a[end - CHUNK..end].try_into().expect("a chunk");
        let y: &[u32; CHUNK] = b[end - CHUNK..end].try_into().expect("a chunk");
        if x != y {
            break;
        }
        l += CHUNK;
    }
    while l < max && a[max - 1 - l] == b[max - 1 - l] {
        l += 1;
    }
    l
}

/// How many leading tokens `a` and `b` share, compared eight at a time while they can
/// (occurrences on repetitive text follow a path for its whole length, and grouping the
/// occurrences of a cursor compares whole horizons).
pub(crate) fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    const CHUNK: usize = 8;
    let max = a.len().min(b.len());
    let mut l = 0;
    while l + CHUNK <= max {
        let x: &[u32; CHUNK] = a[l..l + CHUNK].try_into().expect("a chunk");
        let y: &[u32; CHUNK] = b[l..l + CHUNK].try_into().expect("a chunk");
        if x != y {
            break;
        }
        l += CHUNK;
    }
    while l < max && a[l] == b[l] {
        l += 1;
    }
    l
}

/// Ask the CPU to start loading `value` into cache. Only a hint: it never faults and
/// changes nothing, so it is safe on any reference.
#[inline]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally; the address is a live reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// A child of a tree position, as speculation sees it.
#[derive(Clone, Debug)]
pub struct Child<C> {
    /// The token on the edge into the child.
    pub token: u32,
    /// COUNT of the child: how many stored suffixes pass through it.
    pub count: u32,
    /// Where the child is.
    pub cursor: C,
}

/// Read access to a suffix tree for draft expansion.
///
/// A cursor is a position in the tree, i.e. a path from the root. The expansion code in
/// [`crate::speculate`] is written once against this trait.
pub trait Expand {
    /// A position in the tree.
    type Cursor: Clone;

    /// COUNT of the path at `cursor`.
    fn count(&self, cursor: &Self::Cursor) -> u32;

    /// Children of `cursor` whose count is at least `min_count`, most likely first; among
    /// equal counts the tree's own order (most recently used first) decides.
    fn children(&self, cursor: &Self::Cursor, min_count: u32, out: &mut Vec<Child<Self::Cursor>>);

    /// The most likely child, if any has a count of at least `min_count`.
    fn best_child(&self, cursor: &Self::Cursor, min_count: u32) -> Option<Child<Self::Cursor>> {
        let mut out = Vec::new();
        self.children(cursor, min_count, &mut out);
        out.into_iter().next()
    }

    /// [`Expand::best_child`] in place: moves `cursor` to the most likely child, if any has
    /// a count of at least `min_count`, and returns that child's token and count. On
    /// `None` the cursor is unchanged. A tree whose cursors own buffers overrides it to
    /// reuse them: a path draft takes one such step per token.
    fn step_to_best_child(&self, cursor: &mut Self::Cursor, min_count: u32) -> Option<(u32, u32)> {
        let child = self.best_child(cursor, min_count)?;
        *cursor = child.cursor;
        Some((child.token, child.count))
    }

    /// True when [`Expand::alike_ahead`] can know steps: a path draft then asks it.
    const KNOWS_ALIKE_STEPS: bool = false;

    /// Where every occurrence at `cursor` that goes on goes on with the same token, for
    /// a stretch of steps: writes into `steps` (at most its length) each step's token and
    /// child count, as successive [`Expand::step_to_best_child`] calls would return them
    /// (before their `min_count` check), and returns how many it wrote. A path draft then
    /// takes them without asking every occurrence at every step, and moves the cursor
    /// once with [`Expand::advance_alike`]. The default writes none: the caller steps one
    /// token at a time.
    fn alike_ahead(&self, _cursor: &Self::Cursor, _steps: &mut [(u32, u32)]) -> usize {
        0
    }

    /// Moves `cursor` down the first `taken` steps that [`Expand::alike_ahead`] wrote
    /// for it, where the `taken`-th step's child count was `count`: the cursor
    /// `taken` calls to [`Expand::step_to_best_child`] would leave.
    fn advance_alike(&self, _cursor: &mut Self::Cursor, taken: usize, _count: u32) {
        assert_eq!(taken, 0, "alike_ahead wrote no steps");
    }

    /// The child of `cursor` for `token`, if there is one.
    fn child(&self, cursor: &Self::Cursor, token: u32) -> Option<Child<Self::Cursor>> {
        let mut out = Vec::new();
        self.children(cursor, 1, &mut out);
        out.into_iter().find(|k| k.token == token)
    }

    /// When the path at `cursor` occurs exactly once and the tree knows how that
    /// occurrence continues past its depth limit, the tokens that follow (at most `max`).
    /// Only extended speculation asks for this; the default is "unknown".
    fn continuation_beyond_depth(&self, _cursor: &Self::Cursor, _max: usize) -> &[u32] {
        &[]
    }
}

/// A tree that speculation can match contexts in: the global tree, a snapshot of it, or
/// the store's layered view of both. Its cursors can be stepped token by token.
pub trait GlobalIndex: Expand {
    /// The depth limit: no path is longer.
    fn max_depth(&self) -> usize;

    /// Changes whenever the contents change: a cursor stays valid while it is the same.
    fn version(&self) -> u64;

    /// The root position.
    fn root(&self) -> Self::Cursor;

    /// Follow one token down from `cursor`.
    fn step(&self, cursor: &Self::Cursor, token: u32) -> Option<Self::Cursor>;

    /// Start loading what [`GlobalIndex::step`] from `cursor` by `token` will read first,
    /// so that independent steps wait on memory together. Only a hint: the default does
    /// nothing.
    fn prefetch_step(&self, _cursor: &Self::Cursor, _token: u32) {}

    /// Walk `path` from the root; `None` when it is not in the tree.
    fn walk(&self, path: &[u32]) -> Option<Self::Cursor> {
        if path.len() > self.max_depth() {
            return None;
        }
        path.iter().try_fold(self.root(), |c, &t| self.step(&c, t))
    }

    /// When the path at `cursor` occurs once, how far that occurrence keeps matching
    /// `context` backwards beyond the path itself (at most `limit` more tokens).
    fn extend_match_back(&self, _cursor: &Self::Cursor, _context: &[u32], _limit: usize) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::common_suffix_len;

    #[test]
    fn common_suffix_len_counts_matching_ends_up_to_max() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        assert_eq!(common_suffix_len(&a, &b, 100), 40);
        assert_eq!(common_suffix_len(&a, &b, 17), 17);
        b[20] = 999;
        assert_eq!(common_suffix_len(&a, &b, 100), 19);
        assert_eq!(common_suffix_len(&a[..5], &b, 100), 0);
        assert_eq!(common_suffix_len(&[], &b, 100), 0);
        assert_eq!(common_suffix_len(&a[..21], &b[..21], 100), 0);
        assert_eq!(common_suffix_len(&a[30..], &a, 100), 10);
    }
}
