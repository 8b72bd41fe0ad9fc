//! What abridge makes of a Responses input when it serves a compaction: which items are
//! the API's own (`compaction` items, the `compaction_trigger`, request-scoped items),
//! the summary of the rest (the `deterministic` strategy's digest of the whole history,
//! after what earlier compaction items carried), the user messages a compaction keeps,
//! and the expansion of a compaction item into its summary before a request goes on.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::sealed::{self, Summary};
use crate::conversation::{Item, Role};
use crate::formats::Format;
use crate::identity::IdentityKey;
use crate::json::Raw;
use crate::recall::Archive;
use crate::strategies::SummaryRole;
use crate::tokens::Estimator;

/// Tokens the digest's index of the summarised items may take.
const INDEX_TOKENS: u64 = 2000;
/// Characters of an earlier compaction's summary carried into the next one.
const PRIOR_CHARS: usize = 16_000;
/// Characters of a client's summary instructions a summary records.
const INSTRUCTIONS_CHARS: usize = 4_000;
/// Tokens of user messages `/responses/compact` keeps beside its item, newest first.
pub(super) const KEPT_USER_TOKENS: u64 = 20_000;

/// What an input item is to the compaction APIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind<'a> {
    /// Part of the conversation.
    Plain,
    /// A `compaction` item, with its `encrypted_content`.
    Compaction(Option<Cow<'a, str>>),
    /// `compaction_trigger` (Codex's remote compaction v2).
    Trigger,
    /// Belongs to one request only (`additional_tools`, `item_reference`): not summarised.
    Scoped,
}

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    encrypted_content: Option<Cow<'a, str>>,
}

/// The kind of each item (only items the format did not model are read again).
pub(super) fn kinds<'a>(items: &[Item<'a>]) -> Vec<Kind<'a>> {
    items
        .iter()
        .map(|item| {
            let Some(extra) = item.extra else {
                return Kind::Plain;
            };
            let Ok(typed) = serde_json::from_str::<Typed<'a>>(extra.get()) else {
                return Kind::Plain;
            };
            match typed.kind.as_deref() {
                Some("compaction") => Kind::Compaction(typed.encrypted_content),
                Some("compaction_trigger") => Kind::Trigger,
                Some("additional_tools" | "item_reference") => Kind::Scoped,
                _ => Kind::Plain,
            }
        })
        .collect()
}

