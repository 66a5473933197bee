//! A small client for OpenAI's Files and Batches API on any server: upload,
//! create, get, list, cancel, download. Answers are read leniently (JSON values),
//! so servers that add or omit fields work.

use std::path::Path;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

pub struct BatchClient {
    base: String,
    api_key: Option<String>,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl BatchClient {
    /// `base`: the server's URL, with or without `/v1`.
    pub fn new(base: &str, api_key: Option<String>) -> Self {
        let b = base.trim().trim_end_matches('/');
        BatchClient {
            base: b.strip_suffix("/v1").unwrap_or(b).to_string(),
            api_key,
            http: HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        ctype: Option<String>,
        body: Bytes,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let url = format!("{}{path}", self.base);
        let mut req = Request::builder().method(method.clone()).uri(&url);
        if let Some(k) = &self.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        if let Some(c) = ctype {
            req = req.header("content-type", c);
        }
        let req = req
            .body(Full::new(body))
            .with_context(|| format!("bad URL {url}"))?;
        let resp = self
            .http
            .request(req)
            .await
            .with_context(|| format!("{method} {url}: cannot connect"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let msg = v["error"]["message"]
                .as_str()
                .map_or_else(|| String::from_utf8_lossy(&body).into_owned(), String::from);
            bail!("{method} {url}: {status}: {msg}");
        }
        Ok(resp)
    }

    async fn json(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let (ctype, bytes) = match body {
            Some(b) => (
                Some("application/json".to_string()),
                Bytes::from(b.to_string()),
            ),
            None => (None, Bytes::new()),
        };
        let resp = self.send(method, path, ctype, bytes).await?;
        let body = resp.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&body).with_context(|| format!("{path}: the answer is not JSON"))
    }

    /// `POST /v1/files` with purpose `batch`.
    pub async fn upload(&self, file: &Path) -> anyhow::Result<Value> {
        let data = tokio::fs::read(file)
            .await
            .with_context(|| format!("cannot read {}", file.display()))?;
        let name = file.file_name().map_or("batch.jsonl".into(), |n| {
            n.to_string_lossy().replace('"', "_")
        });
        let boundary = format!("sloserve{:016x}", rand::random::<u64>());
        let mut body = Vec::with_capacity(data.len() + 512);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/jsonl\r\n\r\n").as_bytes());
        body.extend_from_slice(&data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let resp = self
            .send(
                Method::POST,
                "/v1/files",
                Some(format!("multipart/form-data; boundary={boundary}")),
                body.into(),
            )
            .await?;
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok(serde_json::from_slice(&bytes)?)
    }

    pub async fn create(
        &self,
        file_id: &str,
        endpoint: &str,
        metadata: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut body =
            json!({"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"});
        if let Some(m) = metadata {
            body["metadata"] = m;
        }
        self.json(Method::POST, "/v1/batches", Some(body)).await
    }

    pub async fn get(&self, id: &str) -> anyhow::Result<Value> {
        self.json(Method::GET, &format!("/v1/batches/{id}"), None)
            .await
    }

    pub async fn list(&self, after: Option<&str>, limit: usize) -> anyhow::Result<Value> {
        let mut q = format!("/v1/batches?limit={limit}");
        if let Some(a) = after {
            q.push_str(&format!("&after={a}"));
        }
        self.json(Method::GET, &q, None).await
    }

    pub async fn cancel(&self, id: &str) -> anyhow::Result<Value> {
        self.json(Method::POST, &format!("/v1/batches/{id}/cancel"), None)
            .await
    }

    /// Streams file `id`'s content into `dest`; returns the bytes written.
    pub async fn download(&self, id: &str, dest: &Path) -> anyhow::Result<u64> {
        let resp = self
            .send(
                Method::GET,
                &format!("/v1/files/{id}/content"),
                None,
                Bytes::new(),
            )
            .await?;
        let mut f = tokio::fs::File::create(dest)
            .await
            .with_context(|| format!("cannot create {}", dest.display()))?;
        let mut body = resp.into_body();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                n += data.len() as u64;
                f.write_all(&data).await?;
            }
        }
        f.flush().await?;
        Ok(n)
    }
}
