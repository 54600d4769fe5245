//! A streamed response: the Responses API's events, from the same pieces the chat
//! stream sends as chunks ([`ChoiceStream`]). `response.created` and
//! `response.in_progress` first; then each output item in turn — added, its text or
//! arguments as deltas, done — the thoughts as a reasoning item, the text as a message
//! with one output text part, each call as a function call; last `response.completed`
//! (or `response.incomplete`, or `response.failed`) with the whole response.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};

use crate::engine::Generation;
use crate::serve::AppState;

use super::super::ApiError;
use super::super::openai::Queued;
use super::super::stream::{ChoiceStream, Piece};
use super::super::wire::ChatTokenLogprob;
use super::wire::{
    Numbered, OutputItem, OutputText, ReasoningText, ResponseError, ResponseObject, StreamEvent,
};
use super::{StoredResponse, ToKeep, chat_logprobs, finish, item_id};

/// The response's events as Server-Sent Events. When the client goes away the stream
/// is dropped with the token channel, and the model thread cancels the generation.
pub(super) fn stream_response(
    app: Arc<AppState>,
    response: ResponseObject,
    queued: Queued,
    keep: Option<ToKeep>,
) -> impl IntoResponse {
    let mut choice = ChoiceStream::new(0, queued.stream_calls(), queued.thinking);
    let thinking = queued.thinking;
    let mut jobs = queued.jobs;
    let stream = async_stream::stream! {
        let Some((mut tokens, done)) = jobs.pop() else {
            return;
        };
        let mut out = Writer::new(response);
        yield Ok::<Event, Infallible>(out.send(|r| StreamEvent::Created { response: r }));
        yield Ok(out.send(|r| StreamEvent::InProgress { response: r }));
        while let Some(delta) = tokens.recv().await {
            for piece in choice.advance(&app, true, delta) {
                for event in out.piece(piece) {
                    yield Ok(event);
                }
            }
        }
        match done.await {
            Ok(Ok(g)) => {
                let (pieces, _) = choice.finish(&app, true, &g);
                for piece in pieces {
                    for event in out.piece(piece) {
                        yield Ok(event);
                    }
                }
                let (events, kept) = out.finish(&app, &g, thinking, keep);
                super::share(&app, kept.as_deref()).await;
                for event in events {
                    yield Ok(event);
                }
            }
            Ok(Err(e)) => {
                app.metrics.record_error();
                yield Ok(out.failed(ApiError::from(e).message));
            }
            Err(_) => yield Ok(out.failed("the generation was dropped".into())),
        }
    };
    Sse::new(stream)
}

/// The item being streamed.
enum Open {
    Reasoning {
        text: String,
    },
    Message {
        text: String,
        logprobs: Vec<ChatTokenLogprob>,
    },
    Call {
        name: String,
        arguments: String,
        call_id: String,
    },
}

/// The events' numbering (`sequence_number`), apart from the response and its items so
/// that an event can borrow them while it is numbered.
struct Numbering {
    next: u64,
}

impl Numbering {
    /// The next event: its name, then its data with its number.
    fn event(&mut self, event: StreamEvent<'_>) -> Event {
        let name = event.name();
        let numbered = Numbered {
            event,
            sequence_number: self.next,
        };
        self.next += 1;
        super::super::stream::sse_data(&numbered).event(name)
    }
}

/// The response on its way out: its finished items, the one being streamed, and the
/// events' numbering.
struct Writer {
    response: ResponseObject,
    /// The open item's id and kind.
    open: Option<(String, Open)>,
    numbering: Numbering,
}

impl Writer {
    fn new(response: ResponseObject) -> Self {
        Writer {
            response,
            open: None,
            numbering: Numbering { next: 0 },
        }
    }

    /// The next event.
    fn event(&mut self, event: StreamEvent<'_>) -> Event {
        self.numbering.event(event)
    }

    /// A lifecycle event over the response as it stands.
    fn send(&mut self, make: impl Fn(&ResponseObject) -> StreamEvent<'_>) -> Event {
        self.numbering.event(make(&self.response))
    }

    /// Where the next item goes.
    fn next_index(&self) -> usize {
        self.response.output.len()
    }