/// What each compaction item carries, when abridge made it (`None` elsewhere).
pub(super) fn opened(key: &IdentityKey, kinds: &[Kind<'_>]) -> Vec<Option<Summary>> {
    kinds
        .iter()
        .map(|k| match k {
            Kind::Compaction(Some(token)) => sealed::open(key, token),
            _ => None,
        })
        .collect()
}

/// Whether some compaction item is not abridge's (forged, altered, another provider's).
pub(super) fn any_foreign(kinds: &[Kind<'_>], opened: &[Option<Summary>]) -> bool {
    kinds
        .iter()
        .zip(opened)
        .any(|(k, o)| matches!(k, Kind::Compaction(_)) && o.is_none())
}

/// What a compaction of this input replaces, archived for recall (see
/// [`crate::recall::archive`]): after the archive of the latest earlier compaction
/// abridge made, the plain items that follow that item — those before it are what it
/// replaced, archived already, and not twice when the client still sends them (an
/// earlier item without an archive, made before archives were: every plain item).
pub(super) fn archive(
    items: &[Item<'_>],
    kinds: &[Kind<'_>],
    opened: &[Option<Summary>],
) -> Option<String> {
    let latest = opened.iter().rposition(Option::is_some);
    let prior = latest
        .and_then(|l| opened[l].as_ref())
        .and_then(Summary::archive);
    let from = match (&prior, latest) {
        (Some(_), Some(l)) => l + 1,
        _ => 0,
    };
    let replaced: Vec<Item<'_>> = items
        .iter()
        .zip(kinds)
        .skip(from)
        .filter(|(_, k)| **k == Kind::Plain)
        .map(|(i, _)| i.clone())
        .collect();
    Archive::of(prior.as_ref(), &replaced).map(|a| a.encoded().to_owned())
}

/// Where the items a compaction made now summarises start: after the latest earlier
/// compaction item abridge made (what precedes it — the user messages a client keeps
/// beside the item, or the whole history it still sends — that item's summary covers,
/// and is not counted or summarised twice), else at the first item.
pub(super) fn since_prior(opened: &[Option<Summary>]) -> usize {
    opened
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |l| l + 1)
}

/// The conversation items a compaction made now summarises anew (compaction items, the
/// trigger and request-scoped items left out; see [`since_prior`]), with their kinds'
/// order kept.
pub(super) fn summarised<'i, 'a>(
    items: &'i [Item<'a>],
    kinds: &'i [Kind<'_>],
    opened: &[Option<Summary>],
) -> impl DoubleEndedIterator<Item = &'i Item<'a>> {
    items
        .iter()
        .zip(kinds)
        .skip(since_prior(opened))
        .filter(|(_, k)| **k == Kind::Plain)
        .map(|(i, _)| i)
}

/// The summary of `items`: the latest earlier compaction's, then a digest of the
/// conversation items since ([`summarised`]).
pub(super) fn summarise(
    items: &[Item<'_>],
    kinds: &[Kind<'_>],
    opened: &[Option<Summary>],
    created_at: u64,
) -> Summary {
    let summarised: Vec<Item<'_>> = summarised(items, kinds, opened).cloned().collect();
    let prior = opened.iter().rev().flatten().next();
    summary_of(&summarised, prior, None, created_at)
}

/// A summary a model wrote for `kinds`' compaction, as the item carries it: redacted,
/// covering what [`summarise`]'s digest would (the plain items since the latest earlier
/// compaction, and what that one covered).
pub(super) fn said(
    text: &str,
    kinds: &[Kind<'_>],
    opened: &[Option<Summary>],
    created_at: u64,
) -> Summary {
    let since = kinds.iter().skip(since_prior(opened));
    let plain = since.filter(|k| **k == Kind::Plain).count() as u64;
    let prior = opened.iter().rev().flatten().next();
    Summary {
        summary: crate::strategies::redact::redact(text).into_owned(),
        items: plain + prior.map_or(0, |p| p.items),
        created_at,
        archive: None,
    }
}

/// The summary a compaction carries, whichever provider's API asked for it (the one
/// summariser both wings use): `prior`'s summary (an earlier compaction's, bounded),
/// then a digest of `summarised`; `instructions` (the client's, bounded) are what the
/// summary was asked to keep, recorded at its head. Bounded, and redacted.
pub(super) fn summary_of(
    summarised: &[Item<'_>],
    prior: Option<&Summary>,
    instructions: Option<&str>,
    created_at: u64,
) -> Summary {
    let digest = crate::strategies::digest(summarised, INDEX_TOKENS, &Estimator::approx());
    let mut summary = match prior {
        Some(prior) => {
            let earlier: String = prior.summary.chars().take(PRIOR_CHARS).collect();
            format!("Earlier, as compacted before:\n{earlier}\n\nSince then:\n{digest}")
        }
        None => digest,
    };
    if let Some(asked) = instructions.filter(|i| !i.trim().is_empty()) {
        let asked: String = asked.chars().take(INSTRUCTIONS_CHARS).collect();
        summary = format!("Asked of this summary: {asked}\n\n{summary}");
    }
    Summary {
        summary: crate::strategies::redact::redact(&summary).into_owned(),
        items: summarised.len() as u64 + prior.map_or(0, |p| p.items),
        created_at,
        archive: None,
    }
}

/// The text a summary is expanded into before a request goes on.
pub(super) fn expansion(summary: &Summary) -> String {
    format!(
        "Summary of the earlier conversation ({} items), compacted by abridge:\n{}",
        summary.items, summary.summary
    )
}

/// The user messages a compaction keeps: the newest first within `budget` tokens,
/// returned in their order.
pub(super) fn kept_users<'a>(items: &[Item<'a>], kinds: &[Kind<'_>], budget: u64) -> Vec<Raw<'a>> {
    let estimator = Estimator::approx();
    let mut left = budget;
    let mut kept: Vec<Raw<'a>> = Vec::new();
    for (item, _) in items
        .iter()
        .zip(kinds)
        .rev()
        .filter(|(i, k)| **k == Kind::Plain && i.is_ask() && i.extra.is_none())
    {
        let Some(rest) = left.checked_sub(estimator.message(item)) else {
            break;
        };
        left = rest;
        kept.push(item.raw);
    }
    kept.reverse();
    kept
}

/// A request's input with its compaction items expanded.
pub(super) struct Expanded<'a> {
    /// The items to forward (`summary` spliced in at [`Expanded::at`]).
    pub items: Vec<Raw<'a>>,
    pub summary: Option<Box<RawValue>>,
    pub at: usize,
    /// What the expanded item replaced, for recall.
    pub archive: Option<Archive>,
}

impl Expanded<'_> {
    /// The forwarded items, the summary message in its place.
    pub fn forwarded(&self) -> Vec<Raw<'_>> {
        let mut out = self.items.clone();
        if let Some(summary) = &self.summary {
            out.insert(self.at.min(out.len()), Raw::from(&**summary));
        }
        out
    }
}

/// The input with the latest compaction item abridge made replaced by a message that
/// carries its summary (framed as reference material, like every summary abridge
/// writes), the conversation before it dropped but for the user, developer and system
/// messages (what a client keeps beside the item), and every other compaction item
/// dropped (an earlier one is inside the latest; one abridge did not make is not
/// trusted).
pub(super) fn expand<'a>(
    items: &[Item<'a>],
    kinds: &[Kind<'_>],
    opened: &[Option<Summary>],
    role: SummaryRole,
) -> Expanded<'a> {
    let latest = opened.iter().rposition(Option::is_some);
    let mut out = Vec::with_capacity(items.len());
    let mut at = 0;
    for (k, (item, kind)) in items.iter().zip(kinds).enumerate() {
        if latest == Some(k) {
            at = out.len();
            continue;
        }
        let before = latest.is_some_and(|l| k < l);
        let keep = match kind {
            Kind::Compaction(_) => false,
            _ if before => {
                matches!(item.role, Role::User | Role::System | Role::Developer)
                    && item.results.is_empty()
                    && item.extra.is_none()
            }
            _ => true,
        };
        if keep {
            out.push(item.raw);
        }
    }
    let opened = latest.and_then(|l| opened[l].as_ref());
    Expanded {
        items: out,
        summary: opened.map(|s| summary_message(s, role)),
        at,
        archive: opened.and_then(Summary::archive),
    }
}

/// The message a compaction item's summary is forwarded as (the same bytes whenever that
/// item is expanded, so the provider's prompt cache keeps hitting).
pub(super) fn summary_message(summary: &Summary, role: SummaryRole) -> Box<RawValue> {
    crate::strategies::authored(Format::Responses, role, &expansion(summary))
}
