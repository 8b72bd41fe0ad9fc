//! The decision, pure: given a request and what the store had, what to do — forward as
//! it is (with the checkpoint in force), apply a prepared checkpoint, or compact now to
//! a budget. No I/O; it may take CPU (token estimates), so the shell runs it off the
//! async workers for large requests.
//!
//! ```text
//! usage of the deepest history + checkpoints ─► checkpoint in force ─► predicted tokens
//!   under the hard threshold ─► forward with it (the prefix stays byte-stable)
//!   over it ──────────────────► a prepared deeper checkpoint that reaches the target?
//!                               apply it; else compact now, to the target
//! ```
//!
//! Under `compaction.policy = "cost"` (with a price for the model: [`Economics`]) a
//! request over the threshold is compacted only when [`cost::judge`] says so — the
//! window needs it, the operator's threshold says so, or it pays at the provider's
//! prices — and past the soft threshold it compacts earlier where that pays (a cold
//! cache makes it pay at once); it then aims deep
//! (`compaction.target_ratio` of the threshold), so one checkpoint serves many requests.
//!
//! Predicted tokens are the provider's own count for this history's last request,
//! corrected for a head that changed since, plus an estimate of what was appended,
//! scaled by how this provider counts appended turns; without a record, the forwarded
//! view is estimated whole. The target leaves room for `room_turns` turns of the
//! history's growth (see [`target`]); budgets are calibrated to the provider's count.

use crate::config::CompactionConfig;
use crate::controls::Compact;
use crate::conversation::{Item, Role};
use crate::outcome::Trigger;
use crate::store::{Checkpoint, Usage};
use crate::tokens::Estimator;

pub use super::aim::{
    DEEP_FLOOR, REPLACEMENT_FLOOR, deep, deepens, items_budget, raised_at_most, target, with_room,
};
use super::cost::Why;
pub use super::decided::{Action, Decided};
pub use super::estimate::{
    added, beside, calibration, essential, estimate, forwarded_estimate, scaled, to_record,
    unscaled,
};
pub use super::growth::{growth, next_ratio, pace, round_trips};
use super::turn::{Reason, Turn};
use super::weigh::weigh;
pub use super::weigh::{AHEAD_REQUESTS, AHEAD_SHARE, Economics, FIRST_AHEAD};

/// Decides for `turn` (see the module docs). `threshold` is the model's.
pub fn decide<'c>(
    config: &CompactionConfig,
    (threshold, economics): (u64, Option<&Economics>),
    turn: &Turn<'c, '_>,
    reason: Reason,
) -> Decided<'c> {
    let soft = ((threshold as f64) * config.soft_ratio) as u64;
    let (usage, matching, active) = history(turn);
    let prediction = predict(turn, usage.as_ref(), active, threshold);
    let since = usage.map_or(1, |u| {
        round_trips(&turn.messages[(u.messages as usize).min(turn.messages.len())..])
    });
    let growth = growth(usage.as_ref(), prediction.tokens, since);
    let pace = pace(usage.as_ref(), prediction.tokens, since);
    let scheduled = turn
        .loaded
        .and_then(|l| l.state.as_ref())
        .and_then(|s| s.scheduled.as_deref());
    let mut decided = Decided {
        action: Action::Forward,
        threshold,
        soft,
        predicted: prediction.tokens,
        head_tokens: prediction.head,
        appended: prediction.appended,
        growth,
        pace,
        // Until a compaction needs the exact one: the ratio learned from the reports
        // (what a forwarded request's saving is scaled by to be counted as the
        // provider counts).
        ratio: usage.map_or(1.0, |u| u.ratio()),
        usage,
        active,
        deepest: matching.first().copied(),
        scheduled,
        why: None,
        expects: true,
        figures: None,
    };
    let forced = turn.controls.compact == Compact::Force
        || matches!(reason, Reason::Overflow { .. })
        || scheduled.is_some();
    // What the provider reported is exact; what was appended since is an estimate, and
    // a twentieth of it (and a two-hundredth of the threshold, for its calibration) is
    // allowed for its error, so a request predicted just under the threshold is not one
    // the provider counts just over it.
    let margin = prediction.appended / 20 + threshold / 200;
    let over = prediction.tokens.saturating_add(margin) > threshold;
    if let Some(e) = economics {
        let weighed = weigh(config, e, turn, &decided, margin);
        (decided.why, decided.expects, decided.figures) = weighed;
        // The provider said the request did not fit: compacted for the window, whatever
        // the model weighed from abridge's estimate.
        if matches!(reason, Reason::Overflow { .. }) {
            decided.why = Some(Why::Window);
        }
        if !forced && !decided.why.is_some_and(Why::compacts) {
            return decided;
        }
    } else if !forced && !over {
        return decided;
    }
    decided.ratio = calibration(turn, usage.as_ref(), active);
    let target = match economics {
        Some(_) => deep(config, threshold, growth),
        None => target(config, threshold, soft, growth),
    };
    if !forced {
        // A prepared checkpoint was built for the target up to two turns ago; the
        // history has grown since by about that much.
        let reach = target.saturating_add(growth.saturating_mul(2));
        if let Some(action) = prepared(turn, (&matching, active), threshold, (reach, decided.ratio))
        {
            decided.action = action;
            return decided;
        }
    }
    decided.action = compaction(turn, reason, forced, &decided, target);
    decided
}

