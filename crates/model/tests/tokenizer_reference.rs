//! Tokenizer and streaming detokenizer against llama.cpp's reference tokenizations of
//! SmolLM2-135M-Instruct (tokenize records plus every greedy record's prompt and output).

mod common;

use candle_core::quantized::gguf_file::Value;
use common::{load_content, reference_json as reference};
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::ModelError;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&load_content()).expect("tokenizer builds from GGUF")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

const GREEDY_FILES: &[&str] = &[
    "llamacpp-greedy-smollm2-q4_1.jsonl",
    "llamacpp-f32-greedy-smollm2.jsonl",
    "llamacpp-f32-long-smollm2.jsonl",
];

/// Streams `ids` through a `StreamDecoder`, checking every piece is clean UTF-8 text.
fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut dec = StreamDecoder::new(skip_special);
    let mut out = String::new();
    for &id in ids {
        let piece = dec.push(tok, id);
        assert!(
            !piece.contains('\u{FFFD}'),
            "piece {piece:?} holds a replacement char"
        );
        out.push_str(piece);
    }
    out.push_str(&dec.flush());
    out
}

#[test]
fn metadata() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(!tok.add_bos());
    assert_eq!(tok.pre_tokenizer_name(), "smollm");
    assert_eq!(tok.token_str(1), Some("<|im_start|>"));
    assert_eq!(tok.token_str(49152), None);
    assert_eq!(tok.token_bytes(2), b"<|im_end|>".to_vec());
    assert_eq!(tok.token_bytes(198), b"\n".to_vec());
    assert!(tok.is_special(0) && tok.is_special(2) && !tok.is_special(198));
    let stops = tok.stop_token_ids();
    assert_eq!(stops[0], 2);
    assert!(
        stops.contains(&0),
        "<|endoftext|> is a stop token: {stops:?}"
    );
}

#[test]
fn reproduces_llamacpp_tokenize_records() {
    let tok = tokenizer();
    let records = reference("llamacpp-tokenize-smollm2.jsonl");
    let mut n = 0;
    for r in &records {
        let text = r["text"].as_str().expect("text");
        let want = ids(&r["token_ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "tokens of {text:?}");
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            text,
            "round trip of {text:?}"
        );
        assert_eq!(
            stream(&tok, &want, false),
            text,
            "streamed decode of {text:?}"
        );
        n += 1;
    }
    assert_eq!(n, 26, "tokenize records checked");
}

#[test]
fn reproduces_greedy_record_prompts_and_outputs() {
    let tok = tokenizer();
    let mut n = 0;
    for file in GREEDY_FILES {
        for r in reference(file) {
            let id = r["id"].as_str().unwrap_or("?");
            let prompt = r["rendered_prompt"].as_str().expect("rendered_prompt");
            let want = ids(&r["prompt_token_ids"]);
            assert_eq!(
                tok.encode(prompt, true).unwrap(),
                want,
                "{file} {id}: prompt tokens"
            );
            assert_eq!(
                tok.encode_prompt(prompt).unwrap(),
                want,
                "{file} {id}: prompt tokens with the BOS rule"
            );
            assert_eq!(
                tok.decode(&want, false).unwrap(),
                prompt,
                "{file} {id}: prompt decode"
            );
            let out = ids(&r["greedy_token_ids"]);
            let text = r["greedy_text"].as_str().expect("greedy_text");
            assert_eq!(
                tok.decode(&out, true).unwrap(),
                text,
                "{file} {id}: greedy decode"
            );
            assert_eq!(stream(&tok, &out, true), text, "{file} {id}: greedy stream");
            n += 1;
        }
    }
    assert_eq!(n, 10 + 10 + 3, "greedy records checked");
}

#[test]
fn encode_prompt_adds_bos_once_iff_the_model_asks() {
    let mut content = load_content();
    // SmolLM2 does not ask for BOS: a prompt is its plain tokenization.
    let tok = Tokenizer::from_gguf(&content).unwrap();
    assert!(!tok.add_bos());
    let hello = tok.encode("Hello", true).unwrap();
    assert_eq!(tok.encode_prompt("Hello").unwrap(), hello);

    content
        .metadata
        .insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
    let tok = Tokenizer::from_gguf(&content).unwrap();
    assert!(tok.add_bos());
    let bos = tok.bos_id().expect("SmolLM2 names a BOS token");
    let with_bos = |ids: &[u32]| [&[bos][..], ids].concat();
    assert_eq!(tok.encode_prompt("Hello").unwrap(), with_bos(&hello));
    assert_eq!(tok.encode_prompt("").unwrap(), vec![bos]);
    // A text that already starts with the BOS token keeps only its own.
    let chat = "<|im_start|>user\nhi<|im_end|>";
    let ids = tok.encode(chat, true).unwrap();
    assert_eq!(ids[0], bos);
    assert_eq!(tok.encode_prompt(chat).unwrap(), ids);
    // The BOS token further in does not count.
    let late = " <|im_start|>";
    assert_eq!(
        tok.encode_prompt(late).unwrap(),
        with_bos(&tok.encode(late, true).unwrap())
    );
}

#[test]
fn parse_special_false_treats_control_tokens_as_text() {
    let tok = tokenizer();
    let text = "<|im_start|>user\nhi<|im_end|>";
    let special = tok.encode(text, true).unwrap();
    assert_eq!(special, vec![1, 4093, 198, 6004, 2]);
    let plain = tok.encode(text, false).unwrap();
    assert!(
        plain.iter().all(|&id| !tok.is_special(id)),
        "no control ids in {plain:?}"
    );
    assert!(plain.len() > special.len());
    assert_eq!(tok.decode(&plain, false).unwrap(), text);
    // Alone, the control text still splits into ordinary pieces.
    let alone = tok.encode("<|im_start|>", false).unwrap();
    assert!(alone.len() > 1 && !alone.contains(&1), "{alone:?}");
    assert_eq!(tok.decode(&alone, false).unwrap(), "<|im_start|>");
}

#[test]
fn decode_skip_special_and_bad_ids() {
    let tok = tokenizer();
    let ids = tok
        .encode("<|im_start|>assistant\nHi there<|im_end|>", true)
        .unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "assistant\nHi there");
    assert!(matches!(
        tok.decode(&[49152], false),
        Err(ModelError::Tokenizer(_))
    ));
    assert!(tok.token_bytes(u32::MAX).is_empty());
}

