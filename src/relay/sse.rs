//! Incremental server-sent-events scanner: reads `usage` as a stream passes and, when
//! abridge asked the provider for usage on the client's behalf, removes what the client
//! did not ask for.
//!
//! Events end at a blank line; lines end in CRLF, LF or CR (WHATWG HTML §9.2), and an
//! event, a line, even a CRLF pair may be split across chunks. The scanner keeps only
//! the unfinished tail of the current event between chunks.
//!
//! Two modes:
//! - **observe** (the client asked for usage, or none was requested): every chunk is
//!   returned unchanged, at once; the scanner only looks.
//! - **strip** (abridge added `stream_options.include_usage`): complete events are
//!   released as soon as their blank line arrives; the usage-only event (`choices: []`
//!   with a `usage` object) is dropped, and the `"usage":null` member that
//!   `include_usage` adds to every other chunk is removed when it is the last member
//!   (OpenAI's layout), so the client receives the bytes it would have received directly.

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use memchr::{memchr2, memmem};

use super::usage::{Envelope, Usage};

/// Longest event kept for inspection; a stream with longer "events" is not SSE as
/// abridge knows it, so scanning stops and bytes flow on untouched.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

const NULL_MEMBER: &[u8] = br#","usage":null"#;

#[derive(Debug)]
pub struct SseTap {
    strip: bool,
    /// The unfinished current event (a copy in observe mode, held back in strip mode).
    partial: Vec<u8>,
    /// The previous byte ended a line.
    at_line_start: bool,
    /// The previous byte was a CR: a following LF completes the same line ending.
    after_cr: bool,
    /// Scanning gave up (oversized event); bytes pass untouched from here on.
    disabled: bool,
    /// The last complete event was dropped (strip mode).
    dropped_last: bool,
    usage: Option<Usage>,
    dropped_events: u32,
}

enum Action {
    Keep,
    Drop,
    /// Keep the event without the `,"usage":null` member that starts at this offset.
    CutNull(usize),
}

/// `event` without the `,"usage":null` member at `start`, appended to `out`.
fn extend_cut(out: &mut BytesMut, event: &[u8], start: usize) {
    out.extend_from_slice(&event[..start]);
    out.extend_from_slice(&event[start + NULL_MEMBER.len()..]);
}

impl SseTap {
    pub fn new(strip: bool) -> Self {
        Self {
            strip,
            partial: Vec::new(),
            at_line_start: true,
            after_cr: false,
            disabled: false,
            dropped_last: false,
            usage: None,
            dropped_events: 0,
        }
    }

    /// The last usage object seen in the stream.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether this tap removes what abridge added (strip mode).
    /// Whether it still reads events (it stops at one over [`MAX_EVENT_BYTES`]).
    pub fn scanning(&self) -> bool {
        !self.disabled
    }

    pub fn strips(&self) -> bool {
        self.strip
    }

    /// Bytes held for the unfinished event (its buffer, which is reused).
    pub fn buffered(&self) -> usize {
        self.partial.capacity()
    }

    /// Stops scanning now (the process cannot hold this stream's event): what strip
    /// mode held back is released, and bytes flow on untouched from here.
    pub fn release(&mut self) -> Bytes {
        if self.disabled {
            return Bytes::new();
        }
        if !self.strip {
            // Observe mode already sent what it holds a copy of.
            self.partial.clear();
        }
        self.give_up(BytesMut::new())
    }

    /// How many events strip mode removed.
    pub fn dropped_events(&self) -> u32 {
        self.dropped_events
    }

