use super::*;
use crate::recall::{Condensed, Corpus};

fn body(messages: &[serde_json::Value]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap()
}

fn words(s: &str) -> u64 {
    s.len() as u64 / 4 + 1
}

/// Text that does not compress: a pseudo-random hex stream, `n` characters, seeded.
fn noise(seed: u64, n: usize) -> String {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap()
        })
        .collect()
}

#[test]
fn an_archive_keeps_the_messages_as_recall_shows_them_redacted_and_numbered_on() {
    let first = [
        serde_json::json!({"role": "user", "content": "The staging database listens on port 6543."}),
        serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"psql -p 6543\"}"}}]}),
        serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": "connected; api_key=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"}),
    ];
    let body_1 = body(&first);
    let parsed = crate::formats::chat::parse(&body_1).unwrap();
    let archive = Archive::of(None, &parsed.messages).unwrap();
    let opened = archive.open().unwrap();
    assert_eq!(opened.total, 3);
    assert_eq!(opened.left_out(), 0);
    let labels: Vec<(u32, &str)> = opened
        .messages
        .iter()
        .map(|m| (m.n, m.label.as_str()))
        .collect();
    assert_eq!(
        labels,
        [(1, "user"), (2, "assistant"), (3, "tool result call_1")]
    );
    assert!(opened.messages[1].text.contains("[tool call shell call_1]"));
    let result = &opened.messages[2].text;
    assert!(!result.contains("sk-proj-abc"), "redacted: {result}");
    assert!(result.contains("[REDACTED]"), "{result}");

    // A later compaction carries on from it: numbers go on, nothing before is repeated.
    let second = [serde_json::json!({"role": "user", "content": "Then deploy to the canary."})];
    let body_2 = body(&second);
    let parsed = crate::formats::chat::parse(&body_2).unwrap();
    let later = Archive::of(Some(&archive), &parsed.messages).unwrap();
    let opened = later.open().unwrap();
    assert_eq!(opened.total, 4);
    assert_eq!(opened.messages.len(), 4);
    assert_eq!(opened.messages[3].n, 4);

    // Recall reads it: by query, by `c` id, and by `m` id when the request has no
    // condensed messages of its own.
    let condensed = Condensed {
        checkpoint: None,
        archive: Some(later),
    };
    let corpus = Corpus::for_request(&[], &condensed);
    assert_eq!(corpus.span().as_deref(), Some("c1–c4"));
    let port = corpus.answer(r#"{"query": "staging database port"}"#, 2000, &words);
    assert!(
        port.contains("[c1 user]\nThe staging database listens on port 6543."),
        "{port}"
    );
    for id in ["c4", "m4", "4"] {
        let by_id = corpus.answer(&format!(r#"{{"id": "{id}"}}"#), 2000, &words);
        assert!(
            by_id.contains("Then deploy to the canary."),
            "{id}: {by_id}"
        );
    }
    assert!(Archive::of(None, &[]).is_none(), "nothing to archive");
}

#[test]
fn over_its_bound_an_archive_keeps_the_newest_and_says_what_it_left_out() {
    // 60 messages of 40,000 incompressible characters: each cut to its head and tail,
    // far over the compressed bound together.
    let messages: Vec<serde_json::Value> = (0..60)
        .map(|n| serde_json::json!({"role": "user", "content": format!("note {n}: {}", noise(n, 40_000))}))
        .collect();
    let body = body(&messages);
    let parsed = crate::formats::chat::parse(&body).unwrap();
    let archive = Archive::of(None, &parsed.messages).unwrap();
    assert!(
        archive.encoded().len() <= MAX_COMPRESSED.div_ceil(3) * 4,
        "{}",
        archive.encoded().len()
    );
    assert!(
        archive.encoded().len() > MAX_COMPRESSED,
        "filled near the bound"
    );
    let opened = archive.open().unwrap();
    assert_eq!(opened.total, 60);
    let kept = opened.messages.len() as u32;
    assert!((1..60).contains(&kept), "{kept}");
    assert_eq!(opened.left_out(), 60 - kept);
    assert_eq!(opened.messages.last().unwrap().n, 60, "the newest kept");
    let newest = &opened.messages.last().unwrap().text;
    assert!(newest.starts_with("note 59: "));
    assert!(
        newest.contains("characters omitted"),
        "cut to head and tail"
    );
    assert!(newest.chars().count() < MESSAGE_CHARS + 100);

    let corpus = Corpus::for_request(
        &[],
        &Condensed {
            checkpoint: None,
            archive: Some(archive),
        },
    );
    let answer = corpus.answer(r#"{"id": "c1"}"#, 2000, &words);
    let gone = opened.left_out();
    assert!(
        answer.contains(&format!("c1–c{gone} were left out of the archive")),
        "{answer}"
    );
    assert!(
        answer.contains("`c1` is not a condensed message"),
        "{answer}"
    );
}

#[test]
fn an_archive_over_its_bounds_is_not_opened() {
    assert_eq!(Archive::new("not base64 !").open(), None);
    assert_eq!(Archive::new("").open(), None);
    // Over the encoded bound: not even decoded.
    let long = "A".repeat(MAX_COMPRESSED.div_ceil(3) * 4 + 4);
    assert_eq!(Archive::new(&long).open(), None);
    // Inflates past the raw bound (a bomb of spaces inside valid JSON): refused.
    let mut json = b"{\"total\":0,\"messages\":[]".to_vec();
    json.extend(std::iter::repeat_n(b' ', MAX_RAW));
    json.push(b'}');
    let bomb = URL_SAFE_NO_PAD.encode(deflate(&json).unwrap());
    assert!(bomb.len() < 8 * 1024);
    assert_eq!(Archive::new(&bomb).open(), None);
    // The same within the bound opens.
    let small = URL_SAFE_NO_PAD.encode(deflate(br#"{"total":0,"messages":[]}"#).unwrap());
    assert_eq!(Archive::new(&small).open(), Some(Opened::default()));
}
