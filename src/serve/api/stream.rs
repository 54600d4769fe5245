//! Streamed answers: Server-Sent Events in OpenAI's chunk format, text as it is decoded
//! (less what may begin a tool call), tool calls as name then argument fragments, and
//! a last chunk with the finish reason, usage and suffixd's figures.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Generation, TokenLogprob};
use crate::serve::AppState;
use crate::serve::worker::{Delta, JobError};

use super::ApiError;
use super::answer::{chat_finish, finish, logprobs_of, spec_stats_of, unix_s, usage_of};
use super::thinking::Thinking;
use super::tools::{self, CallStreamer};
use super::wire::{
    ChatChunkChoice, Chunk, ChunkChoice, Logprobs, MessageDelta, TextChoice, ToolCallDelta,
};
use crate::chat::{CallSyntax, ThoughtStream};

/// How a streamed answer's tool calls go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StreamCalls {
    /// The answer makes no calls: all of it is content.
    No,
    /// Calls, written in this form, are read at the end and sent whole (the model wrote
    /// them freely).
    Whole(CallSyntax),
    /// Calls, written in this form, are held to the call grammar: each streams as it is
    /// decoded.
    AsDecoded(CallSyntax),
}

impl StreamCalls {
    /// How the answer's calls are written; None when it makes none.
    fn syntax(self) -> Option<CallSyntax> {
        match self {
            StreamCalls::No => None,
            StreamCalls::Whole(s) | StreamCalls::AsDecoded(s) => Some(s),
        }
    }
}

/// What a choice's forwarding task hands the stream: a step's tokens, then the end (a
/// generation is ten times a step's size: boxed, so that every step's message is not).
enum Progress {
    Delta(Delta),
    Done(Result<Result<Box<Generation>, JobError>, oneshot::error::RecvError>),
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
/// without choices carries them for all (`per_prompt` choices for each prompt). A
/// thinking model's thoughts (`thinking`) go out as `reasoning_content`. When
/// the client goes away the stream is dropped, the token channels close, and the model
/// thread cancels the generations at their next step.
pub(super) fn stream_response(
    app: Arc<AppState>,
    id: String,
    chat: bool,
    (calls_out, thinking): (StreamCalls, Option<Thinking>),
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
        thinking,
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
            let _ = tx.send((index, Progress::Done(done.await.map(|r| r.map(Box::new)))));
        });
    }
    drop(merged_tx);
    let stream = async_stream::stream! {
        let mut states: Vec<ChoiceStream> =
            (0..count).map(|index| ChoiceStream::new(index, calls_out, thinking)).collect();
        if chunks.chat {
            for state in &states {
                let role = MessageDelta { role: Some("assistant"), content: Some(String::new()), ..Default::default() };
                yield Ok::<Event, Infallible>(chunks.event(state.index, role, None, None));
            }
        }
        let mut generations: Vec<Option<Generation>> = (0..count).map(|_| None).collect();
        while let Some((index, progress)) = merged.recv().await {
            let state = &mut states[index];
            match progress {
                Progress::Delta(delta) => {
                    for piece in state.advance(&chunks.app, chunks.chat, delta) {
                        yield Ok(chunks.event(state.index, piece.delta, piece.logprobs, None));
                    }
                }
                Progress::Done(Ok(Ok(g))) => {
                    let g = *g;
                    let (pieces, finish_reason) = state.finish(&chunks.app, chunks.chat, &g);
                    for piece in pieces {
                        yield Ok(chunks.event(state.index, piece.delta, piece.logprobs, None));
                    }
                    // One choice's last chunk carries the usage.
                    let usage = (count == 1).then(|| (std::slice::from_ref(&g), 1));
                    let last = chunks.choice(state.index, MessageDelta::default(), None, Some(finish_reason));
                    yield Ok(chunks.event_with(vec![last], usage));
                    generations[index] = Some(g);
                }
                Progress::Done(Ok(Err(e))) => {
                    chunks.app.metrics.record_error();
                    let e = ApiError::from(e);
                    yield Ok(sse_data(&e.body()));
                    break;
                }
                // The model thread went away: the stream ends without a finish.
                Progress::Done(Err(_)) => break,
            }
        }
        let generations: Vec<Generation> = generations.into_iter().flatten().collect();
        if count > 1 && generations.len() == count {
            yield Ok(chunks.event_with(Vec::new(), Some((&generations, per_prompt))));
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
    /// A thinking model's thoughts, counted in the usage.
    thinking: Option<Thinking>,
}

impl Chunks {
    /// A chunk of choice `index`: a chat `delta`, or for completions its `content` as
    /// `text`, with the log-probabilities of the tokens whose text it completes.
    fn event(
        &self,
        index: usize,
        delta: MessageDelta,
        logprobs: Option<Logprobs>,
        finish: Option<&'static str>,
    ) -> Event {
        self.event_with(vec![self.choice(index, delta, logprobs, finish)], None)
    }

    fn choice(
        &self,
        index: usize,
        delta: MessageDelta,
        logprobs: Option<Logprobs>,
        finish_reason: Option<&'static str>,
    ) -> ChunkChoice {
        if self.chat {
            ChunkChoice::Chat(ChatChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason,
            })
        } else {
            ChunkChoice::Text(TextChoice {
                index,
                text: delta.content.unwrap_or_default(),
                finish_reason,
                logprobs,
            })
        }
    }

    /// A chunk of `choices`, with the usage and figures of `usage`'s answers when given
    /// (and how many choices each prompt has).
    fn event_with(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<(&[Generation], usize)>,
    ) -> Event {
        sse_data(&Chunk {
            id: &self.id,
            object: self.object,
            created: self.created,
            model: &self.app.model_id,
            choices,
            usage: usage.map(|(gs, per_prompt)| usage_of(&self.app, gs, per_prompt, self.thinking)),
            suffixd: usage.map(|(gs, _)| spec_stats_of(gs)),
        })
    }
}

