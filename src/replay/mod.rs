//! `abridge replay`: how each strategy would treat a conversation, for users deciding how
//! to configure abridge. Each input is replayed through the real request path — abridge
//! serving on loopback in this process, with the configuration given — against a
//! simulated provider that reports usage ([`provider`]); the summarising strategies call
//! the configured summary provider, or the simulated provider's offline stand-in, which
//! says so. [`report`] prints what happened per strategy.
//!
//! An input file is a JSONL of chat-completions request bodies as a client sent them turn
//! by turn, or one request (a body, or `{"request": body}` as in
//! `tests/data/conversations/`) whose history is replayed growing one user turn at a time.

mod provider;
mod report;

use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::secret::Secret;
use crate::strategies::Strategy;
use crate::strategies::text::identifiers;
use crate::{AppState, Listeners};

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

FILE is a JSONL of chat-completions request bodies as a client sent them turn by turn,
or one request whose history is replayed growing one user turn at a time. Every
strategy is replayed unless --strategy names some; --threshold sets
compaction.threshold_tokens.";

/// Reads the arguments after `replay`.
pub fn parse_args(mut parser: lexopt::Parser) -> Result<Options, lexopt::Error> {
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
    Ok(o)
}

/// The turns of one input: the request bodies to send, in order.
fn turns_of(text: &str) -> Result<Vec<Value>, String> {
    let whole: Result<Value, _> = serde_json::from_str(text);
    let request = match whole {
        Ok(v) if v.get("request").is_some() => v["request"].clone(),
        Ok(v) => v,
        Err(_) => {
            // JSONL: one body per line, each a turn.
            return text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).map_err(|e| format!("a line is not JSON: {e}")))
                .collect();
        }
    };
    let messages = request["messages"]
        .as_array()
        .ok_or("the request has no messages array")?;
    let asks: Vec<usize> = (0..messages.len())
        .filter(|&k| messages[k]["role"] == "user")
        .collect();
    Ok(asks
        .iter()
        .map(|&k| {
            let mut body = request.clone();
            body["messages"] = Value::Array(messages[..=k].to_vec());
            body["stream"] = Value::Bool(false);
            body
        })
        .collect())
}

/// Runs the command; the exit code.
pub async fn run(options: Options) -> Result<String, String> {
    let base = Config::load(options.config.as_deref()).map_err(|e| e.to_string())?;
    let mut inputs = Vec::new();
    for file in &options.files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        inputs.push((
            file.display().to_string(),
            turns_of(&text).map_err(|e| format!("{}: {e}", file.display()))?,
        ));
    }
    let mut figures = Vec::new();
    for &strategy in &options.strategies {
        let mut config = base.clone();
        config.compaction.strategy = strategy;
        if let Some(t) = options.threshold {
            config.compaction.threshold_tokens = t;
        }
        let (mut turns, mut compactions) = (Vec::new(), 0);
        for (_, bodies) in &inputs {
            let (replayed, runs) = replay(&config, bodies).await?;
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
async fn replay(config: &Config, bodies: &[Value]) -> Result<(Vec<Turn>, u64), String> {
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
        "http://{}/v1/chat/completions",
        proxy.local_addr().map_err(|e| e.to_string())?
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
    for (n, body) in bodies.iter().enumerate() {
        let bytes = Bytes::from(body.to_string());
        let request = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("authorization", "Bearer replay")
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
        let seen = provider.seen();
        let forwarded = seen.last().cloned();
        let (ids, sent) = (
            history_identifiers(body),
            forwarded_text(forwarded.as_ref()),
        );
        turns.push(Turn {
            status,
            compacted,
            client_tokens: client_tokens(&bytes),
            provider_tokens: answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            stable_prefix: match (seen.len().checked_sub(2).map(|i| &seen[i]), &forwarded) {
                (Some(before), Some(now)) => now.messages.starts_with(&before.messages),
                _ => true,
            },
            kept_identifiers: share(&ids, |id| sent.contains(id)),
            recallable_identifiers: (n + 1 == bodies.len()).then(|| {
                let recall = Recallable::of(&bytes, forwarded.as_ref(), max_tokens);
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

/// What the client's request (its bytes, as sent) estimates, as abridge counts it.
fn client_tokens(body: &[u8]) -> u64 {
    crate::formats::chat::parse(body)
        .map(|p| {
            let model = p.request.model.as_deref().unwrap_or_default();
            crate::tokens::Estimator::for_model(model).messages(&p.messages)
        })
        .unwrap_or(0)
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
    fn of(bytes: &[u8], forwarded: Option<&provider::Seen>, max_tokens: u64) -> Self {
        let sent: std::collections::HashSet<&str> = forwarded
            .map(|f| f.messages.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let (corpus, model) = match crate::formats::chat::parse(bytes) {
            Ok(parsed) => {
                let condensed = (0..parsed.messages.len())
                    .filter(|&i| !sent.contains(parsed.messages[i].raw.get()));
                let corpus = crate::recall::Corpus::of_messages(&parsed.messages, condensed);
                (
                    corpus,
                    parsed.request.model.unwrap_or_default().into_owned(),
                )
            }
            Err(_) => (crate::recall::Corpus::default(), String::new()),
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

/// The identifiers of a request's messages, read from their text (every string in them,
/// unescaped: never a JSON escape taken for part of a path), each once.
fn history_identifiers(body: &Value) -> Vec<String> {
    let mut text = String::new();
    strings(&body["messages"], &mut text);
    let mut ids = identifiers(&text);
    ids.sort();
    ids.dedup();
    ids
}

/// The text of what was forwarded: every string in its messages.
fn forwarded_text(forwarded: Option<&provider::Seen>) -> String {
    let mut text = String::new();
    for raw in forwarded.map_or(&[][..], |f| f.messages.as_slice()) {
        if let Ok(value) = serde_json::from_str::<Value>(raw) {
            strings(&value, &mut text);
        }
    }
    text
}

/// Every string of `value`, each on a line of its own.
fn strings(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(members) => members.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}
