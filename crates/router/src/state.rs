//! `RouterState`: what every handler shares — the configuration, the fleets and
//! their picker, the upstream client, the owners of batch and file ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::RouterConfig;
use crate::owners::Owners;
use crate::picker::Picker;
use crate::upstream::{self, HttpClient};

pub struct RouterState {
    pub cfg: RouterConfig,
    pub picker: Picker,
    pub client: HttpClient,
    pub owners: Owners,
    spilled: AtomicU64,
}

impl RouterState {
    pub fn new(cfg: RouterConfig) -> anyhow::Result<Self> {
        cfg.require_fleets()?;
        Ok(RouterState {
            picker: Picker::new(&cfg),
            client: upstream::client(Duration::from_secs(2)),
            owners: Owners::default(),
            spilled: AtomicU64::new(0),
            cfg,
        })
    }

    pub fn count_spill(&self) {
        self.spilled.fetch_add(1, Ordering::Relaxed);
    }

    pub fn spilled(&self) -> u64 {
        self.spilled.load(Ordering::Relaxed)
    }
}
