//! Replay calibrated to the bill a session file recorded.
//!
//! A Claude Code transcript keeps no system prompt and no tools (Claude Code's are
//! ~15–20 K tokens on every request); a Codex rollout keeps its instructions but no tools.
//! Without them replay would count every request short, and compact where the real
//! client never came near the threshold. So what the file leaves out is sized from the
//! first request's recorded bill — what the provider counted, less what replay counts of
//! the request as rebuilt — and carried by every request as a head of that many tokens
//! ([`pad`]): filler text the simulated provider counts as it counts the rest, cached
//! at the head as the clients mark theirs.
//!
//! What the requests add, one after another, is counted at the rate the bills grew
//! ([`scale`]): replay's estimate of Claude's tokenizer reads code and JSON lighter than
//! the provider bills it, and the error would grow with every request.
//!
//! [`Calibration`] then compares, request by request, replay's count of what the client
//! sent with what the session recorded: the error replay reports per conversation (the
//! goal: within 5 %), and the share of the recorded prompt the provider's cache served.

use serde::Serialize;
use serde_json::Value;

use super::cache::Cache;
use super::input::Input;
use super::provider;
use crate::prices::Tokens;
use crate::tokens::Estimator;

/// Below this many tokens a difference is left alone (the counts' own noise).
const MIN_PAD: u64 = 64;
/// One sentence of the filler.
const FILLER: &str = "The tool reads the named file and returns its lines with numbers; \
                      paths are absolute, and an offset and a limit select a range. ";

/// How many tokens the provider billed for each the estimator counts, fitted to what
/// the requests added one after another: over the requests with a bill, the least
/// squares of the bills' growth from the first against replay's count's growth
/// (`Σ Δbill·Δcount / Σ Δcount²`), clamped to 0.5–2; 1 with fewer than two bills. (The
/// head the file left out is the same in every request: the growth does not see it.)
pub fn scale(input: &Input, estimator: &Estimator) -> f64 {
    let count = provider::count(estimator, 1.0);
    let mut cache = Cache::default();
    let mut first = None;
    let (mut cross, mut square) = (0.0, 0.0);
    for k in 0..input.len() {
        let Some(bill) = input.bill(k) else { continue };
        let sent = input.sent(k);
        let own = cache
            .serve_items(
                input.format,
                (input.rest(k), sent.items, &sent.keys, sent.newest.as_ref()),
                &count,
            )
            .input;
        let (bill0, own0) = *first.get_or_insert((bill.input, own));
        let (db, dc) = (bill.input as f64 - bill0 as f64, own as f64 - own0 as f64);
        cross += db * dc;
        square += dc * dc;
    }
    if square <= 0.0 {
        return 1.0;
    }
    (cross / square).clamp(0.5, 2.0)
}

/// Adds to `input`'s head what its file left out, sized from its first recorded bill
/// against replay's count at `scale` (see the module docs): the tokens added (0:
/// nothing recorded, or nothing missing).
pub fn pad(input: &mut Input, estimator: &Estimator, scale: f64) -> u64 {
    let Some(bill) = input.bill(0) else {
        return 0;
    };
    let count = provider::count(estimator, scale);
    let own = own_count(input, 0, &count);
    let missing = bill.input.saturating_sub(own);
    if missing < MIN_PAD {
        return 0;
    }
    // In the estimator's tokens, less the 4 the head block counts besides its text (as
    // every item does).
    let target = ((missing as f64 / scale.max(0.01)) as u64).saturating_sub(4);
    let unit = estimator.text(FILLER).max(1);
    let mut text = FILLER.repeat(usize::try_from(target / unit).unwrap_or(0));
    // Close the rest a word at a time.
    while estimator.text(&text) < target {
        text.push_str("lines ");
    }
    input.pad(&text);
    own_count(input, 0, &count).saturating_sub(own)
}

