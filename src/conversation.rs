//! The format-neutral view of a conversation: what identity, the token estimate, the
//! strategies and the validator see, whichever wire format the request came in (chat
//! completions, Responses, Anthropic Messages; see `crate::formats`).
//!
//! A conversation is a list of [`Item`]s. Each keeps its exact bytes ([`Item::raw`]:
//! what is forwarded when the item is kept) and a parsed view of what carries meaning:
//! its role, its content, the tool calls it makes, the calls it answers, whether it is
//! opaque (a reasoning item that travels with the next one, a provider's own compaction
//! item that nothing before may be moved past), and any bytes abridge does not model
//! but must not ignore ([`Item::extra`]). A format module builds the items when it
//! parses a request, once; nothing downstream looks at the wire format's field names.

use std::borrow::Cow;

use serde::Deserialize;

use crate::json::Raw;

/// One item of a conversation.
#[derive(Debug, Clone)]
pub struct Item<'a> {
    /// The item's exact bytes in the request.
    pub raw: Raw<'a>,
    pub role: Role,
    pub content: Content<'a>,
    /// A participant's name (chat's `name`), when given and not empty.
    pub name: Option<Cow<'a, str>>,
    /// The tool calls it makes (an assistant's).
    pub calls: Vec<ToolCall<'a>>,
    /// The ids of the calls it answers (a tool result; an Anthropic user message may
    /// answer several).
    pub results: Vec<Cow<'a, str>>,
    pub opaque: Opaque,
    /// Bytes that carry meaning but abridge does not model (a shape of tool calls it
    /// does not know, an unknown block or item type): part of identity, counted by size.
    pub extra: Option<Raw<'a>>,
    /// A Responses `reasoning` item: the reasoning tokens it carries, as the provider
    /// bills them (see [`crate::tokens::reasoning`]) — not its ciphertext's length.
    pub reasoning: Option<u64>,
    /// A Responses `reasoning` item of a turn before the last ask: the provider drops it
    /// from the prompt (OpenAI reads an earlier turn's reasoning no more), so it counts
    /// no tokens. It is forwarded as it is, and it is not part of identity (it is set by
    /// where the item stands, which a later ask changes).
    pub dropped: bool,
}

/// The same bytes and the same view (what the fast and the reference parse of a format
/// are compared by).
impl PartialEq for Item<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.raw.get() == other.raw.get()
            && self.role == other.role
            && self.content == other.content
            && self.name == other.name
            && self.calls == other.calls
            && self.results == other.results
            && self.opaque == other.opaque
            && self.extra.map(Raw::get) == other.extra.map(Raw::get)
            && self.reasoning == other.reasoning
            && self.dropped == other.dropped
    }
}

impl Item<'_> {
    /// A tool (or legacy function) result: it belongs to the call it answers.
    pub fn is_result(&self) -> bool {
        !self.results.is_empty() || self.role == Role::Function
    }

    /// A user's own words (not a message that only carries tool results): the final
    /// turn starts at the last of these.
    pub fn is_ask(&self) -> bool {
        self.role == Role::User && self.results.is_empty()
    }

    /// Part of the head: the leading system and developer items are never moved.
    pub fn is_instruction(&self) -> bool {
        matches!(self.role, Role::System | Role::Developer)
    }
}

/// Whose an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// Chat's deprecated predecessor of `tool`: answers the nearest earlier assistant.
    Function,
}

/// Items that are not plain messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Opaque {
    #[default]
    None,
    /// Travels with the item after it (a reasoning item, a thinking block's message):
    /// both are kept or both replaced, and it is never edited.
    WithNext,
    /// The provider's own compaction item: opaque and encrypted; only what follows it
    /// may be compacted.
    Barrier,
}

/// An item's content.
#[derive(Debug, Clone)]
pub enum Content<'a> {
    /// Absent or `null` (e.g. an assistant message that only calls tools).
    None,
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
    /// Any other JSON value; forwarded as is.
    Other(Raw<'a>),
}

/// One element of a content array.
#[derive(Debug, Clone)]
pub enum Part<'a> {
    /// A text part, whatever the format calls it (`text`, `input_text`, `output_text`).
    Text(Cow<'a, str>),
    /// Images, audio, files, refusals...: kept raw.
    Other(Raw<'a>),
}

/// The `type` of a raw content part (an [`Part::Other`]), read wherever the key stands
/// (serializers that sort keys write an image's data first) in one pass that skips the
/// rest; `None` when it has none or is not a JSON object.
pub fn part_type(raw: &str) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<Kind<'_>>(raw).ok()?.kind
}

/// One tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall<'a> {
    pub id: Cow<'a, str>,
    pub name: Cow<'a, str>,
    /// The arguments as the model wrote them (a JSON document in a string).
    pub arguments: Cow<'a, str>,
}

impl PartialEq for Part<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Part::Text(a), Part::Text(b)) => a == b,
            (Part::Other(a), Part::Other(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl PartialEq for Content<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Content::None, Content::None) => true,
            (Content::Text(a), Content::Text(b)) => a == b,
            (Content::Parts(a), Content::Parts(b)) => a == b,
            (Content::Other(a), Content::Other(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl<'a> Content<'a> {
    /// The text when the content is only text: a string, or an array whose parts are all
    /// text (concatenated, as providers read them). `None` for anything else.
    pub fn as_text(&self) -> Option<Cow<'a, str>> {
        match self {
            Content::Text(s) => Some(s.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for part in parts {
                    match part {
                        Part::Text(t) => out.push_str(t),
                        Part::Other(_) => return None,
                    }
                }
                Some(Cow::Owned(out))
            }
            Content::None | Content::Other(_) => None,
        }
    }

    /// All the text, non-text parts left out, parts separated by newlines: for
    /// summaries and token estimates.
    pub fn text_lossy(&self) -> Cow<'a, str> {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::Text(t) => Some(t.as_ref()),
                        Part::Other(_) => None,
                    })
                    .collect();
                Cow::Owned(texts.join("\n"))
            }
            Content::None | Content::Other(_) => Cow::Borrowed(""),
        }
    }

    /// Whether there is no text at all (and nothing else).
    pub fn is_empty(&self) -> bool {
        match self {
            Content::None => true,
            Content::Text(t) => t.is_empty(),
            Content::Parts(parts) => parts.is_empty(),
            Content::Other(_) => false,
        }
    }
}
