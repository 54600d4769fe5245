//! The verifier on the real default model (installed by tools/setup.sh): speculative
//! greedy output equals plain greedy output, token for token, on 50 prompts, with tree
//! drafts from both the prompt and a global tree of earlier outputs.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use std::path::{Path, PathBuf};

use suffixd::corpus::logs::ChatMessage;
use suffixd::drafting::CacheDrafter;
use suffixd::engine::cost::CostCurve;
use suffixd::engine::{Engine, GenerateOptions, NoDrafts};
use suffixd::model::forward::WeightFormat;
use suffixd::speculate::{SpecMode, SpecParams};
use suffixd::store::Layered;
use suffixd::tree::GlobalTree;

fn model() -> Option<PathBuf> {
    // One model thread per test, as the notes advise: the quantized matmul's spinning
    // pool collapses when oversubscribed.
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    // SUFFIXD_MODEL names the model where the checkout is not where it was built (a
    // test binary carried to a GPU machine).
    let p = std::env::var_os("SUFFIXD_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("SUFFIXD_SKIP_MODEL_TESTS").is_some() {
        eprintln!("skipped: no model and SUFFIXD_SKIP_MODEL_TESTS is set");
        return None;
    }
    panic!("the default model is missing: run tools/setup.sh (or set SUFFIXD_SKIP_MODEL_TESTS=1)");
}

/// The device the tests run the model on: the CPU, or with the `cuda` feature and
/// `SUFFIXD_TEST_DEVICE=cuda`, the first GPU (tools/gpu-check.sh runs them there).
fn device() -> candle_core::Device {
    #[cfg(feature = "cuda")]
    if std::env::var("SUFFIXD_TEST_DEVICE").is_ok_and(|d| d == "cuda") {
        return candle_core::Device::new_cuda(0).expect("a CUDA GPU");
    }
    candle_core::Device::Cpu
}

/// The weight formats that are exact on `device()`: all of them on the CPU; on a GPU,
/// those its own kernels run.
fn exact_formats() -> Vec<WeightFormat> {
    if device().is_cpu() {
        vec![
            WeightFormat::Q8_0,
            WeightFormat::Native,
            WeightFormat::F32,
            WeightFormat::Bf16,
        ]
    } else {
        vec![WeightFormat::F32, WeightFormat::Bf16]
    }
}

fn prompts() -> Vec<String> {
    let mut v = Vec::new();
    let names = ["Alice", "Bob", "Chen", "Dana", "Emeka"];
    let cities = ["Paris", "Lima", "Oslo", "Pune", "Kyiv"];
    // Agentic: extraction into JSON, twice over the same template.
    for (i, n) in names.iter().enumerate() {
        for c in &cities[..3] {
            v.push(format!(
                "Extract the fields as JSON with keys name, city, age.\nText: {n} lives in {c} and is {} years old.\nJSON:",
                20 + i * 7
            ));
        }
    }
    // Agentic: a pipeline step that quotes an earlier output.
    for c in cities {
        v.push(format!(
            "Previous step output: {{\"city\": \"{c}\", \"status\": \"ok\"}}\nRepeat the previous step output exactly, then add a field \"checked\": true.\nAnswer:"
        ));
    }
    // Chat.
    let questions = [
        "What is the capital of France?",
        "Give me three tips for sleeping better.",
        "Write a haiku about rain.",
        "Explain what a suffix tree is in one sentence.",
        "List the days of the week.",
        "How do I reverse a list in Python?",
        "What is 12 times 12?",
        "Name three primary colors.",
        "Translate 'good morning' into Spanish.",
        "Write a SQL query that counts rows in a table named users.",
        "What does HTTP stand for?",
        "Give a one-line summary of Romeo and Juliet.",
        "Suggest a name for a pet turtle.",
        "Write a short greeting for a birthday card.",
        "What is the boiling point of water in Celsius?",
        "List three fruits that are red.",
        "Describe the color blue to someone.",
        "Write a Python function that returns the square of a number.",
        "What are the four seasons?",
        "Count from one to ten.",
        "Say hello in French.",
        "What is a prime number?",
        "Write a JSON object with keys a and b.",
        "Repeat this sentence twice: the cat sat on the mat.",
        "Name two planets.",
        "What is the opposite of hot?",
        "Write a to-do list with three items.",
        "Spell the word 'cat' backwards.",
        "What language is spoken in Brazil?",
        "Give an example of a noun.",
    ];
    for q in questions {
        v.push(format!("<chat>{q}"));
    }
    v
}

