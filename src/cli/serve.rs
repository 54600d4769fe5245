//! `suffixd serve`: settings from a TOML file, overridden by environment variables,
//! overridden by flags; then the server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use crate::chat::{ChatTemplate, TemplateError};
use crate::replicate::ReplicationConfig;
use crate::serve::{ServeConfig, serve};
use crate::store::wal::FsyncPolicy;

use super::SpecArgs;
use super::generate::{ModelArgs, model_path};

/// The config file's keys (all optional). See the README for each.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    addr: Option<SocketAddr>,
    snapshot_dir: Option<PathBuf>,
    warm_logs: Option<Vec<PathBuf>>,
    model: Option<PathBuf>,
    max_body_bytes: Option<usize>,
    default_max_tokens: Option<usize>,
    max_tokens_limit: Option<usize>,
    speculate: Option<bool>,
    grammar_drafts: Option<bool>,
    allow_control_tokens: Option<bool>,
    max_batch: Option<usize>,
    budget_tokens: Option<u64>,
    max_age_s: Option<u64>,
    fsync: Option<FsyncPolicy>,
    snapshot_on_exit: Option<bool>,
    read_timeout_s: Option<u64>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    shutdown_grace_s: Option<u64>,
    drain_delay_s: Option<u64>,
    max_queued: Option<usize>,
    stall_limit_s: Option<u64>,
    replicate: Option<String>,
    cluster: Option<String>,
    publish_snapshots_s: Option<u64>,
    keep_snapshots: Option<usize>,
    stream_max_age_s: Option<u64>,
    stored_responses_bytes: Option<usize>,
    api_keys: Option<PathBuf>,
    prefix_cache_bytes: Option<u64>,
    prefix_cache_share: Option<u8>,
    draft_model: Option<PathBuf>,
    draft_weights: Option<crate::model::forward::WeightFormat>,
    hybrid_tau: Option<f64>,
    chat_template: Option<PathBuf>,
    reasoning_format: Option<crate::serve::ReasoningFormat>,
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Args, Debug)]
pub(super) struct ServeArgs {
    /// TOML config file; flags and SUFFIXD_* variables override its keys.
    #[arg(long, env = "SUFFIXD_CONFIG")]
    config: Option<PathBuf>,
    /// Listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "SUFFIXD_ADDR")]
    addr: Option<SocketAddr>,
    /// Store directory for snapshots and the WAL [default: snapshots].
    #[arg(long, env = "SUFFIXD_SNAPSHOT_DIR")]
    snapshot_dir: Option<PathBuf>,
    /// Logs to warm-start from when the store has no snapshot (repeatable).
    #[arg(long)]
    warm_logs: Vec<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// A chat template file (Jinja, as in a model's tokenizer_config.json) to use
    /// instead of the model's own: for a model without one, or one whose template does
    /// not render tools [default: the model's].
    #[arg(long, env = "SUFFIXD_CHAT_TEMPLATE")]
    chat_template: Option<PathBuf>,
    /// Where a thinking model's thoughts go (Qwen 3, QwQ, DeepSeek-R1's distillations:
    /// templates that mark them with `<think>`): `auto` sends them as
    /// `reasoning_content`, apart from the answer, and lets the model think before an
    /// answer a grammar holds; `none` leaves them in the content [default: auto].
    #[arg(long, value_enum, env = "SUFFIXD_REASONING_FORMAT")]
    reasoning_format: Option<crate::serve::ReasoningFormat>,
    /// Variables every request's chat template gets, as a JSON object (a request's own
    /// `chat_template_kwargs` replace them key by key): `{"enable_thinking": false}`
    /// serves Qwen 3 without thoughts [default: none].
    #[arg(long, env = "SUFFIXD_CHAT_TEMPLATE_KWARGS", value_parser = template_variables)]
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Plain decoding, no speculation (for comparisons).
    #[arg(long)]
    no_spec: bool,
    /// Do not draft the tokens a structured output's grammar forces (drafts are still
    /// cut to the grammar); for comparisons.
    #[arg(long)]
    no_grammar_drafts: bool,
    /// Read control-token strings (`<|im_end|>`) in `/v1/completions` prompts as control
    /// tokens, for trusted callers that write raw prompts. Off by default: prompts and
    /// message contents are text, and only the chat template's own markup makes control
    /// tokens, so untrusted text cannot close its turn or forge another.
    #[arg(long)]
    allow_control_tokens: bool,
    /// Most requests decoded together in one batch; more wait in the queue [default: 16].
    #[arg(long, env = "SUFFIXD_MAX_BATCH")]
    max_batch: Option<usize>,
    /// Most cached tokens; least recently used responses are evicted beyond it
    /// [default: a sixteenth of the memory (the cgroup's limit in a container) at 80
    /// bytes a token, at most 8,000,000].
    #[arg(long, env = "SUFFIXD_BUDGET_TOKENS")]
    budget_tokens: Option<u64>,
    /// Evict cached responses unused for this many seconds.
    #[arg(long)]
    max_age_s: Option<u64>,
    /// WAL fsync policy [default: always].
    #[arg(long, value_enum)]
    fsync: Option<FsyncPolicy>,
    /// Write a snapshot on graceful shutdown [default: true].
    #[arg(long)]
    snapshot_on_exit: Option<bool>,
    /// `max_tokens` of requests that give none [default: 256].
    #[arg(long)]
    default_max_tokens: Option<usize>,
    /// Largest `max_tokens` accepted [default: 2048].
    #[arg(long)]
    max_tokens_limit: Option<usize>,
    /// Seconds to wait for a request's headers, and for its body; also the idle limit
    /// of a kept-alive connection [default: 30].
    #[arg(long)]
    read_timeout_s: Option<u64>,
    /// Most connections open at once; as they near it, each new one closes the one idle
    /// longest, and beyond it new ones are closed on arrival [default: 1024].
    #[arg(long)]
    max_connections: Option<usize>,
    /// Most connections open at once from one client address; more are closed on
    /// arrival. Behind a proxy or load balancer every connection comes from its address:
    /// raise it to `--max-connections` there [default: half of --max-connections].
    #[arg(long)]
    max_connections_per_client: Option<usize>,
    /// Seconds requests in flight get to finish after SIGTERM, before they are cancelled
    /// and the snapshot is written [default: 30].
    #[arg(long)]
    shutdown_grace_s: Option<u64>,
    /// Seconds between SIGTERM and closing the listener: `/ready` answers 503 at once
    /// while requests are still served, so that a load balancer takes the server out
    /// first; set it to the balancer's probe interval [default: 0].
    #[arg(long)]
    drain_delay_s: Option<u64>,
    /// Most requests waiting for the model thread beyond those it decodes; more get 429
    /// with `Retry-After`, except for a namespace holding less than its share (this over
    /// the namespaces waiting), up to twice this [default: 256].
    #[arg(long, env = "SUFFIXD_MAX_QUEUED")]
    max_queued: Option<usize>,
    /// Seconds the model thread may go without finishing a step (or, when idle, a
    /// wait) before `/health` reports it stalled [default: 120].
    #[arg(long)]
    stall_limit_s: Option<u64>,
    /// Share the learned cache with the other replicas of `--cluster` through this NATS
    /// JetStream server (`nats://HOST:PORT`) [default: no replication].
    #[arg(long, env = "SUFFIXD_REPLICATE")]
    replicate: Option<String>,
    /// The replicas that share one cache: names the JetStream stream [default: suffixd].
    #[arg(long, env = "SUFFIXD_CLUSTER")]
    cluster: Option<String>,
    /// With --replicate: write and publish a snapshot every this many seconds (on one
    /// designated replica) [default: only on POST /admin/snapshot].
    #[arg(long = "publish-snapshots", env = "SUFFIXD_PUBLISH_SNAPSHOTS")]
    publish_snapshots_s: Option<u64>,
    /// With --replicate: how many published snapshots the cluster's bucket keeps
    /// [default: 3].
    #[arg(long)]
    keep_snapshots: Option<usize>,
    /// With --replicate: how long the cluster's stream keeps records, in seconds (at
    /// least 120), set on the stream at start. A replica away longer catches up from the
    /// newest published snapshot, so publish snapshots more often [default: the stream's
    /// setting; a new stream keeps records forever].
    #[arg(long = "stream-max-age", env = "SUFFIXD_STREAM_MAX_AGE")]
    stream_max_age_s: Option<u64>,
    /// Most bytes of `/v1/responses` answers kept in memory for `previous_response_id`
    /// and `GET /v1/responses/{id}`, the least recently used out first; a response
    /// counts with the conversation before it. With --replicate also kept in NATS and
    /// shared by the replicas (else lost at a restart); 0 keeps none [default: 67108864
    /// (64 MiB)].
    #[arg(long, env = "SUFFIXD_STORED_RESPONSES_BYTES")]
    stored_responses_bytes: Option<usize>,
    /// A file of API keys for the OpenAI routes, one a line: `KEY` (any namespace) or
    /// `KEY NAMESPACE` (a tenant: that namespace and its own stored responses only);
    /// `#` starts a comment. Read again on SIGHUP. With SUFFIXD_API_KEY (one more key,
    /// unbound) [default: no keys, the routes are open].
    #[arg(long, env = "SUFFIXD_API_KEYS")]
    api_keys: Option<PathBuf>,
}

