//! `suffixd serve`: the last stage before the CLI. tokio and axum handle HTTP; one
//! model thread runs generation ([`worker`]), each request drafting through a
//! [`crate::drafting::CacheDrafter`]; the store is shared by the model thread
//! (drafts and appends) and the admin endpoints.
//!
//! Boot order: open the newest snapshot of the store directory; if there is none and
//! warm-start logs are configured, build one from them first; then replay the WAL.

pub mod api;
mod fair;
pub mod http;
pub mod metrics;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};

use crate::chat::{ChatTemplate, ThoughtMarkers};
use crate::engine::Engine;
use crate::engine::grammar::GrammarCompiler;
use crate::model::tokenizer::ModelTokenizer;
use crate::replicate::{ReplicaIdentity, Replication, ReplicationConfig, bootstrap};
use crate::speculate::SpecParams;
use crate::store::DiskDirectory;
use crate::store::TokenizerId;
use crate::store::from_logs::{BuildOptions, build_from_logs};
use crate::store::live::{Store, StoreConfig};
use crate::store::manifest::current_snapshot;
use crate::store::wal::FsyncPolicy;

/// Server settings after merging the config file, environment and flags.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServeConfig {
    /// Listen address.
    pub addr: SocketAddr,
    /// Store directory.
    pub snapshot_dir: PathBuf,
    /// Logs to warm-start from when the store has no snapshot.
    pub warm_logs: Vec<PathBuf>,
    /// Admin bearer token; the admin API is disabled without one.
    #[serde(skip)]
    pub admin_token: Option<String>,
    /// `SUFFIXD_API_KEY`: a key of the OpenAI routes (bound to no namespace).
    #[serde(skip)]
    pub api_key: Option<String>,
    /// `--api-keys`: a file of keys of the OpenAI routes, `KEY [NAMESPACE]` a line.
    pub api_keys_file: Option<PathBuf>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// Largest `max_tokens` accepted.
    pub max_tokens_limit: usize,
    /// Speculate (false: plain decoding, for comparison).
    pub speculate: bool,
    /// Draft the tokens a request's grammar forces (false: only cut drafts to the
    /// grammar, for comparison).
    pub grammar_drafts: bool,
    /// Whether a thinking model's thoughts go out apart from its answer.
    #[serde(default)]
    pub reasoning_format: ReasoningFormat,
    /// Variables every request's chat template gets (a request's own
    /// `chat_template_kwargs` replace them key by key).
    #[serde(default)]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Read control-token strings in `/v1/completions` prompts as control tokens (for
    /// trusted callers that write raw prompts); off: every prompt and message content is
    /// text.
    #[serde(default)]
    pub allow_control_tokens: bool,
    /// Most requests decoded together in one batch.
    pub max_batch: usize,
    /// Most cached tokens (LRU eviction beyond).
    pub budget_tokens: Option<u64>,
    /// Evict cached responses unused for this many seconds.
    pub max_age_s: Option<u64>,
    /// WAL fsync policy.
    pub fsync: FsyncPolicy,
    /// Write a snapshot on graceful shutdown.
    pub snapshot_on_exit: bool,
    /// Longest wait for a request's headers, and separately for its body; also how
    /// long a kept-alive connection may sit idle.
    pub read_timeout_s: u64,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one client address.
    pub max_connections_per_client: usize,
    /// Seconds requests in flight get to finish after SIGTERM before they are cancelled.
    pub shutdown_grace_s: u64,
    /// Seconds between a shutdown signal and closing the listener, with `/ready`
    /// answering 503 meanwhile.
    pub drain_delay_s: u64,
    /// Most requests waiting for the model thread; more get 429, except for a namespace
    /// under its share of it (up to twice it).
    pub max_queued: usize,
    /// Seconds the model thread may go without a sign of progress before `/health`
    /// reports it stalled.
    pub stall_limit_s: u64,
    /// Share the cache with other replicas through NATS JetStream (None: single node).
    pub replicate: Option<ReplicationConfig>,
    /// With `replicate`: write and publish a snapshot this often, in seconds.
    pub publish_snapshots_s: Option<u64>,
    /// Most bytes of stored responses kept in memory (0: none are kept).
    #[serde(default)]
    pub stored_responses_bytes: usize,
}

/// Where a thinking model's thoughts go (`--reasoning-format`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningFormat {
    /// Apart: `reasoning_content` holds them, `content` the answer, and a grammar holds
    /// the answer after them (for a model whose template marks thoughts).
    #[default]
    Auto,
    /// In the content, as the model wrote them; a grammar holds the answer from its
    /// first token.
    None,
}

