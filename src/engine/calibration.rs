//! Calibration of draft probabilities against what the model accepts, per draft source.

use crate::speculate::{Draft, DraftSource};

/// How far the draft's token probabilities are from the truth, per draft source (the
/// request's own text, the global tree, both): a copy from the prompt and a guess from
/// other requests' answers are right at very different rates, and the recent past
/// predicts the next step best.
///
/// The correction is per token, not per draft. Each node's probability given its parent
/// (a count ratio, often 1 from a single sighting) is scaled by the source's factor q,
/// so a node's worth is the product of the corrected ratios along its path. A scale on
/// the draft's SCORE instead treats the 24th token of a once-seen path like the first:
/// on open chat, 24-token copies of a phrase from the prompt were verified at 3.8 times
/// the cost of a plain step for 0.4 accepted tokens, while SCORE × factor still promised
/// several. With a per-token q of 0.3 the same draft is worth 0.4, as observed.
///
/// q is learned level by level along the accepted path: at each level the model's token
/// was expected among the node's draft children with their summed (uncorrected)
/// probability, and it was or was not there.
///
/// q is kept per source and per band of the pattern length the draft grew from
/// ([`Draft::match_len`]): a draft found from one or two matched tokens is a guess, one
/// from a 30-token match is a copy, and their counts mean different things. Measured on
/// `tools/e2e-bench`'s agentic workload with one q per source, the first token of
/// request-tree drafts grown from a 1-token pattern was accepted 45% of the time where
/// the corrected counts said 70%, and from 8 to 24 tokens 95–100% where they said
/// 86–94%: one factor overrated the guesses and underrated the copies.
///
/// A draft model's tokens ([`DraftSource::Model`]) are calibrated differently: their
/// probability is the draft model's own confidence, and how often the target agrees at
/// a given confidence is what matters. A 135M model drafting for itself in f32 is often
/// only 40% sure of the token the target then takes 97% of the time, and no single
/// factor maps both its sure and its unsure tokens. So the acceptance rate is learned
/// per confidence band ([`Calibration::model_rate`]).
#[derive(Clone, Debug)]
pub(super) struct Calibration {
    /// Per [`DraftSource`] and pattern-length band: moving averages of the expected and
    /// the realised levels accepted per verified draft.
    buckets: [[(f64, f64); BANDS]; SOURCES],
    /// Per band of a draft model's confidence in its token (tenths): the moving
    /// average of how often the target accepted such a token, and the tokens seen.
    model: [(f64, f64); MODEL_BANDS],
    /// The same over every band: how often the target accepts a draft model's token.
    model_all: (f64, f64),
}

/// How many [`DraftSource`]s there are, each with buckets of its own.
const SOURCES: usize = 7;

/// Bands of a draft model's confidence: tenths.
const MODEL_BANDS: usize = 10;

/// Pattern-length bands: 1, 2, 3–4, 5–8, 9–16, 17 and more (0, no pattern, goes with 1).
const BANDS: usize = 6;

impl Default for Calibration {
    fn default() -> Self {
        // Start by trusting the counts, with the weight of a few steps.
        Calibration {
            buckets: [[(1.0, 1.0); BANDS]; SOURCES],
            // Until observed, a band is trusted at its confidence (its middle).
            model: std::array::from_fn(|i| ((i as f64 + 0.5) / MODEL_BANDS as f64, 0.0)),
            // A draft model of the same family agrees with its target most of the time:
            // trusted so until observed.
            model_all: (0.8, 0.0),
        }
    }
}

impl Calibration {
    /// Weight of the newest verified draft in the moving averages.
    const RATE: f64 = 0.15;
    /// Weight of the newest verified token in a draft model's confidence bands.
    const MODEL_RATE: f64 = 0.05;
    /// How fast an unused source drifts back to trusting its counts, per refused draft.
    /// Slow: on open chat each drift back to trust buys a failed verification, while a
    /// source that turned good again is found within a few hundred steps.
    const DRIFT: f64 = 0.01;

    /// The bucket of drafts of `source` grown from a `match_len`-token pattern.
    fn bucket(&self, source: DraftSource, match_len: usize) -> &(f64, f64) {
        &self.buckets[Self::source_index(source)][Self::band(match_len)]
    }

    fn bucket_mut(&mut self, source: DraftSource, match_len: usize) -> &mut (f64, f64) {
        &mut self.buckets[Self::source_index(source)][Self::band(match_len)]
    }

