//! A request's body before any work: the content type JSON routes require (415),
//! and the body read whole, under `--max-body-bytes` and `--body-read-timeout`,
//! before the in-flight slot is taken (uploads stream, under the same deadline).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sloserve_api::ApiError;
use tokio::time::Sleep;

use crate::error::{api_response, ServerError};
use crate::state::AppState;

/// The one route whose body is not JSON: the Batch API's multipart upload.
const UPLOAD_PATH: &str = "/v1/files";
/// The upload's deadline, in body-read timeouts (it may be far larger than a prompt).
const UPLOAD_DEADLINE_FACTOR: u32 = 10;

fn unsupported(message: String) -> ApiError {
    let mut e = ApiError::bad_request(message).with_code("unsupported_media_type");
    e.status = 415;
    e
}

/// Whether a POST to `path` may carry these headers. JSON routes need
/// `application/json`; the upload needs `multipart/form-data`. A body-less POST
/// (a cancel) may omit the type, unless it comes from a browser (`Origin` or
/// `Sec-Fetch-Site`): a cross-origin "simple" request must never act.
pub fn check_content_type(path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?").to_ascii_lowercase());
    let essence = ctype
        .as_deref()
        .map(|c| c.split(';').next().unwrap_or("").trim().to_string());
    let want = if path == UPLOAD_PATH {
        "multipart/form-data"
    } else {
        "application/json"
    };
    match essence.as_deref() {
        Some(e) if e == want => Ok(()),
        Some(_) => Err(unsupported(format!(
            "POST {path} needs Content-Type: {want}, got {:?}",
            ctype.unwrap_or_default()
        ))),
        None => {
            let empty = headers
                .get(header::CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() == b"0")
                || (!headers.contains_key(header::CONTENT_LENGTH)
                    && !headers.contains_key(header::TRANSFER_ENCODING));
            let browser =
                headers.contains_key(header::ORIGIN) || headers.contains_key("sec-fetch-site");
            if empty && !browser {
                Ok(())
            } else {
                Err(unsupported(format!(
                    "POST {path} needs Content-Type: {want}"
                )))
            }
        }
    }
}

/// The middleware: 415 before the body is read.
pub async fn require_content_type(req: Request, next: Next) -> Response {
    if req.method() == Method::POST {
        if let Err(e) = check_content_type(req.uri().path(), req.headers()) {
            return api_response(&e, None);
        }
    }
    next.run(req).await
}

/// A response the connection closes after (the body was not read to its end).
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn timed_out(d: Duration) -> Response {
    closing(api_response(
        &ApiError::timed_out(format!(
            "the request body did not arrive within {:.1} s (--body-read-timeout)",
            d.as_secs_f64()
        )),
        None,
    ))
}

/// Reads the body whole (at most `limit` bytes).
async fn collect(body: Body, limit: usize) -> Result<Bytes, ServerError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ServerError::Body(e.to_string()))?;
        if buf.len() + chunk.len() > limit {
            return Err(ServerError::BodyTooLarge { limit });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// The middleware: the body in memory before the next layer (the in-flight limit)
/// runs, so a body that never arrives holds a connection, never a request slot.
pub async fn read_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let deadline = state.conn_limits.body_read_timeout;
    let (parts, body) = req.into_parts();
    if parts.method == Method::POST && parts.uri.path() == UPLOAD_PATH {
        // Uploads have their own (larger) limit and go to disk as they arrive.
        let body = Body::new(DeadlineBody {
            inner: body,
            sleep: deadline.map(|d| Box::pin(tokio::time::sleep(d * UPLOAD_DEADLINE_FACTOR))),
        });
        return next.run(Request::from_parts(parts, body)).await;
    }
    let limit = state.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return closing(ServerError::BodyTooLarge { limit }.into_response());
    }
    let read = collect(body, limit);
    let bytes = match deadline {
        Some(d) => match tokio::time::timeout(d, read).await {
            Ok(r) => r,
            Err(_) => return timed_out(d),
        },
        None => read.await,
    };
    match bytes {
        Ok(b) => next.run(Request::from_parts(parts, Body::from(b))).await,
        Err(e) => closing(e.into_response()),
    }
}

/// A streamed body that fails once its deadline passes.
struct DeadlineBody {
    inner: Body,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(axum::Error::new(
                    "the request body did not arrive within --body-read-timeout",
                ))));
            }
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn json_routes_need_json() {
        let ok = |p, hs| check_content_type(p, &h(hs)).is_ok();
        let json = [("content-type", "application/json; charset=utf-8")];
        assert!(ok("/v1/completions", &json));
        assert!(ok(
            "/v1/completions",
            &[("content-type", "Application/JSON")]
        ));
        assert!(!ok("/v1/completions", &[("content-type", "text/plain")]));
        let form = [("content-type", "application/x-www-form-urlencoded")];
        assert!(!ok("/v1/batches", &form));
        assert!(!ok("/v1/completions", &[("content-length", "12")]));
        // A body-less cancel from a CLI passes; from a browser it does not.
        assert!(ok("/v1/batches/b/cancel", &[("content-length", "0")]));
        assert!(ok("/v1/batches/b/cancel", &[]));
        let browser = [("content-length", "0"), ("origin", "http://evil.example")];
        assert!(!ok("/v1/batches/b/cancel", &browser));
        assert!(ok("/v1/batches/b/cancel", &json));
        // The upload takes multipart only.
        let mp = [("content-type", "multipart/form-data; boundary=x")];
        assert!(ok("/v1/files", &mp));
        assert!(!ok("/v1/files", &json));
        let e = check_content_type("/v1/completions", &h(&[("content-type", "text/plain")]))
            .unwrap_err();
        assert_eq!(
            (e.status, e.code.as_deref()),
            (415, Some("unsupported_media_type"))
        );
    }
}
