//! The HTTP edge without the model: each endpoint of [`router`] over real HTTP, with a
//! small hand-made tokenizer (one token per byte, so characters split across tokens),
//! a store in memory ([`RamDirectory`]) and a scripted model thread on the job channel
//! that records what it was asked and answers with [`ANSWER`]. `tests/serve.rs` runs
//! the whole server with the real model beside these.

mod keys;
mod penalties;
mod queue;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::worker::{Delta, Job, JobError};
use super::*;
use crate::chat::ChatTemplate;
use crate::engine::{FinishReason, GenerateOptions, Generation};
use crate::model::detokenizer::Detokenizer;
use crate::model::tokenizer::ModelTokenizer;
use crate::model::tokenizer::testing::byte_tokenizer;
use crate::store::live::{Store, StoreConfig};
use crate::store::{RamDirectory, TokenizerId};

/// What the scripted model answers: two characters of two bytes each, split across
/// byte tokens.
const ANSWER: &str = "héllo, wörld";
const ADMIN_TOKEN: &str = "test-admin-token";

/// What the model thread was asked.
#[derive(Clone)]
struct Asked {
    prompt: Vec<u32>,
    opts: GenerateOptions,
    prediction: Vec<u32>,
}

/// The model thread's stand-in: answers [`ANSWER`] (cut at `max_tokens`) one token per
/// delta, fails a prompt that contains `FAIL` and refuses one that contains `REFUSE`.
fn scripted_model(
    jobs: crossbeam::channel::Receiver<Job>,
    tokenizer: ModelTokenizer,
    asked: Arc<Mutex<Vec<Asked>>>,
) {
    for job in jobs {
        asked.lock().unwrap().push(Asked {
            prompt: job.prompt.clone(),
            opts: job.opts.clone(),
            prediction: job.prediction.to_vec(),
        });
        let prompt = tokenizer.decode(&job.prompt, false).unwrap();
        if prompt.contains("FAIL") {
            let _ = job.done.send(Err(JobError::Failed(7)));
            continue;
        }
        if prompt.contains("SLOW") {
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
        if prompt.contains("REFUSE") {
            let _ = job
                .done
                .send(Err(JobError::Rejected("refused by the script".into())));
            continue;
        }
        let mut tokens = tokenizer.encode_text(ANSWER).unwrap();
        let cut = tokens.len() > job.opts.max_tokens;
        tokens.truncate(job.opts.max_tokens);
        // One token a step, its text decoded as the engine does.
        let mut text = Detokenizer::new();
        for seen in 1..=tokens.len() {
            let before = text.text().len();
            text.update(&tokenizer, &tokens[..seen]).unwrap();
            let delta = Delta {
                text: text.text()[before..].to_string(),
                logprobs: Vec::new(),
            };
            let _ = job.tokens.send(delta);
        }
        let generation = Generation {
            text: tokenizer.decode(&tokens, true).unwrap(),
            prompt_tokens: job.prompt.len(),
            cached_prompt_tokens: 0,
            steps: tokens.len(),
            drafted_tokens: 0,
            accepted_tokens: 0,
            verify_cost: tokens.len() as f64,
            finish_reason: if cut {
                FinishReason::Length
            } else {
                FinishReason::Stop
            },
            prefill_s: 0.0,
            decode_s: 0.0,
            tokens_per_s: 0.0,
            logprobs: None,
            grammar_failure: None,
            sources: Default::default(),
            tokens,
        };
        let _ = job.done.send(Ok(generation));
    }
}

/// A server on a free local port, stopped when dropped.
struct TestServer {
    base: String,
    app: Arc<AppState>,
    tokenizer: ModelTokenizer,
    asked: Arc<Mutex<Vec<Asked>>>,
    _runtime: tokio::runtime::Runtime,
}

impl TestServer {
    fn start() -> Self {
        Self::start_with(api::KeyGate::default())
    }

    /// A server whose OpenAI routes are behind `api_keys`.
    fn start_with(api_keys: api::KeyGate) -> Self {
        let tokenizer = byte_tokenizer();
        let store = Store::open(StoreConfig {
            directory: Arc::new(RamDirectory::new()),
            ..StoreConfig::new("/ram/store", TokenizerId::UNKNOWN)
        })
        .unwrap();
        let template = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>",
            "",
            "<|end|>",
        )
        .unwrap();
        let cfg = ServeConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            snapshot_dir: "/ram/store".into(),
            warm_logs: Vec::new(),
            admin_token: Some(ADMIN_TOKEN.into()),
            api_key: None,
            api_keys_file: None,
            max_body_bytes: 1 << 20,
            default_max_tokens: 64,
            max_tokens_limit: 256,
            speculate: true,
            grammar_drafts: true,
            allow_control_tokens: false,
            reasoning_format: Default::default(),
            chat_template_kwargs: Default::default(),
            max_batch: 4,
            budget_tokens: None,
            max_age_s: None,
            fsync: crate::store::wal::FsyncPolicy::Always,
            snapshot_on_exit: false,
            read_timeout_s: 5,
            max_connections: 64,
            max_connections_per_client: 64,
            shutdown_grace_s: 1,
            drain_delay_s: 0,
            max_queued: 4,
            stall_limit_s: 120,
            replicate: None,
            publish_snapshots_s: None,
            stored_responses_bytes: 1 << 20,
        };
        let (jobs, rx) = crossbeam::channel::unbounded();
        let asked = Arc::new(Mutex::new(Vec::new()));
        {
            let (tokenizer, asked) = (tokenizer.clone(), asked.clone());
            std::thread::spawn(move || scripted_model(rx, tokenizer, asked));
        }
        let app = Arc::new(AppState {
            cfg,
            model_id: "test-model".into(),
            started: 1,
            tokenizer: tokenizer.clone(),
            template: Some(template),
            thoughts: None,
            grammars: None,
            context_len: 1024,
            jobs,
            waiting: Default::default(),
            waiting_by_namespace: Default::default(),
            store: Arc::new(store),
            metrics: Default::default(),
            jobs_status: Mutex::default(),
            queued_snapshot: Mutex::default(),
            snapshot_job: Mutex::default(),
            ids: AtomicU64::new(1),
            replication: None,
            admin_guard: Default::default(),
            api_keys,
            liveness: Arc::new(super::worker::Liveness::new()),
            draining: Default::default(),
            responses: api::ResponseStore::new(1 << 20),
        });
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes = router(app.clone());
        runtime.spawn(async move { axum::serve(listener, routes).await });
        TestServer {
            base,
            app,
            tokenizer,
            asked,
            _runtime: runtime,
        }
    }

    /// Status and body of a request; `token` is sent as the admin bearer token.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> (u16, String) {
        let mut request = ureq::request(method, &format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let response = match body {
            Some(body) => request
                .set("Content-Type", "application/json")
                .send_string(body),
            None => request.call(),
        };
        match response {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(status, r)) => (status, r.into_string().unwrap()),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// A JSON answer to a POST, with its status.
    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (status, text) = self.call("POST", path, Some(&body.to_string()), None);
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }

    fn admin(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let (status, text) = self.call(method, path, body.as_deref(), Some(ADMIN_TOKEN));
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }

    /// Status and JSON body of a request without a body (`GET`, `DELETE`).
    fn fetch(&self, method: &str, path: &str) -> (u16, Value) {
        let (status, text) = self.call(method, path, None, None);
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }

    fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

