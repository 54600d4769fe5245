//! Tight upper bounds on the score of a request-tree candidate, from its occurrences
//! alone, so that the search over p grows only the candidates that can win.
//!
//! A draft grown from the last p context tokens starts at the occurrences E_p that match
//! at least p tokens. Its node at depth k has D(N) = COUNT(N) / |E_p| (the ratios
//! telescope), and COUNT(N) counts occurrences that have at least k tokens after them.
//! The nodes at one depth share those occurrences, so their D(N) sum to at most
//! avail_k / |E_p|, where avail_k = |E_p| minus the occurrences fewer than k tokens
//! before the end of the request. No node is kept below `min_prob`. Hence
//!
//!   SCORE ≤ Σ_{k=1..limit, avail_k/|E_p| ≥ min_prob} avail_k / |E_p|.
//!
//! Budgets alone bound every long p by `max_spec`. On repetitive text (a run of one
//! token, a short period repeated) dozens of p have that bound and each grows nearly the
//! same long draft; this bound tells them apart, since a shorter p has more occurrences
//! and the same few near the end. It costs one pass over the matches, and per candidate
//! one step per occurrence near the end.

use crate::tree::{MAX_CURSOR_ENDS, Match};

/// Relative margin over the exact bound: a draft's score is computed in f32 (a product of
/// up to `max_spec` ratios per node, a sum of up to `max_spec` nodes), whose rounding
/// errs by a few 1e-6 at most. A candidate that could tie is never ruled out.
const ROUNDING_MARGIN: f64 = 1e-5;

/// What bounds the score of each candidate p, for one context.
#[derive(Clone, Debug, Default)]
pub(super) struct OccurrenceBounds {
    /// `at_least[p]`: occurrences that match at least p tokens.
    at_least: Vec<u32>,
    /// Occurrences with fewer than `horizon` tokens after them: (tokens after, match
    /// length), fewest tokens after first.
    near_end: Vec<(u32, u32)>,
    /// No occurrence is near the end, so every bound is the plain limit and nothing was
    /// counted but the longest match: the usual case.
    only_limits: bool,
    /// The longest match where only limits are kept: no p beyond it has an occurrence.
    longest: usize,
}

impl OccurrenceBounds {
    /// Bounds with room for `candidates` p and `near_end` occurrences near the end.
    pub(super) fn with_capacity(candidates: usize, near_end: usize) -> Self {
        OccurrenceBounds {
            at_least: Vec::with_capacity(candidates + 2),
            near_end: Vec::with_capacity(near_end),
            ..Self::default()
        }
    }

