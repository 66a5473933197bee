//! The Lark rules of tool calls in each model format (`sloserve_model::tool_format`
//! spells their markers and keys). [`after_open`] is what follows a format's opening
//! marker (`ToolCallFormat::open`): one call (Hermes, Qwen3-Coder, Llama 3 after
//! `<|python_tag|>`, Mistral's `name[ARGS]{...}`), or the calls of a section (Mistral's
//! `[...]` array, Phi-4-mini's after `functools[`, DeepSeek-R1's up to
//! `<｜tool▁calls▁end｜>`); the `required` / named grammars here and `auto`'s
//! (`crate::tools`) are built on it. Parallel calls follow each other (a newline between
//! JSON or XML calls and R1's, array items, or `[TOOL_CALLS]` again). Qwen3-Coder's
//! parameters come in the schema's order, the required ones always, the others
//! optionally; a `string` parameter's value is raw text up to `\n</parameter>\n`, any
//! other JSON as its schema says.

use serde_json::{json, Value};
use sloserve_model::tool_format::{
    ToolCallFormat, MISTRAL_ARGS, R1_CALLS_END, R1_CALL_BEGIN, R1_CALL_END, R1_FENCE_CLOSE,
    R1_FENCE_OPEN, R1_SEP, R1_TYPE, TOOL_CALL_CLOSE, XML_FUNCTION, XML_FUNCTION_CLOSE,
    XML_PARAMETER, XML_PARAMETER_CLOSE,
};

use crate::tools::{json_options, ToolFunction};
use sloserve_model::harmony;

/// A Lark string literal of `s`.
pub(crate) fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The id of `m` where the vocabulary has it as a control token.
pub(crate) fn marker_token(m: &str, markers: &[(&str, u32)]) -> Option<u32> {
    markers.iter().find(|(t, _)| *t == m).map(|&(_, id)| id)
}

/// A marker: its control token (`<[id]>`) where the vocabulary has it as one, else its
/// text.
pub(crate) fn marker(m: &str, markers: &[(&str, u32)]) -> String {
    match marker_token(m, markers) {
        Some(id) => format!("<[{id}]>"),
        None => lit(m),
    }
}

/// `schema` with llguidance's JSON options.
pub(crate) fn with_options(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-guidance".into(), json_options());
    }
    schema
}

/// The JSON schema of one call object `{"name": ..., <arguments key>: ...}` to any of
/// `chosen` (each with its narrowed `params`).
pub(crate) fn call_schema(
    format: ToolCallFormat,
    chosen: &[&ToolFunction],
    params: &[Value],
) -> Value {
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
    with_options(if alternatives.len() == 1 {
        alternatives.into_iter().next().unwrap_or_default()
    } else {
        json!({ "anyOf": alternatives })
    })
}