/// An event whose data is `body` as JSON.
pub(super) fn sse_data(body: &impl Serialize) -> Event {
    // The API's answers are plain structs of strings and numbers, which always
    // serialize; an error here would be a bug, sent as an error event.
    let data = serde_json::to_string(body).unwrap_or_else(|e| {
        tracing::error!("cannot serialize a stream chunk: {e}");
        r#"{"error":{"message":"the server could not write this chunk","type":"server_error","param":null,"code":null}}"#.to_string()
    });
    Event::default().data(data)
}

/// What a step adds to a streamed choice: a message delta (thoughts, content or call
/// pieces) and the log-probabilities of the tokens whose text it completes. The chat
/// stream sends each as a chunk; `/v1/responses` as its items' events.
pub(super) struct Piece {
    pub(super) delta: MessageDelta,
    pub(super) logprobs: Option<Logprobs>,
}

/// One choice on its way out: its text so far (as the engine decoded it), its thoughts
/// as they stream, what of the answer past them was sent, log-probabilities not sent
/// yet, and its calls as they stream.
pub(super) struct ChoiceStream {
    index: usize,
    calls_out: StreamCalls,
    /// The whole text: thoughts, then the answer.
    answer: String,
    /// A thinking model's thoughts on their way out.
    thoughts: Option<ThoughtStream>,
    /// Where the answer past the thoughts starts in `answer`, once known.
    answer_start: Option<usize>,
    /// What of the answer was sent is `answer[answer_start..][..sent]`.
    sent: usize,
    pending: Vec<TokenLogprob>,
    /// The text before the pending log-probabilities (completions count `text_offset`
    /// from the answer's start).
    logprob_offset: usize,
    calls: CallStreamer,
}

impl ChoiceStream {
    pub(super) fn new(index: usize, calls_out: StreamCalls, thinking: Option<Thinking>) -> Self {
        ChoiceStream {
            index,
            calls_out,
            answer: String::new(),
            thoughts: thinking.map(|t| t.stream()),
            answer_start: if thinking.is_some() { None } else { Some(0) },
            sent: 0,
            pending: Vec::new(),
            logprob_offset: 0,
            calls: CallStreamer::new(calls_out.syntax().unwrap_or(CallSyntax::Tagged)),
        }
    }

    /// A piece of `delta`, with the log-probabilities not sent yet (chat's form, or
    /// the completions' legacy arrays).
    fn piece(&mut self, app: &AppState, chat: bool, delta: MessageDelta) -> Piece {
        let logprobs = (!self.pending.is_empty()).then(|| {
            let v = logprobs_of(app, &self.pending, chat, &mut self.logprob_offset);
            self.pending.clear();
            v
        });
        Piece { delta, logprobs }
    }

