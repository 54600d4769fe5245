//! What [`RequestTree::match_lengths`](super::RequestTree::match_lengths) finds: the
//! occurrences of the context's last token with how far each matches, where the copies
//! of one occurrence in a repeated stretch are one entry.

use smallvec::SmallVec;

/// Occurrences of the context's last token that match the same number of context tokens
/// backwards: the one ending at `end` and, inside a repeated stretch, `copies - 1` more,
/// each `stride` tokens before the one before it. The copies of one entry are followed by
/// the same tokens for as long as any draft grows (the horizon the matching was asked
/// for), so they step as one: on a run or a short period, dozens of occurrences are one
/// entry and cost one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// End position of the most recent occurrence.
    pub end: u32,
    /// How many context tokens each occurrence matches.
    pub len: u32,
    /// How many occurrences the entry stands for (at least 1).
    pub copies: u32,
    /// Tokens from one copy to the next (the stretch's period); 0 for a single one.
    pub stride: u32,
}

impl Match {
    /// One occurrence, ending at `end`, that matches `len` tokens.
    pub fn one(end: u32, len: u32) -> Self {
        Self {
            end,
            len,
            copies: 1,
            stride: 0,
        }
    }

    /// Whether the entry is copies in a repeated stretch (even a single one), whose
    /// occurrences interleave with the other such entries beside it in the list.
    pub fn is_run(&self) -> bool {
        self.stride > 0
    }

    /// End position of copy `k` (0 the most recent).
    pub fn end_of(&self, k: u32) -> u32 {
        self.end - k * self.stride
    }

    /// How many copies, the most recent first, end at or after position `at`.
    pub fn copies_ending_at_or_after(&self, at: usize) -> u32 {
        let end = self.end as usize;
        if end < at {
            0
        } else if self.stride == 0 {
            1
        } else {
            self.copies
                .min(((end - at) / self.stride as usize) as u32 + 1)
        }
    }
}

/// The occurrences a cursor of `p` tokens keeps: of the occurrences in `matches` (most
/// recent first, as `match_lengths` lists them) that match at least `p` tokens and lie
/// wholly at or after position `from`, the most recent `cap`. Calls `take(index of the
/// entry, end of its most recent occurrence taken, how many it gives)` for each entry
/// that gives any, in the order of their most recent occurrences.
///
/// The runs of one repeated stretch come together in the list, after that stretch's
/// single occurrences, and their copies interleave: copy k of every run is more recent
/// than copy k + 1 of any, since the runs start within one stride of each other. So the
/// most recent of them are taken a layer of copies at a time.
#[inline]
pub(crate) fn for_most_recent(
    matches: &[Match],
    p: usize,
    from: usize,
    cap: usize,
    mut take: impl FnMut(usize, u32, u32),
) {
    let mut left = cap as u32;
    // An occurrence ending at `end` lies wholly at or after `from` if it starts there.
    let first_end = (from + p).saturating_sub(1);
    let mut i = 0;
    while i < matches.len() && left > 0 {
        let m = matches[i];
        // Most entries are too short for p; a run too short gives none either, so the
        // block of its neighbours may start after it.
        if (m.len as usize) < p {
            i += 1;
            continue;
        }
        if !m.is_run() {
            if m.end as usize >= first_end {
                take(i, m.end, 1);
                left -= 1;
            }
            i += 1;
            continue;
        }
        // The block of runs that interleave with this one.
        let block_end = matches[i..]
            .iter()
            .position(|r| {
                !r.is_run() || r.stride != m.stride || m.end - r.end.min(m.end) >= m.stride
            })
            .map_or(matches.len(), |n| i + n);
        if block_end == i + 1 {
            // A run alone: its most recent copies, as many as are left.
            let n = m.copies_ending_at_or_after(first_end).min(left);
            if n > 0 {
                take(i, m.end, n);
                left -= n;
            }
            i = block_end;
            continue;
        }
        let block = &matches[i..block_end];
        let available: SmallVec<[u32; 16]> = block
            .iter()
            .map(|r| {
                if r.len as usize >= p {
                    r.copies_ending_at_or_after(first_end)
                } else {
                    0
                }
            })
            .collect();
        let (whole, extra) = layers_to_take(&available, left);
        let mut extra_left = extra;
        let taken: SmallVec<[u32; 16]> = available
            .iter()
            .map(|&a| {
                let partial = a > whole && extra_left > 0;
                extra_left -= partial as u32;
                a.min(whole) + partial as u32
            })
            .collect();
        left -= taken.iter().sum::<u32>();
        for (k, &n) in taken.iter().enumerate() {
            if n > 0 {
                take(i + k, block[k].end, n);
            }
        }
        i = block_end;
    }
}

