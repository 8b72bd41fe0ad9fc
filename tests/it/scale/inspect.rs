//! Reading the outcome of the scale-out run from the outside: the keys and memory in
//! Redis, and the conversations and messages in the requests the provider received.

use abridge::json::Raw;
use std::collections::BTreeSet;

use abridge::store::Checkpoint;

pub(super) fn node(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

pub(super) fn keys(url: &str, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut node(url))
        .unwrap()
}

/// The conversation hash inside a key's braces.
pub(super) fn tag_of(key: &str) -> Option<&str> {
    let start = key.find('{')? + 1;
    let end = key[start..].find('}')? + start;
    Some(&key[start..end])
}

pub(super) fn used_memory(url: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut node(url))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

pub(super) fn memory_usage(con: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query::<Option<u64>>(con)
        .unwrap()
        .unwrap_or(0)
}

/// The conversations a (summary) request body talks about, from the `[sc-NNN]` markers.
pub(super) fn markers(body: &[u8]) -> BTreeSet<usize> {
    let text = String::from_utf8_lossy(body);
    text.match_indices("[sc-")
        .filter_map(|(i, _)| text.get(i + 4..i + 7)?.parse().ok())
        .collect()
}

pub(super) fn raw_messages(body: &[u8]) -> Vec<String> {
    abridge::formats::chat::parse(body)
        .unwrap()
        .messages
        .iter()
        .map(|m| m.raw.get().to_owned())
        .collect()
}

/// `sent` with `checkpoint` applied: head + replacement + the rest, as raw messages.
pub(super) fn applied(sent: &[String], checkpoint: &Checkpoint) -> Vec<String> {
    let replacement: Vec<Raw<'_>> = checkpoint
        .replacement
        .iter()
        .map(|r| Raw::from(&**r))
        .collect();
    let (head, through) = (checkpoint.head as usize, checkpoint.through as usize);
    sent[..head]
        .iter()
        .cloned()
        .chain(replacement.iter().map(|r| r.get().to_owned()))
        .chain(sent[through + 1..].iter().cloned())
        .collect()
}

/// What Redis holds about one conversation.
pub(super) struct Stored {
    pub(super) checkpoints: Vec<Checkpoint>,
    pub(super) compactions: u64,
    /// `MEMORY USAGE` of the checkpoint hash and of the state hash.
    pub(super) ckpt_bytes: u64,
    pub(super) state_bytes: u64,
}
