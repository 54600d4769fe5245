//! Streamed answers: Server-Sent Events in OpenAI's chunk format, text as it is decoded
//! (less what may begin a tool call), tool calls as name then argument fragments, and
//! a last chunk with the finish reason, usage and suffixd's figures.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::model::detokenizer::Detokenizer;
use crate::model::engine::{Generation, TokenLogprob};
use crate::serve::AppState;
use crate::serve::worker::{Delta, JobError};

use super::ApiError;
use super::openai::{chat_finish, finish, logprobs_json, spec_stats_of, unix_s, usage_of};
use super::tools::{self, CallStreamer};

/// How a streamed answer's tool calls go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StreamCalls {
    /// The answer makes no calls: all of it is content.
    No,
    /// Calls are read at the end and sent whole (the model wrote them freely).
    Whole,
    /// Calls are held to the call grammar: each streams as it is decoded.
    AsDecoded,
}

/// Server-Sent Events in OpenAI's chunk format, ending with `data: [DONE]`. When the
/// client goes away the stream is dropped, the token channel closes, and the model
/// thread cancels the generation at its next step.
pub(super) fn stream_response(
    app: Arc<AppState>,
    id: String,
    chat: bool,
    calls_out: StreamCalls,
    mut tokens: mpsc::UnboundedReceiver<Delta>,
    done: oneshot::Receiver<Result<Generation, JobError>>,
) -> impl IntoResponse {
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let stream = async_stream::stream! {
        let created = unix_s();
        // A chunk carries the log-probabilities of the tokens whose text it completes.
        let chunk = |delta: serde_json::Value, logprobs: serde_json::Value, finish: Option<&str>| -> Event {
            let choice = if chat {
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            } else {
                json!({"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")), "finish_reason": finish, "logprobs": logprobs})
            };
            Event::default().data(json!({"id": id, "object": object, "created": created, "model": app.model_id, "choices": [choice]}).to_string())
        };
        if chat {
            yield Ok::<Event, Infallible>(chunk(json!({"role": "assistant", "content": ""}), serde_json::Value::Null, None));
        }
        // Log-probabilities not sent yet, and the text before them (completions count
        // `text_offset` from the answer's start).
        let mut pending: Vec<TokenLogprob> = Vec::new();
        let mut logprob_offset = 0usize;
        let mut take_logprobs = |pending: &mut Vec<TokenLogprob>| -> serde_json::Value {
            if pending.is_empty() {
                return serde_json::Value::Null;
            }
            let v = logprobs_json(&app, pending, chat, &mut logprob_offset);
            pending.clear();
            v
        };
        // Decoded once per token; a character split across tokens comes out whole, with
        // the token that completes it. What was sent is `text[..sent]`.
        let mut all: Vec<u32> = Vec::new();
        let mut answer = Detokenizer::new();
        let mut sent = 0usize;
        let reads_calls = calls_out != StreamCalls::No;
        let mut streamer = CallStreamer::default();
        while let Some(delta) = tokens.recv().await {
            all.extend_from_slice(&delta.tokens);
            pending.extend(delta.logprobs);
            if let Err(e) = answer.update(&app.tokenizer, &all) {
                // The ids come from the model's own vocabulary, so this is a bug.
                tracing::error!("cannot decode the generated tokens: {e}");
                continue;
            }
            let text = answer.text();
            // When the answer may call tools, text from where a call may begin is held
            // back: calls go out as tool-call deltas, never as content.
            let end = if reads_calls { tools::streamable_len(text) } else { text.len() };
            // The detokenizer's text never ends in a cut character.
            if end > sent && text.is_char_boundary(sent) && text.is_char_boundary(end) {
                let piece = text[sent..end].to_string();
                sent = end;
                let logprobs = take_logprobs(&mut pending);
                yield Ok(chunk(json!({"content": piece}), logprobs, None));
            }
            if calls_out == StreamCalls::AsDecoded {
                let deltas = streamer.advance(text);
                if !deltas.is_empty() {
                    let logprobs = take_logprobs(&mut pending);
                    yield Ok(chunk(json!({"tool_calls": deltas}), logprobs, None));
                }
            }
        }
        match done.await {
            Ok(Ok(g)) => {
                // The content past what was sent: the answer's, with any call blocks
                // out of it (what went out is always its start).
                let (content, calls) = tools::read_answer(&g.text, reads_calls);
                let content = content.unwrap_or_default();
                let rest = if content.len() > sent && content.is_char_boundary(sent) {
                    content[sent..].to_string()
                } else {
                    String::new()
                };
                if !rest.is_empty() || (!pending.is_empty() && calls.is_empty()) {
                    let logprobs = take_logprobs(&mut pending);
                    yield Ok(chunk(json!({"content": rest}), logprobs, None));
                }
                // The rest of the calls: the last fragments of those streaming, and
                // whole the ones that did not stream.
                let mut deltas = if calls_out == StreamCalls::AsDecoded {
                    streamer.advance(&g.text)
                } else {
                    Vec::new()
                };
                deltas.extend(
                    calls
                        .iter()
                        .enumerate()
                        .skip(streamer.started())
                        .map(|(i, c)| c.to_json(Some(i))),
                );
                if !deltas.is_empty() {
                    let logprobs = take_logprobs(&mut pending);
                    yield Ok(chunk(json!({"tool_calls": deltas}), logprobs, None));
                }
                let finish_reason = chat_finish(&g, &calls);
                let choice = if chat {
                    json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason})
                } else {
                    json!({"index": 0, "text": "", "finish_reason": finish(&g), "logprobs": null})
                };
                let last = json!({"id": id, "object": object, "created": created, "model": app.model_id,
                    "choices": [choice], "usage": usage_of(std::slice::from_ref(&g), 1),
                    "suffixd": spec_stats_of(std::slice::from_ref(&g))});
                yield Ok(Event::default().data(last.to_string()));
            }
            Ok(Err(e)) => {
                app.metrics.record_error();
                let e = ApiError::from(e);
                yield Ok(Event::default().data(json!({"error": {"message": e.message, "type": e.kind}}).to_string()));
            }
            Err(_) => {}
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Sse::new(stream)
}
