use super::*;

const OPEN: &str = sloserve_model::tool_format::TOOL_CALL_OPEN;

fn call(name: &str, arguments: &str) -> ToolEvent {
    ToolEvent::Call(ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    })
}

fn names() -> Vec<String> {
    ["get_weather", "add", "f", "g", "ping"]
        .map(String::from)
        .to_vec()
}

fn content(t: &str) -> ToolEvent {
    ToolEvent::Content(t.into())
}

/// Runs the pieces through one parser; adjacent content events are merged.
fn run(pieces: &[&str]) -> Vec<ToolEvent> {
    let mut p = ToolCallParser::new(names());
    let mut events = Vec::new();
    let mut pushed = String::new();
    for piece in pieces {
        pushed.push_str(piece);
        let evs = p.push(piece);
        // Content never carries the start of a tag the text so far ends with.
        for e in &evs {
            if let ToolEvent::Content(t) = e {
                for n in 1..OPEN.len() {
                    let tail = &OPEN[..n];
                    assert!(
                        !(pushed.ends_with(tail) && t.ends_with(tail)),
                        "partial tag released in {t:?}"
                    );
                }
            }
        }
        events.extend(evs);
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

/// Every split of `text` into two and three pieces gives the same events.
fn all_splits(text: &str) -> Vec<ToolEvent> {
    let whole = run(&[text]);
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &i in &cuts {
        assert_eq!(run(&[&text[..i], &text[i..]]), whole, "split at {i}");
        for &j in cuts.iter().filter(|&&j| j >= i).step_by(7) {
            assert_eq!(
                run(&[&text[..i], &text[i..j], &text[j..]]),
                whole,
                "split at {i}, {j}"
            );
        }
    }
    whole
}

#[test]
fn plain_text_passes_through() {
    assert_eq!(
        all_splits("Hello, <b>world</b> 1 < 2\n"),
        [content("Hello, <b>world</b> 1 < 2\n")]
    );
    // A held-back tag prefix that turns out not to be one is released.
    assert_eq!(run(&["a <tool", "_cal", "x"]), [content("a <tool_calx")]);
    assert_eq!(
        run(&["ends with <tool_ca"]),
        [content("ends with <tool_ca")]
    );
    assert_eq!(run(&[""]), []);
}

#[test]
fn one_call_split_anywhere() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert_eq!(
        all_splits(text),
        [call("get_weather", r#"{"city":"Paris"}"#)]
    );
    // Token by token, as the model emits it.
    let pieces = [
        "<tool_call>",
        "\n",
        "{\"",
        "name",
        "\":",
        " \"",
        "get",
        "_weather",
        "\",",
        " \"arguments",
        "\":",
        " {\"",
        "city",
        "\":",
        " \"",
        "Paris",
        "\"}}\n",
        "</",
        "tool",
        "_call",
        ">",
    ];
    assert_eq!(run(&pieces), [call("get_weather", r#"{"city":"Paris"}"#)]);
}

#[test]
fn text_around_and_parallel_calls() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\n</tool_call>\n";
    assert_eq!(
        all_splits(text),
        [
            content("Let me check."),
            call("add", r#"{"a":1,"b":2}"#),
            call("add", r#"{"a":3,"b":4}"#),
        ]
    );
    let after = "<tool_call>{\"name\": \"ping\"}</tool_call>\n\nDone, é.";
    assert_eq!(all_splits(after), [call("ping", "{}"), content("Done, é.")]);
}

#[test]
fn bad_json_stays_content() {
    let bad = "x <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> y";
    assert_eq!(all_splits(bad), [content(bad)]);
    let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
    assert_eq!(all_splits(no_name), [content(no_name)]);
    // An unclosed block (max_tokens hit) is content, verbatim.
    let open = "<tool_call>\n{\"name\": \"f\", \"argu";
    assert_eq!(all_splits(open), [content(open)]);
    // A good call after a bad one is still a call.
    assert_eq!(
        run(&[
            "<tool_call>nope</tool_call>",
            "<tool_call>{\"name\":\"g\",\"arguments\":\"{\\\"k\\\": 1}\"}</tool_call>"
        ]),
        [
            content("<tool_call>nope</tool_call>"),
            call("g", r#"{"k": 1}"#)
        ]
    );
}

#[test]
fn calls_are_counted() {
    let mut p = ToolCallParser::new(names());
    p.push("<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>");
    p.finish();
    assert_eq!(p.calls(), 2);
}

#[test]
fn bare_calls_at_the_start_and_after_a_call() {
    // Small models often leave the tags out.
    let bare = " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n";
    assert_eq!(
        all_splits(bare),
        [call("get_weather", r#"{"city":"Paris"}"#)]
    );
    let two = "{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n<tool_call>{\"name\": \"ping\"}</tool_call>\n{ \"name\": \"g\"} and text";
    assert_eq!(
        all_splits(two),
        [
            call("add", r#"{"a":1}"#),
            call("ping", "{}"),
            call("g", "{}"),
            content("and text")
        ]
    );
    // Not a function of the request, not at a boundary, or not a call: text.
    let other = "{\"name\": \"Bob\", \"age\": 3}";
    assert_eq!(all_splits(other), [content(other)]);
    let later = "Here: {\"name\": \"add\", \"arguments\": {}}";
    assert_eq!(all_splits(later), [content(later)]);
    let json = "{\"city\": \"Paris\"}";
    assert_eq!(all_splits(json), [content(json)]);
    let cut = "{\"name\": \"add\", \"argu";
    assert_eq!(all_splits(cut), [content(cut)]);
}
