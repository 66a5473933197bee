//! `/v1/chat/completions`: the request (`messages` whose `content` is a string or a
//! list of `{type: "text", text}` parts), the response, its stream chunks and the
//! chat logprobs shape `{content: [{token, logprob, bytes, top_logprobs}]}`.

use serde::{Deserialize, Deserializer, Serialize};

use crate::common::{check_logprobs, GenParams, RequestFields, Usage};
use crate::error::ApiError;
use crate::sampling::SamplingFields;
use crate::tools::{check_message_tools, ToolCall, ToolCallDelta, ToolFields, ToolMode};

/// Roles a message may have.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// A message's `content`: a string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(MessageContent::Text(s)),
            v @ serde_json::Value::Array(_) => serde_json::from_value(v)
                .map(MessageContent::Parts)
                .map_err(|e| {
                    D::Error::custom(format!(
                        "expected a list of {{\"type\": \"text\", \"text\": ...}} parts ({e})"
                    ))
                }),
            _ => Err(D::Error::custom(
                "expected a string or a list of {\"type\": \"text\", \"text\": ...} parts",
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A tool message's answer to this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning sent back (vLLM's `reasoning` too), given to
    /// the template.
    #[serde(default, alias = "reasoning", skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub fields: RequestFields,
    #[serde(flatten)]
    pub tool_fields: ToolFields,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// vLLM's: each prompt token's logprob with this many alternatives (0-20), as
    /// the answer's `prompt_logprobs` (JSON answers; a stream leaves it out).
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    /// Append the assistant header to the rendered prompt (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Extra variables for the chat template, as vLLM and llama-server take them
    /// (e.g. `{"enable_thinking": false}` for Qwen3).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// OpenAI's `reasoning_effort` (`minimal`, `low`, `medium`, `high`): passed to the
    /// template as `reasoning_effort` (gpt-oss's reads it), as vLLM does, unless
    /// `chat_template_kwargs` sets it.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
}

/// The `reasoning_effort` values accepted.
pub const REASONING_EFFORTS: [&str; 4] = ["minimal", "low", "medium", "high"];

impl ChatCompletionRequest {
    /// The template's extra variables: `chat_template_kwargs` with `reasoning_effort`.
    pub fn template_kwargs(
        &self,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ApiError> {
        let mut kw = self.chat_template_kwargs.clone();
        if let Some(e) = &self.reasoning_effort {
            if !REASONING_EFFORTS.contains(&e.as_str()) {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!(
                        "reasoning_effort must be one of {}, got '{e}'",
                        REASONING_EFFORTS.join(", ")
                    ),
                ));
            }
            kw.get_or_insert_with(Default::default)
                .entry("reasoning_effort")
                .or_insert_with(|| serde_json::Value::String(e.clone()));
        }
        Ok(kw)
    }

    pub fn params(&self) -> Result<GenParams, ApiError> {
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), n) => Some(check_logprobs("top_logprobs", n.unwrap_or(0))?),
            (_, Some(n)) if n > 0 => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs requires logprobs to be true",
                ))
            }
            _ => None,
        };
        let f = &self.fields;
        let max_tokens = match (f.max_completion_tokens, f.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        let mut params = f.params(&self.sampling, max_tokens, logprobs)?;
        params.prompt_logprobs = self
            .prompt_logprobs
            .map(|n| check_logprobs("prompt_logprobs", n))
            .transpose()?;
        params.tools = self.tool_fields.validate()?;
        let forced = params
            .tools
            .as_ref()
            .is_some_and(|t| t.mode != ToolMode::Auto);
        let constrained = params
            .response_format
            .as_ref()
            .is_some_and(|rf| rf.get("type").and_then(|t| t.as_str()) != Some("text"));
        if forced && constrained {
            return Err(ApiError::invalid(
                "response_format",
                "response_format: cannot be combined with tool_choice 'required' or a named function (the call's arguments follow the function's parameters)",
            ));
        }
        Ok(params)
    }

    /// The messages as (role, text) pairs, text parts joined by newlines.
    pub fn text_messages(&self) -> Result<Vec<(String, String)>, ApiError> {
        text_messages(&self.messages)
    }
}

/// Checks roles and content parts; returns (role, text) pairs.
pub fn text_messages(messages: &[ChatMessage]) -> Result<Vec<(String, String)>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            let p = format!("messages[{i}].role");
            return Err(ApiError::invalid(
                &p,
                format!(
                    "{p}: unknown role '{}' (expected one of {})",
                    m.role,
                    ROLES.join(", ")
                ),
            ));
        }
        check_message_tools(
            i,
            &m.role,
            m.tool_calls.as_deref(),
            m.tool_call_id.as_deref(),
        )?;
        let text = match &m.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, part) in parts.iter().enumerate() {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => texts.push(t.as_str()),
                        ("text", None) => {
                            let p = format!("messages[{i}].content[{j}].text");
                            return Err(ApiError::invalid(&p, format!("{p}: field is required")));
                        }
                        (other, _) => {
                            let p = format!("messages[{i}].content[{j}].type");
                            return Err(ApiError::invalid(
                                &p,
                                format!(
                                    "{p}: only 'text' content parts are supported, got '{other}'"
                                ),
                            ));
                        }
                    }
                }
                texts.join("\n")
            }
        };
        out.push((m.role.clone(), text));
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseMessage {
    pub role: String,
    /// `null` when the model only called tools.
    pub content: Option<String>,
    /// A thinking model's reasoning (vLLM's and DeepSeek's name), absent for others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same text under vLLM's newer name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionResponse {
    pub id: String,
    /// "chat.completion".
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// vLLM's `prompt_logprobs` (when asked): one entry per token of the rendered
    /// prompt, `null` first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<crate::PromptLogprobsEntry>>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A piece of a thinking model's reasoning (its answer comes in `content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same piece under vLLM's newer name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// "chat.completion.chunk".
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json;

    fn req(json: &str) -> ChatCompletionRequest {
        parse_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn content_forms_and_roles() {
        let r = req(r#"{"messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null}]}"#);
        let m = r.text_messages().unwrap();
        assert_eq!(m[1], ("user".to_string(), "a\nb".to_string()));
        assert_eq!(m[2].1, "");
        let r = req(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
        );
        let e = r.text_messages().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let e = req(r#"{"messages":[{"role":"robot","content":"x"}]}"#)
            .text_messages()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = req(r#"{"messages":[]}"#).text_messages().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn chat_params() {
        let p = req(r#"{"messages":[],"max_completion_tokens":5,"max_tokens":9}"#)
            .params()
            .unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(req(r#"{"messages":[]}"#).params().unwrap().max_tokens, None);
        let p = req(r#"{"messages":[],"logprobs":true,"top_logprobs":3}"#)
            .params()
            .unwrap();
        assert_eq!(p.logprobs, Some(3));
        let e = req(r#"{"messages":[],"top_logprobs":3}"#)
            .params()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn chunk_omits_absent_fields() {
        let c = ChatCompletionChunk {
            id: "x".into(),
            object: "chat.completion.chunk".into(),
            created: 1,
            model: "m".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: ChatDelta {
                    content: Some("hi".into()),
                    ..ChatDelta::default()
                },
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        };
        let s = serde_json::to_string(&c).unwrap();
        assert!(s.contains(r#""delta":{"content":"hi"}"#), "{s}");
        assert!(
            s.contains(r#""finish_reason":null"#) && !s.contains("usage"),
            "{s}"
        );
    }
}
