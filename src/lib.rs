//! abridge: an OpenAI-compatible reverse proxy that keeps long conversations inside the
//! model's context window. Apps change only their base URL.
//!
//! # Layout
//!
//! Listed from the top down: a module uses only those below it.
//!
//! - `main.rs`     — thin binary: arguments, config, logging, bind, [`run`] until a signal.
//! - [`server`]    — wiring: the proxy [`router`] (which routes are read) and [`run`].
//! - [`admin`]     — the admin listener: health, readiness, metrics, the token-guarded
//!   `/admin` API (stats, conversations, preview) and the dashboard page.
//! - [`websocket`] — the Responses API over WebSocket: relayed where the upstream has
//!   it (each `response.create` through the proxy's conversation stages), else refused
//!   with the 426 Codex falls back from.
//! - [`proxy`]     — request handlers: the conversation routes (chat completions,
//!   Responses: one handler whatever the format) and pass-through (everything else).
//! - [`prepare`]   — the stages shared by the handler and the admin preview: parse,
//!   identify, load.
//! - [`provider_apis`] — the provider compaction APIs (OpenAI's `/responses/compact`,
//!   Codex's `compaction_trigger`, `compaction` items) served for an upstream that lacks
//!   them, with abridge's own signed `compaction` items.
//! - [`state`]     — [`AppState`] (one `Arc`): configuration, store, compactor, stats.
//! - [`compactor`] — the plan stage: a pure decision per request, the single-flight
//!   build, persistence, background pre-compaction, the summariser, overflow recognition.
//! - [`strategies`] — the compaction strategies (pure, no I/O) and the validator every
//!   plan passes.
//! - [`recall`]    — the `abridge_recall` tool: the condensed messages of a request (and
//!   the archive a provider-API compaction item carries), ranked for a query, and each
//!   format's tool, calls and follow-up.
//! - [`relay`]     — the response back to the client, byte for byte, with the usage tee:
//!   [`relay::sse`] scans events incrementally, [`relay::usage`] reads every naming.
//! - [`replay`]    — `abridge replay`: conversations through the real request path against
//!   a simulated provider, figures per strategy (it stands above everything else).
//! - [`serve`]     — one listener: connection and in-flight caps, client deadlines,
//!   request ids and the request's log span, drain on shutdown.
//! - [`request_id`] — which id a request, its upstream call and its response carry.
//! - [`ask`]       — asking a model server for a model's context window (`/props`,
//!   `/v1/models`, `/api/show`), off the request path.
//! - [`upstream`]  — the pooled HTTP client to the one configured provider, timeouts.
//! - [`azure`]     — Azure OpenAI's paths (the v1 base, the classic deployment paths)
//!   on the configured upstream, and the deployment a path names.
//! - [`store`]     — checkpoints, usage state and locks: in-process or Redis (single,
//!   Cluster or Sentinel, plain or TLS), fail-open behind a timeout and a probe gate.
//! - [`identity`]  — canonical item form, rolling prefix hashes, tenant namespaces.
//! - [`tokens`]    — token estimates: the model's own tokenizer for OpenAI families, a
//!   calibrated byte-class estimate for the rest.
//! - [`formats`]   — the wire formats ([`formats::chat`], [`formats::responses`]):
//!   parsed by borrowing into the neutral view; edits are splices of the bytes.
//! - [`conversation`] — the format-neutral view of a conversation: items, roles,
//!   content, tool calls, opaque items.
//! - [`controls`]  — `x-abridge-*` request controls and the response report.
//! - [`headers`]   — hop-by-hop and `x-abridge-*` header hygiene, both directions, and
//!   the credentials a tenant is known by.
//! - [`ingress`]   — request bodies within bounds: size, deadline, bytes held at once.
//! - [`stats`], [`outcome`] — the metrics (prometheus-client) and what they count.
//! - [`accounting`] — what one exchange saved and cost, in tokens and in money, added up
//!   per conversation (store) and in total (stats).
//! - [`prices`]    — what tokens cost per model: a built-in table and `[prices]`.
//! - [`tenants`]   — what abridge knows of a credential: accepted by the provider yet,
//!   and its summary budget.
//! - [`models`]    — context windows of known models (for ratio thresholds).
//! - [`windows`]   — context windows learned from the providers, kept in the store.
//! - [`offload`]   — CPU-heavy work off the async workers, bounded in concurrency.
//! - [`config`]    — the configuration: TOML file + `ABRIDGE_*` environment, checked once.
//! - [`json`], [`error`], [`secret`] — reading JSON serde_json has validated without
//!   parsing it again (a string's text, an object's members); abridge's own errors, in
//!   OpenAI's error shape; a string type whose `Debug`/`Display` print `*****`.
//!
//! The fake OpenAI-compatible provider used by the tests (and as an offline demo
//! upstream) is the workspace crate `crates/fake-provider`.
//!
//! # Request flow
//!
//! ```text
//! client ─► ingress ─► parse ─► identify ─► plan ─► rewrite ─► forward ─► relay ─► client
//!            │          │          │          │        │           │         │
//!       limits, route, borrowed, rolling   predict, splice     hyper,     bytes out as
//!       x-abridge-*    neutral     prefix    apply a  head +     timeouts,  they arrive;
//!       controls       items,      hashes +  stored   replacement cancel on usage tee from
//!                      fields kept one store checkpoint + rest   drop;      JSON / SSE
//!                                  round     or       into the   retry once     │
//!                                  trip      compact  original   on context     ▼
//!                                            now      bytes      overflow   record: usage →
//!                                                                           store, anti-thrash,
//!                                                                           background build
//! ```
//!
//! The parse stage is the format's (chat completions or Responses); every stage after
//! it sees the format-neutral items. Every other route under `/v1` (and Azure's
//! `/openai/…`, see [`azure`]) is forward → relay
//! with nothing read. Nothing that can
//! fail in abridge's own machinery fails the user's request: a body abridge does not
//! understand is forwarded untouched.

pub mod accounting;
pub mod admin;
pub mod ask;
pub mod azure;
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
pub mod prices;
pub mod provider_apis;
pub mod proxy;
pub mod recall;
pub mod relay;
pub mod replay;
pub mod request_id;
pub mod request_log;
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
pub mod websocket;
pub mod windows;

pub use config::Config;
pub use error::Error;
pub use server::{Listeners, router, run};
pub use state::AppState;
