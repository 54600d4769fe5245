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

    /// The longest path of the draft that `truth` follows token by token.
    pub fn accept(&self, truth: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut node = -1i32;
        'walk: while out.len() < truth.len() {
            let want = truth[out.len()];
            for i in (node + 1).max(0) as usize..self.tokens.len() {
                if self.parents[i] == node && self.tokens[i] == want {
                    out.push(want);
                    node = i as i32;
                    continue 'walk;
                }
            }
            break;
        }
        out
    }
}
