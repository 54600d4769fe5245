//! suffixd: a persistent SuffixDecoding speculation store and the LLM server that uses it.
//!
//! The modules follow the data flow (see `ARCHITECTURE.md`):
//! [`tree`] (suffix trees) → [`speculate`] (drafts) → [`simulate`] (the simulated
//! verifier) → [`cli`]. [`corpus`] reads token-stream files for all of them.

pub mod cli;
pub mod corpus;
pub mod replicate;
pub mod serve;
pub mod simulate;
pub mod speculate;
pub mod store;
pub mod tree;
pub mod verify;
