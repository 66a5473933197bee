//! From engine token events to text: [`StopMatcher`] (stop strings matched across
//! token boundaries, holding back a possible stop prefix, never emitting the stop
//! string) and [`Generation`], one submitted request driven by `recv().await`. It
//! owns the `RequestStream`, so dropping it (a client disconnect drops the response
//! body) cancels the request at the engine's next step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sloserve_api::{PromptTokensDetails, SloTimings, Usage};
use sloserve_engine::{Event, FinishInfo, FinishReason, RequestStream, SloClass};
use sloserve_model::detokenizer::StreamDecoder;

use crate::state::{AppState, InflightGuard};

/// Stop-string matching over a stream of text pieces.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What a piece of text releases.
#[derive(Debug, PartialEq)]
pub enum StopOutcome {
    /// Text that can be emitted (possibly empty: all held back).
    Emit(String),
    /// A stop string matched; this text preceded it. Generation ends.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Emit(piece.to_string());
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(i) = first {
            let before = self.held[..i].to_string();
            self.held.clear();
            return StopOutcome::Stopped(before);
        }
        // Hold back the longest suffix that could start a stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep_from);
        StopOutcome::Emit(std::mem::replace(&mut self.held, rest))
    }

    /// Releases what is held back (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// A generated token's logprob data, for the response's logprobs.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
    /// Offset of the token's text in the completion text.
    pub offset: usize,
}

/// New output: text and the logprobs of the tokens it covers (when asked).
#[derive(Debug, Default)]
pub struct Delta {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

/// One request in flight.
pub struct Generation {
    pub state: Arc<AppState>,
    pub id: String,
    pub class: SloClass,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    stream: Option<RequestStream>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    want_logprobs: bool,
    pending_lp: Vec<TokenLogprob>,
    text_len: usize,
    submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    finish: Option<FinishInfo>,
    /// "stop" / "length", or "error" / "cancelled" (engine failure or abort).
    pub finish_reason: Option<&'static str>,
    pub error: Option<String>,
    ended: Option<Instant>,
    _inflight: InflightGuard,
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3)
}

impl Generation {
    pub fn new(
        state: &Arc<AppState>,
        id: String,
        stream: RequestStream,
        class: SloClass,
        prompt_tokens: usize,
        stops: Vec<String>,
        want_logprobs: bool,
    ) -> Self {
        Generation {
            state: state.clone(),
            id,
            class,
            prompt_tokens,
            completion_tokens: 0,
            stream: Some(stream),
            decoder: StreamDecoder::new(true),
            stop: StopMatcher::new(stops),
            want_logprobs,
            pending_lp: Vec::new(),
            text_len: 0,
            submitted: Instant::now(),
            first_token: None,
            last_token: None,
            finish: None,
            finish_reason: None,
            error: None,
            ended: None,
            _inflight: InflightGuard::new(state),
        }
    }

    fn take_delta(&mut self, text: String) -> Option<Delta> {
        if text.is_empty() && self.pending_lp.is_empty() {
            return None;
        }
        Some(Delta {
            text,
            logprobs: std::mem::take(&mut self.pending_lp),
        })
    }

    /// The next output, or `None` once finished (see `finish_reason`).
    pub async fn next(&mut self) -> Option<Delta> {
        loop {
            let stream = self.stream.as_mut()?;
            match stream.recv().await {
                Some(Event::Token {
                    id,
                    logprob,
                    top_logprobs,
                    time,
                }) => {
                    self.completion_tokens += 1;
                    if let Some(prev) = self.last_token {
                        let itl = time.saturating_duration_since(prev);
                        self.state.metrics.observe_itl(self.class, itl);
                    } else {
                        self.first_token = Some(time);
                    }
                    self.last_token = Some(time);
                    let piece = self.decoder.push(&self.state.tokenizer, id).to_string();
                    if self.want_logprobs {
                        self.pending_lp.push(TokenLogprob {
                            id,
                            logprob: logprob.unwrap_or(0.0),
                            top: top_logprobs,
                            offset: self.text_len,
                        });
                    }
                    self.text_len += piece.len();
                    match self.stop.push(&piece) {
                        StopOutcome::Emit(t) => {
                            if let Some(d) = self.take_delta(t) {
                                return Some(d);
                            }
                        }
                        StopOutcome::Stopped(t) => {
                            // Dropping the stream cancels the request in the engine.
                            self.stream = None;
                            self.end("stop", None);
                            self.state.metrics.observe_partial(
                                self.class,
                                self.first_token
                                    .map(|t| t.saturating_duration_since(self.submitted)),
                                self.submitted.elapsed(),
                                "stop",
                            );
                            return self.take_delta(t);
                        }
                    }
                }
                Some(Event::Finished(info)) => {
                    self.stream = None;
                    let rest = self.decoder.flush();
                    let mut text = match self.stop.push(&rest) {
                        StopOutcome::Emit(t) => t,
                        StopOutcome::Stopped(t) => {
                            self.end("stop", None);
                            t
                        }
                    };
                    text.push_str(&self.stop.finish());
                    if self.finish_reason.is_none() {
                        let (reason, err) = match &info.reason {
                            FinishReason::Stop => ("stop", None),
                            FinishReason::Length => ("length", None),
                            FinishReason::Cancelled => (
                                "cancelled",
                                Some(
                                    "the request was cancelled (server shutting down)".to_string(),
                                ),
                            ),
                            FinishReason::Error(m) => ("error", Some(m.clone())),
                        };
                        self.end(reason, err);
                    }
                    self.state.metrics.observe_finished(self.class, &info);
                    self.finish = Some(info);
                    return self.take_delta(text);
                }
                None => {
                    self.stream = None;
                    self.end(
                        "error",
                        Some("the engine stopped without finishing the request".into()),
                    );
                    return None;
                }
            }
        }
    }

