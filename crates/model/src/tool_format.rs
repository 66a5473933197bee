//! `ToolCallFormat`: how a model writes its tool calls, spelled in this one place
//! (markers, JSON keys) and read by the server's streamed parser, the grammar of
//! `required` / named calls and `inspect`. Chosen per model from its chat template,
//! as llama.cpp's `common/chat.cpp` detects formats, else its family's default.

use crate::family::Family;
use crate::harmony;

/// A model's native tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Hermes / Qwen2.5: `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`
    /// (a bare `{"name": ..., "arguments": ...}` at the start is a call too).
    Hermes,
    /// Llama 3.1 / 3.2 / 3.3: `{"name": "f", "parameters": {...}}`, bare or after
    /// `<|python_tag|>`.
    Llama3Json,
    /// Mistral v0.3 / Nemo: `[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}]`.
    MistralArray,
    /// Mistral Small 3.2, Devstral, Ministral 3: `[TOOL_CALLS]f[ARGS]{...}` (Small 3.2
    /// puts `[CALL_ID]id` before `[ARGS]`), one `[TOOL_CALLS]` per call.
    MistralArgs,
    /// Qwen3-Coder (and Qwen3.5, Nemotron Nano 3): `<tool_call>\n<function=f>\n
    /// <parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>`, a string
    /// parameter's value raw, any other JSON.
    Qwen3CoderXml,
    /// gpt-oss's harmony: a message to the function, `<|channel|>commentary
    /// to=functions.f <|constrain|>json<|message|>{...}` ended by `<|call|>` (or the
    /// recipient in the role's header: `<|start|>assistant to=functions.f<|channel|>
    /// commentary json<|message|>{...}<|call|>`, as the template writes history); the
    /// reasoning splitter (`crate::harmony`) gives each call out in the first form.
    Harmony,
}

/// Hermes / Qwen3-Coder's block tags.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";
/// Llama 3's marker before a call (a control token).
pub const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's marker before the calls (a control token).
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
/// Mistral's marker between a function's name and its arguments.
pub const MISTRAL_ARGS: &str = "[ARGS]";
/// Mistral Small 3.2's marker before a call's id.
pub const MISTRAL_CALL_ID: &str = "[CALL_ID]";
/// What opens a harmony call as the splitter gives it out (`crate::harmony::call_open`).
pub const HARMONY_CALL_OPEN: &str = "<|channel|>commentary to=functions.";
/// Qwen3-Coder's function and parameter tags.
pub const XML_FUNCTION: &str = "<function=";
pub const XML_FUNCTION_CLOSE: &str = "</function>";
pub const XML_PARAMETER: &str = "<parameter=";
pub const XML_PARAMETER_CLOSE: &str = "</parameter>";

/// Every format, for tests and tables.
pub const ALL: [ToolCallFormat; 6] = [
    ToolCallFormat::Hermes,
    ToolCallFormat::Llama3Json,
    ToolCallFormat::MistralArray,
    ToolCallFormat::MistralArgs,
    ToolCallFormat::Qwen3CoderXml,
    ToolCallFormat::Harmony,
];

impl ToolCallFormat {
    /// The format a chat template's source shows, if it shows one (llama.cpp's
    /// checks, most specific first).
    pub fn detect(template: &str) -> Option<Self> {
        let has = |s: &str| template.contains(s);
        if has(harmony::CHANNEL) && has(harmony::FUNCTIONS) {
            Some(ToolCallFormat::Harmony)
        } else if has(MISTRAL_CALLS) && has(MISTRAL_ARGS) {
            Some(ToolCallFormat::MistralArgs)
        } else if has(MISTRAL_CALLS) {
            Some(ToolCallFormat::MistralArray)
        } else if has(TOOL_CALL_OPEN) && has(XML_FUNCTION) && has(XML_PARAMETER) {
            Some(ToolCallFormat::Qwen3CoderXml)
        } else if has(TOOL_CALL_OPEN) {
            Some(ToolCallFormat::Hermes)
        } else if has("<|start_header_id|>") && has("ipython") && has("\"parameters\"") {
            Some(ToolCallFormat::Llama3Json)
        } else {
            None
        }
    }

