//! The per-request tree as a drafting tree ([`Expand`]): counts, children and the best
//! child at a cursor, and the steps through stretches whose occurrences are all alike.

use smallvec::smallvec;

use super::{Ends, RequestCursor, RequestTree};
use crate::tree::{Child, Expand, common_prefix_len};

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
        let mut cursor = c.clone();
        let (token, count) = self.step_to_best_child(&mut cursor, min_count)?;
        Some(Child {
            token,
            count,
            cursor,
        })
    }

    fn step_to_best_child(&self, c: &mut RequestCursor, min_count: u32) -> Option<(u32, u32)> {
        if c.depth >= self.max_depth {
            return None;
        }
        // Repetitive text (a run, a period, a copy in progress) mostly has occurrences
        // that all go on the same way: one pass finds that, and the cursor is stepped
        // in place rather than rebuilt at every draft step.
        let (token, count) = {
            let mut next = self.next_tokens(c);
            let (token, (_, first)) = next.next()?;
            let mut count = first;
            let mut alike = true;
            for (t, (_, n)) in next {
                alike &= t == token;
                count += n;
            }
            if alike {
                (token, count)
            } else {
                self.most_frequent_next(c)?
            }
        };
        if count < min_count {
            return None;
        }
        let tokens = &self.tokens;
        c.ends
            .retain(|&mut (j, _)| tokens.get(j as usize + 1) == Some(&token));
        for (j, _) in &mut c.ends {
            *j += 1;
        }
        c.count = count;
        c.depth += 1;
        Some((token, count))
    }

    const KNOWS_ALIKE_STEPS: bool = true;

    fn alike_ahead(&self, c: &RequestCursor, steps: &mut [(u32, u32)]) -> usize {
        // The oldest occurrence has the most tokens after it. Each step, the others that
        // are still on its path either go on with its token or part from it there (or
        // have run out); while those going on hold a strict majority, the greedy step
        // takes its token, whatever the others are (as `most_frequent_next` would), and
        // keeps only them. So one comparison per occurrence gives every step.
        let Some(lead) = c.ends.iter().map(|&(j, _)| j as usize).min() else {
            return 0;
        };
        let tokens = &self.tokens;
        let lead_after = &tokens[(lead + 1).min(tokens.len())..];
        let room = steps
            .len()
            .min(self.max_depth.saturating_sub(c.depth))
            .min(lead_after.len());
        if room == 0 {
            return 0;
        }
        // Where the first step is already not the lead's (ordinary text, mostly), one
        // look at each next token says so.
        let (mut with_lead, mut against) = (0u32, 0u32);
        for &(j, n) in &c.ends {
            match tokens.get(j as usize + 1) {
                Some(&t) if t == lead_after[0] => with_lead += n,
                Some(_) => against += n,
                None => {}
            }
        }
        if with_lead <= against {
            return 0;
        }
        // Until the last pass, `steps[k]` holds (occurrences that follow the lead up to
        // step k and part there, occurrences that follow it through step k as
        // differences); the last pass writes the tokens over the first.
        steps[..room].fill((0, 0));
        for &(j, n) in &c.ends {
            let after = &tokens[j as usize + 1..];
            let agree = common_prefix_len(after, &lead_after[..room]);
            if agree > 0 {
                steps[0].1 += n;
                if agree < room {
                    steps[agree].1 = steps[agree].1.wrapping_sub(n);
                }
            }
            if agree < room && agree < after.len() {
                steps[agree].0 += n;
            }
        }
        for k in 0..room {
            if k > 0 {
                steps[k].1 = steps[k].1.wrapping_add(steps[k - 1].1);
            }
            let (parting, on_path) = steps[k];
            if on_path <= parting {
                return k;
            }
            steps[k].0 = lead_after[k];
        }
        room
    }

    fn advance_alike(&self, c: &mut RequestCursor, taken: usize, count: u32) {
        let tokens = &self.tokens;
        let lead = c.ends.iter().map(|&(j, _)| j as usize).min().unwrap_or(0);
        let path = &tokens[(lead + 1).min(tokens.len())..];
        let path = &path[..taken.min(path.len())];
        c.ends
            .retain(|&mut (j, _)| tokens[j as usize + 1..].starts_with(path));
        for (j, _) in &mut c.ends {
            *j += taken as u32;
        }
        c.count = count;
        c.depth += taken;
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
