//! The archive a provider-API compaction carries: what a `compaction` item or block
//! abridge made replaced, inside its sealed `encrypted_content`
//! ([`crate::provider_apis::sealed`]), so that recall reads it for as long as the client
//! sends the item back — on any replica, after a restart, with a cold store — although
//! the client no longer sends the history it replaced.
//!
//! Each replaced message is kept as recall shows it (its role, its text and tool calls,
//! secrets redacted by the summariser's rules, [`crate::strategies::redact`]), numbered
//! `c1`, `c2`, … in conversation order; a later compaction appends what it replaced
//! after the archive of the item it carries on from, so the numbers stay. Encoded as
//! base64url of the DEFLATE of its JSON. Bounded: one message at most
//! [`MESSAGE_CHARS`] characters (head and tail kept around a note), the JSON at most
//! [`MAX_RAW`] bytes and the compressed archive at most [`MAX_COMPRESSED`] bytes; over
//! those the newest messages are kept and the oldest left out, and the archive says how
//! many it numbered in all, so a recall says which are gone. Opening is bounded the same
//! way (an archive that inflates past [`MAX_RAW`] is not read).

use std::borrow::Cow;
use std::io::{Read as _, Write as _};
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use serde::{Deserialize, Serialize};

use crate::conversation::Item;
use crate::strategies::text::{head_tail, truncate_chars};

/// Compressed bytes an archive takes at most (its base64 in the token is a third more).
pub const MAX_COMPRESSED: usize = 96 * 1024;
/// Bytes of an archive's JSON at most, before compression and once inflated.
pub const MAX_RAW: usize = 1024 * 1024;
/// Characters of one message an archive keeps at most: its head and its tail.
pub const MESSAGE_CHARS: usize = 32_000;
/// Characters of a message's label at most (a tool result's call id is the client's).
const LABEL_CHARS: usize = 200;
/// Most tries at fitting [`MAX_COMPRESSED`], each with fewer of the oldest messages.
const FITS: usize = 6;

/// An archive as a sealed item carries it (encoded): a cheap clone, opened only when a
/// recall is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive(Arc<str>);

impl Archive {
    /// The encoded archive a sealed payload carried.
    pub fn new(encoded: &str) -> Self {
        Self(Arc::from(encoded))
    }

    /// As the sealed payload carries it.
    pub fn encoded(&self) -> &str {
        &self.0
    }

    /// Its messages; `None` when it cannot be read within the bounds.
    pub fn open(&self) -> Option<Opened> {
        if self.0.len() > MAX_COMPRESSED.div_ceil(3) * 4 {
            return None;
        }
        let compressed = URL_SAFE_NO_PAD.decode(self.0.as_bytes()).ok()?;
        let mut json = Vec::new();
        let limit = u64::try_from(MAX_RAW).unwrap_or(u64::MAX) + 1;
        DeflateDecoder::new(&compressed[..])
            .take(limit)
            .read_to_end(&mut json)
            .ok()?;
        if json.len() > MAX_RAW {
            return None;
        }
        serde_json::from_slice(&json).ok()
    }

    /// The archive of a compaction that replaced `items`, after what `prior` (the
    /// archive of the item it carries on from) held: within the bounds, newest kept.
    /// `None`: nothing to archive, or not even an empty archive could be written.
    pub fn of(prior: Option<&Archive>, items: &[Item<'_>]) -> Option<Archive> {
        let mut archive = prior.and_then(Archive::open).unwrap_or_default();
        for item in items {
            let text = crate::recall::readable_redacted(item);
            if text.trim().is_empty() {
                continue;
            }
            archive.total += 1;
            archive.messages.push(Archived {
                n: archive.total,
                label: truncate_chars(&crate::recall::label(item), LABEL_CHARS).into_owned(),
                text: head_tail(&text, MESSAGE_CHARS / 2, MESSAGE_CHARS / 2, as_is),
            });
        }
        if archive.total == 0 {
            return None;
        }
        archive.encode()
    }
}

/// An archive's messages.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    /// How many messages it ever numbered (the oldest may have been left out).
    pub total: u32,
    /// The messages it keeps, oldest first.
    pub messages: Vec<Archived>,
}

/// One archived message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Archived {
    /// Its number (`c<n>`), 1-based, in conversation order.
    pub n: u32,
    /// Its role as recall labels it (`user`, `assistant`, `tool result call_1`).
    pub label: String,
    /// Its text and tool calls, redacted.
    pub text: String,
}

impl Opened {
    /// How many of the oldest it left out (over its bounds).
    pub fn left_out(&self) -> u32 {
        self.messages.first().map_or(self.total, |m| m.n - 1)
    }

    /// Encoded within the bounds: the newest messages that fit.
    fn encode(mut self) -> Option<Archive> {
        let sizes: Vec<usize> = self
            .messages
            .iter()
            .map(|m| serde_json::to_vec(m).map_or(usize::MAX, |v| v.len() + 1))
            .collect();
        let mut budget = MAX_RAW.saturating_sub(64);
        for _ in 0..FITS {
            let kept = newest_within(&sizes, budget);
            let from = self.messages.len() - kept;
            let shown = Opened {
                total: self.total,
                messages: self.messages[from..].to_vec(),
            };
            let json = serde_json::to_vec(&shown).ok()?;
            let compressed = deflate(&json)?;
            if compressed.len() <= MAX_COMPRESSED {
                return Some(Archive::new(&URL_SAFE_NO_PAD.encode(compressed)));
            }
            // Scaled to what compressed to the bound, with a tenth to spare; at least
            // one message fewer, so that each try shrinks.
            let scaled = (json.len() as u128 * MAX_COMPRESSED as u128 * 9
                / (compressed.len() as u128 * 10)) as usize;
            let fewer: usize = sizes[from..].iter().skip(1).sum();
            budget = scaled.min(fewer);
        }
        self.messages.clear();
        let json = serde_json::to_vec(&self).ok()?;
        deflate(&json).map(|c| Archive::new(&URL_SAFE_NO_PAD.encode(c)))
    }
}

/// Text already redacted, kept as it is around a cut.
fn as_is(text: &str) -> Cow<'_, str> {
    Cow::Borrowed(text)
}

/// How many of the last `sizes` fit in `budget` together.
fn newest_within(sizes: &[usize], budget: usize) -> usize {
    let mut used = 0usize;
    sizes
        .iter()
        .rev()
        .take_while(|&&s| {
            used = used.saturating_add(s);
            used <= budget
        })
        .count()
}

fn deflate(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).ok()?;
    encoder.finish().ok()
}

#[cfg(test)]
mod tests;
