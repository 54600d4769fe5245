//! Speculation latency from the live store while appends and compactions run, against
//! the same readers with the store left alone, in one run.
//!
//! Readers draft for contexts of the bundled test workload from the store's view of the
//! namespace, over and over. Phase `idle`: nothing else runs. Phase `busy`: a writer
//! appends responses (fsync off, so that it writes as fast as it can, with LRU eviction
//! at a token budget) and another thread takes snapshot + compaction back to back.
//! For each phase it prints p50/p99/p99.9/max of the whole draft call, of taking the
//! read access alone (the part that would wait on a writer, were there a lock), and of
//! the last-use mark the model thread makes after each accepted draft (`Store::touch`,
//! which must not wait for a writer either).
//!
//! `cargo bench --bench store_latency` (3 s per phase; `LAT_SECONDS`, `LAT_READERS`
//! override). Under `cargo test` it runs for a moment, as a smoke test. On a machine
//! with fewer cores than threads, preemption shows in the tail of both phases.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use suffixd::corpus::{TokenExample, read_examples};
use suffixd::speculate::{SpecParams, Speculator};
use suffixd::store::LayeredCursor;
use suffixd::store::TokenizerId;
use suffixd::store::live::{Store, StoreConfig};
use suffixd::store::wal::FsyncPolicy;
use suffixd::tree::RequestTree;

fn load(name: &str) -> Vec<TokenExample> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/data")
        .join(name);
    read_examples(&path, None)
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Nanosecond latencies of one phase.
#[derive(Default)]
struct Samples {
    call: Vec<u64>,
    read: Vec<u64>,
    touch: Vec<u64>,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i] as f64 / 1e3
}

fn summary(name: &str, mut xs: Vec<u64>) -> String {
    xs.sort_unstable();
    format!(
        "\"{name}\": {{\"n\": {}, \"p50_us\": {:.2}, \"p99_us\": {:.2}, \"p999_us\": {:.2}, \"max_us\": {:.2}}}",
        xs.len(),
        percentile(&xs, 50.0),
        percentile(&xs, 99.0),
        percentile(&xs, 99.9),
        percentile(&xs, 100.0)
    )
}

