//! The API-key gate of the OpenAI routes over real HTTP: keys wanted, the probes and
//! metrics left open, a tenant's key held to its namespace and its own stored responses.

use serde_json::{Value, json};

use super::super::api::KeyGate;
use super::TestServer;

const OPEN_KEY: &str = "sk-open-0123456789abcdef";
const KEY_B: &str = "sk-team-b-0123456789abcdef";
const KEY_C: &str = "sk-team-c-0123456789abcdef";

/// A server whose keys are [`OPEN_KEY`] (unbound), [`KEY_B`] (`team-b`) and [`KEY_C`]
/// (`team-c`), read from a file as `--api-keys` reads it.
fn server_with_keys() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    let text = format!("# keys\n{OPEN_KEY}\n{KEY_B} team-b\n{KEY_C} team-c\n");
    std::fs::write(&file, text).unwrap();
    let gate = KeyGate::open(None, Some(file)).unwrap();
    assert_eq!(gate.keys().map(|k| k.counts()), Some((3, 2)));
    (TestServer::start_with(gate), dir)
}

/// Status and JSON body of a request with `key` and more `headers`.
fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut request = ureq::request(method, &format!("{}{path}", server.base));
    if let Some(key) = key {
        request = request.set("Authorization", &format!("Bearer {key}"));
    }
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let response = match body {
        Some(body) => request
            .set("Content-Type", "application/json")
            .send_string(&body.to_string()),
        None => request.call(),
    };
    let (status, text) = match response {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(status, r)) => (status, r.into_string().unwrap()),
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let json = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
    (status, json)
}

#[test]
fn the_openai_routes_want_a_key_and_the_probes_do_not() {
    let (server, _dir) = server_with_keys();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for (method, path, body) in [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/test-model", None),
        ("POST", "/v1/chat/completions", Some(chat.clone())),
        ("POST", "/v1/completions", Some(json!({"prompt": "hi"}))),
        ("POST", "/v1/responses", Some(json!({"input": "hi"}))),
        (
            "GET",
            "/v1/responses/resp_00000000000000000000000000000000",
            None,
        ),
        (
            "DELETE",
            "/v1/responses/resp_00000000000000000000000000000000",
            None,
        ),
    ] {
        let (status, answer) = send(&server, method, path, body.clone(), None, &[]);
        assert_eq!(status, 401, "{method} {path} without a key: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_api_key", "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Bearer")
        );
        let wrong = &OPEN_KEY[..OPEN_KEY.len() - 1];
        let (status, answer) = send(&server, method, path, body, Some(wrong), &[]);
        assert_eq!(status, 401, "{method} {path} with a wrong key: {answer}");
    }
    assert!(server.asked().is_empty(), "nothing reached the model");
    let (status, models) = send(&server, "GET", "/v1/models", None, Some(OPEN_KEY), &[]);
    assert_eq!(
        (status, &models["data"][0]["id"]),
        (200, &json!("test-model"))
    );
    for path in ["/health", "/ready", "/metrics", "/openapi.json"] {
        assert_eq!(send(&server, "GET", path, None, None, &[]).0, 200, "{path}");
    }
    // The admin API keeps its own token: an API key is not it.
    assert_eq!(
        send(&server, "GET", "/admin/stats", None, Some(OPEN_KEY), &[]).0,
        401
    );
    let (_, metrics) = send(&server, "GET", "/metrics", None, None, &[]);
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("suffixd_api_key_refusals_total 14"),
        "seven routes refused twice each"
    );
}

#[test]
fn wrong_keys_from_one_source_are_capped() {
    let (server, _dir) = server_with_keys();
    let wrong = "sk-guess-0123456789abcdef";
    for _ in 0..20 {
        assert_eq!(
            send(&server, "GET", "/v1/models", None, Some(wrong), &[]).0,
            401
        );
    }
    let (status, answer) = send(&server, "GET", "/v1/models", None, Some(OPEN_KEY), &[]);
    assert_eq!(
        status, 429,
        "past the cap even the right key waits: {answer}"
    );
    assert_eq!(answer["error"]["type"], "rate_limit_error");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(
        send(&server, "GET", "/v1/models", None, Some(OPEN_KEY), &[]).0,
        200
    );
}

