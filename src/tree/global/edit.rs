//! Editing a tree in place: inserting and removing sequences, compaction.

use super::*;

impl GlobalTree {
    /// Store `tokens` as sequence `id`: every suffix, cut at the depth limit, is counted.
    pub fn insert(&mut self, id: u64, tokens: &[u32]) -> Result<(), TreeError> {
        let entry = self.push_sequence(id, tokens)?;
        self.insert_suffixes_of(entry);
        Ok(())
    }

    /// Put `tokens` in the pool and the sequence table, without indexing its suffixes.
    pub(super) fn push_sequence(&mut self, id: u64, tokens: &[u32]) -> Result<SeqEntry, TreeError> {
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
    pub(super) fn index_children(&mut self, parent: u32) {
        let mut c = self.nodes[parent as usize].first_child;
        while c != NIL {
            self.child_index.insert(parent, self.first_token(c), c);
            c = self.nodes[c as usize].next_sibling;
        }
    }

    pub(super) fn insert_suffix(&mut self, mut pos: u32, mut rem: usize) {
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
