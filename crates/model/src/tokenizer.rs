//! `Tokenizer`: the tokenizer rebuilt from a GGUF file's `tokenizer.ggml.*` metadata:
//! byte-level BPE (`gpt2`, splitting text the way llama.cpp does for each
//! `tokenizer.ggml.pre` name, in `pretok`), SentencePiece (`llama`, in `spm`), Gemma 4's
//! BPE over UTF-8 (`gemma4`, in `utf8_bpe`) or WordPiece (`bert`, in `wordpiece`), plus the
//! id -> bytes table used for decoding.

pub mod hf_export;
mod merge;
mod meta;
mod pretok;
mod special;
mod spm;
mod utf8_bpe;
mod wordpiece;

use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use self::meta::{as_i64, bad, flag, floats, get, rstrip_rule, strings, token_id};
use self::special::SpecialTokens;
use self::spm::Spm;
use self::utf8_bpe::Utf8Bpe;
use self::wordpiece::WordPiece;
use crate::error::{ModelError, Result};

/// `tokenizer.ggml.model` values this crate tokenizes, with what they are.
pub const SUPPORTED_TOKENIZERS: &[(&str, &str)] = &[
    ("gpt2", "byte-level BPE"),
    ("llama", "SentencePiece"),
    ("gemma4", "BPE over UTF-8 with SentencePiece spaces"),
    ("bert", "WordPiece"),
];

/// The supported tokenizer models as one line, e.g. for error messages.
pub fn supported_tokenizers_list() -> String {
    SUPPORTED_TOKENIZERS
        .iter()
        .map(|(m, what)| format!("{m} ({what})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// GGUF `tokenizer.ggml.token_type` values.
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;

/// End-of-turn token texts treated as stop tokens when present in the vocab.
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end|>",
    "<end_of_turn>",
    // o200k_harmony (gpt-oss): the answer's end, and a tool call's.
    "<|return|>",
    "<|call|>",
];

/// gpt-oss's harmony header tokens, which llama.cpp makes user-defined in every vocab
/// that has them ("always render these tokens"): decoded as text even where control
/// tokens are dropped, so a harmony answer's channels reach `crate::harmony`.
const HARMONY_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The stop tokens of a vocabulary: EOS, EOT, EOM and the end-of-turn tokens present,
/// without duplicates; as llama.cpp, `<|end|>` is not one where the vocabulary has both
/// `<|return|>` and `<|call|>` (o200k_harmony: there it ends a message, not the answer).
fn stop_ids(tokens: &[String], named: [Option<u32>; 3]) -> Vec<u32> {
    let find = |name: &str| tokens.iter().position(|t| t == name).map(|i| i as u32);
    let harmony = find("<|return|>").is_some() && find("<|call|>").is_some();
    let end = find("<|end|>").filter(|_| harmony);
    let mut ids: Vec<u32> = named.into_iter().flatten().collect();
    ids.extend(END_OF_TURN.iter().filter_map(|n| find(n)));
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| Some(*id) != end && seen.insert(*id));
    ids
}

/// What turns text into ids.
enum Encoder {
    Bpe {
        /// Control tokens are matched as special tokens (`parse_special = true`).
        with_special: Box<tokenizers::Tokenizer>,
        /// Same model, but control tokens are tokenized as plain text.
        plain: Arc<tokenizers::Tokenizer>,
    },
    Native(Arc<Native>),
}

/// The tokenizers written here, each encoding as llama.cpp's of the same kind.
enum Native {
    Spm(Spm),
    Utf8Bpe(Utf8Bpe),
    WordPiece(WordPiece),
}

impl Native {
    /// `text`'s ids (no BOS/EOS); control-token texts become their ids with `parse_special`.
    fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        match self {
            Native::Spm(t) => t.encode(text, parse_special, &mut ids),
            Native::Utf8Bpe(t) => t.encode(text, parse_special, &mut ids),
            Native::WordPiece(t) => t.encode(text, parse_special, &mut ids),
        }
        ids
    }
}

/// A cheap, shareable handle on a tokenizer's plain-text encoding (control-token
/// texts as text, no BOS): what [`Tokenizer::encode`] with `parse_special = false`
/// does, for a user that must outlive the borrow (the grammar engine tokenizes the
/// text a grammar forces as the model would).
#[derive(Clone)]
pub struct TextEncoder(TextEncoderInner);

#[derive(Clone)]
enum TextEncoderInner {
    Bpe(Arc<tokenizers::Tokenizer>),
    Native(Arc<Native>),
}

