//! Property tests of the speculation core against naive references:
//! - counts by brute force over the stored sequences;
//! - the arena's invariants under appends interleaved with removals;
//! - a threaded build against one-by-one inserts;
//! - drafts against a literal implementation of the paper's Algorithm 1;
//! - the pruned search over p against the exhaustive loop;
//! - snapshots: a frozen tree gives exactly the drafts of the tree it was written from,
//!   and base + delta − evicted gives the counts and children of one tree of what is
//!   left, on bases with sorted and unsorted wide lists.

use proptest::prelude::*;
use suffixd::speculate::{Draft, SpecMode, SpecParams, Speculator};
use suffixd::store::snapshot::{NamespaceInput, Snapshot, TokenizerId, write_snapshot};
use suffixd::store::{Layered, LayeredCursor};
use suffixd::tree::{GlobalIndex, GlobalTree, RequestTree};

const VOCAB: u32 = 5;

/// COUNT(path) by brute force: occurrences of `path` in `seqs`, paths of at most `depth`.
fn naive_count(seqs: &[Vec<u32>], path: &[u32], depth: usize) -> u32 {
    if path.len() > depth {
        return 0;
    }
    seqs.iter()
        .map(|s| {
            if path.is_empty() {
                return s.len() as u32;
            }
            s.windows(path.len()).filter(|w| *w == path).count() as u32
        })
        .sum()
}

fn seqs_strategy() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(0..VOCAB, 0..30), 1..7)
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u32>),
    Remove(usize),
}

fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::collection::vec(0..VOCAB, 0..25).prop_map(Op::Insert),
            2 => (0usize..8).prop_map(Op::Remove),
        ],
        1..25,
    )
}

/// What a view says of a path's children: each child's (token, count), and the most
/// likely child.
type ChildrenAndBest = (Vec<(u32, u32)>, Option<(u32, u32)>);

/// Every path of length 0..=depth+1 over the vocabulary that occurs, plus some that do not.
fn probe_paths(seqs: &[Vec<u32>], depth: usize) -> Vec<Vec<u32>> {
    let mut out = vec![vec![], vec![VOCAB + 1]];
    for s in seqs {
        for i in 0..s.len() {
            for l in 1..=(depth + 1).min(s.len() - i) {
                out.push(s[i..i + l].to_vec());
            }
        }
    }
    out
}

/// The min and max SCORE that Algorithm 1 can give for pattern length `p` over every way
/// of breaking ties between equally frequent children, and whether `draft` is one of the
/// greedy paths (each token a most frequent child, each probability exact).
struct Naive<'a> {
    count: &'a dyn Fn(&[u32]) -> u32,
    params: SpecParams,
    depth: usize,
}