/// Request `k` of `input` as the simulated provider counts it (no cache).
fn own_count(input: &Input, k: usize, count: &dyn Fn(&Value) -> u64) -> u64 {
    let sent = input.sent(k);
    Cache::default()
        .serve_items(
            input.format,
            (input.rest(k), sent.items, &sent.keys, sent.newest.as_ref()),
            count,
        )
        .input
}

/// Replay's count of a conversation's requests against what its file recorded.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Calibration {
    /// Requests with a recorded bill.
    pub requests: u64,
    /// Replay's count of them and what was recorded: in all, and read from the cache.
    pub counted: u64,
    pub counted_cached: u64,
    pub recorded: u64,
    pub recorded_cached: u64,
    /// The largest error of one request (a share of what was recorded).
    pub worst: f64,
    /// Tokens added to each request's head for what the file left out.
    pub head: u64,
    /// The provider's tokens per token replay's estimator counts ([`scale`]; 0: not
    /// fitted, nothing recorded).
    pub scale: f64,
}

impl Calibration {
    /// One request: replay counted `own` (its simulated cache served part of it) of
    /// what the provider billed as `bill`.
    pub fn add(&mut self, own: Tokens, bill: Tokens) {
        self.requests += 1;
        self.counted += own.input;
        self.counted_cached += own.cached;
        let own = own.input;
        self.recorded += bill.input;
        self.recorded_cached += bill.cached;
        if bill.input > 0 {
            let error = (own as f64 - bill.input as f64).abs() / bill.input as f64;
            self.worst = self.worst.max(error);
        }
    }

    /// Adds another conversation's.
    pub fn merge(&mut self, other: &Calibration) {
        self.requests += other.requests;
        self.counted += other.counted;
        self.counted_cached += other.counted_cached;
        self.recorded += other.recorded;
        self.recorded_cached += other.recorded_cached;
        self.worst = self.worst.max(other.worst);
    }

    /// Replay's count over the recording, less one (`None`: nothing recorded).
    pub fn error(&self) -> Option<f64> {
        (self.recorded > 0).then(|| self.counted as f64 / self.recorded as f64 - 1.0)
    }

    /// The share of the recorded prompt tokens the provider's cache served.
    pub fn cached_share(&self) -> Option<f64> {
        (self.recorded > 0).then(|| self.recorded_cached as f64 / self.recorded as f64)
    }

    /// The share of replay's count of the same requests its simulated cache served.
    pub fn simulated_cached_share(&self) -> Option<f64> {
        (self.counted > 0).then(|| self.counted_cached as f64 / self.counted as f64)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::formats::Format;

    #[test]
    fn what_the_file_left_out_is_sized_from_the_first_bill() {
        let items = vec![
            json!({"role": "user", "content": "Fix the failing test in src/parser.rs."}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Done."}]}),
            json!({"role": "user", "content": "Thanks."}),
        ];
        let base = json!({"model": "claude-sonnet-4-5", "max_tokens": 100})
            .as_object()
            .unwrap()
            .clone();
        let bill = |input| {
            Some(Tokens {
                input,
                ..Tokens::default()
            })
        };
        let mut input = Input::growing(Format::Messages, "claude-code", base, items, vec![1, 3])
            .with_bills(vec![bill(18_000), bill(18_040)]);
        let estimator = Estimator::for_model("claude-sonnet-4-5");
        let count = provider::count(&estimator, 1.0);
        let before = own_count(&input, 1, &count);
        let added = pad(&mut input, &estimator, 1.0);
        let first = own_count(&input, 0, &count);
        assert!(first.abs_diff(18_000) < 40, "{first}");
        // Every request carries it, cached at the head as Claude Code marks its own.
        assert_eq!(own_count(&input, 1, &count), before + added);
        assert!(
            input.body(1)["system"]
                .to_string()
                .contains("cache_control")
        );
        let mut calibration = Calibration::default();
        let own = Tokens {
            input: first,
            ..Tokens::default()
        };
        calibration.add(own, bill(18_000).unwrap());
        assert!(calibration.error().unwrap().abs() < 0.01);
    }
}
