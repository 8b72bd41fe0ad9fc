//! `recency`, the default: the protected head verbatim, the middle elided with one
//! marker, and the end kept newest first up to the budget: the latest observations whole,
//! older bulky tool results in the kept part reduced to a one-line digest. No LLM, so it
//! cannot fail, and the marker is tiny, so it fits whenever anything fits: it is also
//! what the other strategies fall back to.
//!
//! Why it is the default: masking old tool observations matched LLM summaries on
//! SWE-bench at half the cost (JetBrains, "The Complexity Trap"), and it keeps the most
//! recent work word for word.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::value::RawValue;

use super::index;
use super::text::{first_line, thousands, truncate_chars};
use super::{Ctx, Edges, Fallback, Origin, Plan, Strategy, Tail, authored, is_result};
use crate::conversation::{Item, Role, ToolCall};
use crate::json::Raw;

/// The marker's text for `elided` messages starting at history index `first`, of which
/// `users` user messages, `assistants` assistant messages and `results` tool results.
/// The span is named by the ids recall knows (`m3–m40`, see [`span_ids`]).
pub(super) fn marker_text(
    (first, elided): (usize, usize),
    users: usize,
    assistants: usize,
    results: usize,
) -> String {
    format!(
        "{} earlier messages ({}: {} user, {} assistant, {} tool results) were elided to fit \
         the context window. The conversation continues below; respond to its latest user \
         message.",
        thousands(elided),
        span_ids(first, elided),
        thousands(users),
        thousands(assistants),
        thousands(results),
    )
}

/// The ids of `len` messages from history index `first`: `m3–m40` (1-based, as
/// `abridge_recall` names them).
pub(super) fn span_ids(first: usize, len: usize) -> String {
    match len {
        0 | 1 => format!("m{}", first + 1),
        _ => format!("m{}–m{}", first + 1, first + len),
    }
}

pub(super) fn plan(
    ctx: &Ctx<'_, '_>,
    requested: Strategy,
    fallback: Option<Fallback>,
) -> Result<Plan, super::CannotCompact> {
    let wanted = index_budget(ctx);
    let (mut plan, used) = attempt(ctx, requested, wanted);
    // An index much smaller than its share leaves room a longer kept end can use: once
    // more with the share it needed (the elided part, and its index, can only shrink).
    let needed = used + used / 4 + 16;
    if needed < wanted {
        plan = attempt(ctx, requested, needed).0;
    }
    plan.fallback = fallback;
    Ok(plan)
}

/// The plan with an index of about `index_budget` tokens, and the tokens its index
/// took (0: the marker only counts).
fn attempt(ctx: &Ctx<'_, '_>, requested: Strategy, index_budget: u64) -> (Plan, u64) {
    let messages = ctx.messages();
    let t_min = ctx.t_min();
    // What the agent saw last stays whole; only older bulky tool results are digested,
    // and the kept end fills the budget newest first.
    let reserve = ctx.marker_reserve() + index_budget;
    // Past the final turn's ask only when the final turn does not fit whole: then its
    // older results, which the model has acted on, are digested too (the ask, every
    // call and the newest exchange stay as they came).
    let whole = ctx.newest_whole(reserve);
    let digested = |k: usize| k < whole && (k < t_min || ctx.layout.clearable(k));
    let cost_kept = |k: usize| match digested(k).then(|| ctx.digest_cost(k)).flatten() {
        Some(tokens) => tokens,
        None => ctx.cost(k..k + 1),
    };
    let keep_from = whole.min(t_min);
    let Edges { head, start } = ctx.edges(reserve, Tail::Filled { keep_from }, &cost_kept);

    // Digests in the kept part before the whole part; the replacement runs through the
    // end of the last digested tool exchange.
    let last = (start..whole)
        .rev()
        .find(|&k| digested(k) && ctx.digest_cost(k).is_some());
    let through = last.map_or(start - 1, |last| ctx.exchange_end(last));

    let elided = &messages[head..start];
    let count = |role: Role| elided.iter().filter(|m| m.role == role).count();
    let counts = marker_text(
        (head, elided.len()),
        count(Role::User),
        count(Role::Assistant),
        elided.iter().filter(|m| is_result(m)).count(),
    );
    let tokens = |text: &str| ctx.estimator().text(text);
    let indexed = |budget: u64| {
        index::index((head, elided), budget, &tokens).map(|index| format!("{counts}\n{index}"))
    };
    let kept = copies(ctx, start..=through, digested);
    // The index is estimated cheaply while it is built; should the plan's own estimate
    // find it over the budget, the marker that only counts always fits.
    let build = |marker: &str| {
        let mut replacement = Vec::with_capacity(kept.len() + 1);
        replacement.push((
            authored(ctx.input.format, ctx.settings.summary_role, marker),
            Origin::Authored,
        ));
        replacement.extend(kept.iter().cloned());
        ctx.plan(
            requested,
            Strategy::Recency,
            (head, through),
            replacement,
            None,
        )
    };
    // Should the plan's own estimate find the index over the budget, a smaller one; the
    // marker that only counts always fits.
    let fits = |plan: &Plan| plan.tokens_after <= ctx.input.budget;
    let used = |marker: &str| tokens(marker).saturating_sub(tokens(&counts));
    for share in [index_budget, index_budget / 2] {
        if let Some(marker) = indexed(share) {
            let plan = build(&marker);
            if fits(&plan) {
                return (plan, used(&marker));
            }
        }
    }
    (build(&counts), 0)
}

