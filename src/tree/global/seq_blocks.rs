//! Which sequence holds a pool position, without a binary search over every sequence.

use super::*;

/// Pool tokens per block of [`SeqBlocks`]: about one sequence of chat data.
const SEQ_BLOCK_SHIFT: u32 = 8;

/// A coarse index from pool positions to the sequence table, which is in pool order:
/// for every block of 2^[`SEQ_BLOCK_SHIFT`] pool positions, the first sequence that ends
/// at or after the block's start. Drafts ask which sequence holds a position (to read a
/// unique occurrence past the depth limit) on most calls; a binary search over the
/// whole table is a dozen dependent loads, cold ones among them, where this is one
/// load and a search over the few sequences of one block.
#[derive(Clone, Debug, Default)]
pub(crate) struct SeqBlocks {
    first: Vec<u32>,
}

impl SeqBlocks {
    /// The index over `seqs`, a table over a pool of `pool_len` tokens, as
    /// [`SeqBlocks::note`] would build it entry by entry. Ends past the pool (only in a
    /// damaged snapshot) count as the pool's end, so such a table costs no more memory
    /// than a sound one.
    pub(crate) fn over(seqs: &[SeqEntry], pool_len: usize) -> Self {
        let mut blocks = SeqBlocks::default();
        for (i, e) in seqs.iter().enumerate() {
            blocks.note(i, e, pool_len);
        }
        blocks
    }

    /// Account for sequence `index`, `e`, appended to the table of a pool of `pool_len`
    /// tokens. Blocks are added up to its end: no earlier sequence reached their start,
    /// or they would exist already.
    pub(crate) fn note(&mut self, index: usize, e: &SeqEntry, pool_len: usize) {
        let end = (e.offset as u64 + e.len as u64).min(pool_len as u64);
        while ((self.first.len() as u64) << SEQ_BLOCK_SHIFT) <= end {
            self.first.push(index as u32);
        }
    }

    /// The first sequence of `seqs` whose end (`offset + len`) is at least `pos`, or
    /// `seqs.len()` if none is: `partition_point` over the whole table, narrowed to the
    /// sequences that can hold `pos`. On a damaged table (out of pool order) the answer
    /// may be wrong, but it is always within `0..=seqs.len()`.
    #[inline]
    pub(crate) fn first_ending_at_or_after(&self, seqs: &[SeqEntry], pos: usize) -> usize {
        let block = pos >> SEQ_BLOCK_SHIFT;
        let Some(&lo) = self.first.get(block) else {
            return seqs.len();
        };
        let hi = self
            .first
            .get(block + 1)
            .map_or(seqs.len(), |&h| h as usize + 1)
            .min(seqs.len());
        let lo = (lo as usize).min(hi);
        lo + seqs[lo..hi].partition_point(|e| (e.offset as usize + e.len as usize) < pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq_table(lens: &[u32]) -> Vec<SeqEntry> {
        let mut offset = 0;
        lens.iter()
            .enumerate()
            .map(|(i, &len)| {
                let e = SeqEntry {
                    id: i as u64,
                    offset,
                    len,
                    live: 1,
                    reserved: 0,
                };
                offset += len;
                e
            })
            .collect()
    }

    proptest::proptest! {
        /// The block index answers as a binary search over the whole table would, for
        /// every position, whatever the sequence lengths (empty ones and ones spanning
        /// many blocks included).
        #[test]
        fn seq_blocks_agree_with_a_full_search(
            lens in proptest::collection::vec(
                proptest::prop_oneof![0u32..4, 0u32..300, 250u32..1200],
                0..40,
            ),
        ) {
            let seqs = seq_table(&lens);
            let total: u32 = lens.iter().sum();
            let blocks = SeqBlocks::over(&seqs, total as usize);
            for pos in 0..=total as usize + 2 {
                let want = seqs.partition_point(|e| ((e.offset + e.len) as usize) < pos);
                proptest::prop_assert_eq!(blocks.first_ending_at_or_after(&seqs, pos), want);
            }
        }
    }

    #[test]
    fn seq_blocks_stay_in_bounds_on_a_table_out_of_order() {
        let mut seqs = seq_table(&[300, 10, 700, 5]);
        seqs.swap(0, 2);
        let blocks = SeqBlocks::over(&seqs, 1015);
        for pos in 0..2000 {
            assert!(blocks.first_ending_at_or_after(&seqs, pos) <= seqs.len());
        }
        // A table for other sequences than the one searched: still no panic.
        let other = SeqBlocks::over(&seq_table(&[5000]), 5000);
        for pos in [0, 255, 256, 4999, 5000, 9000] {
            assert!(other.first_ending_at_or_after(&seqs[..1], pos) <= 1);
        }
        // Ends far past the pool: the index stays the pool's size.
        let mut huge = seq_table(&[10]);
        huge[0].offset = u32::MAX - 1;
        huge[0].len = u32::MAX;
        let capped = SeqBlocks::over(&huge, 10);
        assert_eq!(capped.first.len(), 1);
        assert!(capped.first_ending_at_or_after(&huge, 5) <= 1);
    }
}
