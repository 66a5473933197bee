//! `/v1/embeddings` (OpenAI's shape): the request (`input` a string, strings,
//! token ids or lists of token ids; `encoding_format`; `dimensions`) validated
//! into [`EmbedParams`], and the response. The bounds are stated here once.

use serde::{Deserialize, Serialize};
use sloserve_slo::{Asked, SloClass};

use crate::error::ApiError;

/// Most inputs of one request (OpenAI's limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// `input`: one text, several, one token list or several.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (each vector's little-endian f32 bytes).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Keep the first `dimensions` values, renormalised (Matryoshka models); at
    /// most the model's hidden size.
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    /// sloserve: "batch" (the default for embeddings) or "interactive".
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub slo_class: Option<SloClass>,
    /// sloserve: this request's TTFT target (interactive).
    #[serde(default)]
    pub ttft_slo_ms: Option<f64>,
}

/// The inputs, as texts or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Inputs {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Tokens(t) => t.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A validated embedding request.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedParams {
    pub inputs: Inputs,
    pub base64: bool,
    pub dimensions: Option<usize>,
    /// The body's SLO fields; embeddings default to the batch class.
    pub slo: Asked,
}

/// The SLO fields of a pooled request's body: batch unless it asks.
pub fn pooled_slo(class: Option<SloClass>, ttft_ms: Option<f64>) -> Result<Asked, ApiError> {
    let slo = Asked {
        class,
        objective: None,
        ttft_ms,
        tpot_ms: None,
    };
    slo.validate()?;
    Ok(slo)
}

/// Checks a list of inputs' count (`param` names it): at least one, at most
/// [`MAX_EMBEDDING_INPUTS`].
pub fn check_count(n: usize, param: &str) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::invalid(
            param,
            format!("{param} must not be empty"),
        ));
    }
    if n > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::invalid(
            param,
            format!("{param}: {n} inputs, at most {MAX_EMBEDDING_INPUTS} per request"),
        ));
    }
    Ok(())
}

impl EmbeddingRequest {
    pub fn validate(self) -> Result<EmbedParams, ApiError> {
        let inputs = match self.input {
            EmbeddingInput::Text(t) => Inputs::Texts(vec![t]),
            EmbeddingInput::Texts(t) => Inputs::Texts(t),
            EmbeddingInput::Tokens(t) => Inputs::Tokens(vec![t]),
            EmbeddingInput::TokenLists(t) => Inputs::Tokens(t),
        };
        check_count(inputs.len(), "input")?;
        let empty = match &inputs {
            Inputs::Texts(t) => t.iter().position(String::is_empty),
            Inputs::Tokens(t) => t.iter().position(Vec::is_empty),
        };
        if let Some(i) = empty {
            return Err(ApiError::invalid(
                "input",
                format!("input[{i}] is empty: each input needs at least one token"),
            ));
        }
        let base64 = match self.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format must be \"float\" or \"base64\", got {f:?}"),
                ))
            }
        };
        let dimensions = match self.dimensions {
            None => None,
            Some(d) if d >= 1 => Some(d as usize),
            Some(d) => {
                return Err(ApiError::invalid(
                    "dimensions",
                    format!("dimensions must be at least 1, got {d}"),
                ))
            }
        };
        Ok(EmbedParams {
            inputs,
            base64,
            dimensions,
            slo: pooled_slo(self.slo_class, self.ttft_slo_ms)?,
        })
    }
}

/// One vector: floats, or their little-endian f32 bytes in base64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Embedding {
    /// "embedding".
    pub object: String,
    pub embedding: EmbeddingVector,
    pub index: usize,
}

/// `usage` of a pooled request: its prompt tokens (no completion).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PooledUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl PooledUsage {
    pub fn of(prompt_tokens: usize) -> Self {
        PooledUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingResponse {
    /// "list".
    pub object: String,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: PooledUsage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json;

    fn params(body: &str) -> Result<EmbedParams, ApiError> {
        parse_json::<EmbeddingRequest>(body.as_bytes())?.validate()
    }

    #[test]
    fn every_input_shape_parses() {
        let t = |v: &[&str]| Inputs::Texts(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(params(r#"{"input":"a"}"#).unwrap().inputs, t(&["a"]));
        assert_eq!(
            params(r#"{"input":["a","b"]}"#).unwrap().inputs,
            t(&["a", "b"])
        );
        assert_eq!(
            params(r#"{"input":[1,2]}"#).unwrap().inputs,
            Inputs::Tokens(vec![vec![1, 2]])
        );
        assert_eq!(
            params(r#"{"input":[[1],[2,3]]}"#).unwrap().inputs,
            Inputs::Tokens(vec![vec![1], vec![2, 3]])
        );
        let p = params(r#"{"input":"a","encoding_format":"base64","dimensions":8}"#).unwrap();
        assert!(p.base64 && p.dimensions == Some(8) && p.slo.class.is_none());
    }

    #[test]
    fn bad_inputs_name_the_field() {
        for (body, param) in [
            (r#"{"input":[]}"#, "input"),
            (r#"{"input":""}"#, "input"),
            (r#"{"input":["a",""]}"#, "input"),
            (r#"{"input":[[1],[]]}"#, "input"),
            (
                r#"{"input":"a","encoding_format":"int8"}"#,
                "encoding_format",
            ),
            (r#"{"input":"a","dimensions":0}"#, "dimensions"),
            (r#"{"input":"a","slo_class":"bulk"}"#, "slo_class"),
            (r#"{"model":"m"}"#, "input"),
        ] {
            let e = params(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
        let many = format!(r#"{{"input":[{}]}}"#, vec!["\"a\""; 2049].join(","));
        assert!(params(&many).unwrap_err().message.contains("at most 2048"));
    }
}
