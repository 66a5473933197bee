//! llama.cpp's own tokenizer tests (`tests/test-tokenizer-0.cpp`) on its `ggml-vocab-*.gguf`
//! vocabularies: every input of a vocab's `.inp` must encode to exactly the ids of its
//! `.out` (no BOS, control-token texts as plain text, as the C++ test calls
//! `common_tokenize(ctx, text, false, false)`), and decode back to the input.
//!
//! The vocabularies are slim copies in `tests/data/vocab/` (see its README.md): GGUFs with
//! no tensors, gzip-compressed. A vocabulary sloserve claims must have its files there;
//! one it does not claim is listed in [`NOT_CLAIMED`] with the reason (and in
//! docs/models.md's tokenizer table).

use std::io::Read;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use sloserve_model::tokenizer::Tokenizer;

/// The vocabularies sloserve tokenizes exactly as llama.cpp does.
const CLAIMED: &[&str] = &[
    "llama-bpe",
    "llama-spm",
    "qwen2",
    "phi-3",
    "gpt-2",
    "deepseek-llm",
    "deepseek-coder",
    "starcoder",
    "falcon",
    "mpt",
    "refact",
    "command-r",
    "qwen35",
    "gemma-4",
    "bert-bge",
];

/// llama.cpp's test vocabularies (those with `.inp` / `.out` files) sloserve does not
/// tokenize, and why: none today. (llama.cpp's `models/` also holds aquila, baichuan,
/// gpt-neox and nomic-bert-moe vocabularies, which have no test files.)
const NOT_CLAIMED: &[(&str, &str)] = &[];

fn vocab_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/vocab")
}

fn read(name: &str, ext: &str) -> Vec<u8> {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf{ext}"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (claimed vocabularies must have their data; see tests/data/vocab/README.md)",
            path.display()
        )
    })
}

fn tokenizer(name: &str) -> Result<Tokenizer, String> {
    let mut gguf = Vec::new();
    flate2::read::GzDecoder::new(&read(name, ".gz")[..])
        .read_to_end(&mut gguf)
        .unwrap_or_else(|e| panic!("{name}: gunzip: {e}"));
    let content = Content::read(&mut std::io::Cursor::new(gguf))
        .unwrap_or_else(|e| panic!("{name}: not a GGUF file: {e}"));
    Tokenizer::from_gguf(&content).map_err(|e| format!("{name}: {e}"))
}

/// The (input, expected ids) pairs, split as `read_tests` in test-tokenizer-0.cpp does.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = String::from_utf8(read(name, ".inp")).expect(".inp is UTF-8");
    let out = String::from_utf8(read(name, ".out")).expect(".out is UTF-8");
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(p) => {
                inputs.push(rest[..p].to_string());
                rest = &rest[p + SEP.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                rest = "";
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("token id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: .inp and .out hold different numbers of tests"
    );
    assert!(!inputs.is_empty(), "{name}: no tests");
    inputs.into_iter().zip(outputs).collect()
}

/// What decoding `text`'s ids must give: SentencePiece adds one leading space; WordPiece
/// loses case, accents and spacing, so it is not checked.
fn expected_decode(tok: &Tokenizer, text: &str) -> Option<String> {
    match tok.model() {
        "bert" => None,
        "llama" if !text.is_empty() => Some(format!(" {text}")),
        _ => Some(text.to_string()),
    }
}

/// Every vocabulary in the data folder is claimed (tested) or listed with its reason.
#[test]
fn every_vocab_file_is_accounted_for() {
    for entry in std::fs::read_dir(vocab_dir()).expect("tests/data/vocab/") {
        let file = entry.expect("dir entry").file_name();
        let file = file.to_string_lossy();
        let Some(name) = file
            .strip_prefix("ggml-vocab-")
            .and_then(|f| f.split(".gguf").next())
        else {
            continue;
        };
        assert!(
            CLAIMED.contains(&name) || NOT_CLAIMED.iter().any(|(n, _)| *n == name),
            "{file}: vocabulary {name} is neither claimed nor listed as not claimed"
        );
    }
}

#[test]
fn llamacpp_vocab_tests_pass_exactly() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for &name in CLAIMED {
        assert!(
            !NOT_CLAIMED.iter().any(|(n, _)| *n == name),
            "{name} is both claimed and not"
        );
        let tok = match tokenizer(name) {
            Ok(tok) => tok,
            Err(e) => {
                report.push(format!("{name:<16} does not load"));
                failures.push(e);
                continue;
            }
        };
        let cases = cases(name);
        let (mut enc_ok, mut dec_ok) = (0, 0);
        for (text, want) in &cases {
            let got = tok.encode(text, false).expect("encode");
            if &got == want {
                enc_ok += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
            let Some(expected) = expected_decode(&tok, text) else {
                continue;
            };
            let back = tok.decode(want, false).expect("decode");
            if back == expected {
                dec_ok += 1;
            } else {
                failures.push(format!("{name}: {text:?} decodes to {back:?}"));
            }
        }
        let n = cases.len();
        let dec = match expected_decode(&tok, "") {
            Some(_) => format!("{dec_ok}/{n}"),
            None => "not checked".into(),
        };
        report.push(format!("{name:<16} encode {enc_ok}/{n}  decode {dec}"));
    }
    for (name, why) in NOT_CLAIMED {
        report.push(format!("{name:<16} not claimed: {why}"));
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// With special tokens on, llama.cpp puts BOS first where `add_bos_token` says so (by
/// default for SentencePiece, Gemma 4 and the Llama 3 pre-tokenizer), and WordPiece's
/// `[CLS]` first and `[SEP]` last.
#[test]
fn prompts_get_llamacpp_special_tokens() {
    for (name, first, last) in [
        ("bert-bge", Some(101), Some(102)),
        ("llama-spm", Some(1), None),
        ("gemma-4", Some(2), None),
        ("llama-bpe", Some(128000), None),
        ("qwen2", None, None),
    ] {
        let tok = tokenizer(name).unwrap();
        let (text, ids) = cases(name)
            .into_iter()
            .find(|(t, _)| t == "Hello world")
            .expect("a Hello world case");
        let want: Vec<u32> = first.into_iter().chain(ids).chain(last).collect();
        assert_eq!(tok.encode_prompt(&text).unwrap(), want, "{name}");
    }
}
