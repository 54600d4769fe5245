//! The integrity check: every invariant of the arena against the stored sequences.

use super::*;

/// The first broken invariant [`GlobalTree::check_integrity`] found. Any of them means
/// the tables are damaged (a bad snapshot) or a bug changed them: rebuild the tree from
/// its sequences (`suffixd build`, or restore the snapshot from a backup).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IntegrityError {
    /// A sequence's range is not inside the token pool.
    #[error("sequence {seq} lies outside the token pool")]
    SequenceOutsidePool {
        /// Sequence id.
        seq: u64,
    },
    /// A suffix of a sequence has no path from the root.
    #[error("sequence {seq} suffix {suffix}: no child at depth {depth}")]
    MissingPath {
        /// Sequence id.
        seq: u64,
        /// Where the suffix starts in the sequence.
        suffix: usize,
        /// Depth at which the path stops.
        depth: usize,
    },
    /// A suffix ends inside an edge instead of at a node.
    #[error("sequence {seq} suffix {suffix} ends inside an edge")]
    EndsInsideEdge {
        /// Sequence id.
        seq: u64,
        /// Where the suffix starts in the sequence.
        suffix: usize,
    },
    /// An edge on a suffix's path spells other tokens than the suffix.
    #[error("sequence {seq} suffix {suffix}: edge tokens differ")]
    EdgeTokensDiffer {
        /// Sequence id.
        seq: u64,
        /// Where the suffix starts in the sequence.
        suffix: usize,
    },
    /// An edge is empty, or reaches past the depth limit.
    #[error("node {node}: bad edge length {len} at depth {depth}")]
    BadEdgeLength {
        /// The node.
        node: u32,
        /// Its edge length.
        len: usize,
        /// Depth of its parent.
        depth: usize,
    },
    /// A node's count differs from the suffixes passing through it (the root's
    /// included).
    #[error("node {node}: count {count}, {suffixes} suffixes pass through")]
    CountMismatch {
        /// The node.
        node: u32,
        /// Its count.
        count: u32,
        /// Suffixes passing through it.
        suffixes: u32,
    },
    /// A wide list is out of count order though the tree says it is sorted.
    #[error(
        "node {node}: wide children list out of count order, though the tree says it is sorted"
    )]
    WideListUnsorted {
        /// The parent node.
        node: u32,
    },
    /// A node's occurrence (its `start`) is not inside the pool.
    #[error("node {node}: occurrence out of the pool")]
    OccurrenceOutsidePool {
        /// The node.
        node: u32,
    },
    /// An indexed node's child is missing from the child index.
    #[error("node {node}: child {child} missing from the index")]
    MissingFromIndex {
        /// The parent node.
        node: u32,
        /// The child.
        child: u32,
    },
    /// The links reach a node twice.
    #[error("a node is reachable twice: the links form a cycle")]
    Cycle,
    /// A children list is not headed by its largest child.
    #[error("node {node}: head child {head} is not the largest")]
    HeadNotLargest {
        /// The parent node.
        node: u32,
        /// Its first child.
        head: u32,
    },
    /// The children of a node count more suffixes than the node.
    #[error("node {node}: children count more than the node")]
    ChildrenExceedNode {
        /// The node.
        node: u32,
    },
    /// A node has too many children for a list but no index.
    #[error("node {node}: {fanout} children but no index")]
    MissingIndex {
        /// The node.
        node: u32,
        /// Its children.
        fanout: usize,
    },
    /// Reachable and free nodes do not add up to the allocated ones.
    #[error("{reachable} nodes reachable, {free} free, {allocated} allocated")]
    NodesUnaccounted {
        /// Nodes reachable from the root.
        reachable: usize,
        /// Nodes on the free list.
        free: usize,
        /// Node records.
        allocated: usize,
    },
}

impl<S: Storage> GlobalTree<S> {
    /// Checks every invariant of the arena against the stored sequences; returns the first
    /// problem found. Costs O(tokens × depth): a tool for tests and `verify`, not serving.
    pub fn check_integrity(&self) -> Result<(), IntegrityError> {
        let visits = self.suffix_visits()?;
        self.check_structure(&visits)
    }

