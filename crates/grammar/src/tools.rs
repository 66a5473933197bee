//! Tool-call grammars in the Qwen2.5 / Hermes native format:
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, for
//! `tool_choice` `required` (any of the tools) or a named function.

use serde_json::{json, Value};

use crate::{Constraint, GrammarError};

/// One function of a request's `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFunction {
    pub name: String,
    /// The `parameters` JSON schema (`None`: any JSON object).
    pub parameters: Option<Value>,
}

/// Which calls the grammar allows.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// At least one call, to any of the tools.
    Required,
    /// Exactly the named function.
    Named(String),
}

/// The constraint that makes the output one tool call (or, with `parallel`, one or
/// more, separated by a newline) in the `<tool_call>` format. Arguments follow
/// each function's `parameters` schema.
pub fn tool_call_constraint(
    tools: &[ToolFunction],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Constraint, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Invalid(
            "tool_choice needs at least one tool".into(),
        ));
    }
    let chosen: Vec<&ToolFunction> = match choice {
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(n) => {
            let f: Vec<_> = tools.iter().filter(|t| &t.name == n).collect();
            if f.is_empty() {
                return Err(GrammarError::Invalid(format!(
                    "tool_choice names function '{n}', which is not in tools"
                )));
            }
            f
        }
    };
    let alternatives: Vec<Value> = chosen
        .iter()
        .map(|t| {
            let params = match &t.parameters {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p) => p.clone(),
            };
            let mut params = params;
            crate::formats::narrow_formats(&mut params);
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut schema = if alternatives.len() == 1 {
        alternatives.into_iter().next().unwrap_or_default()
    } else {
        json!({ "anyOf": alternatives })
    };
    if let Some(obj) = schema.as_object_mut() {
        obj.insert(
            "x-guidance".into(),
            json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}),
        );
    }
    let repeat = if parallel { "(\"\\n\" call)*" } else { "" };
    Ok(Constraint::Lark(format!(
        "start: call {repeat}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {schema}\n"
    )))
}
