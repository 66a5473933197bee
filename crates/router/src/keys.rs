//! The router's API keys as data: the server's `KEY[:CLASS]` format (flags,
//! `SLOSERVE_API_KEY`, a key file), the presented key matched in constant time,
//! the caller's class ceiling for the routing decision. The middleware that
//! applies them is `auth`; the key itself travels on to the replica, which
//! checks it again.

use std::path::Path;

use anyhow::{bail, Context};
use axum::http::HeaderMap;
use sloserve_slo::SloClass;

pub use sloserve_slo::KeySpec;

/// A key file: one `KEY[:CLASS]` a line; blank lines and `#` comments skipped.
pub fn read_key_file(path: &Path) -> anyhow::Result<Vec<KeySpec>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the key file {}", path.display()))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let k = line
            .parse::<KeySpec>()
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), i + 1))?;
        keys.push(k);
    }
    if keys.is_empty() {
        bail!("the key file {} holds no key", path.display());
    }
    Ok(keys)
}

/// Who made a request (a request extension set by [`require_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The highest class this caller may ask for (`None`: any).
    pub ceiling: Option<SloClass>,
    /// Index of the matching key (`None`: the router has no keys).
    pub key_index: Option<usize>,
}

impl Caller {
    pub const OPEN: Caller = Caller {
        ceiling: None,
        key_index: None,
    };
}

/// The configured keys (empty: the router is open).
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    pub keys: Vec<KeySpec>,
    pub metrics_require_key: bool,
}

impl ApiKeys {
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Paths anyone may call: the endpoint table's open rows (probes, the API
    /// description, `/metrics` unless it needs a key).
    pub fn is_open(&self, path: &str) -> bool {
        sloserve_api::endpoints::is_open(path, self.metrics_require_key)
    }

    /// The fairness flow of `caller`'s requests: its key's digest (the replica's
    /// own name for the key), `None` without a key.
    pub fn flow_of(&self, caller: &Caller) -> Option<String> {
        let k = self.keys.get(caller.key_index?)?;
        Some(sloserve_slo::key_digest(&k.key))
    }

    /// The caller presenting `headers`' key; every key is compared (no early exit).
    pub fn identify(&self, headers: &HeaderMap) -> Option<Caller> {
        if !self.enabled() {
            return Some(Caller::OPEN);
        }
        let given = presented_key(headers)?;
        let i = sloserve_slo::match_key(&self.keys, given)?;
        Some(Caller {
            key_index: Some(i),
            ceiling: self.keys[i].ceiling,
        })
    }
}

/// The key in `Authorization: Bearer KEY`, else in `x-api-key`.
pub fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    let get = |name| {
        headers
            .get(name)
            .map(|v: &axum::http::HeaderValue| v.as_bytes())
    };
    sloserve_slo::presented_key(
        get(axum::http::header::AUTHORIZATION.as_str()),
        get(sloserve_slo::headers::API_KEY),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_match_exactly_and_ceilings_apply() {
        let k: KeySpec = "sk-abc:batch".parse().unwrap();
        assert_eq!(
            (k.key.as_str(), k.ceiling),
            ("sk-abc", Some(SloClass::Batch))
        );
        assert_eq!("a:b:c".parse::<KeySpec>().unwrap().key, "a:b:c");
        assert!(":batch".parse::<KeySpec>().is_err() && "".parse::<KeySpec>().is_err());
        assert!(!format!("{k:?}").contains("sk-abc"));
        let keys = ApiKeys {
            keys: vec!["k1".parse().unwrap(), "k2:batch".parse().unwrap()],
            metrics_require_key: false,
        };
        let mut h = HeaderMap::new();
        assert_eq!(keys.identify(&h), None);
        h.insert("authorization", "Bearer k2".parse().unwrap());
        let c = keys.identify(&h).unwrap();
        assert_eq!(c.ceiling, Some(SloClass::Batch));
        assert_eq!(keys.flow_of(&c), Some(sloserve_slo::key_digest("k2")));
        assert_eq!(keys.flow_of(&Caller::OPEN), None);
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k1".parse().unwrap());
        assert_eq!(keys.identify(&h).unwrap().ceiling, None);
        h.insert("x-api-key", "k11".parse().unwrap());
        assert_eq!(keys.identify(&h), None);
        assert!(keys.is_open("/health") && keys.is_open("/metrics"));
        assert!(!keys.is_open("/v1/models") && !keys.is_open("/v1/files"));

        let dir = std::env::temp_dir().join(format!("route-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("keys");
        std::fs::write(&p, "# tenants\nk1\n\n  k2:batch  \n").unwrap();
        let ks = read_key_file(&p).unwrap();
        assert_eq!(ks, keys.keys);
        std::fs::write(&p, "# none\n").unwrap();
        assert!(format!("{:#}", read_key_file(&p).unwrap_err()).contains("no key"));
        std::fs::write(&p, "ok\n:batch\n").unwrap();
        assert!(format!("{:#}", read_key_file(&p).unwrap_err()).contains(":2:"));
    }
}
