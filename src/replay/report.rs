//! What `abridge replay` reports per strategy: turns, compactions, client-side and
//! provider-side prompt tokens, the largest forwarded request against the threshold,
//! whether every request succeeded, how often the forwarded prefix stayed byte-stable
//! (the prompt cache's view), how much of the history's identifiers reached the
//! provider at the final turn, and what it cost — sent as the client sent it and through
//! abridge, summaries included, at the price table — as tables, as JSON, or as one
//! self-contained HTML page with a plot per strategy.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::json;

use super::Spend;
use super::session::Replayed;
use crate::strategies::Strategy;

/// What one turn showed.
#[derive(Debug, Clone, Serialize)]
pub struct Turn {
    pub status: u16,
    pub compacted: bool,
    /// Why the cost policy compacted it, or did not (`x-abridge-reason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What abridge told the client beside the answer (`x-abridge-note`: a summary that
    /// fell back, a budget spent, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Prompt tokens of the request as the client sent it (as the simulated provider
    /// counts).
    pub client_tokens: u64,
    /// Prompt tokens the (simulated) provider reported for what abridge forwarded.
    pub provider_tokens: u64,
    /// What the session file recorded the provider counted for the request, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_tokens: Option<u64>,
    /// The forwarded messages began with the previous turn's forwarded messages.
    pub stable_prefix: bool,
    /// Why the simulated provider refused what was forwarded, as a real one would.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Share of the history's identifiers present in what was forwarded.
    pub kept_identifiers: f64,
    /// At an input's final turn: the share of the history's identifiers either present in
    /// what was forwarded or returned by an `abridge_recall` query for it, those recall
    /// withholds left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recallable_identifiers: Option<f64>,
    /// At an input's final turn: the history's identifiers, not forwarded, that recall
    /// withholds — its redaction took them (a password in a URL, a value assigned to
    /// `api_key`), as the archive never stores a secret.
    #[serde(skip_serializing_if = "is_zero")]
    pub withheld_identifiers: usize,
}

/// One conversation's figures under one strategy.
#[derive(Debug, Clone, Serialize)]
pub struct Conversation {
    /// Its file (and which of the file's conversations: `file#2`).
    pub name: String,
    pub kind: &'static str,
    pub requests: usize,
    pub compactions: u64,
    pub compacted_requests: usize,
    /// The cost policy's verdicts on its requests, and how many of each (`pays`,
    /// `not-worth-it`, `window`, …: see `x-abridge-reason`).
    pub reasons: std::collections::BTreeMap<String, usize>,
    /// What abridge told the client beside its answers, and how often (`x-abridge-note`,
    /// its numbers written `N`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub notes: std::collections::BTreeMap<String, usize>,
    /// The first request a provider would refuse: the conversation failed, and its
    /// figures are left out of the totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    pub cost_direct_usd: Option<f64>,
    pub cost_through_usd: Option<f64>,
    pub net_saved_usd: Option<f64>,
    pub net_saved_percent: Option<f64>,
    /// The most any compaction could have saved, in percent of the cost as sent: what
    /// its requests paid for their histories, beyond the head and before their own
    /// turn (the simulation's, as net saved is).
    pub at_most_percent: Option<f64>,
    /// Of it, what the requests over the threshold (as the client sent them) paid for
    /// their histories: the most a compaction at this threshold could have saved.
    pub at_most_here_percent: Option<f64>,
    /// Against the bill the file recorded: replay's count of what the client sent over
    /// the recording, less one, in percent; the worst single request's; the share of
    /// the recorded prompt read from the provider's cache; tokens added to each
    /// request's head for what the file left out (system prompt, tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count_error_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_request_error_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_cache_read_share: Option<f64>,
    /// The share replay's simulated cache served of the same requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated_cache_read_share: Option<f64>,
    pub head_tokens_added: u64,
    /// The provider's tokens per token of replay's estimate, fitted to the bills' growth
    /// (`None`: nothing recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count_scale: Option<f64>,
}

