//! Tool-call grammars in the model's own format (`sloserve_model::tool_format`, which
//! spells the markers and keys): Hermes / Qwen2.5
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, for `tool_choice`
//! `required` (any of the tools), a named function, or `auto` with strict functions
//! (free text, or text then calls whose arguments are constrained); Llama 3's JSON,
//! Mistral's `[TOOL_CALLS]` forms and Qwen3-Coder's XML for `required` and named calls
//! (`crate::tool_formats`; their `auto` is not constrained).

use serde_json::{json, Value};
use sloserve_model::tool_format::{ToolCallFormat, TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

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
    /// Free text with no `<tool_call>` in it, or text followed by calls to any of
    /// the tools (the model chooses; the calls it makes are constrained).
    Auto,
}

/// The constraint that makes the output one tool call (or, with `parallel`, one or
/// more, separated by a newline) in the `<tool_call>` format, or for
/// [`ToolChoice::Auto`] free text or text followed by such calls. Arguments follow
/// each function's `parameters` schema (`None`: any JSON object).
pub fn tool_call_constraint(
    tools: &[ToolFunction],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Constraint, GrammarError> {
    tool_call_constraint_in(ToolCallFormat::Hermes, &[], tools, choice, parallel)
}

/// [`tool_call_constraint`] in `format`: the calls as the model writes them. `auto`
/// is constrained in the Hermes form only (an error in the others). `markers`: the
/// format's markers that are control tokens of the vocabulary, with their ids (the
/// grammar then asks for the token, as the model writes it, not the marker's text).
pub fn tool_call_constraint_in(
    format: ToolCallFormat,
    markers: &[(&str, u32)],
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
        ToolChoice::Required | ToolChoice::Auto => tools.iter().collect(),
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
    let params: Vec<Value> = chosen
        .iter()
        .map(|t| {
            let mut p = match &t.parameters {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p) => p.clone(),
            };
            crate::formats::narrow_formats(&mut p);
            p
        })
        .collect();
    if format != ToolCallFormat::Hermes {
        if *choice == ToolChoice::Auto {
            return Err(GrammarError::Invalid(format!(
                "tool_choice auto with strict functions is constrained in the Hermes format only, not {}",
                format.name()
            )));
        }
        return Ok(Constraint::Lark(crate::tool_formats::grammar(
            format, markers, &chosen, &params, parallel,
        )));
    }
    let alternatives: Vec<Value> = chosen
        .iter()
        .zip(&params)
        .map(|(t, p)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": p},
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
        obj.insert("x-guidance".into(), json_options());
    }
    let repeat = if parallel { "(\"\\n\" call)*" } else { "" };
    Ok(Constraint::Lark(match choice {
        ToolChoice::Auto => auto_grammar(&chosen, &params, &schema, parallel),
        _ => format!(
            "start: call {repeat}\n\
             call: \"{TOOL_CALL_OPEN}\\n\" body \"\\n{TOOL_CALL_CLOSE}\"\n\
             body: %json {schema}\n"
        ),
    }))
}

/// `auto`: a reply is text, or calls then text. A call is tagged
/// (`<tool_call>\n{json}\n</tool_call>`, the body one of `body`'s objects) or, at
/// the start of the reply, bare: `{"name": "<function>", "arguments": {...}}`, as
/// the server's parser reads it (small models often leave the tags out).
///
/// llguidance's lexer ends a lexeme only where no other can go on (no look-back),
/// so text and a call must part at one byte: TEXT holds no `<tool_call>` and does
/// not begin with a bare call's head (`{"name": "f", "arguments": ` for a function
/// `f`), which is one literal lexeme, so that TEXT dies on the byte that completes
/// it; `pre` (text up to a tag) is one lexeme for the same reason. JSON that names
/// no function stays text. After a call the text is free but for tags (the parser
/// takes it as content, or a further bare call, unconstrained); with `parallel` a
/// tag there opens another constrained call.
fn auto_grammar(
    chosen: &[&ToolFunction],
    params: &[Value],
    body: &Value,
    parallel: bool,
) -> String {
    let mut bare = Vec::new();
    let mut args = String::new();
    for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
        let mut p = p.clone();
        if let Some(obj) = p.as_object_mut() {
            obj.insert("x-guidance".into(), json_options());
        }
        // Names are `[a-zA-Z0-9_-]` (checked at the API): literal in Lark and regex.
        bare.push(format!(
            "\"{{\\\"name\\\": \\\"{}\\\", \\\"arguments\\\": \" args{i} \"}}\"",
            t.name
        ));
        args.push_str(&format!("args{i}: %json {p}\n"));
    }
    let names: Vec<&str> = chosen.iter().map(|t| t.name.as_str()).collect();
    let head = format!(
        "\\{{\"name\": \"({})\", \"arguments\": (?s:.*)",
        names.join("|").replace('-', "\\-")
    );
    let more = if parallel { " | next rest tail" } else { "" };
    format!(
        "start: TEXT? | pre rest tail | bare tail\n\
         TEXT: /(?s:.+)/ & ~/(?s:.*{TOOL_CALL_OPEN}.*)/ & ~/{head}/\n\
         TAIL: /(?s:.+)/ & ~/(?s:.*{TOOL_CALL_OPEN}.*)/\n\
         pre[lazy]: TEXT? \"{TOOL_CALL_OPEN}\\n\"\n\
         next[lazy]: TAIL? \"{TOOL_CALL_OPEN}\\n\"\n\
         rest: body \"\\n{TOOL_CALL_CLOSE}\"\n\
         bare: {}\n\
         tail: (TAIL{more})?\n\
         body: %json {body}\n{args}",
        bare.join(" | ")
    )
}

/// How call JSON is written: the separators models are trained on, no free
/// whitespace (llguidance's `x-guidance` options).
pub(crate) fn json_options() -> Value {
    json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false})
}
