//! Speculation: from a context and two suffix trees to one draft tree (paper §3).
//!
//! For each pattern length p the last p context tokens are matched in a tree, reaching
//! N_p. A draft is grown greedily from N_p by D(N) = D(parent) × COUNT(N) / COUNT(parent),
//! up to MAX_SPEC = min(max_spec, α·p + offset) tokens, and never below `min_prob`. The
//! candidate with the largest SCORE = Σ D(N) wins, across both trees and all p.
//!
//! Two modes, selectable so that changes can be measured against the paper:
//! - [`SpecMode::Paper`] is the paper's algorithm with the reference implementation's
//!   details (context cut to `max_depth`, p < context length, the request tree wins ties,
//!   f32 probabilities), so that drafts compare one to one with ArcticInference.
//! - [`SpecMode::Extended`] (the default) adds two things:
//!   - context beyond the depth limit: the request tree has no depth limit and matches up
//!     to [`EXTENDED_WINDOW`] tokens, and where a global path occurs once its occurrence
//!     is matched further back and read on past the depth limit. A long match earns a
//!     long draft, as MAX_SPEC intends;
//!   - the context's own occurrence at the end of the request tree is left out of its
//!     counts: it has no continuation yet, so it is not evidence;
//!   - a context that occurs exactly once earlier in the request (a copy in progress)
//!     earns the full `max_spec` budget rather than α·p: copying a span of the prompt
//!     then takes one step instead of a geometric ramp of 1, 2, 4… tokens. Drafts get
//!     longer and acceptance per drafted token lower; the verifier's cost-aware cap is
//!     what bounds draft size where verification is not free;
//!   - the response so far as global evidence: the global candidate reads the global
//!     tree and the generated part of the request tree as one, with summed counts (see
//!     `merged`). The reference implementation gets the same by adding responses to its
//!     global tree token by token; suffixd keeps the shared store for completed requests.
//!
//! Candidates are tried from the longest p down, and a p whose best possible score
//! cannot beat the best so far is skipped. This returns exactly the draft the
//! exhaustive loop would (largest score, ties to the longer match) at a fraction of the
//! work.
//!
//! Here: [`Speculator`], the search over both trees. Beside it: `params` (the modes
//! and limits), `draft` (the draft tree handed to the verifier), `cursors` (the
//! global-tree positions one call leaves for the next), `expand` (growing a draft from
//! a node), `bounds` (the upper bounds that let the search skip a p), `rescore` (exact
//! scores without growing) and `merged` (the response so far read as global evidence).

use crate::tree::{GlobalCursor, GlobalIndex, MAX_CURSOR_ENDS, Match, RequestTree};

mod bounds;
mod cursors;
mod draft;
mod expand;
mod merged;
mod params;
mod rescore;
use bounds::OccurrenceBounds;
use cursors::{Extension, GlobalMatches};
pub use draft::{Draft, DraftSource};
use expand::{expand, min_count_for};
use merged::Merged;
pub use params::{SpecMode, SpecParams};
use rescore::PathRescorer;

/// How many context tokens extended mode matches against the request tree, and how far
/// back it follows a unique global occurrence.
pub const EXTENDED_WINDOW: usize = 64;

/// Most drafts grown for one candidate set (one source) in one call. The candidates
/// are tried from the best upper bound down; on ordinary text a few need growing before
/// the rest are ruled out by their bound, but on repetitive text (a run of one token, a
/// short period) dozens of match lengths have bounds above the best score and each
/// grows the same long draft. Beyond this many, the best found so far is kept.
pub const MAX_GROWN_PER_CALL: usize = 8;

/// Most candidates examined for one candidate set in one call once a first draft has
/// been grown. Each costs a pass over the occurrences, to tell its score or to grow it.
/// Where a reply repeats a period out of phase with the prompt's copies of it, every
/// occurrence in the reply matches back to a different length, so dozens of match
/// lengths have bounds above the best score and each is examined to find it loses
/// (up to 14 per call on `tools/spec-adversarial.sh`'s period-3 stream). Beyond this
/// many the best found so far is kept. On ShareGPT the steps are the same with this
/// bound as without; at 6 they are not (2 more in 196,935).
pub const MAX_RESCORED_PER_CALL: usize = 8;

/// In extended mode, how many occurrences of its longest match (the whole window, or at
/// least [`crate::tree::LONG_MATCH`] tokens) the request tree looks for before it stops:
/// a cursor keeps no more, so older ones could only add a longer match further back,
/// while each one costs speculation time on repetitive text.
pub const ENOUGH_FULL_MATCHES: usize = crate::tree::MAX_CURSOR_ENDS;

