//! The OpenAI-compatible API and the admin API.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::chat::{ChatMessage, PromptPiece, TemplateError};
use crate::replicate::{RecordOp, ReplicationStats};
use crate::store::live::StoreStats;
use crate::verify::engine::{GenerateOptions, Generation, Sampling};

use super::AppState;
use super::worker::{Job, JobError};

/// An OpenAI-style error answer.
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            code: None,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Rejected(m) => ApiError::bad_request(m),
            JobError::Failed(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": null, "code": self.code}});
        (self.status, Json(body)).into_response()
    }
}

/// Every error answer in the API's JSON shape: an error that axum's extractors or
/// layers wrote as plain text (a path that does not parse, say) is rewritten with its
/// text as the message, keeping its status and headers. (A request hyper cannot parse
/// as HTTP at all gets hyper's bare 400 before it reaches the router.)
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = match text.trim() {
        "" => status.canonical_reason().unwrap_or("error").to_string(),
        t => t.to_string(),
    };
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    let rewritten = ApiError::new(status, kind, message).into_response();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.remove(axum::http::header::CONTENT_TYPE);
    let (fresh, body) = rewritten.into_parts();
    parts.headers.extend(fresh.headers);
    Response::from_parts(parts, body)
}

/// `stop` may be a string or a list of strings.
#[derive(Deserialize, Debug, Default)]
#[serde(untagged)]
enum Stop {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

/// Who speaks in a chat message. Anything else is refused: a role the template does
/// not know would be rendered as text the model was never trained on.
#[derive(Deserialize, Debug, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Role {
    System,
    /// OpenAI's newer name for `system`.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A message's content: a string, or a list of parts as the OpenAI SDKs and LangChain
/// send. Only text parts can be served by a text model.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// One chat message of a request. Fields that clients send along with tool calls
/// (`name`, `tool_calls`, `tool_call_id`) are accepted and not used.
#[derive(Deserialize, Debug)]
struct RequestMessage {
    role: Role,
    /// `null` for an assistant message that only calls tools.
    content: Option<Content>,
}

impl RequestMessage {
    fn to_template(&self) -> Result<ChatMessage, ApiError> {
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::bad_request("a text content part needs `text`"));
                        }
                        (other, _) => {
                            return Err(ApiError::bad_request(format!(
                                "content parts of type {other:?} are not supported: this model reads text parts only"
                            )));
                        }
                    }
                }
                text
            }
        };
        Ok(ChatMessage {
            role: self.role.template_name().into(),
            content,
        })
    }
}

/// `logprobs` is not implemented: `true` (chat) or a count (completions) is refused
/// rather than silently ignored; `false`, `0` and `null` are accepted.
fn wants_logprobs(v: &Option<serde_json::Value>) -> bool {
    match v {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => false,
        Some(serde_json::Value::Number(n)) => n.as_u64() != Some(0),
        Some(_) => true,
    }
}

/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 128;

/// A namespace (from `x-suffixd-namespace` or `user`) is 1 to 128 bytes of printable
/// ASCII without spaces. Anything else is refused, never mapped to another namespace.
fn check_namespace(ns: &str) -> Result<(), ApiError> {
    if ns.is_empty() || ns.len() > MAX_NAMESPACE_BYTES || !ns.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::bad_request(format!(
            "a namespace (the x-suffixd-namespace header or `user`) must be 1 to {MAX_NAMESPACE_BYTES} printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

/// The fields both endpoints share. Unknown fields are refused, so that a typo is an
/// error and not a silently ignored setting; the accepted no-op fields are those
/// OpenAI clients commonly send.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct GenerationRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<RequestMessage>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    #[serde(default)]
    stop: Stop,
    seed: Option<u64>,
    #[serde(default)]
    stream: bool,
    user: Option<String>,
    n: Option<u32>,
    #[allow(dead_code)]
    stream_options: Option<serde_json::Value>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logprobs: Option<serde_json::Value>,
    top_logprobs: Option<serde_json::Value>,
}

fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `GET /v1/models`.
pub async fn models(State(app): State<Arc<AppState>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{"id": app.model_id, "object": "model", "created": app.started, "owned_by": "suffixd"}],
    }))
    .into_response()
}

