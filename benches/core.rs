//! Throughput of the speculation core on the bundled example workload:
//! speculate (paper and extended, path and tree drafts), append a response to the global
//! tree, remove it, start a request tree, and build a tree from all warm responses.
//!
//! `cargo bench --bench core`; compare medians within one run, never across machines.

use std::hint::black_box;
use std::path::Path;

use criterion::measurement::WallTime;
use criterion::{BatchSize, BenchmarkGroup, Criterion, criterion_group, criterion_main};
use suffixd::corpus::{TokenExample, read_examples};
use suffixd::speculate::{SpecMode, SpecParams, Speculator};
use suffixd::tree::{GlobalTree, RequestTree};

fn load(name: &str) -> Vec<TokenExample> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/data")
        .join(name);
    read_examples(&path, None)
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

fn build(warm: &[TokenExample], depth: usize) -> GlobalTree {
    build_with(warm, depth, 1)
}

/// The tree of all warm responses, built by `threads` threads.
fn build_with(warm: &[TokenExample], depth: usize, threads: usize) -> GlobalTree {
    let seqs = warm
        .iter()
        .enumerate()
        .map(|(i, ex)| (i as u64, &ex.response));
    GlobalTree::build_with_threads(depth, seqs, threads).unwrap()
}

/// The same tree, one insert at a time.
fn insert_one_by_one(warm: &[TokenExample], depth: usize) -> GlobalTree {
    let mut t = GlobalTree::new(depth).unwrap();
    for (i, ex) in warm.iter().enumerate() {
        t.insert(i as u64, &ex.response).unwrap();
    }
    t
}

/// (request tree, context) pairs at every 7th step of each test response, as a decoder
/// would present them.
fn contexts(test: &[TokenExample], params: &SpecParams) -> Vec<(RequestTree, Vec<u32>)> {
    let mut out = Vec::new();
    for ex in test.iter().take(30) {
        for cut in (0..ex.response.len()).step_by(7) {
            let mut r = RequestTree::new(&ex.prompt, params.request_depth());
            r.extend(&ex.response[..cut]);
            let ctx: Vec<u32> = ex
                .prompt
                .iter()
                .chain(&ex.response[..cut])
                .copied()
                .collect();
            out.push((r, ctx));
        }
    }
    out
}

/// One benchmark: speculation on each of `cases` in turn, with one speculator carried
/// from call to call as a decoder would.
fn bench_contexts(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: String,
    cases: &[(RequestTree, Vec<u32>)],
    tree: &GlobalTree,
    params: &SpecParams,
) {
    let mut spec = Speculator::new();
    let mut i = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            let (r, ctx) = &cases[i % cases.len()];
            i += 1;
            black_box(spec.speculate(Some(r), tree, ctx, params))
        })
    });
}

fn bench_speculate(c: &mut Criterion) {
    let warm = load("warm.jsonl.zst");
    let test = load("test.jsonl.zst");
    let tree = build(&warm, 24);
    let mut group = c.benchmark_group("speculate");
    for mode in [SpecMode::Paper, SpecMode::Extended] {
        for shape in [false, true] {
            let params = SpecParams {
                mode,
                tree: shape,
                ..SpecParams::default()
            };
            let cases = contexts(&test, &params);
            let name = format!("{mode:?}/{}", if shape { "tree" } else { "path" }).to_lowercase();
            bench_contexts(&mut group, name, &cases, &tree, &params);
        }
    }
    group.finish();
}

