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

    /// Visit the children of `c` whose view count reaches the threshold, which starts at
    /// `min_count` and is replaced by what `visit` returns. Base children come in list
    /// order, then children only the delta has.
    ///
    /// Each list is left as soon as no child it has not shown could reach the threshold:
    /// none has more than the rest of the list's total, nor (below the root) more than
    /// the head, nor (in a sorted list) more than the child before it. A child of the
    /// view counts at most its base count plus the delta's whole count, since eviction
    /// only lowers counts. So on a base with sorted wide lists a wide node costs a few
    /// lookups, not one per child.
    fn scan_children(
        &self,
        c: &LayeredCursor,
        min_count: u32,
        mut visit: impl FnMut(Child<LayeredCursor>) -> u32,
    ) {
        let (cb, cd, _) = self.counts(c);
        let cd = cd as u64;
        let mut threshold = min_count as u64;
        let removed = |token: u32| {
            c[2].as_ref()
                .and_then(|z| self.evicted.child(z, token))
                .map_or((0, None), |g| (g.count, Some(g.cursor)))
        };
        let base = self.base.zip(c[0].as_ref());
        if let Some((b, x)) = base {
            let mut bound = ListBound::new(cb, b.list_sorted(x), x.depth() > 0);
            for k in b.child_list(x) {
                if bound.most() + cd < threshold {
                    break;
                }
                bound.saw(k.count);
                if (k.count as u64) + cd < threshold {
                    continue;
                }
                let d = c[1].as_ref().and_then(|y| self.delta.child(y, k.token));
                let (gone, z) = removed(k.token);
                let count = (k.count + d.as_ref().map_or(0, |m| m.count)).saturating_sub(gone);
                if count as u64 >= threshold {
                    threshold = visit(Child {
                        token: k.token,
                        count,
                        cursor: [Some(k.cursor), d.map(|m| m.cursor), z],
                    }) as u64;
                }
            }
        }
        let Some(y) = &c[1] else { return };
        let mut bound = ListBound::new(cd as u32, self.delta.list_sorted(y), y.depth() > 0);
        for m in self.delta.child_list(y) {
            if bound.most() < threshold {
                break;
            }
            bound.saw(m.count);
            // A child the base also has was visited above, or could not reach the
            // threshold there (and the threshold only rises).
            if (m.count as u64) < threshold
                || base.is_some_and(|(b, x)| b.child(x, m.token).is_some())
            {
                continue;
            }
            let (gone, z) = removed(m.token);
            let count = m.count.saturating_sub(gone);
            if count as u64 >= threshold {
                threshold = visit(Child {
                    token: m.token,
                    count,
                    cursor: [None, Some(m.cursor), z],
                }) as u64;
            }
        }
    }
}

/// The most that a child not yet seen in one children list can count.
struct ListBound {
    /// The total of the children not seen: their parent's count minus those seen.
    unseen: u64,
    /// The count of the child seen last (sorted lists) or of the head (below the root,
    /// where the head is the largest); unbounded before either.
    cap: u64,
    sorted: bool,
    headed: bool,
}

impl ListBound {
    fn new(parent_count: u32, sorted: bool, below_root: bool) -> Self {
        ListBound {
            unseen: parent_count as u64,
            cap: u64::MAX,
            sorted,
            headed: below_root,
        }
    }

    fn most(&self) -> u64 {
        self.unseen.min(self.cap)
    }

    fn saw(&mut self, count: u32) {
        self.unseen = self.unseen.saturating_sub(count as u64);
        if self.sorted || self.headed {
            self.cap = count as u64;
            self.headed = false;
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
        out.clear();
        if let Some((b, x)) = self.base_only(c) {
            let mut kids = Vec::new();
            b.children(x, min_count, &mut kids);
            out.extend(kids.into_iter().map(|k| Child {
                token: k.token,
                count: k.count,
                cursor: [Some(k.cursor), None, None],
            }));
            return;
        } else {
            let min_count = min_count.max(1);
            self.scan_children(c, min_count, |k| {
                out.push(k);
                min_count
            });
        }
        // Stable: equal counts keep scan order, which `best_child` also follows.
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
        let mut best = None;
        self.scan_children(c, min_count.max(1), |k| {
            // Only a strictly larger count can displace it: ties keep scan order.
            let above = k.count + 1;
            best = Some(k);
            above
        });
        best
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
        let base = self.base.map_or(0, GlobalIndex::version);
        mix(
            mix(mix(0, base), GlobalIndex::version(self.delta)),
            GlobalIndex::version(self.evicted),
        )
    }

    fn root(&self) -> LayeredCursor {
        // A layer with no tokens has no path: leaving it out spares every step a lookup.
        let holding = |t: &GlobalTree| (t.cached_tokens() > 0).then(|| t.root());
        [
            self.base.map(|b| b.root()),
            holding(self.delta),
            holding(self.evicted),
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
        let gone = c[2].and_then(|z| self.evicted.step(z, token));
        let next = [base, delta, gone];
        // Nothing evicted here: a path one layer holds counts at least 1.
        (gone.is_none() || self.count(&next) > 0).then_some(next)
    }

    #[inline]
    fn prefetch_step(&self, c: &LayeredCursor, token: u32) {
        if let (Some(b), Some(x)) = (self.base, &c[0]) {
            b.prefetch_step(x, token);
        }
        if let Some(y) = &c[1] {
            self.delta.prefetch_step(y, token);
        }
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
