//! Request logs for warm starts, in three shapes, one JSON object a line:
//! - token ids: `{"prompt": [u32…], "response": [u32…]}` (DESIGN.md §4);
//! - text: `{"prompt": "…", "response": "…"}`;
//! - OpenAI chat records: `{"messages": [{"role": …, "content": …}, …]}`, whose
//!   assistant turns are the responses.
//!
//! Any record may carry `"namespace": "…"` to cache it for one tenant and model.

use std::path::Path;

use serde::Deserialize;

use super::{CorpusError, read_json_lines};

pub use crate::chat::ChatMessage;

/// What one log line holds.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum LogBody {
    /// Token ids.
    Tokens {
        /// Prompt ids (unused by the store).
        #[serde(default)]
        prompt: Vec<u32>,
        /// Response ids.
        response: Vec<u32>,
    },
    /// Text.
    Text {
        /// Prompt text (unused by the store).
        #[serde(default)]
        prompt: String,
        /// Response text.
        response: String,
    },
    /// A chat transcript.
    Chat {
        /// The messages, in order.
        messages: Vec<ChatMessage>,
    },
}

/// One log line.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct LogRecord {
    /// The namespace it belongs to, when the log says.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Its contents.
    #[serde(flatten)]
    pub body: LogBody,
}

impl LogRecord {
    /// The responses this record holds, as text or as ids.
    pub fn responses(&self) -> Vec<Response<'_>> {
        match &self.body {
            LogBody::Tokens { response, .. } => vec![Response::Tokens(response)],
            LogBody::Text { response, .. } => vec![Response::Text(response)],
            LogBody::Chat { messages } => messages
                .iter()
                .filter(|m| m.role == "assistant")
                .map(|m| Response::Text(&m.content))
                .collect(),
        }
    }
}

/// A response, before or after tokenization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// Token ids.
    Tokens(&'a [u32]),
    /// Text, to be tokenized with the model's tokenizer.
    Text(&'a str),
}

/// Stream the records of a log file (`.jsonl`, or zstd-compressed).
pub fn read_log(
    path: &Path,
) -> Result<impl Iterator<Item = Result<LogRecord, CorpusError>>, CorpusError> {
    read_json_lines(path, |path, line, source| CorpusError::Log {
        path,
        line,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_all_three_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log.jsonl");
        std::fs::write(
            &p,
            r#"{"prompt": [1, 2], "response": [3, 4]}
{"prompt": "hi", "response": "hello", "namespace": "acme"}
{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}, {"role": "assistant", "content": "a2"}]}
"#,
        )
        .unwrap();
        let recs: Vec<LogRecord> = read_log(&p).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs[0].responses(), vec![Response::Tokens(&[3, 4])]);
        assert_eq!(recs[1].responses(), vec![Response::Text("hello")]);
        assert_eq!(recs[1].namespace.as_deref(), Some("acme"));
        assert_eq!(
            recs[2].responses(),
            vec![Response::Text("a1"), Response::Text("a2")]
        );
    }

    #[test]
    fn a_line_of_no_known_shape_is_an_error_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log.jsonl");
        std::fs::write(&p, "{\"response\": [1]}\n{\"answer\": 3}\n").unwrap();
        let err = read_log(&p).unwrap().nth(1).unwrap().unwrap_err();
        assert!(err.to_string().contains("log.jsonl:2"), "{err}");
    }
}
