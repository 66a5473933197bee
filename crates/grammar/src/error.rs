//! `GrammarError`: why a constraint was refused (compile) or failed (matching).

/// The one error type of the grammar crate. `Unsupported`, `Invalid`, `TooLarge`
/// and `CompileTimeout` are the client's fault (HTTP 400); `Busy` is load (the
/// compile workers and their queue are full: retry later); `Vocab` is the model's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// The request asks for something the grammar engine does not support (a JSON
    /// Schema keyword, a regex feature); the message names it.
    #[error("unsupported constraint: {0}")]
    Unsupported(String),
    /// The constraint is malformed (bad `response_format`, unsatisfiable schema,
    /// Lark syntax error...).
    #[error("invalid constraint: {0}")]
    Invalid(String),
    /// The grammar took longer than the compile time bound.
    #[error("constraint took longer than {0} ms to compile")]
    CompileTimeout(u64),
    /// The grammar exceeds a size limit (lexer states, grammar size, fuel).
    #[error("constraint too large: {0}")]
    TooLarge(String),
    /// Every compile worker is busy and the queue is full.
    #[error("the grammar compiler is busy: {0}")]
    Busy(String),
    /// The tokenizer's vocabulary can't be turned into a token trie.
    #[error("vocabulary: {0}")]
    Vocab(String),
}

/// llguidance's message as a client should read it: without its `<non-verbose/>`
/// marker, and a bare parser stop reason (`NoExtensionBias`...) said in words.
pub(crate) fn readable(msg: &str) -> String {
    let m = msg.replace("<non-verbose/>", "");
    let m = m.trim();
    let words = match m.to_ascii_lowercase().replace('_', "").as_str() {
        "noextensionbias" => {
            "the constraint allows no output at all (e.g. a $ref loop with no way out)"
        }
        "noextension" => "the constraint allows no further output",
        "lexertoocomplex" => "the constraint is past the grammar engine's lexer limits",
        "parsertoocomplex" => "the constraint is past the grammar engine's parser limits",
        "internalerror" => "the grammar engine could not build a parser for the constraint",
        "cancelled" | "operation cancelled" => "stopped at the compile time bound",
        _ => m,
    };
    words.to_string()
}

impl GrammarError {
    /// Sorts a compile error of llguidance into the variant a client can act on.
    pub(crate) fn from_compile(msg: String) -> Self {
        let msg = readable(&msg);
        let m = msg.to_ascii_lowercase();
        if m.contains("fuel") || m.contains("too large") || m.contains("limit") {
            GrammarError::TooLarge(msg)
        } else if m.contains("unimplemented")
            || m.contains("unsupported")
            || m.contains("unknown keyword")
            || m.contains("not supported")
        {
            GrammarError::Unsupported(msg)
        } else {
            GrammarError::Invalid(msg)
        }
    }
}
