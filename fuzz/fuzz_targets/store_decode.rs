//! What abridge reads back from its store (a shared Redis anyone on its network could
//! write to): a checkpoint's JSON and a usage record. Decoding never panics; a
//! checkpoint that is used is consistent with the conversation it is applied to (its
//! kept messages are among those it replaces) and forwards a conversation that still
//! parses; a usage record round-trips.
#![no_main]

use abridge::compactor::{decide, forwarded};
use abridge::identity::Fingerprint;
use abridge::store::{Checkpoint, Usage};
use libfuzzer_sys::fuzz_target;

const CONVERSATION: &[u8] = br#"{"model":"m","messages":[
{"role":"system","content":"s"},{"role":"user","content":"u1"},
{"role":"assistant","content":"a1"},{"role":"user","content":"u2"},
{"role":"assistant","content":"a2"},{"role":"user","content":"u3"}]}"#;

fuzz_target!(|data: &[u8]| {
    let prefix = Fingerprint::from_hex(&"ab".repeat(32)).unwrap();
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(usage) = Usage::decode(prefix, text)
    {
        assert_eq!(Usage::decode(prefix, &usage.encode()), Some(usage));
    }
    let Ok(checkpoint) = serde_json::from_slice::<Checkpoint>(data) else {
        return;
    };
    let pieces = checkpoint.pieces().count();
    assert!(pieces <= checkpoint.replacement.len() + checkpoint.kept.len());
    let parsed = abridge::formats::chat::parse(CONVERSATION).unwrap();
    if !decide::applicable(&checkpoint, &parsed.messages) {
        return;
    }
    assert!(checkpoint.kept_consistent());
    assert_eq!(pieces, checkpoint.replacement.len() + checkpoint.kept.len());
    let out = forwarded(&parsed.messages, &checkpoint);
    let kept_around = checkpoint.head as usize + (parsed.messages.len() - checkpoint.through as usize - 1);
    assert_eq!(out.len(), kept_around + pieces);
});
