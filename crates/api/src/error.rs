//! `ApiError`: an HTTP status plus OpenAI's error body
//! `{"error": {"message", "type", "param", "code"}}`.

use serde::{Deserialize, Serialize};

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

/// An error as the client sees it: status code and OpenAI-shaped body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 about field `param` (the message should name it too).
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message).with_param(param)
    }

    /// 400 not tied to one field (e.g. malformed JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message)
    }

    /// 404 for a model name this server does not serve.
    pub fn model_not_found(name: &str, served: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            format!("The model `{name}` does not exist (this server serves `{served}`)"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 404 for an object (file, batch) that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "invalid_request_error", message).with_code("not_found")
    }

    /// 409: the object is in a state that does not allow the operation.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "invalid_request_error", message).with_code("conflict")
    }

    /// 404 for an unknown path.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            format!("no route for {method} {path}"),
        )
        .with_code("not_found")
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            "invalid_request_error",
            format!("method {method} is not allowed on {path}"),
        )
        .with_code("method_not_allowed")
    }

    /// 413: the body exceeds `limit` bytes.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "invalid_request_error",
            format!("request body too large: the limit is {limit} bytes"),
        )
        .with_code("request_too_large")
    }

    /// 401: no API key, or a wrong one (OpenAI's shape and code).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, "invalid_request_error", message).with_code("invalid_api_key")
    }

    /// 403: the API key does not allow what `param` asks for.
    pub fn forbidden(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(403, "permission_error", message)
            .with_param(param)
            .with_code("permission_denied")
    }

    /// 429: the class's queue is full or its TTFT SLO cannot be met now.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(429, "rate_limit_exceeded", message).with_code("rate_limit_exceeded")
    }

    /// 503: the server is draining or the engine stopped.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "service_unavailable", message).with_code("service_unavailable")
    }

    /// 408: the request's deadline passed before it finished.
    pub fn timed_out(message: impl Into<String>) -> Self {
        Self::new(408, "timeout_error", message).with_code("request_timeout")
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message).with_code("internal_error")
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: self.code.clone(),
            },
        }
    }

    /// The body as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#.into()
        })
    }
}

/// A refused SLO field: 400 naming the field or header, or 403 for a class the
/// key may not use.
impl From<sloserve_slo::SloError> for ApiError {
    fn from(e: sloserve_slo::SloError) -> Self {
        match e.status() {
            403 => ApiError::forbidden(e.param(), e.to_string()),
            _ => ApiError::invalid(e.param(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_openai_shape() {
        let e = ApiError::invalid("temperature", "temperature must be in [0, 2]");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert!(v["error"]["code"].is_null());
        assert_eq!(e.status, 400);
        let nf = ApiError::model_not_found("gpt-4", "smol");
        assert_eq!(nf.status, 404);
        assert_eq!(nf.code.as_deref(), Some("model_not_found"));
    }
}
