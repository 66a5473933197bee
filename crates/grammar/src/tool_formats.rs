//! The Lark grammars of `required` / named tool calls in the formats other than Hermes
//! (`sloserve_model::tool_format` spells their markers and keys): Llama 3's bare
//! `{"name": ..., "parameters": {...}}`, Mistral's `[TOOL_CALLS][{...}]` and
//! `[TOOL_CALLS]name[ARGS]{...}`, Qwen3-Coder's `<tool_call>\n<function=name>\n
//! <parameter=p>\nvalue\n</parameter>\n...</function>\n</tool_call>`. Parallel calls
//! follow each other (a newline between JSON or XML calls, Mistral's array items or
//! `[TOOL_CALLS]` again). Qwen3-Coder's parameters come in the schema's order, the
//! required ones always, the others optionally; a `string` parameter's value is raw
//! text up to `\n</parameter>\n`, any other JSON as its schema says.

use serde_json::{json, Value};
use sloserve_model::tool_format::{
    ToolCallFormat, MISTRAL_ARGS, MISTRAL_CALLS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, XML_FUNCTION,
    XML_FUNCTION_CLOSE, XML_PARAMETER, XML_PARAMETER_CLOSE,
};

use crate::tools::{json_options, ToolFunction};
use sloserve_model::harmony;

/// A Lark string literal of `s`.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A marker: its control token (`<[id]>`) where the vocabulary has it as one, else its
/// text.
fn marker(m: &str, markers: &[(&str, u32)]) -> String {
    match markers.iter().find(|(t, _)| *t == m) {
        Some((_, id)) => format!("<[{id}]>"),
        None => lit(m),
    }
}

/// `schema` with llguidance's JSON options.
fn with_options(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-guidance".into(), json_options());
    }
    schema
}

/// The grammar of one or more (`parallel`) calls to `chosen` (each with its narrowed
/// `params`) in `format` (not Hermes, which `crate::tools` writes).
pub(crate) fn grammar(
    format: ToolCallFormat,
    markers: &[(&str, u32)],
    chosen: &[&ToolFunction],
    params: &[Value],
    parallel: bool,
) -> String {
    match format {
        ToolCallFormat::Hermes | ToolCallFormat::Llama3Json | ToolCallFormat::MistralArray => {
            json_calls(format, markers, chosen, params, parallel)
        }
        ToolCallFormat::MistralArgs => {
            let mut g = format!(
                "start: call{}\ncall: {} (",
                if parallel { "+" } else { "" },
                marker(MISTRAL_CALLS, markers)
            );
            let alts: Vec<String> = (0..chosen.len()).map(|i| format!("f{i}")).collect();
            g.push_str(&alts.join(" | "));
            g.push_str(")\n");
            for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
                g.push_str(&format!(
                    "f{i}: {} {} args{i}\nargs{i}: %json {}\n",
                    lit(&t.name),
                    marker(MISTRAL_ARGS, markers),
                    with_options(p.clone())
                ));
            }
            g
        }
        ToolCallFormat::Qwen3CoderXml => xml_calls(chosen, params, parallel),
        // One call: harmony's `<|call|>` ends the model's turn.
        ToolCallFormat::Harmony => {
            let alts: Vec<String> = (0..chosen.len()).map(|i| format!("f{i}")).collect();
            let mut g = format!("start: {}\n", alts.join(" | "));
            for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
                g.push_str(&format!(
                    "f{i}: {} {} {} {} {} args{i}\nargs{i}: %json {}\n",
                    marker(harmony::CHANNEL, markers),
                    lit(&format!(
                        "commentary {}{}{} ",
                        harmony::TO,
                        harmony::FUNCTIONS,
                        t.name
                    )),
                    marker(harmony::CONSTRAIN, markers),
                    lit("json"),
                    marker(harmony::MESSAGE, markers),
                    with_options(p.clone())
                ));
            }
            g
        }
    }
}

/// Calls as JSON objects `{"name": ..., <arguments key>: ...}`: bare, one a line
/// (Llama 3), or in Mistral's `[TOOL_CALLS][...]` array.
fn json_calls(
    format: ToolCallFormat,
    markers: &[(&str, u32)],
    chosen: &[&ToolFunction],
    params: &[Value],
    parallel: bool,
) -> String {
    let key = format.arguments_key();
    let alternatives: Vec<Value> = chosen
        .iter()
        .zip(params)
        .map(|(t, p)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: p},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = with_options(if alternatives.len() == 1 {
        alternatives.into_iter().next().unwrap_or_default()
    } else {
        json!({ "anyOf": alternatives })
    });
    if format == ToolCallFormat::MistralArray {
        let more = if parallel { " (\", \" call)*" } else { "" };
        format!(
            "start: {} \"[\" call{more} \"]\"\ncall: %json {schema}\n",
            marker(MISTRAL_CALLS, markers)
        )
    } else {
        let more = if parallel { " (\"\\n\" call)*" } else { "" };
        format!("start: call{more}\ncall: %json {schema}\n")
    }
}

/// Qwen3-Coder's XML calls.
fn xml_calls(chosen: &[&ToolFunction], params: &[Value], parallel: bool) -> String {
    let close = lit(&format!("\n{XML_PARAMETER_CLOSE}\n"));
    let more = if parallel { " (\"\\n\" call)*" } else { "" };
    let alts: Vec<String> = (0..chosen.len()).map(|i| format!("f{i}")).collect();
    let mut g = format!(
        "start: call{more}\ncall: {}\n\
         sval[lazy]: /(?s:.*)/ {close}\n\
         PNAME: /[a-zA-Z0-9_\\-]+/\n\
         anyparam: {} PNAME \">\\n\" sval\n",
        alts.join(" | "),
        lit(XML_PARAMETER)
    );
    let end = lit(&format!("{XML_FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"));
    for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
        let head = lit(&format!("{TOOL_CALL_OPEN}\n{XML_FUNCTION}{}>\n", t.name));
        let props = p.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = p
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(props) = props.filter(|m| !m.is_empty()) else {
            g.push_str(&format!("f{i}: {head} anyparam* {end}\n"));
            continue;
        };
        let mut body = Vec::new();
        for (j, (name, schema)) in props.iter().enumerate() {
            let open = lit(&format!("{XML_PARAMETER}{name}>\n"));
            let value = if schema.get("type").and_then(Value::as_str) == Some("string") {
                "sval".to_string()
            } else {
                g.push_str(&format!(
                    "v{i}_{j}: j{i}_{j} {close}\nj{i}_{j}: %json {}\n",
                    with_options(schema.clone())
                ));
                format!("v{i}_{j}")
            };
            let opt = if required.contains(&name.as_str()) {
                ""
            } else {
                "?"
            };
            body.push(format!("({open} {value}){opt}"));
        }
        g.push_str(&format!("f{i}: {head} {} {end}\n", body.join(" ")));
    }
    g
}