#[test]
fn stream_decoder_holds_back_partial_utf8() {
    let tok = tokenizer();
    let text = "🙂🙃🙂 안녕하세요 ᚠᛇᚻ";
    let ids = tok.encode(text, true).unwrap();
    let mut dec = StreamDecoder::new(false);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(dec.push(&tok, id).to_string());
    }
    assert!(
        pieces.iter().any(|p| p.is_empty()),
        "some token ends mid-character: {pieces:?}"
    );
    assert_eq!(dec.flush(), "");
    assert_eq!(pieces.concat(), text);
    // An incomplete sequence left at the end becomes U+FFFD, as in `decode`.
    let first = ids[0];
    assert!(std::str::from_utf8(&tok.token_bytes(first)).is_err());
    let mut dec = StreamDecoder::new(false);
    assert_eq!(dec.push(&tok, first), "");
    assert!(dec.has_pending());
    assert_eq!(dec.flush(), tok.decode(&[first], false).unwrap());
    // Special tokens are emitted as text unless skipped.
    let mut dec = StreamDecoder::new(false);
    assert_eq!(dec.push(&tok, 2), "<|im_end|>");
    let mut dec = StreamDecoder::new(true);
    assert_eq!(dec.push(&tok, 2), "");
}

#[test]
fn unsupported_tokenizer_model_is_named() {
    let mut content = load_content();
    content
        .metadata
        .insert("tokenizer.ggml.model".into(), Value::String("rwkv".into()));
    match Tokenizer::from_gguf(&content) {
        Err(ModelError::Tokenizer(msg)) => assert!(
            msg.contains("'rwkv'") && msg.contains("gpt2 (byte-level BPE), llama (SentencePiece)"),
            "{msg}"
        ),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an RWKV tokenizer must be rejected"),
    }
    content.metadata.remove("tokenizer.ggml.model");
    assert!(matches!(
        Tokenizer::from_gguf(&content),
        Err(ModelError::MissingMetadata { .. })
    ));
}
