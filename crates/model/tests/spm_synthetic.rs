//! The SentencePiece tokenizer beyond Gemma: a small vocabulary (scores, control and
//! user-defined tokens, the 256 byte tokens) written to a GGUF file, read back, and
//! arbitrary text encoded and decoded back unchanged, with llama.cpp's defaults for
//! the keys a file leaves out.

use candle_core::quantized::gguf_file::{self, Content, Value};
use rand::{Rng, SeedableRng};
use sloserve_model::tokenizer::Tokenizer;

/// Normal pieces with their scores (higher merges first).
const PIECES: &[(&str, f32)] = &[
    ("▁", -1.0),
    ("▁the", -2.0),
    ("th", -3.0),
    ("he", -3.5),
    ("the", -2.5),
    ("▁a", -4.0),
    ("an", -3.9),
    ("and", -4.8),
    ("▁and", -5.0),
    ("▁▁", -6.0),
    ("é", -7.0),
];

/// Writes the vocabulary, with `extra` metadata, and reads the tokenizer back.
fn tokenizer(extra: &[(&str, Value)]) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), "<nl2>".into()];
    let mut types = vec![2, 3, 3, 4];
    let mut scores = vec![0.0f32; 4];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for c in 'a'..='z' {
        tokens.push(c.to_string());
        types.push(1);
        scores.push(-10.0);
    }
    for (p, s) in PIECES {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(*s);
    }
    let arr = |v: Vec<Value>| Value::Array(v);
    let mut meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            arr(tokens.into_iter().map(Value::String).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            arr(scores.into_iter().map(Value::F32).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            arr(types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ];
    meta.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut buf = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut buf, &refs, &[]).unwrap();
    buf.set_position(0);
    let content = Content::read(&mut buf).unwrap();
    Tokenizer::from_gguf(&content).expect("SentencePiece vocabulary builds")
}

fn id(tok: &Tokenizer, piece: &str) -> u32 {
    (0..tok.vocab_size() as u32)
        .find(|&i| tok.token_str(i) == Some(piece))
        .unwrap()
}

#[test]
fn merges_by_score_and_falls_back_to_bytes() {
    let tok = tokenizer(&[]);
    assert_eq!(tok.model(), "llama");
    // Defaults: BOS added, a space prefix, no EOS.
    assert!(tok.add_bos() && !tok.add_eos());
    let ids = tok.encode_prompt("the and").unwrap();
    assert_eq!(ids, [1, id(&tok, "▁the"), id(&tok, "▁and")]);
    // "7" and the emoji's four bytes have no piece: byte tokens.
    let ids = tok.encode("x7🙂", false).unwrap();
    let mut want = vec![id(&tok, "▁"), id(&tok, "x"), 4 + b'7' as u32];
    want.extend("🙂".bytes().map(|b| 4 + b as u32));
    assert_eq!(ids, want);
    // Control text only with parse_special; the user-defined token always.
    assert_eq!(tok.encode("<s>", true).unwrap(), [1]);
    assert_ne!(tok.encode("<s>", false).unwrap(), [1]);
    assert_eq!(tok.encode("a<nl2>", false).unwrap(), [id(&tok, "▁a"), 3]);
}

#[test]
fn arbitrary_text_round_trips() {
    let alphabet: Vec<char> = "the and  xyz é\u{301}\n\t🙂字\u{0}\u{7f}ÿ<s>"
        .chars()
        .collect();
    let plain = tokenizer(&[("tokenizer.ggml.add_space_prefix", Value::Bool(false))]);
    let spaced = tokenizer(&[("tokenizer.ggml.add_eos_token", Value::Bool(true))]);
    assert!(spaced.encode_prompt("a").unwrap().ends_with(&[2]));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..300 {
        let len = rng.random_range(0..40);
        let text: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        let ids = plain.encode(&text, false).unwrap();
        assert_eq!(plain.decode(&ids, false).unwrap(), text, "{ids:?}");
        // With the space prefix, decoding shows it (llama.cpp's pieces keep it too).
        let ids = spaced.encode(&text, false).unwrap();
        let want = if text.is_empty() {
            String::new()
        } else {
            format!(" {text}")
        };
        assert_eq!(spaced.decode(&ids, false).unwrap(), want, "{ids:?}");
    }
}
