//! The `suffixd` binary as a user runs it: real files, a real process, its exit code,
//! stdout and stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

use common::{assert_clean_failure, run};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/data")
        .join(name)
}

/// `suffixd simulate --warm WARM --test TEST EXTRA...`
fn simulate(warm: &Path, test: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "simulate",
        "--warm",
        warm.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("some output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

fn total_response_tokens(path: &Path) -> u64 {
    suffixd::corpus::read_examples(path, None)
        .unwrap()
        .map(|e| e.unwrap().response.len() as u64)
        .sum()
}

#[test]
fn simulate_json_has_the_contract_keys_and_consistent_figures() {
    let warm = example("warm.jsonl.zst");
    let test = example("test.jsonl.zst");
    for mode in ["paper", "extended"] {
        for shape in ["--linear", "--tree"] {
            let out = simulate(
                &warm,
                &test,
                &["--test-limit", "40", "--mode", mode, shape, "--json"],
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r = last_json(&out);
            for key in [
                "tokens_per_step",
                "acceptance_rate",
                "mean_draft_size",
                "steps",
                "generated_tokens",
                "accepted_tokens",
                "drafted_tokens",
                "spec_us_per_call",
                "update_us_per_token",
                "warmup_s",
                "cached_tokens",
                "store_bytes_per_token",
            ] {
                assert!(r.get(key).is_some(), "{mode} {shape}: missing {key}");
            }
            // The per-call distribution: ordered, and the mean lies within it.
            let q = |k: &str| r[k].as_f64().unwrap();
            assert!(q("spec_us_p50") <= q("spec_us_p99") && q("spec_us_p99") <= q("spec_us_max"));
            assert!(q("spec_us_per_call") <= q("spec_us_max") && q("spec_us_max") > 0.0);
            let steps = r["steps"].as_u64().unwrap();
            let generated = r["generated_tokens"].as_u64().unwrap();
            let accepted = r["accepted_tokens"].as_u64().unwrap();
            let drafted = r["drafted_tokens"].as_u64().unwrap();
            // Every step yields one bonus token except where the draft finished the response.
            assert!(generated >= steps && generated <= steps + accepted);
            assert!(accepted <= drafted);
            let tps = r["tokens_per_step"].as_f64().unwrap();
            assert!((tps - generated as f64 / steps as f64).abs() < 1e-9);
            assert!(tps > 1.0, "{mode} {shape}: speculation accepted nothing");
            assert_eq!(r["test_examples"].as_u64(), Some(40));
            assert_eq!(r["warm_examples"].as_u64(), Some(300));
        }
    }
}

#[test]
fn simulate_replays_every_response_token() {
    let warm = example("warm.jsonl.zst");
    let test = example("test.jsonl.zst");
    let out = run(&[
        "simulate",
        "--warm",
        warm.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success());
    let r = last_json(&out);
    assert_eq!(
        r["generated_tokens"].as_u64().unwrap(),
        total_response_tokens(&test)
    );
    assert_eq!(
        r["cached_tokens"].as_u64().unwrap(),
        total_response_tokens(&warm)
    );
}

#[test]
fn replay_timing_adds_its_figure_and_changes_no_draft() {
    let warm = example("warm.jsonl.zst");
    let test = example("test.jsonl.zst");
    let args = ["--test-limit", "40", "--json"];
    let plain = last_json(&simulate(&warm, &test, &args));
    let out = simulate(&warm, &test, &[&args[..], &["--replay-timing"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed = last_json(&out);
    assert!(plain.get("spec_replay_us_per_call").is_none());
    assert!(replayed["spec_replay_us_per_call"].as_f64().unwrap() > 0.0);
    for key in ["steps", "accepted_tokens", "drafted_tokens"] {
        assert_eq!(plain[key], replayed[key], "{key}");
    }
}

#[test]
fn max_cached_requests_limits_the_global_tree() {
    let warm = example("warm.jsonl.zst");
    let test = example("test.jsonl.zst");
    let args = |cap: &str| {
        simulate(
            &warm,
            &test,
            &["--test-limit", "5", "--max-cached-requests", cap, "--json"],
        )
    };
    let r = last_json(&args("10"));
    assert_eq!(r["cached_requests"].as_u64(), Some(10));
    let r = last_json(&args("0"));
    assert_eq!(r["cached_tokens"].as_u64(), Some(0));
}

#[test]
fn entropy_is_lower_for_repetitive_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let repetitive = dir.path().join("rep.jsonl");
    let mut f = std::fs::File::create(&repetitive).unwrap();
    for _ in 0..50 {
        writeln!(
            f,
            "{{\"prompt\": [], \"response\": [10, 11, 12, 13, 14, 15, 16, 17]}}"
        )
        .unwrap();
    }
    let out = run(&["entropy", "--logs", repetitive.to_str().unwrap(), "--json"]);
    assert!(out.status.success());
    let low = last_json(&out)["entropy_bits"].as_f64().unwrap();
    let out = run(&[
        "entropy",
        "--logs",
        example("warm.jsonl.zst").to_str().unwrap(),
        "--json",
    ]);
    let chat = last_json(&out)["entropy_bits"].as_f64().unwrap();
    assert!(
        low < 0.5 && chat > 1.0 && low < chat,
        "repetitive {low}, chat {chat}"
    );
}

#[test]
fn bad_inputs_are_clear_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let test = example("test.jsonl.zst");
    let out = simulate(&dir.path().join("missing.jsonl"), &test, &[]);
    assert_clean_failure(&out, "cannot read");

    let garbage = dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, "this is not json\n").unwrap();
    assert_clean_failure(&simulate(&garbage, &test, &[]), "garbage.jsonl:1");

    let negative = dir.path().join("neg.jsonl");
    std::fs::write(&negative, "{\"prompt\": [1], \"response\": [-3]}\n").unwrap();
    assert_clean_failure(&simulate(&negative, &test, &[]), "not a token example");

    // A truncated zstd stream.
    let bytes = std::fs::read(example("warm.jsonl.zst")).unwrap();
    let truncated = dir.path().join("truncated.jsonl.zst");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_failure(&simulate(&truncated, &test, &[]), "cannot read");

    assert_clean_failure(&simulate(&test, &test, &["--min-prob", "2"]), "--min-prob");
    assert_clean_failure(
        &simulate(&test, &test, &["--max-depth", "0"]),
        "--max-depth",
    );
    let snapshot = dir.path().to_str().unwrap();
    assert_clean_failure(
        &simulate(&test, &test, &["--snapshot", snapshot]),
        "holds no snapshot",
    );
}

/// `e2e-bench --cost-curve`: the curve in the file sizes the drafts and prices the steps.
/// Where verifying costs nothing the projection is the steps saved; where each row costs
/// a step of its own no draft pays, and the projection is plain decoding's speed. A file
/// without a curve is a clear error.
#[test]
fn a_cost_curve_file_sizes_the_drafts_and_prices_the_projection() {
    if !common::model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workload = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/workloads/agentic.jsonl");
    let model = common::model_path();
    let bench = |curve: &str| {
        let file = dir.path().join("curve.json");
        std::fs::write(&file, curve).unwrap();
        let args = [
            "e2e-bench",
            "--model",
            model.to_str().unwrap(),
            "--workload",
            workload.to_str().unwrap(),
            "--limit",
            "1",
            "--max-tokens",
            "48",
            "--json",
            "--cost-curve",
            file.to_str().unwrap(),
        ];
        run(&args)
    };
    let report = |curve: &str| {
        let out = bench(curve);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        last_json(&out)
    };
    let free = report(r#"{"curve": [[1, 1.0], [64, 1.0]]}"#);
    assert_eq!(free["cost_curve"]["points"][1][1], 1.0, "{free}");
    let projected = free["curve_speedup"].as_f64().unwrap();
    let per_step = free["spec_tokens_per_step"].as_f64().unwrap();
    // Both sides make the same tokens; plain decoding's steps are its tokens less the
    // prefill's first, so the projection is a little above tokens per step.
    assert!(projected > 1.5, "{free}");
    assert!((projected - per_step).abs() < 0.5 * per_step, "{free}");

    let dear = report(r#"{"curve": [[1, 1.0], [2, 2.0], [64, 64.0]]}"#);
    assert_eq!(dear["identical_outputs"], dear["generations"], "{dear}");
    let projected = dear["curve_speedup"].as_f64().unwrap();
    assert!((0.9..=1.1).contains(&projected), "{dear}");

    assert_clean_failure(&bench("{\"t1_ms\": 3}\n"), "no line of the file");
}

/// `generate`'s measured cost curve is kept in the cache folder and reused as measured
/// by the next run with the same binary, model and settings; `--cost remeasure` times it
/// again and keeps that; a damaged file is measured over and replaced, never an error.
#[test]
fn a_measured_cost_curve_is_kept_and_reused() {
    if !common::model_present() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let model = common::model_path();
    let generate = |cost: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_suffixd"))
            .args(["generate", "--model", model.to_str().unwrap()])
            .args(["--prompt", "Count: one, two,", "--max-tokens", "8"])
            .args(["--cost", cost, "--json"])
            .env("SUFFIXD_CACHE_DIR", cache.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        last_json(&out)["cost_curve"].clone()
    };
    let kept_files = || -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    };
    let kept_t1 = |file: &Path| -> serde_json::Value {
        let text = std::fs::read_to_string(file).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["t1_ms"].clone()
    };

    let first = generate("measure");
    let files = kept_files();
    assert_eq!(files.len(), 1, "one kept curve: {files:?}");
    assert_eq!(kept_t1(&files[0]), first["t1_ms"]);

    let second = generate("measure");
    assert_eq!(second["t1_ms"], first["t1_ms"], "reused, not timed again");
    assert_eq!(second["measured"], first["measured"]);

    let third = generate("remeasure");
    assert_ne!(third["t1_ms"], first["t1_ms"], "timed again");
    assert_eq!(kept_t1(&files[0]), third["t1_ms"], "and kept");

    std::fs::write(&files[0], "{\"key\": ").unwrap();
    let fourth = generate("measure");
    assert_ne!(
        fourth["t1_ms"], third["t1_ms"],
        "a damaged file is measured over"
    );
    assert_eq!(kept_t1(&files[0]), fourth["t1_ms"], "and replaced");
    assert_eq!(kept_files().len(), 1);
}

/// `suffixd serve` with a store in `dir` and `extra` flags, for settings refused at
/// start (it returns at once when they are).
fn serve_failing(dir: &Path, extra: &[&str]) -> Output {
    let store = dir.join("store");
    let mut args = vec![
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--snapshot-dir",
        store.to_str().unwrap(),
    ];
    args.extend(extra);
    run(&args)
}

/// `serve --chat-template`: a file that cannot be read fails before the model loads,
/// and one that is not a template names the problem; neither panics.
#[test]
fn a_bad_chat_template_file_is_refused_with_the_problem_named() {
    if !common::model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let serve = |template: &std::path::Path| {
        serve_failing(dir.path(), &["--chat-template", template.to_str().unwrap()])
    };
    let missing = dir.path().join("missing.jinja");
    assert_clean_failure(&serve(&missing), "cannot read the chat template");
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for %}").unwrap();
    assert_clean_failure(&serve(&broken), "broken.jinja does not compile");
}

/// `serve --chat-template-kwargs` and the config file's `chat_template_kwargs`: JSON that
/// is not an object, and a variable the server sets, are refused before the model loads.
#[test]
fn template_variables_that_cannot_be_used_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |extra: &[&str]| serve_failing(dir.path(), extra);
    assert_clean_failure(
        &serve(&["--chat-template-kwargs", "[1]"]),
        "must be a JSON object",
    );
    assert_clean_failure(
        &serve(&["--chat-template-kwargs", "{enable_thinking"]),
        "is not JSON",
    );
    let config = dir.path().join("suffixd.toml");
    std::fs::write(
        &config,
        "[chat_template_kwargs]\nenable_thinking = false\nmessages = []\n",
    )
    .unwrap();
    assert_clean_failure(
        &serve(&["--config", config.to_str().unwrap()]),
        "may not set `messages`",
    );
}