/// The index's share: `index_budget_ratio` of the budget at least, more when much is
/// elided — an eighth of what must go (the conversation over the budget), up to half
/// the budget — so a large elided middle keeps its identifiers (0 when the ratio is 0:
/// a marker that only counts).
fn index_budget(ctx: &Ctx<'_, '_>) -> u64 {
    let budget = ctx.input.budget;
    let floor = ctx.settings.index_budget(budget);
    if floor == 0 {
        return 0;
    }
    let elided = ctx.rough_total().saturating_sub(budget);
    let room = budget.saturating_sub(ctx.minimal());
    floor.max((elided / 8).min(budget / 2)).min(room)
}

/// `messages[range]` as a replacement carries them: each one `digested` says, and
/// [`digest`] can, as its digest (made once per compaction, see `Ctx::digested`), the
/// others copied as they came.
pub(super) fn copies(
    ctx: &Ctx<'_, '_>,
    range: std::ops::RangeInclusive<usize>,
    digested: impl Fn(usize) -> bool,
) -> Vec<(Box<RawValue>, Origin)> {
    let messages = &ctx.messages()[range.clone()];
    range
        .zip(messages)
        .map(
            |(k, message)| match digested(k).then(|| ctx.digested(k)).flatten() {
                Some((raw, _)) => (raw.clone(), Origin::Digest(k)),
                None => (copy(message), Origin::Verbatim(k)),
            },
        )
        .collect()
}

/// A byte-identical copy of a message. (A message is valid JSON; were it not, the copy
/// would be `null`, which the plan's validation refuses as unreadable.)
fn copy(m: &Item<'_>) -> Box<RawValue> {
    m.raw
        .to_boxed()
        .unwrap_or_else(|| RawValue::NULL.to_owned())
}

/// For a tool result longer than `tool_prune_chars`: the message with its output (each
/// output longer than that, for a Messages result of several calls) replaced by a
/// one-line digest, and that message's tokens.
pub(super) fn digest(ctx: &Ctx<'_, '_>, k: usize) -> Option<(Box<RawValue>, u64)> {
    let m = &ctx.messages()[k];
    if !is_result(m) {
        return None;
    }
    let limit = ctx.settings.tool_prune_chars;
    // Cheap test first: the item's bytes are at least as many as its text's characters.
    if m.raw.get().len() <= limit {
        return None;
    }
    let line = |id: Option<&str>, text: &str| {
        let chars = text.chars().count();
        (chars > limit).then(|| digest_line((k, m), ctx.layout.call_answered(k, id), text, chars))
    };
    let raw = ctx.input.format.digest(m, line)?;
    let tokens = ctx
        .input
        .format
        .item(Raw::from(&*raw))
        .map(|d| ctx.estimator().message(&d))?;
    Some((raw, tokens))
}

