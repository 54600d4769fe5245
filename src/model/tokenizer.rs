//! The model's tokenizer: built from a GGUF file's metadata, or read from tokenizer.json.
//!
//! candle's own GGUF tokenizer treats SmolLM2's `pre = "smollm"` as plain GPT-2 with a
//! prefix space and mistokenizes. What matches the model's tokenizer.json is a BPE over
//! `tokenizer.ggml.tokens` / `.merges`, pre-tokenized by individual digits and then
//! byte-level (no prefix space), decoded byte-level, with control tokens as specials.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

use crate::vocab::{EncodeError, TextEncoder, TokenizerId};

/// Errors from loading a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// tokenizer.json could not be read or parsed.
    #[error("cannot load tokenizer {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The GGUF metadata lacks or garbles a tokenizer key.
    #[error("the model's GGUF metadata has no usable tokenizer: {0}")]
    Gguf(String),
    /// The tokenizer could not be written out as tokenizer.json.
    #[error("cannot write the tokenizer as tokenizer.json: {0}")]
    Serialize(String),
}

/// Token ids that the tokenizer could not turn into text. Ids the model produced are in
/// its vocabulary, so for generated text this is a bug, not bad input.
#[derive(Debug, thiserror::Error)]
#[error("the tokenizer cannot decode these token ids: {0}")]
pub struct DecodeError(pub String);

/// A tokenizer with its identity.
#[derive(Clone)]
pub struct ModelTokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with control-token strings read as plain text.
    literal: tokenizers::Tokenizer,
    identity: TokenizerId,
    /// Bytes of the longest vocabulary entry: no token covers more text than that.
    max_token_bytes: usize,
}

/// GGUF token type of control tokens.
const CONTROL: i32 = 3;

impl ModelTokenizer {
    /// Read a Hugging Face tokenizer.json.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::File {
            path: path.into(),
            message: e.to_string(),
        })?;
        Ok(Self::wrap(inner))
    }

    /// Build the tokenizer that the GGUF metadata describes (BPE models).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let md = |k: &str| {
            content
                .metadata
                .get(k)
                .ok_or_else(|| TokenizerError::Gguf(format!("missing {k}")))
        };
        let bad = |k: &str, e: candle_core::Error| TokenizerError::Gguf(format!("{k}: {e}"));
        let model = md("tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| bad("tokenizer.ggml.model", e))?;
        if model != "gpt2" {
            return Err(TokenizerError::Gguf(format!(
                "tokenizer model {model:?} is not supported (BPE \"gpt2\" only); use a safetensors directory with tokenizer.json"
            )));
        }
        let tokens: Vec<String> = md("tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?;
        let merges: Vec<(String, String)> = md("tokenizer.ggml.merges")?
            .to_vec()
            .map_err(|e| bad("tokenizer.ggml.merges", e))?
            .iter()
            .map(|v| {
                let s = v.to_string().map_err(|e| bad("tokenizer.ggml.merges", e))?;
                let (a, b) = s
                    .split_once(' ')
                    .ok_or_else(|| TokenizerError::Gguf(format!("merge {s:?} is not \"a b\"")))?;
                Ok((a.to_string(), b.to_string()))
            })
            .collect::<Result<_, TokenizerError>>()?;
        let types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| bad("tokenizer.ggml.token_type", e))?
                .iter()
                .map(|t| t.to_i32())
                .collect::<Result<_, _>>()
                .map_err(|e| bad("tokenizer.ggml.token_type", e))?,
            None => Vec::new(),
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| TokenizerError::Gguf(format!("BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ]))));
        inner.with_decoder(Some(tokenizers::DecoderWrapper::ByteLevel(
            ByteLevel::default(),
        )));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter())
            .filter(|(_, t)| **t == CONTROL)
            .map(|(tok, _)| AddedToken::from(tok.clone(), true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| TokenizerError::Gguf(format!("special tokens: {e}")))?;
        Ok(Self::wrap(inner))
    }

    fn wrap(inner: tokenizers::Tokenizer) -> Self {
        let mut vocab: Vec<(String, u32)> = inner.get_vocab(true).into_iter().collect();
        vocab.sort_by_key(|(_, id)| *id);
        let identity = TokenizerId::of_vocab(vocab.iter().map(|(s, _)| s.as_str()));
        // A vocabulary entry spells its text with at least one byte per byte it covers
        // (byte-level BPE: one char per byte; SentencePiece: `▁` for a space).
        let max_token_bytes = vocab.iter().map(|(s, _)| s.len()).max().unwrap_or(1).max(1);
        let mut literal = inner.clone();
        literal.set_encode_special_tokens(true);
        Self {
            inner,
            literal,
            identity,
            max_token_bytes,
        }
    }

    /// Token ids of `text`. Special-token strings in it (`<|im_start|>`) become their ids.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError(e.to_string()))
    }

    /// Token ids of `text` read as plain text: a control-token string in it (`<|im_end|>`)
    /// is tokenized as the characters it is made of, never as the control token.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.literal
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError(e.to_string()))
    }

    /// Token ids of a chat prompt: markup as [`ModelTokenizer::encode_text`], contents as
    /// [`ModelTokenizer::encode_literal`].
    pub fn encode_pieces(
        &self,
        pieces: &[crate::chat::PromptPiece],
    ) -> Result<Vec<u32>, EncodeError> {
        let mut ids = Vec::new();
        for piece in pieces {
            ids.extend(match piece {
                crate::chat::PromptPiece::Markup(text) => self.encode_text(text)?,
                crate::chat::PromptPiece::Content(text) => self.encode_literal(text)?,
            });
        }
        Ok(ids)
    }

    /// Text of `ids`; special tokens are dropped when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, DecodeError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| DecodeError(e.to_string()))
    }

    /// The tokenizer in Hugging Face `tokenizer.json` form.
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.inner
            .to_string(false)
            .map_err(|e| TokenizerError::Serialize(e.to_string()))
    }

    /// The id of the token spelled `token`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// An upper bound on the bytes of text one token covers.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Vocabulary size, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

impl TextEncoder for ModelTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.encode_text(text)
    }

    fn identity(&self) -> TokenizerId {
        self.identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference tokenizer file built from SmolLM2's GGUF metadata, when this
    /// checkout sits beside the shared data.
    fn reference() -> Option<ModelTokenizer> {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/data/sharegpt/tokenizer_smollm2.json");
        p.exists().then(|| ModelTokenizer::from_file(&p).unwrap())
    }

    #[test]
    fn reference_file_tokenizes_the_check_string() {
        let Some(t) = reference() else {
            eprintln!("skipped: ../shared/data/sharegpt/tokenizer_smollm2.json is absent");
            return;
        };
        assert_eq!(
            t.encode_text("Hello, world! How are you today?").unwrap(),
            vec![19556, 28, 905, 17, 1073, 359, 346, 1834, 47]
        );
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let e = ModelTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot load tokenizer"), "{e}");
    }
}
