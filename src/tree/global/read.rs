//! Reading a tree: cursors, walking, counts, children, and the [`GlobalIndex`] and
//! [`Expand`] views speculation reads.

use super::*;

impl<S: Storage> GlobalTree<S> {
    /// Node `n`; outside the arena (only in a damaged snapshot), an empty leaf.
    #[inline]
    pub(super) fn node(&self, n: u32) -> &Node {
        self.nodes.get(n as usize).unwrap_or(&Node::OUTSIDE)
    }

    #[inline]
    pub(super) fn len_byte(&self, n: u32) -> u8 {
        self.lens.get(n as usize).copied().unwrap_or(0)
    }

    /// The pool token at `pos`; `NIL` outside the pool (only in a damaged snapshot).
    #[inline]
    fn token_at(&self, pos: usize) -> u32 {
        self.pool.get(pos).copied().unwrap_or(NIL)
    }

    #[inline]
    pub(super) fn len_of(&self, n: u32) -> usize {
        (self.len_byte(n) & LEN_MASK) as usize
    }

    #[inline]
    pub(super) fn first_token(&self, n: u32) -> u32 {
        self.token_at(self.node(n).start as usize)
    }
}

impl<S: Storage> GlobalTree<S> {
    pub(super) fn find_child(&self, node: u32, token: u32) -> Lookup {
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
            super::super::prefetch(node);
        }
        if let Some(len) = self.lens.get(n as usize) {
            super::super::prefetch(len);
        }
    }

    /// Child of `node` for `token`, if any.
    #[inline]
    pub(super) fn child(&self, node: u32, token: u32) -> Option<u32> {
        match self.find_child(node, token) {
            Lookup::Found { child, .. } => Some(child),
            Lookup::Missing { .. } => None,
        }
    }

    pub(super) fn predecessor(&self, parent: u32, child: u32) -> u32 {
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
                super::super::prefetch(t);
            }
        } else if self.len_byte(cursor.node) & INDEXED != 0 {
            self.child_index.prefetch(cursor.node, token);
        } else if let Some(first) = self.nodes.get(node.first_child as usize) {
            super::super::prefetch(first);
        }
    }

    fn extend_match_back(&self, cursor: &GlobalCursor, context: &[u32], limit: usize) -> usize {
        GlobalTree::extend_match_back(self, cursor, context, limit)
    }
}
