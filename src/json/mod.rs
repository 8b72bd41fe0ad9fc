//! JSON as abridge reads request bodies: one validating pass over a body ([`top`], as
//! strict as serde_json, finding the top-level members and each array member's elements
//! on its way), then walks over the validated text that read what the formats need
//! without validating it again — a string literal's text ([`string_text`]) and an
//! object's named members ([`fields`]: each a [`Member`], its raw JSON and, for a
//! string, its text decoded in the same pass) — each read where it lies in the body, as
//! a [`Raw`] value.

mod object;
mod raw;
mod text;
mod valid;

pub use object::{Member, elements, fields, optional_string};
pub use raw::Raw;
pub use text::string_text;
pub use valid::{
    Top, TopValue, agrees_with_serde, optional_flag, optional_raw, optional_text, top,
};
