//! A long message's text in recall parts: at most a part's worth of characters each,
//! cut where the text allows without splitting a word, a path, a URL or an id, so a
//! query for one finds it whole in one part. One pass, linear in the text.

/// Characters that end a token in structured text (JSON, code, logs): a part may end
/// after one when its text has no line end or space near the limit.
const TOKEN_ENDS: &[char] = &[
    ',', ';', '"', '\'', '`', ')', ']', '}', '>', '(', '[', '{', '<',
];

/// `text` in parts of at most `limit` characters (`limit` > 0).
pub fn split(text: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((end, _)) = rest.char_indices().nth(limit) {
        let cut = part_end(&rest[..end]);
        out.push(rest[..cut].to_owned());
        rest = &rest[cut..];
    }
    out.push(rest.to_owned());
    out
}

/// Where a part whose longest form is `head` ends: after the last line end in its second
/// half, else after its last space there, else after its last [`TOKEN_ENDS`] there, else
/// at the end of `head` (a run of one token longer than half a part is cut).
fn part_end(head: &str) -> usize {
    let half = head.len() / 2;
    let after = |found: Option<usize>| {
        found
            .filter(|&n| n > half)
            .map(|n| n + head[n..].chars().next().map_or(1, char::len_utf8))
    };
    after(head.rfind('\n'))
        .or_else(|| after(head.rfind(char::is_whitespace)))
        .or_else(|| after(head.rfind(TOKEN_ENDS)))
        .unwrap_or(head.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_keep_the_text_and_their_limit() {
        let text = "é".repeat(25) + &"word ".repeat(40) + "\nlast line";
        let parts = split(&text, 30);
        assert_eq!(parts.concat(), text, "nothing lost, nothing added");
        assert!(parts.iter().all(|p| p.chars().count() <= 30), "{parts:?}");
        assert_eq!(split("short", 30), ["short"]);
        assert_eq!(split("", 30), [""]);
    }

    #[test]
    fn a_part_ends_at_a_line_end_then_a_space_then_a_token_end() {
        let lines = "aaaa aaaa\nbbbb bbbb\ncccc";
        assert_eq!(split(lines, 12)[0], "aaaa aaaa\n");
        let spaced = "aaaa bbbb cccc dddd";
        assert_eq!(split(spaced, 12)[0], "aaaa bbbb ");
        let json = r#"{"a":"x/y/z","b":"u/v/w"}"#;
        assert_eq!(split(json, 20)[0], r#"{"a":"x/y/z","b":""#);
        // One token longer than the part: cut at the limit.
        assert_eq!(split(&"x".repeat(25), 10)[0], "x".repeat(10));
    }

    #[test]
    fn every_url_of_a_long_json_line_is_whole_in_one_part() {
        let urls: Vec<String> = (0..300)
            .map(|i| format!("https://api.example.com/repos/o/r/pulls/comments/{i:010}/reactions"))
            .collect();
        let line = urls
            .iter()
            .map(|u| format!(r#"{{"url":"{u}","count":0}}"#))
            .collect::<Vec<_>>()
            .join(",");
        let parts = split(&line, 4000);
        assert!(parts.len() > 3);
        for url in &urls {
            assert!(
                parts.iter().any(|p| p.contains(url.as_str())),
                "{url} split"
            );
        }
    }
}
