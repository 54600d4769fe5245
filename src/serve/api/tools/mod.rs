//! Tool calling and structured outputs at the serving edge: a request's `tools`,
//! `tool_choice`, `parallel_tool_calls` and `response_format` become the prompt's tool
//! list and the grammar its answer is held to; the answer's text becomes tool calls.
//!
//! Calls are written in the form the model's template teaches ([`CallSyntax`]): the
//! `<tool_call>` blocks of the Hermes and Qwen templates,
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! Llama 3's bare object, the whole answer: `{"name": "get_weather", "parameters":
//! {"city": "Paris"}}`, Mistral's list after its control token: `[TOOL_CALLS]
//! [{"name": "get_weather", "arguments": {"city": "Paris"}}]`, or Mistral's newer
//! calls, one by one: `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`. A template
//! that renders tools itself gets the `tools` list and the earlier calls; for one that
//! does not (the default model's), the tools are
//! described in the system message and earlier calls are written into the assistant's
//! turns, in the tagged form. With
//! `tool_choice` `required` or a named function, decoding is held to a grammar of calls
//! whose arguments follow each tool's `parameters` schema, so even a small model emits
//! a valid call; with `auto` the model chooses, and a call it opens is held to the
//! tools' schemas (a lazy grammar); the answer is read for calls ([`calls`]).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::chat::{ARGS_TOKEN, CallSyntax, ChatMessage, ChatTemplate, TOOL_CALLS_TOKEN};
use crate::engine::Delimiters;
use crate::engine::grammar::GrammarSpec;
use crate::model::tokenizer::ModelTokenizer;

use super::ApiError;

mod calls;
mod grammar;
mod named;
pub(super) use calls::{CallStreamer, ToolCall, read_answer, streamable_len};

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

/// How the served model writes calls: its template's form and, for Mistral's forms,
/// the ids of its `[TOOL_CALLS]` and `[ARGS]` control tokens (None: the tokenizer has
/// them as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CallForm {
    /// The form.
    pub syntax: CallSyntax,
    /// The control token that opens Mistral's list, or each of its newer calls.
    pub tool_calls_token: Option<u32>,
    /// The control token before the arguments in Mistral's newer calls.
    pub args_token: Option<u32>,
}

impl CallForm {
    /// The form a model's template teaches (the tagged one without a template).
    pub(super) fn of_model(template: Option<&ChatTemplate>, tokenizer: &ModelTokenizer) -> Self {
        let control = |text: &str| {
            tokenizer
                .token_id(text)
                .filter(|&id| tokenizer.is_control(id))
        };
        CallForm {
            syntax: template.map_or(CallSyntax::Tagged, ChatTemplate::call_syntax),
            tool_calls_token: control(TOOL_CALLS_TOKEN),
            args_token: control(ARGS_TOKEN),
        }
    }

    /// `syntax` with its markers as text.
    #[cfg(test)]
    pub(super) fn text(syntax: CallSyntax) -> Self {
        CallForm {
            syntax,
            tool_calls_token: None,
            args_token: None,
        }
    }
}

/// A request's tools and what it asks of them.
#[derive(Debug, Clone)]
pub(super) struct ToolPlan {
    tools: Vec<Tool>,
    choice: ToolChoice,
    parallel: bool,
    /// How the model writes a call.
    form: CallForm,
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
    /// Read and check a request's tool fields, for a model that writes calls in
    /// `form`; None when it offers no tools.
    pub(super) fn from_request(
        tools: Option<Vec<Tool>>,
        choice: Option<&Value>,
        parallel: Option<bool>,
        form: CallForm,
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
            form,
        }))
    }

    /// True when the model decides whether to call (`auto`).
    pub(super) fn lets_the_model_choose(&self) -> bool {
        self.choice == ToolChoice::Auto
    }

    /// How the model writes a call.
    pub(super) fn syntax(&self) -> CallSyntax {
        self.form.syntax
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
                    let mut function = json!({"name": t.function.name});
                    // As the client sent it: templates print every key they are given
                    // (Mistral's, Llama 3's), and a tool without a description has none.
                    if let Some(d) = &t.function.description {
                        function["description"] = json!(d);
                    }
                    function["parameters"] = t.parameters();
                    json!({"type": "function", "function": function})
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
        call_schema(&self.tools.iter().collect::<Vec<_>>(), self.form.syntax)
    }
}
/// Where a call holds its arguments: `arguments`, or Llama 3's `parameters`.
pub(super) fn arguments_key(syntax: CallSyntax) -> &'static str {
    match syntax {
        CallSyntax::Tagged | CallSyntax::ToolCallsList | CallSyntax::NamedArgs => "arguments",
        CallSyntax::BareJson => "parameters",
    }
}