    /// Takes one chunk from the provider; returns the bytes to send to the client now
    /// (possibly empty in strip mode while an event is incomplete).
    pub fn feed(&mut self, chunk: Bytes) -> Bytes {
        if self.disabled {
            return chunk;
        }
        let mut pos = 0;
        let mut start = 0;
        // The previous event's final CRLF was split by the chunk boundary: this LF is
        // part of that event, kept or dropped with it, never of the next one.
        if self.after_cr && self.partial.is_empty() && chunk.first() == Some(&b'\n') {
            self.after_cr = false;
            pos = 1;
            if self.dropped_last {
                start = 1;
            }
        }
        // Strip mode builds its output only once something differs from the input.
        let mut out: Option<BytesMut> = None;
        let mut copied_to = start;

        if !self.partial.is_empty() {
            match self.find_event_end(&chunk, 0) {
                None => return self.hold(chunk),
                Some(end) => {
                    self.complete_partial(&chunk, end, &mut out);
                    if self.strip {
                        copied_to = end;
                    }
                    pos = end;
                }
            }
        }

        while let Some(end) = self.find_event_end(&chunk, pos) {
            let action = self.inspect(&chunk[pos..end]);
            if self.strip {
                match action {
                    Action::Keep => {}
                    Action::Drop | Action::CutNull(_) => {
                        let buf = out.get_or_insert_with(|| BytesMut::with_capacity(chunk.len()));
                        buf.extend_from_slice(&chunk[copied_to..pos]);
                        if let Action::CutNull(start) = action {
                            extend_cut(buf, &chunk[pos..end], start);
                        }
                        copied_to = end;
                    }
                }
            }
            pos = end;
        }

        if pos < chunk.len() {
            self.partial.extend_from_slice(&chunk[pos..]);
            if self.partial.len() > MAX_EVENT_BYTES {
                if !self.strip {
                    self.give_up(BytesMut::new());
                    return chunk;
                }
                let mut released = out.unwrap_or_default();
                released.extend_from_slice(&chunk[copied_to..pos]);
                return self.give_up(released);
            }
        }
        if !self.strip {
            return chunk;
        }
        match out {
            None => chunk.slice(start..pos),
            Some(mut buf) => {
                buf.extend_from_slice(&chunk[copied_to..pos]);
                buf.freeze()
            }
        }
    }

    /// Completes the held-back event with `chunk[..end]` and inspects it; in strip mode,
    /// what is kept of it goes to `out`.
    fn complete_partial(&mut self, chunk: &[u8], end: usize, out: &mut Option<BytesMut>) {
        self.partial.extend_from_slice(&chunk[..end]);
        let event = std::mem::take(&mut self.partial);
        let action = self.inspect(&event);
        if self.strip {
            let buf = out.get_or_insert_with(|| BytesMut::with_capacity(event.len() + chunk.len()));
            match action {
                Action::Keep => buf.extend_from_slice(&event),
                Action::Drop => {}
                Action::CutNull(start) => extend_cut(buf, &event, start),
            }
        }
        // Reuse the allocation for the next partial event.
        self.partial = event;
        self.partial.clear();
    }

    /// End of stream: whatever was held back (an unterminated last event) is inspected
    /// and, in strip mode, released.
    pub fn finish(&mut self) -> Bytes {
        if self.partial.is_empty() || self.disabled {
            return Bytes::new();
        }
        let event = std::mem::take(&mut self.partial);
        let action = self.inspect(&event);
        if !self.strip {
            return Bytes::new();
        }
        match action {
            Action::Keep => Bytes::from(event),
            Action::Drop => Bytes::new(),
            Action::CutNull(start) => {
                let mut out = BytesMut::with_capacity(event.len() - NULL_MEMBER.len());
                extend_cut(&mut out, &event, start);
                out.freeze()
            }
        }
    }

    /// No event ended in `chunk`: keep it with the partial event.
    fn hold(&mut self, chunk: Bytes) -> Bytes {
        self.partial.extend_from_slice(&chunk);
        let oversized = self.partial.len() > MAX_EVENT_BYTES;
        match (self.strip, oversized) {
            (false, false) => chunk,
            (false, true) => {
                self.give_up(BytesMut::new());
                chunk
            }
            (true, false) => Bytes::new(),
            (true, true) => self.give_up(BytesMut::new()),
        }
    }

