//! The streaming client: one OpenAI-compatible request → a timestamped [`RequestRecord`].

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::args::Endpoint;
use crate::record::RequestRecord;
use crate::sse::SseParser;
use crate::workload::RequestSpec;

/// Most of an error body kept in a record.
const ERROR_BODY_LIMIT: usize = 300;

/// What every request shares.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Base URL without `/v1` (a trailing `/v1` or `/` is stripped).
    pub base_url: String,
    pub endpoint: Endpoint,
    pub model: String,
    pub api_key: Option<String>,
    pub ignore_eos: bool,
    pub timeout: Duration,
}

/// A pooled HTTP/1.1 client (plain http, keep-alive, `TCP_NODELAY`).
#[derive(Clone)]
pub struct Client {
    cfg: ClientConfig,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

/// `url` without a trailing `/` or `/v1`.
pub fn normalize_base_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

impl Client {
    pub fn new(mut cfg: ClientConfig) -> Self {
        cfg.base_url = normalize_base_url(&cfg.base_url);
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        // A fresh connection per request: servers that close idle keep-alive
        // connections (llama-server does) would otherwise race a reused one and fail
        // the request with "connection closed before message completed". A loopback
        // connect costs microseconds against TTFTs of milliseconds.
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(conn);
        Client { cfg, http }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    fn path(&self) -> &'static str {
        match self.cfg.endpoint {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// The JSON body sent for `spec`.
    pub fn request_body(&self, spec: &RequestSpec) -> Value {
        let mut b = json!({
            "model": self.cfg.model,
            "max_tokens": spec.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
            "temperature": 0.0,
            "ignore_eos": self.cfg.ignore_eos,
        });
        match self.cfg.endpoint {
            Endpoint::Completions => b["prompt"] = json!(spec.prompt_text()),
            Endpoint::Chat => b["messages"] = json!(spec.messages),
        }
        if let Some(c) = &spec.class {
            b["slo_class"] = json!(c);
        }
        b
    }

    fn builder(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let mut r = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.cfg.base_url));
        if let Some(k) = &self.cfg.api_key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        r
    }

