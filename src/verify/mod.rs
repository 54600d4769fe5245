//! The verifier: the model that checks drafts. The fourth stage of the data flow.
//!
//! - [`tokenizer`]: the model's tokenizer, from GGUF metadata or tokenizer.json.

pub mod tokenizer;
