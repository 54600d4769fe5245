//! `/v1/models`, `/v1/completions` and `/v1/chat/completions`: requests checked, tokenized
//! and handed to the model thread; answers whole or streamed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::chat::{
    CallSyntax, ChatMessage, PromptPiece, RenderExtras, TemplateError, reserved_variable,
};
use crate::engine::grammar::{Grammar, GrammarError, GrammarSpec, check_schema};
use crate::engine::{GenerateOptions, Generation, Sampling};
use crate::model::detokenizer::floor_char_boundary;

use super::answer::{chat_finish, finish, logprobs_of, spec_stats_of, unix_s, usage_of};
use super::keys::NAMESPACE_HEADER;
use super::request::{GenerationRequest, PromptField, Stop, logprobs_wanted};
use super::stream::{self, StreamCalls};
use super::thinking::Thinking;
use super::tools::{self, CallForm, ToolPlan};
use super::wire::{AssistantMessage, ChatChoice, Completion, Model, ModelList, TextChoice};
use super::{ApiError, read_json};
use crate::serve::AppState;
use crate::serve::worker::{Delta, Job, JobError};

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
    let queued = enqueue_request(&app, &headers, &req, chat).await?;
    let id = format!(
        "{}-{}",
        if chat { "chatcmpl" } else { "cmpl" },
        app.next_id()
    );
    if req.stream {
        let reads = (queued.stream_calls(), queued.thinking);
        let stream = stream::stream_response(app, id, chat, reads, queued.jobs, queued.n);
        return Ok(stream.into_response());
    }
    let reads = (queued.reads_calls, queued.thinking);
    answer_whole(app, id, chat, reads, queued.n, queued.jobs).await
}

/// A request on the model thread's queue: its choices' jobs, and how to read their
/// answers.
pub(super) struct Queued {
    /// One job per choice: prompt p's choice i at p × n + i.
    pub(super) jobs: Vec<JobChannels>,
    /// Choices per prompt (`n`).
    pub(super) n: usize,
    /// How the answers write calls, when they may make them.
    pub(super) reads_calls: Option<CallSyntax>,
    /// Whether the answers are held to a grammar (calls then stream as decoded).
    pub(super) constrained: bool,
    /// A thinking model's thoughts, where the prompt leaves the answer thinking.
    pub(super) thinking: Option<Thinking>,
}

impl Queued {
    /// How a stream sends the calls: held to the call grammar, they are in its layout
    /// and stream as they are decoded; others go out whole at the end.
    pub(super) fn stream_calls(&self) -> StreamCalls {
        match (self.reads_calls, self.constrained) {
            (Some(syntax), true) => StreamCalls::AsDecoded(syntax),
            (Some(syntax), false) => StreamCalls::Whole(syntax),
            (None, _) => StreamCalls::No,
        }
    }
}

/// Check a request (chat or completion), build its prompts, options and grammar, and
/// queue its choices for the model thread (`/v1/responses` comes here as a chat).
pub(super) async fn enqueue_request(
    app: &AppState,
    headers: &HeaderMap,
    req: &GenerationRequest,
    chat: bool,
) -> Result<Queued, ApiError> {
    check_supported(app, req, chat)?;
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
    let prompts = prompt_pieces(app, req, chat, tool_plan.as_ref())?;
    // A chat has one prompt, which may leave its answer thinking.
    let thinking = prompts
        .first()
        .filter(|_| chat)
        .and_then(|p| Thinking::of_prompt(app, p));
    let n = req.n.unwrap_or(1);
    let choices = prompts.len() * n as usize;
    if choices > MAX_CHOICES as usize {
        return Err(ApiError::bad_request(format!(
            "{} prompts × `n` {n} asks for {choices} choices; at most {MAX_CHOICES}",
            prompts.len()
        )));
    }
    let namespace = namespace_of(headers, req)?;
    let mut opts = generate_options(app, req, namespace)?;
    opts.logprobs = logprobs_wanted(req, chat)?;
    // The cheap checks before a grammar costs a compile.
    let format = tools::response_format(req.response_format.as_ref())?;
    check_grammar_limits(app, format.as_ref(), tool_plan.as_ref(), thinking.is_some())?;
    let prompts = prompts
        .iter()
        .map(|pieces| tokenize_prompt(app, pieces, opts.max_tokens))
        .collect::<Result<Vec<_>, _>>()?;
    let prediction = match req.prediction_text()? {
        Some(text) => tokenize_prediction(app, &text, opts.max_tokens)?,
        None => Arc::from([]),
    };
    refuse_when_queue_full(app, &opts.namespace)?;
    opts.grammar = grammar_of(app, format, tool_plan.as_ref(), thinking).await?;
    // Calls are read from the answer when the model may make them.
    let reads_calls = tool_plan
        .as_ref()
        .filter(|p| p.offers_calls())
        .map(ToolPlan::syntax);
    // A small model repeats the call it just made until `max_tokens`.
    opts.stop_on_repeat = reads_calls.and_then(tools::call_delimiters);
    let jobs = enqueue(app, &prompts, n, &opts, &prediction)?;
    Ok(Queued {
        jobs,
        n: n as usize,
        reads_calls,
        constrained: opts.grammar.is_some(),
        thinking,
    })
}

