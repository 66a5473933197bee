//! Shared fixtures of the fuzz targets: the default model's tokenizer and chat
//! template, loaded once from its GGUF header.

use std::sync::OnceLock;

use sloserve_model::chat_template::ChatTemplate;
use sloserve_model::tokenizer::Tokenizer;

pub struct Fixture {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

impl Fixture {
    /// SmolLM2's vocabulary lacks a few bytes (ASCII 0x04 0x06 0x13 0x14 0x16 0x1d and
    /// the UTF-8 lead bytes 0xf1 0xf2): encoding drops them, as Hugging Face's does, so
    /// characters using them do not round-trip and are left out.
    pub fn encodable(&self, text: &str) -> String {
        let tok = &self.tokenizer;
        text.chars()
            .filter(|c| {
                let s = c.to_string();
                tok.decode(&tok.encode(&s, false).unwrap(), false).unwrap() == s
            })
            .collect()
    }
}

/// The default model (`make model` fetches it) read with the checked header reader.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(sloserve_model::DEFAULT_MODEL_PATH);
        let mut file = std::io::BufReader::new(
            std::fs::File::open(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run `make model`)", path.display())),
        );
        let size = std::fs::metadata(&path).unwrap().len();
        let content = sloserve_model::gguf_header::read_header(&mut file, size).unwrap();
        let tokenizer = Tokenizer::from_gguf(&content).unwrap();
        let template = ChatTemplate::from_gguf(&content, &tokenizer)
            .unwrap()
            .expect("the default model has a chat template");
        Fixture {
            tokenizer,
            template,
        }
    })
}
