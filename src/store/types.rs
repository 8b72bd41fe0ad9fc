//! The store's data types: checkpoints, a conversation's state and usage records, what
//! one load returns, and the small values the backends hand back (saved, lock, recent).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::StoreError;
use crate::identity::Fingerprint;
use crate::json::Raw;
pub use crate::strategies::Kept;
use crate::strategies::Strategy;

/// "Messages `head..=through` of the conversation whose prefix hash through `through` is
/// `prefix` are replaced by `replacement`."
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Index of the last message the replacement stands for.
    pub through: u32,
    /// `h(through)`: the checkpoint applies only to requests with this exact history.
    pub prefix: Fingerprint,
    /// Messages `..head` are kept verbatim before the replacement.
    pub head: u32,
    /// The replacement messages abridge wrote (markers, summaries, digests), each
    /// spliced in as is. Parsed once, when loaded (a JSON array of raw values: each
    /// element is kept byte for byte).
    pub replacement: Vec<Box<RawValue>>,
    /// The replacement messages that are client messages forwarded unchanged: kept by
    /// reference, never as text (the store holds no client text abridge forwards
    /// as it came). See [`Checkpoint::pieces`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<Kept>,
    /// The summary text, for an iterative update at the next compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The strategy that produced it.
    pub strategy: Strategy,
    /// Why the requested strategy was not the one that produced it (a fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// abridge's estimates of the request it was built for: with the previous checkpoint
    /// applied (what this one improved on), with this one applied, and as the client
    /// sent it (0 in checkpoints written before it was kept: `tokens_before` then).
    pub tokens_before: u64,
    pub tokens_after: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_sent: u64,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// What the summary gate found and repaired (a summary written for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<crate::strategies::Verdict>,
}

#[cfg(test)]
impl Checkpoint {
    /// For tests: a recency checkpoint of `head..=through` under `prefix`, written as
    /// `replacement`, with nothing kept and no figures.
    pub(crate) fn sample(
        (head, through): (u32, u32),
        prefix: Fingerprint,
        replacement: Vec<Box<RawValue>>,
    ) -> Self {
        Self {
            through,
            prefix,
            head,
            replacement,
            kept: Vec::new(),
            summary: None,
            strategy: Strategy::Recency,
            fallback: None,
            tokens_before: 0,
            tokens_after: 0,
            tokens_sent: 0,
            created_ms: 0,
            gate: None,
        }
    }
}

/// One message of a checkpoint's replacement, in order.
#[derive(Debug, Clone, Copy)]
pub enum Piece<'c> {
    /// Written by abridge, as stored.
    Stored(Raw<'c>),
    /// The conversation's message at this index, as the client sent it.
    Kept(usize),
}

impl Checkpoint {
    /// The replacement in order: what abridge wrote, and the client's messages kept.
    pub fn pieces(&self) -> impl Iterator<Item = Piece<'_>> + '_ {
        let mut stored = self.replacement.iter();
        let mut kept = self.kept.iter().peekable();
        (0..self.replacement.len() + self.kept.len()).filter_map(move |pos| {
            match kept.next_if(|k| k.at as usize == pos) {
                Some(k) => Some(Piece::Kept(k.of as usize)),
                None => stored.next().map(|r| Piece::Stored(Raw::from(&**r))),
            }
        })
    }

    /// Whether the kept messages are where a checkpoint can have them: in order, within
    /// the replacement, each one of the replaced messages. (What a store hands back is
    /// checked before it is used.)
    pub fn kept_consistent(&self) -> bool {
        let total = self.replacement.len() + self.kept.len();
        let mut last: Option<(u32, u32)> = None;
        self.kept.iter().all(|k| {
            let ordered = last.is_none_or(|(at, of)| k.at > at && k.of > of);
            last = Some((k.at, k.of));
            ordered && (k.at as usize) < total && k.of >= self.head && k.of <= self.through
        })
    }

    /// Bytes of the replacement as it is spliced in.
    pub fn replacement_bytes(&self) -> usize {
        self.replacement.iter().map(|r| r.get().len() + 1).sum()
    }

    /// What it keeps from the provider: abridge's estimate of the client's request less
    /// the forwarded one, when it was built.
    pub fn tokens_saved(&self) -> u64 {
        self.tokens_sent
            .max(self.tokens_before)
            .saturating_sub(self.tokens_after)
    }

