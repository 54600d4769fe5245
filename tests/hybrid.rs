//! Hybrid mode on the real default model: the target in f32, drafted by the same model
//! held as Q8_0 (the "serve full precision, draft quantized" pair). Greedy output equals
//! plain decoding alone and under continuous batching; sampled output keeps the target's
//! distribution; a draft model with another tokenizer is refused.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use suffixd::corpus::logs::ChatMessage;
use suffixd::drafting::CacheDrafter;
use suffixd::engine::{Engine, GenerateOptions, NoDrafts, Sampling};
use suffixd::model::forward::WeightFormat;
use suffixd::speculate::SpecParams;
use suffixd::store::Layered;
use suffixd::tree::GlobalTree;

/// A τ no suffix draft reaches: with the cost check off, the draft model drafts at
/// every step.
const ALWAYS: f64 = 1e6;

fn engines(tau: f64) -> Option<Engine> {
    // One model thread per test: the kernels' pools collapse when oversubscribed.
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    if !common::model_present() {
        return None;
    }
    let path = common::model_path();
    let device = candle_core::Device::Cpu;
    let mut target = Engine::load(&path, WeightFormat::F32, 1024, &device).unwrap();
    let draft = Engine::load(&path, WeightFormat::Q8_0, 1024, &device).unwrap();
    target.set_draft_model(draft, tau).unwrap();
    target.set_draft_cost_check(false);
    Some(target)
}

/// 20 prompts, chat and agentic, tokenized as the server tokenizes them.
fn prompts(engine: &Engine) -> Vec<Vec<u32>> {
    let chats = [
        "Write a short poem about the sea.",
        "Explain how a bicycle stays upright.",
        "Give me three ideas for a rainy afternoon.",
        "What is the difference between a list and a tuple in Python?",
        "Describe a sunrise to someone who has never seen one.",
        "Why do cats purr?",
        "Suggest a name for a coffee shop run by robots.",
        "Summarise the plot of a detective story in two sentences.",
        "How do I make a cup of green tea?",
        "Tell me a fun fact about octopuses.",
        "What should I pack for a weekend of hiking?",
        "Write a limerick about a forgetful wizard.",
    ];
    let agentic = [
        "Extract the fields as JSON with keys name, city, age.\nText: Ines lives in Porto and is 41 years old.\nJSON:",
        "Extract the fields as JSON with keys name, city, age.\nText: Tomas lives in Brno and is 29 years old.\nJSON:",
        "Tool result: {\"temperature\": 18, \"unit\": \"C\", \"city\": \"Quito\"}\nAnswer the user's question about the weather in Quito in one sentence.",
        "Classify the sentiment of this review as positive, negative or neutral: \"The battery lasts two days but the screen scratches easily.\"",
        "Rewrite as a bulleted list: milk, eggs, flour, sugar, butter.",
        "Previous step output: {\"order\": 5512, \"status\": \"shipped\"}\nRepeat the previous step output exactly, then add a field \"notified\": true.",
        "Convert to SQL: select the names of customers in Berlin ordered by name.",
        "Plan the steps to rename a column in a production database table.",
    ];
    let template = engine.template().expect("the default model has a template");
    chats
        .iter()
        .chain(&agentic)
        .map(|text| {
            let prompt = template
                .render(&[ChatMessage {
                    role: "user".into(),
                    content: (*text).into(),
                    ..Default::default()
                }])
                .unwrap();
            engine.tokenizer().encode_text(&prompt).unwrap()
        })
        .collect()
}

fn options(max_tokens: usize, speculate: bool, sampling: Sampling) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling,
        speculate,
        ..GenerateOptions::default()
    }
}

fn drafter<'a>(empty: &'a GlobalTree, prompt: &[u32]) -> CacheDrafter<Layered<'a>> {
    CacheDrafter::new(
        Layered::new(None, empty, empty),
        SpecParams::default(),
        prompt,
    )
}

