//! The cost policy's part of a decision (`compaction.policy = "cost"`): what
//! [`super::decide`] hands [`super::cost::judge`] for a request — its outlook (size,
//! cached head, growth, requests still to come before its horizon), its bounds, where a
//! compaction would aim and what its summary would cost — and whether a checkpoint built
//! ahead would be used. Pure.

use crate::config::CompactionConfig;
use crate::outcome::Figures;

use super::aim::{REPLACEMENT_FLOOR, deep, deepens};
use super::cost::{self, Why};
use super::decided::Decided;
use super::estimate::{added, beside, essential, scaled};
use super::growth::answers;
use super::turn::Turn;

/// What the cost policy weighs a request with: the model's prices, its window, whether
/// the strategy summarises (a summary is paid for), and the time (for the cache).
#[derive(Debug, Clone)]
pub struct Economics {
    pub rates: cost::Rates,
    pub window: u64,
    pub summarises: bool,
    pub now_ms: u64,
    /// Where the tenant's other conversations on this model ended, as forwarded,
    /// smallest first (see [`super::horizon`]).
    pub ends: Vec<u64>,
}

/// The cost policy's verdict on `decided` (see [`cost::judge`]), whether it expects to
/// compact once the history reaches the threshold, and what it weighed.
pub(super) fn weigh(
    config: &CompactionConfig,
    e: &Economics,
    turn: &Turn<'_, '_>,
    decided: &Decided<'_>,
    margin: u64,
) -> (Option<Why>, bool, Option<Figures>) {
    let threshold = decided.threshold;
    let made = answers(turn.messages);
    let cold = decided
        .usage
        .is_some_and(|u| e.now_ms.saturating_sub(u.at_ms) > config.cache_ttl_ms);
    let prompt = decided.predicted.saturating_add(margin);
    let bounds = cost::Bounds {
        threshold,
        chosen: config.threshold_tokens > 0,
        fits: e.window.saturating_sub(e.window / 50).max(threshold),
        must: e.window.saturating_sub(e.window / 10).max(threshold),
        early: decided.soft,
        deep: deepens(config, threshold, decided.growth),
    };
    // Far from every bound (and from being near one in two requests): nothing to weigh,
    // and no checkpoint to build ahead.
    if prompt.saturating_add(decided.growth.saturating_mul(2)) <= bounds.early {
        return (None, false, None);
    }
    // What the request carries besides its items (tools, a `system` or `instructions`
    // field): it stays whatever a compaction does.
    let beside = beside(turn);
    let head = beside + decided.head_tokens;
    // The first compaction adds the recall tool, and the tools lead the cached prefix:
    // nothing of the old prefix stays cached — unless every request carried it already.
    let cached_head = match decided.active.is_none() && added(turn) > 0 && !turn.recall_always {
        true => 0,
        false => head,
    };
    // How many requests are left before the horizon is counted at the larger of the
    // history's growth and its average since it began, so a lull does not stretch the
    // future a compaction is paid back over: a real Claude Code conversation at 715
    // tokens a request (1,700 on average) was compacted where 20 requests were expected
    // to pay it back; it made 5.
    let forecast = decided
        .growth
        .max(prompt.saturating_sub(head) / made.max(1));
    let outlook = cost::Outlook {
        prompt,
        head: cached_head,
        growth: forecast,
        remaining: cost::remaining(made, prompt, forecast, horizon(e, prompt, &bounds)),
        cold,
    };
    // Where it can get: no lower than what every plan keeps (the head, the final turn,
    // room for a summary or index).
    let floor = beside
        + scaled(
            essential(turn) + added(turn) + REPLACEMENT_FLOOR,
            decided.ratio,
        );
    let target = deep(config, threshold, decided.growth).max(floor);
    let now = summary(e, target, outlook.prompt);
    let why = cost::judge(&outlook, &bounds, &e.rates, target, now);
    let mut figures = cost::figures(&outlook, &e.rates, (threshold, target), now);
    figures.since_ms = decided.usage.map(|u| e.now_ms.saturating_sub(u.at_ms));
    let first = decided.usage.is_some_and(|u| u.growth == 0);
    let pace = (made, decided.pace, first);
    let expects = expects(e, (&outlook, &bounds), pace, target);
    (why, expects, Some(figures))
}

