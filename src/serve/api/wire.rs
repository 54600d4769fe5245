//! The API's answers as types: every body the OpenAI-compatible endpoints send (what
//! `openapi.json` describes), built from these structs and nowhere by hand, so that a
//! field cannot be misspelt in one handler and right in another.

use serde::Serialize;

use crate::engine::DraftSources;

/// `chat.completion` or `text_completion`: a finished answer with all its choices.
#[derive(Debug, Serialize)]
pub(super) struct Completion<C> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    pub usage: Usage,
    /// suffixd's own figures: how speculation went.
    pub suffixd: SpecStats,
}

/// A streamed chunk (`chat.completion.chunk`, or `text_completion` for completions).
/// The last carries `usage` and suffixd's figures.
#[derive(Debug, Serialize)]
pub(super) struct Chunk<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffixd: Option<SpecStats>,
}

/// A chat completion's choice.
#[derive(Debug, Serialize)]
pub(super) struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: &'static str,
}

/// The assistant's answer: its content (null when it only called tools) and calls.
#[derive(Debug, Serialize)]
pub(super) struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    /// A thinking model's thoughts, apart from its answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A completion's choice, whole or as a streamed piece (then `finish_reason` is null
/// until the last).
#[derive(Debug, Serialize)]
pub(super) struct TextChoice {
    pub index: usize,
    pub text: String,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<Logprobs>,
}

/// A streamed chunk's choice: a chat message's delta, or a completion's text.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum ChunkChoice {
    Chat(ChatChunkChoice),
    Text(TextChoice),
}

/// A chat chunk's choice: what its message gained.
#[derive(Debug, Serialize)]
pub(super) struct ChatChunkChoice {
    pub index: usize,
    pub delta: MessageDelta,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<&'static str>,
}

/// What a chat chunk adds to the message: the role first, then content or call
/// fragments; empty in the chunk with the finish reason.
#[derive(Debug, Default, Serialize)]
pub(super) struct MessageDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// More of a thinking model's thoughts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A call the answer made; `index` only in a stream.
#[derive(Debug, Serialize)]
pub(super) struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

/// A function's name and its arguments as JSON text.
#[derive(Debug, Serialize)]
pub(super) struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A piece of a streamed call: its id, type and name first (with empty arguments), then
/// fragments of its arguments.
#[derive(Debug, Serialize)]
pub(super) struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

impl ToolCallDelta {
    /// A call that goes out whole in one piece, at `index`.
    pub(super) fn whole(index: usize, call: ToolCallOut) -> Self {
        ToolCallDelta {
            index,
            id: Some(call.id),
            kind: Some(call.kind),
            function: FunctionDelta {
                name: Some(call.function.name),
                arguments: call.function.arguments,
            },
        }
    }
}

/// The part of a function a streamed call piece carries.
#[derive(Debug, Serialize)]
pub(super) struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// Log-probabilities in the endpoint's form.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum Logprobs {
    /// Chat's: one entry per token.
    Chat { content: Vec<ChatTokenLogprob> },
    /// The legacy completion arrays; `text_offset` counts bytes from the answer's start.
    Completion {
        tokens: Vec<String>,
        token_logprobs: Vec<f32>,
        top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
        text_offset: Vec<usize>,
    },
}

/// A chat token's log-probability, with the most likely alternatives.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// Its UTF-8 bytes; null when the token is part of a character.
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// One of the most likely tokens at a position.
#[derive(Debug, Clone, Serialize)]
pub(super) struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
}

/// Token counts, OpenAI's way.
#[derive(Debug, Serialize)]
pub(super) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

/// The answer's tokens that were a thinking model's thoughts (`reasoning_content`); and
/// how the client's prediction of the answer (`prediction`) fared: its tokens the model
/// accepted as drafts, and those it verified and refused (both 0 without one).
#[derive(Debug, Serialize)]
pub(super) struct CompletionTokensDetails {
    pub reasoning_tokens: usize,
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

/// The prompt tokens served from the prefix cache.
#[derive(Debug, Serialize)]
pub(super) struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// How speculation went for a request: steps and tokens summed over its choices.
#[derive(Debug, Clone, Serialize)]
pub(super) struct SpecStats {
    pub steps: usize,
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    /// Decoding speed, the mean of the choices'.
    pub tokens_per_s: f64,
    pub draft_sources: DraftSources,
}

/// A served model.
#[derive(Debug, Serialize)]
pub(super) struct Model<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

/// `GET /v1/models`' list.
#[derive(Debug, Serialize)]
pub(super) struct ModelList<'a> {
    pub object: &'static str,
    pub data: Vec<Model<'a>>,
}

/// The error answer, OpenAI's shape (also an error event in a stream).
#[derive(Debug, Serialize)]
pub(super) struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

/// What went wrong and what kind of error it is.
#[derive(Debug, Serialize)]
pub(super) struct ErrorDetail<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'a str>,
    pub code: Option<&'static str>,
}
