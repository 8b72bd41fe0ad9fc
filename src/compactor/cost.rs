//! Whether a compaction pays, at the provider's prices (`compaction.policy = "cost"`).
//! Pure: no I/O, no clock (the caller says whether the cache is cold).
//!
//! Agents' requests are read mostly from the provider's prompt cache, at a tenth of the
//! input price (Anthropic's cache reads, OpenAI's cached input for the gpt-5 family). A
//! compaction is an expense first — the prefix after the head is new, so it is written
//! (Anthropic: 1.25× input) or sent uncached (OpenAI), and a summary is a call of its own
//! — and pays back only through what each later request no longer reads from the cache.
//! For a request of `P` tokens (`H` of them the head a compaction keeps: tools, system),
//! growing `G` a request, with `R` requests still to come, compacted to `T`:
//!
//! ```text
//! as it is:   c·P + w·G           then c·(P + (i−1)·G) + w·G  for i = 2…R
//! compacted:  c·H + w·(T − H + G) then c·(T + (i−1)·G) + w·G  for i = 2…R, plus the summary S
//! net = (R − 1)·c·(P − T) + c·(P − H) − w·(T − H) − S
//! ```
//!
//! with `c` the cached price, `w` the price of a token written (the cache-write price,
//! or input where writing costs nothing more). When the cache has gone cold (the
//! conversation's last request is older than the cache lives), the request as it is
//! pays `w·(P + G)` anyway, and the compacted one `w·(T + G)`:
//! `net = w·(P − T) + (R − 1)·c·(P − T) − S` — a compaction then costs nearly nothing.
//!
//! A compaction is made when `net` is positive over one request fewer than expected
//! ([`SPARE_REQUESTS`]): over the threshold, and under it past the soft threshold when
//! the cut is deep (the window is large enough), so a conversation is not carried up to
//! the threshold at a cost the rewrite would save.
//!
//! `R` is not known; a conversation that has made `n` requests is expected to make about
//! as many more ([`remaining`]), at least [`MIN_REMAINING`] — but never more than it can
//! make before the size `E` where it would be compacted anyway (`(E − P) / G + 1`
//! requests): there the conversation as it is gets compacted too (by an agent that
//! compacts itself near its window, as Claude Code and Codex do, by its user's
//! `/compact`, or by abridge, for the window), so what a compaction now saves after it is
//! not this compaction's to claim. `E` is the caller's (see `super::horizon`).

use crate::outcome::Figures;
use crate::prices::Price;

/// A compaction pays only if it pays back with this many requests to spare (and in at
/// least the request it is made on): the requests still to come are a forecast, and a
/// compaction whose break-even is the last request expected saves nothing on average and
/// loses whenever the conversation ends a request early. On fifteen real Codex rollouts
/// replayed at their recorded bills, three conversations cost 0.5–1.1 % more through
/// abridge; the one traced was compacted at its 380th of 381 requests, paying back on
/// exactly the 6th of the 6 it expected. With a request to spare none cost more, and
/// the totals did not fall.
pub const SPARE_REQUESTS: u64 = 1;

/// A conversation is expected to make at least this many more requests.
pub const MIN_REMAINING: u64 = 4;
/// …and at most this many count (a long session's far future is not paid for now).
pub const MAX_REMAINING: u64 = 200;

/// What the model knows of a conversation at a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outlook {
    /// The request as it would go (the provider's count).
    pub prompt: u64,
    /// Of which the head a compaction keeps (read from the cache after it too).
    pub head: u64,
    /// Tokens a request adds, as the forecast counts them (see `super::decide`).
    pub growth: u64,
    /// Requests still to come, this one included.
    pub remaining: u64,
    /// The provider's cache has expired since the conversation's last request.
    pub cold: bool,
}

/// Prices per token, in millionths of a dollar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub input: f64,
    pub cached: f64,
    pub write: f64,
    pub output: f64,
}

impl Rates {
    pub fn of(price: &Price) -> Self {
        Self {
            input: price.input,
            cached: price.cached_input.unwrap_or(price.input),
            write: price.cache_write.unwrap_or(price.input),
            output: price.output,
        }
    }

    /// Whether nothing costs anything (a local model priced at zero).
    pub fn free(&self) -> bool {
        self.input == 0.0 && self.cached == 0.0 && self.write == 0.0 && self.output == 0.0
    }
}

/// What a summary of the condensed part costs: its prompt and its answer, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub input: u64,
    pub output: u64,
}

/// Requests a conversation that has made `made` is expected to make, this one included,
/// when its requests are `prompt` tokens, growing `growth` a request, and it would be
/// compacted anyway at `bound` tokens (see the module docs).
pub fn remaining(made: u64, prompt: u64, growth: u64, bound: u64) -> u64 {
    let before_bound = bound.saturating_sub(prompt) / growth.max(1) + 1;
    made.clamp(MIN_REMAINING, MAX_REMAINING).min(before_bound)
}