/// The `data:` payloads of a Server-Sent Events body.
fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn models_lists_the_served_model() {
    let server = TestServer::start();
    let (status, body) = server.call("GET", "/v1/models", None, None);
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["data"][0]["id"], "test-model");
    assert_eq!(body["object"], "list");
}

#[test]
fn a_completion_hands_the_model_the_tokenized_prompt_and_its_options() {
    let server = TestServer::start();
    let (status, body) = server.post(
        "/v1/completions",
        json!({"prompt": "Say hi", "max_tokens": 100, "temperature": 0.5, "seed": 3,
            "stop": ["zz"], "user": "team-a"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], ANSWER);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["usage"]["prompt_tokens"], 6, "one token per byte");
    assert_eq!(body["usage"]["completion_tokens"], ANSWER.len());
    let asked = server.asked();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].prompt,
        server.tokenizer.encode_text("Say hi").unwrap()
    );
    let opts = &asked[0].opts;
    assert_eq!(opts.max_tokens, 100);
    assert_eq!(opts.stop, ["zz"]);
    assert_eq!((opts.sampling.seed, opts.sampling.temperature), (3, 0.5));
    assert_eq!(opts.namespace, "team-a", "`user` names the namespace");
    assert!(opts.speculate);
}

#[test]
fn max_tokens_cuts_the_answer_and_says_so() {
    let server = TestServer::start();
    // Three byte tokens: `h` and both bytes of `é`.
    let (status, body) = server.post("/v1/completions", json!({"prompt": "x", "max_tokens": 3}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "hé");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let (status, body) = server.post(
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 100_000}),
    );
    assert_eq!(status, 400, "over the limit: {body}");
    assert_eq!(
        server.asked().len(),
        1,
        "a refused request never reaches the model"
    );
}

