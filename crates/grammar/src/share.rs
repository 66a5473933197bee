//! `Shares`: how many grammar compiles each tenant (an API key's owner, or the
//! trusted gateway's fairness id) has in flight, so that one tenant cannot fill the
//! compile pool: past its share a compile is refused at once (`Busy`), as a full
//! queue is. A compile holds its share until its job ends on a worker — an abandoned
//! one that llguidance cannot interrupt included — or is skipped unstarted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::GrammarError;

/// In-flight compiles per tenant, each at most `limit`.
#[derive(Debug)]
pub struct Shares {
    limit: usize,
    counts: Mutex<HashMap<String, usize>>,
}

/// One compile's hold on its tenant's share; released on drop.
#[derive(Debug)]
pub struct ShareGuard {
    shares: Arc<Shares>,
    tenant: String,
}

impl Shares {
    /// At most `limit` (at least 1) compiles in flight per tenant.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Shares {
            limit: limit.max(1),
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// Takes one of `tenant`'s share, or refuses when it holds all of it. The map
    /// holds only tenants with a compile in flight (at most the pool's workers and
    /// queue, as every held share is a job there).
    pub fn take(self: &Arc<Self>, tenant: &str) -> Result<ShareGuard, GrammarError> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(tenant.to_string()).or_insert(0);
        if *n >= self.limit {
            return Err(GrammarError::Busy(format!(
                "this key has {} grammar compiles in flight (at most {} a key); retry later",
                n, self.limit
            )));
        }
        *n += 1;
        Ok(ShareGuard {
            shares: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    /// Compiles `tenant` has in flight.
    #[cfg(test)]
    pub fn held(&self, tenant: &str) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for ShareGuard {
    fn drop(&mut self) {
        let mut counts = self.shares.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_its_share_is_refused_and_others_are_not() {
        let s = Shares::new(2);
        let a1 = s.take("a").unwrap();
        let _a2 = s.take("a").unwrap();
        let e = s.take("a").unwrap_err();
        assert!(
            matches!(e, GrammarError::Busy(ref m) if m.contains("at most 2 a key")),
            "{e}"
        );
        let _b = s.take("b").unwrap();
        drop(a1);
        assert_eq!(s.held("a"), 1);
        let _a3 = s.take("a").unwrap();
        assert_eq!(s.held("a"), 2);
    }

    #[test]
    fn released_shares_leave_no_entry() {
        let s = Shares::new(1);
        for i in 0..1000 {
            drop(s.take(&format!("tenant-{i}")).unwrap());
        }
        assert!(s.counts.lock().unwrap().is_empty());
    }
}
