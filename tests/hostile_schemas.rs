//! Hostile JSON schemas against a real `suffixd serve`: generated schemas that nest
//! deep (chains of `$ref`s through every keyword that holds a subschema, inline
//! nesting, cycles), run wide (thousands of properties), or both, sent as a response
//! format (chat and completions) and as tool parameters with forced and optional calls.
//! Every answer must be 200 or a 4xx in OpenAI's error shape, and the process must stay
//! up. (Tool schemas are also described in the prompt, so with the test server's short
//! context most tool requests that pass the schema limits end as a context-length 400;
//! the limits are checked before that.) Before schemas were bounded, one chain of 225 to 800 references aborted it
//! (`thread 'tokio-rt-worker' has overflowed its stack`).
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use common::{Server, model_present};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};

/// How one link of a chain holds the next (`r` is the reference to it).
const LINKS: usize = 13;

fn link(kind: usize, r: &str) -> Value {
    let to = json!({"$ref": r});
    match kind % LINKS {
        0 => to,
        1 => json!({"anyOf": [to, {"type": "null"}]}),
        2 => json!({"allOf": [to]}),
        3 => json!({"oneOf": [to, {"type": "integer"}]}),
        4 => json!({"type": "array", "items": to}),
        5 => json!({"type": "array", "prefixItems": [to], "items": false}),
        6 => json!({"type": "object", "properties": {"a": to}, "required": ["a"]}),
        7 => json!({"type": "object", "additionalProperties": to}),
        8 => json!({"type": "object", "patternProperties": {"^x": to}}),
        9 => json!({"if": {"type": "object"}, "then": to, "else": to}),
        10 => json!({"type": "array", "items": {"anyOf": [to, {"allOf": [to]}]}}),
        11 => json!({"type": "object", "properties": {"a": {"type": "array", "items": to}}}),
        _ => json!({"anyOf": [{"allOf": [to]}, {"type": "boolean"}]}),
    }
}

/// Wrap `inner` in one level of inline nesting of kind `kind`.
fn nest(kind: usize, inner: Value) -> Value {
    match kind % 5 {
        0 => json!({"anyOf": [inner, {"type": "string"}]}),
        1 => json!({"allOf": [inner]}),
        2 => json!({"type": "array", "items": inner}),
        3 => json!({"type": "object", "properties": {"n": inner}, "required": ["n"]}),
        _ => json!({"oneOf": [inner]}),
    }
}

/// What to generate: a chain of references, inline nesting around its root, a wide
/// object at its end, and whether the chain's end refers back to its start.
#[derive(Debug, Clone)]
struct Shape {
    links: Vec<usize>,
    nesting: Vec<usize>,
    width: usize,
    all_required: bool,
    cycle: bool,
    anchors: bool,
}

fn shapes() -> impl Strategy<Value = Shape> {
    (
        prop_oneof![
            3 => prop::collection::vec(0..LINKS, 0..40),
            2 => prop::collection::vec(0..LINKS, 200..1200),
        ],
        prop_oneof![
            4 => prop::collection::vec(0usize..5, 0..12),
            1 => prop::collection::vec(0usize..5, 12..70),
        ],
        prop_oneof![4 => 0usize..20, 1 => 1500usize..6000],
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(links, nesting, width, all_required, cycle, anchors)| Shape {
                links,
                nesting,
                width,
                all_required,
                cycle,
                anchors,
            },
        )
}

fn schema(shape: &Shape) -> Value {
    let n = shape.links.len();
    // References by pointer, or by anchor (which the server cannot resolve by reading
    // pointers and must bound anyway).
    let name = |i: usize| {
        if shape.anchors {
            format!("#a{i}")
        } else {
            format!("#/$defs/d{i}")
        }
    };
    let mut defs = Map::new();
    for (i, &kind) in shape.links.iter().enumerate() {
        let mut d = link(kind, &name(i + 1));
        if shape.anchors {
            d["$anchor"] = json!(format!("a{i}"));
        }
        defs.insert(format!("d{i}"), d);
    }
    let names: Vec<String> = (0..shape.width).map(|i| format!("p{i}")).collect();
    let properties: Map<String, Value> = names
        .iter()
        .map(|p| (p.clone(), json!({"type": "integer"})))
        .collect();
    let mut end = json!({"type": "object", "properties": properties});
    if shape.all_required {
        end["required"] = json!(names);
    }
    if shape.cycle {
        end["properties"]["back"] = json!({"$ref": name(0)});
    }
    if shape.anchors {
        end["$anchor"] = json!(format!("a{n}"));
    }
    defs.insert(format!("d{n}"), end);
    let mut root = json!({"$ref": name(0)});
    for &kind in &shape.nesting {
        root = nest(kind, root);
    }
    json!({"$defs": defs, "allOf": [root]})
}