impl ServeConfig {
    /// How long a request's headers, and separately its body, may take to arrive.
    pub fn read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.read_timeout_s.max(1))
    }
}

/// Shared by every handler.
pub struct AppState {
    /// Settings.
    pub cfg: ServeConfig,
    /// The model's id in the API.
    pub model_id: String,
    /// When the server started (Unix seconds).
    pub started: u64,
    /// The tokenizer (a copy, so handlers never wait for the model thread).
    pub tokenizer: ModelTokenizer,
    /// The chat template.
    pub template: Option<ChatTemplate>,
    /// The markers of the model's thoughts, when they go out apart from its answers
    /// (`--reasoning-format auto` and a template that marks them).
    pub thoughts: Option<ThoughtMarkers>,
    /// Compiles requests' grammars (structured outputs, required tool calls); None when
    /// the model's tokenizer cannot be described to the grammar engine.
    pub grammars: Option<GrammarCompiler>,
    /// KV capacity of the model.
    pub context_len: usize,
    /// Jobs for the model thread.
    pub jobs: crossbeam::channel::Sender<worker::Job>,
    /// Jobs the model thread took off `jobs` that wait for a slot in its batch.
    pub waiting: Arc<AtomicUsize>,
    /// Jobs waiting for a slot (on `jobs` or taken off it), by namespace.
    pub waiting_by_namespace: Arc<fair::WaitingCounts>,
    /// The store.
    pub store: Arc<Store>,
    /// Serving metrics.
    pub metrics: Arc<metrics::Metrics>,
    /// Background admin jobs by id: the newest [`JOBS_KEPT`].
    pub jobs_status: Mutex<std::collections::BTreeMap<u64, serde_json::Value>>,
    /// The snapshot job waiting for the one running to finish, if any: later requests
    /// join it instead of queueing another, since the snapshot it writes once it starts
    /// holds what they asked to be saved.
    queued_snapshot: Mutex<Option<u64>>,
    /// Held by the snapshot job that runs: one at a time.
    snapshot_job: Mutex<()>,
    ids: AtomicU64,
    /// Replication, when `--replicate` is set.
    pub replication: Option<Replication>,
    /// The cap on wrong admin tokens.
    pub admin_guard: api::GuessGuard,
    /// The API keys of the OpenAI routes (open without any).
    pub api_keys: api::KeyGate,
    /// Signs of the model thread's progress, for `/health` and `/ready`.
    pub liveness: Arc<worker::Liveness>,
    /// Set on a shutdown signal: `/ready` answers 503 from then on.
    pub draining: std::sync::atomic::AtomicBool,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: api::ResponseStore,
}

/// Admin jobs whose status `GET /admin/jobs/{id}` still answers: the newest.
pub const JOBS_KEPT: usize = 256;

impl AppState {
    /// Requests waiting for the model thread: on its queue, or taken off it and waiting
    /// for a slot in its batch.
    pub fn queued(&self) -> usize {
        self.jobs.len() + self.waiting.load(Ordering::Relaxed)
    }

    /// A fresh id for completions and admin jobs (responses get random ids).
    pub fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// Start a snapshot (which also compacts) on its own thread; returns the job id.
    /// At most two are in flight: the one running and one queued behind it, which every
    /// later request joins until it starts.
    pub fn start_snapshot_job(self: &Arc<Self>) -> u64 {
        let mut queued = self.queued_snapshot.lock().expect("queued snapshot");
        if let Some(job) = *queued {
            return job;
        }
        let job = self.next_id();
        *queued = Some(job);
        drop(queued);
        self.record_job(job, serde_json::json!({"job": job, "status": "running"}));
        let app = self.clone();
        std::thread::spawn(move || {
            let _one = app.snapshot_job.lock().expect("snapshot job");
            // From here a request queues a new job: this one's cut may precede it.
            app.queued_snapshot
                .lock()
                .expect("queued snapshot")
                .take_if(|queued| *queued == job);
            // A replica publishes the snapshot too, tagged with the stream position read
            // before it started (everything up to there is in it).
            let position = app.replication.as_ref().map(|r| r.snapshot_position());
            let result = match app.store.snapshot() {
                Ok(info) => {
                    let mut done =
                        serde_json::json!({"job": job, "status": "done", "snapshot": info});
                    if let (Some(r), Some(position)) = (&app.replication, position) {
                        done["published"] = match r.publish_snapshot(&info.path, position) {
                            Ok(p) => serde_json::json!(p),
                            Err(e) => serde_json::json!({"error": e.to_string()}),
                        };
                    }
                    done
                }
                Err(e) => {
                    app.metrics.record_failed_job();
                    tracing::error!("admin job {job}: the snapshot failed: {e}");
                    serde_json::json!({"job": job, "status": "failed", "error": e.to_string()})
                }
            };
            tracing::info!("admin job {job}: {result}");
            app.record_job(job, result);
        });
        job
    }