    /// How many of the client's messages the replacement stands for (`head..=through`).
    pub fn messages_replaced(&self) -> usize {
        (self.through + 1).saturating_sub(self.head) as usize
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl PartialEq for Checkpoint {
    fn eq(&self, other: &Self) -> bool {
        // `RawValue` has no equality of its own; its text is what is stored and spliced.
        self.through == other.through
            && self.prefix == other.prefix
            && self.head == other.head
            && self.replacement.len() == other.replacement.len()
            && self
                .replacement
                .iter()
                .zip(&other.replacement)
                .all(|(a, b)| a.get() == b.get())
            && self.kept == other.kept
            && self.summary == other.summary
            && self.strategy == other.strategy
            && self.fallback == other.fallback
            && self.tokens_before == other.tokens_before
            && self.tokens_after == other.tokens_after
            && self.tokens_sent == other.tokens_sent
            && self.created_ms == other.created_ms
            && self.gate == other.gate
    }
}

/// A conversation's own state, beside its histories' usage.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// An operator asked for this conversation to be compacted at its next turn, with
    /// this focus for a summary (empty: none).
    pub scheduled: Option<String>,
    /// Checkpoints saved over the conversation's life.
    pub compactions: u64,
    pub last_seen_ms: u64,
}

/// What the provider reported for one history of a conversation. Conversations that
/// share an opening (sibling chats of an IDE, one system prompt and first message) share
/// a conversation key, so usage is kept per exact history prefix: a request uses the
/// deepest record whose prefix it contains, and no sibling overwrites another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `h(messages - 1)`: the tokens are only meaningful for a request that starts with
    /// this history.
    pub prefix: Fingerprint,
    /// Messages of that request.
    pub messages: u32,
    /// Input tokens the provider counted for it.
    pub tokens: u64,
    /// `through` of the checkpoint applied to it (`None`: forwarded as sent).
    pub applied: Option<u32>,
    /// abridge's estimate of its head (leading system messages), so a head that
    /// changed since (a timestamp in the system prompt) is accounted for.
    pub head_tokens: u64,
    /// How many tokens a turn of this history has added lately (provider's count).
    pub growth: u64,
    /// The provider's count of what a turn appended, per thousand of abridge's estimate
    /// of it (1000 until measured): what appended messages are scaled by.
    pub ratio_permille: u32,
    /// The request as the client sent it, counted as the provider counts (its own count
    /// when forwarded as sent; 0: not known, a record written before it was kept).
    pub client_tokens: u64,
    /// What the request carried besides its items (tools, system), as the provider
    /// counts it, learned over this history's reports (0: not learned yet; see
    /// `compactor::estimate::beside`).
    pub beside: u64,
    /// When it was reported (ms since the epoch).
    pub at_ms: u64,
}

impl Usage {
    /// The provider's tokens per token of abridge's estimate for this history
    /// (`ratio_permille` as a factor, never zero).
    pub fn ratio(&self) -> f64 {
        f64::from(self.ratio_permille.max(1)) / 1000.0
    }

    /// The record's value as stored (Redis): numbers separated by `:`, `at_ms` last.
    pub fn encode(&self) -> String {
        let applied = self.applied.map_or(-1, i64::from);
        format!(
            "{}:{}:{applied}:{}:{}:{}:{}:{}:{}",
            self.tokens,
            self.messages,
            self.head_tokens,
            self.growth,
            self.ratio_permille,
            self.client_tokens,
            self.beside,
            self.at_ms
        )
    }

    /// A stored value: nine numbers, or the eight of a record written before `beside`
    /// was kept, or the seven of one written before `client_tokens` was.
    pub fn decode(prefix: Fingerprint, value: &str) -> Option<Self> {
        let numbers: Vec<i64> = value
            .split(':')
            .map(|n| n.parse().ok())
            .collect::<Option<_>>()?;
        let (client_tokens, beside, at_ms) = match *numbers.as_slice() {
            [_, _, _, _, _, _, at_ms] => (0, 0, at_ms),
            [_, _, _, _, _, _, client, at_ms] => (client, 0, at_ms),
            [_, _, _, _, _, _, client, beside, at_ms] => (client, beside, at_ms),
            _ => return None,
        };
        let n = |i: usize| numbers[i];
        Some(Self {
            prefix,
            tokens: u64::try_from(n(0)).ok()?,
            messages: u32::try_from(n(1)).ok()?,
            applied: u32::try_from(n(2)).ok(),
            head_tokens: u64::try_from(n(3)).ok()?,
            growth: u64::try_from(n(4)).ok()?,
            ratio_permille: u32::try_from(n(5)).ok()?,
            client_tokens: u64::try_from(client_tokens).ok()?,
            beside: u64::try_from(beside).ok()?,
            at_ms: u64::try_from(at_ms).ok()?,
        })
    }
}

/// Histories whose usage a conversation keeps at most (the least recently reported go).
pub const MAX_USAGE: usize = 16;

/// How stale a conversation's entry in the recent index may get before it is updated.
pub const INDEX_REFRESH_MS: u64 = 60_000;

