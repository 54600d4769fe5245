//! A request's logit bias and penalties on the real default model: the answer is the
//! same with speculation as without (each verified node adjusted for the answer and the
//! path above it), alone and batched beside sequences without them, greedy and sampled,
//! with the draft model on; and they change the answer as they should.
//!
//! Set `SUFFIXD_SKIP_MODEL_TESTS=1` to skip on a machine without the model.

mod common;

use suffixd::corpus::logs::ChatMessage;
use suffixd::drafting::CacheDrafter;
use suffixd::engine::{Engine, GenerateOptions, NoDrafts, Penalties, Sampling};
use suffixd::model::forward::WeightFormat;
use suffixd::speculate::SpecParams;
use suffixd::store::Layered;
use suffixd::tree::GlobalTree;

fn engine() -> Option<Engine> {
    // One model thread per test: the kernels' pools collapse when oversubscribed.
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    if !common::model_present() {
        return None;
    }
    let device = candle_core::Device::Cpu;
    Some(
        Engine::load(
            &common::model_path(),
            WeightFormat::default_for_build(),
            1024,
            &device,
        )
        .unwrap(),
    )
}

/// Chat prompts whose answers repeat themselves or the prompt: where penalties bite
/// and drafts are accepted.
fn prompts(engine: &Engine) -> Vec<Vec<u32>> {
    let questions = [
        "Repeat this sentence three times: the cat sat on the mat.",
        "Count from one to twenty.",
        "Write a JSON list of five objects with keys id and name.",
        "List the days of the week, one per line.",
        "Write a Python function that returns the square of a number.",
        "Previous step output: {\"order\": 5512, \"status\": \"shipped\"}\nRepeat the previous step output exactly.",
    ];
    let template = engine.template().expect("the default model has a template");
    questions
        .iter()
        .map(|q| {
            let text = template
                .render(&[ChatMessage {
                    role: "user".into(),
                    content: (*q).into(),
                    ..Default::default()
                }])
                .unwrap();
            engine.tokenizer().encode_text(&text).unwrap()
        })
        .collect()
}

fn options(speculate: bool, sampling: Sampling, penalties: &Penalties) -> GenerateOptions {
    GenerateOptions {
        max_tokens: 40,
        sampling,
        speculate,
        penalties: penalties.clone(),
        ..GenerateOptions::default()
    }
}

/// The settings checked: each penalty alone, all together, and a bias beside them.
fn settings() -> Vec<Penalties> {
    vec![
        Penalties {
            frequency: 1.0,
            ..Penalties::default()
        },
        Penalties {
            presence: 1.5,
            ..Penalties::default()
        },
        Penalties {
            repetition: 1.3,
            ..Penalties::default()
        },
        Penalties {
            presence: 0.5,
            frequency: 0.5,
            repetition: 1.1,
            bias: vec![(28, -5.0), (30, 3.0)],
        },
    ]
}

fn sampled(seed: u64) -> Sampling {
    Sampling {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 0,
        seed,
    }
}

/// Drafts from the prompt and from a tree holding both the plain answer and the
/// penalised one: whole answers to accept (so penalties must follow the path) and
/// branches where the two part (so walks stop mid-draft).
fn drafter<'a>(
    global: &'a GlobalTree,
    empty: &'a GlobalTree,
    prompt: &[u32],
) -> CacheDrafter<Layered<'a>> {
    CacheDrafter::new(
        Layered::new(None, global, empty),
        SpecParams::default(),
        prompt,
    )
}

