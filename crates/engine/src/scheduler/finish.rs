//! After a step ran: sampling each logits row with its sequence's sampler, stop
//! checks, prefix-cache inserts, the step-time observation; and the ways requests
//! leave (finished, cancelled by the client, failed).

use std::time::{Duration, Instant};

use super::Scheduler;
use crate::event::FinishReason;
use crate::request::SloClass;
use crate::runner::{Batch, Logits};
use crate::sequence::Sequence;
use crate::stats::Counters;

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StepOutcome {
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    /// Seconds from the start of `execute` to the end of postprocessing.
    pub secs: f64,
}

impl Scheduler {
    /// Takes the results of the planned step (`batch` as built by `schedule`,
    /// `logits` from the runner, which took `secs` with postprocessing): appends
    /// sampled tokens (a verification row's accepted draft and one more), sends
    /// events, caches newly full blocks, checks stops.
    pub fn postprocess(&mut self, batch: &Batch, logits: &Logits, t: Instant) -> StepOutcome {
        let mut out = StepOutcome::default();
        let (mut row, mut hidden_row) = (0, 0);
        for k in 0..self.step_seqs.len() {
            let (entry, i) = (batch.seqs[k], self.step_seqs[k]);
            let s = &mut self.running[i];
            s.clear_scheduled();
            if s.pools() {
                out.prefill_tokens += entry.num_tokens;
                let start = s.num_computed();
                s.advance_computed(entry.num_tokens);
                let at = if entry.hidden {
                    &mut hidden_row
                } else {
                    &mut row
                };
                s.take_pooled(logits, &entry, *at, start);
                *at += entry.num_rows();
                self.cache_full_blocks(i);
                continue;
            }
            if entry.num_logits > 1 && !s.draft().is_empty() {
                out.decode_tokens += 1;
                self.verify(i, logits, row, t);
                row += entry.num_logits;
                self.cache_full_blocks(i);
                continue;
            }
            if s.is_decoding() {
                out.decode_tokens += 1;
            } else {
                out.prefill_tokens += entry.num_tokens;
            }
            let start = s.num_computed();
            s.advance_computed(entry.num_tokens);
            self.cache_full_blocks(i);
            let rows = entry.num_logits.min(entry.num_tokens);
            if rows > 0 {
                let s = &mut self.running[i];
                let end = start + entry.num_tokens;
                if s.scores_prompt() {
                    // A scoring prefill chunk: a row per position (the last one
                    // also samples when the chunk ends the sequence).
                    s.send_prompt_scores(logits, row, end - rows, rows);
                }
                if end == s.tokens().len() && s.finish_reason().is_none() {
                    s.emit(logits.row(row + rows - 1), t, &mut self.counters);
                }
                row += rows;
            }
        }
        self.counters.prefill_tokens += out.prefill_tokens as u64;
        self.counters.steps += 1;
        out
    }

    /// Offers running sequence `i`'s newly full blocks to the prefix cache.
    fn cache_full_blocks(&mut self, i: usize) {
        let Some(cache) = &mut self.cache else {
            return;
        };
        self.running[i].cache_full_blocks(cache, self.pool.block_size());
    }

    /// Feeds the measured seconds of the step just run into the step-time model,
    /// and charges each of its sequences its share (by tokens) of the step.
    pub fn observe_step_time(&mut self, batch: &Batch, secs: f64) {
        let total = batch.tokens.len().max(1) as f64;
        for (k, &i) in self.step_seqs.iter().enumerate() {
            let share = batch.seqs[k].num_tokens as f64 / total;
            self.running[i].charge_engine_time(Duration::from_secs_f64(secs * share));
        }
        let p = &self.planned;
        tracing::trace!(
            step = self.step,
            prefill = p.shape.prefill_tokens,
            decode = p.shape.decode_rows,
            context = p.shape.context_tokens,
            predicted_ms = p.predicted_s * 1e3,
            limit_ms = p.limit_s.unwrap_or(0.0) * 1e3,
            measured_ms = secs * 1e3,
            "step"
        );
        self.cost.observe(&p.shape, secs);
    }

    /// The runner failed the planned step: its sequences fail with `msg`.
    pub fn fail_step(&mut self, msg: &str) {
        self.counters.steps += 1;
        for &i in &self.step_seqs {
            let s = &mut self.running[i];
            s.reset_kv();
            s.finish(FinishReason::Error(msg.to_owned()));
        }
    }

