//! Tool calling on the wire, as OpenAI defines it: the request's `tools`
//! (functions: name, description, parameters, strict), `tool_choice` (`none`,
//! `auto`, `required` or one named function) and `parallel_tool_calls`, declared
//! once in [`ToolFields`] and validated into [`ToolParams`]; the `tool_calls` of
//! assistant messages and responses ([`ToolCall`]) and their stream deltas
//! ([`ToolCallDelta`]).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::error::ApiError;

/// Most tools per request.
pub const MAX_TOOLS: usize = 128;
/// Longest function name, as OpenAI allows (`^[a-zA-Z0-9_-]{1,64}$`).
pub const MAX_TOOL_NAME: usize = 64;
/// Longest function description, in bytes.
pub const MAX_TOOL_DESCRIPTION: usize = 16 * 1024;
/// Largest `parameters` schema of one function, as JSON text.
pub const MAX_TOOL_PARAMETERS: usize = 64 * 1024;
/// Largest `tools` list in all, as JSON text.
pub const MAX_TOOLS_BYTES: usize = 512 * 1024;
/// Most `tool_calls` in one assistant message.
pub const MAX_MESSAGE_TOOL_CALLS: usize = 128;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The arguments' JSON schema (absent: any JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// An entry of `tools`: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Tool {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionDef,
}

fn function_type() -> String {
    "function".into()
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"`, or
/// `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    #[schema(value_type = Object)]
    Function(Value),
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(s) => Ok(ToolChoice::Mode(s)),
            v @ Value::Object(_) => Ok(ToolChoice::Function(v)),
            _ => Err(D::Error::custom(
                "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            )),
        }
    }
}

/// The tool fields of a chat request (declared here once; flattened into it).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ToolFields {
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may make several calls in one turn (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// How the model may call the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMode {
    /// The model decides; its native calls are parsed out of the text.
    Auto,
    /// At least one call, to any tool (constrained by grammar).
    Required,
    /// A call to this function (constrained by grammar).
    Named(String),
}

/// Validated tools of one request (`None` in `GenParams` without tools or with
/// `tool_choice: "none"`: nothing is rendered, nothing parsed).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolParams {
    pub tools: Vec<Tool>,
    pub mode: ToolMode,
    pub parallel: bool,
}