/// Readers draft until `stop`; returns every call's latency.
fn readers(
    store: &Arc<Store>,
    contexts: &Arc<Vec<(RequestTree, Vec<u32>)>>,
    ids: &Arc<Vec<u64>>,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Samples {
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (store, contexts, stop) = (store.clone(), contexts.clone(), stop.clone());
            let ids = ids.clone();
            std::thread::spawn(move || {
                let params = SpecParams::default();
                let mut spec: Speculator<LayeredCursor> = Speculator::default();
                let mut s = Samples::default();
                let mut i = r * 7919;
                while !stop.load(Ordering::Relaxed) {
                    let (tree, ctx) = &contexts[i % contexts.len()];
                    i += 1;
                    let t0 = Instant::now();
                    let mut t1 = t0;
                    let draft = store.with_namespace("default", |ns| {
                        t1 = Instant::now();
                        let ns = ns.expect("namespace");
                        spec.speculate(Some(tree), &ns.view(), ctx, &params)
                    });
                    let t2 = Instant::now();
                    std::hint::black_box(draft);
                    // As the model thread does after an accepted draft.
                    store.touch("default", &[ids[i % ids.len()]]);
                    let t3 = Instant::now();
                    s.read.push((t1 - t0).as_nanos() as u64);
                    s.call.push((t2 - t0).as_nanos() as u64);
                    s.touch.push((t3 - t2).as_nanos() as u64);
                }
                s
            })
        })
        .collect();
    let mut all = Samples::default();
    for h in handles {
        let s = h.join().unwrap();
        all.call.extend(s.call);
        all.read.extend(s.read);
        all.touch.extend(s.touch);
    }
    all
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds: f64 = env_or("LAT_SECONDS", if benching { 3.0 } else { 0.2 });
    let n_readers: usize = env_or("LAT_READERS", 2);
    let warm = load("warm.jsonl.zst");
    let test = load("test.jsonl.zst");
    let params = SpecParams::default();
    let contexts: Vec<(RequestTree, Vec<u32>)> = test
        .iter()
        .flat_map(|ex| {
            (0..ex.response.len()).step_by(5).map(move |cut| {
                let mut ctx = ex.prompt.clone();
                ctx.extend_from_slice(&ex.response[..cut]);
                (RequestTree::new(&ctx, params.request_depth()), ctx)
            })
        })
        .collect();
    let contexts = Arc::new(contexts);

    let dir = tempfile::tempdir().unwrap();
    let warm_tokens: u64 = warm.iter().map(|e| e.response.len() as u64).sum();
    let store = Arc::new(
        Store::open(StoreConfig {
            max_depth: params.max_depth,
            fsync: FsyncPolicy::Never,
            budget_tokens: Some(warm_tokens * 3 / 2),
            ..StoreConfig::new(dir.path(), TokenizerId::UNKNOWN)
        })
        .unwrap(),
    );
    let ids: Vec<u64> = warm
        .iter()
        .map(|ex| store.append("default", &ex.response).unwrap())
        .collect();
    let ids = Arc::new(ids);
    store.snapshot().unwrap();

    let run = |busy: bool| -> (Samples, u64, u64) {
        let stop = Arc::new(AtomicBool::new(false));
        let appended = Arc::new(AtomicU64::new(0));
        let compactions = Arc::new(AtomicU64::new(0));
        let mut side = Vec::new();
        if busy {
            let (writer_store, writer_stop, appended) =
                (store.clone(), stop.clone(), appended.clone());
            let responses: Vec<Vec<u32>> = test
                .iter()
                .chain(&warm)
                .map(|e| e.response.clone())
                .collect();
            side.push(std::thread::spawn(move || {
                for r in responses.iter().cycle() {
                    if writer_stop.load(Ordering::Relaxed) {
                        break;
                    }
                    writer_store.append("default", r).unwrap();
                    appended.fetch_add(1, Ordering::Relaxed);
                }
            }));
            let (compact_store, compact_stop, compactions) =
                (store.clone(), stop.clone(), compactions.clone());
            side.push(std::thread::spawn(move || {
                while !compact_stop.load(Ordering::Relaxed) {
                    compact_store.snapshot().unwrap();
                    compactions.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let timer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs_f64(seconds));
                stop.store(true, Ordering::Relaxed);
            })
        };
        let samples = readers(&store, &contexts, &ids, n_readers, &stop);
        timer.join().unwrap();
        for h in side {
            h.join().unwrap();
        }
        (
            samples,
            appended.load(Ordering::Relaxed),
            compactions.load(Ordering::Relaxed),
        )
    };

    let (idle, _, _) = run(false);
    let (busy, appended, compactions) = run(true);
    assert!(
        !idle.call.is_empty() && !busy.call.is_empty(),
        "readers ran"
    );
    if busy.call.len() > 100 {
        assert!(appended > 0, "the writer appended during the busy phase");
    }
    let median = |xs: &[u64]| {
        let mut v = xs.to_vec();
        v.sort_unstable();
        percentile(&v, 50.0)
    };
    let p99 = |xs: &[u64]| {
        let mut v = xs.to_vec();
        v.sort_unstable();
        percentile(&v, 99.0)
    };
    println!(
        "{{\"readers\": {n_readers}, \"seconds_per_phase\": {seconds}, \"busy_appends\": {appended}, \"busy_compactions\": {compactions},\n \"idle\": {{{}, {}, {}}},\n \"busy\": {{{}, {}, {}}},\n \"busy_over_idle\": {{\"call_p50\": {:.3}, \"call_p99\": {:.3}}}}}",
        summary("call", idle.call.clone()),
        summary("read_access", idle.read.clone()),
        summary("touch", idle.touch.clone()),
        summary("call", busy.call.clone()),
        summary("read_access", busy.read.clone()),
        summary("touch", busy.touch.clone()),
        median(&busy.call) / median(&idle.call),
        p99(&busy.call) / p99(&idle.call),
    );
}
