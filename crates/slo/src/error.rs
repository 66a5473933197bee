//! Why a request's SLO fields were refused; each names the field or header at fault.

/// A bad SLO field (400) or a class the caller's key may not use (403).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SloError {
    /// An unknown class name in the body or `x-slo-class`.
    #[error("{reason}")]
    Class { param: &'static str, reason: String },
    /// A target that is not a positive, finite number of milliseconds.
    #[error("{param} must be a positive number of milliseconds, got {value}")]
    Target { param: &'static str, value: String },
    /// The key is capped at batch and the request asked for interactive.
    #[error("this API key may only make batch requests (slo_class 'interactive' is not allowed)")]
    Forbidden,
}

impl SloError {
    /// The request field or header the error is about.
    pub fn param(&self) -> &'static str {
        match self {
            SloError::Class { param, .. } | SloError::Target { param, .. } => param,
            SloError::Forbidden => "slo_class",
        }
    }

    /// The HTTP status it maps to.
    pub fn status(&self) -> u16 {
        match self {
            SloError::Forbidden => 403,
            _ => 400,
        }
    }
}
