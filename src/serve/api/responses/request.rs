//! A `/v1/responses` request read, checked, and turned into the chat request it asks
//! for: `instructions`, the conversation a `previous_response_id` continues, and the
//! `input` items become chat messages (a function call item an assistant's tool call,
//! its output a tool message, a reasoning item the next assistant message's thoughts),
//! function tools and `text.format` their chat forms. Everything past that goes the
//! chat path's way ([`super::super::openai`]).

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::super::ApiError;
use super::super::request::GenerationRequest;
use super::stored::user_message;
use crate::engine::MAX_TOP_LOGPROBS;

/// A `/v1/responses` request. Unknown fields are refused, as on the chat endpoint.
/// `reasoning.effort` is chat's `reasoning_effort`. Fields that do not change an
/// answer here are accepted and ignored (`metadata`, `reasoning.summary`,
/// `service_tier`, `prompt_cache_*`, `safety_identifier`, `stream_options`,
/// `max_tool_calls`, `context_management`); those that would are
/// refused unless they ask for nothing (`conversation`, `prompt` null, `background`
/// false, `truncation` `disabled`).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(super) struct ResponsesRequest {
    pub(super) model: Option<String>,
    pub(super) input: Option<Input>,
    pub(super) instructions: Option<String>,
    pub(super) max_output_tokens: Option<usize>,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    /// vLLM's extensions, as on the chat endpoint.
    pub(super) top_k: Option<usize>,
    pub(super) seed: Option<u64>,
    #[serde(default)]
    pub(super) stream: bool,
    pub(super) tools: Option<Vec<Value>>,
    pub(super) tool_choice: Option<Value>,
    pub(super) parallel_tool_calls: Option<bool>,
    pub(super) text: Option<Value>,
    pub(super) top_logprobs: Option<Value>,
    pub(super) include: Option<Vec<String>>,
    pub(super) user: Option<String>,
    pub(super) chat_template_kwargs: Option<Map<String, Value>>,
    /// The stored response this one continues.
    pub(super) previous_response_id: Option<Value>,
    /// Whether to keep this response (true unless false, as at OpenAI).
    pub(super) store: Option<Value>,
    // Refused unless they ask for nothing.
    pub(super) conversation: Option<Value>,
    pub(super) prompt: Option<Value>,
    pub(super) background: Option<Value>,
    pub(super) truncation: Option<Value>,
    /// `{"effort": ...}`: chat's `reasoning_effort`; its `summary` is ignored.
    pub(super) reasoning: Option<Value>,
    // Accepted and ignored: they do not change the answer.
    pub(super) metadata: Option<Value>,
    pub(super) service_tier: Option<Value>,
    pub(super) prompt_cache_key: Option<Value>,
    pub(super) prompt_cache_retention: Option<Value>,
    pub(super) prompt_cache_options: Option<Value>,
    pub(super) safety_identifier: Option<Value>,
    pub(super) stream_options: Option<Value>,
    pub(super) max_tool_calls: Option<Value>,
    pub(super) context_management: Option<Value>,
}

/// `input`: a user message's text, or a list of items.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub(super) enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// What asks for output logprobs in `include`.
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";