#[test]
fn a_chat_prompt_is_the_template_rendered_and_the_answer_a_message() {
    let server = TestServer::start();
    let (status, body) = server.post(
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], ANSWER);
    let asked = server.asked();
    let prompt = server.tokenizer.decode(&asked[0].prompt, false).unwrap();
    assert_eq!(prompt, "<system>Be brief.\n<user>hi\n<assistant>");
    assert_eq!(asked[0].opts.max_tokens, 64, "the configured default");
}

#[test]
fn a_streamed_answer_sends_whole_characters_and_ends_with_done() {
    let server = TestServer::start();
    for (path, body, text_of) in [
        (
            "/v1/completions",
            json!({"prompt": "x", "stream": true}),
            (|c: &Value| c["text"].clone()) as fn(&Value) -> Value,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "stream": true}),
            |c: &Value| c["delta"]["content"].clone(),
        ),
    ] {
        let (status, text) = server.call("POST", path, Some(&body.to_string()), None);
        assert_eq!(status, 200, "{path}: {text}");
        let events = events(&text);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{path}");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let mut streamed = String::new();
        for chunk in &chunks {
            if let Some(piece) = text_of(&chunk["choices"][0]).as_str() {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "{path}: a cut character in {piece:?}"
                );
                streamed.push_str(piece);
            }
        }
        assert_eq!(streamed, ANSWER, "{path}");
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop", "{path}");
        assert_eq!(last["usage"]["completion_tokens"], ANSWER.len(), "{path}");
        assert!(
            chunks.len() > 3,
            "{path}: streamed in pieces, {} chunks",
            chunks.len()
        );
    }
}

#[test]
fn model_failures_become_their_statuses() {
    let server = TestServer::start();
    let (status, body) = server.post("/v1/completions", json!({"prompt": "FAIL please"}));
    assert_eq!(status, 500, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("incident 7"), "{message}");
    let (status, body) = server.post("/v1/completions", json!({"prompt": "REFUSE please"}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["message"], "refused by the script");
    // Streamed, the failure arrives as an error event before [DONE].
    let request = json!({"prompt": "FAIL", "stream": true}).to_string();
    let (status, text) = server.call("POST", "/v1/completions", Some(&request), None);
    assert_eq!(status, 200, "{text}");
    let events = events(&text);
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("incident 7"),
        "{error}"
    );
}

#[test]
fn malformed_requests_get_json_errors_and_never_reach_the_model() {
    let server = TestServer::start();
    let cases: [(&str, &str, Option<&str>, u16); 7] = [
        ("POST", "/v1/completions", Some("{"), 400),
        ("POST", "/v1/completions", Some("[1, 2]"), 400),
        (
            "POST",
            "/v1/completions",
            Some(r#"{"prompt": "x", "model": "other"}"#),
            404,
        ),
        (
            "POST",
            "/v1/completions",
            Some(r#"{"prompt": "x", "n": 17}"#),
            400,
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#),
            400,
        ),
        ("GET", "/v1/completions", None, 405),
        ("GET", "/v1/nothing-here", None, 404),
    ];
    for (method, path, body, want) in cases {
        let (status, text) = server.call(method, path, body, None);
        assert_eq!(status, want, "{method} {path} {body:?}: {text}");
        let answer: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text}"));
        assert!(answer["error"]["message"].is_string(), "{text}");
    }
    assert!(server.asked().is_empty());
}

#[test]
fn every_admin_route_wants_the_token() {
    let server = TestServer::start();
    let routes = [
        ("POST", "/admin/snapshot"),
        ("POST", "/admin/compact"),
        ("GET", "/admin/jobs/1"),
        ("GET", "/admin/stats"),
        ("POST", "/admin/evict"),
        ("GET", "/admin/verify"),
    ];
    for (method, path) in routes {
        for token in [None, Some("wrong")] {
            let body = (method == "POST").then_some("{}");
            let (status, text) = server.call(method, path, body, token);
            assert_eq!(status, 401, "{method} {path} with {token:?}: {text}");
        }
    }
    let (status, stats) = server.admin("GET", "/admin/stats", None);
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["cached_sequences"], 0, "{stats}");
    assert_eq!(
        stats["wal_bytes"], 32,
        "a fresh log segment in the RAM directory: {stats}"
    );
}

