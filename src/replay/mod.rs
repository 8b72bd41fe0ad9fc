//! `abridge replay`: how each strategy would treat a conversation, for users deciding how
//! to configure abridge. Each input is replayed through the real request path — abridge
//! serving on loopback in this process, with the configuration given — against a
//! simulated provider that reports usage ([`provider`]); the summarising strategies call
//! the configured summary provider, or the simulated provider's offline stand-in, which
//! says so. [`report`] prints what happened per strategy.
//!
//! What an input file can be, and how its format is found, is [`input`]'s: request
//! bodies of any of the three formats, or an agent's own session file (Claude Code,
//! Codex CLI), read by [`sessions`].

mod input;
mod provider;
mod report;
mod sessions;

use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::formats::{Format, Request};
use crate::secret::Secret;
use crate::strategies::Strategy;
use crate::strategies::text::identifiers;
use crate::{AppState, Listeners};

pub use input::Input;
pub use report::{Figures, Turn};

/// What the command line asked for.
pub struct Options {
    pub config: Option<PathBuf>,
    pub strategies: Vec<Strategy>,
    pub threshold: Option<u64>,
    pub json: bool,
    pub html: Option<PathBuf>,
    pub files: Vec<PathBuf>,
}

pub const USAGE: &str = "\
abridge replay — how each strategy would treat your conversations

USAGE:
    abridge replay [--config FILE] [--strategy S ...] [--threshold TOKENS] [--json]
                   [--html OUT] FILE...

