//! Tool results cleared in place: a user message whose `tool_result` blocks have their
//! `content` replaced by a digest (one block at a time, as the caller decides), every
//! other byte of the message kept — its other blocks, each result's `tool_use_id`,
//! `is_error` and `cache_control` — so it still answers the calls before it. And the
//! check that a message is such a digest of another.

use serde_json::Value;
use serde_json::value::RawValue;

use super::item::{MessageFields, block, result_text};
use crate::formats::splice::{Edit, apply, span_of};
use crate::json::{self, Raw};

/// `raw` (a message) with the `content` of each `tool_result` block that `line` gives a
/// text for (called with the block's `tool_use_id` and its content's text) replaced by
/// that text, as a JSON string. A result whose content is not text (an image among it)
/// is not offered. `None` when no block is replaced, or the message cannot be read.
pub fn with_results(
    raw: Raw<'_>,
    mut line: impl FnMut(&str, &str) -> Option<String>,
) -> Option<Box<RawValue>> {
    let whole = raw.get();
    let content = match json::fields(whole, ["content"]) {
        Some([content]) => content?.raw,
        None => serde_json::from_str::<MessageFields<'_>>(whole)
            .ok()?
            .content?
            .get(),
    };
    let mut edits = Vec::new();
    for element in json::elements(content)? {
        let Ok(b) = block(element.get()) else {
            continue;
        };
        let (true, Some(id), Some(value)) = (b.kind == "tool_result", b.tool_use_id, b.content)
        else {
            continue;
        };
        let span = span_of(whole.as_bytes(), value.raw)?;
        let Some(text) = result_text(value, block) else {
            continue;
        };
        if let Some(replacement) = line(&id, &text) {
            let bytes = serde_json::to_vec(&replacement).ok()?;
            edits.push(Edit { span, bytes });
        }
    }
    let spliced = apply(whole.as_bytes(), edits)?;
    RawValue::from_string(String::from_utf8(spliced.to_vec()).ok()?).ok()
}

/// Whether `digest` is `original` with only the `content` of some of its `tool_result`
/// blocks replaced by a string (what [`with_results`] makes).
pub fn same_but_results(digest: Raw<'_>, original: Raw<'_>) -> bool {
    type Object = serde_json::Map<String, Value>;
    let parse = |r: Raw<'_>| serde_json::from_str::<Object>(r.get()).ok();
    let (Some(mut d), Some(mut o)) = (parse(digest), parse(original)) else {
        return false;
    };
    let (Some(Value::Array(d_blocks)), Some(Value::Array(o_blocks))) =
        (d.remove("content"), o.remove("content"))
    else {
        return false;
    };
    d == o
        && d_blocks.len() == o_blocks.len()
        && d_blocks
            .into_iter()
            .zip(o_blocks)
            .all(|(d, o)| d == o || result_digest(d, o))
}

/// One block of a digest: a `tool_result` block as it was, its content now a string.
fn result_digest(digest: Value, original: Value) -> bool {
    let (Value::Object(mut d), Value::Object(mut o)) = (digest, original) else {
        return false;
    };
    let is_result = |b: &serde_json::Map<String, Value>| {
        b.get("type").and_then(Value::as_str) == Some("tool_result")
    };
    is_result(&d)
        && is_result(&o)
        && matches!(d.remove("content"), Some(Value::String(_)))
        && o.remove("content").is_some()
        && d == o
}
