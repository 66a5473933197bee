//! `/v1/rerank` (Cohere's / Jina's shape, as vLLM serves it) and `/score`
//! (vLLM's): a query against documents, or texts against texts, each pair
//! scored by the model. Validated into [`Pairs`]; bounded as embeddings are
//! ([`crate::embeddings::MAX_EMBEDDING_INPUTS`] documents or pairs).

use serde::{Deserialize, Serialize};
use sloserve_slo::{Asked, SloClass};

use crate::embeddings::{check_count, pooled_slo, PooledUsage};
use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// Return the best `top_n` (default: all), best first.
    #[serde(default)]
    pub top_n: Option<i64>,
    /// Each result carries its document's text (default true).
    #[serde(default)]
    pub return_documents: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub slo_class: Option<SloClass>,
    #[serde(default)]
    pub ttft_slo_ms: Option<f64>,
}

/// `text_1` / `text_2`: one text or several.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum TextOrList {
    One(String),
    Many(Vec<String>),
}

impl TextOrList {
    fn into_vec(self) -> Vec<String> {
        match self {
            TextOrList::One(t) => vec![t],
            TextOrList::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ScoreRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub text_1: TextOrList,
    pub text_2: TextOrList,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub slo_class: Option<SloClass>,
    #[serde(default)]
    pub ttft_slo_ms: Option<f64>,
}

/// What is scored: each pair `(left, right)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pairs {
    pub pairs: Vec<(String, String)>,
    pub slo: Asked,
}

fn no_empty(texts: &[String], param: &str) -> Result<(), ApiError> {
    match texts.iter().position(String::is_empty) {
        Some(i) => Err(ApiError::invalid(
            param,
            format!("{param}[{i}] is empty: each text needs at least one token"),
        )),
        None => Ok(()),
    }
}

impl RerankRequest {
    /// The pairs (the query with each document), the number to return and
    /// whether documents come back.
    pub fn validate(&self) -> Result<(Pairs, usize, bool), ApiError> {
        check_count(self.documents.len(), "documents")?;
        no_empty(&self.documents, "documents")?;
        if self.query.is_empty() {
            return Err(ApiError::invalid("query", "query must not be empty"));
        }
        let n = self.documents.len();
        let top_n = match self.top_n {
            None => n,
            Some(k) if k >= 1 => (k as usize).min(n),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_n",
                    format!("top_n must be at least 1, got {k}"),
                ))
            }
        };
        let pairs = self
            .documents
            .iter()
            .map(|d| (self.query.clone(), d.clone()))
            .collect();
        let slo = pooled_slo(self.slo_class, self.ttft_slo_ms)?;
        let docs = self.return_documents.unwrap_or(true);
        Ok((Pairs { pairs, slo }, top_n, docs))
    }
}

impl ScoreRequest {
    /// vLLM's pairing: one `text_1` against every `text_2`, or lists of the
    /// same length pair by pair.
    pub fn validate(self) -> Result<Pairs, ApiError> {
        let (a, b) = (self.text_1.into_vec(), self.text_2.into_vec());
        check_count(a.len(), "text_1")?;
        check_count(b.len(), "text_2")?;
        no_empty(&a, "text_1")?;
        no_empty(&b, "text_2")?;
        let pairs = match (a.len(), b.len()) {
            (1, _) => b.into_iter().map(|t| (a[0].clone(), t)).collect(),
            (x, y) if x == y => a.into_iter().zip(b).collect(),
            (x, y) => {
                return Err(ApiError::invalid(
                    "text_2",
                    format!("text_1 has {x} texts and text_2 {y}: give one text_1, or lists of the same length"),
                ))
            }
        };
        let slo = pooled_slo(self.slo_class, self.ttft_slo_ms)?;
        Ok(Pairs { pairs, slo })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RerankResult {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
    pub relevance_score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: PooledUsage,
    /// Best first.
    pub results: Vec<RerankResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScoreData {
    pub index: usize,
    /// "score".
    pub object: String,
    pub score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScoreResponse {
    pub id: String,
    /// "list".
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<ScoreData>,
    pub usage: PooledUsage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json;

    #[test]
    fn rerank_and_score_pairs() {
        let r: RerankRequest =
            parse_json(br#"{"query":"q","documents":["a","b","c"],"top_n":9}"#).unwrap();
        let (p, top, docs) = r.validate().unwrap();
        assert_eq!(p.pairs[2], ("q".into(), "c".into()));
        assert_eq!((top, docs), (3, true));
        let s: ScoreRequest = parse_json(br#"{"text_1":"q","text_2":["a","b"]}"#).unwrap();
        assert_eq!(s.validate().unwrap().pairs.len(), 2);
        let s: ScoreRequest = parse_json(br#"{"text_1":["x","y"],"text_2":["a","b"]}"#).unwrap();
        assert_eq!(s.validate().unwrap().pairs[1], ("y".into(), "b".into()));
    }

    #[test]
    fn bad_pairs_name_the_field() {
        let rerank = |b: &str| {
            parse_json::<RerankRequest>(b.as_bytes())?
                .validate()
                .map(|_| ())
        };
        let score = |b: &str| {
            parse_json::<ScoreRequest>(b.as_bytes())?
                .validate()
                .map(|_| ())
        };
        for (r, param) in [
            (rerank(r#"{"query":"q","documents":[]}"#), "documents"),
            (rerank(r#"{"query":"","documents":["a"]}"#), "query"),
            (
                rerank(r#"{"query":"q","documents":["a"],"top_n":0}"#),
                "top_n",
            ),
            (rerank(r#"{"query":"q","documents":["a",""]}"#), "documents"),
            (
                score(r#"{"text_1":["a","b"],"text_2":["c","d","e"]}"#),
                "text_2",
            ),
            (score(r#"{"text_1":[],"text_2":"c"}"#), "text_1"),
        ] {
            assert_eq!(r.unwrap_err().param.as_deref(), Some(param));
        }
    }
}
