//! The last stage of a step: what the model agreed with is kept. Per sequence, a
//! prefill chunk is kept; a verified draft is walked by the sequence's rule, what it
//! accepted recorded, and the answer extended up to its end.

use std::time::Instant;

use candle_core::Tensor;

use super::grammar::Constraint;
use super::sampling::{Adjustments, walk_adjusted, walk_greedy, walk_sampled};
use super::{Engine, FinishReason, Pass, Plan, Sequence, StepReport, TokenLogprob};
use crate::engine::Drafter;
use crate::model::forward::ModelError;
use crate::speculate::{Draft, DraftSource};

impl Engine {
    /// Accept what the model agreed with: commit the accepted path to each cache, hand
    /// out the new tokens and the bonus token, and finish the sequences that are done.
    /// In stages, per sequence: a prefill chunk is kept ([`Self::keep_prefill`]); a draft
    /// is walked by the sequence's rule ([`Self::walk`]), what it accepted is recorded
    /// ([`Self::record`]), and the answer grows up to its end ([`Self::extend_answer`]).
    pub(super) fn accept(
        &mut self,
        batch: &mut [(&mut Sequence, &mut dyn Drafter)],
        plans: Vec<Plan>,
        pass: Pass,
        report: &mut StepReport,
    ) -> Result<(), ModelError> {
        let greedy_rows = if batch.iter().zip(&plans).any(|((s, _), p)| {
            matches!(p, Plan::Verify { .. })
                && s.opts.sampling.temperature <= 0.0
                && s.constraint.is_none()
                && s.seen.is_none()
        }) {
            // Its ids come back to the host: the pass is done.
            self.model.argmax_rows(&pass.logits)?
        } else {
            pass.logits.device().synchronize()?;
            Vec::new()
        };
        self.observe_pass(&pass, report);
        let mut row = 0;
        for ((seq, drafter), plan) in batch.iter_mut().zip(plans) {
            let (draft, tokens, parents) = match plan {
                Plan::Idle => continue,
                Plan::Prefill { tokens, .. } => {
                    self.keep_prefill(seq, tokens.len())?;
                    continue;
                }
                Plan::Verify {
                    draft,
                    tokens,
                    parents,
                } => (draft, tokens, parents),
            };
            let rows = row..row + tokens.len();
            row = rows.end;
            if seq.decode_start.is_none() {
                seq.decode_start = Some(Instant::now());
            }
            let Some((path, bonus)) = Self::walk(
                seq,
                &tokens,
                &parents,
                &pass.logits,
                rows.clone(),
                &greedy_rows,
            )?
            else {
                continue;
            };
            seq.cache.commit(&path)?;
            let mut new = self.record(seq, &mut **drafter, &draft, &tokens, &path, report);
            new.push(bonus);
            seq.pending = bonus;
            self.extend_answer(seq, new, &path, &pass.logits, rows.start)?;
        }
        Ok(())
    }

    /// Keep a prefill chunk of `len` tokens. A prompt whose prefill completes is offered
    /// to the prefix cache now, not only at the end, so that a request of the same stage
    /// arriving meanwhile reuses it.
    fn keep_prefill(&mut self, seq: &mut Sequence, len: usize) -> Result<(), ModelError> {
        seq.cache.commit(&(0..len).collect::<Vec<_>>())?;
        seq.prefilled += len;
        if !seq.in_prefill() {
            self.prefix.insert(
                &seq.opts.namespace,
                &seq.context[..seq.prefilled],
                &seq.cache,
            );
            seq.prefill_s = seq.started.elapsed().as_secs_f64();
            seq.decode_start = Some(Instant::now());
        }
        Ok(())
    }

    /// The accepted path through one sequence's verified rows (`rows` of `logits`:
    /// indices into `tokens`, from the pending token) and the bonus token after it, by
    /// the sequence's rule: greedy (from `greedy_rows`, the pass's argmaxes), sampled, or
    /// under its grammar. `None` when its grammar could not go on (a schema past the
    /// engine's limits): the request then ends with the reason, and the batch goes on.
    fn walk(
        seq: &mut Sequence,
        tokens: &[u32],
        parents: &[i32],
        logits: &Tensor,
        rows: std::ops::Range<usize>,
        greedy_rows: &[u32],
    ) -> Result<Option<(Vec<usize>, u32)>, ModelError> {
        let sampling = seq.opts.sampling;
        if seq.constraint.is_some() || seq.seen.is_some() {
            let own = logits.narrow(0, rows.start, rows.len())?;
            let adjust = Adjustments {
                penalties: seq.seen.clone().map(|seen| (&seq.opts.penalties, seen)),
                constraint: seq.constraint.as_mut(),
            };
            let walked = walk_adjusted(
                tokens,
                parents,
                &own,
                &sampling,
                &seq.draws,
                seq.out.len(),
                adjust,
            )?;
            return match walked {
                Ok(walk) => Ok(Some(walk)),
                Err(e) => {
                    seq.cache.commit(&[0])?;
                    seq.grammar_failure = Some(e.to_string());
                    seq.finish = Some(FinishReason::Stop);
                    Ok(None)
                }
            };
        }
        if sampling.temperature <= 0.0 {
            return Ok(Some(walk_greedy(tokens, parents, &greedy_rows[rows])));
        }
        let own = logits.narrow(0, rows.start, rows.len())?;
        let walked = walk_sampled(tokens, parents, &own, &sampling, &seq.draws, seq.out.len())?;
        Ok(Some(walked))
    }

