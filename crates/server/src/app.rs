//! `App`: one served replica: the handlers' shared [`AppState`] and, unless
//! `--no-batch-api`, the Batch API running its lines through those handlers. The
//! batch service holds the state; the state never holds the service, so the two
//! are built in order and nothing refers back.

use std::sync::Arc;

use sloserve_batch::BatchService;

use crate::args::ServeArgs;
use crate::state::AppState;

#[derive(Clone)]
pub struct App {
    pub state: Arc<AppState>,
    /// The Batch API (absent with `--no-batch-api`).
    pub batch: Option<Arc<BatchService>>,
}

impl App {
    /// Loads the model, starts the engine, then opens the Batch API's store over it.
    pub fn load(args: &ServeArgs) -> anyhow::Result<App> {
        let state = AppState::load(args)?;
        let batch = crate::batch::open(&args.batch, &state)?;
        Ok(App { state, batch })
    }
}

/// A replica without the Batch API (tests that build their own state).
impl From<Arc<AppState>> for App {
    fn from(state: Arc<AppState>) -> Self {
        App { state, batch: None }
    }
}
