//! Datasets: where prompts and output lengths come from (`synthetic`, `sharegpt:FILE`, `prefix`, `jsonl:FILE`).
//!
//! Lengths are in tokens as the server counts them, approximated by words
//! (the synthetic word list is one token a word); the server's
//! `usage.prompt_tokens` is what results report.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::spec::WorkloadSpec;
use crate::words::WORDS;

mod files;
pub use files::{load_jsonl, load_sharegpt};

/// Output length when neither the flags nor the dataset give one.
pub const DEFAULT_OUTPUT_LEN: usize = 128;

/// `--dataset`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DatasetSpec {
    /// Random words: `--input-len`/`--input-len-dist`, `--output-len`/`--output-len-dist`.
    Synthetic,
    /// The ShareGPT JSON layout: first human turn as prompt, the gpt reply's word count as output length.
    ShareGpt(PathBuf),
    /// A shared system prompt of `--prefix-len` tokens + a unique question of `--input-len` tokens.
    Prefix,
    /// JSON lines: `{"prompt": "..."}` or `{"messages": [...]}`, optional `output_len`/`max_tokens`, `slo_class`.
    Jsonl(PathBuf),
}

impl FromStr for DatasetSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "synthetic" || s == "random" => Ok(DatasetSpec::Synthetic),
            None if s == "prefix" => Ok(DatasetSpec::Prefix),
            None if s.ends_with(".jsonl") => Ok(DatasetSpec::Jsonl(s.into())),
            Some(("sharegpt", f)) if !f.is_empty() => Ok(DatasetSpec::ShareGpt(f.into())),
            Some(("jsonl", f)) if !f.is_empty() => Ok(DatasetSpec::Jsonl(f.into())),
            _ => Err(format!(
                "unknown dataset {s:?} (synthetic, sharegpt:FILE, prefix, jsonl:FILE)"
            )),
        }
    }
}

impl fmt::Display for DatasetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetSpec::Synthetic => f.write_str("synthetic"),
            DatasetSpec::Prefix => f.write_str("prefix"),
            DatasetSpec::ShareGpt(p) => write!(f, "sharegpt:{}", p.display()),
            DatasetSpec::Jsonl(p) => write!(f, "jsonl:{}", p.display()),
        }
    }
}

/// A length distribution: `uniform:LO-HI` (inclusive) or `normal:MEAN,STD` (clamped to ≥ 1).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LenDist {
    Uniform { lo: usize, hi: usize },
    Normal { mean: f64, std: f64 },
}

impl LenDist {
    pub fn sample(&self, rng: &mut StdRng) -> usize {
        match *self {
            LenDist::Uniform { lo, hi } => rng.random_range(lo..=hi),
            LenDist::Normal { mean, std } => {
                let v: f64 = Normal::new(mean, std)
                    .map(|d| d.sample(rng))
                    .unwrap_or(mean);
                v.round().max(1.0) as usize
            }
        }
    }
}

impl FromStr for LenDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad length distribution {s:?} (uniform:LO-HI or normal:MEAN,STD)");
        match s.split_once(':') {
            Some(("uniform", r)) => {
                let (lo, hi) = r.split_once('-').ok_or_else(bad)?;
                let (lo, hi): (usize, usize) = (
                    lo.trim().parse().map_err(|_| bad())?,
                    hi.trim().parse().map_err(|_| bad())?,
                );
                if lo == 0 || lo > hi {
                    return Err(bad());
                }
                Ok(LenDist::Uniform { lo, hi })
            }
            Some(("normal", r)) => {
                let (m, sd) = r.split_once(',').ok_or_else(bad)?;
                let (mean, std): (f64, f64) = (
                    m.trim().parse().map_err(|_| bad())?,
                    sd.trim().parse().map_err(|_| bad())?,
                );
                if !(mean >= 1.0 && std >= 0.0) {
                    return Err(bad());
                }
                Ok(LenDist::Normal { mean, std })
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for LenDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LenDist::Uniform { lo, hi } => write!(f, "uniform:{lo}-{hi}"),
            LenDist::Normal { mean, std } => write!(f, "normal:{mean},{std}"),
        }
    }
}

macro_rules! string_serde {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    };
}
string_serde!(DatasetSpec);
string_serde!(LenDist);

/// One chat message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One prompt with its target output length.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The conversation; the completions endpoint gets the contents joined by blank lines.
    pub messages: Vec<Message>,
    /// Estimated prompt tokens (words).
    pub prompt_tokens: usize,
    pub output_len: usize,
    /// A class fixed by the dataset (JSONL `slo_class`), overriding `--slo-class`.
    pub class: Option<String>,
}

fn user(content: String) -> Message {
    Message {
        role: "user".into(),
        content,
    }
}

/// Words in `s` (the token estimate).
pub fn word_count(s: &str) -> usize {
    s.split_whitespace().count()
}

/// `n` random words from the word list.
pub fn random_words(n: usize, rng: &mut StdRng) -> String {
    let mut out = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    out
}

/// `n` samples of the dataset `spec.dataset`, reproducible from `rng`.
pub fn load_samples(
    spec: &WorkloadSpec,
    n: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Vec<Sample>> {
    let out_len =
        |rng: &mut StdRng, own: Option<usize>| match (&spec.output_len_dist, spec.output_len) {
            (Some(d), _) => d.sample(rng),
            (None, Some(l)) => l,
            (None, None) => own.unwrap_or(DEFAULT_OUTPUT_LEN),
        };
    let in_len = |rng: &mut StdRng| {
        spec.input_len_dist
            .map_or(spec.input_len, |d| d.sample(rng))
            .max(1)
    };
    let samples = match &spec.dataset {
        DatasetSpec::Synthetic => (0..n)
            .map(|_| {
                let words = in_len(rng);
                let output_len = out_len(rng, None);
                Sample {
                    messages: vec![user(random_words(words, rng))],
                    prompt_tokens: words,
                    output_len,
                    class: None,
                }
            })
            .collect(),
        DatasetSpec::Prefix => {
            let prefixes: Vec<String> = (0..spec.num_prefixes.max(1))
                .map(|_| random_words(spec.prefix_len, rng))
                .collect();
            (0..n)
                .map(|i| {
                    let words = in_len(rng);
                    let question = format!("Question {i}: {}?", random_words(words, rng));
                    let system = Message {
                        role: "system".into(),
                        content: prefixes[i % prefixes.len()].clone(),
                    };
                    let output_len = out_len(rng, None);
                    let prompt_tokens = spec.prefix_len + word_count(&question);
                    Sample {
                        messages: vec![system, user(question)],
                        prompt_tokens,
                        output_len,
                        class: None,
                    }
                })
                .collect()
        }
        DatasetSpec::ShareGpt(path) => {
            let mut pool = load_sharegpt(path)?;
            pool.shuffle(rng);
            cycle(pool, n)
                .into_iter()
                .map(|mut s| {
                    s.output_len = out_len(rng, Some(s.output_len));
                    s
                })
                .collect()
        }
        DatasetSpec::Jsonl(path) => {
            let pool = load_jsonl(path)?;
            cycle(pool, n)
                .into_iter()
                .map(|mut s| {
                    s.output_len = out_len(rng, Some(s.output_len).filter(|&l| l > 0));
                    s
                })
                .collect()
        }
    };
    Ok(samples)
}

/// Repeat `pool` in order until it has `n` items.
fn cycle(pool: Vec<Sample>, n: usize) -> Vec<Sample> {
    pool.iter().cycle().take(n).cloned().collect()
}
