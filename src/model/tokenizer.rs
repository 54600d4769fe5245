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
    /// The id a prompt starts with, when the model wants one (`add_bos_token`).
    bos_to_add: Option<u32>,
    /// The control tokens' ids, sorted.
    controls: Vec<u32>,
    /// The control tokens among [`crate::chat::ANSWER_MARKUP`], sorted: decoded text
    /// keeps them.
    kept_markup: Vec<u32>,
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

    /// A Hugging Face tokenizer.json's contents, already in memory.
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let inner: tokenizers::Tokenizer = json.parse().map_err(|e| TokenizerError::File {
            path: "(tokenizer JSON in memory)".into(),
            message: format!("{e}"),
        })?;
        Ok(Self::wrap(inner))
    }

    /// Build the tokenizer that the GGUF metadata describes: byte-level BPE
    /// (`tokenizer.ggml.model = "gpt2"`, with the pre-tokenizer `tokenizer.ggml.pre`
    /// names) or SentencePiece (`"llama"`: Llama 2, Mistral, Gemma).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let vocab = GgufVocab::read(content)?;
        let (mut inner, add_bos) = match vocab.model.as_str() {
            "gpt2" => (bpe_tokenizer(&vocab)?, false),
            "llama" => (sentencepiece_tokenizer(&vocab)?, true),
            other => {
                return Err(TokenizerError::Gguf(format!(
                    "tokenizer model {other:?} is not supported; suffixd reads \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece), or a directory's tokenizer.json"
                )));
            }
        };
        let specials: Vec<AddedToken> = vocab
            .tokens_of_type(CONTROL)
            .map(|tok| AddedToken::from(tok, true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| TokenizerError::Gguf(format!("special tokens: {e}")))?;
        // User-defined pieces (Gemma's runs of spaces and newlines) match the raw text
        // whole, as llama.cpp matches them.
        let user: Vec<AddedToken> = vocab
            .tokens_of_type(USER_DEFINED)
            .map(|tok| AddedToken::from(tok, false).normalized(false))
            .collect();
        inner
            .add_tokens(user)
            .map_err(|e| TokenizerError::Gguf(format!("user-defined tokens: {e}")))?;
        let add_bos = content
            .metadata
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(add_bos);
        let bos = content
            .metadata
            .get("tokenizer.ggml.bos_token_id")
            .and_then(|v| v.to_u32().ok());
        let mut t = Self::wrap(inner);
        t.bos_to_add = bos.filter(|_| add_bos);
        Ok(t)
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
        let mut controls: Vec<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        controls.sort_unstable();
        let mut kept_markup: Vec<u32> = crate::chat::ANSWER_MARKUP
            .iter()
            .filter_map(|m| inner.token_to_id(m))
            .filter(|id| controls.binary_search(id).is_ok())
            .collect();
        kept_markup.sort_unstable();
        Self {
            inner,
            literal,
            identity,
            max_token_bytes,
            bos_to_add: None,
            controls,
            kept_markup,
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

    /// Token ids of a prompt: markup as [`ModelTokenizer::encode_text`], contents as
    /// [`ModelTokenizer::encode_literal`], after the BOS token when the model wants one
    /// and the markup (a chat template's `{{ bos_token }}`) did not write it.
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
        if let Some(bos) = self.bos_to_add
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// Text of `ids`. With `skip_special` control tokens are dropped, but for those
    /// that mark an answer's calls and thoughts ([`crate::chat::ANSWER_MARKUP`]:
    /// Mistral's `[TOOL_CALLS]`, `[ARGS]`, `[THINK]`..), which the server reads the
    /// answer by, as llama.cpp keeps its "preserved tokens".
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, DecodeError> {
        let kept = |id: &u32| self.kept_markup.binary_search(id).is_ok();
        // Most tokenizers have none of these markers: no scan of the ids then.
        let keeps_some = skip_special && !self.kept_markup.is_empty() && ids.iter().any(kept);
        let decoded = if keeps_some {
            let shown: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|id| kept(id) || self.controls.binary_search(id).is_err())
                .collect();
            self.inner.decode(&shown, false)
        } else {
            self.inner.decode(ids, skip_special)
        };
        decoded.map_err(|e| DecodeError(e.to_string()))
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

    /// Whether `id` is a special (control) token.
    pub fn is_control(&self, id: u32) -> bool {
        self.controls.binary_search(&id).is_ok()
    }

    /// Whether an answer's text shows token `id`: it is not a control token, or it is
    /// one of the markup tokens decoding keeps ([`ModelTokenizer::decode`]).
    pub fn shows(&self, id: u32) -> bool {
        !self.is_control(id) || self.kept_markup.binary_search(&id).is_ok()
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

/// GGUF token type of normal pieces.
const NORMAL: i32 = 1;
/// GGUF token type of user-defined pieces.
const USER_DEFINED: i32 = 4;

/// The tokenizer keys of a GGUF file's metadata.
struct GgufVocab {
    model: String,
    pre: Option<String>,
    tokens: Vec<String>,
    types: Vec<i32>,
    scores: Vec<f32>,
    merges: Vec<(String, String)>,
    unknown: Option<u32>,
    add_space_prefix: Option<bool>,
}

impl GgufVocab {
    fn read(content: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let get = |k: &str| content.metadata.get(k);
        let md = |k: &str| get(k).ok_or_else(|| TokenizerError::Gguf(format!("missing {k}")));
        let bad = |k: &str, e: candle_core::Error| TokenizerError::Gguf(format!("{k}: {e}"));
        // An optional array: empty when the key is absent.
        let list = |k: &str| -> Result<&[gguf_file::Value], TokenizerError> {
            match get(k) {
                Some(v) => Ok(v.to_vec().map_err(|e| bad(k, e))?.as_slice()),
                None => Ok(&[]),
            }
        };
        let model = md("tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| bad("tokenizer.ggml.model", e))?
            .clone();
        let tokens: Vec<String> = md("tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?;
        let types: Vec<i32> = list("tokenizer.ggml.token_type")?
            .iter()
            .map(|t| t.to_i32())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("tokenizer.ggml.token_type", e))?;
        let scores: Vec<f32> = list("tokenizer.ggml.scores")?
            .iter()
            .map(|t| t.to_f32())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("tokenizer.ggml.scores", e))?;
        let merges = list("tokenizer.ggml.merges")?
            .iter()
            .map(|v| {
                let s = v.to_string().map_err(|e| bad("tokenizer.ggml.merges", e))?;
                let (a, b) = s
                    .split_once(' ')
                    .ok_or_else(|| TokenizerError::Gguf(format!("merge {s:?} is not \"a b\"")))?;
                Ok((a.to_string(), b.to_string()))
            })
            .collect::<Result<_, TokenizerError>>()?;
        if !types.is_empty() && types.len() != tokens.len() {
            return Err(TokenizerError::Gguf(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        Ok(GgufVocab {
            model,
            pre: get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok().cloned()),
            tokens,
            types,
            scores,
            merges,
            unknown: get("tokenizer.ggml.unknown_token_id").and_then(|v| v.to_u32().ok()),
            add_space_prefix: get("tokenizer.ggml.add_space_prefix").and_then(|v| v.to_bool().ok()),
        })
    }

    fn type_of(&self, id: usize) -> i32 {
        self.types.get(id).copied().unwrap_or(NORMAL)
    }

    fn tokens_of_type(&self, kind: i32) -> impl Iterator<Item = String> + '_ {
        self.tokens
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.type_of(*i) == kind)
            .map(|(_, t)| t.clone())
    }

    fn vocab(&self) -> tokenizers::models::bpe::Vocab {
        self.tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect()
    }
}

/// llama.cpp's pre-tokenizer regexes for the byte-level BPE families, by
/// `tokenizer.ggml.pre`.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Byte-level BPE over `tokenizer.ggml.tokens` / `.merges`, pre-tokenized as
/// `tokenizer.ggml.pre` says, decoded byte-level.
fn bpe_tokenizer(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if v.merges.is_empty() {
        return Err(TokenizerError::Gguf("missing tokenizer.ggml.merges".into()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(v.vocab(), v.merges.clone())
        .build()
        .map_err(|e| TokenizerError::Gguf(format!("BPE: {e}")))?;
    let split = |regex: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = tokenizers::pre_tokenizers::split::Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(regex.into()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Gguf(format!("pre-tokenizer: {e}")))?;
        Ok(PreTokenizerWrapper::Split(split))
    };
    let byte_level =
        |regex: bool| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, regex));
    let pre = match v.pre.as_deref() {
        // SmolLM's (and files without the key): single digits, then GPT-2's regex.
        None | Some("smollm") => vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level(true),
        ],
        Some("gpt-2" | "gpt2") => vec![byte_level(true)],
        Some("llama-bpe" | "llama3") => vec![split(LLAMA3_SPLIT)?, byte_level(false)],
        Some("qwen2") => vec![split(QWEN2_SPLIT)?, byte_level(false)],
        Some(other) => {
            return Err(TokenizerError::Gguf(format!(
                "BPE pre-tokenizer {other:?} is not supported; suffixd knows smollm, gpt-2, llama-bpe and qwen2"
            )));
        }
    };
    let mut t = tokenizers::Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(pre))));
    t.with_decoder(Some(tokenizers::DecoderWrapper::ByteLevel(
        ByteLevel::default(),
    )));
    Ok(t)
}