#[test]
fn speculative_greedy_output_equals_plain_greedy_output() {
    let Some(path) = model() else { return };
    let mut engine =
        Engine::load(&path, WeightFormat::default_for_build(), 1024, &device()).unwrap();
    // Verify every draft whole: the most tree verification and KV compaction to check.
    engine.set_cost_curve(CostCurve::flat());
    let params = SpecParams {
        tree: true,
        max_spec: 8,
        mode: SpecMode::Extended,
        ..SpecParams::default()
    };
    let mut global = GlobalTree::new(params.max_depth).unwrap();
    let nothing = GlobalTree::new(params.max_depth).unwrap();
    let opts = |speculate| GenerateOptions {
        max_tokens: 24,
        speculate,
        ..GenerateOptions::default()
    };
    let prompts = prompts();
    assert_eq!(prompts.len(), 50);
    let (mut drafted, mut accepted) = (0, 0);
    for (i, text) in prompts.iter().enumerate() {
        let text = match text.strip_prefix("<chat>") {
            Some(q) => engine
                .template()
                .expect("SmolLM2 has a chat template")
                .render(&[ChatMessage {
                    role: "user".into(),
                    content: q.into(),
                    ..Default::default()
                }])
                .unwrap(),
            None => text.clone(),
        };
        let prompt = engine.tokenizer().encode_text(&text).unwrap();
        let plain = engine
            .generate(&prompt, &opts(false), &mut NoDrafts, &mut |_| true)
            .unwrap();
        let view = Layered::new(None, &global, &nothing);
        let mut drafter = CacheDrafter::new(view, params, &prompt);
        let spec = engine
            .generate(&prompt, &opts(true), &mut drafter, &mut |_| true)
            .unwrap();
        assert_eq!(spec.tokens, plain.tokens, "prompt {i}: {text:?}");
        assert_eq!(spec.finish_reason, plain.finish_reason);
        drafted += spec.drafted_tokens;
        accepted += spec.accepted_tokens;
        global.insert(i as u64, &plain.tokens).unwrap();
    }
    // The drafts really were verified, and many accepted.
    eprintln!("drafted {drafted}, accepted {accepted}");
    assert!(
        drafted > 200 && accepted > 50,
        "drafted {drafted}, accepted {accepted}"
    );
}

/// A stop string ends the answer before it, with speculation as without: the answer is
/// the plain answer's tokens up to the last one whose text ends before the stop string
/// (so the next token's text would reach into it), for stop strings that begin inside a
/// token, at a token's start, and in a token a draft carries.
#[test]
fn a_stop_string_cuts_the_answer_before_it_with_and_without_speculation() {
    use suffixd::engine::FinishReason;
    let Some(path) = model() else { return };
    let mut engine =
        Engine::load(&path, WeightFormat::default_for_build(), 1024, &device()).unwrap();
    engine.set_cost_curve(CostCurve::flat());
    let params = SpecParams::default();
    let opts = |stop: Vec<String>, speculate| GenerateOptions {
        max_tokens: 48,
        stop,
        speculate,
        ..GenerateOptions::default()
    };
    let chat = engine
        .template()
        .expect("SmolLM2 has a chat template")
        .render(&[ChatMessage {
            role: "user".into(),
            content: "Give me three tips for sleeping better.".into(),
            ..Default::default()
        }])
        .unwrap();
    let prompt = engine.tokenizer().encode_text(&chat).unwrap();
    let plain = engine
        .generate(&prompt, &opts(vec![], false), &mut NoDrafts, &mut |_| true)
        .unwrap();
    assert!(plain.text.len() > 40, "{:?}", plain.text);
    let mut global = GlobalTree::new(params.max_depth).unwrap();
    global.insert(0, &plain.tokens).unwrap();
    let nothing = GlobalTree::new(params.max_depth).unwrap();
    let tokenizer = engine.tokenizer().clone();
    let text_of = |ids: &[u32]| tokenizer.decode(ids, true).unwrap();
    let mut cases = 0;
    for start in (10..plain.text.len() - 4).step_by(7) {
        if !plain.text.is_char_boundary(start) || !plain.text.is_char_boundary(start + 3) {
            continue;
        }
        let stop = plain.text[start..start + 3].to_string();
        let at = plain.text.find(&stop).unwrap();
        // The plain answer's tokens before the stop string's first byte.
        let want = (0..=plain.tokens.len())
            .rev()
            .find(|&n| text_of(&plain.tokens[..n]).len() <= at)
            .unwrap();
        for speculate in [false, true] {
            let view = Layered::new(None, &global, &nothing);
            let mut drafter = CacheDrafter::new(view, params, &prompt);
            let got = if speculate {
                engine.generate(
                    &prompt,
                    &opts(vec![stop.clone()], true),
                    &mut drafter,
                    &mut |_| true,
                )
            } else {
                engine.generate(
                    &prompt,
                    &opts(vec![stop.clone()], false),
                    &mut NoDrafts,
                    &mut |_| true,
                )
            }
            .unwrap();
            assert_eq!(
                got.tokens,
                plain.tokens[..want],
                "stop {stop:?}, speculate {speculate}"
            );
            assert_eq!(got.text, text_of(&plain.tokens[..want]));
            assert!(!got.text.contains(&stop));
            assert_eq!(got.finish_reason, FinishReason::Stop);
            if speculate {
                assert!(
                    got.accepted_tokens > 0,
                    "the drafts carried the stop string"
                );
            }
        }
        cases += 1;
    }
    assert!(cases >= 4, "{cases} stop strings tried");
}

