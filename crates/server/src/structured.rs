//! Structured output: a request's `response_format` compiled (sloserve-grammar, on
//! llguidance) into the constraint the engine's sampler masks each token with. The
//! model's grammar factory (its token trie) is built on the first constrained
//! request and shared; compiles run on the blocking pool and are cached by schema
//! text. A constraint that does not compile is a 400 naming why, before admission.

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use sloserve_api::ApiError;
use sloserve_engine::sampler::constraint::SharedConstraint;
use sloserve_grammar::{
    from_response_format, Constraint, GrammarError, GrammarFactory, GrammarLimits,
};
use sloserve_model::tokenizer::Tokenizer;

use crate::error::ServerError;

/// The grammar engine of one model (built on first use).
#[derive(Default)]
pub struct Structured {
    factory: OnceLock<Result<Arc<GrammarFactory>, String>>,
}

impl Structured {
    /// The constraint of `response_format` (`None` for free text), compiled within
    /// `tenant`'s share of the compile pool (its key's owner; `None`: no share).
    /// Blocking: call it off the async workers.
    pub fn constraint(
        &self,
        tokenizer: &Tokenizer,
        n_vocab: usize,
        response_format: &Value,
        tenant: Option<&str>,
    ) -> Result<Option<SharedConstraint>, ServerError> {
        let Some(spec) = from_response_format(response_format)
            .map_err(|e| client_error(e, "response_format"))?
        else {
            return Ok(None);
        };
        self.compile(tokenizer, n_vocab, &spec, "response_format", tenant)
            .map(Some)
    }

    /// Compiles `spec` within `tenant`'s share; an error the client caused is a 400
    /// naming `param`, a full pool or share a 503 (`GrammarBusy`). Blocking: call it
    /// off the async workers.
    pub fn compile(
        &self,
        tokenizer: &Tokenizer,
        n_vocab: usize,
        spec: &Constraint,
        param: &str,
        tenant: Option<&str>,
    ) -> Result<SharedConstraint, ServerError> {
        let factory = self
            .factory
            .get_or_init(|| {
                let t0 = std::time::Instant::now();
                let f =
                    GrammarFactory::from_tokenizer(tokenizer, n_vocab).map_err(|e| e.to_string());
                tracing::info!(
                    ms = format_args!("{:.0}", t0.elapsed().as_secs_f64() * 1e3),
                    ok = f.is_ok(),
                    "grammar engine built for the model's vocabulary"
                );
                f.map(Arc::new)
            })
            .as_ref()
            .map_err(|e| {
                ServerError::Internal(format!("the grammar engine is unavailable: {e}"))
            })?;
        let compiled = factory
            .compile_as(spec, tenant)
            .map_err(|e| client_error(e, param))?;
        Ok(compiled as SharedConstraint)
    }
}

/// The cheap checks of a request's `response_format` ([`GrammarLimits::precheck`]:
/// its size, its schema's `patternProperties`), run before its prompt is rendered
/// or tokenized, so a constraint refused for its shape costs no template or
/// tokenizer work. (Tool schemas are bounded when the request is parsed.)
pub fn precheck(response_format: Option<&Value>) -> Result<(), ServerError> {
    let Some(rf) = response_format else {
        return Ok(());
    };
    let Some(spec) = from_response_format(rf).map_err(|e| client_error(e, "response_format"))?
    else {
        return Ok(());
    };
    // The factory's limits (`GrammarFactory::from_tokenizer`).
    GrammarLimits::default()
        .precheck(&spec)
        .map_err(|e| client_error(e, "response_format"))
}

/// A constraint the client sent that cannot run: a 400 on `param`
/// (the vocabulary's own failure is the server's).
fn client_error(e: GrammarError, param: &str) -> ServerError {
    match e {
        GrammarError::Vocab(m) => ServerError::Internal(format!("grammar vocabulary: {m}")),
        GrammarError::Busy(m) => ServerError::GrammarBusy(m),
        e => ApiError::invalid(param, format!("{param}: {e}")).into(),
    }
}
