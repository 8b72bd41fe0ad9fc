//! The bytes of one round's stream, as they arrive, into the events [`Round`] reads —
//! linear in the stream's size and within the round's bound.
//!
//! **Linear.** Where the first event of what arrived ends is searched for from where
//! the last search stopped ([`Scan`]), never again from the event's start: a line of
//! hundreds of megabytes with no end costs one pass over its bytes, however many pieces
//! it comes in. An event is parsed once, when it is whole.
//!
//! **Bounded.** What the round keeps and the unfinished event together stay within
//! `recall.max_answer_bytes`: past it the round gives recall up (see the stream module).
//! An unfinished event past the bound on its own cannot be read at all. It passes to the
//! client as it comes, unread, when it cannot be part of a call of abridge's tool
//! (`Round::may_pass_unread`) — its bytes are looked through for the tool's name
//! (linearly too, a few bytes held back at each piece's end so a name cut in two is
//! seen), and the first event after it is read again as usual. Otherwise, or should the
//! name show up in it, the client's stream ends there with the format's error event:
//! abridge's tool never reaches the client.

use memchr::memmem;

use super::{Event, Round};

/// Where the first event of a stretch of stream ends, searched for a byte at a time
/// and resumed where the last search stopped: the blank line that ends it (LF, CRLF or
/// CR line ends, as [`crate::relay::events`] reads them).
#[derive(Debug, Default, Clone)]
pub struct Scan {
    /// Bytes of the event examined so far.
    at: usize,
    /// Whether the line being examined has a byte of its own (a blank line ends the
    /// event).
    content: bool,
}

impl Scan {
    /// Where the event `bytes` starts ends (just after its blank line), or `None` when it
    /// is not whole yet; `bytes` are the event's from its start, each call with more of
    /// them. A CR at the end of `bytes` waits for the next byte (it may start a CRLF)
    /// unless `wait` is false.
    pub fn end(&mut self, bytes: &[u8], wait: bool) -> Option<usize> {
        while self.at < bytes.len() {
            let rest = &bytes[self.at..];
            let Some(i) = memchr::memchr2(b'\n', b'\r', rest) else {
                self.content = true;
                self.at = bytes.len();
                return None;
            };
            self.content |= i > 0;
            let t = self.at + i;
            let ending = match (bytes[t], bytes.get(t + 1)) {
                (b'\r', Some(b'\n')) => 2,
                (b'\r', None) if wait => {
                    self.at = t;
                    return None;
                }
                _ => 1,
            };
            self.at = t + ending;
            if !std::mem::take(&mut self.content) {
                let end = self.at;
                *self = Scan::default();
                return Some(end);
            }
        }
        None
    }
}

/// One round's bytes into events (see the module docs).
#[derive(Debug)]
pub struct Reader {
    /// Bytes of the events not yet whole.
    pending: Vec<u8>,
    scan: Scan,
    /// An event too large to read, passing unread.
    unread: Option<Unread>,
    /// `recall.max_answer_bytes`.
    max: usize,
}

/// An event passing unread: where its end is searched for, and the last bytes of it not
/// yet sent (the name could start in them).
#[derive(Debug, Default)]
struct Unread {
    scan: Scan,
    tail: Vec<u8>,
}

/// What became of a piece of an event passing unread.
enum Passed<'d> {
    /// The event ended in it; these bytes come after.
    Ended(&'d [u8]),
    /// The event goes on.
    More,
    /// The name showed up: the stream ends.
    Cut,
}

/// What the client gets of some bytes of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// These bytes, and the stream goes on.
    Bytes(Vec<u8>),
    /// These bytes, the last: the stream ends (with the format's error event).
    End(Vec<u8>),
}

impl Reader {
    /// A reader for a round kept within `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            pending: Vec::new(),
            scan: Scan::default(),
            unread: None,
            max,
        }
    }

    /// `data`, the next bytes of the round's stream: what the client gets of them now.
    pub fn feed(&mut self, round: &mut Round, mut data: &[u8]) -> Fed {
        let mut out = Vec::new();
        if self.unread.is_some() {
            match self.pass(round, data, &mut out) {
                Passed::Ended(rest) => data = rest,
                Passed::More => return Fed::Bytes(out),
                Passed::Cut => return Fed::End(out),
            }
        }
        self.pending.extend_from_slice(data);
        let mut at = 0;
        while let Some(len) = self.scan.end(&self.pending[at..], true) {
            if let Some((_, event)) = Event::read(&self.pending[at..at + len]) {
                out.extend(round.event(event));
            }
            at += len;
        }
        self.pending.drain(..at);
        if round.kept() + self.pending.len() > self.max {
            out.extend(round.give_up());
        }
        if self.pending.len() <= self.max {
            return Fed::Bytes(out);
        }
        // One event past the bound: it cannot be read.
        let pending = std::mem::take(&mut self.pending);
        let scanned = std::mem::take(&mut self.scan);
        let name = round.carry.name.as_bytes();
        if !round.may_pass_unread() || memmem::find(&pending, name).is_some() {
            out.extend(round.error_event());
            return Fed::End(out);
        }
        let keep = pending.len().saturating_sub(name.len());
        out.extend_from_slice(&pending[..keep]);
        // The search goes on in the bytes to come, where it stopped in these.
        self.unread = Some(Unread {
            scan: Scan {
                at: 0,
                content: scanned.content,
            },
            tail: pending[keep..].to_vec(),
        });
        Fed::Bytes(out)
    }

    /// `data` of an event passing unread: into `out`, all of it but a few bytes held back
    /// (the name could start in them) until the event ends.
    fn pass<'d>(&mut self, round: &Round, data: &'d [u8], out: &mut Vec<u8>) -> Passed<'d> {
        let Some(unread) = self.unread.as_mut() else {
            return Passed::Ended(data);
        };
        let name = round.carry.name.as_bytes();
        let end = unread.scan.end(data, false);
        let (this, rest) = data.split_at(end.unwrap_or(data.len()));
        let mut seen = std::mem::take(&mut unread.tail);
        seen.extend_from_slice(this);
        if memmem::find(&seen, name).is_some() {
            // The event never ends for the client: a blank line, then the error.
            self.unread = None;
            out.extend_from_slice(b"\n\n");
            out.extend(round.error_event());
            return Passed::Cut;
        }
        if end.is_some() {
            self.unread = None;
            out.extend_from_slice(&seen);
            return Passed::Ended(rest);
        }
        let keep = seen.len().saturating_sub(name.len());
        out.extend_from_slice(&seen[..keep]);
        unread.tail = seen.split_off(keep);
        Passed::More
    }

    /// The stream ended: what is left of an unfinished event, for the client, unless it
    /// may be part of a call of abridge's tool (an event never finished is no event to a
    /// client; it is relayed as the provider sent it).
    pub fn finish(&mut self, round: &Round) -> Vec<u8> {
        let mut left = std::mem::take(&mut self.pending);
        if let Some(unread) = self.unread.take() {
            left = unread.tail;
        }
        let name = round.carry.name.as_bytes();
        if memmem::find(&left, name).is_some() || (!round.recalls.is_empty() && !left.is_empty()) {
            return Vec::new();
        }
        left
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
