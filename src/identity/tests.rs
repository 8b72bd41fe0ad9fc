//! Unit tests of conversation identity: canonical forms, rolling prefix hashes and
//! tenant namespaces.

use super::*;
use crate::formats::chat::parse;
use proptest::prelude::*;

fn key() -> IdentityKey {
    IdentityKey::new(Secret::new("test-secret"))
}

fn hashes(ns: &Fingerprint, messages_json: &str) -> Hashes {
    let body = format!(r#"{{"messages":{messages_json}}}"#);
    let parsed = parse(body.as_bytes()).unwrap();
    hash_conversation(ns, &parsed.messages)
}

fn one(message_json: &str) -> Fingerprint {
    let body = format!(r#"{{"messages":[{message_json}]}}"#);
    let parsed = parse(body.as_bytes()).unwrap();
    hash_message(&parsed.messages[0])
}

#[test]
fn volatile_and_empty_fields_do_not_change_the_hash() {
    let base = one(r#"{"role":"assistant","content":"hi"}"#);
    assert_eq!(
        base,
        one(r#"{ "content" : "hi", "role":"assistant", "refusal":null, "annotations":[] }"#)
    );
    assert_eq!(
        base,
        one(r#"{"role":"assistant","content":"hi","name":""}"#)
    );
    assert_eq!(
        base,
        one(r#"{"role":"assistant","content":"hi","tool_calls":[]}"#)
    );
    assert_eq!(
        base,
        one(r#"{"role":"assistant","content":"hi","tool_calls":null}"#)
    );
    assert_eq!(
        base,
        one(r#"{"role":"assistant","content":[{"type":"text","text":"hi"}]}"#)
    );
    assert_eq!(base, one(r#"{"role":"assistant","content":"h\u0069"}"#));
    let empty = one(
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
    );
    assert_eq!(
        empty,
        one(
            r#"{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#
        )
    );
    assert_eq!(
        empty,
        one(
            r#"{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#
        )
    );
}

#[test]
fn meaningful_fields_change_the_hash() {
    let base = one(r#"{"role":"user","content":"hi"}"#);
    for other in [
        r#"{"role":"assistant","content":"hi"}"#,
        r#"{"role":"user","content":"hi!"}"#,
        r#"{"role":"user","content":"hi","name":"bob"}"#,
        r#"{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}"#,
        r#"{"role":"user","content":"hi","tool_call_id":"c1"}"#,
    ] {
        assert_ne!(base, one(other), "{other}");
    }
    let call = |id: &str, name: &str, args: &str| {
        one(&format!(
            r#"{{"role":"assistant","tool_calls":[{{"id":"{id}","type":"function","function":{{"name":"{name}","arguments":"{args}"}}}}]}}"#
        ))
    };
    let c = call("c1", "read", "{}");
    assert_ne!(c, call("c2", "read", "{}"));
    assert_ne!(c, call("c1", "write", "{}"));
    assert_ne!(c, call("c1", "read", "[]"));
}

#[test]
fn framing_is_prefix_free() {
    // Moving bytes between fields never collides.
    assert_ne!(
        one(r#"{"role":"user","content":"ab","name":"c"}"#),
        one(r#"{"role":"user","content":"a","name":"bc"}"#)
    );
    assert_ne!(
        one(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]}"#
        ),
        one(
            r#"{"role":"user","content":[{"type":"image_url","image_url":{}},{"type":"text","text":"a"}]}"#
        )
    );
}

#[test]
fn the_conversation_key_is_the_prefix_through_the_first_user_message() {
    let ns = key().namespace(b"Bearer sk-a", None);
    let h = hashes(
        &ns,
        r#"[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"}]"#,
    );
    assert_eq!(h.first_user, Some(1));
    assert_eq!(h.conversation(), Some(h.prefixes[1]));
    let longer = hashes(
        &ns,
        r#"[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"user","content":"next"}]"#,
    );
    assert_eq!(longer.conversation(), h.conversation());
    assert_eq!(&longer.prefixes[..3], &h.prefixes[..]);
    assert_eq!(
        hashes(&ns, r#"[{"role":"system","content":"s"}]"#).conversation(),
        None
    );
}

#[test]
fn a_changed_system_prompt_keeps_the_conversation_and_its_prefixes() {
    let ns = key().namespace(b"Bearer sk-a", None);
    let turn = |time: &str| {
        hashes(
            &ns,
            &format!(
                r#"[{{"role":"system","content":"Current time: {time}"}},{{"role":"developer","content":"env"}},{{"role":"user","content":"u"}},{{"role":"assistant","content":"a"}}]"#
            ),
        )
    };
    let (a, b) = (turn("10:00"), turn("10:05"));
    assert_eq!(a.head_len, 2);
    assert_ne!(a.head, b.head, "the head has a hash of its own");
    assert_eq!(a.conversation(), b.conversation());
    assert_eq!(a.prefixes, b.prefixes);
    // One head message more or less shifts every index: a checkpoint (matched at
    // its own index) no longer matches, safely.
    let shorter = hashes(
        &ns,
        r#"[{"role":"system","content":"Current time: 10:00"},{"role":"user","content":"u"},{"role":"assistant","content":"a"}]"#,
    );
    for i in 1..shorter.prefixes.len() {
        assert_ne!(shorter.prefixes[i], a.prefixes[i], "index {i}");
    }
}

#[test]
fn namespaces_separate_tenants_conversations_and_secrets() {
    let k = key();
    let a = k.namespace(b"Bearer sk-a", None);
    assert_eq!(a, k.namespace(b"Bearer sk-a", None));
    assert_ne!(a, k.namespace(b"Bearer sk-b", None));
    assert_ne!(a, k.namespace(b"Bearer sk-a", Some(b"c1")));
    assert_ne!(
        k.namespace(b"Bearer sk-a", Some(b"c1")),
        k.namespace(b"Bearer sk-a", Some(b"c2"))
    );
    assert_ne!(k.namespace(b"", Some(b"")), k.namespace(b"", None));
    let other = IdentityKey::new(Secret::new("other-secret"));
    assert_ne!(a, other.namespace(b"Bearer sk-a", None));
    // A format's domain separates its conversations from chat's, and from an id
    // that happens to spell the domain.
    let scoped = |format, conversation| {
        k.namespace_in(
            b"Bearer sk-a",
            Scope {
                format,
                conversation,
            },
        )
    };
    assert_ne!(a, scoped(Some(&b"responses"[..]), None));
    assert_ne!(
        scoped(Some(&b"responses"[..]), None),
        scoped(None, Some(&b"responses"[..]))
    );
    assert_eq!(a, scoped(None, None));
    // The namespace does not contain the credential in any readable form.
    assert!(!a.to_hex().contains(&hex::encode(b"sk-a")));
}

#[test]
fn fingerprint_hex_round_trips() {
    let f = key().namespace(b"x", None);
    assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
    assert_eq!(f.to_string().len(), 64);
    assert_eq!(
        f.to_hex(),
        hex::encode(f.as_bytes()),
        "lowercase, byte order"
    );
    assert_eq!(f.to_string(), f.to_hex());
    assert_eq!(
        format!("{f:?}"),
        format!("Fingerprint({}…)", &f.to_hex()[..12])
    );
    assert_eq!(Fingerprint::from_hex("zz"), None);
    let json = serde_json::to_string(&f).unwrap();
    assert_eq!(serde_json::from_str::<Fingerprint>(&json).unwrap(), f);
}

/// A random message, as JSON.
fn message() -> impl Strategy<Value = String> {
    let text = "[a-z \\n\"é🌍]{0,12}";
    prop_oneof![
        (prop_oneof![Just("system"), Just("user"), Just("assistant")], text).prop_map(|(r, t)| {
            serde_json::json!({"role": r, "content": t}).to_string()
        }),
        (text, text).prop_map(|(a, b)| {
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": a}, {"type": "text", "text": b}]}).to_string()
        }),
        ("[a-z0-9]{1,4}", "[a-z]{1,4}", text).prop_map(|(id, name, args)| {
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": name, "arguments": args}}]}).to_string()
        }),
        ("[a-z0-9]{1,4}", text).prop_map(|(id, t)| {
            serde_json::json!({"role": "tool", "tool_call_id": id, "content": t}).to_string()
        }),
    ]
}

fn conversation() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(message(), 1..12)
}

fn hash_list(ns: &Fingerprint, messages: &[String]) -> Hashes {
    hashes(ns, &format!("[{}]", messages.join(",")))
}

proptest! {
    #[test]
    fn equal_canonical_forms_hash_equal(messages in conversation()) {
        let ns = key().namespace(b"t", None);
        // Re-serialised with other whitespace and an extra volatile field.
        let reformatted: Vec<String> = messages.iter().map(|m| {
            let mut v: serde_json::Value = serde_json::from_str(m).unwrap();
            v["refusal"] = serde_json::Value::Null;
            serde_json::to_string_pretty(&v).unwrap()
        }).collect();
        prop_assert_eq!(hash_list(&ns, &messages), hash_list(&ns, &reformatted));
    }

    #[test]
    fn string_and_text_parts_hash_equal(texts in proptest::collection::vec("[a-z é]{0,8}", 1..4)) {
        let joined: String = texts.concat();
        let parts: Vec<serde_json::Value> = texts.iter().map(|t| serde_json::json!({"type": "text", "text": t})).collect();
        prop_assert_eq!(
            one(&serde_json::json!({"role": "user", "content": joined}).to_string()),
            one(&serde_json::json!({"role": "user", "content": parts}).to_string())
        );
    }

    /// Any edit, insertion, deletion or reorder at or before i changes h(i) and
    /// leaves every h(j < position) unchanged.
    #[test]
    fn changes_at_or_before_i_change_h_i_only_from_there(
        messages in conversation(),
        pos in any::<proptest::sample::Index>(),
        kind in 0u8..4,
        replacement in message(),
    ) {
        let ns = key().namespace(b"t", None);
        let p = pos.index(messages.len());
        let mut edited = messages.clone();
        match kind {
            0 => edited[p] = replacement,
            1 => edited.insert(p, replacement),
            2 => { edited.remove(p); }
            _ => {
                if p + 1 < edited.len() { edited.swap(p, p + 1); }
            }
        }
        if edited.is_empty() {
            return Ok(());
        }
        let before = hash_list(&ns, &messages);
        let after = hash_list(&ns, &edited);
        let canon = |list: &[String]| list.iter().map(|m| one(m)).collect::<Vec<_>>();
        let (cb, ca) = (canon(&messages), canon(&edited));
        // The head (leading system messages) is not part of the chain: a history is
        // the same when the heads have the same length and the rest is equal.
        let same_head = before.head_len == after.head_len;
        let (s, ha) = (before.head_len, after.head_len);
        for i in 0..before.prefixes.len().min(after.prefixes.len()) {
            if i < s.max(ha) {
                continue;
            }
            let same_history = same_head && cb[s..=i] == ca[s..=i];
            prop_assert_eq!(before.prefixes[i] == after.prefixes[i], same_history, "h({}) after an edit at {}", i, p);
            if i < p && same_head {
                prop_assert_eq!(before.prefixes[i], after.prefixes[i], "h({}) before the edit at {} changed", i, p);
            }
        }
        // A real edit after the head (not a swap of equal messages) is visible at its
        // position.
        if same_head && p >= s && cb.get(p) != ca.get(p) && p < before.prefixes.len().min(after.prefixes.len()) {
            prop_assert_ne!(before.prefixes[p], after.prefixes[p]);
        }
    }

    #[test]
    fn different_tenants_never_share_a_hash(
        messages in conversation(),
        a in "[a-zA-Z0-9]{1,20}",
        b in "[a-zA-Z0-9]{1,20}",
    ) {
        prop_assume!(a != b);
        let k = key();
        let ha = hash_list(&k.namespace(a.as_bytes(), None), &messages);
        let hb = hash_list(&k.namespace(b.as_bytes(), None), &messages);
        for (x, y) in ha.prefixes.iter().zip(&hb.prefixes) {
            prop_assert_ne!(x, y);
        }
    }
}
