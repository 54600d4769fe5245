//! The per-request tree: an implicit suffix tree over the request's prompt and the
//! tokens generated so far.
//!
//! Instead of materialising nodes, it keeps for each position the previous position with
//! the same token (`prev`). A tree position is then the set of places where its path
//! occurs, found by walking that chain from the end. Starting a request over a 10k-token
//! prompt is one pass with one hash lookup per token, and appending is O(1).
//!
//! Counts are those of a suffix tree with depth limit `max_depth` over the one sequence:
//! COUNT(path) is the number of occurrences of `path`, including the one that ends at the
//! last token (which has no continuation), exactly as in the reference implementation.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::{NIL, common_prefix_len, common_suffix_len};

mod expand;
mod matches;
mod walk;
pub use matches::Match;
pub(crate) use matches::for_most_recent;
use walk::Walk;

/// How many occurrences of the last context token are examined, most recent first.
/// Bounds the cost of one speculation on pathological prompts (one token repeated
/// thousands of times); ordinary prompts stay far below it.
pub const MAX_OCCURRENCES: usize = 1024;

/// How many occurrences a cursor keeps, most recent first. COUNTs enter a draft only as
/// ratios, which the most recent 64 estimate as well as thousands would (ShareGPT
/// tokens/step is the same to the last digit), while a draft step costs one pass over
/// them: a run of one token would otherwise make every step walk a thousand.
pub const MAX_CURSOR_ENDS: usize = 64;

/// A match this long that occurs [`MAX_CURSOR_ENDS`] times ends the search for longer
/// ones (see [`RequestTree::match_lengths`]).
pub const LONG_MATCH: usize = 16;

/// Two positions preceded by the same this many tokens (themselves included) are
/// *alike*: they match any context of fewer tokens equally. Longer than any match the
/// drafter asks for (64 tokens in extended mode, the depth limit in paper mode); a longer
/// match limit simply walks every occurrence.
pub const ALIKE_CONTEXT: usize = 65;

/// How many earlier occurrences of a token are tried when looking for one alike with a
/// new position (a pattern that repeats one token needs the second or third).
const ALIKE_TRIES: usize = 4;

/// Index over one request's tokens.
#[derive(Clone, Debug, Default)]
pub struct RequestTree {
    tokens: Vec<u32>,
    prev: Vec<u32>,
    /// For each position, an earlier one alike with it ([`ALIKE_CONTEXT`]), or NIL.
    alike: Vec<u32>,
    /// For each position i, the start of the periodic stretch it ends: every position
    /// x from there to i has `alike[x] == x - (i - alike[i])`, one period back.
    periodic_since: Vec<u32>,
    last: FxHashMap<u32, u32>,
    max_depth: usize,
    prompt_len: usize,
}

/// The occurrences of a path, as groups: (end position of the most recent occurrence of
/// the group, how many occurrences it stands for). The occurrences of a group go on
/// with the same tokens for as long as any draft from the cursor can grow, so they step
/// as one: on a run or a period, dozens of occurrences are one group. Most paths a draft
/// follows occur a few times, so they are kept inline: cursors are made and dropped at
/// every draft step.
type Ends = SmallVec<[(u32, u32); 6]>;

/// A position in a [`RequestTree`]: the occurrences of its path, most recent first.
#[derive(Clone, Debug)]
pub struct RequestCursor {
    ends: Ends,
    /// COUNT: the occurrences the groups stand for.
    count: u32,
    depth: usize,
}

impl RequestCursor {
    /// Length of the path.
    pub fn depth(&self) -> usize {
        self.depth
    }
}

impl RequestTree {
    /// An index over `prompt` whose paths are at most `max_depth` tokens long
    /// (`usize::MAX` for no limit).
    pub fn new(prompt: &[u32], max_depth: usize) -> Self {
        let mut t = Self {
            tokens: Vec::with_capacity(prompt.len() + 256),
            prev: Vec::with_capacity(prompt.len() + 256),
            alike: Vec::with_capacity(prompt.len() + 256),
            periodic_since: Vec::with_capacity(prompt.len() + 256),
            last: FxHashMap::default(),
            max_depth,
            prompt_len: prompt.len(),
        };
        t.extend(prompt);
        t
    }

