//! Sampling and acceptance: the distribution a sampled token is drawn from, the
//! walks that accept a verified draft's path, greedy (exactly plain decoding's output)
//! or sampled, and the log-probabilities reported with generated tokens.
//!
//! A sampled token is drawn by inverting its distribution's cumulative sum at a uniform
//! number that depends on the request's seed and the token's position in the answer
//! only ([`Draws`]). Verification draws the token at each position of the draft's path
//! exactly as plain decoding would, and follows the child that holds it: the answer is
//! plain sampling's answer for the seed, token for token, whatever was drafted (so a
//! seed reproduces with and without speculation), each token follows the model's
//! distribution, and a deterministic draft token x is accepted with probability p(x),
//! as the speculative sampling rule accepts it.

use candle_core::Tensor;

use super::grammar::{Constraint, GrammarError};
use super::penalties::{Penalties, Seen};
use crate::model::forward::ModelError;

/// Sampling parameters; temperature 0 is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass (1 keeps everything).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 keeps everything).
    pub top_k: usize,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// The sampling distribution from one row of logits: temperature, then top-k, then
    /// top-p, renormalised.
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let t = self.temperature.max(1e-6);
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = logits.iter().map(|&l| ((l - max) / t).exp()).collect();
        let keep_k = self.top_k > 0 && self.top_k < p.len();
        if keep_k || self.top_p < 1.0 {
            let total: f32 = p.iter().sum();
            let top_k = if keep_k { self.top_k } else { p.len() };
            let mut kept = vec![false; p.len()];
            for i in largest_kept(&p, top_k, self.top_p, total) {
                kept[i] = true;
            }
            p.iter_mut()
                .zip(&kept)
                .filter(|(_, kept)| !**kept)
                .for_each(|(x, _)| *x = 0.0);
        }
        let total: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= total);
        p
    }
}

/// What top-k and top-p keep of `p` (weights summing to `total`): in descending order
/// (ties to the lower index), the first `top_k` or fewer, up to the first whose
/// cumulative share reaches `top_p`.
///
/// Only the head of the order is sorted: the largest 256 are selected in linear time,
/// then 1,024, and so on while the share is not reached. Sorting a whole 262k
/// vocabulary cost about 15 ms a token for Gemma 3 270M, close to its forward pass. The
/// kept set and the sums along it are those of a full sort, since the prefix is the same.
fn largest_kept(p: &[f32], top_k: usize, top_p: f32, total: f32) -> Vec<usize> {
    let descending = |a: &usize, b: &usize| p[*b].total_cmp(&p[*a]).then(a.cmp(b));
    let limit = top_k.min(p.len());
    let mut head = limit.min(256);
    loop {
        let mut order: Vec<usize> = (0..p.len()).collect();
        if head < order.len() {
            order.select_nth_unstable_by(head, descending);
            order.truncate(head);
        }
        order.sort_unstable_by(descending);
        let mut mass = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            mass += p[i] / total;
            if mass >= top_p {
                order.truncate(rank + 1);
                return order;
            }
        }
        if head == limit {
            return order;
        }
        head = (head * 4).min(limit);
    }
}

/// Greedy acceptance: from the root, follow the child whose token is the model's argmax
/// at its parent; the model's argmax at the last accepted node is the bonus token.
/// Returns the accepted path (indices, root first) and the bonus.
pub(super) fn walk_greedy(tokens: &[u32], parents: &[i32], argmax: &[u32]) -> (Vec<usize>, u32) {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    loop {
        let want = argmax[cur];
        match (cur + 1..tokens.len()).find(|&j| parents[j] == cur as i32 && tokens[j] == want) {
            Some(j) => {
                path.push(j);
                cur = j;
            }
            None => return (path, want),
        }
    }
}

/// The uniform numbers a sampled answer is drawn with: one per position of the answer,
/// a function of the seed and the position alone (SplitMix64's stream for the seed).
#[derive(Clone, Copy, Debug)]
pub(super) struct Draws {
    stream: u64,
}

impl Draws {
    /// The draws of answers sampled with `seed`.
    pub(super) fn new(seed: u64) -> Self {
        Draws {
            stream: splitmix64(seed),
        }
    }

