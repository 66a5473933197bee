//! `HfTokenizer`: a GGUF file's tokenizer written out as a Hugging Face tokenizer folder
//! (`tokenizer.json` in the `tokenizers` library's format, `tokenizer_config.json`,
//! `special_tokens_map.json`), for benchmark clients that count tokens with the served
//! model's tokenizer (aiperf, guidellm, genai-perf, `vllm bench serve`).
//!
//! Each llama.cpp tokenizer kind becomes the `tokenizers` pipeline that encodes as it does:
//! byte-level BPE (`gpt2`) with the `pretok` splits of its `tokenizer.ggml.pre` name;
//! SentencePiece (`llama`) as BPE with byte fallback, its merges ranked by the merged
//! entry's score; Gemma 4's BPE over UTF-8 (`gemma4`) with its merges; WordPiece (`bert`)
//! with BERT's `##` continuations restored. Where `tokenizers` cannot state a llama.cpp
//! rule exactly, [`HfTokenizer::notes`] says so (docs/benchmarking.md lists them).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use serde_json::{json, Map, Value};

use super::{
    flag, floats, merges, pretok, rstrip_rule, token_id, Tokenizer, TYPE_CONTROL, TYPE_UNKNOWN,
    TYPE_USER_DEFINED,
};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

/// The three files of a Hugging Face tokenizer folder, as JSON.
pub struct HfTokenizer {
    /// `tokenizer.json`.
    pub tokenizer: Value,
    /// `tokenizer_config.json`.
    pub config: Value,
    /// `special_tokens_map.json`.
    pub special_tokens_map: Value,
    /// Where the export may encode differently from sloserve (llama.cpp rules the
    /// `tokenizers` library cannot state), one sentence each.
    pub notes: Vec<String>,
}

/// What a kind of tokenizer contributes to `tokenizer.json`.
struct Pipeline {
    normalizer: Value,
    pre_tokenizer: Value,
    model: Value,
    decoder: Value,
    /// Token types cut out of the text before the model sees it (as `special::SpecialTokens`).
    added_types: &'static [i32],
    /// Which added tokens swallow the whitespace after them.
    rstrip: fn(&str) -> bool,
}

impl HfTokenizer {
    /// The Hugging Face form of `file`'s tokenizer; errors name the file and the key at fault.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_content(&file.content).map_err(|e| at_file(e, &file.path))
    }

    /// The same from GGUF metadata already read (errors name no file).
    pub fn from_content(content: &Content) -> Result<Self> {
        let tok = Tokenizer::from_gguf(content)?;
        let mut notes = Vec::new();
        let pipeline = match tok.model() {
            "gpt2" => byte_level_bpe(content, &tok, &mut notes)?,
            "llama" => sentencepiece(content, &tok, &mut notes)?,
            "gemma4" => utf8_bpe(content, &tok, &mut notes)?,
            "bert" => wordpiece(content, &tok, &mut notes)?,
            other => {
                return Err(ModelError::Tokenizer(format!(
                    "no Hugging Face export for tokenizer model '{other}'"
                )))
            }
        };
        let added = added_tokens(&tok, pipeline.added_types, pipeline.rstrip);
        let overlaps = overlapping_ends(added.iter().filter_map(|a| a["content"].as_str()));
        if overlaps > 0 {
            notes.push(format!(
                "{overlaps} added tokens end with the start of another: where such a pair \
                 overlaps in a text, tokenizers takes the leftmost, llama.cpp the longest"
            ));
        }
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": pipeline.normalizer,
            "pre_tokenizer": pipeline.pre_tokenizer,
            "post_processor": post_processor(&tok),
            "decoder": pipeline.decoder,
            "model": pipeline.model,
        });
        let n = tok.vocab_size();
        let text = |id: Option<u32>| id.and_then(|id| tok.token_str(id)).map(str::to_string);
        let unk = text(token_id(content, "tokenizer.ggml.unknown_token_id", n)?);
        let pad = text(token_id(content, "tokenizer.ggml.padding_token_id", n)?);
        let mut special = Map::new();
        for (key, value) in [
            ("bos_token", text(tok.bos_id())),
            ("eos_token", text(tok.eos_id())),
            ("unk_token", unk),
            ("pad_token", pad),
            ("sep_token", text(tok.sep_id())),
        ] {
            if let Some(v) = value {
                special.insert(key.into(), Value::String(v));
            }
        }
        if let Some(cls) = special.get("bos_token").filter(|_| tok.model() == "bert") {
            let cls = cls.clone();
            special.insert("cls_token".into(), cls);
        }
        let mut config = special.clone();
        config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
        config.insert("add_bos_token".into(), tok.add_bos().into());
        config.insert("add_eos_token".into(), tok.add_eos().into());
        config.insert("clean_up_tokenization_spaces".into(), false.into());
        if let Some(len) = context_length(content) {
            config.insert("model_max_length".into(), len.into());
        }
        match string(content, "tokenizer.chat_template")? {
            Some(t) => {
                config.insert("chat_template".into(), t.into());
            }
            None => notes.push(
                "the GGUF has no tokenizer.chat_template, so tokenizer_config.json has none".into(),
            ),
        }
        Ok(HfTokenizer {
            tokenizer,
            config: Value::Object(config),
            special_tokens_map: Value::Object(special),
            notes,
        })
    }

    /// Writes the three files into `dir` (created if missing); returns their paths.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).map_err(|source| ModelError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut written = Vec::new();
        for (name, value) in [
            ("tokenizer.json", &self.tokenizer),
            ("tokenizer_config.json", &self.config),
            ("special_tokens_map.json", &self.special_tokens_map),
        ] {
            let path = dir.join(name);
            let io = |source| ModelError::Write {
                path: path.clone(),
                source,
            };
            let mut w = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io)?);
            serde_json::to_writer_pretty(&mut w, value).map_err(|e| io(e.into()))?;
            w.write_all(b"\n").map_err(io)?;
            w.flush().map_err(io)?;
            written.push(path);
        }
        Ok(written)
    }
}

