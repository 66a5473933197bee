//! The Responses request's mapping onto chat, tested.

use super::*;
use crate::parse_json;

fn req(v: Value) -> ResponsesRequest {
    parse_json(v.to_string().as_bytes()).unwrap()
}

#[test]
fn a_reasoning_item_is_the_next_assistant_turns_reasoning() {
    let reasoning = |t: &str| {
        json!({"type": "reasoning", "id": "rs_1", "summary": [],
            "content": [{"type": "reasoning_text", "text": t}]})
    };
    let c = req(json!({"input": [
        {"role": "user", "content": "Weather?"},
        reasoning("Need the tool."),
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        reasoning("Answer now."),
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"},
        reasoning("dangling")]}))
    .to_chat()
    .unwrap();
    let m = &c.messages;
    assert_eq!(m.len(), 5);
    assert_eq!(m[1].reasoning_content.as_deref(), Some("Need the tool."));
    assert_eq!(m[1].tool_calls.as_ref().map(Vec::len), Some(1));
    assert_eq!(m[3].reasoning_content.as_deref(), Some("Answer now."));
    assert_eq!(m[3].content, Some(MessageContent::Text("Sunny.".into())));
    assert_eq!(m[4].role, "user");
}

#[test]
fn input_forms_map_to_messages() {
    let c = req(json!({"input": "hi", "instructions": "be brief", "max_output_tokens": 5}))
        .to_chat()
        .unwrap();
    let m = c.text_messages().unwrap();
    assert_eq!(
        m,
        vec![
            ("system".into(), "be brief".into()),
            ("user".into(), "hi".into())
        ]
    );
    assert_eq!(c.params().unwrap().max_tokens, Some(5));
    let c = req(json!({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
        {"type": "reasoning", "id": "r", "summary": []},
    ]}))
    .to_chat()
    .unwrap();
    let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    let calls = c.messages[1].tool_calls.as_ref().unwrap();
    assert_eq!(
        (calls[0].id.as_str(), calls[1].function.name.as_str()),
        ("c1", "g")
    );
    assert_eq!(c.messages[2].tool_call_id.as_deref(), Some("c1"));
}

#[test]
fn tools_choice_and_format_map_to_chat() {
    let c = req(json!({"input": "x",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "text"}}}))
    .to_chat()
    .unwrap();
    let p = c.params().unwrap();
    assert_eq!(p.tools.unwrap().mode, crate::ToolMode::Named("f".into()));
    let c = req(
        json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "s",
        "schema": {"type": "object"}, "strict": true}}}),
    )
    .to_chat()
    .unwrap();
    assert_eq!(
        c.fields.response_format.unwrap()["json_schema"]["name"],
        "s"
    );
}

#[test]
fn errors_name_the_field() {
    for (body, param) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": 5}), "input"),
        (json!({"input": []}), "input"),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f"}]}),
            "input[0].call_id",
        ),
        (
            json!({"input": [{"type": "web_search_call"}]}),
            "input[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": "x", "tool_choice": {"type": "function"}}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "temperature": 3}), "temperature"),
        (json!({"input": "x", "n": 2}), "n"),
    ] {
        let e = req(body.clone()).to_chat().unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        assert!(e.message.contains(param), "{}", e.message);
    }
    let e = parse_json::<ResponsesRequest>(br#"{"model": "m"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input"));
}

#[test]
fn store_is_accepted_and_echo_has_defaults() {
    let r = req(json!({"input": "x", "store": true, "metadata": {"k": "v"}}));
    r.to_chat().unwrap();
    let e = r.echo();
    assert_eq!(e.metadata, json!({"k": "v"}));
    assert_eq!((e.tool_choice, e.tools), (json!("auto"), json!([])));
    assert_eq!(e.text, json!({"format": {"type": "text"}}));
    assert!(e.parallel_tool_calls);
}
