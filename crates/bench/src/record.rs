//! What one request looked like from the client: send time, content-chunk timestamps, usage.

use serde::{Deserialize, Serialize};

/// One request's client-side trace. Times are seconds (f64): `send_s` is
/// relative to the start of the measured run of its point, every other time is
/// relative to this request's own send.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Index of the request in the workload.
    pub id: usize,
    /// SLO class sent with the request (`--slo-class`), if any.
    pub class: Option<String>,
    /// When the load driver issued the request (decided to send it, within the
    /// run's deadline), seconds after the run's start.
    pub send_s: f64,
    /// Arrival time of every chunk that carried generated text, seconds after send.
    /// Chunks without text (role-only deltas, usage-only chunks) are not here.
    pub chunk_s: Vec<f64>,
    /// End of the stream (`data: [DONE]` or the body's end), seconds after send.
    pub end_s: f64,
    /// `usage.prompt_tokens` as the server reported it.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens` as the server reported it.
    pub completion_tokens: Option<u64>,
    /// Prompt length the workload aimed at (words ≈ tokens), used when the server gives no usage.
    pub expected_prompt_tokens: u64,
    /// `max_tokens` sent.
    pub max_tokens: u64,
    /// `finish_reason` of the last choice that had one.
    pub finish_reason: Option<String>,
    /// Why the request failed (HTTP status and body, error JSON, transport error, timeout).
    pub error: Option<String>,
    /// Whether the request met the TTFT / TPOT target the server judged it by
    /// (sloserve's `usage.sloserve.ttft_met` / `tpot_met`; `None` without one).
    #[serde(default)]
    pub server_ttft_met: Option<bool>,
    #[serde(default)]
    pub server_tpot_met: Option<bool>,
}

impl RequestRecord {
    /// A request succeeded when it has no error (the client sets an error when
    /// the stream carried no generated text at all).
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Whether the server reported `usage` for this request.
    pub fn usage_reported(&self) -> bool {
        self.completion_tokens.is_some()
    }

    /// Output tokens: the server's `usage.completion_tokens`, or the number of
    /// content chunks when the server reported no usage.
    pub fn output_tokens(&self) -> u64 {
        self.completion_tokens.unwrap_or(self.chunk_s.len() as u64)
    }

    /// Input tokens: the server's `usage.prompt_tokens`, or the workload's estimate.
    pub fn input_tokens(&self) -> u64 {
        self.prompt_tokens.unwrap_or(self.expected_prompt_tokens)
    }
}
