//! What follows a tool call's opening marker, read in the model's own format
//! (`sloserve_model::tool_format`): a Hermes JSON block, a Qwen3-Coder XML block, Llama 3's
//! JSON object after `<|python_tag|>`, Mistral's array or `name[ARGS]{...}` after
//! `[TOOL_CALLS]`, harmony's message to a function as the reasoning splitter gives it
//! out, DeepSeek-R1's calls up to `<｜tool▁calls▁end｜>`, Phi-4-mini's array after
//! `functools[`. Each reader says whether the calls are complete, need more text, or
//! are not calls (then the text stays content). The streamed state machine is
//! `crate::tool_parser`.

use serde_json::{Map, Value};
use sloserve_model::harmony;
use sloserve_model::tool_format::{
    ToolCallFormat, MISTRAL_ARGS, MISTRAL_CALL_ID, R1_CALL_BEGIN, R1_CALL_END, R1_SEP, R1_TYPE,
    XML_FUNCTION, XML_FUNCTION_CLOSE, XML_PARAMETER, XML_PARAMETER_CLOSE,
};

/// The longest call held back before it is taken as text.
pub(crate) const MAX_CALL: usize = 64 * 1024;
/// The longest function name Mistral's `name[ARGS]` form is waited for.
const MAX_NAME: usize = 256;

/// A complete call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What a parser needs of a request: the model's format, its functions' names (a bare
/// call must name one), and which parameters are strings (Qwen3-Coder writes their
/// values raw, the others as JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Functions {
    pub format: ToolCallFormat,
    pub names: Vec<String>,
    /// `(function, parameter)` whose schema's type is `string`.
    pub string_params: Vec<(String, String)>,
}

impl From<Vec<String>> for Functions {
    /// Hermes calls to `names`.
    fn from(names: Vec<String>) -> Self {
        Functions {
            format: ToolCallFormat::Hermes,
            names,
            string_params: Vec::new(),
        }
    }
}

/// What the text after an opening marker holds.
#[derive(Debug, PartialEq)]
pub(crate) enum Body {
    /// Calls, and the bytes they took (through the closing marker).
    Calls(Vec<ParsedCall>, usize),
    /// Not complete yet.
    More,
    /// Not calls: the marker and the first `n` bytes are content, verbatim (a closed
    /// block whole; nothing more for a format without a closing marker).
    Bad(usize),
}

/// Reads the calls at the start of `text` (just after the opening marker).
pub(crate) fn read_block(f: &Functions, text: &str) -> Body {
    if let Some(close) = f.format.close() {
        let Some(j) = text.find(close) else {
            return Body::More;
        };
        let body = &text[..j];
        let calls = match f.format {
            ToolCallFormat::Qwen3CoderXml => xml_call(body, &f.string_params).map(|c| vec![c]),
            ToolCallFormat::Harmony => harmony_call(body).map(|c| vec![c]),
            ToolCallFormat::DeepSeekR1 => r1_calls(body),
            _ => parse_call(body, f.format).map(|c| vec![c]),
        };
        return match calls {
            Some(c) => Body::Calls(c, j + close.len()),
            None => Body::Bad(j + close.len()),
        };
    }
    match f.format {
        ToolCallFormat::MistralArgs => mistral_args(text),
        // The marker holds the array's `[`: read from it.
        ToolCallFormat::Phi4MiniJson => match json_prefix(&format!("[{text}")) {
            Json::Value(v, end) => match calls_of(f.format, v) {
                Some(calls) => Body::Calls(calls, end - 1),
                None => Body::Bad(0),
            },
            Json::More => Body::More,
            Json::Bad => Body::Bad(0),
        },
        format => match json_prefix(text) {
            Json::Value(v, end) => match calls_of(format, v) {
                Some(calls) => Body::Calls(calls, end),
                None => Body::Bad(0),
            },
            Json::More => Body::More,
            Json::Bad => Body::Bad(0),
        },
    }
}

/// A JSON value at the start of a text (after whitespace).
pub(crate) enum Json {
    Value(Value, usize),
    More,
    Bad,
}

pub(crate) fn json_prefix(text: &str) -> Json {
    let start = text.len() - text.trim_start().len();
    if start == text.len() {
        return Json::More;
    }
    let mut it = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Json::Value(v, start + it.byte_offset()),
        Some(Err(e)) if e.is_eof() && text.len() <= MAX_CALL => Json::More,
        None => Json::More,
        _ => Json::Bad,
    }
}