/// The compaction `decided` calls for (`target`: where it aims): its budget, in
/// abridge's estimate, and what started it.
fn compaction<'c>(
    turn: &Turn<'_, '_>,
    reason: Reason,
    forced: bool,
    decided: &Decided<'c>,
    target: u64,
) -> Action<'c> {
    let (threshold, soft, growth) = (decided.threshold, decided.soft, decided.growth);
    let (budget, trigger, ceiling) = match reason {
        Reason::Overflow { sent } => (
            (sent / 2).min(target),
            Trigger::Retry,
            (sent / 2).max(soft.min(sent / 10 * 9)),
        ),
        _ if forced => ((decided.predicted / 2).min(target), Trigger::Forced, soft),
        _ => (target, Trigger::Threshold, soft),
    };
    let ceiling = ceiling.min(raised_at_most(threshold, growth));
    let budget = with_room(turn, budget, ceiling, decided.ratio);
    Action::Compact {
        // The strategies plan the messages; the recall tool, the tools and the system
        // prompt go beside them.
        budget: items_budget(turn, budget, decided.ratio),
        trigger,
    }
}

/// What the store knows of this request's history: the usage record it extends, the
/// checkpoints that apply to it (deepest first) and the one in force at that record.
fn history<'c>(
    turn: &Turn<'c, '_>,
) -> (Option<Usage>, Vec<&'c Checkpoint>, Option<&'c Checkpoint>) {
    let usage = turn
        .loaded
        .and_then(|l| l.usage_for(turn.prefixes))
        .copied();
    let matching: Vec<&'c Checkpoint> = turn
        .loaded
        .map(|l| {
            l.all_matching(turn.prefixes)
                .filter(|c| applicable(c, turn.messages))
                .collect()
        })
        .unwrap_or_default();
    let active = usage
        .and_then(|u| u.applied)
        .and_then(|through| matching.iter().copied().find(|c| c.through == through));
    (usage, matching, active)
}

/// A prepared checkpoint deeper than the one in force whose forwarded request comes
/// within `reach` (the provider's count, `ratio` converts): to apply as it is.
fn prepared<'c>(
    turn: &Turn<'c, '_>,
    (matching, active): (&[&'c Checkpoint], Option<&'c Checkpoint>),
    threshold: u64,
    (reach, ratio): (u64, f64),
) -> Option<Action<'c>> {
    matching
        .iter()
        .copied()
        .filter(|c| active.is_none_or(|a| c.through > a.through))
        .find_map(|candidate| {
            let estimate = scaled(estimate(turn, Some(candidate), threshold), ratio) + beside(turn);
            (estimate <= reach).then_some(Action::Apply {
                checkpoint: candidate,
                estimate,
            })
        })
}

/// What [`predict`] worked out.
pub struct Prediction {
    /// Predicted prompt tokens (the provider's count).
    pub tokens: u64,
    /// abridge's estimate of the head.
    pub head: u64,
    /// abridge's estimate of what was appended since the usage record.
    pub appended: u64,
}

/// Predicted prompt tokens of the request with `applied` applied (see the module docs).
/// Saturating: the numbers come from the provider, and a wrapped sum would read as a
/// tiny conversation and switch compaction off.
pub fn predict(
    turn: &Turn<'_, '_>,
    usage: Option<&Usage>,
    applied: Option<&Checkpoint>,
    threshold: u64,
) -> Prediction {
    let exact = Estimator::for_model_ready(turn.model);
    let head_len = turn
        .messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count();
    let head: u64 = turn.messages[..head_len]
        .iter()
        .map(|m| exact.message(m))
        .sum();
    if let Some(u) = usage {
        let n = u.messages as usize;
        if n <= turn.messages.len() && u.applied == applied.map(|c| c.through) {
            let reported = u.tokens.saturating_sub(u.head_tokens).saturating_add(head);
            let added: u64 = turn.messages[n..].iter().map(|m| exact.message(m)).sum();
            // What the provider read at the report and drops now: a new ask since
            // dropped the reasoning of the turn the report ended in.
            let since = turn.messages[..n]
                .iter()
                .rposition(Item::is_ask)
                .unwrap_or(0);
            let dropped: u64 = turn.messages[since..n]
                .iter()
                .filter(|m| m.dropped)
                .map(|m| exact.read(m))
                .sum();
            let scale = |t: u64| t.saturating_mul(u64::from(u.ratio_permille.max(1))) / 1000;
            return Prediction {
                tokens: reported
                    .saturating_add(scale(added))
                    .saturating_sub(scale(dropped)),
                head,
                // What the history grew by, as the next report will count it.
                appended: added.saturating_sub(dropped),
            };
        }
    }
    Prediction {
        tokens: estimate(turn, applied, threshold) + beside(turn),
        head,
        appended: 0,
    }
}

/// A stored checkpoint fits this request: something of the request follows its range,
/// and not a tool result (a later turn cannot change what was checked when it was
/// built, since the prefix hash matches; this guards against a corrupt store). Its range
/// may reach into the final turn (results the model has acted on, digested: see
/// `crate::strategies`), and then a later request of the same turn applies it too.
pub fn applicable(c: &Checkpoint, messages: &[Item<'_>]) -> bool {
    let (head, through) = (c.head as usize, c.through as usize);
    head <= through + 1
        && c.kept_consistent()
        && messages.iter().any(|m| m.role == Role::User)
        && messages
            .get(through + 1)
            .is_some_and(|m| !matches!(m.role, Role::Tool | Role::Function))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
