//! The state of one [`RequestTree::match_lengths`](super::RequestTree::match_lengths)
//! walk over the occurrences of the context's last token: what it has listed, and when
//! it stops.

use smallvec::{SmallVec, smallvec};

use super::{ALIKE_CONTEXT, MAX_CURSOR_ENDS, MAX_OCCURRENCES, Match};

/// The state of one walk.
pub(super) struct Walk<'a> {
    pub(super) out: &'a mut Vec<Match>,
    /// The last position: its occurrence is the context's own.
    pub(super) end: usize,
    pub(super) enough: usize,
    pub(super) long_enough: usize,
    /// Drafts from the cursors grow at most this many tokens: copies of a repeated
    /// stretch followed by the same this many tokens are listed as one run.
    pub(super) horizon: usize,
    /// The longest match so far, and how many occurrences match that long.
    pub(super) longest: u32,
    pub(super) as_long: usize,
    /// Occurrences walked, or passed over as copies of listed ones.
    pub(super) visited: usize,
    /// `listed[l]`: listed occurrences (the context's own aside) that match `l` tokens,
    /// for the repeated stretches (whose matches are shorter than [`ALIKE_CONTEXT`]).
    pub(super) listed: [u32; ALIKE_CONTEXT + 1],
    /// Every length up to this one is matched by at least [`MAX_CURSOR_ENDS`] listed
    /// occurrences (0: none yet), so an occurrence that matches no longer is kept out
    /// of every cursor.
    pub(super) kept_out_up_to: u32,
}

