//! Test support: a fake OpenAI-compatible streaming server and plot checks.
pub mod fake_server;
pub mod plots;