/// `e` with the GGUF file's path in place of the tokenizer's placeholder.
fn at_file(e: ModelError, path: &Path) -> ModelError {
    match e {
        ModelError::MissingMetadata { key, .. } => ModelError::MissingMetadata {
            path: path.into(),
            key,
        },
        ModelError::BadMetadata { key, reason, .. } => ModelError::BadMetadata {
            path: path.into(),
            key,
            reason,
        },
        ModelError::Tokenizer(m) => ModelError::Tokenizer(format!("{}: {m}", path.display())),
        e => e,
    }
}

/// An optional string key.
fn string(content: &Content, key: &str) -> Result<Option<String>> {
    match content.metadata.get(key) {
        None => Ok(None),
        Some(v) => v
            .to_string()
            .cloned()
            .map(Some)
            .map_err(|e| ModelError::BadMetadata {
                path: PathBuf::from("<gguf metadata>"),
                key: key.into(),
                reason: e.to_string(),
            }),
    }
}

/// `{arch}.context_length`, if the file says.
fn context_length(content: &Content) -> Option<u64> {
    let arch = content
        .metadata
        .get("general.architecture")?
        .to_string()
        .ok()?;
    let v = content.metadata.get(&format!("{arch}.context_length"))?;
    super::meta::as_i64(v).and_then(|n| u64::try_from(n).ok())
}

/// The tokens of `types` as `added_tokens` entries; control and unknown tokens are
/// `special` (matched only when special tokens are parsed), user-defined ones are not.
fn added_tokens(tok: &Tokenizer, types: &[i32], rstrip: fn(&str) -> bool) -> Vec<Value> {
    (0..tok.vocab_size() as u32)
        .filter_map(|id| {
            let ty = tok.token_type(id)?;
            let text = tok.token_str(id).filter(|t| !t.is_empty())?;
            types.contains(&ty).then(|| {
                json!({
                    "id": id,
                    "content": text,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": rstrip(text),
                    "normalized": false,
                    "special": ty != TYPE_USER_DEFINED,
                })
            })
        })
        .collect()
}

/// How many of `texts` end with a proper prefix of one of them: the only case where
/// cutting them out leftmost-longest (tokenizers) can differ from longest text first over
/// the whole text (llama.cpp). Runs of one character against runs of the same character
/// (Gemma's whitespace tokens) are left out: both ways cut a run greedily from the left.
/// An upper bound otherwise: a text overlapping only itself counts too.
fn overlapping_ends<'a>(texts: impl Iterator<Item = &'a str> + Clone) -> usize {
    let is_run = |t: &str| {
        let mut chars = t.chars();
        chars.next().is_some_and(|c| chars.all(|d| d == c))
    };
    let prefixes = |only_non_runs: bool| -> std::collections::HashSet<&'a str> {
        texts
            .clone()
            .filter(|t| !(only_non_runs && is_run(t)))
            .flat_map(|t| t.char_indices().skip(1).map(move |(i, _)| &t[..i]))
            .collect()
    };
    let (all, of_non_runs) = (prefixes(false), prefixes(true));
    texts
        .filter(|t| {
            let set = if is_run(t) { &of_non_runs } else { &all };
            t.char_indices().skip(1).any(|(i, _)| set.contains(&t[i..]))
        })
        .count()
}

