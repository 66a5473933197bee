//! What both generation endpoints share after parsing: submitting the request and
//! answering with one JSON response (here) or a Server-Sent Events stream
//! ([`crate::stream`]), in the completions or the chat shape.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sloserve_api::{
    ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, GenParams,
    PromptLogprobsEntry, ResponseMessage, Usage,
};

use crate::echo::{join_logprobs, prompt_part, PromptAsk};
use crate::error::ServerError;
use crate::generation::logprobs::{chat_logprobs, completion_logprobs};
use crate::generation::stop_automaton::StopAutomaton;
use crate::generation::{Delta, Generation};
use crate::keys::Caller;
use crate::state::{unix_now, AppState};
use crate::stream::sse_response;
use sloserve_engine::RequestStream;

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
    let (stream, include_usage) = (params.stream, params.include_usage);
    let write_timeout = state.stream_write_timeout;
    let Started { gens, first, out } = start(state, headers, caller, prompt, params, kind).await?;
    if stream {
        sse_response(gens, first, out, include_usage, write_timeout).await
    } else {
        collect(gens, first, out).await
    }
}

/// A request submitted: its choices (choice 0's first output taken when `n` > 1)
/// and how to shape them.
pub(crate) struct Started {
    pub gens: Vec<Generation>,
    pub first: Option<Delta>,
    pub out: Out,
}

