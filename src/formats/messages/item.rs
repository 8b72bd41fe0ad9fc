//! One Messages message as a conversation item (the view the parent module's docs
//! describe). The body's parse has validated the message, so its fields and those of
//! its blocks are found by a walk over its bytes (`json::fields`) instead of a serde pass
//! over every string for each; what the walk leaves to serde (a duplicate field, a value
//! of a type serde refuses) is read by serde alone ([`item_by_serde`]), errors included.

use std::borrow::Cow;

use serde::Deserialize;

use crate::conversation::{Content, Item, Opaque, Part, Role, ToolCall};
use crate::json::{self, Raw};

#[derive(Deserialize)]
pub(super) struct MessageFields<'a> {
    #[serde(borrow)]
    pub(super) role: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) content: Option<Raw<'a>>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Raw<'a>>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Raw<'a>>,
}

/// A block's fields, the values abridge keeps raw as JSON text (`null` is absent).
pub(super) struct BlockFields<'a> {
    pub(super) kind: Cow<'a, str>,
    text: Option<Cow<'a, str>>,
    id: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    input: Option<&'a str>,
    pub(super) tool_use_id: Option<Cow<'a, str>>,
    pub(super) content: Option<json::Member<'a>>,
}

/// How a block's fields are read: walked, or by serde.
pub(super) type ReadBlock = for<'a> fn(&'a str) -> Result<BlockFields<'a>, serde_json::Error>;

/// A block's fields: walked, or by serde where the walk cannot read it.
pub(super) fn block(text: &str) -> Result<BlockFields<'_>, serde_json::Error> {
    walked_block(text).or_else(|_| serde_block(text))
}

/// One message as a conversation item.
pub fn item(raw: Raw<'_>) -> Result<Item<'_>, serde_json::Error> {
    let walked = json::fields(raw.get(), ["role", "content"]).and_then(|[role, content]| {
        let role = role?.text()?;
        build(raw, &role, content, walked_block).ok()
    });
    match walked {
        Some(item) => Ok(item),
        None => item_by_serde(raw),
    }
}

/// [`item`] through serde alone: what the walk must agree with (tests and fuzzing
/// compare them).
#[doc(hidden)]
pub fn item_by_serde(raw: Raw<'_>) -> Result<Item<'_>, serde_json::Error> {
    let f: MessageFields<'_> = serde_json::from_str(raw.get())?;
    let content = f.content.map(|c| json::Member::unread(c.get()));
    build(raw, &f.role, content, serde_block)
}

fn serde_block(text: &str) -> Result<BlockFields<'_>, serde_json::Error> {
    let b: Block<'_> = serde_json::from_str(text)?;
    Ok(BlockFields {
        kind: b.kind,
        text: b.text,
        id: b.id,
        name: b.name,
        input: b.input.map(Raw::get),
        tool_use_id: b.tool_use_id,
        content: b.content.map(|c| json::Member::unread(c.get())),
    })
}

/// A block walked; an error (to fall back to serde) where the walk cannot read it as
/// serde would.
fn walked_block(text: &str) -> Result<BlockFields<'_>, serde_json::Error> {
    let walk = || {
        let [kind, text, id, name, input, tool_use_id, content] = json::fields(
            text,
            [
                "type",
                "text",
                "id",
                "name",
                "input",
                "tool_use_id",
                "content",
            ],
        )?;
        Some(BlockFields {
            kind: kind?.text()?,
            text: json::optional_string(text)?,
            id: json::optional_string(id)?,
            name: json::optional_string(name)?,
            input: input.map(|i| i.raw),
            tool_use_id: json::optional_string(tool_use_id)?,
            content,
        })
    };
    walk().ok_or_else(|| serde::de::Error::custom("left to serde"))
}

fn build<'a>(
    raw: Raw<'a>,
    role: &str,
    content: Option<json::Member<'a>>,
    read: ReadBlock,
) -> Result<Item<'a>, serde_json::Error> {
    let mut item = Item {
        raw,
        role: match role {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "system" => Role::System,
            other => {
                return Err(serde::de::Error::custom(format!("unknown role {other:?}")));
            }
        },
        content: Content::None,
        name: None,
        calls: Vec::new(),
        results: Vec::new(),
        opaque: Opaque::None,
        extra: None,
        reasoning: None,
        dropped: false,
    };
    let Some(value) = content else {
        return Ok(item);
    };
    let text = value.raw;
    if text.starts_with('"') {
        if let Some(decoded) = value.text() {
            item.content = Content::Text(decoded);
            return Ok(item);
        }
        item.content = Content::Text(match json::string_text(text) {
            Some(s) => s,
            None => serde_json::from_str(text)?,
        });
        return Ok(item);
    }
    if !text.starts_with('[') {
        item.content = Content::Other(serde_json::from_str(text)?);
        return Ok(item);
    }
    let blocks = json::elements(text)
        .ok_or_else(|| <serde_json::Error as serde::de::Error>::custom("not an array"))?;
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        let b = read(block.get())?;
        match b.kind.as_ref() {
            "text" => parts.push(Part::Text(b.text.unwrap_or_default())),
            "tool_use" => item.calls.push(ToolCall {
                id: b.id.unwrap_or_default(),
                name: b.name.unwrap_or_default(),
                arguments: Cow::Borrowed(b.input.unwrap_or("{}")),
            }),
            "tool_result" => {
                item.results.extend(b.tool_use_id);
                if let Some(content) = b.content {
                    let raw = content.raw;
                    match result_text(content, read) {
                        Some(text) => parts.push(Part::Text(text)),
                        None => parts.push(Part::Other(serde_json::from_str(raw)?)),
                    }
                }
            }
            _ => parts.push(Part::Other(block)),
        }
    }
    item.content = Content::Parts(parts);
    Ok(item)
}

/// A tool result's content as text: a string, or text blocks only.
pub(super) fn result_text(value: json::Member<'_>, read: ReadBlock) -> Option<Cow<'_, str>> {
    let raw = value.raw;
    if raw.starts_with('"') {
        return value
            .text()
            .or_else(|| json::string_text(raw))
            .or_else(|| serde_json::from_str(raw).ok());
    }
    let blocks = json::elements(raw)?;
    // Every block read first (serde refuses the array for one bad block); what the walk
    // cannot read, serde reads.
    let all = |read: ReadBlock| -> Result<Vec<BlockFields<'_>>, serde_json::Error> {
        blocks.iter().map(|b| read(b.get())).collect()
    };
    let blocks = all(read).or_else(|_| all(serde_block)).ok()?;
    let mut out = String::new();
    for b in blocks {
        if b.kind != "text" {
            return None;
        }
        out.push_str(b.text.as_deref().unwrap_or_default());
    }
    Some(Cow::Owned(out))
}