    fn source_index(source: DraftSource) -> usize {
        match source {
            DraftSource::None => 0,
            DraftSource::Request => 1,
            DraftSource::Global => 2,
            DraftSource::Both => 3,
            DraftSource::Grammar => 4,
            DraftSource::Model => 5,
            DraftSource::Prediction => 6,
        }
    }

    /// The band of a pattern length: doubling widths, so a copy's long match and a
    /// guess's short one never share a factor.
    fn band(match_len: usize) -> usize {
        match match_len {
            0..=1 => 0,
            2 => 1,
            3..=4 => 2,
            5..=8 => 3,
            9..=16 => 4,
            _ => 5,
        }
    }

    /// The factor q on each token's conditional probability, for drafts of `source`
    /// grown from a `match_len`-token pattern.
    pub(super) fn factor(&self, source: DraftSource, match_len: usize) -> f64 {
        let &(expected, observed) = self.bucket(source, match_len);
        (observed / expected.max(1e-6)).clamp(0.02, 1.5)
    }

    /// How often the target accepts a draft model's token of confidence `p`, as lately
    /// observed.
    pub(super) fn model_rate(&self, p: f64) -> f64 {
        self.model[Self::model_band(p)].0
    }

    /// How often the target accepts a draft model's token, whatever its confidence: the
    /// best guess at a token not drafted yet.
    pub(super) fn model_mean_rate(&self) -> f64 {
        self.model_all.0
    }

    fn model_band(p: f64) -> usize {
        ((p * MODEL_BANDS as f64) as usize).min(MODEL_BANDS - 1)
    }

    /// Each node's expected worth: the product of its path's conditional probabilities,
    /// each times q and at most 1 (for a draft model's tokens: each the acceptance rate
    /// of its confidence band).
    pub(super) fn values(&self, draft: &Draft) -> Vec<f64> {
        let q = self.factor(draft.source, draft.match_len);
        let worth = |p: f64| match draft.source {
            DraftSource::Model => self.model_rate(p),
            _ => (q * p).min(1.0),
        };
        let mut values: Vec<f64> = Vec::with_capacity(draft.len());
        for (i, &parent) in draft.parents.iter().enumerate() {
            let parent_value = usize::try_from(parent).map_or(1.0, |p| values[p]);
            values.push(parent_value * worth(given_parent(draft, i)));
        }
        values
    }

    /// A draft was not worth verifying: with no new evidence, its bucket drifts back
    /// towards trusting the counts, so that one bad stretch does not stop drafting for
    /// good.
    pub(super) fn refused(&mut self, draft: &Draft) {
        let b = self.bucket_mut(draft.source, draft.match_len);
        b.1 += Self::DRIFT * (b.0 - b.1).max(0.0);
    }

    /// The draft model was not asked to draft: with no new evidence, its overall
    /// acceptance drifts back towards trust, as [`Calibration::refused`] does for the
    /// trees.
    pub(super) fn model_refused(&mut self) {
        let rate = &mut self.model_all.0;
        *rate += Self::DRIFT * (1.0 - *rate).max(0.0);
    }

    /// Learn from a verified draft and the draft nodes the model accepted, in order.
    pub(super) fn observe(&mut self, draft: &Draft, accepted: &[usize]) {
        if draft.source == DraftSource::Model {
            // A linear draft: its accepted tokens, then the first rejected one.
            let tried = (accepted.len() + 1).min(draft.len());
            for i in 0..tried {
                let band = Self::model_band(given_parent(draft, i));
                let outcome = if i < accepted.len() { 1.0 } else { 0.0 };
                for (rate, seen) in [&mut self.model[band], &mut self.model_all] {
                    // The first tokens count fully, so that the average starts from data.
                    *seen += 1.0;
                    *rate += (1.0 / *seen).max(Self::MODEL_RATE) * (outcome - *rate);
                }
            }
            return;
        }
        let (expected, observed) = level_trials(draft, accepted);
        if expected <= 0.0 {
            return;
        }
        let b = self.bucket_mut(draft.source, draft.match_len);
        b.0 += Self::RATE * (expected - b.0);
        b.1 += Self::RATE * (observed - b.1);
    }
}

/// Draft node `i`'s probability given its parent (the context for a root child), at
/// most 1.
fn given_parent(draft: &Draft, i: usize) -> f64 {
    let parent_prob = usize::try_from(draft.parents[i]).map_or(1.0, |p| f64::from(draft.probs[p]));
    (f64::from(draft.probs[i]) / parent_prob.max(1e-9)).min(1.0)
}

