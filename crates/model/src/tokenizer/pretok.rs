//! The pre-tokenizers of byte-level BPE vocabularies: for each `tokenizer.ggml.pre` name,
//! the regexes llama.cpp's `llm_tokenizer_bpe` splits text with (llama-vocab.cpp, as of
//! llama-cpp-python 0.3.36's vendored llama.cpp), applied in order, each to the pieces the
//! previous one left (matches and the text between them both kept), and whether a piece
//! that is a whole vocabulary entry skips the merges (`ignore_merges`).

/// GPT-2's split (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split; llama.cpp spells the case-insensitive contractions out.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's: Qwen2's with combining marks kept in words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k: gpt-oss, Llama 4), as llama.cpp rewrites tokenizer.json's: a word is
/// letters other than a-z then letters other than A-Z (or the reverse), with an optional
/// contraction; numbers in threes; punctuation runs take trailing newlines and slashes.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian and other cased
/// scripts, as its tokenizer.json lists them (escaped: some of these characters change
/// under Unicode normalization, which an editor may apply).
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}",
    r"\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}",
    r"\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}",
    r"\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}",
    r"\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}",
    r"\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}",
    r"\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}",
    r"\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}",
    r"\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}",
    r"\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}",
    r"\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}",
    r"\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}",
    r"\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}",
    r"\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}",
    r"\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}",
    r"\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}",
    r"\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}",
    r"\x{1E900}-\x{1E943}]+",
);

/// CJK ideographs (and everything from U+0800 up to them) and Hangul, for DeepSeek.
const DEEPSEEK_CJK: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+";

/// A pre-tokenizer: its regexes in order and whether whole-vocabulary pieces skip merges.
pub(crate) struct PreTokenizer {
    pub regexes: &'static [&'static str],
    pub ignore_merges: bool,
}

const fn pre(regexes: &'static [&'static str], ignore_merges: bool) -> PreTokenizer {
    PreTokenizer {
        regexes,
        ignore_merges,
    }
}

/// The Llama 3 family's names: its split, whole-token pieces skip merges, BOS by default.
const LLAMA3_NAMES: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
];

/// llama.cpp's pre-tokenizer names for each split sloserve implements.
const FAMILIES: &[(&[&str], PreTokenizer)] = &[
    (LLAMA3_NAMES, pre(&[LLAMA3], true)),
    (&["dbrx", "smaug-bpe"], pre(&[LLAMA3], false)),
    (
        &["deepseek-llm"],
        pre(
            &[
                r"[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
                r"\s+$",
                DEEPSEEK_CJK,
                r"\p{N}+",
            ],
            false,
        ),
    ),
    (
        &["deepseek-coder"],
        pre(
            &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                DEEPSEEK_CJK,
                r"\p{N}",
            ],
            false,
        ),
    ),
    (
        &["falcon"],
        pre(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], false),
    ),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        pre(&[r"\p{N}", GPT2], false),
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "jina-es",
            "jina-de",
            "jina-v2-es",
            "jina-v2-de",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ],
        pre(&[GPT2], false),
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
        ],
        pre(&[QWEN2], false),
    ),
    (&["qwen35"], pre(&[QWEN35], false)),
    (
        &["gpt-4o", "llama4", "kanana2", "talkie"],
        pre(&[GPT4O], false),
    ),
    (
        &["default"],
        pre(
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
        ),
    ),
];

/// Whether llama.cpp adds BOS for this pre name when `tokenizer.ggml.add_bos_token` is
/// absent (the Llama 3 family, tekken, chameleon).
pub(crate) fn adds_bos(name: &str) -> bool {
    matches!(name, "tekken" | "chameleon") || LLAMA3_NAMES.contains(&name)
}

/// The pre-tokenizer of a `tokenizer.ggml.pre` name (`default` when the key is absent),
/// `None` for a name sloserve does not implement.
pub(crate) fn for_name(name: &str) -> Option<&'static PreTokenizer> {
    FAMILIES
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, p)| p)
}

/// Every `tokenizer.ggml.pre` name sloserve implements.
#[cfg(test)]
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().flat_map(|(names, _)| names.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regex_compiles_and_names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for name in names() {
            assert!(seen.insert(name), "{name} listed twice");
            for re in for_name(name).unwrap().regexes {
                tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex((*re).into()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{name}: {re}: {e}"));
            }
        }
        assert!(for_name("no-such-split").is_none());
    }

    /// GPT-4o's split: case changes start words, contractions stay on, digits go in
    /// threes, a lone space before a word joins it and one before a number stands alone.
    #[test]
    fn gpt4o_splits_words_by_case_and_digits_in_threes() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let split = tokenizers::pre_tokenizers::split::Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(GPT4O.into()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap();
        let text = "Hello World's CamelCase 12345 ok\n\n  x HTTPServer.";
        let mut pts = PreTokenizedString::from(text);
        split.pre_tokenize(&mut pts).unwrap();
        let pieces: Vec<&str> = pts
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s)
            .collect();
        assert_eq!(
            pieces,
            [
                "Hello",
                " World's",
                " Camel",
                "Case",
                " ",
                "123",
                "45",
                " ok",
                "\n\n",
                " ",
                " x",
                " HTTPServer",
                "."
            ]
        );
    }
}