    /// An event grew past the limit: release everything held (after `released`, what
    /// strip mode had not yet sent of earlier events) and stop scanning.
    fn give_up(&mut self, mut released: BytesMut) -> Bytes {
        // The relay logs it, in the request's span.
        self.disabled = true;
        released.extend_from_slice(&self.partial);
        self.partial = Vec::new();
        released.freeze()
    }

    /// Finds the end (exclusive) of the event that continues at `buf[from..]`, carrying
    /// line state across calls and chunks.
    fn find_event_end(&mut self, buf: &[u8], from: usize) -> Option<usize> {
        let mut i = from;
        while let Some(off) = memchr2(b'\n', b'\r', &buf[i..]) {
            let p = i + off;
            let byte = buf[p];
            if byte == b'\n' && self.after_cr && p == i {
                // The LF of a CRLF whose CR ended the previous line.
                self.after_cr = false;
                i = p + 1;
                continue;
            }
            let blank_line = self.at_line_start && p == i;
            self.at_line_start = true;
            self.after_cr = byte == b'\r';
            i = p + 1;
            if blank_line {
                if byte == b'\r' && buf.get(i) == Some(&b'\n') {
                    i += 1;
                    self.after_cr = false;
                }
                return Some(i);
            }
        }
        if i < buf.len() {
            self.at_line_start = false;
            self.after_cr = false;
        }
        None
    }

    fn inspect(&mut self, event: &[u8]) -> Action {
        let action = self.action_for(event);
        self.dropped_last = matches!(action, Action::Drop);
        action
    }

    fn action_for(&mut self, event: &[u8]) -> Action {
        let Some(data) = event_data(event) else {
            return Action::Keep;
        };
        match usage_member(&data) {
            None => Action::Keep,
            // Observe mode keeps every event as it is: no need to look further.
            Some(UsageMember::Null) if self.strip => match null_member_at_end(event) {
                Some(start) => Action::CutNull(start),
                None => Action::Keep,
            },
            Some(UsageMember::Null) => Action::Keep,
            Some(UsageMember::Object) => {
                let Ok(envelope) = serde_json::from_slice::<Envelope>(&data) else {
                    return Action::Keep;
                };
                let usage_only = envelope.choices.is_none_or(|c| c.len == 0);
                if let Some(usage) = envelope.usage() {
                    self.usage = Some(usage);
                    if self.strip && usage_only {
                        self.dropped_events += 1;
                        return Action::Drop;
                    }
                }
                Action::Keep
            }
        }
    }
}

/// The `data` of an event: the values of its `data:` lines joined by LF. Borrowed when
/// the event has one data line (the common case); `None` when it has none.
fn event_data(event: &[u8]) -> Option<Cow<'_, [u8]>> {
    let mut data: Option<Cow<'_, [u8]>> = None;
    let mut rest = event;
    while !rest.is_empty() {
        let (line, next) = match memchr2(b'\n', b'\r', rest) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        let value = if let Some(v) = line.strip_prefix(b"data:") {
            v.strip_prefix(b" ").unwrap_or(v)
        } else if line == b"data" {
            &[][..]
        } else {
            continue;
        };
        data = Some(match data {
            None => Cow::Borrowed(value),
            Some(prev) => {
                let mut joined = prev.into_owned();
                joined.push(b'\n');
                joined.extend_from_slice(value);
                Cow::Owned(joined)
            }
        });
    }
    data
}

enum UsageMember {
    /// `"usage": null`
    Null,
    /// `"usage": {...}`
    Object,
}

