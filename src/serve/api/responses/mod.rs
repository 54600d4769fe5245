//! `POST /v1/responses`: OpenAI's Responses API, the default of the OpenAI Agents SDK and
//! of newer clients. A request becomes the chat request it stands for
//! ([`request::ResponsesRequest::to_chat`]) and runs as one (same prompt, grammar, tool
//! calls, thoughts); its answer goes out as output items: the thoughts as a reasoning
//! item, the text as a message, each call as a function call; whole, or as the API's
//! stream of events ([`events`]). Finished responses are kept ([`stored`]) unless
//! `store` is false: a later request continues one with `previous_response_id`, and
//! `GET`/`DELETE /v1/responses/{id}` read and forget them; `GET
//! /v1/responses/{id}/input_items` lists what one was made from ([`input_items`]).

mod events;
mod input_items;
mod items;
mod request;
mod stored;
mod wire;

pub use input_items::response_input_items;
pub use stored::ResponseStore;

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::chat::CallSyntax;
use crate::engine::{FinishReason, Generation};
use crate::replicate::responses::SharedError;
use crate::serve::AppState;

use super::answer::{logprobs_of, reasoning_tokens, spec_stats_of, unix_s};
use super::keys::Caller;
use super::openai::{await_answers, enqueue_request};
use super::thinking::Thinking;
use super::tools;
use super::wire::{ChatTokenLogprob, Logprobs};
use super::{ApiError, read_json};
use items::item_id;
use request::ResponsesRequest;
use stored::StoredResponse;
use wire::{
    IncompleteDetails, InputTokensDetails, OutputItem, OutputText, OutputTokensDetails,
    ReasoningText, ResponseObject, ResponseUsage,
};

/// `POST /v1/responses`.
pub async fn responses(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(app, caller, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn respond(
    app: Arc<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest =
        read_json(body, app.cfg.max_body_bytes, app.cfg.read_timeout()).await?;
    let previous = continued(&app, &req, &caller).await?;
    let earlier = previous.as_deref().map(StoredResponse::conversation);
    let input = app
        .responses
        .resolve_references(req.input_items()?, &caller)
        .await
        .map_err(shared_unavailable)?;
    let chat = req.to_chat(earlier.as_deref().unwrap_or_default(), &input)?;
    let keep = match req.wants_stored()? && app.responses.enabled() {
        true => Some(ToKeep {
            input,
            previous: previous.clone(),
            tenant: caller.namespace,
        }),
        false => None,
    };
    let queued = enqueue_request(&app, &headers, &chat, true).await?;
    // Found, or `continued` refused the request.
    let previous_id = req.previous_response_id()?;
    let mut response = started(&app, &req, keep.is_some(), previous_id);
    if req.stream {
        return Ok(events::stream_response(app, response, queued, keep).into_response());
    }
    let (reads_calls, thinking) = (queued.reads_calls, queued.thinking);
    // One job, so one answer.
    let Some(generation) = await_answers(&app, queued.jobs).await?.pop() else {
        return Err(ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the model thread sent no answer",
        ));
    };
    let output = output_items(&app, &response.id, &generation, reads_calls, thinking);
    finish(&app, &mut response, output, &generation, thinking);
    if let Some(keep) = keep {
        let kept = keep.keep(&app, &mut response);
        share(&app, kept.as_deref()).await;
    }
    Ok(Json(response).into_response())
}

/// The stored response `req` continues, if it names one; an unknown id is refused as
/// OpenAI refuses it (`previous_response_not_found`, which clients and proxies answer
/// by sending the whole conversation).
async fn continued(
    app: &AppState,
    req: &ResponsesRequest,
    caller: &Caller,
) -> Result<Option<Arc<StoredResponse>>, ApiError> {
    let Some(id) = req.previous_response_id()? else {
        return Ok(None);
    };
    let why = match (app.responses.enabled(), app.responses.shared().is_some()) {
        (false, _) => "this server keeps no responses (--stored-responses-bytes 0)",
        (true, false) => {
            "responses are kept in memory, the most recently used within --stored-responses-bytes, not across restarts or replicas (--replicate shares them)"
        }
        (true, true) => {
            "responses are kept by the replicas through NATS for as long as their stream keeps them (30 days unless its operator set otherwise), and a conversation only while all its responses are"
        }
    };
    let found = app
        .responses
        .find(id, caller)
        .await
        .map_err(shared_unavailable)?;
    found.map(Some).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Previous response with id '{}' not found: {why}; send the whole conversation as `input`",
            shown_id(id)
        ))
        .param("previous_response_id")
        .code("previous_response_not_found")
    })
}