/// Everything a request needs about its conversation, read in one round trip.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// Deepest first.
    pub checkpoints: Vec<Checkpoint>,
    /// The histories' usage, newest first.
    pub usage: Vec<Usage>,
    pub state: Option<State>,
}

impl Loaded {
    /// The deepest checkpoint whose history matches `prefixes` (the request's rolling
    /// hashes).
    pub fn matching(&self, prefixes: &[Fingerprint]) -> Option<&Checkpoint> {
        self.all_matching(prefixes).next()
    }

    /// Every checkpoint whose history matches `prefixes`, deepest first.
    pub fn all_matching<'s, 'p>(
        &'s self,
        prefixes: &'p [Fingerprint],
    ) -> impl Iterator<Item = &'s Checkpoint> + use<'s, 'p> {
        self.checkpoints
            .iter()
            .filter(|c| prefixes.get(c.through as usize) == Some(&c.prefix))
    }

    /// The usage of the deepest history `prefixes` contains.
    pub fn usage_for(&self, prefixes: &[Fingerprint]) -> Option<&Usage> {
        self.usage
            .iter()
            .filter(|u| u.messages >= 1 && prefixes.get(u.messages as usize - 1) == Some(&u.prefix))
            .max_by_key(|u| (u.messages, u.at_ms))
    }

    /// The fields (see [`checkpoint_field`]) to drop when `new` is saved for the
    /// history `prefixes`: that history keeps its `max` deepest checkpoints, and the
    /// conversation as a whole `max * 4` (the oldest go), so sibling conversations never
    /// evict each other's.
    pub fn to_drop(&self, prefixes: &[Fingerprint], new: &Checkpoint, max: usize) -> Vec<String> {
        let field = checkpoint_field(new);
        let mine: Vec<&Checkpoint> = self
            .all_matching(prefixes)
            .filter(|c| checkpoint_field(c) != field)
            .collect();
        let mut drop: Vec<String> = mine
            .iter()
            .skip(max.saturating_sub(1))
            .map(|c| checkpoint_field(c))
            .collect();
        let kept = self.checkpoints.len() + 1 - drop.len();
        if kept > max * 4 {
            let mut others: Vec<&Checkpoint> = self
                .checkpoints
                .iter()
                .filter(|c| !mine.iter().any(|m| std::ptr::eq(*m, *c)))
                .collect();
            others.sort_by_key(|c| c.created_ms);
            drop.extend(
                others
                    .iter()
                    .take(kept - max * 4)
                    .map(|c| checkpoint_field(c)),
            );
        }
        drop
    }
}

/// Whether a checkpoint was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    Stored,
    /// One for the same history and depth was there first and stays (its replacement
    /// is what every replica forwards, keeping the provider's prompt cache warm).
    AlreadyPresent,
}

/// A held single-flight lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub(super) token: String,
}

impl Lock {
    pub(super) fn new() -> Result<Self, StoreError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| StoreError::Backend(format!("random token: {e}")))?;
        Ok(Self {
            token: hex::encode(bytes),
        })
    }
}

/// A conversation in the admin listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recent {
    pub conversation: Fingerprint,
    pub last_seen_ms: u64,
}

/// The field name of a checkpoint: depth first, zero-padded, so names sort by depth.
pub(crate) fn checkpoint_field(checkpoint: &Checkpoint) -> String {
    format!("{:010}:{}", checkpoint.through, checkpoint.prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written by an older replica still loads: `beside` (and before it
    /// `client_tokens`) read as not known, and the time stays the last number.
    #[test]
    fn a_usage_record_loads_whichever_release_wrote_it() {
        let prefix = crate::identity::IdentityKey::new(crate::secret::Secret::new("k"))
            .namespace(b"t", None);
        let usage = Usage {
            prefix,
            messages: 12,
            tokens: 90_000,
            applied: Some(7),
            head_tokens: 40,
            growth: 1_500,
            ratio_permille: 1_200,
            client_tokens: 120_000,
            beside: 42_000,
            at_ms: 1_700_000_000_000,
        };
        assert_eq!(Usage::decode(prefix, &usage.encode()), Some(usage));
        let eight = Usage::decode(prefix, "90000:12:7:40:1500:1200:120000:1700000000000").unwrap();
        assert_eq!((eight.client_tokens, eight.beside), (120_000, 0));
        assert_eq!(eight.at_ms, 1_700_000_000_000);
        let seven = Usage::decode(prefix, "90000:12:-1:40:1500:1200:1700000000000").unwrap();
        assert_eq!(
            (seven.applied, seven.client_tokens, seven.beside),
            (None, 0, 0)
        );
        assert_eq!(Usage::decode(prefix, "90000:12"), None);
    }
}