    /// Set a job's status, forgetting the oldest beyond [`JOBS_KEPT`].
    fn record_job(&self, job: u64, status: serde_json::Value) {
        let mut jobs = self.jobs_status.lock().expect("jobs");
        jobs.insert(job, status);
        while jobs.len() > JOBS_KEPT {
            jobs.pop_first();
        }
    }
}

/// The router with every endpoint.
pub fn router(app: Arc<AppState>) -> Router {
    // Every admin route behind one gate: a route added here cannot forget the token.
    let admin = Router::new()
        .route("/admin/snapshot", post(api::admin_snapshot))
        .route("/admin/compact", post(api::admin_snapshot))
        .route("/admin/jobs/{id}", get(api::admin_job))
        .route("/admin/stats", get(api::admin_stats))
        .route("/admin/evict", post(api::admin_evict))
        .route("/admin/verify", get(api::admin_verify))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            api::require_admin,
        ));
    // Every OpenAI route behind the API-key gate (open without keys).
    let openai = Router::new()
        .route("/v1/models", get(api::models))
        .route("/v1/models/{id}", get(api::model))
        .route("/v1/completions", post(api::completions))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/responses", post(api::responses))
        .route(
            "/v1/responses/{id}",
            get(api::stored_response).delete(api::delete_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(api::response_input_items),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            api::require_api_key,
        ));
    Router::new()
        .route("/health", get(api::health))
        .route("/ready", get(api::ready))
        .merge(openai)
        .merge(admin)
        .route("/metrics", get(api::metrics))
        .route("/openapi.json", get(api::openapi))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(axum::middleware::map_response(api::json_errors))
        .with_state(app)
}

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] crate::store::live::StoreOpenError),
    /// Warm start failed.
    #[error("warm start from logs failed: {0}")]
    Warm(#[from] crate::store::from_logs::BuildError),
    /// The directory could not be read.
    #[error(transparent)]
    Dir(#[from] crate::store::manifest::DirError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The API keys could not be read.
    #[error(transparent)]
    ApiKeys(#[from] api::ApiKeysError),
    /// Replication could not start.
    #[error(transparent)]
    Replicate(#[from] crate::replicate::ReplicateError),
    /// The server failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    /// The model thread died (a panic); the server stopped so that a supervisor can
    /// restart it.
    #[error("the model thread stopped unexpectedly ({0}); the server shut down")]
    ModelThread(String),
}

/// Run the server until SIGTERM or Ctrl-C. `engine` is loaded; `tokenizer` is a second
/// copy of its tokenizer for the handlers.
pub fn serve(
    cfg: ServeConfig,
    engine: Engine,
    tokenizer: ModelTokenizer,
    template: Option<ChatTemplate>,
    model_id: String,
    params: SpecParams,
) -> Result<(), ServeError> {
    let api_keys = api::KeyGate::open(cfg.api_key.clone(), cfg.api_keys_file.clone())?;
    match api_keys.keys().map(|k| k.counts()) {
        None => tracing::info!(
            "no API keys (SUFFIXD_API_KEY, --api-keys): the OpenAI routes are open to every client"
        ),
        Some((keys, bound)) => tracing::info!(
            "the OpenAI routes need one of {keys} API keys ({bound} bound to a namespace)"
        ),
    }
    warm_start_if_empty(&cfg, &params, &tokenizer)?;
    let (store, replication) = open_store(&cfg, &params, engine.tokenizer_identity())?;
    let responses = match &cfg.replicate {
        Some(r) => api::ResponseStore::sharing(cfg.stored_responses_bytes, &r.url, &r.cluster)
            .map_err(crate::replicate::ReplicateError::Thread)?,
        None => api::ResponseStore::new(cfg.stored_responses_bytes),
    };
    let metrics = Arc::new(metrics::Metrics::default());
    let (tx, rx) = crossbeam::channel::unbounded();
    metrics.publish_cost_curve(engine.cost_curve());
    let context_len = engine.context_len();
    let grammars = engine
        .grammar_compiler()
        .inspect_err(|e| tracing::warn!("{e}: structured outputs are off"))
        .ok();
    let max_batch = cfg.max_batch;
    let liveness = Arc::new(worker::Liveness::new());
    let waiting = Arc::new(AtomicUsize::new(0));
    // A panic on the model thread ends the server (after the grace period), which then
    // exits non-zero: requests cannot be served without it.
    let model_died = Arc::new(tokio::sync::Notify::new());
    let worker = {
        let (store, metrics) = (store.clone(), metrics.clone());
        let (liveness, model_died) = (liveness.clone(), model_died.clone());
        let (grammars, waiting) = (grammars.clone(), waiting.clone());
        std::thread::Builder::new()
            .name("model".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| {
                    let intake = worker::Intake {
                        jobs: rx,
                        max_batch,
                        liveness: &liveness,
                        grammars,
                        waiting,
                    };
                    worker::run(engine, store, params, metrics, intake)
                });
                let outcome = std::panic::catch_unwind(run).map_err(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    tracing::error!("the model thread panicked: {why}; shutting down");
                    why
                });
                liveness.stop();
                if outcome.is_err() {
                    model_died.notify_one();
                }
                outcome
            })?
    };
    let app = Arc::new(AppState {
        cfg: cfg.clone(),
        model_id,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        thoughts: template
            .as_ref()
            .and_then(ChatTemplate::thought_markers)
            .filter(|_| cfg.reasoning_format == ReasoningFormat::Auto),
        tokenizer,
        template,
        grammars,
        context_len,
        jobs: tx,
        waiting,
        waiting_by_namespace: Default::default(),
        store: store.clone(),
        metrics,
        jobs_status: Mutex::default(),
        queued_snapshot: Mutex::default(),
        snapshot_job: Mutex::default(),
        ids: AtomicU64::new(1),
        replication,
        admin_guard: Default::default(),
        api_keys,
        liveness,
        draining: Default::default(),
        responses,
    });
    if let (Some(every), Some(_)) = (cfg.publish_snapshots_s, &cfg.replicate) {
        publish_snapshots_every(&app, std::time::Duration::from_secs(every))?;
    }
    listen(&cfg, app, model_died)?;
    // The app state is gone with the runtime, and with it the last job senders: the
    // model thread then ends.
    let died = match worker.join() {
        Ok(Ok(())) => None,
        Ok(Err(why)) => Some(why),
        Err(_) => Some("a panic".to_string()),
    };
    if cfg.snapshot_on_exit {
        match store.snapshot() {
            Ok(info) => tracing::info!("snapshot on exit: {}", info.path.display()),
            Err(e) => tracing::error!("snapshot on exit failed: {e}"),
        }
    }
    match died {
        Some(why) => Err(ServeError::ModelThread(why)),
        None => Ok(()),
    }
}

