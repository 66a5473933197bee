//! Test support: a fake OpenAI-compatible streaming server.
pub mod fake_server;
