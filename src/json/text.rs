//! A JSON string literal's text: borrowed where it lies when it has no escape, decoded
//! in one pass into one buffer when it has.

use std::borrow::Cow;

/// The text of the JSON string literal `raw` (quotes included). `None` when `raw` is
/// not one string, or holds an escape left to the parser (a lone surrogate).
pub fn string_text(raw: &str) -> Option<Cow<'_, str>> {
    if !raw.starts_with('"') {
        return None;
    }
    match string_at(raw, 0)? {
        (end, text) if end == raw.len() => text,
        _ => None,
    }
}

/// The string literal that opens at `open` in `raw`: just past its closing quote, and
/// its text — borrowed where it has no escape, decoded as the scan meets the escapes
/// where it has (so a member the walk reads is scanned once); `None` for an escape left
/// to the parser: anything malformed, or a `\u` surrogate not in a valid pair. `None`
/// when the string does not end.
pub(super) fn string_at(raw: &str, open: usize) -> Option<(usize, Option<Cow<'_, str>>)> {
    let b = raw.as_bytes();
    let start = open + 1;
    let mut at = start;
    // The decoded text, once an escape is met (then `run` is where the undecoded run
    // starts); `decoded` is false after an escape the parser must read. Built as a
    // `String` from `raw`'s runs (cut at ASCII quotes and backslashes, so at char
    // boundaries) and decoded escapes: no UTF-8 check of the result.
    let mut text: Option<String> = None;
    let mut run = start;
    let mut decoded = true;
    loop {
        at += memchr::memchr2(b'"', b'\\', b.get(at..)?)?;
        if b[at] == b'"' {
            let text = match text {
                _ if !decoded => None,
                None => raw.get(start..at).map(Cow::Borrowed),
                Some(mut t) => {
                    t.push_str(raw.get(run..at)?);
                    // Sized for the rest of `raw`: a short string early in a long value
                    // gives the excess back.
                    if t.capacity() / 2 > t.len() {
                        t.shrink_to_fit();
                    }
                    Some(Cow::Owned(t))
                }
            };
            return Some((at + 1, text));
        }
        let mut utf8 = [0u8; 4];
        if decoded {
            if let Some((piece, used)) = escape(&b[at..], &mut utf8) {
                // Room for the rest of `raw` at most: one allocation, no growth.
                let t = text.get_or_insert_with(|| String::with_capacity(b.len() - start));
                t.push_str(raw.get(run..at)?);
                t.push_str(piece);
                at += used;
                run = at;
                continue;
            }
            decoded = false;
        }
        // An escape is a backslash and one ASCII byte (`\uXXXX`'s digits hold no quote or
        // backslash): skipping two bytes keeps the scan in step.
        at += 2;
    }
}

/// The escape at the start of `rest` (a backslash): its decoded bytes (in `utf8` for a
/// `\u` escape) and how many bytes it used; `None` where the parser must read it.
fn escape<'b>(rest: &[u8], utf8: &'b mut [u8; 4]) -> Option<(&'b str, usize)> {
    let simple: &'static str = match *rest.get(1)? {
        b'"' => "\"",
        b'\\' => "\\",
        b'/' => "/",
        b'b' => "\x08",
        b'f' => "\x0c",
        b'n' => "\n",
        b'r' => "\r",
        b't' => "\t",
        b'u' => {
            let high = hex4(rest.get(2..6)?)?;
            let (code, used) = if (0xD800..0xDC00).contains(&high) {
                if rest.get(6..8)? != b"\\u" {
                    return None;
                }
                let low = hex4(rest.get(8..12)?)?;
                if !(0xDC00..0xE000).contains(&low) {
                    return None;
                }
                (0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00), 12)
            } else {
                (high, 6)
            };
            // A lone low surrogate is not a char: left to the parser.
            let c = char::from_u32(code)?;
            return Some((c.encode_utf8(utf8), used));
        }
        _ => return None,
    };
    Some((simple, 2))
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
            // Found in a value with more after it, the string ends where it does and
            // reads the same in the walk's one pass.
            let within = format!("{raw},\"next\":1}}");
            let (end, text) = string_at(&within, 0).unwrap();
            proptest::prop_assert_eq!(end, raw.len());
            proptest::prop_assert_eq!(text.as_deref(), Some(parsed.as_str()));
        }

        /// Any text between quotes: the one pass ends where the string ends (the next
        /// quote no backslash escapes) and reads what serde reads of it; where it leaves
        /// the text to the parser, serde refuses it too.
        #[test]
        fn one_pass_reads_what_serde_reads(
            pieces in proptest::collection::vec(
                proptest::sample::select(&[
                    "a", "é", " ", "\n", "\"", "\\n", "\\\"", "\\\\", "\\/", "\\t", "\\u00e9",
                    "\\ud83d\\ude00", "\\ud800", "\\ude00", "\\x", "\\u12", "\\",
                ][..]),
                0..12,
            ),
        ) {
            let raw = format!("\"{}", pieces.concat());
            let mut end = None;
            let mut at = 1;
            let b = raw.as_bytes();
            while at < b.len() {
                match b[at] {
                    b'"' => { end = Some(at + 1); break; }
                    b'\\' => at += 2,
                    _ => at += 1,
                }
            }
            match string_at(&raw, 0) {
                None => proptest::prop_assert_eq!(end, None),
                Some((e, text)) => {
                    proptest::prop_assert_eq!(Some(e), end);
                    match serde_json::from_str::<String>(&raw[..e]) {
                        Ok(parsed) => proptest::prop_assert_eq!(text.as_deref(), Some(parsed.as_str())),
                        Err(_) => proptest::prop_assert!(text.is_none() || raw[..e].contains('\n')),
                    }
                }
            }
        }
    }

    #[test]
    fn what_it_leaves_to_the_parser() {
        assert_eq!(string_text(r#""plain""#), Some(Cow::Borrowed("plain")));
        assert_eq!(string_text(r#""a\ud800b""#), None, "a lone surrogate");
        assert_eq!(string_text("42"), None, "not a string");
        assert_eq!(
            string_at(r#""a\nb" "#, 0),
            Some((6, Some(Cow::Owned("a\nb".into()))))
        );
        assert_eq!(
            string_at(r#""a\ud800b","#, 0),
            Some((10, None)),
            "ends, left to the parser"
        );
        assert_eq!(string_at(r#""a\"#, 0), None, "does not end");
    }
}
