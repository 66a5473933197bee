//! `POST /v1/rerank` and `POST /score`: pairs of texts scored by the served
//! model. A reranker (`pooling rank`) scores each pair's Qwen3-Reranker prompt
//! by P("yes") / (P("yes") + P("no")) at its last position; an embedding model
//! scores by the cosine of the two texts' embeddings.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sloserve_api::{
    ApiError, Pairs, PooledUsage, RerankDocument, RerankRequest, RerankResponse, RerankResult,
    ScoreData, ScoreRequest, ScoreResponse,
};
use sloserve_engine::Pooling;

use crate::accept::Accepted;
use crate::error::ServerError;
use crate::keys::Caller;
use crate::pooled::{self, cosine};
use crate::pooling_mode::PoolingMode;
use crate::state::{unix_now, AppState};

/// Qwen3-Reranker's prompt (its model card), before the pair.
const RANK_PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
/// ... and after it: the answer's first token is read here.
const RANK_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// The card's default instruction.
const RANK_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

/// The reranker's prompt of one pair: the prefix and suffix with their control
/// tokens, the pair as plain text.
pub fn rank_prompt(st: &AppState, query: &str, doc: &str) -> Result<Vec<u32>, ServerError> {
    let pair = format!("<Instruct>: {RANK_INSTRUCTION}\n<Query>: {query}\n<Document>: {doc}");
    let mut ids = st.encode(RANK_PREFIX, true, "query")?;
    let tok = |t: &str, special| {
        st.tokenizer.encode(t, special).map_err(|e| {
            ServerError::from(ApiError::invalid(
                "documents",
                format!("cannot tokenize: {e}"),
            ))
        })
    };
    ids.extend(tok(&pair, false)?);
    ids.extend(tok(RANK_SUFFIX, true)?);
    Ok(ids)
}

/// Each pair's score and the prompt tokens spent.
async fn scores(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    caller: &Caller,
    p: Pairs,
    param: &'static str,
) -> Result<(Vec<f64>, usize), ServerError> {
    match state.pooling.clone() {
        PoolingMode::Rank { yes, no } => {
            let pairs = p.pairs;
            let prompts = state
                .blocking(move |st| {
                    pairs
                        .iter()
                        .map(|(q, d)| rank_prompt(st, q, d))
                        .collect::<Result<Vec<_>, _>>()
                })
                .await??;
            let tokens = prompts.iter().map(Vec::len).sum();
            let pooling = Pooling::TokenLogits(vec![yes, no]);
            let outs = pooled::run(state, headers, caller, prompts, pooling, p.slo, param).await?;
            // P(yes) / (P(yes) + P(no)) = sigmoid(logit_yes - logit_no).
            let s = outs
                .iter()
                .map(|v| 1.0 / (1.0 + (v[1] as f64 - v[0] as f64).exp()))
                .collect();
            Ok((s, tokens))
        }
        mode => {
            let pooling = mode.embedding()?;
            let n = p.pairs.len();
            // Left texts then right texts, each once when the left is shared.
            let shared = p.pairs.iter().all(|(l, _)| *l == p.pairs[0].0);
            let mut texts: Vec<String> = match shared {
                true => vec![p.pairs[0].0.clone()],
                false => p.pairs.iter().map(|(l, _)| l.clone()).collect(),
            };
            texts.extend(p.pairs.iter().map(|(_, r)| r.clone()));
            let prompts = state
                .blocking(move |st| {
                    texts
                        .iter()
                        .map(|t| {
                            st.tokenizer.encode_prompt(t).map_err(|e| {
                                ServerError::from(ApiError::invalid(
                                    param,
                                    format!("cannot tokenize: {e}"),
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .await??;
            let tokens = prompts.iter().map(Vec::len).sum();
            let outs = pooled::run(state, headers, caller, prompts, pooling, p.slo, param).await?;
            let left = |i: usize| &outs[if shared { 0 } else { i }];
            let right_at = outs.len() - n;
            let s = (0..n)
                .map(|i| cosine(left(i), &outs[right_at + i]))
                .collect();
            Ok((s, tokens))
        }
    }
}

/// `POST /v1/rerank`: the documents by relevance to the query, best first.
pub async fn rerank(a: Accepted<RerankRequest>) -> Result<Response, ServerError> {
    let (pairs, top_n, with_docs) = a.req.validate()?;
    let (state, req) = (&a.state, &a.req);
    let (s, tokens) = scores(state, &a.headers, &a.caller, pairs, "documents").await?;
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.sort_by(|&x, &y| s[y].total_cmp(&s[x]).then(x.cmp(&y)));
    let results = order
        .into_iter()
        .take(top_n)
        .map(|i| RerankResult {
            index: i,
            document: with_docs.then(|| RerankDocument {
                text: req.documents[i].clone(),
            }),
            relevance_score: s[i],
        })
        .collect();
    Ok(Json(RerankResponse {
        id: state.new_id("rerank"),
        model: state.model_name.clone(),
        usage: PooledUsage::of(tokens),
        results,
    })
    .into_response())
}

/// `POST /score`: each pair's score, in order.
pub async fn score(a: Accepted<ScoreRequest>) -> Result<Response, ServerError> {
    let state = a.state.clone();
    let pairs = a.req.validate()?;
    let (s, tokens) = scores(&state, &a.headers, &a.caller, pairs, "text_2").await?;
    let data = s
        .into_iter()
        .enumerate()
        .map(|(index, score)| ScoreData {
            index,
            object: "score".into(),
            score,
        })
        .collect();
    Ok(Json(ScoreResponse {
        id: state.new_id("score"),
        object: "list".into(),
        created: unix_now(),
        model: state.model_name.clone(),
        data,
        usage: PooledUsage::of(tokens),
    })
    .into_response())
}
