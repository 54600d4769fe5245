//! Tool calling and structured outputs at the serving edge: a request's `tools`,
//! `tool_choice`, `parallel_tool_calls` and `response_format` become the prompt's tool
//! list and the grammar its answer is held to; the answer's text becomes tool calls.
//!
//! Calls are written in the `<tool_call>` form of the Hermes and Qwen templates:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! A template that renders tools itself gets the `tools` list and the earlier calls; for
//! one that does not (the default model's), the tools are described in the system
//! message and earlier calls are written into the assistant's turns in that form. With
//! `tool_choice` `required` or a named function, decoding is held to a grammar of calls
//! whose arguments follow each tool's `parameters` schema, so even a small model emits
//! a valid call; with `auto` the model chooses, and a call it opens is held to the
//! tools' schemas (a lazy grammar); the answer is read for calls.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::chat::ChatMessage;
use crate::engine::Delimiters;
use crate::engine::grammar::{GrammarSpec, with_json_layout};

use super::ApiError;
use super::wire::{FunctionCall, FunctionDelta, ToolCallDelta, ToolCallOut};

/// Where a call starts and ends in the answer.
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// A tool the model may call: OpenAI's `{"type": "function", "function": {..}}`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct Tool {
    #[serde(rename = "type")]
    kind: String,
    function: Function,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct Function {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    /// Arguments always follow `parameters` when a call is constrained; accepted for
    /// clients that send it.
    #[serde(default)]
    #[allow(dead_code)]
    strict: Option<bool>,
}

/// Which calls the answer may or must make.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ToolChoice {
    /// No calls; the tools are not shown to the model.
    None,
    /// The model decides.
    Auto,
    /// At least one call, of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

/// A request's tools and what it asks of them.
#[derive(Debug, Clone)]
pub(super) struct ToolPlan {
    tools: Vec<Tool>,
    choice: ToolChoice,
    parallel: bool,
}

/// Longest tool name, as OpenAI allows.
const MAX_TOOL_NAME: usize = 64;

impl Tool {
    /// Its arguments schema (any object when it gives none).
    fn parameters(&self) -> Value {
        self.function
            .parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object"}))
    }
}