/// `--chat-template-kwargs`: a JSON object.
fn template_variables(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err("must be a JSON object, such as {\"enable_thinking\": false}".into()),
        Err(e) => Err(format!("is not JSON: {e}")),
    }
}

/// Template variables from the flag or the config file, refused when they would replace
/// one the server sets.
fn checked_template_variables(
    variables: serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    if let Some(name) = crate::chat::reserved_variable(&variables) {
        anyhow::bail!(
            "chat_template_kwargs may not set `{name}`: the server sets it from each request"
        );
    }
    Ok(variables)
}

/// The chat template `source` (read from `path`) for `engine`'s model: with its
/// template's `bos_token` and `eos_token`, or, for a model without one, its
/// end-of-sequence token's text and an empty `bos_token`.
fn chat_template_for(
    source: &str,
    path: &Path,
    engine: &crate::engine::Engine,
) -> anyhow::Result<ChatTemplate> {
    let template = match engine.template() {
        Some(own) => own.with_source(source),
        None => {
            let eos = engine
                .eos()
                .first()
                .and_then(|&id| engine.tokenizer().decode(&[id], false).ok())
                .unwrap_or_default();
            ChatTemplate::new(source, "", &eos)
        }
    };
    template.map_err(|e| match e {
        TemplateError::Compile(e) | TemplateError::Render(e) => {
            anyhow::anyhow!("the chat template {} does not compile: {e}", path.display())
        }
    })
}

