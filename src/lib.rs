//! abridge: an OpenAI-compatible reverse proxy that keeps long conversations inside the
//! model's context window. Apps change only their base URL.
//!
//! # Layout
//!
//! - `main.rs`     — thin binary: arguments, config, logging, bind, [`run`] until a signal.
//! - [`config`]    — the configuration: TOML file + `ABRIDGE_*` environment, checked once.
//! - [`server`]    — [`AppState`] (one `Arc`), the proxy [`router`], and [`run`].
//! - [`serve`]     — one listener: connection and in-flight caps, client deadlines,
//!   drain on shutdown.
//! - [`proxy`]     — request handlers: chat completions (read) and pass-through (rest).
//! - [`proxy::headers`] — hop-by-hop and `x-abridge-*` header hygiene, both directions.
//! - [`ingress`]   — request bodies within bounds: size, deadline, bytes held at once.
//! - [`chat`]      — the chat request parsed by borrowing; edits are splices of the bytes.
//! - [`identity`]  — canonical message form, rolling prefix hashes, tenant namespaces.
//! - [`store`]     — checkpoints, usage state and locks: in-process or Redis (single,
//!   Cluster or Sentinel), fail-open behind a timeout and a probe gate.
//! - [`controls`]  — `x-abridge-*` request controls and the response report.
//! - [`compaction`] — the plan stage: predict, decide, apply or build checkpoints,
//!   single-flight, compact-and-retry, anti-thrash, background pre-compaction.
//! - [`compact`]   — the compaction strategies (pure, no I/O): which messages to replace
//!   and with what, as a [`compact::Plan`], and the validator every plan passes.
//! - [`tokens`]    — token estimates: the model's own tokenizer for OpenAI families, a
//!   calibrated byte-class estimate for the rest.
//! - [`upstream`]  — the pooled HTTP client to the one configured provider, timeouts.
//! - [`summariser`] — one chat completion that turns a transcript into a summary.
//! - [`tenants`]   — what abridge knows of a credential: accepted by the provider yet,
//!   and its summary budget.
//! - [`models`]    — context windows of known models (for ratio thresholds).
//! - [`offload`]   — CPU-heavy work off the async workers, bounded in concurrency.
//! - [`overflow`]  — recognising a provider's "context length exceeded" answer.
//! - [`relay`]     — the response back to the client, byte for byte, with the usage tee:
//!   [`relay::sse`] scans events incrementally, [`relay::usage`] reads both namings.
//! - [`stats`]     — the metrics (prometheus-client): counters, gauges, latency.
//! - [`admin`]     — the admin listener: health, readiness, metrics, the token-guarded
//!   `/admin` API (stats, conversations, preview) and the dashboard page.
//! - [`error`]     — abridge's own errors, answered in OpenAI's error shape.
//! - [`secret`]    — a string type whose `Debug`/`Display` print `*****`.
//!
//! The fake OpenAI-compatible provider used by the tests (and as an offline demo
//! upstream) is the workspace crate `crates/fake-provider`.
//!
//! # Request flow
//!
//! ```text
//! client ─► ingress ─► parse ─► identify ─► plan ─► rewrite ─► forward ─► relay ─► client
//!            │          │          │          │        │           │         │
//!       limits, route, ChatRequest rolling   predict, splice     hyper,     bytes out as
//!       x-abridge-*    borrowed,   prefix    apply a  head +     timeouts,  they arrive;
//!       controls       unknown     hashes +  stored   replacement cancel on usage tee from
//!                      fields kept one store checkpoint + rest   drop;      JSON / SSE
//!                                  round     or       into the   retry once     │
//!                                  trip      compact  original   on context     ▼
//!                                            now      bytes      overflow   record: usage →
//!                                                                           store, anti-thrash,
//!                                                                           background build
//! ```
//!
//! Every other route under `/v1` is forward → relay with nothing read. Nothing that can
//! fail in abridge's own machinery fails the user's request: a body abridge does not
//! understand is forwarded untouched.

pub mod admin;
pub mod chat;
pub mod compactor;
pub mod config;
pub mod controls;
pub mod conversation;
pub mod error;
pub mod formats;
pub mod headers;
pub mod identity;
pub mod ingress;
pub mod json;
pub mod models;
pub mod offload;
pub mod outcome;
pub mod prepare;
pub mod proxy;
pub mod relay;
pub mod secret;
pub mod serve;
pub mod server;
pub mod state;
pub mod stats;
pub mod store;
pub mod strategies;
pub mod tenants;
pub mod tokens;
pub mod upstream;

pub use config::Config;
pub use error::Error;
pub use server::{Listeners, router, run};
pub use state::AppState;