/// Request-tree candidates are scored along the leading draft's path without growing
/// them (see [`rescore`]) when the context has at least this many earlier occurrences.
const RESCORE_FROM_MATCHES: usize = 32;

/// Room reserved at construction for the request tree's matches: more than ordinary and
/// repetitive contexts list (69 on a reply out of phase with a period-3 prompt), so that
/// no call, the first included, grows the buffers (growing them took 97 reallocations
/// and about half the time of the first call of a process on `tools/spec-adversarial.sh`'s
/// streams).
const RESERVED_MATCHES: usize = 256;

/// Room reserved at construction for each draft (the default `max_spec` is 24).
const RESERVED_DRAFT: usize = 64;

/// Room reserved for the candidate p of a search: p is below 128 (the depth limit, or
/// the extended window).
const RESERVED_CANDIDATES: usize = 128;

/// Reusable speculation state: scratch buffers, so that a call does not allocate, and
/// the global-tree cursors of the previous call, so that the next call on a longer
/// context only steps them over the new tokens.
///
/// `C` is the cursor type of the global index it is used with.
#[derive(Clone)]
pub struct Speculator<C = GlobalCursor> {
    matches: Vec<Match>,
    exhaustive: bool,
    /// The last call's request-tree draft could not be beaten, and the global tree was
    /// not searched.
    skipped_global: bool,
    global: GlobalMatches<C>,
    drafts: Scratch,
    /// How far the request tree's occurrences follow the leading path draft.
    rescorer: PathRescorer,
}

impl<C> Default for Speculator<C> {
    fn default() -> Self {
        Self {
            matches: Vec::with_capacity(RESERVED_MATCHES),
            exhaustive: false,
            skipped_global: false,
            global: GlobalMatches::with_capacity(EXTENDED_WINDOW),
            drafts: Scratch::reserved(),
            rescorer: PathRescorer::with_capacity(RESERVED_MATCHES, RESERVED_DRAFT),
        }
    }
}

/// Drafts whose buffers live as long as the speculator: the best candidate so far, the
/// one being grown, and the request tree's winner. Candidates are grown at every call
/// for every p tried, so growing them into fresh vectors would allocate (and
/// reallocate) on the hot path.
#[derive(Clone, Default)]
struct Scratch {
    /// The winner of the last search over p.
    best: Draft,
    /// The candidate being grown.
    next: Draft,
    /// The request tree's winner, while the global candidates are searched.
    local: Draft,
    /// The candidate p, by bound.
    order: Vec<(f32, usize)>,
    /// Score bounds of the request tree's candidates.
    request_bounds: OccurrenceBounds,
    /// Score bounds of the response's occurrences, for the merged candidates.
    response_bounds: OccurrenceBounds,
    /// The request tree's candidate p (up to [`EXTENDED_WINDOW`] of them).
    candidates: Vec<usize>,
    /// Drafts grown in the current call, over every search.
    grown: usize,
    /// Candidates examined after the first draft (told or grown) in the current call,
    /// over every search.
    rescored: usize,
    /// Whether a search of the current call stopped at [`MAX_GROWN_PER_CALL`] or
    /// [`MAX_RESCORED_PER_CALL`] with candidates left whose bound could still win.
    capped: bool,
}

impl Scratch {
    /// Scratch space with the room reserved that speculation on ordinary input needs.
    fn reserved() -> Self {
        let draft = || Draft::with_capacity(RESERVED_DRAFT);
        let bounds = || OccurrenceBounds::with_capacity(RESERVED_CANDIDATES, RESERVED_DRAFT);
        Scratch {
            best: draft(),
            next: draft(),
            local: draft(),
            order: Vec::with_capacity(RESERVED_CANDIDATES),
            request_bounds: bounds(),
            response_bounds: bounds(),
            candidates: Vec::with_capacity(RESERVED_CANDIDATES),
            ..Scratch::default()
        }
    }
}

impl Speculator {
    /// A speculator for the global tree's cursors, with its scratch space reserved.
    pub fn new() -> Self {
        Self::default()
    }

    /// A speculator that tries every p instead of skipping those that cannot win, and
    /// matches every occurrence one by one. It returns the same drafts, slower: tests use
    /// it to check the pruning.
    #[doc(hidden)]
    pub fn exhaustive() -> Self {
        Self::default().exhaustively()
    }
}

