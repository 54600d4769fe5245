//! Where drafts come from. The engine asks a request's [`Drafter`] for each decoding
//! step's draft and tells it what the model accepted; everything the drafter speculates
//! from (the request's own suffix tree, the shared cache, the speculation parameters) is
//! the drafter's own, so every caller of the engine drafts alike.

use crate::speculate::Draft;

/// Drafts for one request.
pub trait Drafter {
    /// The draft that follows `context`: the request's prompt, then every token
    /// generated so far. Each call's context extends the previous call's.
    fn draft(&mut self, context: &[u32]) -> Draft;

    /// Called after a verified step whose draft had `accepted` tokens accepted;
    /// `context` ends with those accepted tokens.
    fn accepted(&mut self, _context: &[u32], _draft: &Draft, _accepted: usize) {}
}

/// Drafts nothing: plain decoding.
pub struct NoDrafts;

impl Drafter for NoDrafts {
    fn draft(&mut self, _: &[u32]) -> Draft {
        Draft::default()
    }
}
