//! Clearing inside the final turn for `deterministic`, whose digest keeps the final turn
//! whole: a plan over its budget because of its final turn is carried into that turn,
//! its results the model has acted on digested, oldest first, only as many as it takes
//! — the ask, every call and the newest exchange copied as they came (see the parent
//! module's *The shape of every plan*). `recency` clears as it fills its kept end
//! instead. The summarising strategies do not clear: a summary beside a final turn that
//! does not fit whole falls back to `recency`, which clears and pays for no summary
//! (measured on real Codex rollouts at a 60,000-token threshold, clearing under a
//! summary made 105 summaries where falling back made 61, and saved 29.4 % against
//! 31.9 %: a summary that stops short of its plan's range is written afresh next time).

use serde_json::value::RawValue;

use super::recency::copies;
use super::{Ctx, Origin, Plan};

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