#[test]
fn penalised_answers_are_the_same_with_and_without_speculation() {
    let Some(mut engine) = engine() else { return };
    let prompts = prompts(&engine);
    let empty = GlobalTree::new(SpecParams::default().max_depth).unwrap();
    let (mut accepted, mut changed, mut cases) = (0, 0, 0);
    for (s, penalties) in settings().iter().enumerate() {
        for (i, prompt) in prompts.iter().enumerate() {
            for sampling in [Sampling::default(), sampled(i as u64)] {
                let run = |engine: &mut Engine, speculate, p: &Penalties, global: &GlobalTree| {
                    let opts = options(speculate, sampling, p);
                    if speculate {
                        let mut d = drafter(global, &empty, prompt);
                        engine.generate(prompt, &opts, &mut d, &mut |_| true)
                    } else {
                        engine.generate(prompt, &opts, &mut NoDrafts, &mut |_| true)
                    }
                    .unwrap()
                };
                let mut global = GlobalTree::new(SpecParams::default().max_depth).unwrap();
                let unadjusted = run(&mut engine, false, &Penalties::default(), &global);
                let plain = run(&mut engine, false, penalties, &global);
                global.insert(0, &unadjusted.tokens).unwrap();
                global.insert(1, &plain.tokens).unwrap();
                let spec = run(&mut engine, true, penalties, &global);
                assert_eq!(
                    spec.tokens, plain.tokens,
                    "setting {s}, prompt {i}, {sampling:?}"
                );
                assert_eq!(spec.finish_reason, plain.finish_reason);
                accepted += spec.accepted_tokens;
                changed += usize::from(plain.tokens != unadjusted.tokens);
                cases += 1;
            }
        }
    }
    eprintln!(
        "{cases} cases, {changed} changed by their penalties, {accepted} draft tokens accepted"
    );
    // The drafts were walked along, and the penalties did something in most cases.
    assert!(
        accepted > 20 * cases,
        "only {accepted} accepted in {cases} cases"
    );
    assert!(
        changed * 2 >= cases,
        "only {changed} of {cases} answers changed"
    );
}

/// A frequency penalty makes a repetitive answer repeat less; a large bias for one
/// token makes the greedy answer that token, and a large negative one keeps the plain
/// answer's first token out of it.
#[test]
fn penalties_and_bias_change_the_answer_as_asked() {
    let Some(mut engine) = engine() else { return };
    let prompt = &prompts(&engine)[2];
    let greedy = |engine: &mut Engine, p: &Penalties| {
        let opts = options(false, Sampling::default(), p);
        engine
            .generate(prompt, &opts, &mut NoDrafts, &mut |_| true)
            .unwrap()
            .tokens
    };
    let repeats = |tokens: &[u32]| {
        let distinct: std::collections::HashSet<_> = tokens.iter().collect();
        tokens.len() - distinct.len()
    };
    let plain = greedy(&mut engine, &Penalties::default());
    let penalised = greedy(
        &mut engine,
        &Penalties {
            frequency: 1.5,
            ..Penalties::default()
        },
    );
    assert!(
        repeats(&penalised) < repeats(&plain),
        "plain repeats {} tokens, penalised {}",
        repeats(&plain),
        repeats(&penalised)
    );
    // A token the plain answer does not hold, pushed to the top.
    let forced = (1000..2000).find(|t| !plain.contains(t)).unwrap();
    let pushed = greedy(
        &mut engine,
        &Penalties {
            bias: vec![(forced, 100.0)],
            ..Penalties::default()
        },
    );
    assert!(pushed.iter().all(|&t| t == forced), "{pushed:?}");
    let banned = greedy(
        &mut engine,
        &Penalties {
            bias: vec![(plain[0], -100.0)],
            ..Penalties::default()
        },
    );
    assert!(!banned.contains(&plain[0]), "{banned:?} holds {}", plain[0]);
}

