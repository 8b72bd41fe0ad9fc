//! What a request comes to, for the decision: abridge's estimate of its items (the
//! forwarded view, a checkpoint applied), of what every plan keeps, of the recall tool
//! it gets and of what it carries beside its items (tools, system), and the calibration
//! that turns an estimate into the provider's count and back. Pure: no I/O.

use crate::conversation::{Item, Role};
use crate::formats::Format;
use crate::store::{Checkpoint, Piece, Usage};
use crate::strategies;
use crate::tokens::Estimator;

use super::turn::Turn;

/// Estimated tokens of what every plan keeps: the items that never move and the final
/// turn from the last ask on, the bulky results in it the model has acted on digested
/// (the strategies' smallest plan, [`strategies::essential`], with the estimator they
/// count with). A Claude Code or Codex turn is the user's ask and every tool round
/// since, often tens of thousands of tokens: a compaction cannot go below its ask, its
/// calls and its newest exchange, and the cost policy must not expect it to. With
/// nothing to replace, the whole request.
pub fn essential(turn: &Turn<'_, '_>) -> u64 {
    let estimator = Estimator::for_model_ready(turn.model);
    let settings = strategies::Settings {
        tool_prune_chars: turn.tool_prune_chars,
        ..Default::default()
    };
    let input = strategies::Input {
        messages: turn.messages,
        budget: 0,
        previous: None,
        focus: None,
        estimator: &estimator,
        format: turn.format,
        summary_window: None,
        summary_ratio: None,
    };
    strategies::essential(&input, &settings)
        .unwrap_or_else(|| estimator.messages(turn.messages) + estimator.per_request())
}

/// abridge's estimate (cheap: [`crate::tokens::approx_text`]) of how every request of
/// `request`'s conversation starts: what it carries beside its items (tools, system),
/// its leading system messages and the first item after them. Later requests only
/// append, so each request of a conversation gives about the same figure; it decides
/// whether the recall tool is offered from the first request (`recall.offer = "auto"`).
pub fn opening(request: &crate::formats::Request) -> u64 {
    let items = request.items();
    let first = items
        .iter()
        .position(|m| !matches!(m.role, Role::System | Role::Developer))
        .map_or(items.len(), |k| k + 1);
    let leading: u64 = items[..first].iter().map(approx_item).sum();
    estimated_beside(request.body(), request.withheld(), items) + leading
}