/// What keeping a finished response takes besides the response: its request's input,
/// the response it continued, and the tenant whose key asked for it.
pub(super) struct ToKeep {
    input: Vec<Value>,
    previous: Option<Arc<StoredResponse>>,
    tenant: Option<String>,
}

impl ToKeep {
    /// Keep `response`, finished; its `store` then says whether it was kept. Then
    /// [`share`] it.
    fn keep(self, app: &AppState, response: &mut ResponseObject) -> Option<Arc<StoredResponse>> {
        response.store = true;
        let whole = serde_json::to_value(&*response).unwrap_or(Value::Null);
        let kept = app
            .responses
            .keep(whole, self.input, self.previous, self.tenant);
        response.store = kept.is_some();
        kept
    }
}

/// Give `kept`, just kept, to the other replicas (when this server shares responses),
/// before its client can read that it is done: its next request may reach another
/// replica. While NATS is away it waits in the outbox, published once NATS is back;
/// when NATS refuses it (too large), it stays kept here, and the failure is logged.
async fn share(app: &AppState, kept: Option<&StoredResponse>) {
    if let Some(kept) = kept
        && let Err(e) = app.responses.share(kept).await
    {
        tracing::warn!("response kept on this replica only: {e}");
    }
}

/// The answer when the replicas' shared responses cannot be reached: 503, which clients
/// retry.
fn shared_unavailable(e: SharedError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        format!("{e}; retry, or send the whole conversation as `input`"),
    )
    .code("shared_responses_unavailable")
}

/// `GET /v1/responses/{id}`: a kept response, as it finished.
pub async fn stored_response(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    match app.responses.find(&id, &caller).await {
        Ok(Some(kept)) => Json(kept.response()).into_response(),
        Ok(None) => not_kept(&id).into_response(),
        Err(e) => shared_unavailable(e).into_response(),
    }
}

/// `DELETE /v1/responses/{id}`: forget a kept response, on every replica (a later
/// response that continued it still continues it where it is held).
pub async fn delete_response(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    match app.responses.forget(&id, &caller).await {
        Ok(true) => Json(json!({"id": id, "object": "response", "deleted": true})).into_response(),
        Ok(false) => not_kept(&id).into_response(),
        Err(e) => shared_unavailable(e).into_response(),
    }
}

/// The answer for an id this server does not keep.
fn not_kept(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "Response with id '{}' not found: it was not stored (`store: false`), was deleted or evicted, or was made before a restart or on a replica that does not share its responses",
            shown_id(id)
        ),
    )
    .code("not_found")
}

/// An id as an error message shows it: cut short, since it is the client's text.
fn shown_id(id: &str) -> String {
    const SHOWN: usize = 80;
    match id.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &id[..end]),
        None => id.to_string(),
    }
}

/// The response as it starts: what was asked, echoed with the defaults that served it,
/// no output yet. `stored`: whether it is to be kept; `previous_id`: the stored
/// response it continues.
fn started(
    app: &AppState,
    req: &ResponsesRequest,
    stored: bool,
    previous_id: Option<&str>,
) -> ResponseObject {
    let top_logprobs = req.top_logprobs.as_ref().and_then(Value::as_u64);
    ResponseObject {
        id: stored::fresh_response_id(),
        object: "response",
        created_at: unix_s(),
        status: "in_progress",
        background: false,
        error: None,
        incomplete_details: None,
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        model: app.model_id.clone(),
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: previous_id.map(str::to_owned),
        reasoning: req
            .reasoning
            .clone()
            .unwrap_or_else(|| json!({"effort": null, "summary": null})),
        service_tier: "default",
        store: stored,
        temperature: req.temperature.unwrap_or(1.0),
        text: req
            .text
            .clone()
            .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools: req.tools.clone().unwrap_or_default(),
        top_logprobs: top_logprobs.unwrap_or(0),
        top_p: req.top_p.unwrap_or(1.0),
        truncation: "disabled",
        usage: None,
        user: req.user.clone(),
        metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
        suffixd: None,
    }
}

