//! The OpenAI requests both endpoints read: their fields, messages and roles, checked
//! as they are read (unknown fields refused).

use serde::Deserialize;

use super::ApiError;
use super::tools;
use crate::chat::ChatMessage;
use crate::engine::{
    ADDITIVE_PENALTY_RANGE, LOGIT_BIAS_RANGE, MAX_TOP_LOGPROBS, Penalties, REPETITION_PENALTY_RANGE,
};

/// The most tokens one `logit_bias` may name: a bound on what each row's adjustment
/// costs, far above what a client biases in practice.
const MAX_LOGIT_BIAS_TOKENS: usize = 1024;

/// `stop` may be a string or a list of strings.
#[derive(Deserialize, Debug, Default)]
#[serde(untagged)]
pub(super) enum Stop {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

/// Who speaks in a chat message. Anything else is refused: a role the template does
/// not know would be rendered as text the model was never trained on.
#[derive(Deserialize, Debug, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub(super) enum Role {
    System,
    /// OpenAI's newer name for `system`.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub(super) fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A message's content: a string, or a list of parts as the OpenAI SDKs and LangChain
/// send. Only text parts can be served by a text model.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl Content {
    /// The text: the string, or the text parts joined; other parts are refused.
    pub(super) fn text(&self) -> Result<String, ApiError> {
        let parts = match self {
            Content::Text(t) => return Ok(t.clone()),
            Content::Parts(parts) => parts,
        };
        let mut text = String::new();
        for p in parts {
            match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => text.push_str(t),
                ("text", None) => {
                    return Err(ApiError::bad_request("a text content part needs `text`"));
                }
                (other, _) => {
                    return Err(ApiError::bad_request(format!(
                        "content parts of type {other:?} are not supported: this model reads text parts only"
                    )));
                }
            }
        }
        Ok(text)
    }
}

/// OpenAI's Predicted Outputs: `{"type": "content", "content": text or text parts}`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Prediction {
    #[serde(rename = "type")]
    kind: String,
    content: Content,
}

#[derive(Deserialize, Debug)]
pub(super) struct ContentPart {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) text: Option<String>,
}

/// One chat message of a request. `name` and other fields clients send along are
/// accepted and not used.
#[derive(Deserialize, Debug)]
pub(super) struct RequestMessage {
    pub(super) role: Role,
    /// `null` for an assistant message that only calls tools.
    pub(super) content: Option<Content>,
    /// An assistant message's calls (OpenAI's form).
    #[serde(default)]
    pub(super) tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's call id.
    #[serde(default)]
    pub(super) tool_call_id: Option<String>,
    /// An assistant message's thoughts, as this server sends them.
    #[serde(default)]
    pub(super) reasoning_content: Option<String>,
}

impl RequestMessage {
    /// The message for the template; `native`: the template renders tool calls itself
    /// (else they are written into the content, see [`tools`]).
    pub(super) fn to_template(&self, native_tools: bool) -> Result<ChatMessage, ApiError> {
        let message = self.to_text_message()?;
        match (&self.tool_calls, self.role) {
            (Some(calls), Role::Assistant) if !calls.is_empty() => {
                tools::assistant_with_calls(message, calls, native_tools)
            }
            (Some(calls), _) if !calls.is_empty() => Err(ApiError::bad_request(
                "only assistant messages carry `tool_calls`",
            )),
            _ => Ok(message),
        }
    }

    pub(super) fn to_text_message(&self) -> Result<ChatMessage, ApiError> {
        let content = match &self.content {
            None => String::new(),
            Some(content) => content.text()?,
        };
        Ok(ChatMessage {
            role: self.role.template_name().into(),
            content,
            tool_call_id: self.tool_call_id.clone(),
            reasoning_content: self.reasoning_content.clone(),
            ..Default::default()
        })
    }
}

