//! A fake LLM provider — OpenAI chat completions, OpenAI Responses, Anthropic Messages:
//! abridge's test apparatus and an offline demo upstream.
//!
//! It behaves like the real APIs where abridge cares: it counts prompt tokens, enforces a
//! context window with each API's own error, answers chat completions as JSON or as SSE
//! framed exactly like OpenAI (role chunk, content chunks, finish chunk, a usage chunk and
//! `"usage":null` members only when `stream_options.include_usage` is set, `data:
//! [DONE]`), makes tool calls when given tools, answers summarisation prompts with a
//! sectioned summary (chat only), serves `/models` and `/embeddings`, and records every
//! request it receives (method, URI, headers, raw body) for assertions, whatever its
//! route. The path prefix before an API's own path is free (`/v1/…`, `/api/v1/…`).
//!
//! - `POST …/chat/completions`: see the rest of this page and the token counting below.
//! - `POST …/responses`: OpenAI's Responses API ([`responses`]): input items, the pairing
//!   checks of function calls, their outputs and reasoning items, typed SSE
//!   (`event: response.…` with `sequence_number`s, no `[DONE]`).
//! - `POST …/messages` and `…/messages/count_tokens`: Anthropic's Messages API
//!   ([`messages`]): `anthropic-version` required, errors in Anthropic's shape (the
//!   `x-fake-status` failure and the 401 of the key list too), tool_use/tool_result and
//!   thinking-signature checks, simulated prompt caching ([`prompt_cache`]), typed SSE.
//!
//! Reasoning models (`gpt-5*`, `o1`…, any name containing `reasoning`) refuse chat
//! requests with `max_tokens` or a `temperature` other than 1, in OpenAI's words.
//!
//! It can be told to misbehave, for the whole instance ([`Behavior`]) or per request with
//! `x-fake-*` headers: `x-fake-status: 503` (fail), `x-fake-stall: headers|body|end` (hang
//! before the response headers / after the first SSE event / before the last one), `x-fake-delay-ms` (between
//! SSE events), `x-fake-latency-ms` (before the headers), `x-fake-words` (reply length),
//! `x-fake-error-bytes` (with `x-fake-status`: an error body that much longer),
//! `x-fake-window` (context window in tokens), `x-fake-overflow: FAMILY` (whose overflow
//! answer), `x-fake-overflow-stream: 1` (a streamed overflow as a 200 stream that reports
//! it), `x-fake-recall: 1` (use a proxy's `abridge_recall` tool, see [`recall`]),
//! `x-fake-gzip: 1`, `x-fake-split: 1`
//! (every SSE event in two TCP writes), `x-fake-multiline: 1` (JSON spread over several
//! `data:` lines), `x-fake-usage: input` (`input_tokens` naming), `x-fake-prompt-tokens:
//! N` (report N prompt tokens), the faults of [`faults`] (`x-fake-gzip-bomb`,
//! `x-fake-garbage`, `x-fake-reset`, `x-fake-reject-stream-options`,
//! `x-fake-reject-tools`; a key list that
//! answers 401), the answer shapes of [`shapes`] (many recall calls, padded tool
//! arguments, one giant event, a slow follow-up, tools with a repeated name, `n`), `x-fake-leak-headers: 1` (hop-by-hop and `x-abridge-*` response
//! headers a proxy must not pass on), `x-fake-thinking: 1` (Responses: a reasoning item
//! first; Messages: a thinking block first), `x-fake-strict-alternation: 1` (Messages:
//! reject consecutive same-role turns), `x-fake-request-id: none` (no `x-request-id`, or
//! Anthropic's `request-id`, answered). Azure's `/openai/…` paths: as Azure (`azure.rs`).
//! With [`Behavior::responses_websocket`], the Responses API over WebSocket too
//! ([`websocket`]).
//! The status, stall, delay, latency, words, window, split, multiline, gzip, reset,
//! prompt-tokens and token-scale knobs apply to all three APIs; `x-fake-usage` and the
//! summaries are chat's only. Bench mode keeps answers for chat only.
//!
//! Token counting (documented so tests can predict it), chat completions: 3 per request +
//! for each message 4 + ⌈bytes/4⌉ of its text content, name, and tool-call names and
//! arguments; times `token_scale` (`x-fake-token-scale`), 1 by default, rounded up. The
//! Responses and Messages counts follow the same scheme ([`count_response_tokens`],
//! [`count_message_tokens`]; their modules say exactly how).

