//! `suffixd serve` as a real process on loopback, with the real model, driven over
//! real HTTP as an OpenAI client would: completions, chat, streaming, the admin API,
//! bad inputs, concurrent clients during snapshot and compaction, a restart that keeps
//! what the cache learned, and namespaces taking turns for the batch's slots.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{Server, answer, model_present, raw_exchange};
use serde_json::{Value, json};

/// Parse an SSE body as an OpenAI client does: `data:` lines, JSON until `[DONE]`.
fn stream_chat(s: &Server, body: &Value) -> (String, Vec<Value>) {
    let resp = ureq::post(&s.url("/v1/chat/completions"))
        .set("content-type", "application/json")
        .send_string(&body.to_string())
        .unwrap();
    assert!(resp.content_type().starts_with("text/event-stream"));
    let mut text = String::new();
    let mut chunks = Vec::new();
    let mut done = false;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        chunks.push(v);
    }
    assert!(done, "stream ended without [DONE]");
    (text, chunks)
}

const REPEAT: &str = "Copy this JSON exactly: {\"order\": 1234, \"items\": [\"apple\", \"pear\"], \"status\": \"shipped\"}\nCopy:";

#[test]
fn openai_api_admin_bad_inputs_concurrency_and_restart() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path());

    // Models.
    let (st, models) = s.get("/v1/models", false);
    assert_eq!(st, 200);
    let model = models["data"][0]["id"].as_str().unwrap().to_string();

    // Completions, greedy.
    let req = json!({"model": model, "prompt": REPEAT, "max_tokens": 24, "temperature": 0});
    let (st, first) = s.post("/v1/completions", &req.to_string(), false);
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["object"], "text_completion");
    assert!(!first["choices"][0]["text"].as_str().unwrap().is_empty());
    assert!(first["usage"]["completion_tokens"].as_u64().unwrap() as usize > 0);
    assert!(first["suffixd"]["steps"].as_u64().unwrap() > 0);

    // Chat, plain and streamed: the same greedy text.
    let chat = json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 16, "temperature": 0});
    let (st, plain) = s.post("/v1/chat/completions", &chat.to_string(), false);
    assert_eq!(st, 200, "{plain}");
    let mut streamed_req = chat.clone();
    streamed_req["stream"] = json!(true);
    let (streamed, chunks) = stream_chat(&s, &streamed_req);
    assert_eq!(
        streamed,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());

    // The learned cache: the same request again drafts from the first answer.
    let (_, second) = s.post("/v1/completions", &req.to_string(), false);
    assert_eq!(second["choices"][0]["text"], first["choices"][0]["text"]);
    assert!(
        second["suffixd"]["accepted_tokens"].as_u64().unwrap() > 0,
        "{second}"
    );
    // The prefix cache: the repeat reuses its prompt's keys and values (all but its
    // last token, in whole 16-token blocks); another namespace reuses nothing.
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached_prompt = |r: &Value| {
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached_prompt(&first), 0);
    assert!(
        prompt_tokens > 16 && cached_prompt(&second) + 16 >= prompt_tokens,
        "{second}"
    );
    let elsewhere = ureq::post(&s.url("/v1/completions"))
        .set("x-suffixd-namespace", "tenant-b")
        .send_string(&req.to_string());
    let (st, elsewhere) = answer(elsewhere);
    assert_eq!(st, 200, "{elsewhere}");
    assert_eq!(cached_prompt(&elsewhere), 0, "{elsewhere}");

    // Admin: every route refused without the token (one gate in front of them all),
    // working with it.
    for path in ["/admin/stats", "/admin/verify", "/admin/jobs/1"] {
        assert_eq!(s.get(path, false).0, 401, "GET {path}");
    }
    for path in ["/admin/snapshot", "/admin/compact", "/admin/evict"] {
        assert_eq!(s.post(path, "{}", false).0, 401, "POST {path}");
    }
    let (st, stats) = s.get("/admin/stats", true);
    assert_eq!(st, 200);
    let cached = stats["cached_tokens"].as_u64().unwrap();
    let in_namespace = |n: &str| stats["namespaces"][n]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && in_namespace("default") + in_namespace("tenant-b") == cached);
    let (st, metrics) = (
        200,
        ureq::get(&s.url("/metrics"))
            .call()
            .unwrap()
            .into_string()
            .unwrap(),
    );
    assert_eq!(st, 200);
    assert!(
        metrics.contains(&format!("suffixd_cached_tokens {cached}")),
        "{metrics}"
    );
    assert!(metrics.contains("suffixd_accepted_tokens_per_step_bucket"));
    // The repeated completion and the streamed repeat of the chat request reused.
    let reused: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("suffixd_prefix_cache_reused_tokens_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no prefix cache counter: {metrics}"));
    assert!(reused > cached_prompt(&second), "{reused}");
    // Each tenant's use, by namespace: four requests of the default one, and tenant-b's
    // one completion as its usage reported it.
    let usage = |name: &str, namespace: &str| -> u64 {
        let prefix = format!("suffixd_namespace_{name}_total{{namespace=\"{namespace}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix}: {metrics}"))
    };
    assert_eq!(usage("requests", "default"), 4);
    assert_eq!(usage("requests", "tenant-b"), 1);
    assert_eq!(
        usage("generated_tokens", "tenant-b"),
        elsewhere["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage("prompt_tokens", "tenant-b"), prompt_tokens);
    assert!(usage("cached_prompt_tokens", "default") >= cached_prompt(&second));
    assert_eq!(stats["serving"]["prefix_cache"]["hits"], 2, "{stats}");
    // Drafting and verifying were timed at every step.
    for name in [
        "suffixd_speculation_seconds_count",
        "suffixd_verification_seconds_count",
        "suffixd_batch_sequences_count",
    ] {
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing: {metrics}"));
        assert!(count > 0, "{name} is {count}");
    }

    // Bad inputs: OpenAI-style 4xx, and the server keeps serving.
    for (body, status, needle) in [
        ("{not json".to_string(), 400, "invalid JSON"),
        (
            json!({"prompt": "x", "bogus": 1}).to_string(),
            400,
            "unknown field",
        ),
        (
            json!({"prompt": "x", "model": "gpt-9"}).to_string(),
            404,
            "not served",
        ),
        (
            json!({"prompt": "x", "max_tokens": 100000}).to_string(),
            400,
            "max_tokens",
        ),
        (
            json!({"prompt": "word ".repeat(600), "max_tokens": 8}).to_string(),
            400,
            "context length",
        ),
        (json!({"prompt": ""}).to_string(), 400, "prompt"),
        (
            json!({"prompt": "x".repeat(2 << 20)}).to_string(),
            413,
            "larger than",
        ),
    ] {
        let (st, err) = s.post("/v1/completions", &body, false);
        assert_eq!(st, status, "{err}");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{msg}");
    }
    let (st, err) = s.post(
        "/v1/chat/completions",
        &json!({"messages": []}).to_string(),
        false,
    );
    assert_eq!(st, 400, "{err}");
    assert_eq!(s.get("/nope", false).0, 404);

    // A body declared far over the limit is refused from its headers alone, before the
    // client sends it (so a client using `Expect: 100-continue` never has to).
    let head = raw_exchange(
        &s.base,
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: 1073741824\r\nconnection: close\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.contains("larger than"), "{head}");

    // Concurrent clients while a snapshot and a compaction run: every request answered.
    let base = s.base.clone();
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let base = base.clone();
            std::thread::spawn(move || {
                for j in 0..2 {
                    let body = json!({"prompt": format!("Count: {i} {j} {i} {j}"), "max_tokens": 6, "temperature": 0.7, "seed": i});
                    let r = ureq::post(&format!("{base}/v1/completions")).send_string(&body.to_string());
                    assert_eq!(r.map(|r| r.status()).unwrap_or(0), 200);
                }
            })
        })
        .collect();
    let (st, job) = s.post("/admin/snapshot", "", true);
    assert_eq!(st, 202);
    let poll = job["poll"].as_str().unwrap().to_string();
    let (st, _) = s.post("/admin/compact", "", true);
    assert!(st == 202, "compact answered {st}");
    for c in clients {
        c.join().unwrap();
    }
    let t = Instant::now();
    loop {
        let (_, j) = s.get(&poll, true);
        if j["status"] == "done" {
            assert!(j["snapshot"]["path"].as_str().unwrap().ends_with(".sfxd"));
            break;
        }
        assert_ne!(j["status"], "failed", "{j}");
        assert!(t.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, verify) = s.get("/admin/verify", true);
    assert_eq!(verify["ok"], true, "{verify}");
    let (_, before) = s.get("/admin/stats", true);
    let (_, third) = s.post("/v1/completions", &req.to_string(), false);

    // Restart: graceful stop (snapshot on exit), start on the same directory.
    s.stop();
    let s = Server::start(dir.path());
    let (_, after) = s.get("/admin/stats", true);
    assert_eq!(
        after["cached_tokens"],
        before["cached_tokens"].as_u64().unwrap()
            + third["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let (_, again) = s.post("/v1/completions", &req.to_string(), false);
    assert_eq!(again["choices"][0]["text"], first["choices"][0]["text"]);
    assert_eq!(
        again["suffixd"]["accepted_tokens"], third["suffixd"]["accepted_tokens"],
        "the same drafts after the restart"
    );
    assert_eq!(again["suffixd"]["steps"], third["suffixd"]["steps"]);
    s.stop();
}

/// Log-probabilities as an OpenAI client asks for them: every generated token's, with
/// its most likely alternatives, in chat and completions, streamed and not. They are the
/// model's own, so a speculating server and a `--no-spec` one give the same.
#[test]
fn logprobs_come_with_every_token_and_speculation_leaves_them_unchanged() {
    if !model_present() {
        return;
    }
    let (dir, plain_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = Server::start(dir.path());
    let plain = Server::start_with(plain_dir.path(), &["--no-spec"], false);
    let chat = json!({"messages": [{"role": "user", "content": REPEAT}], "max_tokens": 24,
        "temperature": 0, "logprobs": true, "top_logprobs": 3});
    // The second answer drafts from the first.
    assert_eq!(
        spec.post("/v1/chat/completions", &chat.to_string(), false)
            .0,
        200
    );
    let (st, drafted) = spec.post("/v1/chat/completions", &chat.to_string(), false);
    assert_eq!(st, 200, "{drafted}");
    assert!(
        drafted["suffixd"]["accepted_tokens"].as_u64().unwrap() > 0,
        "{drafted}"
    );
    let (st, alone) = plain.post("/v1/chat/completions", &chat.to_string(), false);
    assert_eq!(st, 200, "{alone}");
    assert_eq!(alone["suffixd"]["drafted_tokens"], 0);
    let logprobs = &drafted["choices"][0]["logprobs"];
    assert_eq!(*logprobs, alone["choices"][0]["logprobs"]);

    let content = logprobs["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        drafted["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let text: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        text,
        drafted["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
    for t in content {
        assert!(t["logprob"].as_f64().unwrap() <= 0.0, "{t}");
        assert_eq!(
            t["bytes"],
            json!(t["token"].as_str().unwrap().as_bytes()),
            "{t}"
        );
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{t}");
        // Greedy: the token is the most likely one.
        assert_eq!(
            (&top[0]["token"], &top[0]["logprob"]),
            (&t["token"], &t["logprob"])
        );
        assert!(
            top.windows(2)
                .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64())
        );
    }

    // Streamed: the same entries, spread over the chunks that carry their text.
    let mut streamed_req = chat.clone();
    streamed_req["stream"] = json!(true);
    let (streamed_text, chunks) = stream_chat(&plain, &streamed_req);
    assert_eq!(streamed_text, text);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(streamed, *content);

    // Completions, the legacy form: parallel arrays, text offsets in bytes.
    let req = json!({"prompt": REPEAT, "max_tokens": 16, "temperature": 0, "logprobs": 2});
    let (st, c) = spec.post("/v1/completions", &req.to_string(), false);
    assert_eq!(st, 200, "{c}");
    let lp = &c["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), c["choices"][0]["text"].as_str().unwrap());
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let mut at = 0;
    for (token, offset) in tokens.iter().zip(&offsets) {
        assert_eq!(*offset, at);
        at += token.len() as u64;
    }
    for (top, chosen) in lp["top_logprobs"].as_array().unwrap().iter().zip(&tokens) {
        let top = top.as_object().unwrap();
        assert!(
            !top.is_empty() && top.len() <= 2 && top.contains_key(*chosen),
            "{top:?}"
        );
    }
    // Without `logprobs`, none.
    let (_, none) = spec.post(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}).to_string(),
        false,
    );
    assert!(none["choices"][0]["logprobs"].is_null(), "{none}");
}

/// A stream's text is the answer's, whatever the stop strings: text that may be the
/// start of a stop string is held back until the stop string follows (and is cut) or
/// does not. Stop strings are cut from the model's own answer at several places, so
/// that they span token boundaries; with and without speculation.
#[test]
fn streams_never_send_the_start_of_a_stop_string() {
    if !model_present() {
        return;
    }
    for extra in [&[][..], &["--no-spec"][..]] {
        let dir = tempfile::tempdir().unwrap();
        let s = Server::start_with(dir.path(), extra, false);
        let body = |stop: Value| {
            json!({"messages": [{"role": "user", "content": "Count from 1 to 30, separated by commas."}],
                "max_tokens": 48, "temperature": 0, "stop": stop})
        };
        let (st, free) = s.post(
            "/v1/chat/completions",
            &body(json!(null)).to_string(),
            false,
        );
        assert_eq!(st, 200, "{free}");
        let text = free["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(text.len() > 30, "{text:?}");
        let piece = |at: usize, len: usize| {
            let mut at = at.min(text.len() - len);
            while !text.is_char_boundary(at) || !text.is_char_boundary(at + len) {
                at -= 1;
            }
            text[at..at + len].to_string()
        };
        let stops = [
            json!(piece(text.len() / 2, 4)),
            json!(piece(text.len() / 3, 2)),
            json!([piece(text.len() * 3 / 4, 5), "never appears here"]),
            json!(["no such text", format!("{}, zz", piece(text.len() / 4, 3))]),
            json!(piece(text.len() - 3, 3)),
        ];
        for stop in stops {
            let (st, whole) = s.post(
                "/v1/chat/completions",
                &body(stop.clone()).to_string(),
                false,
            );
            assert_eq!(st, 200, "{whole}");
            let answer = whole["choices"][0]["message"]["content"].as_str().unwrap();
            // The answer is the free answer up to the earliest stop string.
            let list: Vec<String> = match &stop {
                Value::String(one) => vec![one.clone()],
                many => serde_json::from_value(many.clone()).unwrap(),
            };
            let cut = list
                .iter()
                .filter_map(|x| text.find(x.as_str()))
                .min()
                .unwrap_or(text.len());
            assert_eq!(answer, &text[..cut], "stop {stop}");
            let mut streamed = body(stop.clone());
            streamed["stream"] = json!(true);
            let (sent, _) = stream_chat(&s, &streamed);
            assert_eq!(sent, answer, "stop {stop} {extra:?}");
        }
    }
}

/// A seed fixes a sampled answer, with or without speculation: a speculating server
/// that has learned the prompt's answers (so its drafts are verified and accepted)
/// answers each seed as a server that does not speculate does.
#[test]
fn a_seed_gives_the_same_answer_with_and_without_speculation() {
    if !model_present() {
        return;
    }
    let (dir, plain_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = Server::start(dir.path());
    let plain = Server::start_with(plain_dir.path(), &["--no-spec"], false);
    let body = |seed: u64| {
        json!({"messages": [{"role": "user", "content": "Write a short poem about the sea."}],
            "max_tokens": 32, "temperature": 1.0, "top_p": 0.95, "seed": seed})
        .to_string()
    };
    let mut accepted = 0;
    for seed in 0..6 {
        let (_, want) = plain.post("/v1/chat/completions", &body(seed), false);
        // Twice: the second time the store has the first answer to draft from.
        for _ in 0..2 {
            let (st, got) = spec.post("/v1/chat/completions", &body(seed), false);
            assert_eq!(st, 200, "{got}");
            assert_eq!(
                got["choices"][0]["message"], want["choices"][0]["message"],
                "seed {seed}"
            );
            accepted += got["suffixd"]["accepted_tokens"].as_u64().unwrap();
        }
    }
    assert!(accepted > 50, "speculation accepted only {accepted} tokens");
}

/// `/health` and `/ready` on a real server: both 200 while it serves; on SIGTERM with a
/// drain delay `/ready` turns 503 at once while requests are still answered, then the
/// process exits 0.
#[test]
fn sigterm_drains_readiness_first_and_then_exits_cleanly() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start_with(dir.path(), &["--drain-delay-s", "3"], false);
    assert_eq!(s.get("/health", false), (200, json!({"status": "ok"})));
    assert_eq!(s.get("/ready", false), (200, json!({"status": "ok"})));
    s.signal_term();
    let t = Instant::now();
    let mut saw_draining = false;
    while t.elapsed() < Duration::from_secs(2) {
        let (status, body) = s.get("/ready", false);
        if status == 503 {
            assert!(
                body["reason"].as_str().unwrap().contains("draining"),
                "{body}"
            );
            saw_draining = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(saw_draining, "/ready never turned 503 after SIGTERM");
    assert_eq!(s.get("/health", false).0, 200, "draining is alive");
    let (st, answer) = s.post(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 4}).to_string(),
        false,
    );
    assert_eq!(st, 200, "requests are served while draining: {answer}");
    let status = s.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status}: {}", s.log());
}

/// A model thread that dies (a panic, injected at its step) fails `/health` and
/// `/ready`, and the process exits non-zero by itself, so that a supervisor restarts it.
#[test]
fn a_dead_model_thread_fails_health_and_the_process_exits_non_zero() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start_with_env(
        dir.path(),
        &["--shutdown-grace-s", "1"],
        false,
        &[("FAILPOINTS", "model-step=panic")],
    );
    assert_eq!(s.get("/health", false).0, 200);
    // The step panics: the request fails (or its connection closes), never hangs.
    let failed = ureq::post(&s.url("/v1/completions"))
        .set("content-type", "application/json")
        .send_string(&json!({"prompt": "Hi", "max_tokens": 4}).to_string());
    assert!(
        !matches!(failed, Ok(ref r) if r.status() == 200),
        "a request was answered without a model thread"
    );
    let status = s.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "exited with {status}");
    let log = s.log();
    assert!(log.contains("model thread panicked"), "{log}");
}

/// `n` choices are `n` generations of one prompt, choice i sampled with seed + i: each
/// choice is what a one-choice request with that seed returns, and streamed with `n`
/// they arrive under their indices. Usage counts the prompt once.
#[test]
fn n_choices_are_generations_with_seeds_one_apart() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), &["--no-spec"], false);
    let body = |n: u32, seed: u64| {
        json!({"messages": [{"role": "user", "content": "Write a short poem about the sea."}],
            "max_tokens": 12, "temperature": 1.0, "seed": seed, "n": n, "logprobs": true})
    };
    let (st, many) = s.post("/v1/chat/completions", &body(3, 40).to_string(), false);
    assert_eq!(st, 200, "{many}");
    let choices = many["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{many}");
    let mut tokens = 0;
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let (st, one) = s.post(
            "/v1/chat/completions",
            &body(1, 40 + i as u64).to_string(),
            false,
        );
        assert_eq!(st, 200, "{one}");
        assert_eq!(one["choices"][0]["message"], choice["message"]);
        tokens += choice["logprobs"]["content"].as_array().unwrap().len();
    }
    assert!(
        choices
            .iter()
            .any(|c| c["message"] != choices[0]["message"]),
        "{many}"
    );
    assert_eq!(many["usage"]["completion_tokens"], tokens);
    assert_eq!(
        many["usage"]["prompt_tokens"],
        s.post("/v1/chat/completions", &body(1, 1).to_string(), false)
            .1["usage"]["prompt_tokens"]
    );
    // Streamed, the same choices arrive, each under its index and ending with its own
    // finish reason; a last chunk without choices carries the same counts.
    let mut streamed = body(3, 40);
    streamed["stream"] = json!(true);
    let (_, chunks) = stream_chat(&s, &streamed);
    let (mut texts, mut finishes) = (vec![String::new(); 3], vec![Value::Null; 3]);
    for chunk in &chunks[..chunks.len() - 1] {
        let choice = &chunk["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i].push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        if !choice["finish_reason"].is_null() {
            finishes[i] = choice["finish_reason"].clone();
        }
    }
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(
            texts[i],
            choice["message"]["content"].as_str().unwrap(),
            "choice {i}"
        );
        assert_eq!(finishes[i], choice["finish_reason"], "choice {i}");
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    // (Its prompt now comes from the prefix cache: `cached_tokens` may differ.)
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(
            last["usage"][field], many["usage"][field],
            "{field}: {last}"
        );
    }
}