    fn end(&mut self, reason: &'static str, error: Option<String>) {
        self.finish_reason = Some(reason);
        self.error = error;
        self.ended = Some(Instant::now());
    }

    pub fn wants_logprobs(&self) -> bool {
        self.want_logprobs
    }

    /// Whether it ended in an engine error or abort (no usable completion).
    pub fn failed(&self) -> bool {
        matches!(self.finish_reason, Some("error") | Some("cancelled"))
    }

    /// Token counts, cached tokens and where the time went. From the engine's
    /// timings when it finished the request; measured here when a stop string
    /// ended it (queue and prefill times are then unknown).
    pub fn usage(&self) -> Usage {
        let completion = self.completion_tokens;
        let (timings, cached) = match &self.finish {
            Some(f) => {
                let t = &f.timings;
                (
                    SloTimings {
                        slo_class: self.class.as_str().into(),
                        queue_ms: ms(t.queue_time()),
                        ttft_ms: ms(t.ttft()),
                        prefill_ms: ms(t.prefill_time()),
                        decode_ms: ms(t.decode_time()),
                        e2e_ms: ms(t.e2e()),
                        tpot_ms: ms(t.mean_inter_token(f.completion_tokens)),
                        cached_prompt_tokens: f.cached_prompt_tokens as u32,
                        preemptions: t.preemptions,
                        ttft_target_ms: f.slo.targets.ttft_ms,
                        tpot_target_ms: f.slo.targets.tpot_ms,
                        ttft_met: f.slo.ttft_met,
                        tpot_met: f.slo.tpot_met,
                    },
                    f.cached_prompt_tokens,
                )
            }
            None => {
                let decode = match (self.first_token, self.last_token) {
                    (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
                    _ => None,
                };
                (
                    SloTimings {
                        slo_class: self.class.as_str().into(),
                        queue_ms: None,
                        ttft_ms: ms(self
                            .first_token
                            .map(|t| t.saturating_duration_since(self.submitted))),
                        prefill_ms: None,
                        decode_ms: ms(decode),
                        e2e_ms: ms(self
                            .ended
                            .map(|t| t.saturating_duration_since(self.submitted))),
                        tpot_ms: ms(decode
                            .filter(|_| completion > 1)
                            .map(|d| d / (completion as u32 - 1))),
                        cached_prompt_tokens: 0,
                        preemptions: 0,
                        ..SloTimings::default()
                    },
                    0,
                )
            }
        };
        Usage {
            prompt_tokens: self.prompt_tokens as u32,
            completion_tokens: completion as u32,
            total_tokens: (self.prompt_tokens + completion) as u32,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: cached as u32,
            }),
            sloserve: Some(timings),
        }
    }

    /// The text of one token (lossy UTF-8), for logprobs.
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.state.tokenizer.token_bytes_ref(id)).into_owned()
    }

    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.state.tokenizer.token_bytes(id)
    }
}

/// The targets a finished request missed, for its log line: "" or e.g. "ttft,tpot".
fn missed_targets(t: &SloTimings) -> &'static str {
    match (t.ttft_met == Some(false), t.tpot_met == Some(false)) {
        (false, false) => "",
        (true, false) => "ttft",
        (false, true) => "tpot",
        (true, true) => "ttft,tpot",
    }
}

impl Drop for Generation {
    /// One structured log line per request, however it ended.
    fn drop(&mut self) {
        let u = self.usage();
        let t = u.sloserve.unwrap_or_default();
        let reason = self.finish_reason.unwrap_or("client_disconnected");
        if reason == "client_disconnected" {
            self.state.metrics.observe_disconnect(self.class);
        }
        tracing::info!(
            target: "sloserve::request",
            id = %self.id,
            class = self.class.as_str(),
            prompt_tokens = u.prompt_tokens,
            completion_tokens = u.completion_tokens,
            cached_tokens = t.cached_prompt_tokens,
            queue_ms = t.queue_ms.unwrap_or(-1.0),
            ttft_ms = t.ttft_ms.unwrap_or(-1.0),
            e2e_ms = t.e2e_ms.unwrap_or_else(|| self.submitted.elapsed().as_secs_f64() * 1e3),
            preemptions = t.preemptions,
            finish_reason = reason,
            slo_missed = missed_targets(&t),
            "request finished"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Emit(t) => out.push_str(&t),
                StopOutcome::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_across_pieces() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            run(&["END"], &["abc E", "N", "D more"]),
            ("abc ".into(), true)
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "x"]),
            ("abc ENx".into(), false)
        );
        assert_eq!(
            run(&["\n\n", "xy"], &["a\n", "b x", "y"]),
            ("a\nb ".into(), true)
        );
        // The earliest match wins, whichever stop string it is.
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
        // Multi-byte characters are never split.
        assert_eq!(run(&["日本"], &["é日", "x日本"]), ("é日x".into(), true));
        assert_eq!(run(&["ab"], &["a"]), ("a".into(), false));
    }

    #[test]
    fn held_text_is_only_a_possible_prefix() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("xxST"), StopOutcome::Emit("xx".into()));
        assert_eq!(m.push("AR"), StopOutcome::Emit("STAR".into()));
        assert_eq!(m.push("S"), StopOutcome::Emit("".into()));
        assert_eq!(m.push("TOP"), StopOutcome::Stopped("".into()));
    }
}