#[test]
fn admin_evicts_and_snapshots_and_keeps_a_bounded_job_table() {
    let server = TestServer::start();
    let store = &server.app.store;
    store.append("x", &[1, 2, 3]).unwrap();
    store.append("x", &[1, 2, 4]).unwrap();
    store.append("y", &[5]).unwrap();
    let (status, body) = server.admin("POST", "/admin/evict", Some(json!({"namespace": "x"})));
    assert_eq!((status, body["evicted"].clone()), (200, json!(2)), "{body}");
    let (status, body) = server.admin("POST", "/admin/evict", Some(json!({"id": 3})));
    assert_eq!(status, 400, "an id needs its namespace: {body}");

    let (status, started) = server.admin("POST", "/admin/snapshot", None);
    assert_eq!(status, 202, "{started}");
    let poll = started["poll"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let done = loop {
        let (status, job) = server.admin("GET", &poll, None);
        assert_eq!(status, 200, "{job}");
        if job["status"] != "running" {
            break job;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the snapshot never finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["snapshot"]["sequences"], 1, "{done}");

    // The table keeps the newest JOBS_KEPT: the snapshot's entry goes once that many
    // newer jobs are recorded.
    let first = started["job"].as_u64().unwrap();
    for job in first + 1..=first + JOBS_KEPT as u64 {
        server
            .app
            .record_job(job, json!({"job": job, "status": "done"}));
    }
    assert_eq!(server.app.jobs_status.lock().unwrap().len(), JOBS_KEPT);
    let (status, _) = server.admin("GET", &poll, None);
    assert_eq!(status, 404, "the oldest job is forgotten");
    let newest = format!("/admin/jobs/{}", first + JOBS_KEPT as u64);
    assert_eq!(server.admin("GET", &newest, None).0, 200);
}

#[test]
fn metrics_are_prometheus_text() {
    let server = TestServer::start();
    server.post("/v1/completions", json!({"prompt": "x"}));
    let (status, text) = server.call("GET", "/metrics", None, None);
    assert_eq!(status, 200);
    assert!(text.contains("# TYPE suffixd_"), "{text}");
}

#[test]
fn the_model_is_listed_by_id() {
    let server = TestServer::start();
    let (status, body) = server.call("GET", "/v1/models/test-model", None, None);
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (body["id"].as_str(), body["object"].as_str()),
        (Some("test-model"), Some("model"))
    );
    let (status, body) = server.call("GET", "/v1/models/gpt-4o", None, None);
    assert_eq!(status, 404, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
}

#[test]
fn health_and_readiness_follow_the_model_thread_and_draining() {
    let server = TestServer::start();
    let probe = |path| {
        let (status, body) = server.call("GET", path, None, None);
        (status, serde_json::from_str::<Value>(&body).unwrap())
    };
    server.app.liveness.beat();
    assert_eq!(probe("/health"), (200, json!({"status": "ok"})));
    assert_eq!(probe("/ready"), (200, json!({"status": "ok"})));
    server
        .app
        .draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(probe("/health").0, 200, "draining is still alive");
    let (status, body) = probe("/ready");
    assert_eq!(status, 503);
    assert!(
        body["reason"].as_str().unwrap().contains("draining"),
        "{body}"
    );
    server.app.liveness.stop();
    for path in ["/health", "/ready"] {
        let (status, body) = probe(path);
        assert_eq!(status, 503, "{path}");
        assert!(
            body["reason"].as_str().unwrap().contains("stopped"),
            "{body}"
        );
    }
}

#[test]
fn openais_other_fields_are_ignored_unless_they_would_change_the_answer() {
    let server = TestServer::start();
    let ignored = json!({"prompt": "hi", "metadata": {"a": "b"}, "store": false, "service_tier": "auto",
        "reasoning_effort": null, "prompt_cache_key": "k", "safety_identifier": "u1", "verbosity": null,
        "prediction": null, "logit_bias": {}, "modalities": ["text"], "audio": null, "echo": false,
        "best_of": 1, "suffix": null, "stream_options": null});
    let (status, body) = server.post("/v1/completions", ignored);
    assert_eq!(status, 200, "{body}");
    for (field, value) in [
        ("modalities", json!(["text", "audio"])),
        ("echo", json!(true)),
        ("best_of", json!(3)),
        ("suffix", json!("end")),
        ("audio", json!({"voice": "x"})),
    ] {
        let mut body = json!({"prompt": "hi"});
        body[field] = value;
        let (status, answer) = server.post("/v1/completions", body);
        assert_eq!(status, 400, "{field}: {answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(field),
            "{answer}"
        );
    }
}

/// `prediction` (OpenAI's Predicted Outputs) reaches the model thread as tokens to
/// draft from, at most `max_tokens` of them; a malformed one is refused by name; usage
/// says how it fared (nothing drafted here: the scripted model does not speculate).
#[test]
fn a_prediction_goes_to_the_drafter_and_its_usage_is_reported() {
    let server = TestServer::start();
    let chat = |prediction: Value, max_tokens: usize| {
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "prediction": prediction})
    };
    let text = json!({"type": "content", "content": "héllo, <|end|> wörld"});
    let (status, body) = server.post("/v1/chat/completions", chat(text, 64));
    assert_eq!(status, 200, "{body}");
    let details = &body["usage"]["completion_tokens_details"];
    assert_eq!(details["accepted_prediction_tokens"], 0, "{body}");
    assert_eq!(details["rejected_prediction_tokens"], 0, "{body}");
    let literal = server
        .tokenizer
        .encode_literal("héllo, <|end|> wörld")
        .unwrap();
    assert_eq!(server.asked()[0].prediction, literal, "read as plain text");
    let parts = json!({"type": "content", "content": [{"type": "text", "text": "ab"},
        {"type": "text", "text": "cd"}]});
    let (status, body) = server.post("/v1/chat/completions", chat(parts, 3));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        server.asked()[1].prediction,
        server.tokenizer.encode_literal("abc").unwrap(),
        "the parts joined, cut at max_tokens"
    );
    let (status, body) = server.post("/v1/chat/completions", chat(Value::Null, 8));
    assert_eq!(status, 200, "{body}");
    assert!(server.asked()[2].prediction.is_empty());
    for bad in [
        json!("the answer"),
        json!({"type": "text", "content": "x"}),
        json!({"type": "content"}),
        json!({"type": "content", "content": 7}),
        json!({"type": "content", "content": [{"type": "image_url", "text": "x"}]}),
        json!({"type": "content", "content": "x", "extra": 1}),
    ] {
        let (status, body) = server.post("/v1/chat/completions", chat(bad.clone(), 8));
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["param"], "prediction", "{bad}: {body}");
    }
    assert_eq!(
        server.asked().len(),
        3,
        "refused ones never reach the model"
    );
}

