//! A thinking model's thoughts apart from its answer.
//!
//! Qwen 3, QwQ, DeepSeek-R1's distillations and SmolLM3 write `<think>…</think>` before
//! they answer; Magistral writes `[THINK]…[/THINK]`. Some templates open the thoughts
//! in the prompt itself (DeepSeek-R1's and QwQ's end it with `<think>\n`), so that the
//! answer starts inside them. OpenAI-compatible servers (vLLM's reasoning parsers,
//! llama.cpp's `--reasoning-format`) send the thoughts as `reasoning_content` and the
//! rest as `content`; this module finds where one ends and the other starts, for a
//! whole answer ([`ThoughtMarkers::split`]) and for one still being decoded
//! ([`ThoughtStream`]), the two always agreeing.

/// The markers around a model's thoughts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThoughtMarkers {
    /// What opens them.
    pub open: &'static str,
    /// What closes them.
    pub close: &'static str,
}

/// A whole answer's thoughts and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThoughtSplit<'a> {
    /// The thoughts, without their markers and the whitespace around them; None when
    /// the answer has none (or only whitespace between the markers).
    pub thoughts: Option<&'a str>,
    /// What follows them, without leading whitespace; the whole answer when it has no
    /// thoughts, and empty when it was cut off while thinking.
    pub answer: &'a str,
}

impl ThoughtMarkers {
    /// `<think>` … `</think>`.
    pub const THINK: Self = Self {
        open: "<think>",
        close: "</think>",
    };
    /// Mistral's `[THINK]` … `[/THINK]` (Magistral).
    pub const MISTRAL: Self = Self {
        open: "[THINK]",
        close: "[/THINK]",
    };

    /// Every pair the server knows (each in [`crate::chat::ANSWER_MARKUP`], so that an
    /// answer's text shows them even where they are control tokens).
    pub const ALL: [Self; 2] = [Self::THINK, Self::MISTRAL];

    /// The markers a template's source teaches; None when it names no pair.
    pub fn of_template(source: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|m| source.contains(m.open) && source.contains(m.close))
    }

    /// True when a prompt ending with `prompt_tail` leaves the thoughts open, so that
    /// the answer starts inside them.
    pub fn opened_by(&self, prompt_tail: &str) -> bool {
        prompt_tail.trim_end().ends_with(self.open)
    }

    /// Split a whole `answer` (`opened`: its prompt opened the thoughts).
    pub fn split<'a>(&self, answer: &'a str, opened: bool) -> ThoughtSplit<'a> {
        let Some(inner) = self.thoughts_start(answer, opened) else {
            return ThoughtSplit {
                thoughts: None,
                answer,
            };
        };
        let inner = &answer[inner..];
        let (thoughts, rest) = match inner.find(self.close) {
            Some(at) => (&inner[..at], inner[at + self.close.len()..].trim_start()),
            None => (inner, ""),
        };
        let thoughts = thoughts.trim();
        ThoughtSplit {
            thoughts: (!thoughts.is_empty()).then_some(thoughts),
            answer: rest,
        }
    }

    /// Where the thoughts' text starts in `answer` (past the opening marker); None when
    /// the answer does not start with thoughts.
    fn thoughts_start(&self, answer: &str, opened: bool) -> Option<usize> {
        if opened {
            return Some(0);
        }
        let lead = answer.len() - answer.trim_start().len();
        answer[lead..]
            .starts_with(self.open)
            .then_some(lead + self.open.len())
    }
}

/// Where a streamed answer stands: what of its thoughts went out, and where its answer
/// starts once that is known. The thoughts sent are always the start of what
/// [`ThoughtMarkers::split`] finds in the whole answer, and the answer starts where it
/// finds it.
#[derive(Clone, Debug)]
pub struct ThoughtStream {
    markers: ThoughtMarkers,
    opened: bool,
    /// Bytes of the thoughts sent.
    sent: usize,
}

/// What a streamed answer's text so far gives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThoughtProgress<'a> {
    /// Thoughts not sent before.
    pub thoughts: Option<&'a str>,
    /// Where the answer past the thoughts starts, once known: no more thoughts follow.
    pub answer_start: Option<usize>,
}

impl ThoughtStream {
    /// A stream of an answer whose prompt opened the thoughts (`opened`) or not.
    pub fn new(markers: ThoughtMarkers, opened: bool) -> Self {
        Self {
            markers,
            opened,
            sent: 0,
        }
    }

    /// Read `text`, the answer so far (each call's text extends the last's): the new
    /// thoughts, and where the answer starts once that is sure. Text that may still be
    /// an opening or closing marker, and whitespace that may end the thoughts, wait.
    pub fn advance<'a>(&mut self, text: &'a str) -> ThoughtProgress<'a> {
        let m = self.markers;
        let inner = if self.opened {
            0
        } else {
            let lead = text.len() - text.trim_start().len();
            let after_lead = &text[lead..];
            if after_lead.starts_with(m.open) {
                lead + m.open.len()
            } else if m.open.starts_with(after_lead) {
                // Still possibly the opening marker.
                return ThoughtProgress::default();
            } else {
                return ThoughtProgress {
                    thoughts: None,
                    answer_start: Some(0),
                };
            }
        };
        let body = &text[inner..];
        let start = inner + (body.len() - body.trim_start().len());
        let (end, answer_start) = match body.find(m.close) {
            Some(at) => {
                let after = inner + at + m.close.len();
                let rest = &text[after..];
                let gap = rest.len() - rest.trim_start().len();
                // The answer starts at its first visible character.
                let answer = (gap < rest.len()).then_some(after + gap);
                (inner + body[..at].trim_end().len(), answer)
            }
            None => {
                let held = longest_marker_start(body, m.close);
                (inner + body[..body.len() - held].trim_end().len(), None)
            }
        };
        let from = start + self.sent;
        let thoughts = (end > from).then(|| &text[from..end]);
        if let Some(t) = thoughts {
            self.sent += t.len();
        }
        ThoughtProgress {
            thoughts,
            answer_start,
        }
    }

    /// The whole answer's split ([`ThoughtMarkers::split`]), once it is decoded.
    pub fn split<'a>(&self, text: &'a str) -> ThoughtSplit<'a> {
        self.markers.split(text, self.opened)
    }

    /// Bytes of the thoughts sent so far.
    pub fn sent(&self) -> usize {
        self.sent
    }
}

