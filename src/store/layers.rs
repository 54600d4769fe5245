//! The trees of one namespace, owned: base + delta − evicted, changed by inserts and
//! removals and read through [`Layered`]. The live store keeps one per namespace (with
//! its sequence metadata beside it), and `simulate` keeps one as its global cache, so
//! that both draft from exactly the same structure.

use crate::tree::{GlobalTree, Owned, Storage, TreeError};

use super::layered::Layered;
use super::snapshot::Frozen;

/// When removed tokens pass this fraction of the delta's pool, the delta is compacted;
/// when evicted tokens pass it of the base, the base is due to be rewritten
/// ([`Layers::base_due`]).
pub const COMPACT_DEAD_FRACTION: f64 = 0.5;

/// A namespace's trees: the base (a snapshot's frozen tree, or one built in memory),
/// the sequences inserted since (delta), and the base sequences removed since
/// (evicted). The base never changes; removing one of its sequences inserts it into
/// `evicted`, which the view subtracts.
#[derive(Clone)]
pub struct Layers<S: Storage = Frozen> {
    base: Option<GlobalTree<S>>,
    delta: GlobalTree,
    evicted: GlobalTree,
}

impl<S: Storage> Layers<S> {
    /// No base, nothing inserted.
    pub fn new(max_depth: usize) -> Result<Self, TreeError> {
        Ok(Layers {
            base: None,
            delta: GlobalTree::new(max_depth)?,
            evicted: GlobalTree::new(max_depth)?,
        })
    }

    /// `base`, with nothing inserted or removed since.
    pub fn over(base: GlobalTree<S>) -> Result<Self, TreeError> {
        let mut layers = Layers::new(base.max_depth())?;
        layers.base = Some(base);
        Ok(layers)
    }

    /// The view speculation reads.
    #[inline]
    pub fn view(&self) -> Layered<'_, S> {
        Layered::over(self.base.as_ref(), &self.delta, &self.evicted)
    }

    /// The depth limit of the trees.
    pub fn max_depth(&self) -> usize {
        self.delta.max_depth()
    }

    /// The base tree, if there is one.
    pub fn base(&self) -> Option<&GlobalTree<S>> {
        self.base.as_ref()
    }

    /// The tree of sequences inserted since the base.
    pub fn delta(&self) -> &GlobalTree {
        &self.delta
    }

    /// The tree of base sequences removed since.
    pub fn evicted(&self) -> &GlobalTree {
        &self.evicted
    }

    /// The tokens of a live sequence.
    pub fn sequence(&self, id: u64) -> Option<&[u32]> {
        if let Some(s) = self.delta.sequence(id) {
            return Some(s);
        }
        if self.evicted.contains(id) {
            return None;
        }
        self.base.as_ref()?.sequence(id)
    }

    /// Tokens of the live sequences.
    pub fn cached_tokens(&self) -> u64 {
        self.base.as_ref().map_or(0, |b| b.cached_tokens()) + self.delta.cached_tokens()
            - self.evicted.cached_tokens()
    }

    /// Insert a sequence into the delta.
    pub fn insert(&mut self, id: u64, tokens: &[u32]) -> Result<(), TreeError> {
        self.delta.insert(id, tokens)
    }

    /// Remove a live sequence: from the delta, or else by evicting it from the base.
    /// False if no live sequence has this id. Compacts nothing: see
    /// [`Layers::compact_delta_if_dead`] and [`Layers::base_due`].
    pub fn remove(&mut self, id: u64) -> Result<bool, TreeError> {
        if self.delta.remove(id) {
            return Ok(true);
        }
        if self.evicted.contains(id) {
            return Ok(false);
        }
        match self.base.as_ref().and_then(|b| b.sequence(id)) {
            Some(seq) => {
                let seq = seq.to_vec();
                self.evicted.insert(id, &seq)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Compact the delta if removed sequences hold more than [`COMPACT_DEAD_FRACTION`]
    /// of its pool; true if it did.
    pub fn compact_delta_if_dead(&mut self) -> bool {
        let due = self.delta.dead_fraction() > COMPACT_DEAD_FRACTION;
        if due {
            self.delta.compact();
        }
        due
    }

    /// Whether evicted sequences hold more than [`COMPACT_DEAD_FRACTION`] of the base:
    /// time to write a new base without them (a snapshot, or [`Layers::folded`]).
    pub fn base_due(&self) -> bool {
        let base = self.base.as_ref().map_or(0, |b| b.cached_tokens());
        self.evicted.cached_tokens() as f64 > COMPACT_DEAD_FRACTION * base as f64
    }

    /// The live sequences `ids` names (in that order; others are skipped) built into a
    /// new in-memory base, with nothing inserted or removed since.
    pub fn folded(&self, ids: impl Iterator<Item = u64>) -> Result<Layers<Owned>, TreeError> {
        let live = ids.filter_map(|id| Some((id, self.sequence(id)?)));
        Layers::over(GlobalTree::build(self.max_depth(), live)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Expand, GlobalIndex};

    /// COUNT of `path` in the view.
    fn count<S: Storage>(l: &Layers<S>, path: &[u32]) -> u32 {
        let v = l.view();
        v.walk(path).map_or(0, |c| v.count(&c))
    }

    fn layers() -> Layers<Owned> {
        let base = GlobalTree::build(8, [(1u64, &[1u32, 2, 3][..]), (2, &[1, 2, 4][..])]).unwrap();
        let mut l = Layers::over(base).unwrap();
        l.insert(3, &[1, 2, 5]).unwrap();
        l
    }

    #[test]
    fn removals_reach_the_delta_and_the_base_once() {
        let mut l = layers();
        assert_eq!(l.cached_tokens(), 9);
        assert!(l.remove(3).unwrap(), "from the delta");
        assert!(l.remove(1).unwrap(), "evicted from the base");
        assert!(!l.remove(1).unwrap(), "already evicted");
        assert!(!l.remove(9).unwrap(), "never stored");
        assert_eq!(l.sequence(1), None);
        assert_eq!(l.sequence(2), Some(&[1, 2, 4][..]));
        assert_eq!(l.cached_tokens(), 3);
        assert_eq!(count(&l, &[1, 2]), 1);
        assert!(!l.base_due(), "half of the base evicted: not over half");
        l.remove(2).unwrap();
        assert!(l.base_due());
    }

    #[test]
    fn folding_keeps_the_live_sequences_in_the_order_given() {
        let mut l = layers();
        l.remove(1).unwrap();
        let f = l.folded([3, 1, 2].into_iter()).unwrap();
        let base = f.base().unwrap();
        assert_eq!(base.ids().collect::<Vec<_>>(), vec![3, 2]);
        assert_eq!(f.cached_tokens(), 6);
        assert!(!f.base_due());
        assert_eq!(count(&f, &[1, 2]), 2);
    }
}