/// `POST /v1/completions`.
pub async fn completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(app, headers, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(app, headers, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// How much of an oversize body the server reads and discards before it answers 413,
/// as a multiple of the limit. Closing a connection with unread bytes makes the kernel
/// reset it, and a client still writing then sees a broken pipe instead of the error
/// message; draining a bounded amount lets ordinary clients read the 413.
const OVERSIZE_DRAIN_FACTOR: usize = 8;

/// How long the server keeps draining an oversize body.
const OVERSIZE_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Read a JSON body of at most `limit` bytes, within `timeout`: a client that stops
/// sending mid-body gets 408 instead of holding its connection.
async fn read_json<T: serde::de::DeserializeOwned>(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<T, ApiError> {
    tokio::time::timeout(timeout, read_json_untimed(body, limit))
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs()
                ),
            ))
        })
}

async fn read_json_untimed<T: serde::de::DeserializeOwned>(
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    use axum::body::HttpBody;
    use futures_util::StreamExt;

    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body is larger than {limit} bytes; send a smaller request"),
        )
    };
    let drain_cap = limit.saturating_mul(OVERSIZE_DRAIN_FACTOR);
    let declared = body.size_hint().exact();
    if declared.is_some_and(|n| n > drain_cap as u64) {
        // Too large to be worth reading at all.
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("could not read the body: {e}")))?;
        if bytes.len() + chunk.len() > limit {
            let mut seen = bytes.len() + chunk.len();
            drop(bytes);
            let drain = async {
                while seen <= drain_cap {
                    match stream.next().await {
                        Some(Ok(c)) => seen += c.len(),
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(OVERSIZE_DRAIN_TIME, drain).await;
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Validate a request, tokenize it and hand it to the model thread.
async fn generate(
    app: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    let req: GenerationRequest =
        read_json(body, app.cfg.max_body_bytes, app.cfg.read_timeout()).await?;
    check_supported(&app, &req)?;
    let pieces = prompt_pieces(&app, &req, chat)?;
    let namespace = namespace_of(&headers, &req)?;
    let opts = generate_options(&app, &req, namespace)?;
    let prompt = tokenize_prompt(&app, &pieces, opts.max_tokens)?;
    let (tok_tx, tok_rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = oneshot::channel();
    let job = Job {
        prompt,
        opts,
        tokens: tok_tx,
        done: done_tx,
    };
    app.jobs.send(job).map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the model thread has stopped",
        )
    })?;
    let id = format!(
        "{}-{}",
        if chat { "chatcmpl" } else { "cmpl" },
        app.next_id()
    );
    if req.stream {
        return Ok(stream_response(app, id, chat, tok_rx, done_rx).into_response());
    }
    // Held until the answer is ready: if the client goes away this handler is dropped
    // with it, the channel closes, and the model thread cancels the generation.
    let _cancel_on_drop = tok_rx;
    let g = await_generation(&app, done_rx).await?;
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": g.text}, "finish_reason": finish(&g)})
    } else {
        json!({"index": 0, "text": g.text, "finish_reason": finish(&g), "logprobs": null})
    };
    Ok(Json(json!({
        "id": id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": unix_s(),
        "model": app.model_id,
        "choices": [choice],
        "usage": usage(&g),
        "suffixd": spec_stats(&g),
    }))
    .into_response())
}

/// Refuse what this server does not do: another model, n > 1, penalties, logprobs.
fn check_supported(app: &AppState, req: &GenerationRequest) -> Result<(), ApiError> {
    if let Some(m) = &req.model
        && *m != app.model_id
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "model {m:?} is not served here; GET /v1/models lists {:?}",
                app.model_id
            ),
        )
        .code("model_not_found"));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported"));
    }
    if req.presence_penalty.is_some_and(|p| p != 0.0)
        || req.frequency_penalty.is_some_and(|p| p != 0.0)
    {
        return Err(ApiError::bad_request(
            "presence and frequency penalties are not supported",
        ));
    }
    if wants_logprobs(&req.logprobs) || wants_logprobs(&req.top_logprobs) {
        return Err(ApiError::bad_request(
            "logprobs are not supported by this server; leave out `logprobs` and `top_logprobs`",
        ));
    }
    Ok(())
}

