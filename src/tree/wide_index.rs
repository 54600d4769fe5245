//! The child index of wide nodes: a map from `(node, token)` to child with its keys
//! stored inline.
//!
//! Speculation steps its cursors through the shallow, wide part of the global tree on
//! every call, and those lookups land on cold memory. A general-purpose table (hashbrown)
//! reads a control byte and then, elsewhere, the entry: two cache misses. Here a slot
//! holds the whole entry and collisions probe the next slots (linear probing), so a
//! lookup usually costs one miss, and [`WideIndex::prefetch`] can start it early.
//!
//! Removal shifts the entries of the probe run back (no tombstones), so lookups of absent
//! keys stop at the first empty slot however many removals came before.

use super::NIL;

/// The largest share of slots in use before the table doubles: with linear probing, a
/// fuller table makes absent keys walk long runs.
const MAX_LOAD_PER_8: usize = 7;
/// Slots of the first allocation.
const MIN_SLOTS: usize = 16;

/// One entry; `node == NIL` marks a free slot (`NIL` is never a node index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    node: u32,
    token: u32,
    child: u32,
}

const FREE: Slot = Slot {
    node: NIL,
    token: 0,
    child: NIL,
};

/// `(node, token) → child`, open addressing with the keys inline.
#[derive(Clone, Debug, Default)]
pub struct WideIndex {
    /// A power of two in length, or empty.
    slots: Vec<Slot>,
    len: usize,
}

/// A slot position from a key: a 64-bit mix (murmur3's finaliser), high bits first, so
/// that the children of one node spread over the table instead of forming one run.
#[inline]
fn home(node: u32, token: u32, mask: usize) -> usize {
    let mut h = ((node as u64) << 32) | token as u64;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h as usize & mask
}

impl WideIndex {
    /// An empty index; it allocates on the first insert.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes held (every slot, used or not).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The child of `node` whose edge starts with `token`.
    #[inline]
    pub fn get(&self, node: u32, token: u32) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = home(node, token, mask);
        loop {
            let s = &self.slots[i];
            if s.node == node && s.token == token {
                return Some(s.child);
            }
            if s.node == NIL {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Ask the CPU to start loading the slot where `(node, token)` would be, so that
    /// several independent lookups wait on memory together instead of one after another.
    #[inline]
    pub fn prefetch(&self, node: u32, token: u32) {
        if self.slots.is_empty() {
            return;
        }
        super::prefetch(&self.slots[home(node, token, self.mask())]);
    }

    /// Map `(node, token)` to `child`; returns the child it replaced, if any.
    pub fn insert(&mut self, node: u32, token: u32, child: u32) -> Option<u32> {
        debug_assert_ne!(node, NIL, "NIL marks free slots");
        self.reserve(1);
        let mask = self.mask();
        let mut i = home(node, token, mask);
        loop {
            let s = &mut self.slots[i];
            if s.node == NIL {
                *s = Slot { node, token, child };
                self.len += 1;
                return None;
            }
            if s.node == node && s.token == token {
                return Some(std::mem::replace(&mut s.child, child));
            }
            i = (i + 1) & mask;
        }
    }

    /// Remove `(node, token)`; returns its child, if it was there.
    pub fn remove(&mut self, node: u32, token: u32) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut hole = home(node, token, mask);
        loop {
            let s = self.slots[hole];
            if s.node == NIL {
                return None;
            }
            if s.node == node && s.token == token {
                break;
            }
            hole = (hole + 1) & mask;
        }
        let child = self.slots[hole].child;
        // Backward shift: move each later entry of the run into the hole when its home
        // does not lie after the hole (cyclically), so that no probe run is cut.
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let s = self.slots[i];
            if s.node == NIL {
                break;
            }
            let h = home(s.node, s.token, mask);
            if (i.wrapping_sub(h) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = s;
                hole = i;
            }
        }
        self.slots[hole] = FREE;
        self.len -= 1;
        Some(child)
    }

    /// Make room for `additional` more entries without growing on the way.
    pub fn reserve(&mut self, additional: usize) {
        let need = self.len + additional;
        if need * 8 <= self.slots.len() * MAX_LOAD_PER_8 {
            return;
        }
        let slots = (need * 8)
            .div_ceil(MAX_LOAD_PER_8)
            .next_power_of_two()
            .max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![FREE; slots]);
        self.len = 0;
        for s in old.into_iter().filter(|s| s.node != NIL) {
            self.insert(s.node, s.token, s.child);
        }
    }

    /// Every entry as `(node, token, child)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.node != NIL)
            .map(|s| (s.node, s.token, s.child))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn empty_index_finds_nothing_and_removes_nothing() {
        let mut ix = WideIndex::new();
        assert_eq!(ix.get(0, 0), None);
        assert_eq!(ix.remove(0, 0), None);
        ix.prefetch(1, 2);
        assert!(ix.is_empty());
        assert_eq!(ix.heap_bytes(), 0);
    }

    #[test]
    fn insert_replaces_and_reports_the_old_child() {
        let mut ix = WideIndex::new();
        assert_eq!(ix.insert(3, u32::MAX, 7), None);
        assert_eq!(ix.insert(3, u32::MAX, 8), Some(7));
        assert_eq!(ix.get(3, u32::MAX), Some(8));
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn stays_within_its_load_limit() {
        let mut ix = WideIndex::new();
        for t in 0..10_000 {
            ix.insert(t % 7, t, t);
        }
        assert_eq!(ix.len(), 10_000);
        assert!(ix.len() * 8 <= ix.slots.len() * MAX_LOAD_PER_8);
        assert!(ix.slots.len().is_power_of_two());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, u32, u32),
        Remove(u32, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, so that removals hit and probe runs collide.
        prop_oneof![
            (0u32..6, 0u32..40, any::<u32>()).prop_map(|(n, t, c)| Op::Insert(n, t, c)),
            (0u32..6, 0u32..40).prop_map(|(n, t)| Op::Remove(n, t)),
        ]
    }

    proptest! {
        /// Interleaved inserts and removals agree with a standard map at every step,
        /// lookups of absent keys included (backward shifts must not cut a probe run).
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut ix = WideIndex::new();
            let mut model = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(n, t, c) => {
                        prop_assert_eq!(ix.insert(n, t, c), model.insert((n, t), c));
                    }
                    Op::Remove(n, t) => {
                        prop_assert_eq!(ix.remove(n, t), model.remove(&(n, t)));
                    }
                }
                prop_assert_eq!(ix.len(), model.len());
                for n in 0..6 {
                    for t in 0..40 {
                        prop_assert_eq!(ix.get(n, t), model.get(&(n, t)).copied());
                    }
                }
            }
            let mut all: Vec<_> = ix.iter().collect();
            all.sort_unstable();
            let mut want: Vec<_> = model.iter().map(|(&(n, t), &c)| (n, t, c)).collect();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }
    }
}
