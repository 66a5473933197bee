//! `/v1/completions`: the request (prompt as text or token ids), the response, its
//! stream chunks, and the legacy logprobs shape
//! `{tokens, token_logprobs, top_logprobs, text_offset}`.

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::common::{check_logprobs, GenParams, RequestFields, Usage};
use crate::error::ApiError;
pub use crate::prompt_logprobs::{PromptLogprobsEntry, PromptTokenLogprob};
use crate::sampling::SamplingFields;

/// `prompt`: a string or a list of token ids (a list holding one string or one
/// list of ids is accepted too; several prompts per request are not).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// A list of several prompts (refused by validation).
    Batch(usize),
}

const PROMPT_TYPES: &str = "expected a string or an array of token ids";

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        use serde_json::Value;
        fn ids<E: Error>(items: &[Value]) -> Result<Vec<u32>, E> {
            items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .filter(|&x| x <= u32::MAX as u64)
                        .map(|x| x as u32)
                        .ok_or_else(|| E::custom("token ids must be non-negative integers"))
                })
                .collect()
        }
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Prompt::Text(s)),
            Value::Array(items) => match items.first() {
                None => Ok(Prompt::Tokens(Vec::new())),
                Some(Value::Number(_)) => ids(&items).map(Prompt::Tokens),
                Some(_) if items.len() > 1 => Ok(Prompt::Batch(items.len())),
                Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
                Some(Value::Array(inner)) => ids(inner).map(Prompt::Tokens),
                Some(_) => Err(D::Error::custom(PROMPT_TYPES)),
            },
            _ => Err(D::Error::custom(PROMPT_TYPES)),
        }
    }
}

/// The wire shape of `prompt`: a string or a list of token ids.
impl utoipa::PartialSchema for Prompt {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(
                ArrayBuilder::new()
                    .items(
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(0)),
                    )
                    .min_items(Some(1)),
            )
            .description(Some("A string, or a list of token ids."))
            .into()
    }
}
impl utoipa::ToSchema for Prompt {}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub fields: RequestFields,
    /// Number of alternatives per token (0-20); `null`: no logprobs.
    #[serde(default)]
    pub logprobs: Option<i64>,
    /// The prompt's text before the completion; with `logprobs`, the prompt
    /// tokens' logprobs before the completion's (the first token's `null`).
    #[serde(default)]
    pub echo: Option<bool>,
    /// vLLM's: each prompt token's logprob with this many alternatives (0-20), as
    /// `choices[].prompt_logprobs` (`null` first).
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    #[serde(default)]
    pub suffix: Option<String>,
    /// Control-token texts in a text prompt (`<|im_start|>`) are tokenized as plain
    /// text when true; by default they become their ids, as in vLLM and llama-server
    /// (the name is Hugging Face tokenizers' `split_special_tokens`).
    #[serde(default)]
    pub split_special_tokens: Option<bool>,
}

/// OpenAI's default `max_tokens` for legacy completions.
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

impl CompletionRequest {
    /// Validated generation parameters (the prompt is checked by the server, which
    /// knows the tokenizer and context length).
    pub fn params(&self) -> Result<GenParams, ApiError> {
        if let Prompt::Batch(n) = self.prompt {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt: one prompt per request is supported, got a list of {n}"),
            ));
        }
        let echo = self.echo == Some(true);
        let prompt_logprobs = self
            .prompt_logprobs
            .map(|n| check_logprobs("prompt_logprobs", n))
            .transpose()?;
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix is not supported"));
        }
        let logprobs = self
            .logprobs
            .map(|n| check_logprobs("logprobs", n))
            .transpose()?;
        let f = &self.fields;
        let max_tokens = match (f.max_tokens, f.max_completion_tokens) {
            (Some(m), _) => (Some(m), "max_tokens"),
            (None, Some(m)) => (Some(m), "max_completion_tokens"),
            (None, None) => (Some(DEFAULT_COMPLETION_MAX_TOKENS as i64), "max_tokens"),
        };
        // Scoring the prompt alone (echo, prompt_logprobs) may generate nothing.
        let scoring_only = max_tokens.0 == Some(0) && (echo || prompt_logprobs.is_some());
        let checked = if scoring_only {
            (Some(1), max_tokens.1)
        } else {
            max_tokens
        };
        let mut p = f.params(&self.sampling, checked, logprobs)?;
        if scoring_only {
            if p.sampling.n > 1 {
                return Err(ApiError::invalid(
                    "n",
                    "n must be 1 when max_tokens is 0 (the prompt is only scored)",
                ));
            }
            p.max_tokens = Some(0);
        }
        p.echo = echo;
        p.prompt_logprobs = prompt_logprobs;
        Ok(p)
    }
}