/// `note` with each number in it written `N`, so that notes that differ only in their
/// figures (a summary's size, a budget) are counted as one.
fn numberless(note: &str) -> String {
    let mut out = String::with_capacity(note.len());
    let mut in_number = false;
    for c in note.chars() {
        match (c.is_ascii_digit(), in_number) {
            (true, false) => out.push('N'),
            (true, true) => {}
            (false, _) => out.push(c),
        }
        in_number = c.is_ascii_digit();
    }
    out
}

/// How many times each of `values` comes.
fn counted(values: impl Iterator<Item = String>) -> std::collections::BTreeMap<String, usize> {
    values.fold(std::collections::BTreeMap::new(), |mut counts, value| {
        *counts.entry(value).or_default() += 1;
        counts
    })
}

impl Conversation {
    fn of(r: &Replayed) -> Self {
        let spend = &r.spend;
        let priced = spend.unpriced.is_empty();
        let usd = |micros: f64| priced.then_some(micros / 1e6);
        let (net, through) = spend.net_and_through();
        let c = &r.calibration;
        Self {
            name: r.name.clone(),
            kind: r.kind,
            requests: r.turns.len(),
            compactions: r.compactions,
            compacted_requests: r.turns.iter().filter(|t| t.compacted).count(),
            reasons: counted(r.turns.iter().filter_map(|t| t.reason.clone())),
            notes: counted(
                r.turns
                    .iter()
                    .filter_map(|t| t.note.as_deref().map(numberless)),
            ),
            failed: r.refusal(),
            cost_direct_usd: usd(spend.direct_micros),
            cost_through_usd: usd(through),
            net_saved_usd: usd(net),
            net_saved_percent: spend.percent_of_direct(net),
            at_most_percent: spend.percent_of_direct(spend.history_micros),
            at_most_here_percent: spend.percent_of_direct(spend.over_threshold_micros),
            count_error_percent: c.error().map(|e| 100.0 * e),
            worst_request_error_percent: c.error().map(|_| 100.0 * c.worst),
            recorded_cache_read_share: c.cached_share(),
            simulated_cache_read_share: c.error().and(c.simulated_cached_share()),
            head_tokens_added: c.head,
            count_scale: (c.scale > 0.0).then_some(c.scale),
        }
    }
}

/// One strategy's figures over every conversation that did not fail.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub strategy: Strategy,
    pub turns: usize,
    /// Compactions run.
    pub compactions: u64,
    /// Turns forwarded compacted (a checkpoint applied or made).
    pub compacted_turns: usize,
    pub client_tokens: u64,
    pub provider_tokens: u64,
    pub saved_percent: f64,
    pub largest_forwarded: u64,
    /// `compaction.threshold_tokens` (0: a share of each model's window).
    pub threshold: u64,
    pub all_succeeded: bool,
    pub stable_prefix_share: f64,
    /// At each input's final turn, averaged over inputs.
    pub final_identifier_share: f64,
    /// The same, counting what a recall query returns too (secrets aside).
    pub final_recallable_share: f64,
    /// The secrets left out of that share, over the inputs' final turns.
    pub final_withheld_identifiers: usize,
    /// The first refusal: its conversation, request and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_refusal: Option<String>,
    /// No forwarded request broke a rule a provider enforces.
    pub all_valid: bool,
    /// Conversations left out of the figures because a provider would refuse one of
    /// their requests.
    pub failed_conversations: usize,
    /// What it cost, in US dollars at the price table (`None`: a model has no price):
    /// the requests sent as the client sent them (the recorded bill where the session
    /// recorded one), through abridge (the forwarded requests and the summaries), of
    /// which the summaries; net saved, and as a share of direct. Net saved is the
    /// simulation's, both sides on one model of the cache (as sent, simulated, less the
    /// forwarded requests and the summaries); through abridge is what is sent less that.
    /// And as sent by the simulation alone (against the recording: how far it is).
    pub cost_direct_usd: Option<f64>,
    pub cost_direct_simulated_usd: Option<f64>,
    pub cost_through_usd: Option<f64>,
    pub summary_usd: Option<f64>,
    pub net_saved_usd: Option<f64>,
    pub net_saved_percent: Option<f64>,
    /// The most any compaction could have saved, and one at this threshold (see
    /// [`Conversation`]).
    pub at_most_percent: Option<f64>,
    pub at_most_here_percent: Option<f64>,
    pub summary_calls: u64,
    /// The summaries' input and output tokens.
    pub summary_tokens: u64,
    /// Over the requests whose bill was recorded: replay's count over the recording,
    /// less one, in percent; and the share the provider's cache served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count_error_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_cache_read_share: Option<f64>,
    /// Models without a price.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpriced_models: Vec<String>,
    /// Each conversation, failed ones included.
    pub conversations: Vec<Conversation>,
    /// Every turn of every counted conversation, in order (the plot).
    #[serde(skip)]
    pub series: Vec<Turn>,
}

