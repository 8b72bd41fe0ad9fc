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

mod cache;
mod harness;
mod input;
mod provider;
mod report;
mod rules;
mod sessions;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::config::Config;
use crate::formats::Request;
use crate::prices::{Price, Prices, Tokens};
use crate::strategies::Strategy;
use crate::strategies::text::identifiers;

use harness::Harness;
pub use input::Input;
pub use report::{Figures, Turn};

/// What the command line asked for.
pub struct Options {
    pub config: Option<PathBuf>,
    pub strategies: Vec<Strategy>,
    pub threshold: Option<u64>,
    pub json: bool,
    pub html: Option<PathBuf>,
    pub prices: Option<PathBuf>,
    /// Refuse a configured summary upstream: summaries come from the simulated stand-in.
    pub offline: bool,
    pub files: Vec<PathBuf>,
}

pub const USAGE: &str = "\
abridge replay — how each strategy would treat your conversations

USAGE:
    abridge replay [--config FILE] [--strategy S ...] [--threshold TOKENS]
                   [--prices FILE] [--offline] [--json] [--html OUT] FILE...

FILE is one of (the format is found by itself):
  - a Claude Code transcript: ~/.claude/projects/*/*.jsonl
  - a Codex CLI rollout: ~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl
  - a JSONL of request bodies (chat completions, Responses or Messages), one per
    turn as the client sent them
  - one request (JSON) whose history is replayed growing one turn at a time

OPTIONS:
    -c, --config FILE      abridge's configuration (the upstream is replaced by a
                           simulated provider on loopback). Nothing leaves the
                           machine unless it names a summary.upstream (also from
                           ABRIDGE_SUMMARY__UPSTREAM): then the summarising
                           strategies send it your sessions' text, with
                           summary.api_key; replay says so before it starts
        --offline          never call a summary.upstream: the simulated provider's
                           stand-in summarises (and says so)
        --strategy S       deterministic, recency, structured or llm_replace; repeat
                           for several (default: every strategy)
        --threshold TOKENS compaction.threshold_tokens for the run
        --prices FILE      prices per model (TOML: \"model\" = { input = 2.5,
                           cached_input = 1.25, cache_write = 2.5, output = 10 },
                           US dollars per million tokens; a [prices] table of it
                           too), over the configuration's and the built-in ones
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
        prices: None,
        offline: false,
        files: Vec::new(),
    };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('c') | Long("config") => o.config = Some(parser.value()?.into()),
            Long("strategy") => o.strategies.push(parser.value()?.parse()?),
            Long("threshold") => o.threshold = Some(parser.value()?.parse()?),
            Long("json") => o.json = true,
            Long("html") => o.html = Some(parser.value()?.into()),
            Long("prices") => o.prices = Some(parser.value()?.into()),
            Long("offline") => o.offline = true,
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

/// Runs the command: the report. `notify` hears, before anything is replayed, what
/// may leave the machine.
pub async fn run(options: Options, notify: &dyn Fn(&str)) -> Result<String, String> {
    let mut base = Config::load(options.config.as_deref()).map_err(|e| e.to_string())?;
    notify(&leaving(&mut base, options.offline));
    if let Some(file) = &options.prices {
        base.prices.extend(read_prices(file)?);
        Prices::new(&base.prices).map_err(|e| format!("{}: {e}", file.display()))?;
    }
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
        let (mut turns, mut compactions, mut spend) = (Vec::new(), 0, Spend::default());
        for input in &inputs {
            let (replayed, runs, spent) = replay(&config, input).await?;
            turns.push(replayed);
            compactions += runs;
            spend.add(&spent);
        }
        let threshold = config.compaction.threshold_tokens;
        figures.push(Figures::of(
            strategy,
            (threshold, compactions),
            &turns,
            &spend,
        ));
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

/// What may leave the machine with `config` (the summary upstream, when one is named
/// and not refused by `offline`, which drops it from `config`), in one line.
fn leaving(config: &mut Config, offline: bool) -> String {
    match (&config.summary.upstream, offline) {
        (None, _) => {
            "nothing leaves this machine: abridge and the provider are simulated on loopback"
                .to_owned()
        }
        (Some(upstream), true) => {
            let said = format!(
                "--offline: summary.upstream ({upstream}) is not called; the simulated provider's stand-in summarises"
            );
            config.summary.upstream = None;
            config.summary.api_key = None;
            said
        }
        (Some(upstream), false) => format!(
            "summaries go to {upstream} (summary.upstream{}): the summarising strategies send it your sessions' text; --offline refuses it",
            if config.summary.api_key.is_some() {
                ", with summary.api_key"
            } else {
                ""
            }
        ),
    }
}

/// What one input cost at the price table: as the client sent it and as forwarded (both
/// with the simulated prompt cache), and the summaries abridge asked for.
#[derive(Debug, Clone, Default)]
pub struct Spend {
    pub direct_micros: f64,
    pub forwarded_micros: f64,
    pub summary_micros: f64,
    pub summary_calls: u64,
    pub summary_tokens: u64,
    /// Models no price is known for (their inputs are in the tokens only).
    pub unpriced: Vec<String>,
}

impl Spend {
    fn add(&mut self, other: &Spend) {
        self.direct_micros += other.direct_micros;
        self.forwarded_micros += other.forwarded_micros;
        self.summary_micros += other.summary_micros;
        self.summary_calls += other.summary_calls;
        self.summary_tokens += other.summary_tokens;
        for model in &other.unpriced {
            if !self.unpriced.contains(model) {
                self.unpriced.push(model.clone());
            }
        }
    }
}

/// One input through abridge with `config`: what each turn showed, in order, how many
/// compactions ran, and what it cost.
async fn replay(config: &Config, input: &Input) -> Result<(Vec<Turn>, u64, Spend), String> {
    let harness = Harness::start(config, input.format).await?;
    let format = input.format;
    let model = input
        .rest(0)
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let estimator = crate::tokens::Estimator::for_model(&model);
    let price = harness.prices.of(&model);
    let (mut turns, mut spend) = (Vec::new(), Spend::default());
    // The client's requests sent as they were, on the same model of the cache.
    let mut direct = cache::Cache::default();
    for n in 0..input.len() {
        let sent = input.sent(n);
        let answer = harness.send(sent.bytes.clone()).await?;
        let (before, forwarded) = harness.provider.last_two();
        let sent_as_is = Tokens {
            output: provider::REPLY_TOKENS,
            ..direct.serve_items(
                format,
                (input.rest(n), sent.items, &sent.keys, sent.newest.as_ref()),
                &provider::count(&estimator),
            )
        };
        let reported = crate::relay::usage::of_value(&answer.body["usage"])
            .map(|u| crate::accounting::reported(&u))
            .unwrap_or_default();
        if let Some(price) = price {
            spend.direct_micros += price.micros(sent_as_is);
            spend.forwarded_micros += price.micros(reported);
        }
        let mut turn = Turn {
            status: answer.status,
            compacted: answer.compacted,
            client_tokens: sent_as_is.input,
            provider_tokens: reported.input,
            stable_prefix: match (&before, &forwarded) {
                (Some(before), Some(now)) => now.messages.starts_with(&before.messages),
                _ => true,
            },
            refused: forwarded
                .as_ref()
                .and_then(|f| f.refused.clone())
                .map(|why| {
                    // The input's own fault, or abridge's.
                    match rules::violation(format, sent.items) {
                        Some(_) => format!("{why} (as the client sent it too)"),
                        None => why,
                    }
                }),
            kept_identifiers: 1.0,
            recallable_identifiers: None,
        };
        if n + 1 == input.len() {
            let client = Request::parse(format, sent.bytes).ok();
            finals(
                &mut turn,
                client.as_ref(),
                forwarded.as_ref(),
                harness.max_tokens,
            );
        }
        turns.push(turn);
        harness.wait_idle().await;
    }
    let (calls, summaries) = harness.provider.summaries();
    spend.summary_calls = calls;
    spend.summary_tokens = summaries.input + summaries.output;
    let summariser = harness.summary_model.as_deref().unwrap_or(&model);
    match (price, harness.prices.of(summariser)) {
        (Some(_), Some(summary_price)) => spend.summary_micros = summary_price.micros(summaries),
        _ => spend.unpriced.push(model.clone()),
    }
    Ok((turns, harness.finish().await, spend))
}

/// At an input's final turn (whose history holds all its identifiers): the share of
/// them the provider received, and the share it received or a recall query returns.
fn finals(
    turn: &mut Turn,
    client: Option<&Request>,
    forwarded: Option<&provider::Seen>,
    max_tokens: u64,
) {
    let ids = client.map(history_identifiers).unwrap_or_default();
    let sent = forwarded.map_or("", |f| f.text.as_str());
    turn.kept_identifiers = share(&ids, |id| sent.contains(id));
    let recall = Recallable::of(client, forwarded, max_tokens);
    let searcher = recall.corpus.searcher();
    turn.recallable_identifiers = Some(share(&ids, |id| {
        sent.contains(id) || recall.returns(&searcher, id)
    }));
}

/// A `--prices` file: `"model" = { input = …, output = … }` entries, at the top or in a
/// `[prices]` table.
fn read_prices(file: &std::path::Path) -> Result<BTreeMap<String, Price>, String> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum File {
        Table { prices: BTreeMap<String, Price> },
        Bare(BTreeMap<String, Price>),
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    match toml::from_str::<File>(&text) {
        Ok(File::Table { prices } | File::Bare(prices)) => Ok(prices),
        Err(e) => Err(format!(
            "{}: not a price table (\"model\" = {{ input = 2.5, output = 10 }}, dollars per million tokens): {e}",
            file.display()
        )),
    }
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
                // The newest is forwarded whatever its breakpoint mark.
                let last = items.len().saturating_sub(1);
                let condensed = (0..last).filter(|&i| !sent.contains(items[i].raw.get()));
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

    /// Whether a query for `id` returns it (`searcher`: this corpus indexed).
    fn returns(&self, searcher: &crate::recall::Searcher<'_>, id: &str) -> bool {
        let tokens = |t: &str| self.estimator.text(t);
        searcher
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
