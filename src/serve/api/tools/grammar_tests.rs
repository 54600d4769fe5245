//! The lazy `auto` grammar ([`ToolPlan::grammar`]) compiled for the default model's
//! tokenizer (installed by tools/setup.sh): free text, and from a call's opening on, a
//! valid call of the offered tools only.

use super::*;
use crate::engine::grammar::GrammarCompiler;
use crate::model::tokenizer::ModelTokenizer;

pub(in crate::serve::api) fn compiler() -> (GrammarCompiler, ModelTokenizer, u32) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut file = std::fs::File::open(path).expect("run tools/setup.sh");
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let tokenizer = ModelTokenizer::from_gguf(&content).unwrap();
    let eos = tokenizer.token_id("<|im_end|>").unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, 49152, &[eos]).unwrap();
    (compiler, tokenizer, eos)
}

/// A plan offering one tool, `get_weather(city)`, for a model writing calls in `form`.
pub(in crate::serve::api) fn weather_plan(
    choice: Value,
    parallel: bool,
    form: CallForm,
) -> ToolPlan {
    let tools = serde_json::from_value(json!([{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}]))
    .unwrap();
    ToolPlan::from_request(Some(tools), Some(&choice), Some(parallel), form)
        .unwrap()
        .unwrap()
}

fn auto_plan(parallel: bool) -> ToolPlan {
    weather_plan(json!("auto"), parallel, CallForm::text(CallSyntax::Tagged))
}

/// Whether the constraint allows `token` next.
pub(in crate::serve::api) fn allows(
    c: &mut crate::engine::grammar::Constraint,
    token: u32,
) -> bool {
    // Room past the default vocabulary for added tokens.
    let mut logits = vec![0.0f32; 49152 + ADDED.len()];
    c.mask_logits(&mut logits).unwrap();
    logits[token as usize].is_finite()
}

#[test]
fn auto_leaves_text_free_and_holds_an_opened_call_to_the_tools() {
    let (compiler, tok, eos) = compiler();
    for parallel in [true, false] {
        let spec = auto_plan(parallel)
            .grammar(None)
            .expect("auto has a grammar");
        let grammar = compiler.compile(&spec).unwrap();

        // Text that never opens a call is free, markup and all, and may end anywhere.
        let mut c = grammar.start();
        for &t in &tok
            .encode_text("Sure: <b>22°C</b> in Paris, {\"a\": 1} <tool")
            .unwrap()
        {
            assert!(allows(&mut c, t), "text token {t} refused");
            c.advance(t).unwrap();
        }
        assert!(allows(&mut c, eos), "free text may end");

        // Once the opening is written, only a call of the tools follows.
        let mut c = grammar.start();
        for &t in &tok.encode_text("Let me check.<tool_call>").unwrap() {
            c.advance(t).unwrap();
        }
        let prose = tok.encode_text(" I think").unwrap()[0];
        assert!(!allows(&mut c, prose), "text after the opening");
        assert!(!allows(&mut c, eos), "the opening without a call");
        let call =
            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        for &t in &tok.encode_text(call).unwrap() {
            assert!(allows(&mut c, t), "call token {t} refused");
            c.advance(t).unwrap();
        }
        assert!(allows(&mut c, eos), "the answer may end after its call");
        let wrong = tok.encode_text("\n{\"name\": \"get_time\"").unwrap();
        let mut c = grammar.start();
        for &t in &tok.encode_text("<tool_call>").unwrap() {
            c.advance(t).unwrap();
        }
        let refused = wrong.iter().any(|&t| {
            let ok = allows(&mut c, t);
            if ok {
                c.advance(t).unwrap();
            }
            !ok
        });
        assert!(refused, "a call of a tool that is not offered");
    }
}

fn bare_plan(choice: Value) -> ToolPlan {
    weather_plan(choice, false, CallForm::text(CallSyntax::BareJson))
}

