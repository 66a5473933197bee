//! `tokenizer::hf_export` on llama.cpp's test vocabularies (`tests/data/vocab/`): each
//! exported `tokenizer.json`, loaded back with the `tokenizers` crate, must encode every
//! test input to llama.cpp's ids (no BOS, control-token texts as plain text), as sloserve
//! does; the written folder holds the three files; bad inputs give errors, not panics.
//! (tests/python/test_export_tokenizer.py checks the same with Python's `tokenizers`.)

use std::io::Read;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use sloserve_model::tokenizer::hf_export::HfTokenizer;

fn vocab_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/vocab")
}

fn content(name: &str) -> Content {
    let gz = std::fs::read(vocab_dir().join(format!("ggml-vocab-{name}.gguf.gz"))).unwrap();
    let mut gguf = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut gguf)
        .unwrap();
    Content::read(&mut std::io::Cursor::new(gguf)).unwrap()
}

/// (input, expected ids), split as llama.cpp's test-tokenizer-0 does.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        std::fs::read_to_string(vocab_dir().join(format!("ggml-vocab-{name}.gguf{ext}"))).unwrap()
    };
    let inp = read(".inp");
    let mut inputs: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    if inputs.last().is_some_and(String::is_empty) {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> = read(".out")
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}");
    inputs.into_iter().zip(outputs).collect()
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(vocab_dir())
        .unwrap()
        .filter_map(|e| {
            let f = e.unwrap().file_name().to_string_lossy().into_owned();
            Some(
                f.strip_prefix("ggml-vocab-")?
                    .strip_suffix(".gguf.gz")?
                    .to_string(),
            )
        })
        .collect();
    names.sort();
    names
}

#[test]
fn exported_tokenizers_encode_as_llamacpp() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let hf =
            HfTokenizer::from_content(&content(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let json = serde_json::to_string(&hf.tokenizer).unwrap();
        let mut tok: tokenizers::Tokenizer = json
            .parse()
            .unwrap_or_else(|e| panic!("{name}: tokenizer.json does not load: {e}"));
        tok.set_encode_special_tokens(true);
        let cases = cases(&name);
        let mut ok = 0;
        for (text, want) in &cases {
            let got = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        report.push(format!("{name:<16} {ok}/{}", cases.len()));
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// BOS goes first where the GGUF says add_bos (the post-processor), special tokens parse.
#[test]
fn exported_tokenizers_add_bos_and_parse_special_tokens() {
    for (name, text, want_first) in [
        ("llama-spm", "<s>", Some(1)),
        ("llama-bpe", "Hello", Some(128000)),
        ("qwen2", "<|endoftext|>", Some(151643)),
        ("bert-bge", "hello", Some(101)),
    ] {
        let hf = HfTokenizer::from_content(&content(name)).unwrap();
        let tok: tokenizers::Tokenizer = serde_json::to_string(&hf.tokenizer)
            .unwrap()
            .parse()
            .unwrap();
        let ids = tok.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(ids.first().copied(), want_first, "{name}: {ids:?}");
        let config = &hf.config;
        assert_eq!(
            config["tokenizer_class"], "PreTrainedTokenizerFast",
            "{name}"
        );
    }
}

#[test]
fn writes_three_files_and_names_the_path_it_cannot_write() {
    let hf = HfTokenizer::from_content(&content("gpt-2")).unwrap();
    let dir = std::env::temp_dir().join(format!("sloserve-hf-export-{}", std::process::id()));
    let written = hf.write(&dir.join("tok")).unwrap();
    let names: Vec<_> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json"
        ]
    );
    for p in &written {
        let _: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    }
    // A file where the folder should be: an error naming it.
    let blocked = dir.join("tok").join("tokenizer.json").join("sub");
    let err = hf.write(&blocked).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_without_a_tokenizer_is_an_error() {
    let mut c = content("gpt-2");
    c.metadata.remove("tokenizer.ggml.tokens");
    let err = HfTokenizer::from_content(&c)
        .err()
        .expect("an error")
        .to_string();
    assert!(err.contains("tokenizer.ggml.tokens"), "{err}");
}

/// The export says where tokenizers may differ from llama.cpp, and only there.
#[test]
fn notes_name_what_applies_to_the_file() {
    let notes = |name: &str| {
        HfTokenizer::from_content(&content(name))
            .unwrap()
            .notes
            .join("\n")
    };
    assert!(notes("falcon").contains("12 added tokens end with the start of another"));
    assert!(notes("llama-spm").contains("1 scores are each shared"));
    assert!(notes("bert-bge").contains("NFD"));
    let qwen2 = notes("qwen2");
    assert!(!qwen2.contains("added tokens end with"), "{qwen2}");
    assert!(qwen2.contains("Oniguruma"), "{qwen2}");
}
