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
    let mut ahead = [(0u32, 0u32); ALIKE_AHEAD];
    // Asked at the start, and again after a step that every occurrence took: on
    // ordinary text the occurrences part at most steps, and asking would not pay.
    let mut ask = T::KNOWS_ALIKE_STEPS;
    while d.len() < max_tokens {
        // Where every occurrence goes on alike, the steps are known at once; each is
        // taken by the same checks and arithmetic as the step below.
        let mut count = tree.count(&cur);
        // A single occurrence is read on below (extended mode) in one go.
        let known = if ask && !(extended && count == 1) {
            let asked = (max_tokens - d.len()).min(ALIKE_AHEAD);
            tree.alike_ahead(&cur, &mut ahead[..asked])
        } else {
            0
        };
        let mut taken = 0;
        for &(token, child_count) in &ahead[..known] {
            if cannot_reach(d, max_tokens - d.len(), prob, floor) {
                return;
            }
            // A single occurrence is read on below (extended mode).
            if extended && count == 1 {
                break;
            }
            if child_count < min_count_for(params, prob, count) {
                return;
            }
            let next = prob * (child_count as f32 / count as f32);
            if next < params.min_prob {
                return;
            }
            prob = next;
            let parent = d.len() as i32 - 1;
            d.push(token, parent, prob);
            count = child_count;
            taken += 1;
        }
        if taken > 0 {
            tree.advance_alike(&mut cur, taken, count);
            // Fewer steps than asked: the next one is not known at once (the majority
            // fails, or nothing goes on), so it is taken below.
            if taken == ALIKE_AHEAD {
                continue;
            }
        }
        if d.len() >= max_tokens || cannot_reach(d, max_tokens - d.len(), prob, floor) {
            break;
        }
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
        ask = T::KNOWS_ALIKE_STEPS && child_count == count;
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
