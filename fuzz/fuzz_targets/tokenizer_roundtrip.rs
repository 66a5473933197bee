//! The default model's tokenizer on arbitrary text: decoding the ids of text encoded
//! with control tokens taken literally gives the text back, byte for byte; encoding
//! with control tokens parsed and decoding arbitrary ids never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let f = sloserve_fuzz::fixture();
    let tok = &f.tokenizer;
    // Characters the vocabulary cannot encode are dropped (a regression test in
    // crates/model/tests/chat_control_tokens.rs records it); the rest round-trips.
    let text = f.encodable(&String::from_utf8_lossy(data));
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text, "{ids:?}");
    let special = tok.encode(&text, true).unwrap();
    assert_eq!(tok.decode(&special, false).unwrap(), text, "{special:?}");
    let raw: Vec<u32> = data
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
        .collect();
    let _ = tok.decode(&raw, true);
});
