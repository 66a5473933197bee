//! One input line through the endpoint: the [`Dispatch`] contract (the server's
//! own handlers answer, so a line's body is exactly what the synchronous endpoint
//! gives), the batch class forced, and the reply turned into an output line.

use std::time::Duration;

use futures_util::future::BoxFuture;
use rand::Rng;
use serde_json::{json, Value};
use sloserve_slo::SloClass;

use crate::owner::Owner;
use crate::store::LineUsage;
use crate::types::{LineError, LineResponse, OutputLine};
use crate::validate::ParsedLine;

/// An endpoint's answer to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    /// `Retry-After` of a 429 / 503, in seconds.
    pub retry_after: Option<u64>,
}

/// Runs one request against `url` (`/v1/completions`, `/v1/chat/completions` or `/v1/responses`)
/// as `owner` would synchronously: with that key's cache scope, class ceiling and
/// limits. An owner the server cannot resolve (its key is gone) gets an error reply.
pub trait Dispatch: Send + Sync + 'static {
    fn call<'a>(&'a self, owner: &'a Owner, url: &'a str, body: Value) -> BoxFuture<'a, Reply>;
}

/// What became of a line.
#[derive(Debug)]
pub enum Outcome {
    /// A final answer (success or the endpoint's error): goes to a file. Boxed:
    /// the line is large beside the other variants.
    Done(Box<OutputLine>, LineUsage),
    /// Refused for now (queue full): try again after the delay.
    Later(Duration),
    /// The server is going away: leave the line for the next start.
    Stopped,
}

/// `prefix` + 24 random hex digits.
pub fn new_id(prefix: &str) -> String {
    let n: u128 = rand::rng().random();
    format!("{prefix}{:024x}", n >> 32)
}

/// An output line with no response (the line never ran).
pub fn unrun(custom_id: &str, code: &str, message: &str) -> OutputLine {
    OutputLine {
        id: new_id("batch_req_"),
        custom_id: custom_id.into(),
        response: None,
        error: Some(LineError {
            code: code.into(),
            message: message.into(),
        }),
    }
}

/// Sends `line` as `owner` in the batch SLO class and classifies the reply.
pub async fn run_line(dispatch: &dyn Dispatch, owner: &Owner, line: &ParsedLine) -> Outcome {
    let mut body = line.body.clone();
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let err = sloserve_api::ApiError::invalid(
            "stream",
            "stream: streaming is not supported in a batch",
        );
        return Outcome::Done(
            Box::new(response_line(
                line,
                400,
                serde_json::to_value(err.body()).unwrap_or_default(),
            )),
            LineUsage::default(),
        );
    }
    if let Some(obj) = body.as_object_mut() {
        obj.insert("slo_class".into(), json!(SloClass::Batch.as_str()));
    }
    let reply = dispatch.call(owner, &line.url, body).await;
    match reply.status {
        429 => Outcome::Later(Duration::from_secs(
            reply.retry_after.unwrap_or(1).clamp(1, 30),
        )),
        503 => Outcome::Stopped,
        status => {
            let usage = usage_of(&reply.body);
            Outcome::Done(Box::new(response_line(line, status, reply.body)), usage)
        }
    }
}

fn response_line(line: &ParsedLine, status: u16, body: Value) -> OutputLine {
    let request_id = body
        .get("id")
        .and_then(Value::as_str)
        .map_or_else(|| new_id("req_"), str::to_string);
    OutputLine {
        id: new_id("batch_req_"),
        custom_id: line.custom_id.clone(),
        response: Some(LineResponse {
            status_code: status,
            request_id,
            body,
        }),
        error: None,
    }
}

