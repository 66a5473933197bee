//! `POST /v1/chat/completions`: messages (with their tool calls and results) and the
//! request's tools rendered with the model's chat template and tokenized (control
//! tokens only from the template), then generated like a completion.

use std::sync::Arc;

use axum::response::Response;
use sloserve_api::{ApiError, ChatCompletionRequest, ChatMessage, ToolParams};
use sloserve_model::chat_template::ChatMessage as TemplateMessage;
use sloserve_model::ModelError;

use crate::accept::Accepted;
use crate::error::ServerError;
use crate::generate::{generate, Kind};
use crate::state::AppState;

/// Renders `messages` with the model's template (the assistant header appended when
/// `add_generation_prompt`) and tokenizes them: control tokens come only from the
/// template, message text is tokenized with them taken literally. BOS by the
/// tokenizer's rule when `add_bos`. `tools` go to the template (or its fallback),
/// and so do the request's `chat_template_kwargs`.
pub fn encode_messages(
    state: &AppState,
    messages: &[ChatMessage],
    tools: Option<&ToolParams>,
    add_generation_prompt: bool,
    add_bos: bool,
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Vec<u32>, ServerError> {
    state.check_generates()?;
    let msgs = sloserve_api::chat::text_messages(messages)?;
    let Some(template) = &state.chat_template else {
        return Err(ApiError::invalid(
            "messages",
            "messages: this model has no chat template; use /v1/completions",
        )
        .into());
    };
    let msgs: Vec<TemplateMessage> = msgs
        .into_iter()
        .zip(messages)
        .map(|((role, content), m)| TemplateMessage {
            name: m.name.clone(),
            tool_calls: m.tool_calls.as_deref().map(crate::tools::template_calls),
            tool_call_id: m.tool_call_id.clone(),
            reasoning_content: m
                .reasoning_content
                .clone()
                .filter(|_| m.role == "assistant"),
            ..TemplateMessage::new(role, content)
        })
        .collect();
    let tools = tools.map(crate::tools::template_tools);
    template
        .encode_kwargs(
            &state.tokenizer,
            &msgs,
            tools.as_deref(),
            add_generation_prompt,
            add_bos,
            kwargs,
        )
        .map_err(|e| match e {
            ModelError::ChatTemplate(m) => ServerError::Template(m),
            e => ApiError::invalid("messages", format!("messages: cannot tokenize: {e}")).into(),
        })
}

/// A chat request's validated parameters and its prompt (the template rendered
/// and tokenized off the async workers).
pub async fn prompt_and_params(
    state: &Arc<AppState>,
    req: ChatCompletionRequest,
) -> Result<(Vec<u32>, sloserve_api::GenParams), ServerError> {
    let params = req.params()?;
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let kwargs = req.template_kwargs()?;
    let messages = req.messages;
    sloserve_api::chat::text_messages(&messages)?;
    let size = crate::prompt_bound::ChatSize::of(&messages, params.tools.as_ref());
    state.prompt_bound.check_chat(size, "messages")?;
    crate::structured::precheck(params.response_format.as_ref())?;
    let tools = params.tools.clone();
    let prompt = state
        .blocking(move |st| {
            encode_messages(
                st,
                &messages,
                tools.as_ref(),
                add_generation_prompt,
                true,
                kwargs.as_ref(),
            )
        })
        .await??;
    Ok((prompt, params))
}

pub async fn handle(a: Accepted<ChatCompletionRequest>) -> Result<Response, ServerError> {
    let (prompt, params) = prompt_and_params(&a.state, a.req).await?;
    generate(a.state, &a.headers, &a.caller, prompt, params, Kind::Chat).await
}
