//! The one validator of plans, used by the tests and at runtime before anything is
//! forwarded: a plan that fails it is not applied. It reads only the original messages
//! and the plan, never the settings, so it also checks what a strategy was told to do.

use std::collections::BTreeMap;

use super::{FRAME, Layout, Origin, Plan, is_result};
use crate::conversation::{Item, Role};
use crate::json::Raw;

/// What is wrong with a plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("the conversation has no user message, so no final turn")]
    NoFinalTurn,
    #[error("the replaced range {head}..={through} is empty or outside the {len} messages")]
    Range {
        head: usize,
        through: usize,
        len: usize,
    },
    #[error("the head ({head} messages) leaves out leading system/developer messages ({sys})")]
    SystemMessages { head: usize, sys: usize },
    #[error(
        "the replaced range ends at message {through}, in the final turn that starts at \
         message {final_turn}, but does not keep each of its messages through there \
         (copied, or a result the model has acted on digested) before its newest exchange"
    )]
    FinalTurn { through: usize, final_turn: usize },
    #[error("the cut before message {index} is not at a turn boundary")]
    Cut { index: usize },
    #[error("{replacement} replacement messages but {origin} origins")]
    Origins { replacement: usize, origin: usize },
    #[error("replacement message {position} is not a message abridge can read: {reason}")]
    Unreadable { position: usize, reason: String },
    #[error(
        "replacement message {position} claims to come from message {index}, outside the \
         replaced range or out of order"
    )]
    OriginOrder { position: usize, index: usize },
    #[error("replacement message {position} is not a byte-identical copy of message {index}")]
    NotVerbatim { position: usize, index: usize },
    #[error("replacement message {position} changes more than the content of tool result {index}")]
    Digest { position: usize, index: usize },
    #[error(
        "replacement message {position} is written by abridge but is not a user or system \
         message starting with the reference-material frame"
    )]
    Unframed { position: usize },
    #[error("the tool call in message {call} and its result in message {result} are separated")]
    ToolPair { call: usize, result: usize },
}

/// Checks `plan` against the conversation it was made for (see the module docs of
/// [`super`] for the rules).
pub fn validate(messages: &[Item<'_>], plan: &Plan) -> Result<(), Violation> {
    let layout = Layout::new(messages).map_err(|_| Violation::NoFinalTurn)?;
    validate_with(&layout, messages, plan)
}

/// [`validate`] with the conversation's layout already worked out (it depends only on
/// `messages`; compaction has it).
pub(crate) fn validate_with(
    layout: &Layout<'_, '_>,
    messages: &[Item<'_>],
    plan: &Plan,
) -> Result<(), Violation> {
    check_edges(layout, messages.len(), plan)?;
    let copied_at = check_copies(messages, plan)?;
    check_final_turn(layout, plan, &copied_at)?;
    check_tool_pairs(layout, messages, plan, &copied_at)
}

/// A range that reaches into the final turn keeps every message of it there, in order
/// (the ask as it came, results the model has acted on perhaps digested: see
/// [`Layout::clearable`]), and ends before the turn's newest exchange.
fn check_final_turn(
    layout: &Layout<'_, '_>,
    plan: &Plan,
    copied_at: &BTreeMap<usize, usize>,
) -> Result<(), Violation> {
    let (through, final_turn) = (plan.through, layout.last_user);
    if through < final_turn {
        return Ok(());
    }
    // What precedes the range is not replaced (a range may start inside the turn).
    let kept = (final_turn.max(plan.head)..=through).all(|k| match copied_at.get(&k) {
        Some(&at) => match plan.origin[at] {
            Origin::Verbatim(_) => true,
            Origin::Digest(_) => layout.clearable(k),
            Origin::Authored => false,
        },
        None => false,
    });
    if kept && through < layout.clear_end {
        return Ok(());
    }
    Err(Violation::FinalTurn {
        through,
        final_turn,
    })
}

/// The range and its edges: the head keeps the system messages, both cuts are at turn
/// boundaries, and every replacement message has its origin.
fn check_edges(layout: &Layout<'_, '_>, n: usize, plan: &Plan) -> Result<(), Violation> {
    let (head, through) = (plan.head, plan.through);
    if head > through || through >= n {
        return Err(Violation::Range {
            head,
            through,
            len: n,
        });
    }
    if head < layout.sys {
        return Err(Violation::SystemMessages {
            head,
            sys: layout.sys,
        });
    }
    for index in [head, through + 1] {
        if !layout.cut_ok[index] {
            return Err(Violation::Cut { index });
        }
    }
    if plan.replacement.len() != plan.origin.len() {
        return Err(Violation::Origins {
            replacement: plan.replacement.len(),
            origin: plan.origin.len(),
        });
    }
    Ok(())
}

/// Copies: in range, in order, faithful; authored messages framed. Returns where each
/// copied message is in the replacement (original index → position).
fn check_copies(messages: &[Item<'_>], plan: &Plan) -> Result<BTreeMap<usize, usize>, Violation> {
    let (head, through, format) = (plan.head, plan.through, plan.format);
    let mut copied_at: BTreeMap<usize, usize> = BTreeMap::new();
    let mut last: Option<usize> = None;
    for (position, (raw, origin)) in plan.replacement.iter().zip(&plan.origin).enumerate() {
        let parsed = format
            .item(Raw::from(&**raw))
            .ok_or_else(|| Violation::Unreadable {
                position,
                reason: "not an item of the conversation's format".to_owned(),
            })?;
        let index = match *origin {
            Origin::Authored => {
                let framed = parsed
                    .content
                    .as_text()
                    .is_some_and(|t| t.starts_with(FRAME));
                let plain = parsed.calls.is_empty() && parsed.results.is_empty();
                if !framed || !plain || !matches!(parsed.role, Role::User | Role::System) {
                    return Err(Violation::Unframed { position });
                }
                continue;
            }
            Origin::Verbatim(index) | Origin::Digest(index) => index,
        };
        if index < head || index > through || last.is_some_and(|l| index <= l) {
            return Err(Violation::OriginOrder { position, index });
        }
        last = Some(index);
        let original = &messages[index];
        match *origin {
            Origin::Verbatim(_) if raw.get() != original.raw.get() => {
                return Err(Violation::NotVerbatim { position, index });
            }
            Origin::Digest(_)
                if !is_result(original)
                    || !format.is_digest_of(Raw::from(&**raw), original.raw) =>
            {
                return Err(Violation::Digest { position, index });
            }
            _ => {}
        }
        copied_at.insert(index, position);
    }
    Ok(copied_at)
}

/// Tool calls and results: a pair inside the replaced range is copied whole or not at
/// all, and a copied result follows the copy of the message it followed.
fn check_tool_pairs(
    layout: &Layout<'_, '_>,
    messages: &[Item<'_>],
    plan: &Plan,
    copied_at: &BTreeMap<usize, usize>,
) -> Result<(), Violation> {
    let (head, through) = (plan.head, plan.through);
    for &(call, result) in &layout.pairs {
        if call < head || result > through {
            continue;
        }
        if copied_at.contains_key(&call) != copied_at.contains_key(&result) {
            return Err(Violation::ToolPair { call, result });
        }
    }
    for (&index, &position) in copied_at {
        if is_result(&messages[index]) {
            let follows =
                index > 0 && position > 0 && copied_at.get(&(index - 1)) == Some(&(position - 1));
            if !follows {
                let call = layout.call_of[index].map_or(index.saturating_sub(1), |(a, _)| a);
                return Err(Violation::ToolPair {
                    call,
                    result: index,
                });
            }
        }
    }
    Ok(())
}
