//! Dataset files: ShareGPT conversations and JSONL prompt lists.

use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

use super::{user, word_count, Message, Sample};

#[derive(Deserialize)]
struct ShareGptEntry {
    #[serde(default)]
    conversations: Vec<ShareGptTurn>,
}

#[derive(Deserialize)]
struct ShareGptTurn {
    from: String,
    value: String,
}

/// ShareGPT conversations as vLLM uses them: the first turn (human) is the
/// prompt, the second (gpt) reply's length is the output length; entries with
/// fewer than two turns, or a prompt or reply under 4 words, are skipped.
pub fn load_sharegpt(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading ShareGPT file {}", path.display()))?;
    let entries: Vec<ShareGptEntry> = serde_json::from_str(&text)
        .with_context(|| format!("parsing ShareGPT JSON {}", path.display()))?;
    let samples: Vec<Sample> = entries
        .into_iter()
        .filter_map(|e| {
            let (q, a) = (e.conversations.first()?, e.conversations.get(1)?);
            if q.from != "human" || a.from != "gpt" {
                return None;
            }
            let (pl, ol) = (word_count(&q.value), word_count(&a.value));
            (pl >= 4 && ol >= 4).then(|| Sample {
                messages: vec![user(q.value.clone())],
                prompt_tokens: pl,
                output_len: ol,
                class: None,
            })
        })
        .collect();
    if samples.is_empty() {
        bail!("no usable conversations in {}", path.display());
    }
    Ok(samples)
}

#[derive(Deserialize)]
struct JsonlEntry {
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    output_len: Option<usize>,
    max_tokens: Option<usize>,
    slo_class: Option<String>,
}

/// Explicit prompts, one JSON object per line (blank lines and `#` lines skipped).
pub fn load_jsonl(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading JSONL file {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let e: JsonlEntry = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: bad JSON line", path.display(), i + 1))?;
        let messages = match (e.prompt, e.messages) {
            (Some(p), None) => vec![user(p)],
            (None, Some(m)) if !m.is_empty() => m,
            _ => bail!(
                "{}:{}: want exactly one of \"prompt\" or \"messages\"",
                path.display(),
                i + 1
            ),
        };
        let prompt_tokens = messages.iter().map(|m| word_count(&m.content)).sum();
        let output_len = e.output_len.or(e.max_tokens).unwrap_or(0);
        out.push(Sample {
            messages,
            prompt_tokens,
            output_len,
            class: e.slo_class,
        });
    }
    if out.is_empty() {
        bail!("no prompts in {}", path.display());
    }
    Ok(out)
}