    /// The draw in [0, 1) for the answer's token at `position` (0 is its first token).
    pub(super) fn at(&self, position: usize) -> f32 {
        let bits = splitmix64(self.stream.wrapping_add(position as u64));
        // The top 24 bits: every value is exact in an f32 and below 1.
        (bits >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// SplitMix64's output function (Steele, Lea and Flood, 2014) over `state` advanced
/// by its constant: consecutive states give independent-looking outputs.
fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sampled acceptance: from the root, the token at each position is drawn from the
/// model's distribution at the path's last node with that position's draw; the walk
/// follows the child holding it, and the first token no child holds is the bonus.
/// `position`: the position in the answer of the token the root's row predicts.
pub(super) fn walk_sampled(
    tokens: &[u32],
    parents: &[i32],
    logits: &Tensor,
    sampling: &Sampling,
    draws: &Draws,
    position: usize,
) -> Result<(Vec<usize>, u32), ModelError> {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    loop {
        let row: Vec<f32> = logits.get(cur)?.to_vec1()?;
        let p = sampling.distribution(&row);
        let token = sample(&p, draws.at(position + path.len() - 1));
        match child_with(tokens, parents, cur, token) {
            Some(j) => {
                path.push(j);
                cur = j;
            }
            None => return Ok((path, token)),
        }
    }
}

/// The child of node `cur` that holds `token`, if one does.
fn child_with(tokens: &[u32], parents: &[i32], cur: usize, token: u32) -> Option<usize> {
    (cur + 1..tokens.len()).find(|&j| parents[j] == cur as i32 && tokens[j] == token)
}

/// What a walk changes in each row's logits before it chooses: the request's penalties
/// (with what they read: the answer so far) and its grammar, either or both.
pub(super) struct Adjustments<'a> {
    /// The penalties and what the answer held before this step.
    pub(super) penalties: Option<(&'a Penalties, Seen)>,
    /// The grammar's state after the answer so far; advanced by every token taken.
    pub(super) constraint: Option<&'a mut Constraint>,
}

/// Acceptance with adjusted logits, greedy or sampled: at each node the row's logits are
/// adjusted by the penalties for the answer and the path above the node, then masked to
/// what the grammar allows after that path, and the choice is made as plain decoding
/// makes it (the adjusted argmax, or the position's draw from the adjusted distribution,
/// as [`walk_greedy`] and [`walk_sampled`] make it). Every token taken, the bonus
/// included, advances the constraint.
pub(super) fn walk_adjusted(
    tokens: &[u32],
    parents: &[i32],
    logits: &Tensor,
    sampling: &Sampling,
    draws: &Draws,
    position: usize,
    mut adjust: Adjustments,
) -> Result<Result<(Vec<usize>, u32), GrammarError>, ModelError> {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    loop {
        let forced = match adjust
            .constraint
            .as_deref_mut()
            .map(Constraint::forced_next)
        {
            Some(Err(e)) => return Ok(Err(e)),
            Some(Ok(forced)) => forced,
            None => None,
        };
        let chosen = match forced {
            // The one token allowed: every sampling picks it, so its logits go unread.
            Some(forced) => forced,
            None => {
                let mut row: Vec<f32> = logits.get(cur)?.to_vec1()?;
                if let Some((penalties, seen)) = &adjust.penalties {
                    penalties.apply(&mut row, seen);
                }
                if let Some(constraint) = adjust.constraint.as_deref_mut() {
                    if let Err(e) = constraint.mask_logits(&mut row) {
                        return Ok(Err(e));
                    }
                    if !row.iter().any(|x| x.is_finite()) {
                        return Ok(Err(GrammarError::Failed(
                            "the grammar allows no token here".into(),
                        )));
                    }
                }
                if sampling.temperature <= 0.0 {
                    crate::model::forward::argmax(&row)
                } else {
                    sample(
                        &sampling.distribution(&row),
                        draws.at(position + path.len() - 1),
                    )
                }
            }
        };
        let next = child_with(tokens, parents, cur, chosen);
        if let Some(constraint) = adjust.constraint.as_deref_mut()
            && let Err(e) = constraint.advance(chosen)
        {
            return Ok(Err(e));
        }
        if let Some((_, seen)) = adjust.penalties.as_mut() {
            seen.add(chosen);
        }
        match next {
            Some(j) => {
                path.push(j);
                cur = j;
            }
            None => return Ok(Ok((path, chosen))),
        }
    }
}

/// The token where `p`'s cumulative sum (in token order) first exceeds `draw`, a
/// uniform number in [0, 1): a draw from `p`, a distribution that sums to 1.
pub(super) fn sample(p: &[f32], draw: f32) -> u32 {
    let mut acc = 0.0;
    for (i, &x) in p.iter().enumerate() {
        acc += x;
        if draw < acc {
            return i as u32;
        }
    }
    // Rounding left the draw above the total: the last token with mass.
    p.iter().rposition(|&x| x > 0.0).unwrap_or(0) as u32
}

/// Most alternatives [`super::GenerateOptions::logprobs`] may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A generated token's log-probability under the model's own distribution (its logits'
/// softmax: temperature 1, before top-k and top-p), and the most likely tokens at its
/// position, most likely first (ties: the lower id). The logits of a position are the
/// same bits with and without speculation (row invariance), so these are too.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its natural log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// `token`'s log-probability in `logits` (one position's), with the `top` most
    /// likely tokens. Sums run in f64, so the probabilities of a 49k vocabulary add up.
    pub fn from_logits(logits: &[f32], token: u32, top: usize) -> Self {
        let max = logits
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
        let log_sum = sum.ln();
        let logprob = |x: f32| ((x - max) as f64 - log_sum) as f32;
        // The `top` largest, by a bounded insertion: k is at most MAX_TOP_LOGPROBS.
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
        if top > 0 {
            for (i, &x) in logits.iter().enumerate() {
                if x.is_nan() || (best.len() == top && x <= best[top - 1].1) {
                    continue;
                }
                let at = best.partition_point(|&(_, y)| y >= x);
                best.insert(at, (i as u32, x));
                best.truncate(top);
            }
        }
        TokenLogprob {
            token,
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&x| logprob(x)),
            top: best.into_iter().map(|(t, x)| (t, logprob(x))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn greedy_walk_follows_the_argmax_and_adds_the_bonus() {
        // root(0) -> a(1) -> b(2); root -> c(3)
        let tokens = [9, 5, 6, 7];
        let parents = [-1, 0, 1, 0];
        let (path, bonus) = walk_greedy(&tokens, &parents, &[5, 6, 8, 0]);
        assert_eq!(path, vec![0, 1, 2]);
        assert_eq!(bonus, 8);
        let (path, bonus) = walk_greedy(&tokens, &parents, &[7, 0, 0, 3]);
        assert_eq!(path, vec![0, 3]);
        assert_eq!(bonus, 3);
    }

    /// The full sort `largest_kept` replaces: its kept set, for comparison.
    fn kept_by_full_sort(p: &[f32], top_k: usize, top_p: f32, total: f32) -> Vec<usize> {
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let mut mass = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            if rank >= top_k {
                order.truncate(rank);
                return order;
            }
            mass += p[i] / total;
            if mass >= top_p {
                order.truncate(rank + 1);
                return order;
            }
        }
        order
    }

    #[test]
    fn the_partial_selection_keeps_what_a_full_sort_keeps() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(46);
        for vocab in [3usize, 300, 5_000, 262_144] {
            // Coarse values, so that many tie (ties go to the lower index), and a
            // flat tail, so that top-p needs more than the first selection.
            let logits: Vec<f32> = (0..vocab)
                .map(|_| (rng.random_range(0..40) as f32) / 4.0)
                .collect();
            let p: Vec<f32> = logits.iter().map(|&l| (l - 10.0).exp()).collect();
            let total: f32 = p.iter().sum();
            for (top_k, top_p) in [
                (vocab, 0.5),
                (vocab, 0.95),
                (vocab, 0.9999),
                (40, 1.0),
                (2000, 0.99),
                (vocab, 1.0),
            ] {
                assert_eq!(
                    largest_kept(&p, top_k, top_p, total),
                    kept_by_full_sort(&p, top_k, top_p, total),
                    "vocabulary {vocab}, top-k {top_k}, top-p {top_p}"
                );
            }
        }
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let s = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 2,
            seed: 0,
        };
        let p = s.distribution(&[0.0, 1.0, 2.0, -5.0]);
        assert_eq!(p[0], 0.0);
        assert_eq!(p[3], 0.0);
        assert!((p[1] + p[2] - 1.0).abs() < 1e-6);
        let s = Sampling {
            top_k: 0,
            top_p: 0.5,
            ..s
        };
        let p = s.distribution(&[0.0, 0.0, 10.0]);
        assert_eq!(p, vec![0.0, 0.0, 1.0]);
    }

    /// Speculative sampling must leave the model's distribution unchanged, whatever the
    /// draft proposes: chi-square of 200k sampled first tokens against p, for a draft
    /// tree whose root has two children (the recursive rule) and one that proposes an
    /// unlikely token.
    #[test]
    fn speculative_sampling_preserves_the_distribution() {
        let logits = [2.0f32, 1.5, 1.0, 0.2, -1.0, 0.0];
        let sampling = Sampling {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 5,
            seed: 0,
        };
        let p = sampling.distribution(&logits);
        // Rows: root, then draft nodes (their rows are never read for the first token).
        let rows: Vec<f32> = logits
            .iter()
            .cycle()
            .take(logits.len() * 4)
            .cloned()
            .collect();
        let t = Tensor::from_vec(rows, (4, logits.len()), &candle_core::Device::Cpu).unwrap();
        for (tokens, parents) in [
            (vec![9u32, 1, 0, 3], vec![-1i32, 0, 0, 1]),
            (vec![9u32, 4, 2, 5], vec![-1i32, 0, 1, 0]),
        ] {
            let n = 200_000;
            let mut hist = vec![0u64; logits.len()];
            for seed in 0..n {
                let draws = Draws::new(seed);
                let (path, bonus) =
                    walk_sampled(&tokens, &parents, &t, &sampling, &draws, 5).unwrap();
                let first = if path.len() > 1 {
                    tokens[path[1]]
                } else {
                    bonus
                };
                hist[first as usize] += 1;
            }
            let mut chi2 = 0.0;
            let mut dof = 0;
            for (i, &pi) in p.iter().enumerate() {
                if pi == 0.0 {
                    assert_eq!(hist[i], 0, "token {i} is outside top-k/top-p");
                    continue;
                }
                let e = pi as f64 * n as f64;
                chi2 += (hist[i] as f64 - e).powi(2) / e;
                dof += 1;
            }
            // 99.9th percentile of chi-square with 4 degrees of freedom is 18.47.
            assert_eq!(dof, 5);
            assert!(
                chi2 < 18.47,
                "chi2 {chi2} for {tokens:?}, hist {hist:?}, p {p:?}"
            );
        }
    }

    /// Under a grammar, speculative sampling must draw from the masked distribution
    /// that plain constrained sampling draws from, whatever the draft proposes: a
    /// forbidden child first, then an allowed one; or a single allowed child.
    #[test]
    fn constrained_speculative_sampling_keeps_the_masked_distribution() {
        use crate::engine::grammar::GrammarSpec;
        let (compiler, tok) = crate::engine::grammar::tests::smollm2();
        let grammar = compiler
            .compile(&GrammarSpec::Lark(
                r#"start: "yes" | "no" | "maybe""#.into(),
            ))
            .unwrap();
        let id = |w: &str| {
            let ids = tok.encode_text(w).unwrap();
            assert_eq!(ids.len(), 1, "{w} is one token");
            ids[0]
        };
        let (yes, no, maybe, hello) = (id("yes"), id("no"), id("maybe"), id("hello"));
        let vocab = 49152;
        let mut row = vec![-30.0f32; vocab];
        row[yes as usize] = 1.0;
        row[no as usize] = 0.6;
        row[maybe as usize] = 0.0;
        row[hello as usize] = 3.0;
        let sampling = Sampling {
            temperature: 0.9,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        };
        // The reference: one plain constrained step.
        let mut masked = row.clone();
        grammar.start().mask_logits(&mut masked).unwrap();
        let p = sampling.distribution(&masked);
        assert_eq!(p[hello as usize], 0.0);
        let rows: Vec<f32> = row.iter().cycle().take(vocab * 3).cloned().collect();
        let t = Tensor::from_vec(rows, (3, vocab), &candle_core::Device::Cpu).unwrap();
        for (tokens, parents) in [
            (vec![9u32, hello, no], vec![-1i32, 0, 0]),
            (vec![9u32, maybe, 7], vec![-1i32, 0, 1]),
        ] {
            let n = 20_000;
            let mut hist = std::collections::HashMap::<u32, u64>::new();
            for seed in 0..n {
                let mut c = grammar.start();
                let draws = Draws::new(seed);
                let adjust = Adjustments {
                    penalties: None,
                    constraint: Some(&mut c),
                };
                let (path, bonus) =
                    walk_adjusted(&tokens, &parents, &t, &sampling, &draws, 0, adjust)
                        .unwrap()
                        .unwrap();
                let first = if path.len() > 1 {
                    tokens[path[1]]
                } else {
                    bonus
                };
                *hist.entry(first).or_default() += 1;
            }
            assert_eq!(hist.get(&hello), None, "a forbidden token was taken");
            let mut chi2 = 0.0;
            for &w in &[yes, no, maybe] {
                let e = p[w as usize] as f64 * n as f64;
                let o = hist.get(&w).copied().unwrap_or(0) as f64;
                chi2 += (o - e).powi(2) / e;
            }
            let rest: u64 = hist
                .iter()
                .filter(|(w, _)| ![yes, no, maybe].contains(w))
                .map(|(_, &c)| c)
                .sum();
            assert!(rest <= 5, "{hist:?}");
            // 99.9th percentile of chi-square with 2 degrees of freedom is 13.82.
            assert!(chi2 < 13.82, "chi2 {chi2} for {tokens:?}: {hist:?}");
        }
    }

    /// Whatever the draft tree, a sampled walk takes at each position the token plain
    /// sampling takes there with the same seed: the answer does not depend on what was
    /// drafted. Rows differ per node, so a wrong position or row would show.
    #[test]
    fn a_sampled_walk_takes_plain_samplings_tokens_whatever_was_drafted() {
        let vocab = 6usize;
        let sampling = Sampling {
            temperature: 1.0,
            ..Sampling::default()
        };
        // Node i's row: logits that favour token (i % vocab) a little.
        let row_of = |i: usize| -> Vec<f32> {
            (0..vocab)
                .map(|t| if t == i % vocab { 1.0 } else { 0.3 * t as f32 })
                .collect()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for seed in 0..2_000u64 {
            let draws = Draws::new(seed);
            let start = rng.random_range(0..100);
            // A random tree of 8 nodes: node j's parent is one of the nodes before it.
            let n = 8;
            let parents: Vec<i32> = (0..n)
                .map(|j| {
                    if j == 0 {
                        -1
                    } else {
                        rng.random_range(0..j) as i32
                    }
                })
                .collect();
            let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
            let rows: Vec<f32> = (0..n).flat_map(row_of).collect();
            let t = Tensor::from_vec(rows, (n, vocab), &candle_core::Device::Cpu).unwrap();
            let (path, bonus) =
                walk_sampled(&tokens, &parents, &t, &sampling, &draws, start).unwrap();
            // Plain sampling along the same path: at each node, its row and the draw of
            // its position.
            for (depth, &node) in path.iter().enumerate() {
                let want = sample(
                    &sampling.distribution(&row_of(node)),
                    draws.at(start + depth),
                );
                let took = path.get(depth + 1).map_or(bonus, |&next| tokens[next]);
                assert_eq!(took, want, "seed {seed}, tree {parents:?} {tokens:?}");
            }
        }
    }

    #[test]
    fn draws_are_uniform_and_depend_on_seed_and_position_only() {
        let a = Draws::new(42);
        assert_eq!(a.at(7), Draws::new(42).at(7));
        assert_ne!(a.at(7), a.at(8));
        assert_ne!(a.at(7), Draws::new(43).at(7));
        // Ten bins over 100k positions of one seed and 100k seeds at one position.
        for draws in [
            (0..100_000).map(|i| a.at(i)).collect::<Vec<_>>(),
            (0..100_000).map(|s| Draws::new(s).at(3)).collect(),
        ] {
            let mut bins = [0f64; 10];
            for d in draws {
                assert!((0.0..1.0).contains(&d));
                bins[(d * 10.0) as usize] += 1.0;
            }
            let chi2: f64 = bins.iter().map(|o| (o - 10_000.0).powi(2) / 10_000.0).sum();
            // 99.9th percentile of chi-square with 9 degrees of freedom is 27.88.
            assert!(chi2 < 27.88, "{bins:?}");
        }
    }

    #[test]
    fn logprobs_are_a_distribution_and_list_the_most_likely_first() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5, f32::NEG_INFINITY];
        let all: Vec<f32> = (0..logits.len() as u32)
            .map(|t| TokenLogprob::from_logits(&logits, t, 0).logprob)
            .collect();
        let mass: f64 = all.iter().map(|&l| (l as f64).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-6, "{mass}");
        assert!(all.iter().all(|&l| l <= 0.0));
        assert_eq!(all[5], f32::NEG_INFINITY);
        let lp = TokenLogprob::from_logits(&logits, 4, 3);
        assert_eq!(lp.token, 4);
        assert_eq!(lp.logprob, all[4]);
        // Ties go to the lower id, as the greedy argmax does.
        assert_eq!(lp.top, vec![(1, all[1]), (3, all[3]), (0, all[0])]);
        assert_eq!(TokenLogprob::from_logits(&logits, 1, 9).top.len(), 6);
    }
}
