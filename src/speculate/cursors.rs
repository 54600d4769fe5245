//! The global-tree cursors one call leaves for the next: a longer context only steps
//! them over its new tokens.

use crate::tree::GlobalIndex;

/// The global-tree positions N_1, N_2, … of the last p context tokens, for one context.
#[derive(Clone)]
pub(super) struct GlobalMatches<C> {
    version: u64,
    context_len: usize,
    /// The last `max_depth` tokens of that context: the cursors depend on these alone.
    tail: Vec<u32>,
    /// `cursors[p - 1]` is N_p, for every p that matches.
    pub(super) cursors: Vec<C>,
    /// The previous call's cursors while they are stepped (kept for its buffer).
    previous: Vec<C>,
}

impl<C> GlobalMatches<C> {
    /// No cursors yet, with room for `depth` of them.
    pub(super) fn with_capacity(depth: usize) -> Self {
        Self {
            version: 0,
            context_len: 0,
            tail: Vec::with_capacity(depth),
            cursors: Vec::with_capacity(depth),
            previous: Vec::with_capacity(depth),
        }
    }
}

/// Whether a context extends the one the cursors were made for (same tree version, same
/// tokens where the old tail was), and by how many tokens.
#[derive(Clone, Copy)]
pub(super) struct Extension {
    extends: bool,
    new_tokens: usize,
}

impl<C: Clone> GlobalMatches<C> {
    /// How `context` relates to the context of the cursors: see [`Extension`].
    pub(super) fn extension<G: GlobalIndex<Cursor = C>>(
        &self,
        tree: &G,
        context: &[u32],
    ) -> Extension {
        let depth = tree.max_depth();
        let n = context.len();
        let old_len = self.context_len;
        let extends = self.version == tree.version()
            && n >= old_len
            && old_len >= self.tail.len()
            && self.tail.len() == depth.min(old_len)
            && context[old_len - self.tail.len()..old_len] == self.tail[..];
        Extension {
            extends,
            new_tokens: n - old_len.min(n),
        }
    }

    /// Start loading what the first step of every p in [`GlobalMatches::update`] reads.
    /// The steps are independent of each other, and the shallow nodes they read are
    /// wide and cold: issued together, and early, their misses overlap each other and
    /// whatever the caller does before the update. Returns what the update needs to
    /// know of `context`, so that it is worked out once.
    pub(super) fn prefetch<G: GlobalIndex<Cursor = C>>(
        &self,
        tree: &G,
        context: &[u32],
    ) -> Extension {
        let ext = self.extension(tree, context);
        let (extends, k) = (ext.extends, ext.new_tokens);
        let n = context.len();
        let new = &context[n - k..];
        let root = tree.root();
        for p in 1..=tree.max_depth().min(n) {
            if !(extends && p > k) {
                tree.prefetch_step(&root, context[n - p]);
            } else if let (Some(c), Some(&t)) = (self.cursors.get(p - k - 1), new.first()) {
                tree.prefetch_step(c, t);
            } else {
                break;
            }
        }
        ext
    }

    /// Bring the cursors up to date for `context`. When `context` extends the previous
    /// one, N_p is N_{p-k} of the previous call stepped over the k new tokens, O(p·k)
    /// instead of a walk from the root for every p. A suffix of a path is a path, so the
    /// first p that fails ends the list. `ext` is what [`GlobalMatches::prefetch`]
    /// returned for the same tree and context.
    pub(super) fn update<G: GlobalIndex<Cursor = C>>(
        &mut self,
        tree: &G,
        context: &[u32],
        ext: Extension,
    ) {
        let depth = tree.max_depth();
        let n = context.len();
        let (extends, k) = (ext.extends, ext.new_tokens);
        std::mem::swap(&mut self.cursors, &mut self.previous);
        self.cursors.clear();
        let old = &self.previous;
        let new = &context[n - k..];
        for p in 1..=depth.min(n) {
            let cursor = if extends && p > k {
                old.get(p - k - 1)
                    .and_then(|c| new.iter().try_fold(c.clone(), |c, &t| tree.step(&c, t)))
            } else {
                tree.walk(&context[n - p..])
            };
            match cursor {
                Some(c) => self.cursors.push(c),
                None => break,
            }
        }
        self.version = tree.version();
        self.context_len = n;
        self.tail.clear();
        self.tail.extend_from_slice(&context[n - depth.min(n)..]);
    }
}
