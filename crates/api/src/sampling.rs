//! The sampling fields of a generation request, declared once: [`SamplingFields`]
//! (the body, flattened into chat and completions) and [`Sampling`] (validated,
//! defaults filled in) both come from the one list in `sampling_fields!` below,
//! where each field names its wire type, its validated type and its check.
//! Adding a sampling field: one line here, one in the server's conversion to the
//! engine's `SamplingParams`, and the sampler itself.

use serde::Deserialize;

use crate::common::{StopSpec, MAX_STOP_BYTES, MAX_STOP_STRINGS};
use crate::error::ApiError;

/// Declares the sampling fields: `name: WireType => ValidType = check;` where
/// `check(param, Option<&WireType>) -> Result<ValidType, ApiError>`.
macro_rules! sampling_fields {
    ($( $(#[$meta:meta])* $name:ident: $wire:ty => $valid:ty = $check:expr; )*) => {
        /// The sampling fields of a request body (absent: the default).
        #[derive(Debug, Clone, Default, PartialEq, Deserialize, utoipa::ToSchema)]
        pub struct SamplingFields {
            $( $(#[$meta])* #[serde(default)] pub $name: Option<$wire>, )*
        }

        /// The sampling fields, validated.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Sampling {
            $( pub $name: $valid, )*
        }

        impl SamplingFields {
            /// Checks every field (the first bad one is the error, naming it).
            pub fn validate(&self) -> Result<Sampling, ApiError> {
                Ok(Sampling {
                    $( $name: ($check)(stringify!($name), self.$name.as_ref())?, )*
                })
            }
        }
    };
}

sampling_fields! {
    /// 0-2 (default 1); 0 is greedy.
    temperature: f64 => f32 = range(0.0, 2.0, 1.0);
    /// Nucleus sampling, (0, 1] (default 1: off).
    top_p: f64 => f32 = top_p;
    /// -1 or 0: off; else the k most likely tokens.
    top_k: i64 => usize = top_k;
    /// Drops tokens less likely than `min_p` times the most likely one (0-1).
    min_p: f64 => f32 = range(0.0, 1.0, 0.0);
    seed: i64 => Option<u64> = |_, s: Option<&i64>| Ok::<_, ApiError>(s.map(|&s| s as u64));
    /// One stop string or a list (at most 16), never emitted.
    stop: StopSpec => Vec<String> = stop;
    presence_penalty: f64 => f32 = range(-2.0, 2.0, 0.0);
    frequency_penalty: f64 => f32 = range(-2.0, 2.0, 0.0);
    /// vLLM's: logits of tokens already in the prompt or output divided by it
    /// (0.01-10; default 1: off).
    repetition_penalty: f64 => f32 = range(0.01, 10.0, 1.0);
    /// sloserve/vLLM: keep generating through end-of-sequence (benchmarks).
    ignore_eos: bool => bool = |_, b: Option<&bool>| Ok::<_, ApiError>(b.copied().unwrap_or(false));
    /// Choices per request, 1 to 16 (each its own engine request; choice `i`
    /// samples with `seed + i`; they share the prompt's cached KV blocks).
    n: i64 => u32 = choices;
    /// Completions: accepted equal to `n` only (choices are not ranked here).
    best_of: i64 => Option<u32> = best_of;
    /// Token id (as a string) -> bias added to its logit, -100 to 100 (OpenAI's).
    #[schema(value_type = Option<Object>)]
    logit_bias: serde_json::Map<String, serde_json::Value> => Vec<(u32, f32)> = logit_bias;
}

/// A number in `lo..=hi`, `default` when absent.
fn range(lo: f64, hi: f64, default: f64) -> impl Fn(&str, Option<&f64>) -> Result<f32, ApiError> {
    move |param, v| match v {
        None => Ok(default as f32),
        Some(&x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("{param} must be between {lo} and {hi}, got {x}"),
        )),
    }
}

fn top_p(param: &str, v: Option<&f64>) -> Result<f32, ApiError> {
    let p = range(0.0, 1.0, 1.0)(param, v)?;
    if p <= 0.0 {
        return Err(ApiError::invalid(param, "top_p must be in (0, 1], got 0"));
    }
    Ok(p)
}

fn top_k(param: &str, v: Option<&i64>) -> Result<usize, ApiError> {
    match v.copied() {
        None | Some(-1) | Some(0) => Ok(0),
        Some(k) if k > 0 => Ok(k as usize),
        Some(k) => Err(ApiError::invalid(
            param,
            format!("top_k must be -1 (disabled) or at least 1, got {k}"),
        )),
    }
}

fn stop(param: &str, v: Option<&StopSpec>) -> Result<Vec<String>, ApiError> {
    let stop = v.map(StopSpec::to_vec).unwrap_or_default();
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            param,
            format!(
                "stop: at most {MAX_STOP_STRINGS} stop strings, got {}",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            param,
            "stop: stop strings must not be empty",
        ));
    }
    let bytes: usize = stop.iter().map(String::len).sum();
    if bytes > MAX_STOP_BYTES {
        return Err(ApiError::invalid(
            param,
            format!("stop: at most {MAX_STOP_BYTES} bytes of stop strings in all, got {bytes}"),
        ));
    }
    Ok(stop)
}