/// The digest of `text`, `chars` characters long, an output of message `k`, `m`: of
/// `call` (or of the function `m` names). What was called on what, how much it
/// returned, the id recall reads it back by (`m12`, as [`span_ids`] names messages), its
/// exit status and first line, redacted (the digest is stored).
fn digest_line(
    (k, m): (usize, &Item<'_>),
    call: Option<&ToolCall<'_>>,
    text: &str,
    chars: usize,
) -> String {
    let name = match (call, &m.name) {
        (Some(c), _) => c.name.to_string(),
        (None, Some(n)) => n.to_string(),
        (None, None) => "tool".to_owned(),
    };
    let argument = call
        .and_then(|c| key_argument(&c.arguments))
        .map(|(key, value)| format!("{key}={}", quoted(&value)))
        .unwrap_or_default();
    let mut line = format!(
        "[abridge: tool output elided] {name}({argument}) returned {} characters in {} lines \
         ({})",
        thousands(chars),
        thousands(text.lines().count()),
        span_ids(k, 1),
    );
    if let Some(status) = exit_status(text) {
        line.push_str(&format!(", exit status {status}"));
    }
    let first = first_line(text, 160);
    if !first.is_empty() {
        line.push_str(&format!("; first line: {}", quoted(&first)));
    }
    // The first line of a tool's output can hold a secret.
    super::redact::redact(&line).into_owned()
}

/// The argument that says most about a call: a path, command, query or URL, else the
/// first string argument (arguments are read in their own order).
pub(super) fn key_argument(arguments: &str) -> Option<(String, String)> {
    const KEYS: &[&str] = &[
        "path",
        "file_path",
        "filepath",
        "file",
        "filename",
        "command",
        "cmd",
        "query",
        "url",
        "pattern",
        "name",
        "id",
    ];
    let value: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let object = value.as_object()?;
    let string = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(items) => Some(
            items
                .iter()
                .filter_map(|i| i.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    };
    KEYS.iter()
        .find_map(|k| {
            object
                .get(*k)
                .and_then(string)
                .map(|v| ((*k).to_owned(), v))
        })
        .or_else(|| {
            object
                .iter()
                .find_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
        })
}

/// `"value"` on one line, at most 80 characters.
pub(super) fn quoted(value: &str) -> String {
    let one_line: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("\"{}\"", truncate_chars(one_line.trim(), 80))
}

/// An exit status reported near the end of a tool's output (`exit code: 1`,
/// `exited with 2`, `"exit_code": 0`, `Process exited with code 137`).
pub(super) fn exit_status(text: &str) -> Option<String> {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    let re = &P.get_or_init(|| {
        super::text::compile(&[
            r#"(?i)\bexit(?:ed)?(?:[ _-]?(?:code|status))?["']?\s*(?:with(?: code)?\s*)?[:=]?\s*(-?[0-9]{1,3})\b"#,
        ])
    })[0];
    let tail_start = text.char_indices().rev().nth(600).map_or(0, |(i, _)| i);
    re.captures_iter(&text[tail_start..])
        .last()
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_arguments_and_exit_status() {
        assert_eq!(
            key_argument(r#"{"timeout":5,"command":"cargo test"}"#),
            Some(("command".to_owned(), "cargo test".to_owned()))
        );
        assert_eq!(
            key_argument(r#"{"b":"x","a":"y"}"#),
            Some(("a".to_owned(), "y".to_owned()))
        );
        assert_eq!(key_argument("not json"), None);
        assert_eq!(exit_status("...\nexit code: 1\n").as_deref(), Some("1"));
        assert_eq!(exit_status(r#"{"exit_code": 0}"#).as_deref(), Some("0"));
        assert_eq!(
            exit_status("Process exited with code 137").as_deref(),
            Some("137")
        );
        assert_eq!(exit_status("all good"), None);
        assert_eq!(quoted("a\nb"), "\"a b\"");
    }
}
