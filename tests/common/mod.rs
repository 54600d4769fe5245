//! The harness of the tests that run `suffixd serve` as a real process on loopback with
//! the real model, and talk to it over real HTTP.

#![allow(dead_code, reason = "each test binary uses a different part")]

pub mod nats;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The admin token the servers are started with.
pub const TOKEN: &str = "test-admin-token";

/// Where tools/setup.sh installs the default model.
pub fn model_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Run the `suffixd` binary with `args` to completion.
pub fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_suffixd"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// `out` is a failure that says `needle` on stderr, without a panic.
pub fn assert_clean_failure(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "panicked instead of reporting: {stderr}"
    );
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
}

/// Whether the default model is installed; without it, panic unless the environment
/// asks to skip model tests.
pub fn model_present() -> bool {
    if model_path().exists() {
        return true;
    }
    if std::env::var_os("SUFFIXD_SKIP_MODEL_TESTS").is_some() {
        eprintln!("skipped: no model and SUFFIXD_SKIP_MODEL_TESTS is set");
        return false;
    }
    panic!("the default model is missing: run tools/setup.sh (or set SUFFIXD_SKIP_MODEL_TESTS=1)");
}

/// A running `suffixd serve`.
pub struct Server {
    pub child: Child,
    pub base: String,
    log: tempfile::NamedTempFile,
}

/// The flags every test server starts with, less those `extra` sets itself (the CLI
/// refuses a flag given twice).
fn defaults_not_in(extra: &[&str]) -> Vec<&'static str> {
    [
        ("--cost", "flat"),
        ("--max-context", "512"),
        ("--max-tokens-limit", "256"),
    ]
    .into_iter()
    .filter(|(flag, _)| !extra.contains(flag))
    .flat_map(|(flag, value)| [flag, value])
    .collect()
}

impl Server {
    /// Start on `dir` with the test defaults.
    pub fn start(dir: &Path) -> Server {
        Self::start_with(dir, &[], false)
    }

    /// Start on `dir` with `extra` flags. `ignore_file_size_signal`: start it with
    /// SIGXFSZ ignored, so that a file-size limit makes writes fail (as a full disk
    /// does) instead of killing the process.
    pub fn start_with(dir: &Path, extra: &[&str], ignore_file_size_signal: bool) -> Server {
        Self::start_with_env(dir, extra, ignore_file_size_signal, &[])
    }