#[test]
fn gguf_tokenizer_matches_the_reference_and_the_context_limit_is_an_error() {
    let Some(path) = model() else { return };
    let mut engine =
        Engine::load(&path, WeightFormat::Q8_0, 64, &candle_core::Device::Cpu).unwrap();
    assert_eq!(
        engine
            .tokenizer()
            .encode_text("Hello, world! How are you today?")
            .unwrap(),
        vec![19556, 28, 905, 17, 1073, 359, 346, 1834, 47]
    );
    let long: Vec<u32> = (0..80).map(|i| 100 + i).collect();
    let err = engine
        .generate(
            &long,
            &GenerateOptions {
                max_tokens: 4,
                ..GenerateOptions::default()
            },
            &mut NoDrafts,
            &mut |_| true,
        )
        .expect_err("an 80-token prompt does not fit a 64-token context");
    assert!(err.to_string().contains("context too long"), "{err}");
}

/// Continuous batching changes nothing in greedy output: sequences that join a running
/// batch at different steps, with prefill chunks beside decoding rows and tree drafts,
/// give token for token what each gives alone with plain decoding.
#[test]
fn batched_speculative_greedy_output_equals_plain_greedy_output_one_by_one() {
    let Some(path) = model() else { return };
    let mut engine =
        Engine::load(&path, WeightFormat::default_for_build(), 1024, &device()).unwrap();
    engine.set_cost_curve(CostCurve::flat());
    let params = SpecParams {
        tree: true,
        max_spec: 8,
        mode: SpecMode::Extended,
        ..SpecParams::default()
    };
    let all = prompts();
    let mut texts: Vec<String> = all.iter().step_by(4).cloned().collect();
    // A prompt longer than one prefill chunk, so chunks run beside decoding rows.
    texts.push(format!(
        "{}\nSummarise the text above in one line:",
        "The pipeline stage parsed the record and wrote it to the table. ".repeat(30)
    ));
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| {
            let text = match t.strip_prefix("<chat>") {
                Some(q) => engine
                    .template()
                    .unwrap()
                    .render(&[ChatMessage {
                        role: "user".into(),
                        content: q.into(),
                        ..Default::default()
                    }])
                    .unwrap(),
                None => t.clone(),
            };
            engine.tokenizer().encode_text(&text).unwrap()
        })
        .collect();
    assert!(prompts.last().unwrap().len() > 300);
    let opts = |i: usize, speculate| GenerateOptions {
        max_tokens: 12 + 4 * (i % 4),
        speculate,
        ..GenerateOptions::default()
    };
    let plain: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            engine
                .generate(p, &opts(i, false), &mut NoDrafts, &mut |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    // Drafts from half of the answers, so some are accepted and some refused.
    let mut global = GlobalTree::new(params.max_depth).unwrap();
    for (i, out) in plain.iter().enumerate().step_by(2) {
        global.insert(i as u64, out).unwrap();
    }
    let nothing = GlobalTree::new(params.max_depth).unwrap();
    let mut drafters: Vec<CacheDrafter<Layered<'_>>> = prompts
        .iter()
        .map(|p| CacheDrafter::new(Layered::new(None, &global, &nothing), params, p))
        .collect();
    // Four start together, then one more joins at each step.
    let batched = common::run_batched(&mut engine, &prompts, |i| opts(i, true), &mut drafters, 4);
    let (widest, step) = (batched.widest, batched.steps);
    let drafted: usize = batched.generations.iter().map(|g| g.drafted_tokens).sum();
    for (i, (got, want)) in batched.generations.iter().zip(&plain).enumerate() {
        assert_eq!(&got.tokens, want, "prompt {i}: {:?}", texts[i]);
    }
    eprintln!(
        "{} prompts, widest batch {widest}, {step} steps, {drafted} drafted",
        prompts.len()
    );
    assert!(
        widest >= 8,
        "the batch really ran {widest} sequences together"
    );
    assert!(drafted > 20, "drafts were verified in the batch: {drafted}");
}

