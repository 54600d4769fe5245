//! A draft: the tokens proposed to the verifier, as a tree.

use serde::Serialize;

/// Which tree a draft came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftSource {
    /// No draft.
    #[default]
    None,
    /// The per-request tree (prompt and generated tokens).
    Request,
    /// The global tree of earlier responses.
    Global,
    /// The global tree and the response generated so far, their counts summed.
    Both,
    /// Tokens a grammar forces (constrained decoding), nothing else.
    Grammar,
    /// A draft model's own continuation (hybrid mode), where the trees had nothing likely.
    Model,
    /// The client's guess at the answer (OpenAI's Predicted Outputs, `prediction`).
    Prediction,
}

/// A draft tree in topological order: `parents[i] < i`, or -1 for a child of the context.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Draft {
    /// Draft token ids.
    pub tokens: Vec<u32>,
    /// Index of each token's parent in `tokens`, or -1.
    pub parents: Vec<i32>,
    /// D(N) of each token: its estimated probability of being accepted.
    pub probs: Vec<f32>,
    /// SCORE = Σ D(N): the expected number of accepted tokens.
    pub score: f32,
    /// The pattern length p the draft was grown from.
    pub match_len: usize,
    /// The tree it came from.
    pub source: DraftSource,
}

impl Draft {
    /// An empty draft with room for `n` tokens.
    pub(super) fn with_capacity(n: usize) -> Self {
        Draft {
            tokens: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
            probs: Vec::with_capacity(n),
            ..Draft::default()
        }
    }

    /// Number of draft tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True for an empty draft.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keep the first `k` nodes (a subtree, as the order is topological).
    pub fn truncate(&mut self, k: usize) {
        self.tokens.truncate(k);
        self.parents.truncate(k);
        self.probs.truncate(k);
        self.score = self.probs.iter().sum();
    }

    /// Keep the nodes marked in `keep`: a node whose parent goes goes too. Indices are
    /// renumbered, the order stays topological.
    pub fn retain(&mut self, keep: &[bool]) {
        let mut new_index = vec![-1i32; self.len()];
        let mut kept = 0usize;
        for i in 0..self.len() {
            let parent = self.parents[i];
            let parent_kept = parent < 0 || new_index[parent as usize] >= 0;
            if !(keep.get(i).copied().unwrap_or(false) && parent_kept) {
                continue;
            }
            new_index[i] = kept as i32;
            self.tokens[kept] = self.tokens[i];
            self.parents[kept] = if parent < 0 {
                -1
            } else {
                new_index[parent as usize]
            };
            self.probs[kept] = self.probs[i];
            kept += 1;
        }
        self.truncate(kept);
        if self.is_empty() {
            self.source = DraftSource::None;
        }
    }

    /// The deepest node reached by following `chain` from the context, and how many of
    /// its tokens were followed (-1 and 0 when the draft does not start with it).
    pub fn follow(&self, chain: &[u32]) -> (i32, usize) {
        let mut node = -1i32;
        let mut done = 0;
        while let Some(&want) = chain.get(done) {
            let next = ((node + 1).max(0) as usize..self.len())
                .find(|&i| self.parents[i] == node && self.tokens[i] == want);
            match next {
                Some(i) => node = i as i32,
                None => break,
            }
            done += 1;
        }
        (node, done)
    }

    /// The nodes without a child, in index order.
    pub fn leaves(&self) -> Vec<usize> {
        let mut has_child = vec![false; self.len()];
        for &p in &self.parents {
            if let Ok(p) = usize::try_from(p) {
                has_child[p] = true;
            }
        }
        (0..self.len()).filter(|&i| !has_child[i]).collect()
    }

    /// The nodes from a root down to `node`, in that order.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut parent = self.parents[node];
        while let Ok(p) = usize::try_from(parent) {
            path.push(p);
            parent = self.parents[p];
        }
        path.reverse();
        path
    }

    /// Add `chain` below node `under` (-1: the context), each token certain given the
    /// one before (its probability is its parent's).
    pub fn graft_chain(&mut self, under: i32, chain: &[u32]) {
        let mut parent = under;
        for &t in chain {
            let prob = usize::try_from(parent).map_or(1.0, |p| self.probs[p]);
            parent = self.push(t, parent, prob);
        }
    }

    /// Mark this draft as coming from `source` (or from nowhere when empty).
    pub(super) fn set_source(&mut self, source: DraftSource) {
        self.source = if self.is_empty() {
            DraftSource::None
        } else {
            source
        };
    }

    /// Empty, keeping the buffers.
    pub(super) fn clear(&mut self) {
        self.tokens.clear();
        self.parents.clear();
        self.probs.clear();
        self.score = 0.0;
        self.match_len = 0;
        self.source = DraftSource::None;
    }

    pub(super) fn push(&mut self, token: u32, parent: i32, prob: f32) -> i32 {
        self.tokens.push(token);
        self.parents.push(parent);
        self.probs.push(prob);
        self.score += prob;
        (self.tokens.len() - 1) as i32
    }

    /// The path in the trees behind this draft's first `accepted` tokens, as the end of
    /// `context`, which ends with them: the `match_len` tokens the draft was grown from,
    /// then the accepted ones. For a draft from the shared cache, the cached sequences
    /// holding this path are the ones that supported what was accepted.
    pub fn supporting_path<'c>(&self, context: &'c [u32], accepted: usize) -> &'c [u32] {
        let len = (self.match_len + accepted).min(context.len());
        &context[context.len() - len..]
    }

    /// The longest path of the draft that `truth` follows token by token.
    pub fn accept(&self, truth: &[u32]) -> Vec<u32> {
        truth[..self.follow(truth).1].to_vec()
    }
}