/// The calls a JSON value is in `format`: one object, or Mistral's array of them.
pub(crate) fn calls_of(format: ToolCallFormat, v: Value) -> Option<Vec<ParsedCall>> {
    match (format, v) {
        (ToolCallFormat::MistralArray | ToolCallFormat::Phi4MiniJson, Value::Array(items))
            if !items.is_empty() =>
        {
            items
                .into_iter()
                .map(|i| call_of(format, &i))
                .collect::<Option<Vec<_>>>()
        }
        (ToolCallFormat::MistralArray | ToolCallFormat::Phi4MiniJson, _) => None,
        (_, v) => Some(vec![call_of(format, &v)?]),
    }
}

/// The call a block's JSON body holds, if it is one: `name` and the format's arguments
/// key (`arguments` or `parameters`; the other one is read too).
pub fn parse_call(body: &str, format: ToolCallFormat) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    call_of(format, &v)
}

fn call_of(format: ToolCallFormat, v: &Value) -> Option<ParsedCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let (key, other) = match format.arguments_key() {
        "parameters" => ("parameters", "arguments"),
        _ => ("arguments", "parameters"),
    };
    let arguments = match obj.get(key).or_else(|| obj.get(other)) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Mistral's `name[ARGS]{...}` (or `name[CALL_ID]id[ARGS]{...}`).
fn mistral_args(text: &str) -> Body {
    let Some(a) = text.find(MISTRAL_ARGS) else {
        // Wait while the text can still be a name, `[CALL_ID]` and an id, `[ARGS]`.
        let could_be = text.len() <= MAX_NAME
            && text
                .trim_start()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.[]".contains(&b));
        return if could_be { Body::More } else { Body::Bad(0) };
    };
    let head = text[..a].trim();
    let name = head.split(MISTRAL_CALL_ID).next().unwrap_or("").trim();
    if !valid_name(name) {
        return Body::Bad(0);
    }
    let rest = &text[a + MISTRAL_ARGS.len()..];
    match json_prefix(rest) {
        Json::Value(v @ Value::Object(_), end) => Body::Calls(
            vec![ParsedCall {
                name: name.to_string(),
                arguments: v.to_string(),
            }],
            a + MISTRAL_ARGS.len() + end,
        ),
        Json::More => Body::More,
        _ => Body::Bad(0),
    }
}

/// A harmony call's `NAME <|constrain|>json<|message|>ARGS` (after the opening
/// `<|channel|>commentary to=functions.`): its arguments a JSON object.
fn harmony_call(body: &str) -> Option<ParsedCall> {
    let (head, args) = body.split_once(harmony::MESSAGE)?;
    let name = head.split(|c: char| c.is_whitespace() || c == '<').next()?;
    if !valid_name(name) {
        return None;
    }
    let args: Value = serde_json::from_str(args.trim()).ok()?;
    args.is_object().then(|| ParsedCall {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// DeepSeek-R1's calls (between its calls' markers): each
/// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`,
/// whitespace between them; the fence is optional, as llama.cpp reads it (its tests also
/// give V3.1's `NAME<｜tool▁sep｜>{...}`, read too). Arguments must be a JSON object.
fn r1_calls(body: &str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = body;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return (!calls.is_empty()).then_some(calls);
        }
        let after = rest.strip_prefix(R1_CALL_BEGIN)?;
        let end = after.find(R1_CALL_END)?;
        let (kind, call) = after[..end].split_once(R1_SEP)?;
        let (name, args) = match kind.trim() {
            R1_TYPE => call.split_once('\n')?,
            name => (name, call),
        };
        let name = name.trim();
        let args = args.trim();
        let args = args
            .strip_prefix("```json")
            .or_else(|| args.strip_prefix("```"))
            .unwrap_or(args);
        let args = args.trim_end();
        let args = args.strip_suffix("```").unwrap_or(args);
        let v: Value = serde_json::from_str(args.trim()).ok()?;
        if !valid_name(name) || !v.is_object() {
            return None;
        }
        calls.push(ParsedCall {
            name: name.to_string(),
            arguments: v.to_string(),
        });
        rest = &after[end + R1_CALL_END.len()..];
    }
}

/// Qwen3-Coder's `<function=NAME>` with `<parameter=P>\nvalue\n</parameter>` each.
fn xml_call(body: &str, string_params: &[(String, String)]) -> Option<ParsedCall> {
    let rest = body.trim().strip_prefix(XML_FUNCTION)?;
    let (name, rest) = rest.split_once('>')?;
    if !valid_name(name) {
        return None;
    }
    let mut rest = rest.trim_end().strip_suffix(XML_FUNCTION_CLOSE)?;
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (param, after) = rest.strip_prefix(XML_PARAMETER)?.split_once('>')?;
        let end = after.find(XML_PARAMETER_CLOSE)?;
        let raw = &after[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let is_string = string_params.iter().any(|(f, p)| f == name && p == param);
        let value = if is_string {
            Value::String(raw.to_string())
        } else {
            serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
        };
        args.insert(param.to_string(), value);
        rest = &after[end + XML_PARAMETER_CLOSE.len()..];
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}