    /// Walk every suffix of every live sequence, cut at the depth limit, and count the
    /// suffixes passing through each node; the root's count must be all of them.
    fn suffix_visits(&self) -> Result<FxHashMap<u32, u32>, IntegrityError> {
        let mut visits: FxHashMap<u32, u32> = FxHashMap::default();
        let mut root_visits = 0u32;
        for e in self.seqs.iter().filter(|e| e.live != 0) {
            let s = self
                .pool
                .get(e.offset as usize..e.offset as usize + e.len as usize)
                .ok_or(IntegrityError::SequenceOutsidePool { seq: e.id })?;
            for i in 0..s.len() {
                root_visits += 1;
                let rem = (s.len() - i).min(self.max_depth);
                let mut node = ROOT;
                let mut j = 0;
                while j < rem {
                    let child = self
                        .child(node, s[j + i])
                        .ok_or(IntegrityError::MissingPath {
                            seq: e.id,
                            suffix: i,
                            depth: j,
                        })?;
                    let len = self.len_of(child);
                    let st = self.node(child).start as usize;
                    if len == 0 {
                        // Only a damaged snapshot has one, and the walk would never advance.
                        return Err(IntegrityError::BadEdgeLength {
                            node: child,
                            len,
                            depth: j,
                        });
                    }
                    if j + len > rem {
                        return Err(IntegrityError::EndsInsideEdge {
                            seq: e.id,
                            suffix: i,
                        });
                    }
                    if self.pool.get(st..st + len) != Some(&s[i + j..i + j + len]) {
                        return Err(IntegrityError::EdgeTokensDiffer {
                            seq: e.id,
                            suffix: i,
                        });
                    }
                    *visits.entry(child).or_default() += 1;
                    node = child;
                    j += len;
                }
            }
        }
        if self.node(ROOT).count != root_visits {
            return Err(IntegrityError::CountMismatch {
                node: ROOT,
                count: self.node(ROOT).count,
                suffixes: root_visits,
            });
        }
        Ok(visits)
    }

    /// Every reachable node's count equals its visits, children are consistent with
    /// the index and with their order, and every node is reachable or free.
    fn check_structure(&self, visits: &FxHashMap<u32, u32>) -> Result<(), IntegrityError> {
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
                    return Err(IntegrityError::Cycle);
                }
                fanout += 1;
                let cnt = self.node(c).count;
                if self.wide_lists_sorted && indexed && cnt > previous {
                    return Err(IntegrityError::WideListUnsorted { node: n });
                }
                previous = cnt;
                let want = visits.get(&c).copied().unwrap_or(0);
                if cnt != want || cnt == 0 {
                    return Err(IntegrityError::CountMismatch {
                        node: c,
                        count: cnt,
                        suffixes: want,
                    });
                }
                let len = self.len_of(c);
                if len == 0 || depth + len > self.max_depth {
                    return Err(IntegrityError::BadEdgeLength {
                        node: c,
                        len,
                        depth,
                    });
                }
                let st = self.node(c).start as usize;
                if st < depth || st + len > self.pool.len() {
                    return Err(IntegrityError::OccurrenceOutsidePool { node: c });
                }
                if indexed && self.child_index.child_of(n, self.first_token(c)) != Some(c) {
                    return Err(IntegrityError::MissingFromIndex { node: n, child: c });
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
                        return Err(IntegrityError::HeadNotLargest { node: n, head });
                    }
                    c = self.node(c).next_sibling;
                }
            }
            if child_sum > self.node(n).count as u64 {
                return Err(IntegrityError::ChildrenExceedNode { node: n });
            }
            if !indexed && fanout > INDEX_FANOUT {
                return Err(IntegrityError::MissingIndex { node: n, fanout });
            }
        }
        if reachable + self.free_nodes != self.nodes.len() {
            return Err(IntegrityError::NodesUnaccounted {
                reachable,
                free: self.free_nodes,
                allocated: self.nodes.len(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of damage is reported as what it is, with the node it is at.
    #[test]
    fn damage_is_named() {
        let t = GlobalTree::build(8, [(1u64, &[1u32, 2, 3][..]), (2, &[1, 2, 4][..])]).unwrap();
        assert_eq!(t.check_integrity(), Ok(()));

        let mut bad = t.clone();
        let one = bad.child(ROOT, 1).unwrap();
        let count = bad.nodes[one as usize].count;
        bad.nodes[one as usize].count += 1;
        assert_eq!(
            bad.check_integrity(),
            Err(IntegrityError::CountMismatch {
                node: one,
                count: count + 1,
                suffixes: count,
            })
        );

        let mut bad = t.clone();
        bad.nodes[ROOT as usize].count += 1;
        assert!(matches!(
            bad.check_integrity(),
            Err(IntegrityError::CountMismatch { node: ROOT, .. })
        ));

        let mut bad = t.clone();
        bad.pool[1] = 9; // sequence 1 now reads [1, 9, 3]: its suffix at 1 has no path
        assert!(matches!(
            bad.check_integrity(),
            Err(IntegrityError::MissingPath { seq: 1, .. }
                | IntegrityError::EdgeTokensDiffer { .. })
        ));

        let mut bad = t.clone();
        bad.nodes[one as usize].next_sibling = one; // a sibling cycle
        assert!(bad.check_integrity().is_err());
    }
}
