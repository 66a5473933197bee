//! Shared fixtures of the fuzz targets: the default model's tokenizer and chat
//! template, loaded once from its GGUF header.

use std::sync::OnceLock;

use sloserve_model::chat_template::ChatTemplate;
use sloserve_model::tokenizer::Tokenizer;

pub struct Fixture {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// ASCII characters the vocabulary has no token for (SmolLM2 lacks bytes 0x04,
    /// 0x06, 0x13, 0x14, 0x16, 0x1d): encoding drops them, as Hugging Face's does.
    pub unencodable: Vec<char>,
}

impl Fixture {
    /// `text` without the characters encoding drops.
    pub fn encodable(&self, text: &str) -> String {
        text.chars()
            .filter(|c| !self.unencodable.contains(c))
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
        let unencodable = (0u8..0x80)
            .map(char::from)
            .filter(|c| tokenizer.encode(&c.to_string(), false).unwrap().is_empty())
            .collect();
        Fixture {
            tokenizer,
            template,
            unencodable,
        }
    })
}
