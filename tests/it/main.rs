//! abridge's integration tests: one binary, real sockets on 127.0.0.1:0, the fake
//! provider as the upstream, real HTTP clients, real Redis where a store is involved.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

mod admin;
mod azure;
mod budget;

mod compaction;

mod claude_code;
mod cli;
mod codex;
mod codex_remote;
mod codex_websocket;
mod connections;
mod context_management;
mod conversations;
mod cost;
mod credentials;
mod dashboard;
mod docs;
mod errors;
mod faults;
mod fidelity;
mod hardening;
mod lifecycle;
mod llama;
mod llama_agents;
mod messages;
mod messages_compaction;
mod messages_compaction_summary;
mod outage;
mod passthrough;
mod provider_apis;
mod provider_recall;
mod provider_summary;
mod recall;
mod recall_bounds;
mod recall_offer;
mod recall_stream;
mod redis_support;
mod redis_tls;
mod replay;
mod replay_identifiers;
mod request_ids;
mod responses;
mod responses_websocket;
mod savings;
mod scale;
mod sdk;
mod secrets;
mod sentinel;
mod store;
mod streaming;
mod summariser;
mod summary_cache;
mod traffic;
mod windows;
