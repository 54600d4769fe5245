//! The one vocabulary of changes to the cached sequences: what the write-ahead log
//! records, what replication carries between replicas, and what the admin API asks for.
//! An append names one sequence; an eviction names a scope ([`EvictScope`]), which the
//! store resolves into the sequences it removes, one logged eviction each (replaying
//! "unused since" would depend on last-use times the log does not keep).

/// What an eviction removes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictScope {
    /// One sequence.
    Id {
        /// Its namespace.
        namespace: String,
        /// Its id.
        id: u64,
    },
    /// Every sequence of a namespace.
    Namespace {
        /// The namespace.
        namespace: String,
    },
    /// Every sequence not used since a time: each store by its own last-use times.
    UnusedSince {
        /// ms since the Unix epoch.
        cutoff_ms: u64,
    },
}

impl EvictScope {
    /// One sequence.
    pub fn id(namespace: impl Into<String>, id: u64) -> Self {
        EvictScope::Id {
            namespace: namespace.into(),
            id,
        }
    }
}

/// A change to the cached sequences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A completed request's response, cached under `id`.
    Append {
        /// Its namespace.
        namespace: String,
        /// Its id (the same on every replica).
        id: u64,
        /// When it was appended, ms since the Unix epoch.
        time_ms: u64,
        /// The response's tokens.
        tokens: Vec<u32>,
    },
    /// An eviction.
    Evict(EvictScope),
}

impl Change {
    /// The one sequence the change names: an append's, or a one-sequence eviction's.
    pub fn sequence(&self) -> Option<(&str, u64)> {
        match self {
            Change::Append { namespace, id, .. }
            | Change::Evict(EvictScope::Id { namespace, id }) => Some((namespace, *id)),
            Change::Evict(EvictScope::Namespace { .. } | EvictScope::UnusedSince { .. }) => None,
        }
    }

    /// The eviction of one sequence.
    pub fn evict(namespace: impl Into<String>, id: u64) -> Self {
        Change::Evict(EvictScope::id(namespace, id))
    }
}