impl Figures {
    pub fn of(strategy: Strategy, threshold: u64, replayed: &[Replayed]) -> Self {
        let conversations: Vec<Conversation> = replayed.iter().map(Conversation::of).collect();
        let counted: Vec<&Replayed> = replayed.iter().filter(|r| r.refusal().is_none()).collect();
        let mut spend = Spend::default();
        let mut calibration = super::calibrate::Calibration::default();
        for r in &counted {
            spend.add(&r.spend);
            calibration.merge(&r.calibration);
        }
        let priced = spend.unpriced.is_empty();
        let usd = |micros: f64| priced.then_some(micros / 1e6);
        let (net, through) = spend.net_and_through();
        let all: Vec<Turn> = counted.iter().flat_map(|r| r.turns.clone()).collect();
        let client: u64 = all.iter().map(|t| t.client_tokens).sum();
        let provider: u64 = all.iter().map(|t| t.provider_tokens).sum();
        let finals: Vec<f64> = counted
            .iter()
            .filter_map(|r| r.turns.last().map(|t| t.kept_identifiers))
            .collect();
        let share = |n: usize| {
            if all.is_empty() {
                1.0
            } else {
                n as f64 / all.len() as f64
            }
        };
        Self {
            strategy,
            turns: all.len(),
            compactions: counted.iter().map(|r| r.compactions).sum(),
            compacted_turns: all.iter().filter(|t| t.compacted).count(),
            client_tokens: client,
            provider_tokens: provider,
            saved_percent: if client == 0 {
                0.0
            } else {
                100.0 * (client.saturating_sub(provider)) as f64 / client as f64
            },
            largest_forwarded: all.iter().map(|t| t.provider_tokens).max().unwrap_or(0),
            threshold,
            all_succeeded: replayed
                .iter()
                .all(|r| r.turns.iter().all(|t| t.status == 200)),
            stable_prefix_share: share(all.iter().filter(|t| t.stable_prefix).count()),
            final_identifier_share: mean(&finals),
            final_recallable_share: mean(
                &counted
                    .iter()
                    .filter_map(|r| r.turns.last().and_then(|t| t.recallable_identifiers))
                    .collect::<Vec<_>>(),
            ),
            final_withheld_identifiers: counted
                .iter()
                .filter_map(|r| r.turns.last().map(|t| t.withheld_identifiers))
                .sum(),
            first_refusal: replayed
                .iter()
                .find_map(|r| Some(format!("{}, {}", r.name, r.refusal()?))),
            all_valid: counted.len() == replayed.len(),
            failed_conversations: replayed.len() - counted.len(),
            cost_direct_usd: usd(spend.direct_micros),
            cost_direct_simulated_usd: usd(spend.simulated_direct_micros),
            cost_through_usd: usd(through),
            summary_usd: usd(spend.summary_micros),
            net_saved_usd: usd(net),
            net_saved_percent: spend.percent_of_direct(net),
            at_most_percent: spend.percent_of_direct(spend.history_micros),
            at_most_here_percent: spend.percent_of_direct(spend.over_threshold_micros),
            summary_calls: spend.summary_calls,
            summary_tokens: spend.summary_tokens,
            count_error_percent: calibration.error().map(|e| 100.0 * e),
            recorded_cache_read_share: calibration.cached_share(),
            unpriced_models: spend.unpriced.clone(),
            conversations,
            series: all,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The mean of shares (1 for none).
fn mean(shares: &[f64]) -> f64 {
    if shares.is_empty() {
        1.0
    } else {
        shares.iter().sum::<f64>() / shares.len() as f64
    }
}

/// One line per strategy.
pub fn text(figures: &[Figures]) -> String {
    let mut out = String::from(
        "strategy       turns  compactions  compacted turns  client tokens  provider tokens  \
         saved  largest  all 2xx  stable prefix  identifiers kept  recallable\n",
    );
    for f in figures {
        let _ = writeln!(
            out,
            "{:<14} {:>5}  {:>11}  {:>15}  {:>13}  {:>15}  {:>4.1}%  {:>7}  {:>7}  {:>12.0}%  {:>15.0}%  {:>9.0}%",
            f.strategy.to_string(),
            f.turns,
            f.compactions,
            f.compacted_turns,
            f.client_tokens,
            f.provider_tokens,
            f.saved_percent,
            f.largest_forwarded,
            if f.all_succeeded { "yes" } else { "NO" },
            100.0 * f.stable_prefix_share,
            100.0 * f.final_identifier_share,
            100.0 * f.final_recallable_share,
        );
    }
    out.push_str(&costs(figures));
    out.push_str(&conversations(figures));
    for f in figures {
        if let Some(why) = &f.first_refusal {
            let _ = writeln!(
                out,
                "{}: a provider would refuse {why}; that conversation is left out of the figures",
                f.strategy
            );
        }
        if f.final_withheld_identifiers > 0 {
            let _ = writeln!(
                out,
                "{}: identifiers recall withholds as secrets (or beside one), not in its \
                 recallable share: {}",
                f.strategy, f.final_withheld_identifiers
            );
        }
    }
    out
}

/// Each conversation under each strategy: one line each, and — where its file recorded
/// the bill — how replay's count of what the client sent compares with it.
fn conversations(figures: &[Figures]) -> String {
    // The header in the lines' own widths, so each title stands over its column.
    let mut out = format!(
        "\n{:<14} {:<36} {:>9}  {:>11}  {:>12}  {:>15}  {:>9}  {:>7}  {:>12}  {:>13}  {:>11}\n",
        "strategy",
        "conversation",
        "requests",
        "compactions",
        "cost as sent",
        "through abridge",
        "net saved",
        "at most",
        "at threshold",
        "count vs bill",
        "cache reads"
    );
    let pct = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:+.1}%"));
    let usd = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("${v:.4}"));
    for f in figures {
        for c in &f.conversations {
            let net = match &c.failed {
                Some(_) => "FAILED".to_owned(),
                None => pct(c.net_saved_percent),
            };
            let _ = writeln!(
                out,
                "{:<14} {:<36} {:>9}  {:>11}  {:>12}  {:>15}  {:>9}  {:>7}  {:>12}  {:>13}  {:>11}",
                f.strategy.to_string(),
                c.name.chars().take(36).collect::<String>(),
                c.requests,
                c.compactions,
                usd(c.cost_direct_usd),
                usd(c.cost_through_usd),
                net,
                percent(c.at_most_percent),
                percent(c.at_most_here_percent),
                pct(c.count_error_percent),
                match (c.recorded_cache_read_share, c.simulated_cache_read_share) {
                    (Some(r), Some(s)) => format!("{:.0}% ({:.0}%)", 100.0 * r, 100.0 * s),
                    _ => "–".to_owned(),
                },
            );
        }
    }
    out
}

/// A share in percent, to one decimal (`–`: none).
fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}%"))
}