impl TextEncoder {
    /// `text`'s token ids; `None` if the tokenizer fails on it.
    pub fn encode(&self, text: &str) -> Option<Vec<u32>> {
        match &self.0 {
            TextEncoderInner::Bpe(tk) => tk
                .encode_fast(text, false)
                .ok()
                .map(|e| e.get_ids().to_vec()),
            TextEncoderInner::Native(t) => Some(t.encode(text, false)),
        }
    }
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.0 {
            TextEncoderInner::Bpe(_) => "TextEncoder(bpe)",
            TextEncoderInner::Native(t) => match **t {
                Native::Spm(_) => "TextEncoder(spm)",
                Native::Utf8Bpe(_) => "TextEncoder(utf8-bpe)",
                Native::WordPiece(_) => "TextEncoder(wordpiece)",
            },
        })
    }
}

pub struct Tokenizer {
    encoder: Encoder,
    /// `tokenizer.ggml.model` (gpt2 or llama).
    model: String,
    tokens: Vec<String>,
    types: Vec<i32>,
    /// The bytes of token `i` are `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// WordPiece's separator, put last by `encode_prompt`.
    sep: Option<u32>,
    pre: String,
    stop_ids: Vec<u32>,
}

/// GPT-2's byte -> printable char table.
pub(crate) fn byte_to_char() -> [char; 256] {
    let keep = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        map[b as usize] = if keep(b) {
            b as char
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    map
}

/// `tokenizer.ggml.merges` as (left, right) pairs.
fn merges(content: &Content) -> Result<Vec<(String, String)>> {
    strings(content, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            // llama.cpp searches the separator from the second char on.
            let first_len = m.chars().next().map_or(0, char::len_utf8);
            match m[first_len..].find(' ') {
                Some(p) => Ok((
                    m[..first_len + p].to_string(),
                    m[first_len + p + 1..].to_string(),
                )),
                None => Err(bad(
                    "tokenizer.ggml.merges",
                    format!("merge '{m}' has no space"),
                )),
            }
        })
        .collect()
}

