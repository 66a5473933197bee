//! The `/v1/responses` response object: its output items (messages with output
//! text, function calls), usage with cached tokens, the echoed request fields and
//! why a response is incomplete.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{PromptTokensDetails, SloTimings};

/// The request fields echoed in a response object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Echo {
    #[schema(value_type = Option<String>)]
    pub instructions: Option<Value>,
    #[schema(value_type = Object)]
    pub metadata: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Value,
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    pub temperature: f64,
    pub top_p: f64,
    pub parallel_tool_calls: bool,
    #[schema(value_type = Object)]
    pub text: Value,
    pub max_output_tokens: Option<i64>,
    pub user: Option<String>,
}

/// An `output_text` content part (a message's), or a `reasoning_text` one (a
/// reasoning item's: no annotations, no logprobs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputText {
    /// "output_text" or "reasoning_text".
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Vec<Object>)]
    pub annotations: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Vec<Object>)]
    pub logprobs: Option<Vec<Value>>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        OutputText {
            kind: "output_text".into(),
            text,
            annotations: Some(Vec::new()),
            logprobs: Some(Vec::new()),
        }
    }

    pub fn reasoning(text: String) -> Self {
        OutputText {
            kind: "reasoning_text".into(),
            text,
            annotations: None,
            logprobs: None,
        }
    }
}

/// An output item: a `message` (role, content), a `reasoning` (summary, content of
/// `reasoning_text`) or a `function_call` (call_id, name, arguments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputItem {
    /// "message", "reasoning" or "function_call".
    #[serde(rename = "type")]
    pub kind: String,
    /// `msg_...`, `rs_...` or `fc_...`.
    pub id: String,
    /// "in_progress", "completed" or "incomplete".
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// A reasoning item's summary (none: sloserve does not summarise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub summary: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<OutputText>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

impl OutputItem {
    pub fn message(id: String, status: &str, content: Vec<OutputText>) -> Self {
        OutputItem {
            kind: "message".into(),
            id,
            status: status.into(),
            role: Some("assistant".into()),
            summary: None,
            content: Some(content),
            call_id: None,
            name: None,
            arguments: None,
        }
    }

    /// A reasoning item with its text (`None`: the item as first announced).
    pub fn reasoning(id: String, status: &str, text: Option<String>) -> Self {
        OutputItem {
            kind: "reasoning".into(),
            id,
            status: status.into(),
            role: None,
            summary: Some(Vec::new()),
            content: Some(text.into_iter().map(OutputText::reasoning).collect()),
            call_id: None,
            name: None,
            arguments: None,
        }
    }

    pub fn function_call(
        id: String,
        status: &str,
        call_id: String,
        name: String,
        arguments: String,
    ) -> Self {
        OutputItem {
            kind: "function_call".into(),
            id,
            status: status.into(),
            role: None,
            summary: None,
            content: None,
            call_id: Some(call_id),
            name: Some(name),
            arguments: Some(arguments),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
    pub cache_write_tokens: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// A response's usage, with sloserve's timings as chat's `usage.sloserve`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sloserve: Option<SloTimings>,
}

impl From<crate::Usage> for ResponseUsage {
    fn from(u: crate::Usage) -> Self {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u
                    .prompt_tokens_details
                    .map_or(0, |d: PromptTokensDetails| d.cached_tokens),
                cache_write_tokens: 0,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: u
                    .completion_tokens_details
                    .map_or(0, |d| d.reasoning_tokens),
            },
            total_tokens: u.total_tokens,
            sloserve: u.sloserve,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IncompleteDetails {
    /// "max_output_tokens".
    pub reason: String,
}

/// The response object (`object: "response"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// "response".
    pub object: String,
    pub created_at: u64,
    /// "in_progress", "completed" or "incomplete".
    pub status: String,
    pub incomplete_details: Option<IncompleteDetails>,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    /// Always false: nothing is stored.
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// "disabled".
    pub truncation: String,
    #[serde(flatten)]
    pub echo: Echo,
}
