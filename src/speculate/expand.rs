//! Growing a draft from a matched node: greedily along the likeliest child (paths), or
//! best-first over every child above `min_prob` (trees).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::tree::{Child, Expand};

use super::{Draft, SpecMode, SpecParams};

struct HeapItem<C> {
    prob: f32,
    order: u32,
    parent: i32,
    token: u32,
    cursor: C,
}

impl<C> PartialEq for HeapItem<C> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<C> Eq for HeapItem<C> {}
impl<C> PartialOrd for HeapItem<C> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<C> Ord for HeapItem<C> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest probability first; among equals, the one pushed first.
        self.prob
            .total_cmp(&other.prob)
            .then_with(|| other.order.cmp(&self.order))
    }
}

/// The smallest child count that could keep a path of probability `prob`, at a node of
/// `count`, at or above `min_prob` (rounded down, so that it never excludes one that can).
pub(super) fn min_count_for(params: &SpecParams, prob: f32, count: u32) -> u32 {
    // The quotient is not negative, so the cast's truncation is the floor (without a
    // call to libm's floorf on every draft step).
    (((params.min_prob / prob) * count as f32) as u32).max(1)
}

/// True when a draft of `d.score` that may still grow by `room` tokens of at most `prob`
/// each cannot reach `floor`. The margin covers the rounding of the f32 sum (24 terms at
/// most err by about 1e-6 relative), so a draft that could tie is never cut.
pub(super) fn cannot_reach(d: &Draft, room: usize, prob: f32, floor: f32) -> bool {
    (d.score + room as f32 * prob) * (1.0 + 1e-4) < floor
}

/// Most steps a path draft takes at once where its occurrences go on alike (more than
/// any default draft: `max_spec` is 24).
const ALIKE_AHEAD: usize = 64;

/// Fewest occurrences at which a path draft asks for the steps known at once: below it,
/// one token at a time costs about as little, and asking costs a pass (ShareGPT, whose
/// request-tree cursors mostly hold a few occurrences: 6,447 instructions per call
/// before, 6,548 asking from 2 occurrences, 6,466 from 8, 6,432 from 32). The same
/// threshold as telling scores (`RESCORE_FROM_MATCHES`): repetitive text has more.
const ALIKE_FROM_OCCURRENCES: u32 = 32;

/// Grow a single-path draft from `start` into `d`, stopping early once it cannot reach
/// `floor` (every later token is at most as likely as the last).
pub(super) fn expand_path<T: Expand>(
    tree: &T,
    start: &T::Cursor,
    max_tokens: usize,
    floor: f32,
    params: &SpecParams,
    d: &mut Draft,
) {
    let mut prob = 1.0f32;
    let mut cur = start.clone();
    let extended = params.mode == SpecMode::Extended;
    // A few occurrences step as cheaply one token at a time (ordinary text).
    if T::KNOWS_ALIKE_STEPS
        && tree.count(&cur) >= ALIKE_FROM_OCCURRENCES
        && !take_alike_steps(tree, &mut cur, max_tokens, floor, params, d, &mut prob)
    {
        return;
    }
    while d.len() < max_tokens {
        if cannot_reach(d, max_tokens - d.len(), prob, floor) {
            break;
        }
        let count = tree.count(&cur);
        if extended && count == 1 {
            let rest = tree.continuation_beyond_depth(&cur, max_tokens - d.len());
            if !rest.is_empty() {
                for &t in rest {
                    let parent = d.len() as i32 - 1;
                    d.push(t, parent, prob);
                }
                break;
            }
        }
        // Children below this count cannot reach min_prob: the tree need not look at them.
        let Some((token, child_count)) =
            tree.step_to_best_child(&mut cur, min_count_for(params, prob, count))
        else {
            break;
        };
        let next = prob * (child_count as f32 / count as f32);
        if next < params.min_prob {
            break;
        }
        prob = next;
        let parent = d.len() as i32 - 1;
        d.push(token, parent, prob);
    }
}

/// The first steps of [`expand_path`] where every occurrence goes on alike
/// ([`Expand::alike_ahead`]): each taken by the same checks and arithmetic as one step
/// at a time, then the cursor moved once. False when the draft ended among them; true
/// when the rest is left to one step at a time (from a step where the occurrences part
/// without a majority). A single occurrence left among them is stepped through here:
/// its continuation is what extended mode would read on, at the same probability.
fn take_alike_steps<T: Expand>(
    tree: &T,
    cur: &mut T::Cursor,
    max_tokens: usize,
    floor: f32,
    params: &SpecParams,
    d: &mut Draft,
    prob: &mut f32,
) -> bool {
    let mut ahead = [(0u32, 0u32); ALIKE_AHEAD];
    loop {
        let asked = (max_tokens - d.len()).min(ALIKE_AHEAD);
        let known = tree.alike_ahead(cur, &mut ahead[..asked]);
        let mut count = tree.count(cur);
        let mut taken = 0;
        for &(token, child_count) in &ahead[..known] {
            if cannot_reach(d, max_tokens - d.len(), *prob, floor) {
                return false;
            }
            if child_count < min_count_for(params, *prob, count) {
                return false;
            }
            let next = *prob * (child_count as f32 / count as f32);
            if next < params.min_prob {
                return false;
            }
            *prob = next;
            let parent = d.len() as i32 - 1;
            d.push(token, parent, *prob);
            count = child_count;
            taken += 1;
        }
        if taken > 0 {
            tree.advance_alike(cur, taken, count);
        }
        // Only a full buffer leaves more steps that may be known at once.
        if taken < ALIKE_AHEAD {
            return true;
        }
    }
}

