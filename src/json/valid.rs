//! The validating pass over a request body: one scan that checks the whole body is JSON
//! as strictly as serde_json checks it, and on its way finds what the formats read at
//! the top — each member's key and raw value, and the elements of each array member
//! (a conversation's messages) — so that nothing is validated twice and the walks of
//! this module read the rest where it lies. A string is scanned eight bytes a step for
//! what ends a run of plain text (a quote, a backslash or a control byte), as serde's
//! own scan does.

use std::borrow::Cow;
use std::ops::Range;

use super::object::{skip_space, split_array};
use super::raw::Raw;
use super::text::string_text;

/// A validated body whose top level is an object: its members in order (duplicates
/// included) and, for each that is an array, its elements.
#[derive(Debug)]
pub struct Top<'a> {
    members: Vec<(&'a str, Raw<'a>, Option<Range<usize>>)>,
    elements: Vec<Raw<'a>>,
}

/// A member of [`Top`]: its raw value, and its elements when it is an array.
#[derive(Debug, Clone, Copy)]
pub struct TopValue<'a, 't> {
    pub raw: Raw<'a>,
    pub elements: Option<&'t [Raw<'a>]>,
}

impl<'a> TopValue<'a, '_> {
    /// The string's text; `None` when it is not a string, or holds a lone surrogate
    /// (which serde refuses where it reads a string).
    pub fn text(&self) -> Option<Cow<'a, str>> {
        string_text(self.raw.get())
    }

    fn is_null(&self) -> bool {
        self.raw.get() == "null"
    }
}

/// The body `text` validated (`None` when serde_json would refuse it, or its top level
/// is not an object), with its top level found on the way.
pub fn top(text: &str) -> Option<Top<'_>> {
    let b = text.as_bytes();
    let mut at = skip_space(b, 0);
    if b.get(at) != Some(&b'{') {
        return None;
    }
    let mut top = Top {
        members: Vec::new(),
        elements: Vec::new(),
    };
    at = skip_space(b, at + 1);
    if b.get(at) != Some(&b'}') {
        loop {
            let (key_end, start) = key(b, at)?;
            let key_text = text.get(at..key_end)?;
            let (end, elements) = if b.get(start) == Some(&b'[') {
                let first = top.elements.len();
                (
                    split_array(text, start, &mut top.elements, skip_value)?,
                    Some(first..top.elements.len()),
                )
            } else {
                (skip_value(b, start)?, None)
            };
            let value = Raw::trusted(text.get(start..end)?);
            top.members.push((key_text, value, elements));
            at = skip_space(b, end);
            match b.get(at)? {
                b',' => at = skip_space(b, at + 1),
                b'}' => break,
                _ => return None,
            }
        }
    }
    (skip_space(b, at + 1) == b.len()).then_some(top)
}

/// Whether [`top`]'s verdict on `text` is serde_json's: both accept it (JSON, an object
/// at the top) or both refuse it. What the fuzz targets and tests check.
#[doc(hidden)]
pub fn agrees_with_serde(text: &str) -> bool {
    let serde = serde_json::from_str::<&serde_json::value::RawValue>(text).is_ok()
        && text.trim_start().starts_with('{');
    top(text).is_some() == serde
}

impl<'a> Top<'a> {
    /// Each member in order: its key as written (quotes included) and its raw value.
    pub fn members(&self) -> impl Iterator<Item = (&'a str, Raw<'a>)> + '_ {
        self.members.iter().map(|(key, raw, _)| (*key, *raw))
    }

    /// The members named `names`, `null` included; `None` when a name appears twice or
    /// a key holds a lone surrogate (serde's read of the body gives the error then).
    pub fn fields<const N: usize>(
        &self,
        names: [&str; N],
    ) -> Option<[Option<TopValue<'a, '_>>; N]> {
        let mut found = [const { None }; N];
        for (key, raw, elements) in &self.members {
            let key = string_text(key)?;
            if let Some(i) = names.iter().position(|n| *n == key) {
                let elements = elements.clone().map(|r| &self.elements[r]);
                if found[i]
                    .replace(TopValue {
                        raw: *raw,
                        elements,
                    })
                    .is_some()
                {
                    return None;
                }
            }
        }
        Some(found)
    }
}

/// An optional string member as serde reads it into `Option<Cow<str>>`: `Some(None)`
/// when absent or `null`, `None` when serde would refuse it (or should read it).
pub fn optional_text<'a>(value: Option<TopValue<'a, '_>>) -> Option<Option<Cow<'a, str>>> {
    match value {
        None => Some(None),
        Some(v) if v.is_null() => Some(None),
        Some(v) => v.text().map(Some),
    }
}

/// An optional boolean member as serde reads it into `Option<bool>`.
pub fn optional_flag(value: Option<TopValue<'_, '_>>) -> Option<Option<bool>> {
    match value.map(|v| v.raw.get()) {
        None | Some("null") => Some(None),
        Some("true") => Some(Some(true)),
        Some("false") => Some(Some(false)),
        Some(_) => None,
    }
}

/// An optional raw member as serde reads it into `Option<&RawValue>`: `null` is absent.
pub fn optional_raw<'a>(value: Option<TopValue<'a, '_>>) -> Option<Raw<'a>> {
    value.filter(|v| !v.is_null()).map(|v| v.raw)
}

