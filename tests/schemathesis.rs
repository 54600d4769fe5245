//! schemathesis (PyPI, pinned in tools/requirements-tests.txt) fuzzes suffixd's OpenAPI
//! document (src/serve/api/openapi.json, served at `/openapi.json`) against a real
//! `suffixd serve` with the real model: requests generated from the document, valid and
//! not, to every operation, with and without the admin token. Every answer must be no
//! 5xx, carry a status and content type the document names, and match the document's
//! schema: so every error is OpenAI's error object.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, TOKEN, model_present};

/// The checks that hold for this API. Left out: `positive_data_acceptance` (a request
/// the document allows may still be refused for what the document cannot say: a prompt
/// longer than the context, `max_tokens` over the server's limit, a tool schema the
/// grammar engine refuses), and the checks for APIs that create resources
/// (`use_after_free`, `ensure_resource_availability`, `object_level_authorization`).
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_headers_conformance,response_schema_conformance,negative_data_rejection,\
missing_required_header,unsupported_method,ignored_auth";

fn fuzz(server: &Server, extra: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schemathesis = root.join("target/py/bin/schemathesis");
    assert!(
        schemathesis.exists(),
        "schemathesis is missing: run tools/setup.sh"
    );
    // Its caches go to the working directory: a scratch one, not the checkout.
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(&schemathesis)
        .current_dir(scratch.path())
        .arg("run")
        .arg(root.join("src/serve/api/openapi.json"))
        .args(["--url", &server.url(""), "--checks", CHECKS])
        .args(["--max-examples", "25", "--seed", "20261128"])
        // One worker: hypothesis 6.170 races describing its strategies from two threads.
        .args(["--generation-database", "none", "--workers", "1"])
        .args(["--request-timeout", "120", "--no-color"])
        .args(extra)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log()
    );
}

#[test]
fn schemathesis_finds_no_failure_in_the_openapi_document() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Short answers: the checks are about the answers' form, and since bias and
    // penalties are accepted the fuzzer's requests that set them generate too.
    let short = ["--max-tokens-limit", "64", "--default-max-tokens", "32"];
    let server = Server::start_with(dir.path(), &short, false);
    // As a stranger: the admin API must refuse, in the documented shape.
    fuzz(&server, &[]);
    // As the operator.
    let auth = format!("Authorization: Bearer {TOKEN}");
    fuzz(&server, &["--header", &auth]);
}