/// Checks the request (the cheap checks first: shape, context, the in-flight
/// limit for every choice), then compiles its constraint, builds and submits its
/// choices (see [`generate`]).
pub(crate) async fn start(
    state: Arc<AppState>,
    headers: &HeaderMap,
    caller: &Caller,
    prompt: Vec<u32>,
    params: GenParams,
    kind: Kind,
) -> Result<Started, ServerError> {
    let prompt_param = match kind {
        Kind::Completion => "prompt",
        Kind::Chat => "messages",
    };
    let prompt_len = prompt.len();
    let prompt_ask = PromptAsk {
        echo: params.echo.then(|| prompt.clone()),
        echo_logprobs: params.logprobs.filter(|_| params.echo),
        prompt_logprobs: params.prompt_logprobs,
    };
    let reasoning = match kind {
        Kind::Chat => crate::reasoning::splitter(&state, &prompt, params.tools.is_some()),
        Kind::Completion => None,
    };
    // Where the answer starts: a budget counts from it, and a grammar waits for the
    // end of a reasoning the prompt opened (`crate::reasoning_budget`).
    let answer_splitter = crate::reasoning::splitter(&state, &prompt, false);
    let mut ingress = crate::ingress::build(&state, prompt, &params, headers, caller, None)?;
    state.check_accepting()?;
    // The engine's shape checks (context length, max_tokens) before any grammar
    // work; `submit` makes them again with the constraint.
    state
        .engine
        .limits()
        .validate(&ingress.request)
        .map_err(|e| ServerError::engine(e, prompt_param))?;
    let n = params.sampling.n;
    // Each choice is a request in flight: the middleware counted the first.
    let mut slots = state
        .inflight_limit
        .try_more(n.saturating_sub(1) as usize)?;
    // response_format's grammar, or the tool calls' (never both with a forced
    // call: a 400 at parsing; under `auto` response_format wins, as the output is
    // then the format's).
    // Compiles count against the caller's share of the grammar pool (its flow: the
    // key's owner, or the trusted gateway's fairness id).
    let tenant = ingress.request.fairness.clone();
    let (constraint, constraint_param) = match (&params.tools, params.response_format.clone()) {
        (_, Some(rf)) => (
            state
                .blocking(move |st| {
                    let n_vocab = st.engine.info().vocab_size;
                    st.structured
                        .constraint(&st.tokenizer, n_vocab, &rf, tenant.as_deref())
                })
                .await??,
            "response_format",
        ),
        (Some(t), None) => {
            let t = t.clone();
            (
                state
                    .blocking(move |st| crate::tools::constraint(st, &t, tenant.as_deref()))
                    .await??,
                "tools",
            )
        }
        (None, None) => (None, "response_format"),
    };
    let opened = answer_splitter.as_ref().is_some_and(|s| s.in_reasoning());
    let constraint = match params.thinking_token_budget {
        Some(b) => crate::reasoning_budget::wrap(&state, answer_splitter, b, constraint)?,
        // No budget: the grammar still waits for the reasoning's end.
        None if opened && constraint.is_some() => {
            crate::reasoning_budget::wrap(&state, answer_splitter, u32::MAX, constraint)?
        }
        None => constraint,
    };
    ingress.request.constraint = constraint;
    let id = state.new_id(match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    });
    // Built once: the choices share it.
    let stops = StopAutomaton::new(params.sampling.stop.as_slice()).map(Arc::new);
    // A tool-using chat answer keeps its format's control-token markers in its text.
    let kept = match (kind, &params.tools) {
        (Kind::Chat, Some(_)) => {
            crate::tools::marker_ids(&state, crate::tools::call_format(&state))
                .into_iter()
                .map(|(_, id)| id)
                .collect()
        }
        _ => Vec::new(),
    };
    let mut choice = |i: u32, stream: RequestStream| -> Generation {
        let class = stream.admitted().class;
        let gen = Generation::new(
            &state,
            id.clone(),
            stream,
            class,
            prompt_len,
            stops.clone(),
            params.logprobs.is_some(),
        )
        .with_timeout(ingress.timeout)
        .with_choice(i)
        .with_kept_tokens(&kept)
        .with_reasoning(reasoning.as_ref())
        .with_constraint_param(constraint_param);
        // The later choices hold the extra counts (the first is the request's).
        match if i > 0 { slots.pop() } else { None } {
            Some(slot) => gen.with_slot(slot),
            None => gen,
        }
    };
    let request = |i: u32| {
        let mut request = ingress.request.clone();
        request.sampling.seed = request.sampling.seed.map(|s| s.wrapping_add(i as u64));
        request
    };
    // All n choices are admitted together, or the request is refused at once.
    let (stream, mut reserved) = state
        .engine
        .submit_choices(request(0), n as usize)
        .map_err(|e| ServerError::engine(e, prompt_param))?;
    let mut gens = vec![choice(0, stream)];
    // n > 1: one prefill. The later choices are submitted once the first one's
    // prompt has been prefilled (its first token came), so the prefix cache gives
    // them its full blocks (only the last partial block is computed again). Their
    // admission is held meanwhile; only an engine that stops can still refuse
    // them (dropping `gens` then cancels the choices already running).
    let mut first = None;
    if n > 1 {
        if state.engine.config().enable_prefix_cache {
            first = gens[0].first_token().await;
            if first.is_none() {
                if let Some(e) = gens[0].failure() {
                    return Err(e);
                }
            }
        }
        for i in 1..n {
            let stream = state
                .engine
                .submit_reserved(&mut reserved, request(i))
                .map_err(|e| ServerError::engine(e, prompt_param))?;
            gens.push(choice(i, stream));
        }
    }
    let out = Out {
        kind,
        created: unix_now(),
        model: state.model_name.clone(),
        tools: match (kind, &params.tools) {
            (Kind::Chat, Some(t)) => Some(crate::tools::functions(
                crate::tools::call_format(&state),
                t,
            )),
            _ => None,
        },
        reasoning,
        prompt: prompt_ask,
    };
    Ok(Started { gens, first, out })
}

/// Shapes the chunks and responses of one request.
pub(crate) struct Out {
    pub kind: Kind,
    pub created: u64,
    pub model: String,
    /// Parse the model's tool calls out of its text (the request's functions).
    pub tools: Option<crate::tool_parser::Functions>,
    /// Split a thinking model's reasoning from its content (chat; `crate::reasoning`).
    pub reasoning: Option<sloserve_model::reasoning::ReasoningSplitter>,
    /// Completions: what the choices carry of the prompt (`echo`,
    /// `prompt_logprobs`).
    pub prompt: PromptAsk,
}

/// The OpenAI `finish_reason` of an ended generation.
pub(crate) fn wire_finish_reason(gen: &Generation) -> Option<String> {
    gen.finish_reason().map(|r| r.as_openai().to_string())
}