    /// Append generated tokens.
    pub fn extend(&mut self, tokens: &[u32]) {
        for &tok in tokens {
            let i = self.tokens.len() as u32;
            let p = self.last.insert(tok, i).unwrap_or(NIL);
            self.prev.push(p);
            self.tokens.push(tok);
            let alike = self.find_alike(i as usize);
            self.alike.push(alike);
            let since = match i.checked_sub(1) {
                Some(before)
                    if alike != NIL && self.alike[before as usize] == alike.wrapping_sub(1) =>
                {
                    self.periodic_since[before as usize]
                }
                _ => i,
            };
            self.periodic_since.push(since);
        }
    }

    /// An earlier position alike with the last one, `i`. Inside a repeated stretch the
    /// one after the previous position's alike one is (one token to check); elsewhere a
    /// few earlier occurrences of the token are tried, which on ordinary text differ
    /// at the first or second token before.
    fn find_alike(&self, i: usize) -> u32 {
        if let Some(&before) = i.checked_sub(1).and_then(|b| self.alike.get(b))
            && before != NIL
            && self.tokens[before as usize + 1] == self.tokens[i]
        {
            return before + 1;
        }
        let mut a = self.prev[i];
        let token_before = self.tokens[i.saturating_sub(1)];
        for _ in 0..ALIKE_TRIES {
            if a == NIL || (a as usize) + 1 < ALIKE_CONTEXT {
                break;
            }
            let au = a as usize;
            if self.tokens[au - 1] == token_before
                && common_suffix_len(&self.tokens[..i], &self.tokens[..au], ALIKE_CONTEXT - 1)
                    == ALIKE_CONTEXT - 1
            {
                return a;
            }
            a = self.prev[au];
        }
        NIL
    }

    /// The period of the repeated stretch that position `j` ends, and where the stretch
    /// starts, when the whole period before `j` lies in it.
    fn period_at(&self, j: usize) -> Option<(usize, usize)> {
        let alike = self.alike[j];
        if alike == NIL {
            return None;
        }
        let period = j - alike as usize;
        let since = self.periodic_since[j] as usize;
        (since + period <= j + 1).then_some((period, since))
    }

    /// Everything indexed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The depth limit.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Occurrences of the last token of `context`, each with how many tokens of `context`
    /// it matches backwards (at most `limit`), most recent first, for cursors whose
    /// drafts grow at most `horizon` tokens.
    ///
    /// Stops after [`MAX_OCCURRENCES`], or once `enough` occurrences match as long as the
    /// longest so far, if that is all `limit` tokens or at least [`LONG_MATCH`]. On
    /// repetitive text (a run, a short period) that happens within a few dozen
    /// occurrences. A cursor keeps only the most recent [`MAX_CURSOR_ENDS`] occurrences,
    /// so with `enough` at that cap the older ones could only add a longer match further
    /// back, and ordinary text does not hold that many copies of a long span. The
    /// occurrence at the end of the request is listed but not counted for the stop.
    ///
    /// Inside a stretch that repeats with some period, every occurrence matches as the
    /// one a period later does (see [`ALIKE_CONTEXT`]): one period is compared, and of the
    /// rest a copy is listed only while fewer than [`MAX_CURSOR_ENDS`] listed occurrences
    /// match as long as it does, since no cursor keeps more. The others count towards
    /// [`MAX_OCCURRENCES`] and the stop as if walked, so what any cursor holds is what
    /// walking every occurrence gives ([`RequestTree::match_lengths_one_by_one`]). Copies
    /// far enough back to be followed by the same `horizon` tokens are listed as one
    /// [`Match`] per occurrence of the period, with how many copies it stands for.
    ///
    /// Outside such stretches the same rule holds: an occurrence that at least
    /// [`MAX_CURSOR_ENDS`] listed ones already match as long as is passed over. So the
    /// list stays short where a common token occurs hundreds of times in a long prompt,
    /// and everything that reads it (cursors, bounds, rescoring) reads that much less.
    pub fn match_lengths(
        &self,
        context: &[u32],
        limit: usize,
        enough: usize,
        horizon: usize,
        out: &mut Vec<Match>,
    ) {
        self.match_lengths_with(context, limit, enough, horizon, true, out);
    }