/// `{token text: logprob}` for one position, best first (serialized as a JSON
/// object in that order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobsMap(pub Vec<(String, f32)>);

impl Serialize for TopLogprobsMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobsMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        Ok(TopLogprobsMap(
            m.into_iter()
                .map(|(k, v)| (k, v.as_f64().unwrap_or(f64::NEG_INFINITY) as f32))
                .collect(),
        ))
    }
}

/// `{token text: logprob}`: an object of numbers.
impl utoipa::PartialSchema for TopLogprobsMap {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::RefOr(
                ObjectBuilder::new().schema_type(Type::Number).into(),
            )))
            .into()
    }
}
impl utoipa::ToSchema for TopLogprobsMap {}

/// Legacy completions logprobs, one entry per token: the generated ones, after
/// the prompt's with `echo` (whose first token has `null`: nothing before it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<TopLogprobsMap>>,
    /// Offset of each token's text in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<String>,
    /// vLLM's `prompt_logprobs` (when asked): one entry per prompt token, `null`
    /// first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<PromptLogprobsEntry>>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionResponse {
    pub id: String,
    /// "text_completion".
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

/// One `data:` event of a streamed completion; the optional last one before
/// `[DONE]` carries `usage` and no choices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionChunk {
    pub id: String,
    /// "text_completion".
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json;

    fn req(json: &str) -> CompletionRequest {
        parse_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn prompt_forms() {
        assert_eq!(req(r#"{"prompt":"hi"}"#).prompt, Prompt::Text("hi".into()));
        assert_eq!(
            req(r#"{"prompt":[1,2]}"#).prompt,
            Prompt::Tokens(vec![1, 2])
        );
        assert_eq!(
            req(r#"{"prompt":["hi"]}"#).prompt,
            Prompt::Text("hi".into())
        );
        assert_eq!(req(r#"{"prompt":[[3]]}"#).prompt, Prompt::Tokens(vec![3]));
        let e = req(r#"{"prompt":["a","b"]}"#).params().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = parse_json::<CompletionRequest>(br#"{"prompt":[1,-2]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = parse_json::<CompletionRequest>(br#"{"prompt":{"a":1}}"#).unwrap_err();
        assert!(
            e.message.contains("expected a string or an array"),
            "{}",
            e.message
        );
    }

    #[test]
    fn params_defaults_and_ranges() {
        let p = req(r#"{"prompt":"a"}"#).params().unwrap();
        assert_eq!(p.max_tokens, Some(16));
        assert_eq!(p.sampling.temperature, 1.0);
        assert!(p.logprobs.is_none() && !p.stream && !p.include_usage);
        let p = req(r#"{"prompt":"a","stop":"x","logprobs":2,"stream":true,
                       "stream_options":{"include_usage":true},"seed":7,"top_k":-1}"#)
        .params()
        .unwrap();
        assert_eq!(p.sampling.stop, vec!["x".to_string()]);
        assert_eq!(
            (p.logprobs, p.sampling.seed, p.sampling.top_k),
            (Some(2), Some(7), 0)
        );
        assert!(p.include_usage);
        for (body, param) in [
            (r#"{"prompt":"a","temperature":2.5}"#, "temperature"),
            (r#"{"prompt":"a","temperature":-1}"#, "temperature"),
            (r#"{"prompt":"a","top_p":0}"#, "top_p"),
            (r#"{"prompt":"a","top_p":1.5}"#, "top_p"),
            (r#"{"prompt":"a","max_tokens":0}"#, "max_tokens"),
            (
                r#"{"prompt":"a","max_completion_tokens":-3}"#,
                "max_completion_tokens",
            ),
            (r#"{"prompt":"a","top_k":-2}"#, "top_k"),
            (r#"{"prompt":"a","min_p":2}"#, "min_p"),
            (r#"{"prompt":"a","presence_penalty":3}"#, "presence_penalty"),
            (
                r#"{"prompt":"a","frequency_penalty":-3}"#,
                "frequency_penalty",
            ),
            (r#"{"prompt":"a","n":17}"#, "n"),
            (r#"{"prompt":"a","n":2,"best_of":4}"#, "best_of"),
            (r#"{"prompt":"a","logprobs":21}"#, "logprobs"),
            (r#"{"prompt":"a","stop":["a",""]}"#, "stop"),
            (r#"{"prompt":"a","ttft_slo_ms":0}"#, "ttft_slo_ms"),
            (r#"{"prompt":"a","prompt_logprobs":21}"#, "prompt_logprobs"),
            (r#"{"prompt":"a","max_tokens":0,"echo":true,"n":2}"#, "n"),
        ] {
            let e = req(body).params().unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert!(e.message.contains(param), "{}", e.message);
        }
    }

    #[test]
    fn flattened_fields_are_named_in_parse_errors() {
        for (body, param) in [
            (r#"{"prompt":"a","slo_class":"bulk"}"#, "slo_class"),
            (r#"{"prompt":"a","temperature":"hot"}"#, "temperature"),
            (r#"{"prompt":"a","stream":1}"#, "stream"),
            (r#"{"prompt":"a","stop":[1]}"#, "stop"),
        ] {
            let e = parse_json::<CompletionRequest>(body.as_bytes()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}");
            assert!(e.message.contains(param), "{}", e.message);
        }
        let p = req(r#"{"prompt":"a","slo_class":" Batch","ttft_slo_ms":50}"#)
            .params()
            .unwrap();
        assert_eq!(p.slo.class, Some(sloserve_slo::SloClass::Batch));
        assert_eq!(p.slo.ttft_ms, Some(50.0));
    }

    #[test]
    fn top_logprobs_serialize_as_ordered_object() {
        let lp = CompletionLogprobs {
            tokens: vec!["b".into()],
            token_logprobs: vec![Some(-0.5)],
            top_logprobs: vec![Some(TopLogprobsMap(vec![
                ("b".into(), -0.5),
                ("a".into(), -1.0),
            ]))],
            text_offset: vec![0],
        };
        let s = serde_json::to_string(&lp).unwrap();
        assert!(s.contains(r#""top_logprobs":[{"b":-0.5,"a":-1.0}]"#), "{s}");
        let back: CompletionLogprobs = serde_json::from_str(&s).unwrap();
        assert_eq!(back.top_logprobs[0].as_ref().unwrap().0.len(), 2);
    }

    #[test]
    fn echo_and_prompt_logprobs_allow_scoring_only() {
        let p = req(r#"{"prompt":"a","echo":true,"logprobs":1,"max_tokens":0}"#)
            .params()
            .unwrap();
        assert!(p.echo && p.max_tokens == Some(0));
        assert_eq!(p.prompt_scoring(), Some(1));
        let p = req(r#"{"prompt":"a","prompt_logprobs":3,"max_tokens":0}"#)
            .params()
            .unwrap();
        assert_eq!((p.prompt_logprobs, p.prompt_scoring()), (Some(3), Some(3)));
        let p = req(r#"{"prompt":"a","echo":true,"max_tokens":0}"#)
            .params()
            .unwrap();
        assert_eq!(p.prompt_scoring(), Some(0));
        // Echo of a generating request without logprobs scores nothing.
        let p = req(r#"{"prompt":"a","echo":true}"#).params().unwrap();
        assert_eq!(p.prompt_scoring(), None);
        let p = req(r#"{"prompt":"a","logprobs":2}"#).params().unwrap();
        assert_eq!(p.prompt_scoring(), None);
    }
}