/// Taking up to `left` occurrences a layer at a time from runs that have `available`
/// copies each: how many whole layers, and how many runs (the first that still have a
/// copy) give one more.
fn layers_to_take(available: &[u32], left: u32) -> (u32, u32) {
    let mut sorted: SmallVec<[u32; 16]> = available.iter().copied().filter(|&a| a > 0).collect();
    sorted.sort_unstable();
    let (mut layers, mut left) = (0u32, left);
    for (n, &a) in sorted.iter().enumerate() {
        // Runs still giving copies below `a` layers: this one and the rest.
        let active = (sorted.len() - n) as u32;
        let step = a - layers;
        if step as u64 * active as u64 > left as u64 {
            return (layers + left / active, left % active);
        }
        left -= step * active;
        layers = a;
    }
    (layers, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every occurrence `matches` stands for, most recent first, one by one.
    fn one_by_one(matches: &[Match]) -> Vec<Match> {
        let mut all: Vec<Match> = matches
            .iter()
            .flat_map(|m| (0..m.copies).map(move |k| Match::one(m.end_of(k), m.len)))
            .collect();
        all.sort_by_key(|m| std::cmp::Reverse(m.end));
        all
    }

    proptest::proptest! {
        /// Taking from runs gives the occurrences taking one by one gives, as many from
        /// each run as it has among them.
        #[test]
        fn runs_give_the_most_recent_occurrences(
            singles in proptest::collection::vec((0u32..9, 1u32..12), 0..4),
            runs in proptest::collection::vec((0u32..5, 1u32..12, 1u32..30), 0..5),
            stride in 5u32..9,
            p in 1usize..12,
            from in 0usize..200,
            cap in 1usize..70,
        ) {
            // A stretch's singles, most recent first, then its runs, which start within one
            // stride of each other and below every single.
            let top = 1000u32;
            let mut matches: Vec<Match> = singles
                .iter()
                .enumerate()
                .map(|(n, &(_, len))| Match::one(top - n as u32, len))
                .collect();
            let mut heads: Vec<u32> = runs.iter().map(|r| r.0).collect();
            heads.sort_unstable();
            heads.dedup();
            let base = top - 10;
            for (n, &h) in heads.iter().enumerate() {
                let (_, len, copies) = runs[n];
                let copies = copies.min((base - h - 100) / stride);
                matches.push(Match { end: base - h, len, copies, stride });
            }
            let want: Vec<u32> = one_by_one(&matches)
                .iter()
                .filter(|m| m.len as usize >= p && m.end as usize + 1 >= from + p)
                .take(cap)
                .map(|m| m.end)
                .collect();
            let mut got = Vec::new();
            for_most_recent(&matches, p, from, cap, |i, end, n| {
                let m = matches[i];
                let k0 = (m.end - end) / m.stride.max(1);
                got.extend((k0..k0 + n).map(|k| m.end_of(k)));
            });
            got.sort_by_key(|&e| std::cmp::Reverse(e));
            proptest::prop_assert_eq!(got, want);
        }
    }
}