impl Walk<'_> {
    /// Lists the occurrence at `j`, matching `l` tokens; true when the walk is over.
    #[inline]
    pub(super) fn visit(&mut self, j: u32, l: u32) -> bool {
        self.out.push(Match::one(j, l));
        self.count(j, l)
    }

    /// Lists the occurrence at `j`, matching `l` tokens, unless [`MAX_CURSOR_ENDS`]
    /// listed occurrences (the context's own aside) already match at least as long: then
    /// every cursor it could enter is full of more recent ones, and it is passed over,
    /// counted towards the stops as the walk one by one counts it. On ordinary text, most
    /// occurrences of a common token in a long prompt are such. True when the walk is
    /// over.
    #[inline]
    pub(super) fn visit_unless_kept_out(&mut self, j: u32, l: u32) -> bool {
        // The list holds at most one occurrence (the context's own) that `listed` does
        // not count, so below this length no cursor can be full yet. Listed counts only
        // grow, so the bound is raised after a listing, and a pass-over costs a compare
        // (on text over a few tokens most of a long walk is pass-overs).
        if l > self.kept_out_up_to && self.out.len() > MAX_CURSOR_ENDS {
            while (self.kept_out_up_to as usize) < ALIKE_CONTEXT - 1
                && self.listed_at_least(self.kept_out_up_to + 1) >= MAX_CURSOR_ENDS
            {
                self.kept_out_up_to += 1;
            }
        }
        if l <= self.kept_out_up_to && j as usize != self.end {
            // The occurrences counted above match at least `l`: it is not longer than
            // the longest, as `pass_over` requires.
            return self.pass_over(l);
        }
        self.visit(j, l)
    }

    /// Counts an occurrence listed at `j` (alone or in a run), matching `l` tokens; true
    /// when the walk is over.
    #[inline]
    fn count(&mut self, j: u32, l: u32) -> bool {
        self.visited += 1;
        // The occurrence at the very end (the context's own, usually) has nothing
        // after it: it never starts a draft, so it does not count towards `enough`.
        if j as usize != self.end {
            self.listed[(l as usize).min(ALIKE_CONTEXT)] += 1;
            if l > self.longest {
                (self.longest, self.as_long) = (l, 0);
            }
            if l == self.longest {
                self.as_long += 1;
                if self.as_long >= self.enough && l as usize >= self.long_enough {
                    return true;
                }
            }
        }
        self.visited >= MAX_OCCURRENCES
    }

    /// Counts an occurrence the walk passes over without listing it (a copy no cursor
    /// can keep, of a listed one that matches `l`); true when the walk is over.
    #[inline]
    fn pass_over(&mut self, l: u32) -> bool {
        self.visited += 1;
        if l == self.longest {
            self.as_long += 1;
            if self.as_long >= self.enough && l as usize >= self.long_enough {
                return true;
            }
        }
        self.visited >= MAX_OCCURRENCES
    }

    /// Listed occurrences, the context's own aside, that match at least `l` tokens.
    fn listed_at_least(&self, l: u32) -> usize {
        self.listed[(l as usize).min(ALIKE_CONTEXT)..]
            .iter()
            .sum::<u32>() as usize
    }

    /// Walks the copies, one and more periods back, of the occurrences listed from
    /// `first` on (one period of a repeated stretch), down to position `floor` where the
    /// stretch ends. A copy is listed while fewer than [`MAX_CURSOR_ENDS`] listed
    /// occurrences match as long as it does, since a cursor keeps no more; the others
    /// are passed over, counted as the walk one by one would count them. Copies far
    /// enough back to be followed by the same `horizon` tokens as each other are listed
    /// as one run per occurrence of the period, after the single ones. Returns None
    /// when the walk is over, else the oldest copy in the stretch (None if there is
    /// none), from which the chain goes on.
    pub(super) fn repeat(
        &mut self,
        first: usize,
        period: usize,
        floor: usize,
    ) -> Option<Option<usize>> {
        let last = self.out.len();
        if first == last {
            return Some(None);
        }
        // How many periods back each one's copies can still enter a cursor: each period
        // adds a copy of every listed one that matches at least as long.
        let reps: SmallVec<[usize; 16]> = (first..last)
            .map(|i| {
                let l = self.out[i].len;
                let per_period = self.out[first..last].iter().filter(|o| o.len >= l).count();
                MAX_CURSOR_ENDS
                    .saturating_sub(self.listed_at_least(l))
                    .div_ceil(per_period)
            })
            .collect();
        // Copies `in_runs_from` periods back or more are followed, for `horizon` tokens,
        // by tokens of the stretch before the occurrence they copy, so by the same ones.
        let in_runs_from = self.horizon.div_ceil(period).max(1);
        let mut runs: SmallVec<[u32; 16]> = smallvec![0; last - first];
        let outcome = self.walk_copies(first, last, period, floor, &reps, in_runs_from, &mut runs);
        for (i, &copies) in (first..last).zip(&runs) {
            if copies > 0 {
                let Match { end, len, .. } = self.out[i];
                self.out.push(Match {
                    end: end - (in_runs_from * period) as u32,
                    len,
                    copies,
                    stride: period as u32,
                });
            }
        }
        outcome
    }

    /// The walk of [`Walk::repeat`], counting in `runs` the copies that its runs stand
    /// for.
    #[allow(clippy::too_many_arguments)]
    fn walk_copies(
        &mut self,
        first: usize,
        last: usize,
        period: usize,
        floor: usize,
        reps: &[usize],
        in_runs_from: usize,
        runs: &mut [u32],
    ) -> Option<Option<usize>> {
        let most = reps.iter().copied().max().unwrap_or(0);
        let mut k = 1;
        while k <= most {
            if k >= in_runs_from {
                let layers = self.layers_without_stop(first, last, period, floor, k, most);
                if layers > 0 {
                    self.count_layers(first, last, reps, k, layers, runs);
                    k += layers;
                    continue;
                }
            }
            for i in first..last {
                let Match { end: j, len: l, .. } = self.out[i];
                let Some(copy) = (j as usize).checked_sub(k * period).filter(|&c| c >= floor)
                else {
                    // Copies run out in position order: this one and every later one.
                    return Some(self.oldest_copy(first, last, period, floor));
                };
                let over = if k > reps[i - first] {
                    self.pass_over(l)
                } else if k < in_runs_from {
                    self.visit(copy as u32, l)
                } else {
                    runs[i - first] += 1;
                    self.count(copy as u32, l)
                };
                if over {
                    return None;
                }
            }
            k += 1;
        }
        // The older copies repeat listed matches: no cursor keeps them.
        let mut as_long = 0;
        for i in first..last {
            let Match { end: j, len: l, .. } = self.out[i];
            let passed = ((j as usize - floor) / period).saturating_sub(most);
            self.visited += passed;
            if l == self.longest {
                as_long += passed;
            }
        }
        self.as_long += as_long;
        let stop = self.as_long >= self.enough && self.longest as usize >= self.long_enough;
        if stop || self.visited >= MAX_OCCURRENCES {
            return None;
        }
        Some(self.oldest_copy(first, last, period, floor))
    }

    /// How many whole periods of copies, from `k` periods back on (at most to `most`),
    /// the walk can count at once: every occurrence listed in `first..last` has a copy
    /// in each of them, none raises the longest match, and the walk does not stop
    /// within them. On a long stretch that is all of them but the last.
    fn layers_without_stop(
        &self,
        first: usize,
        last: usize,
        period: usize,
        floor: usize,
        k: usize,
        most: usize,
    ) -> usize {
        let listed = &self.out[first..last];
        if listed.iter().any(|o| o.len > self.longest) {
            return 0;
        }
        // Listed in position order, most recent first: the last runs out first.
        let oldest = listed[listed.len() - 1].end as usize;
        let whole = (oldest - floor.min(oldest)) / period;
        if whole < k {
            return 0;
        }
        let per_layer = listed.len();
        let as_long_per_layer = listed.iter().filter(|o| o.len == self.longest).count();
        let mut layers = (most - k + 1).min(whole - k + 1);
        // Each copy is a step towards the stops; the last one counted must not reach them.
        layers = layers.min(MAX_OCCURRENCES.saturating_sub(self.visited + 1) / per_layer);
        if as_long_per_layer > 0 && self.longest as usize >= self.long_enough {
            layers = layers.min(self.enough.saturating_sub(self.as_long + 1) / as_long_per_layer);
        }
        layers
    }

    /// Counts `layers` whole periods of copies from `k` periods back on (see
    /// [`Walk::layers_without_stop`]), as the walk one copy at a time would: a copy of
    /// the occurrence listed at `i` joins its run while `reps[i - first]` allows, and is
    /// passed over after.
    fn count_layers(
        &mut self,
        first: usize,
        last: usize,
        reps: &[usize],
        k: usize,
        layers: usize,
        runs: &mut [u32],
    ) {
        for i in first..last {
            let l = self.out[i].len;
            let listed = reps[i - first].min(k + layers - 1).saturating_sub(k - 1) as u32;
            runs[i - first] += listed;
            self.listed[(l as usize).min(ALIKE_CONTEXT)] += listed;
            if l == self.longest {
                self.as_long += layers;
            }
        }
        self.visited += layers * (last - first);
    }

    /// The oldest copy, at or after `floor`, of the occurrences listed in `first..last`.
    fn oldest_copy(&self, first: usize, last: usize, period: usize, floor: usize) -> Option<usize> {
        (first..last)
            .map(|i| {
                let j = self.out[i].end as usize;
                j - (j - floor) / period * period
            })
            .min()
    }
}