impl ToolPlan {
    /// Read and check a request's tool fields; None when it offers no tools.
    pub(super) fn from_request(
        tools: Option<Vec<Tool>>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Self>, ApiError> {
        let tools = tools.unwrap_or_default();
        let choice = match choice {
            None | Some(Value::Null) => {
                if tools.is_empty() {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                }
            }
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "`tool_choice` {other:?} is not one of \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}"
                    )));
                }
            },
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ..}}",
                        )
                    })?;
                ToolChoice::Named(name.to_string())
            }
        };
        for (i, tool) in tools.iter().enumerate() {
            let f = &tool.function;
            if tool.kind != "function" {
                return Err(ApiError::bad_request(format!(
                    "tools[{i}]: type {:?} is not supported; tools are functions",
                    tool.kind
                )));
            }
            let name_ok = !f.name.is_empty()
                && f.name.len() <= MAX_TOOL_NAME
                && f.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !name_ok {
                return Err(ApiError::bad_request(format!(
                    "tools[{i}]: a function name is 1 to {MAX_TOOL_NAME} letters, digits, _ or -, not {:?}",
                    f.name
                )));
            }
            if tools[..i].iter().any(|t| t.function.name == f.name) {
                return Err(ApiError::bad_request(format!(
                    "tools[{i}]: the function name {:?} is used twice",
                    f.name
                )));
            }
            if let Some(p) = &f.parameters
                && !p.is_object()
            {
                return Err(ApiError::bad_request(format!(
                    "tools[{i}] ({}): `parameters` must be a JSON schema object",
                    f.name
                )));
            }
        }
        match &choice {
            ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => {
                return Err(ApiError::bad_request(
                    "`tool_choice` asks for a call, but the request has no `tools`",
                ));
            }
            ToolChoice::Named(name) if !tools.iter().any(|t| t.function.name == *name) => {
                return Err(ApiError::bad_request(format!(
                    "`tool_choice` names {name:?}, which is not among the `tools`"
                )));
            }
            _ => {}
        }
        if tools.is_empty() {
            return Ok(None);
        }
        Ok(Some(ToolPlan {
            tools,
            choice,
            parallel: parallel.unwrap_or(true),
        }))
    }

    /// True when the model decides whether to call (`auto`).
    pub(super) fn lets_the_model_choose(&self) -> bool {
        self.choice == ToolChoice::Auto
    }

    /// True when the model sees the tools and may call them.
    pub(super) fn offers_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The tools in OpenAI's form, for a template that renders them.
    pub(super) fn tools_json(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.function.name,
                        "description": t.function.description,
                        "parameters": t.parameters(),
                    }})
                })
                .collect(),
        )
    }

    /// The tools described for the system message, when the template cannot render
    /// them.
    pub(super) fn system_text(&self) -> String {
        let mut text = format!(
            "You can call the following tools. To call one, answer with a {CALL_OPEN} block holding a JSON object with the tool's name and its arguments, and nothing else:\n{CALL_OPEN}\n{{\"name\": \"<tool name>\", \"arguments\": {{<arguments>}}}}\n{CALL_CLOSE}\nWhen a tool's result arrives, use it to answer.\n\nTools:"
        );
        for t in &self.tools {
            let line = json!({
                "name": t.function.name,
                "description": t.function.description,
                "parameters": t.parameters(),
            });
            text.push('\n');
            text.push_str(&line.to_string());
        }
        text
    }

    /// The JSON schema of a call of any tool the answer may call, as the grammar embeds
    /// it (for checking it against the compiler's limits first).
    pub(super) fn any_call_schema(&self) -> Value {
        call_schema(&self.tools.iter().collect::<Vec<_>>())
    }

    /// The grammar the answer is held to: the calls when they are required; either the
    /// response format or calls when both are possible; with `auto` alone, free text
    /// until the model opens a call, and from there calls only (a lazy grammar: text
    /// never holds a call's opening, so a call that starts is a valid call).
    pub(super) fn grammar(&self, response_format: Option<&GrammarSpec>) -> Option<GrammarSpec> {
        let candidates: Vec<&Tool> = match &self.choice {
            ToolChoice::None => return response_format.cloned(),
            ToolChoice::Named(name) => self
                .tools
                .iter()
                .filter(|t| t.function.name == *name)
                .collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        };
        let call_schema = with_json_layout(call_schema(&candidates));
        let calls = if self.parallel && !matches!(self.choice, ToolChoice::Named(_)) {
            "call (\"\\n\" call)*"
        } else {
            "call"
        };
        let mut lark = format!(
            "calls: {calls}\ncall: {open:?} %json {call_schema} {close:?}\n",
            open = format!("{CALL_OPEN}\n"),
            close = format!("\n{CALL_CLOSE}"),
        );
        match (self.choice == ToolChoice::Auto, response_format) {
            (true, None) => {
                // Two ways through: text without the opening, or text up to the first
                // opening (a lazy lexeme, which ends there) and then calls.
                let more = if self.parallel {
                    " (\"\\n\" call)*"
                } else {
                    ""
                };
                lark.push_str(&format!(
                    "start: PROSE | prose_then_call{more}\n\
                     PROSE: /(?s:.*)/ & ~/(?s:.*{open}.*)/\n\
                     prose_then_call: prose_to_opening call_rest\n\
                     prose_to_opening[suffix={open_literal:?}]: /(?s:.*)/\n\
                     call_rest: \"\\n\" %json {call_schema} {close:?}\n",
                    open = regex_literal(CALL_OPEN),
                    open_literal = CALL_OPEN,
                    close = format!("\n{CALL_CLOSE}"),
                ));
            }
            (true, Some(format)) => {
                let schema = match format {
                    GrammarSpec::JsonObject => json!({"type": "object"}),
                    GrammarSpec::JsonSchema(s) => s.clone(),
                    // Never built from a request.
                    GrammarSpec::Lark(_) => return Some(format.clone()),
                };
                lark.push_str(&format!(
                    "start: answer | calls\nanswer: %json {}\n",
                    with_json_layout(schema)
                ));
            }
            _ => lark.push_str("start: calls\n"),
        }
        Some(GrammarSpec::Lark(lark))
    }
}

