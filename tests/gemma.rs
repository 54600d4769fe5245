//! Gemma 3 270M, a real non-llama model (issue 46), end to end: its SentencePiece
//! tokenizer from the GGUF metadata, its sliding-window layers, and speculative greedy
//! output equal to plain greedy output on 20 prompts, one by one and under continuous
//! batching.
//!
//! The model is optional (`tools/setup.sh --model gemma3-270m`; Gemma terms apply): these
//! tests say so and pass when it is absent. `tools/gemma-vs-llamacpp.py` compares its
//! greedy output with llama.cpp's.

mod common;

use std::path::{Path, PathBuf};

use suffixd::chat::PromptPiece;
use suffixd::drafting::CacheDrafter;
use suffixd::engine::cost::CostCurve;
use suffixd::engine::{Engine, GenerateOptions, NoDrafts};
use suffixd::model::forward::WeightFormat;
use suffixd::speculate::{SpecMode, SpecParams};
use suffixd::store::Layered;
use suffixd::tree::GlobalTree;

fn model() -> Option<PathBuf> {
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: Gemma 3 270M is optional; tools/setup.sh --model gemma3-270m installs it"
        );
        None
    }
}

/// Twenty prompts (tests/fixtures/gemma_prompts.json, which
/// tools/gemma-vs-llamacpp.py also reads): completions that repeat their prompt's
/// structure (where the suffix trees draft) and open ones.
fn prompts() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma_prompts.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn encode(engine: &Engine, text: &str) -> Vec<u32> {
    engine
        .tokenizer()
        .encode_pieces(&[PromptPiece::Markup(text.into())])
        .unwrap()
}

fn options(max_tokens: usize, speculate: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        speculate,
        ..GenerateOptions::default()
    }
}

fn params() -> SpecParams {
    SpecParams {
        tree: true,
        max_spec: 8,
        mode: SpecMode::Extended,
        ..SpecParams::default()
    }
}

#[test]
fn the_tokenizer_reads_gemma_s_sentencepiece_vocabulary_as_llama_cpp_does() {
    let Some(path) = model() else { return };
    let engine =
        Engine::load(&path, WeightFormat::Native, 1024, &candle_core::Device::Cpu).unwrap();
    let tok = engine.tokenizer();
    // llama.cpp's /tokenize on the same file (add_special false, parse_special true).
    let cases: [(&str, &[u32]); 4] = [
        (
            "Hello, world! How are you today?",
            &[9259, 236764, 1902, 236888, 2088, 659, 611, 3124, 236881],
        ),
        (
            "a  b   c    d",
            &[236746, 138, 236763, 139, 236755, 140, 236753],
        ),
        (
            "<start_of_turn>user\nHi<end_of_turn>\n",
            &[105, 2364, 107, 10979, 106, 107],
        ),
        (
            "Ünïcödé — émojis 🎉🚀 and 中文字符 mixed",
            &[
                238194, 236749, 238527, 236755, 55515, 236859, 2192, 1559, 1289, 92467, 204906,
                242015, 532, 17346, 31818, 238741, 9726,
            ],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode_text(text).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), text);
    }
    // A prompt starts with <bos> (add_bos_token), once.
    assert_eq!(encode(&engine, "Hi")[0], 2);
    assert_eq!(encode(&engine, "<bos>Hi"), encode(&engine, "Hi"));
    // <end_of_turn> ends generation beside <eos>.
    assert!(
        engine.eos().contains(&1) && engine.eos().contains(&106),
        "{:?}",
        engine.eos()
    );
}

#[test]
fn gemma_speculative_greedy_output_equals_plain_alone_and_batched() {
    let Some(path) = model() else { return };
    let mut engine =
        Engine::load(&path, WeightFormat::Native, 1024, &candle_core::Device::Cpu).unwrap();
    engine.set_cost_curve(CostCurve::flat());
    let texts = prompts();
    assert_eq!(texts.len(), 20);
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| encode(&engine, t)).collect();
    let max = |i: usize| 12 + 4 * (i % 4);
    let plain: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            engine
                .generate(p, &options(max(i), false), &mut NoDrafts, &mut |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    // Drafts from the prompt and from half of the answers.
    let mut global = GlobalTree::new(params().max_depth).unwrap();
    for (i, out) in plain.iter().enumerate().step_by(2) {
        global.insert(i as u64, out).unwrap();
    }
    let nothing = GlobalTree::new(params().max_depth).unwrap();
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let mut drafter = CacheDrafter::new(Layered::new(None, &global, &nothing), params(), p);
        let spec = engine
            .generate(p, &options(max(i), true), &mut drafter, &mut |_| true)
            .unwrap();
        assert_eq!(spec.tokens, plain[i], "prompt {i}: {:?}", texts[i]);
        drafted += spec.drafted_tokens;
        accepted += spec.accepted_tokens;
    }
    eprintln!("alone: drafted {drafted}, accepted {accepted}");
    assert!(
        drafted > 50 && accepted > 10,
        "drafted {drafted}, accepted {accepted}"
    );

    // Continuous batching: four start together, then one more joins at each step.
    let mut drafters: Vec<CacheDrafter<Layered<'_>>> = prompts
        .iter()
        .map(|p| CacheDrafter::new(Layered::new(None, &global, &nothing), params(), p))
        .collect();
    let batched = common::run_batched(
        &mut engine,
        &prompts,
        |i| options(max(i), true),
        &mut drafters,
        4,
    );
    let widest = batched.widest;
    let results: Vec<Vec<u32>> = batched.generations.into_iter().map(|g| g.tokens).collect();
    for (i, (got, want)) in results.iter().zip(&plain).enumerate() {
        assert_eq!(got, want, "batched prompt {i}: {:?}", texts[i]);
    }
    assert!(widest >= 8, "the batch ran {widest} sequences together");
}
