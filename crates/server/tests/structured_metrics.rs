//! The structured-output metrics on `/metrics` move with a constrained request
//! (issue #32 item 7): `sloserve:constrained_requests_total`, the grammar's mask
//! time per constrained token (`sloserve:grammar_mask_time_seconds`, one
//! observation per token generated under the grammar) and
//! `sloserve:grammar_compile_errors_total` after a schema that does not compile,
//! and the forced tokens fast-forward drafted and the model accepted
//! (`sloserve:grammar_forced_draft_tokens_total`, `sloserve:grammar_forced_tokens_total`).

mod common;

use common::{get, metric, post, test_args, wait_for, TestServer};
use serde_json::json;

#[test]
fn constrained_requests_mask_times_and_compile_errors_are_on_metrics() {
    let s = TestServer::start(test_args());
    let read = |name: &str| {
        let text = get(s.addr, "/metrics").text();
        metric(&text, &format!("{name}{{model_name=\"smol\"}}"))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    let mask_count = "sloserve:grammar_mask_time_seconds_count";
    let (req0, err0, masks0) = (
        read("sloserve:constrained_requests_total"),
        read("sloserve:grammar_compile_errors_total"),
        read(mask_count),
    );
    // The mask histogram's buckets are there (seconds, microseconds up).
    let text = get(s.addr, "/metrics").text();
    assert!(text.contains("# TYPE sloserve:grammar_mask_time_seconds histogram"));
    assert!(text
        .contains("sloserve:grammar_mask_time_seconds_bucket{model_name=\"smol\",le=\"0.0001\"}"));

    let schema = json!({
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": false
    });
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "Give a number as JSON."}],
            "max_tokens": 12,
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema, "strict": true}
            }
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let tokens = r.json()["usage"]["completion_tokens"].as_f64().unwrap();
    assert!(tokens >= 1.0);
    assert!(read("sloserve:constrained_requests_total") >= req0 + 1.0);
    // Every token of the constrained request had its mask timed (the snapshot is
    // published after the step whose last token the client may already hold).
    wait_for(&format!("{tokens} mask times"), 10, || {
        read(mask_count) >= masks0 + tokens
    });
    let sum = read("sloserve:grammar_mask_time_seconds_sum");
    assert!(sum > 0.0 && sum < 60.0, "{sum}");
    // The schema's `"n": ` after the first token is forced: fast-forward (on by
    // default) drafted it and the model took it.
    let forced = |name: &str| {
        let text = get(s.addr, "/metrics").text();
        let labels = "{model_name=\"smol\",slo_class=\"interactive\"}";
        metric(&text, &format!("{name}{labels}"))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    let drafted = forced("sloserve:grammar_forced_draft_tokens_total");
    let accepted = forced("sloserve:grammar_forced_tokens_total");
    assert!(
        accepted >= 1.0 && accepted <= drafted && accepted < tokens,
        "forced {accepted} of {drafted} drafted, {tokens} tokens"
    );

    // A free request adds no mask time (its tokens reach the snapshot, none of
    // them as a mask time).
    let before = read(mask_count);
    let gen0 = read("sloserve:generation_tokens_total");
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200);
    wait_for("the free request's tokens", 10, || {
        read("sloserve:generation_tokens_total") >= gen0 + 3.0
    });
    assert_eq!(read(mask_count), before);

    // A pattern that does not compile: a 400 and one more compile error.
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "bad", "strict": true, "schema": {"type": "string", "pattern": "("}}
            }
        }),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(read("sloserve:grammar_compile_errors_total") >= err0 + 1.0);
    s.shutdown();
}
