//! One conversation through abridge, for `abridge replay`: each request sent as the
//! client sent it (calibrated to the bill its file recorded, see [`calibrate`]), what the
//! simulated provider was forwarded and reported, what the request cost sent as sent —
//! the recorded bill where the file has one, else the simulated provider's count and
//! cache — and through abridge, and at the last request how much of the history's
//! identifiers the provider received or a recall query returns.

use serde_json::Value;

use super::calibrate::{self, Calibration};
use super::harness::Harness;
use super::input::Input;
use super::report::Turn;
use super::{Spend, cache, provider, rules};
use crate::compactor::horizon::Horizons;
use crate::config::Config;
use crate::formats::Request;
use crate::prices::Tokens;
use crate::strategies::text::identifiers;

/// One conversation replayed.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Its file and, when the file holds several, which (`file#2`).
    pub name: String,
    /// What the file was (`claude-code`, `codex`, `chat`, …).
    pub kind: &'static str,
    pub turns: Vec<Turn>,
    pub compactions: u64,
    pub spend: Spend,
    pub calibration: Calibration,
}

impl Replayed {
    /// The first request a provider would refuse, and why: such a conversation is
    /// reported as failed, and none of its figures count.
    pub fn refusal(&self) -> Option<String> {
        self.turns
            .iter()
            .enumerate()
            .find_map(|(i, t)| Some(format!("request {}: {}", i + 1, t.refused.as_ref()?)))
    }
}

/// `input` (called `name`) through abridge with `config`.
/// `horizons`: what the session's earlier conversations taught the proxy, and what this
/// one teaches it.
pub async fn replay(
    config: &Config,
    input: &Input,
    name: String,
    horizons: &Horizons,
) -> Result<Replayed, String> {
    let model = input
        .rest(0)
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let estimator = crate::tokens::Estimator::for_model(&model);
    let mut calibration = Calibration::default();
    let mut padded = None;
    if input.bill(0).is_some() {
        calibration.scale = calibrate::scale(input, &estimator);
        let mut copy = input.clone();
        calibration.head = calibrate::pad(&mut copy, &estimator, calibration.scale);
        padded = Some(copy);
    }
    let input = padded.as_ref().unwrap_or(input);
    let scale = if calibration.scale > 0.0 {
        calibration.scale
    } else {
        1.0
    };
    let harness = Harness::start(config, input.format, scale).await?;
    horizons.carry_into(harness.horizons());
    let mut run = Run {
        price: harness.prices.of(&model),
        threshold: harness.threshold(&model),
        harness,
        input,
        count: &provider::count(&estimator, scale),
        direct: cache::Cache::default(),
        previous: 0,
        spend: Spend::default(),
        calibration,
    };
    let mut turns = Vec::new();
    for n in 0..input.len() {
        turns.push(run.request(n).await?);
        run.harness.wait_idle().await;
    }
    let Run {
        harness,
        mut spend,
        calibration,
        price,
        ..
    } = run;
    harness.horizons().carry_into(horizons);
    let (calls, summaries) = harness.provider.summaries();
    spend.summary_calls = calls;
    spend.summary_tokens = summaries.input + summaries.output;
    let summariser = harness.summary_model.as_deref().unwrap_or(&model);
    match (price, harness.prices.of(summariser)) {
        (Some(_), Some(summary_price)) => spend.summary_micros = summary_price.micros(summaries),
        _ => spend.unpriced.push(model.clone()),
    }
    Ok(Replayed {
        name,
        kind: input.kind,
        turns,
        compactions: harness.finish().await,
        spend,
        calibration,
    })
}

/// One conversation being replayed.
struct Run<'a> {
    harness: Harness,
    input: &'a Input,
    count: &'a dyn Fn(&Value) -> u64,
    price: Option<crate::prices::Price>,
    /// The hard threshold abridge applies to the input's model.
    threshold: u64,
    /// The client's requests sent as they were, on the same model of the cache.
    direct: cache::Cache,
    /// The tokens of the client's previous request (0 before the first).
    previous: u64,
    spend: Spend,
    calibration: Calibration,
}