    /// The pieces a step's text makes: new thoughts, new content (a character split
    /// across tokens comes out whole, with the token that completes it), and call
    /// fragments.
    pub(super) fn advance(&mut self, app: &AppState, chat: bool, delta: Delta) -> Vec<Piece> {
        self.answer.push_str(&delta.text);
        self.pending.extend(delta.logprobs);
        let mut pieces = Vec::new();
        if let (Some(thoughts), None) = (&mut self.thoughts, self.answer_start) {
            let progress = thoughts.advance(&self.answer);
            self.answer_start = progress.answer_start;
            if let Some(new) = progress.thoughts.map(str::to_string) {
                pieces.push(self.piece(app, chat, reasoning_delta(new)));
            }
        }
        let Some(start) = self.answer_start else {
            return pieces;
        };
        // What this step adds, read from the answer without copying it (it grows every
        // step): new content, and call fragments.
        let text = &self.answer[start..];
        // When the answer may call tools, text from where a call may begin is held
        // back: calls go out as tool-call deltas, never as content.
        let end = match self.calls_out.syntax() {
            None => text.len(),
            Some(syntax) => tools::streamable_len(text, syntax),
        };
        // The engine's text never ends in a cut character.
        let piece =
            (end > self.sent && text.is_char_boundary(self.sent) && text.is_char_boundary(end))
                .then(|| text[self.sent..end].to_string());
        let deltas = if matches!(self.calls_out, StreamCalls::AsDecoded(_)) {
            self.calls.advance(text)
        } else {
            Vec::new()
        };
        if let Some(piece) = piece {
            self.sent = end;
            pieces.push(self.piece(app, chat, content_delta(piece)));
        }
        if !deltas.is_empty() {
            pieces.push(self.piece(app, chat, tool_calls_delta(deltas)));
        }
        pieces
    }

    /// The last pieces of a finished answer (thoughts and content past what was sent,
    /// the rest of its calls) and its finish reason.
    pub(super) fn finish(
        &mut self,
        app: &AppState,
        chat: bool,
        g: &Generation,
    ) -> (Vec<Piece>, &'static str) {
        let mut pieces = Vec::new();
        // The thoughts past what was sent (what went out is always their start).
        let mut answer = g.text.as_str();
        if let Some(thoughts) = &self.thoughts {
            let split = thoughts.split(&g.text);
            answer = split.answer;
            let rest = split
                .thoughts
                .and_then(|t| t.get(thoughts.sent()..))
                .filter(|rest| !rest.is_empty())
                .map(str::to_string);
            if let Some(rest) = rest {
                pieces.push(self.piece(app, chat, reasoning_delta(rest)));
            }
        }
        // The content past what was sent: the answer's, with any call blocks out of it
        // (what went out is always its start).
        let (content, calls) = tools::read_answer(answer, self.calls_out.syntax());
        let content = content.unwrap_or_default();
        let rest = if content.len() > self.sent && content.is_char_boundary(self.sent) {
            content[self.sent..].to_string()
        } else {
            String::new()
        };
        if !rest.is_empty() || (!self.pending.is_empty() && calls.is_empty()) {
            pieces.push(self.piece(app, chat, content_delta(rest)));
        }
        // The rest of the calls: the last fragments of those streaming, and whole the
        // ones that did not stream.
        let mut deltas = if matches!(self.calls_out, StreamCalls::AsDecoded(_)) {
            self.calls.advance(answer)
        } else {
            Vec::new()
        };
        deltas.extend(
            calls
                .iter()
                .enumerate()
                .skip(self.calls.started())
                .map(|(i, c)| ToolCallDelta::whole(i, c.to_wire(None, self.calls.syntax()))),
        );
        if !deltas.is_empty() {
            pieces.push(self.piece(app, chat, tool_calls_delta(deltas)));
        }
        let finish_reason = if chat {
            chat_finish(g, &calls)
        } else {
            finish(g)
        };
        (pieces, finish_reason)
    }
}

/// A delta of content.
fn content_delta(text: String) -> MessageDelta {
    MessageDelta {
        content: Some(text),
        ..Default::default()
    }
}

/// A delta of thoughts.
fn reasoning_delta(text: String) -> MessageDelta {
    MessageDelta {
        reasoning_content: Some(text),
        ..Default::default()
    }
}

/// A delta of call pieces.
fn tool_calls_delta(deltas: Vec<ToolCallDelta>) -> MessageDelta {
    MessageDelta {
        tool_calls: deltas,
        ..Default::default()
    }
}
