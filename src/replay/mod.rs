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
mod calibrate;
mod harness;
mod input;
mod provider;
mod report;
mod rules;
mod session;
mod sessions;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::compactor::horizon::Horizons;
use crate::config::Config;
use crate::prices::{Price, Prices};
use crate::strategies::Strategy;

pub use input::Input;
pub use report::{Figures, Turn};

/// What the command line asked for.
pub struct Options {
    pub config: Option<PathBuf>,
    pub strategies: Vec<Strategy>,
    pub threshold: Option<u64>,
    /// Every model's context window for the run (the threshold stays a share of it).
    pub window: Option<u64>,
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
                   [--window TOKENS] [--prices FILE] [--offline] [--json]
                   [--html OUT] FILE...

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
        --threshold TOKENS compaction.threshold_tokens for the run: a bound the
                           operator chose, which compacts whatever it costs
        --window TOKENS    every model's context window for the run: the threshold
                           stays compaction.threshold_ratio of it, and the cost
                           policy decides whether crossing it pays
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
        window: None,
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
            Long("window") => o.window = Some(parser.value()?.parse()?),
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
        let name = file.file_name().map_or_else(
            || file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let several = read.len() > 1;
        for (k, input) in read.into_iter().enumerate() {
            let name = if several {
                format!("{name}#{}", k + 1)
            } else {
                name.clone()
            };
            inputs.push((name, input));
        }
    }
    let mut figures = Vec::new();
    for &strategy in &options.strategies {
        let mut config = base.clone();
        config.compaction.strategy = strategy;
        // A session's requests go back to back, hours of it in seconds: a per-minute
        // summary budget would refuse summaries the session's own pace never would.
        config.summary.max_tokens_per_tenant_per_minute = u64::MAX;
        config.summary.max_per_tenant_per_minute = 0;
        if let Some(t) = options.threshold {
            config.compaction.threshold_tokens = t;
        }
        if let Some(w) = options.window {
            // The empty prefix names every model.
            config.compaction.context_windows.insert(String::new(), w);
        }
        let mut replayed = Vec::new();
        // What a session's earlier conversations taught the proxy (where they ended),
        // carried to its later ones, as one proxy would have learned it.
        let mut learned: HashMap<&str, Horizons> = HashMap::new();
        for (name, input) in &inputs {
            let session = name.split_once('#').map_or(name.as_str(), |(file, _)| file);
            let horizons = learned.entry(session).or_default();
            replayed.push(session::replay(&config, input, name.clone(), horizons).await?);
        }
        let threshold = config.compaction.threshold_tokens;
        figures.push(Figures::of(strategy, threshold, &replayed));
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
    /// As sent: the recorded bill where the session file has one, else the simulation.
    pub direct_micros: f64,
    /// As sent, by the simulation alone (against the recorded bill: calibration).
    pub simulated_direct_micros: f64,
    /// Of which the requests' histories (see [`cache::history`]): the most any
    /// compaction could save.
    pub history_micros: f64,
    /// Of which the histories of the requests that were, as the client sent them, over
    /// the run's threshold: the most a compaction at that threshold could save (about:
    /// abridge decides on its own prediction of a request's size).
    pub over_threshold_micros: f64,
    pub forwarded_micros: f64,
    pub summary_micros: f64,
    pub summary_calls: u64,
    pub summary_tokens: u64,
    /// Models no price is known for (their inputs are in the tokens only).
    pub unpriced: Vec<String>,
}

impl Spend {
    /// Net saved and the cost through abridge, in millionths of a dollar. The saving is
    /// the simulation's, as sent against as forwarded (plus the summaries) on one model
    /// of the prompt cache; through abridge is the cost as sent (the recorded bill, where
    /// the session has one) less it — so a conversation abridge left alone costs what
    /// it cost, whatever the simulated cache does differently from the provider's.
    pub fn net_and_through(&self) -> (f64, f64) {
        let net = self.simulated_direct_micros - self.forwarded_micros - self.summary_micros;
        (net, self.direct_micros - net)
    }

    /// `micros` as a share of the cost as sent, in percent (`None`: unpriced, or nothing
    /// sent): how net saved and the most any compaction could have saved (what the
    /// requests paid for their histories) are reported.
    pub fn percent_of_direct(&self, micros: f64) -> Option<f64> {
        (self.unpriced.is_empty() && self.direct_micros > 0.0)
            .then(|| 100.0 * micros / self.direct_micros)
    }

    fn add(&mut self, other: &Spend) {
        self.direct_micros += other.direct_micros;
        self.simulated_direct_micros += other.simulated_direct_micros;
        self.history_micros += other.history_micros;
        self.over_threshold_micros += other.over_threshold_micros;
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