impl<C: Clone> Speculator<C> {
    /// This speculator, made to try every p (see [`Speculator::exhaustive`]).
    #[doc(hidden)]
    pub fn exhaustively(mut self) -> Self {
        self.exhaustive = true;
        self
    }

    /// Drafts grown by the last call, and whether [`MAX_GROWN_PER_CALL`] or
    /// [`MAX_RESCORED_PER_CALL`] cut one of its searches short (tests check the bounds,
    /// and that an uncut search is exact).
    #[doc(hidden)]
    pub fn last_call_work(&self) -> (usize, bool) {
        (self.drafts.grown, self.drafts.capped)
    }

    /// Candidates the last call examined once a first draft was grown, whether their
    /// score was told without growing or not (tests check [`MAX_RESCORED_PER_CALL`]).
    #[doc(hidden)]
    pub fn last_call_rescored(&self) -> usize {
        self.drafts.rescored
    }

    /// Request-tree occurrences the last call matched against its context, less the
    /// context's own in extended mode (tests check the bound on repetitive input).
    #[doc(hidden)]
    pub fn last_call_occurrences(&self) -> usize {
        self.matches.len()
    }

    /// The best draft for `context` from both trees. `context` is the request's prompt
    /// followed by the tokens generated so far.
    pub fn speculate<G: GlobalIndex<Cursor = C>>(
        &mut self,
        request: Option<&RequestTree>,
        global: &G,
        context: &[u32],
        params: &SpecParams,
    ) -> Draft {
        self.speculate_in_place(request, global, context, params)
            .clone()
    }

    /// [`Speculator::speculate`] without the copy: the draft stays in the speculator's
    /// buffers until its next call, so a caller that only reads it allocates nothing.
    pub fn speculate_in_place<G: GlobalIndex<Cursor = C>>(
        &mut self,
        request: Option<&RequestTree>,
        global: &G,
        context: &[u32],
        params: &SpecParams,
    ) -> &Draft {
        // The request tree is this request's own, small and warm; the global tree is
        // large and cold. Its first loads are issued now so that they arrive while the
        // request tree is matched, unless the last call did not search it: the call
        // after a skipped search usually skips it too.
        self.drafts.grown = 0;
        self.drafts.rescored = 0;
        self.drafts.capped = false;
        let early = (!self.skipped_global).then(|| self.global.prefetch(global, context));
        let local_pmax = match request {
            Some(r) => self.match_request(r, context, params),
            None => {
                self.matches.clear();
                0
            }
        };
        match request {
            Some(r) => self.best_from_request(r, local_pmax, params),
            None => self.drafts.best.clear(),
        }
        std::mem::swap(&mut self.drafts.best, &mut self.drafts.local);
        // No draft scores above max_spec: at most that many tokens, each of probability
        // at most 1. A request-tree draft that reaches it (a copy in progress, drafted
        // in full) cannot be beaten, since ties go to the request tree, so the global
        // search is skipped. Its cursors stay behind; the next search steps them over
        // every token since, as it would over one call's.
        self.skipped_global = self.drafts.local.score >= params.max_spec as f32;
        if self.skipped_global {
            return &self.drafts.local;
        }
        let extension = early.unwrap_or_else(|| self.global.prefetch(global, context));
        let global_pmax = self.match_global(global, context, extension, params);
        // The request tree's draft wins ties: a global one must score above it.
        let floor = self.drafts.local.score;
        match (params.mode, request) {
            (SpecMode::Extended, Some(r)) => {
                self.best_from_both(r, local_pmax, global, context, global_pmax, floor, params)
            }
            _ => self.best_from_global(global, context, global_pmax, floor, params),
        }
        let Scratch { best, local, .. } = &self.drafts;
        // The request tree wins ties, as in the reference implementation.
        if local.score >= best.score {
            local
        } else {
            best
        }
    }

    /// The best draft from the per-request tree alone.
    pub fn speculate_request(
        &mut self,
        tree: &RequestTree,
        context: &[u32],
        params: &SpecParams,
    ) -> Draft {
        let p_max = self.match_request(tree, context, params);
        self.best_from_request(tree, p_max, params);
        self.drafts.best.clone()
    }

