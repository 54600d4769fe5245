//! Cached sequences in last-use order, for LRU and age eviction.
//!
//! An [`lru::LruCache`] keyed by (namespace, id), holding each sequence's last-use time:
//! a use moves a sequence to the recent end in O(1), and the budget evicts from the cold
//! end. Its order is the order of uses. At open and at a snapshot swap it is rebuilt from
//! the persisted last-use times, oldest first (ties by namespace, then id), so it is the
//! same order again.

use lru::LruCache;

/// Sequences from least to most recently used, with their last-use times (ms).
#[derive(Clone)]
pub(crate) struct LastUse {
    order: LruCache<(String, u64), u64>,
}

impl LastUse {
    /// No sequences.
    pub fn new() -> Self {
        LastUse {
            order: LruCache::unbounded(),
        }
    }

    /// The order of these `(last_use_ms, namespace, id)` entries: by time, ties by
    /// namespace and id.
    pub fn from_times(mut entries: Vec<(u64, String, u64)>) -> Self {
        entries.sort_unstable();
        let mut order = LruCache::unbounded();
        for (time, ns, id) in entries {
            order.push((ns, id), time);
        }
        LastUse { order }
    }

    /// `id` of `namespace` was used (or added) at `time_ms`: it becomes the most recent.
    pub fn used(&mut self, namespace: &str, id: u64, time_ms: u64) {
        let key = (namespace.to_string(), id);
        match self.order.get_mut(&key) {
            Some(t) => *t = time_ms,
            None => {
                self.order.push(key, time_ms);
            }
        }
    }

    /// `id` of `namespace` left the cache.
    pub fn remove(&mut self, namespace: &str, id: u64) {
        self.order.pop(&(namespace.to_string(), id));
    }

    /// Every sequence, coldest first.
    pub fn coldest_first(&self) -> impl Iterator<Item = (&str, u64)> {
        self.order
            .iter()
            .rev()
            .map(|((ns, id), _)| (ns.as_str(), *id))
    }

    /// The sequences last used before `cutoff_ms`, coldest first.
    pub fn unused_since(&self, cutoff_ms: u64) -> impl Iterator<Item = (&str, u64)> {
        self.order
            .iter()
            .rev()
            .take_while(move |(_, t)| **t < cutoff_ms)
            .map(|((ns, id), _)| (ns.as_str(), *id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coldest_is_the_least_recently_used_and_age_cuts_from_the_cold_end() {
        let mut lu = LastUse::from_times(vec![
            (30, "b".into(), 1),
            (10, "a".into(), 2),
            (10, "a".into(), 1),
        ]);
        assert_eq!(
            lu.coldest_first().next(),
            Some(("a", 1)),
            "oldest time, ties by namespace and id"
        );
        lu.used("a", 1, 40);
        assert_eq!(lu.coldest_first().next(), Some(("a", 2)));
        lu.used("c", 7, 50);
        let old: Vec<_> = lu.unused_since(40).collect();
        assert_eq!(old, vec![("a", 2), ("b", 1)]);
        lu.remove("a", 2);
        lu.remove("a", 2);
        assert_eq!(lu.coldest_first().next(), Some(("b", 1)));
        assert_eq!(lu.unused_since(0).count(), 0);
    }
}
