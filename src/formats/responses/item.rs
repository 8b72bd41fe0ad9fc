//! One Responses input item as a conversation item (the view the parent module's docs
//! describe). The body's parse has validated the item, so its fields are found by a
//! walk over its bytes (`json::fields`) instead of a second serde pass over every
//! string; what the walk leaves to serde (a duplicate field, a value of a type serde
//! refuses) is read by serde alone ([`item_by_serde`]), errors included.

use std::borrow::Cow;

use serde::Deserialize;

use crate::conversation::{Content, Item, Opaque, Role, ToolCall};
use crate::json::{self, Raw};

/// What kind of item, where it matters beyond the neutral view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Plain,
    Reference,
    Trigger,
}

#[derive(Deserialize)]
pub(super) struct ItemFields<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Raw<'a>>,
    #[serde(borrow, default)]
    call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) output: Option<Raw<'a>>,
    #[serde(borrow, default)]
    action: Option<Raw<'a>>,
    #[serde(borrow, default)]
    encrypted_content: Option<Cow<'a, str>>,
}

/// The same fields with the values abridge keeps raw as JSON text (`null` is absent).
struct Values<'a> {
    kind: Option<Cow<'a, str>>,
    role: Option<Cow<'a, str>>,
    content: Option<json::Member<'a>>,
    call_id: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    arguments: Option<Cow<'a, str>>,
    input: Option<Cow<'a, str>>,
    output: Option<json::Member<'a>>,
    action: Option<&'a str>,
    encrypted_content: Option<Cow<'a, str>>,
}

/// One input item as a conversation item (see the parent module's docs).
pub fn item(raw: Raw<'_>) -> Result<Item<'_>, serde_json::Error> {
    item_of(raw).map(|(item, _)| item)
}

/// The item and its kind: walked when the walk reads it, else by serde.
pub(super) fn item_of(raw: Raw<'_>) -> Result<(Item<'_>, Kind), serde_json::Error> {
    match walked(raw.get()).map(|values| build(raw, values)) {
        Some(Ok(read)) => Ok(read),
        _ => by_serde(raw),
    }
}

/// [`item`] through serde alone: what the walk must agree with (tests and fuzzing
/// compare them).
#[doc(hidden)]
pub fn item_by_serde(raw: Raw<'_>) -> Result<Item<'_>, serde_json::Error> {
    by_serde(raw).map(|(item, _)| item)
}

fn by_serde(raw: Raw<'_>) -> Result<(Item<'_>, Kind), serde_json::Error> {
    let f: ItemFields<'_> = serde_json::from_str(raw.get())?;
    let values = Values {
        kind: f.kind,
        role: f.role,
        content: f.content.map(|c| json::Member::unread(c.get())),
        call_id: f.call_id,
        name: f.name,
        arguments: f.arguments,
        input: f.input,
        output: f.output.map(|o| json::Member::unread(o.get())),
        action: f.action.map(Raw::get),
        encrypted_content: f.encrypted_content,
    };
    build(raw, values)
}

/// The item's fields, walked; `None` for whatever the walk leaves to serde.
fn walked(text: &str) -> Option<Values<'_>> {
    let names = [
        "type",
        "role",
        "content",
        "call_id",
        "name",
        "arguments",
        "input",
        "output",
        "action",
        "encrypted_content",
    ];
    let [
        kind,
        role,
        content,
        call_id,
        name,
        arguments,
        input,
        output,
        action,
        encrypted_content,
    ] = json::fields(text, names)?;
    Some(Values {
        kind: json::optional_string(kind)?,
        role: json::optional_string(role)?,
        content,
        call_id: json::optional_string(call_id)?,
        name: json::optional_string(name)?,
        arguments: json::optional_string(arguments)?,
        input: json::optional_string(input)?,
        output,
        action: action.map(|a| a.raw),
        encrypted_content: json::optional_string(encrypted_content)?,
    })
}

fn build<'a>(raw: Raw<'a>, f: Values<'a>) -> Result<(Item<'a>, Kind), serde_json::Error> {
    let mut item = Item {
        raw,
        role: Role::Assistant,
        content: Content::None,
        name: None,
        calls: Vec::new(),
        results: Vec::new(),
        opaque: Opaque::None,
        extra: None,
        reasoning: None,
        dropped: false,
    };
    let kind = f.kind.as_deref().unwrap_or("message");
    let mut what = Kind::Plain;
    match kind {
        "message" => {
            let role = f.role.as_deref().unwrap_or("user");
            item.role = match role {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "system" => Role::System,
                "developer" => Role::Developer,
                _ => {
                    item.extra = Some(raw);
                    Role::User
                }
            };
            item.content = content(f.content)?;
        }
        "function_call" | "custom_tool_call" | "local_shell_call" => {
            let arguments = match kind {
                "custom_tool_call" => f.input.unwrap_or_default(),
                "local_shell_call" => Cow::Borrowed(f.action.unwrap_or("")),
                _ => f.arguments.unwrap_or_default(),
            };
            let fallback = match kind {
                "custom_tool_call" => "custom_tool_call",
                "local_shell_call" => "local_shell_call",
                _ => "function_call",
            };
            item.calls.push(ToolCall {
                id: f.call_id.unwrap_or_default(),
                name: f.name.unwrap_or(Cow::Borrowed(fallback)),
                arguments,
            });
        }
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
            item.role = Role::Tool;
            item.results.extend(f.call_id);
            item.content = content(f.output)?;
        }
        "reasoning" => {
            item.opaque = Opaque::WithNext;
            item.extra = Some(raw);
            let cipher = f.encrypted_content.as_deref().map_or(0, str::len);
            item.reasoning = Some(crate::tokens::reasoning(cipher));
        }
        "compaction" => {
            item.opaque = Opaque::Barrier;
            item.extra = Some(raw);
        }
        other => {
            what = match other {
                "item_reference" => Kind::Reference,
                "compaction_trigger" => Kind::Trigger,
                _ => Kind::Plain,
            };
            item.extra = Some(raw);
        }
    }
    Ok((item, what))
}

/// A content (or output): text parts are `input_text`, `output_text` and `text`.
fn content(value: Option<json::Member<'_>>) -> Result<Content<'_>, serde_json::Error> {
    value.map_or(Ok(Content::None), |value| {
        super::super::content(value, &["input_text", "output_text", "text"])
    })
}