/// The prompt's text: the chat template over `messages`, or `prompt`.
/// The prompt: the chat template's rendering of `messages` (its markup apart from the
/// contents, which are text whatever they hold), or the completion `prompt`, text too
/// unless the server allows control tokens in it (`--allow-control-tokens`).
fn prompt_pieces(
    app: &AppState,
    req: &GenerationRequest,
    chat: bool,
) -> Result<Vec<PromptPiece>, ApiError> {
    Ok(if chat {
        let messages = req
            .messages
            .as_ref()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::bad_request("`messages` must be a non-empty list"))?
            .iter()
            .map(RequestMessage::to_template)
            .collect::<Result<Vec<_>, _>>()?;
        app.template
            .as_ref()
            .ok_or_else(|| {
                ApiError::bad_request("this model has no chat template; use /v1/completions")
            })?
            .render_pieces(&messages)
            .map_err(|e| match e {
                TemplateError::Render(_) => ApiError::bad_request(e.to_string()),
                TemplateError::Compile(_) => ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e.to_string(),
                ),
            })?
    } else {
        if req.messages.is_some() {
            return Err(ApiError::bad_request(
                "`messages` belongs to /v1/chat/completions",
            ));
        }
        let prompt = req
            .prompt
            .clone()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| ApiError::bad_request("`prompt` must be a non-empty string"))?;
        vec![if app.cfg.allow_control_tokens {
            PromptPiece::Markup(prompt)
        } else {
            PromptPiece::Content(prompt)
        }]
    })
}

/// Sampling, length and stop strings, checked against the server's limits.
fn generate_options(
    app: &AppState,
    req: &GenerationRequest,
    namespace: String,
) -> Result<GenerateOptions, ApiError> {
    let temperature = req.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request("temperature must be between 0 and 2"));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request("top_p must be in (0, 1]"));
    }
    let max_tokens = req
        .max_completion_tokens
        .or(req.max_tokens)
        .unwrap_or(app.cfg.default_max_tokens);
    if max_tokens == 0 || max_tokens > app.cfg.max_tokens_limit {
        return Err(ApiError::bad_request(format!(
            "max_tokens must be between 1 and {}",
            app.cfg.max_tokens_limit
        )));
    }
    let stop = match &req.stop {
        Stop::None => vec![],
        Stop::One(s) => vec![s.clone()],
        Stop::Many(v) => v.clone(),
    };
    Ok(GenerateOptions {
        max_tokens,
        sampling: Sampling {
            temperature,
            top_p,
            top_k: req.top_k.unwrap_or(0),
            seed: req.seed.unwrap_or_else(rand::random),
        },
        stop,
        speculate: app.cfg.speculate,
        namespace,
    })
}