/// What each strategy cost, in dollars: one line each.
fn costs(figures: &[Figures]) -> String {
    let mut out = String::from(
        "\nstrategy       cost as sent  through abridge  of which summaries (calls, tokens)  \
         net saved            at most  at threshold  every request valid\n",
    );
    let usd = |v: Option<f64>| {
        v.map_or_else(
            || "–".to_owned(),
            |v| format!("{}${:.4}", if v < 0.0 { "-" } else { "" }, v.abs()),
        )
    };
    for f in figures {
        let net = match (f.net_saved_usd, f.net_saved_percent) {
            (Some(net), Some(share)) => format!("{} ({share:.1}%)", usd(Some(net))),
            (net, _) => usd(net),
        };
        let _ = writeln!(
            out,
            "{:<14} {:>12}  {:>15}  {:>34}  {:<20} {:>7}  {:>12}  {}",
            f.strategy.to_string(),
            usd(f.cost_direct_usd),
            usd(f.cost_through_usd),
            format!(
                "{} ({}, {})",
                usd(f.summary_usd),
                f.summary_calls,
                f.summary_tokens
            ),
            net,
            percent(f.at_most_percent),
            percent(f.at_most_here_percent),
            if f.all_valid { "yes" } else { "NO" },
        );
    }
    if let Some(models) = figures.first().map(|f| &f.unpriced_models)
        && !models.is_empty()
    {
        let _ = writeln!(
            out,
            "no price for {}: tokens only (set [prices] in the configuration, or --prices FILE)",
            models.join(", ")
        );
    }
    out
}

