//! A tree's tables without what is derived from them: lent to the snapshot writer, and
//! checked and assembled again from what a snapshot holds.

use super::*;

impl GlobalTree {
    /// The tables in the form a snapshot stores them: wide children lists in
    /// descending count order (sorted here unless they already are) and the child index
    /// as a list sorted by `(node, token)`. Compacted trees only: free nodes would be
    /// lent as they are, and [`GlobalTree::from_parts`] does not expect them.
    pub fn parts(&self) -> TreeParts<Borrowed<'_>> {
        let nodes = if self.wide_lists_sorted {
            std::borrow::Cow::Borrowed(self.nodes.as_slice())
        } else {
            let mut nodes = self.nodes.clone();
            build::sort_wide_lists(&mut nodes, &self.lens);
            std::borrow::Cow::Owned(nodes)
        };
        let mut wide: Vec<WideChild> = self
            .child_index
            .iter()
            .map(|(node, token, child)| WideChild { node, token, child })
            .collect();
        wide.sort_unstable_by_key(|w| (w.node, w.token));
        TreeParts {
            max_depth: self.max_depth,
            nodes,
            lens: &self.lens,
            child_index: std::borrow::Cow::Owned(wide),
            pool: &self.pool,
            seqs: &self.seqs,
            wide_lists_sorted: true,
        }
    }
}

impl<S: Storage> GlobalTree<S> {
    /// A tree over tables that [`GlobalTree::parts`] lent, as read back from a snapshot.
    ///
    /// Checks what the tree's own bookkeeping needs (the depth, the table lengths,
    /// unique live ids) and derives the rest in O(sequences). The tree invariants
    /// themselves are [`GlobalTree::check_integrity`]'s job: reading never goes out of
    /// bounds on damaged tables, it only finds wrong drafts.
    pub fn from_parts(parts: TreeParts<S>) -> Result<Self, PartsError> {
        let TreeParts {
            max_depth,
            nodes,
            lens,
            child_index,
            pool,
            seqs,
            wide_lists_sorted,
        } = parts;
        if max_depth == 0 || max_depth > MAX_SUPPORTED_DEPTH {
            return Err(PartsError::BadDepth(max_depth));
        }
        if nodes.is_empty() || lens.len() != nodes.len() {
            return Err(PartsError::TablesDiffer {
                nodes: nodes.len(),
                lens: lens.len(),
            });
        }
        let mut seq_by_id = FxHashMap::default();
        seq_by_id.reserve(seqs.len());
        let (mut live_tokens, mut dead_tokens) = (0u64, 0u64);
        for (i, e) in seqs.iter().enumerate() {
            if e.live == 0 {
                dead_tokens += e.len as u64;
            } else if seq_by_id.insert(e.id, i as u32).is_some() {
                return Err(PartsError::DuplicateId(e.id));
            } else {
                live_tokens += e.len as u64;
            }
        }
        let seq_blocks = SeqBlocks::over(&seqs, pool.len());
        Ok(GlobalTree {
            max_depth,
            nodes,
            lens,
            free_head: NIL,
            free_nodes: 0,
            child_index,
            pool,
            seqs,
            seq_by_id,
            seq_blocks,
            live_tokens,
            dead_tokens,
            version: next_version(),
            wide_lists_sorted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(seqs: &[&[u32]]) -> GlobalTree {
        let mut t = GlobalTree::new(8).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            t.insert(i as u64, s).unwrap();
        }
        t.compact();
        t
    }

    /// Parts lent by a tree assemble into a tree that reads the same and passes the
    /// integrity check, even from a tree whose wide lists were out of order.
    #[test]
    fn parts_round_trip() {
        // Over 24 distinct continuations of token 7: the node gets a wide, indexed list.
        let seqs: Vec<Vec<u32>> = (0..40).map(|i| vec![7, 100 + i % 30, 5, 7]).collect();
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let t = tree(&refs);
        let parts = t.parts();
        assert!(parts.wide_lists_sorted);
        let back = GlobalTree::<Borrowed<'_>>::from_parts(parts).unwrap();
        back.check_integrity().unwrap();
        assert_eq!(back.len(), t.len());
        assert_eq!(back.cached_tokens(), t.cached_tokens());
        for (i, s) in seqs.iter().enumerate() {
            assert_eq!(back.sequence(i as u64), Some(s.as_slice()));
        }
        assert_eq!(back.count_of(&[7]), t.count_of(&[7]));
        assert_eq!(back.count_of(&[7, 105, 5]), t.count_of(&[7, 105, 5]));
    }

    #[test]
    fn damaged_parts_are_refused() {
        let t = tree(&[&[1, 2, 3], &[4, 5]]);
        let mut seqs = t.seqs.clone();
        seqs[1].id = seqs[0].id;
        let dup = TreeParts::<Borrowed<'_>> {
            seqs: &seqs,
            ..t.parts()
        };
        assert_eq!(
            GlobalTree::from_parts(dup).err(),
            Some(PartsError::DuplicateId(seqs[0].id))
        );
        let short = TreeParts::<Borrowed<'_>> {
            lens: &t.lens[..1],
            ..t.parts()
        };
        assert!(matches!(
            GlobalTree::from_parts(short),
            Err(PartsError::TablesDiffer { lens: 1, .. })
        ));
        let deep = TreeParts::<Borrowed<'_>> {
            max_depth: MAX_SUPPORTED_DEPTH + 1,
            ..t.parts()
        };
        assert_eq!(
            GlobalTree::from_parts(deep).err(),
            Some(PartsError::BadDepth(MAX_SUPPORTED_DEPTH + 1))
        );
    }
}
