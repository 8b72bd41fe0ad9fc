//! Responses `context_management` (`[{"type": "compaction", "compact_threshold": N}]`,
//! OpenAI's server-side compaction) for an upstream that lacks it. The field is not
//! forwarded. Over N tokens (abridge's estimate of the request as it would go on) the
//! input is compacted as `/responses/compact` compacts it: the forwarded input is the
//! instructions and the newest user messages (within a budget) before the current turn,
//! the summary expanded as a later request's `compaction` item is, then the current turn
//! (from its last user message on) verbatim; the answer's `output` starts with the
//! `compaction` item ([`super::first`]), which the client sends back next turn. Under N,
//! or without a `compact_threshold`, the request goes on without the field. Weighed once,
//! before any summary is asked ([`weigh`]): a model is asked for a summary only when the
//! compaction is made.

use bytes::Bytes;
use serde::Deserialize;

use super::compacted::{self, Kind};
use super::first::First;
use super::sealed::Summary;
use super::{Made, Outcome};
use crate::conversation::Item;
use crate::error::Error;
use crate::formats::responses::{self, Parsed};
use crate::formats::splice::{self, Edit};
use crate::json::Raw;
use crate::recall::Archive;
use crate::strategies::SummaryRole;

/// The note when abridge compacted over the client's `compact_threshold`.
const COMPACTED: &str = "context_management: over compact_threshold by abridge's estimate, compacted by abridge (its compaction item first in output; not forwarded)";

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(borrow, rename = "type")]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default)]
    compact_threshold: Option<u64>,
}

/// What a request's `context_management` asks of abridge: `None` when it has none,
/// else the threshold of its `compaction` entry (if it has one); an invalid field is
/// refused as OpenAI refuses it.
pub(super) fn asked(parsed: &Parsed<'_>) -> Result<Option<Option<u64>>, Error> {
    let Some(raw) = parsed
        .fields
        .context_management
        .filter(|v| v.get() != "null")
    else {
        return Ok(None);
    };
    let entries: Vec<Entry<'_>> =
        serde_json::from_str(raw.get()).map_err(|_| Error::InvalidValue {
            message: "context_management must be an array of {\"type\": \"compaction\", \"compact_threshold\": <integer>}",
            param: "context_management",
        })?;
    Ok(Some(
        entries
            .iter()
            .filter(|e| e.kind == "compaction")
            .find_map(|e| e.compact_threshold),
    ))
}

/// The request as it goes on: `forwarded` as its input, `context_management` removed
/// (the key, its value and one comma).
fn body(body: &Bytes, parsed: &Parsed<'_>, forwarded: &[Raw<'_>]) -> Option<Bytes> {
    let value = parsed.fields.context_management?;
    let removal = removal(body, splice::span_of(body, value.get())?)?;
    let mut edits = vec![removal];
    edits.extend(responses::input_edit(body, parsed, forwarded));
    splice::apply(body, edits)
}

/// The edit that removes the member whose value lies at `value`: from its key through
/// the comma after it, or from the comma before it when it is the last member.
fn removal(body: &[u8], value: std::ops::Range<usize>) -> Option<Edit> {
    const KEY: &[u8] = b"\"context_management\"";
    let blank = |b: &u8| b.is_ascii_whitespace();
    let mut start = value.start
        - body[..value.start]
            .iter()
            .rev()
            .take_while(|b| blank(b))
            .count();
    (start > 0 && body[start - 1] == b':').then_some(())?;
    start -= 1;
    start -= body[..start].iter().rev().take_while(|b| blank(b)).count();
    start = start
        .checked_sub(KEY.len())
        .filter(|&s| &body[s..s + KEY.len()] == KEY)?;
    let after = value.end + body[value.end..].iter().take_while(|b| blank(b)).count();
    let span = if body.get(after) == Some(&b',') {
        let next = after + 1;
        start..next + body[next..].iter().take_while(|b| blank(b)).count()
    } else {
        let before = start - body[..start].iter().rev().take_while(|b| blank(b)).count();
        match before > 0 && body[before - 1] == b',' {
            true => before - 1..value.end,
            false => start..value.end,
        }
    };
    Some(Edit {
        span,
        bytes: Vec::new(),
    })
}

/// What a request's `context_management` comes to, weighed once: its compaction items
/// expanded and the field dropped, is it over the threshold?
pub(super) enum Weighed {
    /// Not over it (or there is none): goes on as this body, with what the item it
    /// expanded replaced (for recall).
    Under(Bytes, Option<Archive>),
    /// Over it: compacted ([`compacted`]).
    Over,
}