/// The prefix cache's per-namespace share, through the real server: a quiet tenant's
/// prompt is evicted by a busy tenant's twenty different prompts under plain least recent
/// use, and kept with `--prefix-cache-share 30`, while the busy tenant still uses the
/// rest of the budget.
#[test]
fn a_namespace_keeps_its_prefix_cache_share_while_another_floods_it() {
    if !model_present() {
        return;
    }
    // Ten 16-token blocks of the default model (46,080 bytes a token, 256 of bookkeeping
    // a block).
    let budget = (10 * (16 * 46_080 + 256)).to_string();
    let quiet_prompt = "The quiet tenant asks the same long question every morning: what is the weather going to be like in Paris, Lyon and Marseille today, and should I bring an umbrella?";
    let ask = |s: &Server, namespace: &str, prompt: &str| -> Value {
        let body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
        let r = ureq::post(&s.url("/v1/completions"))
            .set("x-suffixd-namespace", namespace)
            .send_string(&body.to_string());
        let (st, r) = answer(r);
        assert_eq!(st, 200, "{r}");
        r
    };
    let cached = |r: &Value| {
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    for share in ["0", "30"] {
        let dir = tempfile::tempdir().unwrap();
        let s = Server::start_with(
            dir.path(),
            &[
                "--prefix-cache-bytes",
                &budget,
                "--prefix-cache-share",
                share,
            ],
            false,
        );
        let first = ask(&s, "quiet", quiet_prompt);
        assert!(
            first["usage"]["prompt_tokens"].as_u64().unwrap() > 32,
            "{first}"
        );
        for i in 0..20 {
            let flood = format!(
                "Busy tenant request {i}: summarise ticket {i} about the printer on floor {i}, which jams every time someone prints in colour"
            );
            ask(&s, "busy", &flood);
        }
        let again = ask(&s, "quiet", quiet_prompt);
        let (_, stats) = s.get("/admin/stats", true);
        let prefix = &stats["serving"]["prefix_cache"];
        if share == "0" {
            assert_eq!(
                cached(&again),
                0,
                "plain LRU evicts the quiet prompt: {again}"
            );
        } else {
            assert!(cached(&again) >= 32, "the share keeps it: {again}");
            assert!(
                prefix["namespace_share_bytes"].as_u64().unwrap() > 0,
                "{prefix}"
            );
        }
        // Either way the cache is full and within its budget.
        assert_eq!(prefix["blocks"], 10, "{prefix}");
        assert!(prefix["bytes"].as_u64().unwrap() <= budget.parse::<u64>().unwrap());
    }
}

/// One slot in the batch (`--max-batch 1`), five requests of a busy namespace waiting
/// behind its sixth, then one of a quiet namespace: the quiet one runs within two turns
/// (the busy namespace's next was first in line, and one may have started meanwhile),
/// not seventh as first-come-first-served would run it; `suffixd_queued_requests`
/// counts the waiting.
#[test]
fn a_quiet_namespace_is_not_held_behind_a_busy_one() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), &["--max-batch", "1", "--no-spec"], false);
    let queued = || {
        let text = ureq::get(&s.url("/metrics"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("suffixd_queued_requests "));
        line.and_then(|n| n.parse::<usize>().ok())
            .expect("the gauge")
    };
    let finished = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let ask = |namespace: &'static str, i: usize| {
            let (s, finished) = (&s, &finished);
            move || {
                let prompt =
                    format!("Story {i} of {namespace}: once upon a time, in a town by the sea,");
                let body = json!({"prompt": prompt, "max_tokens": 48, "temperature": 0});
                let r = ureq::post(&s.url("/v1/completions"))
                    .set("x-suffixd-namespace", namespace)
                    .send_string(&body.to_string());
                let (status, r) = answer(r);
                assert_eq!(status, 200, "{r}");
                finished.lock().unwrap().push(format!("{namespace}{i}"));
            }
        };
        for i in 0..6 {
            scope.spawn(ask("busy", i));
        }
        // One runs; the other five wait.
        let start = Instant::now();
        while queued() < 5 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "five never waited together"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        scope.spawn(ask("quiet", 0));
    });
    let order = finished.into_inner().unwrap();
    let quiet_at = order.iter().position(|n| n == "quiet0").unwrap();
    assert!(
        quiet_at <= 3,
        "the quiet namespace waited behind the busy one's queue: {order:?}"
    );
    assert_eq!(queued(), 0);
}