/// The adversarial streams of `tools/make-repetitive-streams.py`, built in place: a
/// 16k-token run of one token, a 7-token pattern repeated to 16k tokens (the reply
/// starting the pattern over), and ordinary replies that fall into an 11-token loop.
fn repetitive_examples(test: &[TokenExample]) -> Vec<(&'static str, Vec<TokenExample>)> {
    let run = TokenExample {
        prompt: vec![4242; 16_000],
        response: vec![4242; 128],
    };
    let pattern = [311u32, 9001, 27, 4242, 1337, 80, 5150];
    let periodic = |n: usize| {
        pattern
            .iter()
            .copied()
            .cycle()
            .take(n)
            .collect::<Vec<u32>>()
    };
    let period = TokenExample {
        prompt: periodic(16_000),
        response: periodic(128),
    };
    let loops = test
        .iter()
        .filter(|ex| ex.response.len() >= 40)
        .take(30)
        .map(|ex| {
            let half = &ex.response[..ex.response.len() / 2];
            let cycle = &ex.response[half.len()..half.len() + 11];
            let mut response = half.to_vec();
            response.extend(
                cycle
                    .iter()
                    .copied()
                    .cycle()
                    .take(ex.response.len() - half.len() + 88),
            );
            TokenExample {
                prompt: ex.prompt[..ex.prompt.len().min(800)].to_vec(),
                response,
            }
        })
        .collect();
    vec![
        ("runs", vec![run]),
        ("periods", vec![period]),
        ("loops", loops),
    ]
}

/// Speculation on repetitive text (issue 21): every call should cost about what an
/// ordinary one does, whatever the repetition.
fn bench_speculate_repetitive(c: &mut Criterion) {
    let warm = load("warm.jsonl.zst");
    let test = load("test.jsonl.zst");
    let tree = build(&warm, 24);
    let mut group = c.benchmark_group("speculate_repetitive");
    for (stream, examples) in repetitive_examples(&test) {
        for (mode, shape) in [
            (SpecMode::Extended, false),
            (SpecMode::Extended, true),
            (SpecMode::Paper, false),
        ] {
            let params = SpecParams {
                mode,
                tree: shape,
                ..SpecParams::default()
            };
            let cases = contexts(&examples, &params);
            let shape = if shape { "tree" } else { "path" };
            let name = format!("{stream}/{mode:?}/{shape}").to_lowercase();
            bench_contexts(&mut group, name, &cases, &tree, &params);
        }
    }
    group.finish();
}

fn bench_update(c: &mut Criterion) {
    let warm = load("warm.jsonl.zst");
    let test = load("test.jsonl.zst");
    let tree = build(&warm, 24);
    let response = &test[0].response;
    let mut group = c.benchmark_group("update");
    group.throughput(criterion::Throughput::Elements(response.len() as u64));
    group.bench_function("append_response", |b| {
        b.iter_batched_ref(
            || tree.clone(),
            |t| t.insert(u64::MAX, black_box(response)).unwrap(),
            BatchSize::LargeInput,
        )
    });
    let mut with = tree.clone();
    with.insert(u64::MAX, response).unwrap();
    group.bench_function("remove_response", |b| {
        b.iter_batched_ref(
            || with.clone(),
            |t| assert!(t.remove(u64::MAX)),
            BatchSize::LargeInput,
        )
    });
    let prompt = &test.iter().max_by_key(|e| e.prompt.len()).unwrap().prompt;
    group.throughput(criterion::Throughput::Elements(prompt.len() as u64));
    group.bench_function("start_request_longest_prompt", |b| {
        b.iter(|| black_box(RequestTree::new(black_box(prompt), usize::MAX)))
    });
    group.finish();
}

fn bench_build(c: &mut Criterion) {
    let warm = load("warm.jsonl.zst");
    let tokens: u64 = warm.iter().map(|e| e.response.len() as u64).sum();
    let mut group = c.benchmark_group("build");
    group.sample_size(10);
    group.throughput(criterion::Throughput::Elements(tokens));
    group.bench_function("warm_tree_depth24_inserts", |b| {
        b.iter(|| black_box(insert_one_by_one(&warm, 24)))
    });
    group.bench_function("warm_tree_depth24", |b| {
        b.iter(|| black_box(build(&warm, 24)))
    });
    group.bench_function("warm_tree_depth24_2_threads", |b| {
        b.iter(|| black_box(build_with(&warm, 24, 2)))
    });
    group.bench_function("warm_tree_depth64", |b| {
        b.iter(|| black_box(build(&warm, 64)))
    });
    group.finish();
}

criterion_group!(
    benches,
    bench_speculate,
    bench_speculate_repetitive,
    bench_update,
    bench_build
);
criterion_main!(benches);
