//! The Batch API's Prometheus families (declared once, below) and counters:
//! lines by result, tokens, and jobs by status.

use std::sync::atomic::{AtomicU64, Ordering};

use sloserve_api::prom::Writer;

use crate::store::{LineUsage, Store};
use crate::types::BatchStatus;

sloserve_api::families! { ALL;
    REQUESTS = Counter "sloserve:batch_requests_total" ["status"]
        "Batch lines finished since start, by result.";
    PROMPT_TOKENS = Counter "sloserve:batch_prompt_tokens_total" []
        "Prompt tokens of batch lines finished since start.";
    GENERATION_TOKENS = Counter "sloserve:batch_generation_tokens_total" []
        "Tokens generated for batch lines since start.";
    JOBS = Gauge "sloserve:batch_jobs" ["status"]
        "Batch jobs in the store, by status.";
}

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

    /// Appends the batch metrics (the families above) to `/metrics`.
    pub fn render(&self, store: &Store, w: &mut Writer) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        w.head(&REQUESTS);
        w.sample(&REQUESTS, &[&"completed"], g(&self.completed));
        w.sample(&REQUESTS, &[&"failed"], g(&self.failed));
        w.single(&PROMPT_TOKENS, &[], g(&self.prompt_tokens));
        w.single(&GENERATION_TOKENS, &[], g(&self.generation_tokens));
        w.head(&JOBS);
        let counts = store.batch_status_counts().unwrap_or_default();
        for s in BatchStatus::ALL {
            let n = counts
                .iter()
                .find(|(k, _)| k == s.as_str())
                .map_or(0, |(_, n)| *n);
            w.sample(&JOBS, &[&s.as_str()], n as f64);
        }
    }
}