mod azure;
mod chat;
pub mod faults;
pub mod messages;
pub mod overflow;
pub mod prompt_cache;
pub mod recall;
pub mod responses;
pub mod shapes;
mod summary;
mod transport;
mod websocket;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri, header};
use http_body_util::BodyExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use transport::Answer;

pub use chat::{count_tokens, is_summary_request, text_of_content};
pub use messages::{count_tokens as count_message_tokens, thinking_signature};
pub use responses::count_tokens as count_response_tokens;

/// Where the fake stalls when told to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// Never send response headers.
    BeforeHeaders,
    /// Send headers and the first SSE event (or nothing of a JSON body), then hang.
    AfterFirstEvent,
    /// Send every SSE event but the last, then hang (a stream that never ends).
    BeforeLastEvent,
}

/// What summaries look like (for testing a summariser's fallbacks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryMode {
    /// All template sections, with the transcript's identifiers and latest ask.
    Good,
    /// Only the first section.
    MissingSections,
    /// An empty message.
    Empty,
    /// HTTP 500.
    Error,
}

/// Instance-wide behaviour; `x-fake-*` request headers override it per request.
#[derive(Debug, Clone)]
pub struct Behavior {
    /// Prompt tokens above this → 400 `context_length_exceeded`.
    pub context_window: Option<u64>,
    /// Whose overflow answer the chat route gives, and which window endpoint it serves
    /// (with `context_window`).
    pub overflow: overflow::Family,
    /// A streamed request that overflows gets a 200 stream reporting it (see
    /// [`overflow`]) instead of a 400.
    pub overflow_in_stream: bool,
    /// Serve the family's window endpoint (`/props`, `/v1/models` with `max_model_len`,
    /// `/api/show`) when `context_window` is set; off, a server that cannot be asked.
    pub window_endpoints: bool,
    /// Use a proxy's `abridge_recall` tool when offered (see [`recall`]); off, a model
    /// that never calls it.
    pub uses_recall: bool,
    /// Pause between SSE events.
    pub chunk_delay: Duration,
    /// Pause before the response headers.
    pub latency: Duration,
    /// Words in a normal reply.
    pub reply_words: usize,
    /// Answer every request with this status and an OpenAI error body.
    pub fail_status: Option<u16>,
    /// With `fail_status`: pad the error message to make the body about this many bytes
    /// longer (a provider's oversized error page).
    pub error_padding: usize,
    pub stall: Option<Stall>,
    pub gzip: bool,
    pub split_events: bool,
    pub multiline_data: bool,
    /// Report `input_tokens`/`output_tokens` instead of `prompt_tokens`/`completion_tokens`.
    pub input_tokens_naming: bool,
    pub leak_headers: bool,
    pub summary: SummaryMode,
    /// Report this many prompt tokens whatever was sent (a provider whose count is
    /// absurd).
    pub reported_prompt_tokens: Option<u64>,
    /// Faults of a misbehaving provider (see [`faults`]).
    pub faults: faults::Faults,
    /// Shapes of chat answers for bound tests (see [`shapes`]).
    pub shapes: shapes::Shapes,
    /// Prompt tokens are counted as documented, times this (a provider whose
    /// tokenizer counts more, or fewer, than abridge's estimate).
    pub token_scale: f64,
    /// Messages API: reject consecutive user (or assistant) turns, as many
    /// Anthropic-compatible servers do (Anthropic merges them).
    pub strict_alternation: bool,
    /// Think before answering: a reasoning item (Responses) or a thinking block (Messages)
    /// first.
    pub thinking: bool,
    /// Serve the Responses API over WebSocket, as OpenAI does (see [`websocket`]); off,
    /// a server without it.
    pub responses_websocket: bool,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            context_window: None,
            overflow: overflow::Family::OpenAi,
            overflow_in_stream: false,
            window_endpoints: true,
            uses_recall: false,
            chunk_delay: Duration::ZERO,
            latency: Duration::ZERO,
            reply_words: 12,
            fail_status: None,
            error_padding: 0,
            stall: None,
            gzip: false,
            split_events: false,
            multiline_data: false,
            input_tokens_naming: false,
            leak_headers: false,
            summary: SummaryMode::Good,
            reported_prompt_tokens: None,
            faults: faults::Faults::default(),
            shapes: shapes::Shapes::default(),
            token_scale: 1.0,
            strict_alternation: false,
            thinking: false,
            responses_websocket: false,
        }
    }
}