/// The schema of one call of any of `tools` in `syntax`: `{"name": .., "arguments":
/// ..}` (or `"parameters"`) with the tool's `parameters` as the arguments, one tool or
/// `anyOf` several. Each tool's references into its own schema (`#/$defs/..`, `#`) are
/// rewritten to where its schema now sits, so Pydantic's `$defs` keep resolving.
fn call_schema(tools: &[&Tool], syntax: CallSyntax) -> Value {
    let key = arguments_key(syntax);
    let one = |t: &Tool, at: &str| {
        let mut arguments = t.parameters();
        rebase_references(&mut arguments, &format!("{at}/properties/{key}"));
        close_objects(&mut arguments);
        json!({
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                key: arguments,
            },
            "required": ["name", key],
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

/// The text an earlier call is written as in an assistant turn.
pub(super) fn call_text(name: &str, arguments: &Value) -> String {
    format!(
        "{CALL_OPEN}\n{}\n{CALL_CLOSE}",
        json!({"name": name, "arguments": arguments})
    )
}

/// The delimiters of a call in an answer in `syntax`, for ending an answer that
/// repeats a call: the tags, a call object (in the grammar's layout) of Mistral's
/// list, or one of its newer calls from its `[TOOL_CALLS]` to its arguments' end; None
/// for Llama 3's single call.
pub(super) fn call_delimiters(syntax: CallSyntax) -> Option<Delimiters> {
    match syntax {
        CallSyntax::Tagged => Some(Delimiters {
            open: CALL_OPEN.into(),
            close: CALL_CLOSE.into(),
        }),
        CallSyntax::ToolCallsList => Some(Delimiters {
            open: "{\"name\": ".into(),
            close: String::new(),
        }),
        CallSyntax::NamedArgs => Some(Delimiters {
            open: TOOL_CALLS_TOKEN.into(),
            close: String::new(),
        }),
        CallSyntax::BareJson => None,
    }
}

/// Longest call id Mistral's templates take (7B v0.3's takes only this length; later
/// ones print the last nine characters).
const MISTRAL_ID_CHARS: usize = 9;

/// Fit the call ids in `messages` (an assistant's calls, a tool result's
/// `tool_call_id`) to what a template in `syntax` takes: for Mistral's forms, their
/// last nine characters, as vLLM cuts them (this server's own ids end in nine
/// letters and digits); others are left alone.
pub(super) fn fit_call_ids(messages: &mut [ChatMessage], syntax: CallSyntax) {
    if !syntax.is_mistral() {
        return;
    }
    let cut = |id: &str| {
        let skip = id.chars().count().saturating_sub(MISTRAL_ID_CHARS);
        id.chars().skip(skip).collect::<String>()
    };
    for m in messages {
        if let Some(id) = &mut m.tool_call_id {
            *id = cut(id);
        }
        for call in m
            .tool_calls
            .iter_mut()
            .flat_map(|c| c.as_array_mut())
            .flatten()
        {
            if let Some(Value::String(id)) = call.get_mut("id") {
                *id = cut(id);
            }
        }
    }
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
            let mut hf_call =
                json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            // Templates that pair calls with their results by id (Mistral's) read it.
            if let Some(id) = call.get("id").filter(|id| id.is_string()) {
                hf_call["id"] = id.clone();
            }
            hf_calls.push(hf_call);
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

    /// Templates get the tools as the client sent them: no `description` key for a tool
    /// without one (Llama 3's and Mistral's templates print every key).
    #[test]
    fn templates_get_the_tools_as_sent() {
        let bare: Tool = serde_json::from_value(json!({"type": "function", "function": {
            "name": "now", "parameters": {"type": "object", "properties": {}}}}))
        .unwrap();
        let plan = ToolPlan::from_request(
            Some(vec![weather(), bare]),
            None,
            None,
            CallForm::text(CallSyntax::BareJson),
        )
        .unwrap()
        .unwrap();
        let tools = plan.tools_json();
        assert_eq!(
            tools[1],
            json!({"type": "function", "function": {"name": "now",
                "parameters": {"type": "object", "properties": {}}}})
        );
        assert_eq!(tools[0]["function"]["name"], "get_weather");
    }

    /// For Mistral's templates, ids go back as their last nine characters (OpenAI's and
    /// this server's end in letters and digits); other templates get them as sent.
    #[test]
    fn call_ids_are_cut_for_mistral_templates() {
        let messages = || {
            vec![
                ChatMessage {
                    role: "assistant".into(),
                    tool_calls: Some(
                        json!([{"id": "call_0123456789abcdefABCDEFGH", "type": "function",
                        "function": {"name": "f", "arguments": {}}}, {"id": "Xy7", "function": {}}]),
                    ),
                    ..Default::default()
                },
                ChatMessage {
                    role: "tool".into(),
                    tool_call_id: Some("call_0123456789abcdefABCDEFGH".into()),
                    ..Default::default()
                },
            ]
        };
        let mut cut = messages();
        fit_call_ids(&mut cut, CallSyntax::ToolCallsList);
        let calls = cut[0].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["id"], "fABCDEFGH");
        assert_eq!(
            calls[1]["id"], "Xy7",
            "a short id stays (the template names the problem)"
        );
        assert_eq!(cut[1].tool_call_id.as_deref(), Some("fABCDEFGH"));
        for syntax in [CallSyntax::Tagged, CallSyntax::BareJson] {
            let mut kept = messages();
            fit_call_ids(&mut kept, syntax);
            assert_eq!(kept, messages());
        }
    }

    #[test]
    fn tool_fields_are_checked() {
        let bad_choice = ToolPlan::from_request(
            Some(vec![weather()]),
            Some(&json!("always")),
            None,
            CallForm::text(CallSyntax::Tagged),
        );
        assert!(bad_choice.unwrap_err().message.contains("always"));
        let unknown = ToolPlan::from_request(
            Some(vec![weather()]),
            Some(&json!({"type": "function", "function": {"name": "nope"}})),
            None,
            CallForm::text(CallSyntax::Tagged),
        );
        assert!(unknown.unwrap_err().message.contains("nope"));
        let none = ToolPlan::from_request(
            None,
            Some(&json!("required")),
            None,
            CallForm::text(CallSyntax::Tagged),
        );
        assert!(none.unwrap_err().message.contains("no `tools`"));
        let twice = ToolPlan::from_request(
            Some(vec![weather(), weather()]),
            None,
            None,
            CallForm::text(CallSyntax::Tagged),
        );
        assert!(twice.unwrap_err().message.contains("twice"));
        let plan = ToolPlan::from_request(
            Some(vec![weather()]),
            None,
            None,
            CallForm::text(CallSyntax::Tagged),
        )
        .unwrap()
        .unwrap();
        assert!(plan.offers_calls());
        let Some(GrammarSpec::Lark(lazy)) = plan.grammar(None) else {
            panic!("auto guards the calls the model opens");
        };
        assert!(lazy.contains("PROSE") && lazy.contains("suffix="), "{lazy}");
        let required = ToolPlan::from_request(
            Some(vec![weather()]),
            Some(&json!("required")),
            Some(false),
            CallForm::text(CallSyntax::Tagged),
        )
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
pub(super) mod grammar_tests;