FILE is one of (the format is found by itself):
  - a Claude Code transcript: ~/.claude/projects/*/*.jsonl
  - a Codex CLI rollout: ~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl
  - a JSONL of request bodies (chat completions, Responses or Messages), one per
    turn as the client sent them
  - one request (JSON) whose history is replayed growing one turn at a time

OPTIONS:
    -c, --config FILE      abridge's configuration (the upstream is replaced by a
                           simulated provider on loopback; nothing leaves the machine)
        --strategy S       deterministic, recency, structured or llm_replace; repeat
                           for several (default: every strategy)
        --threshold TOKENS compaction.threshold_tokens for the run
        --json             the figures as JSON instead of a table
        --html OUT         also write a page with a plot per strategy to OUT
    -h, --help             print this help";

/// Reads the arguments after `replay`; `None` when they ask for the help.
pub fn parse_args(mut parser: lexopt::Parser) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut o = Options {
        config: None,
        strategies: Vec::new(),
        threshold: None,
        json: false,
        html: None,
        files: Vec::new(),
    };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('c') | Long("config") => o.config = Some(parser.value()?.into()),
            Long("strategy") => o.strategies.push(parser.value()?.parse()?),
            Long("threshold") => o.threshold = Some(parser.value()?.parse()?),
            Long("json") => o.json = true,
            Long("html") => o.html = Some(parser.value()?.into()),
            Short('h') | Long("help") => return Ok(None),
            Value(file) => o.files.push(file.into()),
            _ => return Err(arg.unexpected()),
        }
    }
    if o.files.is_empty() {
        return Err("no FILE to replay".into());
    }
    if o.strategies.is_empty() {
        o.strategies = Strategy::ALL.to_vec();
    }
    Ok(Some(o))
}

/// Runs the command; the exit code.
pub async fn run(options: Options) -> Result<String, String> {
    let base = Config::load(options.config.as_deref()).map_err(|e| e.to_string())?;
    let mut inputs = Vec::new();
    for file in &options.files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let read = input::read(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        if read.iter().all(Input::is_empty) {
            return Err(format!("{}: no request to replay in it", file.display()));
        }
        inputs.extend(read);
    }
    let mut figures = Vec::new();
    for &strategy in &options.strategies {
        let mut config = base.clone();
        config.compaction.strategy = strategy;
        if let Some(t) = options.threshold {
            config.compaction.threshold_tokens = t;
        }
        let (mut turns, mut compactions) = (Vec::new(), 0);
        for input in &inputs {
            let (replayed, runs) = replay(&config, input).await?;
            turns.push(replayed);
            compactions += runs;
        }
        let threshold = config.compaction.threshold_tokens;
        figures.push(Figures::of(strategy, (threshold, compactions), &turns));
    }
    if let Some(out) = &options.html {
        std::fs::write(out, report::html(&figures))
            .map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(if options.json {
        report::json(&figures)
    } else {
        report::text(&figures)
    })
}

/// One input through abridge with `config`: what each turn showed, in order, and how
/// many compactions ran.
async fn replay(config: &Config, input: &Input) -> Result<(Vec<Turn>, u64), String> {
    let provider = provider::Simulated::start()
        .await
        .map_err(|e| e.to_string())?;
    let mut config = config.clone();
    config.upstream = provider.url.parse()?;
    config.anthropic_upstream = None;
    config.store = Default::default();
    config.identity.secret = Some(Secret::new("abridge replay: a fixed, local identity key"));
    config.admin.token = None;
    let max_tokens = config.recall.max_tokens;
    let state = AppState::new(config).map_err(|e| e.to_string())?;
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (proxy, admin) = (
        bind().await.map_err(|e| e.to_string())?,
        bind().await.map_err(|e| e.to_string())?,
    );
    let url = format!(
        "http://{}{}",
        proxy.local_addr().map_err(|e| e.to_string())?,
        path(input.format)
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::run(
        Listeners { proxy, admin },
        state.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut turns = Vec::new();
    let format = input.format;
    for n in 0..input.len() {
        let bytes = Bytes::from(input.body(n).to_string());
        let request = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("authorization", "Bearer replay")
            .header("anthropic-version", "2023-06-01")
            .body(Full::new(bytes.clone()))
            .map_err(|e| e.to_string())?;
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let compacted = response
            .headers()
            .get("x-abridge-compacted")
            .is_some_and(|v| v == "true");
        let answer = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        let (before, forwarded) = provider.last_two();
        let sent = forwarded.as_ref().map_or("", |f| f.text.as_str());
        let client = Request::parse(format, bytes).ok();
        let ids = client.as_ref().map(history_identifiers).unwrap_or_default();
        turns.push(Turn {
            status,
            compacted,
            client_tokens: client.as_ref().map_or(0, client_tokens),
            provider_tokens: reported_input(&answer),
            stable_prefix: match (&before, &forwarded) {
                (Some(before), Some(now)) => now.messages.starts_with(&before.messages),
                _ => true,
            },
            kept_identifiers: share(&ids, |id| sent.contains(id)),
            recallable_identifiers: (n + 1 == input.len()).then(|| {
                let recall = Recallable::of(client.as_ref(), forwarded.as_ref(), max_tokens);
                share(&ids, |id| sent.contains(id) || recall.returns(id))
            }),
        });
        wait_idle(&state).await;
    }
    let compactions = state.stats().snapshot().compactions_total();
    let _ = stop.send(());
    let _ = server.await;
    Ok((turns, compactions))
}

/// Lets background compactions finish before the next turn, as a user's think time
/// would (at most a few seconds).
async fn wait_idle(state: &AppState) {
    for _ in 0..500 {
        if state.compactor().pending_jobs() == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Where a format's requests go.
fn path(format: Format) -> &'static str {
    match format {
        Format::Chat => "/v1/chat/completions",
        Format::Responses => "/v1/responses",
        Format::Messages => "/v1/messages",
    }
}

/// The prompt tokens an answer reports, in any of the three formats (Anthropic's
/// `input_tokens` leaves out what the cache read and wrote).
fn reported_input(answer: &Value) -> u64 {
    let usage = &answer["usage"];
    let n = |k: &str| usage[k].as_u64().unwrap_or(0);
    n("prompt_tokens")
        + n("input_tokens")
        + n("cache_read_input_tokens")
        + n("cache_creation_input_tokens")
}

/// What the client's request estimates, as abridge counts it.
fn client_tokens(request: &Request) -> u64 {
    crate::tokens::Estimator::for_model(request.model()).messages(request.items())
}

/// The share of `ids` that `found` finds (1 for none).
fn share(ids: &[String], found: impl Fn(&str) -> bool) -> f64 {
    if ids.is_empty() {
        return 1.0;
    }
    ids.iter().filter(|id| found(id)).count() as f64 / ids.len() as f64
}

/// What an `abridge_recall` query returns from the messages of a request (its bytes)
/// that were not forwarded, within `recall.max_tokens`.
struct Recallable {
    corpus: crate::recall::Corpus,
    estimator: crate::tokens::Estimator,
    max_tokens: u64,
}

impl Recallable {
    fn of(client: Option<&Request>, forwarded: Option<&provider::Seen>, max_tokens: u64) -> Self {
        let sent: std::collections::HashSet<&str> = forwarded
            .map(|f| f.messages.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let (corpus, model) = match client {
            Some(request) => {
                let items = request.items();
                let condensed = (0..items.len()).filter(|&i| !sent.contains(items[i].raw.get()));
                let corpus = crate::recall::Corpus::of_messages(items, condensed);
                (corpus, request.model().to_owned())
            }
            None => (crate::recall::Corpus::default(), String::new()),
        };
        Self {
            corpus,
            estimator: crate::tokens::Estimator::for_model(&model),
            max_tokens,
        }
    }

    /// Whether a query for `id` returns it.
    fn returns(&self, id: &str) -> bool {
        let tokens = |t: &str| self.estimator.text(t);
        self.corpus
            .returned_for(id, self.max_tokens, &tokens)
            .contains(id)
    }
}

/// The identifiers of a request's history, read from what the model reads of each
/// message (its text and tool calls, never an item's ids or metadata), each once.
fn history_identifiers(request: &Request) -> Vec<String> {
    let mut text = String::new();
    for item in request.items() {
        text.push_str(&crate::recall::readable(item));
        text.push('\n');
    }
    let mut ids = identifiers(&text);
    ids.sort();
    ids.dedup();
    ids
}
