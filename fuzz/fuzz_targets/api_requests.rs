//! Request bodies of `/v1/completions`, `/v1/chat/completions` and `/tokenize`: parsing
//! and validation never panic, and every rejection is a 4xx with a message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sloserve_api::{
    parse_json, ApiError, ChatCompletionRequest, CompletionRequest, TokenizeRequest,
};

fn check(e: &ApiError) {
    assert!((400..500).contains(&e.status), "{e:?}");
    assert!(!e.message.is_empty(), "{e:?}");
}

fuzz_target!(|data: &[u8]| {
    match parse_json::<CompletionRequest>(data) {
        Ok(req) => {
            if let Err(e) = req.params() {
                check(&e)
            }
        }
        Err(e) => check(&e),
    }
    match parse_json::<ChatCompletionRequest>(data) {
        Ok(req) => {
            if let Err(e) = req.params() {
                check(&e)
            }
            if let Err(e) = req.text_messages() {
                check(&e)
            }
        }
        Err(e) => check(&e),
    }
    match parse_json::<TokenizeRequest>(data) {
        Ok(req) => {
            if let Err(e) = req.validate() {
                check(&e)
            }
        }
        Err(e) => check(&e),
    }
});
