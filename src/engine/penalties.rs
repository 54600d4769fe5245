//! What a request may ask to change in the model's logits before a token is chosen:
//! OpenAI's `logit_bias`, `presence_penalty` and `frequency_penalty`, and the
//! `repetition_penalty` of vLLM, SGLang and Hugging Face.
//!
//! The penalties depend on the tokens before the one being chosen, so verification
//! applies them node by node along the path it walks ([`super::sampling::walk_adjusted`]):
//! a node's row is adjusted for the answer so far plus the path's tokens above it, which
//! is exactly what plain decoding would have adjusted it for. The answer is the same with
//! and without speculation.

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::Arc;

/// The values `presence` and `frequency` may take (OpenAI's range).
pub const ADDITIVE_PENALTY_RANGE: RangeInclusive<f32> = -2.0..=2.0;

/// The values `repetition` may take: vLLM takes any above 0, but dividing a logit by
/// 1e-38 overflows f32 and leaves the distribution NaN.
pub const REPETITION_PENALTY_RANGE: RangeInclusive<f32> = 0.01..=10.0;

/// The values one token's bias may take (OpenAI's range).
pub const LOGIT_BIAS_RANGE: RangeInclusive<f32> = -100.0..=100.0;

/// The adjustments one request asks for; the default changes nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// Subtracted once from the logit of every token the answer already holds.
    pub presence: f32,
    /// Subtracted from a token's logit once for each time the answer holds it.
    pub frequency: f32,
    /// Divides a positive logit and multiplies a negative one, for every token of the
    /// prompt or the answer (1: none), as Hugging Face's and vLLM's do.
    pub repetition: f32,
    /// Added to the logits of these tokens, whatever came before.
    pub bias: Vec<(u32, f32)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties {
            presence: 0.0,
            frequency: 0.0,
            repetition: 1.0,
            bias: Vec::new(),
        }
    }
}

impl Penalties {
    /// True when they change no logit: the engine then takes its plain paths.
    pub fn is_none(&self) -> bool {
        self.presence == 0.0
            && self.frequency == 0.0
            && self.repetition == 1.0
            && self.bias.iter().all(|&(_, b)| b == 0.0)
    }

    /// What they depend on, at the start of an answer to `prompt`: the prompt's tokens
    /// are kept only for the repetition penalty, which is the one that reads them.
    pub(super) fn seen_for(&self, prompt: &[u32]) -> Seen {
        Seen {
            prompt: Arc::new(if self.repetition != 1.0 {
                prompt.iter().copied().collect()
            } else {
                HashSet::new()
            }),
            answer: HashMap::new(),
        }
    }

    /// Adjust one row of logits, the model's prediction after the prompt and the answer
    /// `seen` holds: the bias, then the repetition penalty, then the presence and
    /// frequency penalties (vLLM's order). Tokens outside the row are ignored.
    pub(super) fn apply(&self, row: &mut [f32], seen: &Seen) {
        for &(token, bias) in &self.bias {
            if let Some(logit) = row.get_mut(token as usize) {
                *logit += bias;
            }
        }
        if self.repetition != 1.0 {
            let repeated = seen.prompt.iter().chain(
                seen.answer
                    .keys()
                    .filter(|token| !seen.prompt.contains(token)),
            );
            for &token in repeated {
                if let Some(logit) = row.get_mut(token as usize) {
                    *logit = if *logit > 0.0 {
                        *logit / self.repetition
                    } else {
                        *logit * self.repetition
                    };
                }
            }
        }
        if self.presence != 0.0 || self.frequency != 0.0 {
            for (&token, &count) in &seen.answer {
                if let Some(logit) = row.get_mut(token as usize) {
                    *logit -= self.presence + self.frequency * count as f32;
                }
            }
        }
    }
}

/// The tokens the penalties read: the prompt's (for the repetition penalty only) and
/// how often the answer holds each of its tokens. Each step's walk takes a copy, which
/// shares the prompt's.
#[derive(Clone, Debug, Default)]
pub(super) struct Seen {
    prompt: Arc<HashSet<u32>>,
    answer: HashMap<u32, u32>,
}

impl Seen {
    /// The answer goes on with `token`.
    pub(super) fn add(&mut self, token: u32) {
        *self.answer.entry(token).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(penalties: &Penalties, prompt: &[u32], answer: &[u32]) -> Seen {
        let mut seen = penalties.seen_for(prompt);
        answer.iter().for_each(|&t| seen.add(t));
        seen
    }

    #[test]
    fn the_default_changes_nothing() {
        let none = Penalties::default();
        assert!(none.is_none());
        let mut row = vec![1.0, -2.0, 3.0];
        none.apply(&mut row, &seen(&none, &[0, 1], &[2, 2]));
        assert_eq!(row, vec![1.0, -2.0, 3.0]);
        let zero_bias = Penalties {
            bias: vec![(1, 0.0)],
            ..Penalties::default()
        };
        assert!(zero_bias.is_none());
    }

    #[test]
    fn frequency_counts_and_presence_does_not() {
        let p = Penalties {
            presence: 0.5,
            frequency: 0.25,
            ..Penalties::default()
        };
        assert!(!p.is_none());
        let mut row = vec![1.0; 4];
        // Token 2 three times, token 0 once; the prompt's token 3 is not the answer's.
        p.apply(&mut row, &seen(&p, &[3], &[2, 0, 2, 2]));
        assert_eq!(row, vec![1.0 - 0.75, 1.0, 1.0 - 1.25, 1.0]);
    }

    #[test]
    fn repetition_shrinks_toward_zero_from_both_sides_over_prompt_and_answer() {
        let p = Penalties {
            repetition: 2.0,
            ..Penalties::default()
        };
        let mut row = vec![4.0, -4.0, 4.0, 4.0];
        // Token 0 in the prompt, 1 in both, 2 twice in the answer: each penalised once.
        p.apply(&mut row, &seen(&p, &[0, 1], &[1, 2, 2]));
        assert_eq!(row, vec![2.0, -8.0, 2.0, 4.0]);
    }

    #[test]
    fn bias_comes_first_and_ignores_tokens_outside_the_row() {
        let p = Penalties {
            repetition: 2.0,
            bias: vec![(0, -6.0), (9, 100.0)],
            ..Penalties::default()
        };
        let mut row = vec![4.0, 1.0];
        // 4 − 6 = −2, then the repetition penalty makes it −4 (it acts on the biased logit).
        p.apply(&mut row, &seen(&p, &[0], &[]));
        assert_eq!(row, vec![-4.0, 1.0]);
    }
}