#[test]
fn a_list_of_prompts_gets_n_choices_each() {
    let server = TestServer::start();
    let (status, body) = server.post(
        "/v1/completions",
        json!({"prompt": ["one", "three"], "n": 2, "max_tokens": 4}),
    );
    assert_eq!(status, 200, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "{body}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert_eq!(body["usage"]["prompt_tokens"], 3 + 5, "each prompt once");
    let asked: Vec<String> = server
        .asked()
        .iter()
        .map(|a| server.tokenizer.decode(&a.prompt, false).unwrap())
        .collect();
    assert_eq!(asked, ["one", "one", "three", "three"]);
    for (prompt, needle) in [
        (json!([1, 2, 3]), "token ids"),
        (json!([]), "non-empty"),
        (json!(["a", ""]), "non-empty"),
    ] {
        let (status, body) = server.post("/v1/completions", json!({"prompt": prompt}));
        assert_eq!(status, 400, "{prompt}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(needle),
            "{body}"
        );
    }
}

/// Streamed, a list of prompts with `n` each streams every choice with its index, each
/// ending with its finish reason; a last chunk without choices carries the usage of all.
#[test]
fn streamed_choices_come_with_their_index_and_usage_at_the_end() {
    let server = TestServer::start();
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": ["one", "three"], "n": 2, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 4, "stream": true}),
        ),
    ] {
        let (status, text) = server.call("POST", path, Some(&body.to_string()), None);
        assert_eq!(status, 200, "{text}");
        let events = events(&text);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let (mut texts, mut finishes) = (vec![String::new(); 4], vec![0; 4]);
        for chunk in &chunks[..chunks.len() - 1] {
            let choice = &chunk["choices"][0];
            let i = choice["index"].as_u64().unwrap() as usize;
            let piece = if path.contains("chat") {
                choice["delta"]["content"].as_str()
            } else {
                choice["text"].as_str()
            };
            texts[i].push_str(piece.unwrap_or_default());
            finishes[i] += usize::from(choice["finish_reason"] == "stop");
            assert!(chunk.get("usage").is_none(), "{chunk}");
        }
        assert_eq!(texts, vec![ANSWER; 4], "{path}");
        assert_eq!(finishes, [1; 4], "{path}: one finish per choice");
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]), "{last}");
        assert_eq!(
            last["usage"]["completion_tokens"],
            4 * ANSWER.len(),
            "{last}"
        );
        if path.contains("chat") {
            assert_eq!(last["suffixd"]["steps"].as_u64().map(|s| s > 0), Some(true));
        } else {
            assert_eq!(
                last["usage"]["prompt_tokens"],
                3 + 5,
                "each prompt once: {last}"
            );
        }
    }
}