    /// The best draft from the global tree alone.
    pub fn speculate_global<G: GlobalIndex<Cursor = C>>(
        &mut self,
        tree: &G,
        context: &[u32],
        params: &SpecParams,
    ) -> Draft {
        let extension = self.global.prefetch(tree, context);
        let p_max = self.match_global(tree, context, extension, params);
        self.best_from_global(tree, context, p_max, 0.0, params);
        self.drafts.best.clone()
    }

    /// Match the context in the request tree; returns the longest usable p.
    fn match_request(&mut self, tree: &RequestTree, context: &[u32], params: &SpecParams) -> usize {
        let (window, max_p) = match params.mode {
            SpecMode::Paper => {
                let w = &context[context.len().saturating_sub(params.max_depth)..];
                (w, w.len().saturating_sub(1))
            }
            SpecMode::Extended => {
                let w = &context[context.len().saturating_sub(EXTENDED_WINDOW)..];
                (w, w.len())
            }
        };
        // The reference counts every occurrence; extended mode stops at enough copies of
        // a long match (see `RequestTree::match_lengths`).
        let enough = match params.mode {
            SpecMode::Paper => usize::MAX,
            SpecMode::Extended => ENOUGH_FULL_MATCHES,
        };
        if self.exhaustive {
            tree.match_lengths_one_by_one(window, max_p, enough, &mut self.matches);
        } else {
            tree.match_lengths(window, max_p, enough, params.max_spec, &mut self.matches);
        }
        // The occurrence at the very end (the context itself, usually) has nothing after
        // it: it counts in every COUNT but cannot start a draft, so it does not make a
        // longer p worth trying.
        let end = (tree.tokens().len() as u32).wrapping_sub(1);
        if params.mode == SpecMode::Extended {
            // An occurrence with nothing after it (usually the context's own) says
            // nothing about the next token; the reference counts it anyway, diluting
            // every request-tree probability.
            self.matches.retain(|m| m.end != end);
        }
        self.matches
            .iter()
            .filter(|m| m.end != end)
            .map(|m| m.len as usize)
            .max()
            .unwrap_or(0)
            .min(max_p)
    }

    fn best_from_request(&mut self, tree: &RequestTree, p_max: usize, params: &SpecParams) {
        let matches = &self.matches;
        let room = |p: usize| match params.mode {
            SpecMode::Paper => tree.max_depth().saturating_sub(p),
            SpecMode::Extended => usize::MAX,
        };
        // Extended mode: when the context occurs exactly once earlier in the request's own
        // text, the response is most likely copying from there (a quoted field, a code
        // block, an earlier step's output), and a short match already identifies the
        // place. Such a draft gets the full budget instead of α·p.
        // That is every p beyond the second longest match.
        // One pass over the matches for what the search needs of them: the two longest
        // (counting each occurrence), how many occurrences there are, and every match
        // length (for the ranges below).
        let (mut longest, mut second_longest) = (0, 0);
        let mut occurrences = 0usize;
        let mut cuts = 1u128 << p_max.min(127);
        for m in matches {
            let l = m.len;
            if l > longest {
                (longest, second_longest) = (l, longest);
            } else if l > second_longest {
                second_longest = l;
            }
            // A run is at least two occurrences of its length.
            if m.copies > 1 {
                second_longest = second_longest.max(l);
            }
            occurrences += m.copies as usize;
            cuts |= 1u128 << (l as usize).min(p_max).min(127);
        }
        if params.mode != SpecMode::Extended {
            second_longest = 0;
        }
        let copying = |p: usize| params.mode == SpecMode::Extended && p > second_longest as usize;
        let budget = |p: usize| {
            if copying(p) {
                params.max_spec
            } else {
                params.budget(p)
            }
        };
        let limit = |p: usize| budget(p).min(room(p));
        let mut bounds = std::mem::take(&mut self.drafts.request_bounds);
        bounds.prepare(matches, tree.tokens().len(), 0, p_max, params.max_spec);
        // The occurrences of the last p context tokens only change where p passes a
        // match length. Within a range of equal occurrence sets every p grows the same
        // path, cut at limit(p) tokens, so no p shorter than the one with the largest
        // limit (the longest on ties) can win in its range. A longer p can: its draft is
        // the same when the path ends before its cut, and ties go to the longer p.
        // p_max is below 128 (the depth limit, or the extended window), so the range ends
        // fit in one bit set (`cuts`, filled above).
        cuts &= !1;
        let rescorer = &mut self.rescorer;
        let mut candidates = std::mem::take(&mut self.drafts.candidates);
        candidates.clear();
        // Extended mode has no depth limit, so with α ≥ 0 the limit never falls as p
        // grows and the range's largest p has the largest: no need to ask every p.
        let limit_rises = params.mode == SpecMode::Extended && params.spec_factor >= 0.0;
        let mut lo = 1;
        while cuts != 0 {
            let hi = cuts.trailing_zeros() as usize;
            cuts &= cuts - 1;
            if limit_rises {
                candidates.push(hi);
            } else if let Some(p) = (lo..=hi).max_by_key(|&p| (limit(p), p)) {
                candidates.extend(p..=hi);
            }
            lo = hi + 1;
        }
        best_over_p(
            &mut self.drafts,
            candidates.iter().copied(),
            p_max,
            self.exhaustive,
            0.0,
            |p| bounds.score_bound(p, limit(p), params.min_prob, 0),
            |p, floor, d| {
                let Some(cursor) = tree.cursor_at(matches, p, budget(p)) else {
                    return false;
                };
                expand(tree, &cursor, budget(p), floor, params, d);
                d.match_len = p;
                true
            },
            |p, leader, changed| {
                // Telling a score costs a pass over the matches, which only pays where
                // a draft is grown from many occurrences.
                if params.tree || occurrences < RESCORE_FROM_MATCHES {
                    return None;
                }
                if changed {
                    rescorer.follow(tree, matches, leader);
                }
                rescorer.score(matches, p, limit(p), params)
            },
        );
        self.drafts.candidates = candidates;
        self.drafts.request_bounds = bounds;
        self.drafts.best.set_source(DraftSource::Request);
    }