/// A request with `context_management` (and no compaction trigger) weighed: `None` when
/// the body could not be rewritten (then it goes on as sent, field and all).
pub(super) fn weigh(
    (body_in, parsed): (&Bytes, &Parsed<'_>),
    (kinds, opened): (&[Kind<'_>], &[Option<Summary>]),
    threshold: Option<u64>,
    role: SummaryRole,
) -> Option<Weighed> {
    let expanded = compacted::expand(&parsed.items, kinds, opened, role);
    let plain = body(body_in, parsed, &expanded.forwarded())?;
    let estimate = crate::tokens::approx_text(&String::from_utf8_lossy(&plain));
    Some(match threshold.is_some_and(|t| estimate > t) {
        true => Weighed::Over,
        false => Weighed::Under(plain, expanded.archive),
    })
}

/// A request [`Weighed::Over`] its threshold, compacted with `made`: `None` when the
/// body could not be rewritten.
///
/// What this request recalls from is what the item replaces but for the current turn,
/// which goes on as sent (a recall does not read it back twice); the item itself carries
/// all of it, for the requests after.
pub(super) fn compacted(
    (body_in, parsed): (&Bytes, &Parsed<'_>),
    (kinds, opened): (&[Kind<'_>], &[Option<Summary>]),
    (made, role): (Made, SummaryRole),
    note: Option<&'static str>,
) -> Option<Outcome> {
    let turn = current_turn(&parsed.items, kinds);
    let forwarded = compacted_input(&parsed.items, (kinds, turn), &made, role);
    let compacted = body(body_in, parsed, &forwarded.forwarded())?;
    let archive = match opened.iter().rposition(Option::is_some) {
        Some(latest) if latest >= turn => made.summary.archive(),
        _ => compacted::archive(&parsed.items[..turn], &kinds[..turn], &opened[..turn])
            .map(|encoded| Archive::new(&encoded)),
    };
    let first = First::new(made.item);
    Some(Outcome::Compacted(
        compacted,
        note.or(Some(COMPACTED)),
        first,
        archive,
    ))
}

/// Where the current turn starts: its last user message that asks (the input's end when
/// there is none).
fn current_turn(items: &[Item<'_>], kinds: &[Kind<'_>]) -> usize {
    items
        .iter()
        .zip(kinds)
        .rposition(|(i, k)| *k == Kind::Plain && i.is_ask() && i.extra.is_none())
        .unwrap_or(items.len())
}

/// The compacted input: the instructions and the newest user messages before the current
/// turn, the summary, then the current turn (its last user message on) as sent.
fn compacted_input<'a>(
    items: &[Item<'a>],
    (kinds, turn): (&[Kind<'_>], usize),
    made: &Made,
    role: SummaryRole,
) -> compacted::Expanded<'a> {
    let (before, kinds_before) = (&items[..turn], &kinds[..turn]);
    let users = compacted::kept_users(before, kinds_before, compacted::KEPT_USER_TOKENS);
    let mut kept: Vec<Raw<'a>> = before
        .iter()
        .zip(kinds_before)
        .filter(|(i, k)| {
            **k == Kind::Plain
                && i.extra.is_none()
                && i.results.is_empty()
                && (i.is_instruction() || users.iter().any(|u| std::ptr::eq(u.get(), i.raw.get())))
        })
        .map(|(i, _)| i.raw)
        .collect();
    let at = kept.len();
    kept.extend(
        items[turn..]
            .iter()
            .zip(&kinds[turn..])
            .filter(|(_, k)| !matches!(k, Kind::Compaction(_) | Kind::Trigger))
            .map(|(i, _)| i.raw),
    );
    compacted::Expanded {
        items: kept,
        summary: Some(compacted::summary_message(&made.summary, role)),
        at,
        archive: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removed(body: &str) -> String {
        let parsed = responses::parse(body.as_bytes()).unwrap();
        let value = parsed.fields.context_management.unwrap();
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let span = splice::span_of(body.as_bytes(), value.get()).unwrap();
        let edit = removal(&bytes, span).unwrap();
        String::from_utf8(splice::apply(&bytes, vec![edit]).unwrap().to_vec()).unwrap()
    }

    #[test]
    fn the_member_goes_with_one_comma_wherever_it_stands() {
        let cm = r#"[{"type": "compaction", "compact_threshold": 1000}]"#;
        for (body, want) in [
            (
                format!(r#"{{"model":"m","context_management":{cm},"input":[]}}"#),
                r#"{"model":"m","input":[]}"#,
            ),
            (
                format!(r#"{{"model":"m", "context_management" : {cm} }}"#),
                r#"{"model":"m" }"#,
            ),
            (
                format!(r#"{{"context_management":{cm},"input":[]}}"#),
                r#"{"input":[]}"#,
            ),
            (format!(r#"{{"context_management":{cm}}}"#), r#"{}"#),
        ] {
            let out = removed(&body);
            assert_eq!(out, want);
            serde_json::from_str::<serde_json::Value>(&out).unwrap();
        }
    }
}