/// The prompt's tokens, refused when they and `max_tokens` cannot fit in the context.
fn tokenize_prompt(
    app: &AppState,
    pieces: &[PromptPiece],
    max_tokens: usize,
) -> Result<Vec<u32>, ApiError> {
    let bytes: usize = pieces
        .iter()
        .map(|p| match p {
            PromptPiece::Markup(t) | PromptPiece::Content(t) => t.len(),
        })
        .sum();
    // No token is longer than the tokenizer's longest, so a text this long cannot fit:
    // refuse it before tokenizing costs time and memory.
    let most_bytes = app
        .context_len
        .saturating_mul(app.tokenizer.max_token_bytes());
    if bytes > most_bytes {
        return Err(ApiError::bad_request(format!(
            "this model's maximum context length is {} tokens, and a prompt of {} bytes cannot fit in it",
            app.context_len,
            bytes
        ))
        .code("context_length_exceeded"));
    }
    let prompt = app
        .tokenizer
        .encode_pieces(pieces)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if prompt.len() + max_tokens > app.context_len {
        return Err(ApiError::bad_request(format!(
            "this model's maximum context length is {} tokens; the prompt has {} and max_tokens asks for {}",
            app.context_len,
            prompt.len(),
            max_tokens
        ))
        .code("context_length_exceeded"));
    }
    Ok(prompt)
}

/// The namespace to draft from and learn into: the `x-suffixd-namespace` header, else
/// `user`, else "default".
fn namespace_of(headers: &HeaderMap, req: &GenerationRequest) -> Result<String, ApiError> {
    let namespace = match headers.get("x-suffixd-namespace") {
        Some(v) => v
            .to_str()
            .map_err(|_| {
                ApiError::bad_request("the x-suffixd-namespace header must be printable ASCII")
            })?
            .to_string(),
        None => req.user.clone().unwrap_or_else(|| "default".into()),
    };
    check_namespace(&namespace)?;
    Ok(namespace)
}

/// The model thread's answer to a job; failures are counted.
async fn await_generation(
    app: &AppState,
    done: oneshot::Receiver<Result<Generation, JobError>>,
) -> Result<Generation, ApiError> {
    match done.await {
        Ok(Ok(g)) => Ok(g),
        Ok(Err(e)) => {
            app.metrics.record_error();
            Err(e.into())
        }
        Err(_) => {
            app.metrics.record_error();
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "generation was dropped",
            ))
        }
    }
}

fn finish(g: &Generation) -> &'static str {
    match g.finish_reason {
        crate::verify::engine::FinishReason::Length => "length",
        _ => "stop",
    }
}

fn usage(g: &Generation) -> serde_json::Value {
    json!({
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.tokens.len(),
        "total_tokens": g.prompt_tokens + g.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": g.cached_prompt_tokens},
    })
}

fn spec_stats(g: &Generation) -> serde_json::Value {
    json!({"steps": g.steps, "drafted_tokens": g.drafted_tokens, "accepted_tokens": g.accepted_tokens, "tokens_per_s": g.tokens_per_s})
}