/// BOS first (if `add_bos_token`), EOS last (if `add_eos_token`), then WordPiece's SEP.
fn post_processor(tok: &Tokenizer) -> Value {
    let name = |id: Option<u32>| id.and_then(|id| tok.token_str(id).map(|t| (t, id)));
    let first: Vec<(&str, u32)> = name(tok.bos_id().filter(|_| tok.add_bos()))
        .into_iter()
        .collect();
    let last: Vec<(&str, u32)> = name(tok.eos_id().filter(|_| tok.add_eos()))
        .into_iter()
        .chain(name(tok.sep_id()))
        .collect();
    if first.is_empty() && last.is_empty() {
        return Value::Null;
    }
    let piece = |seq: &str, type_id: u32| {
        let mut v: Vec<Value> = first
            .iter()
            .map(|(t, _)| json!({"SpecialToken": {"id": t, "type_id": type_id}}))
            .collect();
        v.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        v.extend(
            last.iter()
                .map(|(t, _)| json!({"SpecialToken": {"id": t, "type_id": type_id}})),
        );
        v
    };
    let mut pair = piece("A", 0);
    pair.extend(piece("B", 1));
    let mut specials = Map::new();
    for (t, id) in first.iter().chain(&last) {
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({
        "type": "TemplateProcessing",
        "single": piece("A", 0),
        "pair": pair,
        "special_tokens": specials,
    })
}

/// Token text -> id, the first id winning on duplicates (`first`) or the last.
fn vocab(tokens: impl Iterator<Item = String>, first: bool) -> Map<String, Value> {
    let mut map = Map::new();
    for (id, t) in tokens.enumerate() {
        if !(first && map.contains_key(&t)) {
            map.insert(t, id.into());
        }
    }
    map
}

fn tokens(tok: &Tokenizer) -> impl Iterator<Item = String> + '_ {
    (0..tok.vocab_size() as u32).map(|id| tok.token_str(id).unwrap_or_default().to_string())
}

fn merge_pairs(merges: impl IntoIterator<Item = (String, String)>) -> Value {
    Value::Array(merges.into_iter().map(|(l, r)| json!([l, r])).collect())
}

fn replace(from: &str, to: &str) -> Value {
    json!({"type": "Replace", "pattern": {"String": from}, "content": to})
}

/// `tokenizer.ggml.model = "gpt2"`: byte-level BPE, split by the pre name's regexes in
/// order (`pretok`; a name sloserve does not know splits like gpt-2, as in sloserve).
fn byte_level_bpe(content: &Content, tok: &Tokenizer, notes: &mut Vec<String>) -> Result<Pipeline> {
    let pre = tok.pre_tokenizer_name();
    let split = match pretok::for_name(pre) {
        Some(p) => p,
        None => {
            notes.push(format!(
                "pre-tokenizer '{pre}' is not one sloserve implements: split like gpt-2, as sloserve does"
            ));
            pretok::for_name("gpt-2")
                .ok_or_else(|| ModelError::Tokenizer("the gpt-2 pre-tokenizer is missing".into()))?
        }
    };
    let mut pres: Vec<Value> = split
        .regexes
        .iter()
        .map(|re| {
            json!({
                "type": "Split",
                "pattern": {"Regex": re},
                "behavior": "Isolated",
                "invert": false,
            })
        })
        .collect();
    pres.push(json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false,
    }));
    notes.push(
        "the pre-tokenizer regexes run on Oniguruma in Python's tokenizers (sloserve: \
         fancy-regex); Unicode classes may differ on rare characters"
            .into(),
    );
    Ok(Pipeline {
        normalizer: Value::Null,
        pre_tokenizer: json!({"type": "Sequence", "pretokenizers": pres}),
        model: json!({
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": split.ignore_merges,
            "vocab": vocab(tokens(tok), true),
            "merges": merge_pairs(merges(content)?),
        }),
        decoder: json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false,
        }),
        added_types: &[TYPE_CONTROL, TYPE_USER_DEFINED],
        rstrip: |_| false,
    })
}

