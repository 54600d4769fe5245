//! The KV cache of one sequence on the host: per layer, growing with the sequence, with a
//! logical length; after each step only the accepted path of the draft is kept.

/// The KV cache of one sequence, on the host: per layer, keys and values laid out
/// `[position][kv_head][head_dim]`. Rows `0..len` are the committed context, the rows
/// after it the last forward pass. It grows with the sequence, up to the model's context.
#[derive(Default)]
pub struct KvCache {
    pub(super) keys: Vec<Vec<f32>>,
    pub(super) values: Vec<Vec<f32>>,
    /// Floats per position in one layer: kv_heads × head_dim.
    row: usize,
    /// Committed tokens.
    pub(super) len: usize,
    /// Rows written by the last forward pass, after `len`.
    pending: usize,
    /// The cache on the GPU, when the model runs there through its own kernels (then
    /// `keys` and `values` stay empty).
    #[cfg(feature = "cuda")]
    pub(super) device: Option<super::cuda::kv::DeviceKv>,
}

impl KvCache {
    /// Committed tokens in the cache.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget the sequence (keeping the memory): the next pass starts at position 0.
    pub fn reset(&mut self) {
        self.len = 0;
        self.pending = 0;
    }

    /// Keep the first `len` committed tokens and forget the rest, and any pass not
    /// committed: a draft model's cache, rolled back to the tokens the target accepted.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.pending = 0;
        let keep = self.len * self.row;
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            cache.truncate(keep);
        }
    }

    /// `t` rows of the pass now running follow the committed ones (on the device).
    #[cfg(feature = "cuda")]
    pub(super) fn set_pending(&mut self, t: usize) {
        self.pending = t;
    }

    /// The committed keys and values of `layer` at positions `from..from + n`; `None`
    /// when they are not on the host (a GPU's cache) or not committed.
    pub fn committed_rows(&self, layer: usize, from: usize, n: usize) -> Option<(&[f32], &[f32])> {
        if from + n > self.len || layer >= self.keys.len() {
            return None;
        }
        let span = from * self.row..(from + n) * self.row;
        Some((&self.keys[layer][span.clone()], &self.values[layer][span]))
    }

    /// Append `n` committed positions whose keys and values `fill` writes, layer by
    /// layer (`fill(layer, keys, values)`, each `n × row` floats): a cached prefix put
    /// back. The cache must be on the host and hold nothing pending.
    pub fn extend_committed(
        &mut self,
        layers: usize,
        row: usize,
        n: usize,
        mut fill: impl FnMut(usize, &mut [f32], &mut [f32]),
    ) {
        assert_eq!(self.pending, 0, "no pass is pending");
        #[cfg(feature = "cuda")]
        assert!(self.device.is_none(), "the cache is on the host");
        self.prepare(layers, row, n);
        let span = self.len * row..(self.len + n) * row;
        for (l, (keys, values)) in self.keys.iter_mut().zip(&mut self.values).enumerate() {
            fill(l, &mut keys[span.clone()], &mut values[span.clone()]);
        }
        self.len += n;
        self.pending = 0;
    }

    /// Make room for `t` new rows after the committed ones, in `layers` layers.
    pub(super) fn prepare(&mut self, layers: usize, row: usize, t: usize) {
        if self.keys.len() != layers || self.row != row {
            self.keys = vec![Vec::new(); layers];
            self.values = vec![Vec::new(); layers];
            self.row = row;
            self.len = 0;
        }
        let need = (self.len + t) * row;
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            cache.resize(need, 0.0);
        }
        self.pending = t;
    }

    /// Keep the rows at `accepted` (indices into the last forward pass, a root-to-leaf
    /// path in order) as the continuation of the context; drop the rest. Positions were
    /// base + depth, so a path's rows move down unchanged.
    ///
    /// On a GPU the rows move with a kernel launch; when it fails the cache no longer
    /// holds what the sequence's tokens say, and the error ends the pass (the sequence
    /// cannot go on, and nothing is committed).
    pub fn commit(&mut self, accepted: &[usize]) -> Result<(), CommitError> {
        assert!(
            accepted.iter().all(|&i| i < self.pending),
            "accepted rows were computed"
        );
        #[cfg(feature = "cuda")]
        if let Some(device) = &self.device {
            device
                .keep(self.len, accepted)
                .map_err(|e| CommitError(e.to_string()))?;
            self.len += accepted.len();
            self.pending = 0;
            return Ok(());
        }
        let row = self.row;
        let is_prefix = accepted.iter().enumerate().all(|(k, &i)| k == i);
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            if !is_prefix {
                // Accepted indices ascend, so moving rows down in order never
                // overwrites a row still to be moved.
                for (dst, &src) in accepted.iter().enumerate() {
                    let from = (self.len + src) * row;
                    cache.copy_within(from..from + row, (self.len + dst) * row);
                }
            }
            cache.truncate((self.len + accepted.len()) * row);
        }
        self.len += accepted.len();
        self.pending = 0;
        Ok(())
    }
}

/// The accepted rows of a pass could not be kept: the device failed moving them.
#[derive(Debug, thiserror::Error)]
#[error("keeping the accepted rows of the KV cache on the device failed: {0}")]
pub struct CommitError(String);