    /// [`RequestTree::match_lengths`] walking and listing every occurrence, repeated
    /// stretches included (tests check that passing over some changes no cursor).
    #[doc(hidden)]
    pub fn match_lengths_one_by_one(
        &self,
        context: &[u32],
        limit: usize,
        enough: usize,
        out: &mut Vec<Match>,
    ) {
        self.match_lengths_with(context, limit, enough, 0, false, out);
    }

    fn match_lengths_with(
        &self,
        context: &[u32],
        limit: usize,
        enough: usize,
        horizon: usize,
        pass_over: bool,
        out: &mut Vec<Match>,
    ) {
        out.clear();
        let Some(&lastc) = context.last() else { return };
        let limit = limit.min(context.len()).min(self.max_depth);
        // `listed` tells matches apart only up to ALIKE_CONTEXT tokens.
        let pass_over = pass_over && limit < ALIKE_CONTEXT;
        let mut walk = Walk {
            out,
            end: self.tokens.len().wrapping_sub(1),
            enough,
            long_enough: limit.min(LONG_MATCH),
            horizon,
            longest: 0,
            as_long: 0,
            visited: 0,
            listed: [0; ALIKE_CONTEXT + 1],
            kept_out_up_to: 0,
        };
        let mut j = self.last.get(&lastc).copied().unwrap_or(NIL);
        while j != NIL {
            let ju = j as usize;
            if pass_over && let Some((period, since)) = self.period_at(ju) {
                // One period is matched; the stretch before it repeats it.
                let first = walk.out.len();
                while j != NIL && j as usize + period > ju {
                    let l = self.match_length(j as usize, context, limit);
                    if walk.visit(j, l) {
                        return;
                    }
                    j = self.prev[j as usize];
                }
                match walk.repeat(first, period, since - period) {
                    Some(next) => j = next.map_or(NIL, |oldest| self.prev[oldest]),
                    None => return,
                }
                continue;
            }
            let l = self.match_length(ju, context, limit);
            let over = if pass_over {
                walk.visit_unless_kept_out(j, l)
            } else {
                walk.visit(j, l)
            };
            if over {
                return;
            }
            j = self.prev[ju];
        }
    }

    /// How many tokens of `context` the occurrence of its last token at `j` matches
    /// backwards, at most `limit`.
    fn match_length(&self, j: usize, context: &[u32], limit: usize) -> u32 {
        // The token at j matches the last one by construction of the chain.
        let n = context.len();
        (1 + common_suffix_len(
            &self.tokens[..j],
            &context[..n - 1],
            limit.saturating_sub(1),
        )) as u32
    }

    /// The cursor of the path made of the last `p` tokens of the context, given the
    /// output of [`RequestTree::match_lengths`], for drafts of at most `horizon` tokens.
    pub fn cursor_at(&self, matches: &[Match], p: usize, horizon: usize) -> Option<RequestCursor> {
        self.cursor_from(matches, p, horizon, 0)
    }

    /// Like [`RequestTree::cursor_at`], but only occurrences that lie wholly in the
    /// generated tokens: the view of the response alone, as a global tree that learns
    /// the response while it is generated would hold it.
    pub fn response_cursor_at(
        &self,
        matches: &[Match],
        p: usize,
        horizon: usize,
    ) -> Option<RequestCursor> {
        self.cursor_from(matches, p, horizon, self.prompt_len)
    }

    /// The cursor of the occurrences in `matches` that match at least `p` tokens, all
    /// of them at or after position `from`: the first [`MAX_CURSOR_ENDS`], most recent
    /// first, in groups that go on alike for `horizon` tokens.
    fn cursor_from(
        &self,
        matches: &[Match],
        p: usize,
        horizon: usize,
        from: usize,
    ) -> Option<RequestCursor> {
        if p > self.max_depth {
            return None;
        }
        let mut groups = Ends::new();
        let mut count = 0u32;
        for_most_recent(matches, p, from, MAX_CURSOR_ENDS, |_, j, n| {
            count += n;
            if let Some((rep, m)) = groups.last_mut()
                && self.go_on_alike(*rep, j, horizon)
            {
                *m += n;
                return;
            }
            groups.push((j, n));
        });
        (count > 0).then_some(RequestCursor {
            ends: groups,
            count,
            depth: p,
        })
    }

