//! The validating pass against serde_json, the oracle: the bodies it accepts and
//! refuses, and what it finds at the top of those it accepts.

use super::*;
use proptest::prelude::*;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::json::object::tests::{Pairs, deeply_nested};

/// serde_json's verdict on `text` as a body the pass reads: JSON, an object at the top.
fn serde_accepts(text: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(text).is_ok() && text.trim_start().starts_with('{')
}

/// What serde reads at the top of an object: each member's key and raw value, in order,
/// duplicates kept, and each array member's elements.
type Read<'a> = Vec<(String, &'a str, Option<Vec<&'a str>>)>;

fn serde_read(text: &str) -> Option<Read<'_>> {
    // serde refuses a key with a lone surrogate: nothing to compare.
    let pairs: Pairs<'_> = serde_json::from_str(text).ok()?;
    let read = pairs
        .0
        .into_iter()
        .map(|(k, v)| {
            let elements = v.get().starts_with('[').then(|| {
                let all: Vec<&RawValue> = serde_json::from_str(v.get()).unwrap();
                all.into_iter().map(RawValue::get).collect()
            });
            (k.into_owned(), v.get(), elements)
        })
        .collect();
    Some(read)
}

fn read<'a>(top: &Top<'a>) -> Option<Read<'a>> {
    top.members
        .iter()
        .map(|(key, raw, elements)| {
            let key: String = serde_json::from_str(key).ok()?;
            let elements = elements
                .clone()
                .map(|r| top.elements[r].iter().map(|e| e.get()).collect());
            Some((key, raw.get(), elements))
        })
        .collect()
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "(?s)[a-z \"\\\\/\n\t{}\\[\\],:é🌍\u{0}-\u{1f}\u{7f}]{0,12}"
            .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(5, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z\"\\\\é]{0,3}", inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `text` with one edit at `at` (clamped to a char boundary): a byte of JSON's own
/// alphabet put in, taken out or put in place of one.
fn edited(text: &str, at: usize, edit: u8, byte: u8) -> String {
    const ALPHABET: &[u8] = b"{}[]\",:\\ 0-.eE+tfnu\n\x01a";
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let c = char::from(ALPHABET[usize::from(byte) % ALPHABET.len()]);
    let mut out = String::from(&text[..at]);
    let rest = &text[at..];
    let mut after = rest.chars();
    match edit % 3 {
        0 => out.push(c),
        1 => {
            after.next();
        }
        _ => {
            after.next();
            out.push(c);
        }
    }
    out.push_str(after.as_str());
    out
}

proptest! {
    /// Any object serde writes, compact or pretty: the pass accepts it and finds at the
    /// top what serde reads there.
    #[test]
    fn finds_what_serde_reads(value in json_value(), pretty in any::<bool>(), pad in "[ \t\n\r]{0,2}") {
        let value = match value {
            serde_json::Value::Object(_) => value,
            other => serde_json::json!({ "messages": other, "model": "m" }),
        };
        let text = if pretty {
            serde_json::to_string_pretty(&value).unwrap()
        } else {
            serde_json::to_string(&value).unwrap()
        };
        let text = format!("{pad}{text}{pad}");
        let top = top(&text);
        prop_assert!(top.is_some(), "refused: {text}");
        prop_assert_eq!(read(&top.unwrap()), serde_read(&text));
    }

    /// One edit anywhere in a body serde wrote: the pass accepts it exactly when serde
    /// does, and then finds what serde reads.
    #[test]
    fn accepts_and_refuses_as_serde_does(
        value in json_value(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..3),
    ) {
        let mut text = serde_json::json!({ "model": "m", "messages": [value] }).to_string();
        for (at, edit, byte) in edits {
            text = edited(&text, at, edit, byte);
        }
        let accepted = top(&text);
        prop_assert_eq!(accepted.is_some(), serde_accepts(&text), "{}", text);
        if let Some(top) = accepted {
            prop_assert_eq!(read(&top), serde_read(&text));
        }
    }

    /// Any text of JSON's alphabet: the same verdict as serde's, and no panic.
    #[test]
    fn any_text_gets_serde_s_verdict(text in "(?s)[{}\\[\\]\",:\\\\ a-z0-9.eE+\\-\n\u{1}é]{0,40}") {
        prop_assert_eq!(top(&text).is_some(), serde_accepts(&text), "{}", text);
        prop_assert!(agrees_with_serde(&text));
    }
}

#[test]
fn what_it_refuses_as_serde_does() {
    for text in [
        r#"{"a":1}"#,
        r#" { "a" : [ 1 , 2 ] , "b" : { } } "#,
        r#"{"a":-0.5e+10,"b":0,"c":1E2,"d":true,"e":false,"f":null}"#,
        r#"{"a":"\ud800 lone surrogates pass where serde skips them"}"#,
        "{\"a\":\"\u{7f} is not a control byte\"}",
        r#"{"a":"\u00e9\"\\\/\b\f\n\r\t"}"#,
        r#"{"a":01}"#,
        r#"{"a":1.}"#,
        r#"{"a":1e}"#,
        r#"{"a":-}"#,
        r#"{"a":+1}"#,
        r#"{"a":.5}"#,
        r#"{"a":[1,]}"#,
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{"a":tru}"#,
        r#"{"a":nul}"#,
        r#"{"a":"\x"}"#,
        r#"{"a":"\u12"}"#,
        r#"{"a":"\u12g4"}"#,
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"past the first eight bytes \u{1f} a control byte\"}",
        "{\"a\":\"past the first eight bytes, é and \u{80}, then \\u00e9\"}",
        "{\"a\":\"line\nbreak\"}",
        r#"{"a":1}x"#,
        r#"{"a":1}{}"#,
        r#"{"a":[}"#,
        r#"{"a":{]}"#,
        r#"{1:2}"#,
        r#"{"a":"unterminated}"#,
        "\u{feff}{}",
        "",
        "{",
    ] {
        assert_eq!(top(text).is_some(), serde_accepts(text), "{text:?}");
    }
    assert!(
        top("[1]").is_none() && !serde_accepts("[1]"),
        "not an object"
    );
}

#[test]
fn any_depth_costs_no_stack() {
    for depth in [127, 128, 129, 130, 300] {
        let text = format!(
            r#"{{"messages":[{}1{}],"b":{}"x"{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth),
            "{\"k\":".repeat(depth),
            "}".repeat(depth)
        );
        assert_eq!(top(&text).is_some(), serde_accepts(&text), "depth {depth}");
        assert_eq!(read(&top(&text).unwrap()), serde_read(&text));
        let broken = text.replacen("]]", "}]", 1);
        assert_eq!(
            top(&broken).is_some(),
            serde_accepts(&broken),
            "depth {depth}"
        );
    }
    let deep = deeply_nested(1_000_000);
    let top = top(&deep).unwrap();
    assert_eq!(top.members.len(), 2);
    assert_eq!(top.members[1].1.get(), "2");
}

#[test]
fn fields_read_members_as_serde_would() {
    let text = r#"{"model":"g\u00e9","messages":[{"a":1}, 2],"stream":true,"tools":null,"x":[]}"#;
    let top = top(text).unwrap();
    let [model, messages, stream, tools, absent] = top
        .fields(["model", "messages", "stream", "tools", "absent"])
        .unwrap();
    assert_eq!(optional_text(model), Some(Some(Cow::Owned("gé".into()))));
    let elements: Vec<&str> = messages
        .unwrap()
        .elements
        .unwrap()
        .iter()
        .map(|e| e.get())
        .collect();
    assert_eq!(elements, [r#"{"a":1}"#, "2"]);
    assert_eq!(optional_flag(stream), Some(Some(true)));
    assert_eq!(tools.map(|t| t.raw.get()), Some("null"), "null is present");
    assert!(
        optional_raw(tools).is_none(),
        "and absent where serde maps it so"
    );
    assert!(absent.is_none());
    // A named member twice, or a key serde cannot read: left to serde.
    assert!(
        super::top(r#"{"model":"a","model":"b"}"#)
            .unwrap()
            .fields(["model"])
            .is_none()
    );
    assert!(
        super::top(r#"{"\ud800":1}"#)
            .unwrap()
            .fields(["model"])
            .is_none()
    );
    // A key written with escapes is the member it names.
    let escaped = super::top(r#"{"m\u006fdel":"x"}"#).unwrap();
    assert_eq!(
        optional_text(escaped.fields(["model"]).unwrap()[0]),
        Some(Some("x".into()))
    );
    // What serde would refuse as the field's type: left to serde.
    assert_eq!(
        optional_flag(super::top(r#"{"s":1}"#).unwrap().fields(["s"]).unwrap()[0]),
        None
    );
    assert_eq!(
        optional_text(super::top(r#"{"s":1}"#).unwrap().fields(["s"]).unwrap()[0]),
        None
    );
}
