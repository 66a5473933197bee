//! What both generation endpoints share after parsing: submitting the request and
//! answering with one JSON response (here) or a Server-Sent Events stream
//! ([`crate::stream`]), in the completions or the chat shape.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sloserve_api::{
    ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, GenParams,
    ResponseMessage, ToolMode,
};

use crate::auth::Caller;
use crate::error::ServerError;
use crate::generation::logprobs::{chat_logprobs, completion_logprobs};
use crate::generation::{Delta, Generation};
use crate::state::{unix_now, AppState};
use crate::stream::sse_response;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// Validates against the context, submits to the engine and answers.
pub async fn generate(
    state: Arc<AppState>,
    headers: &HeaderMap,
    caller: &Caller,
    prompt: Vec<u32>,
    params: GenParams,
    kind: Kind,
) -> Result<Response, ServerError> {
    let prompt_param = match kind {
        Kind::Completion => "prompt",
        Kind::Chat => "messages",
    };
    let prompt_len = prompt.len();
    // A forced tool call's grammar, or response_format's (never both: a 400 at
    // parsing).
    let constraint = match (&params.tools, params.response_format.clone()) {
        (Some(t), _) if t.mode != ToolMode::Auto => {
            let t = t.clone();
            state
                .blocking(move |st| crate::tools::constraint(st, &t))
                .await??
        }
        (_, None) => None,
        (_, Some(rf)) => {
            state
                .blocking(move |st| {
                    let n_vocab = st.engine.info().vocab_size;
                    st.structured.constraint(&st.tokenizer, n_vocab, &rf)
                })
                .await??
        }
    };
    let ingress = crate::ingress::build(&state, prompt, &params, headers, caller, constraint)?;
    state.check_accepting()?;
    let stream = state
        .engine
        .submit(ingress.request)
        .map_err(|e| ServerError::engine(e, prompt_param))?;
    let class = stream.admitted().class;
    let id = state.new_id(match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    });
    let gen = Generation::new(
        &state,
        id,
        stream,
        class,
        prompt_len,
        params.sampling.stop.clone(),
        params.logprobs.is_some(),
    )
    .with_timeout(ingress.timeout);
    let out = Out {
        kind,
        created: unix_now(),
        model: state.model_name.clone(),
        tools: match (kind, &params.tools) {
            (Kind::Chat, Some(t)) => Some(crate::tools::function_names(t)),
            _ => None,
        },
    };
    if params.stream {
        sse_response(gen, out, params.include_usage, state.stream_write_timeout).await
    } else {
        collect(gen, out).await
    }
}

/// Shapes the chunks and responses of one request.
pub(crate) struct Out {
    pub kind: Kind,
    pub created: u64,
    pub model: String,
    /// Parse the model's tool calls out of its text (the request's functions).
    pub tools: Option<Vec<String>>,
}

/// The OpenAI `finish_reason` of an ended generation.
pub(crate) fn wire_finish_reason(gen: &Generation) -> Option<String> {
    gen.finish_reason().map(|r| r.as_openai().to_string())
}

async fn collect(mut gen: Generation, out: Out) -> Result<Response, ServerError> {
    let mut text = String::new();
    let mut lps = Vec::new();
    let want_lp = gen.wants_logprobs();
    while let Some(Delta { text: t, logprobs }) = gen.next().await {
        text.push_str(&t);
        lps.extend(logprobs);
    }
    if let Some(e) = gen.failure() {
        return Err(e);
    }
    let usage = gen.usage();
    let mut finish_reason = wire_finish_reason(&gen);
    let (content, tool_calls) = if let Some(names) = out.tools.clone() {
        let (content, calls) = crate::tools::ToolOutput::message(names, &text);
        finish_reason = crate::tools::finish_reason(finish_reason, calls.len());
        (content, (!calls.is_empty()).then_some(calls))
    } else {
        (Some(text.clone()), None)
    };
    let tok = gen.tokenizer();
    let body = match out.kind {
        Kind::Completion => serde_json::to_string(&CompletionResponse {
            id: gen.id().to_string(),
            object: "text_completion".into(),
            created: out.created,
            model: out.model,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs: want_lp.then(|| completion_logprobs(tok, &lps)),
                finish_reason,
            }],
            usage,
        }),
        Kind::Chat => serde_json::to_string(&ChatCompletionResponse {
            id: gen.id().to_string(),
            object: "chat.completion".into(),
            created: out.created,
            model: out.model,
            choices: vec![ChatChoice {
                index: 0,
                message: ResponseMessage {
                    role: "assistant".into(),
                    content,
                    tool_calls,
                },
                logprobs: want_lp.then(|| chat_logprobs(tok, &lps)),
                finish_reason,
            }],
            usage,
        }),
    };
    let body = body.map_err(|e| ServerError::Internal(format!("cannot serialize: {e}")))?;
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}
