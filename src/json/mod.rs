//! Reading JSON that serde_json has already validated, without parsing it again: a
//! string literal's text ([`string_text`]) and an object's named members ([`fields`]:
//! each a [`Member`], its raw JSON and, for a string, its text decoded in the same
//! pass), each read where it lies in the body.

mod object;
mod text;

pub use object::{Member, fields, optional_string};
pub use text::string_text;