    /// Record what a verified step accepted: the sequence's and the report's counts per
    /// draft source, the calibration, the draft model's and the drafter's view. Returns
    /// the accepted draft tokens (`path` after the pending token).
    fn record(
        &mut self,
        seq: &mut Sequence,
        drafter: &mut dyn Drafter,
        draft: &Draft,
        tokens: &[u32],
        path: &[usize],
        report: &mut StepReport,
    ) -> Vec<u32> {
        let accepted = path.len() - 1;
        report.accepted.push(accepted);
        seq.sources.record(draft.source, draft.len(), accepted);
        report.sources.record(draft.source, draft.len(), accepted);
        if draft.source == DraftSource::Model
            && let Some(state) = seq.draft.as_mut()
        {
            state.accepted(accepted);
        }
        seq.steps += 1;
        seq.drafted += draft.len();
        seq.accepted += accepted;
        seq.verify_cost += self.cost.cost(draft.len() + 1);
        let new: Vec<u32> = path[1..].iter().map(|&i| tokens[i]).collect();
        if !draft.is_empty() {
            let accepted_nodes: Vec<usize> = path[1..].iter().map(|&i| i - 1).collect();
            self.calibration.observe(draft, &accepted_nodes);
            // The context with the accepted tokens, borrowed for the call: a copy
            // would cost the whole context (up to the model's length) every step.
            let before = seq.context.len();
            seq.context.extend_from_slice(&new);
            drafter.accepted(&seq.context, draft, accepted);
            seq.context.truncate(before);
        }
        new
    }

    /// Add `new` (the accepted tokens, then the bonus) to the answer, up to its end: an
    /// end-of-sequence token, `max_tokens`, a stop string, a repeat, or a finished
    /// grammar. Token m's log-probabilities come from the row of path node m (from
    /// `first_row` of `logits`), which predicted it.
    fn extend_answer(
        &self,
        seq: &mut Sequence,
        mut new: Vec<u32>,
        path: &[usize],
        logits: &Tensor,
        first_row: usize,
    ) -> Result<(), ModelError> {
        let mut stop = false;
        if let Some(i) = new.iter().position(|t| self.eos.contains(t)) {
            new.truncate(i);
            stop = true;
        }
        new.truncate(seq.opts.max_tokens - seq.out.len());
        if let Some(top) = seq.opts.logprobs {
            // Token m of `new` was predicted by path node m's row.
            for (&token, &node) in new.iter().zip(path) {
                let row: Vec<f32> = logits.get(first_row + node)?.to_vec1()?;
                seq.logprobs
                    .push(TokenLogprob::from_logits(&row, token, top));
            }
        }
        seq.out.extend_from_slice(&new);
        seq.context.extend_from_slice(&new);
        if let Some(seen) = seq.seen.as_mut() {
            new.iter().for_each(|&token| seen.add(token));
        }
        if let Err(e) = seq.text.update(&self.tokenizer, &seq.out) {
            // The ids come from the model's own vocabulary: a bug, not bad input.
            tracing::error!("{e} ({} generated ids)", seq.out.len());
        }
        if let Some(at) = Self::stop_at(&seq.text, &seq.opts.stop) {
            seq.cut_text_at(at);
            stop = true;
        }
        if let Some(at) = seq
            .opts
            .stop_on_repeat
            .as_ref()
            .and_then(|d| d.repeat_at(seq.text.text()))
        {
            seq.cut_text_at(at);
            stop = true;
        }
        // A complete grammar allows nothing but the end: no need for a step to say so.
        if seq.constraint.as_ref().is_some_and(Constraint::is_finished) {
            stop = true;
        }
        if !stop
            && seq.out.len() >= seq.opts.max_tokens
            && let Some(cut) = seq
                .opts
                .stop_on_repeat
                .as_ref()
                .and_then(|d| d.unfinished_repeat_at(seq.text.text()))
        {
            // Cut off while repeating a block: the repeat is dropped, as a complete
            // one would be, and the answer is what came before it.
            seq.cut_text_at(cut);
            stop = true;
        }
        if stop {
            seq.finish = Some(FinishReason::Stop);
        } else if seq.out.len() >= seq.opts.max_tokens {
            seq.finish = Some(FinishReason::Length);
        }
        Ok(())
    }
}