/// A response is kept unless `store` is false: `previous_response_id` continues its
/// conversation (without its instructions), whole or streamed; `GET` reads it, `DELETE`
/// forgets it, and an id not kept is refused as OpenAI refuses it.
#[test]
fn stored_responses_continue_read_and_delete() {
    let server = TestServer::start();
    let last_prompt = || {
        let asked = server.asked();
        let prompt = &asked.last().unwrap().prompt;
        server.tokenizer.decode(prompt, false).unwrap()
    };
    let (status, first) = server.post(
        "/v1/responses",
        json!({"instructions": "SYSTEM RULES", "input": "first question"}),
    );
    assert_eq!(status, 200, "{first}");
    let first_id = first["id"].as_str().unwrap().to_string();
    assert!(first["store"].as_bool().unwrap(), "{first}");
    assert_eq!(first_id.len(), "resp_".len() + 32, "{first_id}");
    let (status, second) = server.post(
        "/v1/responses",
        json!({"input": "second question", "previous_response_id": first_id}),
    );
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], first_id.as_str());
    let prompt = last_prompt();
    let at = |needle: &str| {
        prompt
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in {prompt:?}"))
    };
    assert!(at("first question") < at(ANSWER) && at(ANSWER) < at("second question"));
    assert!(!prompt.contains("SYSTEM RULES"), "{prompt}");
    // Streamed: kept before `response.completed` reaches the client.
    let request = json!({"input": "third", "previous_response_id": second["id"], "stream": true});
    let (status, body) = server.call("POST", "/v1/responses", Some(&request.to_string()), None);
    assert_eq!(status, 200, "{body}");
    let last: Value = serde_json::from_str(events(&body).last().unwrap()).unwrap();
    assert_eq!(last["type"], "response.completed", "{last}");
    let third_id = last["response"]["id"].as_str().unwrap().to_string();
    let (status, read) = server.fetch("GET", &format!("/v1/responses/{third_id}"));
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["output"], last["response"]["output"]);
    assert_eq!(read["previous_response_id"], second["id"]);
    // Output items of kept responses by reference: their text reaches the prompt.
    let item = first["output"][0]["id"].as_str().unwrap();
    let request = json!({"input": [{"type": "item_reference", "id": item}, {"role": "user", "content": "more"}]});
    let (status, body) = server.post("/v1/responses", request);
    assert_eq!(status, 200, "{body}");
    assert!(last_prompt().contains(ANSWER), "{}", last_prompt());
    let unknown = json!({"input": [{"type": "item_reference", "id": "msg_0123_0"}]});
    let (status, body) = server.post("/v1/responses", unknown);
    assert_eq!(status, 400, "{body}");
    // `store: false` keeps nothing.
    let (_, unkept) = server.post("/v1/responses", json!({"input": "x", "store": false}));
    assert_eq!(unkept["store"], false);
    let unkept_id = unkept["id"].as_str().unwrap();
    let (status, _) = server.fetch("GET", &format!("/v1/responses/{unkept_id}"));
    assert_eq!(status, 404);
    // Deleted, a response is gone; the one that continued it still continues it.
    let (status, deleted) = server.fetch("DELETE", &format!("/v1/responses/{first_id}"));
    assert_eq!(
        (status, deleted["deleted"].clone()),
        (200, json!(true)),
        "{deleted}"
    );
    let (status, gone) = server.fetch("DELETE", &format!("/v1/responses/{first_id}"));
    assert_eq!(status, 404, "{gone}");
    let (status, again) = server.post(
        "/v1/responses",
        json!({"input": "x", "previous_response_id": first_id}),
    );
    assert_eq!(status, 400, "{again}");
    assert_eq!(again["error"]["code"], "previous_response_not_found");
    assert_eq!(again["error"]["param"], "previous_response_id");
    // A client's id is shown cut short, and one that is no string is refused.
    let long = "x".repeat(100_000);
    let (status, refused) = server.post(
        "/v1/responses",
        json!({"input": "x", "previous_response_id": long}),
    );
    assert_eq!(status, 400);
    assert!(
        refused["error"]["message"].as_str().unwrap().len() < 1_000,
        "{refused}"
    );
    let (status, refused) = server.post(
        "/v1/responses",
        json!({"input": "x", "previous_response_id": 7}),
    );
    assert_eq!(
        (status, refused["error"]["param"].clone()),
        (400, json!("previous_response_id"))
    );
    let (status, _) = server.post(
        "/v1/responses",
        json!({"input": "fourth", "previous_response_id": third_id}),
    );
    assert_eq!(status, 200);
    assert!(last_prompt().contains("first question"));
    let (_, metrics) = server.call("GET", "/metrics", None, None);
    assert!(metrics.contains("suffixd_stored_responses 4"), "{metrics}");
}