/// abridge's own estimate of what a request carries beside its `items`: the body's less
/// its items' and less what it withholds (not forwarded). Linear in the body.
fn estimated_beside(
    body: &[u8],
    withheld: Option<crate::json::Raw<'_>>,
    items: &[Item<'_>],
) -> u64 {
    let body = std::str::from_utf8(body)
        .map_or(0, crate::tokens::approx_text)
        .saturating_sub(withheld.map_or(0, |w| crate::tokens::approx_text(w.get())));
    body.saturating_sub(items.iter().map(approx_item).sum())
}

fn approx_item(m: &Item<'_>) -> u64 {
    crate::tokens::approx_text(m.raw.get())
}

/// abridge's estimate of what it adds to a compacted request of `turn`: the recall
/// tool's definition, which the provider counts as prompt tokens (0 when the request
/// does not get it).
pub fn added(turn: &Turn<'_, '_>) -> u64 {
    if turn.recall_tool {
        crate::recall::wire::tool_tokens(turn.format, turn.recall_always)
    } else {
        0
    }
}

/// What `turn`'s request carries besides its items — tools, a `system` or
/// `instructions` field (an agent's are 15–50 K tokens) — which no compaction changes,
/// as the provider counts it: kept apart from the items, so the provider's count over
/// abridge's estimate of the items (the calibration) is not inflated by it, and a
/// compaction's budget for the items is what the target leaves beside it. Worked out
/// once a request ([`Beside`]).
pub fn beside(turn: &Turn<'_, '_>) -> u64 {
    turn.beside.get_or_init(|| work_out(turn)).tokens
}

/// What a request carries beside its items ([`beside`]), and whether it was learned
/// from the history's reports (what the next record keeps).
#[derive(Debug, Clone, Copy, Default)]
pub struct Beside {
    pub tokens: u64,
    pub learned: bool,
}

/// What the next usage record is to keep of [`beside`] when this request's decision
/// learned it (`None`: it did not; the record's own stands). Never works it out itself
/// (a request far from every bound asks for none).
pub fn to_record(turn: &Turn<'_, '_>) -> Option<u64> {
    turn.beside.get().filter(|b| b.learned).map(|b| b.tokens)
}

/// [`beside`], worked out. abridge's estimate is the body's less its items' (and less
/// what it withholds: not forwarded); linear in the body, asked only where a compaction
/// is weighed or planned. The estimate reads tool schemas and code as much as a half
/// lighter than Claude's tokenizer counts them (15 K tokens of a 50 K head), and what
/// it misses would be taken for items: every item would seem dearer (a calibration of
/// 2.7 where the turns count 1.0) and every compaction's floor too low. So once the
/// history's rate is learned (a record after an earlier one: what the provider counted
/// of appended turns per token abridge estimated), it is what the provider's count of
/// the history's last request leaves beside its items at that rate — at most twice the
/// estimate (the record's tools may differ from this request's) — averaged with what
/// the history's records learned before: one turn's rate, off by a tenth, would move it
/// by a tenth of the whole history. Before, never more than the count leaves beside
/// the items as estimated (a server that does not count tools).
fn work_out(turn: &Turn<'_, '_>) -> Beside {
    let withheld = turn.request.and_then(|r| r.withheld());
    let estimated = estimated_beside(turn.body, withheld, turn.messages);
    let as_estimated = Beside {
        tokens: estimated,
        learned: false,
    };
    let Some((loaded, u)) = turn
        .loaded
        .and_then(|l| Some((l, l.usage_for(turn.prefixes)?)))
    else {
        return as_estimated;
    };
    let applied = u.applied.map(|through| {
        loaded
            .all_matching(turn.prefixes)
            .find(|c| c.through == through)
    });
    let applied = match applied {
        Some(None) => return as_estimated,
        Some(Some(c)) => Some(c),
        None => None,
    };
    let n = (u.messages as usize).min(turn.messages.len());
    let rate = learned(u);
    // At the learned rate, with the estimator it was learned with; else as estimated.
    let estimator = match rate {
        Some(_) => Estimator::for_model_ready(turn.model),
        None => Estimator::approx(),
    };
    let forwarded = forwarded_estimate(&estimator, turn.format, &turn.messages[..n], applied)
        + applied.map_or(0, |_| added(turn));
    let Some(rate) = rate else {
        return Beside {
            tokens: estimated.min(u.tokens.saturating_sub(forwarded)),
            learned: false,
        };
    };
    let counted = u
        .tokens
        .saturating_sub(scaled(forwarded, rate))
        .min(estimated.saturating_mul(2));
    let tokens = match u.beside {
        0 => counted,
        before => (before.saturating_mul(3) + counted) / 4,
    };
    Beside {
        tokens,
        learned: true,
    }
}

/// The rate the provider counts this history's appended turns at, per token abridge
/// estimates (see [`super::decide::next_ratio`]), once a record followed an earlier one
/// (`None`: not measured yet).
fn learned(u: &Usage) -> Option<f64> {
    (u.growth > 0).then(|| u.ratio())
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::{Value, json};

    use crate::formats::{Format, Request};

    fn parsed(format: Format, body: &Value) -> Request {
        Request::parse(format, Bytes::from(body.to_string())).unwrap()
    }

    #[test]
    fn a_conversations_opening_is_what_its_requests_all_start_with() {
        let system = "You are a careful coding agent; keep every change small. ".repeat(200);
        let ask = "Fix the failing test in the parser module. ".repeat(20);
        let result = "error[E0308]: mismatched types in src/parse.rs ".repeat(100);
        let tools = json!([{"name": "Bash", "description": "Runs a command. ".repeat(50),
            "input_schema": {"type": "object"}}]);
        let mut messages = vec![json!({"role": "user", "content": ask})];
        let first = json!({"model": "m", "system": system, "tools": tools,
            "max_tokens": 100, "messages": messages});
        let opening = super::opening(&parsed(Format::Messages, &first));
        // The system prompt, the tools and the ask: each some hundreds of tokens.
        let parts = [system.as_str(), &tools.to_string(), &ask]
            .map(crate::tokens::approx_text)
            .iter()
            .sum::<u64>();
        assert!(
            opening >= parts && opening <= parts + 50,
            "{opening} of {parts}"
        );
        // Later requests append rounds: the same opening, within a separator or two.
        for round in 0..5 {
            messages.push(json!({"role": "assistant", "content": [{"type": "tool_use",
                "id": format!("t{round}"), "name": "Bash", "input": {"command": "make"}}]}));
            messages.push(json!({"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": format!("t{round}"), "content": result}]}));
        }
        let later = json!({"model": "m", "system": system, "tools": tools,
            "max_tokens": 100, "messages": messages});
        let again = super::opening(&parsed(Format::Messages, &later));
        assert!(opening.abs_diff(again) <= 10, "{opening} then {again}");

        // On chat, the leading system messages and the first message after them.
        let chat = |messages: &[Value]| {
            let body = json!({"model": "m", "messages": messages});
            super::opening(&parsed(Format::Chat, &body))
        };
        let head = [
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": ask}),
        ];
        let mut longer = head.to_vec();
        longer.push(json!({"role": "assistant", "content": result}));
        longer.push(json!({"role": "user", "content": "And the next one?"}));
        let (short, long) = (chat(&head), chat(&longer));
        assert!(short >= parts - crate::tokens::approx_text(&tools.to_string()));
        assert!(short.abs_diff(long) <= 10, "{short} then {long}");
    }
}