    /// The first model id `GET /v1/models` lists.
    pub async fn first_model(&self) -> anyhow::Result<String> {
        let req = self
            .builder(Method::GET, "/v1/models")
            .body(Full::new(Bytes::new()))?;
        let resp = tokio::time::timeout(Duration::from_secs(30), self.http.request(req))
            .await
            .context("GET /v1/models timed out")?
            .context("GET /v1/models")?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!("GET /v1/models: HTTP {status}: {}", summarize_body(&body));
        }
        let v: Value = serde_json::from_slice(&body).context("GET /v1/models: bad JSON")?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("GET /v1/models lists no model"))
    }

    /// Send request `id` and time it. `send_s` is `issued` (the instant the load
    /// driver decided to send it, checked against the run's deadline) relative
    /// to `run_start`; latencies count from the moment the body goes out. Never
    /// fails: errors go into the record.
    pub async fn send(
        &self,
        id: usize,
        spec: &RequestSpec,
        run_start: Instant,
        issued: Instant,
    ) -> RequestRecord {
        let mut rec = RequestRecord {
            id,
            class: spec.class.clone(),
            expected_prompt_tokens: spec.prompt_tokens as u64,
            max_tokens: spec.max_tokens as u64,
            ..RequestRecord::default()
        };
        let body = serde_json::to_vec(&self.request_body(spec)).expect("JSON body");
        let sent = Instant::now();
        rec.send_s = issued.saturating_duration_since(run_start).as_secs_f64();
        match tokio::time::timeout(self.cfg.timeout, self.stream(spec, body, sent, &mut rec)).await
        {
            Err(_) => {
                rec.error = Some(format!(
                    "timeout after {:.0}s",
                    self.cfg.timeout.as_secs_f64()
                ))
            }
            Ok(Err(e)) => rec.error = Some(format!("{e:#}")),
            Ok(Ok(())) if rec.chunk_s.is_empty() => {
                rec.error = Some("stream ended without generated text".into())
            }
            Ok(Ok(())) => {}
        }
        if rec.end_s == 0.0 {
            rec.end_s = sent.elapsed().as_secs_f64();
        }
        rec
    }

    async fn stream(
        &self,
        spec: &RequestSpec,
        body: Vec<u8>,
        sent: Instant,
        rec: &mut RequestRecord,
    ) -> anyhow::Result<()> {
        let mut req = self
            .builder(Method::POST, self.path())
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        if let Some(c) = &spec.class {
            req = req.header(sloserve_slo::headers::CLASS, c.as_str());
        }
        let resp = self
            .http
            .request(req.body(Full::new(Bytes::from(body)))?)
            .await
            .map_err(|e| anyhow!("request failed: {}", error_chain(&e)))?;
        let status = resp.status();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            bail!("HTTP {}: {}", status.as_u16(), summarize_body(&bytes));
        }
        let mut sse = SseParser::new();
        let mut raw_head = Vec::new();
        let mut events_seen = false;
        let mut done = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| anyhow!("stream broken: {}", error_chain(&e)))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let t = sent.elapsed().as_secs_f64();
            if raw_head.len() < ERROR_BODY_LIMIT {
                raw_head.extend_from_slice(&data[..data.len().min(ERROR_BODY_LIMIT)]);
            }
            for ev in sse.feed(&data) {
                events_seen = true;
                if handle_event(&ev, t, rec)? {
                    done = true;
                    rec.end_s = t;
                }
            }
        }
        if let Some(ev) = sse.finish() {
            events_seen = true;
            let t = sent.elapsed().as_secs_f64();
            if handle_event(&ev, t, rec)? {
                done = true;
                rec.end_s = t;
            }
        }
        if !events_seen {
            bail!(
                "no server-sent events in the response: {}",
                summarize_body(&raw_head)
            );
        }
        if !done {
            rec.end_s = sent.elapsed().as_secs_f64();
        }
        Ok(())
    }
}

/// Apply one SSE event to `rec` (received `t` s after send). `Ok(true)` at `[DONE]`.
pub fn handle_event(data: &str, t: f64, rec: &mut RequestRecord) -> anyhow::Result<bool> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(true);
    }
    if data.is_empty() {
        return Ok(false);
    }
    let v: Value = serde_json::from_str(data).map_err(|e| {
        anyhow!(
            "bad JSON in stream ({e}): {}",
            summarize_body(data.as_bytes())
        )
    })?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        bail!("error in stream: {}", error_message(err));
    }
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        let mut has_text = false;
        for c in choices {
            let text = [
                &c["text"],
                &c["delta"]["content"],
                &c["delta"]["reasoning_content"],
            ]
            .into_iter()
            .filter_map(|x| x.as_str())
            .any(|s| !s.is_empty());
            has_text |= text;
            if let Some(fr) = c.get("finish_reason").and_then(Value::as_str) {
                rec.finish_reason = Some(fr.to_string());
            }
        }
        if has_text {
            rec.chunk_s.push(t);
        }
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        rec.prompt_tokens = u["prompt_tokens"].as_u64().or(rec.prompt_tokens);
        rec.completion_tokens = u["completion_tokens"].as_u64().or(rec.completion_tokens);
        let slo = &u["sloserve"];
        rec.server_ttft_met = slo["ttft_met"].as_bool().or(rec.server_ttft_met);
        rec.server_tpot_met = slo["tpot_met"].as_bool().or(rec.server_tpot_met);
    }
    Ok(false)
}

fn error_message(err: &Value) -> String {
    match err {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string()),
        other => other.to_string(),
    }
}

/// One line describing an error body: the OpenAI `error.message` if it is one, else its start.
pub fn summarize_body(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if let Some(err) = v.get("error") {
            return error_message(err);
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return "(empty body)".into();
    }
    if text.chars().count() > ERROR_BODY_LIMIT {
        format!(
            "{}…",
            text.chars().take(ERROR_BODY_LIMIT).collect::<String>()
        )
    } else {
        text
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
