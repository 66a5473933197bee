//! The GGUF header reader on arbitrary bytes (seeds: the default model's first 4 KiB and
//! the synthetic files of the hostile-file tests); a header that parses goes on to the
//! tokenizer and chat-template builders. Nothing may panic or allocate without bound.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use sloserve_model::chat_template::ChatTemplate;
use sloserve_model::gguf_header::read_header;
use sloserve_model::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Ok(content) = read_header(&mut Cursor::new(data), data.len() as u64) else {
        return;
    };
    for (name, info) in &content.tensor_infos {
        let end = content.tensor_data_offset + info.offset;
        assert!(end <= data.len() as u64, "{name} starts past the end");
    }
    if let Ok(tok) = Tokenizer::from_gguf(&content) {
        let _ = ChatTemplate::from_gguf(&content, &tok);
        let _ = tok.encode("hello <|im_start|> world", true);
    }
});