impl Run<'_> {
    /// Request `n`: sent through abridge, counted and priced both ways.
    async fn request(&mut self, n: usize) -> Result<Turn, String> {
        let (input, format) = (self.input, self.input.format);
        let sent = input.sent(n);
        let answer = self.harness.send(sent.bytes.clone()).await?;
        let (before, forwarded) = self.harness.provider.last_two();
        let simulated = self.direct.serve_items(
            format,
            (input.rest(n), sent.items, &sent.keys, sent.newest.as_ref()),
            self.count,
        );
        let bill = input.bill(n);
        if let Some(bill) = bill {
            self.calibration.add(simulated, bill);
        }
        let reported = crate::relay::usage::of_value(&answer.body["usage"])
            .map(|u| crate::accounting::reported(&u))
            .unwrap_or_default();
        let history = cache::history(simulated, self.direct.head(), self.previous);
        self.previous = simulated.input;
        let over = simulated.input > self.threshold;
        self.price_one(bill, (simulated, history, over), reported);
        let mut turn = Turn {
            status: answer.status,
            compacted: answer.compacted,
            reason: answer.reason.clone(),
            note: answer.note.clone(),
            client_tokens: simulated.input,
            provider_tokens: reported.input,
            recorded_tokens: bill.map(|b| b.input),
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
            withheld_identifiers: 0,
        };
        if n + 1 == input.len() {
            let client = Request::parse(format, sent.bytes).ok();
            let max_tokens = self.harness.max_tokens;
            finals(&mut turn, client.as_ref(), forwarded.as_deref(), max_tokens);
        }
        Ok(turn)
    }

    /// One request's cost: as sent (the recorded `bill`, else the `simulated` count and
    /// cache), as sent by the simulation, of which its history (see
    /// [`cache::history`]; `over`: the request was over the threshold), and as
    /// forwarded (`reported`). The answer's length is the model's whatever abridge sent:
    /// as recorded, on every side.
    fn price_one(
        &mut self,
        bill: Option<Tokens>,
        simulated: (Tokens, Tokens, bool),
        reported: Tokens,
    ) {
        let (simulated, history, over) = simulated;
        let Some(price) = self.price else { return };
        let output = bill.map_or(provider::REPLY_TOKENS, |b| b.output);
        let simulated = Tokens {
            output,
            ..simulated
        };
        self.spend.direct_micros += price.micros(bill.unwrap_or(simulated));
        self.spend.simulated_direct_micros += price.micros(simulated);
        self.spend.history_micros += price.micros(history);
        if over {
            self.spend.over_threshold_micros += price.micros(history);
        }
        self.spend.forwarded_micros += price.micros(Tokens { output, ..reported });
    }
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
    // What recall withholds (redacted as, or beside, a secret) counts for neither side.
    let (withheld, ids): (Vec<String>, Vec<String>) = ids
        .into_iter()
        .partition(|id| !sent.contains(id.as_str()) && recall.withholds(id));
    turn.withheld_identifiers = withheld.len();
    turn.recallable_identifiers = Some(share(&ids, |id| {
        sent.contains(id) || recall.returns(&searcher, id)
    }));
}

/// The share of `ids` that `found` finds (1 for none).
fn share(ids: &[String], found: impl Fn(&str) -> bool) -> f64 {
    if ids.is_empty() {
        return 1.0;
    }
    ids.iter().filter(|id| found(id)).count() as f64 / ids.len() as f64
}

/// What an `abridge_recall` query returns from the messages of a request (its bytes)
/// that were not forwarded, within `recall.max_tokens`; and those messages' text as the
/// client sent them and as recall keeps them, secrets redacted.
struct Recallable {
    corpus: crate::recall::Corpus,
    estimator: crate::tokens::Estimator,
    max_tokens: u64,
    plain: String,
    redacted: String,
}

impl Recallable {
    fn of(client: Option<&Request>, forwarded: Option<&provider::Seen>, max_tokens: u64) -> Self {
        let sent: std::collections::HashSet<&str> = forwarded
            .map(|f| f.messages.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let (corpus, model, plain, redacted) = match client {
            Some(request) => {
                let items = request.items();
                // The newest is forwarded whatever its breakpoint mark.
                let last = items.len().saturating_sub(1);
                let condensed: Vec<usize> = (0..last)
                    .filter(|&i| !sent.contains(items[i].raw.get()))
                    .collect();
                let corpus = crate::recall::Corpus::of_messages(items, condensed.iter().copied());
                let plain = condensed
                    .iter()
                    .map(|&i| crate::recall::readable(&items[i]) + "\n")
                    .collect();
                // The redacted text is the corpus's own, not redacted again.
                let redacted = corpus.joined();
                (corpus, request.model().to_owned(), plain, redacted)
            }
            None => Default::default(),
        };
        Self {
            corpus,
            estimator: crate::tokens::Estimator::for_model(&model),
            max_tokens,
            plain,
            redacted,
        }
    }

    /// Whether recall withholds `id`: it is in the condensed messages as sent, but not
    /// as recall keeps them (a secret, or a word the redaction took with one).
    fn withholds(&self, id: &str) -> bool {
        self.plain.contains(id) && !self.redacted.contains(id)
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