/// Feeds `text` (as text: a control token's spelling is its characters) to a fresh
/// constraint of `grammar`; false at the first token refused.
pub(in crate::serve::api) fn takes(
    grammar: &crate::engine::grammar::Grammar,
    tok: &ModelTokenizer,
    text: &str,
) -> bool {
    let mut c = grammar.start();
    for &t in &tok.encode_literal(text).unwrap() {
        if !allows(&mut c, t) {
            return false;
        }
        c.advance(t).unwrap();
    }
    true
}

/// Llama 3's form: `required` is one bare call with its arguments under `parameters`
/// and nothing after it; `auto` is text that does not start with `{`, or that call.
#[test]
fn bare_calls_are_one_object_with_parameters() {
    let (compiler, tok, eos) = compiler();
    let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    let required = compiler
        .compile(&bare_plan(json!("required")).grammar(None).unwrap())
        .unwrap();
    let mut c = required.start();
    assert!(!allows(&mut c, eos), "a required call cannot be skipped");
    assert!(takes(&required, &tok, call));
    assert!(!takes(&required, &tok, "Sure, "), "no text before the call");
    assert!(!takes(
        &required,
        &tok,
        "{\"name\": \"get_weather\", \"arguments\": {"
    ));
    assert!(!takes(&required, &tok, "{\"name\": \"get_time\""));
    let mut c = required.start();
    for &t in &tok.encode_text(call).unwrap() {
        c.advance(t).unwrap();
    }
    assert!(allows(&mut c, eos), "the answer ends after its call");
    let more = tok.encode_text("; {").unwrap()[0];
    assert!(!allows(&mut c, more), "one call per answer");

    let auto = compiler
        .compile(&bare_plan(json!("auto")).grammar(None).unwrap())
        .unwrap();
    assert!(takes(
        &auto,
        &tok,
        "It is sunny in {Paris}; see <tool_call>."
    ));
    assert!(takes(&auto, &tok, call));
    assert!(
        takes(&auto, &tok, &format!("\n\n{call}")),
        "a call after newlines"
    );
    assert!(takes(&auto, &tok, "\n\nIt is sunny."));
    let mut c = auto.start();
    for &t in &tok.encode_literal(&format!("\n{call}")).unwrap() {
        c.advance(t).unwrap();
    }
    assert!(allows(&mut c, eos), "the answer ends after its call");
    let mut c = auto.start();
    for &t in &tok.encode_literal("\n Sunny.").unwrap() {
        c.advance(t).unwrap();
    }
    assert!(allows(&mut c, eos), "text may end");
    assert!(
        !takes(&auto, &tok, "{\"temperature\": 22}"),
        "an object is a call"
    );
    assert!(!takes(&auto, &tok, "\n{\"temperature\": 22}"));
    let mut c = auto.start();
    assert!(allows(&mut c, eos), "the empty answer");
}

/// The control tokens [`with_mistral_tokens`] adds, from id 49152 on.
const ADDED: [&str; 4] = ["[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"];

/// The default tokenizer with Mistral's markers ([`ADDED`]) added as control tokens,
/// as Mistral's tokenizers have them, and a grammar compiler for it.
pub(in crate::serve::api) fn with_mistral_tokens(
    tok: &ModelTokenizer,
) -> (ModelTokenizer, GrammarCompiler) {
    let mut json: Value = serde_json::from_str(&tok.to_json().unwrap()).unwrap();
    for (i, marker) in ADDED.iter().enumerate() {
        json["added_tokens"].as_array_mut().unwrap().push(json!({
            "id": 49152 + i, "content": marker, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}));
    }
    let tok = ModelTokenizer::from_json(&json.to_string()).unwrap();
    let eos = tok.token_id("<|im_end|>").unwrap();
    let compiler = GrammarCompiler::new(&tok, 49152 + ADDED.len(), &[eos]).unwrap();
    (tok, compiler)
}

/// The id of `marker` in [`with_mistral_tokens`]' tokenizer.
pub(in crate::serve::api) fn added(marker: &str) -> u32 {
    49152 + ADDED.iter().position(|m| *m == marker).unwrap() as u32
}

fn list_plan(choice: Value, form: CallForm) -> ToolPlan {
    weather_plan(choice, true, form)
}

