//! `RouterError` and its one mapping to an HTTP status and OpenAI's error body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sloserve_api::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The request itself is wrong (malformed JSON, unknown class, ...).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The body exceeds the limit.
    #[error("request body too large")]
    BodyTooLarge { limit: usize },
    /// The body could not be read.
    #[error("cannot read the request body: {0}")]
    Body(String),
    /// The body did not arrive within the body-read timeout.
    #[error("the request body did not arrive within {secs} s")]
    BodyTimeout { secs: f64 },
    /// Every replica of the fleet is ejected.
    #[error("no healthy replica in fleet '{fleet}'")]
    NoReplica { fleet: String },
    /// The replica could not be reached or failed before answering.
    #[error("replica {backend} failed: {message}")]
    Upstream { backend: String, message: String },
    /// The replica sent nothing for the upstream timeout.
    #[error("replica {backend} sent nothing for {secs} s")]
    UpstreamTimeout { backend: String, secs: f64 },
    /// The replica's answer did not finish within the request's deadline.
    #[error(
        "replica {backend} did not finish the answer within the request's deadline ({secs} s)"
    )]
    UpstreamDeadline { backend: String, secs: f64 },
    /// No replica of the fleet knows this batch or file id.
    #[error("no replica of fleet '{fleet}' knows '{id}'")]
    UnknownId { fleet: String, id: String },
}

impl RouterError {
    /// A limit that passed while `backend` answered.
    pub fn expired(backend: &str, e: crate::upstream::Expired) -> Self {
        let backend = backend.to_owned();
        match e {
            crate::upstream::Expired::Gap(secs) => RouterError::UpstreamTimeout { backend, secs },
            crate::upstream::Expired::Deadline(secs) => {
                RouterError::UpstreamDeadline { backend, secs }
            }
        }
    }

    /// The client's view of this error.
    pub fn to_api(&self) -> ApiError {
        match self {
            RouterError::Api(e) => e.clone(),
            RouterError::BodyTooLarge { limit } => ApiError::too_large(*limit),
            RouterError::Body(m) => ApiError::bad_request(m.clone()),
            RouterError::NoReplica { .. } => {
                ApiError::unavailable(self.to_string()).with_code("no_healthy_replica")
            }
            RouterError::Upstream { .. } => ApiError {
                status: 502,
                message: self.to_string(),
                kind: "server_error",
                param: None,
                code: Some("bad_gateway".into()),
            },
            RouterError::BodyTimeout { .. } => ApiError {
                status: 408,
                message: self.to_string(),
                kind: "invalid_request_error",
                param: None,
                code: Some("request_timeout".into()),
            },
            RouterError::UpstreamTimeout { .. } => ApiError {
                status: 504,
                message: self.to_string(),
                kind: "server_error",
                param: None,
                code: Some("upstream_timeout".into()),
            },
            RouterError::UpstreamDeadline { .. } => ApiError {
                status: 504,
                message: self.to_string(),
                kind: "server_error",
                param: None,
                code: Some("upstream_deadline".into()),
            },
            RouterError::UnknownId { id, .. } => ApiError {
                status: 404,
                message: self.to_string(),
                kind: "invalid_request_error",
                param: Some(id.clone()),
                code: Some("not_found".into()),
            },
        }
    }

    /// The same error as one Server-Sent Event (for a stream that already began).
    pub fn sse_event(&self) -> String {
        format!("data: {}\n\ndata: [DONE]\n\n", self.to_api().to_json())
    }
}

impl IntoResponse for RouterError {
    fn into_response(self) -> Response {
        let e = self.to_api();
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, e.to_json()).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
