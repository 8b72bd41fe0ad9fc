//! A JSON object's members in one walk: each key's text and its value's raw JSON, in
//! order, duplicates included, found by skipping strings with `memchr` instead of
//! parsing them — and the text of the string values asked for, decoded in the same
//! pass. For JSON already validated (a message inside a body the validating pass or serde
//! read); on anything else it stops with [`Malformed`] — never a panic, never a wrong
//! member.

use std::borrow::Cow;

use super::raw::Raw;
use super::text::string_at;

/// The walk could not go on: not JSON, or a key with an escape only the parser reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// A member's value: its raw JSON and, when it is a string the walk decodes (see
/// [`super::string_text`]), its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    pub raw: &'a str,
    text: Option<Cow<'a, str>>,
}

impl<'a> Member<'a> {
    /// The raw JSON `raw` as a member not walked: its text, if any, is for the reader
    /// to find (serde's reads, the tests).
    pub fn unread(raw: &'a str) -> Self {
        Self { raw, text: None }
    }

    /// The string's text; `None` when the value is not a string the walk reads.
    pub fn text(self) -> Option<Cow<'a, str>> {
        self.text
    }
}

/// The members of the JSON object `raw`; `None` when `raw` is not an object.
fn members(raw: &str) -> Option<Members<'_>> {
    let at = skip_space(raw.as_bytes(), 0);
    (raw.as_bytes().get(at) == Some(&b'{')).then_some(Members {
        raw,
        at: at + 1,
        first: true,
    })
}

/// The members named `names` in the object `raw` (their string values decoded as they
/// are walked), `null` read as absent; `None` when a name appears twice or the walk
/// cannot read the object — serde should read it then (its error for a duplicate field
/// is the one to give).
pub fn fields<'a, const N: usize>(
    raw: &'a str,
    names: [&str; N],
) -> Option<[Option<Member<'a>>; N]> {
    let mut found = [const { None }; N];
    let mut walk = members(raw)?;
    while let Some((key, start)) = walk.key().ok()? {
        let wanted = names.iter().position(|n| *n == key);
        let value = walk.value(start, wanted.is_some()).ok()?;
        if let Some(i) = wanted {
            if found[i].replace(value).is_some() {
                return None;
            }
        }
    }
    Some(found.map(|v| v.filter(|v| v.raw != "null")))
}

/// An optional string member's text: `Some(None)` when absent, `None` when it is not
/// a string the walk reads (serde should then read it).
pub fn optional_string(value: Option<Member<'_>>) -> Option<Option<Cow<'_, str>>> {
    match value {
        None => Some(None),
        Some(v) => v.text.map(Some),
    }
}

/// The elements of the JSON array `raw`, each as its raw JSON; `None` when `raw` is not
/// an array. For JSON already validated (a member of a validated value), as every walk
/// here: the elements are [`Raw`] values on that ground.
pub fn elements(raw: &str) -> Option<Vec<Raw<'_>>> {
    let open = skip_space(raw.as_bytes(), 0);
    if raw.as_bytes().get(open) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    split_array(raw, open, &mut out, value_end)?;
    Some(out)
}

/// Just past the array that opens at `open` in `text`, each element pushed to `out`;
/// `end_of` finds where an element ends (this walk's [`value_end`] for validated JSON,
/// the validating pass's own skip for a body not yet validated).
pub(super) fn split_array<'a>(
    text: &'a str,
    open: usize,
    out: &mut Vec<Raw<'a>>,
    end_of: fn(&[u8], usize) -> Option<usize>,
) -> Option<usize> {
    let b = text.as_bytes();
    let mut at = skip_space(b, open + 1);
    if b.get(at) == Some(&b']') {
        return Some(at + 1);
    }
    loop {
        let end = end_of(b, at)?;
        out.push(Raw::trusted(text.get(at..end)?));
        at = skip_space(b, end);
        match b.get(at)? {
            b',' => at = skip_space(b, at + 1),
            b']' => return Some(at + 1),
            _ => return None,
        }
    }
}

/// The walk of [`members`]: each member's key (decoded) and then its value (its raw
/// JSON without surrounding whitespace), in turn.
#[derive(Debug, Clone)]
struct Members<'a> {
    raw: &'a str,
    at: usize,
    first: bool,
}

