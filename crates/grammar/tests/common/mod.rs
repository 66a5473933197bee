//! Shared by the grammar tests and bench: the three real tokenizers (GGUF files in
//! models/), the schema suite, and the seeded walks over allowed tokens.

#![allow(dead_code)]

use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use rand::rngs::StdRng;
use rand::Rng;
use sloserve_engine::sampler::constraint::TokenConstraint;
use sloserve_grammar::{GrammarFactory, GrammarMatcher};
use sloserve_model::tokenizer::Tokenizer;

/// (name, file) of the models whose tokenizers are tested: byte-level BPE 49k,
/// SentencePiece 262k, byte-level BPE 152k.
pub const MODELS: &[(&str, &str)] = &[
    ("smollm2", "models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("gemma3", "models/gemma-3-270m-q4_k_m.gguf"),
    ("qwen", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
];

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tokenizer of `file` (relative to the repo root) and the model's logits width.
pub fn load(file: &str) -> (Tokenizer, usize) {
    let p = repo_root().join(file);
    assert!(
        p.exists(),
        "{} is missing: run `make models` first",
        p.display()
    );
    let mut f = std::fs::File::open(&p).unwrap();
    let content = Content::read(&mut f).unwrap();
    let tok = Tokenizer::from_gguf(&content).unwrap();
    // The output matrix's rows (token_embd when tied) are the logits width.
    let n_vocab = ["output.weight", "token_embd.weight"]
        .iter()
        .find_map(|n| content.tensor_infos.get(*n))
        .map(|t| *t.shape.dims().last().unwrap())
        .unwrap_or(tok.vocab_size());
    (tok, n_vocab)
}

pub fn factory(file: &str) -> (Tokenizer, GrammarFactory) {
    let (tok, n_vocab) = load(file);
    let f = GrammarFactory::from_tokenizer(&tok, n_vocab).unwrap();
    (tok, f)
}

/// The schema suite: (file stem, schema), sorted by name.
pub fn schemas() -> Vec<(String, serde_json::Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schemas");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The allowed ids of a mask.
pub fn allowed_ids(mask: &[u32], out: &mut Vec<u32>) {
    out.clear();
    for (w, &bits) in mask.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            let j = b.trailing_zeros();
            out.push(w as u32 * 32 + j);
            b &= b - 1;
        }
    }
}

/// How strongly a token closes the document: EOS, then tokens made only of
/// closers (`"`, `}`, `]`: they end a string or a container), then tokens with a
/// `}` / `]`, then with a `"`, then single bytes (progress inside strings and
/// numbers), then the rest.
fn closing_score(bytes: &[u8], is_eos: bool) -> u8 {
    let closer = |b: &u8| matches!(b, b'"' | b'}' | b']');
    if is_eos {
        6
    } else if !bytes.is_empty() && bytes.iter().all(closer) {
        5
    } else if bytes.contains(&b'}') || bytes.contains(&b']') {
        4
    } else if bytes.contains(&b'"') {
        3
    } else if bytes.len() == 1 {
        2
    } else {
        1
    }
}

/// `text` with every exponent of more than 3 digits replaced by 0: llguidance's
/// unbounded `number` allows any exponent (valid JSON, RFC 8259 sets no range),
/// which serde_json's f64 parse refuses. Only unbounded numbers can have an
/// exponent (bounded ones are generated without), and any finite number
/// validates against those, so the cut does not change the verdict.
pub fn clamp_exponents(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    let mut in_string = false;
    while i < b.len() {
        let c = b[i];
        if c == b'"' && (i == 0 || b[i - 1] != b'\\') {
            in_string = !in_string;
        }
        if !in_string && (c == b'e' || c == b'E') && i > 0 && b[i - 1].is_ascii_digit() {
            let mut j = i + 1;
            if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                j += 1;
            }
            let k = (j..b.len())
                .find(|&k| !b[k].is_ascii_digit())
                .unwrap_or(b.len());
            if k - j > 3 {
                out.extend_from_slice(&b[i..j]);
                out.extend_from_slice(b"0");
                i = k;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8(out).expect("cut at ASCII bytes only")
}

/// What a walk did.
pub struct Walk {
    /// The drawn tokens (the final EOS, if drawn, excluded).
    pub tokens: Vec<u32>,
    /// Seconds of each `fill_mask`.
    pub mask_secs: Vec<f64>,
    pub finished: bool,
}

/// A seeded walk: uniform among the allowed tokens for `uniform_steps` draws, then
/// (or with probability 1 - `p_uniform` each step) the most closing allowed token
/// (ties uniform), until the grammar finishes or EOS is drawn.
pub fn walk(
    m: &mut GrammarMatcher,
    tok: &Tokenizer,
    eos: &[u32],
    rng: &mut StdRng,
    uniform_steps: usize,
    p_uniform: f64,
    max_steps: usize,
) -> Walk {
    let words = m.vocab_size().div_ceil(32);
    let mut mask = vec![0u32; words];
    let mut ids = Vec::new();
    let mut w = Walk {
        tokens: Vec::new(),
        mask_secs: Vec::new(),
        finished: false,
    };
    for step in 0..max_steps {
        let t0 = std::time::Instant::now();
        m.fill_mask(&mut mask)
            .unwrap_or_else(|e| panic!("mask: {e}"));
        w.mask_secs.push(t0.elapsed().as_secs_f64());
        allowed_ids(&mask, &mut ids);
        assert!(!ids.is_empty(), "empty mask after {:?}", w.tokens);
        let uniform = step < uniform_steps || rng.random_bool(p_uniform);
        let t = if uniform {
            ids[rng.random_range(0..ids.len())]
        } else {
            let score = |t: u32| closing_score(tok.token_bytes_ref(t), eos.contains(&t));
            let best = ids.iter().map(|&t| score(t)).max().unwrap();
            let top: Vec<u32> = ids.iter().copied().filter(|&t| score(t) == best).collect();
            top[rng.random_range(0..top.len())]
        };
        m.commit(t).unwrap_or_else(|e| panic!("commit {t}: {e}"));
        if eos.contains(&t) {
            w.finished = true;
            break;
        }
        w.tokens.push(t);
        if m.is_finished() {
            w.finished = true;
            break;
        }
    }
    w
}