fn read_config(path: Option<&Path>) -> anyhow::Result<FileConfig> {
    match path {
        None => Ok(FileConfig::default()),
        Some(p) => {
            let text = crate::files::read_regular_to_string(p, "config file")
                .with_context(|| format!("cannot read config {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("config {} is not valid", p.display()))
        }
    }
}

pub(super) fn run_serve(a: ServeArgs) -> anyhow::Result<()> {
    // Fault points named in FAILPOINTS, for the tests; nothing in a release build.
    let _faults = fail::FailScenario::setup();
    // Before any thread starts, so that none gets an arena of its own.
    crate::memory::limit_arenas(crate::memory::SERVER_ARENAS);
    let file = read_config(a.config.as_deref())?;
    let stream_max_age = a.stream_max_age_s.or(file.stream_max_age_s);
    if let Some(age) = stream_max_age {
        let least = crate::replicate::DUPLICATE_WINDOW.as_secs();
        anyhow::ensure!(
            age >= least,
            "--stream-max-age {age}: the stream must keep records at least {least} s (its duplicate window)"
        );
    }
    let max_connections = a.max_connections.or(file.max_connections).unwrap_or(1024);
    let cfg = ServeConfig {
        addr: a
            .addr
            .or(file.addr)
            .unwrap_or(([127, 0, 0, 1], 8080).into()),
        snapshot_dir: a
            .snapshot_dir
            .or(file.snapshot_dir)
            .unwrap_or_else(|| "snapshots".into()),
        warm_logs: if a.warm_logs.is_empty() {
            file.warm_logs.unwrap_or_default()
        } else {
            a.warm_logs
        },
        admin_token: std::env::var("SUFFIXD_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
        api_key: std::env::var("SUFFIXD_API_KEY")
            .ok()
            .filter(|t| !t.is_empty()),
        api_keys_file: a.api_keys.or(file.api_keys),
        max_body_bytes: file.max_body_bytes.unwrap_or(1 << 20),
        default_max_tokens: a
            .default_max_tokens
            .or(file.default_max_tokens)
            .unwrap_or(256),
        max_tokens_limit: a.max_tokens_limit.or(file.max_tokens_limit).unwrap_or(2048),
        speculate: !a.no_spec && file.speculate.unwrap_or(true),
        grammar_drafts: !a.no_grammar_drafts && file.grammar_drafts.unwrap_or(true),
        allow_control_tokens: a.allow_control_tokens || file.allow_control_tokens.unwrap_or(false),
        reasoning_format: a
            .reasoning_format
            .or(file.reasoning_format)
            .unwrap_or_default(),
        chat_template_kwargs: checked_template_variables(
            a.chat_template_kwargs
                .or(file.chat_template_kwargs)
                .unwrap_or_default(),
        )?,
        max_batch: a.max_batch.or(file.max_batch).unwrap_or(16).max(1),
        budget_tokens: Some(
            a.budget_tokens
                .or(file.budget_tokens)
                .unwrap_or_else(crate::store::live::default_budget_tokens),
        ),
        max_age_s: a.max_age_s.or(file.max_age_s),
        fsync: a.fsync.or(file.fsync).unwrap_or(FsyncPolicy::Always),
        snapshot_on_exit: a.snapshot_on_exit.or(file.snapshot_on_exit).unwrap_or(true),
        read_timeout_s: a.read_timeout_s.or(file.read_timeout_s).unwrap_or(30),
        max_connections,
        max_connections_per_client: a
            .max_connections_per_client
            .or(file.max_connections_per_client)
            .unwrap_or((max_connections / 2).max(1)),
        shutdown_grace_s: a.shutdown_grace_s.or(file.shutdown_grace_s).unwrap_or(30),
        drain_delay_s: a.drain_delay_s.or(file.drain_delay_s).unwrap_or(0),
        max_queued: a.max_queued.or(file.max_queued).unwrap_or(256).max(1),
        stall_limit_s: a.stall_limit_s.or(file.stall_limit_s).unwrap_or(120).max(1),
        replicate: a
            .replicate
            .or(file.replicate)
            .filter(|u| !u.is_empty())
            .map(|url| ReplicationConfig {
                url,
                cluster: a
                    .cluster
                    .or(file.cluster)
                    .unwrap_or_else(|| "suffixd".into()),
                keep_snapshots: a.keep_snapshots.or(file.keep_snapshots).unwrap_or(3).max(1),
                stream_max_age: stream_max_age.map(std::time::Duration::from_secs),
            }),
        publish_snapshots_s: a
            .publish_snapshots_s
            .or(file.publish_snapshots_s)
            .filter(|&s| s > 0),
        stored_responses_bytes: a
            .stored_responses_bytes
            .or(file.stored_responses_bytes)
            .unwrap_or(64 << 20),
    };
    let mut model_args = a.model.clone();
    model_args.prefix_cache_bytes = a.model.prefix_cache_bytes.or(file.prefix_cache_bytes);
    model_args.prefix_cache_share = a.model.prefix_cache_share.or(file.prefix_cache_share);
    model_args.draft_model = a.model.draft_model.clone().or(file.draft_model);
    model_args.draft_weights = a.model.draft_weights.or(file.draft_weights);
    model_args.hybrid_tau = a.model.hybrid_tau.or(file.hybrid_tau);
    model_args.model = Some(model_path(
        a.model.model.as_deref().or(file.model.as_deref()),
    )?);
    let model_id = model_id_of(model_args.model.as_deref());
    tracing::info!("loading {} ({:?} weights)", model_id, model_args.weights);
    // Read before the model loads, so that a wrong path fails at once.
    let chat_template = match a.chat_template.as_deref().or(file.chat_template.as_deref()) {
        Some(path) => Some((
            crate::files::read_regular_to_string(path, "chat template")
                .with_context(|| format!("cannot read the chat template {}", path.display()))?,
            path.to_path_buf(),
        )),
        None => None,
    };
    let engine = model_args.load()?;
    tracing::info!(
        "verifier cost curve t(K)/t(1): {:?}",
        engine.cost_curve().points
    );
    if let (Some(tau), Some(ratio)) = (engine.hybrid_tau(), engine.draft_cost_ratio()) {
        tracing::info!(
            "hybrid mode: the draft model drafts below τ = {tau} expected tokens; one of its passes costs {ratio:.2} target steps"
        );
    }
    let prefix = engine.prefix_cache_stats();
    tracing::info!(
        "prefix cache: {} MB ({} tokens of keys and values)",
        prefix.budget_bytes / 1_000_000,
        prefix.budget_bytes / engine.kv_bytes_per_token().max(1)
    );
    let tokenizer = engine.tokenizer().clone();
    let template = match &chat_template {
        Some((source, path)) => Some(chat_template_for(source, path, &engine)?),
        None => engine.template().cloned(),
    };
    let params = a.spec.params()?;
    warn_about_admin_token(cfg.admin_token.as_deref());
    serve(cfg, engine, tokenizer, template, model_id, params)?;
    Ok(())
}

/// The model's id in the API: its file's name without the extension, or a synthetic
/// shape's whole name (its dots are not an extension).
fn model_id_of(path: Option<&Path>) -> String {
    match path.and_then(|p| p.to_str()) {
        Some(spec) if spec.starts_with("synthetic:") => spec.to_string(),
        _ => path
            .and_then(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    }
}

/// Warn when the admin API is off, or on with a token no client can send.
fn warn_about_admin_token(token: Option<&str>) {
    match token {
        None => tracing::warn!("SUFFIXD_ADMIN_TOKEN is not set: the admin API is disabled"),
        // An Authorization header carries visible ASCII; clients cannot send a token with
        // whitespace (a trailing newline from a file), control or non-ASCII characters.
        Some(t) if !t.bytes().all(|b| b.is_ascii_graphic()) => tracing::warn!(
            "SUFFIXD_ADMIN_TOKEN holds whitespace, control or non-ASCII characters, which no HTTP client can send in an Authorization header: the admin API will refuse every request. Set it to visible ASCII (strip a trailing newline)"
        ),
        Some(_) => {}
    }
}