/// Row invariance on the real model, for every weight format: a token's logits are the
/// same bits whether it is decoded alone or verified as row j of a K-row draft (K up to
/// 64) that shares its forward pass with another sequence's rows.
#[test]
fn a_token_gets_the_same_logits_alone_and_in_a_batched_draft_for_every_weight_format() {
    use candle_core::quantized::gguf_file;
    use suffixd::model::forward::{BatchEntry, KvCache, Model};
    let Some(path) = model() else { return };
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    // Long enough that attention's key chunks wrap around its splits on the GPU (chunks
    // of 64 keys, 16 splits by default): some splits take two chunks.
    let context: Vec<u32> = (0..1100).map(|i| 300 + 17 * (i % 500)).collect();
    let draft: Vec<u32> = (0..64).map(|i| 1000 + 31 * i).collect();
    let other: Vec<u32> = (0..9).map(|i| 5000 + 7 * i).collect();
    let chain = |n: usize| -> Vec<i32> { (0..n as i32).map(|i| i - 1).collect() };
    let bits = |t: &candle_core::Tensor, row: usize| -> Vec<u32> {
        let v: Vec<f32> = t.get(row).unwrap().to_vec1().unwrap();
        v.into_iter().map(f32::to_bits).collect()
    };
    for format in exact_formats() {
        let model = Model::load_gguf(&path, &content, format, 2048, &device()).unwrap();
        let prefilled = || {
            let mut cache = KvCache::default();
            model
                .forward(&mut cache, &context, &chain(context.len()))
                .unwrap();
            cache
                .commit(&(0..context.len()).collect::<Vec<_>>())
                .unwrap();
            cache
        };
        // Plain decoding: one token per pass.
        let mut alone = Vec::new();
        let mut cache = prefilled();
        for &t in &draft {
            alone.push(bits(&model.forward(&mut cache, &[t], &[-1]).unwrap(), 0));
            cache.commit(&[0]).unwrap();
        }
        for k in [2, 16, 64] {
            let mut cache = prefilled();
            let mut neighbour = KvCache::default();
            let parents = chain(k);
            let other_parents = chain(other.len());
            let logits = model
                .forward_batch(&mut [
                    BatchEntry {
                        cache: &mut neighbour,
                        tokens: &other,
                        parents: &other_parents,
                        logits: suffixd::model::forward::LogitRows::All,
                    },
                    BatchEntry {
                        cache: &mut cache,
                        tokens: &draft[..k],
                        parents: &parents,
                        logits: suffixd::model::forward::LogitRows::All,
                    },
                ])
                .unwrap();
            for (j, want) in alone.iter().take(k).enumerate() {
                assert!(
                    bits(&logits, other.len() + j) == *want,
                    "{format:?}: token {j} of a {k}-row draft beside another sequence differs from plain decoding"
                );
            }
        }
    }
}