    /// Whether the occurrences ending at `recent` and at the earlier `older` are
    /// followed by the same `horizon` tokens, all of them in the request.
    fn go_on_alike(&self, recent: u32, older: u32, horizon: usize) -> bool {
        let (recent, older) = (recent as usize + 1, older as usize + 1);
        let Some(after_recent) = self.tokens.get(recent..recent.saturating_add(horizon)) else {
            return false;
        };
        // Most occurrences of a path part ways at once: one load settles them.
        horizon == 0
            || (after_recent[0] == self.tokens[older]
                && common_prefix_len(after_recent, &self.tokens[older..older + horizon]) == horizon)
    }

    /// Tokens of the prompt (the rest was generated).
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// COUNT of `path` (brute force over the chain; for tests and tools).
    pub fn count_of(&self, path: &[u32]) -> u32 {
        if path.is_empty() {
            return self.tokens.len() as u32;
        }
        if path.len() > self.max_depth {
            return 0;
        }
        let mut m = Vec::new();
        self.match_lengths_one_by_one(path, path.len(), usize::MAX, &mut m);
        m.iter()
            .filter(|m| m.len as usize >= path.len())
            .map(|m| m.copies)
            .sum()
    }
}

impl RequestTree {
    /// For each group in `c` that has a continuation: (next token, (its position, the
    /// occurrences it stands for)), most recent first.
    fn next_tokens<'a>(
        &'a self,
        c: &'a RequestCursor,
    ) -> impl Iterator<Item = (u32, (u32, u32))> + 'a {
        c.ends.iter().filter_map(move |&(j, n)| {
            let next = j as usize + 1;
            (next < self.tokens.len()).then(|| (self.tokens[next], (next as u32, n)))
        })
    }

    /// The most frequent next token of the occurrences in `c`, and how often it follows;
    /// among equals, the one that follows the most recent occurrence. A cursor holds at
    /// most [`MAX_CURSOR_ENDS`] occurrences, so a linear tally is cheap.
    fn most_frequent_next(&self, c: &RequestCursor) -> Option<(u32, u32)> {
        let mut tally: SmallVec<[(u32, u32); MAX_CURSOR_ENDS]> = SmallVec::new();
        for (tok, (_, w)) in self.next_tokens(c) {
            match tally.iter_mut().find(|(t, _)| *t == tok) {
                Some((_, n)) => *n += w,
                None => tally.push((tok, w)),
            }
        }
        let mut best: Option<(u32, u32)> = None;
        for &(t, n) in &tally {
            if best.is_none_or(|(_, b)| n > b) {
                best = Some((t, n));
            }
        }
        best
    }
}

/// `pattern` repeated `repeats` times, with the tokens of `noise` ((position, token))
/// written over it: a prompt for the property tests of repeated stretches.
#[cfg(test)]
pub(crate) fn repeated_with_noise(
    pattern: &[u32],
    repeats: usize,
    noise: &[(usize, u32)],
) -> Vec<u32> {
    let mut out = pattern.repeat(repeats);
    for &(at, tok) in noise {
        if let Some(t) = out.get_mut(at) {
            *t = tok;
        }
    }
    out
}

/// Property-test prompts: a pattern of 1 to 8 tokens over 4, repeated a number of
/// times in `repeats`, with up to 5 positions below `noise_span` overwritten by one of 6
/// tokens ([`repeated_with_noise`]).
#[cfg(test)]
pub(crate) fn repetitive_prompt(
    repeats: std::ops::Range<usize>,
    noise_span: usize,
) -> impl proptest::strategy::Strategy<Value = Vec<u32>> {
    use proptest::strategy::Strategy;
    (
        proptest::collection::vec(0u32..4, 1..9),
        repeats,
        proptest::collection::vec((0usize..noise_span, 0u32..6), 0..6),
    )
        .prop_map(|(pattern, repeats, noise)| repeated_with_noise(&pattern, repeats, &noise))
}

