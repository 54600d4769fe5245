//! The Berkeley Function Calling Leaderboard's cases (PyPI `bfcl-eval`, its data and AST
//! checker, installed by tools/setup.sh) through `suffixd serve` with a forced call and
//! greedy decoding, by tests/bfcl.py and the official openai client: a speculating
//! server and a `--no-spec` one side by side.
//!
//! Every fourth case of `live_simple`, `live_multiple`, `simple_python` and
//! `live_parallel` (432 of 1,727, about 11 minutes on two cores): all of them take
//! `tools/bfcl.sh` about 45 minutes, more than the README's test command can spend on
//! one suite. docs/agents.md gives the full run's figures.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{Server, model_present};
use serde_json::Value;

/// Flags of both servers: BFCL's largest tool lists run to about 6,000 tokens.
const FLAGS: &[&str] = &["--max-context", "8192", "--max-tokens-limit", "256"];

/// Cases answered, keyed by BFCL id, and the run's summary line.
fn read_run(path: &Path, stdout: &[u8]) -> (HashMap<String, Value>, Value) {
    let rows = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            (row["id"].as_str().unwrap().to_string(), row)
        })
        .collect();
    let summary = String::from_utf8_lossy(stdout);
    let last = summary.lines().last().unwrap_or_default();
    (rows, serde_json::from_str(last).unwrap_or(Value::Null))
}

#[test]
fn bfcl_cases_get_valid_calls_and_speculation_changes_no_answer() {
    if !model_present() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/py/bin/python");
    assert!(
        python.exists(),
        "the Python test packages are missing: run tools/setup.sh"
    );
    let out = tempfile::tempdir().unwrap();
    let (spec_dir, plain_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let speculating = Server::start_with(spec_dir.path(), FLAGS, false);
    let plain = Server::start_with(plain_dir.path(), &[FLAGS, &["--no-spec"]].concat(), false);

    let run = |server: &Server, name: &str| {
        Command::new(&python)
            .arg(root.join("tests/bfcl.py"))
            .args(["--base-url", &server.url("/v1"), "--every", "4"])
            .args(["--max-tokens", "128", "--clients", "2", "--out"])
            .arg(out.path().join(name))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (spec_run, plain_run) = (run(&speculating, "spec.jsonl"), run(&plain, "plain.jsonl"));
    let (spec_out, plain_out) = (
        spec_run.wait_with_output().unwrap(),
        plain_run.wait_with_output().unwrap(),
    );
    for (name, result, server) in [
        ("speculating", &spec_out, &speculating),
        ("--no-spec", &plain_out, &plain),
    ] {
        assert!(
            result.status.success(),
            "bfcl.py against the {name} server failed:\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&result.stderr),
            server.log()
        );
    }
    let (spec_rows, summary) = read_run(&out.path().join("spec.jsonl"), &spec_out.stdout);
    let (plain_rows, _) = read_run(&out.path().join("plain.jsonl"), &plain_out.stdout);
    eprintln!("BFCL, every fourth case, speculating server: {summary}");

    assert_eq!(spec_rows.len(), 432, "{summary}");
    for (id, row) in &spec_rows {
        // Each case is answered (no 5xx, no grammar the engine could not run, no refusal:
        // every schema BFCL writes is one suffixd must take).
        assert_eq!(row["status"], 200, "{id}: {row}");
        assert_eq!(row["schema_problems"], Value::Array(vec![]), "{id}: {row}");
        // A forced call: calls, or an answer max_tokens cut before its first call closed.
        let calls = row["calls"].as_array().unwrap();
        assert!(
            !calls.is_empty() || row["finish"] == "length",
            "{id}: a forced call returned none: {row}"
        );
        let content = row["content"].as_str().unwrap_or("");
        assert!(
            !content.contains("<tool_call>"),
            "{id}: markup in content: {row}"
        );
        let other = &plain_rows[id];
        assert_eq!(
            (&row["calls"], &row["content"], &row["finish"]),
            (&other["calls"], &other["content"], &other["finish"]),
            "{id}: the speculating server's answer differs from --no-spec's"
        );
    }
    // BFCL's checker runs: a 135M model matches some of its answers (about a sixth when
    // this was written; a drop to none means the checker or the calls broke).
    let matched = spec_rows.values().filter(|r| r["match"] == true).count();
    assert!(
        matched >= 30,
        "only {matched} of 432 calls match BFCL's answers: {summary}"
    );
}