/// Rules defining `rest`: what follows `format`'s opening marker. Section formats hold
/// one call, or with `parallel` one or more; the others one call. Not harmony (whose
/// forced call [`grammar`] writes whole).
pub(crate) fn after_open(
    format: ToolCallFormat,
    markers: &[(&str, u32)],
    chosen: &[&ToolFunction],
    params: &[Value],
    parallel: bool,
) -> String {
    let alts = |p: &str| -> String {
        (0..chosen.len())
            .map(|i| format!("{p}{i}"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    // A rule `rule` of call objects separated by `sep` (one without `parallel`), then
    // `close`.
    let items = |rule: &str, sep: &str, close: &str| {
        let more = if parallel {
            format!(" ({} item)*", lit(sep))
        } else {
            String::new()
        };
        format!(
            "{rule}: item{more} {}\nitem: %json {}\n",
            lit(close),
            call_schema(format, chosen, params)
        )
    };
    match format {
        ToolCallFormat::Hermes => format!(
            "rest: \"\\n\" body {}\nbody: %json {}\n",
            lit(&format!("\n{TOOL_CALL_CLOSE}")),
            call_schema(format, chosen, params)
        ),
        ToolCallFormat::Llama3Json => {
            format!("rest: %json {}\n", call_schema(format, chosen, params))
        }
        ToolCallFormat::MistralArray => format!("rest: \"[\" arr\n{}", items("arr", ", ", "]")),
        // The marker holds the array's `[`.
        ToolCallFormat::Phi4MiniJson => items("rest", ", ", "]"),
        ToolCallFormat::MistralArgs => {
            let mut g = format!("rest: {}\n", alts("f"));
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
        ToolCallFormat::Qwen3CoderXml => xml_calls(chosen, params),
        ToolCallFormat::DeepSeekR1 => {
            let more = if parallel { " (\"\\n\" rc)*" } else { "" };
            let mut g = format!(
                "rest: rc{more} {}\nrc: {}\n",
                marker(R1_CALLS_END, markers),
                alts("r")
            );
            for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
                g.push_str(&format!(
                    "r{i}: {} {} {} {} args{i} {} {}\nargs{i}: %json {}\n",
                    marker(R1_CALL_BEGIN, markers),
                    lit(R1_TYPE),
                    marker(R1_SEP, markers),
                    lit(&format!("{}\n{R1_FENCE_OPEN}", t.name)),
                    lit(R1_FENCE_CLOSE),
                    marker(R1_CALL_END, markers),
                    with_options(p.clone())
                ));
            }
            g
        }
        ToolCallFormat::Harmony => String::new(),
    }
}

/// The grammar of one or more (`parallel`) calls to `chosen` (each with its narrowed
/// `params`) in `format`.
pub(crate) fn grammar(
    format: ToolCallFormat,
    markers: &[(&str, u32)],
    chosen: &[&ToolFunction],
    params: &[Value],
    parallel: bool,
) -> String {
    let open = marker(format.open(), markers);
    let rest = || after_open(format, markers, chosen, params, parallel);
    match format {
        // Llama 3's calls bare (its `<|python_tag|>` is optional), one a line.
        ToolCallFormat::Llama3Json => {
            let more = if parallel { " (\"\\n\" call)*" } else { "" };
            format!(
                "start: call{more}\ncall: %json {}\n",
                call_schema(format, chosen, params)
            )
        }
        // A section: its marker once.
        ToolCallFormat::MistralArray
        | ToolCallFormat::Phi4MiniJson
        | ToolCallFormat::DeepSeekR1 => {
            format!("start: {open} rest\n{}", rest())
        }
        ToolCallFormat::MistralArgs => format!(
            "start: call{}\ncall: {open} rest\n{}",
            if parallel { "+" } else { "" },
            rest()
        ),
        ToolCallFormat::Hermes | ToolCallFormat::Qwen3CoderXml => format!(
            "start: call{}\ncall: {open} rest\n{}",
            if parallel { " (\"\\n\" call)*" } else { "" },
            rest()
        ),
        // One call: harmony's `<|call|>` ends the model's turn.
        ToolCallFormat::Harmony => {
            let mut g = format!(
                "start: {}\n",
                (0..chosen.len())
                    .map(|i| format!("f{i}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
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

/// Qwen3-Coder's XML calls after `<tool_call>`.
fn xml_calls(chosen: &[&ToolFunction], params: &[Value]) -> String {
    let close = lit(&format!("\n{XML_PARAMETER_CLOSE}\n"));
    let alts: Vec<String> = (0..chosen.len()).map(|i| format!("x{i}")).collect();
    let mut g = format!(
        "rest: {}\n\
         sval[lazy]: /(?s:.*)/ {close}\n\
         PNAME: /[a-zA-Z0-9_\\-]+/\n\
         anyparam: {} PNAME \">\\n\" sval\n",
        alts.join(" | "),
        lit(XML_PARAMETER)
    );
    let end = lit(&format!("{XML_FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"));
    for (i, (t, p)) in chosen.iter().zip(params).enumerate() {
        let head = lit(&format!("\n{XML_FUNCTION}{}>\n", t.name));
        let props = p.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = p
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(props) = props.filter(|m| !m.is_empty()) else {
            g.push_str(&format!("x{i}: {head} anyparam* {end}\n"));
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
        g.push_str(&format!("x{i}: {head} {} {end}\n", body.join(" ")));
    }
    g
}
