//! `GrammarFactory`: llguidance's parser factory over one model's vocabulary, with
//! sloserve's parser limits, compiles on a bounded pool ([`CompilePool`]) within a
//! time bound, and a small compile cache; `CompiledGrammar`: one compiled
//! constraint, the engine's `ConstraintFactory`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llguidance::api::ParserLimits;
use llguidance::{Matcher, ParserFactory};
use sloserve_engine::sampler::constraint::{ConstraintFactory, TokenConstraint};
use sloserve_model::tokenizer::{TextEncoder, Tokenizer};

use crate::pool::CompilePool;
use crate::share::Shares;
use crate::{Constraint, GrammarError, GrammarMatcher, Vocab};

/// [`GrammarFactory::compile`] calls of the whole process (every factory), as
/// `/metrics` reports them: each a request's constraint (a cached compile too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileCounts {
    /// Constraints compiled (or found cached): requests decoded under a grammar.
    pub ok: u64,
    /// Constraints that did not compile (a 400, or the vocabulary's failure).
    pub errors: u64,
}

struct AtomicCounts {
    ok: AtomicU64,
    errors: AtomicU64,
}

static COUNTS: AtomicCounts = AtomicCounts {
    ok: AtomicU64::new(0),
    errors: AtomicU64::new(0),
};

/// The process's compile counts so far.
pub fn compile_counts() -> CompileCounts {
    CompileCounts {
        ok: COUNTS.ok.load(Ordering::Relaxed),
        errors: COUNTS.errors.load(Ordering::Relaxed),
    }
}

/// Bounds on grammar work, so that one hostile constraint cannot stall a step or
/// the server.
#[derive(Debug, Clone)]
pub struct GrammarLimits {
    /// llguidance's limits. Per mask: `step_lexer_fuel` (~14k/ms) and
    /// `step_max_items` (~20k/ms) bound one token's mask to a few milliseconds;
    /// past them the mask fails and the sequence ends with an error.
    pub parser: ParserLimits,
    /// Wall-clock bound on one compile, its wait for a worker included (the
    /// compile itself is also bounded by `initial_lexer_fuel` and
    /// `max_grammar_size`). Past it the job is abandoned: never started if still
    /// queued, else asked to stop (llguidance's cancellation; the JSON-schema
    /// translation cannot be interrupted and ends on its worker).
    pub compile_timeout: Duration,
    /// Compile worker threads: at most this many compiles run at once.
    pub compile_workers: usize,
    /// Compiles waiting for a worker; past it a compile is refused (`Busy`).
    pub compile_queue: usize,
    /// Compiles one tenant (an API key's owner) may have in flight, queued or
    /// running (0: half the workers and queue together, at least 1); past it that
    /// tenant's compile is refused (`Busy`) while others still get the pool.
    pub compile_share: usize,
    /// Most `patternProperties` entries in one JSON schema, all objects together:
    /// llguidance checks every pair of them for overlap while translating the
    /// schema (uninterruptible; 128 took ~0.4 s, 1,000 took 387 s of CPU).
    pub max_pattern_properties: usize,
    /// Compiled grammars kept by constraint text (0: no cache).
    pub cache_entries: usize,
    /// Constraints longer than this (bytes of their text) are refused.
    pub max_constraint_bytes: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        GrammarLimits {
            parser: ParserLimits {
                max_items_in_row: 2000,
                initial_lexer_fuel: 1_000_000,
                step_lexer_fuel: 100_000,
                step_max_items: 20_000,
                // ~1-2 kB each, shared by the sequences of one grammar.
                max_lexer_states: 40_000,
                max_grammar_size: 200_000,
                precompute_large_lexemes: true,
                verbose_errors: false,
            },
            compile_timeout: Duration::from_secs(2),
            compile_workers: 2,
            compile_queue: 16,
            compile_share: 0,
            max_pattern_properties: 32,
            cache_entries: 32,
            max_constraint_bytes: 512 * 1024,
        }
    }
}

impl GrammarLimits {
    /// The cheap checks a constraint must pass before any work: its text's
    /// length and its schema's `patternProperties` entries. A server runs them
    /// before rendering and tokenizing the request's prompt; every compile runs
    /// them first too.
    pub fn precheck(&self, c: &Constraint) -> Result<(), GrammarError> {
        let bytes = c.cache_key().len();
        if bytes > self.max_constraint_bytes {
            return Err(GrammarError::TooLarge(format!(
                "{bytes} bytes of constraint (at most {})",
                self.max_constraint_bytes
            )));
        }
        if let Constraint::JsonSchema { schema, .. } = c {
            let n = crate::spec::pattern_properties(schema);
            if n > self.max_pattern_properties {
                return Err(GrammarError::TooLarge(format!(
                    "{n} patternProperties entries (at most {} in a schema)",
                    self.max_pattern_properties
                )));
            }
        }
        Ok(())
    }
}

/// Built once per model; compiles constraints for it. Cheap to share (`Arc`).
pub struct GrammarFactory {
    parser: Arc<ParserFactory>,
    limits: GrammarLimits,
    vocab_size: usize,
    /// The model's own tokenizer, for the text a grammar forces (`None`: the token
    /// trie's greedy tokenization).
    text: Option<TextEncoder>,
    cache: Mutex<VecDeque<(String, Arc<CompiledGrammar>)>>,
    pool: CompilePool,
    shares: Arc<Shares>,
}