impl ResponsesRequest {
    /// The stored response this one continues, if it names one.
    pub(super) fn previous_response_id(&self) -> Result<Option<&str>, ApiError> {
        match &self.previous_response_id {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(id)) => Ok(Some(id)),
            Some(_) => Err(
                ApiError::bad_request("`previous_response_id` must be a string")
                    .param("previous_response_id"),
            ),
        }
    }

    /// Whether the request asks to keep its response (`store`: true unless false).
    pub(super) fn wants_stored(&self) -> Result<bool, ApiError> {
        match &self.store {
            None | Some(Value::Null) => Ok(true),
            Some(Value::Bool(keep)) => Ok(*keep),
            Some(_) => Err(ApiError::bad_request("`store` must be true or false").param("store")),
        }
    }

    /// The request's input as items: a text input is one user message.
    pub(super) fn input_items(&self) -> Result<Vec<Value>, ApiError> {
        match &self.input {
            None => Err(ApiError::bad_request("`input` is required")),
            Some(Input::Text(text)) => Ok(vec![user_message(text)]),
            Some(Input::Items(items)) if items.is_empty() => Err(ApiError::bad_request(
                "`input` must be a string or a non-empty list of items",
            )),
            Some(Input::Items(items)) => Ok(items.clone()),
        }
    }

    /// `reasoning.effort`, which chat calls `reasoning_effort` (checked there).
    fn reasoning_effort(&self) -> Result<Option<Value>, ApiError> {
        match &self.reasoning {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(reasoning)) => {
                Ok(reasoning.get("effort").filter(|e| !e.is_null()).cloned())
            }
            Some(_) => Err(ApiError::bad_request(
                "`reasoning` must be an object, such as {\"effort\": \"none\"}, or null",
            )
            .param("reasoning")),
        }
    }

    /// The chat request this asks for: the items of the conversation it continues
    /// (`earlier`, from `previous_response_id`; instructions are not carried over, as
    /// at OpenAI), then its `input` items ([`Self::input_items`], references resolved).
    /// Refuses what this server does not do here: conversations (send the whole
    /// conversation as `input`, or continue a stored response), prompt templates,
    /// background runs, automatic truncation, hosted tools.
    pub(super) fn to_chat(
        &self,
        earlier: &[Value],
        input: &[Value],
    ) -> Result<GenerationRequest, ApiError> {
        let is_null = |v: &Option<Value>| v.as_ref().is_none_or(Value::is_null);
        let refusals = [
            (
                "conversation",
                is_null(&self.conversation),
                "this server keeps no conversation objects; send the whole conversation as `input`, or continue a response with `previous_response_id`",
            ),
            (
                "prompt",
                is_null(&self.prompt),
                "stored prompt templates are not available; send `instructions` and `input`",
            ),
            (
                "background",
                is_null(&self.background) || self.background == Some(json!(false)),
                "background responses are not available; stream instead",
            ),
            (
                "truncation",
                is_null(&self.truncation) || self.truncation == Some(json!("disabled")),
                "only `disabled` is supported: a conversation longer than the context is refused",
            ),
        ];
        if let Some((field, _, why)) = refusals.iter().find(|(_, ok, _)| !ok) {
            return Err(ApiError::bad_request(format!("`{field}`: {why}")));
        }
        if self.max_output_tokens == Some(0) {
            return Err(ApiError::bad_request(
                "`max_output_tokens` must be at least 1",
            ));
        }
        let top_logprobs = match &self.top_logprobs {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Some(json!(n)),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "`top_logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}"
                    )));
                }
            },
        };
        let wants_logprobs = self.include.iter().flatten().any(|i| i == LOGPROBS_INCLUDE);
        let mut chat = json!({
            "messages": chat_messages(self.instructions.as_deref(), earlier, input)?,
        });
        let fields = [
            ("model", self.model.as_ref().map(|m| json!(m))),
            ("max_tokens", self.max_output_tokens.map(|n| json!(n))),
            ("temperature", self.temperature.map(|t| json!(t))),
            ("top_p", self.top_p.map(|p| json!(p))),
            ("top_k", self.top_k.map(|k| json!(k))),
            ("seed", self.seed.map(|s| json!(s))),
            ("user", self.user.as_ref().map(|u| json!(u))),
            (
                "parallel_tool_calls",
                self.parallel_tool_calls.map(|p| json!(p)),
            ),
            (
                "chat_template_kwargs",
                self.chat_template_kwargs.clone().map(Value::Object),
            ),
            ("tools", self.tools.as_deref().map(chat_tools).transpose()?),
            (
                "tool_choice",
                self.tool_choice
                    .as_ref()
                    .map(chat_tool_choice)
                    .transpose()?,
            ),
            ("response_format", response_format(self.text.as_ref())?),
            ("reasoning_effort", self.reasoning_effort()?),
            ("logprobs", wants_logprobs.then(|| json!(true))),
            ("top_logprobs", top_logprobs.filter(|_| wants_logprobs)),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                chat[name] = value;
            }
        }
        serde_json::from_value(chat).map_err(|e| ApiError::bad_request(e.to_string()))
    }
}