impl<'a> Members<'a> {
    /// The next member's key and where its value starts, or `None` at the closing brace.
    fn key(&mut self) -> Result<Option<(Cow<'a, str>, usize)>, Malformed> {
        let b = self.raw.as_bytes();
        let mut at = skip_space(b, self.at);
        match (b.get(at), std::mem::take(&mut self.first)) {
            (Some(b'}'), _) => return Ok(None),
            (Some(b','), false) => at = skip_space(b, at + 1),
            (Some(b'"'), true) => {}
            _ => return Err(Malformed),
        }
        if b.get(at) != Some(&b'"') {
            return Err(Malformed);
        }
        // The key's text found in the pass that finds its end.
        let (key_end, key) = string_at(self.raw, at).ok_or(Malformed)?;
        let colon = skip_space(b, key_end);
        if b.get(colon) != Some(&b':') {
            return Err(Malformed);
        }
        Ok(Some((key.ok_or(Malformed)?, skip_space(b, colon + 1))))
    }

    /// The value that starts at `start`, its text decoded on the way when `decode` and
    /// it is a string; the walk goes on after it.
    fn value(&mut self, start: usize, decode: bool) -> Result<Member<'a>, Malformed> {
        let b = self.raw.as_bytes();
        let (end, text) = match b.get(start) {
            Some(b'"') if decode => string_at(self.raw, start).ok_or(Malformed)?,
            _ => (value_end(b, start).ok_or(Malformed)?, None),
        };
        self.at = end;
        let raw = self.raw.get(start..end).ok_or(Malformed)?;
        Ok(Member { raw, text })
    }
}

/// The first byte at or after `at` that is not JSON whitespace.
pub(super) fn skip_space(b: &[u8], at: usize) -> usize {
    let rest = b.get(at..).unwrap_or_default();
    at + rest
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .unwrap_or(rest.len())
}

/// Just past the value that starts at `at`.
fn value_end(b: &[u8], at: usize) -> Option<usize> {
    match *b.get(at)? {
        b'"' => string_end(b, at),
        b'{' | b'[' => container_end(b, at),
        _ => {
            let rest = &b[at..];
            let len = rest
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            (len > 0).then_some(at + len)
        }
    }
}

/// Just past the string whose opening quote is at `open`: the next quote that no
/// backslash escapes. An escape is a backslash and one ASCII byte (`\uXXXX`'s digits
/// hold no quote or backslash), so skipping two bytes is enough.
fn string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut at = open + 1;
    loop {
        at += memchr::memchr2(b'"', b'\\', b.get(at..)?)?;
        if *b.get(at)? == b'"' {
            return Some(at + 1);
        }
        at += 2;
    }
}

