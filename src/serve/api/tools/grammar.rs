//! The grammar an answer is held to, in the form the model writes calls: `<tool_call>`
//! blocks, Llama 3's bare object, Mistral's list or its newer calls; free text before
//! a call with `auto`, a response format beside calls.

use serde_json::{Value, json};

use super::{CALL_CLOSE, CALL_OPEN, Tool, ToolChoice, ToolPlan, call_schema, close_objects};
use crate::chat::{ARGS_TOKEN, CallSyntax, TOOL_CALLS_TOKEN};
use crate::engine::grammar::{GrammarSpec, lark_marker, with_json_layout};

impl ToolPlan {
    /// The grammar the answer is held to: the calls when they are required; either the
    /// response format or calls when both are possible; with `auto` alone, free text
    /// until the model opens a call, and from there calls only (a lazy grammar: text
    /// never holds a call's opening, so a call that starts is a valid call).
    pub(in crate::serve::api) fn grammar(
        &self,
        response_format: Option<&GrammarSpec>,
    ) -> Option<GrammarSpec> {
        let candidates: Vec<&Tool> = match &self.choice {
            ToolChoice::None => return response_format.cloned(),
            ToolChoice::Named(name) => self
                .tools
                .iter()
                .filter(|t| t.function.name == *name)
                .collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        };
        // The forms that embed a whole call object (Mistral's newer calls embed only
        // each tool's arguments).
        let call_schema = || with_json_layout(call_schema(&candidates, self.form.syntax));
        let auto = self.choice == ToolChoice::Auto;
        let format_schema = match response_format {
            None => None,
            Some(GrammarSpec::JsonObject) => Some(with_json_layout(json!({"type": "object"}))),
            Some(GrammarSpec::JsonSchema(s)) => Some(with_json_layout(s.clone())),
            // Never built from a request.
            Some(format @ GrammarSpec::Lark(_)) => return Some(format.clone()),
        };
        let lark = match self.form.syntax {
            CallSyntax::Tagged => self.tagged_grammar(&call_schema(), auto, format_schema),
            CallSyntax::BareJson => bare_grammar(&call_schema(), auto, format_schema),
            CallSyntax::ToolCallsList => self.list_grammar(&call_schema(), auto, format_schema),
            CallSyntax::NamedArgs => self.named_grammar(&candidates, auto, format_schema),
        };
        Some(GrammarSpec::Lark(lark))
    }

    /// [`ToolPlan::grammar`] for calls in `<tool_call>` blocks.
    fn tagged_grammar(&self, call_schema: &Value, auto: bool, format: Option<Value>) -> String {
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
        match (auto, format) {
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
            (true, Some(schema)) => {
                lark.push_str(&format!("start: answer | calls\nanswer: %json {schema}\n"));
            }
            _ => lark.push_str("start: calls\n"),
        }
        lark
    }

    /// [`ToolPlan::grammar`] for Mistral's list: its control token (or its text), the
    /// calls in brackets; with `auto`, text that does not open the list, or the list.
    fn list_grammar(&self, call_schema: &Value, auto: bool, format: Option<Value>) -> String {
        let calls = if self.parallel && !matches!(self.choice, ToolChoice::Named(_)) {
            "call (\", \" call)*"
        } else {
            "call"
        };
        let opening = lark_marker(self.form.tool_calls_token, TOOL_CALLS_TOKEN);
        let mut lark =
            format!("calls: {opening} \" \"? \"[\" {calls} \"]\"\ncall: %json {call_schema}\n");
        match (auto, format) {
            // A control token is never text: any text is prose.
            (true, None) if self.form.tool_calls_token.is_some() => {
                lark.push_str("start: PROSE | calls\nPROSE: /(?s:.*)/\n");
            }
            (true, None) => lark.push_str(&format!(
                "start: PROSE | calls\nPROSE: /(?s:.*)/ & ~/(?s:\\s*{}.*)/\n",
                regex_literal(TOOL_CALLS_TOKEN)
            )),
            (true, Some(schema)) => {
                lark.push_str(&format!("start: answer | calls\nanswer: %json {schema}\n"));
            }
            _ => lark.push_str("start: calls\n"),
        }
        lark
    }

    /// [`ToolPlan::grammar`] for Mistral's newer calls: each `[TOOL_CALLS]`, a tool's
    /// name, `[ARGS]` and its arguments (markers as control tokens or text); with
    /// `auto`, text that holds no `[TOOL_CALLS]`, then perhaps calls.
    fn named_grammar(&self, candidates: &[&Tool], auto: bool, format: Option<Value>) -> String {
        let opening = lark_marker(self.form.tool_calls_token, TOOL_CALLS_TOKEN);
        let args = lark_marker(self.form.args_token, ARGS_TOKEN);
        let several = self.parallel && !matches!(self.choice, ToolChoice::Named(_));
        let more = if several { " call*" } else { "" };
        let mut lark = format!(
            "calls: call{more}
call: {opening} call_rest
call_rest: "
        );
        let names: Vec<String> = (0..candidates.len()).map(|i| format!("tool_{i}")).collect();
        lark.push_str(&names.join(" | "));
        lark.push('\n');
        for (name, tool) in names.iter().zip(candidates) {
            // The arguments are a document of their own: references into the tool's
            // schema (`#/$defs/..`) resolve as they are.
            let mut arguments = tool.parameters();
            close_objects(&mut arguments);
            lark.push_str(&format!(
                "{name}: {:?} {args} %json {}\n",
                tool.function.name,
                with_json_layout(arguments)
            ));
        }
        // Text never holds the opening's text either: whatever reads as a call was held
        // to the grammar.
        let no_opening = format!("~/(?s:.*{}.*)/", regex_literal(TOOL_CALLS_TOKEN));
        match (auto, format) {
            // A control token is never text: text, then perhaps calls.
            (true, None) if self.form.tool_calls_token.is_some() => lark.push_str(&format!(
                "start: PROSE | PROSE calls | calls\nPROSE: /(?s:.+)/ & {no_opening}\n"
            )),
            // Text up to the first opening (a lazy lexeme, which ends there), the rest
            // of that call, and perhaps more.
            (true, None) => lark.push_str(&format!(
                "start: PROSE | prose_to_opening call_rest{more}\n\
                 PROSE: /(?s:.*)/ & {no_opening}\n\
                 prose_to_opening[suffix={TOOL_CALLS_TOKEN:?}]: /(?s:.*)/\n"
            )),
            (true, Some(schema)) => {
                lark.push_str(&format!("start: answer | calls\nanswer: %json {schema}\n"));
            }
            _ => lark.push_str("start: calls\n"),
        }
        lark
    }
}

/// [`ToolPlan::grammar`] for Llama 3's bare call: the answer is one call; with `auto`,
/// either text that does not start with `{` or the call.
fn bare_grammar(call_schema: &Value, auto: bool, format: Option<Value>) -> String {
    let mut lark = format!("call: %json {call_schema}\n");
    match (auto, format) {
        (true, None) => lark
            .push_str("start: PROSE | LEAD? call\nPROSE: /(?s:\\s*([^\\s{].*)?)/\nLEAD: /\\s+/\n"),
        (true, Some(schema)) => {
            lark.push_str(&format!("start: answer | call\nanswer: %json {schema}\n"));
        }
        _ => lark.push_str("start: call\n"),
    }
    lark
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
