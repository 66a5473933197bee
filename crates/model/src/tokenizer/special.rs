//! Special-token partitioning, as llama.cpp's `tokenizer_st_partition`: the text is split
//! around every occurrence of each control, unknown and user-defined token, longest token
//! text first; control and unknown tokens only with `parse_special`, user-defined ones
//! always. A token marked rstrip swallows the whitespace after it.

use super::spm::{TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED};

/// A piece of the input after special-token partitioning.
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

struct Special {
    text: String,
    id: u32,
    /// Control or unknown: matched only with `parse_special`.
    needs_parse: bool,
    rstrip: bool,
}

pub(crate) struct SpecialTokens(Vec<Special>);

impl SpecialTokens {
    /// The special tokens of a vocabulary; `rstrip(text)` says which swallow the
    /// whitespace after them (llama.cpp sets it by model name, e.g. for Phi-3).
    pub(crate) fn new(tokens: &[String], types: &[i32], rstrip: impl Fn(&str) -> bool) -> Self {
        let mut list: Vec<Special> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (t, &ty))| {
                !t.is_empty() && matches!(ty, TYPE_CONTROL | TYPE_UNKNOWN | TYPE_USER_DEFINED)
            })
            .map(|(i, (t, &ty))| Special {
                text: t.clone(),
                id: i as u32,
                needs_parse: ty != TYPE_USER_DEFINED,
                rstrip: rstrip(t),
            })
            .collect();
        list.sort_by_key(|s| (std::cmp::Reverse(s.text.len()), s.id));
        SpecialTokens(list)
    }

    /// `text` split around the special tokens (empty text: no fragments).
    pub(crate) fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(text)];
        for s in &self.0 {
            if s.needs_parse && !parse_special {
                continue;
            }
            let tok = s.text.as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(tok)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut t) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(p) = t.find(tok) {
                    if p > 0 {
                        next.push(Fragment::Text(&t[..p]));
                    }
                    next.push(Fragment::Token(s.id));
                    t = &t[p + tok.len()..];
                    if s.rstrip {
                        t = t.trim_start_matches(is_c_space);
                    }
                }
                if !t.is_empty() {
                    next.push(Fragment::Text(t));
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(frags: &[Fragment<'_>]) -> Vec<String> {
        frags
            .iter()
            .map(|f| match f {
                Fragment::Text(t) => format!("{t:?}"),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    #[test]
    fn longest_first_user_defined_always_rstrip_swallows_spaces() {
        let tokens: Vec<String> = ["<s>", "<|end|>", "<|end|>x", "<u>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let types = [TYPE_CONTROL, TYPE_CONTROL, TYPE_CONTROL, TYPE_USER_DEFINED];
        let sp = SpecialTokens::new(&tokens, &types, |t| t == "<|end|>");
        let text = "a<|end|>x b<|end|> \n c<u> d<s>";
        assert_eq!(
            parts(&sp.partition(text, true)),
            ["\"a\"", "#2", "\" b\"", "#1", "\"c\"", "#3", "\" d\"", "#0"]
        );
        // Without parse_special only the user-defined token is cut out.
        assert_eq!(
            parts(&sp.partition(text, false)),
            ["\"a<|end|>x b<|end|> \\n c\"", "#3", "\" d<s>\""]
        );
        assert!(sp.partition("", true).is_empty());
    }
}