/// Greedy output with the draft model drafting is plain greedy output of the f32
/// target, token for token: alone, and with sequences joining a running batch (the
/// draft model's passes batched across them, its caches caught up and rolled back).
#[test]
fn hybrid_greedy_output_is_plain_greedy_output_alone_and_batched() {
    let Some(mut engine) = engines(ALWAYS) else {
        return;
    };
    let prompts = prompts(&engine);
    assert_eq!(prompts.len(), 20);
    let max_tokens = |i: usize| 16 + 8 * (i % 3);
    let greedy = Sampling::default();
    let empty = GlobalTree::new(SpecParams::default().max_depth).unwrap();
    let plain: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let opts = options(max_tokens(i), false, greedy);
            engine
                .generate(p, &opts, &mut NoDrafts, &mut |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    let mut model_accepted = 0;
    for (i, p) in prompts.iter().enumerate() {
        let opts = options(max_tokens(i), true, greedy);
        let g = engine
            .generate(p, &opts, &mut drafter(&empty, p), &mut |_| true)
            .unwrap();
        assert_eq!(g.tokens, plain[i], "prompt {i} alone");
        model_accepted += g.sources.model.accepted;
    }
    assert!(
        model_accepted > 100,
        "the draft model's tokens were accepted: {model_accepted}"
    );
    // Batched: eight start together, one more joins at each step.
    let mut drafters: Vec<_> = prompts.iter().map(|p| drafter(&empty, p)).collect();
    let batched = common::run_batched(
        &mut engine,
        &prompts,
        |i| options(max_tokens(i), true, greedy),
        &mut drafters,
        8,
    );
    let widest = batched.widest;
    let done = batched.generations;
    let mut model_steps = 0;
    for (i, g) in done.iter().enumerate() {
        assert_eq!(g.tokens, plain[i], "prompt {i} batched");
        model_steps += g.sources.model.steps;
    }
    assert!(widest >= 8, "the batch ran {widest} sequences together");
    assert!(
        model_steps > 30,
        "the draft model drafted in the batch: {model_steps} steps"
    );
}

/// Sampling with the draft model keeps the target's distribution: the first token of
/// 300 sampled generations (temperature 1, top-k 4), each drafted by the draft model,
/// follows the target's own probabilities at the prompt's end. And a seed fixes the
/// answer: plain sampling with the same seed gives the same tokens.
#[test]
fn hybrid_sampling_keeps_the_targets_distribution() {
    let Some(mut engine) = engines(ALWAYS) else {
        return;
    };
    let prompt = prompts(&engine)[0].clone();
    // The target's distribution of the first token: its top-4 log-probabilities,
    // renormalised as top-k 4 renormalises them.
    let mut probe = options(1, false, Sampling::default());
    probe.logprobs = Some(4);
    let g = engine
        .generate(&prompt, &probe, &mut NoDrafts, &mut |_| true)
        .unwrap();
    let top = &g.logprobs.unwrap()[0].top;
    let total: f64 = top.iter().map(|t| f64::from(t.1).exp()).sum();
    let p: Vec<(u32, f64)> = top
        .iter()
        .map(|t| (t.0, f64::from(t.1).exp() / total))
        .collect();
    let empty = GlobalTree::new(SpecParams::default().max_depth).unwrap();
    let trials = 300;
    let mut counts = vec![0usize; p.len()];
    let mut drafted_by_model = 0;
    for seed in 0..trials {
        let sampling = Sampling {
            temperature: 1.0,
            top_k: 4,
            seed,
            ..Sampling::default()
        };
        let opts = options(2, true, sampling);
        let g = engine
            .generate(&prompt, &opts, &mut drafter(&empty, &prompt), &mut |_| true)
            .unwrap();
        drafted_by_model += usize::from(g.sources.model.steps > 0);
        // The seed fixes the answer: plain sampling with it gives the same tokens.
        let plain = engine
            .generate(
                &prompt,
                &options(2, false, sampling),
                &mut drafter(&empty, &prompt),
                &mut |_| true,
            )
            .unwrap();
        assert_eq!(g.tokens, plain.tokens, "seed {seed}");
        let first = g.tokens[0];
        let i = p
            .iter()
            .position(|t| t.0 == first)
            .expect("top-k 4 draws one of the 4");
        counts[i] += 1;
    }
    for (i, &(token, want)) in p.iter().enumerate() {
        let seen = counts[i] as f64 / trials as f64;
        let sd = (want * (1.0 - want) / trials as f64).sqrt();
        assert!(
            (seen - want).abs() < 4.0 * sd + 0.01,
            "token {token}: drawn {seen:.3} of the time, the target says {want:.3} ({counts:?})"
        );
    }
    // Longer answers too: sixteen tokens, temperature 1 without top-k.
    for seed in 0..10 {
        let sampling = Sampling {
            temperature: 1.0,
            seed,
            ..Sampling::default()
        };
        let run = |engine: &mut Engine, speculate: bool| {
            engine
                .generate(
                    &prompt,
                    &options(16, speculate, sampling),
                    &mut drafter(&empty, &prompt),
                    &mut |_| true,
                )
                .unwrap()
        };
        let (drafted, plain) = (run(&mut engine, true), run(&mut engine, false));
        assert_eq!(drafted.tokens, plain.tokens, "seed {seed}");
    }
    // A model draft whose token is unlikely to be accepted is cut before it is
    // verified, so not every generation verifies one.
    assert!(
        drafted_by_model > trials as usize * 2 / 3,
        "the draft model's draft was verified in {drafted_by_model} of {trials}"
    );
}

/// A draft model must speak the target's tokenizer: a copy of the default model whose
/// vocabulary gives two tokens each other's ids is refused, with a message that says why.
#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    use candle_core::quantized::gguf_file;
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    if !common::model_present() {
        return;
    }
    let path = common::model_path();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut metadata = content.metadata.clone();
    let gguf_file::Value::Array(mut tokens) = metadata["tokenizer.ggml.tokens"].clone() else {
        panic!("the vocabulary is an array");
    };
    // Two special tokens trade ids: every merge still holds, the ids mean other things.
    tokens.swap(0, 1);
    metadata.insert(
        "tokenizer.ggml.tokens".into(),
        gguf_file::Value::Array(tokens),
    );
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let t = content
                .tensor(&mut file, name, &candle_core::Device::Cpu)
                .unwrap();
            (name.clone(), t)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.gguf");
    let mut out = std::fs::File::create(&other).unwrap();
    let md: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &md, &ts).unwrap();
    drop(out);
    let device = candle_core::Device::Cpu;
    let mut target = Engine::load(&path, WeightFormat::Q8_0, 256, &device).unwrap();
    let draft = Engine::load(&other, WeightFormat::Q8_0, 256, &device).unwrap();
    let err = target.set_draft_model(draft, 1.0).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer") && err.contains("draft model"),
        "{err}"
    );
    assert_eq!(target.hybrid_tau(), None, "nothing was set");
    // And through the CLI, the same refusal, named.
    let out = common::run(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--draft-model",
        other.to_str().unwrap(),
        "--cost",
        "flat",
        "--prompt",
        "Hello",
        "--max-tokens",
        "2",
    ]);
    common::assert_clean_failure(&out, "tokenizer");
}