    /// [`Server::start_with`], with `env` set for the process (FAILPOINTS, say).
    pub fn start_with_env(
        dir: &Path,
        extra: &[&str],
        ignore_file_size_signal: bool,
        env: &[(&str, &str)],
    ) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = if ignore_file_size_signal {
            let mut c = Command::new("sh");
            c.args(["-c", "trap '' XFSZ; exec \"$0\" \"$@\""])
                .arg(env!("CARGO_BIN_EXE_suffixd"));
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_suffixd"))
        };
        let child = cmd
            .args([
                "serve",
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--snapshot-dir",
            ])
            .arg(dir)
            .args(defaults_not_in(extra))
            .args(extra)
            .env("SUFFIXD_ADMIN_TOKEN", TOKEN)
            .env("CANDLE_NUM_THREADS", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("start suffixd serve");
        let mut s = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let t = Instant::now();
        // Up once it answers HTTP at all (behind API keys, /v1/models answers 401).
        let answers = |base: &str| {
            let probe = ureq::get(&format!("{base}/v1/models")).call();
            !matches!(probe, Err(ureq::Error::Transport(_)))
        };
        while !answers(&s.base) {
            if let Some(status) = s.child.try_wait().unwrap() {
                panic!("server exited with {status}: {}", s.log());
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "server did not come up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        s
    }

    /// What the server has written to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST JSON; returns (status, body as JSON).
    pub fn post(&self, path: &str, body: &str, admin: bool) -> (u16, Value) {
        let mut r = ureq::post(&self.url(path)).set("content-type", "application/json");
        if admin {
            r = r.set("authorization", &format!("Bearer {TOKEN}"));
        }
        answer(r.send_string(body))
    }

    pub fn get(&self, path: &str, admin: bool) -> (u16, Value) {
        let mut r = ureq::get(&self.url(path));
        if admin {
            r = r.set("authorization", &format!("Bearer {TOKEN}"));
        }
        answer(r.call())
    }

    /// SIGTERM; returns how long the process took to exit (at most `limit`).
    pub fn terminate(&mut self, limit: Duration) -> Duration {
        self.signal_term();
        let t = Instant::now();
        self.wait_exit(limit);
        t.elapsed()
    }

    /// Send SIGTERM and return at once.
    pub fn signal_term(&self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    }

    /// Wait for the process to exit (at most `limit`); its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                t.elapsed() < limit,
                "no exit within {limit:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, and wait for a graceful exit.
    pub fn stop(mut self) {
        self.terminate(Duration::from_secs(60));
    }

    /// SIGKILL: no shutdown work at all.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status and JSON body of a ureq answer.
pub fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
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
pub fn raw_exchange(base: &str, request: &[u8]) -> String {
    let addr = base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(request).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// What [`run_batched`] did: each prompt's generation, in prompt order, the widest batch
/// and the steps it took.
pub struct Batched {
    pub generations: Vec<suffixd::engine::Generation>,
    pub widest: usize,
    pub steps: usize,
}

/// Run `prompts` through `engine` under continuous batching, as the server does: the
/// first `together` start at once, then one more joins at each step, each drafting from
/// its own drafter; a sequence leaves the batch when it finishes.
pub fn run_batched<D: suffixd::engine::Drafter>(
    engine: &mut suffixd::engine::Engine,
    prompts: &[Vec<u32>],
    options: impl Fn(usize) -> suffixd::engine::GenerateOptions,
    drafters: &mut [D],
    together: usize,
) -> Batched {
    use suffixd::engine::{Drafter, Generation, Sequence};
    let mut seqs: Vec<Option<Sequence>> = prompts.iter().map(|_| None).collect();
    let mut done: Vec<Option<Generation>> = prompts.iter().map(|_| None).collect();
    let (mut steps, mut widest) = (0, 0);
    while done.iter().any(Option::is_none) {
        for i in 0..prompts.len() {
            if seqs[i].is_none() && done[i].is_none() && i < together + steps {
                seqs[i] = Some(engine.start(&prompts[i], &options(i)).unwrap());
            }
        }
        let mut batch: Vec<(&mut Sequence, &mut dyn Drafter)> = seqs
            .iter_mut()
            .zip(drafters.iter_mut())
            .filter_map(|(s, d)| s.as_mut().map(|s| (s, d as &mut dyn Drafter)))
            .collect();
        widest = widest.max(batch.len());
        engine.step(&mut batch).unwrap();
        for i in 0..prompts.len() {
            if seqs[i].as_ref().is_some_and(Sequence::is_finished) {
                done[i] = Some(engine.finish(seqs[i].take().unwrap()));
            }
        }
        steps += 1;
    }
    Batched {
        generations: done.into_iter().map(Option::unwrap).collect(),
        widest,
        steps,
    }
}

/// Asserts that a device's logits `dev` are finite and near the CPU's `cpu` for weights
/// in `format`: the norm of their difference over the norm of the CPU's (printed under
/// `what`) under 1e-3, as summation orders differ, or 5e-3 in bf16, where the CPU rounds
/// activations to bf16 and the GPU's kernels do not.
pub fn assert_near_the_cpu(
    cpu: &[f32],
    dev: &[f32],
    format: suffixd::model::forward::WeightFormat,
    what: &str,
) {
    assert!(dev.iter().all(|x| x.is_finite()), "{what}: finite logits");
    let diff: f64 = cpu
        .iter()
        .zip(dev)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let norm: f64 = cpu.iter().map(|a| (*a as f64).powi(2)).sum();
    let rel = (diff / norm).sqrt();
    eprintln!("{what}: relative difference from the CPU {rel:.3e}");
    let tolerance = match format {
        suffixd::model::forward::WeightFormat::Bf16 => 5e-3,
        _ => 1e-3,
    };
    assert!(
        rel < tolerance,
        "{what}: logits differ from the CPU's by {rel:.3e}"
    );
}