/// Token counts (and engine time) from a response's `usage`: chat's and
/// completions' names (`prompt_tokens`, ...), or the Responses API's
/// (`input_tokens`, `output_tokens`, `input_tokens_details`).
fn usage_of(body: &Value) -> LineUsage {
    let u = &body["usage"];
    let n = |a: &str, b: &str| u[a].as_u64().or_else(|| u[b].as_u64()).unwrap_or(0);
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .or_else(|| u["input_tokens_details"]["cached_tokens"].as_u64());
    LineUsage {
        input_tokens: n("prompt_tokens", "input_tokens"),
        cached_tokens: cached.unwrap_or(0),
        output_tokens: n("completion_tokens", "output_tokens"),
        machine_secs: u["sloserve"]["engine_ms"].as_f64().unwrap_or(0.0) / 1e3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Echo(Mutex<Vec<Value>>, u16);
    impl Dispatch for Echo {
        fn call<'a>(&'a self, o: &'a Owner, _url: &'a str, body: Value) -> BoxFuture<'a, Reply> {
            assert_eq!(o, &Owner::key("k"));
            self.0.lock().unwrap().push(body);
            let status = self.1;
            Box::pin(async move {
                Reply {
                    status,
                    body: json!({"id": "cmpl-1", "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": 3}, "sloserve": {"engine_ms": 250.0}}}),
                    retry_after: Some(2),
                }
            })
        }
    }

    fn line(body: Value) -> ParsedLine {
        ParsedLine {
            line: 1,
            custom_id: "c".into(),
            url: "/v1/completions".into(),
            body,
        }
    }

    #[tokio::test]
    async fn lines_run_in_the_batch_class_and_carry_usage() {
        let d = Echo(Mutex::new(vec![]), 200);
        let Outcome::Done(out, u) = run_line(
            &d,
            &Owner::key("k"),
            &line(json!({"prompt": "x", "slo_class": "interactive"})),
        )
        .await
        else {
            panic!("not done")
        };
        assert_eq!(d.0.lock().unwrap()[0]["slo_class"], "batch");
        assert!(out.is_success());
        assert_eq!(out.response.unwrap().request_id, "cmpl-1");
        assert_eq!(
            u,
            LineUsage {
                input_tokens: 5,
                cached_tokens: 3,
                output_tokens: 2,
                machine_secs: 0.25
            }
        );
    }

    /// A `/v1/responses` line's usage has the Responses API's names.
    #[test]
    fn usage_in_either_shape() {
        let chat = json!({"usage": {"prompt_tokens": 7, "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 2}}});
        let resp = json!({"object": "response", "usage": {"input_tokens": 7, "output_tokens": 4,
            "input_tokens_details": {"cached_tokens": 2}, "total_tokens": 11,
            "sloserve": {"engine_ms": 500.0}}});
        let want = LineUsage {
            input_tokens: 7,
            cached_tokens: 2,
            output_tokens: 4,
            machine_secs: 0.0,
        };
        assert_eq!(usage_of(&chat), want);
        assert_eq!(
            usage_of(&resp),
            LineUsage {
                machine_secs: 0.5,
                ..want
            }
        );
        assert_eq!(usage_of(&json!({"error": {}})), LineUsage::default());
    }

    #[tokio::test]
    async fn refusals_wait_or_stop_and_streams_are_refused() {
        let later = run_line(
            &Echo(Mutex::new(vec![]), 429),
            &Owner::key("k"),
            &line(json!({})),
        )
        .await;
        assert!(matches!(later, Outcome::Later(d) if d == Duration::from_secs(2)));
        assert!(matches!(
            run_line(
                &Echo(Mutex::new(vec![]), 503),
                &Owner::key("k"),
                &line(json!({}))
            )
            .await,
            Outcome::Stopped
        ));
        let d = Echo(Mutex::new(vec![]), 200);
        let Outcome::Done(out, _) =
            run_line(&d, &Owner::key("k"), &line(json!({"stream": true}))).await
        else {
            panic!()
        };
        assert_eq!(out.response.unwrap().status_code, 400);
        assert!(d.0.lock().unwrap().is_empty());
    }
}
