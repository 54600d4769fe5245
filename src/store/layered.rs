//! The global view of one namespace: the snapshot's frozen tree (base), plus the tree of
//! sequences appended since (delta), minus the tree of base sequences evicted since
//! (evicted).
//!
//! COUNT is a sum over sequences, so the view's counts are exactly those of one tree
//! built from base + delta − evicted: `base + delta − evicted` at every path. Eviction
//! from the read-only base therefore takes effect at once, without touching the mapped
//! file, and its space comes back when compaction writes a new base.

use crate::tree::{Child, Expand, GlobalCursor, GlobalIndex, GlobalTree, Storage};

use super::snapshot::FrozenTree;

/// Base + delta − evicted, read as one tree.
pub struct Layered<'a, S: Storage = super::snapshot::Frozen> {
    /// The snapshot's tree, if one is open.
    pub base: Option<&'a GlobalTree<S>>,
    /// Sequences appended since the snapshot.
    pub delta: &'a GlobalTree,
    /// Base sequences evicted since the snapshot.
    pub evicted: &'a GlobalTree,
}

/// A position in each layer: `[base, delta, evicted]`, `None` where a layer lacks the path.
pub type LayeredCursor = [Option<GlobalCursor>; 3];

impl<'a> Layered<'a> {
    /// The view of a snapshot's `base` + `delta` − `evicted`.
    pub fn new(
        base: Option<&'a FrozenTree>,
        delta: &'a GlobalTree,
        evicted: &'a GlobalTree,
    ) -> Self {
        Layered::over(base, delta, evicted)
    }
}

impl<'a, S: Storage> Layered<'a, S> {
    /// The view of `base` (frozen or in memory) + `delta` − `evicted`.
    pub fn over(
        base: Option<&'a GlobalTree<S>>,
        delta: &'a GlobalTree,
        evicted: &'a GlobalTree,
    ) -> Self {
        Layered {
            base,
            delta,
            evicted,
        }
    }
}

impl<S: Storage> Layered<'_, S> {
    /// A cached sequence that holds the path at `c`: from the delta if it has the path,
    /// else from the base. Used to mark the sequences behind accepted drafts as used.
    pub fn sequence_at(&self, c: &LayeredCursor) -> Option<u64> {
        if let Some(y) = &c[1]
            && let Some(id) = self.delta.sequence_at(y)
        {
            return Some(id);
        }
        match (self.base, &c[0]) {
            (Some(b), Some(x)) => b.sequence_at(x),
            _ => None,
        }
    }

    fn counts(&self, c: &LayeredCursor) -> (u32, u32, u32) {
        (
            match (self.base, &c[0]) {
                (Some(b), Some(x)) => b.count(x),
                _ => 0,
            },
            c[1].as_ref().map_or(0, |x| self.delta.count(x)),
            c[2].as_ref().map_or(0, |x| self.evicted.count(x)),
        )
    }

    /// Only the base holds this path, and nothing under it was evicted: read the base
    /// directly (the common case, and exactly the base's own answers).
    fn base_only<'c>(&self, c: &'c LayeredCursor) -> Option<(&GlobalTree<S>, &'c GlobalCursor)> {
        match (self.base, c) {
            (Some(b), [Some(x), None, None]) => Some((b, x)),
            _ => None,
        }
    }
}

