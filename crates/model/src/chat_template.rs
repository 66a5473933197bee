//! `ChatTemplate`: renders a GGUF file's `tokenizer.chat_template` (Hugging Face style
//! Jinja) over chat messages with minijinja, the way transformers' `apply_chat_template`
//! does (trim_blocks, lstrip_blocks, Python string methods, `raise_exception`,
//! `strftime_now`, Python's `tojson`), with the request's `tools` and the messages'
//! `tool_calls` / `tool_call_id` (templates without a tools section get the
//! fallback of [`crate::chat_tools`]).

use candle_core::quantized::gguf_file::Content;
use minijinja::{context, Environment, Error, ErrorKind, Value};

pub use crate::chat_message::ChatMessage;
use crate::chat_prompt::{encode_chat, ControlTokens};
use crate::chat_tools::{with_fallback, ToolSupport};
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template plus the BOS / EOS texts it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// The vocabulary's control-token texts, built on the first `encode`.
    controls: std::sync::OnceLock<std::result::Result<ControlTokens, String>>,
    /// What the template renders of tools, probed on first use.
    tool_support: std::sync::OnceLock<ToolSupport>,
    /// The time renders see (`strftime_now`, the default `date_string`): Unix
    /// seconds, 0 for the system clock.
    clock: Clock,
}

