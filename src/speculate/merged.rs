//! A view of two suffix trees as one whose counts are the sums of both.
//!
//! The request tree knows what this request repeats; the global tree knows what earlier
//! responses did. Where both have seen the context, summing their counts estimates the
//! continuation from all the evidence instead of from one tree or the other. The
//! reference implementation gets part of this by adding the response in progress to its
//! global tree; summing at read time gives it for the prompt too, without touching the
//! shared store.

use crate::tree::{Child, Expand};

/// Two trees read as one; counts add up.
pub(crate) struct Merged<'a, A, B> {
    pub(crate) a: &'a A,
    pub(crate) b: &'a B,
}

/// A position in both trees; `None` where a tree does not have the path.
pub(crate) type MergedCursor<A, B> = (Option<<A as Expand>::Cursor>, Option<<B as Expand>::Cursor>);

fn count_in<T: Expand>(t: &T, c: &Option<T::Cursor>) -> u32 {
    c.as_ref().map_or(0, |c| t.count(c))
}

fn child_for<T: Expand>(t: &T, c: &Option<T::Cursor>, token: u32) -> Option<Child<T::Cursor>> {
    t.child(c.as_ref()?, token)
}

impl<A: Expand, B: Expand> Expand for Merged<'_, A, B> {
    type Cursor = MergedCursor<A, B>;

    fn count(&self, c: &Self::Cursor) -> u32 {
        count_in(self.a, &c.0) + count_in(self.b, &c.1)
    }

    fn children(&self, c: &Self::Cursor, min_count: u32, out: &mut Vec<Child<Self::Cursor>>) {
        out.clear();
        let (ca, cb) = (count_in(self.a, &c.0), count_in(self.b, &c.1));
        let mut ka = Vec::new();
        let mut kb = Vec::new();
        // A child needs min_count in total, so at least min_count - (the other tree's whole
        // count) in each tree.
        if let Some(x) = &c.0 {
            self.a
                .children(x, min_count.saturating_sub(cb).max(1), &mut ka);
        }
        if let Some(y) = &c.1 {
            self.b
                .children(y, min_count.saturating_sub(ca).max(1), &mut kb);
        }
        for k in ka {
            let other = kb
                .iter()
                .position(|m| m.token == k.token)
                .map(|i| kb.swap_remove(i));
            let count = k.count + other.as_ref().map_or(0, |m| m.count);
            out.push(Child {
                token: k.token,
                count,
                cursor: (Some(k.cursor), other.map(|m| m.cursor)),
            });
        }
        out.extend(kb.into_iter().map(|m| Child {
            token: m.token,
            count: m.count,
            cursor: (None, Some(m.cursor)),
        }));
        out.retain(|k| k.count >= min_count);
        out.sort_by_key(|k| std::cmp::Reverse(k.count));
    }

    fn best_child(&self, c: &Self::Cursor, min_count: u32) -> Option<Child<Self::Cursor>> {
        // A path only one tree has is that tree's alone, and so are its children.
        let min_count = min_count.max(1);
        match c {
            (Some(x), None) => {
                return self.a.best_child(x, min_count).map(|k| Child {
                    token: k.token,
                    count: k.count,
                    cursor: (Some(k.cursor), None),
                });
            }
            (None, Some(y)) => {
                return self.b.best_child(y, min_count).map(|m| Child {
                    token: m.token,
                    count: m.count,
                    cursor: (None, Some(m.cursor)),
                });
            }
            _ => {}
        }
        // The most likely child is almost always one tree's favourite; weigh both
        // favourites with their counts in the other tree.
        // A child reaching min_count in total has at least min_count minus the other
        // tree's whole count in each tree.
        let (ca, cb) = (count_in(self.a, &c.0), count_in(self.b, &c.1));
        let fa =
            c.0.as_ref()
                .and_then(|x| self.a.best_child(x, min_count.saturating_sub(cb).max(1)));
        let fb =
            c.1.as_ref()
                .and_then(|y| self.b.best_child(y, min_count.saturating_sub(ca).max(1)));
        if let (Some(k), Some(m)) = (&fa, &fb)
            && k.token == m.token
        {
            // Both trees favour the same token: no lookups needed.
            let (k, m) = (fa.unwrap(), fb.unwrap());
            let count = k.count + m.count;
            return (count >= min_count).then(|| Child {
                token: k.token,
                count,
                cursor: (Some(k.cursor), Some(m.cursor)),
            });
        }
        let mut best: Option<Child<Self::Cursor>> = None;
        let from_a = fa.map(|k| {
            let m = child_for(self.b, &c.1, k.token);
            Child {
                token: k.token,
                count: k.count + m.as_ref().map_or(0, |m| m.count),
                cursor: (Some(k.cursor), m.map(|m| m.cursor)),
            }
        });
        let from_b = fb.map(|m| {
            let k = child_for(self.a, &c.0, m.token);
            Child {
                token: m.token,
                count: m.count + k.as_ref().map_or(0, |k| k.count),
                cursor: (k.map(|k| k.cursor), Some(m.cursor)),
            }
        });
        for cand in [from_a, from_b].into_iter().flatten() {
            if best.as_ref().is_none_or(|b| cand.count > b.count) {
                best = Some(cand);
            }
        }
        best.filter(|b| b.count >= min_count)
    }

    fn step_to_best_child(&self, c: &mut Self::Cursor, min_count: u32) -> Option<(u32, u32)> {
        // A path only one tree has steps in that tree, in place (see `best_child`).
        let min_count = min_count.max(1);
        match c {
            (Some(x), None) => self.a.step_to_best_child(x, min_count),
            (None, Some(y)) => self.b.step_to_best_child(y, min_count),
            _ => {
                let child = self.best_child(c, min_count)?;
                *c = child.cursor;
                Some((child.token, child.count))
            }
        }
    }

    fn continuation_beyond_depth(&self, c: &Self::Cursor, max: usize) -> &[u32] {
        match (&c.0, &c.1) {
            (Some(x), None) => self.a.continuation_beyond_depth(x, max),
            (None, Some(y)) => self.b.continuation_beyond_depth(y, max),
            _ => &[],
        }
    }
}
