//! An Anthropic Messages request body from a client: the borrowed parse of the request
//! and of every message (the walk over a message agreeing with serde), the decision whether the provider manages its context, and the
//! splice abridge makes (a subset of the messages with a message of abridge's own),
//! which must parse again, alternate wherever abridge's message stands, and keep every
//! message it was given, in order.
#![no_main]

use abridge::conversation::Role;
use abridge::formats::{Author, messages};
use abridge::json::Raw;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The validating pass accepts and refuses the bodies serde_json does (objects at
    // the top: the rest is left to serde).
    if let Ok(text) = std::str::from_utf8(data) {
        assert!(abridge::json::agrees_with_serde(text), "{text:?}");
    }
    // The top level found by the validating pass reads as serde reads it (the same
    // request and items, or the same error).
    assert_eq!(
        format!("{:?}", messages::parse(data)),
        format!("{:?}", messages::parse_by_serde(data)),
    );
    // Each message is read by a walk over its bytes: it must read what serde reads
    // (the same item, or a refusal where serde refuses).
    if let Ok(fields) = serde_json::from_slice::<messages::Fields<'_>>(data) {
        let raw: Vec<Raw<'_>> = fields
            .messages
            .and_then(|m| serde_json::from_str(m.get()).ok())
            .unwrap_or_default();
        for raw in raw {
            assert_eq!(
                messages::item(raw).ok(),
                messages::item_by_serde(raw).ok(),
                "message {:?}",
                raw.get()
            );
        }
    }
    let body = Bytes::copy_from_slice(data);
    let Ok(parsed) = messages::parse(&body) else {
        return;
    };
    let _ = messages::untouchable(&parsed);
    let summary = messages::authored(Author::User, "[summary]");
    let mut kept: Vec<_> = parsed.items.iter().map(|i| i.raw).step_by(2).collect();
    kept.insert(kept.len().min(1), Raw::from(&*summary));
    let Some(out) = messages::with_messages(&body, &parsed, &kept) else {
        return;
    };
    let again = messages::parse(&out).unwrap_or_else(|e| {
        panic!(
            "the spliced body does not parse: {e}\n{}",
            String::from_utf8_lossy(&out)
        )
    });
    // Every kept message is there, in order; fillers are all that was added.
    let got: Vec<&str> = again.items.iter().map(|i| i.raw.get()).collect();
    let mut at = 0;
    for k in &kept {
        at += got[at..]
            .iter()
            .position(|g| *g == k.get())
            .unwrap_or_else(|| panic!("kept message missing: {}", k.get()));
        at += 1;
    }
    // Around abridge's message, roles alternate (system messages aside).
    let roles: Vec<Role> = again
        .items
        .iter()
        .map(|i| i.role)
        .filter(|r| *r != Role::System)
        .collect();
    let mine = again
        .items
        .iter()
        .filter(|i| i.role != Role::System)
        .position(|i| i.raw.get() == summary.get());
    if let Some(p) = mine {
        assert!(p == 0 || roles[p - 1] != roles[p], "{roles:?}");
        assert!(
            p + 1 >= roles.len() || roles[p + 1] != roles[p],
            "{roles:?}"
        );
    }
    // The forwarded conversation starts with a user message.
    assert!(roles.first().is_none_or(|r| *r == Role::User), "{roles:?}");
});
