//! `/v1/models`, `/v1/completions` and `/v1/chat/completions`: requests checked, tokenized
//! and handed to the model thread; answers whole or streamed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::chat::{CallSyntax, ChatMessage, PromptPiece, TemplateError};
use crate::engine::grammar::{Grammar, GrammarError, GrammarSpec, check_schema};
use crate::engine::{GenerateOptions, Generation, MAX_TOP_LOGPROBS, Sampling};

use super::answer::{chat_finish, finish, logprobs_of, spec_stats_of, unix_s, usage_of};
use super::stream::{self, StreamCalls};
use super::tools::{self, CallForm, ToolPlan};
use super::wire::{AssistantMessage, ChatChoice, Completion, Model, ModelList, TextChoice};
use super::{ApiError, read_json};
use crate::serve::AppState;
use crate::serve::worker::{Delta, Job, JobError};

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

/// One chat message of a request. `name` and other fields clients send along are
/// accepted and not used.
#[derive(Deserialize, Debug)]
struct RequestMessage {
    role: Role,
    /// `null` for an assistant message that only calls tools.
    content: Option<Content>,
    /// An assistant message's calls (OpenAI's form).
    #[serde(default)]
    tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's call id.
    #[serde(default)]
    tool_call_id: Option<String>,
}

impl RequestMessage {
    /// The message for the template; `native`: the template renders tool calls itself
    /// (else they are written into the content, see [`tools`]).
    fn to_template(&self, native_tools: bool) -> Result<ChatMessage, ApiError> {
        let message = self.to_text_message()?;
        match (&self.tool_calls, self.role) {
            (Some(calls), Role::Assistant) if !calls.is_empty() => {
                tools::assistant_with_calls(message, calls, native_tools)
            }
            (Some(calls), _) if !calls.is_empty() => Err(ApiError::bad_request(
                "only assistant messages carry `tool_calls`",
            )),
            _ => Ok(message),
        }
    }

    fn to_text_message(&self) -> Result<ChatMessage, ApiError> {
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
            tool_call_id: self.tool_call_id.clone(),
            ..Default::default()
        })
    }
}

/// What a request's `logprobs` and `top_logprobs` ask for: None, or how many
/// alternatives to list beside each token. Chat: `logprobs: true` turns them on and
/// `top_logprobs` (0 to 20, only with it) sets the alternatives. Completions (the
/// legacy form): `logprobs: N`, 0 to 20.
fn logprobs_wanted(req: &GenerationRequest, chat: bool) -> Result<Option<usize>, ApiError> {
    use serde_json::Value;
    let count = |v: &Value, name: &str| -> Result<usize, ApiError> {
        match v.as_u64() {
            Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Ok(n as usize),
            _ => Err(ApiError::bad_request(format!(
                "`{name}` must be an integer from 0 to {MAX_TOP_LOGPROBS}"
            ))),
        }
    };
    let top = match &req.top_logprobs {
        None | Some(Value::Null) => None,
        Some(v) => Some(count(v, "top_logprobs")?),
    };
    let on = match &req.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) if chat => Some(top.unwrap_or(0)),
        Some(v) if !chat => Some(count(v, "logprobs")?),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`logprobs` must be true or false in a chat completion (`top_logprobs` sets how many alternatives)",
            ));
        }
    };
    match (on, top) {
        (None, Some(_)) if chat => Err(ApiError::bad_request(
            "`top_logprobs` needs `logprobs: true`",
        )),
        (_, Some(_)) if !chat => Err(ApiError::bad_request(
            "`top_logprobs` is a chat completion field; a completion takes `logprobs: N`",
        )),
        _ => Ok(on),
    }
}

pub use crate::store::MAX_NAMESPACE_BYTES;