/// Mistral's list: with `[TOOL_CALLS]` a control token, `required` starts with that
/// token and a list of calls follows (one or more, each with `arguments`); `auto`
/// leaves text free (the token is never text) and holds the list once the token is
/// chosen. With the token as text (the default tokenizer), the same in text.
#[test]
fn mistral_lists_open_with_their_control_token() {
    let (_, plain, eos) = compiler();
    let (tok, with_token) = with_mistral_tokens(&plain);
    let opening = added("[TOOL_CALLS]");
    assert!(tok.is_control(opening));
    let form = CallForm {
        syntax: CallSyntax::ToolCallsList,
        tool_calls_token: Some(opening),
        args_token: None,
    };
    let call = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
    let list = format!(" [{call}, {call}]");
    let required = with_token
        .compile(&list_plan(json!("required"), form).grammar(None).unwrap())
        .unwrap();
    let mut c = required.start();
    assert!(allows(&mut c, opening), "the list opens with the token");
    let text = tok.encode_text("[").unwrap()[0];
    assert!(!allows(&mut c, text), "not with text");
    c.advance(opening).unwrap();
    for &t in &tok.encode_text(&list).unwrap() {
        assert!(allows(&mut c, t), "list token {t} refused");
        c.advance(t).unwrap();
    }
    assert!(allows(&mut c, eos), "the answer ends after the list");

    let auto = with_token
        .compile(&list_plan(json!("auto"), form).grammar(None).unwrap())
        .unwrap();
    assert!(takes(
        &auto,
        &tok,
        "[TOOL_CALLS] as text, and [1, 2] are prose."
    ));
    let mut c = auto.start();
    assert!(allows(&mut c, opening), "auto may open the list");
    c.advance(opening).unwrap();
    let prose = tok.encode_text(" I think").unwrap()[0];
    assert!(!allows(&mut c, prose), "after the token, only the list");

    // The token as text: the default tokenizer.
    let (compiler, plain, eos) = self::compiler();
    let form = CallForm::text(CallSyntax::ToolCallsList);
    let required = compiler
        .compile(&list_plan(json!("required"), form).grammar(None).unwrap())
        .unwrap();
    assert!(takes(&required, &plain, &format!("[TOOL_CALLS]{list}")));
    assert!(!takes(&required, &plain, &list));
    let auto = compiler
        .compile(&list_plan(json!("auto"), form).grammar(None).unwrap())
        .unwrap();
    assert!(takes(&auto, &plain, "It is sunny; see [1]."));
    assert!(takes(&auto, &plain, &format!("[TOOL_CALLS]{list}")));
    assert!(!takes(&auto, &plain, "[TOOL_CALLS] I think"));
    let mut c = auto.start();
    for &t in &plain.encode_text(&format!("[TOOL_CALLS]{list}")).unwrap() {
        c.advance(t).unwrap();
    }
    assert!(allows(&mut c, eos));
}