impl std::fmt::Debug for GrammarFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarFactory")
            .field("vocab_size", &self.vocab_size)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl GrammarFactory {
    /// From sloserve's tokenizer; `n_vocab` is the model's logits width.
    pub fn from_tokenizer(tok: &Tokenizer, n_vocab: usize) -> Result<Self, GrammarError> {
        let mut f = Self::new(
            &Vocab::from_tokenizer(tok, n_vocab)?,
            GrammarLimits::default(),
        )?;
        f.text = Some(tok.text_encoder());
        Ok(f)
    }

    pub fn new(vocab: &Vocab, limits: GrammarLimits) -> Result<Self, GrammarError> {
        let env = vocab.tok_env()?;
        let mut parser =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocab(e.to_string()))?;
        parser.quiet();
        *parser.limits_mut() = limits.parser.clone();
        let pool = CompilePool::new(limits.compile_workers, limits.compile_queue)?;
        let share = match limits.compile_share {
            0 => (limits.compile_workers + limits.compile_queue) / 2,
            n => n,
        };
        Ok(GrammarFactory {
            pool,
            shares: Shares::new(share),
            parser: Arc::new(parser),
            limits,
            vocab_size: vocab.len(),
            text: None,
            cache: Mutex::new(VecDeque::new()),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn limits(&self) -> &GrammarLimits {
        &self.limits
    }

    /// Compiles running on a worker now (an abandoned one until it stops).
    pub fn running_compiles(&self) -> usize {
        self.pool.running()
    }

    /// The token trie (bytes of each token, EOS set), e.g. to decode in tests.
    pub fn tok_trie(&self) -> &toktrie::TokTrie {
        self.parser.tok_env().tok_trie()
    }

    /// Compiles `c` (or returns the cached compile of the same text). Errors are
    /// the client's (a 400 naming why), except `Vocab`. Counted in
    /// [`compile_counts`].
    pub fn compile(&self, c: &Constraint) -> Result<Arc<CompiledGrammar>, GrammarError> {
        self.compile_as(c, None)
    }

    /// [`compile`](Self::compile) for `tenant` (an API key's owner; `None`: no
    /// share applies): a compile past the tenant's share of the pool is refused
    /// (`Busy`); a cached constraint never counts.
    pub fn compile_as(
        &self,
        c: &Constraint,
        tenant: Option<&str>,
    ) -> Result<Arc<CompiledGrammar>, GrammarError> {
        let r = self.compile_uncounted(c, tenant);
        let n = if r.is_ok() {
            &COUNTS.ok
        } else {
            &COUNTS.errors
        };
        n.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn compile_uncounted(
        &self,
        c: &Constraint,
        tenant: Option<&str>,
    ) -> Result<Arc<CompiledGrammar>, GrammarError> {
        self.limits.precheck(c)?;
        let key = c.cache_key();
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        let grammar = c.to_grammar()?;
        // Held by the job until it ends on its worker (or is skipped unstarted).
        let share = tenant.map(|t| self.shares.take(t)).transpose()?;
        let parser = self.parser.clone();
        let timeout = self.limits.compile_timeout;
        let matcher = self.pool.run(timeout, move |ticket| {
            let _share = share;
            if ticket.abandoned() {
                return Err(GrammarError::CompileTimeout(timeout.as_millis() as u64));
            }
            let p = parser
                .create_parser(grammar)
                .map_err(|e| GrammarError::from_compile(format!("{e:#}")))?;
            // The first mask: catches grammars that fail at once, and warms the
            // shared lexer; cancellable, so a caller's timeout stops it.
            let mut m = Matcher::new(Ok(p)).into_cancellable();
            if let Some(h) = m.cancellation_handle() {
                ticket.cancel_with(h);
            }
            m.compute_mask()
                .map_err(|e| GrammarError::from_compile(format!("{e:#}")))?;
            Ok(m)
        })??;
        let compiled = Arc::new(CompiledGrammar {
            template: matcher,
            vocab_size: self.vocab_size,
            text: self.text.clone(),
            key: key.clone(),
        });
        self.insert(key, compiled.clone());
        Ok(compiled)
    }

    fn cached(&self, key: &str) -> Option<Arc<CompiledGrammar>> {
        let mut cache = self.cache.lock().ok()?;
        let i = cache.iter().position(|(k, _)| k == key)?;
        let entry = cache.remove(i)?;
        let hit = entry.1.clone();
        cache.push_front(entry);
        Some(hit)
    }

    fn insert(&self, key: String, g: Arc<CompiledGrammar>) {
        if self.limits.cache_entries == 0 {
            return;
        }
        if let Ok(mut cache) = self.cache.lock() {
            cache.retain(|(k, _)| *k != key);
            cache.push_front((key, g));
            cache.truncate(self.limits.cache_entries);
        }
    }
}

/// One compiled constraint: each sequence gets a clone of its start state (clones
/// share the grammar's lexer cache).
pub struct CompiledGrammar {
    template: Matcher,
    vocab_size: usize,
    text: Option<TextEncoder>,
    key: String,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: String = self.key.chars().take(80).collect();
        f.debug_struct("CompiledGrammar")
            .field("constraint", &head)
            .finish_non_exhaustive()
    }
}

impl CompiledGrammar {
    /// A fresh matcher at the start of the grammar.
    pub fn start(&self) -> GrammarMatcher {
        GrammarMatcher::new(self.template.clone(), self.vocab_size, self.text.clone())
    }
}

impl ConstraintFactory for CompiledGrammar {
    fn matcher(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.start())
    }
}