/// What a request's `logprobs` and `top_logprobs` ask for: None, or how many
/// alternatives to list beside each token. Chat: `logprobs: true` turns them on and
/// `top_logprobs` (0 to 20, only with it) sets the alternatives. Completions (the
/// legacy form): `logprobs: N`, 0 to 20.
pub(super) fn logprobs_wanted(
    req: &GenerationRequest,
    chat: bool,
) -> Result<Option<usize>, ApiError> {
    use serde_json::Value;
    let count = |v: &Value, name: &str| -> Result<usize, ApiError> {
        match v.as_u64() {
            Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Ok(n as usize),
            _ => Err(ApiError::bad_request(format!(
                "`{name}` must be an integer from 0 to {MAX_TOP_LOGPROBS}"
            ))),
        }
    };
    let top = match &req.top_logprobs {
        None | Some(Value::Null) => None,
        Some(v) => Some(count(v, "top_logprobs")?),
    };
    let on = match &req.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) if chat => Some(top.unwrap_or(0)),
        Some(v) if !chat => Some(count(v, "logprobs")?),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`logprobs` must be true or false in a chat completion (`top_logprobs` sets how many alternatives)",
            ));
        }
    };
    match (on, top) {
        (None, Some(_)) if chat => Err(ApiError::bad_request(
            "`top_logprobs` needs `logprobs: true`",
        )),
        (_, Some(_)) if !chat => Err(ApiError::bad_request(
            "`top_logprobs` is a chat completion field; a completion takes `logprobs: N`",
        )),
        _ => Ok(on),
    }
}

/// OpenAI's `logit_bias`: an object from token ids, written as strings, to a bias from
/// −100 to 100 (null or absent: none).
fn logit_bias(
    field: Option<&serde_json::Value>,
    vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    use serde_json::Value;
    let refused =
        |why: String| ApiError::bad_request(format!("`logit_bias` {why}")).param("logit_bias");
    let biases = match field {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(biases)) => biases,
        Some(_) => {
            return Err(refused(
                "must be an object from token ids to biases, such as {\"50256\": -100}".into(),
            ));
        }
    };
    if biases.len() > MAX_LOGIT_BIAS_TOKENS {
        return Err(refused(format!(
            "names {} tokens; at most {MAX_LOGIT_BIAS_TOKENS}",
            biases.len()
        )));
    }
    let mut parsed: Vec<(u32, f32)> = biases
        .iter()
        .map(|(token, bias)| {
            let id = token
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    refused(format!(
                        "names {token:?}, which is not a token id of this model's vocabulary (0 to {})",
                        vocab - 1
                    ))
                })?;
            match bias.as_f64() {
                Some(b)
                    if (f64::from(*LOGIT_BIAS_RANGE.start())..=f64::from(*LOGIT_BIAS_RANGE.end()))
                        .contains(&b) =>
                {
                    Ok((id, b as f32))
                }
                _ => Err(refused(format!(
                    "gives token {token} the bias {bias}; a bias is a number from {} to {}",
                    LOGIT_BIAS_RANGE.start(),
                    LOGIT_BIAS_RANGE.end()
                ))),
            }
        })
        .collect::<Result<_, _>>()?;
    // "50" and "050" are one token: which bias was meant is the client's to say.
    parsed.sort_unstable_by_key(|&(id, _)| id);
    if let Some(pair) = parsed.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(refused(format!("names token {} twice", pair[0].0)));
    }
    Ok(parsed)
}