    /// Match the context in the global tree, given what [`GlobalMatches::prefetch`] found
    /// of it; returns the longest p that matches.
    fn match_global<G: GlobalIndex<Cursor = C>>(
        &mut self,
        tree: &G,
        context: &[u32],
        extension: Extension,
        params: &SpecParams,
    ) -> usize {
        let window = context.len().min(tree.max_depth());
        let max_p = match params.mode {
            SpecMode::Paper => window.saturating_sub(1),
            SpecMode::Extended => window,
        };
        self.global.update(tree, context, extension);
        self.global.cursors.len().min(max_p)
    }

    /// The best global draft; one that cannot score above `floor` need not be found
    /// (the caller has a draft of that score, which wins ties).
    fn best_from_global<G: GlobalIndex<Cursor = C>>(
        &mut self,
        tree: &G,
        context: &[u32],
        p_max: usize,
        floor: f32,
        params: &SpecParams,
    ) {
        let depth = tree.max_depth();
        let cursors = &self.global.cursors;
        let extended = params.mode == SpecMode::Extended;
        // In extended mode the longest match may be followed further back, which can
        // raise its budget up to the full window.
        let bound = |p: usize| {
            (match params.mode {
                SpecMode::Paper => params.budget(p).min(depth - p),
                SpecMode::Extended if p == p_max => params.budget(EXTENDED_WINDOW.max(p)),
                SpecMode::Extended => params.budget(p),
            }) as f32
        };
        best_over_p(
            &mut self.drafts,
            1..=p_max,
            p_max,
            self.exhaustive,
            floor,
            bound,
            |p, floor, d| {
                let Some(cursor) = cursors.get(p - 1) else {
                    return false;
                };
                let mut matched = p;
                if extended && p == p_max {
                    matched +=
                        tree.extend_match_back(cursor, context, EXTENDED_WINDOW.saturating_sub(p));
                }
                expand(tree, cursor, params.budget(matched), floor, params, d);
                d.match_len = matched;
                true
            },
            |_, _, _| None,
        );
        self.drafts.best.set_source(DraftSource::Global);
    }