/// SentencePiece's BPE as llama.cpp runs it: spaces become `▁` (with one in front when
/// `add_space_prefix`), adjacent pieces merge into the vocabulary piece of highest score
/// first, and characters no piece covers become byte tokens (`<0x0A>`). The merges are
/// derived from the scores: every split of a normal piece into two pieces, ranked by the
/// whole piece's score (what Hugging Face's converter does).
fn sentencepiece_tokenizer(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    use tokenizers::decoders::{
        byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as Decoders, strip::Strip,
    };
    use tokenizers::normalizers::{Prepend, Replace};
    if v.scores.len() != v.tokens.len() {
        return Err(TokenizerError::Gguf(format!(
            "{} scores for {} tokens",
            v.scores.len(),
            v.tokens.len()
        )));
    }
    let ids: rustc_hash::FxHashMap<&str, usize> = v
        .tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| v.type_of(*i) == NORMAL)
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (&piece, &id) in &ids {
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                ranked.push((v.scores[id], id, l, r));
            }
        }
    }
    // Highest score first; among splits of one piece, the lower left id, as llama.cpp's
    // queue takes the leftmost of equal candidates.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<(String, String)> = ranked
        .iter()
        .map(|&(_, _, l, r)| (v.tokens[l].clone(), v.tokens[r].clone()))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(v.vocab(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.unknown.and_then(|i| v.tokens.get(i as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| TokenizerError::Gguf(format!("SentencePiece: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let space_prefix = v.add_space_prefix.unwrap_or(true);
    let replace =
        Replace::new(" ", "▁").map_err(|e| TokenizerError::Gguf(format!("normalizer: {e}")))?;
    let normalizer: tokenizers::NormalizerWrapper = if space_prefix {
        tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("▁".into()).into(),
            replace.into(),
        ])
        .into()
    } else {
        replace.into()
    };
    t.with_normalizer(Some(normalizer))
        .map_err(|e| TokenizerError::Gguf(format!("normalizer: {e}")))?;
    let mut decoders: Vec<tokenizers::DecoderWrapper> = vec![
        Replace::new("▁", " ")
            .map_err(|e| TokenizerError::Gguf(format!("decoder: {e}")))?
            .into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    t.with_decoder(Some(Decoders::new(decoders)));
    Ok(t)
}

impl TextEncoder for ModelTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.encode_text(text)
    }

    fn identity(&self) -> TokenizerId {
        self.identity
    }
}

/// Tokenizers for tests that need no model files.
#[cfg(test)]
pub(crate) mod testing {
    use super::ModelTokenizer;
    use serde_json::{Value, json};

    /// GPT-2's byte-to-character table (the byte-level BPE alphabet).
    pub(crate) fn byte_level_char(b: u8) -> char {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        if printable(b) {
            return char::from(b);
        }
        let shifted = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + shifted).expect("in the alphabet")
    }

    /// A byte-level BPE without merges (every byte its own token, ids 0..256) and one
    /// control token, `<|end|>` (256): characters beyond ASCII split across tokens.
    pub(crate) fn byte_tokenizer() -> ModelTokenizer {
        let vocab: serde_json::Map<String, Value> = (0..=255u8)
            .map(|b| (byte_level_char(b).to_string(), json!(b)))
            .collect();
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": false});
        let tokenizer = json!({
            "version": "1.0",
            "added_tokens": [{"id": 256, "content": "<|end|>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": byte_level,
            "post_processor": null,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []},
        });
        ModelTokenizer::from_json(&tokenizer.to_string()).expect("a valid tokenizer")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2's tokenizer: from the default model's GGUF (which `tools/setup.sh`
    /// installs), and from the reference tokenizer.json built from it when this checkout
    /// sits beside the shared data.
    fn smollm2_tokenizers() -> Vec<ModelTokenizer> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let model = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let mut file = std::fs::File::open(&model)
            .unwrap_or_else(|e| panic!("{}: {e}; run tools/setup.sh", model.display()));
        let content = gguf_file::Content::read(&mut file).unwrap();
        let mut found = vec![ModelTokenizer::from_gguf(&content).unwrap()];
        let reference = root.join("../shared/data/sharegpt/tokenizer_smollm2.json");
        if reference.exists() {
            found.push(ModelTokenizer::from_file(&reference).unwrap());
        }
        found
    }

    #[test]
    fn smollm2_s_tokenizer_tokenizes_the_check_string() {
        for t in smollm2_tokenizers() {
            assert_eq!(
                t.encode_text("Hello, world! How are you today?").unwrap(),
                vec![19556, 28, 905, 17, 1073, 359, 346, 1834, 47]
            );
        }
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let e = ModelTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot load tokenizer"), "{e}");
    }
}
