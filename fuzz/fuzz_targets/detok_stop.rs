//! The streaming detokenizer and the stop-string matcher together, as a generation runs
//! them: the streamed pieces add up to `decode` of all ids, and the matcher emits
//! exactly the text before the earliest stop string (all of it when none occurs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_server::generation::stop::{StopMatcher, StopOutcome};

fuzz_target!(|data: &[u8]| {
    let tok = &sloserve_fuzz::fixture().tokenizer;
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    // Up to 3 non-empty stop strings, each a length byte then its bytes.
    let mut rest = rest;
    let mut stops = Vec::new();
    for _ in 0..(head % 4) {
        let Some((&n, r)) = rest.split_first() else {
            break;
        };
        let n = (n as usize % 8 + 1).min(r.len());
        let s = String::from_utf8_lossy(&r[..n]).into_owned();
        if !s.is_empty() {
            stops.push(s);
        }
        rest = &r[n..];
    }
    let skip_special = head & 0x80 != 0;
    let vocab = tok.vocab_size() as u32;
    let ids: Vec<u32> = rest
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32 % vocab)
        .collect();

    let mut dec = StreamDecoder::new(skip_special);
    let mut stop = StopMatcher::new(stops.clone());
    let (mut streamed, mut emitted, mut stopped) = (String::new(), String::new(), false);
    let mut feed = |piece: &str, emitted: &mut String, stopped: &mut bool| {
        if *stopped {
            return;
        }
        match stop.push(piece) {
            StopOutcome::Emit(t) => emitted.push_str(&t),
            StopOutcome::Stopped(t) => {
                emitted.push_str(&t);
                *stopped = true;
            }
        }
    };
    for &id in &ids {
        let piece = dec.push(tok, id).to_string();
        streamed.push_str(&piece);
        feed(&piece, &mut emitted, &mut stopped);
    }
    let tail = dec.flush();
    streamed.push_str(&tail);
    feed(&tail, &mut emitted, &mut stopped);
    assert_eq!(streamed, tok.decode(&ids, skip_special).unwrap());

    let earliest = stops.iter().filter_map(|s| streamed.find(s.as_str())).min();
    match earliest {
        Some(i) => {
            assert!(
                stopped,
                "a stop string occurs at {i} but the matcher missed it"
            );
            assert_eq!(emitted, streamed[..i]);
        }
        None => {
            assert!(!stopped);
            emitted.push_str(&stop.finish());
            assert_eq!(emitted, streamed);
        }
    }
});
