//! The text of a growing answer, decoded once per token.
//!
//! Stop strings, streamed deltas and the final text all need the answer's text as it
//! grows. Decoding the whole answer again at every step costs O(n²) over an answer; a
//! [`Detokenizer`] decodes each new token within a short window of the tokens before it
//! (enough for decoders whose output depends on the left context, such as
//! SentencePiece's leading space) and appends only what is new. A token that ends inside
//! a multi-byte character adds nothing until the token that completes it arrives, so the
//! text never holds half a character or a replacement character for one.

use super::tokenizer::{DecodeError, ModelTokenizer};

/// Tokens of left context each new token is decoded with.
const WINDOW: usize = 6;

/// An answer's text, decoded incrementally (see the module docs). The answer's tokens
/// stay with the caller, who hands the whole answer so far to each call.
#[derive(Clone, Debug, Default)]
pub struct Detokenizer {
    text: String,
    /// `ends[i]`: the length of `text` once token i was decoded (tokens still waiting
    /// for the rest of a character end where the text ended before them).
    ends: Vec<usize>,
    /// The tokens whose text is complete in `text`.
    done: usize,
}

impl Detokenizer {
    /// An empty answer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Catch up with `ids`, the whole answer so far: the tokens past those seen before
    /// add their text. Special tokens (eos, chat markup) add none.
    pub fn update(&mut self, tokenizer: &ModelTokenizer, ids: &[u32]) -> Result<(), DecodeError> {
        for seen in self.ends.len() + 1..=ids.len() {
            let ids = &ids[..seen];
            let start = self.done.saturating_sub(WINDOW);
            let before = tokenizer.decode(&ids[start..self.done], true)?;
            let after = tokenizer.decode(&ids[start..], true)?;
            // A character still cut off at the end shows as U+FFFD: wait for the rest.
            if !after.ends_with('\u{fffd}') {
                match after.strip_prefix(before.as_str()) {
                    Some(new) => self.text.push_str(new),
                    // A decoder that rewrote the window's start: decode the whole answer
                    // once and keep what lies past the text so far.
                    None => {
                        let all = tokenizer.decode(ids, true)?;
                        let from = floor_char_boundary(&all, self.text.len());
                        self.text.push_str(&all[from..]);
                    }
                }
                self.done = seen;
            }
            self.ends.push(self.text.len());
        }
        Ok(())
    }

    /// The text of the tokens so far, without a character still cut off at the end.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The tokens seen so far.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The most tokens whose text ends at or before byte `at` of [`Detokenizer::text`]:
    /// where to cut the answer so that a stop string found at `at` is left out.
    pub fn tokens_before(&self, at: usize) -> usize {
        self.ends.partition_point(|&end| end <= at)
    }

    /// The length of the text of the first `n` tokens (all of them when there are fewer;
    /// a token waiting for the rest of its character adds nothing yet).
    pub fn text_len_of(&self, n: usize) -> usize {
        match n.min(self.ends.len()) {
            0 => 0,
            n => self.ends[n - 1],
        }
    }

    /// Keep the first `n` tokens and their text.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.ends.len() {
            return;
        }
        self.ends.truncate(n);
        self.text.truncate(self.ends.last().copied().unwrap_or(0));
        self.done = self.done.min(n);
    }

    /// The whole text of `ids` (the answer, seen in full): [`Detokenizer::text`], then
    /// whatever the last tokens decode to when no token will complete them (a replacement
    /// character for a character cut off by the end).
    pub fn finish(&self, tokenizer: &ModelTokenizer, ids: &[u32]) -> Result<String, DecodeError> {
        if self.done == ids.len() {
            return Ok(self.text.clone());
        }
        let start = self.done.saturating_sub(WINDOW);
        let before = tokenizer.decode(&ids[start..self.done], true)?;
        let after = tokenizer.decode(&ids[start..], true)?;
        Ok(match after.strip_prefix(before.as_str()) {
            Some(rest) => format!("{}{rest}", self.text),
            None => tokenizer.decode(ids, true)?,
        })
    }
}