    /// The global candidate of extended mode: the global tree read together with the
    /// response generated so far (counts summed), so that what this response repeats
    /// and what earlier responses did count as one body of evidence. As with
    /// [`Speculator::best_from_global`], one that cannot beat `floor` need not be found.
    #[allow(clippy::too_many_arguments)]
    fn best_from_both<G: GlobalIndex<Cursor = C>>(
        &mut self,
        request: &RequestTree,
        local_pmax: usize,
        global: &G,
        context: &[u32],
        global_pmax: usize,
        floor: f32,
        params: &SpecParams,
    ) {
        let merged = Merged {
            a: global,
            b: request,
        };
        let cursors = &self.global.cursors;
        let matches = &self.matches;
        let p_max = local_pmax.max(global_pmax);
        let mut response = std::mem::take(&mut self.drafts.response_bounds);
        let whole_request = std::mem::take(&mut self.drafts.request_bounds);
        response.prepare(
            matches,
            request.tokens().len(),
            request.prompt_len(),
            p_max,
            params.max_spec,
        );
        let bound = |p: usize| {
            let global_count = match cursors.get(p - 1) {
                Some(c) if p <= global_pmax => Some(global.count(c)),
                _ => None,
            };
            let in_response = response.occurrences(p);
            match (in_response, whole_request.occurrences(p), global_count) {
                // Every occurrence lies in the response: this is the request tree's own
                // candidate for p, which its search has weighed already and which wins
                // ties (this also covers a path neither tree has).
                (Some(r), Some(w), None) if r == w => 0.0,
                (Some(0), _, None) => 0.0,
                // No draft scores above its budget: a budget below the floor needs no
                // closer bound (most p, on a long context).
                (Some(r), _, _) if r > 0 && (params.budget(p) as f32) < floor => 0.0,
                (Some(r), _, elsewhere) if r > 0 => response.score_bound(
                    p,
                    params.budget(p),
                    params.min_prob,
                    elsewhere.unwrap_or(0),
                ),
                // The global tree alone, whose one occurrence may be followed further back.
                (_, _, Some(_)) if p == global_pmax => params.budget(EXTENDED_WINDOW.max(p)) as f32,
                _ => params.budget(p) as f32,
            }
        };
        // Beyond the global match (so for p + 1 too) a candidate reads the response
        // alone. Where p + 1 has the same occurrences there (nested sets of equal size,
        // under the cursor's cap), p grows the same path with a budget no larger, and
        // ties go to the longer p: as in the request tree's search, it cannot win.
        let same_as_longer = |p: usize| {
            p > global_pmax
                && p < p_max
                && p < request.max_depth()
                && matches!(
                    (response.occurrences(p), response.occurrences(p + 1)),
                    (Some(n), Some(m)) if n == m && (n as usize) < MAX_CURSOR_ENDS
                )
        };
        best_over_p(
            &mut self.drafts,
            (1..=p_max).filter(|&p| !same_as_longer(p)),
            p_max,
            self.exhaustive,
            floor,
            bound,
            |p, floor, d| {
                let g = if p <= global_pmax {
                    cursors.get(p - 1).cloned()
                } else {
                    None
                };
                // A response cursor is only read with the budget of p itself.
                let r = request.response_cursor_at(matches, p, params.budget(p));
                let mut matched = p;
                if r.is_none()
                    && p == global_pmax
                    && let Some(g) = &g
                {
                    matched +=
                        global.extend_match_back(g, context, EXTENDED_WINDOW.saturating_sub(p));
                }
                if g.is_none() && r.is_none() {
                    return false;
                }
                let budget = params.budget(matched);
                let source = match (g, r) {
                    // The merged view of a path the response lacks is the global tree's:
                    // read it directly, without carrying an empty request side along.
                    (Some(g), None) => {
                        expand(global, &g, budget, floor, params, d);
                        DraftSource::Global
                    }
                    (g, r) => {
                        expand(&merged, &(g, r), budget, floor, params, d);
                        DraftSource::Both
                    }
                };
                d.match_len = matched;
                d.set_source(source);
                true
            },
            |_, _, _| None,
        );
        self.drafts.response_bounds = response;
        self.drafts.request_bounds = whole_request;
    }
}

