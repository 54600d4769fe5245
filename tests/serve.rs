//! `suffixd serve` as a real process on loopback, with the real model, driven over
//! real HTTP as an OpenAI client would: completions, chat, streaming, the admin API,
//! bad inputs, concurrent clients during snapshot and compaction, and a restart that
//! keeps what the cache learned.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TOKEN: &str = "test-admin-token";

struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_suffixd"))
            .args([
                "serve",
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--snapshot-dir",
            ])
            .arg(dir)
            .args([
                "--cost",
                "flat",
                "--max-context",
                "512",
                "--max-tokens-limit",
                "256",
            ])
            .env("SUFFIXD_ADMIN_TOKEN", TOKEN)
            .env("CANDLE_NUM_THREADS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start suffixd serve");
        let s = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let t = Instant::now();
        while ureq::get(&format!("{}/v1/models", s.base)).call().is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "server did not come up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        s
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST JSON; returns (status, body as JSON).
    fn post(&self, path: &str, body: &str, admin: bool) -> (u16, Value) {
        let mut r = ureq::post(&self.url(path)).set("content-type", "application/json");
        if admin {
            r = r.set("authorization", &format!("Bearer {TOKEN}"));
        }
        answer(r.send_string(body))
    }

    fn get(&self, path: &str, admin: bool) -> (u16, Value) {
        let mut r = ureq::get(&self.url(path));
        if admin {
            r = r.set("authorization", &format!("Bearer {TOKEN}"));
        }
        answer(r.call())
    }

    /// SIGTERM, and wait for a graceful exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let t = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(60), "no graceful exit");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Send raw bytes to the server and read its answer until it closes the connection.
fn raw_exchange(base: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

fn model_present() -> bool {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return true;
    }
    if std::env::var_os("SUFFIXD_SKIP_MODEL_TESTS").is_some() {
        eprintln!("skipped: no model and SUFFIXD_SKIP_MODEL_TESTS is set");
        return false;
    }
    panic!("the default model is missing: run tools/setup.sh (or set SUFFIXD_SKIP_MODEL_TESTS=1)");
}

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
    assert_eq!(
        first["usage"]["completion_tokens"].as_u64().unwrap() as usize > 0,
        true
    );
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

    // Admin: refused without the token, working with it.
    assert_eq!(s.get("/admin/stats", false).0, 401);
    assert_eq!(s.post("/admin/snapshot", "", false).0, 401);
    let (st, stats) = s.get("/admin/stats", true);
    assert_eq!(st, 200);
    let cached = stats["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && stats["namespaces"]["default"]["cached_tokens"].as_u64() == Some(cached));
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
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
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
