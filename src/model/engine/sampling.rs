//! Sampling and acceptance: the distribution a sampled token is drawn from, the
//! walks that accept a verified draft's path, greedy (exactly plain decoding's output)
//! or sampled (speculative sampling, which preserves the model's distribution), and the
//! log-probabilities reported with generated tokens.

use candle_core::Tensor;
use rand::Rng;

use super::super::forward::ModelError;
use super::super::grammar::{Constraint, GrammarError};

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

/// Sampled acceptance (recursive rejection for deterministic drafts).
pub(super) fn walk_sampled(
    tokens: &[u32],
    parents: &[i32],
    logits: &Tensor,
    sampling: &Sampling,
    rng: &mut impl Rng,
) -> Result<(Vec<usize>, u32), ModelError> {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    loop {
        let row: Vec<f32> = logits.get(cur)?.to_vec1()?;
        let mut p = sampling.distribution(&row);
        match try_children(tokens, parents, cur, &mut p, rng) {
            Some(j) => {
                path.push(j);
                cur = j;
            }
            None => return Ok((path, sample(&p, rng))),
        }
    }
}

/// Offer node `cur`'s draft children to `p` in turn, each accepted with its
/// probability; a rejected child's token leaves `p` (the residual max(p − q, 0) for a
/// point mass q is p without it, renormalised). Returns the accepted child, or None with
/// `p` the distribution the token is then drawn from.
fn try_children(
    tokens: &[u32],
    parents: &[i32],
    cur: usize,
    p: &mut [f32],
    rng: &mut impl Rng,
) -> Option<usize> {
    for j in (cur + 1..tokens.len()).filter(|&j| parents[j] == cur as i32) {
        let x = tokens[j] as usize;
        let px = p.get(x).copied().unwrap_or(0.0);
        if px > 0.0 && rng.random::<f32>() < px {
            return Some(j);
        }
        if px > 0.0 {
            p[x] = 0.0;
            let total: f32 = p.iter().sum();
            if total <= 0.0 {
                break;
            }
            p.iter_mut().for_each(|v| *v /= total);
        }
    }
    None
}

/// Acceptance under a grammar, greedy or sampled: at each node the row's logits are
/// masked to what the grammar allows after the path so far, then the choice is made as
/// plain constrained decoding makes it (the masked argmax, or a draw from the masked
/// distribution, with the same acceptance rules as [`walk_greedy`] and
/// [`walk_sampled`]). Every token taken, the bonus included, advances `constraint`.
pub(super) fn walk_constrained(
    tokens: &[u32],
    parents: &[i32],
    logits: &Tensor,
    sampling: &Sampling,
    rng: &mut impl Rng,
    constraint: &mut Constraint,
) -> Result<Result<(Vec<usize>, u32), GrammarError>, ModelError> {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    loop {
        let mut row: Vec<f32> = logits.get(cur)?.to_vec1()?;
        if let Err(e) = constraint.mask_logits(&mut row) {
            return Ok(Err(e));
        }
        if !row.iter().any(|x| x.is_finite()) {
            return Ok(Err(GrammarError::Failed(
                "the grammar allows no token here".into(),
            )));
        }
        let (next, chosen) = if sampling.temperature <= 0.0 {
            let want = super::super::forward::argmax(&row);
            let next =
                (cur + 1..tokens.len()).find(|&j| parents[j] == cur as i32 && tokens[j] == want);
            (next, want)
        } else {
            let mut p = sampling.distribution(&row);
            match try_children(tokens, parents, cur, &mut p, rng) {
                Some(j) => (Some(j), tokens[j]),
                None => (None, sample(&p, rng)),
            }
        };
        if let Err(e) = constraint.advance(chosen) {
            return Ok(Err(e));
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

/// A draw from `p` (a distribution that sums to 1).
pub(super) fn sample(p: &[f32], rng: &mut impl Rng) -> u32 {
    let r: f32 = rng.random();
    let mut acc = 0.0;
    for (i, &x) in p.iter().enumerate() {
        acc += x;
        if r < acc {
            return i as u32;
        }
    }
    // Rounding left r above the total: the last token with mass.
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
    use rand::SeedableRng;

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
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let n = 200_000;
            let mut hist = vec![0u64; logits.len()];
            for _ in 0..n {
                let (path, bonus) =
                    walk_sampled(&tokens, &parents, &t, &sampling, &mut rng).unwrap();
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
        use crate::model::grammar::GrammarSpec;
        let Some((compiler, tok)) = crate::model::grammar::tests::smollm2() else {
            return;
        };
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
            let mut rng = rand::rngs::StdRng::seed_from_u64(11);
            let n = 20_000;
            let mut hist = std::collections::HashMap::<u32, u64>::new();
            for _ in 0..n {
                let mut c = grammar.start();
                let (path, bonus) =
                    walk_constrained(&tokens, &parents, &t, &sampling, &mut rng, &mut c)
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