    /// Sheds interactive requests that can no longer start in time (admission
    /// predicted they would, but bursts can make waits longer): one with a TTFT
    /// target once it has waited that target times `ttft_reject_factor`, any
    /// other after twice `max_queue_wait_s`. A clear refusal the client can retry
    /// elsewhere beats a late answer. Batch requests are never shed for their
    /// wait: one still waiting when its own deadline passes finishes `TimedOut`.
    pub(super) fn shed_overdue(&mut self, now: Instant) {
        let adm = &self.cfg.admission;
        let queue_limit = adm.max_queue_wait_s * 2.0;
        let limit = |s: &Sequence| match (s.class(), s.refuse_ttft_ms()) {
            (SloClass::Batch, _) => (
                s.deadline().map_or(f64::INFINITY, |d| d.as_secs_f64()),
                FinishReason::TimedOut,
            ),
            (SloClass::Interactive, Some(ms)) if adm.ttft_reject_factor > 0.0 => {
                (ms / 1e3 * adm.ttft_reject_factor, FinishReason::Shed)
            }
            _ if queue_limit > 0.0 => (queue_limit, FinishReason::Shed),
            _ => (f64::INFINITY, FinishReason::Shed),
        };
        let (counters, released, fair) = (&mut self.counters, &mut self.released, &mut self.fair);
        for (_, q) in self.waiting.iter_mut() {
            q.retain_mut(|s| {
                let waited = now.saturating_duration_since(s.timings().arrival);
                let (limit_s, reason) = limit(s);
                if s.has_started() || waited.as_secs_f64() <= limit_s {
                    return true;
                }
                released[s.class()].record(s, None);
                fair[s.class()].leave(s, false);
                count_finish(counters, &reason);
                s.send_finished(reason, now, &mut counters.slo[s.class()]);
                false
            });
        }
    }

    /// Drops sequences whose client dropped the stream, freeing their blocks.
    pub(super) fn reap_cancelled(&mut self, now: Instant) {
        let (counters, released, fair) = (&mut self.counters, &mut self.released, &mut self.fair);
        for (_, q) in self.waiting.iter_mut() {
            q.retain_mut(|s| {
                if !s.is_cancelled() {
                    return true;
                }
                if !s.has_started() {
                    released[s.class()].record(s, None);
                    fair[s.class()].leave(s, false);
                }
                counters.requests_cancelled += 1;
                s.send_finished(FinishReason::Cancelled, now, &mut counters.slo[s.class()]);
                false
            });
        }
        for s in &mut self.running {
            if s.is_active() && s.is_cancelled() {
                s.finish(FinishReason::Cancelled);
            }
        }
        self.reap_finished(now);
    }

    /// Finishes sequence `id` with `reason`: a running one is marked and reaped, a
    /// waiting one leaves its queue; either way its stream gets `Finished`. Nothing
    /// if no such sequence is left (it already finished).
    pub fn cancel(&mut self, id: u64, reason: FinishReason, now: Instant) {
        if let Some(s) = self.running.iter_mut().find(|s| s.id() == id) {
            s.finish(reason);
            self.reap_finished(now);
            return;
        }
        let (counters, released, fair) = (&mut self.counters, &mut self.released, &mut self.fair);
        for (_, q) in self.waiting.iter_mut() {
            let Some(k) = q.iter().position(|s| s.id() == id) else {
                continue;
            };
            let mut s = q.remove(k).expect("position is in range");
            if !s.has_started() {
                released[s.class()].record(&s, None);
                fair[s.class()].leave(&s, false);
            }
            count_finish(counters, &reason);
            s.send_finished(reason, now, &mut counters.slo[s.class()]);
            return;
        }
    }

    /// Sends `Finished` for and drops every running sequence with a finish reason.
    pub fn reap_finished(&mut self, now: Instant) {
        let (c, last) = (&mut self.counters, &mut self.last_interactive_finish);
        self.running.retain_mut(|s| {
            let Some(reason) = s.finish_reason().cloned() else {
                return true;
            };
            if s.class() == SloClass::Interactive {
                *last = Some(now);
            }
            count_finish(c, &reason);
            s.send_finished(reason, now, &mut c.slo[s.class()]);
            false
        });
    }

    /// Finishes every request, running and waiting, with `reason`.
    pub fn fail_all(&mut self, reason: FinishReason, now: Instant) {
        for s in &mut self.running {
            s.finish(reason.clone());
        }
        self.reap_finished(now);
        let (c, released, fair) = (&mut self.counters, &mut self.released, &mut self.fair);
        for (_, q) in self.waiting.iter_mut() {
            for mut s in q.drain(..) {
                if !s.has_started() {
                    released[s.class()].record(&s, None);
                    fair[s.class()].leave(&s, false);
                }
                count_finish(c, &reason);
                s.send_finished(reason.clone(), now, &mut c.slo[s.class()]);
            }
        }
    }
}

/// Counts a finished request by its reason.
fn count_finish(c: &mut Counters, reason: &FinishReason) {
    match reason {
        FinishReason::Stop | FinishReason::StopString => c.requests_finished_stop += 1,
        FinishReason::Length => c.requests_finished_length += 1,
        FinishReason::Cancelled
        | FinishReason::Aborted
        | FinishReason::TimedOut
        | FinishReason::ClientStalled
        | FinishReason::Shed => c.requests_cancelled += 1,
        FinishReason::Error(_) | FinishReason::Constraint(_) => c.requests_failed += 1,
    }
}