/// `{"strategies": {"<name>": {...}}}`.
pub fn json(figures: &[Figures]) -> String {
    let strategies: serde_json::Map<String, serde_json::Value> = figures
        .iter()
        .map(|f| (f.strategy.to_string(), json!(f)))
        .collect();
    json!({ "strategies": strategies }).to_string()
}

/// One page, no external assets: the table, and per strategy a plot of client-side
/// against provider-side prompt tokens per turn.
pub fn html(figures: &[Figures]) -> String {
    let mut page = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>abridge replay</title>\
         <style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}\
         pre{background:#f6f6f6;padding:12px;font-size:12px;overflow-x:auto}svg{background:#fcfcfc;border:1px solid #ddd}\
         .c{stroke:#999;fill:none;stroke-width:1.5}.p{stroke:#1565c0;fill:none;stroke-width:2}\
         .t{stroke:#c62828;stroke-dasharray:4 3}</style></head><body><h1>abridge replay</h1>",
    );
    let _ = write!(page, "<pre>{}</pre>", escape(&text(figures)));
    page.push_str(
        "<p><span style=\"color:#999\">grey</span>: prompt tokens the client sent; \
         <span style=\"color:#1565c0\">blue</span>: what the provider received; \
         <span style=\"color:#c62828\">red</span>: the threshold. Inputs are replayed one \
         after another.</p>",
    );
    for f in figures {
        let _ = write!(page, "<h2>{}</h2>{}", f.strategy, plot(f));
    }
    page.push_str("</body></html>\n");
    page
}

fn plot(f: &Figures) -> String {
    let (w, h, pad) = (720.0, 220.0, 30.0);
    let top = f
        .series
        .iter()
        .map(|t| t.client_tokens.max(t.provider_tokens))
        .chain([f.threshold])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let n = f.series.len().max(2) as f64 - 1.0;
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / n;
    let y = |v: u64| h - pad - (h - 2.0 * pad) * v as f64 / top;
    let line = |pick: fn(&Turn) -> u64| {
        f.series
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{:.1},{:.1}", x(i), y(pick(t))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut svg = format!("<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">");
    if f.threshold > 0 {
        let ty = y(f.threshold);
        let _ = write!(
            svg,
            "<line class=\"t\" x1=\"{pad}\" y1=\"{ty:.1}\" x2=\"{:.1}\" y2=\"{ty:.1}\"/>",
            w - pad
        );
    }
    let _ = write!(
        svg,
        "<polyline class=\"c\" points=\"{}\"/><polyline class=\"p\" points=\"{}\"/>\
         <text x=\"{pad}\" y=\"16\">{} tokens</text><text x=\"{:.0}\" y=\"{:.0}\">turn {}</text></svg>",
        line(|t| t.client_tokens),
        line(|t| t.provider_tokens),
        top as u64,
        w - pad - 60.0,
        h - 8.0,
        f.series.len()
    );
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
