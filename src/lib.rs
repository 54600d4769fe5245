//! suffixd: a persistent SuffixDecoding speculation store and the LLM server that uses it.
//!
//! The modules follow the data flow (see `ARCHITECTURE.md`):
//! [`tree`] (suffix trees) → [`speculate`] (drafts) → [`store`] (snapshots, write-ahead
//! log, eviction, compaction) → [`model`] (the forward pass that checks drafts) →
//! [`engine`] (batching, acceptance, grammars, the prefix cache) → [`drafting`] (the
//! drafters over the store) → [`serve`]
//! (the OpenAI and admin APIs) → [`cli`]. [`replicate`] shares a store's appends,
//! evictions and snapshots with other replicas through NATS JetStream. [`simulate`] is
//! the reference benchmark's simulated verifier. Beside the flow: [`corpus`] reads
//! request logs and token-stream files, [`chat`] holds chat messages and the model's
//! chat template, [`vocab`] names the tokenizer token ids come from, and [`files`]
//! opens the files an operator names (regular files only), [`memory`] reads and
//! trims the process's resident memory. `fuzzing` (the
//! `fuzzing` feature) holds the fuzz harnesses over the readers of the store's files.

pub mod chat;
pub mod cli;
pub mod corpus;
pub mod drafting;
pub mod engine;
pub mod files;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod memory;
pub mod model;
pub mod replicate;
pub mod serve;
pub mod simulate;
pub mod speculate;
pub mod store;
pub mod tree;
pub mod vocab;