/// `text` as a regular expression matching it literally (inside a lark `/../`).
fn regex_literal(text: &str) -> String {
    text.chars()
        // Only the syntax's own characters: `\<` and `\>` are word boundaries there.
        .map(|c| match c {
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$'
            | '#' | '&' | '-' | '~' | '/' => format!("\\{c}"),
            c => c.to_string(),
        })
        .collect()
}

/// The schema of one call of any of `tools`: `{"name": .., "arguments": ..}` with the
/// tool's `parameters` as the arguments, one tool or `anyOf` several. Each tool's
/// references into its own schema (`#/$defs/..`, `#`) are rewritten to where its
/// schema now sits, so Pydantic's `$defs` keep resolving.
fn call_schema(tools: &[&Tool]) -> Value {
    let one = |t: &Tool, at: &str| {
        let mut arguments = t.parameters();
        rebase_references(&mut arguments, &format!("{at}/properties/arguments"));
        close_objects(&mut arguments);
        json!({
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": arguments,
            },
            "required": ["name", "arguments"],
            "additionalProperties": false,
        })
    };
    match tools {
        [t] => one(t, ""),
        _ => json!({
            "anyOf": tools
                .iter()
                .enumerate()
                .map(|(i, t)| one(t, &format!("/anyOf/{i}")))
                .collect::<Vec<_>>()
        }),
    }
}

/// Call `f` on every schema object within `schema` (itself included), with whether it
/// is a branch of an `allOf`. Values under `const`, `enum`, `default` and `examples`
/// are data, not schemas, and are skipped; so are the names of `properties` and the
/// like (a property named `$ref` is not a reference). Iterative: a schema's depth is
/// the client's choice.
fn for_each_schema(
    schema: &mut Value,
    mut f: impl FnMut(&mut serde_json::Map<String, Value>, bool),
) {
    /// What a value on the stack is.
    #[derive(Clone, Copy)]
    enum Held {
        /// A schema (or a list of them); true: a branch of `allOf`.
        Schema(bool),
        /// A map of names to schemas, such as `properties`.
        NamedSchemas,
    }
    let mut stack = vec![(schema, Held::Schema(false))];
    while let Some((v, held)) = stack.pop() {
        match (v, held) {
            (Value::Object(map), Held::NamedSchemas) => {
                stack.extend(map.values_mut().map(|c| (c, Held::Schema(false))));
            }
            (Value::Object(map), Held::Schema(in_all_of)) => {
                f(map, in_all_of);
                for (key, child) in map.iter_mut() {
                    let held = match key.as_str() {
                        "const" | "enum" | "default" | "examples" => continue,
                        "properties" | "patternProperties" | "$defs" | "definitions"
                        | "dependentSchemas" => Held::NamedSchemas,
                        "allOf" => Held::Schema(true),
                        _ => Held::Schema(false),
                    };
                    stack.push((child, held));
                }
            }
            (Value::Array(items), Held::Schema(in_all_of)) => {
                stack.extend(items.iter_mut().map(|c| (c, Held::Schema(in_all_of))));
            }
            _ => {}
        }
    }
}

/// Prefix every local JSON-pointer reference in `schema` (`#`, `#/..`) with `at`, the
/// pointer to where `schema` is placed in a larger document. Anchors (`#name`) and other
/// documents' URIs are left alone.
fn rebase_references(schema: &mut Value, at: &str) {
    for_each_schema(schema, |map, _| {
        if let Some(Value::String(r)) = map.get_mut("$ref")
            && let Some(pointer) = r.strip_prefix('#')
            && (pointer.is_empty() || pointer.starts_with('/'))
        {
            *r = format!("#{at}{pointer}");
        }
    });
}

