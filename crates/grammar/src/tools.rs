//! Tool-call grammars in the model's own format (`sloserve_model::tool_format`, which
//! spells the markers and keys; `crate::tool_formats` writes each format's calls), for
//! `tool_choice` `required` (any of the tools), a named function, or `auto` with strict
//! functions (free text, or text then calls whose arguments are constrained; every
//! format but harmony's).

use serde_json::{json, Value};
use sloserve_model::tool_format::ToolCallFormat;

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
    /// Free text with no opening marker (`<tool_call>`, ...) in it, or text followed
    /// by calls to any of the tools (the model chooses; the calls it makes are
    /// constrained).
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

/// [`tool_call_constraint`] in `format`: the calls as the model writes them (`auto`
/// in harmony is an error: `ToolCallFormat::constrains_auto`). `markers`: the
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
    Ok(Constraint::Lark(match choice {
        ToolChoice::Auto if !format.constrains_auto() => {
            return Err(GrammarError::Invalid(format!(
                "tool_choice auto with strict functions is not constrained in {}",
                format.name()
            )))
        }
        ToolChoice::Auto => auto_grammar(format, markers, &chosen, &params, parallel),
        _ => crate::tool_formats::grammar(format, markers, &chosen, &params, parallel),
    }))
}

/// Escapes the regex syntax characters of a marker's text.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `auto`, in any format but harmony's: a reply is text, or text then calls. A call
/// opens with the format's marker (`ToolCallFormat::open`) and what follows it is
/// constrained (`crate::tool_formats::after_open`: the call, or a section of them);
/// where the format takes bare calls (`ToolCallFormat::bare_calls`: Hermes, Llama 3,
/// Mistral's array), a call may also come bare at the start of the reply,
/// `{"name": "f", "arguments": ` for a function `f` (Llama 3: `"parameters"`; Mistral:
/// in `[...]`), as the server's parser reads it (small models often leave the markers
/// out).
///
/// llguidance's lexer ends a lexeme only where no other can go on (no look-back),
/// so text and a call must part at one byte: TEXT holds no opening marker's text and
/// does not begin with a bare call's head, which is one literal lexeme, so that TEXT
/// dies on the byte that completes it; `pre` (text up to the marker) is one lexeme for
/// the same reason (a marker that is a control token is its own token, which text never
/// holds). JSON that names no function stays text. After a call the text is free but
/// for the marker (the parser takes it as content, or a further bare call,
/// unconstrained); with `parallel` the marker there opens another constrained call.
fn auto_grammar(
    format: ToolCallFormat,
    markers: &[(&str, u32)],
    chosen: &[&ToolFunction],
    params: &[Value],
    parallel: bool,
) -> String {
    use crate::tool_formats::{after_open, lit, marker, marker_token, with_options};
    let open_text = format.open();
    let open = marker(open_text, markers);
    // A control token is no lexeme: the rule before it is no lexeme either.
    let lazy = if marker_token(open_text, markers).is_some() {
        ""
    } else {
        "[lazy]"
    };
    let no_open = format!("~/(?s:.*{}.*)/", regex_escape(open_text));
    let more = if parallel { " | next rest tail" } else { "" };
    let mut g = format!(
        "TAIL: /(?s:.+)/ & {no_open}\n\
         pre{lazy}: TEXT? {open}\n\
         next{lazy}: TAIL? {open}\n\
         tail: (TAIL{more})?\n{}",
        after_open(format, markers, chosen, params, parallel)
    );
    if !format.bare_calls() {
        g.push_str(&format!(
            "start: TEXT? | pre rest tail\nTEXT: /(?s:.+)/ & {no_open}\n"
        ));
        return g;
    }
    // Mistral's bare calls are an array (more items with `parallel`: `after_open`'s
    // `item`).
    let (lead, end) = match format {
        ToolCallFormat::MistralArray if parallel => ("[", "(\", \" item)* \"]\""),
        ToolCallFormat::MistralArray => ("[", "\"]\""),
        _ => ("", ""),
    };
    let key = format.arguments_key();
    let mut bare = Vec::new();
    for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
        // Names are `[a-zA-Z0-9_-]` (checked at the API): literal in Lark and regex.
        bare.push(format!(
            "{} bargs{i} \"}}\" {end}",
            lit(&format!("{lead}{{\"name\": \"{}\", \"{key}\": ", t.name))
        ));
        g.push_str(&format!("bargs{i}: %json {}\n", with_options(p.clone())));
    }
    let names: Vec<&str> = chosen.iter().map(|t| t.name.as_str()).collect();
    let head = format!(
        "{}\\{{\"name\": \"({})\", \"{key}\": (?s:.*)",
        regex_escape(lead),
        names.join("|").replace('-', "\\-")
    );
    g.push_str(&format!(
        "start: TEXT? | pre rest tail | bare tail\n\
         TEXT: /(?s:.+)/ & {no_open} & ~/{head}/\n\
         bare: {}\n",
        bare.join(" | ")
    ));
    g
}

/// How call JSON is written: the separators models are trained on, no free
/// whitespace (llguidance's `x-guidance` options).
pub(crate) fn json_options() -> Value {
    json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false})
}