impl Naive<'_> {
    fn children(&self, path: &[u32]) -> Vec<(u32, u32)> {
        if path.len() >= self.depth {
            return vec![];
        }
        (0..VOCAB)
            .filter_map(|v| {
                let mut q = path.to_vec();
                q.push(v);
                let c = (self.count)(&q);
                (c > 0).then_some((v, c))
            })
            .collect()
    }

    fn budget(&self, p: usize) -> usize {
        ((p as f32 * self.params.spec_factor + self.params.spec_offset + 1e-6) as usize)
            .min(self.params.max_spec)
    }

    /// All scores reachable by greedy linear expansion from `path`.
    fn scores(&self, path: &mut Vec<u32>, prob: f32, left: usize, acc: f32, out: &mut Vec<f32>) {
        let kids = self.children(path);
        let total = (self.count)(path);
        let Some(max) = kids.iter().map(|k| k.1).max() else {
            out.push(acc);
            return;
        };
        let next = prob * (max as f32 / total as f32);
        if left == 0 || next < self.params.min_prob {
            out.push(acc);
            return;
        }
        for (v, c) in kids.into_iter().filter(|k| k.1 == max) {
            let _ = c;
            path.push(v);
            self.scores(path, next, left - 1, acc + next, out);
            path.pop();
        }
    }

    fn score_range(&self, window: &[u32], p: usize) -> Option<(f32, f32)> {
        let mut path = window[window.len() - p..].to_vec();
        if (self.count)(&path) == 0 {
            return None;
        }
        let mut out = Vec::new();
        self.scores(&mut path, 1.0, self.budget(p), 0.0, &mut out);
        Some((
            out.iter().cloned().fold(f32::INFINITY, f32::min),
            out.iter().cloned().fold(f32::NEG_INFINITY, f32::max),
        ))
    }

    /// Checks that `d` is a greedy path from its match and ends where Algorithm 1 ends.
    fn check_path(&self, window: &[u32], d: &Draft) -> Result<(), String> {
        let p = d.match_len;
        let mut path = window[window.len() - p..].to_vec();
        let mut prob = 1.0f32;
        for (i, &t) in d.tokens.iter().enumerate() {
            let kids = self.children(&path);
            let total = (self.count)(&path);
            let max = kids.iter().map(|k| k.1).max().ok_or("token past a leaf")?;
            let c = kids
                .iter()
                .find(|k| k.0 == t)
                .map(|k| k.1)
                .ok_or("token not a child")?;
            if c != max {
                return Err(format!("token {i} has count {c}, the best child {max}"));
            }
            prob *= c as f32 / total as f32;
            if prob != d.probs[i] || d.parents[i] != i as i32 - 1 {
                return Err(format!(
                    "token {i}: prob {} parent {}, want {prob}",
                    d.probs[i], d.parents[i]
                ));
            }
            path.push(t);
        }
        if d.tokens.len() < self.budget(p) {
            let kids = self.children(&path);
            if let Some(max) = kids.iter().map(|k| k.1).max()
                && prob * (max as f32 / (self.count)(&path) as f32) >= self.params.min_prob
            {
                return Err("draft stopped early".into());
            }
        }
        Ok(())
    }

    /// Checks a whole paper-mode linear draft for `window` (the last `depth` tokens).
    fn check(&self, window: &[u32], d: &Draft) -> Result<(), String> {
        let (mut lo, mut hi) = (0.0f32, 0.0f32);
        for p in 1..window.len() {
            match self.score_range(window, p) {
                Some((a, b)) => {
                    lo = lo.max(a);
                    hi = hi.max(b);
                }
                None => break,
            }
        }
        if d.is_empty() {
            return if hi == 0.0 {
                Ok(())
            } else {
                Err(format!("empty draft, but {hi} was possible"))
            };
        }
        self.check_path(window, d)?;
        if d.score < lo || d.score > hi {
            return Err(format!(
                "score {} outside what Algorithm 1 gives, {lo}..={hi}",
                d.score
            ));
        }
        Ok(())
    }
}

/// A global tree holding `seqs` as sequences 0, 1, …
fn global_tree(seqs: &[Vec<u32>], depth: usize) -> GlobalTree {
    let mut t = GlobalTree::new(depth).unwrap();
    for (i, s) in seqs.iter().enumerate() {
        t.insert(i as u64, s).unwrap();
    }
    t
}

/// Checks a paper-mode linear draft for `context` against Algorithm 1 over `seqs`.
fn check_algorithm_1(
    seqs: &[Vec<u32>],
    context: &[u32],
    d: &Draft,
    params: SpecParams,
) -> Result<(), String> {
    let depth = params.max_depth;
    let count = |p: &[u32]| naive_count(seqs, p, depth);
    let naive = Naive {
        count: &count,
        params,
        depth,
    };
    naive.check(&context[context.len().saturating_sub(depth)..], d)
}

/// Both trees give the same draft for `context` (tokens, parents and score), in the
/// given shape and mode, with the request tree over `context` beside them.
fn same_drafts<A: GlobalIndex, B: GlobalIndex>(
    a: &A,
    b: &B,
    context: &[u32],
    depth: usize,
    tree_shape: bool,
    extended: bool,
) -> Result<(), TestCaseError> {
    let mut params = paper(depth, 8, 0.1, tree_shape);
    if extended {
        params.mode = SpecMode::Extended;
    }
    let request = RequestTree::new(context, params.request_depth());
    let da = Speculator::<A::Cursor>::default().speculate(Some(&request), a, context, &params);
    let db = Speculator::<B::Cursor>::default().speculate(Some(&request), b, context, &params);
    prop_assert_eq!(&da.tokens, &db.tokens);
    prop_assert_eq!(&da.parents, &db.parents);
    prop_assert_eq!(da.score, db.score);
    Ok(())
}