/// What compacting to `target` tokens now saves over the conversation's expected
/// requests, less what it costs (see the module docs), in millionths of a dollar;
/// negative when it costs more.
pub fn net(o: &Outlook, r: &Rates, target: u64, summary: Summary) -> f64 {
    let (p, t) = (o.prompt as f64, target.min(o.prompt) as f64);
    let h = o.head.min(target).min(o.prompt) as f64;
    let later = o.remaining.saturating_sub(1) as f64 * r.cached * (p - t);
    let now = if o.cold {
        r.write * (p - t)
    } else {
        r.cached * (p - h) - r.write * (t - h)
    };
    let summary = summary.input as f64 * r.input + summary.output as f64 * r.output;
    later + now - summary
}

/// The expected cost of the requests still to come sent as they are, and compacted to
/// `target` now (the summary included), in millionths of a dollar: the two totals of
/// the module docs, whose difference is [`net`] (so "not worth it" is a compacted total
/// at least the other).
pub fn totals(o: &Outlook, r: &Rates, target: u64, summary: Summary) -> (f64, f64) {
    let (p, g, n) = (o.prompt as f64, o.growth as f64, o.remaining.max(1) as f64);
    // Each request reads what came before it from the cache and writes what it appends;
    // after a cold cache the first one writes its whole prefix again.
    let mut as_is = n * (r.cached * p + r.write * g) + r.cached * g * n * (n - 1.0) / 2.0;
    if o.cold {
        as_is += (r.write - r.cached) * p;
    }
    (as_is, as_is - net(o, r, target, summary))
}

/// What the model weighed for `o`, for the admin API (`bounds`: the threshold and where
/// a compaction aims; the time since the previous request is the caller's to say).
pub fn figures(o: &Outlook, r: &Rates, (threshold, target): (u64, u64), s: Summary) -> Figures {
    let (as_is, compacted) = totals(o, r, target, s);
    Figures {
        prompt: o.prompt,
        as_is_micros: as_is.round() as u64,
        compacted_micros: compacted.round() as u64,
        break_even: break_even(o, r, target, s),
        remaining: o.remaining,
        cold: o.cold,
        since_ms: None,
        threshold,
        target,
    }
}

/// After how many requests a compaction to `target` has paid for itself (`None`: not
/// within [`MAX_REMAINING`]): the break-even the docs speak of.
pub fn break_even(o: &Outlook, r: &Rates, target: u64, summary: Summary) -> Option<u64> {
    (1..=MAX_REMAINING).find(|&n| {
        let o = Outlook { remaining: n, ..*o };
        net(&o, r, target, summary) > 0.0
    })
}

pub use crate::outcome::Why;

/// The request and the bounds it is judged against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// The hard threshold in force.
    pub threshold: u64,
    /// Whether the operator set it (`threshold_tokens`), rather than a share of the window.
    pub chosen: bool,
    /// Over this the request compacts whatever it costs: the window, less a fiftieth for
    /// the estimate's error. A request the provider takes is sent as it is — an agent
    /// compacts itself near its window, and a request that does not fit is compacted
    /// when the provider says so and retried.
    pub fits: u64,
    /// Where agents end their conversations on their own (the window less a tenth):
    /// the bound of the horizon a compaction is paid back over (see `super::decide`).
    pub must: u64,
    /// Under the threshold, past this (the soft threshold) a compaction is weighed where
    /// it is `deep`: made when it pays, warm or cold.
    pub early: u64,
    /// Whether a compaction goes deeper than the size policy's would (a window large
    /// enough for [`super::decide::deep`]). A shallow one made before the threshold would
    /// be made again a few requests later, each time a new cache write and, with a
    /// summary, the facts summarised once more: on a small window nothing is weighed
    /// early (at a 4,000-token threshold, the shipped conversations kept 47 of 51
    /// planted facts with structured where they keep 49).
    pub deep: bool,
}

/// Whether to compact `o` now to `target` under the cost policy (`None`: under every
/// bound, nothing to weigh).
pub fn judge(o: &Outlook, b: &Bounds, r: &Rates, target: u64, summary: Summary) -> Option<Why> {
    if o.prompt > b.fits {
        return Some(Why::Window);
    }
    let over = o.prompt > b.threshold;
    if over && b.chosen {
        return Some(Why::Threshold);
    }
    // Past the soft threshold the rewrite may pay before the threshold is reached: the
    // conversation is not carried up to it at a cost the compaction would save — where
    // the cut is deep (see [`Bounds::deep`]).
    let weighed = over || (b.deep && o.prompt > b.early);
    if !weighed {
        return None;
    }
    // With a request to spare: see [`SPARE_REQUESTS`].
    let sure = Outlook {
        remaining: o.remaining.saturating_sub(SPARE_REQUESTS).max(1),
        ..*o
    };
    let pays = !r.free() && net(&sure, r, target, summary) > 0.0;
    Some(match (pays, o.cold) {
        (true, true) => Why::CacheCold,
        (true, false) => Why::Pays,
        (false, _) if over => Why::NotWorthIt,
        // Under the threshold and not worth it: nothing said.
        (false, _) => return None,
    })
}

#[cfg(test)]
mod tests;
