//! What a request comes to, for the decision: abridge's estimate of its items (the
//! forwarded view, a checkpoint applied), of what every plan keeps, of the recall tool
//! it gets and of what it carries beside its items (tools, system), and the calibration
//! that turns an estimate into the provider's count and back. Pure: no I/O.

use crate::conversation::Item;
use crate::formats::Format;
use crate::store::{Checkpoint, Piece, Usage};
use crate::strategies::Layout;
use crate::tokens::Estimator;

use super::turn::Turn;

/// Estimated tokens of what every plan keeps: the items that never move and the final
/// turn from the last ask on (the strategies' smallest plan, [`Layout::smallest`], with
/// the estimator they count with). A Claude Code or Codex turn is the user's ask and
/// every tool round since, often tens of thousands of tokens: a compaction cannot go
/// below it, and the cost policy must not expect it to. With nothing to replace, the
/// whole request.
pub fn essential(turn: &Turn<'_, '_>) -> u64 {
    let estimator = Estimator::for_model_ready(turn.model);
    let messages = turn.messages;
    let whole = (messages.len(), messages.len());
    let (head, start) = Layout::new(messages)
        .ok()
        .and_then(|l| l.smallest())
        .unwrap_or(whole);
    let kept = messages[..head].iter().chain(&messages[start..]);
    kept.map(|m| estimator.message(m)).sum::<u64>() + estimator.per_request()
}

/// abridge's estimate of what it adds to a compacted request of `turn`: the recall
/// tool's definition, which the provider counts as prompt tokens (0 when the request
/// does not get it).
pub fn added(turn: &Turn<'_, '_>) -> u64 {
    if turn.recall_tool {
        crate::recall::wire::tool_tokens(turn.format)
    } else {
        0
    }
}

/// abridge's estimate of what `turn`'s request carries besides its items — tools, a
/// `system` or `instructions` field (an agent's are ~20 K tokens) — which no compaction
/// changes: the body's estimate less its items' (and less what it withholds: not
/// forwarded). Linear in the body; worked out only where a compaction is weighed or
/// planned; never more than the provider's count of the history's last request leaves
/// beside its items. Taken as the provider counts it (text and schemas, which the
/// estimate is calibrated on) and kept apart from the items: the provider's count over
/// abridge's estimate of the items (the calibration) is not inflated by it, and a
/// compaction's budget for the items is what the target leaves beside it.
pub fn beside(turn: &Turn<'_, '_>) -> u64 {
    let withheld = turn.request.and_then(|r| r.withheld());
    let body = std::str::from_utf8(turn.body)
        .map_or(0, crate::tokens::approx_text)
        .saturating_sub(withheld.map_or(0, |w| crate::tokens::approx_text(w.get())));
    let items: u64 = turn
        .messages
        .iter()
        .map(|m| crate::tokens::approx_text(m.raw.get()))
        .sum();
    let estimated = body.saturating_sub(items);
    // Never more than the provider's own count of this history's last request leaves
    // beside its items (a server that does not count tools, say).
    let Some((loaded, u)) = turn
        .loaded
        .and_then(|l| Some((l, l.usage_for(turn.prefixes)?)))
    else {
        return estimated;
    };
    let applied = u.applied.map(|through| {
        loaded
            .all_matching(turn.prefixes)
            .find(|c| c.through == through)
    });
    let applied = match applied {
        Some(None) => return estimated,
        Some(Some(c)) => Some(c),
        None => None,
    };
    let n = (u.messages as usize).min(turn.messages.len());
    let forwarded = forwarded_estimate(
        &Estimator::approx(),
        turn.format,
        &turn.messages[..n],
        applied,
    ) + applied.map_or(0, |_| added(turn));
    estimated.min(u.tokens.saturating_sub(forwarded))
}

/// Estimated prompt tokens of the forwarded view with `applied` applied. Cheap
/// estimate first (0.2 ms per 200 KB); the model's exact tokenizer (~12 ms per 200 KB)
/// only when the cheap one is close enough to the threshold that the decision could
/// differ: it reads 0.92–1.22 × the exact count, so below 0.7 × or above 1.4 × the
/// threshold both sides agree.
pub fn estimate(turn: &Turn<'_, '_>, applied: Option<&Checkpoint>, threshold: u64) -> u64 {
    // With a checkpoint applied, the request carries the recall tool too.
    let tool = applied.map_or(0, |_| added(turn));
    let cheap = forwarded_estimate(&Estimator::approx(), turn.format, turn.messages, applied);
    let exact = Estimator::for_model_ready(turn.model);
    let near = cheap >= threshold / 10 * 7 && cheap <= threshold / 10 * 14;
    if !exact.is_exact() || !near {
        return cheap + tool;
    }
    forwarded_estimate(&exact, turn.format, turn.messages, applied) + tool
}

/// Estimated prompt tokens of `messages` with `applied` applied.
pub fn forwarded_estimate(
    estimator: &Estimator,
    format: Format,
    messages: &[Item<'_>],
    applied: Option<&Checkpoint>,
) -> u64 {
    let Some(c) = applied else {
        return estimator.messages(messages);
    };
    let (head, through) = (c.head as usize, c.through as usize);
    let replaced: u64 = c
        .pieces()
        .map(|piece| match piece {
            Piece::Stored(raw) => format.item(raw).map_or(0, |m| estimator.message(&m)),
            Piece::Kept(k) => messages.get(k).map_or(0, |m| estimator.message(m)),
        })
        .sum();
    let kept: u64 = messages
        .iter()
        .take(head)
        .chain(messages.iter().skip(through + 1))
        .map(|m| estimator.message(m))
        .sum();
    kept + replaced + estimator.per_request()
}

/// The provider's count over abridge's estimate, for this conversation: what it
/// reported for this history's last request against the estimate of the same view
/// (with the estimator the strategies count with). 1 without a report. Clamped to
/// 0.5–4.
pub fn calibration(turn: &Turn<'_, '_>, usage: Option<&Usage>, active: Option<&Checkpoint>) -> f64 {
    let Some(u) = usage else {
        return 1.0;
    };
    let n = (u.messages as usize).min(turn.messages.len());
    let estimator = Estimator::for_model_ready(turn.model);
    let estimate = forwarded_estimate(&estimator, turn.format, &turn.messages[..n], active)
        + active.map_or(0, |_| added(turn));
    // What the request carries besides its items is counted as it is (see [`beside`]).
    let items = u.tokens.saturating_sub(beside(turn));
    if estimate == 0 || items == 0 {
        return 1.0;
    }
    (items as f64 / estimate as f64).clamp(0.5, 4.0)
}

/// An estimate in abridge's units as the provider would count it.
pub fn scaled(estimate: u64, ratio: f64) -> u64 {
    (estimate as f64 * ratio) as u64
}

/// A provider count in abridge's units.
pub fn unscaled(tokens: u64, ratio: f64) -> u64 {
    (tokens as f64 / ratio) as u64
}