/// A completion's `prompt`: a string, or a list of them (a choice per prompt and `n`).
/// Token-id prompts are read (and not used) so that they get a clear refusal.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum PromptField {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// The fields both endpoints share. Unknown fields are refused, so that a typo is an
/// error and not a silently ignored setting. OpenAI's fields that do not change an
/// answer here are accepted and ignored (`metadata`, `store`, `service_tier`,
/// `prompt_cache_key`, `safety_identifier`, `verbosity`, `prediction`,
/// `stream_options`); those that would change it are refused unless
/// they ask for nothing (`modalities` text only, `audio` and
/// `web_search_options` null, `echo` false, `best_of` 1, `suffix` null).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(super) struct GenerationRequest {
    pub(super) model: Option<String>,
    pub(super) prompt: Option<PromptField>,
    pub(super) messages: Option<Vec<RequestMessage>>,
    pub(super) max_tokens: Option<usize>,
    pub(super) max_completion_tokens: Option<usize>,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    pub(super) top_k: Option<usize>,
    #[serde(default)]
    pub(super) stop: Stop,
    pub(super) seed: Option<u64>,
    #[serde(default)]
    pub(super) stream: bool,
    pub(super) user: Option<String>,
    pub(super) n: Option<u32>,
    #[allow(dead_code)]
    pub(super) stream_options: Option<serde_json::Value>,
    pub(super) presence_penalty: Option<f32>,
    pub(super) frequency_penalty: Option<f32>,
    /// vLLM's, SGLang's and Hugging Face's multiplicative penalty over the prompt's and
    /// the answer's tokens (1: none).
    pub(super) repetition_penalty: Option<f32>,
    pub(super) logit_bias: Option<serde_json::Value>,
    pub(super) logprobs: Option<serde_json::Value>,
    pub(super) top_logprobs: Option<serde_json::Value>,
    pub(super) tools: Option<Vec<tools::Tool>>,
    pub(super) tool_choice: Option<serde_json::Value>,
    pub(super) parallel_tool_calls: Option<bool>,
    pub(super) response_format: Option<serde_json::Value>,
    /// More variables for the chat template (vLLM's and llama.cpp's field), such as
    /// Qwen 3's `enable_thinking`.
    pub(super) chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// OpenAI's effort of a reasoning model: given to the chat template, and `none`
    /// turns thinking off where the template can (`openai::template_variables`).
    pub(super) reasoning_effort: Option<serde_json::Value>,
    // Accepted and ignored: they do not change the answer.
    pub(super) metadata: Option<serde_json::Value>,
    pub(super) store: Option<serde_json::Value>,
    pub(super) service_tier: Option<serde_json::Value>,
    pub(super) prompt_cache_key: Option<serde_json::Value>,
    pub(super) safety_identifier: Option<serde_json::Value>,
    pub(super) verbosity: Option<serde_json::Value>,
    // Drafted from; the answer is the model's either way.
    pub(super) prediction: Option<serde_json::Value>,
    // Accepted when they ask for nothing this server would do differently.
    pub(super) modalities: Option<serde_json::Value>,
    pub(super) audio: Option<serde_json::Value>,
    pub(super) web_search_options: Option<serde_json::Value>,
    pub(super) echo: Option<serde_json::Value>,
    pub(super) best_of: Option<serde_json::Value>,
    pub(super) suffix: Option<serde_json::Value>,
}

impl GenerationRequest {
    /// The bias and penalties it asks for, checked as OpenAI checks them: presence and
    /// frequency penalties from −2 to 2, `logit_bias` an object from token ids (of a
    /// vocabulary of `vocab`) to numbers from −100 to 100; and a repetition penalty
    /// from 0.01 to 10 (vLLM takes any above 0, but dividing a logit by a tiny one
    /// overflows f32, and no sampling wants it).
    pub(super) fn penalties(&self, vocab: usize) -> Result<Penalties, ApiError> {
        let within =
            |name: &'static str, value: Option<f32>, range: std::ops::RangeInclusive<f32>| {
                match value {
                    Some(v) if !range.contains(&v) => Err(ApiError::bad_request(format!(
                        "`{name}` must be a number from {} to {}",
                        range.start(),
                        range.end()
                    ))
                    .param(name)),
                    _ => Ok(value),
                }
            };
        let presence = within(
            "presence_penalty",
            self.presence_penalty,
            ADDITIVE_PENALTY_RANGE,
        )?;
        let frequency = within(
            "frequency_penalty",
            self.frequency_penalty,
            ADDITIVE_PENALTY_RANGE,
        )?;
        let repetition = within(
            "repetition_penalty",
            self.repetition_penalty,
            REPETITION_PENALTY_RANGE,
        )?;
        Ok(Penalties {
            presence: presence.unwrap_or(0.0),
            frequency: frequency.unwrap_or(0.0),
            repetition: repetition.unwrap_or(1.0),
            bias: logit_bias(self.logit_bias.as_ref(), vocab)?,
        })
    }

    /// The text of `prediction`, OpenAI's Predicted Outputs (`{"type": "content",
    /// "content": text or a list of text parts}`): the client's guess at the answer,
    /// which speculation drafts from. None when absent or null.
    pub(super) fn prediction_text(&self) -> Result<Option<String>, ApiError> {
        let Some(prediction) = self.prediction.as_ref().filter(|p| !p.is_null()) else {
            return Ok(None);
        };
        let refused = |why: String| {
            ApiError::bad_request(format!(
                "`prediction` {why}: send {{\"type\": \"content\", \"content\": \"the expected answer\"}}"
            ))
            .param("prediction")
        };
        let prediction = Prediction::deserialize(prediction)
            .map_err(|e| refused(format!("is malformed ({e})")))?;
        if prediction.kind != "content" {
            return Err(refused(format!(
                "has `type` {:?}, not \"content\"",
                prediction.kind
            )));
        }
        let text = prediction.content.text().map_err(|e| refused(e.message))?;
        Ok(Some(text))
    }
}