/// With no snapshot yet and warm logs given, build the first snapshot from the logs.
fn warm_start_if_empty(
    cfg: &ServeConfig,
    params: &SpecParams,
    tokenizer: &ModelTokenizer,
) -> Result<(), ServeError> {
    if current_snapshot(&DiskDirectory, &cfg.snapshot_dir)?.is_some() || cfg.warm_logs.is_empty() {
        return Ok(());
    }
    tracing::info!(
        "no snapshot in {}: warm start from {:?}",
        cfg.snapshot_dir.display(),
        cfg.warm_logs
    );
    let t = std::time::Instant::now();
    let report = build_from_logs(
        &cfg.warm_logs,
        &cfg.snapshot_dir,
        &BuildOptions {
            max_depth: params.max_depth,
            namespace: "default".into(),
            keep_last: None,
        },
        Some(tokenizer),
        |n| {
            if n % 10_000 == 0 {
                tracing::info!("warm start: {n} records read");
            }
        },
    )?;
    tracing::info!(
        "warm start: {} sequences, {} tokens in {:.1} s",
        report.header.sequences,
        report.header.tokens,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Open the store (a new replica first fetches its cluster's newest published
/// snapshot), start replication if configured, and verify the snapshot in the
/// background.
fn open_store(
    cfg: &ServeConfig,
    params: &SpecParams,
    tokenizer_id: TokenizerId,
) -> Result<(Arc<Store>, Option<Replication>), ServeError> {
    let identity = match cfg.replicate {
        Some(_) => Some(ReplicaIdentity::load_or_create(&cfg.snapshot_dir)?),
        None => None,
    };
    let bootstrapped = match &cfg.replicate {
        Some(rcfg) => bootstrap(rcfg, &cfg.snapshot_dir, tokenizer_id)?,
        None => None,
    };
    if let Some(b) = &bootstrapped {
        tracing::info!(
            "started from published snapshot {} (stream position {}){}",
            b.object,
            b.position,
            if b.refused.is_empty() {
                String::new()
            } else {
                format!("; newer ones refused: {:?}", b.refused)
            }
        );
    }
    let t = std::time::Instant::now();
    let store = Arc::new(Store::open(StoreConfig {
        max_depth: params.max_depth,
        fsync: cfg.fsync,
        budget_tokens: cfg.budget_tokens,
        max_age_ms: cfg.max_age_s.map(|s| s * 1000),
        id_origin: identity.as_ref().map_or(0, |i| i.tag),
        ..StoreConfig::new(cfg.snapshot_dir.clone(), tokenizer_id)
    })?);
    let replication = match (&cfg.replicate, identity) {
        (Some(rcfg), Some(identity)) => {
            tracing::info!(
                "replicating through {} (cluster {}) as replica {} (tag {})",
                rcfg.url,
                rcfg.cluster,
                identity.name,
                identity.tag
            );
            let r = Replication::start(rcfg.clone(), identity, store.clone(), tokenizer_id)?;
            if let Some(b) = &bootstrapped {
                r.set_bootstrap(b);
            }
            Some(r)
        }
        _ => None,
    };
    tracing::info!(
        "store {} open in {:.1} ms: {} cached tokens, {} WAL records replayed",
        cfg.snapshot_dir.display(),
        t.elapsed().as_secs_f64() * 1e3,
        store.stats().cached_tokens,
        store.counters().replayed
    );
    {
        // Opening read the snapshot's frame only; read the rest off the request path.
        let store = store.clone();
        std::thread::Builder::new()
            .name("verify".into())
            .spawn(move || match store.verify_base() {
                Ok(()) => tracing::debug!("snapshot verified"),
                Err(e) => tracing::error!("{e}"),
            })?;
    }
    Ok((store, replication))
}

/// Start a snapshot job every `every`, for replicas to bootstrap from, until the server
/// shuts down.
fn publish_snapshots_every(app: &Arc<AppState>, every: std::time::Duration) -> std::io::Result<()> {
    // A weak reference: the server's shutdown drops the state, which ends this.
    let app = Arc::downgrade(app);
    std::thread::Builder::new()
        .name("publish-snapshots".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match app.upgrade() {
                    Some(app) => {
                        app.start_snapshot_job();
                    }
                    None => return,
                }
            }
        })?;
    Ok(())
}

/// Serve HTTP on `cfg.addr` until a shutdown signal, then stop the runtime. Dropping the
/// tasks still running drops their requests, which cancels their generations.
fn listen(
    cfg: &ServeConfig,
    app: Arc<AppState>,
    model_died: Arc<tokio::sync::Notify>,
) -> Result<(), ServeError> {
    let limits = http::HttpLimits {
        read_timeout: cfg.read_timeout(),
        max_connections: cfg.max_connections,
        max_connections_per_client: cfg.max_connections_per_client,
        shutdown_grace: std::time::Duration::from_secs(cfg.shutdown_grace_s),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(cfg.addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: cfg.addr,
                source,
            })?;
        tracing::info!("listening on http://{}", listener.local_addr()?);
        let drain_delay = std::time::Duration::from_secs(cfg.drain_delay_s);
        let shutdown = {
            let app = app.clone();
            async move {
                tokio::select! {
                    () = shutdown_signal() => {
                        // Not ready from now on; requests are still served for the
                        // drain delay, while a load balancer notices.
                        app.draining.store(true, Ordering::Relaxed);
                        if !drain_delay.is_zero() {
                            tracing::info!("draining: /ready answers 503; closing the listener in {} s", drain_delay.as_secs());
                            tokio::time::sleep(drain_delay).await;
                        }
                    }
                    () = model_died.notified() => app.draining.store(true, Ordering::Relaxed),
                }
            }
        };
        #[cfg(unix)]
        tokio::spawn(reload_keys_on_hangup(app.clone()));
        http::serve_http(listener, router(app.clone()), limits, shutdown).await;
        Ok::<(), ServeError>(())
    })?;
    drop(app);
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

/// Read the API keys again on each SIGHUP (a file that does not read leaves them as
/// they were): keys rotate without a restart.
#[cfg(unix)]
async fn reload_keys_on_hangup(app: Arc<AppState>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP: the API keys are read at start only");
        return;
    };
    while hangups.recv().await.is_some() {
        match app.api_keys.reload() {
            Ok((0, _)) => tracing::info!("SIGHUP: no API keys are configured"),
            Ok((keys, bound)) => {
                tracing::info!("SIGHUP: API keys read again: {keys} ({bound} bound to a namespace)")
            }
            Err(e) => tracing::error!("SIGHUP: {e}; the API keys stay as they were"),
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod router_tests;
