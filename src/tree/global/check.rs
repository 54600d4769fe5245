//! The integrity check: every invariant of the arena against the stored sequences.

use super::*;

impl<S: Storage> GlobalTree<S> {
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