    /// Prepare the bounds for p up to `p_max`, from `matches` (most recent first, as
    /// `RequestTree::match_lengths` gives them) in a request of `len` tokens; drafts are
    /// at most `horizon` tokens long. Only the part of each occurrence from position
    /// `from` on counts (0 for the whole request, the prompt length for the response
    /// alone).
    pub(super) fn prepare(
        &mut self,
        matches: &[Match],
        len: usize,
        from: usize,
        p_max: usize,
        horizon: usize,
    ) {
        self.at_least.clear();
        self.near_end.clear();
        // How much of an occurrence ending at `end` lies at or after `from`.
        let inside = |end: u32| (end as usize + 1).checked_sub(from).filter(|&n| n > 0);
        // The matches come most recent first, so those near the end lead; the copies of a
        // run lie before its first, and interleave with those of the runs beside it.
        let mut sorted = true;
        'near: for m in matches {
            if !m.is_run() {
                let after = len.saturating_sub(m.end as usize + 1);
                if after >= horizon {
                    break;
                }
                if let Some(inside) = inside(m.end) {
                    self.near_end
                        .push((after as u32, (m.len as usize).min(inside) as u32));
                }
                continue;
            }
            for k in 0..m.copies {
                let end = m.end_of(k);
                let after = len.saturating_sub(end as usize + 1);
                if after >= horizon {
                    if k == 0 {
                        break 'near;
                    }
                    break;
                }
                if let Some(inside) = inside(end) {
                    // Copies of the runs beside this one may lie between these.
                    sorted = false;
                    self.near_end
                        .push((after as u32, (m.len as usize).min(inside) as u32));
                }
            }
        }
        if !sorted {
            self.near_end.sort_unstable();
        }
        self.only_limits = self.near_end.is_empty();
        if self.only_limits {
            // The whole request's longest match is the caller's p_max; the response's
            // may be shorter, and the merged search needs to know where it has none.
            // A run's most recent copy has the most of itself inside.
            self.longest = if from == 0 {
                usize::MAX
            } else {
                matches
                    .iter()
                    .filter_map(|m| Some((m.len as usize).min(inside(m.end)?)))
                    .max()
                    .unwrap_or(0)
            };
            return;
        }
        // No p beyond the longest match has an occurrence (`occurrences` reads past the
        // end as none): on a long context p_max is often far beyond it.
        let longest = matches.iter().map(|m| m.len as usize).max().unwrap_or(0);
        let p_max = p_max.min(longest);
        self.at_least.resize(p_max + 2, 0);
        let top = p_max + 1;
        for m in matches {
            if !m.is_run() {
                if let Some(inside) = inside(m.end) {
                    self.at_least[(m.len as usize).min(inside).min(top)] += 1;
                }
                continue;
            }
            // The copies that lie inside for the whole match, then those cut by `from`,
            // each shorter than the one before.
            let whole = m.copies_ending_at_or_after((from + m.len as usize).saturating_sub(1));
            self.at_least[(m.len as usize).min(top)] += whole;
            for k in whole..m.copies {
                let Some(inside) = inside(m.end_of(k)) else {
                    break;
                };
                self.at_least[inside.min(top)] += 1;
            }
        }
        // A cursor keeps the most recent occurrences only; those near the end are among
        // them (there are fewer than the cap).
        let cap = MAX_CURSOR_ENDS as u32;
        self.at_least[top] = self.at_least[top].min(cap);
        for p in (0..=p_max).rev() {
            self.at_least[p] = (self.at_least[p] + self.at_least[p + 1]).min(cap);
        }
    }

    /// Occurrences that match at least `p` tokens (at most the cursor cap), where they
    /// were counted.
    pub(super) fn occurrences(&self, p: usize) -> Option<u32> {
        if self.only_limits {
            (p > self.longest).then_some(0)
        } else {
            Some(self.at_least.get(p).copied().unwrap_or(0))
        }
    }

    /// An upper bound on the score of a draft of at most `limit` tokens grown from the
    /// last `p` context tokens, none below `min_prob` (see the module docs). `elsewhere`
    /// counts occurrences in another tree read together with this one (see `merged`),
    /// which may all go on to any depth.
    pub(super) fn score_bound(&self, p: usize, limit: usize, min_prob: f32, elsewhere: u32) -> f32 {
        if self.only_limits {
            return if p > self.longest { 0.0 } else { limit as f32 };
        }
        let here = self.occurrences(p).unwrap_or(0);
        if here + elsewhere == 0 || limit == 0 {
            return 0.0;
        }
        let total = (here + elsewhere) as f64;
        // A product instead of a quotient per step: it differs by an ulp of f64, far
        // inside the rounding margin.
        let per_occurrence = 1.0 / total;
        let mut gone = 0u32;
        let mut sum = 0.0f64;
        let mut depth = 0usize;
        // Between two occurrences that run out, every depth has the same availability.
        for &(after, matched) in &self.near_end {
            if matched as usize >= p {
                let until = (after as usize).min(limit);
                if until > depth {
                    let prob = (total - gone as f64) * per_occurrence;
                    if prob < min_prob as f64 {
                        return finish(sum, limit);
                    }
                    sum += prob * (until - depth) as f64;
                    depth = until;
                }
                gone += 1;
            }
        }
        if depth < limit {
            let prob = (total - gone as f64) * per_occurrence;
            if prob >= min_prob as f64 {
                sum += prob * (limit - depth) as f64;
            }
        }
        finish(sum, limit)
    }
}