impl Behavior {
    /// This behaviour with the request's `x-fake-*` overrides applied.
    fn for_request(&self, headers: &HeaderMap) -> Behavior {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let flag = |name: &str| get(name).map(|v| v == "1" || v == "true");
        let millis = |name: &str| {
            get(name)
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis)
        };
        let mut b = self.clone();
        if let Some(status) = get("x-fake-status").and_then(|v| v.parse().ok()) {
            b.fail_status = Some(status);
        }
        if let Some(n) = get("x-fake-error-bytes").and_then(|v| v.parse().ok()) {
            b.error_padding = n;
        }
        match get("x-fake-stall") {
            Some("headers") => b.stall = Some(Stall::BeforeHeaders),
            Some("body") => b.stall = Some(Stall::AfterFirstEvent),
            Some("end") => b.stall = Some(Stall::BeforeLastEvent),
            _ => {}
        }
        if let Some(d) = millis("x-fake-delay-ms") {
            b.chunk_delay = d;
        }
        if let Some(d) = millis("x-fake-latency-ms") {
            b.latency = d;
        }
        if let Some(window) = get("x-fake-window").and_then(|v| v.parse().ok()) {
            b.context_window = Some(window);
        }
        if let Some(family) = get("x-fake-overflow").and_then(overflow::Family::from_name) {
            b.overflow = family;
        }
        if let Some(v) = flag("x-fake-overflow-stream") {
            b.overflow_in_stream = v;
        }
        if let Some(v) = flag("x-fake-recall") {
            b.uses_recall = v;
        }
        if let Some(words) = get("x-fake-words").and_then(|v| v.parse().ok()) {
            b.reply_words = words;
        }
        if let Some(v) = flag("x-fake-gzip") {
            b.gzip = v;
        }
        if let Some(v) = flag("x-fake-split") {
            b.split_events = v;
        }
        if let Some(v) = flag("x-fake-multiline") {
            b.multiline_data = v;
        }
        if let Some(v) = flag("x-fake-leak-headers") {
            b.leak_headers = v;
        }
        if let Some(v) = flag("x-fake-strict-alternation") {
            b.strict_alternation = v;
        }
        if let Some(v) = flag("x-fake-thinking") {
            b.thinking = v;
        }
        if get("x-fake-usage") == Some("input") {
            b.input_tokens_naming = true;
        }
        if let Some(n) = get("x-fake-prompt-tokens").and_then(|v| v.parse().ok()) {
            b.reported_prompt_tokens = Some(n);
        }
        if let Some(scale) = get("x-fake-token-scale").and_then(|v| v.parse().ok()) {
            b.token_scale = scale;
        }
        b.faults.apply_headers(headers);
        b.shapes.apply_headers(headers);
        b
    }
}

/// The usage the fake reported for a request it answered with a 200: what a provider's
/// bill is made of.
#[derive(Debug, Clone)]
pub struct Report {
    pub path: String,
    /// The request it answered.
    pub body: Bytes,
    /// The `usage` object as the answer carried it (a stream's final one: chat's usage
    /// chunk, Responses' `response.completed`, Messages' `message_start` usage updated
    /// by its last `message_delta`).
    pub usage: serde_json::Value,
}

