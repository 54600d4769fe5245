//! Thinking models through the API (Qwen 3, QwQ, DeepSeek-R1's distillations, SmolLM3):
//! their thoughts go out as `reasoning_content`, apart from the answer, as vLLM's
//! reasoning parsers and llama.cpp's `--reasoning-format` send them; calls are read from
//! the answer only; and a grammar (a response format, required tool calls) holds the
//! answer after the thoughts, not the thoughts, so the model still thinks first.

use crate::chat::{PromptPiece, ThoughtMarkers, ThoughtSplit, ThoughtStream};
use crate::engine::grammar::{GrammarSpec, lark_marker, with_json_layout};
use crate::serve::AppState;

/// How a request's answer thinks: the model's markers (and their control tokens, where
/// the tokenizer has them so: Magistral's), and whether its prompt opened them (the
/// answer then starts inside its thoughts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Thinking {
    markers: ThoughtMarkers,
    open_token: Option<u32>,
    close_token: Option<u32>,
    opened: bool,
}

impl Thinking {
    /// For a chat prompt of the served model; None when the server leaves thoughts in
    /// the content (`--reasoning-format none`), the model is not taught to think, or
    /// the prompt closed its thoughts already (Qwen 3's `enable_thinking: false`).
    pub(super) fn of_prompt(app: &AppState, prompt: &[PromptPiece]) -> Option<Self> {
        let markers = app.thoughts?;
        // The generation prompt is the template's: the last piece is markup.
        let tail = match prompt.last() {
            Some(PromptPiece::Markup(m)) => m.as_str(),
            _ => "",
        };
        if tail.trim_end().ends_with(markers.close) {
            return None;
        }
        let control = |marker: &str| {
            let tokenizer = &app.tokenizer;
            tokenizer
                .token_id(marker)
                .filter(|&id| tokenizer.is_control(id))
        };
        Some(Self {
            markers,
            open_token: control(markers.open),
            close_token: control(markers.close),
            opened: markers.opened_by(tail),
        })
    }

