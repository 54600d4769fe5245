//! What every answer says about its generations, streamed or not: finish reasons, usage,
//! speculation figures, log-probabilities and the time it was made.

use serde_json::json;

use crate::engine::{Generation, SourceCounts, TokenLogprob};
use crate::serve::AppState;

use super::thinking::Thinking;
use super::tools;
use super::wire::{
    ChatTokenLogprob, CompletionTokensDetails, Logprobs, PromptTokensDetails, SpecStats,
    TopLogprob, Usage,
};

pub(super) fn finish(g: &Generation) -> &'static str {
    match g.finish_reason {
        crate::engine::FinishReason::Length => "length",
        _ => "stop",
    }
}

/// A chat answer's `finish_reason`: `length` whenever `max_tokens` (or the context) cut
/// it, as OpenAI says, even within a call; else `tool_calls` when it made calls.
pub(super) fn chat_finish(g: &Generation, calls: &[tools::ToolCall]) -> &'static str {
    match finish(g) {
        "stop" if !calls.is_empty() => "tool_calls",
        other => other,
    }
}

/// The usage of a request's choices, `per_prompt` for each prompt: each prompt once
/// (and its cached part, its first choice's), the completions summed, and of those the
/// thoughts of a thinking model (`thinking`).
pub(super) fn usage_of(
    app: &AppState,
    gs: &[Generation],
    per_prompt: usize,
    thinking: Option<Thinking>,
) -> Usage {
    let firsts = || gs.chunks(per_prompt.max(1)).map(|c| &c[0]);
    let prompt: usize = firsts().map(|g| g.prompt_tokens).sum();
    let cached: usize = firsts().map(|g| g.cached_prompt_tokens).sum();
    let completion: usize = gs.iter().map(|g| g.tokens.len()).sum();
    let predicted = |f: fn(&SourceCounts) -> usize| -> usize {
        gs.iter().map(|g| f(&g.sources.prediction)).sum()
    };
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: cached,
        },
        completion_tokens_details: CompletionTokensDetails {
            reasoning_tokens: gs.iter().map(|g| reasoning_tokens(app, g, thinking)).sum(),
            accepted_prediction_tokens: predicted(|c| c.accepted),
            rejected_prediction_tokens: predicted(|c| c.drafted.saturating_sub(c.accepted)),
        },
    }
}

/// How many of generation `g`'s tokens are a thinking model's thoughts (`thinking`):
/// those it takes to reach the answer's start (0 without thoughts).
pub(super) fn reasoning_tokens(
    app: &AppState,
    g: &Generation,
    thinking: Option<Thinking>,
) -> usize {
    thinking.map_or(0, |t| {
        // The answer is the text's end: the thoughts end where it starts.
        let thoughts_end = g.text.len() - t.split(&g.text).answer.len();
        tokens_within(app, &g.tokens, thoughts_end)
    })
}

/// How many of `tokens` it takes for their text to reach byte `bytes`: the fewest whose
/// text is at least that long (a binary search over decoded prefixes).
fn tokens_within(app: &AppState, tokens: &[u32], bytes: usize) -> usize {
    let (mut low, mut high) = (0, tokens.len());
    while low < high {
        let mid = (low + high) / 2;
        let len = app
            .tokenizer
            .decode(&tokens[..mid], true)
            .map_or(usize::MAX, |t| t.len());
        if len >= bytes {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// Speculation figures over a request's choices: steps and tokens summed, tokens per
/// second of decoding the mean of the choices'.
pub(super) fn spec_stats_of(gs: &[Generation]) -> SpecStats {
    let sum = |f: fn(&Generation) -> usize| gs.iter().map(f).sum::<usize>();
    let rate = gs.iter().map(|g| g.tokens_per_s).sum::<f64>() / gs.len().max(1) as f64;
    let mut sources = crate::engine::DraftSources::default();
    gs.iter().for_each(|g| sources.add(&g.sources));
    SpecStats {
        steps: sum(|g| g.steps),
        drafted_tokens: sum(|g| g.drafted_tokens),
        accepted_tokens: sum(|g| g.accepted_tokens),
        tokens_per_s: rate,
        draft_sources: sources,
    }
}

/// A token as text, and its UTF-8 bytes; the bytes are null when the token is part of
/// a character (its text alone is not valid UTF-8).
fn token_text(app: &AppState, token: u32) -> (String, Option<Vec<u8>>) {
    let text = app.tokenizer.decode(&[token], false).unwrap_or_default();
    let bytes = (!text.contains('\u{fffd}')).then(|| text.as_bytes().to_vec());
    (text, bytes)
}

/// A choice's `logprobs` in OpenAI's form: chat's `{"content": [...]}`, or the legacy
/// completion arrays, whose `text_offset` counts bytes from `*offset` (the text before
/// these tokens), which moves past them.
pub(super) fn logprobs_of(
    app: &AppState,
    logprobs: &[TokenLogprob],
    chat: bool,
    offset: &mut usize,
) -> Logprobs {
    if chat {
        let content = logprobs
            .iter()
            .map(|lp| {
                let (token, bytes) = token_text(app, lp.token);
                *offset += token.len();
                let top_logprobs = lp
                    .top
                    .iter()
                    .map(|&(t, logprob)| {
                        let (token, bytes) = token_text(app, t);
                        TopLogprob {
                            token,
                            logprob,
                            bytes,
                        }
                    })
                    .collect();
                ChatTokenLogprob {
                    token,
                    logprob: lp.logprob,
                    bytes,
                    top_logprobs,
                }
            })
            .collect();
        return Logprobs::Chat { content };
    }
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for lp in logprobs {
        let (token, _) = token_text(app, lp.token);
        text_offset.push(*offset);
        *offset += token.len();
        tokens.push(token);
        token_logprobs.push(lp.logprob);
        let top: serde_json::Map<String, serde_json::Value> = lp
            .top
            .iter()
            .map(|&(t, l)| (token_text(app, t).0, json!(l)))
            .collect();
        top_logprobs.push(top);
    }
    Logprobs::Completion {
        tokens,
        token_logprobs,
        top_logprobs,
        text_offset,
    }
}

/// Seconds since the Unix epoch: an answer's `created`.
pub(super) fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