/// Close the objects of a tool's arguments: an object schema that lists `properties`
/// and says nothing of other keys (`additionalProperties`, `patternProperties`,
/// `unevaluatedProperties`) allows no others, as OpenAI's strict function calling
/// does; otherwise a small model invents keys until `max_tokens`. Branches of `allOf`
/// are left open, since their properties add up.
fn close_objects(schema: &mut Value) {
    for_each_schema(schema, |map, in_all_of| {
        let says_nothing = [
            "additionalProperties",
            "patternProperties",
            "unevaluatedProperties",
        ]
        .iter()
        .all(|k| !map.contains_key(*k));
        if !in_all_of && map.contains_key("properties") && says_nothing {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
}

/// `response_format`: text (None), any JSON object, or JSON under a schema.
pub(super) fn response_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_request(
            "`response_format` needs a `type`: \"text\", \"json_object\" or \"json_schema\"",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let schema = v
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "`response_format` of type json_schema needs `json_schema.schema`",
                    )
                })?;
            if !schema.is_object() {
                return Err(ApiError::bad_request(
                    "`response_format.json_schema.schema` must be a JSON schema object",
                ));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        other => Err(ApiError::bad_request(format!(
            "`response_format` type {other:?} is not supported: \"text\", \"json_object\" or \"json_schema\""
        ))),
    }
}

/// A call the answer made.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The call in OpenAI's form, with a fresh id (and its `index` in a stream).
    pub(super) fn to_wire(&self, index: Option<usize>) -> ToolCallOut {
        ToolCallOut {
            index,
            id: new_call_id(),
            kind: "function",
            function: FunctionCall {
                name: self.name.clone(),
                arguments: self.arguments.clone(),
            },
        }
    }
}

/// The text an earlier call is written as in an assistant turn.
pub(super) fn call_text(name: &str, arguments: &Value) -> String {
    format!(
        "{CALL_OPEN}\n{}\n{CALL_CLOSE}",
        json!({"name": name, "arguments": arguments})
    )
}

/// The delimiters of a call in the answer, for ending an answer that repeats a call.
pub(super) fn call_delimiters() -> Delimiters {
    Delimiters {
        open: CALL_OPEN.into(),
        close: CALL_CLOSE.into(),
    }
}

