//! One chat turn as the chat template, the prompt encoder and the tool rendering
//! see it (OpenAI's / Hugging Face's message shape).

/// One chat turn, as in the OpenAI / Hugging Face message format. Absent optional
/// fields are undefined in the template.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's calls: `[{id, type, function: {name, arguments}}]`,
    /// `arguments` an object where the call's JSON text parses as one (as vLLM and
    /// llama.cpp pass them to templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool message's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning, as the client sent it back (Qwen3's template
    /// reads it; gpt-oss's reads it as `thinking`, which `ChatTemplate` sets from it
    /// as llama.cpp does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}