    /// The events of one piece of the answer.
    fn piece(&mut self, piece: Piece) -> Vec<Event> {
        let mut events = Vec::new();
        let delta = piece.delta;
        if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
            if !matches!(self.open, Some((_, Open::Reasoning { .. }))) {
                events.extend(self.close());
                events.extend(self.open(Open::Reasoning {
                    text: String::new(),
                }));
            }
            events.extend(self.add_text(&text, Vec::new()));
        }
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            if !matches!(self.open, Some((_, Open::Message { .. }))) {
                events.extend(self.close());
                events.extend(self.open(Open::Message {
                    text: String::new(),
                    logprobs: Vec::new(),
                }));
            }
            let logprobs = piece.logprobs.map(chat_logprobs).unwrap_or_default();
            events.extend(self.add_text(&text, logprobs));
        }
        for call in delta.tool_calls {
            if let Some(call_id) = call.id {
                events.extend(self.close());
                events.extend(self.open(Open::Call {
                    name: call.function.name.unwrap_or_default(),
                    arguments: String::new(),
                    call_id,
                }));
            }
            if !call.function.arguments.is_empty() {
                events.extend(self.add_arguments(&call.function.arguments));
            }
        }
        events
    }

    /// Open an item: `output_item.added` (and a message's empty text part).
    fn open(&mut self, open: Open) -> Vec<Event> {
        let index = self.next_index();
        let item = item_of(&self.response.id, index, &open, false);
        let id = item.id().to_string();
        let mut events = vec![self.event(StreamEvent::ItemAdded {
            output_index: index,
            item: &item,
        })];
        if matches!(open, Open::Message { .. }) {
            let part = OutputText::new(String::new(), Vec::new());
            events.push(self.event(StreamEvent::PartAdded {
                item_id: &id,
                output_index: index,
                content_index: 0,
                part: &part,
            }));
        }
        self.open = Some((id, open));
        events
    }

    /// More of the open reasoning's or message's text (none when neither is open).
    fn add_text(&mut self, delta: &str, logprobs: Vec<ChatTokenLogprob>) -> Option<Event> {
        let output_index = self.next_index();
        let (id, open) = self.open.as_mut()?;
        match open {
            Open::Reasoning { text } => {
                text.push_str(delta);
                Some(self.numbering.event(StreamEvent::ReasoningDelta {
                    item_id: id,
                    output_index,
                    content_index: 0,
                    delta,
                }))
            }
            Open::Message {
                text,
                logprobs: kept,
            } => {
                text.push_str(delta);
                let event = self.numbering.event(StreamEvent::TextDelta {
                    item_id: id,
                    output_index,
                    content_index: 0,
                    delta,
                    logprobs: &logprobs,
                });
                kept.extend(logprobs);
                Some(event)
            }
            Open::Call { .. } => None,
        }
    }

    /// More of the open call's arguments (none when no call is open).
    fn add_arguments(&mut self, fragment: &str) -> Option<Event> {
        let output_index = self.next_index();
        let Some((id, Open::Call { arguments, .. })) = self.open.as_mut() else {
            return None;
        };
        arguments.push_str(fragment);
        Some(self.numbering.event(StreamEvent::ArgumentsDelta {
            item_id: id,
            output_index,
            delta: fragment,
        }))
    }

    /// Finish the open item: its text's or arguments' `done`, its part's, its own.
    fn close(&mut self) -> Vec<Event> {
        self.close_as("completed")
    }

    /// Finish the open item with `status` (`incomplete` for an answer's last, cut off).
    fn close_as(&mut self, status: &'static str) -> Vec<Event> {
        let Some((id, open)) = self.open.take() else {
            return Vec::new();
        };
        let index = self.next_index();
        let mut item = item_of(&self.response.id, index, &open, true);
        item.set_status(status);
        let mut events = Vec::new();
        match &open {
            Open::Reasoning { text } => events.push(self.event(StreamEvent::ReasoningDone {
                item_id: &id,
                output_index: index,
                content_index: 0,
                text,
            })),
            Open::Message { text, logprobs } => {
                events.push(self.event(StreamEvent::TextDone {
                    item_id: &id,
                    output_index: index,
                    content_index: 0,
                    text,
                    logprobs,
                }));
                let part = OutputText::new(text.clone(), logprobs.clone());
                events.push(self.event(StreamEvent::PartDone {
                    item_id: &id,
                    output_index: index,
                    content_index: 0,
                    part: &part,
                }));
            }
            Open::Call {
                name, arguments, ..
            } => events.push(self.event(StreamEvent::ArgumentsDone {
                item_id: &id,
                output_index: index,
                name,
                arguments,
            })),
        }
        events.push(self.event(StreamEvent::ItemDone {
            output_index: index,
            item: &item,
        }));
        self.response.output.push(item);
        events
    }

    /// The last events: the open item finished (an empty message when the answer made
    /// no item at all, as a whole response has), then the finished response, kept
    /// (`keep`) before the client can read that it is done; and the response kept, to be
    /// shared before these events go out.
    fn finish(
        &mut self,
        app: &AppState,
        g: &Generation,
        thinking: Option<super::Thinking>,
        keep: Option<ToKeep>,
    ) -> (Vec<Event>, Option<Arc<StoredResponse>>) {
        let mut events = Vec::new();
        if self.open.is_none() && self.response.output.is_empty() {
            events.extend(self.open(Open::Message {
                text: String::new(),
                logprobs: Vec::new(),
            }));
        }
        events.extend(self.close_as(if super::is_cut(g) {
            "incomplete"
        } else {
            "completed"
        }));
        let output = std::mem::take(&mut self.response.output);
        finish(app, &mut self.response, output, g, thinking);
        let kept = keep.and_then(|keep| keep.keep(app, &mut self.response));
        let cut = self.response.status == "incomplete";
        events.push(self.send(|r| {
            if cut {
                StreamEvent::Incomplete { response: r }
            } else {
                StreamEvent::Completed { response: r }
            }
        }));
        (events, kept)
    }

    /// `response.failed`, saying why.
    fn failed(&mut self, message: String) -> Event {
        self.response.status = "failed";
        self.response.error = Some(ResponseError {
            code: "server_error",
            message,
        });
        self.send(|r| StreamEvent::Failed { response: r })
    }
}

/// The output item `open` stands for at `index` of response `response_id`: `done`, or
/// as it is added (in progress, its text not there yet).
fn item_of(response_id: &str, index: usize, open: &Open, done: bool) -> OutputItem {
    let status = if done { "completed" } else { "in_progress" };
    match open {
        Open::Reasoning { text } => OutputItem::Reasoning {
            id: item_id(response_id, "rs", index),
            summary: Vec::new(),
            content: done
                .then(|| ReasoningText {
                    kind: "reasoning_text",
                    text: text.clone(),
                })
                .into_iter()
                .collect(),
            status,
        },
        Open::Message { text, logprobs } => OutputItem::Message {
            id: item_id(response_id, "msg", index),
            status,
            role: "assistant",
            content: done
                .then(|| OutputText::new(text.clone(), logprobs.clone()))
                .into_iter()
                .collect(),
        },
        Open::Call {
            name,
            arguments,
            call_id,
        } => OutputItem::FunctionCall {
            id: item_id(response_id, "fc", index),
            call_id: call_id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
            status,
        },
    }
}
