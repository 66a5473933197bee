//! OpenAI-compatible wire types of sloserve's HTTP API: completion, chat and Responses requests,
//! responses and stream chunks, usage with per-request SLO timings, logprobs, vLLM's
//! `/tokenize` and `/detokenize`, `/v1/models`, and the OpenAI error body. Parsing
//! ([`parse_json`]) and validation produce [`ApiError`]s whose message and `param`
//! name the offending field. Unknown fields are ignored, as OpenAI and vLLM do.

pub mod chat;
pub mod common;
pub mod completion;
pub mod embeddings;
pub mod endpoints;
pub mod error;
pub mod parse;
pub mod prom;
pub mod prompt_logprobs;
pub mod rerank;
pub mod responses;
pub mod sampling;
pub mod tokenize;
pub mod tools;

pub use chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatMessage, ChatTokenLogprob, ContentPart,
    MessageContent, ResponseMessage, TopLogprob,
};
pub use common::{
    CompletionTokensDetails, GenParams, PromptTokensDetails, RequestFields, SloTimings, StopSpec,
    StreamOptions, Usage, MAX_LOGPROBS, MAX_STOP_BYTES, MAX_STOP_STRINGS,
};
pub use completion::{
    CompletionChoice, CompletionChunk, CompletionLogprobs, CompletionRequest, CompletionResponse,
    Prompt, PromptLogprobsEntry, PromptTokenLogprob, TopLogprobsMap,
};
pub use embeddings::{
    EmbedParams, Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingVector,
    Inputs, PooledUsage, MAX_EMBEDDING_INPUTS,
};
pub use endpoints::{Endpoint, Runs, Spec as EndpointSpec};
pub use error::{ApiError, ErrorBody, ErrorDetail};
pub use parse::{parse_json, NamesModel};
pub use rerank::{
    Pairs, RerankDocument, RerankRequest, RerankResponse, RerankResult, ScoreData, ScoreRequest,
    ScoreResponse, TextOrList,
};
pub use responses::{
    Echo, IncompleteDetails, OutputItem, OutputText, ResponseObject, ResponseUsage,
    ResponsesRequest,
};
pub use sampling::{Sampling, SamplingFields, MAX_CHOICES};
pub use sloserve_slo::{Asked, SloClass};
pub use tokenize::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
    TokenizerInfo,
};
pub use tools::{
    FunctionCall, FunctionCallDelta, FunctionDef, Tool, ToolCall, ToolCallDelta, ToolChoice,
    ToolFields, ToolMode, ToolParams, MAX_TOOLS,
};