/// Server-Sent Events in OpenAI's chunk format, ending with `data: [DONE]`. When the
/// client goes away the stream is dropped, the token channel closes, and the model
/// thread cancels the generation at its next step.
fn stream_response(
    app: Arc<AppState>,
    id: String,
    chat: bool,
    mut tokens: mpsc::UnboundedReceiver<Vec<u32>>,
    done: oneshot::Receiver<Result<Generation, JobError>>,
) -> impl IntoResponse {
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let stream = async_stream::stream! {
        let created = unix_s();
        let chunk = |delta: serde_json::Value, finish: Option<&str>| -> Event {
            let choice = if chat {
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            } else {
                json!({"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")), "finish_reason": finish, "logprobs": null})
            };
            Event::default().data(json!({"id": id, "object": object, "created": created, "model": app.model_id, "choices": [choice]}).to_string())
        };
        if chat {
            yield Ok::<Event, Infallible>(chunk(json!({"role": "assistant", "content": ""}), None));
        }
        // Decode incrementally: the text of all tokens so far, minus what was sent, so
        // that multi-byte characters split across tokens come out whole.
        let mut all: Vec<u32> = Vec::new();
        let mut sent = 0usize;
        while let Some(new) = tokens.recv().await {
            all.extend_from_slice(&new);
            let text = match app.tokenizer.decode(&all, true) {
                Ok(text) => text,
                Err(e) => {
                    // The ids come from the model's own vocabulary, so this is a bug;
                    // the next tokens are tried again with the whole text.
                    tracing::error!("cannot decode the generated tokens: {e}");
                    continue;
                }
            };
            if text.len() > sent && text.is_char_boundary(sent) && !text.ends_with('\u{fffd}') {
                let piece = text[sent..].to_string();
                sent = text.len();
                yield Ok(chunk(json!({"content": piece}), None));
            }
        }
        match done.await {
            Ok(Ok(g)) => {
                if g.text.len() > sent && g.text.is_char_boundary(sent) {
                    yield Ok(chunk(json!({"content": g.text[sent..].to_string()}), None));
                }
                let choice = if chat {
                    json!({"index": 0, "delta": {}, "finish_reason": finish(&g)})
                } else {
                    json!({"index": 0, "text": "", "finish_reason": finish(&g), "logprobs": null})
                };
                let last = json!({"id": id, "object": object, "created": created, "model": app.model_id,
                    "choices": [choice], "usage": usage(&g), "suffixd": spec_stats(&g)});
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

// ---------------------------------------------------------------------------------
// Admin API

fn authorize(app: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &app.cfg.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "the admin API is disabled: set SUFFIXD_ADMIN_TOKEN to enable it",
        ));
    };
    if !app.admin_guard.may_try() {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "more than {} wrong admin tokens in the last second: admin requests are refused until it has passed",
                AdminGuard::FAILURES_PER_SECOND
            ),
        ));
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes())) {
        app.admin_guard.failed();
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong admin token: send Authorization: Bearer $SUFFIXD_ADMIN_TOKEN",
        ));
    }
    Ok(())
}

/// Whether `given` equals `secret`, in a time that depends on their lengths only, not on
/// where they first differ (which would let a client find the token byte by byte).
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != secret.len());
    for (i, &s) in secret.iter().enumerate() {
        diff |= s ^ given.get(i).copied().unwrap_or(!s);
    }
    std::hint::black_box(diff) == 0
}

/// A cap on wrong admin tokens: past [`AdminGuard::FAILURES_PER_SECOND`] in one second,
/// every admin request is refused (429) for the rest of it, so guessing runs at that
/// rate rather than as fast as a connection carries requests.
#[derive(Default)]
pub struct AdminGuard {
    /// The current one-second window and the failures in it.
    window: std::sync::Mutex<(Option<std::time::Instant>, u32)>,
}

impl AdminGuard {
    /// Wrong tokens allowed per second.
    pub const FAILURES_PER_SECOND: u32 = 20;

    fn current(&self) -> std::sync::MutexGuard<'_, (Option<std::time::Instant>, u32)> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.0
            .is_none_or(|start| start.elapsed() >= std::time::Duration::from_secs(1))
        {
            *w = (Some(std::time::Instant::now()), 0);
        }
        w
    }

    fn may_try(&self) -> bool {
        self.current().1 < Self::FAILURES_PER_SECOND
    }

    fn failed(&self) {
        self.current().1 += 1;
    }
}

/// `POST /admin/snapshot` and `POST /admin/compact`: start in the background, answer 202
/// with a job to poll.
pub async fn admin_snapshot(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&app, &headers) {
        return e.into_response();
    }
    let job = app.start_snapshot_job();
    (
        StatusCode::ACCEPTED,
        Json(json!({"job": job, "status": "running", "poll": format!("/admin/jobs/{job}")})),
    )
        .into_response()
}

/// `GET /admin/jobs/{id}`.
pub async fn admin_job(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<u64>,
) -> Response {
    if let Err(e) = authorize(&app, &headers) {
        return e.into_response();
    }
    match app.jobs_status.lock().expect("jobs").get(&id) {
        Some(v) => Json(v.clone()).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no job {id}"),
        )
        .into_response(),
    }
}

