//! `POST /v1/embeddings`: each input tokenized as llama.cpp's embedding path
//! does (`Tokenizer::encode_prompt`: BOS / EOS as the vocabulary says, control
//! tokens parsed) or taken as ids, pooled by the engine, L2-normalised (after
//! `dimensions` keeps the leading values), as floats or base64 f32.

use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use sloserve_api::{
    ApiError, Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingVector, Inputs, PooledUsage,
};

use crate::accept::Accepted;
use crate::error::ServerError;
use crate::pooled::{self, normalize};

pub async fn handle(a: Accepted<EmbeddingRequest>) -> Result<Response, ServerError> {
    let Accepted {
        state,
        req,
        caller,
        headers,
    } = a;
    let p = req.validate()?;
    let pooling = state.pooling.embedding()?;
    let size = state.embedding_size;
    if let Some(d) = p.dimensions.filter(|&d| d > size) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("dimensions: {d} is more than the model's {size}"),
        )
        .into());
    }
    let prompts = match p.inputs {
        Inputs::Tokens(t) => t,
        Inputs::Texts(texts) => {
            state
                .blocking(move |st| {
                    texts
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            st.tokenizer.encode_prompt(t).map_err(|e| {
                                ApiError::invalid(
                                    "input",
                                    format!("input[{i}]: cannot tokenize: {e}"),
                                )
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .await??
        }
    };
    let tokens: usize = prompts.iter().map(Vec::len).sum();
    let outs = pooled::run(&state, &headers, &caller, prompts, pooling, p.slo, "input").await?;
    let data = outs
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            if let Some(d) = p.dimensions {
                v.truncate(d);
            }
            normalize(&mut v);
            let embedding = match p.base64 {
                false => EmbeddingVector::Float(v),
                true => EmbeddingVector::Base64(base64_f32(&v)),
            };
            Embedding {
                object: "embedding".into(),
                embedding,
                index,
            }
        })
        .collect();
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data,
        model: state.model_name.clone(),
        usage: PooledUsage::of(tokens),
    })
    .into_response())
}

/// The little-endian f32 bytes of `v` in standard base64 (OpenAI's
/// `encoding_format: "base64"`).
pub fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