impl Report {
    /// The request it answered, as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    /// The body as JSON (panics in tests when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// State shared by the handlers and the [`FakeProvider`] handle.
#[derive(Default)]
pub struct Shared {
    behavior: Mutex<Behavior>,
    requests: Mutex<Vec<Recorded>>,
    /// The usage each answered request was reported, in the order of the answers.
    reports: Mutex<Vec<Report>>,
    /// A proxy's questions about the server (a `user-agent` of `abridge/…` asking a
    /// window endpoint: `/props`, `…/models`, `/api/show`), kept apart from the requests.
    asks: Mutex<Vec<Recorded>>,
    /// Responses abandoned by the peer (connection closed) before they were complete.
    cancelled: AtomicU64,
    /// Responses sent to the end.
    completed: AtomicU64,
    changed: Notify,
    sequence: AtomicU64,
    /// Load-benchmark mode ([`Shared::for_bench`]).
    bench: bool,
    /// Bench mode: the answers to the last few distinct chat bodies.
    answers: Mutex<VecDeque<(Bytes, Arc<Answer>)>>,
    /// Messages API: the prompt prefixes cached so far.
    prompt_cache: prompt_cache::PromptCache,
    /// Chat completions and Responses: the prompt prefixes cached so far.
    auto_cache: prompt_cache::AutoCache,
}

/// Distinct chat bodies whose answers bench mode keeps.
const CACHED_ANSWERS: usize = 8;

/// Locks a mutex even if a panicking test poisoned it (the data is plain records).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub fn new(behavior: Behavior) -> Arc<Self> {
        Arc::new(Self {
            behavior: Mutex::new(behavior),
            ..Self::default()
        })
    }

    /// Load-benchmark mode: requests are not recorded (memory stays flat however long
    /// the run), and the answer to a chat body seen recently is sent again without
    /// being worked out anew (parsing and counting a 200 KB body costs more than a proxy
    /// in front of it), unless the request carries `x-fake-*` overrides. The fake's own
    /// CPU then stays small next to the proxy measured in front of it.
    pub fn for_bench(behavior: Behavior) -> Arc<Self> {
        Arc::new(Self {
            behavior: Mutex::new(behavior),
            bench: true,
            ..Self::default()
        })
    }

    /// The answer to a chat-completions body: from the cache in bench mode.
    fn answer(&self, behavior: &Behavior, headers: &HeaderMap, body: &Bytes) -> Arc<Answer> {
        let cacheable = self.bench && !headers.keys().any(|k| k.as_str().starts_with("x-fake-"));
        if !cacheable {
            return Arc::new(chat::answer(behavior, &self.auto_cache, body));
        }
        if let Some((_, answer)) = lock(&self.answers).iter().find(|(b, _)| b == body) {
            return answer.clone();
        }
        let answer = Arc::new(chat::answer(behavior, &self.auto_cache, body));
        let mut answers = lock(&self.answers);
        if answers.len() == CACHED_ANSWERS {
            answers.pop_front();
        }
        answers.push_back((body.clone(), answer.clone()));
        answer
    }

    /// Keeps the usage an answer reports, beside the request it answers (not in bench
    /// mode).
    fn reported(&self, path: &str, body: &Bytes, answer: &Answer) {
        if self.bench {
            return;
        }
        if let Some(usage) = transport::usage_of(answer) {
            lock(&self.reports).push(Report {
                path: path.to_owned(),
                body: body.clone(),
                usage,
            });
        }
    }

    fn record(&self, r: Recorded) {
        keep_body(&r);
        let path = r.uri.path();
        let window_endpoint =
            path.ends_with("/props") || path.ends_with("/models") || path.ends_with("/api/show");
        let from_proxy = r
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ua| ua.starts_with("abridge/"));
        if window_endpoint && from_proxy {
            lock(&self.asks).push(r);
            self.changed.notify_waiters();
            return;
        }
        lock(&self.requests).push(r);
        self.changed.notify_waiters();
    }

    fn finished(&self, complete: bool) {
        let counter = if complete {
            &self.completed
        } else {
            &self.cancelled
        };
        counter.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn next_id(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Marks a response cancelled when dropped before [`Completion::complete`] is called.
struct Completion {
    shared: Arc<Shared>,
    done: bool,
}

impl Completion {
    fn new(shared: &Arc<Shared>) -> Self {
        Self {
            shared: shared.clone(),
            done: false,
        }
    }

    fn complete(mut self) {
        self.done = true;
        self.shared.finished(true);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.done {
            self.shared.finished(false);
        }
    }
}

/// A running fake provider on `127.0.0.1:<ephemeral>`; stops when dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl FakeProvider {
    pub async fn start(behavior: Behavior) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Shared::new(behavior);
        let app = router(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener.tap_io(nodelay), app).await {
                tracing::error!(error = %e, "fake provider stopped");
            }
        });
        Ok(Self { addr, shared, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL as an SDK would be given it: `http://127.0.0.1:<port>/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn set_behavior(&self, f: impl FnOnce(&mut Behavior)) {
        f(&mut lock(&self.shared.behavior));
    }

    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// The usage the fake reported, a request at a time, in the order it answered.
    pub fn reports(&self) -> Vec<Report> {
        lock(&self.shared.reports).clone()
    }

    /// What a proxy asked about the server (see [`Shared`]'s `asks`).
    pub fn asks(&self) -> Vec<Recorded> {
        lock(&self.shared.asks).clone()
    }

    pub fn last_request(&self) -> Option<Recorded> {
        lock(&self.shared.requests).last().cloned()
    }

    pub fn cancelled(&self) -> u64 {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    pub fn completed(&self) -> u64 {
        self.shared.completed.load(Ordering::SeqCst)
    }

    /// Waits until `check` holds (re-checked whenever a request arrives or ends), at most
    /// `timeout`; returns whether it held.
    pub async fn wait_until(&self, timeout: Duration, check: impl Fn(&Self) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.shared.changed.notified();
            if check(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return check(self);
            }
        }
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each event goes out in its own segment the moment it is written, as a provider's
/// does (with Nagle's algorithm a small write waits for the peer's delayed ACK, ~40 ms).
pub fn nodelay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "set_nodelay failed");
    }
}

/// Every route the fake serves; the path prefix before the OpenAI path is free, so
/// `/v1/models` and `/api/v1/models` both work (OpenRouter-style bases).
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    if lock(&shared.behavior).responses_websocket && websocket::asked(&request) {
        return websocket::handshake(shared, request);
    }
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    if !shared.bench {
        shared.record(Recorded {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body: body.clone(),
        });
    }
    let behavior = lock(&shared.behavior).for_request(&parts.headers);
    let completion = Completion::new(&shared);

    if !behavior.latency.is_zero() {
        tokio::time::sleep(behavior.latency).await;
    }
    if let Some(latency) = behavior.shapes.follow_up_latency
        && faults::carries_recall_result(&body)
    {
        tokio::time::sleep(latency).await;
    }
    if behavior.stall == Some(Stall::BeforeHeaders) {
        // Hang until the peer goes away; `completion` then records the cancel.
        std::future::pending::<()>().await;
    }

    let id = shared.next_id();
    let mut response = match azure::admit(&parts, body) {
        Ok(body) => route(&shared, &behavior, &parts, &body, completion, id),
        Err(refusal) => refusal.response_for(completion),
    };
    let anthropic_id = messages::is_route(parts.uri.path()).then(|| anthropic_request_id(id));
    transport::name_request(response.headers_mut(), &parts.headers, id, anthropic_id);
    let headers = response.headers_mut();
    if behavior.leak_headers {
        for (name, value) in [
            ("connection", "x-fake-hop"),
            ("x-fake-hop", "must-not-cross"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic realm=\"fake\""),
            ("x-abridge-compacted", "forged"),
        ] {
            headers.insert(name, header::HeaderValue::from_static(value));
        }
    }
    response
}

/// With `FAKE_PROVIDER_KEEP_BODIES=DIR`, every conversation request body the fake
/// receives is written to `DIR/<route>/<n>.json` (`<route>`: chat, responses, messages):
/// how the fuzz corpora got real clients' bodies (see `docs/src/development.md`).
fn keep_body(r: &Recorded) {
    static N: AtomicU64 = AtomicU64::new(0);
    let Some(dir) = std::env::var_os("FAKE_PROVIDER_KEEP_BODIES") else {
        return;
    };
    let path = r.uri.path();
    let route = if path.ends_with("/chat/completions") {
        "chat"
    } else if path.ends_with("/responses") {
        "responses"
    } else if path.ends_with("/messages") {
        "messages"
    } else {
        return;
    };
    let dir = std::path::Path::new(&dir).join(route);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let name = format!("{}-{n}.json", std::process::id());
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(name), &r.body);
    }
}

/// Anthropic's `request_id` of the request numbered `id`.
fn anthropic_request_id(id: u64) -> String {
    format!("req_fake{id:016}")
}

/// The response to a request, by route, once latency and stalls are done with.
fn route(
    shared: &Shared,
    behavior: &Behavior,
    parts: &http::request::Parts,
    body: &Bytes,
    completion: Completion,
    id: u64,
) -> Response {
    let path = parts.uri.path();
    let post = parts.method == Method::POST;
    let anthropic = messages::is_route(path);
    let request_id = anthropic_request_id(id);
    if let Some(response) =
        faults::respond(&behavior.faults, &parts.headers, path, body, &request_id)
    {
        completion.complete();
        response
    } else if let Some(status) = behavior.fail_status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        completion.complete();
        let message = format!(
            "The fake provider was told to fail this request.{}",
            " ".repeat(behavior.error_padding)
        );
        if anthropic {
            messages::error(status, &message, &request_id)
        } else {
            error(status, &message, "server_error", None, None)
        }
    } else if post && path.ends_with("/chat/completions") {
        let answer = shared.answer(behavior, &parts.headers, body);
        shared.reported(path, body, &answer);
        transport::send(behavior, &answer, completion)
    } else if post && path.ends_with("/responses") {
        let answer = responses::answer(behavior, &shared.auto_cache, body);
        shared.reported(path, body, &answer);
        transport::send(behavior, &answer, completion)
    } else if post && anthropic {
        let count_only = path.ends_with("/count_tokens");
        let answer = messages::answer(
            behavior,
            &shared.prompt_cache,
            &parts.headers,
            body,
            &request_id,
            count_only,
        );
        shared.reported(path, body, &answer);
        transport::send(behavior, &answer, completion)
    } else if let Some(value) = behavior
        .context_window
        .filter(|_| behavior.window_endpoints)
        .and_then(|window| {
            let endpoint = match (&parts.method, path) {
                (&Method::GET, p) if p.ends_with("/props") => "/props",
                (&Method::POST, p) if p.ends_with("/api/show") => "/api/show",
                (&Method::GET, p) if p.ends_with("/models") => "/v1/models",
                _ => "",
            };
            behavior
                .overflow
                .window_endpoint(endpoint, "fake-model", window)
        })
    {
        completion.complete();
        json(StatusCode::OK, &value)
    } else if parts.method == Method::GET && path.ends_with("/models") {
        completion.complete();
        json(
            StatusCode::OK,
            &serde_json::json!({"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 1_700_000_000, "owned_by": "fake-provider"}
            ]}),
        )
    } else if post && path.ends_with("/embeddings") {
        completion.complete();
        chat::embeddings(body)
    } else {
        completion.complete();
        error(
            StatusCode::NOT_FOUND,
            &format!("Invalid URL ({} {})", parts.method, path),
            "invalid_request_error",
            None,
            None,
        )
    }
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An error in OpenAI's shape.
fn error(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error_body(message, kind, param, code),
    )
        .into_response()
}

/// The body of an error in OpenAI's shape.
fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Bytes {
    let value = serde_json::json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
}

#[cfg(test)]
mod tests;