/// A render's "now": the system clock unless pinned.
#[derive(Clone, Default)]
struct Clock(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl Clock {
    fn now(&self) -> i64 {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => now_secs(),
            pinned => pinned,
        }
    }
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

/// Template instructions one render may run (a long chat takes a few dozen per
/// message; a template that loops without end runs out in well under a second).
pub const TEMPLATE_FUEL: u64 = 5_000_000;

impl ChatTemplate {
    /// Compiles `source`; a syntax error is returned as `ModelError::ChatTemplate`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A hostile template (it comes from the model file) cannot loop forever.
        env.set_fuel(Some(TEMPLATE_FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, Error> {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("template raised: {msg}"),
                ))
            },
        );
        let clock = Clock::default();
        let render_clock = clock.clone();
        env.add_function("strftime_now", move |fmt: String| -> String {
            strftime(&fmt, render_clock.now())
        });
        // Jinja2's `iterable`: `none` is not (minijinja iterates it as empty), so
        // `tools is iterable and tools | length > 0` holds no tools (Qwen3-Coder's).
        env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
        env.add_filter("tojson", crate::chat_tools::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| {
                ModelError::ChatTemplate(format!("cannot compile template: {}", describe(&e)))
            })?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            controls: std::sync::OnceLock::new(),
            tool_support: std::sync::OnceLock::new(),
            clock,
        })
    }

    /// Renders as if it were `unix_secs` (`strftime_now`, the default
    /// `date_string`), so that a render can be compared with one recorded on
    /// another day; 0 goes back to the system clock.
    pub fn pin_clock(&self, unix_secs: i64) {
        self.clock
            .0
            .store(unix_secs, std::sync::atomic::Ordering::Relaxed);
    }

    /// The template stored in `tokenizer.chat_template`, or `None` when the file has none.
    pub fn from_gguf(content: &Content, tokenizer: &Tokenizer) -> Result<Option<Self>> {
        let key = "tokenizer.chat_template";
        let Some(v) = content.metadata.get(key) else {
            return Ok(None);
        };
        let source = v.to_string().map_err(|e| ModelError::BadMetadata {
            path: "<gguf metadata>".into(),
            key: key.into(),
            reason: e.to_string(),
        })?;
        Self::with_tokenizer(source, tokenizer).map(Some)
    }

    /// Compiles `source` with the BOS / EOS texts of `tokenizer` (the file's template,
    /// or one given on the command line).
    pub fn with_tokenizer(source: &str, tokenizer: &Tokenizer) -> Result<Self> {
        let text = |id: Option<u32>| {
            id.map(|id| String::from_utf8_lossy(&tokenizer.token_bytes(id)).into_owned())
                .unwrap_or_default()
        };
        Self::new(source, &text(tokenizer.bos_id()), &text(tokenizer.eos_id()))
    }

    /// Renders the conversation; `add_generation_prompt` appends the assistant header.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_raw(messages, None, add_generation_prompt)
    }

    /// Renders the conversation with `tools` (a list of `{"type": "function",
    /// "function": {...}}`) given to the template as is (`None`: `tools` is none).
    pub fn render_raw(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_kwargs(messages, tools, add_generation_prompt, None)
    }

    /// `render_raw` with a request's `chat_template_kwargs` (an object) as extra
    /// template variables, e.g. Qwen3's `enable_thinking`; the template's own
    /// variables (messages, tools, ...) are not overridden by them. `enable_thinking`
    /// is true unless the kwargs say otherwise, as llama.cpp renders (its copies of
    /// the R1 distills' templates close the think block when it is undefined).
    pub fn render_kwargs(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ModelError::ChatTemplate(describe(&e)))?;
        let extra = kwargs.map_or(Value::from(()), Value::from_serialize);
        // Today's date as llama.cpp gives Llama 3.x templates (`date_string`, whose
        // own default is "26 Jul 2024"); the request's kwargs may set it.
        let defaults = context! {
            enable_thinking => true,
            date_string => strftime("%d %b %Y", self.clock.now()),
        };
        // gpt-oss's template reads an assistant turn's reasoning as `thinking`
        // (llama.cpp's gpt-oss handler copies `reasoning_content` there).
        let thinking: Vec<ChatMessage>;
        let messages = if self.reasoning_format() == crate::reasoning::ReasoningFormat::Harmony
            && messages.iter().any(|m| m.reasoning_content.is_some())
        {
            thinking = messages
                .iter()
                .map(|m| ChatMessage {
                    thinking: m.thinking.clone().or_else(|| m.reasoning_content.clone()),
                    ..m.clone()
                })
                .collect();
            &thinking[..]
        } else {
            messages
        };
        let messages = if self.reasoning_as_blocks()
            && messages.iter().any(|m| m.reasoning_content.is_some())
        {
            Value::from_serialize(messages.iter().map(thinking_block).collect::<Vec<_>>())
        } else {
            Value::from_serialize(messages)
        };
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            tools => tools.map_or(Value::from(()), Value::from_serialize),
            ..minijinja::value::merge_maps([defaults, extra])
        })
        .map_err(|e| ModelError::ChatTemplate(format!("cannot render: {}", describe(&e))))
    }

    /// What this template renders natively: `tools`, and assistant `tool_calls` with
    /// `tool` messages (probed once by rendering a small example).
    pub fn tool_support(&self) -> ToolSupport {
        *self
            .tool_support
            .get_or_init(|| ToolSupport::probe(|m, t| self.render_raw(m, t, true)))
    }

    /// Renders the conversation with tools: natively where the template has a tools
    /// section, else through the documented fallback (a system preamble describing
    /// the tools, calls and results as text; `crate::chat_tools`).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (messages, tools) = with_fallback(
            self.tool_call_format(),
            || self.tool_support(),
            messages,
            tools,
        );
        self.render_raw(&messages, tools.as_ref(), add_generation_prompt)
    }

    /// Renders and tokenizes the conversation: control tokens come only from the
    /// template's own text, message text is tokenized with them taken literally (see
    /// `chat_prompt`). `tok` must be the tokenizer of the file the template came from.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        add_bos: bool,
    ) -> Result<Vec<u32>> {
        self.encode_with_tools(tok, messages, None, add_generation_prompt, add_bos)
    }

    /// `encode` with `tools` rendered as [`Self::render_with_tools`] does; the tools'
    /// and calls' text is escaped like message text (no control token from it).
    pub fn encode_with_tools(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        add_bos: bool,
    ) -> Result<Vec<u32>> {
        self.encode_kwargs(tok, messages, tools, add_generation_prompt, add_bos, None)
    }

    /// `encode_with_tools` with a request's `chat_template_kwargs` (`render_kwargs`).
    pub fn encode_kwargs(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        add_bos: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<u32>> {
        let controls = self
            .controls
            .get_or_init(|| ControlTokens::new(tok).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| ModelError::Tokenizer(e.clone()))?;
        let (messages, tools) = with_fallback(
            self.tool_call_format(),
            || self.tool_support(),
            messages,
            tools,
        );
        let render = |m: &[ChatMessage], t: Option<&serde_json::Value>| {
            self.render_kwargs(m, t, add_generation_prompt, kwargs)
        };
        encode_chat(controls, tok, &messages, tools.as_ref(), render, add_bos)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads an assistant turn's reasoning as a `thinking` content
    /// block (Ministral 3 / Magistral: llama.cpp's `common/parsers/ministral3.cpp`, chosen
    /// by the checks of its `common_chat_try_specialized_template`).
    fn reasoning_as_blocks(&self) -> bool {
        use crate::tool_format::{MISTRAL_ARGS, MISTRAL_CALLS, MISTRAL_CALL_ID};
        let has = |s: &str| self.source.contains(s);
        has("[SYSTEM_PROMPT]") && has(MISTRAL_CALLS) && has(MISTRAL_ARGS) && !has(MISTRAL_CALL_ID)
    }

    /// How this template's model marks its reasoning (`crate::reasoning`).
    pub fn reasoning_format(&self) -> crate::reasoning::ReasoningFormat {
        crate::reasoning::ReasoningFormat::detect(&self.source)
    }

    /// How this template's model writes its tool calls (`crate::tool_format`): what
    /// the template shows, else Hermes (the fallback preamble's format).
    pub fn tool_call_format(&self) -> crate::tool_format::ToolCallFormat {
        crate::tool_format::ToolCallFormat::for_model(None, Some(&self.source))
    }
}

/// A system or assistant turn with reasoning as llama.cpp gives it to Ministral 3's
/// template: `content` the blocks `[{"type": "thinking", ...}, {"type": "text", ...}]`.
fn thinking_block(m: &ChatMessage) -> serde_json::Value {
    let mut v = serde_json::to_value(m).unwrap_or_default();
    if let (Some(r), Some(obj)) = (&m.reasoning_content, v.as_object_mut()) {
        if m.role == "assistant" || m.role == "system" {
            obj.insert(
                "content".into(),
                serde_json::json!([{"type": "thinking", "thinking": r},
                    {"type": "text", "text": m.content}]),
            );
            obj.remove("reasoning_content");
        }
    }
    v
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// A small UTC `strftime` for the codes chat templates use (%Y %y %m %d %e %B %b %A %a
/// %H %I %M %S %p %j %%); other codes are copied through unchanged.
/// Seconds since the epoch, now.
fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn strftime(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (hour, min, sec) = (secs / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let wday = (days + 4).rem_euclid(7) as usize;
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!(
                "{:02}",
                if hour % 12 == 0 { 12 } else { hour % 12 }
            )),
            Some('M') => out.push_str(&format!("{min:02}")),
            Some('S') => out.push_str(&format!("{sec:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{now_secs, strftime, ChatTemplate};

    #[test]
    fn a_looping_template_runs_out_of_fuel() {
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[], true).unwrap_err().to_string();
        assert!(e.contains("fuel"), "{e}");
    }

    #[test]
    fn date_string_is_today_unless_given() {
        let t = ChatTemplate::new("{{ date_string }}", "", "").unwrap();
        let today = strftime("%d %b %Y", now_secs());
        assert_eq!(t.render(&[], false).unwrap(), today);
        let mut kw = serde_json::Map::new();
        kw.insert("date_string".into(), "26 Jul 2024".into());
        let given = t.render_kwargs(&[], None, false, Some(&kw)).unwrap();
        assert_eq!(given, "26 Jul 2024");
    }

    /// Jinja2's `iterable` test: a list or a map is, `none` is not.
    #[test]
    fn none_is_not_iterable() {
        let t = ChatTemplate::new(
            "{{ tools is iterable }} {{ [] is iterable }} {{ x is iterable }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "False True True");
    }

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0), "1970-01-01 00:00:00");
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        assert_eq!(
            strftime("%d %b %Y %A %j %I%p %%", 1_709_211_909),
            "29 Feb 2024 Thursday 060 01PM %"
        );
        assert_eq!(strftime("%e %B %y", 1_735_689_600), " 1 January 25");
    }
}