/// The request that carries `schema`, in one of the ways a client can send one.
fn request(schema: Value, way: usize) -> (&'static str, Value) {
    let messages = json!([{"role": "user", "content": "Answer."}]);
    let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": schema}}]);
    match way % 5 {
        0 => (
            "/v1/chat/completions",
            json!({"messages": messages, "response_format": format, "max_tokens": 3}),
        ),
        1 => (
            "/v1/completions",
            json!({"prompt": "{", "response_format": format, "max_tokens": 3}),
        ),
        2 => (
            "/v1/chat/completions",
            json!({"messages": messages, "tools": tool, "tool_choice": "required", "max_tokens": 3}),
        ),
        3 => (
            "/v1/chat/completions",
            json!({"messages": messages, "tools": tool, "max_tokens": 3,
                   "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        ),
        _ => (
            "/v1/chat/completions",
            json!({"messages": messages, "tools": tool, "tool_choice": "auto",
                   "response_format": format, "max_tokens": 3}),
        ),
    }
}

/// Generated schemas, 1,500 of them: each gets 200 or a 4xx with an error message, and
/// the server is alive after every one.
#[test]
fn generated_deep_and_wide_schemas_never_stop_the_server() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = std::cell::RefCell::new(Server::start(dir.path()));
    let cases: u32 = std::env::var("SUFFIXD_HOSTILE_SCHEMA_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let seen = std::cell::Cell::new([0usize; 2]);
    let reasons = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let result = runner.run(&(shapes(), 0usize..5), |(shape, way)| {
        let (path, body) = request(schema(&shape), way);
        let mut server = server.borrow_mut();
        let (status, answer) = server.post(path, &body.to_string(), false);
        if let Some(exit) = server.child.try_wait().unwrap() {
            return Err(TestCaseError::fail(format!(
                "the server exited ({exit}) on {shape:?} sent as way {way}: {}",
                server.log()
            )));
        }
        prop_assert!(
            status == 200 || (400..500).contains(&status),
            "{status} for {shape:?} way {way}: {answer}"
        );
        if status != 200 {
            prop_assert!(
                answer["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{answer}"
            );
        }
        if status != 200 {
            let why: String = answer["error"]["message"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(70)
                .collect();
            *reasons.borrow_mut().entry(why).or_insert(0usize) += 1;
        }
        let mut counts = seen.get();
        counts[usize::from(status == 200)] += 1;
        seen.set(counts);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (seen, mut server) = (seen.get(), server.into_inner());
    eprintln!("{} answered, {} refused:", seen[1], seen[0]);
    for (why, n) in reasons.into_inner() {
        eprintln!("  {n:5}  {why}");
    }
    // The generator reaches both sides of the limits.
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    assert!(server.child.try_wait().unwrap().is_none());
    server.terminate(std::time::Duration::from_secs(60));
}

/// The attack's heaviest literal, a 200 KB `const`, in each way a schema arrives
/// (response formats, tool parameters, chat and completions): a 400 naming the bound on
/// literals, before any compile. Each token of such an answer made the grammar engine
/// walk the whole literal again, holding up every sequence in the batch (docs/structured.md).
#[test]
fn a_literal_past_the_bound_is_refused_naming_it() {
    if !model_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let schema = serde_json::json!({"type": "object", "properties": {"v": {"const": "x".repeat(200_000)}}, "required": ["v"]});
    for way in 0..5 {
        let (path, body) = request(schema.clone(), way);
        let (status, answer) = server.post(path, &body.to_string(), false);
        assert_eq!(status, 400, "way {way}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("`const` and `enum`"),
            "way {way}: {answer}"
        );
    }
}
