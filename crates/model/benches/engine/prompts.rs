//! Benchmark prompts: real-ish English from a seeded generator, tokenized to exact lengths.

use sloserve_model::tokenizer::Tokenizer;

#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "a", "river", "city", "morning", "engineer", "report", "quietly", "under", "bridge",
    "before", "after", "winter", "garden", "market", "old", "new", "small", "large", "music",
    "teacher", "station", "train", "letter", "window", "opened", "closed", "walked", "found",
    "carried", "history", "village", "mountain", "storm", "harbour", "library", "evening",
    "children", "council", "decided", "because", "although", "while", "during", "through",
    "people", "water", "light", "road", "house", "friend", "question", "answer", "plan",
    "machine", "kitchen", "bread", "coffee", "paper", "story", "season", "field", "forest",
    "and", "but", "with", "without", "over", "near", "slowly", "suddenly", "often", "never",
    "remembered", "explained", "built", "painted", "measured", "counted", "travelled", "wrote",
    "careful", "bright", "grey", "warm", "cold", "early", "late", "every", "some", "many",
];

/// A deterministic generator of English-looking sentences.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as usize
    }
}

fn text(seed: u64, words: usize) -> String {
    let mut rng = Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut s = String::new();
    let mut sentence = 0;
    for i in 0..words {
        let w = WORDS[rng.next() % WORDS.len()];
        if sentence == 0 {
            let mut c = w.chars();
            let first = c.next().unwrap().to_ascii_uppercase();
            s.push(first);
            s.push_str(c.as_str());
        } else {
            s.push_str(w);
        }
        sentence += 1;
        if sentence > 6 && rng.next().is_multiple_of(5) || i + 1 == words {
            s.push_str(". ");
            sentence = 0;
        } else {
            s.push(' ');
        }
    }
    s
}

pub struct Prompts {
    pub tok: Tokenizer,
}

impl Prompts {
    pub fn encode(&self, s: &str) -> Vec<u32> {
        self.tok.encode(s, false).expect("tokenize")
    }

    /// Exactly `len` tokens: a header naming `tag`, then generated text.
    pub fn unique(&self, tag: &str, seed: u64, len: usize) -> Vec<u32> {
        let mut t = self.encode(&format!("{tag}: "));
        let mut words = len;
        loop {
            let body = self.encode(&text(seed, words));
            if t.len() + body.len() >= len {
                t.extend_from_slice(&body);
                t.truncate(len);
                return t;
            }
            words *= 2;
        }
    }

    /// Exactly `len` tokens of generated text (no header).
    pub fn body(&self, seed: u64, len: usize) -> Vec<u32> {
        let mut words = len;
        loop {
            let mut t = self.encode(&text(seed, words));
            if t.len() >= len {
                t.truncate(len);
                return t;
            }
            words *= 2;
        }
    }
}