/// `tokenizer.ggml.model = "llama"`: SentencePiece as llama.cpp runs it (adjacent symbols
/// merged best score first) is BPE whose merges are every split of each entry into two
/// entries, ranked by the entry's score, with byte fallback.
fn sentencepiece(content: &Content, tok: &Tokenizer, notes: &mut Vec<String>) -> Result<Pipeline> {
    let n = tok.vocab_size();
    let scores = match content.metadata.get("tokenizer.ggml.scores") {
        None => vec![0.0; n],
        Some(v) => floats(v, "tokenizer.ggml.scores", n)?,
    };
    let space_prefix = flag(content, "tokenizer.ggml.add_space_prefix", true)?;
    let vocab = vocab(tokens(tok), false);
    let merges = score_merges(&vocab, &scores);
    let mut entries_by_score: HashMap<u32, std::collections::HashSet<u32>> = HashMap::new();
    for (score, id, _, _) in &merges {
        entries_by_score
            .entry(score.to_bits())
            .or_default()
            .insert(*id);
    }
    let shared = entries_by_score
        .values()
        .filter(|ids| ids.len() > 1)
        .count();
    if shared > 0 {
        notes.push(format!(
            "{shared} scores are each shared by several merged entries: llama.cpp merges the \
             leftmost of equal-score pairs, BPE by rank (here: score, then entry id)"
        ));
    }
    let unk =
        token_id(content, "tokenizer.ggml.unknown_token_id", n)?.and_then(|id| tok.token_str(id));
    let mut normalizers = Vec::new();
    if space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": SPACE}));
    }
    normalizers.push(replace(" ", SPACE));
    let mut decoders = vec![
        replace(SPACE, " "),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(Pipeline {
        normalizer: json!({"type": "Sequence", "normalizers": normalizers}),
        pre_tokenizer: Value::Null,
        model: json!({
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merge_pairs(merges.into_iter().map(|(_, _, l, r)| (l, r))),
        }),
        decoder: json!({"type": "Sequence", "decoders": decoders}),
        added_types: &[TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED],
        rstrip: rstrip_rule(content),
    })
}

/// Every (left, right) split of a vocabulary entry into two entries, with the entry's
/// score and id, best score first (then by entry id and split point: a fixed order).
fn score_merges(vocab: &Map<String, Value>, scores: &[f32]) -> Vec<(f32, u32, String, String)> {
    let mut merges: Vec<(f32, u32, usize, String, String)> = Vec::new();
    for (text, id) in vocab {
        let Some(id) = id.as_u64().map(|id| id as u32) else {
            continue;
        };
        let score = scores.get(id as usize).copied().unwrap_or(0.0);
        for (k, _) in text.char_indices().skip(1) {
            let (l, r) = text.split_at(k);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                merges.push((score, id, k, l.to_string(), r.to_string()));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        .map(|(s, id, _, l, r)| (s, id, l, r))
        .collect()
}

/// `tokenizer.ggml.model = "gemma4"`: BPE over UTF-8 characters with spaces as U+2581,
/// the text cut into runs of newlines and runs of anything else, byte fallback.
fn utf8_bpe(content: &Content, tok: &Tokenizer, notes: &mut Vec<String>) -> Result<Pipeline> {
    notes.push(
        "a run of newlines that is a vocabulary entry is taken whole by llama.cpp; BPE here \
         reaches it by merges (ignore_merges would take every whole-entry run whole)"
            .into(),
    );
    let mut seen = std::collections::HashSet::new();
    let merges: Vec<(String, String)> = merges(content)?
        .into_iter()
        .filter(|m| seen.insert(m.clone()))
        .collect();
    Ok(Pipeline {
        normalizer: replace(" ", SPACE),
        pre_tokenizer: json!({
            "type": "Split",
            "pattern": {"Regex": "\n+"},
            "behavior": "Isolated",
            "invert": false,
        }),
        model: json!({
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab(tokens(tok), false),
            "merges": merge_pairs(merges),
        }),
        decoder: json!({"type": "Sequence", "decoders": [
            replace(SPACE, " "),
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]}),
        added_types: &[TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED],
        rstrip: |_| false,
    })
}

/// `tokenizer.ggml.model = "bert"`: WordPiece. llama.cpp's conversion marks word-initial
/// pieces with U+2581 and leaves continuations bare; BERT's form is the reverse (`##x`).
fn wordpiece(content: &Content, tok: &Tokenizer, notes: &mut Vec<String>) -> Result<Pipeline> {
    notes.push(
        "llama.cpp keeps only the first character of each character's NFD decomposition \
         and of its lowercase; BertNormalizer keeps all (they differ on e.g. Hangul syllables)"
            .into(),
    );
    let n = tok.vocab_size();
    let unk = token_id(content, "tokenizer.ggml.unknown_token_id", n)?
        .and_then(|id| tok.token_str(id))
        .unwrap_or("[UNK]");
    let bert_tokens = tokens(tok).map(|t| {
        if let Some(word) = t.strip_prefix(SPACE) {
            word.to_string()
        } else if t.starts_with('[') && t.ends_with(']') {
            t
        } else {
            format!("##{t}")
        }
    });
    Ok(Pipeline {
        normalizer: json!({
            "type": "BertNormalizer",
            "clean_text": true,
            "handle_chinese_chars": true,
            "strip_accents": true,
            "lowercase": true,
        }),
        pre_tokenizer: json!({"type": "BertPreTokenizer"}),
        model: json!({
            "type": "WordPiece",
            "unk_token": unk,
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 1_000_000,
            "vocab": vocab(bert_tokens, false),
        }),
        decoder: json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
        added_types: &[TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED],
        rstrip: |_| false,
    })
}