/// An answer that may hold calls, read: its content is the text outside the call
/// blocks (None when there is none), its calls the blocks that hold a well-formed
/// `{"name": .., "arguments": {..}}`. A block that does not (a call cut off by
/// `max_tokens`, or a model's broken one) is dropped: call markup never reaches the
/// content. Without any block, or when the answer could make no calls (`reads_calls`
/// false), the content is the whole text.
pub(super) fn read_answer(text: &str, reads_calls: bool) -> (Option<String>, Vec<ToolCall>) {
    if !reads_calls || !text.contains(CALL_OPEN) {
        return (Some(text.to_string()), Vec::new());
    }
    let mut calls = Vec::new();
    let mut pieces: Vec<&str> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(CALL_OPEN) {
        pieces.push(&rest[..at]);
        let body_start = &rest[at + CALL_OPEN.len()..];
        let (body, after) = match body_start.find(CALL_CLOSE) {
            Some(end) => (&body_start[..end], &body_start[end + CALL_CLOSE.len()..]),
            None => (body_start, ""),
        };
        match read_call(body) {
            Some(call) => calls.push(call),
            None => tracing::debug!("an answer's call block is not a call: {body:?}"),
        }
        rest = after;
    }
    pieces.push(rest);
    // The first piece keeps its start (a stream has sent it as it came); the rest are
    // trimmed where they met a call block.
    let mut content = String::new();
    for (i, piece) in pieces.iter().enumerate() {
        let piece = if i == 0 {
            piece.trim_end()
        } else {
            piece.trim()
        };
        if !piece.is_empty() {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(piece);
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

/// One call's `{"name": .., "arguments": {..}}`.
fn read_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        // The model's own text when it is the grammar's layout (as a stream sends it).
        Some(a @ Value::Object(_)) => match call_head(body) {
            Some((_, at))
                if serde_json::from_str::<Value>(closed_arguments(&body[at..]))
                    .ok()
                    .as_ref()
                    == Some(a) =>
            {
                closed_arguments(&body[at..]).to_string()
            }
            _ => a.to_string(),
        },
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok_and(|a| a.is_object()) => {
            s.clone()
        }
        _ => return None,
    };
    Some(ToolCall { name, arguments })
}

/// How much of a streamed answer may go out as content now: text before a call, less
/// a tail that may be the start of one, and less trailing whitespace (which
/// [`read_answer`] drops before a call).
pub(super) fn streamable_len(text: &str) -> usize {
    if let Some(at) = text.find(CALL_OPEN) {
        return text[..at].trim_end().len();
    }
    let mut keep = text.len();
    for n in (1..CALL_OPEN.len()).rev() {
        if text.len() >= n
            && text.is_char_boundary(text.len() - n)
            && text.ends_with(&CALL_OPEN[..n])
        {
            keep = text.len() - n;
            break;
        }
    }
    text[..keep].trim_end().len()
}

/// A call block's head in the layout the call grammar writes, `{"name": "NAME",
/// "arguments": `: the name and where the arguments start in `body`. None for any other
/// layout (a model writing calls freely), whose calls are sent whole.
fn call_head(body: &str) -> Option<(&str, usize)> {
    let lead = body.len() - body.trim_start().len();
    let rest = body[lead..].strip_prefix("{\"name\": \"")?;
    let name_len = rest.find('"')?;
    let name = &rest[..name_len];
    let after = rest[name_len..].strip_prefix("\", \"arguments\": ")?;
    Some((name, body.len() - after.len()))
}

/// The arguments' text in a closed block's `args` (what follows the head): up to the
/// object's closing brace.
fn closed_arguments(args: &str) -> &str {
    let args = args.trim_end();
    args.strip_suffix('}').unwrap_or(args).trim_end()
}

/// How much of an open block's `args` is surely arguments: less a tail that may be the
/// object's closing brace, whitespace and the start of the closing tag.
fn open_arguments_len(args: &str) -> usize {
    let mut end = args.len();
    for n in (1..CALL_CLOSE.len()).rev() {
        if args.ends_with(&CALL_CLOSE[..n]) {
            end -= n;
            break;
        }
    }
    let kept = args[..end].trim_end();
    kept.strip_suffix('}').unwrap_or(kept).trim_end().len()
}

/// Tool calls streamed as OpenAI streams them: a call's name (with its id) once its
/// head is written, then its arguments in fragments as they are decoded. Only calls in
/// the call grammar's layout stream, and a call whose text so far could still repeat
/// an earlier one waits (the engine drops a repeat, see `call_delimiters`).
#[derive(Default)]
pub(super) struct CallStreamer {
    /// Per call started: its id and the bytes of its arguments sent.
    started: Vec<(String, usize)>,
}

impl CallStreamer {
    /// The tool-call deltas that `text` (the answer so far) adds to what was sent.
    pub(super) fn advance(&mut self, text: &str) -> Vec<ToolCallDelta> {
        let mut deltas = Vec::new();
        let mut earlier: Vec<&str> = Vec::new();
        let mut from = 0;
        let mut index = 0;
        while let Some(open) = text[from..].find(CALL_OPEN).map(|i| from + i) {
            let body_start = open + CALL_OPEN.len();
            let close = text[body_start..].find(CALL_CLOSE).map(|i| body_start + i);
            let block = &text[open..close.map_or(text.len(), |c| c + CALL_CLOSE.len())];
            if close.is_none() && earlier.iter().any(|b| b.starts_with(block)) {
                break;
            }
            let body = &text[body_start..close.unwrap_or(text.len())];
            let Some((name, args_at)) = call_head(body) else {
                break;
            };
            let args = &body[args_at..];
            if index == self.started.len() {
                let id = new_call_id();
                deltas.push(ToolCallDelta {
                    index,
                    id: Some(id.clone()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name.to_string()),
                        arguments: String::new(),
                    },
                });
                self.started.push((id, 0));
            }
            let ready = match close {
                Some(_) => closed_arguments(args).len(),
                None => open_arguments_len(args),
            };
            let sent = &mut self.started[index].1;
            if ready > *sent && args.is_char_boundary(*sent) && args.is_char_boundary(ready) {
                deltas.push(ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: args[*sent..ready].to_string(),
                    },
                });
                *sent = ready;
            }
            let Some(close) = close else { break };
            earlier.push(block);
            index += 1;
            from = close + CALL_CLOSE.len();
        }
        deltas
    }

    /// How many calls have started streaming.
    pub(super) fn started(&self) -> usize {
        self.started.len()
    }
}