fn paper(depth: usize, max_spec: usize, min_prob: f32, tree: bool) -> SpecParams {
    SpecParams {
        max_depth: depth,
        max_spec,
        spec_factor: 1.0,
        spec_offset: 0.0,
        min_prob,
        tree,
        mode: SpecMode::Paper,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn global_counts_equal_brute_force(seqs in seqs_strategy(), depth in 1usize..8) {
        let t = global_tree(&seqs, depth);
        t.check_integrity().map_err(|e| TestCaseError::fail(e.to_string()))?;
        for path in probe_paths(&seqs, depth) {
            prop_assert_eq!(t.count_of(&path), naive_count(&seqs, &path, depth), "path {:?}", path);
        }
    }

    #[test]
    fn appends_interleaved_with_removals_keep_counts(ops in ops_strategy(), depth in 1usize..8, compact_at in 0usize..30) {
        let mut t = GlobalTree::new(depth).unwrap();
        let mut live: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut next = 0u64;
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Insert(s) => {
                    t.insert(next, &s).unwrap();
                    live.push((next, s));
                    next += 1;
                }
                Op::Remove(k) => {
                    if live.is_empty() {
                        prop_assert!(!t.remove(next + 100));
                    } else {
                        let (id, _) = live.remove(k % live.len());
                        prop_assert!(t.remove(id));
                    }
                }
            }
            if step == compact_at {
                t.compact();
            }
            t.check_integrity().map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let seqs: Vec<Vec<u32>> = live.iter().map(|x| x.1.clone()).collect();
        prop_assert_eq!(t.cached_tokens(), seqs.iter().map(|s| s.len() as u64).sum::<u64>());
        for path in probe_paths(&seqs, depth) {
            prop_assert_eq!(t.count_of(&path), naive_count(&seqs, &path, depth), "path {:?}", path);
        }
    }

    #[test]
    fn threaded_build_equals_sequential_inserts(
        seqs in seqs_strategy(),
        depth in 1usize..8,
        threads in 1usize..5,
        context in prop::collection::vec(0..VOCAB, 1..12),
        tree_shape in any::<bool>(),
        extended in any::<bool>(),
        more in prop::collection::vec(0..VOCAB, 0..25),
    ) {
        let one_by_one = global_tree(&seqs, depth);
        let mut built = GlobalTree::build_with_threads(
            depth,
            seqs.iter().enumerate().map(|(i, s)| (i as u64, s.as_slice())),
            threads,
        )
        .unwrap();
        built.check_integrity().map_err(|e| TestCaseError::fail(e.to_string()))?;
        for path in probe_paths(&seqs, depth) {
            prop_assert_eq!(built.count_of(&path), naive_count(&seqs, &path, depth), "path {:?}", path);
        }
        // Same shape below the root, so the same drafts, ties included.
        same_drafts(&one_by_one, &built, &context, depth, tree_shape, extended)?;
        // A built tree takes appends and removals like any other.
        built.insert(seqs.len() as u64, &more).unwrap();
        prop_assert!(built.remove(0));
        built.check_integrity().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut left: Vec<Vec<u32>> = seqs[1..].to_vec();
        left.push(more);
        for path in probe_paths(&left, depth) {
            prop_assert_eq!(built.count_of(&path), naive_count(&left, &path, depth), "path {:?}", path);
        }
    }

    #[test]
    fn request_counts_equal_brute_force(prompt in prop::collection::vec(0..VOCAB, 0..40), more in prop::collection::vec(0..VOCAB, 0..20), depth in 1usize..8) {
        let mut r = RequestTree::new(&prompt, depth);
        r.extend(&more);
        let all: Vec<u32> = prompt.iter().chain(&more).copied().collect();
        let seqs = vec![all];
        for path in probe_paths(&seqs, depth) {
            prop_assert_eq!(r.count_of(&path), naive_count(&seqs, &path, depth), "path {:?}", path);
        }
    }

    #[test]
    fn global_drafts_follow_algorithm_1(
        seqs in seqs_strategy(),
        ctx in prop::collection::vec(0..VOCAB, 1..16),
        depth in 2usize..9,
        max_spec in 1usize..10,
        min_prob in 0.0f32..0.6,
    ) {
        let t = global_tree(&seqs, depth);
        let params = paper(depth, max_spec, min_prob, false);
        let d = Speculator::new().speculate_global(&t, &ctx, &params);
        check_algorithm_1(&seqs, &ctx, &d, params).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn request_drafts_follow_algorithm_1(
        prompt in prop::collection::vec(0..VOCAB, 1..50),
        depth in 2usize..9,
        max_spec in 1usize..10,
        min_prob in 0.0f32..0.6,
    ) {
        let r = RequestTree::new(&prompt, depth);
        let params = paper(depth, max_spec, min_prob, false);
        let d = Speculator::new().speculate_request(&r, &prompt, &params);
        check_algorithm_1(std::slice::from_ref(&prompt), &prompt, &d, params).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn pruned_search_equals_exhaustive(
        seqs in seqs_strategy(),
        prompt in prop::collection::vec(0..VOCAB, 0..40),
        depth in 2usize..9,
        max_spec in 1usize..12,
        min_prob in 0.0f32..0.5,
        tree in any::<bool>(),
        extended in any::<bool>(),
    ) {
        let t = global_tree(&seqs, depth);
        let mut params = paper(depth, max_spec, min_prob, tree);
        if extended {
            params.mode = SpecMode::Extended;
        }
        let split = prompt.len() / 2;
        let mut r = RequestTree::new(&prompt[..split], params.request_depth());
        r.extend(&prompt[split..]);
        let mut bounded = Speculator::new();
        let fast = bounded.speculate(Some(&r), &t, &prompt, &params);
        let slow = Speculator::exhaustive().speculate(Some(&r), &t, &prompt, &params);
        // Exact wherever the search ended under its bound on drafts grown.
        if !bounded.last_call_work().1 {
            prop_assert_eq!(fast, slow);
        }
    }

    #[test]
    fn repetitive_contexts_grow_a_bounded_number_of_drafts_and_stay_exact_under_it(
        pattern in prop::collection::vec(0..VOCAB, 1..8),
        repeats in prop_oneof![2usize..60, 60usize..400],
        reply in 0usize..40,
        cut in 0usize..8,
        seqs in seqs_strategy(),
        tree in any::<bool>(),
    ) {
        // A prompt that repeats a short pattern, and a reply that goes on repeating it:
        // every match length has a bound above the best score. Where the prompt stops
        // inside a copy (`cut`), the reply starts the pattern over, out of phase: each of
        // its occurrences then matches back to a different length.
        let cut = cut % pattern.len();
        let prompt: Vec<u32> = pattern.iter().copied().cycle().take(pattern.len() * repeats + cut).collect();
        let context: Vec<u32> = prompt.iter().chain(pattern.iter().cycle().take(reply)).copied().collect();
        let t = global_tree(&seqs, 8);
        let mut params = paper(8, 32, 0.1, tree);
        params.mode = SpecMode::Extended;
        let mut r = RequestTree::new(&prompt, params.request_depth());
        r.extend(&context[prompt.len()..]);
        let mut bounded = Speculator::new();
        let fast = bounded.speculate(Some(&r), &t, &context, &params);
        let (grown, capped) = bounded.last_call_work();
        // Three searches at most (request tree, global tree, both), each capped.
        prop_assert!(grown <= 3 * suffixd::speculate::MAX_GROWN_PER_CALL, "{grown} drafts grown");
        let rescored = bounded.last_call_rescored();
        prop_assert!(rescored <= 3 * suffixd::speculate::MAX_RESCORED_PER_CALL, "{rescored} examined");
        let mut exhaustive = Speculator::exhaustive();
        let slow = exhaustive.speculate(Some(&r), &t, &context, &params);
        if !capped {
            prop_assert_eq!(&fast, &slow);
        }
        // Capped or not, it never scores above the exhaustive search's best.
        prop_assert!(fast.score <= slow.score + 1e-4);
    }

    #[test]
    fn cursors_carried_between_calls_give_the_same_drafts(
        seqs in seqs_strategy(),
        prompt in prop::collection::vec(0..VOCAB, 0..30),
        generated in prop::collection::vec(0..VOCAB, 0..40),
        chunk in 1usize..4,
        depth in 2usize..9,
        change_at in 0usize..15,
        other in prop::collection::vec(0..VOCAB, 0..20),
        extended in any::<bool>(),
        copy in any::<bool>(),
    ) {
        // A response that first repeats its prompt gets request-tree drafts that cannot
        // be beaten, so calls skip the global search and later ones catch up.
        let generated: Vec<u32> = if copy {
            prompt.iter().chain(&generated).copied().collect()
        } else {
            generated
        };
        let mut t = global_tree(&seqs, depth);
        let mut params = paper(depth, 8, 0.1, false);
        if extended {
            params.mode = SpecMode::Extended;
        }
        let mut carried = Speculator::new();
        let mut r = RequestTree::new(&prompt, params.request_depth());
        let mut ctx = prompt.clone();
        for (step, piece) in generated.chunks(chunk).enumerate() {
            let a = carried.speculate(Some(&r), &t, &ctx, &params);
            let b = Speculator::new().speculate(Some(&r), &t, &ctx, &params);
            prop_assert_eq!(a, b, "step {}", step);
            if step == change_at {
                // The tree changes between two calls of the same request.
                t.insert(1000, &other).unwrap();
            }
            if step % 3 == 2 {
                // Another request's context in between.
                let o = RequestTree::new(&other, params.request_depth());
                let a = carried.speculate(Some(&o), &t, &other, &params);
                let b = Speculator::new().speculate(Some(&o), &t, &other, &params);
                prop_assert_eq!(a, b);
            }
            r.extend(piece);
            ctx.extend_from_slice(piece);
        }
    }

    #[test]
    fn drafts_are_topologically_ordered(
        seqs in seqs_strategy(),
        prompt in prop::collection::vec(0..VOCAB, 0..40),
        tree in any::<bool>(),
    ) {
        let mut t = GlobalTree::new(6).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            t.insert(i as u64, s).unwrap();
        }
        let params = SpecParams { max_depth: 6, tree, ..SpecParams::default() };
        let r = RequestTree::new(&prompt, params.request_depth());
        let d = Speculator::new().speculate(Some(&r), &t, &prompt, &params);
        prop_assert!(d.len() <= params.max_spec);
        prop_assert_eq!(d.parents.len(), d.len());
        prop_assert_eq!(d.probs.len(), d.len());
        for (i, &p) in d.parents.iter().enumerate() {
            prop_assert!(p < i as i32 && p >= -1);
        }
        let sum: f32 = d.probs.iter().sum();
        prop_assert!((sum - d.score).abs() < 1e-4);
    }
}

/// Tokens of the corpora that make wide nodes: more children than the arena lists
/// without an index.
const WIDE_VOCAB: u32 = 60;

/// Sequences in which token 0 precedes almost every other token, so that the root and
/// the node of 0 get wide (indexed) children lists, with uneven counts.
fn wide_seqs_strategy() -> impl Strategy<Value = Vec<Vec<u32>>> {
    let token = prop_oneof![3 => 1..8u32, 1 => 1..WIDE_VOCAB];
    prop::collection::vec(prop::collection::vec(token, 0..40), 1..8).prop_map(|seqs| {
        seqs.into_iter()
            .map(|s| s.into_iter().flat_map(|t| [0, t]).collect())
            .collect()
    })
}

/// Write `tree` as a one-namespace snapshot and open it again from the file.
fn frozen_copy(tree: &GlobalTree, dir: &std::path::Path) -> Snapshot {
    let path = dir.join("snap-000001.sfxd");
    let meta: Vec<_> = tree
        .ids()
        .map(|id| suffixd::store::snapshot::SeqMeta {
            id,
            ..Default::default()
        })
        .collect();
    write_snapshot(
        &suffixd::store::DiskDirectory,
        &path,
        TokenizerId::UNKNOWN,
        (0, 0),
        &[NamespaceInput {
            name: "default",
            tree,
            meta: &meta,
        }],
    )
    .unwrap();
    Snapshot::open(&path, None).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn snapshot_drafts_equal_in_memory_drafts(
        seqs in seqs_strategy(),
        removed in prop::collection::vec(0usize..7, 0..3),
        context in prop::collection::vec(0..VOCAB, 1..12),
        depth in 2usize..8,
        tree_shape in any::<bool>(),
        extended in any::<bool>(),
    ) {
        let mut mem = global_tree(&seqs, depth);
        for r in removed {
            mem.remove(r as u64);
        }
        mem.compact();
        let dir = tempfile::tempdir().unwrap();
        let snap = frozen_copy(&mem, dir.path());
        snap.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let frozen = snap.namespaces().unwrap().pop().unwrap().tree;
        for path in probe_paths(&seqs, depth) {
            prop_assert_eq!(frozen.count_of(&path), mem.count_of(&path));
        }
        same_drafts(&mem, &frozen, &context, depth, tree_shape, extended)?;
    }

    #[test]
    fn base_plus_delta_minus_evicted_counts_as_one_tree(
        base_seqs in seqs_strategy(),
        delta_seqs in seqs_strategy(),
        evict in prop::collection::vec(any::<bool>(), 7),
        depth in 1usize..7,
    ) {
        let base_mem = global_tree(&base_seqs, depth);
        let dir = tempfile::tempdir().unwrap();
        let snap = frozen_copy(&base_mem, dir.path());
        let base = snap.namespaces().unwrap().pop().unwrap().tree;
        let mut delta = GlobalTree::new(depth).unwrap();
        for (i, s) in delta_seqs.iter().enumerate() {
            delta.insert(100 + i as u64, s).unwrap();
        }
        let mut evicted = GlobalTree::new(depth).unwrap();
        let mut left: Vec<Vec<u32>> = delta_seqs.clone();
        for (i, s) in base_seqs.iter().enumerate() {
            if evict[i] {
                evicted.insert(i as u64, s).unwrap();
            } else {
                left.push(s.clone());
            }
        }
        let view = Layered::new(Some(&base), &delta, &evicted);
        let mut probes = probe_paths(&base_seqs, depth);
        probes.extend(probe_paths(&delta_seqs, depth));
        for path in probes {
            let want = naive_count(&left, &path, depth);
            let got = view.walk(&path).map_or(0, |c: LayeredCursor| {
                suffixd::tree::Expand::count(&view, &c)
            });
            prop_assert_eq!(got, want, "path {:?}", path);
        }
    }

    #[test]
    fn base_plus_delta_minus_evicted_has_the_children_of_one_tree(
        base_seqs in wide_seqs_strategy(),
        delta_seqs in wide_seqs_strategy(),
        evict in prop::collection::vec(any::<bool>(), 8),
        depth in 1usize..5,
        min_count in 1u32..4,
        frozen in any::<bool>(),
    ) {
        // A frozen base is built and written sorted; an in-memory one grown by inserts
        // is not, and the view must scan its lists without the sorted shortcut.
        let dir = tempfile::tempdir().unwrap();
        let inserted = global_tree(&base_seqs, depth);
        let built = GlobalTree::build(depth, base_seqs.iter().enumerate().map(|(i, s)| (i as u64, s)))
            .unwrap();
        built.check_integrity().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let snap = frozen_copy(&built, dir.path());
        snap.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let frozen_base = snap.namespaces().unwrap().pop().unwrap().tree;
        let mut delta = GlobalTree::new(depth).unwrap();
        for (i, s) in delta_seqs.iter().enumerate() {
            delta.insert(100 + i as u64, s).unwrap();
        }
        let mut evicted = GlobalTree::new(depth).unwrap();
        let mut left: Vec<Vec<u32>> = delta_seqs.clone();
        for (i, s) in base_seqs.iter().enumerate() {
            if evict[i] {
                evicted.insert(i as u64, s).unwrap();
            } else {
                left.push(s.clone());
            }
        }
        let mut probes = probe_paths(&base_seqs, depth - 1);
        probes.extend(probe_paths(&delta_seqs, depth - 1));
        let check = |view: &dyn Fn(&[u32], u32) -> Option<ChildrenAndBest>| {
            for path in probes.iter().filter(|p| p.len() < depth) {
                let mut want: Vec<(u32, u32)> = (0..=WIDE_VOCAB)
                    .map(|t| {
                        let mut next = path.clone();
                        next.push(t);
                        (t, naive_count(&left, &next, depth))
                    })
                    .filter(|&(_, n)| n >= min_count)
                    .collect();
                let Some((mut got, best)) = view(path, min_count) else {
                    prop_assert!(want.is_empty(), "path {:?} missing", path);
                    continue;
                };
                prop_assert!(got.windows(2).all(|w| w[0].1 >= w[1].1), "not sorted: {:?}", got);
                // The most likely child is the first child, ties included.
                prop_assert_eq!(best, got.first().copied(), "path {:?}", path);
                got.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(got, want, "path {:?}", path);
            }
            Ok(())
        };
        fn read<S: suffixd::tree::Storage>(
            view: &Layered<'_, S>,
            path: &[u32],
            min_count: u32,
        ) -> Option<ChildrenAndBest> {
            use suffixd::tree::Expand;
            let c = view.walk(path)?;
            let mut kids = Vec::new();
            view.children(&c, min_count, &mut kids);
            for k in &kids {
                assert_eq!(view.count(&k.cursor), k.count, "a child's cursor disagrees");
            }
            let best = view.best_child(&c, min_count).map(|k| (k.token, k.count));
            Some((kids.iter().map(|k| (k.token, k.count)).collect(), best))
        }
        if frozen {
            let view = Layered::new(Some(&frozen_base), &delta, &evicted);
            check(&|p, m| read(&view, p, m))?;
        } else {
            let view = Layered::over(Some(&inserted), &delta, &evicted);
            check(&|p, m| read(&view, p, m))?;
        }
    }
}

/// The adversarial case of the bound: a 16,000-token run of one token, with a reply that
/// goes on with it. Unbounded, the search grows a long draft for dozens of match lengths
/// per call; bounded, at most a few times `MAX_GROWN_PER_CALL`, and it still drafts the run.
#[test]
fn a_long_run_of_one_token_grows_a_bounded_number_of_drafts() {
    use suffixd::speculate::MAX_GROWN_PER_CALL;
    let prompt = vec![7u32; 16_000];
    let mut r = RequestTree::new(&prompt, SpecParams::default().request_depth());
    let t = suffixd::tree::GlobalTree::new(24).unwrap();
    let mut s = Speculator::new();
    let mut unbounded = Speculator::exhaustive();
    let mut context = prompt.clone();
    let mut capped_calls = 0;
    for _ in 0..20 {
        let d = s.speculate(Some(&r), &t, &context, &SpecParams::default());
        let (grown, capped) = s.last_call_work();
        assert!(grown <= 3 * MAX_GROWN_PER_CALL, "{grown} drafts grown");
        // The bounds from the occurrences rank the winning p first and rule out the
        // rest, before the cap is needed.
        assert!(grown <= 2, "{grown} drafts grown");
        capped_calls += capped as usize;
        assert!(!d.is_empty() && d.tokens.iter().all(|&x| x == 7));
        unbounded.speculate(Some(&r), &t, &context, &SpecParams::default());
        assert!(
            unbounded.last_call_work().0 > grown,
            "the bound did not bind"
        );
        r.extend(&[7]);
        context.push(7);
    }
    assert_eq!(capped_calls, 0);
}

/// A reply that repeats a short period out of phase with the prompt's copies of it (the
/// prompt stops inside a copy, the reply starts the pattern over): every occurrence in
/// the reply matches back to the junction, each to its own length, and dozens of match
/// lengths have bounds above the best score. Each search examines at most
/// `MAX_RESCORED_PER_CALL` of them after its first draft, the cap is reached, and the
/// drafts still follow the period and score no better than the exhaustive search's.
#[test]
fn a_reply_out_of_phase_examines_a_bounded_number_of_candidates() {
    use suffixd::speculate::MAX_RESCORED_PER_CALL;
    let pattern = [5u32, 5, 9];
    let prompt: Vec<u32> = pattern.iter().copied().cycle().take(1000).collect();
    let params = SpecParams::default();
    let mut r = RequestTree::new(&prompt, params.request_depth());
    let t = suffixd::tree::GlobalTree::new(24).unwrap();
    let mut s = Speculator::new();
    let mut context = prompt.clone();
    let mut capped_calls = 0;
    let mut max_grown = 0;
    for &next in pattern.iter().cycle().take(128) {
        let d = s.speculate(Some(&r), &t, &context, &params);
        let rescored = s.last_call_rescored();
        assert!(
            rescored <= 3 * MAX_RESCORED_PER_CALL,
            "{rescored} candidates examined"
        );
        let (grown, capped) = s.last_call_work();
        max_grown = max_grown.max(grown);
        capped_calls += capped as usize;
        let slow = Speculator::exhaustive().speculate(Some(&r), &t, &context, &params);
        assert!(d.score <= slow.score + 1e-4);
        r.extend(&[next]);
        context.push(next);
    }
    assert!(capped_calls > 0, "the cap was never reached");
    // One draft grown for the request tree and one for the response read with the
    // global tree: the response's match lengths that read the same occurrences as a
    // longer one are not grown again (4 per call before).
    assert!(max_grown <= 2, "{max_grown} drafts grown in one call");
}

/// Issue 21: on runs, short periods and looping replies, at prompts of 1k to 32k tokens,
/// in both modes and both draft shapes, a call visits a bounded number of occurrences
/// and grows a bounded number of drafts, and each draft follows the repetition.
#[test]
fn repetitive_prompts_of_any_length_cost_a_bounded_amount_of_work() {
    use suffixd::speculate::{ENOUGH_FULL_MATCHES, MAX_GROWN_PER_CALL, SpecMode};
    use suffixd::tree::MAX_OCCURRENCES;
    let global = suffixd::tree::GlobalTree::new(24).unwrap();
    let patterns: [&[u32]; 3] = [&[7], &[3, 1, 4, 1, 5, 9, 2], &[10, 11, 12, 10, 13]];
    for len in [1_000usize, 8_000, 32_000] {
        for pattern in patterns {
            let prompt: Vec<u32> = pattern.iter().copied().cycle().take(len).collect();
            for mode in [SpecMode::Extended, SpecMode::Paper] {
                for tree in [false, true] {
                    let params = SpecParams {
                        mode,
                        tree,
                        ..SpecParams::default()
                    };
                    let mut r = RequestTree::new(&prompt, params.request_depth());
                    let mut context = prompt.clone();
                    let mut s = Speculator::new();
                    for step in 0..12 {
                        let d = s.speculate(Some(&r), &global, &context, &params);
                        let visited = s.last_call_occurrences();
                        let (grown, _) = s.last_call_work();
                        // In extended mode matching stops at enough copies of the whole
                        // window; `10` occurs twice per period of the third pattern, so only
                        // every other occurrence of it is such a copy.
                        let most = match mode {
                            SpecMode::Extended => 2 * ENOUGH_FULL_MATCHES + 1,
                            SpecMode::Paper => MAX_OCCURRENCES,
                        };
                        assert!(visited <= most, "{visited} occurrences visited");
                        assert!(grown <= 3 * MAX_GROWN_PER_CALL, "{grown} drafts grown");
                        assert!(!d.is_empty(), "{len} {pattern:?} {mode:?} step {step}");
                        // The draft's first path continues the pattern.
                        let next = pattern[context.len() % pattern.len()];
                        assert_eq!(d.tokens[0], next, "{len} {pattern:?} {mode:?}");
                        r.extend(&[next]);
                        context.push(next);
                    }
                }
            }
        }
    }
}