/// A namespace (from `x-suffixd-namespace` or `user`) is 1 to 128 bytes of printable
/// ASCII without spaces ([`crate::store::is_namespace`]). Anything else is refused,
/// never mapped to another namespace.
pub(super) fn check_namespace(ns: &str) -> Result<(), ApiError> {
    if !crate::store::is_namespace(ns) {
        return Err(ApiError::bad_request(format!(
            "a namespace (the x-suffixd-namespace header or `user`) must be 1 to {MAX_NAMESPACE_BYTES} printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

/// A completion's `prompt`: a string, or a list of them (a choice per prompt and `n`).
/// Token-id prompts are read (and not used) so that they get a clear refusal.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
#[allow(dead_code)]
enum PromptField {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// The fields both endpoints share. Unknown fields are refused, so that a typo is an
/// error and not a silently ignored setting. OpenAI's fields that do not change an
/// answer here are accepted and ignored (`metadata`, `store`, `service_tier`,
/// `reasoning_effort`, `prompt_cache_key`, `safety_identifier`, `verbosity`,
/// `prediction`, `stream_options`); those that would change it are refused unless
/// they ask for nothing (`logit_bias` empty, `modalities` text only, `audio` and
/// `web_search_options` null, `echo` false, `best_of` 1, `suffix` null).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct GenerationRequest {
    model: Option<String>,
    prompt: Option<PromptField>,
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
    tools: Option<Vec<tools::Tool>>,
    tool_choice: Option<serde_json::Value>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<serde_json::Value>,
    // Accepted and ignored: they do not change the answer.
    metadata: Option<serde_json::Value>,
    store: Option<serde_json::Value>,
    service_tier: Option<serde_json::Value>,
    reasoning_effort: Option<serde_json::Value>,
    prompt_cache_key: Option<serde_json::Value>,
    safety_identifier: Option<serde_json::Value>,
    verbosity: Option<serde_json::Value>,
    prediction: Option<serde_json::Value>,
    // Accepted when they ask for nothing this server would do differently.
    logit_bias: Option<serde_json::Value>,
    modalities: Option<serde_json::Value>,
    audio: Option<serde_json::Value>,
    web_search_options: Option<serde_json::Value>,
    echo: Option<serde_json::Value>,
    best_of: Option<serde_json::Value>,
    suffix: Option<serde_json::Value>,
}

/// The served model in OpenAI's form.
fn model_of(app: &AppState) -> Model<'_> {
    Model {
        id: &app.model_id,
        object: "model",
        created: app.started,
        owned_by: "suffixd",
    }
}

/// `GET /v1/models`.
pub async fn models(State(app): State<Arc<AppState>>) -> Response {
    Json(ModelList {
        object: "list",
        data: vec![model_of(&app)],
    })
    .into_response()
}

/// `GET /v1/models/{id}`: the served model, or 404.
pub async fn model(
    State(app): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id != app.model_id {
        return model_not_found(&app, &id).into_response();
    }
    Json(model_of(&app)).into_response()
}

/// The 404 for a model this server does not serve.
fn model_not_found(app: &AppState, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "model {id:?} is not served here; GET /v1/models lists {:?}",
            app.model_id
        ),
    )
    .code("model_not_found")
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

/// Validate a request, tokenize it and hand it to the model thread.
async fn generate(
    app: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    let req: GenerationRequest =
        read_json(body, app.cfg.max_body_bytes, app.cfg.read_timeout()).await?;
    check_supported(&app, &req, chat)?;
    let tool_plan = if chat {
        ToolPlan::from_request(
            req.tools.clone(),
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
            CallForm::of_model(app.template.as_ref(), &app.tokenizer),
        )?
    } else {
        None
    };
    let prompts = prompt_pieces(&app, &req, chat, tool_plan.as_ref())?;
    let n = req.n.unwrap_or(1);
    let choices = prompts.len() * n as usize;
    if choices > MAX_CHOICES as usize {
        return Err(ApiError::bad_request(format!(
            "{} prompts × `n` {n} asks for {choices} choices; at most {MAX_CHOICES}",
            prompts.len()
        )));
    }
    let namespace = namespace_of(&headers, &req)?;
    let mut opts = generate_options(&app, &req, namespace)?;
    opts.logprobs = logprobs_wanted(&req, chat)?;
    // The cheap checks before a grammar costs a compile.
    let format = tools::response_format(req.response_format.as_ref())?;
    check_grammar_limits(&app, format.as_ref(), tool_plan.as_ref())?;
    let prompts = prompts
        .iter()
        .map(|pieces| tokenize_prompt(&app, pieces, opts.max_tokens))
        .collect::<Result<Vec<_>, _>>()?;
    refuse_when_queue_full(&app)?;
    opts.grammar = grammar_of(&app, format, tool_plan.as_ref()).await?;
    // Calls are read from the answer when the model may make them.
    let reads_calls = tool_plan
        .as_ref()
        .filter(|p| p.offers_calls())
        .map(ToolPlan::syntax);
    // A small model repeats the call it just made until `max_tokens`.
    opts.stop_on_repeat = reads_calls.and_then(tools::call_delimiters);
    let jobs = enqueue(&app, &prompts, n, &opts)?;
    let id = format!(
        "{}-{}",
        if chat { "chatcmpl" } else { "cmpl" },
        app.next_id()
    );
    if req.stream {
        // Calls held to the call grammar are in its layout: they stream as they are
        // decoded; others go out whole at the end.
        let calls = match (reads_calls, opts.grammar.is_some()) {
            (Some(syntax), true) => StreamCalls::AsDecoded(syntax),
            (Some(syntax), false) => StreamCalls::Whole(syntax),
            (None, _) => StreamCalls::No,
        };
        let stream = stream::stream_response(app, id, chat, calls, jobs, n as usize);
        return Ok(stream.into_response());
    }
    answer_whole(app, id, chat, reads_calls, n as usize, jobs).await
}

/// Refuse a request while the queue is full, asking the client to come back: a bounded
/// queue (the count is read without a lock, and a request's choices go in together, so
/// the queue may pass the bound by a few).
fn refuse_when_queue_full(app: &AppState) -> Result<(), ApiError> {
    if app.jobs.len() < app.cfg.max_queued {
        return Ok(());
    }
    app.metrics.record_error();
    let mut busy = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        format!(
            "{} requests are waiting for the model (--max-queued {}); retry shortly",
            app.jobs.len(),
            app.cfg.max_queued
        ),
    );
    busy.retry_after_s = Some(1);
    Err(busy)
}

/// What a job sends back: its tokens as they come, and its generation at the end.
type JobChannels = (
    mpsc::UnboundedReceiver<Delta>,
    oneshot::Receiver<Result<Generation, JobError>>,
);

/// Queue one job per choice (prompt p's choice i at index p × n + i), choice i sampling
/// with seed + i; the model thread batches them like any concurrent requests.
fn enqueue(
    app: &AppState,
    prompts: &[Vec<u32>],
    n: u32,
    opts: &GenerateOptions,
) -> Result<Vec<JobChannels>, ApiError> {
    let mut jobs = Vec::new();
    for (prompt, i) in prompts.iter().flat_map(|p| (0..n).map(move |i| (p, i))) {
        let mut opts = opts.clone();
        opts.sampling.seed = opts.sampling.seed.wrapping_add(u64::from(i));
        let (tok_tx, tok_rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = oneshot::channel();
        let job = Job {
            prompt: prompt.clone(),
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
        jobs.push((tok_rx, done_rx));
    }
    Ok(jobs)
}

/// Wait for every choice and answer with them all in one body.
async fn answer_whole(
    app: Arc<AppState>,
    id: String,
    chat: bool,
    reads_calls: Option<CallSyntax>,
    n: usize,
    jobs: Vec<JobChannels>,
) -> Result<Response, ApiError> {
    // The token channels are held until the answers are ready: if the client goes away
    // this handler is dropped with them, and the model thread cancels the generations.
    let (_cancel_on_drop, done): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
    let mut generations = Vec::new();
    for done_rx in done {
        generations.push(await_generation(&app, done_rx).await?);
    }
    let logprobs = |g: &Generation| {
        g.logprobs
            .as_deref()
            .map(|l| logprobs_of(&app, l, chat, &mut 0))
    };
    let (usage, suffixd) = (usage_of(&generations, n), spec_stats_of(&generations));
    if !chat {
        let choices = generations.iter().enumerate().map(|(index, g)| TextChoice {
            index,
            text: g.text.clone(),
            finish_reason: Some(finish(g)),
            logprobs: logprobs(g),
        });
        return Ok(Json(Completion {
            id,
            object: "text_completion",
            created: unix_s(),
            model: app.model_id.clone(),
            choices: choices.collect(),
            usage,
            suffixd,
        })
        .into_response());
    }
    let choices = generations.iter().enumerate().map(|(index, g)| {
        let (content, calls) = tools::read_answer(&g.text, reads_calls);
        ChatChoice {
            index,
            finish_reason: chat_finish(g, &calls),
            message: AssistantMessage {
                role: "assistant",
                content,
                // Calls are read only when the answer could make them (`reads_calls`).
                tool_calls: calls
                    .iter()
                    .map(|c| c.to_wire(None, reads_calls.unwrap_or(CallSyntax::Tagged)))
                    .collect(),
            },
            logprobs: logprobs(g),
        }
    });
    Ok(Json(Completion {
        id,
        object: "chat.completion",
        created: unix_s(),
        model: app.model_id.clone(),
        choices: choices.collect(),
        usage,
        suffixd,
    })
    .into_response())
}

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: u32 = 16;

/// Refuse what this server does not do: another model, more choices than
/// [`MAX_CHOICES`], penalties.
fn check_supported(app: &AppState, req: &GenerationRequest, chat: bool) -> Result<(), ApiError> {
    if let Some(m) = &req.model
        && *m != app.model_id
    {
        return Err(model_not_found(app, m));
    }
    match req.n {
        Some(n) if !(1..=MAX_CHOICES).contains(&n) => {
            return Err(ApiError::bad_request(format!(
                "`n` must be from 1 to {MAX_CHOICES}"
            )));
        }
        _ => {}
    }
    if !chat && (req.tools.is_some() || req.tool_choice.is_some()) {
        return Err(ApiError::bad_request(
            "`tools` belong to /v1/chat/completions",
        ));
    }
    use serde_json::Value;
    let asks_nothing = |v: &Option<Value>, nothing: &[Value]| {
        v.as_ref()
            .is_none_or(|v| v.is_null() || nothing.contains(v))
    };
    let refusals = [
        (
            "logit_bias",
            asks_nothing(&req.logit_bias, &[json!({})]),
            "token biases are not supported",
        ),
        (
            "modalities",
            asks_nothing(&req.modalities, &[json!(["text"])]),
            "this model answers in text only",
        ),
        (
            "audio",
            asks_nothing(&req.audio, &[]),
            "this model answers in text only",
        ),
        (
            "web_search_options",
            asks_nothing(&req.web_search_options, &[]),
            "web search is not available",
        ),
        (
            "echo",
            asks_nothing(&req.echo, &[json!(false)]),
            "echoing the prompt is not supported",
        ),
        (
            "best_of",
            asks_nothing(&req.best_of, &[json!(1)]),
            "`best_of` other than 1 is not supported; use `n`",
        ),
        (
            "suffix",
            asks_nothing(&req.suffix, &[]),
            "insertion (`suffix`) is not supported",
        ),
    ];
    if let Some((field, _, why)) = refusals.iter().find(|(_, ok, _)| !ok) {
        return Err(ApiError::bad_request(format!("`{field}`: {why}")));
    }
    if req.presence_penalty.is_some_and(|p| p != 0.0)
        || req.frequency_penalty.is_some_and(|p| p != 0.0)
    {
        return Err(ApiError::bad_request(
            "presence and frequency penalties are not supported",
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
    tool_plan: Option<&ToolPlan>,
) -> Result<Vec<Vec<PromptPiece>>, ApiError> {
    Ok(if chat {
        let template = app.template.as_ref().ok_or_else(|| {
            ApiError::bad_request("this model has no chat template; use /v1/completions")
        })?;
        let native_tools = template.supports_tools();
        let mut messages = req
            .messages
            .as_ref()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::bad_request("`messages` must be a non-empty list"))?
            .iter()
            .map(|m| m.to_template(native_tools))
            .collect::<Result<Vec<_>, _>>()?;
        tools::fit_call_ids(&mut messages, template.call_syntax());
        let offered = tool_plan.filter(|p| p.offers_calls());
        let tools_json = offered.filter(|_| native_tools).map(ToolPlan::tools_json);
        if let Some(plan) = offered.filter(|_| !native_tools) {
            // The template cannot show tools: the system message describes them.
            let text = plan.system_text();
            match messages.first_mut() {
                Some(first) if first.role == "system" => {
                    first.content = format!("{}\n\n{text}", first.content);
                }
                _ => messages.insert(
                    0,
                    ChatMessage {
                        role: "system".into(),
                        content: text,
                        ..Default::default()
                    },
                ),
            }
        }
        vec![
            template
                .render_pieces_with_tools(&messages, tools_json.as_ref())
                .map_err(|e| match e {
                    TemplateError::Render(_) => ApiError::bad_request(e.to_string()),
                    TemplateError::Compile(_) => ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        e.to_string(),
                    ),
                })?,
        ]
    } else {
        if req.messages.is_some() {
            return Err(ApiError::bad_request(
                "`messages` belongs to /v1/chat/completions",
            ));
        }
        let texts = match &req.prompt {
            Some(PromptField::One(p)) => vec![p.clone()],
            Some(PromptField::Many(ps)) => ps.clone(),
            Some(PromptField::Tokens(_) | PromptField::TokenLists(_)) => {
                return Err(ApiError::bad_request(
                    "`prompt` as token ids is not supported; send the text",
                ));
            }
            None => Vec::new(),
        };
        if texts.is_empty() || texts.iter().any(String::is_empty) {
            return Err(ApiError::bad_request(
                "`prompt` must be a non-empty string or a list of them",
            ));
        }
        texts
            .into_iter()
            .map(|prompt| {
                vec![if app.cfg.allow_control_tokens {
                    PromptPiece::Markup(prompt)
                } else {
                    PromptPiece::Content(prompt)
                }]
            })
            .collect()
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
        draft_model: true,
        namespace,
        logprobs: None,
        grammar: None,
        stop_on_repeat: None,
    })
}

/// Why a response format or tool schemas cannot be used, as the client's 400.
fn unusable(e: GrammarError) -> ApiError {
    ApiError::bad_request(format!(
        "the response format or tool schemas cannot be used: {e}"
    ))
}

/// Refuse tool schemas, and a response format beside them, past the grammar compiler's
/// limits before anything is built from them: a tool grammar embeds them in Lark, where
/// the compiler cannot check them. A response format alone is checked by the compiler.
fn check_grammar_limits(
    app: &AppState,
    format: Option<&GrammarSpec>,
    tool_plan: Option<&ToolPlan>,
) -> Result<(), ApiError> {
    let Some(plan) = tool_plan.filter(|p| p.offers_calls()) else {
        return Ok(());
    };
    let limits = app
        .grammars
        .as_ref()
        .map(|c| *c.limits())
        .unwrap_or_default();
    check_schema(&plan.any_call_schema(), &limits).map_err(unusable)?;
    if let Some(GrammarSpec::JsonSchema(schema)) = format {
        check_schema(schema, &limits).map_err(unusable)?;
    }
    Ok(())
}

/// The grammar a request's answer is held to (`format`, the response format, and tool
/// calls when `tool_choice` asks for them), compiled for the model; a schema or grammar
/// that cannot be compiled is the client's 400, naming the problem.
async fn grammar_of(
    app: &AppState,
    format: Option<GrammarSpec>,
    tool_plan: Option<&ToolPlan>,
) -> Result<Option<Grammar>, ApiError> {
    // `auto` alone only guards calls the model opens: without a grammar engine for
    // this tokenizer, the answer stays free.
    let optional = format.is_none() && tool_plan.is_some_and(ToolPlan::lets_the_model_choose);
    let spec = match tool_plan {
        Some(plan) => plan.grammar(format.as_ref()),
        None => format,
    };
    let Some(spec) = spec else {
        return Ok(None);
    };
    let Some(compiler) = app.grammars.clone() else {
        if optional {
            return Ok(None);
        }
        return Err(ApiError::bad_request(
            "structured outputs and required tool calls are unavailable for this model's tokenizer",
        ));
    };
    // Compiling blocks (on a compile thread, for a slot): off the async workers. If the
    // client goes away meanwhile, this handler is dropped with the guard, and a compile
    // still waiting for its slot is given up.
    let wanted = Arc::new(AtomicBool::new(true));
    let _unwanted_when_dropped = ClearOnDrop(wanted.clone());
    let compiled = tokio::task::spawn_blocking(move || {
        compiler.compile_while(&spec, &|| wanted.load(Ordering::Relaxed))
    })
    .await
    .map_err(|_| GrammarError::Compiler("its task was cancelled".into()))
    .and_then(|r| r);
    match compiled {
        Ok(g) => Ok(Some(g.drafting_forced_tokens(app.cfg.grammar_drafts))),
        Err(e @ GrammarError::Compiler(_)) => {
            tracing::error!("{e}");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            ))
        }
        Err(e) => Err(unusable(e)),
    }
}

/// Clears its flag when dropped: whoever holds it went away.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
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
