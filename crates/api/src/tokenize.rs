//! vLLM's `/tokenize` and `/detokenize` shapes, and `/v1/models`.

use serde::{Deserialize, Serialize};

use crate::chat::ChatMessage;
use crate::error::ApiError;

/// `/tokenize`: either `{prompt, add_special_tokens}` (default true) or
/// `{messages, add_generation_prompt, add_special_tokens}` (defaults true, false).
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub return_token_strs: Option<bool>,
    /// `prompt` only: control-token texts are tokenized as plain text when true.
    #[serde(default)]
    pub split_special_tokens: Option<bool>,
}

impl TokenizeRequest {
    /// Checks that exactly one of `prompt` and `messages` is given.
    pub fn validate(&self) -> Result<(), ApiError> {
        match (&self.prompt, &self.messages) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "prompt",
                "give either prompt or messages, not both",
            )),
            (None, None) => Err(ApiError::invalid(
                "prompt",
                "prompt: field is required (or give messages)",
            )),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    #[serde(default)]
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// vLLM's `GET /tokenizer_info`: what a client needs to tokenize as the server
/// does through `/tokenize` and `/detokenize` (lm-eval's `tokenizer_backend=remote`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenizerInfo {
    /// The GGUF's tokenizer model (`gpt2`, `llama`, `bert`, ...).
    pub tokenizer_class: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// The EOS text (the model has no padding token of its own).
    pub pad_token: Option<String>,
    /// The chat template's Jinja source, when the model has one.
    pub chat_template: Option<String>,
    pub model_max_length: usize,
    pub vocab_size: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelCard {
    pub id: String,
    /// "model".
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    pub root: String,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    /// "list".
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json;

    #[test]
    fn tokenize_shapes() {
        let r: TokenizeRequest = parse_json(br#"{"prompt":"hi"}"#).unwrap();
        assert!(r.validate().is_ok());
        let r: TokenizeRequest = parse_json(br#"{"model":"m"}"#).unwrap();
        assert_eq!(r.validate().unwrap_err().param.as_deref(), Some("prompt"));
        let e = parse_json::<DetokenizeRequest>(br#"{"tokens":[1,"a"]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tokens[1]"));
    }
}
