//! Building a tree from many sequences at once: suffixes sorted into parts, parts built
//! on threads, then laid out as one arena.

use super::*;

impl GlobalTree {
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