/// A fresh call id, in OpenAI's form.
fn new_call_id() -> String {
    format!(
        "call_{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

/// A request's assistant message with `tool_calls` in OpenAI's form, for the template:
/// Hugging Face's form when it renders calls (arguments as objects), else the calls
/// written into the content.
pub(super) fn assistant_with_calls(
    mut message: ChatMessage,
    calls: &[Value],
    native: bool,
) -> Result<ChatMessage, ApiError> {
    let mut hf_calls = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let f = call.get("function");
        let name = f
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "an assistant message's tool_calls[{i}] needs `function.name`"
                ))
            })?;
        let arguments = match f.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                ApiError::bad_request(format!(
                    "an assistant message's tool_calls[{i}].function.arguments is not JSON: {e}"
                ))
            })?,
            Some(v @ Value::Object(_)) => v.clone(),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "an assistant message's tool_calls[{i}] needs `function.arguments`, a JSON object as a string"
                )));
            }
        };
        if native {
            hf_calls.push(
                json!({"type": "function", "function": {"name": name, "arguments": arguments}}),
            );
        } else {
            if !message.content.is_empty() {
                message.content.push('\n');
            }
            message.content.push_str(&call_text(name, &arguments));
        }
    }
    if native {
        message.tool_calls = Some(Value::Array(hf_calls));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        serde_json::from_value(json!({"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }}))
        .unwrap()
    }

    #[test]
    fn calls_are_read_from_the_answer_with_the_text_around_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (content, calls) = read_answer(text, true);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[1].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
        // No call: all text, as it is.
        assert_eq!(
            read_answer(" It is sunny. ", true).0.as_deref(),
            Some(" It is sunny. ")
        );
        // A broken block is dropped, never left as content.
        assert_eq!(
            read_answer("<tool_call>\n{\"name\": 3}\n</tool_call>", true),
            (None, vec![])
        );
        // An unclosed last call (the answer ended at max_tokens or eos) still counts.
        let (content, calls) = read_answer("<tool_call>{\"name\": \"f\", \"arguments\": {}}", true);
        assert_eq!((content, calls.len()), (None, 1));
        // A last call cut off half-way is dropped; the complete ones stand.
        let cut = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"f\", \"argu";
        assert_eq!(
            read_answer(cut, true),
            (
                None,
                vec![ToolCall {
                    name: "f".into(),
                    arguments: "{}".into()
                }]
            )
        );
        // Text after a call is content too.
        let (content, _) = read_answer(
            "Sure.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n Done. ",
            true,
        );
        assert_eq!(content.as_deref(), Some("Sure.\nDone."));
        // An answer that could make no calls is all text, markup included.
        let markup = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        assert_eq!(
            read_answer(markup, false),
            (Some(markup.to_string()), vec![])
        );
    }

    /// Streamed calls: the name with an id once the head is written, then argument
    /// fragments that add up to what the whole answer reads; a call that may still
    /// repeat an earlier one waits, and one that diverges streams.
    #[test]
    fn calls_stream_as_name_then_argument_fragments() {
        let full = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": 1}, \"c\": \"x}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 2}}\n</tool_call>";
        let mut streamer = CallStreamer::default();
        let mut names = Vec::new();
        let mut args = vec![String::new(), String::new()];
        for end in (0..=full.len()).filter(|&e| full.is_char_boundary(e)) {
            for d in streamer.advance(&full[..end]) {
                if let Some(name) = d.function.name {
                    assert!(d.id.unwrap().starts_with("call_"));
                    assert_eq!(d.kind, Some("function"));
                    assert_eq!(d.index, names.len());
                    names.push(name);
                } else {
                    assert_eq!((d.id, d.kind), (None, None));
                }
                args[d.index].push_str(&d.function.arguments);
            }
        }
        let (_, calls) = read_answer(full, true);
        assert_eq!(names, ["f", "f"]);
        assert_eq!(
            args,
            [calls[0].arguments.clone(), calls[1].arguments.clone()]
        );
        assert_eq!(args[0], "{\"a\": {\"b\": 1}, \"c\": \"x}\"}");
        // A second call that may yet repeat the first is held back until it differs.
        let first = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let mut streamer = CallStreamer::default();
        assert_eq!(streamer.advance(first).len(), 2);
        let again = format!("{first}\n<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"a\": ");
        assert!(streamer.advance(&again).is_empty());
        assert_eq!(
            streamer.advance(&format!("{again}2")).len(),
            2,
            "diverged: name and fragment"
        );
        // Another layout (a model writing freely) does not stream.
        assert!(
            CallStreamer::default()
                .advance("<tool_call>{\"arguments\": {}, \"name\": \"f\"}")
                .is_empty()
        );
    }

    #[test]
    fn streaming_holds_back_what_may_open_a_call() {
        assert_eq!(streamable_len("Hello"), 5);
        assert_eq!(streamable_len("Hello <tool"), 5);
        assert_eq!(streamable_len("Hello <tool_call>\n{"), 5);
        assert_eq!(streamable_len("a < b"), 5);
        assert_eq!(streamable_len("a\n"), 1);
    }

    #[test]
    fn argument_objects_are_closed_and_references_rebased() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "item": {"$ref": "#/$defs/Item"},
                "free": {"type": "object"},
                "tags": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
                "$ref": {"type": "object", "properties": {"x": {}}},
                "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
                "data": {"const": {"properties": {"$ref": "#/x"}}}
            },
            "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}}
        });
        rebase_references(&mut schema, "/properties/arguments");
        close_objects(&mut schema);
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(
            schema["$defs"]["Item"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(
            schema["properties"]["item"]["$ref"],
            "#/properties/arguments/$defs/Item"
        );
        let p = &schema["properties"];
        assert!(
            p["free"].get("additionalProperties").is_none(),
            "an object without properties stays open"
        );
        assert_eq!(p["tags"]["additionalProperties"], json!({"type": "string"}));
        assert_eq!(
            p["$ref"]["additionalProperties"],
            json!(false),
            "a property named $ref is a schema"
        );
        assert!(p["both"]["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(
            p["data"]["const"],
            json!({"properties": {"$ref": "#/x"}}),
            "data is left alone"
        );
    }

    #[test]
    fn tool_fields_are_checked() {
        let bad_choice =
            ToolPlan::from_request(Some(vec![weather()]), Some(&json!("always")), None);
        assert!(bad_choice.unwrap_err().message.contains("always"));
        let unknown = ToolPlan::from_request(
            Some(vec![weather()]),
            Some(&json!({"type": "function", "function": {"name": "nope"}})),
            None,
        );
        assert!(unknown.unwrap_err().message.contains("nope"));
        let none = ToolPlan::from_request(None, Some(&json!("required")), None);
        assert!(none.unwrap_err().message.contains("no `tools`"));
        let twice = ToolPlan::from_request(Some(vec![weather(), weather()]), None, None);
        assert!(twice.unwrap_err().message.contains("twice"));
        let plan = ToolPlan::from_request(Some(vec![weather()]), None, None)
            .unwrap()
            .unwrap();
        assert!(plan.offers_calls());
        let Some(GrammarSpec::Lark(lazy)) = plan.grammar(None) else {
            panic!("auto guards the calls the model opens");
        };
        assert!(lazy.contains("PROSE") && lazy.contains("suffix="), "{lazy}");
        let required =
            ToolPlan::from_request(Some(vec![weather()]), Some(&json!("required")), Some(false))
                .unwrap()
                .unwrap();
        let Some(GrammarSpec::Lark(lark)) = required.grammar(None) else {
            panic!("required calls are a grammar");
        };
        assert!(
            lark.contains("get_weather") && lark.contains("start: calls"),
            "{lark}"
        );
    }
}

/// The lazy `auto` grammar compiled for the default model's tokenizer.
#[cfg(test)]
#[path = "tools_grammar_tests.rs"]
mod grammar_tests;
