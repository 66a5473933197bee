//! The Batch API's Prometheus counters: lines by result, tokens, and jobs by status.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{LineUsage, Store};
use crate::types::BatchStatus;

#[derive(Default)]
pub struct Counters {
    completed: AtomicU64,
    failed: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
}

impl Counters {
    pub(crate) fn line(&self, ok: bool, u: &LineUsage) {
        let c = if ok { &self.completed } else { &self.failed };
        c.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(u.input_tokens, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(u.output_tokens, Ordering::Relaxed);
    }

    /// Appends the batch metrics in Prometheus' text format.
    pub fn render(&self, store: &Store, out: &mut String) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP sloserve:batch_requests_total Batch lines finished since start, by result."
        );
        let _ = writeln!(out, "# TYPE sloserve:batch_requests_total counter");
        let _ = writeln!(
            out,
            "sloserve:batch_requests_total{{status=\"completed\"}} {}",
            g(&self.completed)
        );
        let _ = writeln!(
            out,
            "sloserve:batch_requests_total{{status=\"failed\"}} {}",
            g(&self.failed)
        );
        let _ = writeln!(out, "# HELP sloserve:batch_prompt_tokens_total Prompt tokens of batch lines finished since start.");
        let _ = writeln!(out, "# TYPE sloserve:batch_prompt_tokens_total counter");
        let _ = writeln!(
            out,
            "sloserve:batch_prompt_tokens_total {}",
            g(&self.prompt_tokens)
        );
        let _ = writeln!(out, "# HELP sloserve:batch_generation_tokens_total Tokens generated for batch lines since start.");
        let _ = writeln!(out, "# TYPE sloserve:batch_generation_tokens_total counter");
        let _ = writeln!(
            out,
            "sloserve:batch_generation_tokens_total {}",
            g(&self.generation_tokens)
        );
        let _ = writeln!(
            out,
            "# HELP sloserve:batch_jobs Batch jobs in the store, by status."
        );
        let _ = writeln!(out, "# TYPE sloserve:batch_jobs gauge");
        let counts = store.batch_status_counts().unwrap_or_default();
        for s in BatchStatus::ALL {
            let n = counts
                .iter()
                .find(|(k, _)| k == s.as_str())
                .map_or(0, |(_, n)| *n);
            let _ = writeln!(out, "sloserve:batch_jobs{{status=\"{}\"}} {n}", s.as_str());
        }
    }
}
