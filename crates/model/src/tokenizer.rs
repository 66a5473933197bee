//! Tokenizer built from GGUF metadata (to come).
