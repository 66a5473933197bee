//! The tool-calling wire: `tools`, `tool_choice`, `parallel_tool_calls` and the
//! messages' `tool_calls` / `tool_call_id`, parsed and validated into OpenAI-shaped
//! 400s that name the field.

use sloserve_api::{parse_json, ApiError, ChatCompletionRequest, GenParams, ToolMode};

const WEATHER: &str = r#"{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}"#;

fn params(extra: &str) -> Result<GenParams, ApiError> {
    let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
    parse_json::<ChatCompletionRequest>(body.as_bytes())?.params()
}

fn param_of(extra: &str) -> String {
    let e = params(extra).expect_err(extra);
    assert_eq!(e.status, 400, "{extra}: {e:?}");
    e.param.unwrap_or_default()
}

#[test]
fn choices_and_defaults() {
    assert_eq!(params("").unwrap().tools, None);
    let t = params(&format!(r#","tools":[{WEATHER}]"#))
        .unwrap()
        .tools
        .unwrap();
    assert_eq!(t.mode, ToolMode::Auto);
    assert!(t.parallel);
    assert_eq!(t.tools[0].function.strict, Some(true));
    let t = params(&format!(
        r#","tools":[{WEATHER}],"tool_choice":"required","parallel_tool_calls":false"#
    ))
    .unwrap()
    .tools
    .unwrap();
    assert_eq!((t.mode, t.parallel), (ToolMode::Required, false));
    let named = format!(
        r#","tools":[{WEATHER}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}"#
    );
    let t = params(&named).unwrap().tools.unwrap();
    assert_eq!(t.mode, ToolMode::Named("get_weather".into()));
    // "none": nothing rendered, nothing parsed.
    assert_eq!(
        params(&format!(r#","tools":[{WEATHER}],"tool_choice":"none""#))
            .unwrap()
            .tools,
        None
    );
    // A tool without `type` is a function; without parameters, any object.
    let t = params(r#","tools":[{"function":{"name":"ping"}}]"#).unwrap();
    assert_eq!(t.tools.unwrap().tools[0].kind, "function");
}

#[test]
fn bad_tools_name_the_field() {
    let bad_name = r#","tools":[{"type":"function","function":{"name":"ok"}},{"type":"function","function":{"name":"no spaces"}}]"#;
    assert_eq!(param_of(bad_name), "tools[1].function.name");
    let dup = format!(r#","tools":[{WEATHER},{WEATHER}]"#);
    assert_eq!(param_of(&dup), "tools[1].function.name");
    assert_eq!(
        param_of(r#","tools":[{"type":"retrieval","function":{"name":"a"}}]"#),
        "tools[0].type"
    );
    assert_eq!(
        param_of(r#","tools":[{"type":"function","function":{"name":"a","parameters":[1]}}]"#),
        "tools[0].function.parameters"
    );
    assert_eq!(
        param_of(r#","tools":[{"type":"function","function":{"description":"x"}}]"#),
        "tools[0].function.name"
    );
    assert_eq!(param_of(r#","tools":{"a":1}"#), "tools");
    let many: Vec<String> = (0..129)
        .map(|i| format!(r#"{{"type":"function","function":{{"name":"f{i}"}}}}"#))
        .collect();
    assert_eq!(
        param_of(&format!(r#","tools":[{}]"#, many.join(","))),
        "tools"
    );
    let long = "d".repeat(20_000);
    assert_eq!(
        param_of(&format!(
            r#","tools":[{{"type":"function","function":{{"name":"a","description":"{long}"}}}}]"#
        )),
        "tools[0].function.description"
    );
}

#[test]
fn bad_choices_are_400() {
    let with = |choice: &str| format!(r#","tools":[{WEATHER}],"tool_choice":{choice}"#);
    for c in [
        r#""sometimes""#,
        r#"{"type":"function","function":{"name":"get_time"}}"#,
        r#"{"type":"function"}"#,
        r#"{"type":"tool","function":{"name":"get_weather"}}"#,
        "3",
    ] {
        assert_eq!(param_of(&with(c)), "tool_choice", "{c}");
    }
    assert_eq!(param_of(r#","tool_choice":"required""#), "tool_choice");
    let e = params(&with(
        r#"{"type":"function","function":{"name":"get_time"}}"#,
    ))
    .unwrap_err();
    assert!(e.message.contains("get_time"), "{}", e.message);
    // A forced call and a response format cannot both decide the output.
    let both = format!(
        r#"{},"response_format":{{"type":"json_object"}}"#,
        with(r#""required""#)
    );
    assert_eq!(param_of(&both), "response_format");
    assert!(params(&format!(
        r#"{},"response_format":{{"type":"text"}}"#,
        with(r#""required""#)
    ))
    .is_ok());
}

#[test]
fn tool_messages() {
    let body = |msgs: &str| format!(r#"{{"messages":{msgs}}}"#);
    let ok = body(
        r#"[{"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"18C"}]"#,
    );
    let r: ChatCompletionRequest = parse_json(ok.as_bytes()).unwrap();
    assert_eq!(r.text_messages().unwrap().len(), 3);
    let calls = r.messages[1].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0].function.arguments, r#"{"city": "Paris"}"#);
    assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("call_1"));
    // Arguments sent as an object are taken as their JSON text.
    let obj = body(
        r#"[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}]}]"#,
    );
    let r: ChatCompletionRequest = parse_json(obj.as_bytes()).unwrap();
    assert_eq!(
        r.messages[0].tool_calls.as_ref().unwrap()[0]
            .function
            .arguments,
        r#"{"a":1}"#
    );
    let err = |msgs: &str| -> String {
        let r: Result<ChatCompletionRequest, _> = parse_json(body(msgs).as_bytes());
        match r {
            Err(e) => e.param.unwrap_or_default(),
            Ok(r) => r.text_messages().unwrap_err().param.unwrap_or_default(),
        }
    };
    assert_eq!(
        err(
            r#"[{"role":"user","content":"x","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]"#
        ),
        "messages[0].tool_calls"
    );
    assert_eq!(
        err(r#"[{"role":"user","content":"x","tool_call_id":"c"}]"#),
        "messages[0].tool_call_id"
    );
    assert_eq!(
        err(
            r#"[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"","arguments":"{}"}}]}]"#
        ),
        "messages[0].tool_calls[0].function.name"
    );
    assert!(err(r#"[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"arguments":"{}"}}]}]"#)
        .starts_with("messages[0].tool_calls[0].function"));
}
