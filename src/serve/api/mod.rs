//! The serving edge's HTTP handlers: the OpenAI-compatible API (`openai`), the admin
//! API (`admin`), `/metrics`, and what they share (the error answer, reading a JSON
//! body).

mod admin;
mod answer;
mod keys;
mod openai;
mod probes;
mod request;
mod responses;
mod secrets;
mod stream;
mod thinking;
mod tools;
mod wire;

pub use admin::{admin_evict, admin_job, admin_snapshot, admin_stats, admin_verify, require_admin};
pub use keys::{ApiKeys, ApiKeysError, Caller, KeyGate, require_api_key};
pub use openai::{MAX_NAMESPACE_BYTES, chat_completions, completions, model, models};
pub use probes::{health, ready};
pub use responses::{
    ResponseStore, delete_response, response_input_items, responses, stored_response,
};
pub use secrets::GuessGuard;

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::worker::JobError;

/// An OpenAI-style error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    /// The request field the error is about.
    param: Option<&'static str>,
    message: String,
    /// Seconds to send in `Retry-After`, for an answer that asks to come back later.
    retry_after_s: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            code: None,
            param: None,
            message: message.into(),
            retry_after_s: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
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

impl ApiError {
    /// The error's body, OpenAI's shape.
    fn body(&self) -> wire::ErrorBody<'_> {
        wire::ErrorBody {
            error: wire::ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        response
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

/// How much of an oversize body the server reads and discards before it answers 413,
/// as a multiple of the limit. Closing a connection with unread bytes makes the kernel
/// reset it, and a client still writing then sees a broken pipe instead of the error
/// message; draining a bounded amount lets ordinary clients read the 413.
const OVERSIZE_DRAIN_FACTOR: usize = 8;

/// How long the server keeps draining an oversize body.
const OVERSIZE_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Read a JSON body of at most `limit` bytes, within `timeout`: a client that stops
/// sending mid-body gets 408 instead of holding its connection.
pub(super) async fn read_json<T: serde::de::DeserializeOwned>(
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
    text.push_str(&format!(
        "# HELP suffixd_queued_requests Requests waiting for a slot in the model's batch (beyond --max-queued: 429).\n# TYPE suffixd_queued_requests gauge\nsuffixd_queued_requests {}\n",
        app.queued()
    ));
    let (kept, bytes) = app.responses.usage();
    text.push_str(&format!(
        "# HELP suffixd_stored_responses Responses kept for previous_response_id and GET /v1/responses/{{id}}.\n# TYPE suffixd_stored_responses gauge\nsuffixd_stored_responses {kept}\n\
         # HELP suffixd_stored_response_bytes Bytes of the stored responses in memory (kept, or held by a later one), within --stored-responses-bytes.\n# TYPE suffixd_stored_response_bytes gauge\nsuffixd_stored_response_bytes {bytes}\n"
    ));
    if let Some(shared) = app.responses.shared() {
        text.push_str(&shared.counts().prometheus());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A known path with a method it does not take.
pub async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this endpoint does not take that method (completions, responses and admin changes are POST; models, health, ready, stats, jobs, metrics and openapi.json are GET; a stored response is GET or DELETE, its input items GET)",
    )
    .into_response()
}

/// The OpenAPI document of this API (`GET /openapi.json`), kept beside the handlers and
/// fuzzed against a running server by tests/schemathesis.rs.
const OPENAPI_DOCUMENT: &str = include_str!("openapi.json");

/// `GET /openapi.json`.
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI_DOCUMENT,
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
