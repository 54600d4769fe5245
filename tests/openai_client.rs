//! The official `openai` Python package (pinned in tools/requirements-tests.txt,
//! installed by tools/setup.sh into `target/py`) against a real `suffixd serve` on
//! loopback: chat, streaming, log-probabilities plain and streamed, completions, and a
//! refused request, tools and structured outputs (tests/openai_client.py); and agent
//! frameworks: LangChain running a tool loop (tests/agent_framework.py), pydantic-ai and
//! the OpenAI Agents SDK with a nested-model tool and a structured output type
//! (tests/pydantic_agents.py).
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, model_present};

/// Run `tests/{script}` with the test venv's Python against a fresh server (started
/// with `server_args`); it prints "all checks passed" last when every check held.
fn run_script_against_a_server(script: &str, server_args: &[&str]) {
    run_script_with(script, &[], server_args);
}

/// [`run_script_against_a_server`], with `script_args` after the server's URL.
fn run_script_with(script: &str, script_args: &[&str], server_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), server_args, false);
    run_script_on(&s, script, script_args);
}

/// Run `tests/{script}` with the test venv's Python against `s`, `script_args` after
/// its URL; it prints "all checks passed" last when every check held.
fn run_script_on(s: &Server, script: &str, script_args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/py/bin/python");
    assert!(
        python.exists(),
        "the Python test packages are missing: run tools/setup.sh (it installs tools/requirements-tests.txt into target/py)"
    );
    let out = Command::new(&python)
        .arg(root.join("tests").join(script))
        .arg("--base-url")
        .arg(s.url("/v1"))
        .args(script_args)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.trim_end().ends_with("all checks passed"),
        "{script} failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        s.log()
    );
}

#[test]
fn the_official_openai_client_works_against_the_server() {
    if !model_present() {
        return;
    }
    run_script_against_a_server("openai_client.py", &[]);
}

/// An agent framework from PyPI (LangChain's ChatOpenAI) runs a two-step tool loop
/// against the server: a forced call, the tool's result, a text answer, and a streamed
/// call (tests/agent_framework.py).
#[test]
fn an_agent_framework_runs_a_tool_loop_against_the_server() {
    if !model_present() {
        return;
    }
    run_script_against_a_server("agent_framework.py", &[]);
}

/// pydantic-ai's Agent and the OpenAI Agents SDK's Runner, each on its default path
/// with a tool whose arguments are a nested Pydantic model (`$defs`) and a structured
/// output type (tests/pydantic_agents.py).
#[test]
fn pydantic_ai_and_the_agents_sdk_run_nested_tools_and_typed_outputs() {
    if !model_present() {
        return;
    }
    run_script_against_a_server("pydantic_agents.py", &[]);
}

/// `tests/fixtures/{fixture}`, a template in this repository, as a `--chat-template`
/// path.
fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    path.to_str().unwrap().to_string()
}

/// LangChain's tool loop and the openai client's tool checks (forced, named, streamed,
/// `auto`, a result turn, Pydantic tools with `$defs`) against a server whose template
/// is `tests/fixtures/{fixture}` (through `--chat-template`): calls are asked for and
/// read in the form it teaches, earlier calls and results go back through it, and the
/// clients see OpenAI's `tool_calls`, whole and streamed.
fn tool_clients_work_against(fixture: &str, more_args: &[&str]) {
    if !model_present() {
        return;
    }
    let template = self::fixture(fixture);
    // The tools the template prints make prompts longer than the tests' 512 tokens.
    let mut args = vec!["--chat-template", &template, "--max-context", "2048"];
    args.extend(more_args);
    for script in ["agent_framework.py", "openai_client.py"] {
        run_script_against_a_server(script, &args);
    }
}

/// Llama 3's form (tests/fixtures/llama3-tools.jinja): bare `{"name": ..,
/// "parameters": ..}` objects. (pydantic-ai's loop is left out: the 135M model, shown
/// results in an `ipython` turn it was not trained on, calls the tool again every round
/// until the context is full; that is the model's choice, not the form's.)
#[test]
fn tool_clients_work_against_a_llama_3_template() {
    tool_clients_work_against("llama3-tools.jinja", &[]);
}

/// Mistral's list (tests/fixtures/mistral-tools.jinja: `[TOOL_CALLS] [{..}, ..]`, and
/// call ids of exactly nine characters, as Mistral 7B v0.3's template demands). The
/// default model's tokenizer has no `[TOOL_CALLS]` control token, so the list opens
/// with its text here; the control-token path is the grammar tests' (src/serve/api/tools).
#[test]
fn tool_clients_work_against_a_mistral_template() {
    tool_clients_work_against("mistral-tools.jinja", &[]);
}

/// Mistral's newer calls (tests/fixtures/mistral-args-tools.jinja: each call
/// `[TOOL_CALLS]name[ARGS]{..}`, after any text; call ids of nine characters, shown
/// back after `[CALL_ID]`, as Mistral Small 3.1's and Devstral's templates show them).
/// The markers are text here; as control tokens they are the grammar tests' (src/serve/api/tools).
#[test]
fn tool_clients_work_against_a_newer_mistral_template() {
    tool_clients_work_against("mistral-args-tools.jinja", &[]);
}