fn finish(sum: f64, limit: usize) -> f32 {
    ((sum * (1.0 + ROUNDING_MARGIN)) as f32).min(limit as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_one_token_is_bounded_by_what_its_occurrences_have_left() {
        // Occurrences at 0..=8 of a 10-token run (the last, the context's own, left out),
        // each matching as far back as the run goes.
        let matches: Vec<Match> = (0..9u32).rev().map(|j| Match::one(j, j + 1)).collect();
        let mut b = OccurrenceBounds::default();
        b.prepare(&matches, 10, 0, 9, 4);
        // p = 1: 9 occurrences; the one at 8 has 1 token after it, 7 has 2, 6 has 3.
        let want = (9.0 + 8.0 + 7.0 + 6.0) / 9.0;
        assert!((b.score_bound(1, 4, 0.1, 0) - want).abs() < 1e-3);
        // p = 9: only the occurrence at 8, with one token after it.
        assert!((b.score_bound(9, 4, 0.1, 0) - 1.0).abs() < 1e-3);
        // min_prob stops the sum where availability falls below it.
        assert!((b.score_bound(9, 4, 0.5, 0) - 1.0).abs() < 1e-3);
        let two = [Match::one(8, 3), Match::one(7, 3)];
        b.prepare(&two, 10, 0, 3, 4);
        assert!(
            (b.score_bound(3, 4, 0.6, 0) - 1.0).abs() < 1e-3,
            "{}",
            b.score_bound(3, 4, 0.6, 0)
        );
        assert_eq!(b.score_bound(4, 4, 0.1, 0), 0.0);
    }

    #[test]
    fn runs_bound_as_the_occurrences_they_stand_for() {
        // Two single occurrences near the end of a 100-token request, then two runs of
        // copies every 7 tokens whose copies interleave.
        let runs = [
            Match::one(95, 5),
            Match::one(90, 3),
            Match {
                end: 80,
                len: 4,
                copies: 6,
                stride: 7,
            },
            Match {
                end: 78,
                len: 6,
                copies: 9,
                stride: 7,
            },
        ];
        let mut one_by_one: Vec<Match> = runs
            .iter()
            .flat_map(|m| (0..m.copies).map(move |k| Match::one(m.end_of(k), m.len)))
            .collect();
        one_by_one.sort_by_key(|m| std::cmp::Reverse(m.end));
        let (mut a, mut b) = (OccurrenceBounds::default(), OccurrenceBounds::default());
        for from in [0, 50, 70, 85] {
            for horizon in [4, 24, 40] {
                a.prepare(&runs, 100, from, 6, horizon);
                b.prepare(&one_by_one, 100, from, 6, horizon);
                for p in 1..=7 {
                    assert_eq!(a.occurrences(p), b.occurrences(p), "{from} {horizon} {p}");
                    for limit in [1, 5, 24] {
                        assert_eq!(
                            a.score_bound(p, limit, 0.1, 2),
                            b.score_bound(p, limit, 0.1, 2),
                            "{from} {horizon} {p} {limit}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn far_occurrences_are_bounded_by_the_limit() {
        let matches = [Match::one(10, 5), Match::one(3, 2)];
        let mut b = OccurrenceBounds::default();
        b.prepare(&matches, 100, 1, 5, 24);
        assert_eq!(b.score_bound(2, 24, 0.1, 0), 24.0);
        assert_eq!(b.score_bound(5, 7, 0.1, 0), 7.0);
        // Nothing near the end: no counting, and the bound is the limit up to the longest
        // match.
        assert_eq!(b.occurrences(5), None);
        assert_eq!(b.occurrences(6), Some(0));
        assert_eq!(b.score_bound(5, 7, 0.1, 0), 7.0);
        assert_eq!(b.score_bound(6, 7, 0.1, 0), 0.0);
    }

    #[test]
    fn the_response_alone_counts_only_occurrences_after_the_prompt() {
        // A 20-token prompt: the occurrence ending at 21 lies wholly in the response for
        // p <= 2, the one at 12 not at all.
        let matches = [Match::one(21, 6), Match::one(12, 9)];
        let mut b = OccurrenceBounds::default();
        b.prepare(&matches, 30, 20, 9, 24);
        assert_eq!(b.occurrences(1), Some(1));
        assert_eq!(b.occurrences(2), Some(1));
        assert_eq!(b.occurrences(3), Some(0));
        // 8 tokens follow it; another tree's 2 occurrences go on further.
        let want = 8.0 + 16.0 * 2.0 / 3.0;
        assert!((b.score_bound(2, 24, 0.1, 2) - want).abs() < 1e-3);
    }
}