/// The largest char boundary of `s` at or below `at` (`str::floor_char_boundary`, which
/// Rust 1.89 lacks).
pub(crate) fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tokenizer::testing::byte_level_char;

    fn tokenizer() -> Option<ModelTokenizer> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let mut file = std::fs::File::open(path).ok()?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).ok()?;
        ModelTokenizer::from_gguf(&content).ok()
    }

    /// Token by token, in steps of any size, the text is the whole answer's decode at
    /// every step where no character is cut off, and `finish` is always the whole decode.
    #[test]
    fn incremental_text_is_the_whole_decode() {
        let Some(tok) = tokenizer() else { return };
        let texts = [
            "Hello, world! The café serves crème brûlée: 12 × 3 = 36.",
            "日本語のテキストと emoji 🦀🚀 mixed with ASCII {\"key\": \"välue\"}",
            "  leading spaces\n\ttabs\r\nand a final multi-byte char é",
        ];
        for text in texts {
            let ids = tok.encode_literal(text).unwrap();
            // Also every id split into single bytes' worth: cut characters mid-way by
            // feeding a byte-level tokenizer's byte tokens where they exist.
            for step in [1, 2, 3, 7] {
                let mut d = Detokenizer::new();
                for seen in (step..ids.len() + step).step_by(step) {
                    let seen = seen.min(ids.len());
                    d.update(&tok, &ids[..seen]).unwrap();
                    assert_eq!(d.len(), seen);
                    let whole = tok.decode(&ids[..seen], true).unwrap();
                    if !whole.ends_with('\u{fffd}') {
                        assert_eq!(d.text(), whole, "step {step}");
                    } else {
                        assert!(whole.starts_with(d.text()));
                    }
                    assert_eq!(d.finish(&tok, &ids[..seen]).unwrap(), whole);
                }
                assert_eq!(d.text(), text);
            }
        }
    }

    /// A character split over two tokens adds no text until its second token, and a
    /// cut answer's `finish` shows the cut character as the whole decode does.
    #[test]
    fn a_split_character_waits_for_its_last_byte() {
        let Some(tok) = tokenizer() else { return };
        // Byte-level BPE has a token per byte: "é" is 0xC3 0xA9.
        let byte_token = |b: u8| {
            let ch = byte_level_char(b);
            tok.token_id(&ch.to_string()).unwrap()
        };
        let ids = [
            tok.encode_literal("caf").unwrap(),
            vec![byte_token(0xC3), byte_token(0xA9)],
        ]
        .concat();
        let mut d = Detokenizer::new();
        let cut = &ids[..ids.len() - 1];
        d.update(&tok, cut).unwrap();
        assert_eq!(d.text(), "caf");
        assert_eq!(d.finish(&tok, cut).unwrap(), tok.decode(cut, true).unwrap());
        d.update(&tok, &ids).unwrap();
        assert_eq!(d.text(), "café");
        // The cut token ends where the text ended before it.
        assert_eq!(d.tokens_before(3), ids.len() - 1);
        assert_eq!(d.text_len_of(ids.len() - 1), 3);
        assert_eq!(d.text_len_of(ids.len()), "café".len());
        assert_eq!(d.text_len_of(ids.len() + 5), "café".len());
        assert_eq!(d.text_len_of(0), 0);
    }

    /// `tokens_before` and `truncate` cut where a stop string starts, as the engine does.
    #[test]
    fn cutting_at_a_stop_string_keeps_the_tokens_before_it() {
        let Some(tok) = tokenizer() else { return };
        let ids = tok
            .encode_literal("The answer is 42. STOP and more text")
            .unwrap();
        let mut d = Detokenizer::new();
        d.update(&tok, &ids).unwrap();
        let at = d.text().find("STOP").unwrap();
        let n = d.tokens_before(at);
        let kept = tok.decode(&ids[..n], true).unwrap();
        assert!(kept.len() <= at && !kept.contains("STOP"), "{kept:?}");
        assert!(tok.decode(&ids[..n + 1], true).unwrap().len() > at);
        d.truncate(n);
        assert_eq!(d.text(), kept);
        assert_eq!(d.len(), n);
        // And it goes on from there.
        d.update(&tok, &ids).unwrap();
        assert_eq!(d.text(), "The answer is 42. STOP and more text");
    }
}