/// Most choices per request (`n`).
pub const MAX_CHOICES: i64 = 16;

fn choices(param: &str, v: Option<&i64>) -> Result<u32, ApiError> {
    match v.copied() {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES).contains(&n) => Ok(n as u32),
        Some(n) => Err(ApiError::invalid(
            param,
            format!("{param} must be between 1 and {MAX_CHOICES}, got {n}"),
        )),
    }
}

fn best_of(param: &str, v: Option<&i64>) -> Result<Option<u32>, ApiError> {
    v.map(|&b| choices(param, Some(&b))).transpose()
}

impl Sampling {
    /// Cross-field checks: `best_of`, when given, must equal `n` (sloserve does
    /// not generate extra choices to rank them by likelihood).
    pub fn check_best_of(&self) -> Result<(), ApiError> {
        match self.best_of {
            Some(b) if b != self.n => Err(ApiError::invalid(
                "best_of",
                format!(
                    "best_of must equal n when given (got best_of {b}, n {}): choices are not ranked by likelihood here; ask for n choices instead",
                    self.n
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Most entries in one `logit_bias` (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

fn logit_bias(
    param: &str,
    v: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(m) = v else {
        return Ok(Vec::new());
    };
    if m.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            param,
            format!("{param}: at most {MAX_LOGIT_BIAS} entries, got {}", m.len()),
        ));
    }
    m.iter()
        .map(|(k, v)| {
            let id = k.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    param,
                    format!("{param}: keys must be token ids, got {k:?}"),
                )
            })?;
            match v.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(ApiError::invalid(
                    param,
                    format!("{param}: the bias of token {id} must be a number from -100 to 100, got {v}"),
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_and_checks() {
        let s = fields("{}").validate().unwrap();
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p),
            (1.0, 1.0, 0, 0.0)
        );
        assert!(s.stop.is_empty() && !s.ignore_eos && s.seed.is_none());
        let s = fields(r#"{"temperature":0,"top_k":-1,"seed":7,"stop":"x","min_p":0.1}"#)
            .validate()
            .unwrap();
        assert_eq!((s.temperature, s.top_k, s.seed), (0.0, 0, Some(7)));
        assert_eq!((s.stop, s.min_p), (vec!["x".to_string()], 0.1));
        let s = fields(r#"{"n":16,"best_of":16}"#).validate().unwrap();
        assert_eq!((s.n, s.best_of), (16, Some(16)));
        s.check_best_of().unwrap();
        let e = fields(r#"{"n":2,"best_of":3}"#)
            .validate()
            .unwrap()
            .check_best_of()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
        let s = fields(r#"{"logit_bias":{"7":-100," 3":2.5}}"#)
            .validate()
            .unwrap();
        let mut b = s.logit_bias;
        b.sort_by_key(|e| e.0);
        assert_eq!(b, vec![(3, 2.5), (7, -100.0)]);
        // Stop strings are bounded in total bytes too (the cost of matching them).
        let long = "x".repeat(MAX_STOP_BYTES / 2);
        fields(&format!(r#"{{"stop":["{long}","{long}"]}}"#))
            .validate()
            .unwrap();
        let e = fields(&format!(r#"{{"stop":["{long}","{long}y"]}}"#))
            .validate()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        assert!(e.message.contains("65536 bytes"), "{}", e.message);
        for (body, param) in [
            (r#"{"temperature":2.5}"#, "temperature"),
            (r#"{"top_p":0}"#, "top_p"),
            (r#"{"top_k":-2}"#, "top_k"),
            (r#"{"min_p":1.5}"#, "min_p"),
            (r#"{"n":0}"#, "n"),
            (r#"{"n":17}"#, "n"),
            (r#"{"best_of":17}"#, "best_of"),
            (r#"{"logit_bias":{"x":5}}"#, "logit_bias"),
            (r#"{"logit_bias":{"1":101}}"#, "logit_bias"),
            (r#"{"logit_bias":{"1":"5"}}"#, "logit_bias"),
            (r#"{"stop":["a",""]}"#, "stop"),
        ] {
            let e = fields(body).validate().unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert!(e.message.contains(param), "{}", e.message);
        }
    }
}
