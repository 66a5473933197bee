//! The parser in each model format: complete, streamed in every split, text before and
//! after, several calls, malformed calls left as content.

use super::*;
use sloserve_model::tool_format::ToolCallFormat;

fn call(name: &str, arguments: &str) -> ToolEvent {
    ToolEvent::Call(ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    })
}

fn content(t: &str) -> ToolEvent {
    ToolEvent::Content(t.into())
}

fn functions(format: ToolCallFormat) -> Functions {
    Functions {
        format,
        names: ["get_weather", "add"].map(String::from).to_vec(),
        string_params: vec![("get_weather".into(), "city".into())],
    }
}

/// Runs the pieces through one parser; adjacent content events are merged.
fn run(format: ToolCallFormat, pieces: &[&str]) -> Vec<ToolEvent> {
    let mut p = ToolCallParser::new(functions(format));
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(p.push(piece));
    }
    events.extend(p.finish());
    let mut merged: Vec<ToolEvent> = Vec::new();
    for e in events {
        match (merged.last_mut(), e) {
            (Some(ToolEvent::Content(a)), ToolEvent::Content(b)) => a.push_str(&b),
            (_, e) => merged.push(e),
        }
    }
    merged
}

/// Every split into two pieces, some into three, and one char at a time agree.
fn all_splits(format: ToolCallFormat, text: &str) -> Vec<ToolEvent> {
    let whole = run(format, &[text]);
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &i in &cuts {
        assert_eq!(
            run(format, &[&text[..i], &text[i..]]),
            whole,
            "split at {i}"
        );
        for &j in cuts.iter().filter(|&&j| j >= i).step_by(11) {
            let three = [&text[..i], &text[i..j], &text[j..]];
            assert_eq!(run(format, &three), whole, "split at {i}, {j}");
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(format, &refs), whole, "char by char");
    whole
}

const PARIS: &str = r#"{"city":"Paris"}"#;

#[test]
fn llama3_json_bare_or_after_python_tag() {
    let f = ToolCallFormat::Llama3Json;
    let bare = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    assert_eq!(all_splits(f, bare), [call("get_weather", PARIS)]);
    let tagged =
        "<|python_tag|>{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"a\": 1}}";
    assert_eq!(all_splits(f, tagged), [call("add", r#"{"a":1}"#)]);
    let typed = "{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"a\": 1}}\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    assert_eq!(
        all_splits(f, typed),
        [call("add", r#"{"a":1}"#), call("get_weather", PARIS)]
    );
    let around = "Let me look. <|python_tag|>{\"name\": \"add\", \"parameters\": {}} Done.";
    assert_eq!(
        all_splits(f, around),
        [content("Let me look."), call("add", "{}"), content("Done.")]
    );
    // Not a call: a builtin's Python, unknown names bare, cut off, prose.
    let builtin = "<|python_tag|>brave_search.call(query=\"x\")";
    assert_eq!(all_splits(f, builtin), [content(builtin)]);
    let other = "{\"name\": \"Bob\", \"parameters\": {}}";
    assert_eq!(all_splits(f, other), [content(other)]);
    let cut = "<|python_tag|>{\"name\": \"add\", \"param";
    assert_eq!(all_splits(f, cut), [content(cut)]);
    assert_eq!(all_splits(f, "Hello <|py"), [content("Hello <|py")]);
}

#[test]
fn mistral_array() {
    let f = ToolCallFormat::MistralArray;
    let two = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}, {\"name\": \"add\", \"arguments\": {\"a\": 1}}]";
    assert_eq!(
        all_splits(f, two),
        [call("get_weather", PARIS), call("add", r#"{"a":1}"#)]
    );
    let around = format!("Sure.\n{two}\nDone.");
    assert_eq!(
        all_splits(f, &around),
        [
            content("Sure."),
            call("get_weather", PARIS),
            call("add", r#"{"a":1}"#),
            content("Done.")
        ]
    );
    // The control token dropped by the detokenizer: a bare array at the start.
    let bare = "[{\"name\": \"add\", \"arguments\": {\"a\": 2}}]";
    assert_eq!(all_splits(f, bare), [call("add", r#"{"a":2}"#)]);
    for bad in [
        "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": 3}]",
        "[TOOL_CALLS]{\"name\": \"add\"}",
        "[TOOL_CALLS][]",
        "[TOOL_CALLS][{\"name\": \"add\", \"argu",
        "[1, 2]",
    ] {
        assert_eq!(all_splits(f, bad), [content(bad)], "{bad}");
    }
}

#[test]
fn mistral_name_args() {
    let f = ToolCallFormat::MistralArgs;
    let one = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}";
    assert_eq!(all_splits(f, one), [call("get_weather", PARIS)]);
    let two = "Checking.[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[ARGS]{\"a\": 1} ok";
    assert_eq!(
        all_splits(f, two),
        [
            content("Checking."),
            call("get_weather", PARIS),
            call("add", r#"{"a":1}"#),
            content("ok")
        ]
    );
    for bad in [
        "[TOOL_CALLS]not a name[ARGS]{}",
        "[TOOL_CALLS]add[ARGS][1]",
        "[TOOL_CALLS]add[ARGS]{\"a\":",
        "[TOOL_CALLS]add",
    ] {
        assert_eq!(all_splits(f, bad), [content(bad)], "{bad}");
    }
}

#[test]
fn qwen3_coder_xml() {
    let f = ToolCallFormat::Qwen3CoderXml;
    let one = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    // `city` is a string parameter: raw; `days` is not: JSON.
    assert_eq!(
        all_splits(f, one),
        [call("get_weather", r#"{"city":"42","days":3}"#)]
    );
    let code = "I'll add.\n<tool_call>\n<function=add>\n<parameter=code>\nif a < b:\n    x = \"<y>\"\n</parameter>\n<parameter=opts>\n{\"k\": [1, 2]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n</function>\n</tool_call>\nDone.";
    assert_eq!(
        all_splits(f, code),
        [
            content("I'll add."),
            call(
                "add",
                r#"{"code":"if a < b:\n    x = \"<y>\"","opts":{"k":[1,2]}}"#
            ),
            call("add", "{}"),
            content("Done.")
        ]
    );
    for bad in [
        "<tool_call>\n{\"name\": \"add\"}\n</tool_call>",
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>",
        "<tool_call>\n<function=add>\n",
    ] {
        assert_eq!(all_splits(f, bad), [content(bad)], "{bad}");
    }
}

/// DeepSeek-R1: llama.cpp's own examples (`tests/test-chat.cpp` of the vendored
/// llama.cpp, the R1 distill and `llama-cpp-deepseek-r1` blocks, and V3.1's form without
/// the type and fence that its tests also give), split anywhere.
#[test]
fn deepseek_r1_as_llama_cpp_reads_it() {
    let f = ToolCallFormat::DeepSeekR1;
    let r1 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(
        all_splits(f, r1),
        [call("special_function", r#"{"arg1":1}"#)]
    );
    let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"XYZCITY\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(
        all_splits(f, v31),
        [call("get_time", r#"{"city":"XYZCITY"}"#)]
    );
    let two = "CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(
        all_splits(f, two),
        [
            content("CONTENT"),
            call("get_time", PARIS),
            call("get_weather", PARIS)
        ]
    );
    // As R1's template writes history: the fence on its own lines, calls a line apart.
    let tmpl = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜> ok";
    assert_eq!(
        all_splits(f, tmpl),
        [
            call("add", r#"{"a":1}"#),
            call("get_weather", PARIS),
            content("ok")
        ]
    );
    for bad in [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n[1]\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a b\n{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{}",
        "Hi <｜tool",
    ] {
        assert_eq!(all_splits(f, bad), [content(bad)], "{bad}");
    }
}

/// Phi-4-mini: vLLM's `phi4_mini_json` form (`functools[...]`, `parameters` read where
/// `arguments` is missing, as it does); text around the calls stays content (vLLM
/// drops it).
#[test]
fn phi4_mini_functools() {
    let f = ToolCallFormat::Phi4MiniJson;
    let two = "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"add\", \"parameters\": {\"a\": 1}}]";
    assert_eq!(
        all_splits(f, two),
        [call("get_weather", PARIS), call("add", r#"{"a":1}"#)]
    );
    let around = format!("Let me check. {two}\nDone.");
    assert_eq!(
        all_splits(f, &around),
        [
            content("Let me check."),
            call("get_weather", PARIS),
            call("add", r#"{"a":1}"#),
            content("Done.")
        ]
    );
    for bad in [
        "import functools\nfunctools.reduce(f, xs)",
        "functools[1, 2]",
        "functools[]",
        "functools[{\"name\": \"add\", \"arguments\": 3}]",
        "functools[{\"name\": \"add\", \"argu",
    ] {
        assert_eq!(all_splits(f, bad), [content(bad)], "{bad}");
    }
}

#[test]
fn written_calls_parse_back_in_every_format() {
    let args = serde_json::json!({"city": "Paris"});
    for f in sloserve_model::tool_format::ALL {
        let mut text = f.write_call("get_weather", &args);
        // Harmony's splitter ends each call it gives out with `<|call|>`.
        if f == ToolCallFormat::Harmony {
            text.push_str(sloserve_model::harmony::CALL);
        }
        assert_eq!(all_splits(f, &text), [call("get_weather", PARIS)], "{f:?}");
    }
}

/// Harmony: a call as the splitter gives it out, split anywhere; text around it;
/// arguments that are not a JSON object stay content.
#[test]
fn harmony_calls_from_the_splitter() {
    let f = ToolCallFormat::Harmony;
    let one = format!(
        "{}{{\"city\": \"Paris\"}}<|call|>",
        sloserve_model::harmony::call_open("get_weather")
    );
    assert_eq!(all_splits(f, &one), [call("get_weather", PARIS)]);
    let text = format!("Checking.{one}");
    assert_eq!(
        all_splits(f, &text),
        [content("Checking."), call("get_weather", PARIS)]
    );
    let bad = format!(
        "{}not json<|call|>",
        sloserve_model::harmony::call_open("f")
    );
    assert_eq!(all_splits(f, &bad), [content(&bad)]);
}

#[test]
fn random_marker_soup_never_panics_and_loses_nothing() {
    const PARTS: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "<|python_tag|>",
        "{",
        "}",
        "[",
        "]",
        "\"name\"",
        ": ",
        "\"add\"",
        "\"arguments\"",
        "\"parameters\"",
        ",",
        " ",
        "\n",
        "<function=add>",
        "<parameter=a>",
        "</parameter>",
        "</function>",
        "1",
        "é",
        "x",
        "add",
        "<",
        "<tool",
        "[TOOL",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "function<｜tool▁sep｜>add\n```json\n",
        "```<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
        "<｜",
        "functools[",
        "functools",
    ];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..400 {
        let len = 1 + next(24);
        let text: String = (0..len).map(|_| PARTS[next(PARTS.len())]).collect();
        for f in sloserve_model::tool_format::ALL {
            let whole = run(f, &[&text]);
            let cuts: Vec<usize> = (0..=text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            let (i, j) = (cuts[next(cuts.len())], cuts[next(cuts.len())]);
            let (i, j) = (i.min(j), i.max(j));
            let three = [&text[..i], &text[i..j], &text[j..]];
            assert_eq!(run(f, &three), whole, "{f:?} {text:?} at {i}, {j}");
            // Without a call, the content is the text, byte for byte.
            if !whole.iter().any(|e| matches!(e, ToolEvent::Call(_))) {
                let content: String = whole
                    .iter()
                    .map(|e| match e {
                        ToolEvent::Content(t) => t.as_str(),
                        ToolEvent::Call(_) => "",
                    })
                    .collect();
                assert_eq!(content, text, "{f:?}");
            }
        }
    }
}