/// Refuse a request while the queue is full, asking the client to come back: a bounded
/// queue (the count is read without a lock, and a request's choices go in together, so
/// the queue may pass the bound by a few). A full queue still takes a request of a
/// namespace holding less than its share of `--max-queued` (the bound over the
/// namespaces waiting, this one counted), up to twice the bound: one tenant filling
/// the queue leaves the others their turns, which the model thread takes in rotation.
fn refuse_when_queue_full(app: &AppState, namespace: &str) -> Result<(), ApiError> {
    let (queued, bound) = (app.queued(), app.cfg.max_queued);
    if queued < bound {
        return Ok(());
    }
    let (mine, namespaces) = app.waiting_by_namespace.share_of(namespace);
    let share = (bound / namespaces).max(1);
    if mine < share && queued < 2 * bound {
        return Ok(());
    }
    app.metrics.record_queue_refusal(namespace);
    let mut busy = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        format!(
            "{queued} requests are waiting for the model (--max-queued {bound}), {mine} of \
             them from namespace {namespace:?} (its share: {share}); retry shortly"
        ),
    );
    busy.retry_after_s = Some(1);
    Err(busy)
}

/// What a job sends back: its tokens as they come, and its generation at the end.
pub(super) type JobChannels = (
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
    prediction: &Arc<[u32]>,
) -> Result<Vec<JobChannels>, ApiError> {
    let mut jobs = Vec::new();
    for (prompt, i) in prompts.iter().flat_map(|p| (0..n).map(move |i| (p, i))) {
        let mut opts = opts.clone();
        opts.sampling.seed = opts.sampling.seed.wrapping_add(u64::from(i));
        let (tok_tx, tok_rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = oneshot::channel();
        let waiting = Some(app.waiting_by_namespace.ticket(&opts.namespace));
        let job = Job {
            prompt: prompt.clone(),
            opts,
            prediction: Arc::clone(prediction),
            tokens: tok_tx,
            done: done_tx,
            waiting,
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
    (reads_calls, thinking): (Option<CallSyntax>, Option<Thinking>),
    n: usize,
    jobs: Vec<JobChannels>,
) -> Result<Response, ApiError> {
    let generations = await_answers(&app, jobs).await?;
    let logprobs = |g: &Generation| {
        g.logprobs
            .as_deref()
            .map(|l| logprobs_of(&app, l, chat, &mut 0))
    };
    let usage = usage_of(&app, &generations, n, thinking);
    let suffixd = spec_stats_of(&generations);
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
        // Calls are read from the answer past the thoughts.
        let (reasoning, answer) = match thinking.map(|t| t.split(&g.text)) {
            Some(split) => (split.thoughts, split.answer),
            None => (None, g.text.as_str()),
        };
        let (content, calls) = tools::read_answer(answer, reads_calls);
        ChatChoice {
            index,
            finish_reason: chat_finish(g, &calls),
            message: AssistantMessage {
                role: "assistant",
                // An answer cut off while thinking has no content.
                content: content.filter(|c| !c.is_empty() || reasoning.is_none()),
                reasoning_content: reasoning.map(str::to_string),
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

/// Every choice's generation, in order. The token channels are held until the answers
/// are ready: if the client goes away the handler is dropped with them, and the model
/// thread cancels the generations.
pub(super) async fn await_answers(
    app: &AppState,
    jobs: Vec<JobChannels>,
) -> Result<Vec<Generation>, ApiError> {
    let (_cancel_on_drop, done): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
    let mut generations = Vec::new();
    for done_rx in done {
        generations.push(await_generation(app, done_rx).await?);
    }
    Ok(generations)
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
    if let Some(kwargs) = &req.chat_template_kwargs {
        if !chat {
            return Err(ApiError::bad_request(
                "`chat_template_kwargs` belongs to /v1/chat/completions",
            ));
        }
        if let Some(name) = reserved_variable(kwargs) {
            return Err(ApiError::bad_request(format!(
                "`chat_template_kwargs` may not set `{name}`: the server sets it from the request"
            )));
        }
    }
    use serde_json::Value;
    let asks_nothing = |v: &Option<Value>, nothing: &[Value]| {
        v.as_ref()
            .is_none_or(|v| v.is_null() || nothing.contains(v))
    };
    let refusals = [
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
    let effort = req.reasoning_effort.as_ref();
    if effort.is_some_and(|e| !e.is_null() && reasoning_effort(req).is_none()) {
        return Err(ApiError::bad_request(format!(
            "`reasoning_effort` (the Responses API's `reasoning.effort`) must be one of {} or null",
            REASONING_EFFORTS.join(", ")
        ))
        .param("reasoning_effort"));
    }
    Ok(())
}

/// The prompt: the chat template's rendering of `messages` (its markup apart from the
/// contents, which are text whatever they hold), or the completion `prompt`, text too
/// unless the server allows control tokens in it (`--allow-control-tokens`). A chat's template
/// gets the tools and its variables ([`template_variables`]).
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
                .render_pieces_with(
                    &messages,
                    RenderExtras {
                        tools: tools_json.as_ref(),
                        variables: Some(&template_variables(app, req)),
                    },
                )
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

/// OpenAI's values of `reasoning_effort`.
const REASONING_EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// The request's `reasoning_effort`, when it is one of OpenAI's values.
fn reasoning_effort(req: &GenerationRequest) -> Option<&str> {
    let effort = req.reasoning_effort.as_ref()?.as_str()?;
    REASONING_EFFORTS.contains(&effort).then_some(effort)
}

/// The chat template's variables: the server's (`--chat-template-kwargs`), then what
/// the request's `reasoning_effort` sets, then the request's own `chat_template_kwargs`,
/// each replacing the one before of the same name (copied only when there are two).
///
/// `reasoning_effort` reaches the template as the variable of that name (as
/// transformers passes it; gpt-oss's template reads it), and `none` (OpenAI's "do not
/// reason") also sets `enable_thinking` false, which closes the thoughts of the
/// templates that read it (Qwen 3, SmolLM3). Other efforts leave thinking as the
/// template has it: open models have no lighter way of thinking to map them to.
fn template_variables<'a>(
    app: &'a AppState,
    req: &'a GenerationRequest,
) -> std::borrow::Cow<'a, serde_json::Map<String, serde_json::Value>> {
    use std::borrow::Cow;
    let server = &app.cfg.chat_template_kwargs;
    let effort = reasoning_effort(req);
    match (&req.chat_template_kwargs, effort) {
        (None, None) => Cow::Borrowed(server),
        (Some(own), None) if server.is_empty() => Cow::Borrowed(own),
        (own, effort) => {
            let mut variables = server.clone();
            if let Some(effort) = effort {
                variables.insert("reasoning_effort".into(), json!(effort));
                if effort == "none" {
                    variables.insert("enable_thinking".into(), json!(false));
                }
            }
            let own = own.iter().flatten();
            variables.extend(own.map(|(k, v)| (k.clone(), v.clone())));
            Cow::Owned(variables)
        }
    }
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
        penalties: req.penalties(app.tokenizer.vocab_size())?,
        ..GenerateOptions::default()
    })
}

/// Why a response format or tool schemas cannot be used, as the client's 400.
fn unusable(e: GrammarError) -> ApiError {
    ApiError::bad_request(format!(
        "the response format or tool schemas cannot be used: {e}"
    ))
}

/// Refuse tool schemas, and a response format beside them or after a model's thoughts
/// (`thinking`), past the grammar compiler's limits before anything is built from them:
/// those grammars embed them in Lark, where the compiler cannot check them. A response
/// format alone is checked by the compiler.
fn check_grammar_limits(
    app: &AppState,
    format: Option<&GrammarSpec>,
    tool_plan: Option<&ToolPlan>,
    thinking: bool,
) -> Result<(), ApiError> {
    let plan = tool_plan.filter(|p| p.offers_calls());
    if plan.is_none() && !thinking {
        return Ok(());
    }
    let limits = app
        .grammars
        .as_ref()
        .map(|c| *c.limits())
        .unwrap_or_default();
    if let Some(plan) = plan {
        check_schema(&plan.any_call_schema(), &limits).map_err(unusable)?;
    }
    if let Some(GrammarSpec::JsonSchema(schema)) = format {
        check_schema(schema, &limits).map_err(unusable)?;
    }
    Ok(())
}

/// The grammar a request's answer is held to (`format`, the response format, and tool
/// calls when `tool_choice` asks for them), after the thoughts of a thinking model,
/// compiled for the model; a schema or grammar that cannot be compiled is the client's
/// 400, naming the problem.
async fn grammar_of(
    app: &AppState,
    format: Option<GrammarSpec>,
    tool_plan: Option<&ToolPlan>,
    thinking: Option<Thinking>,
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
    let spec = match thinking {
        Some(thinking) => thinking.grammar(&spec),
        None => spec,
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

/// The tokens of a prediction's `text`, at most `max_tokens` (an answer holds no more);
/// only as much of the text is tokenized as that many tokens could hold.
fn tokenize_prediction(
    app: &AppState,
    text: &str,
    max_tokens: usize,
) -> Result<Arc<[u32]>, ApiError> {
    let end = floor_char_boundary(
        text,
        max_tokens.saturating_mul(app.tokenizer.max_token_bytes()),
    );
    let mut tokens = app
        .tokenizer
        .encode_literal(&text[..end])
        .map_err(|e| ApiError::bad_request(e.to_string()).param("prediction"))?;
    tokens.truncate(max_tokens);
    Ok(tokens.into())
}

/// The namespace to draft from and learn into: the `x-suffixd-namespace` header, else
/// `user`, else "default".
fn namespace_of(headers: &HeaderMap, req: &GenerationRequest) -> Result<String, ApiError> {
    let namespace = match headers.get(NAMESPACE_HEADER) {
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
