//! Last-use marks from readers, kept outside the writer's lock.
//!
//! The model thread marks the cached sequences behind an accepted draft as used, for
//! least-recently-used eviction. Taking the store's writer lock for that would make
//! decoding wait for whatever holds it, and a snapshot holds it across its log
//! rotation's fsync. So a mark goes into this side table under its own short lock, and
//! the marks are applied to the state the next time a writer takes the lock (an append,
//! an eviction, a snapshot's cut or swap), and before eviction picks its victims: the
//! order of use that eviction sees is the same, and the reader never waits for the
//! disk.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::State;

/// Marks not yet applied: per namespace, each sequence's latest use (ms since the epoch).
/// One entry per marked sequence, so it stays as small as the set of sequences in use
/// between two writes.
#[derive(Default)]
pub(super) struct PendingTouches {
    marks: Mutex<HashMap<String, HashMap<u64, u64>>>,
}

impl PendingTouches {
    /// Record that `ids` of `namespace` were used at `now_ms`.
    pub(super) fn mark(&self, namespace: &str, ids: &[u64], now_ms: u64) {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        let ns = match marks.get_mut(namespace) {
            Some(ns) => ns,
            None => marks.entry(namespace.to_string()).or_default(),
        };
        for &id in ids {
            let t = ns.entry(id).or_insert(now_ms);
            *t = (*t).max(now_ms);
        }
    }

    /// True when marks wait to be applied.
    pub(super) fn is_pending(&self) -> bool {
        !self
            .marks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Take every pending mark (None when there is none).
    pub(super) fn take(&self) -> Option<HashMap<String, HashMap<u64, u64>>> {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        (!marks.is_empty()).then(|| std::mem::take(&mut *marks))
    }
}

/// Apply taken marks to `state`: a sequence evicted meanwhile is skipped, and a mark
/// never moves a last use back. Idempotent, as a double-buffered change must be.
pub(super) fn apply(state: &mut State, marks: &HashMap<String, HashMap<u64, u64>>) {
    let State {
        namespaces, lru, ..
    } = state;
    for (name, ids) in marks {
        let Some(ns) = namespaces.get_mut(name) else {
            continue;
        };
        for (&id, &time) in ids {
            if let Some(info) = ns.seqs.get_mut(&id)
                && time > info.last_use_ms
            {
                info.last_use_ms = time;
                lru.used(name, id, time);
            }
        }
    }
}