/// What a summary of a `prompt`-token request compacted to `target` costs, in tokens
/// (nothing when the strategy does not summarise).
fn summary(e: &Economics, target: u64, prompt: u64) -> cost::Summary {
    match e.summarises {
        true => cost::Summary {
            input: prompt.saturating_sub(target),
            output: (target / 10).clamp(500, 4000),
        },
        false => cost::Summary::default(),
    }
}

/// Whether a checkpoint built ahead for `outlook` (a conversation that has made `made`
/// requests, at `pace`: see [`super::growth::pace`]; `first`: its first growth) will be used. Only if
/// the history gets to the threshold: at its pace, within the requests it is expected to
/// make and no more than [`AHEAD_REQUESTS`] from now ([`FIRST_AHEAD`] at its first
/// growth) — a Codex session 60,000 tokens short at 300 a request had a summary built
/// that was never used, 44 % of its bill; and if, there, with as many requests still to
/// come as now and a warm cache, the model compacts. At the pace, not the growth budgets
/// count on: Claude Code's first turn, reading files, grew two real sessions by 32,000
/// tokens, and a summary built on that forecast was never used (−1.7 % and −1.5 % of
/// their bills in replay).
fn expects(
    e: &Economics,
    (outlook, b): (&cost::Outlook, &cost::Bounds),
    (made, pace, first): (u64, u64, bool),
    target: u64,
) -> bool {
    let within = outlook.remaining.min(match first {
        true => FIRST_AHEAD,
        false => AHEAD_REQUESTS,
    });
    let reaches = outlook.prompt.saturating_add(pace.saturating_mul(within)) > b.threshold;
    // Where it crosses — or where it is, when it is over already (the model said now that
    // compacting does not pay, and fewer requests are left the further it goes).
    // With half the requests expected there (see [`AHEAD_SHARE`]).
    let ahead = b.threshold.saturating_add(1).max(outlook.prompt);
    let remaining = cost::remaining(made, ahead, outlook.growth, horizon(e, ahead, b));
    let at = cost::Outlook {
        prompt: ahead,
        cold: false,
        remaining: (remaining / AHEAD_SHARE).max(1),
        ..*outlook
    };
    reaches
        && cost::judge(&at, b, &e.rates, target, summary(e, target, ahead))
            .is_some_and(Why::compacts)
}

/// A checkpoint is built ahead only if, at the threshold, it would pay back within this
/// share (one in `AHEAD_SHARE`) of the requests expected there: a build ahead bets a
/// summary on a future one burst can cut short. A real Codex rollout in a lull (207
/// tokens a request) expected 20 requests at its threshold, paid back in 19, and had a
/// summary built; its next turn added 5,864 tokens, which left 3, and the summary was
/// never used (3.9 % of its bill). Not built ahead, a compaction that pays at the
/// threshold is made there, on its request: the same money, that request's latency.
pub const AHEAD_SHARE: u64 = 2;

/// Under the cost policy, a checkpoint is built ahead (in the background, so the
/// request that crosses the threshold does not wait for a summary) only when the
/// threshold is at most this many requests away at the history's pace: further ahead,
/// the conversation often ends first and the summary is paid for nothing. A burst that
/// crosses it sooner is compacted on its request.
pub const AHEAD_REQUESTS: u64 = 8;

/// …and at most this many at a history's first growth, which is one turn's (often an
/// agent's largest: it reads the files it will work on) and says little of the pace to
/// come.
pub const FIRST_AHEAD: u64 = 2;

/// Where a conversation of `prompt` tokens is expected to be compacted anyway: where
/// the tenant's other conversations that grew as far ended
/// ([`super::horizon::expected_end`]); until one has, midway between the threshold and
/// the window's bound `must` (where agents end conversations: Claude Code compacted
/// itself at 155–173 K of a 200 K window in the real sessions replayed, its users ran
/// `/compact` at 149–166 K); never past `must`.
fn horizon(e: &Economics, prompt: u64, b: &cost::Bounds) -> u64 {
    let unlearned = b.threshold + b.must.saturating_sub(b.threshold) / 2;
    super::horizon::expected_end(&e.ends, prompt)
        .unwrap_or(unlearned)
        .min(b.must)
}

#[cfg(test)]
#[path = "weigh_tests.rs"]
mod tests;
