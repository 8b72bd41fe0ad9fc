//! `compaction` blocks on the Messages route: the one a later request sends back,
//! expanded as Anthropic's API does (everything before the latest block dropped, the
//! block replaced by a message carrying its summary: abridge's own, opened from its
//! sealed `encrypted_content`; another's read from its plain `content`), and the one
//! `compact_20260112` makes over its trigger — a summary of the whole conversation in
//! the block (what the block replaces when it is sent back), and a summary of all but
//! the newest turn forwarded now, followed by that turn (the model's summary, when the
//! strategy summarises, is the whole conversation's in both places).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::Entry;
use super::clear::asks;
use crate::conversation::Item;
use crate::formats::Format;
use crate::identity::IdentityKey;
use crate::provider_apis::compacted::{expansion, summary_of};
use crate::provider_apis::sealed::{self, Summary};
use crate::recall::Archive;
use crate::strategies::SummaryRole;

/// Characters of another's compaction block's summary forwarded.
const FOREIGN_CHARS: usize = 64_000;

/// The note when a block abridge did not make was read as plain text.
const PLAIN: &str = "a compaction block abridge did not make (another provider's, or altered) was read as plain text";
/// The note when a block with nothing readable was dropped.
const EMPTY: &str = "a compaction block with no readable summary was dropped";

/// What the latest compaction block sent back carried.
#[derive(Default)]
pub(super) struct Opened {
    /// Its summary, for the next compaction to carry on from.
    pub prior: Option<Summary>,
    pub note: Option<&'static str>,
}

fn is_compaction(block: &Value) -> bool {
    block["type"] == "compaction"
}

/// `entries` from the latest compaction block on: the messages before it, and the
/// blocks before it in its own message, dropped; the block replaced by a message that
/// carries its summary.
pub(super) fn expand(
    key: Option<&IdentityKey>,
    entries: &mut Vec<Entry<'_>>,
    role: SummaryRole,
) -> Opened {
    let latest = entries.iter().enumerate().rev().find_map(|(m, e)| {
        let blocks = e.value["content"].as_array()?;
        Some((m, blocks.iter().rposition(is_compaction)?))
    });
    let Some((m, b)) = latest else {
        return Opened::default();
    };
    let block = entries[m].value["content"][b].clone();
    let sealed = block["encrypted_content"].as_str();
    let opened = key
        .zip(sealed)
        .and_then(|(key, token)| sealed::open(key, token));
    let (text, prior, note) = match (opened, block["content"].as_str()) {
        (Some(summary), _) => (Some(expansion(&summary)), Some(summary), None),
        (None, Some(plain)) if !plain.trim().is_empty() => {
            let plain: String = plain.chars().take(FOREIGN_CHARS).collect();
            let text = format!("Summary of the earlier conversation:\n{plain}");
            let prior = Summary {
                summary: plain,
                items: 0,
                created_at: 0,
                archive: None,
            };
            (Some(text), Some(prior), Some(PLAIN))
        }
        _ => (None, None, Some(EMPTY)),
    };
    let mut rest: Vec<Entry<'_>> = entries.drain(m..).collect();
    entries.clear();
    if let Some(summary) = text.and_then(|t| message(&t, role)) {
        entries.push(summary);
    }
    let first = &mut rest[0];
    if let Some(blocks) = first.value["content"].as_array_mut() {
        blocks.drain(..=b);
    }
    first.changed = true;
    let empty = first.value["content"].as_array().is_some_and(Vec::is_empty);
    entries.extend(rest.into_iter().skip(usize::from(empty)));
    Opened { prior, note }
}

/// The message abridge writes for a summary `text`.
fn message(text: &str, role: SummaryRole) -> Option<Entry<'static>> {
    Entry::authored(&crate::strategies::authored(Format::Messages, role, text))
}

/// Where the newest turn starts in `entries` (the last user message that asks, and what
/// follows it; when that ask opens the conversation — one task and its long tool loop —
/// the last assistant message and what follows it, so a tool call keeps its result):
/// `None` when nothing the request sent comes before it, so there is nothing to
/// summarise.
pub(super) fn newest(entries: &[Entry<'_>]) -> Option<usize> {
    let read = |e: &Entry<'_>| e.from.is_some();
    let after_some = |n: &usize| entries[..*n].iter().any(read);
    entries
        .iter()
        .rposition(|e| read(e) && asks(&e.value))
        .filter(after_some)
        .or_else(|| {
            let answer = |e: &Entry<'_>| read(e) && e.value["role"] == "assistant";
            entries.iter().rposition(answer).filter(after_some)
        })
}

/// The request's messages (as it sent them) behind `entries`.
pub(super) fn sent<'a>(items: &[Item<'a>], entries: &[Entry<'_>]) -> Vec<Item<'a>> {
    entries
        .iter()
        .filter_map(|e| e.from.and_then(|k| items.get(k)).cloned())
        .collect()
}

/// What a compaction is made of: its summary written by a model (`said`, bounded by the
/// caller; redacted here), else the digest headed by the client's `instructions`.
pub(super) struct Made<'s> {
    pub instructions: Option<&'s str>,
    pub said: Option<&'s str>,
    pub role: SummaryRole,
}

/// `compact_20260112` over its trigger, the newest turn starting at `newest`
/// ([`newest`]): `entries` become a summary of what precedes that turn (the model's
/// summary of the whole conversation when it said one) and that turn; the `compaction`
/// block for the answer, its summary the whole conversation's and its archive what the
/// block replaces (after the archive of the block it carries on from: `entries` no
/// longer hold what that one replaced); and what this request recalls from, the same
/// but for the newest turn, which it still forwards (a recall does not read it back
/// twice). `None` (and `entries` untouched) when there is nothing before the newest
/// turn to summarise.
pub(super) fn make(
    key: Option<&IdentityKey>,
    items: &[Item<'_>],
    (entries, prior, newest): (&mut Vec<Entry<'_>>, Option<&Summary>, usize),
    made: &Made<'_>,
) -> Option<(Value, Option<Archive>)> {
    let before = sent(items, &entries[..newest]);
    if before.is_empty() {
        return None;
    }
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let replaced = sent(items, entries);
    let (now, mut whole) = match made.said {
        Some(said) => {
            let whole = Summary {
                summary: crate::strategies::redact::redact(said).into_owned(),
                items: replaced.len() as u64 + prior.map_or(0, |p| p.items),
                created_at,
                archive: None,
            };
            (whole.clone(), whole)
        }
        None => (
            summary_of(&before, prior, made.instructions, created_at),
            summary_of(&replaced, prior, made.instructions, created_at),
        ),
    };
    let earlier = prior.and_then(Summary::archive);
    whole.archive = Archive::of(earlier.as_ref(), &replaced).map(|a| a.encoded().to_owned());
    let archive = Archive::of(earlier.as_ref(), &before);
    let summary = message(&expansion(&now), made.role)?;
    let kept: Vec<Entry<'_>> = entries.drain(newest..).collect();
    entries.clear();
    entries.push(summary);
    entries.extend(kept);
    let sealed = key.map(|key| sealed::seal(key, &whole));
    let block =
        json!({"type": "compaction", "content": whole.summary, "encrypted_content": sealed});
    Some((block, archive))
}