/// A valid function name: 1..=64 of `[a-zA-Z0-9_-]`.
pub fn valid_function_name(name: &str) -> bool {
    (1..=MAX_TOOL_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_tool(i: usize, t: &Tool) -> Result<(), ApiError> {
    let p = |f: &str| format!("tools[{i}].{f}");
    if t.kind != "function" {
        let p = p("type");
        return Err(ApiError::invalid(
            &p,
            format!("{p}: only 'function' tools are supported, got '{}'", t.kind),
        ));
    }
    let f = &t.function;
    if !valid_function_name(&f.name) {
        let p = p("function.name");
        return Err(ApiError::invalid(
            &p,
            format!(
                "{p}: must be 1 to {MAX_TOOL_NAME} letters, digits, '_' or '-', got {:?}",
                f.name.chars().take(80).collect::<String>()
            ),
        ));
    }
    if f.description
        .as_ref()
        .is_some_and(|d| d.len() > MAX_TOOL_DESCRIPTION)
    {
        let p = p("function.description");
        return Err(ApiError::invalid(
            &p,
            format!("{p}: longer than {MAX_TOOL_DESCRIPTION} bytes"),
        ));
    }
    match &f.parameters {
        None | Some(Value::Null) => {}
        Some(v @ Value::Object(_)) => {
            if v.to_string().len() > MAX_TOOL_PARAMETERS {
                let p = p("function.parameters");
                return Err(ApiError::invalid(
                    &p,
                    format!("{p}: larger than {MAX_TOOL_PARAMETERS} bytes of JSON"),
                ));
            }
        }
        Some(_) => {
            let p = p("function.parameters");
            return Err(ApiError::invalid(
                &p,
                format!("{p}: must be a JSON schema object"),
            ));
        }
    }
    Ok(())
}

/// The function a `{"type": "function", "function": {"name": ...}}` choice names.
fn named_choice(v: &Value) -> Result<String, ApiError> {
    let bad = |why: &str| ApiError::invalid("tool_choice", format!("tool_choice: {why}"));
    match v.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        _ => return Err(bad("an object choice must have \"type\": \"function\"")),
    }
    match v.get("function").and_then(|f| f.get("name")) {
        Some(Value::String(n)) => Ok(n.clone()),
        _ => Err(bad("missing function.name")),
    }
}

impl ToolFields {
    /// Checks the tools and the choice; `None` when no tool may be called.
    pub fn validate(&self) -> Result<Option<ToolParams>, ApiError> {
        let tools = self.tools.as_deref().unwrap_or(&[]);
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::invalid(
                "tools",
                format!("tools: at most {MAX_TOOLS} tools, got {}", tools.len()),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in tools.iter().enumerate() {
            check_tool(i, t)?;
            if !names.insert(t.function.name.as_str()) {
                let p = format!("tools[{i}].function.name");
                return Err(ApiError::invalid(
                    &p,
                    format!("{p}: duplicate function name '{}'", t.function.name),
                ));
            }
        }
        let size = serde_json::to_string(tools).map_or(0, |s| s.len());
        if size > MAX_TOOLS_BYTES {
            return Err(ApiError::invalid(
                "tools",
                format!("tools: larger than {MAX_TOOLS_BYTES} bytes of JSON"),
            ));
        }
        let mode = match &self.tool_choice {
            None => (!tools.is_empty()).then_some(ToolMode::Auto),
            Some(ToolChoice::Mode(m)) => match m.as_str() {
                "none" => None,
                "auto" => (!tools.is_empty()).then_some(ToolMode::Auto),
                "required" => Some(ToolMode::Required),
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "tool_choice: expected \"none\", \"auto\", \"required\" or a function object, got '{other}'"
                        ),
                    ))
                }
            },
            Some(ToolChoice::Function(v)) => {
                let name = named_choice(v)?;
                if !tools.iter().any(|t| t.function.name == name) {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("tool_choice: function '{name}' is not in tools"),
                    ));
                }
                Some(ToolMode::Named(name))
            }
        };
        if mode.is_some() && tools.is_empty() {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice: 'required' needs at least one tool in tools",
            ));
        }
        Ok(mode.map(|mode| ToolParams {
            tools: tools.to_vec(),
            mode,
            parallel: self.parallel_tool_calls.unwrap_or(true),
        }))
    }
}

/// The function of a call: its name and its arguments as a JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text (an object sent here is taken as its text).
    #[serde(deserialize_with = "arguments_text")]
    pub arguments: String,
}

fn arguments_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        v => v.to_string(),
    })
}

/// One call of an assistant message or a response: `{id, type, function}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// A call's function in a stream delta: the name once, then argument fragments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A stream delta of one call: `index` always, `id` and `type` on its first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionCallDelta,
}

/// Checks one message's `tool_calls` (assistant only) and `tool_call_id` (tool only).
pub(crate) fn check_message_tools(
    i: usize,
    role: &str,
    calls: Option<&[ToolCall]>,
    tool_call_id: Option<&str>,
) -> Result<(), ApiError> {
    if let Some(calls) = calls {
        let p = format!("messages[{i}].tool_calls");
        if role != "assistant" {
            return Err(ApiError::invalid(
                &p,
                format!("{p}: only assistant messages have tool_calls"),
            ));
        }
        if calls.len() > MAX_MESSAGE_TOOL_CALLS {
            return Err(ApiError::invalid(
                &p,
                format!("{p}: at most {MAX_MESSAGE_TOOL_CALLS} calls"),
            ));
        }
        for (j, c) in calls.iter().enumerate() {
            if c.kind != "function" {
                let p = format!("{p}[{j}].type");
                return Err(ApiError::invalid(&p, format!("{p}: must be 'function'")));
            }
            if c.function.name.is_empty() {
                let p = format!("{p}[{j}].function.name");
                return Err(ApiError::invalid(&p, format!("{p}: must not be empty")));
            }
        }
    }
    if tool_call_id.is_some() && role != "tool" {
        let p = format!("messages[{i}].tool_call_id");
        return Err(ApiError::invalid(
            &p,
            format!("{p}: only tool messages have tool_call_id"),
        ));
    }
    Ok(())
}
