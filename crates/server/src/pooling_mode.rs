//! Which pooling the served model runs for the pooled endpoints
//! ([`PoolingMode`]): `--pooling` (llama-server's flag) over the GGUF's
//! `{arch}.pooling_type`, else last-token pooling. Data only: the state holds
//! it, `crate::pooled` runs it.

use sloserve_api::ApiError;
use sloserve_engine::Pooling;
use sloserve_model::tokenizer::Tokenizer;

use crate::error::ServerError;

/// `--pooling` (llama-server's names and llama.cpp's `pooling_type` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolingFlag {
    None,
    Mean,
    Cls,
    Last,
    Rank,
}

impl PoolingFlag {
    /// llama.cpp's `pooling_type` value.
    pub fn from_type(t: u32) -> Option<Self> {
        [Self::None, Self::Mean, Self::Cls, Self::Last, Self::Rank]
            .get(t as usize)
            .copied()
    }
}

/// What the pooled endpoints run on the served model.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolingMode {
    /// `pooling_type` none: per-token states, which are not served.
    None,
    /// An embedding model: `/v1/embeddings`; rerank and score by the cosine of
    /// the two texts' embeddings.
    Embed(Pooling),
    /// A decoder reranker (Qwen3-Reranker's recipe): a pair's score is
    /// P(yes) / (P(yes) + P(no)) at the last position of its prompt.
    Rank { yes: u32, no: u32 },
}

impl PoolingMode {
    /// `--pooling` over the file's `pooling_type`, else last-token pooling.
    pub fn resolve(
        flag: Option<PoolingFlag>,
        file: Option<u32>,
        tok: &Tokenizer,
    ) -> anyhow::Result<Self> {
        let chosen = match (flag, file) {
            (Some(f), _) => f,
            (None, Some(t)) => PoolingFlag::from_type(t)
                .ok_or_else(|| anyhow::anyhow!("the file's pooling_type {t} is not one of 0-4"))?,
            (None, None) => PoolingFlag::Last,
        };
        Ok(match chosen {
            PoolingFlag::None => PoolingMode::None,
            PoolingFlag::Mean => PoolingMode::Embed(Pooling::Mean),
            PoolingFlag::Cls => PoolingMode::Embed(Pooling::Cls),
            PoolingFlag::Last => PoolingMode::Embed(Pooling::Last),
            PoolingFlag::Rank => {
                let one = |w: &str| -> anyhow::Result<u32> {
                    match tok.encode(w, false).ok().as_deref() {
                        Some(&[id]) => Ok(id),
                        _ => anyhow::bail!(
                            "rank pooling scores by the tokens \"yes\" and \"no\": {w:?} is not one token of this vocabulary"
                        ),
                    }
                };
                PoolingMode::Rank {
                    yes: one("yes")?,
                    no: one("no")?,
                }
            }
        })
    }

    /// The embedding pooling, or the 400 of a model that does not embed.
    pub fn embedding(&self) -> Result<Pooling, ServerError> {
        match self {
            PoolingMode::Embed(p) => Ok(p.clone()),
            PoolingMode::None => Err(ApiError::invalid(
                "model",
                "this model's pooling is none (per-token states), which /v1/embeddings does not serve; start it with --pooling mean|cls|last",
            )
            .into()),
            PoolingMode::Rank { .. } => Err(ApiError::invalid(
                "model",
                "this model is a reranker (pooling rank): use /v1/rerank or /score",
            )
            .into()),
        }
    }
}