/// Just past the object or array that opens at `open`: brackets counted outside
/// strings, without recursion (any depth costs no stack).
fn container_end(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = open;
    while let Some(&c) = b.get(at) {
        match c {
            b'"' => {
                at = string_end(b, at)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    /// What serde_json's own map walk reads: every member in order, duplicates kept (the
    /// reference of this walk's tests and of the validating pass's).
    pub(in crate::json) struct Pairs<'a>(pub(in crate::json) Vec<(Cow<'a, str>, &'a RawValue)>);

    impl<'de> serde::Deserialize<'de> for Pairs<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Pairs<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Pairs<'de>, A::Error> {
                    let mut pairs = Vec::new();
                    while let Some(pair) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                        pairs.push(pair);
                    }
                    Ok(Pairs(pairs))
                }
            }
            d.deserialize_map(Visit)
        }
    }

    /// Every member the walk reads, in order, duplicates kept.
    fn walked(raw: &str) -> Result<Vec<(Cow<'_, str>, &str)>, Malformed> {
        let mut walk = members(raw).ok_or(Malformed)?;
        let mut all = Vec::new();
        while let Some((key, start)) = walk.key()? {
            all.push((key, walk.value(start, false)?.raw));
        }
        Ok(all)
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            (-1e9f64..1e9).prop_map(serde_json::Value::from),
            "(?s)[a-z \"\\\\/\n\t{}\\[\\],:é🌍\u{1}]{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-z\"]{0,3}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn space() -> impl Strategy<Value = String> {
        "[ \t\n\r]{0,2}"
    }

    proptest! {
        /// An object written any way (whitespace, escaped keys, duplicate keys, nested
        /// values with brackets and quotes in strings) walks to the members serde reads.
        #[test]
        fn walks_to_the_members_serde_reads(
            members in prop::collection::vec(
                ("(?s)[a-z\"\\\\é\n]{0,6}", json_value(), any::<bool>(), space(), space()),
                0..6,
            ),
            duplicate in any::<bool>(),
            outer in space(),
        ) {
            let mut text = format!("{outer}{{");
            let mut written: Vec<(String, String)> = members
                .iter()
                .map(|(key, value, pretty, a, b)| {
                    let key = serde_json::to_string(key).unwrap();
                    let value = if *pretty {
                        serde_json::to_string_pretty(value).unwrap()
                    } else {
                        serde_json::to_string(value).unwrap()
                    };
                    (format!("{a}{key}{b}"), format!("{b}{value}{a}"))
                })
                .collect();
            if duplicate && !written.is_empty() {
                written.push(written[0].clone());
            }
            let joined: Vec<String> = written.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            text.push_str(&joined.join(","));
            text.push_str(&format!("}}{outer}"));

            let serde: Pairs<'_> = serde_json::from_str(&text).unwrap();
            let expected: Vec<(Cow<'_, str>, &str)> =
                serde.0.iter().map(|(k, v)| (k.clone(), v.get())).collect();
            prop_assert_eq!(walked(&text), Ok(expected));
        }

        /// Any bytes at all: the walk ends without a panic, and when it reads a whole
        /// object that serde reads too, it reads the same members.
        #[test]
        fn never_panics_and_never_disagrees(text in "(?s)[{}\\[\\]\",:\\\\ a-z0-9]{0,40}") {
            let walk = walked(&text);
            if let (Ok(walk), Ok(serde)) = (walk, serde_json::from_str::<Pairs<'_>>(&text)) {
                let expected: Vec<(Cow<'_, str>, &str)> =
                    serde.0.iter().map(|(k, v)| (k.clone(), v.get())).collect();
                prop_assert_eq!(walk, expected);
            }
        }
    }

    proptest! {
        /// Any array serde writes, compact or pretty: its elements are the raw values
        /// serde hands over.
        #[test]
        fn splits_arrays_as_serde_does(
            values in prop::collection::vec(json_value(), 0..6),
            pretty in any::<bool>(),
            pad in space(),
        ) {
            let array = serde_json::Value::from(values);
            let text = if pretty {
                serde_json::to_string_pretty(&array).unwrap()
            } else {
                serde_json::to_string(&array).unwrap()
            };
            let text = format!("{pad}{text}{pad}");
            let serde: Vec<&RawValue> = serde_json::from_str(&text).unwrap();
            let walked: Vec<&str> = elements(&text).unwrap().into_iter().map(Raw::get).collect();
            prop_assert_eq!(walked, serde.into_iter().map(RawValue::get).collect::<Vec<_>>());
        }
    }

    #[test]
    fn what_it_refuses() {
        assert!(elements("{}").is_none());
        assert_eq!(elements(" [ ] ").map(|e| e.len()), Some(0));
        assert!(members("[1]").is_none());
        assert!(members("\"x\"").is_none());
        assert_eq!(walked("{}"), Ok(vec![]));
        assert_eq!(walked(" { } "), Ok(vec![]));
        for bad in [
            "{",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{,"a":1}"#,
            r#"{"a":[1}"#,
            r#"{"a":"x"#,
            r#"{"\ud800":1}"#,
        ] {
            assert!(walked(bad).is_err(), "{bad}");
        }
    }

    /// `{"a":[[…1…]],"b":2}`, `depth` arrays deep.
    pub(in crate::json) fn deeply_nested(depth: usize) -> String {
        format!(
            r#"{{"a":{}1{},"b":2}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    }

    #[test]
    fn deep_nesting_costs_no_stack() {
        let text = deeply_nested(2_000_000);
        let walk = walked(&text).unwrap();
        assert_eq!(walk.len(), 2);
        assert_eq!(walk[1], (Cow::Borrowed("b"), "2"));
    }
}