/// Finds the best draft over p = 1..=p_max exactly as the exhaustive loop would (largest
/// score, ties to the larger p). Only `candidates` are tried (the caller knows the other
/// p cannot win), from the largest upper bound down, skipping any p whose bound cannot
/// beat the best so far, nor reach `floor` (the score of a draft found elsewhere that
/// wins ties). `bound(p)` must be at least the score `eval(p)` can give.
/// With `exhaustive`, every p is tried, as the reference loop does. Otherwise at most
/// [`MAX_GROWN_PER_CALL`] drafts are grown and [`MAX_RESCORED_PER_CALL`] candidates
/// examined after the first: the result is the exhaustive one whenever the search ends
/// before either (`capped` stays false), and the best of those grown after.
///
/// `eval(p, floor, d)` grows the draft for `p` into `d` (cleared, its buffers reused),
/// or returns false where `p` has no match. It may stop growing once the draft's score
/// cannot reach `floor` (such a draft loses anyway). `rescore(p, best, changed)` may
/// tell the exact score of `p`'s draft without growing it (see [`rescore`]; `changed`
/// says the best draft is not the one of the last call); a `p` it shows to lose is not
/// grown. The winner is left in `drafts.best`.
#[allow(clippy::too_many_arguments)]
fn best_over_p(
    drafts: &mut Scratch,
    candidates: impl IntoIterator<Item = usize>,
    p_max: usize,
    exhaustive: bool,
    floor: f32,
    bound: impl Fn(usize) -> f32,
    mut eval: impl FnMut(usize, f32, &mut Draft) -> bool,
    mut rescore: impl FnMut(usize, &Draft, bool) -> Option<f32>,
) {
    let Scratch {
        best,
        next,
        order,
        grown: grown_in_call,
        rescored: rescored_in_call,
        capped,
        ..
    } = drafts;
    best.clear();
    if exhaustive {
        // The reference loop: every p, ties to the larger.
        for p in 1..=p_max {
            *grown_in_call += 1;
            if eval(p, 0.0, next) && next.score >= best.score && !next.is_empty() {
                std::mem::swap(best, next);
            }
        }
        return;
    }
    order.clear();
    // A candidate that cannot reach `floor` never wins: most p on repetitive text.
    order.extend(
        candidates
            .into_iter()
            .map(|p| (bound(p), p))
            .filter(|&(b, _)| b > 0.0 && b >= floor),
    );
    order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    let mut best_p = 0;
    let mut grown = 0;
    let mut best_changed = false;
    let mut rescored = 0;
    for &(b, p) in order.iter() {
        // The order is by bound, then p, both falling: no later candidate can win either.
        if b < best.score || (b == best.score && p < best_p) {
            break;
        }
        if !best.is_empty() {
            if rescored == MAX_RESCORED_PER_CALL {
                *capped = true;
                break;
            }
            rescored += 1;
            *rescored_in_call += 1;
            if let Some(score) = rescore(p, best, std::mem::take(&mut best_changed))
                && (score < best.score || (score == best.score && p < best_p))
            {
                continue;
            }
        }
        if grown == MAX_GROWN_PER_CALL {
            *capped = true;
            break;
        }
        grown += 1;
        *grown_in_call += 1;
        if eval(p, best.score.max(floor), next)
            && (next.score > best.score
                || (next.score == best.score && p > best_p && !next.is_empty()))
        {
            std::mem::swap(best, next);
            best_p = p;
            best_changed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::GlobalTree;

    fn paper(tree: bool) -> SpecParams {
        SpecParams {
            mode: SpecMode::Paper,
            tree,
            ..SpecParams::default()
        }
    }

    #[test]
    fn global_draft_follows_the_most_common_continuation() {
        let mut g = GlobalTree::new(24).unwrap();
        g.insert(1, &[1, 2, 3, 4, 5]).unwrap();
        g.insert(2, &[1, 2, 3, 4, 6]).unwrap();
        g.insert(3, &[1, 2, 3, 4, 6]).unwrap();
        let mut s = Speculator::new();
        let d = s.speculate(None, &g, &[9, 1, 2, 3], &paper(false));
        assert_eq!(d.tokens, vec![4, 6]);
        assert_eq!(d.parents, vec![-1, 0]);
        assert_eq!(d.source, DraftSource::Global);
        assert!((d.score - (1.0 + 2.0 / 3.0)).abs() < 1e-6);
        assert_eq!(d.match_len, 3);
    }

    #[test]
    fn tree_draft_keeps_both_branches_above_min_prob() {
        let mut g = GlobalTree::new(24).unwrap();
        g.insert(1, &[1, 2, 3, 4, 5]).unwrap();
        g.insert(2, &[1, 2, 3, 4, 6]).unwrap();
        let mut s = Speculator::new();
        let d = s.speculate(None, &g, &[0, 1, 2, 3], &paper(true));
        assert_eq!(d.tokens[0], 4);
        let mut rest = d.tokens[1..].to_vec();
        rest.sort();
        assert_eq!(rest, vec![5, 6]);
        assert_eq!(&d.parents[1..], &[0, 0]);
        assert_eq!(d.accept(&[4, 6, 7]), vec![4, 6]);
    }

    #[test]
    fn empty_inputs_give_empty_drafts() {
        let g = GlobalTree::new(24).unwrap();
        let r = RequestTree::new(&[], 24);
        let mut s = Speculator::new();
        for params in [paper(false), SpecParams::default()] {
            assert!(s.speculate(Some(&r), &g, &[], &params).is_empty());
            assert!(s.speculate(Some(&r), &g, &[1, 2], &params).is_empty());
        }
    }

    #[test]
    fn request_tree_drafts_from_the_prompt() {
        let g = GlobalTree::new(24).unwrap();
        let prompt = [5, 6, 7, 8, 9, 5, 6];
        let r = RequestTree::new(&prompt, 24);
        let mut s = Speculator::new();
        let d = s.speculate(Some(&r), &g, &prompt, &paper(false));
        assert_eq!(d.source, DraftSource::Request);
        assert_eq!(d.tokens, vec![7, 8]);
    }

    #[test]
    fn a_copy_in_progress_earns_the_full_budget_in_extended_mode() {
        let g = GlobalTree::new(24).unwrap();
        // The prompt holds a span after a token (7) seen once; the response has just
        // started copying it.
        let span: Vec<u32> = (100..130).collect();
        let mut prompt = vec![1, 2, 3, 7];
        prompt.extend(&span);
        prompt.extend([4, 5, 7]);
        let mut s = Speculator::new();
        let r = RequestTree::new(&prompt, 24);
        let p = s.speculate(Some(&r), &g, &prompt, &paper(false));
        assert_eq!(p.tokens, vec![100], "α·p with p = 1 allows one token");
        let params = SpecParams::default();
        let r = RequestTree::new(&prompt, params.request_depth());
        let e = s.speculate(Some(&r), &g, &prompt, &params);
        assert_eq!(e.tokens, span[..24].to_vec());
        assert_eq!(e.source, DraftSource::Request);
    }

    #[test]
    fn an_unbeatable_copy_skips_the_global_search_and_later_calls_catch_up() {
        // The prompt holds a long span once; the response copies part of it, then goes
        // on as one earlier response did after the span's 28th to 30th tokens. Only
        // the global tree knows that continuation, through a match that starts inside
        // the copied part. Every call must draft what a fresh speculator drafts, through
        // the skipped stretch and after it. (Cursors left stale by a skip are caught by
        // the property test on carried cursors, whose responses copy their prompts.)
        let span: Vec<u32> = (100..140).collect();
        let after: Vec<u32> = (50..60).collect();
        let g = GlobalTree::build(
            24,
            [
                (1u64, [&span[27..30], &after[..]].concat()),
                (2, vec![50, 70, 71]),
            ],
        )
        .unwrap();
        let mut prompt = vec![1, 2, 7, 8, 9];
        prompt.extend(&span);
        prompt.extend([4, 5, 7, 8, 9]);
        let params = SpecParams::default();
        let mut r = RequestTree::new(&prompt, params.request_depth());
        let mut ctx = prompt.clone();
        let mut carried = Speculator::new();
        let mut skipped = 0;
        let response: Vec<u32> = span[..30].iter().chain(&after[..3]).copied().collect();
        for &t in &response {
            let d = carried.speculate(Some(&r), &g, &ctx, &params);
            skipped += usize::from(carried.skipped_global);
            let fresh = Speculator::new().speculate(Some(&r), &g, &ctx, &params);
            assert_eq!(d, fresh, "after {} tokens", ctx.len() - prompt.len());
            r.extend(&[t]);
            ctx.push(t);
        }
        assert!(skipped > 0, "a full copy draft was never reached");
        let d = carried.speculate(Some(&r), &g, &ctx, &params);
        assert_eq!(d.source, DraftSource::Global);
        // Matched over all six tokens since the span's 28th: a budget of six.
        assert_eq!(d.tokens, after[3..9].to_vec());
    }

    #[test]
    fn extended_mode_reads_past_the_depth_limit() {
        let seq: Vec<u32> = (100..160).collect();
        let mut g = GlobalTree::new(8).unwrap();
        g.insert(1, &seq).unwrap();
        let ctx = &seq[..30];
        let mut s = Speculator::new();
        let p = s.speculate(None, &g, ctx, &paper(false));
        let e = s.speculate(None, &g, ctx, &SpecParams::default());
        // Paper: the tree is 8 deep, so at most 4 tokens from the best p.
        assert_eq!(p.tokens, (130..134).collect::<Vec<_>>());
        // Extended: 30 matched tokens earn the full 24-token budget.
        assert_eq!(e.tokens, (130..154).collect::<Vec<_>>());
        assert_eq!(e.match_len, 30);
    }
}
