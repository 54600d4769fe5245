//! An answer's tool calls: read from its text when it ends ([`read_answer`]), and streamed
//! as they are decoded ([`CallStreamer`]), in the form the model writes them
//! ([`CallSyntax`]). Call markup never reaches the content.

use serde_json::Value;

use super::super::wire::{FunctionCall, FunctionDelta, ToolCallDelta, ToolCallOut};
use super::{CALL_CLOSE, CALL_OPEN, arguments_key, named};
use crate::chat::{CallSyntax, TOOL_CALLS_TOKEN};

/// What Llama 3.1 may write before a call (its built-in tools' marker), when the
/// tokenizer's text shows control tokens.
const PYTHON_TAG: &str = "<|python_tag|>";

/// A call the answer made.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::serve::api) struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The call in OpenAI's form, with a fresh id for a model writing `syntax` (and its
    /// `index` in a stream).
    pub(in crate::serve::api) fn to_wire(
        &self,
        index: Option<usize>,
        syntax: CallSyntax,
    ) -> ToolCallOut {
        ToolCallOut {
            index,
            id: new_call_id(syntax),
            kind: "function",
            function: FunctionCall {
                name: self.name.clone(),
                arguments: self.arguments.clone(),
            },
        }
    }
}

/// An answer read for the calls it made (`calls`: how the model writes them; None: it
/// could make none, and the content is the whole text): its content (None when there is
/// none) and its calls.
pub(in crate::serve::api) fn read_answer(
    text: &str,
    calls: Option<CallSyntax>,
) -> (Option<String>, Vec<ToolCall>) {
    match calls {
        None => (Some(text.to_string()), Vec::new()),
        Some(CallSyntax::Tagged) => read_tagged(text),
        Some(syntax @ (CallSyntax::BareJson | CallSyntax::ToolCallsList)) => {
            read_json_calls(text, syntax)
        }
        Some(CallSyntax::NamedArgs) => read_named(text),
    }
}

/// An answer in Mistral's newer form: its content is the text before its first
/// `[TOOL_CALLS]` and any after its last call, its calls those whose arguments closed
/// (one cut off by `max_tokens` is dropped, markup and all).
fn read_named(text: &str) -> (Option<String>, Vec<ToolCall>) {
    let Some(first) = named::calls_start(text) else {
        return (Some(text.to_string()), Vec::new());
    };
    let (found, after) = named::calls_in(text);
    let calls = found
        .iter()
        .filter(|c| c.closed)
        .map(|c| ToolCall {
            name: c.name.to_string(),
            arguments: c.arguments.to_string(),
        })
        .collect();
    let mut content = text[..first].trim_end().to_string();
    if let Some(after) = after.map(str::trim).filter(|a| !a.is_empty()) {
        if !content.is_empty() {
            content.push('\n');
        }
        content.push_str(after);
    }
    ((!content.is_empty()).then_some(content), calls)
}

