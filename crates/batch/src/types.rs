//! The Batch API's wire shapes, as OpenAI defines them: file and batch objects,
//! lists, the create request, and the input and output lines of a batch file.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether a batch may target `url` (the endpoint table's batchable rows).
pub fn is_batch_url(url: &str) -> bool {
    sloserve_api::Endpoint::from_batch_url(url).is_some()
}

/// The URLs a batch may target, for messages: "/v1/completions or ...".
pub fn batch_urls_text() -> String {
    sloserve_api::endpoints::batch_urls()
        .collect::<Vec<_>>()
        .join(" or ")
}

/// The one completion window OpenAI accepts.
pub const COMPLETION_WINDOW: &str = "24h";

/// `{id, object: "file", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileObject {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: u64,
    pub expires_at: Option<u64>,
    pub filename: String,
    pub purpose: String,
    pub status: String,
    pub status_details: Option<String>,
}

/// `{object: "list", data, first_id, last_id, has_more}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListObject<T> {
    pub object: String,
    pub data: Vec<T>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

impl<T> ListObject<T> {
    pub fn new(data: Vec<T>, has_more: bool, id: impl Fn(&T) -> String) -> Self {
        ListObject {
            object: "list".into(),
            first_id: data.first().map(&id),
            last_id: data.last().map(&id),
            data,
            has_more,
        }
    }
}

/// `DELETE /v1/files/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

/// `POST /v1/batches`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    pub input_file_id: String,
    pub endpoint: String,
    pub completion_window: String,
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// Accepted and ignored: outputs follow `--batch-retention`.
    #[serde(default)]
    pub output_expires_after: Option<Value>,
}

/// A batch's lifecycle (OpenAI's eight statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    pub const ALL: [BatchStatus; 8] = [
        BatchStatus::Validating,
        BatchStatus::Failed,
        BatchStatus::InProgress,
        BatchStatus::Finalizing,
        BatchStatus::Completed,
        BatchStatus::Expired,
        BatchStatus::Cancelling,
        BatchStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }

    /// No more work will happen.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            BatchStatus::Failed
                | BatchStatus::Completed
                | BatchStatus::Expired
                | BatchStatus::Cancelled
        )
    }
}

/// One entry of a batch's `errors` (validation failures, with line numbers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchErrors {
    pub object: String,
    pub data: Vec<BatchError>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u64,
}

/// Token usage of a batch (OpenAI's `BatchUsage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchUsage {
    pub input_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u64,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u64,
}

/// sloserve's extension of the batch object: speed, ETA and price.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchProgress {
    /// Output tokens per second since the job (re)started.
    pub tokens_per_second: Option<f64>,
    /// Seconds to finish at the current rate.
    pub eta_seconds: Option<f64>,
    /// Engine time the batch's lines used (their share of each engine step).
    pub machine_seconds: f64,
    /// `machine_seconds` priced at `--machine-cost-per-hour`, per million output tokens.
    pub cost_per_million_output_tokens: Option<f64>,
}

/// The batch object: every field OpenAI gives, plus `usage` and `sloserve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchObject {
    pub id: String,
    pub object: String,
    pub endpoint: String,
    pub model: Option<String>,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: BatchStatus,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: u64,
    pub in_progress_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub finalizing_at: Option<u64>,
    pub completed_at: Option<u64>,
    pub failed_at: Option<u64>,
    pub expired_at: Option<u64>,
    pub cancelling_at: Option<u64>,
    pub cancelled_at: Option<u64>,
    pub request_counts: RequestCounts,
    pub usage: BatchUsage,
    pub metadata: Option<serde_json::Map<String, Value>>,
    pub sloserve: BatchProgress,
}

/// One line of an input file.
#[derive(Debug, Clone, Deserialize)]
pub struct InputLine {
    pub custom_id: String,
    pub method: String,
    pub url: String,
    pub body: Value,
}

/// The `response` of an output or error line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineResponse {
    pub status_code: u16,
    pub request_id: String,
    pub body: Value,
}

/// The `error` of a line that got no response (cancelled, expired).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineError {
    pub code: String,
    pub message: String,
}

/// One line of an output or error file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputLine {
    pub id: String,
    pub custom_id: String,
    pub response: Option<LineResponse>,
    pub error: Option<LineError>,
}

impl OutputLine {
    /// Goes to the output file (a 2xx response), else to the error file.
    pub fn is_success(&self) -> bool {
        self.response
            .as_ref()
            .is_some_and(|r| (200..300).contains(&r.status_code))
    }
}
