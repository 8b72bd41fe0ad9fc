//! Edits of a request body as splices: the bytes at the span of a borrowed value are
//! replaced, every other byte is kept exactly as the client wrote it. Shared by the
//! format modules.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use crate::json::Raw;

/// One change to a body: the bytes at `span` (of the original body) become `bytes`.
/// Edits computed from one parse never overlap; [`apply`] makes them in one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Range<usize>,
    pub bytes: Vec<u8>,
}

/// `body` with `edits` made, in one copy. `None` when there is nothing to change, or the
/// edits overlap (they never do when computed from one parse; nothing is risked if so).
pub fn apply(body: &[u8], mut edits: Vec<Edit>) -> Option<Bytes> {
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|e| e.span.start);
    if edits.windows(2).any(|w| w[0].span.end > w[1].span.start)
        || edits.iter().any(|e| e.span.end > body.len())
    {
        return None;
    }
    let size = body.len() + edits.iter().map(|e| e.bytes.len()).sum::<usize>()
        - edits.iter().map(|e| e.span.len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    let mut at = 0;
    for e in &edits {
        out.extend_from_slice(&body[at..e.span.start]);
        out.extend_from_slice(&e.bytes);
        at = e.span.end;
    }
    out.extend_from_slice(&body[at..]);
    Some(out.freeze())
}

/// Where `part` (a slice borrowed from `body`) lies in `body`.
pub fn span_of(body: &[u8], part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= body.len()).then_some(start..end)
}

/// A JSON array of `items`, each spliced in as is.
pub fn array(items: &[Raw<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + items.iter().map(|m| m.get().len() + 1).sum::<usize>());
    out.push(b'[');
    for (i, m) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m.get().as_bytes());
    }
    out.push(b']');
    out
}

/// `whole` with its member value `part` (a slice borrowed from it) replaced by the JSON
/// string `text`, every other byte kept.
pub fn with_string(
    whole: Raw<'_>,
    part: Raw<'_>,
    text: &str,
) -> Option<Box<serde_json::value::RawValue>> {
    let outer = whole.get();
    let span = span_of(outer.as_bytes(), part.get())?;
    let encoded = serde_json::to_string(text).ok()?;
    let spliced = format!("{}{encoded}{}", &outer[..span.start], &outer[span.end..]);
    serde_json::value::RawValue::from_string(spliced).ok()
}

/// Whether two JSON objects are equal apart from their member `key`.
pub fn same_except(a: Raw<'_>, b: Raw<'_>, key: &str) -> bool {
    type Object = serde_json::Map<String, serde_json::Value>;
    let parse = |r: Raw<'_>| serde_json::from_str::<Object>(r.get()).ok();
    match (parse(a), parse(b)) {
        (Some(mut a), Some(mut b)) => {
            a.remove(key);
            b.remove(key);
            a == b
        }
        _ => false,
    }
}

/// The edit that removes the member whose value is `value` (a slice borrowed from
/// `body`, a member of the top-level object) — its key, its value and one comma.
/// `None` when the bytes before the value are not `"key":` as expected.
pub fn remove_member(body: &[u8], value: &str) -> Option<Edit> {
    let span = span_of(body, value)?;
    let back = |mut at: usize| {
        while at > 0 && body[at - 1].is_ascii_whitespace() {
            at -= 1;
        }
        at
    };
    let colon = back(span.start).checked_sub(1)?;
    (body[colon] == b':').then_some(())?;
    let close = back(colon).checked_sub(1)?;
    (body[close] == b'"').then_some(())?;
    // A member name of the API's has no escaped quote.
    let open = body[..close].iter().rposition(|&b| b == b'"')?;
    let before = back(open).checked_sub(1)?;
    let mut end = span.end;
    while end < body.len() && body[end].is_ascii_whitespace() {
        end += 1;
    }
    match (body[before], body.get(end)) {
        (b',', _) => Some(Edit {
            span: before..span.end,
            bytes: Vec::new(),
        }),
        (b'{', Some(b',')) => Some(Edit {
            span: open..end + 1,
            bytes: Vec::new(),
        }),
        (b'{', Some(b'}')) => Some(Edit {
            span: open..span.end,
            bytes: Vec::new(),
        }),
        _ => None,
    }
}

