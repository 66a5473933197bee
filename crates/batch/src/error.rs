//! The batch crate's one error enum and its one mapping to OpenAI's error shape.

use sloserve_api::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("No such {kind}: {id}")]
    NotFound { kind: &'static str, id: String },
    #[error("{message}")]
    Invalid {
        param: &'static str,
        message: String,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("the file is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("this upload would take the files held by this API key over its quota of {quota} bytes (it holds {held}; delete files to make room)")]
    QuotaExceeded { quota: u64, held: u64 },
    #[error("batch storage failed: {0}")]
    Storage(String),
}

impl Error {
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid {
            param,
            message: message.into(),
        }
    }

    /// The status code and body a client gets.
    pub fn to_api(&self) -> ApiError {
        match self {
            Error::NotFound { .. } => ApiError::not_found(self.to_string()),
            Error::Invalid { param, message } => ApiError::invalid(*param, message.clone()),
            Error::Conflict(m) => ApiError::conflict(m.clone()),
            Error::TooLarge { limit } => ApiError::too_large(*limit as usize),
            Error::QuotaExceeded { .. } => ApiError {
                status: 413,
                message: self.to_string(),
                kind: "invalid_request_error",
                param: Some("file".into()),
                code: Some("quota_exceeded".into()),
            },
            Error::Storage(_) => ApiError::internal("batch storage failed; see the server log"),
        }
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Storage(format!("sqlite: {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Storage(format!("file store: {e}"))
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Storage(format!("stored JSON: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, Error>;
