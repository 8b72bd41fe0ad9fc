//! Clearing inside the final turn: the results in it the model has acted on digested,
//! oldest first, only as many as it takes — the ask, every call and the newest exchange
//! copied as they came (see the parent module's *The shape of every plan*).
//! - [`fit`]: for `deterministic`, whose digest keeps the final turn whole, a plan over
//!   its budget because of its final turn is carried into that turn. `recency` clears
//!   as it fills its kept end instead. The summarising strategies do not clear: a
//!   summary beside a final turn that does not fit whole falls back to `recency`, which
//!   clears and pays for no summary (measured on real Codex rollouts at a 60,000-token
//!   threshold, clearing under a summary made 105 summaries where falling back made 61,
//!   and saved 29.4 % against 31.9 %: a summary that stops short of its plan's range is
//!   written afresh next time).
//! - [`only`]: for every strategy, when nothing but the head precedes the final turn.

use serde_json::value::RawValue;

use super::recency::copies;
use super::{CannotCompact, Ctx, Fallback, Origin, Plan, Strategy};

/// `plan`, cleared into its final turn as far as it takes to fit the budget (as far as
/// it goes when nothing does); `plan` itself when it fits or has nothing to clear.
pub(super) fn fit(ctx: &Ctx<'_, '_>, plan: Plan) -> Plan {
    let (budget, layout) = (ctx.input.budget, &ctx.layout);
    if plan.tokens_after <= budget || plan.through >= layout.last_user {
        return plan;
    }
    let over = plan.tokens_after - budget;
    let (mut saved, mut last) = (0, None);
    for k in layout.last_user + 1..layout.clear_end {
        let Some(tokens) = layout.clearable(k).then(|| ctx.digest_cost(k)).flatten() else {
            continue;
        };
        saved += ctx.cost(k..k + 1).saturating_sub(tokens);
        last = Some(k);
        if saved >= over {
            break;
        }
    }
    let Some(last) = last else {
        return plan;
    };
    let through = ctx.exchange_end(last);
    let mut replacement: Vec<(Box<RawValue>, Origin)> =
        plan.replacement.into_iter().zip(plan.origin).collect();
    replacement.extend(copies(ctx, plan.through + 1..=through, |k| {
        k <= last && layout.clearable(k)
    }));
    // A summary would no longer cover the whole range: none is kept for an update.
    let mut fitted = ctx.plan(
        plan.requested,
        plan.strategy,
        (plan.head, through),
        replacement,
        None,
    );
    fitted.fallback = plan.fallback;
    fitted.verdict = plan.verdict;
    fitted
}

/// The plan for a final turn that follows the head with nothing between (one ask the
/// agent has worked on since, as a long Claude Code or Codex session is): its results
/// the model has acted on digested, oldest first, as many as it takes to fit the budget,
/// everything else copied as it came; no marker, for nothing is elided. The range runs
/// from the turn boundary before the first result it clears through the exchange of the
/// last. `deterministic` makes the same plan; a summarising strategy has nothing to
/// summarise, and falls back to `recency`, which makes it.
pub(super) fn only(ctx: &Ctx<'_, '_>, requested: Strategy) -> Result<Plan, CannotCompact> {
    let (budget, layout) = (ctx.input.budget, &ctx.layout);
    let n = layout.len();
    let mut total = ctx.estimator().per_request() + ctx.cost(0..n);
    let head = layout
        .clear_only_start()
        .ok_or(CannotCompact::NothingToReplace)?;
    let (mut first, mut last) = (None, None);
    for k in head..layout.clear_end {
        if total <= budget {
            break;
        }
        let Some(tokens) = layout.clearable(k).then(|| ctx.digest_cost(k)).flatten() else {
            continue;
        };
        total -= ctx.cost(k..k + 1).saturating_sub(tokens);
        first.get_or_insert(k);
        last = Some(k);
    }
    let (Some(first), Some(last)) = (first, last) else {
        return Err(CannotCompact::NothingToReplace);
    };
    if total > budget {
        return Err(CannotCompact::TooLarge {
            estimate: total,
            budget,
        });
    }
    // The range starts at the last turn boundary before the first result it clears.
    let head = (head..first)
        .rev()
        .find(|&k| layout.cut_ok[k])
        .unwrap_or(head);
    let through = ctx.exchange_end(last);
    let replacement = copies(ctx, head..=through, |k| k <= last && layout.clearable(k));
    let (strategy, fallback) = match requested {
        Strategy::Recency | Strategy::Deterministic => (requested, None),
        _ => (Strategy::Recency, Some(Fallback::NothingToSummarise)),
    };
    let mut plan = ctx.plan(requested, strategy, (head, through), replacement, None);
    plan.fallback = fallback;
    Ok(plan)
}