/// An answer with `<tool_call>` blocks: its content is the text outside them, its calls
/// the blocks that hold a well-formed `{"name": .., "arguments": {..}}`. A block that
/// does not (a call cut off by `max_tokens`, or a model's broken one) is dropped: call
/// markup never reaches the content. Without any block, the content is the whole text.
fn read_tagged(text: &str) -> (Option<String>, Vec<ToolCall>) {
    if !text.contains(CALL_OPEN) {
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
        match read_call(body, CallSyntax::Tagged) {
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

/// Where an answer's calls start in the JSON forms: at the first object, past leading
/// whitespace and Llama 3's `<|python_tag|>`, or past Mistral's `[TOOL_CALLS]` (text
/// when the tokenizer's text shows it) and the list's `[`; None when the answer does
/// not start with calls.
fn json_calls_start(text: &str, syntax: CallSyntax) -> Option<&str> {
    let body = text.trim_start();
    let body = match syntax {
        CallSyntax::Tagged | CallSyntax::NamedArgs => return None,
        CallSyntax::BareJson => body.strip_prefix(PYTHON_TAG).unwrap_or(body),
        CallSyntax::ToolCallsList => body
            .strip_prefix(TOOL_CALLS_TOKEN)
            .unwrap_or(body)
            .trim_start()
            .strip_prefix('[')?,
    }
    .trim_start();
    body.starts_with('{').then_some(body)
}

/// What follows a call object in a JSON form, past its separator (Llama 3's `;` or
/// whitespace, the list's `,`) and the list's `]`: the rest, and whether another call
/// may start there.
fn after_call(rest: &str, syntax: CallSyntax) -> (&str, bool) {
    let rest = rest.trim_start();
    if syntax == CallSyntax::ToolCallsList {
        return match (rest.strip_prefix(','), rest.strip_prefix(']')) {
            (Some(more), _) => (more.trim_start(), true),
            (None, Some(after)) => (after, false),
            (None, None) => (rest, false),
        };
    }
    let rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    (rest, true)
}

/// An answer in a JSON form (Llama 3's bare objects, one after another as vLLM reads
/// them; Mistral's list): the calls it starts with, and the text after them as
/// content. An answer that does not start with a call is all content, an object that
/// is not a call (a JSON answer) included; a call cut off (by `max_tokens`) is dropped.
fn read_json_calls(text: &str, syntax: CallSyntax) -> (Option<String>, Vec<ToolCall>) {
    let whole = || (Some(text.to_string()), Vec::new());
    let Some(mut rest) = json_calls_start(text, syntax) else {
        return whole();
    };
    let mut calls = Vec::new();
    let mut more = true;
    while more && rest.starts_with('{') {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(_)) => {
                let end = values.byte_offset();
                let Some(call) = read_call(&rest[..end], syntax) else {
                    break;
                };
                calls.push(call);
                (rest, more) = after_call(&rest[end..], syntax);
            }
            Some(Err(e)) if e.is_eof() && names_first(rest) => {
                tracing::debug!("an answer's last call is cut off: {rest:?}");
                rest = "";
            }
            _ => break,
        }
    }
    if calls.is_empty() && !rest.is_empty() {
        return whole();
    }
    let rest = rest.trim();
    ((!rest.is_empty()).then(|| rest.to_string()), calls)
}

/// True when `object` (an object's text, perhaps cut off) names its first key `name`:
/// a call, not another JSON answer.
fn names_first(object: &str) -> bool {
    object
        .strip_prefix('{')
        .is_some_and(|o| o.trim_start().starts_with("\"name\""))
}

/// One call's `{"name": .., "arguments": {..}}`; the arguments may be under Llama 3's
/// `parameters` (models trained on either write either).
fn read_call(body: &str, syntax: CallSyntax) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        // The model's own text when it is the grammar's layout (as a stream sends it).
        Some(a @ Value::Object(_)) => match call_head(body, syntax) {
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

/// How much of a streamed answer may go out as content now. Tagged and Mistral's newer
/// form: text before a call, less a tail that may be the start of one, and less
/// trailing whitespace (which [`read_answer`] drops before a call). The JSON forms:
/// nothing while the answer may still start with calls (whitespace, the start of a
/// marker, `{` or Mistral's `[`), then all of it.
pub(in crate::serve::api) fn streamable_len(text: &str, syntax: CallSyntax) -> usize {
    let body = text.trim_start();
    let may_call = match syntax {
        CallSyntax::Tagged => return len_before(text, CALL_OPEN),
        CallSyntax::NamedArgs => return len_before(text, TOOL_CALLS_TOKEN),
        CallSyntax::BareJson => {
            PYTHON_TAG.starts_with(body) || json_calls_start(text, syntax).is_some()
        }
        CallSyntax::ToolCallsList => TOOL_CALLS_TOKEN.starts_with(body) || body.starts_with('['),
    };
    if may_call { 0 } else { text.len() }
}

/// [`streamable_len`] for forms whose calls start with `opening` anywhere: the text
/// before it, less a tail that may be its start, and less trailing whitespace.
fn len_before(text: &str, opening: &str) -> usize {
    if let Some(at) = text.find(opening) {
        return text[..at].trim_end().len();
    }
    let mut keep = text.len();
    for n in (1..opening.len()).rev() {
        if text.len() >= n && text.is_char_boundary(text.len() - n) && text.ends_with(&opening[..n])
        {
            keep = text.len() - n;
            break;
        }
    }
    text[..keep].trim_end().len()
}

/// A call's head in the layout the call grammar writes, `{"name": "NAME", "arguments":
/// ` (or `"parameters"`, as `syntax` writes them): the name and where the arguments
/// start in `body`. None for any other layout (a model writing calls freely), whose
/// calls are sent whole.
fn call_head(body: &str, syntax: CallSyntax) -> Option<(&str, usize)> {
    let lead = body.len() - body.trim_start().len();
    let rest = body[lead..].strip_prefix("{\"name\": \"")?;
    let name_len = rest.find('"')?;
    let name = &rest[..name_len];
    let after = rest[name_len..]
        .strip_prefix("\", \"")?
        .strip_prefix(arguments_key(syntax))?
        .strip_prefix("\": ")?;
    Some((name, body.len() - after.len()))
}

/// The arguments' text in a closed block's `args` (what follows the head): up to the
/// object's closing brace.
fn closed_arguments(args: &str) -> &str {
    let args = args.trim_end();
    args.strip_suffix('}').unwrap_or(args).trim_end()
}

/// How much of an open call's `args` is surely arguments: less a tail that may be the
/// call object's closing brace, whitespace and the start of the closing tag `close`.
fn open_arguments_len(args: &str, close: &str) -> usize {
    let mut end = args.len();
    for n in (1..close.len()).rev() {
        if args.ends_with(&close[..n]) {
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
pub(in crate::serve::api) struct CallStreamer {
    /// How the model writes calls.
    syntax: CallSyntax,
    /// Per call started: its id and the bytes of its arguments sent.
    started: Vec<(String, usize)>,
}

impl CallStreamer {
    /// A streamer for calls written in `syntax`.
    pub(in crate::serve::api) fn new(syntax: CallSyntax) -> Self {
        CallStreamer {
            syntax,
            started: Vec::new(),
        }
    }

    /// The tool-call deltas that `text` (the answer so far) adds to what was sent.
    pub(in crate::serve::api) fn advance(&mut self, text: &str) -> Vec<ToolCallDelta> {
        let mut deltas = Vec::new();
        match self.syntax {
            CallSyntax::Tagged => self.advance_tagged(text, &mut deltas),
            CallSyntax::BareJson | CallSyntax::ToolCallsList => {
                self.advance_json(text, &mut deltas)
            }
            CallSyntax::NamedArgs => self.advance_named(text, &mut deltas),
        }
        deltas
    }

    /// [`CallStreamer::advance`] over Mistral's newer calls: each once its name is
    /// written, its arguments as they come (all of an open object's text so far is
    /// arguments).
    fn advance_named(&mut self, text: &str, deltas: &mut Vec<ToolCallDelta>) {
        let (calls, _) = named::calls_in(text);
        for (index, call) in calls.iter().enumerate() {
            if !call.closed
                && calls[..index]
                    .iter()
                    .any(|c| c.block.starts_with(call.block))
            {
                return;
            }
            self.send(
                deltas,
                index,
                call.name,
                call.arguments,
                call.arguments.len(),
            );
        }
    }

    /// [`CallStreamer::advance`] over `<tool_call>` blocks.
    fn advance_tagged(&mut self, text: &str, deltas: &mut Vec<ToolCallDelta>) {
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
            let Some((name, args_at)) = call_head(body, self.syntax) else {
                break;
            };
            let args = &body[args_at..];
            let ready = match close {
                Some(_) => closed_arguments(args).len(),
                None => open_arguments_len(args, CALL_CLOSE),
            };
            self.send(deltas, index, name, args, ready);
            let Some(close) = close else { break };
            earlier.push(block);
            index += 1;
            from = close + CALL_CLOSE.len();
        }
    }

    /// [`CallStreamer::advance`] over the JSON forms: each call object in turn, closed
    /// when its object is.
    fn advance_json(&mut self, text: &str, deltas: &mut Vec<ToolCallDelta>) {
        let Some(mut rest) = json_calls_start(text, self.syntax) else {
            return;
        };
        for index in 0.. {
            let Some((name, args_at)) = call_head(rest, self.syntax) else {
                return;
            };
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let end = matches!(values.next(), Some(Ok(_))).then(|| values.byte_offset());
            let ready = match end {
                Some(end) => closed_arguments(&rest[args_at..end]).len(),
                None => open_arguments_len(&rest[args_at..], ""),
            };
            self.send(deltas, index, name, &rest[args_at..], ready);
            let Some(end) = end else { return };
            let (next, more) = after_call(&rest[end..], self.syntax);
            if !more {
                return;
            }
            rest = next;
        }
    }

    /// The deltas of call `index` (named `name`) whose arguments so far are `args`, of
    /// which the first `ready` bytes are surely its arguments: its head when it is new,
    /// and the ready bytes not yet sent.
    fn send(
        &mut self,
        deltas: &mut Vec<ToolCallDelta>,
        index: usize,
        name: &str,
        args: &str,
        ready: usize,
    ) {
        if index == self.started.len() {
            let id = new_call_id(self.syntax);
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
    }

    /// How the model writes the calls streamed.
    pub(in crate::serve::api) fn syntax(&self) -> CallSyntax {
        self.syntax
    }

    /// How many calls have started streaming.
    pub(in crate::serve::api) fn started(&self) -> usize {
        self.started.len()
    }
}

/// A fresh call id: OpenAI's form, or for Mistral's forms nine letters and digits, the
/// only ids Mistral's templates take back.
fn new_call_id(syntax: CallSyntax) -> String {
    if syntax.is_mistral() {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        return (0..9)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect();
    }
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

    const TAGGED: Option<CallSyntax> = Some(CallSyntax::Tagged);

    #[test]
    fn calls_are_read_from_the_answer_with_the_text_around_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (content, calls) = read_answer(text, TAGGED);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[1].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
        // No call: all text, as it is.
        assert_eq!(
            read_answer(" It is sunny. ", TAGGED).0.as_deref(),
            Some(" It is sunny. ")
        );
        // A broken block is dropped, never left as content.
        assert_eq!(
            read_answer("<tool_call>\n{\"name\": 3}\n</tool_call>", TAGGED),
            (None, vec![])
        );
        // An unclosed last call (the answer ended at max_tokens or eos) still counts.
        let (content, calls) =
            read_answer("<tool_call>{\"name\": \"f\", \"arguments\": {}}", TAGGED);
        assert_eq!((content, calls.len()), (None, 1));
        // A last call cut off half-way is dropped; the complete ones stand.
        let cut = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"f\", \"argu";
        assert_eq!(
            read_answer(cut, TAGGED),
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
            TAGGED,
        );
        assert_eq!(content.as_deref(), Some("Sure.\nDone."));
        // An answer that could make no calls is all text, markup included.
        let markup = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        assert_eq!(
            read_answer(markup, None),
            (Some(markup.to_string()), vec![])
        );
    }

    /// A streamed call as its deltas build it: id, name, arguments.
    struct Streamed {
        id: String,
        name: String,
        arguments: String,
    }

    /// `full` fed to a streamer for `syntax` one prefix at a time, as an answer grows:
    /// the calls its deltas build. Each head (an id, `function`, the name, empty
    /// arguments) comes once, under the next index; fragments carry only arguments.
    fn stream_every_prefix(full: &str, syntax: CallSyntax) -> Vec<Streamed> {
        let mut streamer = CallStreamer::new(syntax);
        let mut calls: Vec<Streamed> = Vec::new();
        for end in (0..=full.len()).filter(|&e| full.is_char_boundary(e)) {
            for d in streamer.advance(&full[..end]) {
                if let Some(name) = d.function.name {
                    assert_eq!(d.kind, Some("function"));
                    assert_eq!(d.index, calls.len());
                    assert!(d.function.arguments.is_empty());
                    calls.push(Streamed {
                        id: d.id.unwrap(),
                        name,
                        arguments: String::new(),
                    });
                } else {
                    assert_eq!((d.id, d.kind), (None, None));
                    calls[d.index].arguments.push_str(&d.function.arguments);
                }
            }
        }
        calls
    }

    /// Streamed calls: the name with an id once the head is written, then argument
    /// fragments that add up to what the whole answer reads; a call that may still
    /// repeat an earlier one waits, and one that diverges streams.
    #[test]
    fn calls_stream_as_name_then_argument_fragments() {
        let full = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": 1}, \"c\": \"x}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 2}}\n</tool_call>";
        let streamed = stream_every_prefix(full, CallSyntax::Tagged);
        assert!(streamed.iter().all(|c| c.id.starts_with("call_")));
        let (_, calls) = read_answer(full, TAGGED);
        let names: Vec<_> = streamed.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["f", "f"]);
        let args: Vec<_> = streamed.iter().map(|c| c.arguments.clone()).collect();
        assert_eq!(
            args,
            [calls[0].arguments.clone(), calls[1].arguments.clone()]
        );
        assert_eq!(args[0], "{\"a\": {\"b\": 1}, \"c\": \"x}\"}");
        // A second call that may yet repeat the first is held back until it differs.
        let first = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let mut streamer = CallStreamer::new(CallSyntax::Tagged);
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
            CallStreamer::new(CallSyntax::Tagged)
                .advance("<tool_call>{\"arguments\": {}, \"name\": \"f\"}")
                .is_empty()
        );
    }

    #[test]
    fn streaming_holds_back_what_may_open_a_call() {
        assert_eq!(streamable_len("Hello", CallSyntax::Tagged), 5);
        assert_eq!(streamable_len("Hello <tool", CallSyntax::Tagged), 5);
        assert_eq!(
            streamable_len("Hello <tool_call>\n{", CallSyntax::Tagged),
            5
        );
        assert_eq!(streamable_len("a < b", CallSyntax::Tagged), 5);
        assert_eq!(streamable_len("a\n", CallSyntax::Tagged), 1);
    }

    const BARE: Option<CallSyntax> = Some(CallSyntax::BareJson);

    /// Llama 3's bare calls: the answer's leading objects that are calls (under
    /// `parameters` or `arguments`, after the python tag or not, `;`-separated), the
    /// text after them as content; anything else is content, whole.
    #[test]
    fn bare_calls_are_read_from_the_start_of_the_answer() {
        let one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let (content, calls) = read_answer(one, BARE);
        assert_eq!(content, None);
        assert_eq!(
            calls,
            [ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into()
            }]
        );
        let two = format!(
            "<|python_tag|>{one}; {{\"name\": \"f\", \"arguments\": {{\"a\": [1]}}}}\nDone."
        );
        let (content, calls) = read_answer(&two, BARE);
        assert_eq!(content.as_deref(), Some("Done."));
        assert_eq!(calls.len(), 2);
        assert_eq!(
            serde_json::from_str::<Value>(&calls[1].arguments).unwrap(),
            json!({"a": [1]})
        );
        // Text, and a JSON answer that is not a call, are content as written.
        for text in [
            " It is sunny in {Paris}.",
            "{\"temperature\": 22}",
            "{\"name\": \"Ada\", \"age\": 36}",
            "",
        ] {
            assert_eq!(read_answer(text, BARE), (Some(text.to_string()), vec![]));
        }
        // A call cut off by max_tokens is dropped; an object cut off that is not a call
        // stays content.
        let cut = "{\"name\": \"get_weather\", \"parameters\": {\"ci";
        assert_eq!(read_answer(cut, BARE), (None, vec![]));
        let (content, calls) = read_answer(&format!("{one}\n{cut}"), BARE);
        assert_eq!((content, calls.len()), (None, 1));
        assert_eq!(
            read_answer("{\"rows\": [1, 2", BARE),
            (Some("{\"rows\": [1, 2".into()), vec![])
        );
    }

    /// Streamed, a bare call's text never goes out as content, and its fragments add up
    /// to the arguments the whole answer reads; text that cannot be a call streams.
    #[test]
    fn bare_calls_stream_as_name_then_argument_fragments() {
        let full = "{\"name\": \"f\", \"parameters\": {\"a\": {\"b\": \"}}\"}, \"c\": 2}}";
        for end in (0..=full.len()).filter(|&e| full.is_char_boundary(e)) {
            assert_eq!(streamable_len(&full[..end], CallSyntax::BareJson), 0);
        }
        let streamed = stream_every_prefix(full, CallSyntax::BareJson);
        let (_, calls) = read_answer(full, BARE);
        assert_eq!(streamed.len(), 1, "one head");
        assert_eq!(streamed[0].name, "f");
        let args = &streamed[0].arguments;
        assert_eq!(*args, calls[0].arguments);
        assert_eq!(args, "{\"a\": {\"b\": \"}}\"}, \"c\": 2}");
        // What may still open a call waits; text that cannot streams whole.
        for held in ["", "  ", "\n{", "<|py", "<|python_tag|>{\"na"] {
            assert_eq!(streamable_len(held, CallSyntax::BareJson), 0, "{held:?}");
        }
        for text in ["Hello", " It is {x}", "<b>"] {
            assert_eq!(streamable_len(text, CallSyntax::BareJson), text.len());
        }
    }

    const LIST: Option<CallSyntax> = Some(CallSyntax::ToolCallsList);

    /// Mistral's list: read whether the tokenizer's text shows `[TOOL_CALLS]` (a text
    /// token) or not (a control token, skipped in the text), with or without the space
    /// before the bracket; text after the list is content; a list that is not calls is
    /// content, whole.
    #[test]
    fn mistral_lists_are_read_with_or_without_their_marker() {
        let list =
            "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]";
        for text in [
            format!("[TOOL_CALLS] {list}"),
            format!(" {list}"),
            format!("[TOOL_CALLS]{list}"),
        ] {
            let (content, calls) = read_answer(&text, LIST);
            assert_eq!(content, None, "{text}");
            let names: Vec<_> = calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["f", "g"], "{text}");
            assert_eq!(calls[0].arguments, "{\"a\": 1}");
        }
        let (content, calls) = read_answer(&format!("{list}\nDone."), LIST);
        assert_eq!((content.as_deref(), calls.len()), (Some("Done."), 2));
        for text in [
            "[1, 2, 3]",
            "Sure: [{\"name\": \"f\", \"arguments\": {}}]",
            "[{\"a\": 1}]",
        ] {
            assert_eq!(read_answer(text, LIST), (Some(text.to_string()), vec![]));
        }
        // The list cut off in its second call keeps the first.
        let cut = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"argu";
        assert_eq!(read_answer(cut, LIST).1.len(), 1);
        assert_eq!(read_answer(cut, LIST).0, None);
    }

    /// Streamed, each call of the list goes out as its head, then fragments adding up
    /// to what the whole answer reads, under its own index; ids are nine letters and
    /// digits, as Mistral's templates take them back.
    #[test]
    fn mistral_lists_stream_call_by_call() {
        let full = " [{\"name\": \"f\", \"arguments\": {\"a\": \"]}\"}}, {\"name\": \"g\", \"arguments\": {\"b\": [2]}}]";
        for end in (0..=full.len()).filter(|&e| full.is_char_boundary(e)) {
            assert_eq!(streamable_len(&full[..end], CallSyntax::ToolCallsList), 0);
        }
        let streamed = stream_every_prefix(full, CallSyntax::ToolCallsList);
        for c in &streamed {
            let id = &c.id;
            assert!(
                id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{id}"
            );
        }
        let (_, calls) = read_answer(full, LIST);
        let names: Vec<_> = streamed.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        let args: Vec<_> = streamed.iter().map(|c| c.arguments.clone()).collect();
        assert_eq!(
            args,
            [calls[0].arguments.clone(), calls[1].arguments.clone()]
        );
        assert_eq!(args[0], "{\"a\": \"]}\"}");
        for held in ["", " ", "[TOOL", "[TOOL_CALLS]", " [{\"na"] {
            assert_eq!(
                streamable_len(held, CallSyntax::ToolCallsList),
                0,
                "{held:?}"
            );
        }
        for text in ["Hello", " It is {x}", "(see [1])"] {
            assert_eq!(streamable_len(text, CallSyntax::ToolCallsList), text.len());
        }
    }

    const NAMED: Option<CallSyntax> = Some(CallSyntax::NamedArgs);

    /// Mistral's newer calls: text before the first `[TOOL_CALLS]` (and after the last
    /// call) is content, each call's arguments are its object as written; a call cut
    /// off is dropped, markup and all.
    #[test]
    fn mistral_s_newer_calls_are_read_after_the_text() {
        let two = "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[CALL_ID]abcdefgh1[ARGS]{}";
        for (text, content) in [
            (two.to_string(), None),
            (format!("Let me look.\n{two}"), Some("Let me look.")),
            (format!("{two} Done."), Some("Done.")),
        ] {
            let (read, calls) = read_answer(&text, NAMED);
            assert_eq!(read.as_deref(), content, "{text}");
            let names: Vec<_> = calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["f", "g"], "{text}");
            assert_eq!(calls[0].arguments, "{\"a\": 1}");
        }
        let cut = "Sure.[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{\"b";
        assert_eq!(read_answer(cut, NAMED).0.as_deref(), Some("Sure."));
        assert_eq!(read_answer(cut, NAMED).1.len(), 1);
        for text in ["It is {\"sunny\"} [ARGS]", ""] {
            assert_eq!(read_answer(text, NAMED), (Some(text.to_string()), vec![]));
        }
        assert_eq!(read_answer("[TOOL_CALLS]f[ARGS][1]", NAMED), (None, vec![]));
    }

    /// Streamed: the text before the calls as content (less what may open one), each
    /// call as its head once its name is written, then fragments adding up to what the
    /// whole answer reads; a call that may still repeat an earlier one waits.
    #[test]
    fn mistral_s_newer_calls_stream_call_by_call() {
        let calls = "[TOOL_CALLS]f[ARGS]{\"a\": \"}[TOOL_CALLS]\"}[TOOL_CALLS]g[ARGS]{\"b\": [2]}";
        let full = format!("Let me look. {calls}");
        let streamed = stream_every_prefix(&full, CallSyntax::NamedArgs);
        let (content, read) = read_answer(&full, NAMED);
        assert_eq!(content.as_deref(), Some("Let me look."));
        let names: Vec<_> = streamed.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(streamed[0].arguments, read[0].arguments);
        assert_eq!(streamed[1].arguments, read[1].arguments);
        assert_eq!(streamed[0].arguments, "{\"a\": \"}[TOOL_CALLS]\"}");
        assert!(streamed.iter().all(|c| c.id.len() == 9));
        for (text, len) in [
            ("Hello", 5),
            ("Hello [TOOL", 5),
            ("Hello \n[TOOL_CALLS]f", 5),
            ("see [1]", 7),
        ] {
            assert_eq!(streamable_len(text, CallSyntax::NamedArgs), len, "{text:?}");
        }
        let repeat = "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]f[ARGS]{\"a\": ";
        assert_eq!(stream_every_prefix(repeat, CallSyntax::NamedArgs).len(), 1);
        let diverged = format!("{repeat}2}}");
        assert_eq!(
            stream_every_prefix(&diverged, CallSyntax::NamedArgs).len(),
            2
        );
    }
}
