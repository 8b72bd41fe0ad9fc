//! How fast a history grows and how its provider counts it, learned from the usage
//! reports: the growth a compaction's budget leaves room for, the pace forecasts count
//! on, the answers a request carries, and the ratio of the provider's count to
//! abridge's estimate. Pure.

use crate::conversation::{Item, Role};
use crate::store::Usage;

use super::turn::Record;

/// Tokens a history grows by per turn: what this request added to the last report
/// per round trip since it (`since`, at least 1), and at least the mean of that and the
/// growth remembered, so a burst counts at once and a lull wears off slowly. The report
/// can be more than one round trip old — the previous turn's record had not landed
/// when the client sent the next one to another replica, or its attempt died with a
/// replica — and two turns' growth counted as one would aim the compaction far too low.
pub fn growth(usage: Option<&Usage>, predicted: u64, since: u64) -> u64 {
    usage.map_or(0, |u| {
        let now = latest(u, predicted, since);
        now.max(u.growth / 2 + now / 2)
    })
}

/// The pace a history keeps: the slower of this turn's growth (what this request added
/// to the last report, per round trip since it) and the growth remembered (this turn's
/// when none is yet), so one burst (a pasted log, a large file read) does not make a
/// threshold look near. What forecasts count on; budgets keep [`growth`], which counts
/// a burst at once.
pub fn pace(usage: Option<&Usage>, predicted: u64, since: u64) -> u64 {
    usage.map_or(0, |u| {
        let now = latest(u, predicted, since);
        match u.growth {
            0 => now,
            remembered => now.min(remembered),
        }
    })
}

/// What a request of `predicted` tokens added to the report `u`, per round trip since
/// it (`since`, at least 1).
fn latest(u: &Usage, predicted: u64, since: u64) -> u64 {
    predicted.saturating_sub(u.tokens) / since.max(1)
}

/// Provider answers in `appended` (what came after a reported request), at least 1:
/// see [`answers`].
pub fn round_trips(appended: &[Item<'_>]) -> u64 {
    answers(appended).max(1)
}

/// Provider answers in `items`: runs of assistant items, one per answer whatever it
/// holds (tool calls, reasoning, text).
pub fn answers(items: &[Item<'_>]) -> u64 {
    items
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            m.role == Role::Assistant && (*i == 0 || items[i - 1].role != Role::Assistant)
        })
        .count() as u64
}

/// The ratio of the provider's count to abridge's estimate of appended messages, after
/// a report: `reported − previous tokens` over the estimate of what was appended, when
/// the same checkpoint applied to both (else the previous ratio stands), mixed with the
/// previous ratio by the turn's size against the history's pace; per thousand, clamped
/// to 500–4000.
pub fn next_ratio(
    previous: Option<Record>,
    applied: Option<u32>,
    appended: u64,
    reported: u64,
) -> u32 {
    let Some(p) = previous else {
        return 1000;
    };
    let ratio = p.ratio_permille.max(1);
    if appended < 16 || p.applied != applied || reported <= p.tokens {
        return ratio;
    }
    let counted = reported - p.tokens;
    let measured = (counted * 1000 / appended).clamp(500, 4000);
    // Weighed by size: a turn as large as the history's usual one moves the ratio half
    // way, a small one less, so turns of different kinds (short prose, long tool output)
    // are each counted by their share of the tokens, as a total is. Before the history
    // has a pace (its first measure), half way: one turn alone, often the odd first one,
    // does not set the ratio every later budget is scaled by.
    let weight = if p.growth == 0 { counted } else { p.growth };
    let mixed = (u64::from(ratio) * weight + measured * counted) / (weight + counted);
    mixed.clamp(500, 4000) as u32
}