    /// A whole answer's thoughts and the rest.
    pub(super) fn split<'a>(&self, text: &'a str) -> ThoughtSplit<'a> {
        self.markers.split(text, self.opened)
    }

    /// A streamed answer's reader.
    pub(super) fn stream(&self) -> ThoughtStream {
        ThoughtStream::new(self.markers, self.opened)
    }

    /// `answer`, the grammar the answer is held to, with the thoughts before it free:
    /// any text up to the closing marker (whose first occurrence ends them), in the
    /// opening marker when the prompt did not open them, or none at all; whitespace may
    /// follow them.
    pub(super) fn grammar(&self, answer: &GrammarSpec) -> GrammarSpec {
        let answer = match answer {
            GrammarSpec::JsonObject => format!(
                "%json {}",
                with_json_layout(serde_json::json!({"type": "object"}))
            ),
            GrammarSpec::JsonSchema(schema) => {
                format!("%json {}", with_json_layout(schema.clone()))
            }
            GrammarSpec::Lark(lark) => format!("%lark {{\n{lark}\n}}"),
        };
        let (open, close) = (self.markers.open, self.markers.close);
        let thoughts = match (self.open_token, self.close_token) {
            // Control tokens are never text, so the thoughts' text cannot hold them: a
            // greedy lexeme between the two tokens.
            (Some(_), Some(_)) => {
                let open = match self.opened {
                    true => String::new(),
                    false => lark_marker(self.open_token, open) + " ",
                };
                let close = lark_marker(self.close_token, close);
                format!("thoughts: {open}THOUGHT_TEXT? {close}\nTHOUGHT_TEXT: /(?s:.+)/\n")
            }
            // Text markers: a lazy lexeme, which ends at the first closing marker.
            _ if self.opened => format!("thoughts[lazy]: /(?s:.*)/ {close:?}\n"),
            _ => format!("thoughts[lazy]: {open:?} /(?s:.*)/ {close:?}\n"),
        };
        let start = if self.opened {
            "start: thoughts GAP? answer\n"
        } else {
            "start: answer | thoughts GAP? answer\n"
        };
        GrammarSpec::Lark(format!("{start}{thoughts}GAP: /\\s+/\nanswer: {answer}\n"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::CallSyntax;
    use crate::serve::api::tools::CallForm;
    use crate::serve::api::tools::grammar_tests::{
        added, allows, compiler, takes, weather_plan, with_mistral_tokens,
    };

    const THINK: ThoughtMarkers = ThoughtMarkers::THINK;

    /// A grammar after thoughts takes thoughts (of any text, markup and braces and a
    /// call's opening included) then the answer it holds, or the answer alone; it
    /// refuses an answer that breaks the grammar after them.
    #[test]
    fn a_grammar_holds_the_answer_after_the_thoughts() {
        let (compiler, tok, eos) = compiler();
        let whole = |grammar: &crate::engine::grammar::Grammar, text: &str| {
            let mut c = grammar.start();
            for &t in &tok.encode_literal(text).unwrap() {
                if !allows(&mut c, t) {
                    return false;
                }
                c.advance(t).unwrap();
            }
            allows(&mut c, eos)
        };
        let thinking = Thinking {
            markers: THINK,
            open_token: None,
            close_token: None,
            opened: false,
        };
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false});
        let format = compiler
            .compile(&thinking.grammar(&GrammarSpec::JsonSchema(schema.clone())))
            .unwrap();
        assert!(whole(
            &format,
            "<think>\nSay {\"a\": 1}? <tool_call> maybe.\n</think>\n\n{\"a\": 1}"
        ));
        assert!(whole(&format, "{\"a\": 1}"));
        assert!(!takes(&format, &tok, "<think>x</think>\n\n{\"b\""));
        assert!(
            !whole(&format, "<think>x</think>"),
            "thoughts without the answer"
        );

        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let required = weather_plan(json!("required"), false, CallForm::text(CallSyntax::Tagged))
            .grammar(None)
            .unwrap();
        let calls = compiler.compile(&thinking.grammar(&required)).unwrap();
        assert!(whole(
            &calls,
            &format!("<think>\nParis, then.\n</think>\n\n{call}")
        ));
        assert!(whole(&calls, call));
        assert!(!takes(&calls, &tok, "<think>\nok</think>\n\nSunny"));

        // A prompt that opened the thoughts: the answer starts inside them.
        let opened = Thinking {
            markers: THINK,
            opened: true,
            ..thinking
        };
        let format = compiler
            .compile(&opened.grammar(&GrammarSpec::JsonSchema(schema)))
            .unwrap();
        assert!(whole(&format, "Plan.\n</think>\n\n{\"a\": 2}"));
        assert!(!whole(&format, "{\"a\": 2}"), "the thoughts must close");
    }

    /// Magistral's `[THINK]` and `[/THINK]` are control tokens: answers show them (so the
    /// thoughts are found; `chat::ANSWER_MARKUP`), and a grammar after the thoughts takes
    /// them as their tokens.
    #[test]
    fn control_token_markers_are_shown_and_held_as_tokens() {
        let (_, plain, eos) = compiler();
        let (tok, compiler) = with_mistral_tokens(&plain);
        let (open, close) = (added("[THINK]"), added("[/THINK]"));
        let markers = ThoughtMarkers::MISTRAL;
        let mut ids = vec![open];
        ids.extend(tok.encode_literal("Paris.").unwrap());
        ids.push(close);
        ids.extend(tok.encode_literal("{\"a\": 1}").unwrap());
        ids.push(eos);
        let text = tok.decode(&ids, true).unwrap();
        assert_eq!(
            text, "[THINK]Paris.[/THINK]{\"a\": 1}",
            "other control tokens go"
        );
        let split = markers.split(&text, false);
        assert_eq!(
            (split.thoughts, split.answer),
            (Some("Paris."), "{\"a\": 1}")
        );

        let thinking = Thinking {
            markers,
            open_token: Some(open),
            close_token: Some(close),
            opened: false,
        };
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false});
        let grammar = compiler
            .compile(&thinking.grammar(&GrammarSpec::JsonSchema(schema)))
            .unwrap();
        let mut c = grammar.start();
        assert!(allows(&mut c, open), "the thoughts open with their token");
        c.advance(open).unwrap();
        for &t in &tok.encode_literal("Say [/THINK] as text.").unwrap() {
            assert!(allows(&mut c, t));
            c.advance(t).unwrap();
        }
        assert!(allows(&mut c, close));
        c.advance(close).unwrap();
        for &t in &tok.encode_literal("{\"a\": 1}").unwrap() {
            assert!(allows(&mut c, t));
            c.advance(t).unwrap();
        }
        assert!(allows(&mut c, eos));
        assert!(!takes(&grammar, &tok, "[THINK]"), "not as text");
    }
}
