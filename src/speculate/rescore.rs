//! Exact scores of request-tree path candidates without growing them, along the path
//! of a draft already grown.
//!
//! On repetitive text many p draw the same path: their occurrence sets differ by a few
//! occurrences (one more copy of a period, one that runs out near the end), and the
//! score bounds cannot tell them apart, so each would be grown in full to find that it
//! loses. But a path draft follows, at every step, the next token of most occurrences.
//! Given the occurrences of p and how far each follows the leader's path, the counts
//! along that path are known at once; while the path's next token holds a strict
//! majority of the node's occurrences, the greedy step takes it, whatever the other
//! tokens are. So the draft of p is the leader's path, cut where its own limits cut it,
//! and its score is computed exactly as growing would compute it (the same f32 steps).
//! Where the majority fails, the path would go beyond the leader's, or one occurrence
//! is left (extended mode copies its continuation), the candidate is grown as before.

use super::{Draft, SpecMode, SpecParams, min_count_for};
use crate::tree::{MAX_CURSOR_ENDS, Match, RequestTree, common_prefix_len, for_most_recent};

/// How far the request tree's occurrences follow one path.
#[derive(Clone, Debug, Default)]
pub(super) struct PathRescorer {
    /// For each match, how many of the path's tokens follow its occurrence.
    follows: Vec<u32>,
    /// `at_least[k]`: occurrences of the candidate that follow k tokens or more.
    at_least: Vec<u32>,
    /// The path's length.
    path_len: usize,
    /// The last score told since [`PathRescorer::follow`], and the candidate's limit.
    /// On repetitive text the candidates told one after another often hold the same
    /// counts along the path (each range swaps an older copy for a newer one, both
    /// following the whole path), and then the same score.
    last_told: Option<(usize, Option<f32>)>,
    /// `at_least` of that candidate, before its suffix sums (their sum is its
    /// occurrence count, so equal counts here mean an equal candidate).
    last_counts: Vec<u32>,
}

impl PathRescorer {
    /// A rescorer with room for `matches` matches and paths of `path_len` tokens.
    pub(super) fn with_capacity(matches: usize, path_len: usize) -> Self {
        PathRescorer {
            follows: Vec::with_capacity(matches),
            at_least: Vec::with_capacity(path_len + 2),
            path_len: 0,
            last_told: None,
            last_counts: Vec::with_capacity(path_len + 2),
        }
    }

    /// Measures how far each of `matches` (most recent first, as `match_lengths` gives
    /// them) goes on with the tokens of `path`. The copies of a run go on as its first
    /// does, for as long as any draft grows.
    pub(super) fn follow(&mut self, tree: &RequestTree, matches: &[Match], path: &Draft) {
        let tokens = tree.tokens();
        self.path_len = path.len();
        self.last_told = None;
        self.follows.clear();
        self.follows.extend(matches.iter().map(|m| {
            let after = &tokens[(m.end as usize + 1).min(tokens.len())..];
            common_prefix_len(after, &path.tokens) as u32
        }));
    }

    /// The exact score of the path draft grown from the occurrences matching `p` tokens,
    /// at most `limit` tokens long, if that draft is the measured path (or a prefix of
    /// it); None where that cannot be told without growing it.
    pub(super) fn score(
        &mut self,
        matches: &[Match],
        p: usize,
        limit: usize,
        params: &SpecParams,
    ) -> Option<f32> {
        debug_assert_eq!(
            matches.len(),
            self.follows.len(),
            "follow() the same matches"
        );
        self.at_least.clear();
        self.at_least.resize(self.path_len + 2, 0);
        // The cursor of p: its most recent occurrences (see `RequestTree::cursor_at`).
        let mut count = 0u32;
        let (follows, at_least) = (&self.follows, &mut self.at_least);
        for_most_recent(matches, p, 0, MAX_CURSOR_ENDS, |i, _, n| {
            at_least[follows[i] as usize] += n;
            count += n;
        });
        if let Some((told_limit, score)) = self.last_told
            && told_limit == limit
            && self.last_counts == self.at_least
        {
            return score;
        }
        self.last_counts.clone_from(&self.at_least);
        let score = self.score_from_counts(count, limit, params);
        self.last_told = Some((limit, score));
        score
    }

