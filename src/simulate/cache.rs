//! The simulator's global cache: a namespace's trees as the store keeps them
//! ([`Layers`]: the warm base, the test responses appended since, the base sequences
//! evicted since), with the FIFO order of the reference benchmark. Test responses never
//! change the base, so an in-memory build and its snapshot give the same drafts.

use std::collections::VecDeque;

use crate::speculate::{Draft, SpecParams, Speculator};
use crate::store::snapshot::Frozen;
use crate::store::{FrozenTree, LayeredCursor, Layers};
use crate::tree::{GlobalTree, Owned, RequestTree, TreeError};

/// The layers over a base built in memory from warm responses, or read in place from a
/// snapshot. Each is its own type so that speculation reads either without dispatch.
enum Trees {
    Built(Layers<Owned>),
    Frozen(Layers<Frozen>),
}

/// `$body` with `$l` bound to the layers, whichever their base.
macro_rules! each {
    ($trees:expr, $l:ident => $body:expr) => {
        match $trees {
            Trees::Built($l) => $body,
            Trees::Frozen($l) => $body,
        }
    };
}

/// The global cache: the trees, and the ids they hold, oldest first.
pub(super) struct Cache {
    trees: Trees,
    pub(super) order: VecDeque<u64>,
    capacity: usize,
    pub(super) compactions: usize,
}

impl Cache {
    /// An empty cache that holds at most `capacity` responses.
    pub(super) fn new(max_depth: usize, capacity: usize) -> Result<Self, TreeError> {
        Ok(Cache {
            trees: Trees::Built(Layers::new(max_depth)?),
            order: VecDeque::new(),
            capacity,
            compactions: 0,
        })
    }

    /// Warm-up: `base`, built from the warm responses `ids` names, oldest first.
    pub(super) fn warm(&mut self, base: GlobalTree, ids: Vec<u64>) -> Result<(), TreeError> {
        self.order.extend(ids);
        self.trees = Trees::Built(Layers::over(base)?);
        Ok(())
    }

    /// Warm-up from a snapshot: its tree is the base, its sequences the cache, FIFO-cut
    /// to the capacity.
    pub(super) fn open(&mut self, base: FrozenTree) -> Result<(), TreeError> {
        self.order.extend(base.ids());
        self.trees = Trees::Frozen(Layers::over(base)?);
        self.make_room(0)
    }

    /// Evict the oldest responses until `slots` more fit.
    fn make_room(&mut self, slots: usize) -> Result<(), TreeError> {
        while self.order.len() + slots > self.capacity {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            each!(&mut self.trees, l => l.remove(old))?;
        }
        self.maybe_compact()
    }

    /// Tokens of the cached responses.
    pub(super) fn cached_tokens(&self) -> u64 {
        each!(&self.trees, l => l.cached_tokens())
    }

    /// Append a finished response, evicting the oldest when full.
    pub(super) fn add(&mut self, id: u64, tokens: &[u32]) -> Result<(), TreeError> {
        if self.capacity == 0 {
            return Ok(());
        }
        self.make_room(1)?;
        each!(&mut self.trees, l => l.insert(id, tokens))?;
        self.order.push_back(id);
        Ok(())
    }

    /// Remove a response appended by [`Cache::add`].
    pub(super) fn remove(&mut self, id: u64) -> Result<(), TreeError> {
        if each!(&mut self.trees, l => l.remove(id))? {
            // Usually the newest, removed right after its request.
            if self.order.back() == Some(&id) {
                self.order.pop_back();
            } else {
                self.order.retain(|x| *x != id);
            }
        }
        self.maybe_compact()
    }

    /// Reclaim removed space as the store would: compact the delta when half of it is
    /// dead, and fold everything into a new base when evictions pass half of the base.
    fn maybe_compact(&mut self) -> Result<(), TreeError> {
        if each!(&mut self.trees, l => l.compact_delta_if_dead()) {
            self.compactions += 1;
        }
        if each!(&self.trees, l => l.base_due()) {
            let folded = each!(&self.trees, l => l.folded(self.order.iter().copied()))?;
            self.trees = Trees::Built(folded);
            self.compactions += 1;
        }
        Ok(())
    }

    // Never inlined: `tools/spec-cost.sh` counts instructions per call of this function.
    #[inline(never)]
    pub(super) fn speculate<'s>(
        &self,
        spec: &'s mut Speculator<LayeredCursor>,
        request: &RequestTree,
        context: &[u32],
        params: &SpecParams,
    ) -> &'s Draft {
        each!(&self.trees, l => spec.speculate_in_place(Some(request), &l.view(), context, params))
    }
}
