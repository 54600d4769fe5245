//! Structured outputs and tool calls through a real `suffixd serve`: greedy constrained
//! answers are the same with speculation (grammar-forced drafts and all), without it,
//! and without the forced drafts, for requests run one by one or batched; every answer
//! follows its schema; malformed tools and schemas are 400s that name the problem.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use common::{Server, model_present};
use serde_json::{Value, json};

/// Six schemas, four prompts each: 24 constrained requests. The last forces text
/// whose characters span several tokens' bytes (a grammar once failed on them).
fn requests() -> Vec<(Value, Value)> {
    let schemas = [
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 2, "maxItems": 3}},
            "required": ["items"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no", "unsure"]}, "confidence": {"type": "number"}},
            "required": ["answer", "confidence"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20},
            "coastal": {"type": "boolean"}}, "required": ["city", "country", "coastal"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"steps": {"type": "array", "maxItems": 3, "items": {"type": "object",
            "properties": {"n": {"type": "integer"}, "do": {"type": "string", "maxLength": 20}}, "required": ["n", "do"], "additionalProperties": false}}},
            "required": ["steps"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"city": {"enum": ["Zürich", "Kraków", "東京", "naïve ï\u{8b}"]},
            "greeting": {"const": "¡Hola, señor! 🦀"}}, "required": ["city", "greeting"], "additionalProperties": false}),
    ];
    let prompts = [
        "Answer in JSON about a famous scientist.",
        "Reply with JSON for a shopping trip.",
        "Give JSON describing the weather today.",
        "Return JSON about how to bake bread.",
    ];
    let mut out = Vec::new();
    for schema in &schemas {
        for p in prompts {
            out.push((json!(p), schema.clone()));
        }
    }
    out
}

fn body(prompt: &Value, schema: &Value) -> String {
    json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 128,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": true, "schema": schema}}})
    .to_string()
}

/// The answers to every request, sent all at once (the server batches them) or one by
/// one.
fn answers(s: &Server, batched: bool) -> Vec<(String, Value)> {
    let reqs = requests();
    let ask = |(prompt, schema): &(Value, Value)| {
        let (st, v) = s.post("/v1/chat/completions", &body(prompt, schema), false);
        assert_eq!(st, 200, "{v}");
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        (text, v["suffixd"].clone())
    };
    if !batched {
        return reqs.iter().map(ask).collect();
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = reqs.iter().map(|r| scope.spawn(move || ask(r))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn constrained_greedy_answers_are_the_same_with_and_without_speculation() {
    if !model_present() {
        return;
    }
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let plain = Server::start_with(dirs[0].path(), &["--no-spec"], false);
    let spec = Server::start(dirs[1].path());
    let cut_only = Server::start_with(dirs[2].path(), &["--no-grammar-drafts"], false);
    let truth = answers(&plain, false);
    for (i, ((text, stats), (_, schema))) in truth.iter().zip(requests()).enumerate() {
        assert_eq!(stats["drafted_tokens"], 0);
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{i}: {e}: {text}"));
        let props = schema["properties"].as_object().unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, props.keys().collect::<Vec<_>>(), "{i}: {text}");
    }
    // Batched, then again one by one (now drafting from the answers it learned), on the
    // speculating servers.
    for (name, server) in [("spec", &spec), ("cut only", &cut_only)] {
        for batched in [true, false] {
            let got = answers(server, batched);
            for (i, ((want, _), (have, stats))) in truth.iter().zip(&got).enumerate() {
                assert_eq!(
                    have, want,
                    "{name}, batched {batched}, request {i}: {stats}"
                );
            }
            let drafted: u64 = got
                .iter()
                .map(|(_, s)| s["drafted_tokens"].as_u64().unwrap())
                .sum();
            assert!(drafted > 0, "{name} drafted");
        }
    }
}

#[test]
fn malformed_tools_and_schemas_are_refused_with_the_problem_named() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path());
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let tool = |f: Value| json!({"type": "function", "function": f});
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "colour"}}}}),
            "colour",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "json_schema.schema",
        ),
        (json!({"response_format": {"type": "yaml"}}), "yaml"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}}),
            "nowhere",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}}}),
            "cannot be used",
        ),
        // Compiles, then runs out of the lexer's fuel at the first token: refused too.
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a{1000000}$"}}}}),
            "simplify the schema",
        ),
        (
            json!({"tools": [tool(json!({"name": "bad name!"}))]}),
            "bad name!",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "function"),
        (
            json!({"tools": [tool(json!({"name": "f", "parameters": [1]}))]}),
            "parameters",
        ),
        (
            json!({"tools": [tool(json!({"name": "f", "parameters": {"type": "wat"}}))], "tool_choice": "required"}),
            "wat",
        ),
        (
            json!({"tools": [tool(json!({"name": "f"}))], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "\"g\"",
        ),
        (json!({"tool_choice": "required"}), "no `tools`"),
        (
            json!({"tools": [tool(json!({"name": "f"}))], "tool_choice": "sometimes"}),
            "sometimes",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}),
            "only assistant",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}]}),
            "not JSON",
        ),
    ];
    for (extra, needle) in cases {
        let mut b = json!({"messages": msgs, "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (st, v) = s.post("/v1/chat/completions", &b.to_string(), false);
        assert_eq!(st, 400, "{b}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{b}: {message}");
    }
    let (st, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "hi", "tools": [tool(json!({"name": "f"}))]}).to_string(),
        false,
    );
    assert_eq!(st, 400, "{v}");
    // The server is still serving.
    let (st, v) = s.post(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 2}).to_string(),
        false,
    );
    assert_eq!(st, 200, "{v}");
}
