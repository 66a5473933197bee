//! A request's accounting: the tokens the client got, and its timeline as the
//! engine's [`RequestTimings`] (what the server saw of it until the engine's
//! `Finished` brings the engine's own), reported as `usage`.

use std::time::{Duration, Instant};

use sloserve_api::{PromptTokensDetails, SloTimings, Usage};
use sloserve_engine::{FinishInfo, RequestTimings, SloClass, SloReport};

#[derive(Debug)]
pub struct Accounting {
    class: SloClass,
    prompt_tokens: usize,
    /// Tokens handed to the client (none after a stop string's token).
    completion_tokens: usize,
    cached_prompt_tokens: usize,
    timings: RequestTimings,
    /// Tokens `timings` covers (the engine's count once it finished the request).
    timed_tokens: usize,
    /// The request's targets and whether it met them (the engine's judgement).
    slo: SloReport,
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3)
}

impl Accounting {
    /// A request of `class` with `prompt_tokens`, submitted now.
    pub fn new(class: SloClass, prompt_tokens: usize) -> Self {
        Accounting {
            class,
            prompt_tokens,
            completion_tokens: 0,
            cached_prompt_tokens: 0,
            timings: RequestTimings::new(Instant::now()),
            timed_tokens: 0,
            slo: SloReport::default(),
        }
    }

    pub fn class(&self) -> SloClass {
        self.class
    }

    /// A token handed to the client, sampled at `t`; returns the gap since the
    /// previous one (the inter-token latency).
    pub fn on_token(&mut self, t: Instant) -> Option<Duration> {
        let gap = self
            .timings
            .last_token
            .map(|p| t.saturating_duration_since(p));
        self.completion_tokens += 1;
        self.timed_tokens += 1;
        self.timings.on_token(t);
        gap
    }

    /// The engine finished the request: its timings and cache hits are the truth.
    pub fn on_finished(&mut self, info: &FinishInfo) {
        self.timings = info.timings.clone();
        self.timed_tokens = info.completion_tokens;
        self.cached_prompt_tokens = info.cached_prompt_tokens;
        self.slo = info.slo;
    }

    /// Tokens handed to the client so far.
    pub fn tokens(&self) -> usize {
        self.completion_tokens
    }

    /// The targets the request missed, for its log line.
    pub fn missed_targets(&self) -> &'static str {
        self.slo.missed()
    }

    /// Time since submission (for a request the engine never finished).
    pub fn elapsed(&self) -> Duration {
        self.timings.arrival.elapsed()
    }

    /// Token counts, cached tokens and where the time went.
    pub fn usage(&self) -> Usage {
        let t = &self.timings;
        let completion = self.completion_tokens;
        let cached = self.cached_prompt_tokens as u32;
        Usage {
            prompt_tokens: self.prompt_tokens as u32,
            completion_tokens: completion as u32,
            total_tokens: (self.prompt_tokens + completion) as u32,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: cached,
            }),
            completion_tokens_details: None,
            sloserve: Some(SloTimings {
                slo_class: self.class.as_str().into(),
                queue_ms: ms(t.queue_time()),
                ttft_ms: ms(t.ttft()),
                prefill_ms: ms(t.prefill_time()),
                decode_ms: ms(t.decode_time()),
                e2e_ms: ms(t.e2e()),
                tpot_ms: ms(t.mean_inter_token(self.timed_tokens)),
                cached_prompt_tokens: cached,
                preemptions: t.preemptions,
                engine_ms: ms(Some(t.engine_time)),
                ttft_target_ms: self.slo.targets.ttft_ms,
                tpot_target_ms: self.slo.targets.tpot_ms,
                ttft_met: self.slo.ttft_met,
                tpot_met: self.slo.tpot_met,
            }),
        }
    }
}

/// The usage of a request with several choices (`n` > 1), from each choice's
/// own: the prompt counted once, completion tokens summed; cached tokens and
/// timings are the first choice's (it prefilled the prompt the others reused).
pub fn merge_choices(usages: Vec<Usage>) -> Usage {
    let mut it = usages.into_iter();
    let mut u = it.next().unwrap_or_default();
    for o in it {
        u.completion_tokens += o.completion_tokens;
        if let (Some(d), Some(od)) = (
            &mut u.completion_tokens_details,
            o.completion_tokens_details,
        ) {
            d.reasoning_tokens += od.reasoning_tokens;
        }
    }
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use sloserve_engine::FinishReason;

    #[test]
    fn engine_timings_replace_the_servers_but_not_the_clients_token_count() {
        let mut a = Accounting::new(SloClass::Batch, 7);
        let t0 = Instant::now();
        let ms_ = Duration::from_millis;
        assert_eq!(a.on_token(t0), None);
        assert_eq!(a.on_token(t0 + ms_(4)), Some(ms_(4)));
        let s = a.usage().sloserve.unwrap();
        assert_eq!((s.queue_ms, s.prefill_ms, s.e2e_ms), (None, None, None));
        assert_eq!(s.decode_ms, Some(4.0));
        // The engine ran one more token (after a stop string) before it finished.
        let mut timings = RequestTimings::new(t0 - ms_(10));
        timings.first_scheduled = Some(t0 - ms_(8));
        timings.on_token(t0);
        timings.on_token(t0 + ms_(4));
        timings.on_token(t0 + ms_(8));
        timings.finish = Some(t0 + ms_(9));
        a.on_finished(&FinishInfo {
            reason: FinishReason::StopString,
            prompt_tokens: 7,
            completion_tokens: 3,
            cached_prompt_tokens: 5,
            timings,
            slo: SloReport::default(),
        });
        let u = a.usage();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (7, 2, 9)
        );
        assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, 5);
        let s = u.sloserve.unwrap();
        assert_eq!(s.slo_class, "batch");
        assert_eq!((s.queue_ms, s.prefill_ms), (Some(2.0), Some(8.0)));
        assert_eq!(
            (s.ttft_ms, s.e2e_ms, s.tpot_ms),
            (Some(10.0), Some(19.0), Some(4.0))
        );
        assert_eq!(s.cached_prompt_tokens, 5);
    }
}