/// Finish `response` once its generation `g` is done, with `output`: `completed`, or
/// `incomplete` when `max_output_tokens` (or the context) cut it.
fn finish(
    app: &AppState,
    response: &mut ResponseObject,
    output: Vec<OutputItem>,
    g: &Generation,
    thinking: Option<Thinking>,
) {
    let cut = is_cut(g);
    response.status = if cut { "incomplete" } else { "completed" };
    response.incomplete_details = cut.then_some(IncompleteDetails {
        reason: "max_output_tokens",
    });
    response.output = output;
    response.usage = Some(usage_of(app, g, thinking));
    response.suffixd = Some(spec_stats_of(std::slice::from_ref(g)));
}

/// Whether `max_output_tokens` (or the context) cut the answer: the response and its
/// last item are then `incomplete`.
fn is_cut(g: &Generation) -> bool {
    g.finish_reason == FinishReason::Length
}

/// A finished answer's output items: its thoughts (a reasoning item), its text (a
/// message, also when the answer is empty and makes no calls), and its calls.
fn output_items(
    app: &AppState,
    response_id: &str,
    g: &Generation,
    reads_calls: Option<CallSyntax>,
    thinking: Option<Thinking>,
) -> Vec<OutputItem> {
    let (thoughts, answer) = match thinking.map(|t| t.split(&g.text)) {
        Some(split) => (split.thoughts, split.answer),
        None => (None, g.text.as_str()),
    };
    let (content, calls) = tools::read_answer(answer, reads_calls);
    let mut items = Vec::new();
    if let Some(thoughts) = thoughts {
        items.push(OutputItem::Reasoning {
            id: item_id(response_id, "rs", items.len()),
            summary: Vec::new(),
            content: vec![ReasoningText {
                kind: "reasoning_text",
                text: thoughts.to_string(),
            }],
            status: "completed",
        });
    }
    let content = content.unwrap_or_default();
    if !content.is_empty() || (calls.is_empty() && thoughts.is_none()) {
        let logprobs = g
            .logprobs
            .as_deref()
            .map(|l| chat_logprobs(logprobs_of(app, l, true, &mut 0)))
            .unwrap_or_default();
        items.push(OutputItem::Message {
            id: item_id(response_id, "msg", items.len()),
            status: "completed",
            role: "assistant",
            content: vec![OutputText::new(content, logprobs)],
        });
    }
    let syntax = reads_calls.unwrap_or(CallSyntax::Tagged);
    for call in &calls {
        let wire = call.to_wire(None, syntax);
        items.push(OutputItem::FunctionCall {
            id: item_id(response_id, "fc", items.len()),
            call_id: wire.id,
            name: wire.function.name,
            arguments: wire.function.arguments,
            status: "completed",
        });
    }
    if is_cut(g)
        && let Some(last) = items.last_mut()
    {
        last.set_status("incomplete");
    }
    items
}

/// Chat's per-token log-probabilities (what output text parts carry).
fn chat_logprobs(logprobs: Logprobs) -> Vec<ChatTokenLogprob> {
    match logprobs {
        Logprobs::Chat { content } => content,
        Logprobs::Completion { .. } => Vec::new(),
    }
}

/// The usage of generation `g`: its prompt (and the part the prefix cache served), its
/// tokens, and how many of those were thoughts.
fn usage_of(app: &AppState, g: &Generation, thinking: Option<Thinking>) -> ResponseUsage {
    let reasoning_tokens = reasoning_tokens(app, g, thinking);
    ResponseUsage {
        input_tokens: g.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: g.cached_prompt_tokens,
        },
        output_tokens: g.tokens.len(),
        output_tokens_details: OutputTokensDetails { reasoning_tokens },
        total_tokens: g.prompt_tokens + g.tokens.len(),
    }
}