impl<S: Storage> Expand for Layered<'_, S> {
    type Cursor = LayeredCursor;

    fn count(&self, c: &LayeredCursor) -> u32 {
        let (b, d, e) = self.counts(c);
        (b + d).saturating_sub(e)
    }

    fn children(&self, c: &LayeredCursor, min_count: u32, out: &mut Vec<Child<LayeredCursor>>) {
        if let Some((b, x)) = self.base_only(c) {
            let mut kids = Vec::new();
            b.children(x, min_count, &mut kids);
            out.clear();
            out.extend(kids.into_iter().map(|k| Child {
                token: k.token,
                count: k.count,
                cursor: [Some(k.cursor), None, None],
            }));
            return;
        }
        out.clear();
        let (cb, cd, _) = self.counts(c);
        let mut kb = Vec::new();
        let mut kd = Vec::new();
        // A child needs min_count in total, so at least min_count − (the other layer's
        // whole count) in each; eviction only lowers totals.
        if let (Some(b), Some(x)) = (self.base, &c[0]) {
            b.children(x, min_count.saturating_sub(cd).max(1), &mut kb);
        }
        if let Some(y) = &c[1] {
            self.delta
                .children(y, min_count.saturating_sub(cb).max(1), &mut kd);
        }
        let mut push =
            |token: u32, base: Option<GlobalCursor>, delta: Option<GlobalCursor>, count: u32| {
                let gone = c[2].as_ref().and_then(|z| self.evicted.child(z, token));
                let count = count.saturating_sub(gone.as_ref().map_or(0, |g| g.count));
                if count >= min_count.max(1) {
                    out.push(Child {
                        token,
                        count,
                        cursor: [base, delta, gone.map(|g| g.cursor)],
                    });
                }
            };
        for k in kb {
            let other = kd
                .iter()
                .position(|m| m.token == k.token)
                .map(|i| kd.swap_remove(i));
            let count = k.count + other.as_ref().map_or(0, |m| m.count);
            push(k.token, Some(k.cursor), other.map(|m| m.cursor), count);
        }
        for m in kd {
            // Children found only in the delta may still be in the base below the
            // threshold used above.
            let base = match (self.base, &c[0]) {
                (Some(b), Some(x)) => b.child(x, m.token),
                _ => None,
            };
            let count = m.count + base.as_ref().map_or(0, |k| k.count);
            push(m.token, base.map(|k| k.cursor), Some(m.cursor), count);
        }
        out.sort_by_key(|k| std::cmp::Reverse(k.count));
    }

    fn best_child(&self, c: &LayeredCursor, min_count: u32) -> Option<Child<LayeredCursor>> {
        if let Some((b, x)) = self.base_only(c) {
            return b.best_child(x, min_count).map(|k| Child {
                token: k.token,
                count: k.count,
                cursor: [Some(k.cursor), None, None],
            });
        }
        let mut out = Vec::new();
        self.children(c, min_count, &mut out);
        out.into_iter().next()
    }

    fn child(&self, c: &LayeredCursor, token: u32) -> Option<Child<LayeredCursor>> {
        let next = self.step(c, token)?;
        Some(Child {
            token,
            count: self.count(&next),
            cursor: next,
        })
    }

    fn continuation_beyond_depth(&self, c: &LayeredCursor, max: usize) -> &[u32] {
        if self.count(c) != 1 || c[2].is_some() {
            return &[];
        }
        match (self.base, c) {
            (Some(b), [Some(x), None, None]) => b.continuation_beyond_depth(x, max),
            (_, [None, Some(y), None]) => self.delta.continuation_beyond_depth(y, max),
            _ => &[],
        }
    }
}

impl<S: Storage> GlobalIndex for Layered<'_, S> {
    fn max_depth(&self) -> usize {
        self.delta.max_depth()
    }

    fn version(&self) -> u64 {
        // Versions are unique per tree state; mix the three so that any change changes it.
        let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        let base = self.base.map_or(0, |b| GlobalIndex::version(b));
        mix(
            mix(mix(0, base), GlobalIndex::version(self.delta)),
            GlobalIndex::version(self.evicted),
        )
    }

    fn root(&self) -> LayeredCursor {
        [
            self.base.map(|b| b.root()),
            Some(self.delta.root()),
            Some(self.evicted.root()),
        ]
    }

    #[inline]
    fn step(&self, c: &LayeredCursor, token: u32) -> Option<LayeredCursor> {
        let base = match (self.base, &c[0]) {
            (Some(b), Some(x)) => b.step(*x, token),
            _ => None,
        };
        let delta = c[1].and_then(|y| self.delta.step(y, token));
        if base.is_none() && delta.is_none() {
            return None;
        }
        let next = [base, delta, c[2].and_then(|z| self.evicted.step(z, token))];
        (self.count(&next) > 0).then_some(next)
    }

    fn extend_match_back(&self, c: &LayeredCursor, context: &[u32], limit: usize) -> usize {
        if self.count(c) != 1 || c[2].is_some() {
            return 0;
        }
        match (self.base, c) {
            (Some(b), [Some(x), None, None]) => b.extend_match_back(x, context, limit),
            (_, [None, Some(y), None]) => self.delta.extend_match_back(y, context, limit),
            _ => 0,
        }
    }
}
