use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::formats::Format;
use crate::recall::NAME;
use crate::recall::stream::Carry;

fn round() -> Round {
    Round::new(Carry::new(Format::Chat, json!("auto"), NAME.into()))
}

fn chunk(delta: serde_json::Value, finish: serde_json::Value) -> String {
    let chunk =
        json!({"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {chunk}\n\n")
}

/// A call of `name` whose arguments come in `pieces` deltas of `each` bytes.
fn call(name: &str, pieces: usize, each: usize) -> String {
    let mut out = chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}]}),
        json!(null),
    );
    for _ in 0..pieces {
        let arguments = "x".repeat(each);
        out.push_str(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
            json!(null),
        ));
    }
    out.push_str(&chunk(json!({}), json!("tool_calls")));
    out.push_str("data: [DONE]\n\n");
    out
}

/// `stream` fed to a reader (bound `max`) in pieces of `piece` bytes: what the client got,
/// whether the stream was ended, and the round.
fn feed(stream: &[u8], piece: usize, max: usize) -> (Vec<u8>, bool, Round) {
    let mut round = round();
    let mut reader = Reader::new(max);
    let mut out = Vec::new();
    for data in stream.chunks(piece) {
        match reader.feed(&mut round, data) {
            Fed::Bytes(bytes) => out.extend(bytes),
            Fed::End(bytes) => {
                out.extend(bytes);
                return (out, true, round);
            }
        }
    }
    out.extend(reader.finish(&round));
    (out, false, round)
}

#[test]
fn the_search_for_an_events_end_resumes_where_it_stopped() {
    // A line of a megabyte with no end, a byte at a time: every byte is examined once.
    let mut scan = Scan::default();
    let mut bytes = b"data: ".to_vec();
    for _ in 0..1_000_000 {
        bytes.push(b'x');
        assert_eq!(scan.end(&bytes, true), None);
        assert_eq!(scan.at, bytes.len(), "never back to the start");
    }
    bytes.extend_from_slice(b"\r\n");
    assert_eq!(
        scan.end(&bytes, true),
        None,
        "one line end: not a blank line"
    );
    bytes.extend_from_slice(b"\r");
    assert_eq!(scan.end(&bytes, true), None, "a CR may start a CRLF: wait");
    bytes.extend_from_slice(b"\nnext");
    assert_eq!(scan.end(&bytes, true), Some(bytes.len() - 4));
}

proptest! {
    /// However a stream is cut into pieces, and whatever its line ends, the events the
    /// reader finds are those `next_event` finds in the whole: a round without calls
    /// relays the stream as it came.
    #[test]
    fn a_stream_is_read_as_the_same_events_however_it_is_cut(
        piece in 1usize..64,
        crlf in any::<bool>(),
        words in proptest::collection::vec("[a-z ]{0,12}", 1..12),
    ) {
        let mut stream: String = words
            .iter()
            .map(|w| chunk(json!({"content": w}), json!(null)))
            .collect();
        stream.push_str(": keep-alive\n\n");
        stream.push_str(&chunk(json!({}), json!("stop")));
        stream.push_str("data: [DONE]\n\n");
        if crlf {
            stream = stream.replace('\n', "\r\n");
        }
        let (out, ended, _) = feed(stream.as_bytes(), piece, 1 << 20);
        prop_assert!(!ended);
        prop_assert_eq!(String::from_utf8(out).unwrap(), stream);
    }
}

#[test]
fn a_round_past_its_bound_relays_what_it_held_and_keeps_nothing_more() {
    // A client's call of 2 MB in 1 KB deltas, a bound of 256 KB: given up at the bound,
    // the call reaches the client whole and as it came.
    let stream = call("shell", 2048, 1024);
    let (out, ended, round) = feed(stream.as_bytes(), 4096, 256 * 1024);
    assert!(!ended);
    assert_eq!(String::from_utf8(out).unwrap(), stream);
    assert!(round.given_up && round.held.is_empty() && round.parts.is_empty());
    assert!(round.kept() <= 256 * 1024 + 4096, "{}", round.kept());
    assert!(round.recalled(true).is_none());
}

#[test]
fn a_recall_call_past_the_bound_is_taken_out() {
    let stream = call(NAME, 2048, 1024);
    let (out, ended, round) = feed(stream.as_bytes(), 4096, 256 * 1024);
    let out = String::from_utf8(out).unwrap();
    assert!(!ended);
    assert!(
        !out.contains(NAME) && !out.contains("xxxx"),
        "{}",
        &out[..out.len().min(500)]
    );
    assert!(out.contains(r#""finish_reason":"stop""#), "{out}");
    assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
    assert!(
        round.recalled(true).is_none(),
        "no follow-up: recall was given up"
    );
}

#[test]
fn one_event_past_the_bound_passes_unread_unless_it_may_be_abridges() {
    // A client's call in one event of 1 MB: relayed as it came, the events after it read.
    let stream = call("shell", 1, 1 << 20);
    for piece in [1000, 4096, 65536] {
        let (out, ended, _) = feed(stream.as_bytes(), piece, 256 * 1024);
        assert!(!ended, "{piece}");
        assert_eq!(out, stream.as_bytes(), "{piece}");
    }
    // An event that ends its last line in one piece and its blank line in the next: the
    // event after it is read again (text that names the tool passes; unread, it would
    // have ended the stream).
    let line = format!("data: {}\n", "z".repeat(300_000));
    let text = chunk(json!({"content": format!("see {NAME}")}), json!(null));
    let stream = format!("{line}\n{text}");
    let (out, ended, _) = feed(stream.as_bytes(), line.len(), 256 * 1024);
    assert!(!ended);
    assert_eq!(String::from_utf8(out).unwrap(), stream);
    // The same event, abridge's call: the stream ends with the error, the call unsent.
    let stream = call(NAME, 1, 1 << 20);
    let (out, ended, _) = feed(stream.as_bytes(), 4096, 256 * 1024);
    let out = String::from_utf8(out).unwrap();
    assert!(ended);
    assert!(!out.contains(NAME) && !out.contains("xxxx"), "{out}");
    assert!(
        out.ends_with("\n\n") && out.contains(r#"data: {"error""#),
        "{out}"
    );
    // A client's event that names the tool (cut anywhere): ended where the name shows.
    let named = format!("data: {}{NAME}{}\n\n", "x".repeat(300_000), "y".repeat(10));
    for piece in [7, 1000, 4096] {
        let (out, ended, _) = feed(named.as_bytes(), piece, 256 * 1024);
        let out = String::from_utf8(out).unwrap();
        assert!(ended, "{piece}");
        assert!(!out.contains(NAME), "{piece}");
        assert!(
            out.ends_with("\n\n") && out.contains(r#"data: {"error""#),
            "{piece}"
        );
    }
}