/// Qwen 3's template (tests/fixtures/qwen3.jinja): served without thoughts
/// (`--chat-template-kwargs`, as agent pipelines serve it for speed), the tool and
/// structured-output checks hold; served with them, `chat_template_kwargs` and a tool
/// loop's `reasoning_content` reach the template, and a call asked for comes after any
/// thoughts, never in the content (tests/reasoning_client.py). (The 135M model is not a
/// thinking model: given the choice, it writes its answer as thoughts, so the
/// clients' checks of structured answers run with the thoughts closed.)
#[test]
fn clients_work_against_a_thinking_template() {
    tool_clients_work_against(
        "qwen3.jinja",
        &["--chat-template-kwargs", r#"{"enable_thinking": false}"#],
    );
    if !model_present() {
        return;
    }
    let template = fixture("qwen3.jinja");
    let args = ["--chat-template", &template, "--max-context", "2048"];
    run_script_with("reasoning_client.py", &["--template", "qwen3"], &args);
}

/// A template whose prompt opens the thoughts (DeepSeek-R1's distillations,
/// tests/fixtures/deepseek-r1-distill-qwen.jinja): the answer is thoughts until it
/// closes them, sent as `reasoning_content`, whole and streamed alike; with
/// `--reasoning-format none` they stay in the content.
#[test]
fn thoughts_go_out_apart_from_the_answer() {
    if !model_present() {
        return;
    }
    let template = fixture("deepseek-r1-distill-qwen.jinja");
    run_script_with(
        "reasoning_client.py",
        &["--template", "opened"],
        &["--chat-template", &template],
    );
    run_script_with(
        "reasoning_client.py",
        &["--template", "inline"],
        &["--chat-template", &template, "--reasoning-format", "none"],
    );
}

/// OpenAI's Responses API (`/v1/responses`, the OpenAI Agents SDK's default) through the
/// official client (typed responses, its stream helper's checks of the events, a tool
/// loop, a typed output, refusals) and the Agents SDK on its default path; with a
/// template that opens the thoughts, they come out as a reasoning item, whole and
/// streamed alike (tests/responses_client.py).
#[test]
fn the_responses_api_serves_the_client_and_the_agents_sdk() {
    if !model_present() {
        return;
    }
    run_script_with("responses_client.py", &["--template", "plain"], &[]);
    let template = fixture("deepseek-r1-distill-qwen.jinja");
    run_script_with(
        "responses_client.py",
        &["--template", "opened"],
        &["--chat-template", &template],
    );
}

/// Behind API keys (SUFFIXD_API_KEY and an --api-keys file with two tenants), the
/// official client gets OpenAI's errors (tests/api_keys_client.py); then the file is
/// rewritten and SIGHUP rotates the keys without a restart, a file that does not read
/// leaves them as they were, and a server cannot start on one.
#[test]
fn api_keys_guard_the_openai_routes_and_rotate_on_sighup() {
    if !model_present() {
        return;
    }
    const OPEN: &str = "sk-open-0123456789abcdef";
    const TEAM_B: &str = "sk-team-b-0123456789abcdef";
    const TEAM_C: &str = "sk-team-c-0123456789abcdef";
    const ROTATED: &str = "sk-rotated-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        format!("# tenants\n{TEAM_B} team-b\n{TEAM_C} team-c\n"),
    )
    .unwrap();
    let keys_arg = keys.to_str().unwrap();
    let store = dir.path().join("store");
    let s = Server::start_with_env(
        &store,
        &["--api-keys", keys_arg],
        false,
        &[("SUFFIXD_API_KEY", OPEN)],
    );
    let script_args = ["--open-key", OPEN, "--tenant-key", TEAM_B];
    run_script_on(
        &s,
        "api_keys_client.py",
        &[&script_args[..], &["--other-tenant-key", TEAM_C]].concat(),
    );
    let status_with = |key: &str| {
        let request =
            ureq::get(&s.url("/v1/models")).set("Authorization", &format!("Bearer {key}"));
        common::answer(request.call()).0
    };
    let hang_up = || {
        let pid = s.pid().to_string();
        assert!(
            Command::new("kill")
                .args(["-HUP", &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    let within = |what: &str, done: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed().as_secs() < 20, "{what}: {}", s.log());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    std::fs::write(&keys, format!("{ROTATED} team-b\n")).unwrap();
    hang_up();
    within("the rotated key works after SIGHUP", &|| {
        status_with(ROTATED) == 200
    });
    assert_eq!(status_with(TEAM_B), 401, "the key taken out of the file");
    assert_eq!(status_with(OPEN), 200, "SUFFIXD_API_KEY stays");
    std::fs::write(&keys, "too-short\n").unwrap();
    hang_up();
    within("a broken file is logged", &|| {
        s.log().contains("stay as they were")
    });
    assert_eq!(
        status_with(ROTATED),
        200,
        "a file that does not read changes nothing"
    );
    assert!(s.log().contains("line 1"), "{}", s.log());
    drop(s);
    let out = common::run(&[
        "serve",
        "--snapshot-dir",
        store.to_str().unwrap(),
        "--api-keys",
        keys_arg,
    ]);
    common::assert_clean_failure(&out, "line 1: a key has at least 16 characters");
}
