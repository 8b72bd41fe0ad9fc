//! [`Raw`]: a JSON value's text as it lies in a body that has been validated, borrowed
//! — what abridge forwards of a message it keeps, hashes, and reads by walking.

use serde_json::value::RawValue;

/// The text of one valid JSON value, without surrounding whitespace, borrowed from a
/// body (or from a `RawValue` abridge wrote). It is made only from JSON that has been
/// validated — by [`super::top`]'s pass, by serde_json (`From<&RawValue>`, and its
/// `Deserialize`, which borrows serde's raw value), or found by a walk inside such a
/// value ([`super::elements`]) — so the walks of this module can read it without
/// validating it again.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    /// The value's JSON text.
    pub fn get(self) -> &'a str {
        self.0
    }

    /// An owned copy (serde_json's: what a checkpoint stores). serde checks the text
    /// again, so an owned copy is valid JSON whatever made the `Raw`: `None` if it
    /// is not.
    pub fn to_boxed(self) -> Option<Box<RawValue>> {
        RawValue::from_string(self.0.to_owned()).ok()
    }

    /// Text the caller knows is one valid JSON value without surrounding whitespace
    /// (a value found by a walk over a validated value).
    pub(super) fn trusted(text: &'a str) -> Self {
        Self(text)
    }
}

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(raw: &'a RawValue) -> Self {
        Self(raw.get())
    }
}

impl std::fmt::Debug for Raw<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Raw<'a> {
    /// A value as serde_json hands it over raw (validated by its pass).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de RawValue as serde::Deserialize>::deserialize(d).map(Raw::from)
    }
}