/// The levels of a verified draft, walked along its accepted path: at each level the
/// model's token was expected among the current node's children with the sum of their
/// probabilities given that node, and found there (1) or not (0). Returns the expected
/// and the realised number of levels accepted.
fn level_trials(draft: &Draft, accepted: &[usize]) -> (f64, f64) {
    let mut expected = 0.0;
    let mut node = -1i32;
    let mut level = 0;
    loop {
        let children: f64 = (0..draft.len())
            .filter(|&i| draft.parents[i] == node)
            .map(|i| given_parent(draft, i))
            .sum();
        if children == 0.0 {
            break;
        }
        expected += children.min(1.0);
        match accepted.get(level) {
            Some(&next) => node = next as i32,
            None => break,
        }
        level += 1;
    }
    (expected, accepted.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cost::CostCurve;

    fn copy_draft(len: usize) -> Draft {
        Draft {
            tokens: (0..len as u32).collect(),
            parents: (-1..len as i32 - 1).collect(),
            probs: vec![1.0; len],
            score: len as f32,
            match_len: 3,
            source: DraftSource::Request,
        }
    }

    #[test]
    fn levels_count_every_child_tried_along_the_accepted_path() {
        // a (0.6) and b (0.3) under the context; c under a, as likely as a.
        let draft = Draft {
            tokens: vec![1, 2, 3],
            parents: vec![-1, -1, 0],
            probs: vec![0.6, 0.3, 0.6],
            score: 1.5,
            match_len: 1,
            source: DraftSource::Global,
        };
        // a accepted, then c rejected: 0.9 expected at the first level, 1 at the second.
        let (expected, observed) = level_trials(&draft, &[0]);
        assert!((expected - 1.9).abs() < 1e-6, "{expected}");
        assert_eq!(observed, 1.0);
        let (expected, observed) = level_trials(&draft, &[0, 2]);
        assert!((expected - 1.9).abs() < 1e-6 && observed == 2.0);
        let (expected, observed) = level_trials(&draft, &[]);
        assert!((expected - 0.9).abs() < 1e-6 && observed == 0.0);
    }

    #[test]
    fn long_copies_that_fail_stop_being_verified_and_copies_that_hold_go_on() {
        // f32 on this CPU: two rows cost 1.8 single steps, 25 rows 4.55.
        let curve = CostCurve::new(
            vec![(1, 1.0), (2, 1.8), (4, 2.0), (8, 2.4), (16, 3.2), (32, 5.6)],
            0.0,
        );
        let copy = copy_draft(24);
        let mut chat = Calibration::default();
        for step in 0..60 {
            // Open chat: a third of the copies get their first token accepted.
            let accepted: &[usize] = if step % 3 == 0 { &[0] } else { &[] };
            chat.observe(&copy, accepted);
        }
        let q = chat.factor(DraftSource::Request, copy.match_len);
        assert!((0.15..0.4).contains(&q), "{q}");
        let values = chat.values(&copy);
        assert!(values.iter().sum::<f64>() < 0.5, "{values:?}");
        assert_eq!(curve.best_cut(1, &[values]), vec![0]);
        let mut agentic = Calibration::default();
        let all: Vec<usize> = (0..24).collect();
        for _ in 0..60 {
            agentic.observe(&copy, &all);
        }
        assert_eq!(curve.best_cut(1, &[agentic.values(&copy)]), vec![24]);
        // Refusals drift back towards trust, slowly.
        let before = chat.factor(DraftSource::Request, copy.match_len);
        for _ in 0..10 {
            chat.refused(&copy);
        }
        let after = chat.factor(DraftSource::Request, copy.match_len);
        assert!(
            after > before && after < before + 0.2,
            "{before} -> {after}"
        );
    }

    #[test]
    fn guesses_and_copies_of_one_source_learn_apart() {
        let mut calibration = Calibration::default();
        let mut guess = copy_draft(4);
        guess.match_len = 1;
        let mut copy = copy_draft(16);
        copy.match_len = 40;
        for _ in 0..60 {
            // Guesses from a one-token pattern fail at their first token; long copies hold.
            calibration.observe(&guess, &[]);
            calibration.observe(&copy, &(0..16).collect::<Vec<_>>());
        }
        let guessed = calibration.factor(DraftSource::Request, 1);
        let copied = calibration.factor(DraftSource::Request, 40);
        assert!(guessed < 0.1, "{guessed}");
        assert!(copied > 0.95, "{copied}");
        // Patterns of 17 tokens and more share the copies' band; 2 tokens has its own.
        assert_eq!(calibration.factor(DraftSource::Request, 17), copied);
        assert_eq!(calibration.factor(DraftSource::Request, 2), 1.0);
        // Another source learnt nothing.
        assert_eq!(calibration.factor(DraftSource::Global, 1), 1.0);
    }
}