/// The choices' answers, in index order, in one JSON response. The first
/// failure fails the request (the other choices are dropped, so cancelled).
async fn collect(
    gens: Vec<Generation>,
    mut first: Option<Delta>,
    out: Out,
) -> Result<Response, ServerError> {
    let id = gens[0].id().to_string();
    let out_ref = &out;
    let choices =
        futures_util::future::try_join_all(gens.into_iter().enumerate().map(|(i, gen)| {
            collect_choice(
                gen,
                i as u32,
                if i == 0 { first.take() } else { None },
                out_ref,
            )
        }))
        .await?;
    let usage =
        crate::generation::usage::merge_choices(choices.iter().map(|c| c.1.clone()).collect());
    let body = match out.kind {
        Kind::Completion => serde_json::to_string(&CompletionResponse {
            id,
            object: "text_completion".into(),
            created: out.created,
            model: out.model,
            choices: choices
                .into_iter()
                .filter_map(|(c, _)| match c {
                    WireChoice::Completion(c) => Some(c),
                    WireChoice::Chat(..) => None,
                })
                .collect(),
            usage,
        }),
        Kind::Chat => {
            // vLLM's chat answer carries the prompt's logprobs once, at the top.
            let mut prompt_logprobs = None;
            let choices = choices
                .into_iter()
                .filter_map(|(c, _)| match c {
                    WireChoice::Chat(c, p) => {
                        if prompt_logprobs.is_none() {
                            prompt_logprobs = p;
                        }
                        Some(c)
                    }
                    WireChoice::Completion(_) => None,
                })
                .collect();
            serde_json::to_string(&ChatCompletionResponse {
                id,
                object: "chat.completion".into(),
                created: out.created,
                model: out.model,
                choices,
                usage,
                prompt_logprobs,
            })
        }
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

/// One choice of a JSON answer, in the endpoint's shape (a chat choice with
/// vLLM's `prompt_logprobs` when asked, which the answer carries at its top).
pub(crate) enum WireChoice {
    Completion(CompletionChoice),
    Chat(ChatChoice, Option<Vec<Option<PromptLogprobsEntry>>>),
}

/// Runs one choice to its end: its answer (tool calls parsed per choice) and usage.
pub(crate) async fn collect_choice(
    mut gen: Generation,
    index: u32,
    first: Option<Delta>,
    out: &Out,
) -> Result<(WireChoice, Usage), ServerError> {
    let mut text = String::new();
    let mut lps = Vec::new();
    let want_lp = gen.wants_logprobs();
    if let Some(Delta { text: t, logprobs }) = first {
        text.push_str(&t);
        lps.extend(logprobs);
    }
    while let Some(Delta { text: t, logprobs }) = gen.next().await {
        text.push_str(&t);
        lps.extend(logprobs);
    }
    if let Some(e) = gen.failure() {
        return Err(e);
    }
    let usage = gen.usage();
    let mut finish_reason = wire_finish_reason(&gen);
    let tok = gen.tokenizer();
    let choice = match out.kind {
        Kind::Completion => {
            let ask = &out.prompt;
            let ids = ask.echo.as_deref().unwrap_or(&[]);
            let part = prompt_part(tok, ask, ids, gen.prompt_scores());
            let shift = part.text.len();
            let generated = want_lp.then(|| completion_logprobs(tok, &lps));
            WireChoice::Completion(CompletionChoice {
                index,
                logprobs: join_logprobs(part.logprobs, generated, shift),
                text: part.text + &text,
                finish_reason,
                prompt_logprobs: part.prompt_logprobs,
            })
        }
        Kind::Chat => {
            let (reasoning, text) = match &out.reasoning {
                Some(s) => crate::reasoning::split_whole(s, text),
                None => (None, text),
            };
            let (content, tool_calls) = if let Some(names) = out.tools.clone() {
                let (content, calls) = crate::tools::ToolOutput::message(names, &text);
                finish_reason = crate::tools::finish_reason(finish_reason, calls.len());
                (content, (!calls.is_empty()).then_some(calls))
            } else {
                (Some(text), None)
            };
            let prompt = out
                .prompt
                .any()
                .then(|| prompt_part(tok, &out.prompt, &[], gen.prompt_scores()).prompt_logprobs)
                .flatten();
            WireChoice::Chat(
                ChatChoice {
                    index,
                    message: ResponseMessage {
                        role: "assistant".into(),
                        content,
                        reasoning_content: reasoning.clone(),
                        reasoning,
                        tool_calls,
                    },
                    logprobs: want_lp.then(|| chat_logprobs(tok, &lps)),
                    finish_reason,
                },
                prompt,
            )
        }
    };
    Ok((choice, usage))
}
