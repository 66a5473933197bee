//! Every 4xx error of the HTTP API against the real server, with its OpenAI shape
//! and the field it names: malformed and mistyped bodies, out-of-range values,
//! prompts longer than the context, unknown models and routes, oversized bodies.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::json;

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| TestServer::start(test_args()))
}

#[test]
fn malformed_and_mistyped_bodies_are_400_naming_the_field() {
    let s = server();
    let raw = |path: &str, body: &str| request(s.addr, "POST", path, &[], body.as_bytes());
    let e = raw("/v1/completions", "{\"prompt\": \"hi\"").openai_error(400);
    assert!(e["param"].is_null());
    assert!(e["message"].as_str().unwrap().contains("malformed JSON"));
    assert_eq!(e["type"], "invalid_request_error");
    let e = raw("/v1/chat/completions", "[1, 2]").openai_error(400);
    assert!(e["message"].as_str().unwrap().contains("JSON object"));
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": "ten"}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": "hot"}),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "stream": "yes"}),
            "stream",
        ),
        ("/v1/completions", json!({"prompt": 42}), "prompt"),
        ("/v1/completions", json!({"max_tokens": 3}), "prompt"),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].type",
        ),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "stop": 3}),
            "stop",
        ),
    ] {
        let e = post(s.addr, path, &body).openai_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(param), "{e}");
    }
}

#[test]
fn out_of_range_values_are_400() {
    let s = server();
    for (extra, param) in [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"temperature": -0.1}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_p": 1.01}), "top_p"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": -5}), "max_tokens"),
        (json!({"top_k": -7}), "top_k"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -9}), "frequency_penalty"),
        (json!({"logprobs": 50}), "logprobs"),
        (json!({"n": 17}), "n"),
        (json!({"n": 0}), "n"),
        (json!({"slo_class": "gold"}), "slo_class"),
        (json!({"max_tokens": 5000}), "max_tokens"),
    ] {
        let mut body = json!({"prompt": "Hello"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let e = post(s.addr, "/v1/completions", &body).openai_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    let e = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
    )
    .openai_error(400);
    assert_eq!(e["param"], "top_logprobs");
}

#[test]
fn prompt_longer_than_the_context_is_400() {
    let s = server();
    let long = "hello ".repeat(1500);
    let e = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 1}),
    )
    .openai_error(400);
    assert_eq!(e["param"], "prompt");
    assert_eq!(e["code"], "context_length_exceeded");
    let e = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    )
    .openai_error(400);
    assert_eq!(e["param"], "messages");
    assert_eq!(e["code"], "context_length_exceeded");
}

#[test]
fn unknown_model_route_method_and_oversized_body() {
    let s = server();
    let e = post(
        s.addr,
        "/v1/completions",
        &json!({"model": "gpt-4o", "prompt": "x"}),
    )
    .openai_error(404);
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(e["param"], "model");
    assert!(e["message"].as_str().unwrap().contains("gpt-4o"));
    let e = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"model": "llama", "messages": [{"role": "user", "content": "x"}]}),
    )
    .openai_error(404);
    assert_eq!(e["code"], "model_not_found");
    get(s.addr, "/v1/nothing").openai_error(404);
    get(s.addr, "/v1/completions").openai_error(405);
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5 << 20));
    let e = request(s.addr, "POST", "/v1/completions", &[], big.as_bytes()).openai_error(413);
    assert!(e["message"].as_str().unwrap().contains("too large"));
}

/// `x-request-id` is echoed when sane (on errors too), made when missing or not.
#[test]
fn request_id_is_echoed_or_made() {
    let s = server();
    let body = json!({"prompt": "Hi", "max_tokens": 1}).to_string();
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-request-id", "trace-42")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("trace-42"));
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-request-id", "e-1")],
        b"{",
    );
    assert_eq!((r.status, r.header("x-request-id")), (400, Some("e-1")));
    let long = "x".repeat(129);
    for given in [&[("x-request-id", long.as_str())][..], &[]] {
        let r = request(s.addr, "GET", "/v1/models", given, b"");
        let id = r.header("x-request-id").expect("an id is made");
        assert!(id.starts_with("req-") && id.len() < 64, "{id}");
    }
}

/// The server serves exactly the endpoint table: every row's methods reach a
/// handler (whatever it answers to an empty body), any other method is 405.
#[test]
fn the_served_routes_are_the_endpoint_table() {
    let s = server();
    for spec in sloserve_api::endpoints::TABLE {
        let path = spec.path.replace("{*id}", "x").replace("{id}", "x");
        for m in ["GET", "POST", "DELETE"] {
            let r = request(
                s.addr,
                m,
                &path,
                &[("content-type", "application/json")],
                b"{}",
            );
            let allowed = spec.methods.iter().any(|x| x.as_str() == m);
            let text = r.text();
            if allowed {
                assert!(
                    r.status != 405 && !text.contains("no route for"),
                    "{m} {path}: {} {text}",
                    r.status
                );
            } else {
                assert_eq!(r.status, 405, "{m} {path}: {text}");
            }
        }
    }
}