    /// The format of a model: its template's, else its family's (a template that shows
    /// none gets the Hermes preamble of `crate::chat_tools`, so Hermes without a family).
    pub fn for_model(family: Option<&Family>, template: Option<&str>) -> Self {
        template
            .and_then(Self::detect)
            .or_else(|| family.map(|f| f.tool_format))
            .unwrap_or(ToolCallFormat::Hermes)
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes (<tool_call>{json}</tool_call>)",
            ToolCallFormat::Llama3Json => "llama3 ({\"name\", \"parameters\"}, <|python_tag|>)",
            ToolCallFormat::MistralArray => "mistral ([TOOL_CALLS][{json}, ...])",
            ToolCallFormat::MistralArgs => "mistral ([TOOL_CALLS]name[ARGS]{json})",
            ToolCallFormat::Qwen3CoderXml => {
                "qwen3-coder (<tool_call><function=name><parameter=p>)"
            }
            ToolCallFormat::Harmony => "harmony (<|channel|>commentary to=functions.name)",
        }
    }

    /// What opens a call (Hermes, Qwen3-Coder, Mistral) or may (Llama 3's
    /// `<|python_tag|>`).
    pub fn open(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3CoderXml => TOOL_CALL_OPEN,
            ToolCallFormat::Llama3Json => PYTHON_TAG,
            ToolCallFormat::MistralArray | ToolCallFormat::MistralArgs => MISTRAL_CALLS,
            ToolCallFormat::Harmony => HARMONY_CALL_OPEN,
        }
    }

    /// What closes a call; `None` where the end of its JSON does.
    pub fn close(self) -> Option<&'static str> {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3CoderXml => Some(TOOL_CALL_CLOSE),
            ToolCallFormat::Harmony => Some(harmony::CALL),
            _ => None,
        }
    }

    /// The JSON key of a call's arguments where the call is a JSON object.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolCallFormat::Llama3Json => "parameters",
            _ => "arguments",
        }
    }

    /// Whether a call may come without its opening marker: a bare JSON call at the
    /// start of the output or after a call (small Hermes models leave the tags out;
    /// Llama 3's `<|python_tag|>` is optional; a Mistral array whose control token the
    /// detokenizer dropped).
    pub fn bare_calls(self) -> bool {
        matches!(
            self,
            ToolCallFormat::Hermes | ToolCallFormat::Llama3Json | ToolCallFormat::MistralArray
        )
    }

    /// The markers that are control tokens in the model's vocabulary (Llama 3's
    /// `<|python_tag|>`, Mistral's): decoded into the answer's text where other control
    /// tokens are dropped, so the parser sees them (llama.cpp's preserved tokens).
    /// Hermes's tags are plain added tokens, decoded anyway.
    pub fn rendered_markers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3CoderXml => &[],
            ToolCallFormat::Llama3Json => &[PYTHON_TAG],
            ToolCallFormat::MistralArray => &[MISTRAL_CALLS],
            ToolCallFormat::MistralArgs => &[MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID],
            // User-defined in o200k_harmony (decoded anyway): named for the grammar.
            ToolCallFormat::Harmony => &[harmony::CHANNEL, harmony::CONSTRAIN, harmony::MESSAGE],
        }
    }

    /// One call as the model writes it (the grammar's form; arguments a JSON object's
    /// text). For tests, documentation and templates that lack the format.
    pub fn write_call(self, name: &str, arguments: &serde_json::Value) -> String {
        let key = self.arguments_key();
        match self {
            ToolCallFormat::Hermes => format!(
                "{TOOL_CALL_OPEN}\n{}\n{TOOL_CALL_CLOSE}",
                crate::chat_tools::python_json(
                    &serde_json::json!({"name": name, key: arguments}),
                    None
                )
            ),
            ToolCallFormat::Llama3Json => crate::chat_tools::python_json(
                &serde_json::json!({"name": name, key: arguments}),
                None,
            ),
            ToolCallFormat::MistralArray => format!(
                "{MISTRAL_CALLS}[{}]",
                crate::chat_tools::python_json(
                    &serde_json::json!({"name": name, key: arguments}),
                    None
                )
            ),
            ToolCallFormat::MistralArgs => format!(
                "{MISTRAL_CALLS}{name}{MISTRAL_ARGS}{}",
                crate::chat_tools::python_json(arguments, None)
            ),
            ToolCallFormat::Qwen3CoderXml => {
                let mut s = format!("{TOOL_CALL_OPEN}\n{XML_FUNCTION}{name}>\n");
                if let Some(obj) = arguments.as_object() {
                    for (k, v) in obj {
                        let v = match v {
                            serde_json::Value::String(s) => s.clone(),
                            v => crate::chat_tools::python_json(v, None),
                        };
                        s.push_str(&format!(
                            "{XML_PARAMETER}{k}>\n{v}\n{XML_PARAMETER_CLOSE}\n"
                        ));
                    }
                }
                s.push_str(&format!("{XML_FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"));
                s
            }
            ToolCallFormat::Harmony => {
                format!(
                    "{}{}",
                    harmony::call_open(name),
                    crate::chat_tools::python_json(arguments, None)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_order_and_defaults() {
        assert_eq!(
            ToolCallFormat::detect("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}"),
            Some(ToolCallFormat::MistralArgs)
        );
        assert_eq!(
            ToolCallFormat::detect("{{ '[TOOL_CALLS][' }}"),
            Some(ToolCallFormat::MistralArray)
        );
        assert_eq!(
            ToolCallFormat::detect("<tool_call>\n<function=x>\n<parameter=y>"),
            Some(ToolCallFormat::Qwen3CoderXml)
        );
        assert_eq!(
            ToolCallFormat::detect("<tool_call>"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(ToolCallFormat::detect("{{ messages }}"), None);
        assert_eq!(
            ToolCallFormat::for_model(None, Some("{{ messages }}")),
            ToolCallFormat::Hermes
        );
        assert_eq!(
            ToolCallFormat::for_model(crate::family::family("llama"), None),
            ToolCallFormat::Hermes
        );
    }

    #[test]
    fn written_calls() {
        let args = serde_json::json!({"city": "Paris", "days": 2});
        let w = |f: ToolCallFormat| f.write_call("get_weather", &args);
        assert_eq!(
            w(ToolCallFormat::Hermes),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"
        );
        assert_eq!(
            w(ToolCallFormat::Llama3Json),
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}"
        );
        assert_eq!(
            w(ToolCallFormat::MistralArgs),
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 2}"
        );
        assert_eq!(
            w(ToolCallFormat::Qwen3CoderXml),
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
        );
    }
}