/// On a GPU, its own kernels compute what the CPU's compute: the logits of a prefix and
/// of a draft agree with the CPU's f32 pass to float32 rounding (relative error under
/// 1e-3: summation orders differ) with f32 weights; with bf16 weights under 5e-3 (the
/// CPU rounds the activations to bf16 for bf16 weights, which the GPU does not: on the
/// default model that alone moves the CPU's logits by 2.1e-3).
#[test]
fn the_gpu_pass_agrees_with_the_cpu_pass() {
    use candle_core::quantized::gguf_file;
    use suffixd::model::forward::{KvCache, Model};
    let gpu = device();
    if gpu.is_cpu() {
        return;
    }
    let Some(path) = model() else { return };
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let context: Vec<u32> = (0..300).map(|i| 300 + 17 * i).collect();
    let draft: Vec<u32> = vec![1000, 1031, 1062, 1093];
    let parents = [-1, 0, 0, 2];
    let chain: Vec<i32> = (0..context.len() as i32).map(|i| i - 1).collect();
    let logits = |device: &candle_core::Device, format: WeightFormat| -> Vec<f32> {
        let model = Model::load_gguf(&path, &content, format, 512, device).unwrap();
        let mut cache = KvCache::default();
        let first = model.forward(&mut cache, &context, &chain).unwrap();
        let first: Vec<f32> = first.get(context.len() - 1).unwrap().to_vec1().unwrap();
        cache
            .commit(&(0..context.len()).collect::<Vec<_>>())
            .unwrap();
        let rest = model.forward(&mut cache, &draft, &parents).unwrap();
        let mut all = first;
        all.extend(rest.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        all
    };
    for format in [WeightFormat::F32, WeightFormat::Bf16] {
        let (cpu, dev) = (
            logits(&candle_core::Device::Cpu, format),
            logits(&gpu, format),
        );
        assert_eq!(cpu.len(), dev.len());
        common::assert_near_the_cpu(&cpu, &dev, format, &format!("{format:?} on the GPU"));
    }
}

/// The greedy choice, on whatever device the model runs (the GPU's own kernel there), is
/// the CPU's: the largest value, the lowest index of equal ones, NaN never the largest;
/// on the model's own logits and on rows made to have ties, NaN, infinities and signed
/// zeros.
#[test]
fn the_greedy_argmax_is_the_cpus_on_every_device() {
    use candle_core::quantized::gguf_file;
    use candle_core::{Device, Tensor};
    use suffixd::model::forward::{KvCache, Model, argmax_rows};
    let Some(path) = model() else { return };
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let dev = device();
    let format = exact_formats()[0];
    let model = Model::load_gguf(&path, &content, format, 512, &dev).unwrap();
    let prompt: Vec<u32> = (0..200).map(|i| 300 + 13 * i).collect();
    let parents: Vec<i32> = (0..prompt.len() as i32).map(|i| i - 1).collect();
    let logits = model
        .forward(&mut KvCache::default(), &prompt, &parents)
        .unwrap();
    let on_cpu = logits.to_device(&Device::Cpu).unwrap();
    assert_eq!(
        model.argmax_rows(&logits).unwrap(),
        argmax_rows(&on_cpu).unwrap()
    );

    let vocab = model.config().vocab;
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut row = |edit: &dyn Fn(&mut Vec<f32>)| {
        let mut r: Vec<f32> = (0..vocab)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
            .collect();
        edit(&mut r);
        rows.push(r);
    };
    row(&|r| {
        r[vocab - 1] = 5.0; // the largest at the very end
    });
    row(&|r| {
        for i in [vocab - 3, 4000, 1025, 1024] {
            r[i] = 5.0; // ties: the lowest index wins
        }
    });
    row(&|r| r.iter_mut().for_each(|x| *x = nan)); // all NaN: 0
    row(&|r| {
        r.iter_mut().for_each(|x| *x = nan);
        r[777] = -inf; // NaN is never the largest
    });
    row(&|r| r.iter_mut().for_each(|x| *x = -inf)); // all -inf: the first
    row(&|r| {
        r.iter_mut().for_each(|x| *x = -1.0);
        r[3000] = 0.0;
        r[2000] = -0.0; // equal zeros: the first of either sign
    });
    row(&|r| {
        r[100] = nan;
        r[200] = inf;
        r[50] = inf;
    });
    let crafted: Vec<f32> = rows.concat();
    let crafted = Tensor::from_vec(crafted, (rows.len(), vocab), &Device::Cpu).unwrap();
    let want = argmax_rows(&crafted).unwrap();
    assert_eq!(want, [vocab as u32 - 1, 1024, 0, 777, 0, 2000, 50]);
    assert_eq!(
        model
            .argmax_rows(&crafted.to_device(&dev).unwrap())
            .unwrap(),
        want
    );
}

/// A chat prompt: a long shared system prompt (several prefill chunks), then `turns`
/// (user, assistant, user, ...), rendered by the model's template and tokenized.
fn agent_prompt(engine: &Engine, turns: &[&str]) -> Vec<u32> {
    let system = format!(
        "You are the review stage of a coding pipeline. {}Answer in one short paragraph.",
        "Read the change, name the function it touches, say whether it handles empty input, and give one concrete fix. ".repeat(14)
    );
    let mut messages = vec![ChatMessage {
        role: "system".into(),
        content: system,
        ..Default::default()
    }];
    for (i, t) in turns.iter().enumerate() {
        messages.push(ChatMessage {
            role: if i % 2 == 0 { "user" } else { "assistant" }.into(),
            content: (*t).into(),
            ..Default::default()
        });
    }
    let text = engine.template().unwrap().render(&messages).unwrap();
    engine.tokenizer().encode_text(&text).unwrap()
}

/// The prefix cache changes no output. Greedy answers with the cache equal those
/// without it, plain and speculative, alone and batched; a second turn reuses the first
/// turn's prompt and answer; another namespace reuses nothing; and a request whose
/// prefix is evicted while it runs (other requests' prompts take the room) still
/// answers exactly. On a GPU (`SUFFIXD_TEST_DEVICE=cuda`) the blocks live on the device.
#[test]
fn greedy_output_with_the_prefix_cache_equals_output_without_it() {
    use suffixd::engine::{Drafter, Sequence};
    let Some(path) = model() else { return };
    let mut engine =
        Engine::load(&path, WeightFormat::default_for_build(), 1024, &device()).unwrap();
    engine.set_cost_curve(CostCurve::flat());
    let params = SpecParams {
        tree: true,
        max_spec: 8,
        ..SpecParams::default()
    };
    let nothing = GlobalTree::new(params.max_depth).unwrap();
    let opts = |speculate, namespace: &str| GenerateOptions {
        max_tokens: 20,
        speculate,
        namespace: namespace.into(),
        ..GenerateOptions::default()
    };
    let questions = [
        "def first(xs): return xs[0]",
        "def total(xs): return sum(x for x in xs)",
        "def mean(xs): return sum(xs) / len(xs)",
        "def last(xs): return xs[-1]",
        "def head(xs, n): return xs[:n]",
    ];
    let mut prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| agent_prompt(&engine, &[q]))
        .collect();
    assert!(
        prompts[0].len() > 300,
        "the shared prefix spans prefill chunks"
    );
    // Without the cache.
    engine.set_prefix_cache_bytes(0);
    let plain = |engine: &mut Engine, p: &[u32]| {
        engine
            .generate(p, &opts(false, "default"), &mut NoDrafts, &mut |_| true)
            .unwrap()
    };
    let mut want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| plain(&mut engine, p).tokens)
        .collect();
    // A second turn that resends the first and its answer.
    let answer = engine.tokenizer().decode(&want[0], false).unwrap();
    prompts.push(agent_prompt(
        &engine,
        &[questions[0], &answer, "Now handle None too."],
    ));
    want.push(plain(&mut engine, prompts.last().unwrap()).tokens);
    assert_eq!(engine.prefix_cache_stats().lookups, 0, "the cache was off");

    engine.set_prefix_cache_bytes(256 << 20);
    for (i, p) in prompts.iter().enumerate() {
        let spec = {
            let mut drafter = CacheDrafter::new(Layered::new(None, &nothing, &nothing), params, p);
            engine
                .generate(p, &opts(true, "default"), &mut drafter, &mut |_| true)
                .unwrap()
        };
        let again = engine
            .generate(p, &opts(false, "default"), &mut NoDrafts, &mut |_| true)
            .unwrap();
        assert_eq!(spec.tokens, want[i], "prompt {i}, speculative");
        assert_eq!(again.tokens, want[i], "prompt {i}, plain");
        // The repeat reuses all of its prompt but the last token, to a whole block.
        assert!(
            again.cached_prompt_tokens + 16 >= p.len(),
            "prompt {i}: {} of {}",
            again.cached_prompt_tokens,
            p.len()
        );
        if i > 0 {
            assert!(
                spec.cached_prompt_tokens >= 300,
                "prompt {i} reused the system prompt: {}",
                spec.cached_prompt_tokens
            );
        }
    }
    // The second turn reused the first turn's prompt and answer (cached at its finish).
    let first_turn = prompts[0].len() + want[0].len();
    let second = engine
        .generate(
            prompts.last().unwrap(),
            &opts(false, "default"),
            &mut NoDrafts,
            &mut |_| true,
        )
        .unwrap();
    assert!(
        second.cached_prompt_tokens + 16 > first_turn - 16,
        "{} of {first_turn}",
        second.cached_prompt_tokens
    );
    // Another namespace starts cold, and answers the same.
    let other = engine
        .generate(
            &prompts[1],
            &opts(false, "tenant-b"),
            &mut NoDrafts,
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(other.cached_prompt_tokens, 0);
    assert_eq!(other.tokens, want[1]);

    // Batched, speculative, and the prefix evicted mid-flight: a budget of 24 blocks
    // (384 tokens) holds one prompt's system prompt and little more.
    let block = engine.kv_bytes_per_token() * 16 + 256;
    engine.set_prefix_cache_bytes(24 * block);
    // Cache one stage-prompt, then run all of them together: the first restores the
    // prefix, and the others' prefill (in other namespaces) evicts it while it decodes.
    engine
        .generate(
            &prompts[0],
            &opts(false, "default"),
            &mut NoDrafts,
            &mut |_| true,
        )
        .unwrap();
    let evicted_before = engine.prefix_cache_stats().blocks_evicted;
    let namespaces = ["default", "n1", "n2", "n3", "n4"];
    let mut drafters: Vec<CacheDrafter<Layered<'_>>> = prompts[..5]
        .iter()
        .map(|p| CacheDrafter::new(Layered::new(None, &nothing, &nothing), params, p))
        .collect();
    let mut seqs: Vec<Option<Sequence>> = prompts[..5]
        .iter()
        .zip(namespaces)
        .map(|(p, n)| Some(engine.start(p, &opts(true, n)).unwrap()))
        .collect();
    let mut results: Vec<Option<suffixd::engine::Generation>> = (0..5).map(|_| None).collect();
    while seqs.iter().any(Option::is_some) {
        let mut batch: Vec<(&mut Sequence, &mut dyn Drafter)> = seqs
            .iter_mut()
            .zip(drafters.iter_mut())
            .filter_map(|(s, d)| s.as_mut().map(|s| (s, d as &mut dyn Drafter)))
            .collect();
        engine.step(&mut batch).unwrap();
        for i in 0..5 {
            if seqs[i].as_ref().is_some_and(|s| s.is_finished()) {
                results[i] = Some(engine.finish(seqs[i].take().unwrap()));
            }
        }
    }
    let stats = engine.prefix_cache_stats();
    assert!(stats.blocks_evicted > evicted_before, "{stats:?}");
    assert!(stats.bytes <= stats.budget_bytes, "{stats:?}");
    let results: Vec<_> = results.into_iter().map(Option::unwrap).collect();
    assert!(
        results[0].cached_prompt_tokens >= 300,
        "{}",
        results[0].cached_prompt_tokens
    );
    for (i, g) in results.iter().enumerate() {
        assert_eq!(g.tokens, want[i], "batched prompt {i}");
        if i > 0 {
            assert_eq!(
                g.cached_prompt_tokens, 0,
                "namespace {} starts cold",
                namespaces[i]
            );
        }
    }
}

/// A pass whose rows do not form a tree (a parent after its child, out of range, or a
/// parent count that does not match) is an error for that pass, not a panic that would
/// take the model thread down; the model goes on serving.
#[test]
fn a_malformed_pass_is_an_error_and_the_model_goes_on() {
    use candle_core::quantized::gguf_file;
    use suffixd::model::forward::{KvCache, Model, ModelError};
    let Some(path) = model() else { return };
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let model = Model::load_gguf(
        &path,
        &content,
        WeightFormat::Native,
        256,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let mut cache = KvCache::default();
    for (tokens, parents) in [
        (vec![1u32, 2, 3], vec![-1i32, 2, 0]),
        (vec![1, 2], vec![-1, 7]),
        (vec![1, 2], vec![-2, 0]),
        (vec![1, 2, 3], vec![-1, 0]),
    ] {
        let e = model.forward(&mut cache, &tokens, &parents).unwrap_err();
        assert!(matches!(e, ModelError::BadPass(_)), "{parents:?}: {e}");
    }
    assert!(model.forward(&mut cache, &[1, 2, 3], &[-1, 0, 1]).is_ok());
}
