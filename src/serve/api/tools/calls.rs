//! An answer's tool calls: read from its text when it ends ([`read_answer`]), and streamed
//! as they are decoded ([`CallStreamer`]), in the `<tool_call>` form the module above
//! asks the model for. Call markup never reaches the content.

use serde_json::Value;

use super::super::wire::{FunctionCall, FunctionDelta, ToolCallDelta, ToolCallOut};
use super::{CALL_CLOSE, CALL_OPEN};

/// A call the answer made.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::serve::api) struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The call in OpenAI's form, with a fresh id (and its `index` in a stream).
    pub(in crate::serve::api) fn to_wire(&self, index: Option<usize>) -> ToolCallOut {
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

/// An answer that may hold calls, read: its content is the text outside the call
/// blocks (None when there is none), its calls the blocks that hold a well-formed
/// `{"name": .., "arguments": {..}}`. A block that does not (a call cut off by
/// `max_tokens`, or a model's broken one) is dropped: call markup never reaches the
/// content. Without any block, or when the answer could make no calls (`reads_calls`
/// false), the content is the whole text.
pub(in crate::serve::api) fn read_answer(
    text: &str,
    reads_calls: bool,
) -> (Option<String>, Vec<ToolCall>) {
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
pub(in crate::serve::api) fn streamable_len(text: &str) -> usize {
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
pub(in crate::serve::api) struct CallStreamer {
    /// Per call started: its id and the bytes of its arguments sent.
    started: Vec<(String, usize)>,
}

impl CallStreamer {
    /// The tool-call deltas that `text` (the answer so far) adds to what was sent.
    pub(in crate::serve::api) fn advance(&mut self, text: &str) -> Vec<ToolCallDelta> {
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
    pub(in crate::serve::api) fn started(&self) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