#[test]
fn a_bound_key_drafts_and_learns_in_its_namespace_only() {
    let (server, _dir) = server_with_keys();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "user": "alice"});
    let namespace_of_last = || server.asked().last().unwrap().opts.namespace.clone();
    let chat_as = |key: &str, headers: &[(&str, &str)]| {
        send(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(chat.clone()),
            Some(key),
            headers,
        )
    };
    // `user` is the end user, not a namespace, under a bound key.
    assert_eq!(chat_as(KEY_B, &[]).0, 200);
    assert_eq!(namespace_of_last(), "team-b");
    assert_eq!(chat_as(KEY_B, &[("x-suffixd-namespace", "team-b")]).0, 200);
    assert_eq!(namespace_of_last(), "team-b");
    let asked_before = server.asked().len();
    let (status, answer) = chat_as(KEY_B, &[("x-suffixd-namespace", "team-c")]);
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["type"], "permission_error");
    assert_eq!(
        server.asked().len(),
        asked_before,
        "refused before the model"
    );
    // An unbound key names any namespace, as every caller did before keys.
    assert_eq!(
        chat_as(OPEN_KEY, &[("x-suffixd-namespace", "team-c")]).0,
        200
    );
    assert_eq!(namespace_of_last(), "team-c");
    assert_eq!(chat_as(OPEN_KEY, &[]).0, 200);
    assert_eq!(namespace_of_last(), "alice");
}

#[test]
fn a_tenant_s_stored_responses_are_its_own() {
    let (server, _dir) = server_with_keys();
    let (status, made) = send(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "a question"})),
        Some(KEY_B),
        &[],
    );
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    let items = format!("{path}/input_items");
    let get = |key: &str, path: &str| send(&server, "GET", path, None, Some(key), &[]);
    assert_eq!(get(KEY_B, &path).0, 200);
    assert_eq!(get(KEY_B, &items).0, 200);
    assert_eq!(get(OPEN_KEY, &path).0, 200, "an unbound key reads any");
    let (status, answer) = get(KEY_C, &path);
    assert_eq!(status, 404, "another tenant's is not found: {answer}");
    assert_eq!(answer["error"]["code"], "not_found");
    assert_eq!(get(KEY_C, &items).0, 404);
    let continuing = json!({"input": "next", "previous_response_id": id});
    let as_c = send(
        &server,
        "POST",
        "/v1/responses",
        Some(continuing.clone()),
        Some(KEY_C),
        &[],
    );
    assert_eq!(as_c.0, 400, "{}", as_c.1);
    assert_eq!(as_c.1["error"]["code"], "previous_response_not_found");
    let reference = json!({"input": [{"type": "item_reference", "id": made["output"][0]["id"]}]});
    let as_c = send(
        &server,
        "POST",
        "/v1/responses",
        Some(reference),
        Some(KEY_C),
        &[],
    );
    assert_eq!(
        as_c.0, 400,
        "another tenant's item is not resolved: {}",
        as_c.1
    );
    let as_b = send(
        &server,
        "POST",
        "/v1/responses",
        Some(continuing),
        Some(KEY_B),
        &[],
    );
    assert_eq!(as_b.0, 200, "{}", as_b.1);
    assert_eq!(
        send(&server, "DELETE", &path, None, Some(KEY_C), &[]).0,
        404
    );
    assert_eq!(
        get(KEY_B, &path).0,
        200,
        "another tenant's delete took nothing"
    );
    assert_eq!(
        send(&server, "DELETE", &path, None, Some(KEY_B), &[]).0,
        200
    );
    assert_eq!(get(OPEN_KEY, &path).0, 404);
    // A response made under an unbound key is no tenant's.
    let (_, open) = send(
        &server,
        "POST",
        "/v1/responses",
        Some(json!({"input": "q"})),
        Some(OPEN_KEY),
        &[],
    );
    let open_path = format!("/v1/responses/{}", open["id"].as_str().unwrap());
    assert_eq!(get(KEY_B, &open_path).0, 404);
    assert_eq!(get(OPEN_KEY, &open_path).0, 200);
}
