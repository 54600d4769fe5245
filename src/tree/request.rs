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
use smallvec::{SmallVec, smallvec};

use super::{Child, Expand, NIL, common_suffix_len};

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

/// Index over one request's tokens.
#[derive(Clone, Debug, Default)]
pub struct RequestTree {
    tokens: Vec<u32>,
    prev: Vec<u32>,
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
        }
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
    /// it matches backwards (at most `limit`), most recent first.
    ///
    /// Stops after [`MAX_OCCURRENCES`], or once `enough` occurrences match as long as the
    /// longest so far, if that is all `limit` tokens or at least [`LONG_MATCH`]. On
    /// repetitive text (a run, a short period) that happens within a few dozen
    /// occurrences. A cursor keeps only the most recent [`MAX_CURSOR_ENDS`] occurrences,
    /// so with `enough` at that cap the older ones could only add a longer match further
    /// back, and ordinary text does not hold that many copies of a long span.
    pub fn match_lengths(
        &self,
        context: &[u32],
        limit: usize,
        enough: usize,
        out: &mut Vec<(u32, u32)>,
    ) {
        out.clear();
        let Some(&lastc) = context.last() else { return };
        let limit = limit.min(context.len()).min(self.max_depth);
        let mut j = self.last.get(&lastc).copied().unwrap_or(NIL);
        let n = context.len();
        // The longest match so far, and how many occurrences match that long.
        let (mut longest, mut as_long) = (0, 0);
        let long_enough = limit.min(LONG_MATCH);
        while j != NIL && out.len() < MAX_OCCURRENCES {
            let ju = j as usize;
            // The token at j matches the last one by construction of the chain.
            let l = 1 + common_suffix_len(
                &self.tokens[..ju],
                &context[..n - 1],
                limit.saturating_sub(1),
            );
            out.push((j, l as u32));
            if l > longest {
                (longest, as_long) = (l, 0);
            }
            if l == longest {
                as_long += 1;
                if as_long == enough && longest >= long_enough {
                    break;
                }
            }
            j = self.prev[ju];
        }
    }

    /// The cursor of the path made of the last `p` tokens of the context, given the
    /// output of [`RequestTree::match_lengths`], for drafts of at most `horizon` tokens.
    pub fn cursor_at(
        &self,
        matches: &[(u32, u32)],
        p: usize,
        horizon: usize,
    ) -> Option<RequestCursor> {
        self.cursor_from(matches, p, horizon, 0)
    }

    /// Like [`RequestTree::cursor_at`], but only occurrences that lie wholly in the
    /// generated tokens: the view of the response alone, as a global tree that learns
    /// the response while it is generated would hold it.
    pub fn response_cursor_at(
        &self,
        matches: &[(u32, u32)],
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
        matches: &[(u32, u32)],
        p: usize,
        horizon: usize,
        from: usize,
    ) -> Option<RequestCursor> {
        if p > self.max_depth {
            return None;
        }
        let ends = matches
            .iter()
            .filter(|&&(j, l)| l as usize >= p && j as usize + 1 >= from + p)
            .map(|&(j, _)| j);
        let mut groups = Ends::new();
        let mut count = 0u32;
        for j in ends.take(MAX_CURSOR_ENDS) {
            count += 1;
            if let Some((rep, n)) = groups.last_mut()
                && self.go_on_alike(*rep, j, horizon)
            {
                *n += 1;
                continue;
            }
            groups.push((j, 1));
        }
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
        recent
            .checked_add(horizon)
            .is_some_and(|end| end <= self.tokens.len())
            && self.tokens[recent..recent + horizon] == self.tokens[older..older + horizon]
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
        self.match_lengths(path, path.len(), usize::MAX, &mut m);
        m.iter().filter(|(_, l)| *l as usize >= path.len()).count() as u32
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

impl RequestTree {
    /// The cursor one token below `c`, made of `groups`.
    fn below(c: &RequestCursor, groups: Ends) -> RequestCursor {
        RequestCursor {
            count: groups.iter().map(|&(_, n)| n).sum(),
            ends: groups,
            depth: c.depth + 1,
        }
    }
}

impl Expand for RequestTree {
    type Cursor = RequestCursor;

    fn count(&self, c: &RequestCursor) -> u32 {
        c.count
    }

    fn children(&self, c: &RequestCursor, min_count: u32, out: &mut Vec<Child<RequestCursor>>) {
        out.clear();
        if c.depth >= self.max_depth {
            return;
        }
        // Group the next tokens; `ends` is most recent first, so first-seen order is
        // recency order, which breaks ties.
        let mut order: Vec<(u32, Ends)> = Vec::new();
        for (tok, next) in self.next_tokens(c) {
            match order.iter_mut().find(|(t, _)| *t == tok) {
                Some((_, v)) => v.push(next),
                None => order.push((tok, smallvec![next])),
            }
        }
        out.extend(order.into_iter().filter_map(|(token, groups)| {
            let cursor = Self::below(c, groups);
            (cursor.count >= min_count).then_some(Child {
                token,
                count: cursor.count,
                cursor,
            })
        }));
        out.sort_by_key(|k| std::cmp::Reverse(k.count));
    }

    fn best_child(&self, c: &RequestCursor, min_count: u32) -> Option<Child<RequestCursor>> {
        if c.depth >= self.max_depth {
            return None;
        }
        // Repetitive text (a run, a period, a copy in progress) mostly has occurrences
        // that all go on the same way: one pass finds that and makes the child.
        let mut next = self.next_tokens(c);
        let (token, first) = next.next()?;
        let mut groups = Ends::with_capacity(c.ends.len());
        groups.push(first);
        for (t, at) in next {
            if t != token {
                let (token, _) = self
                    .most_frequent_next(c)
                    .filter(|(_, n)| *n >= min_count)?;
                return self.child(c, token);
            }
            groups.push(at);
        }
        let cursor = Self::below(c, groups);
        (cursor.count >= min_count).then_some(Child {
            token,
            count: cursor.count,
            cursor,
        })
    }

    fn child(&self, c: &RequestCursor, token: u32) -> Option<Child<RequestCursor>> {
        if c.depth >= self.max_depth {
            return None;
        }
        let groups: Ends = self
            .next_tokens(c)
            .filter(|&(t, _)| t == token)
            .map(|(_, next)| next)
            .collect();
        (!groups.is_empty()).then(|| {
            let cursor = Self::below(c, groups);
            Child {
                token,
                count: cursor.count,
                cursor,
            }
        })
    }

    fn continuation_beyond_depth(&self, c: &RequestCursor, max: usize) -> &[u32] {
        // No depth limit to go beyond when the tree has none; with a limit, a unique
        // occurrence still knows its continuation.
        match c.ends[..] {
            [(j, 1)] => {
                let from = j as usize + 1;
                &self.tokens[from..self.tokens.len().min(from + max)]
            }
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_include_the_final_occurrence() {
        let t = RequestTree::new(&[1, 2, 3, 1, 2], 24);
        assert_eq!(t.count_of(&[1, 2]), 2);
        assert_eq!(t.count_of(&[2, 3]), 1);
        assert_eq!(t.count_of(&[9]), 0);
        let mut m = Vec::new();
        t.match_lengths(&[1, 2], 24, usize::MAX, &mut m);
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
            t.match_lengths(&[7], 1, usize::MAX, &mut m);
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
        t.match_lengths(&[7], 1, usize::MAX, &mut m);
        assert_eq!(m.len(), 301);
        let c = t.cursor_at(&m, 1, 24).unwrap();
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
        t.match_lengths(&[5; 10], 10, 64, &mut m);
        // Every recent occurrence matches all 10 tokens: the most recent 64 suffice.
        assert_eq!(m.len(), 64);
        assert!(m.iter().all(|&(_, l)| l == 10));
        t.match_lengths(&[5; 10], 10, usize::MAX, &mut m);
        assert_eq!(m.len(), MAX_OCCURRENCES);
        // A context that breaks off after 20 tokens: 64 copies of those 20 suffice too,
        // but not of a match shorter than LONG_MATCH.
        let mut context = vec![6u32; 30];
        context.extend([5; 20]);
        t.match_lengths(&context, 50, 64, &mut m);
        assert_eq!(m.len(), 64);
        assert!(m.iter().all(|&(_, l)| l == 20));
        t.match_lengths(&context[20..], 30, 64, &mut m);
        assert_eq!(m.len(), 64);
        let short = [6u32, 5, 5, 5];
        t.match_lengths(&short, 4, 64, &mut m);
        assert_eq!(m.len(), MAX_OCCURRENCES);
    }

    #[test]
    fn empty_prompt_and_depth_limit() {
        let mut t = RequestTree::new(&[], 2);
        let mut m = Vec::new();
        t.match_lengths(&[1], 2, usize::MAX, &mut m);
        assert!(m.is_empty());
        t.extend(&[1, 2, 3]);
        assert_eq!(t.count_of(&[1, 2]), 1);
        assert_eq!(t.count_of(&[1, 2, 3]), 0);
        let c = t.cursor_at(&[(1, 2)], 2, 24).unwrap();
        assert!(t.best_child(&c, 1).is_none());
    }
}