/// The length of the longest end of `text` that is a proper start of `marker`: text
/// that may still become the marker.
fn longest_marker_start(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const M: ThoughtMarkers = ThoughtMarkers::THINK;

    #[test]
    fn markers_come_from_the_template() {
        let qwen3 = include_str!("../../tests/fixtures/qwen3.jinja");
        let r1 = include_str!("../../tests/fixtures/deepseek-r1-distill-qwen.jinja");
        assert_eq!(ThoughtMarkers::of_template(qwen3), Some(M));
        assert_eq!(ThoughtMarkers::of_template(r1), Some(M));
        let llama = include_str!("../../tests/fixtures/llama3-tools.jinja");
        assert_eq!(ThoughtMarkers::of_template(llama), None);
        assert_eq!(
            ThoughtMarkers::of_template("{{ '[THINK]' }}{{ '[/THINK]' }}"),
            Some(ThoughtMarkers::MISTRAL)
        );
        assert!(M.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!M.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!M.opened_by("<|im_start|>assistant\n"));
    }

    #[test]
    fn whole_answers_split_as_the_servers_split_them() {
        let split = |text, opened| {
            let s = M.split(text, opened);
            (s.thoughts, s.answer)
        };
        assert_eq!(
            split("<think>\nplan\n</think>\n\nHello", false),
            (Some("plan"), "Hello")
        );
        assert_eq!(split("  <think>a</think>b", false), (Some("a"), "b"));
        assert_eq!(split("plan</think>\n\nHi", true), (Some("plan"), "Hi"));
        // Cut off while thinking: all of it is thoughts.
        assert_eq!(
            split("<think>\nstill going", false),
            (Some("still going"), "")
        );
        assert_eq!(split("still going", true), (Some("still going"), ""));
        // No thoughts.
        assert_eq!(split(" Hello <think>", false), (None, " Hello <think>"));
        assert_eq!(split("<think>\n\n</think>\n\nHi", false), (None, "Hi"));
        assert_eq!(split("<thi", false), (None, "<thi"));
    }

    #[test]
    fn a_stream_holds_what_may_be_a_marker() {
        let mut s = ThoughtStream::new(M, false);
        assert_eq!(s.advance("<th"), ThoughtProgress::default());
        assert_eq!(s.advance("<think>\n"), ThoughtProgress::default());
        let p = s.advance("<think>\nplan </");
        assert_eq!((p.thoughts, p.answer_start), (Some("plan"), None));
        let p = s.advance("<think>\nplan </think>\n");
        assert_eq!((p.thoughts, p.answer_start), (None, None));
        let text = "<think>\nplan </think>\nHi";
        let p = s.advance(text);
        assert_eq!((p.thoughts, p.answer_start), (None, Some(text.len() - 2)));
        let mut plain = ThoughtStream::new(M, false);
        assert_eq!(plain.advance(" H").answer_start, Some(0));
    }

    /// Text made of markers, whitespace and words, so that splits land everywhere.
    fn answer_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("<think>".to_string()),
            Just("</think>".to_string()),
            Just("</thi".to_string()),
            Just("\n".to_string()),
            Just(" ".to_string()),
            "[a-zé<>/]{1,4}",
        ];
        prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
    }

    proptest! {
        /// However the text arrives, the thoughts streamed are the whole answer's, and
        /// the answer starts where the whole answer's does.
        #[test]
        fn streamed_and_whole_splits_agree(
            text in answer_text(),
            cuts in prop::collection::vec(0usize..64, 0..8),
            opened in any::<bool>(),
        ) {
            let mut ends: Vec<usize> = cuts
                .into_iter()
                .map(|c| c.min(text.len()))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            ends.push(text.len());
            ends.sort_unstable();
            let mut stream = ThoughtStream::new(M, opened);
            let mut streamed = String::new();
            let mut start = None;
            for end in ends {
                let p = stream.advance(&text[..end]);
                streamed.push_str(p.thoughts.unwrap_or(""));
                if let Some(at) = p.answer_start {
                    prop_assert!(start.is_none_or(|s| s == at));
                    start = Some(at);
                }
            }
            let whole = M.split(&text, opened);
            let thoughts = whole.thoughts.unwrap_or("");
            prop_assert!(thoughts.starts_with(&streamed), "{streamed:?} vs {thoughts:?}");
            prop_assert_eq!(stream.sent(), streamed.len());
            if let Some(at) = start {
                prop_assert_eq!(&text[at..], whole.answer);
                prop_assert_eq!(streamed.as_str(), thoughts);
            }
        }
    }
}
