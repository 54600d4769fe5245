//! Streamed answers: Server-Sent Events in OpenAI's chunk format, text as it is decoded
//! (less what may begin a tool call), tool calls as name then argument fragments, and
//! a last chunk with the finish reason, usage and suffixd's figures.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use serde_json::{Value, json};
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

/// What a choice's forwarding task hands the stream: a step's tokens, then the end.
enum Progress {
    Delta(Delta),
    Done(Result<Result<Generation, JobError>, oneshot::error::RecvError>),
}

/// One choice's token channel and answer, as the handler queued it.
pub(super) type ChoiceJob = (
    mpsc::UnboundedReceiver<Delta>,
    oneshot::Receiver<Result<Generation, JobError>>,
);

/// Server-Sent Events in OpenAI's chunk format, ending with `data: [DONE]`: each
/// choice's chunks (with its `index`) as its tokens are decoded, interleaved as the
/// model thread makes them, each choice ending with its finish reason. One choice's
/// last chunk carries `usage` and suffixd's figures; with more than one, a last chunk
/// without choices carries them for all (`per_prompt` choices for each prompt). When
/// the client goes away the stream is dropped, the token channels close, and the model
/// thread cancels the generations at their next step.
pub(super) fn stream_response(
    app: Arc<AppState>,
    id: String,
    chat: bool,
    calls_out: StreamCalls,
    choices: Vec<ChoiceJob>,
    per_prompt: usize,
) -> impl IntoResponse {
    let count = choices.len();
    let chunks = Chunks {
        object: if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        },
        app,
        id,
        chat,
        created: unix_s(),
    };
    // Every choice's progress through one channel, in the order the model makes it.
    let (merged_tx, mut merged) = mpsc::unbounded_channel::<(usize, Progress)>();
    for (index, (mut tokens, done)) in choices.into_iter().enumerate() {
        let tx = merged_tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    delta = tokens.recv() => match delta {
                        Some(delta) => {
                            if tx.send((index, Progress::Delta(delta))).is_err() {
                                return;
                            }
                        }
                        None => break,
                    },
                    // The client went away: let go of the token channel now.
                    () = tx.closed() => return,
                }
            }
            let _ = tx.send((index, Progress::Done(done.await)));
        });
    }
    drop(merged_tx);
    let stream = async_stream::stream! {
        let mut states: Vec<ChoiceStream> =
            (0..count).map(|index| ChoiceStream::new(index, calls_out)).collect();
        if chunks.chat {
            for state in &states {
                yield Ok::<Event, Infallible>(chunks.event(state.index, json!({"role": "assistant", "content": ""}), Value::Null, None));
            }
        }
        let mut generations: Vec<Option<Generation>> = (0..count).map(|_| None).collect();
        while let Some((index, progress)) = merged.recv().await {
            let state = &mut states[index];
            match progress {
                Progress::Delta(delta) => {
                    for event in state.advance(&chunks, delta) {
                        yield Ok(event);
                    }
                }
                Progress::Done(Ok(Ok(g))) => {
                    let usage = (count == 1).then(|| std::slice::from_ref(&g));
                    for event in state.finish(&chunks, &g, usage) {
                        yield Ok(event);
                    }
                    generations[index] = Some(g);
                }
                Progress::Done(Ok(Err(e))) => {
                    chunks.app.metrics.record_error();
                    let e = ApiError::from(e);
                    yield Ok(Event::default().data(json!({"error": {"message": e.message, "type": e.kind}}).to_string()));
                    break;
                }
                // The model thread went away: the stream ends without a finish.
                Progress::Done(Err(_)) => break,
            }
        }
        let generations: Vec<Generation> = generations.into_iter().flatten().collect();
        if count > 1 && generations.len() == count {
            let last = json!({"id": chunks.id, "object": chunks.object, "created": chunks.created,
                "model": chunks.app.model_id, "choices": [],
                "usage": usage_of(&generations, per_prompt),
                "suffixd": spec_stats_of(&generations)});
            yield Ok(Event::default().data(last.to_string()));
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Sse::new(stream)
}

/// What every chunk of one stream shares.
struct Chunks {
    app: Arc<AppState>,
    id: String,
    object: &'static str,
    chat: bool,
    created: u64,
}

impl Chunks {
    /// A chunk of choice `index`: a chat `delta`, or for completions its `content` as
    /// `text`, with the log-probabilities of the tokens whose text it completes.
    fn event(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Event {
        self.event_with(self.choice(index, delta, logprobs, finish), None)
    }

    fn choice(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        if self.chat {
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        } else {
            json!({"index": index, "text": delta.get("content").cloned().unwrap_or(json!("")), "finish_reason": finish, "logprobs": logprobs})
        }
    }

    /// A chunk of one choice, with the usage and figures of `usage` when given.
    fn event_with(&self, choice: Value, usage: Option<&[Generation]>) -> Event {
        let mut chunk = json!({"id": self.id, "object": self.object, "created": self.created,
            "model": self.app.model_id, "choices": [choice]});
        if let Some(gs) = usage {
            chunk["usage"] = usage_of(gs, 1);
            chunk["suffixd"] = spec_stats_of(gs);
        }
        Event::default().data(chunk.to_string())
    }
}

/// One choice on its way out: its tokens decoded once each, what of its text was sent,
/// log-probabilities not sent yet, and its calls as they stream.
struct ChoiceStream {
    index: usize,
    calls_out: StreamCalls,
    tokens: Vec<u32>,
    answer: Detokenizer,
    /// What was sent is `answer.text()[..sent]`.
    sent: usize,
    pending: Vec<TokenLogprob>,
    /// The text before the pending log-probabilities (completions count `text_offset`
    /// from the answer's start).
    logprob_offset: usize,
    calls: CallStreamer,
}

impl ChoiceStream {
    fn new(index: usize, calls_out: StreamCalls) -> Self {
        ChoiceStream {
            index,
            calls_out,
            tokens: Vec::new(),
            answer: Detokenizer::new(),
            sent: 0,
            pending: Vec::new(),
            logprob_offset: 0,
            calls: CallStreamer::default(),
        }
    }

    fn take_logprobs(&mut self, chunks: &Chunks) -> Value {
        if self.pending.is_empty() {
            return Value::Null;
        }
        let v = logprobs_json(
            &chunks.app,
            &self.pending,
            chunks.chat,
            &mut self.logprob_offset,
        );
        self.pending.clear();
        v
    }

    /// The chunks a step's tokens make: new content (a character split across tokens
    /// comes out whole, with the token that completes it), and call fragments.
    fn advance(&mut self, chunks: &Chunks, delta: Delta) -> Vec<Event> {
        self.tokens.extend_from_slice(&delta.tokens);
        self.pending.extend(delta.logprobs);
        if let Err(e) = self.answer.update(&chunks.app.tokenizer, &self.tokens) {
            // The ids come from the model's own vocabulary, so this is a bug.
            tracing::error!("cannot decode the generated tokens: {e}");
            return Vec::new();
        }
        // What this step adds, read from the decoded text without copying it (the
        // answer grows every step): new content, and call fragments.
        let text = self.answer.text();
        // When the answer may call tools, text from where a call may begin is held
        // back: calls go out as tool-call deltas, never as content.
        let end = if self.calls_out == StreamCalls::No {
            text.len()
        } else {
            tools::streamable_len(text)
        };
        // The detokenizer's text never ends in a cut character.
        let piece =
            (end > self.sent && text.is_char_boundary(self.sent) && text.is_char_boundary(end))
                .then(|| text[self.sent..end].to_string());
        let deltas = if self.calls_out == StreamCalls::AsDecoded {
            self.calls.advance(text)
        } else {
            Vec::new()
        };
        let mut events = Vec::new();
        if let Some(piece) = piece {
            self.sent = end;
            let logprobs = self.take_logprobs(chunks);
            events.push(chunks.event(self.index, json!({"content": piece}), logprobs, None));
        }
        if !deltas.is_empty() {
            let logprobs = self.take_logprobs(chunks);
            events.push(chunks.event(self.index, json!({"tool_calls": deltas}), logprobs, None));
        }
        events
    }

    /// The last chunks of a finished answer: content past what was sent, the rest of
    /// its calls, and its finish reason (with `usage`'s figures when given).
    fn finish(
        &mut self,
        chunks: &Chunks,
        g: &Generation,
        usage: Option<&[Generation]>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        // The content past what was sent: the answer's, with any call blocks out of it
        // (what went out is always its start).
        let reads_calls = self.calls_out != StreamCalls::No;
        let (content, calls) = tools::read_answer(&g.text, reads_calls);
        let content = content.unwrap_or_default();
        let rest = if content.len() > self.sent && content.is_char_boundary(self.sent) {
            content[self.sent..].to_string()
        } else {
            String::new()
        };
        if !rest.is_empty() || (!self.pending.is_empty() && calls.is_empty()) {
            let logprobs = self.take_logprobs(chunks);
            events.push(chunks.event(self.index, json!({"content": rest}), logprobs, None));
        }
        // The rest of the calls: the last fragments of those streaming, and whole the
        // ones that did not stream.
        let mut deltas = if self.calls_out == StreamCalls::AsDecoded {
            self.calls.advance(&g.text)
        } else {
            Vec::new()
        };
        deltas.extend(
            calls
                .iter()
                .enumerate()
                .skip(self.calls.started())
                .map(|(i, c)| c.to_json(Some(i))),
        );
        if !deltas.is_empty() {
            let logprobs = self.take_logprobs(chunks);
            events.push(chunks.event(self.index, json!({"tool_calls": deltas}), logprobs, None));
        }
        let finish_reason = if chunks.chat {
            chat_finish(g, &calls)
        } else {
            finish(g)
        };
        let choice = chunks.choice(self.index, json!({}), Value::Null, Some(finish_reason));
        events.push(chunks.event_with(choice, usage));
        events
    }
}
