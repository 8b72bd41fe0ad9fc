//! A JSON string literal's text: borrowed where it lies when it has no escape, decoded
//! in one pass into one buffer when it has.

use std::borrow::Cow;

/// The text of the JSON string literal `raw` (quotes included). `None` when `raw` is
/// not a string, or holds an escape left to the parser (a lone surrogate).
pub fn string_text(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    let Some(first) = memchr::memchr(b'\\', inner.as_bytes()) else {
        return Some(Cow::Borrowed(inner));
    };
    let mut text = Vec::with_capacity(inner.len());
    text.extend_from_slice(&inner.as_bytes()[..first]);
    unescape(&inner.as_bytes()[first..], |piece| {
        text.extend_from_slice(piece)
    })?;
    // Valid UTF-8 in, decoded escapes are valid UTF-8: this cannot fail.
    String::from_utf8(text).ok().map(Cow::Owned)
}

/// The unescaped bytes of a JSON string's inner text, handed to `visit` piece by piece
/// (runs between escapes, and each escape decoded). `None` for an escape the JSON parser
/// would be needed for: anything malformed, or a `\u` surrogate not in a valid pair.
fn unescape(inner: &[u8], mut visit: impl FnMut(&[u8])) -> Option<()> {
    let mut rest = inner;
    while let Some(at) = memchr::memchr(b'\\', rest) {
        visit(&rest[..at]);
        let mut utf8 = [0u8; 4];
        let (piece, used): (&[u8], usize) = match *rest.get(at + 1)? {
            b'"' => (b"\"", 2),
            b'\\' => (b"\\", 2),
            b'/' => (b"/", 2),
            b'b' => (b"\x08", 2),
            b'f' => (b"\x0c", 2),
            b'n' => (b"\n", 2),
            b'r' => (b"\r", 2),
            b't' => (b"\t", 2),
            b'u' => {
                let high = hex4(rest.get(at + 2..at + 6)?)?;
                let (code, used) = if (0xD800..0xDC00).contains(&high) {
                    if rest.get(at + 6..at + 8)? != b"\\u" {
                        return None;
                    }
                    let low = hex4(rest.get(at + 8..at + 12)?)?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return None;
                    }
                    (0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00), 12)
                } else {
                    (high, 6)
                };
                // A lone low surrogate is not a char: left to the parser.
                let c = char::from_u32(code)?;
                (c.encode_utf8(&mut utf8).as_bytes(), used)
            }
            _ => return None,
        };
        visit(piece);
        rest = &rest[at + used..];
    }
    visit(rest);
    Some(())
}

/// Four hex digits, as a `\u` escape has them.
fn hex4(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |n, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return None,
        };
        Some(n << 4 | u32::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The one-pass decoder reads what the JSON parser reads, or leaves it to it.
        #[test]
        fn decodes_as_the_parser_does(text in "(?s)[a-z \n\t\"\\\\/é🌍\u{0}-\u{1f}\u{7f}-\u{ff}]{0,40}", mask in proptest::prelude::any::<u64>()) {
            let mut raw = String::from("\"");
            for (i, c) in text.chars().enumerate() {
                match c {
                    '"' => raw.push_str("\\\""),
                    '\\' => raw.push_str("\\\\"),
                    c if (c as u32) < 0x20 || mask >> (i % 64) & 1 == 1 => {
                        let mut units = [0u16; 2];
                        for u in c.encode_utf16(&mut units) {
                            raw.push_str(&format!("\\u{u:04X}"));
                        }
                    }
                    c => raw.push(c),
                }
            }
            raw.push('"');
            let parsed: String = serde_json::from_str(&raw).unwrap();
            let read = string_text(&raw);
            proptest::prop_assert_eq!(read.as_deref(), Some(parsed.as_str()));
        }
    }

    #[test]
    fn what_it_leaves_to_the_parser() {
        assert_eq!(string_text(r#""plain""#), Some(Cow::Borrowed("plain")));
        assert_eq!(string_text(r#""a\ud800b""#), None, "a lone surrogate");
        assert_eq!(string_text("42"), None, "not a string");
    }
}