/// The chat messages of `instructions` (a system message first), the `earlier` items
/// of a continued conversation and the `input` items. Consecutive function calls are
/// one assistant message's calls (after its text, when a message item came just before
/// them); a reasoning item's text goes to the next assistant message.
fn chat_messages(
    instructions: Option<&str>,
    earlier: &[Value],
    input: &[Value],
) -> Result<Vec<Value>, ApiError> {
    let mut messages: Vec<Value> = Vec::new();
    if let Some(text) = instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    let items = earlier.iter().chain(input);
    let mut thoughts: Option<String> = None;
    // Whether the last message is an assistant's that later calls may join.
    let mut calls_may_join = false;
    for (i, item) in items.enumerate() {
        let bad = |what: &str| match i.checked_sub(earlier.len()) {
            Some(i) => ApiError::bad_request(format!("input[{i}]: {what}")),
            None => ApiError::bad_request(format!(
                "item {i} of the conversation `previous_response_id` continues: {what}"
            )),
        };
        let kind = item.get("type").and_then(Value::as_str);
        let kind = match kind {
            None if item.get("role").is_some() => "message",
            None => return Err(bad("an item needs `type` (or `role`, for a message)")),
            Some(kind) => kind,
        };
        match kind {
            "message" => {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a message needs `role`"))?;
                let content = message_text(item.get("content")).map_err(|e| bad(&e))?;
                let mut message = json!({"role": role, "content": content});
                if role == "assistant"
                    && let Some(thoughts) = thoughts.take()
                {
                    message["reasoning_content"] = json!(thoughts);
                }
                calls_may_join = role == "assistant";
                messages.push(message);
            }
            "function_call" => {
                let field = |name: &str| {
                    item.get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(&format!("a function call needs `{name}`, a string")))
                };
                let call = json!({
                    "id": field("call_id")?,
                    "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?},
                });
                if !calls_may_join {
                    let mut message =
                        json!({"role": "assistant", "content": null, "tool_calls": []});
                    if let Some(thoughts) = thoughts.take() {
                        message["reasoning_content"] = json!(thoughts);
                    }
                    messages.push(message);
                    calls_may_join = true;
                }
                let last = messages
                    .last_mut()
                    .expect("an assistant message was just ensured");
                match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => last["tool_calls"] = json!([call]),
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a function call output needs `call_id`, a string"))?;
                let output = message_text(item.get("output")).map_err(|e| bad(&e))?;
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                calls_may_join = false;
            }
            "reasoning" => {
                // Its text (open models' `content`), else its summary; encrypted
                // reasoning alone cannot be read and adds nothing.
                let parts = item
                    .get("content")
                    .filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
                    .or_else(|| item.get("summary"));
                let text = message_text(parts).map_err(|e| bad(&e))?;
                if !text.is_empty() {
                    thoughts = Some(text);
                }
            }
            "item_reference" => {
                return Err(bad(
                    "a reference to an item this server does not keep (only the output items of stored responses are); send the item itself",
                ));
            }
            other => {
                return Err(bad(&format!(
                    "items of type {other:?} are not supported here (messages, function calls, their outputs and reasoning are)"
                )));
            }
        }
    }
    Ok(messages)
}

/// The text of a message's `content` (or a call output's `output`): a string, or text
/// parts (`input_text`, `output_text`, `text`, reasoning and summary text, a refusal)
/// joined. Other parts (images, files, audio) are refused: this model reads text.
fn message_text(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                let field = match kind {
                    "input_text" | "output_text" | "text" | "reasoning_text" | "summary_text" => {
                        "text"
                    }
                    "refusal" => "refusal",
                    other => {
                        return Err(format!(
                            "content parts of type {other:?} are not supported: this model reads text parts only"
                        ));
                    }
                };
                let piece = part
                    .get(field)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("a {kind} part needs `{field}`, a string"))?;
                text.push_str(piece);
            }
            Ok(text)
        }
        Some(_) => Err("content must be a string or a list of parts".into()),
    }
}

/// Function tools in the chat form. OpenAI's hosted tools (web search, file search,
/// computer use, MCP servers…) do not run here.
fn chat_tools(tools: &[Value]) -> Result<Value, ApiError> {
    let mut chat = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(ApiError::bad_request(format!(
                "tools[{i}]: tools of type {kind:?} do not run on this server; only `function` tools do"
            )));
        }
        let mut function = Map::new();
        for (key, value) in tool.as_object().into_iter().flatten() {
            match key.as_str() {
                "type" => {}
                "name" | "description" | "parameters" | "strict" => {
                    function.insert(key.clone(), value.clone());
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "tools[{i}]: unknown field `{other}` (a function tool has name, description, parameters and strict)"
                    )));
                }
            }
        }
        chat.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(chat))
}

/// `tool_choice` in the chat form: `auto`, `none`, `required`, or a named function.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type") == Some(&json!("function")) => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("a function `tool_choice` needs `name`"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::bad_request(
            "`tool_choice` must be auto, none, required or {\"type\": \"function\", \"name\": …}",
        )),
    }
}

