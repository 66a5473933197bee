//! API keys as data: the configured keys, the key a request presents
//! (`Authorization: Bearer` / `x-api-key`) matched in constant time, the caller's
//! identity (`Caller`) for class ceilings and cache scope, and its Batch API
//! [`Owner`] (a digest of the key) for the objects it may reach. The middleware
//! that applies them is [`crate::auth`].

use axum::http::HeaderMap;
use sloserve_batch::Owner;
use sloserve_engine::SloClass;

use crate::guard_args::ApiKeySpec;

/// The configured keys (empty: the API is open).
#[derive(Default)]
pub struct ApiKeys {
    keys: Vec<ApiKeySpec>,
    /// Each key's Batch API owner id ([`owner_id`]), by key index.
    owners: Vec<String>,
    metrics_require_key: bool,
}

/// The owner id recorded on a key's Batch API objects, and its requests' fairness
/// flow: [`sloserve_slo::key_digest`]. Stable across restarts and key reordering;
/// the key itself is never stored. A different key (a rotated one) is a different
/// owner.
pub fn owner_id(key: &str) -> String {
    sloserve_slo::key_digest(key)
}

/// Who made a request, as the auth middleware found it (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// Index of the matching key (`None`: no keys are configured).
    pub key_index: Option<usize>,
    /// The highest class this caller may ask for (`None`: any).
    pub ceiling: Option<SloClass>,
}

impl Caller {
    pub const OPEN: Caller = Caller {
        key_index: None,
        ceiling: None,
    };
}

impl ApiKeys {
    pub fn new(keys: Vec<ApiKeySpec>, metrics_require_key: bool) -> Self {
        ApiKeys {
            owners: keys.iter().map(|k| owner_id(&k.key)).collect(),
            keys,
            metrics_require_key,
        }
    }

    /// The Batch API owner of `caller`'s objects (no key: [`Owner::NONE`]).
    pub fn owner_of(&self, caller: &Caller) -> Owner {
        match caller.key_index.and_then(|i| self.owners.get(i)) {
            Some(id) => Owner::key(id.clone()),
            None => Owner::NONE,
        }
    }

    /// The fairness flow of `caller`'s requests: its key's owner id; `None`
    /// without a key.
    pub fn flow_of(&self, caller: &Caller) -> Option<&str> {
        caller
            .key_index
            .and_then(|i| self.owners.get(i))
            .map(String::as_str)
    }

    /// The caller a Batch API line of `owner` runs as: its key's identity, or the
    /// open caller for ownerless objects on a keyless server; `None` when the
    /// owner's key is not configured here (a removed or rotated key, or an
    /// ownerless object on a server with keys): such a line does not run.
    pub fn caller_for(&self, owner: &Owner) -> Option<Caller> {
        match owner.id() {
            None => (!self.enabled()).then_some(Caller::OPEN),
            Some(id) => self.owners.iter().position(|o| o == id).map(|i| Caller {
                key_index: Some(i),
                ceiling: self.keys[i].ceiling,
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Paths anyone may call (the endpoint table's open rows: probes, the API
    /// description, `/metrics` unless `--metrics-require-key`).
    pub fn is_open(&self, path: &str) -> bool {
        sloserve_api::endpoints::is_open(path, self.metrics_require_key)
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
    fn keys_match_exactly_and_ceilings_apply() {
        let keys = ApiKeys::new(
            vec!["k1".parse().unwrap(), "k2:batch".parse().unwrap()],
            false,
        );
        let mut h = HeaderMap::new();
        assert_eq!(keys.identify(&h), None);
        h.insert("authorization", "Bearer k2".parse().unwrap());
        let c = keys.identify(&h).unwrap();
        assert_eq!((c.key_index, c.ceiling), (Some(1), Some(SloClass::Batch)));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k1".parse().unwrap());
        assert_eq!(keys.identify(&h).unwrap().key_index, Some(0));
        h.insert("x-api-key", "k3".parse().unwrap());
        assert_eq!(keys.identify(&h), None);
        assert!(keys.is_open("/health") && keys.is_open("/metrics"));
        assert!(!keys.is_open("/v1/models") && !keys.is_open("/tokenize"));
        assert!(keys.is_open("/slo") && keys.is_open("/slo/app.js"));
        assert!(!keys.is_open("/slo/status") && !keys.is_open("/slo/"));
        assert!(!ApiKeys::new(vec![], true).is_open("/metrics"));
    }

    #[test]
    fn owners_are_stable_digests_and_resolve_back_to_their_key() {
        let keys = ApiKeys::new(
            vec!["k1".parse().unwrap(), "k2:batch".parse().unwrap()],
            false,
        );
        let k2 = Caller {
            key_index: Some(1),
            ceiling: Some(SloClass::Batch),
        };
        let o = keys.owner_of(&k2);
        // The key reordered (or others added) is the same owner; the id is not the key.
        let moved = ApiKeys::new(vec!["k2:batch".parse().unwrap()], false);
        assert_eq!(moved.owner_of(&moved.caller_for(&o).unwrap()), o);
        assert_eq!(keys.caller_for(&o), Some(k2));
        assert!(!o.id().unwrap().contains("k2") && o.id().unwrap().len() == 36);
        assert_ne!(
            keys.owner_of(&keys.caller_for(&Owner::key(owner_id("k1"))).unwrap()),
            o
        );
        // Unknown and ownerless owners run nowhere on a keyed server; ownerless runs open on a keyless one.
        assert_eq!(keys.caller_for(&Owner::key(owner_id("k3"))), None);
        let k1 = keys.caller_for(&Owner::key(owner_id("k1"))).unwrap();
        assert_eq!(keys.flow_of(&k1), Some(owner_id("k1").as_str()));
        assert_eq!(keys.flow_of(&Caller::OPEN), None);
        assert_eq!(keys.caller_for(&Owner::NONE), None);
        assert_eq!(keys.owner_of(&Caller::OPEN), Owner::NONE);
        let open = ApiKeys::default();
        assert_eq!(open.caller_for(&Owner::NONE), Some(Caller::OPEN));
        assert_eq!(open.caller_for(&o), None);
    }
}
