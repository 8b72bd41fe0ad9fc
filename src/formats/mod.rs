//! The wire formats abridge reads, behind one seam. Each format is a module that maps
//! its bytes to the format-neutral conversation (`crate::conversation`) and back:
//! parsing by borrowing, the items' neutral view, and the few places where a plan must
//! write the format's own shapes — a message abridge authors (a marker, a summary), a
//! tool result whose output is replaced by a digest — and how to check such a digest.
//! Nothing outside a format module knows its field names.
//!
//! A closed set, so an enum: [`Format`] dispatches to the module.

use serde_json::value::RawValue;

use crate::conversation::Item;

/// Which wire format a conversation came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// OpenAI chat completions (`POST /v1/chat/completions`): `crate::chat`.
    #[default]
    Chat,
}

/// The role abridge gives a message it writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Author {
    User,
    System,
}

impl Format {
    /// One item of this format (a replacement message, to check or count it).
    pub fn item<'a>(self, raw: &'a RawValue) -> Option<Item<'a>> {
        match self {
            Format::Chat => crate::chat::item(raw).ok(),
        }
    }

    /// A message abridge writes: `text` as the content of a message of `role`.
    pub fn authored(self, role: Author, text: &str) -> Box<RawValue> {
        match self {
            Format::Chat => crate::chat::authored(role, text),
        }
    }

    /// The tool result `item` with its output replaced by `text`, everything else kept
    /// byte for byte; `None` when it cannot be spliced.
    pub fn digest(self, item: &Item<'_>, text: &str) -> Option<Box<RawValue>> {
        match self {
            Format::Chat => crate::chat::with_content(item.raw, text),
        }
    }

    /// Whether `digest` is `original` with only its output replaced.
    pub fn is_digest_of(self, digest: &RawValue, original: &RawValue) -> bool {
        match self {
            Format::Chat => crate::chat::same_but_content(digest, original),
        }
    }
}