/// The request tree over `prompt` followed by `reply`, and the cursor of its last `p`
/// tokens for drafts of at most `horizon` tokens (None where they occur nowhere
/// earlier): where the property tests of stepping and drafting start.
#[cfg(test)]
pub(crate) fn tree_and_cursor_at_end(
    prompt: &[u32],
    reply: &[u32],
    max_depth: usize,
    p: usize,
    horizon: usize,
) -> (RequestTree, Option<RequestCursor>) {
    let mut t = RequestTree::new(prompt, max_depth);
    t.extend(reply);
    let context = t.tokens().to_vec();
    let window = &context[context.len().saturating_sub(p)..];
    let mut m = Vec::new();
    t.match_lengths(window, p, usize::MAX, 24, &mut m);
    let cursor = t.cursor_at(&m, p, horizon);
    (t, cursor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Expand;

    #[test]
    fn counts_include_the_final_occurrence() {
        let t = RequestTree::new(&[1, 2, 3, 1, 2], 24);
        assert_eq!(t.count_of(&[1, 2]), 2);
        assert_eq!(t.count_of(&[2, 3]), 1);
        assert_eq!(t.count_of(&[9]), 0);
        let mut m = Vec::new();
        t.match_lengths(&[1, 2], 24, usize::MAX, 24, &mut m);
        let c = t.cursor_at(&m, 2, 24).unwrap();
        assert_eq!(t.count(&c), 2);
        let best = t.best_child(&c, 1).unwrap();
        assert_eq!((best.token, best.count), (3, 1));
    }

    #[test]
    fn most_frequent_next_breaks_ties_by_recency() {
        // `7` is followed by 1 and 2 equally often, 2 most recently; then by 3 once more
        // than by either, when `extra` says so.
        for extra in [false, true] {
            let mut prompt = [7, 1, 7, 2].repeat(5);
            if extra {
                prompt.extend([7, 3].repeat(6));
            }
            prompt.push(7);
            let t = RequestTree::new(&prompt, usize::MAX);
            let mut m = Vec::new();
            t.match_lengths(&[7], 1, usize::MAX, 24, &mut m);
            let c = t.cursor_at(&m, 1, 24).unwrap();
            let want = if extra { (3, 6) } else { (2, 5) };
            assert_eq!(t.most_frequent_next(&c), Some(want), "{extra}");
            let best = t.best_child(&c, 1).unwrap();
            assert_eq!((best.token, best.count), want);
        }
    }

    #[test]
    fn a_cursor_keeps_the_most_recent_occurrences() {
        // 300 occurrences of `7`: the cursor keeps the most recent 64 (the last one, the
        // context's own, among them), whose continuations are counted.
        let mut prompt: Vec<u32> = [7, 1].repeat(200);
        prompt.extend([7, 2].repeat(100));
        prompt.push(7);
        let t = RequestTree::new(&prompt, usize::MAX);
        let mut m = Vec::new();
        t.match_lengths_one_by_one(&[7], 1, usize::MAX, &mut m);
        assert_eq!(m.len(), 301);
        // Walking the repeated stretches lists only the copies a cursor can keep.
        let mut skipping = Vec::new();
        t.match_lengths(&[7], 1, usize::MAX, 24, &mut skipping);
        assert!(skipping.len() < 200, "{}", skipping.len());
        let c = t.cursor_at(&m, 1, 24).unwrap();
        assert_eq!(
            profile(&t, Some(&c), 24),
            profile(&t, t.cursor_at(&skipping, 1, 24).as_ref(), 24)
        );
        assert_eq!(t.count(&c), MAX_CURSOR_ENDS as u32);
        let best = t.best_child(&c, 1).unwrap();
        assert_eq!((best.token, best.count), (2, MAX_CURSOR_ENDS as u32 - 1));
        assert_eq!(t.child(&c, 1).map(|k| k.count), None);
    }

    #[test]
    fn matching_stops_at_enough_copies_of_the_whole_window() {
        let prompt = vec![5u32; 2000];
        let t = RequestTree::new(&prompt, usize::MAX);
        let mut m = Vec::new();
        t.match_lengths_one_by_one(&[5; 10], 10, 64, &mut m);
        // Every recent occurrence matches all 10 tokens: the most recent 64 suffice,
        // besides the context's own, which has nothing after it.
        assert_eq!(m.len(), 65);
        assert!(m.iter().all(|m| m.len == 10));
        t.match_lengths_one_by_one(&[5; 10], 10, usize::MAX, &mut m);
        assert_eq!(m.len(), MAX_OCCURRENCES);
        // A context that breaks off after 20 tokens: 64 copies of those 20 suffice too,
        // but not of a match shorter than LONG_MATCH.
        let mut context = vec![6u32; 30];
        context.extend([5; 20]);
        t.match_lengths_one_by_one(&context, 50, 64, &mut m);
        assert_eq!(m.len(), 65);
        assert!(m.iter().all(|m| m.len == 20));
        t.match_lengths_one_by_one(&context[20..], 30, 64, &mut m);
        assert_eq!(m.len(), 65);
        let short = [6u32, 5, 5, 5];
        t.match_lengths_one_by_one(&short, 4, 64, &mut m);
        assert_eq!(m.len(), MAX_OCCURRENCES);
    }

    /// What a cursor's drafts can see within `horizon` tokens: its COUNT and depth, the
    /// continuation of each of its occurrences (cut at the end of the request) with how
    /// many occurrences go on so, in the order of their most recent occurrence (which
    /// breaks ties), and the position of a lone occurrence (read on beyond the depth
    /// limit). Cursors that group the same occurrences differently see the same.
    type Profile = (u32, usize, Vec<(Vec<u32>, u32)>, Option<u32>);

    fn profile(t: &RequestTree, c: Option<&RequestCursor>, horizon: usize) -> Option<Profile> {
        let c = c?;
        let mut seen: Vec<(Vec<u32>, u32)> = Vec::new();
        for &(j, n) in &c.ends {
            let from = j as usize + 1;
            let next =
                t.tokens[from.min(t.tokens.len())..t.tokens.len().min(from + horizon)].to_vec();
            match seen.iter_mut().find(|(s, _)| *s == next) {
                Some((_, m)) => *m += n,
                None => seen.push((next, n)),
            }
        }
        let lone = (c.count == 1).then(|| c.ends[0].0);
        Some((c.count, c.depth, seen, lone))
    }

    /// Every cursor a list of matches gives, for p up to `limit`, with drafts of at most
    /// `horizon` tokens.
    fn cursors(
        t: &RequestTree,
        matches: &[Match],
        limit: usize,
        horizon: usize,
    ) -> Vec<Option<Profile>> {
        (1..=limit)
            .flat_map(|p| {
                [
                    profile(t, t.cursor_at(matches, p, horizon).as_ref(), horizon),
                    profile(
                        t,
                        t.response_cursor_at(matches, p, horizon).as_ref(),
                        horizon,
                    ),
                ]
            })
            .collect()
    }

    #[test]
    fn a_repeated_stretch_is_matched_one_period_deep() {
        let pattern = [11u32, 12, 13, 11, 14, 15, 11];
        for (prompt, reply) in [
            (vec![5u32; 3000], vec![5u32; 40]),
            (pattern.repeat(400), pattern[..3].repeat(10)),
            (pattern[2..].repeat(500), pattern.repeat(12)),
            ([1u32, 2].repeat(900), vec![2, 1, 1, 2, 1, 2]),
        ] {
            let mut t = RequestTree::new(&prompt, usize::MAX);
            let (mut walked, mut skipping) = (Vec::new(), Vec::new());
            for (i, &tok) in reply.iter().enumerate() {
                t.extend(&[tok]);
                let context = t.tokens().to_vec();
                for (limit, enough) in [(64, 64), (64, usize::MAX), (24, usize::MAX), (3, 64)] {
                    let window = &context[context.len().saturating_sub(limit)..];
                    t.match_lengths_one_by_one(window, limit, enough, &mut walked);
                    t.match_lengths(window, limit, enough, 24, &mut skipping);
                    assert!(skipping.len() <= walked.len());
                    // Copies 24 tokens back or more are runs: a stretch lists at most
                    // the single copies within 24 tokens of its end, and a run for each
                    // occurrence in its last period (here, the reply's and the prompt's).
                    assert!(skipping.len() <= 3 * 24, "{} listed at {i}", skipping.len());
                    for horizon in [24, 5] {
                        assert_same_cursors(&t, &walked, &skipping, limit, horizon);
                    }
                }
            }
        }
    }

    /// The two walks give the same cursor for every p, and the same longest match.
    fn assert_same_cursors(
        t: &RequestTree,
        walked: &[Match],
        skipping: &[Match],
        limit: usize,
        horizon: usize,
    ) {
        let end = t.tokens().len() as u32 - 1;
        let longest = |m: &[Match]| m.iter().filter(|o| o.end != end).map(|o| o.len).max();
        assert_eq!(longest(walked), longest(skipping), "limit {limit}");
        assert_eq!(
            cursors(t, walked, limit, horizon),
            cursors(t, skipping, limit, horizon),
            "limit {limit}, horizon {horizon}"
        );
    }

    /// Tokens from a fixed pseudo-random sequence over `alphabet` symbols: text without
    /// periods, where every token occurs often.
    fn scrambled(len: usize, alphabet: u32, seed: u64) -> Vec<u32> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % alphabet as u64) as u32
            })
            .collect()
    }

    #[test]
    fn a_common_token_lists_only_occurrences_a_cursor_can_keep() {
        // About 1,000 occurrences of each token, matching 1 to a dozen tokens back: most
        // are kept out of every cursor by 64 more recent ones that match as long.
        let t = RequestTree::new(&scrambled(4000, 4, 7), usize::MAX);
        let context = t.tokens().to_vec();
        let (mut walked, mut skipping) = (Vec::new(), Vec::new());
        for limit in [64, 24, 3] {
            let window = &context[context.len() - limit..];
            t.match_lengths_one_by_one(window, limit, usize::MAX, &mut walked);
            t.match_lengths(window, limit, usize::MAX, 24, &mut skipping);
            assert!(walked.len() > 900, "{}", walked.len());
            assert!(skipping.len() < 400, "{} listed", skipping.len());
            assert_same_cursors(&t, &walked, &skipping, limit, 24);
        }
    }

    proptest::proptest! {
        #[test]
        fn skipping_repeated_stretches_changes_no_cursor(
            pattern in proptest::collection::vec(0u32..4, 1..12),
            repeats in 10usize..300,
            noise in proptest::collection::vec((0usize..3000, 0u32..6), 0..4),
            reply in proptest::collection::vec(0u32..4, 1..12),
            limit in proptest::prop_oneof![1usize..8, 8usize..65],
            enough in proptest::prop_oneof![proptest::strategy::Just(64usize), proptest::strategy::Just(100usize), proptest::strategy::Just(usize::MAX)],
            horizon in 0usize..40,
            shorter in 0usize..40,
        ) {
            let prompt = repeated_with_noise(&pattern, repeats, &noise);
            let mut t = RequestTree::new(&prompt, usize::MAX);
            t.extend(&reply);
            let context = t.tokens().to_vec();
            let window = &context[context.len().saturating_sub(limit)..];
            let (mut walked, mut skipping) = (Vec::new(), Vec::new());
            t.match_lengths_one_by_one(window, limit, enough, &mut walked);
            t.match_lengths(window, limit, enough, horizon, &mut skipping);
            // Cursors for drafts of the horizon the matching was made for, or fewer.
            assert_same_cursors(&t, &walked, &skipping, limit, horizon);
            assert_same_cursors(&t, &walked, &skipping, limit, horizon.min(shorter));
        }

        #[test]
        fn passing_over_kept_out_occurrences_changes_no_cursor(
            len in 100usize..3000,
            alphabet in 2u32..12,
            seed in proptest::num::u64::ANY,
            limit in proptest::prop_oneof![1usize..8, 8usize..65],
            enough in proptest::prop_oneof![proptest::strategy::Just(64usize), proptest::strategy::Just(usize::MAX)],
            horizon in 0usize..40,
        ) {
            let t = RequestTree::new(&scrambled(len, alphabet, seed), usize::MAX);
            let context = t.tokens().to_vec();
            let window = &context[context.len().saturating_sub(limit)..];
            let (mut walked, mut skipping) = (Vec::new(), Vec::new());
            t.match_lengths_one_by_one(window, limit, enough, &mut walked);
            t.match_lengths(window, limit, enough, horizon, &mut skipping);
            proptest::prop_assert!(skipping.len() <= walked.len());
            assert_same_cursors(&t, &walked, &skipping, limit, horizon);
        }
    }

    proptest::proptest! {
        /// Stepping a cursor in place goes to the first of `children` (the most frequent
        /// next token, ties to the most recent), with the same token, count and
        /// occurrences, step after step, and leaves it alone where there is none.
        #[test]
        fn stepping_in_place_goes_to_the_likeliest_child(
            prompt in repetitive_prompt(1..60, 400),
            reply in proptest::collection::vec(0u32..4, 0..30),
            p in 1usize..20,
            min_count in 0u32..6,
            max_depth in proptest::prop_oneof![proptest::strategy::Just(usize::MAX), 4usize..30],
        ) {
            let (t, cursor) = tree_and_cursor_at_end(&prompt, &reply, max_depth, p, 24);
            let Some(mut cursor) = cursor else {
                return Ok(());
            };
            for _ in 0..30 {
                let mut children = Vec::new();
                t.children(&cursor, min_count, &mut children);
                let child = children.into_iter().next();
                let before = cursor.clone();
                let stepped = t.step_to_best_child(&mut cursor, min_count);
                proptest::prop_assert_eq!(stepped, child.as_ref().map(|k| (k.token, k.count)));
                let Some(child) = child else {
                    proptest::prop_assert_eq!(&cursor.ends, &before.ends);
                    proptest::prop_assert_eq!((cursor.count, cursor.depth), (before.count, before.depth));
                    break;
                };
                proptest::prop_assert_eq!(&cursor.ends, &child.cursor.ends);
                proptest::prop_assert_eq!((cursor.count, cursor.depth), (child.cursor.count, child.cursor.depth));
            }
        }
    }

    proptest::proptest! {
        /// The steps [`Expand::alike_ahead`] knows at once are those that stepping one
        /// token at a time takes (token and count), and advancing over any number of them
        /// leaves the cursor that many steps leave.
        #[test]
        fn steps_known_at_once_are_the_steps_taken_one_by_one(
            prompt in repetitive_prompt(1..60, 400),
            reply in proptest::collection::vec(0u32..4, 0..30),
            p in 1usize..20,
            asked in 0usize..40,
            advance_by in 0usize..40,
            max_depth in proptest::prop_oneof![proptest::strategy::Just(usize::MAX), 4usize..30],
        ) {
            let (t, start) = tree_and_cursor_at_end(&prompt, &reply, max_depth, p, 24);
            let Some(start) = start else {
                return Ok(());
            };
            let mut steps = vec![(0, 0); asked];
            let known = t.alike_ahead(&start, &mut steps);
            proptest::prop_assert!(known <= asked);
            let mut one_by_one = start.clone();
            let taken = advance_by.min(known);
            for (k, &step) in steps[..known].iter().enumerate() {
                proptest::prop_assert_eq!(t.step_to_best_child(&mut one_by_one, 0), Some(step));
                if k + 1 == taken {
                    let mut at_once = start.clone();
                    t.advance_alike(&mut at_once, taken, step.1);
                    proptest::prop_assert_eq!(&at_once.ends, &one_by_one.ends);
                    proptest::prop_assert_eq!(
                        (at_once.count, at_once.depth),
                        (one_by_one.count, one_by_one.depth)
                    );
                }
            }
        }
    }

    #[test]
    fn empty_prompt_and_depth_limit() {
        let mut t = RequestTree::new(&[], 2);
        let mut m = Vec::new();
        t.match_lengths(&[1], 2, usize::MAX, 24, &mut m);
        assert!(m.is_empty());
        t.extend(&[1, 2, 3]);
        assert_eq!(t.count_of(&[1, 2]), 1);
        assert_eq!(t.count_of(&[1, 2, 3]), 0);
        let c = t.cursor_at(&[Match::one(1, 2)], 2, 24).unwrap();
        assert!(t.best_child(&c, 1).is_none());
    }
}