/// `GET /admin/stats`.
pub async fn admin_stats(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&app, &headers) {
        return e.into_response();
    }
    Json(AdminStats {
        store: app.store.stats(),
        serving: app.metrics.summary(),
        cost_curve: app.metrics.cost_curve(),
        replication: app.replication.as_ref().map(|r| r.stats(&app.store)),
    })
    .into_response()
}

/// Body of `GET /admin/stats`: the store's figures, with the serving ones beside them.
#[derive(Serialize)]
struct AdminStats {
    #[serde(flatten)]
    store: StoreStats,
    serving: serde_json::Value,
    cost_curve: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    replication: Option<ReplicationStats>,
}

/// Body of `POST /admin/evict`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EvictRequest {
    namespace: Option<String>,
    id: Option<u64>,
    /// Evict everything not used for this many seconds.
    older_than_s: Option<u64>,
}

/// `POST /admin/evict`: by id (with its namespace), a whole namespace, or by age.
pub async fn admin_evict(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = authorize(&app, &headers) {
        return e.into_response();
    }
    let req: EvictRequest = match read_json(body, 64 << 10, app.cfg.read_timeout()).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let app2 = app.clone();
    let result = tokio::task::spawn_blocking(move || {
        let store = &app2.store;
        let (evicted, op) = match (req.namespace, req.id, req.older_than_s) {
            (Some(namespace), Some(id), None) => (
                store.evict(&namespace, id).map(|b| b as usize),
                RecordOp::Evict { namespace, id },
            ),
            (Some(namespace), None, None) => (
                store.evict_namespace(&namespace),
                RecordOp::EvictNamespace { namespace },
            ),
            (None, None, Some(s)) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                // An age past the epoch evicts nothing, however large.
                let cutoff_ms = now.saturating_sub(s.saturating_mul(1000));
                (
                    store.evict_unused_since(cutoff_ms),
                    RecordOp::EvictUnusedSince { cutoff_ms },
                )
            }
            _ => return Ok(usize::MAX),
        };
        let evicted = evicted.map_err(|e| e.to_string())?;
        // An operator's eviction reaches every replica: it is written down before the
        // answer, and goes out when NATS can take it.
        if let Some(r) = &app2.replication {
            r.evicted(op).map_err(|e| {
                format!("evicted {evicted} here, but not sent to the other replicas: {e}. Retry the eviction")
            })?;
        }
        Ok::<usize, String>(evicted)
    })
    .await;
    match result {
        Ok(Ok(usize::MAX)) => ApiError::bad_request(
            "give {\"namespace\", \"id\"}, {\"namespace\"} or {\"older_than_s\"}",
        )
        .into_response(),
        Ok(Ok(n)) => Json(json!({"evicted": n})).into_response(),
        Ok(Err(e)) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e).into_response()
        }
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
        .into_response(),
    }
}

/// `GET /admin/verify`: check the current snapshot completely.
pub async fn admin_verify(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&app, &headers) {
        return e.into_response();
    }
    let store = app.store.clone();
    match tokio::task::spawn_blocking(move || store.verify()).await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(e)) => (
            StatusCode::OK,
            Json(json!({"ok": false, "error": e.to_string()})),
        )
            .into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
        .into_response(),
    }
}

/// `GET /metrics`.
pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    let stats = app.store.stats();
    let mut text = app.metrics.render(
        stats.cached_tokens,
        stats.cached_sequences as u64,
        stats.counters.evicted,
        stats.counters.snapshots,
    );
    if let Some(r) = &app.replication {
        text.push_str(&r.stats(&app.store).prometheus());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A known path with a method it does not take.
pub async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this endpoint does not take that method (completions and admin changes are POST; models, stats, jobs and metrics are GET)",
    )
    .into_response()
}

/// Any other path.
pub async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint",
    )
    .into_response()
}
