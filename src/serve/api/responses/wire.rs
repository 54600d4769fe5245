//! `/v1/responses`' bodies as types: the response object, its output items and the
//! stream's events (what `openapi.json` describes), as OpenAI's Responses API has them.

use serde::Serialize;
use serde_json::Value;

use super::super::wire::{ChatTokenLogprob, SpecStats};

/// A response: what was asked (echoed, as OpenAI does) and what came out.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress` while streaming, then `completed`, `incomplete` (cut by
    /// `max_output_tokens`) or `failed`.
    pub status: &'static str,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub service_tier: &'static str,
    /// Whether the response is kept (for `previous_response_id` and `GET`).
    pub store: bool,
    pub temperature: f32,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_logprobs: u64,
    pub top_p: f32,
    pub truncation: &'static str,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Value,
    /// suffixd's own figures: how speculation went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffixd: Option<SpecStats>,
}

/// Why a response failed.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ResponseError {
    pub code: &'static str,
    pub message: String,
}

/// Why a response is incomplete.
#[derive(Debug, Clone, Serialize)]
pub(super) struct IncompleteDetails {
    pub reason: &'static str,
}

/// Token counts, the Responses API's way.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

/// The input tokens served from the prefix cache.
#[derive(Debug, Clone, Serialize)]
pub(super) struct InputTokensDetails {
    pub cached_tokens: usize,
}

/// The output tokens that were thoughts.
#[derive(Debug, Clone, Serialize)]
pub(super) struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

/// One item of a response's output.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum OutputItem {
    /// A thinking model's thoughts, as open models' reasoning text (no summary).
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
    /// The answer's text.
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    /// A call of a function tool.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

impl OutputItem {
    /// Mark the item `completed`, `incomplete` (cut off) or `in_progress`.
    pub(super) fn set_status(&mut self, new: &'static str) {
        match self {
            OutputItem::Reasoning { status, .. }
            | OutputItem::Message { status, .. }
            | OutputItem::FunctionCall { status, .. } => *status = new,
        }
    }

    /// The item's id.
    pub(super) fn id(&self) -> &str {
        match self {
            OutputItem::Reasoning { id, .. }
            | OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. } => id,
        }
    }
}

/// A reasoning item's text.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

/// A message's text, with its tokens' log-probabilities when `include` asks for them.
#[derive(Debug, Clone, Serialize)]
pub(super) struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<ChatTokenLogprob>,
}

impl OutputText {
    pub(super) fn new(text: String, logprobs: Vec<ChatTokenLogprob>) -> Self {
        OutputText {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs,
        }
    }
}

/// A streamed event, numbered in the order sent (`sequence_number`).
#[derive(Debug, Serialize)]
pub(super) struct Numbered<'a> {
    #[serde(flatten)]
    pub event: StreamEvent<'a>,
    pub sequence_number: u64,
}

/// The events of a streamed response, OpenAI's names and fields.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub(super) enum StreamEvent<'a> {
    #[serde(rename = "response.created")]
    Created { response: &'a ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: &'a ResponseObject },
    #[serde(rename = "response.completed")]
    Completed { response: &'a ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: &'a ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: &'a ResponseObject },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: &'a OutputText,
    },
    #[serde(rename = "response.content_part.done")]
    PartDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: &'a OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
        logprobs: &'a [ChatTokenLogprob],
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
        logprobs: &'a [ChatTokenLogprob],
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: &'a str,
        output_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: &'a str,
        output_index: usize,
        name: &'a str,
        arguments: &'a str,
    },
}

impl StreamEvent<'_> {
    /// The event's name, for the SSE `event:` line.
    pub(super) fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
            StreamEvent::Failed { .. } => "response.failed",
            StreamEvent::ItemAdded { .. } => "response.output_item.added",
            StreamEvent::ItemDone { .. } => "response.output_item.done",
            StreamEvent::PartAdded { .. } => "response.content_part.added",
            StreamEvent::PartDone { .. } => "response.content_part.done",
            StreamEvent::TextDelta { .. } => "response.output_text.delta",
            StreamEvent::TextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningDelta { .. } => "response.reasoning_text.delta",
            StreamEvent::ReasoningDone { .. } => "response.reasoning_text.done",
            StreamEvent::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            StreamEvent::ArgumentsDone { .. } => "response.function_call_arguments.done",
        }
    }
}
