//! Which tokenizer token ids come from, and the one thing the store asks of a tokenizer.
//! Shared by the store (files record their tokenizer) and the verifier (which has the
//! tokenizer), so that neither imports the other.

/// Which tokenizer produced the token ids in a snapshot or WAL. Ids from another
/// tokenizer would be silently wrong drafts, so a mismatch refuses to open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TokenizerId {
    /// Vocabulary size; 0 when the ids came from token files without a tokenizer.
    pub vocab_size: u32,
    /// Hash of the vocabulary (every token string in id order); 0 when unknown.
    pub vocab_hash: u64,
}

impl TokenizerId {
    /// The identity of token ids whose tokenizer is not known (token-id logs).
    pub const UNKNOWN: TokenizerId = TokenizerId {
        vocab_size: 0,
        vocab_hash: 0,
    };

    /// The identity of a vocabulary given as token strings in id order.
    pub fn of_vocab<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Self {
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut n = 0u32;
        for t in tokens {
            for b in t.bytes().chain(std::iter::once(0xff)) {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            n += 1;
        }
        TokenizerId {
            vocab_size: n,
            vocab_hash: h,
        }
    }
}

impl std::fmt::Display for TokenizerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == Self::UNKNOWN {
            write!(f, "unknown tokenizer (token-id logs)")
        } else {
            write!(
                f,
                "vocab {} / hash {:016x}",
                self.vocab_size, self.vocab_hash
            )
        }
    }
}

/// Text that a tokenizer could not turn into token ids.
#[derive(Debug, thiserror::Error)]
#[error("the tokenizer cannot encode this text: {0}")]
pub struct EncodeError(pub String);

/// Turns response text into token ids: the model's tokenizer.
pub trait TextEncoder {
    /// The token ids of `text`, without special tokens added.
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError>;
    /// Which tokenizer this is.
    fn identity(&self) -> TokenizerId;
}
