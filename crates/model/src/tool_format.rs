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
    /// DeepSeek-R1 (and its distills): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
    /// <｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>` (more calls each after a
    /// newline) `<｜tool▁calls▁end｜>`, as llama.cpp's `common/chat-diff-analyzer.cpp`
    /// reads it.
    DeepSeekR1,
    /// Phi-4-mini: `functools[{"name": "f", "arguments": {...}}, ...]`, as vLLM's
    /// `phi4_mini_json` parser reads it (the vendored llama.cpp has none).
    Phi4MiniJson,
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
/// DeepSeek-R1's markers (added tokens of its vocabulary, fullwidth bars and `▁`).
pub const R1_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub const R1_CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub const R1_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub const R1_CALL_END: &str = "<｜tool▁call▁end｜>";
pub const R1_SEP: &str = "<｜tool▁sep｜>";
/// What R1 writes between `<｜tool▁sep｜>` and the arguments: the call's type, then
/// after the name the fence that the arguments sit in.
pub const R1_TYPE: &str = "function";
pub const R1_FENCE_OPEN: &str = "```json\n";
pub const R1_FENCE_CLOSE: &str = "\n```";
/// Phi-4-mini's marker, with the array's bracket (vLLM: `functools\[(.*?)\]`).
pub const PHI4_CALLS: &str = "functools[";
/// Phi-4-mini's own template passes tools in the system message between these.
pub const PHI4_TOOLS_OPEN: &str = "<|tool|>";
pub const PHI4_TOOLS_CLOSE: &str = "<|/tool|>";
/// Qwen3-Coder's function and parameter tags.
pub const XML_FUNCTION: &str = "<function=";
pub const XML_FUNCTION_CLOSE: &str = "</function>";
pub const XML_PARAMETER: &str = "<parameter=";
pub const XML_PARAMETER_CLOSE: &str = "</parameter>";

/// Every format, for tests and tables.
pub const ALL: [ToolCallFormat; 8] = [
    ToolCallFormat::Hermes,
    ToolCallFormat::Llama3Json,
    ToolCallFormat::MistralArray,
    ToolCallFormat::MistralArgs,
    ToolCallFormat::Qwen3CoderXml,
    ToolCallFormat::Harmony,
    ToolCallFormat::DeepSeekR1,
    ToolCallFormat::Phi4MiniJson,
];

impl ToolCallFormat {
    /// The format a chat template's source shows, if it shows one (llama.cpp's
    /// checks, most specific first).
    pub fn detect(template: &str) -> Option<Self> {
        let has = |s: &str| template.contains(s);
        if has(harmony::CHANNEL) && has(harmony::FUNCTIONS) {
            Some(ToolCallFormat::Harmony)
        } else if has(R1_CALLS_BEGIN) && has("```json") {
            // R1 and its distills (DeepSeek V3.1 writes no fence: not this format).
            Some(ToolCallFormat::DeepSeekR1)
        } else if has(PHI4_CALLS) || (has(PHI4_TOOLS_OPEN) && has(PHI4_TOOLS_CLOSE)) {
            // vLLM's Phi-4-mini template, or Phi-4-mini's own (tools in `<|tool|>`).
            Some(ToolCallFormat::Phi4MiniJson)
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
            ToolCallFormat::DeepSeekR1 => {
                "deepseek-r1 (<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name)"
            }
            ToolCallFormat::Phi4MiniJson => "phi4-mini (functools[{json}, ...])",
        }
    }

    /// What opens a call (Hermes, Qwen3-Coder, Mistral's `[ARGS]` form) or the calls
    /// (Mistral's array, R1, Phi-4-mini), or may (Llama 3's `<|python_tag|>`).
    pub fn open(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3CoderXml => TOOL_CALL_OPEN,
            ToolCallFormat::Llama3Json => PYTHON_TAG,
            ToolCallFormat::MistralArray | ToolCallFormat::MistralArgs => MISTRAL_CALLS,
            ToolCallFormat::Harmony => HARMONY_CALL_OPEN,
            ToolCallFormat::DeepSeekR1 => R1_CALLS_BEGIN,
            ToolCallFormat::Phi4MiniJson => PHI4_CALLS,
        }
    }

    /// What closes a call (or R1's calls); `None` where the end of its JSON does.
    pub fn close(self) -> Option<&'static str> {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3CoderXml => Some(TOOL_CALL_CLOSE),
            ToolCallFormat::Harmony => Some(harmony::CALL),
            ToolCallFormat::DeepSeekR1 => Some(R1_CALLS_END),
            _ => None,
        }
    }

    /// Whether `tool_choice: auto` with a strict function is constrained in this format
    /// (free text, or text then calls whose arguments follow the schemas: the grammar
    /// parts text from a call at [`Self::open`]). Not harmony's: its calls are messages
    /// after the reasoning's, which the grammar does not see apart.
    pub fn constrains_auto(self) -> bool {
        self != ToolCallFormat::Harmony
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
            ToolCallFormat::DeepSeekR1 => &[
                R1_CALLS_BEGIN,
                R1_CALL_BEGIN,
                R1_SEP,
                R1_CALL_END,
                R1_CALLS_END,
            ],
            ToolCallFormat::Phi4MiniJson => &[],
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
            ToolCallFormat::DeepSeekR1 => format!(
                "{R1_CALLS_BEGIN}{}{R1_CALLS_END}",
                r1_call(name, &crate::chat_tools::python_json(arguments, None))
            ),
            ToolCallFormat::Phi4MiniJson => format!(
                "{PHI4_CALLS}{}]",
                crate::chat_tools::python_json(
                    &serde_json::json!({"name": name, key: arguments}),
                    None
                )
            ),
        }
    }
}

/// One of R1's calls (between its calls' markers; more than one are joined by a
/// newline, as its template writes them).
pub fn r1_call(name: &str, arguments: &str) -> String {
    format!("{R1_CALL_BEGIN}{R1_TYPE}{R1_SEP}{name}\n{R1_FENCE_OPEN}{arguments}{R1_FENCE_CLOSE}{R1_CALL_END}")
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
            ToolCallFormat::detect(
                "<|system|>{{ m['content'] + '<|tool|>' + m['tools'] + '<|/tool|>' }}"
            ),
            Some(ToolCallFormat::Phi4MiniJson)
        );
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
            w(ToolCallFormat::DeepSeekR1),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        );
        assert_eq!(
            w(ToolCallFormat::Phi4MiniJson),
            "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]"
        );
        assert_eq!(
            w(ToolCallFormat::Qwen3CoderXml),
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
        );
    }
}