/// Batched beside sequences without penalties (whose argmaxes the pass computes for
/// them alone), penalised sequences keep their answers; and with the draft model on,
/// which drafts for the others, they keep them too.
#[test]
fn penalised_sequences_keep_their_answers_batched_and_with_a_draft_model() {
    let Some(mut engine) = engine() else { return };
    let prompts = prompts(&engine);
    let penalties = settings();
    // Even sequences greedy and odd ones sampled; every other one penalised.
    let opts = |i: usize, speculate| {
        let sampling = if i.is_multiple_of(2) {
            Sampling::default()
        } else {
            sampled(i as u64)
        };
        let p = if i % 4 < 2 {
            penalties[i % penalties.len()].clone()
        } else {
            Penalties::default()
        };
        options(speculate, sampling, &p)
    };
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            engine
                .generate(p, &opts(i, false), &mut NoDrafts, &mut |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    let empty = GlobalTree::new(SpecParams::default().max_depth).unwrap();
    let mut global = GlobalTree::new(SpecParams::default().max_depth).unwrap();
    for (i, tokens) in alone.iter().enumerate() {
        global.insert(i as u64, tokens).unwrap();
    }
    let mut drafters: Vec<_> = prompts
        .iter()
        .map(|p| drafter(&global, &empty, p))
        .collect();
    let batched = common::run_batched(&mut engine, &prompts, |i| opts(i, true), &mut drafters, 3);
    assert!(batched.widest >= 3);
    for (i, g) in batched.generations.iter().enumerate() {
        assert_eq!(g.tokens, alone[i], "sequence {i}, batched");
    }
    // The same model drafting as Q8_0, at every step it may.
    let draft = Engine::load(
        &common::model_path(),
        WeightFormat::Q8_0,
        1024,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    engine.set_draft_model(draft, 1e6).unwrap();
    engine.set_draft_cost_check(false);
    for (i, p) in prompts.iter().enumerate() {
        let nothing = GlobalTree::new(SpecParams::default().max_depth).unwrap();
        let mut d = drafter(&nothing, &empty, p);
        let g = engine
            .generate(p, &opts(i, true), &mut d, &mut |_| true)
            .unwrap();
        assert_eq!(g.tokens, alone[i], "sequence {i}, with the draft model");
    }
}

/// The draft model chooses each draft token from the row the target will adjust, with
/// the same penalties for the answer and the draft so far: with the target's own
/// weights drafting (the same bits, row for row), every token it drafts is accepted,
/// greedy and sampled, under every setting. A draft from the unadjusted row is still
/// exact, but rejected wherever a penalty moves the choice.
#[test]
fn a_draft_model_drafts_what_the_penalised_target_chooses() {
    let Some(mut engine) = engine() else { return };
    let prompts = prompts(&engine);
    let draft = Engine::load(
        &common::model_path(),
        WeightFormat::default_for_build(),
        1024,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    engine.set_draft_model(draft, 1e6).unwrap();
    engine.set_draft_cost_check(false);
    let empty = GlobalTree::new(SpecParams::default().max_depth).unwrap();
    let (mut drafted, mut changed) = (0, 0);
    for (s, penalties) in settings().iter().enumerate() {
        for (i, p) in prompts.iter().enumerate() {
            for sampling in [Sampling::default(), sampled(i as u64)] {
                let plain = engine
                    .generate(
                        p,
                        &options(false, sampling, penalties),
                        &mut NoDrafts,
                        &mut |_| true,
                    )
                    .unwrap();
                let unpenalised = options(false, sampling, &Penalties::default());
                let free = engine.generate(p, &unpenalised, &mut NoDrafts, &mut |_| true);
                changed += usize::from(free.unwrap().tokens != plain.tokens);
                let g = engine
                    .generate(
                        p,
                        &options(true, sampling, penalties),
                        &mut drafter(&empty, &empty, p),
                        &mut |_| true,
                    )
                    .unwrap();
                assert_eq!(g.tokens, plain.tokens, "setting {s}, prompt {i}");
                let model = &g.sources.model;
                assert_eq!(
                    model.accepted, model.drafted,
                    "setting {s}, prompt {i}, {sampling:?}: the draft model's tokens accepted"
                );
                drafted += model.drafted;
            }
        }
    }
    eprintln!("{drafted} draft-model tokens, all accepted; {changed} answers changed by penalties");
    assert!(drafted > 500, "the draft model drafted {drafted} tokens");
    assert!(
        changed > 20,
        "the penalties changed {changed} of 48 answers"
    );
}
