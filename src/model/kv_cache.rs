//! The KV cache of one sequence on the host: per layer, growing with the sequence, with a
//! logical length; after each step only the accepted path of the draft is kept. A run of
//! committed positions can be copied out into a [`KvBlock`] and put back into another
//! sequence's cache (the prefix cache's blocks), on the host or on the device.

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

    /// Copy committed positions `from..from + n`, every layer's keys and values, into a
    /// block: into `reuse` when it has that shape and lives where this cache does, else
    /// into new memory. `None` when those positions are not committed or no memory is to
    /// be had (logged).
    pub fn save_block(&self, from: usize, n: usize, reuse: Option<KvBlock>) -> Option<KvBlock> {
        if n == 0 || from + n > self.len {
            return None;
        }
        #[cfg(feature = "cuda")]
        if let Some(device) = &self.device {
            let reuse = reuse.and_then(|block| match block.memory {
                BlockMemory::Device(memory) => Some(memory),
                BlockMemory::Host(_) => None,
            });
            return match device.save(from, n, reuse) {
                Ok(memory) => Some(KvBlock {
                    layers: device.layers(),
                    row: device.row(),
                    positions: n,
                    memory: BlockMemory::Device(memory),
                }),
                Err(e) => {
                    tracing::warn!("the prefix cache cannot copy a block on the device ({e})");
                    None
                }
            };
        }
        let (layers, row) = (self.keys.len(), self.row);
        let bytes = layers * 2 * n * row * std::mem::size_of::<f32>();
        let mut map = match reuse {
            Some(KvBlock {
                memory: BlockMemory::Host(map),
                ..
            }) if map.len() == bytes => map,
            _ => match memmap2::MmapMut::map_anon(bytes) {
                Ok(map) => map,
                Err(e) => {
                    tracing::warn!(
                        "the prefix cache cannot map a block ({e}); it holds what it has"
                    );
                    return None;
                }
            },
        };
        let span = n * row;
        let floats = floats_mut(&mut map);
        for (layer, out) in floats.chunks_exact_mut(2 * span).enumerate() {
            let (keys, values) = self.committed_rows(layer, from, n)?;
            out[..span].copy_from_slice(keys);
            out[span..].copy_from_slice(values);
        }
        Some(KvBlock {
            layers,
            row,
            positions: n,
            memory: BlockMemory::Host(map),
        })
    }

    /// Append the blocks' positions after the committed ones, in order: a cached prefix
    /// put back. The cache must hold nothing pending; the blocks must have one shape
    /// (this cache's, when it has one) and live where the cache does (an empty cache
    /// takes the blocks' place). On an error nothing is committed.
    pub fn extend_from_blocks(&mut self, blocks: &[&KvBlock]) -> Result<(), KvBlockError> {
        let Some(first) = blocks.first() else {
            return Ok(());
        };
        let (layers, row, positions) = (first.layers, first.row, first.positions);
        let same_shape =
            |b: &&KvBlock| b.layers == layers && b.row == row && b.positions == positions;
        if self.pending > 0 || !blocks.iter().all(same_shape) {
            return Err(KvBlockError::Shape);
        }
        let n = positions * blocks.len();
        #[cfg(feature = "cuda")]
        if let BlockMemory::Device(memory) = &first.memory {
            let memories = blocks
                .iter()
                .map(|b| match &b.memory {
                    BlockMemory::Device(memory) => Some(memory),
                    BlockMemory::Host(_) => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or(KvBlockError::Shape)?;
            if !self.keys.is_empty() {
                return Err(KvBlockError::Shape);
            }
            let device = match &mut self.device {
                Some(device) => device,
                None => self.device.insert(memory.new_cache(self.len + n)?),
            };
            device.load(self.len, &memories)?;
            self.len += n;
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        if self.device.is_some() {
            return Err(KvBlockError::Shape);
        }
        if self.len > 0 && (self.keys.len() != layers || self.row != row) {
            return Err(KvBlockError::Shape);
        }
        let span = positions * row;
        let floats: Vec<&[f32]> = blocks
            .iter()
            .map(|b| match &b.memory {
                BlockMemory::Host(map) => Ok(floats(map)),
                #[cfg(feature = "cuda")]
                BlockMemory::Device(_) => Err(KvBlockError::Shape),
            })
            .collect::<Result<_, _>>()?;
        self.extend_committed(layers, row, n, |layer, keys, values| {
            for (b, block) in floats.iter().enumerate() {
                let kv = &block[layer * 2 * span..(layer + 1) * 2 * span];
                keys[b * span..(b + 1) * span].copy_from_slice(&kv[..span]);
                values[b * span..(b + 1) * span].copy_from_slice(&kv[span..]);
            }
        });
        Ok(())
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

/// A copy of some committed positions of a [`KvCache`], every layer's keys and values,
/// kept apart from any sequence: a prefix-cache block. It lives where the cache it came
/// from did: on the host in an anonymous mapping of its own, outside the heap (the
/// sequences' caches come and go on the heap, and blocks among them would pin the memory
/// they free: measured, 120 MB more resident than the budget explains under 200 different
/// long prompts), or in the device's memory.
pub struct KvBlock {
    layers: usize,
    /// Floats per position in one layer's keys (and in its values).
    row: usize,
    positions: usize,
    memory: BlockMemory,
}

impl KvBlock {
    /// Bytes of keys and values the block holds.
    pub fn bytes(&self) -> u64 {
        (self.layers * 2 * self.positions * self.row * std::mem::size_of::<f32>()) as u64
    }
}

/// Where a block's floats are: per layer, its keys then its values, `2 × positions × row`.
enum BlockMemory {
    Host(memmap2::MmapMut),
    #[cfg(feature = "cuda")]
    Device(super::cuda::kv::DeviceBlock),
}

fn floats(map: &memmap2::MmapMut) -> &[f32] {
    // SAFETY: any bytes are a valid f32, and a mapping is page-aligned.
    let (head, floats, tail) = unsafe { map.align_to::<f32>() };
    debug_assert!(head.is_empty() && tail.is_empty());
    floats
}

fn floats_mut(map: &mut memmap2::MmapMut) -> &mut [f32] {
    // SAFETY: as in `floats`.
    let (head, floats, tail) = unsafe { map.align_to_mut::<f32>() };
    debug_assert!(head.is_empty() && tail.is_empty());
    floats
}

/// Blocks could not be put back into a cache.
#[derive(Debug, thiserror::Error)]
pub enum KvBlockError {
    /// The blocks and the cache differ in shape or place (a bug in the caller: the
    /// prefix cache keeps one model's blocks).
    #[error("the cached blocks do not fit this KV cache (another shape, or another device)")]
    Shape,
    /// The device failed copying them.
    #[error("copying cached blocks into the KV cache on the device failed: {0}")]
    Device(String),
}

#[cfg(feature = "cuda")]
impl From<super::cuda::error::CudaError> for KvBlockError {
    fn from(e: super::cuda::error::CudaError) -> Self {
        KvBlockError::Device(e.to_string())
    }
}

/// The accepted rows of a pass could not be kept: the device failed moving them.
#[derive(Debug, thiserror::Error)]
#[error("keeping the accepted rows of the KV cache on the device failed: {0}")]
pub struct CommitError(String);

#[cfg(test)]
mod tests {
    use super::*;

    /// A host cache of `n` positions in `layers` layers of `row` floats: position p of
    /// layer l holds keys `p × 100 + l` and values their negation.
    fn cache(layers: usize, row: usize, n: usize) -> KvCache {
        let mut cache = KvCache::default();
        cache.extend_committed(layers, row, n, |l, keys, values| {
            for (i, (k, v)) in keys.iter_mut().zip(values.iter_mut()).enumerate() {
                *k = ((i / row) * 100 + l) as f32;
                *v = -*k;
            }
        });
        cache
    }

    #[test]
    fn blocks_put_back_the_positions_they_copied() {
        let source = cache(3, 2, 10);
        let a = source.save_block(0, 4, None).unwrap();
        // A block of another size is not reused: the copy gets memory of its own.
        let b = source
            .save_block(4, 4, Some(source.save_block(0, 2, None).unwrap()))
            .unwrap();
        assert_eq!(a.bytes(), (3 * 2 * 4 * 2 * 4) as u64);
        let mut restored = KvCache::default();
        restored.extend_from_blocks(&[&a, &b]).unwrap();
        assert_eq!(restored.len(), 8);
        for l in 0..3 {
            assert_eq!(
                restored.committed_rows(l, 0, 8),
                source.committed_rows(l, 0, 8),
                "layer {l}"
            );
        }
        // More blocks continue a cache of the same shape.
        restored.extend_from_blocks(&[&a]).unwrap();
        assert_eq!(restored.len(), 12);
        assert_eq!(
            restored.committed_rows(2, 8, 4),
            source.committed_rows(2, 0, 4)
        );
    }

    #[test]
    fn misfits_are_refused_and_change_nothing() {
        let source = cache(3, 2, 10);
        assert!(
            source.save_block(8, 4, None).is_none(),
            "past the committed"
        );
        assert!(source.save_block(0, 0, None).is_none(), "an empty block");
        let four = source.save_block(0, 4, None).unwrap();
        let two = source.save_block(0, 2, None).unwrap();
        let mut restored = KvCache::default();
        assert!(matches!(
            restored.extend_from_blocks(&[&four, &two]),
            Err(KvBlockError::Shape)
        ));
        assert_eq!(restored.len(), 0);
        // Another model's shape does not continue this cache.
        let mut other = cache(2, 2, 4);
        assert!(matches!(
            other.extend_from_blocks(&[&four]),
            Err(KvBlockError::Shape)
        ));
        assert_eq!(other.len(), 4);
        assert!(other.extend_from_blocks(&[]).is_ok());
    }
}