/// Mistral's newer calls, `[TOOL_CALLS]name[ARGS]{..}`: with the markers as control
/// tokens, `required` takes one or more calls of the offered tools, each its opening
/// token, the name, the `[ARGS]` token and arguments under the tool's schema (its own
/// `$defs` resolving); `auto` takes text, then perhaps calls. With the markers as
/// text (the default tokenizer), the same in text, and text never holds the opening.
#[test]
fn mistral_s_newer_calls_open_each_call_with_their_control_tokens() {
    let (_, plain, eos) = compiler();
    let (tok, with_tokens) = with_mistral_tokens(&plain);
    let (opening, args) = (added("[TOOL_CALLS]"), added("[ARGS]"));
    let form = CallForm {
        syntax: CallSyntax::NamedArgs,
        tool_calls_token: Some(opening),
        args_token: Some(args),
    };
    let tools: Vec<Tool> = serde_json::from_value(json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "book", "parameters": {"type": "object",
            "properties": {"room": {"$ref": "#/$defs/Room"}}, "required": ["room"],
            "$defs": {"Room": {"type": "object", "properties": {"n": {"type": "integer"}},
                "required": ["n"]}}}}}]))
    .unwrap();
    let plan = |choice: Value, form: CallForm| {
        ToolPlan::from_request(Some(tools.clone()), Some(&choice), Some(true), form)
            .unwrap()
            .unwrap()
    };
    // Feeds `parts` (text, or a marker's control token) and says whether all were
    // allowed and the answer may end after them.
    let feeds = |grammar: &crate::engine::grammar::Grammar, parts: &[&str]| {
        let mut c = grammar.start();
        for part in parts {
            let ids = match ADDED.contains(part) {
                true => vec![added(part)],
                false => tok.encode_literal(part).unwrap(),
            };
            for id in ids {
                if !allows(&mut c, id) {
                    return false;
                }
                c.advance(id).unwrap();
            }
        }
        allows(&mut c, eos)
    };
    let weather = [
        "[TOOL_CALLS]",
        "get_weather",
        "[ARGS]",
        "{\"city\": \"Paris\"}",
    ];
    let booking = ["[TOOL_CALLS]", "book", "[ARGS]", "{\"room\": {\"n\": 4}}"];
    let required = with_tokens
        .compile(&plan(json!("required"), form).grammar(None).unwrap())
        .unwrap();
    assert!(feeds(&required, &weather));
    assert!(feeds(&required, &[&weather[..], &booking[..]].concat()));
    assert!(!feeds(&required, &["Sunny."]), "required calls");
    assert!(
        !feeds(
            &required,
            &["[TOOL_CALLS]", "get_weather", "{\"city\": \"Paris\"}"]
        ),
        "the arguments follow their control token"
    );
    assert!(!feeds(
        &required,
        &[
            "[TOOL_CALLS]",
            "book",
            "[ARGS]",
            "{\"room\": {\"n\": \"x\"}}"
        ]
    ));
    assert!(!feeds(
        &required,
        &["[TOOL_CALLS]", "get_time", "[ARGS]", "{}"]
    ));
    let mut c = required.start();
    let text_opening = tok.encode_literal("[TOOL_CALLS]").unwrap()[0];
    assert!(
        !allows(&mut c, text_opening),
        "the opening is the token, not text"
    );

    let auto = with_tokens
        .compile(&plan(json!("auto"), form).grammar(None).unwrap())
        .unwrap();
    assert!(feeds(&auto, &["It is sunny; see [1] and {\"a\": 1}."]));
    assert!(
        !feeds(&auto, &["Say [TOOL_CALLS]get_weather[ARGS]{} as text"]),
        "text never holds the opening: what reads as a call went through the grammar"
    );
    assert!(feeds(&auto, &weather));
    assert!(feeds(
        &auto,
        &[&["Let me look."][..], &weather[..], &booking[..]].concat()
    ));
    assert!(!feeds(
        &auto,
        &[
            "Let me look.",
            "[TOOL_CALLS]",
            "get_weather",
            "[ARGS]",
            "{\"town\": 1}"
        ]
    ));

    let named = with_tokens
        .compile(
            &plan(
                json!({"type": "function", "function": {"name": "book"}}),
                form,
            )
            .grammar(None)
            .unwrap(),
        )
        .unwrap();
    assert!(feeds(&named, &booking));
    assert!(!feeds(&named, &weather));
    assert!(
        !feeds(&named, &[&booking[..], &booking[..]].concat()),
        "one call"
    );

    // The markers as text.
    let (compiler, plain, _) = self::compiler();
    let text_form = CallForm::text(CallSyntax::NamedArgs);
    let required = compiler
        .compile(&plan(json!("required"), text_form).grammar(None).unwrap())
        .unwrap();
    let call = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}";
    assert!(takes(&required, &plain, call));
    assert!(takes(&required, &plain, &format!("{call}{call}")));
    assert!(!takes(
        &required,
        &plain,
        "get_weather[ARGS]{\"city\": \"Paris\"}"
    ));
    let auto = compiler
        .compile(&plan(json!("auto"), text_form).grammar(None).unwrap())
        .unwrap();
    assert!(takes(&auto, &plain, "It is sunny; see [TOOL] [ARGS]."));
    assert!(takes(&auto, &plain, &format!("Let me look.{call}")));
    assert!(!takes(&auto, &plain, "Let me look.[TOOL_CALLS] I think"));
}
