//! An API key with its class ceiling (`KEY[:CLASS]`, the server's and the
//! router's format), and where a request presents it: one parse, one rule.

use std::fmt;
use std::str::FromStr;

use crate::SloClass;

/// One `KEY[:CLASS]`: a key and the highest class it may ask for. `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySpec {
    pub key: String,
    /// `Some(Batch)`: this key's requests run as batch (asking `interactive` is a 403).
    pub ceiling: Option<SloClass>,
}

impl FromStr for KeySpec {
    type Err = String;
    /// `KEY` or `KEY:interactive|batch`; a suffix that is not a class is part of the key.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (key, ceiling) = match s.rsplit_once(':') {
            Some((k, c)) if c.parse::<SloClass>().is_ok() => (k, c.parse::<SloClass>().ok()),
            _ => (s, None),
        };
        if key.is_empty() {
            return Err("an API key cannot be empty".into());
        }
        Ok(KeySpec {
            key: key.to_string(),
            ceiling,
        })
    }
}

impl fmt::Debug for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ceiling {
            Some(c) => write!(f, "KeySpec(<redacted>:{c})"),
            None => f.write_str("KeySpec(<redacted>)"),
        }
    }
}

/// A stable name for an API key that does not reveal it: the first 128 bits of
/// SHA-256 over a domain tag and the key, in hex (`key-…`). The server's Batch API
/// owner of the key's objects and the fairness flow of its requests, the router's
/// too, so a key is one flow whichever hop named it.
pub fn key_digest(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"sloserve batch owner v1\0")
        .chain_update(key.as_bytes())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("key-{hex}")
}

/// The prefix-cache salt of a request's scope: its key's digest ([`key_digest`],
/// `None` without a per-key scope) and its `cache_salt`; 0 (the shared cache)
/// when neither applies. SHA-256, so the salt is the same in every process and
/// release: the disk tier keeps blocks under it across restarts, and a scope
/// never meets another's salt by a key's position in a list.
pub fn cache_scope_salt(owner: Option<&str>, cache_salt: Option<&str>) -> u64 {
    use sha2::{Digest, Sha256};
    if owner.is_none() && cache_salt.is_none() {
        return 0;
    }
    let part = |s: Option<&str>| match s {
        Some(s) => format!("1{}:{s}", s.len()),
        None => "0".into(),
    };
    let d = Sha256::new()
        .chain_update(b"sloserve cache scope v1\0")
        .chain_update(part(owner).as_bytes())
        .chain_update(b"\0")
        .chain_update(part(cache_salt).as_bytes())
        .finalize();
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes")).max(1)
}

/// The key a request presents: `Authorization: Bearer KEY` (either header value
/// given as bytes), else `x-api-key: KEY` ([`crate::headers::API_KEY`]).
pub fn presented_key<'a>(
    authorization: Option<&'a [u8]>,
    x_api_key: Option<&'a [u8]>,
) -> Option<&'a [u8]> {
    if let Some(v) = authorization {
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(v[7..].trim_ascii());
        }
    }
    x_api_key.map(|v| v.trim_ascii())
}

/// The index of the first of `keys` equal to `given`. Every key is compared in
/// constant time and none ends the search early, so the answer's timing says
/// nothing of which key, or how much of one, matched.
pub fn match_key(keys: &[KeySpec], given: &[u8]) -> Option<usize> {
    let mut found = None;
    for (i, k) in keys.iter().enumerate() {
        if ct_eq(k.key.as_bytes(), given) && found.is_none() {
            found = Some(i);
        }
    }
    found
}

/// Byte strings equal, in time that depends only on the longer one's length.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly_in_constant_time() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd") && !ct_eq(b"abc", b"abcd") && !ct_eq(b"", b"a"));
        let keys: Vec<KeySpec> = ["k1", "k2:batch", "k1"]
            .iter()
            .map(|k| k.parse().unwrap())
            .collect();
        assert_eq!(match_key(&keys, b"k2"), Some(1));
        assert_eq!(match_key(&keys, b"k1"), Some(0));
        assert_eq!(match_key(&keys, b"k"), None);
    }

    #[test]
    fn specs_parse_and_never_print_the_key() {
        let k: KeySpec = "sk-abc:batch".parse().unwrap();
        assert_eq!(
            (k.key.as_str(), k.ceiling),
            ("sk-abc", Some(SloClass::Batch))
        );
        assert_eq!("a:b:c".parse::<KeySpec>().unwrap().key, "a:b:c");
        assert!("".parse::<KeySpec>().is_err() && ":batch".parse::<KeySpec>().is_err());
        assert!(!format!("{k:?}").contains("sk-abc"));
        assert_eq!(
            presented_key(Some(b"Bearer  k1 "), Some(b"k2")),
            Some(&b"k1"[..])
        );
        assert_eq!(
            presented_key(Some(b"Basic x"), Some(b" k2")),
            Some(&b"k2"[..])
        );
        assert_eq!(presented_key(None, None), None);
    }
}