/// The edit that appends `tool` (a JSON object) to a request's `tools` array (`tools`:
/// its value as written), or adds `"tools": [tool]` at the end of the top-level object
/// when there is none (or it is `null`). `None` when `tools` is not an array or the
/// body does not end its object where expected.
pub fn append_tool(body: &[u8], tools: Option<Raw<'_>>, tool: &str) -> Option<Edit> {
    match tools {
        // `"tools": null`: an array in its place.
        Some(tools) if tools.get() == "null" => {
            return Some(Edit {
                span: span_of(body, tools.get())?,
                bytes: format!("[{tool}]").into_bytes(),
            });
        }
        Some(tools) => {
            let text = tools.get();
            let inner = text.strip_prefix('[')?.strip_suffix(']')?;
            let bytes = match inner.trim().is_empty() {
                true => format!("[{tool}]"),
                false => format!("[{inner},{tool}]"),
            };
            return Some(Edit {
                span: span_of(body, text)?,
                bytes: bytes.into_bytes(),
            });
        }
        None => {}
    }
    let close = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    (body[close] == b'}').then(|| Edit {
        span: close..close,
        bytes: format!(",\"tools\":[{tool}]").into_bytes(),
    })
}

#[cfg(test)]
mod tool_tests {
    use super::*;

    fn with_tool(body: &str) -> Option<String> {
        let parsed = crate::formats::messages::parse(body.as_bytes()).unwrap();
        let edit = append_tool(body.as_bytes(), parsed.fields.tools, r#"{"name":"t"}"#)?;
        let out = apply(body.as_bytes(), vec![edit])?;
        Some(String::from_utf8(out.to_vec()).unwrap())
    }

    #[test]
    fn a_member_goes_with_its_comma_and_every_other_byte_stays() {
        let removed = |body: &str| {
            let parsed = crate::formats::messages::parse(body.as_bytes()).unwrap();
            let value = parsed.fields.context_management.unwrap();
            let edit = remove_member(body.as_bytes(), value.get())?;
            let out = apply(body.as_bytes(), vec![edit])?;
            Some(String::from_utf8(out.to_vec()).unwrap())
        };
        assert_eq!(
            removed(r#"{"a": 1, "context_management": {"edits": []}, "b": 2}"#).unwrap(),
            r#"{"a": 1, "b": 2}"#
        );
        assert_eq!(
            removed(r#"{ "context_management" : {"edits": []} , "b": 2}"#).unwrap(),
            r#"{  "b": 2}"#
        );
        assert_eq!(removed(r#"{"context_management": {}}"#).unwrap(), r#"{}"#);
    }

    #[test]
    fn the_tool_goes_after_the_clients_and_every_other_byte_stays() {
        assert_eq!(
            with_tool(r#"{"tools": [ {"name":"a"} ], "x": 1}"#).unwrap(),
            r#"{"tools": [ {"name":"a"} ,{"name":"t"}], "x": 1}"#
        );
        assert_eq!(
            with_tool(r#"{"tools": [ ], "x": 1}"#).unwrap(),
            r#"{"tools": [{"name":"t"}], "x": 1}"#
        );
        assert_eq!(
            with_tool(r#"{"tools": null}"#).unwrap(),
            r#"{"tools": [{"name":"t"}]}"#
        );
        assert_eq!(
            with_tool("{\"x\": 1}\n").unwrap(),
            "{\"x\": 1,\"tools\":[{\"name\":\"t\"}]}\n"
        );
        assert_eq!(with_tool(r#"{"tools": {"a": 1}}"#), None, "not an array");
    }
}
