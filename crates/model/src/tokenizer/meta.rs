//! Readers of a GGUF file's `tokenizer.ggml.*` metadata for the tokenizer: typed keys
//! (ids, flags, string and number arrays) with errors naming the key, and the
//! special-token whitespace rule llama.cpp decides by model name.

use std::path::PathBuf;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{ModelError, Result};

pub(super) fn bad(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::BadMetadata {
        path: PathBuf::from("<gguf metadata>"),
        key: key.into(),
        reason: reason.into(),
    }
}

pub(super) fn get<'a>(c: &'a Content, key: &str) -> Result<&'a Value> {
    c.metadata
        .get(key)
        .ok_or_else(|| ModelError::MissingMetadata {
            path: PathBuf::from("<gguf metadata>"),
            key: key.into(),
        })
}

pub(super) fn as_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => *x as i64,
        Value::I8(x) => *x as i64,
        Value::U16(x) => *x as i64,
        Value::I16(x) => *x as i64,
        Value::U32(x) => *x as i64,
        Value::I32(x) => *x as i64,
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

pub(super) fn strings(c: &Content, key: &str) -> Result<Vec<String>> {
    let arr = get(c, key)?.to_vec().map_err(|e| bad(key, e.to_string()))?;
    arr.iter()
        .map(|v| v.to_string().cloned().map_err(|e| bad(key, e.to_string())))
        .collect()
}

/// An optional token id; ids outside the vocab (llama.cpp writes -1 / u32::MAX) count as absent.
pub(super) fn token_id(c: &Content, key: &str, n_vocab: usize) -> Result<Option<u32>> {
    match c.metadata.get(key) {
        None => Ok(None),
        Some(v) => {
            let id = as_i64(v).ok_or_else(|| bad(key, "not an integer"))?;
            Ok((id >= 0 && (id as usize) < n_vocab).then_some(id as u32))
        }
    }
}

/// Which special tokens swallow the whitespace after them: llama.cpp has no key for it and
/// decides by model name: for Phi-3, all but `<unk>`, `<s>` and `<|endoftext|>`.
pub(super) fn rstrip_rule(c: &Content) -> fn(&str) -> bool {
    let name = match c.metadata.get("general.name").map(Value::to_string) {
        Some(Ok(n)) => n.to_lowercase(),
        _ => String::new(),
    };
    if name.contains("phi-3") || name.contains("phi3") {
        |t| !matches!(t, "<unk>" | "<s>" | "<|endoftext|>")
    } else {
        |_| false
    }
}

/// An optional boolean key, `default` when absent.
pub(super) fn flag(c: &Content, key: &str, default: bool) -> Result<bool> {
    match c.metadata.get(key) {
        Some(v) => v.to_bool().map_err(|e| bad(key, e.to_string())),
        None => Ok(default),
    }
}

/// An array of `n` numbers as f32.
pub(super) fn floats(v: &Value, key: &str, n: usize) -> Result<Vec<f32>> {
    let arr = v.to_vec().map_err(|e| bad(key, e.to_string()))?;
    if arr.len() != n {
        return Err(bad(key, format!("{} entries for {n} tokens", arr.len())));
    }
    arr.iter()
        .map(|v| match v {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            v => as_i64(v)
                .map(|x| x as f32)
                .ok_or_else(|| bad(key, "not a number")),
        })
        .collect()
}