/// Grow a draft tree from `start` into `d`, best D(N) first, stopping early once it
/// cannot reach `floor` (no node to come is more likely than the heap's top).
pub(super) fn expand_tree<T: Expand>(
    tree: &T,
    start: &T::Cursor,
    max_tokens: usize,
    floor: f32,
    params: &SpecParams,
    d: &mut Draft,
) {
    let mut heap = BinaryHeap::new();
    let mut order = 0u32;
    let mut kids: Vec<Child<T::Cursor>> = Vec::new();
    let extended = params.mode == SpecMode::Extended;
    let mut push_children =
        |heap: &mut BinaryHeap<HeapItem<T::Cursor>>, cur: &T::Cursor, prob: f32, parent: i32| {
            let count = tree.count(cur);
            tree.children(cur, min_count_for(params, prob, count), &mut kids);
            for k in kids.drain(..) {
                let p = prob * (k.count as f32 / count as f32);
                if p < params.min_prob {
                    break;
                }
                heap.push(HeapItem {
                    prob: p,
                    order,
                    parent,
                    token: k.token,
                    cursor: k.cursor,
                });
                order += 1;
            }
        };
    push_children(&mut heap, start, 1.0, -1);
    while d.len() < max_tokens {
        let Some(item) = heap.pop() else { break };
        if cannot_reach(d, max_tokens - d.len(), item.prob, floor) {
            break;
        }
        let idx = d.push(item.token, item.parent, item.prob);
        if extended && tree.count(&item.cursor) == 1 {
            // A unique path has one continuation, as likely as this token: take it now.
            let rest = tree.continuation_beyond_depth(&item.cursor, max_tokens - d.len());
            if !rest.is_empty() {
                let mut parent = idx;
                for &t in rest {
                    parent = d.push(t, parent, item.prob);
                }
                continue;
            }
        }
        push_children(&mut heap, &item.cursor, item.prob, idx);
    }
}

/// Grow a draft from `start` into `d`, which is cleared first (its buffers are reused).
/// Growth may stop once the draft's score cannot reach `floor`: the caller has a draft
/// of that score already, so this one would lose whatever it grew into.
pub(super) fn expand<T: Expand>(
    tree: &T,
    start: &T::Cursor,
    max_tokens: usize,
    floor: f32,
    params: &SpecParams,
    d: &mut Draft,
) {
    d.clear();
    if params.tree {
        expand_tree(tree, start, max_tokens, floor, params, d)
    } else {
        expand_path(tree, start, max_tokens, floor, params, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{RequestCursor, RequestTree, repetitive_prompt, tree_and_cursor_at_end};

    /// The request tree, stepped one token at a time only.
    struct OneByOne<'a>(&'a RequestTree);

    impl Expand for OneByOne<'_> {
        type Cursor = RequestCursor;

        fn count(&self, c: &RequestCursor) -> u32 {
            self.0.count(c)
        }

        fn children(&self, c: &RequestCursor, min_count: u32, out: &mut Vec<Child<RequestCursor>>) {
            self.0.children(c, min_count, out)
        }

        fn step_to_best_child(&self, c: &mut RequestCursor, min_count: u32) -> Option<(u32, u32)> {
            self.0.step_to_best_child(c, min_count)
        }

        fn continuation_beyond_depth(&self, c: &RequestCursor, max: usize) -> &[u32] {
            self.0.continuation_beyond_depth(c, max)
        }
    }

    proptest::proptest! {
        /// A path draft that takes the steps known at once is, token for token and bit
        /// for bit, the draft grown one step at a time.
        #[test]
        fn steps_known_at_once_grow_the_same_draft(
            prompt in repetitive_prompt(1..80, 500),
            reply in proptest::collection::vec(0u32..4, 0..40),
            p in 1usize..24,
            max_tokens in 1usize..100,
            floor in proptest::prop_oneof![proptest::strategy::Just(0.0f32), 0.0f32..30.0],
            paper in proptest::bool::ANY,
        ) {
            let params = SpecParams {
                mode: if paper { SpecMode::Paper } else { SpecMode::Extended },
                ..SpecParams::default()
            };
            let (t, start) =
                tree_and_cursor_at_end(&prompt, &reply, params.request_depth(), p, max_tokens);
            let Some(start) = start else {
                return Ok(());
            };
            let (mut at_once, mut one_by_one) = (Draft::default(), Draft::default());
            expand_path(&t, &start, max_tokens, floor, &params, &mut at_once);
            expand_path(&OneByOne(&t), &start, max_tokens, floor, &params, &mut one_by_one);
            proptest::prop_assert_eq!(&at_once.tokens, &one_by_one.tokens);
            proptest::prop_assert_eq!(&at_once.parents, &one_by_one.parents);
            let bits = |d: &Draft| d.probs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            proptest::prop_assert_eq!(bits(&at_once), bits(&one_by_one));
            proptest::prop_assert_eq!(at_once.score.to_bits(), one_by_one.score.to_bits());
        }
    }
}