/// Cheap check for a `"usage"` key and what it holds, without parsing the JSON.
/// A `"usage"` string that is not followed by `:` is a value, not a key, and skipped.
fn usage_member(data: &[u8]) -> Option<UsageMember> {
    // Built once: building a searcher costs more than searching one event.
    static FINDER: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
    let finder = &*FINDER;
    let mut from = 0;
    while let Some(i) = finder.find(&data[from..]) {
        let at = from + i;
        let after = skip_ws(data, at + 7);
        if data.get(after) == Some(&b':') {
            let value = skip_ws(data, after + 1);
            return match data.get(value) {
                Some(b'{') => Some(UsageMember::Object),
                Some(b'n') => Some(UsageMember::Null),
                _ => None,
            };
        }
        from = at + 7;
    }
    None
}

fn skip_ws(data: &[u8], mut i: usize) -> usize {
    while matches!(data.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Where `,"usage":null` starts in a raw event when it is the last member of the
/// event's JSON object: only `}` and then line ends or blanks follow it (so it sits on the
/// last data line, and the `}` closing the top-level object is the data's last byte).
///
/// Read from the end, so the cost does not grow with the event: blanks, `}`, blanks,
/// then the member (which cannot overlap a later occurrence of itself: its only `,` is
/// its first byte).
fn null_member_at_end(event: &[u8]) -> Option<usize> {
    let close = skip_ws_back(event, event.len()).checked_sub(1)?;
    if event[close] != b'}' {
        return None;
    }
    let end = skip_ws_back(event, close);
    event[..end]
        .ends_with(NULL_MEMBER)
        .then(|| end - NULL_MEMBER.len())
}

/// The index after the last non-blank byte of `data[..end]` (0 when all blank).
fn skip_ws_back(data: &[u8], mut end: usize) -> usize {
    while end > 0 && matches!(data[end - 1], b' ' | b'\t' | b'\n' | b'\r') {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ROLE: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}"#;
    const TEXT: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"the usage"},"finish_reason":null}],"usage":null}"#;
    const FINISH: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#;
    const USAGE: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":3,"total_tokens":45}}"#;
    const DONE: &str = "data: [DONE]";

    fn stream(events: &[&str], eol: &str) -> Vec<u8> {
        let mut s = String::new();
        for e in events {
            s.push_str(e);
            s.push_str(eol);
            s.push_str(eol);
        }
        s.into_bytes()
    }

    fn run(tap: &mut SseTap, input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&input.len())) {
            let c = c.clamp(last, input.len());
            out.extend_from_slice(&tap.feed(Bytes::copy_from_slice(&input[last..c])));
            last = c;
        }
        out.extend_from_slice(&tap.finish());
        out
    }

    fn without_null(events: &[&str]) -> Vec<String> {
        events
            .iter()
            .map(|e| e.replace(r#","usage":null"#, ""))
            .collect()
    }

    #[test]
    fn observe_mode_passes_bytes_and_reads_usage() {
        let input = stream(&[ROLE, TEXT, FINISH, USAGE, DONE], "\n");
        let mut tap = SseTap::new(false);
        let out = run(&mut tap, &input, &[]);
        assert_eq!(out, input);
        assert_eq!(tap.usage().unwrap().prompt_tokens, 42);
        assert_eq!(tap.dropped_events(), 0);
    }

    #[test]
    fn strip_mode_removes_what_include_usage_added() {
        let input = stream(&[ROLE, TEXT, FINISH, USAGE, DONE], "\n");
        let mut tap = SseTap::new(true);
        let out = run(&mut tap, &input, &[]);
        let expected_events = without_null(&[ROLE, TEXT, FINISH]);
        let mut expected: Vec<&str> = expected_events.iter().map(String::as_str).collect();
        expected.push(DONE);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            String::from_utf8(stream(&expected, "\n")).unwrap()
        );
        assert_eq!(tap.usage().unwrap().prompt_tokens, 42);
        assert_eq!(tap.dropped_events(), 1);
    }

    #[test]
    fn usage_as_a_content_word_is_not_a_key() {
        let mut tap = SseTap::new(false);
        let ev = r#"data: {"choices":[{"delta":{"content":"\"usage\""}}]}"#;
        run(&mut tap, &stream(&[ev], "\n"), &[]);
        assert_eq!(tap.usage(), None);
    }

    #[test]
    fn multi_line_data_is_joined() {
        let ev = "data: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":9}}";
        let mut tap = SseTap::new(true);
        let out = run(&mut tap, &stream(&[ev, DONE], "\r\n"), &[]);
        assert_eq!(tap.usage().unwrap().prompt_tokens, 9);
        assert_eq!(out, stream(&[DONE], "\r\n"));
    }

    #[test]
    fn null_usage_is_removed_from_multi_line_events_too() {
        let ev = "data: {\"id\":\"c\",\ndata: \"choices\":[],\"usage\":null}";
        let mut tap = SseTap::new(true);
        let out = run(&mut tap, &stream(&[ev], "\n"), &[]);
        assert_eq!(
            out,
            stream(&["data: {\"id\":\"c\",\ndata: \"choices\":[]}"], "\n")
        );
        // Not the last member: left alone.
        let ev = r#"data: {"usage":null,"choices":[]}"#;
        let mut tap = SseTap::new(true);
        assert_eq!(
            run(&mut tap, &stream(&[ev], "\n"), &[]),
            stream(&[ev], "\n")
        );
    }

    #[test]
    fn usage_in_a_content_chunk_is_read_but_kept() {
        // Some providers put usage on the last content chunk; it cannot be dropped.
        let ev = r#"data: {"choices":[{"delta":{"content":"x"}}],"usage":{"input_tokens":5}}"#;
        let mut tap = SseTap::new(true);
        let input = stream(&[ev], "\n");
        assert_eq!(run(&mut tap, &input, &[]), input);
        assert_eq!(tap.usage().unwrap().prompt_tokens, 5);
    }

    #[test]
    fn unterminated_last_event_is_released_and_read() {
        let input = format!("{ROLE}\n\n{USAGE}");
        let mut tap = SseTap::new(false);
        assert_eq!(
            run(&mut tap, input.as_bytes(), &[10, 200]),
            input.as_bytes()
        );
        assert_eq!(tap.usage().unwrap().prompt_tokens, 42);
    }

    #[test]
    fn strip_mode_releases_complete_events_without_waiting() {
        let mut tap = SseTap::new(true);
        let first = format!("{TEXT}\n\n");
        let out = tap.feed(Bytes::from(format!("{first}data: {{\"par")));
        assert_eq!(out, without_null(&[TEXT])[0].clone() + "\n\n");
    }

    #[test]
    fn oversized_event_stops_scanning_without_losing_bytes() {
        let mut tap = SseTap::new(true);
        let big = vec![b'x'; MAX_EVENT_BYTES + 10];
        let mut out = tap.feed(Bytes::from_static(b"data: ")).to_vec();
        out.extend_from_slice(&tap.feed(Bytes::from(big.clone())));
        out.extend_from_slice(&tap.feed(Bytes::from_static(b"\n\n")));
        out.extend_from_slice(&tap.finish());
        let mut expected = b"data: ".to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"\n\n");
        assert_eq!(out.len(), expected.len());
        assert_eq!(out, expected);
    }

    fn eol() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]
    }

    proptest! {
        /// However the stream is cut into chunks, both modes produce the same bytes and
        /// read the same usage as for the whole stream in one piece.
        #[test]
        fn chunking_never_changes_the_result(
            eol in eol(),
            cuts in proptest::collection::vec(0usize..700, 0..12),
            strip in any::<bool>(),
        ) {
            let input = stream(&[ROLE, TEXT, FINISH, USAGE, DONE], eol);
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut whole = SseTap::new(strip);
            let expected = run(&mut whole, &input, &[]);
            let mut pieces = SseTap::new(strip);
            let got = run(&mut pieces, &input, &cuts);
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(pieces.usage(), whole.usage());
            prop_assert_eq!(pieces.usage().map(|u| u.prompt_tokens), Some(42));
            if !strip {
                prop_assert_eq!(&got, &input);
            }
        }
    }
}