/// The byte-level BPE encoder and its id -> bytes table.
fn bpe(
    content: &Content,
    tokens: &[String],
    types: &[i32],
    pre: &str,
) -> Result<(Encoder, Vec<u8>, Vec<usize>)> {
    let merges = merges(content)?;
    // A name llama.cpp knows but sloserve does not implement splits like GPT-2.
    let split = pretok::for_name(pre).or_else(|| pretok::for_name("gpt-2"));
    let (regexes, ignore_merges) = split.map_or((&[][..], false), |p| (p.regexes, p.ignore_merges));
    let mut vocab = Vocab::default();
    for (i, t) in tokens.iter().enumerate().rev() {
        vocab.insert(t.clone(), i as u32); // first id wins on duplicates
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("building BPE model: {e}")))?;
    let mut pres: Vec<PreTokenizerWrapper> = Vec::new();
    for re in regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
        pres.push(split.into());
    }
    pres.push(ByteLevel::new(false, false, false).into());
    let mut with_special = tokenizers::Tokenizer::new(bpe);
    with_special.with_pre_tokenizer(Some(Sequence::new(pres)));
    with_special.with_decoder(Some(ByteLevel::new(false, false, false)));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == TYPE_CONTROL || t == TYPE_USER_DEFINED)
        .map(|(s, &t)| AddedToken::from(s.clone(), t == TYPE_CONTROL).normalized(false))
        .collect();
    with_special
        .add_special_tokens(added)
        .map_err(|e| ModelError::Tokenizer(format!("adding special tokens: {e}")))?;
    let mut plain = with_special.clone();
    plain.set_encode_special_tokens(true);

    let b2c = byte_to_char();
    let mut c2b = vec![None; 512];
    for (b, c) in b2c.iter().enumerate() {
        c2b[*c as usize] = Some(b as u8);
    }
    let (mut bytes, mut offsets) = (Vec::new(), vec![0]);
    for (tok, &ty) in tokens.iter().zip(types) {
        match ty {
            TYPE_UNKNOWN | TYPE_CONTROL | TYPE_USER_DEFINED => {
                bytes.extend_from_slice(tok.as_bytes())
            }
            TYPE_UNUSED => {}
            _ => {
                for ch in tok.chars() {
                    match c2b.get(ch as usize).copied().flatten() {
                        Some(b) => bytes.push(b),
                        None => bytes.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
            }
        }
        offsets.push(bytes.len());
    }
    let encoder = Encoder::Bpe {
        with_special: Box::new(with_special),
        plain: Arc::new(plain),
    };
    Ok((encoder, bytes, offsets))
}

impl Tokenizer {
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let model = get(content, "tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| bad("tokenizer.ggml.model", e.to_string()))?;
        if !SUPPORTED_TOKENIZERS.iter().any(|(m, _)| *m == model) {
            return Err(ModelError::Tokenizer(format!(
                "unsupported tokenizer model '{model}' (supported: {})",
                supported_tokenizers_list()
            )));
        }
        let tokens = strings(content, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let mut types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
            None => vec![1; n],
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let arr = v.to_vec().map_err(|e| bad(key, e.to_string()))?;
                if arr.len() != n {
                    return Err(bad(key, format!("{} entries for {n} tokens", arr.len())));
                }
                arr.iter()
                    .map(|v| {
                        as_i64(v)
                            .map(|t| t as i32)
                            .ok_or_else(|| bad(key, "not an integer"))
                    })
                    .collect::<Result<_>>()?
            }
        };
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            if HARMONY_RENDERED.contains(&t.as_str()) {
                *ty = TYPE_USER_DEFINED;
            }
        }
        let pre = match content.metadata.get("tokenizer.ggml.pre") {
            Some(v) => v
                .to_string()
                .map_err(|e| bad("tokenizer.ggml.pre", e.to_string()))?
                .clone(),
            None => "default".to_string(),
        };
        let is_spm = model == "llama";
        let is_bert = model == "bert";
        // llama.cpp's defaults when a key is absent: SentencePiece adds BOS and a space
        // prefix; WordPiece adds BOS ([CLS], id 101) and SEP ([SEP], id 102) last; byte-level
        // BPE adds BOS for the Llama 3 family's pre names; Gemma 4 always adds BOS.
        let bert_default = |id: u32| (is_bert && (id as usize) < n).then_some(id);
        let bos_default = is_spm || is_bert || (model == "gpt2" && pretok::adds_bos(&pre));
        let add_bos =
            flag(content, "tokenizer.ggml.add_bos_token", bos_default)? || model == "gemma4";
        let add_eos = flag(content, "tokenizer.ggml.add_eos_token", false)?;
        let bos = token_id(content, "tokenizer.ggml.bos_token_id", n)?.or(bert_default(101));
        let sep = match flag(content, "tokenizer.ggml.add_sep_token", is_bert)? && is_bert {
            true => {
                token_id(content, "tokenizer.ggml.seperator_token_id", n)?.or(bert_default(102))
            }
            false => None,
        };
        let eos = token_id(content, "tokenizer.ggml.eos_token_id", n)?;
        let eot = token_id(content, "tokenizer.ggml.eot_token_id", n)?;
        let eom = token_id(content, "tokenizer.ggml.eom_token_id", n)?;

        let native = match model.as_str() {
            "llama" => {
                let unk = token_id(content, "tokenizer.ggml.unknown_token_id", n)?;
                let scores = match content.metadata.get("tokenizer.ggml.scores") {
                    None => vec![0.0; n],
                    Some(v) => floats(v, "tokenizer.ggml.scores", n)?,
                };
                let space = flag(content, "tokenizer.ggml.add_space_prefix", true)?;
                let specials = SpecialTokens::new(&tokens, &types, rstrip_rule(content));
                Some(Native::Spm(Spm::new(
                    &tokens, scores, &types, unk, space, specials,
                )))
            }
            "gemma4" => {
                let specials = SpecialTokens::new(&tokens, &types, |_| false);
                Some(Native::Utf8Bpe(Utf8Bpe::new(
                    &tokens,
                    merges(content)?,
                    specials,
                )))
            }
            "bert" => {
                let unk = token_id(content, "tokenizer.ggml.unknown_token_id", n)?;
                let specials = SpecialTokens::new(&tokens, &types, |_| false);
                Some(Native::WordPiece(WordPiece::new(&tokens, unk, specials)))
            }
            _ => None,
        };
        let (encoder, bytes, offsets) = match native {
            // Their tokens decode as SentencePiece's: U+2581 is a space, `<0xNN>` a byte.
            Some(native) => {
                let (mut bytes, mut offsets) = (Vec::new(), vec![0]);
                for (tok, &ty) in tokens.iter().zip(&types) {
                    spm::token_bytes(tok, ty, &mut bytes);
                    offsets.push(bytes.len());
                }
                (Encoder::Native(Arc::new(native)), bytes, offsets)
            }
            None => bpe(content, &tokens, &types, &pre)?,
        };
        let stop_ids = stop_ids(&tokens, [eos, eot, eom]);
        Ok(Self {
            encoder,
            model: model.clone(),
            tokens,
            types,
            bytes,
            offsets,
            bos,
            eos,
            add_bos,
            add_eos,
            sep,
            pre,
            stop_ids,
        })
    }

    /// Tokenizes `text`; never adds BOS. With `parse_special`, control-token texts such as
    /// `<|im_start|>` become their ids; without, they are tokenized as plain text.
    /// User-defined tokens are always matched, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let tk = match &self.encoder {
            Encoder::Native(t) => return Ok(t.encode(text, parse_special)),
            Encoder::Bpe { with_special, .. } if parse_special => &**with_special,
            Encoder::Bpe { plain, .. } => &**plain,
        };
        let enc = tk
            .encode_fast(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// A shareable handle on [`Tokenizer::encode`] with `parse_special = false`.
    pub fn text_encoder(&self) -> TextEncoder {
        TextEncoder(match &self.encoder {
            Encoder::Bpe { plain, .. } => TextEncoderInner::Bpe(plain.clone()),
            Encoder::Native(t) => TextEncoderInner::Native(t.clone()),
        })
    }

    /// Tokenizes a prompt as llama.cpp does with `add_special` and `parse_special` on: the
    /// one BOS rule for every caller. Control-token texts become their ids, and BOS goes
    /// first iff the model's `add_bos_token` says so, but never twice: a text that already
    /// starts with the BOS token keeps only its own. (llama.cpp's chat path strips a
    /// template's leading BOS text before tokenizing for this reason; its raw tokenize
    /// path warns about the double BOS in `check_double_bos_eos`.) EOS goes last iff
    /// `add_eos_token` says so; WordPiece's `[SEP]` goes last iff `add_sep_token` (by
    /// default true) says so.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.with_bos(self.encode(text, true)?);
        if let Some(eos) = self.eos.filter(|_| self.add_eos) {
            ids.push(eos);
        }
        ids.extend(self.sep);
        Ok(ids)
    }

    /// `ids` with BOS put first by `encode_prompt`'s rule.
    pub fn with_bos(&self, ids: Vec<u32>) -> Vec<u32> {
        match self.bos {
            Some(bos) if self.add_bos && ids.first() != Some(&bos) => {
                let mut with_bos = Vec::with_capacity(ids.len() + 1);
                with_bos.push(bos);
                with_bos.extend(ids);
                with_bos
            }
            _ => ids,
        }
    }

    /// Decodes `ids` to text; invalid UTF-8 becomes U+FFFD. `skip_special` drops control tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut buf = Vec::new();
        for &id in ids {
            if id as usize >= self.tokens.len() {
                return Err(ModelError::Tokenizer(format!(
                    "token id {id} out of range (vocab size {})",
                    self.tokens.len()
                )));
            }
            if !(skip_special && self.is_special(id)) {
                buf.extend_from_slice(self.token_bytes_ref(id));
            }
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    /// `tokenizer.ggml.add_bos_token` (when absent: true for SentencePiece, else false).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// `tokenizer.ggml.add_eos_token` (false when absent).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), `gemma4`
    /// (BPE over UTF-8) or `bert` (WordPiece).
    pub fn model(&self) -> &str {
        &self.model
    }
    /// The raw vocab string of `id`.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
    /// The bytes `id` stands for (control / user-defined tokens: their text); empty if out of range.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes_ref(id).to_vec()
    }
    /// Like `token_bytes`, without allocating.
    pub fn token_bytes_ref(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a..b],
            _ => &[],
        }
    }
    /// The GGUF `tokenizer.ggml.token_type` of `id` (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte); `None` if out of range.
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.types.get(id as usize).copied()
    }
    /// WordPiece's separator (`[SEP]`), put last by `encode_prompt`; `None` for other kinds.
    pub fn sep_id(&self) -> Option<u32> {
        self.sep
    }
    /// True for control tokens (`<|im_start|>`, `<|endoftext|>`, ...).
    pub fn is_special(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&TYPE_CONTROL)
    }
    /// EOS plus any end-of-turn tokens present in the vocab, without duplicates.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        self.stop_ids.clone()
    }
    /// `tokenizer.ggml.pre` as found in the file ("default" when absent). A name sloserve
    /// does not implement (see `tokenizer/pretok.rs`) splits like gpt-2.
    pub fn pre_tokenizer_name(&self) -> &str {
        &self.pre
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `<|end|>` stops Phi-3-style vocabularies, not o200k_harmony's (which has
    /// `<|return|>` and `<|call|>`: those stop it).
    #[test]
    fn harmony_stops_on_return_and_call_not_end() {
        let toks = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let phi = toks(&["a", "<|end|>", "<|endoftext|>"]);
        assert_eq!(stop_ids(&phi, [Some(2), None, None]), [2, 1]);
        let oss = toks(&["<|return|>", "<|end|>", "<|call|>", "<|start|>"]);
        assert_eq!(stop_ids(&oss, [Some(0), None, None]), [0, 2]);
        assert_eq!(stop_ids(&oss, [Some(1), None, None]), [0, 2]);
    }
}
