//! Constrained decoding for sloserve: JSON-schema, regex and Lark constraints
//! compiled with llguidance over sloserve's own tokenizer ([`GrammarFactory`], once
//! per model), and the per-sequence [`GrammarMatcher`] the engine's sampler masks
//! each draw with (`sloserve_engine::sampler::constraint`).
//!
//! Flow: the server turns a request's `response_format` (or tools) into a
//! [`Constraint`] ([`from_response_format`]), compiles it with
//! [`GrammarFactory::compile`] before admission (a [`GrammarError`] is a 400), and
//! puts the [`CompiledGrammar`] into `Request::constraint`; the engine makes one
//! matcher per sequence from it.

mod error;
mod factory;
mod formats;
mod matcher;
mod pool;
mod share;
mod spec;
mod tool_formats;
mod tools;
mod vocab;

pub use error::GrammarError;
pub use factory::{compile_counts, CompileCounts, CompiledGrammar, GrammarFactory, GrammarLimits};
pub use matcher::GrammarMatcher;
pub use spec::{from_response_format, Constraint};
pub use tools::{tool_call_constraint, tool_call_constraint_in, ToolChoice, ToolFunction};
pub use vocab::Vocab;
