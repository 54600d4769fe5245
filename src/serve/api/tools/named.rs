//! Mistral's newer calls ([`CallSyntax::NamedArgs`](crate::chat::CallSyntax)): after
//! any text, each call its own `[TOOL_CALLS]name[ARGS]{..}`, the name bare and the
//! arguments the JSON object itself; `[CALL_ID]` and an id may stand before `[ARGS]`
//! (what templates that render ids teach). Reading a whole answer and streaming one
//! both go through [`calls_in`], so they always agree.

use serde_json::Value;

use crate::chat::{ARGS_TOKEN, CALL_ID_TOKEN, TOOL_CALLS_TOKEN};

/// One call in an answer's text, whole or still being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NamedCall<'a> {
    /// Its text from its `[TOOL_CALLS]` to the end of its arguments so far.
    pub block: &'a str,
    /// The function.
    pub name: &'a str,
    /// Its arguments so far: the object's text from its `{`.
    pub arguments: &'a str,
    /// Whether the object is closed (then `arguments` is all of it).
    pub closed: bool,
}

/// The calls in `text`, from its first `[TOOL_CALLS]` on, whose names are written (an
/// open one last), and the text after the last one when it is closed and no call
/// follows. A call whose arguments are not an object ends the calls, dropped with
/// everything after it: call markup never becomes content.
pub(super) fn calls_in(text: &str) -> (Vec<NamedCall<'_>>, Option<&str>) {
    let mut calls = Vec::new();
    let Some(first) = text.find(TOOL_CALLS_TOKEN) else {
        return (calls, None);
    };
    let mut rest = &text[first..];
    while let Some(after_opening) = rest.strip_prefix(TOOL_CALLS_TOKEN) {
        let Some(args_at) = after_opening.find(ARGS_TOKEN) else {
            return (calls, None);
        };
        let head = &after_opening[..args_at];
        // An opening without its `[ARGS]` before the next: not a call.
        if head.contains(TOOL_CALLS_TOKEN) {
            return (calls, None);
        }
        let name = head.split(CALL_ID_TOKEN).next().unwrap_or(head).trim();
        let body = &after_opening[args_at + ARGS_TOKEN.len()..];
        let arguments = body.trim_start();
        let arguments_at = rest.len() - arguments.len();
        let mut values = serde_json::Deserializer::from_str(arguments).into_iter::<Value>();
        let (end, closed) = match values.next() {
            Some(Ok(Value::Object(_))) => (values.byte_offset(), true),
            None => (0, false),
            Some(Err(e)) if e.is_eof() && arguments.starts_with('{') => (arguments.len(), false),
            Some(_) => return (calls, None),
        };
        if name.is_empty() {
            return (calls, None);
        }
        calls.push(NamedCall {
            block: &rest[..arguments_at + end],
            name,
            arguments: &arguments[..end],
            closed,
        });
        if !closed {
            return (calls, None);
        }
        rest = arguments[end..].trim_start();
    }
    (calls, Some(rest))
}

/// Where the answer's calls start: its first `[TOOL_CALLS]`.
pub(super) fn calls_start(text: &str) -> Option<usize> {
    text.find(TOOL_CALLS_TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}"#;

    #[test]
    fn calls_are_read_one_after_another() {
        let text = format!("Let me look.{CALL}[TOOL_CALLS]now[CALL_ID]a1B2c3D4e[ARGS] {{}}");
        let (calls, after) = calls_in(&text);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city": "Paris"}"#);
        assert_eq!(calls[0].block, CALL);
        assert!(calls[0].closed);
        assert_eq!(
            (calls[1].name, calls[1].arguments, calls[1].closed),
            ("now", "{}", true)
        );
        assert_eq!(after, Some(""));
        assert_eq!(calls_start(&text), Some("Let me look.".len()));
    }

    /// While a call is written: no call until its `[ARGS]`, then its arguments so far;
    /// an object nested in them does not close it.
    #[test]
    fn an_open_call_shows_what_is_written() {
        assert_eq!(calls_in("[TOOL_CALLS]get_wea"), (vec![], None));
        let (calls, after) = calls_in("[TOOL_CALLS]get_weather[ARGS]");
        assert_eq!(
            (calls[0].arguments, calls[0].closed, after),
            ("", false, None)
        );
        let open = r#"[TOOL_CALLS]f[ARGS]{"a": {"b": 1}, "c": "}"#;
        let (calls, after) = calls_in(open);
        assert_eq!(calls[0].arguments, r#"{"a": {"b": 1}, "c": "}"#);
        assert_eq!(
            (calls[0].closed, calls[0].block, after),
            (false, open, None)
        );
    }

    /// Text after the last call is returned; a call whose arguments are no object ends
    /// the calls, and nothing after it is returned.
    #[test]
    fn what_follows_the_calls() {
        let done = format!("{CALL} Done.");
        let (calls, after) = calls_in(&done);
        assert_eq!((calls.len(), after), (1, Some("Done.")));
        let broken = format!("{CALL}[TOOL_CALLS]f[ARGS][1] x");
        let (calls, after) = calls_in(&broken);
        assert_eq!((calls.len(), after), (1, None));
        let (calls, after) = calls_in("[TOOL_CALLS][ARGS]{}");
        assert_eq!((calls.len(), after), (0, None), "a call without a name");
        let (calls, after) = calls_in("[TOOL_CALLS]f [TOOL_CALLS]g[ARGS]{}");
        assert_eq!(
            (calls.len(), after),
            (0, None),
            "an opening without its [ARGS]"
        );
        assert_eq!(calls_in("No calls [TOOL"), (vec![], None));
    }
}
