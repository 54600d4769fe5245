//! One batched forward pass as its callers and its devices see it: each sequence's rows
//! ([`BatchEntry`]), which rows want logits ([`LogitRows`]), and the layout the CPU and
//! GPU passes both run from ([`BatchPlan`]).

use super::kv_cache::KvCache;

/// One sequence's part of a batched forward pass: its cache, its new tokens and their
/// parents (see [`Model::forward`]).
pub struct BatchEntry<'a> {
    /// The sequence's KV cache.
    pub cache: &'a mut KvCache,
    /// New tokens, in topological order.
    pub tokens: &'a [u32],
    /// Each token's parent index in `tokens`, or -1.
    pub parents: &'a [i32],
    /// Which of this entry's rows get logits: prefill chunks need none, which saves
    /// the head, and a draft model catching up needs only its last row's.
    pub logits: LogitRows,
}

/// The rows of a [`BatchEntry`] whose logits a pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prefill chunk).
    None,
    /// Every row (a verified draft).
    All,
    /// The last row only (the next token after a chunk).
    Last,
}

/// The layout of one batched forward pass: where each sequence's rows start and what
/// each of its tokens attends to, every row's position and token, and the rows whose
/// logits are wanted.
pub(super) struct BatchPlan {
    /// Per sequence: its first row, and per token the indices (after the committed
    /// context) it attends to: its ancestors from the root down, then itself.
    pub(super) parts: Vec<(usize, Vec<Vec<usize>>)>,
    /// Each row's position in its sequence: committed length + depth in the tree.
    pub(super) positions: Vec<u32>,
    /// Each row's token.
    pub(super) ids: Vec<u32>,
    /// Rows in the pass.
    pub(super) total: usize,
    /// The rows whose logits are returned, ascending.
    pub(super) wanted: Vec<u32>,
}

impl BatchPlan {
    /// The plan of `batch`, whose caches are made ready for its rows (`layers` layers of
    /// `row` floats per position). A token attends to the committed context, then its
    /// ancestors from the root down, then itself: in plain decoding it attends to exactly
    /// these keys in this order, which is what makes the result bit-identical.
    pub(super) fn new(
        batch: &mut [BatchEntry<'_>],
        layers: usize,
        row: usize,
        host_cache: bool,
    ) -> Self {
        let total: usize = batch.iter().map(|e| e.tokens.len()).sum();
        let mut parts = Vec::with_capacity(batch.len());
        let mut positions = Vec::with_capacity(total);
        let mut ids = Vec::with_capacity(total);
        let mut wanted = Vec::new();
        let mut offset = 0;
        for e in batch.iter_mut() {
            let t = e.tokens.len();
            let mut sets: Vec<Vec<usize>> = Vec::with_capacity(t);
            for (i, &p) in e.parents.iter().enumerate() {
                debug_assert!(p < i as i32, "forward_batch checked the parents");
                let mut chain = if p < 0 {
                    Vec::new()
                } else {
                    sets[p as usize].clone()
                };
                chain.push(i);
                positions.push((e.cache.len + chain.len() - 1) as u32);
                sets.push(chain);
            }
            ids.extend_from_slice(e.tokens);
            if host_cache {
                e.cache.prepare(layers, row, t);
            }
            match e.logits {
                LogitRows::None => {}
                LogitRows::All => wanted.extend(offset as u32..(offset + t) as u32),
                LogitRows::Last if t > 0 => wanted.push((offset + t - 1) as u32),
                LogitRows::Last => {}
            }
            parts.push((offset, sets));
            offset += t;
        }
        BatchPlan {
            parts,
            positions,
            ids,
            total,
            wanted,
        }
    }
}