/// `GET /openapi.json` serves the kept document, and the document and the router agree:
/// each path and method it names is routed (the fallback's "no such endpoint" never
/// answers), and a path it does not name is not.
#[test]
fn the_openapi_document_names_exactly_the_routes() {
    let server = TestServer::start();
    let (status, text) = server.call("GET", "/openapi.json", None, None);
    assert_eq!(status, 200, "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let routed = |status: u16, body: &str| {
        !(status == 404 && body.contains("no such endpoint")) && status != 405
    };
    for (path, operations) in paths {
        let concrete = path.replace("{id}", "1");
        for method in operations.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let body = (method == "POST").then_some("{}");
            let (status, body) = server.call(&method, &concrete, body, Some(ADMIN_TOKEN));
            assert!(routed(status, &body), "{method} {path}: {status} {body}");
        }
    }
    // Every route the router's source declares is in the document.
    let router_paths: Vec<&str> = include_str!("../mod.rs")
        .split(".route(")
        .skip(1)
        .filter_map(|rest| rest.trim_start().strip_prefix('"')?.split('"').next())
        .collect();
    assert!(router_paths.len() >= 14, "{router_paths:?}");
    let mut documented: Vec<&str> = paths.keys().map(String::as_str).collect();
    documented.sort_unstable();
    let mut expected = router_paths.clone();
    expected.sort_unstable();
    assert_eq!(documented, expected);
    let (status, body) = server.call("GET", "/v1/undocumented", None, None);
    assert!(!routed(status, &body), "{status} {body}");
}