    /// The score along the path of a candidate with `count` occurrences, of which
    /// `at_least[k]` follow exactly k of its tokens (the last entry: all of them), at
    /// most `limit` tokens long; None where the path is not the draft's.
    fn score_from_counts(
        &mut self,
        mut count: u32,
        limit: usize,
        params: &SpecParams,
    ) -> Option<f32> {
        for k in (0..=self.path_len).rev() {
            self.at_least[k] += self.at_least[k + 1];
        }
        // The steps of `expand_path`, on known counts.
        let extended = params.mode == SpecMode::Extended;
        let (mut prob, mut score, mut len) = (1.0f32, 0.0f32, 0usize);
        while len < limit {
            if (extended && count == 1) || len == self.path_len {
                return None;
            }
            let next_count = self.at_least[len + 1];
            // The other next tokens share what is left, so the path's is the most
            // frequent child, and no tie is broken.
            if next_count <= count - next_count {
                return None;
            }
            if next_count < min_count_for(params, prob, count) {
                break;
            }
            let next = prob * (next_count as f32 / count as f32);
            if next < params.min_prob {
                break;
            }
            prob = next;
            score += prob;
            len += 1;
            count = next_count;
        }
        Some(score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculate::expand;
    use crate::tree::repetitive_prompt;
    use proptest::prelude::*;

    /// The draft that growing candidate `p` gives, with the budget the search uses.
    fn grown(tree: &RequestTree, matches: &[Match], p: usize, params: &SpecParams) -> Draft {
        let mut d = Draft::default();
        if let Some(cursor) = tree.cursor_at(matches, p, params.budget(p)) {
            expand(tree, &cursor, params.budget(p), 0.0, params, &mut d);
        }
        d
    }

    proptest! {
        /// Wherever a score is told without growing, growing gives that score, on a
        /// prefix of the leader's path.
        #[test]
        fn a_told_score_is_the_grown_score(
            prompt in repetitive_prompt(1..40, 400),
            reply in prop::collection::vec(0u32..4, 0..30),
            min_prob in 0.0f32..0.6,
            paper in any::<bool>(),
        ) {
            let params = SpecParams {
                min_prob,
                mode: if paper { SpecMode::Paper } else { SpecMode::Extended },
                ..SpecParams::default()
            };
            let mut tree = RequestTree::new(&prompt, params.request_depth());
            tree.extend(&reply);
            let context = tree.tokens().to_vec();
            let limit = if paper { params.max_depth } else { 64 };
            let window = &context[context.len().saturating_sub(limit)..];
            let mut matches = Vec::new();
            tree.match_lengths(window, window.len(), usize::MAX, params.max_spec, &mut matches);
            let p_max = matches.iter().map(|m| m.len as usize).max().unwrap_or(0);
            let mut rescorer = PathRescorer::default();
            for leader_p in 1..=p_max {
                let leader = grown(&tree, &matches, leader_p, &params);
                if leader.is_empty() {
                    continue;
                }
                rescorer.follow(&tree, &matches, &leader);
                for p in 1..=p_max {
                    let room = if paper { params.max_depth.saturating_sub(p) } else { usize::MAX };
                    let limit = params.budget(p).min(room);
                    if let Some(score) = rescorer.score(&matches, p, limit, &params) {
                        let d = grown(&tree, &matches, p, &params);
                        prop_assert_eq!(d.score, score, "p {} after leader {}", p, leader_p);
                        prop_assert!(leader.tokens.starts_with(&d.tokens));
                    }
                }
            }
        }
    }
}