/// The key whose opening quote is at `at`, then its colon: just past the key, and
/// where the value starts.
fn key(b: &[u8], at: usize) -> Option<(usize, usize)> {
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let end = string_end(b, at)?;
    let colon = skip_space(b, end);
    (b.get(colon) == Some(&b':')).then(|| (end, skip_space(b, colon + 1)))
}

/// Just past the valid JSON value that starts at `at`; `None` when there is none.
/// Iterative: any depth costs one bit of [`Open`] a level, no stack.
fn skip_value(b: &[u8], mut at: usize) -> Option<usize> {
    let mut open = Open::default();
    loop {
        at = match *b.get(at)? {
            b'"' => string_end(b, at)?,
            b'{' => {
                at = skip_space(b, at + 1);
                if b.get(at) != Some(&b'}') {
                    open.push(true);
                    at = key(b, at)?.1;
                    continue;
                }
                at + 1
            }
            b'[' => {
                at = skip_space(b, at + 1);
                if b.get(at) != Some(&b']') {
                    open.push(false);
                    continue;
                }
                at + 1
            }
            b't' => literal(b, at, b"true")?,
            b'f' => literal(b, at, b"false")?,
            b'n' => literal(b, at, b"null")?,
            b'-' | b'0'..=b'9' => number(b, at)?,
            _ => return None,
        };
        // A value ended at `at`: close the containers it ends, to the next value.
        loop {
            let Some(object) = open.top() else {
                return Some(at);
            };
            at = skip_space(b, at);
            match (*b.get(at)?, object) {
                (b',', true) => at = key(b, skip_space(b, at + 1))?.1,
                (b',', false) => at = skip_space(b, at + 1),
                (b'}', true) | (b']', false) => {
                    open.pop();
                    at += 1;
                    continue;
                }
                _ => return None,
            }
            break;
        }
    }
}

/// The containers open around a value, innermost last: `true` for an object. The first
/// 128 levels in one word, deeper ones (rare, and what serde also accepts) in a `Vec`.
#[derive(Default)]
struct Open {
    depth: usize,
    bits: u128,
    deeper: Vec<bool>,
}

impl Open {
    fn push(&mut self, object: bool) {
        if self.depth < 128 {
            let bit = 1u128 << self.depth;
            self.bits = if object {
                self.bits | bit
            } else {
                self.bits & !bit
            };
        } else {
            self.deeper.push(object);
        }
        self.depth += 1;
    }

    fn top(&self) -> Option<bool> {
        let d = self.depth.checked_sub(1)?;
        if d < 128 {
            Some(self.bits >> d & 1 == 1)
        } else {
            self.deeper.last().copied()
        }
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 128 {
            self.deeper.pop();
        }
    }
}

/// Just past the string whose opening quote is at `open`: no control byte unescaped,
/// every escape one JSON has (`\u` with four hex digits; a lone surrogate passes, as
/// serde passes it in what it does not read as a string).
fn string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut at = open + 1;
    loop {
        at += stop(b.get(at..)?)?;
        match b[at] {
            b'"' => return Some(at + 1),
            b'\\' => {}
            _ => return None,
        }
        at += match *b.get(at + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
            b'u' if b.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => 6,
            _ => return None,
        };
    }
}

/// The first byte of `rest` that ends a run of a string's plain text: a quote, a
/// backslash or a control byte (which a string must escape). Eight bytes a step, each
/// tested for all three at once (the zero-byte trick: a byte's top bit survives
/// `(v - 0x01..) & !v` only when it was zero, or, for `< 0x20`, below the subtrahend).
fn stop(rest: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    let mut chunks = rest.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let v = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let quote = v ^ (ONES * u64::from(b'"'));
        let slash = v ^ (ONES * u64::from(b'\\'));
        let found = ((quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (v.wrapping_sub(ONES * 0x20) & !v))
            & HIGH;
        if found != 0 {
            // The lowest flagged byte is exact (a borrow only runs upwards).
            return Some(at + found.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let tail = chunks.remainder();
    tail.iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|p| at + p)
}

/// Just past the literal `word` at `at`.
fn literal(b: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    (b.get(at..at + word.len())? == word).then_some(at + word.len())
}

/// Just past the number at `at`: `-`, then `0` or digits without a leading zero, then
/// an optional fraction and exponent, each with at least one digit.
fn number(b: &[u8], mut at: usize) -> Option<usize> {
    if b[at] == b'-' {
        at += 1;
    }
    at = match *b.get(at)? {
        b'0' => at + 1,
        b'1'..=b'9' => digits(b, at),
        _ => return None,
    };
    if b.get(at) == Some(&b'.') {
        at = some_digits(b, at + 1)?;
    }
    if matches!(b.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(b.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        at = some_digits(b, at)?;
    }
    Some(at)
}

/// Just past the digits at `at` (none: `at`).
fn digits(b: &[u8], at: usize) -> usize {
    let rest = b.get(at..).unwrap_or_default();
    at + rest
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(rest.len())
}

/// Just past the digits at `at`; `None` when there is none.
fn some_digits(b: &[u8], at: usize) -> Option<usize> {
    let end = digits(b, at);
    (end > at).then_some(end)
}

#[cfg(test)]
#[path = "valid_tests.rs"]
mod tests;
