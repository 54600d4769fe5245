//! Where drafts come from: the cache drafter, which reads the store's trees for a
//! request and speculates over them. A room above `model` (whose engine asks a
//! [`crate::engine::Drafter`] for drafts) and `store` (whose trees it reads), so
//! that neither imports the other.

mod cache;

pub use cache::{CacheDrafter, CacheSource, NamespaceSource};