/// `text.format` as the chat's `response_format`: plain text (none), a JSON object, or
/// a JSON schema (its fields beside `type`, as chat nests them in `json_schema`).
fn response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let text = match text {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(text)) => text,
        Some(_) => return Err(ApiError::bad_request("`text` must be an object")),
    };
    if let Some(key) = text
        .keys()
        .find(|k| !["format", "verbosity"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "`text`: unknown field `{key}` (it has format and verbosity)"
        )));
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(ApiError::bad_request(
            "`text.format.type` must be text, json_object or json_schema",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<GenerationRequest, ApiError> {
        let req: ResponsesRequest = serde_json::from_value(body).expect("a well-formed request");
        req.to_chat(&[], &req.input_items()?)
    }

    fn messages(body: Value) -> Vec<Value> {
        let req: ResponsesRequest = serde_json::from_value(body).unwrap();
        chat_messages(
            req.instructions.as_deref(),
            &[],
            &req.input_items().unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_tool_loop_becomes_the_chat_it_stands_for() {
        let got = messages(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Two cities."}]},
                {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
                {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "21C"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Mild.", "annotations": []}]},
                {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
            ]
        }));
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Weather in Paris and Rome?"}),
                json!({"role": "assistant", "content": null, "reasoning_content": "Two cities.", "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}},
                ]}),
                json!({"role": "tool", "tool_call_id": "call_a", "content": "18C"}),
                json!({"role": "tool", "tool_call_id": "call_b", "content": "21C"}),
                json!({"role": "assistant", "content": "Mild."}),
                json!({"role": "user", "content": "Thanks"}),
            ]
        );
    }

    #[test]
    fn a_continued_conversation_comes_before_the_input_and_after_the_instructions() {
        let earlier = [
            json!({"type": "message", "role": "user", "content": "Weather in Paris?"}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "c", "name": "get_weather", "arguments": "{}", "status": "completed"}),
        ];
        let req: ResponsesRequest = serde_json::from_value(json!({
            "instructions": "Be brief.",
            "input": [{"type": "function_call_output", "call_id": "c", "output": "18C"}],
        }))
        .unwrap();
        let input = req.input_items().unwrap();
        let got = chat_messages(req.instructions.as_deref(), &earlier, &input).unwrap();
        let roles: Vec<&str> = got.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(got[2]["tool_calls"][0]["id"], "c");
        // A bad item is named where it is: in the input, or in the earlier items.
        let bad = json!({"type": "function_call", "name": "f", "arguments": "{}"});
        let e = chat_messages(None, &earlier, std::slice::from_ref(&bad)).unwrap_err();
        assert!(e.message.starts_with("input[0]: "), "{}", e.message);
        let e = chat_messages(None, &[bad], &input).unwrap_err();
        assert!(
            e.message.contains("item 0 of the conversation"),
            "{}",
            e.message
        );
    }

    #[test]
    fn store_and_previous_response_id_are_read_as_openai_has_them() {
        let read = |body: Value| serde_json::from_value::<ResponsesRequest>(body).unwrap();
        assert!(read(json!({"input": "x"})).wants_stored().unwrap());
        assert!(
            !read(json!({"input": "x", "store": false}))
                .wants_stored()
                .unwrap()
        );
        assert!(
            read(json!({"input": "x", "store": "yes"}))
                .wants_stored()
                .is_err()
        );
        let continued = read(json!({"input": "x", "previous_response_id": "resp_a"}));
        assert_eq!(continued.previous_response_id().unwrap(), Some("resp_a"));
        let e = read(json!({"input": "x", "previous_response_id": 5}))
            .previous_response_id()
            .unwrap_err();
        assert_eq!(e.param, Some("previous_response_id"));
    }

    #[test]
    fn calls_after_an_assistant_message_join_it() {
        let got = messages(json!({"input": [
            {"role": "user", "content": "Hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]}));
        assert_eq!(got.len(), 2);
        assert_eq!(got[1]["content"], "Looking.");
        assert_eq!(got[1]["tool_calls"][0]["id"], "c");
    }

    #[test]
    fn function_tools_choices_and_formats_take_their_chat_forms() {
        let chat = request(json!({
            "input": "Hi",
            "max_output_tokens": 7,
            "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "store": false,
            "reasoning": {"effort": "low"},
        }))
        .unwrap();
        assert_eq!(chat.max_tokens, Some(7));
        assert_eq!(chat.tools.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            chat.tool_choice,
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        assert_eq!(
            chat.response_format,
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}})
            )
        );
        assert_eq!(chat.logprobs, Some(json!(true)));
        assert_eq!(chat.top_logprobs, Some(json!(2)));
    }

    #[test]
    fn what_cannot_be_served_is_refused_by_name() {
        let refused = |body: Value, needle: &str| {
            let e = request(body).expect_err("refused");
            assert!(e.message.contains(needle), "{} lacks {needle:?}", e.message);
        };
        refused(
            json!({"input": "x", "conversation": "conv_1"}),
            "conversation",
        );
        refused(json!({"input": "x", "background": true}), "background");
        refused(json!({"input": "x", "truncation": "auto"}), "truncation");
        refused(
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "\"web_search\"",
        );
        refused(
            json!({"input": "x", "tools": [{"type": "function", "name": "f", "extra": 1}]}),
            "`extra`",
        );
        refused(
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
        );
        refused(
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input_image",
        );
        refused(
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "call_id",
        );
        refused(
            json!({"input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        );
        refused(json!({}), "`input` is required");
        refused(json!({"input": []}), "non-empty list");
        refused(
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        );
        refused(json!({"input": "x", "text": 5}), "`text` must be an object");
        refused(json!({"input": "x", "top_logprobs": 21}), "top_logprobs");
        let unknown =
            serde_json::from_value::<ResponsesRequest>(json!({"input": "x", "temprature": 0}));
        assert!(unknown.is_err());
    }
}
