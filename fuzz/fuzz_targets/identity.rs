//! The identity of a conversation from a client's messages: rolling prefix hashes in a
//! tenant namespace, each message's hash (its canonical form: content, parts, names, tool
//! calls) and its token estimate.
#![no_main]

use std::sync::LazyLock;

use abridge::identity::{self, Fingerprint, IdentityKey};
use abridge::secret::Secret;
use abridge::tokens::Estimator;
use libfuzzer_sys::fuzz_target;

static NAMESPACE: LazyLock<Fingerprint> =
    LazyLock::new(|| IdentityKey::new(Secret::new("fuzz")).namespace(b"t", None));

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = abridge::formats::chat::parse(data) else {
        return;
    };
    let messages = &parsed.messages;
    let hashes = identity::hash_conversation(&NAMESPACE, messages);
    assert_eq!(hashes.prefixes.len(), messages.len());
    if let Some(i) = hashes.first_user {
        assert!(i < messages.len());
        assert_eq!(hashes.conversation(), Some(hashes.prefixes[i]));
    }
    // Rolling: the hashes of a prefix of the messages are a prefix of the hashes.
    if let Some((_, head)) = messages.split_last() {
        let shorter = identity::hash_conversation(&NAMESPACE, head);
        assert_eq!(shorter.prefixes[..], hashes.prefixes[..head.len()]);
    }
    let estimator = Estimator::approx();
    for m in messages {
        let _ = estimator.message(m);
        let h = identity::hash_message(m);
        assert_eq!(Fingerprint::from_hex(&h.to_hex()), Some(h));
    }
    let _ = estimator.messages(messages);
});
