//! Recall: the model reads back exactly what a compaction condensed, through a tool
//! abridge adds to the forwarded request (`abridge_recall`) and answers itself.
//!
//! What is recalled is the request's own history. Clients send the whole conversation
//! on every turn, so the messages a checkpoint condensed are in the request being served,
//! verbatim. A recall therefore reads nothing but the conversation the request belongs
//! to, and nothing a client sends can name another conversation's content. The store
//! keeps no client text for it (as it keeps none for the checkpoints: see
//! [`crate::store`]).
//!
//! After a provider-API compaction abridge served, the client no longer sends what the
//! compaction replaced: its `compaction` item or block carries it instead, as an
//! [`archive`] inside the sealed payload, read from the request the same way. A request
//! recalls from a [`Condensed`]: its applied checkpoint, the archive, or both; archived
//! messages are named `c<N>` (see [`archive`]).
//!
//! The condensed messages are those a checkpoint replaced (`head..=through`, less the
//! ones it forwards unchanged), named `m<N>` by their position in the history (1 is the
//! first message). A message longer than [`PART_CHARS`] is read in parts, `m<N>.<k>`.
//! A call gives an `id` (`m12`, `m12.2`, a range `m3-m9`), a `query` ranked with BM25
//! ([`rank`]), or both. What it returns is the messages' exact text, secrets redacted as
//! for the summariser, within `recall.max_tokens`.
//!
//! One provider answer's calls are served together ([`Corpus::answer_round`]): at most
//! `recall.max_calls_per_answer` of them, and all of them within
//! `recall.max_round_tokens`; every other call gets a short result saying it was not
//! served (so each call still has its result), not a ranking.
//!
//! The tool is named [`NAME`] in a request, unless a tool of the client's own already has
//! that name: then abridge's is named apart for that request (`abridge_recall_2`, the
//! first free), and only calls of the name abridge gave are abridge's ([`Tool`]).
//!
//! [`wire`] has each format's side: the tool, its calls in a provider's answer, and the
//! follow-up request.

pub mod archive;
mod parts;
pub mod rank;
pub mod stream;
pub mod wire;

use std::fmt::Write as _;

use std::borrow::Cow;

use crate::conversation::{Content, Item, Role};
use crate::store::{Checkpoint, Piece};
use crate::strategies::redact::redact;
pub use archive::Archive;

/// The tool's name.
pub const NAME: &str = "abridge_recall";
/// Most tools a request may carry (OpenAI's limit): a client that sends this many gets
/// no tool added beside them.
pub const MAX_TOOLS: usize = 128;

/// abridge's tool as one request carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// Its name in this request (see the module docs).
    pub name: Cow<'static, str>,
    /// Offered to every request of the conversation, compacted or not
    /// (`recall.offer = "always"`), rather than only once something is condensed.
    pub always: bool,
}

impl Tool {
    /// The tool for a request in `format` whose client sent `tools` (its `tools`, as
    /// written): named [`NAME`] unless one of the client's tools is; `None` when the
    /// client's tools already number [`MAX_TOOLS`] or cannot be read. `offer_always`:
    /// `recall.offer = "always"` applies to the request; the tool is then offered from
    /// the first request when the client has tools of its own (an agent's request).
    pub fn for_request(
        format: crate::formats::Format,
        tools: Option<&str>,
        offer_always: bool,
    ) -> Option<Tool> {
        let taken = match tools.map(str::trim) {
            None | Some("null") => Vec::new(),
            Some(tools) => wire::tool_names(format, tools)?,
        };
        if taken.len() >= MAX_TOOLS {
            return None;
        }
        let always = offer_always && !taken.is_empty();
        let free = |name: &str| !taken.iter().any(|t| t == name);
        let name = match free(NAME) {
            true => Cow::Borrowed(NAME),
            false => Cow::Owned((2..).map(|n| format!("{NAME}_{n}")).find(|n| free(n))?),
        };
        Some(Tool { name, always })
    }

    /// Its definition in `format`.
    pub fn definition(&self, format: crate::formats::Format) -> Cow<'static, str> {
        wire::tool(format, &self.name, self.always)
    }
}
/// Longest passage: a longer message is read in parts.
pub const PART_CHARS: usize = 4000;

/// Where a condensed message is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The request's own history (a checkpoint condensed it): `m<N>`.
    Request,
    /// The archive of a provider-API compaction item or block the request carries:
    /// `c<N>` (see [`archive`]).
    Archive,
}

impl Source {
    fn letter(self) -> char {
        match self {
            Source::Request => 'm',
            Source::Archive => 'c',
        }
    }
}

/// What a request's recall reads: the messages its applied checkpoint condensed, and
/// the archive of the provider-API compaction item or block it carries (one request may
/// have both: a conversation abridge compacts after the client's own compaction).
#[derive(Debug, Clone, Default)]
pub struct Condensed {
    pub checkpoint: Option<Checkpoint>,
    pub archive: Option<Archive>,
}

impl Condensed {
    /// Whether there is anything to recall from.
    pub fn is_some(&self) -> bool {
        self.checkpoint.is_some() || self.archive.is_some()
    }
}

/// One condensed message, or one part of a long one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Passage {
    source: Source,
    /// Index of the message in the history (in the archive's numbering, less one).
    message: usize,
    /// 1-based part, and how many the message has.
    part: usize,
    parts: usize,
    /// Its text, labelled, redacted.
    text: String,
}

impl Passage {
    fn id(&self) -> String {
        let letter = self.source.letter();
        match self.parts {
            1 => format!("{letter}{}", self.message + 1),
            _ => format!("{letter}{}.{}", self.message + 1, self.part),
        }
    }
}

/// The condensed messages of one request.
#[derive(Debug, Default)]
pub struct Corpus {
    passages: Vec<Passage>,
    /// What the reader is told of messages it cannot read (an archive's oldest, left
    /// out over its bound).
    note: Option<String>,
}

/// How much one answer's calls are served (see [`Corpus::answer_round`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Calls served at most (`recall.max_calls_per_answer`).
    pub calls: usize,
    /// Tokens of one call's answer at most (`recall.max_tokens`).
    pub tokens: u64,
    /// Tokens of all the calls' answers together at most (`recall.max_round_tokens`).
    pub round_tokens: u64,
}

/// The result of a call past `recall.max_calls_per_answer`.
pub const TOO_MANY: &str = "[abridge_recall: too many recall calls in one answer; this call was not served. Ask again, with fewer calls at a time.]";
/// The result of a call once the answer's calls returned `recall.max_round_tokens`.
pub const ROUND_SPENT: &str = "[abridge_recall: the calls of this answer already returned as much text as one answer may read; this call was not served. Ask again, with a narrower query or an id.]";
/// The result of a call when nothing is condensed (the tool offered before the
/// conversation's first compaction: `recall.offer = "always"`).
pub const NOTHING_CONDENSED: &str = "[abridge_recall: nothing of this conversation has been condensed yet; every message is still in full view above.]";
/// The least a call is answered with: below it, [`ROUND_SPENT`].
const LEAST_TOKENS: u64 = 100;

/// What a call asks.
#[derive(Debug, Default, serde::Deserialize)]
struct Arguments {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    query: Option<String>,
}

impl Corpus {
    /// What a request whose messages are `items` recalls from `condensed`: the archive
    /// first (it is the earlier conversation), then what the checkpoint condensed. An
    /// archive that cannot be opened adds nothing.
    pub fn for_request(items: &[Item<'_>], condensed: &Condensed) -> Self {
        let mut corpus = match &condensed.checkpoint {
            Some(checkpoint) => Self::of(items, checkpoint),
            None => Self::default(),
        };
        if let Some(opened) = condensed.archive.as_ref().and_then(Archive::open) {
            let mut passages = Vec::new();
            for m in &opened.messages {
                let text = format!("[c{} {}]\n{}", m.n, m.label, m.text);
                push(&mut passages, (Source::Archive, m.n as usize - 1), &text);
            }
            passages.append(&mut corpus.passages);
            corpus.passages = passages;
            corpus.note = match opened.left_out() {
                0 => None,
                1 => Some(
                    "c1 was left out of the archive (over its bound): it cannot be read".to_owned(),
                ),
                n => Some(format!(
                    "c1–c{n} were left out of the archive (over its bound): they cannot be read"
                )),
            };
        }
        corpus
    }

    /// The messages `checkpoint` condensed in `items`.
    pub fn of(items: &[Item<'_>], checkpoint: &Checkpoint) -> Self {
        let kept: Vec<usize> = checkpoint
            .pieces()
            .filter_map(|p| match p {
                Piece::Kept(k) => Some(k),
                Piece::Stored(_) => None,
            })
            .collect();
        let (head, through) = (checkpoint.head as usize, checkpoint.through as usize);
        let condensed =
            (head..=through.min(items.len().saturating_sub(1))).filter(|i| !kept.contains(i));
        Self::of_messages(items, condensed)
    }

    /// The messages of `items` at `indices` (in order), as condensed.
    pub fn of_messages(items: &[Item<'_>], indices: impl Iterator<Item = usize>) -> Self {
        let mut passages = Vec::new();
        for i in indices {
            let Some(item) = items.get(i) else { continue };
            push(&mut passages, (Source::Request, i), &render(i, item));
        }
        Self {
            passages,
            note: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.passages.is_empty()
    }

    /// Nothing condensed and nothing to say of it: a call is answered
    /// [`NOTHING_CONDENSED`], and is no recall served.
    fn nothing(&self) -> bool {
        self.passages.is_empty() && self.note.is_none()
    }

    /// The ids the condensed messages span, for the marker and error texts: `m3–m40`.
    /// With an archive, its ids first: `c1–c80, m3–m40`.
    pub fn span(&self) -> Option<String> {
        let spans: Vec<String> = [Source::Archive, Source::Request]
            .into_iter()
            .filter_map(|source| {
                let mut of = self.passages.iter().filter(|p| p.source == source);
                let first = of.next()?;
                let last = of.next_back().unwrap_or(first);
                let letter = source.letter();
                Some(match first.message == last.message {
                    true => format!("{letter}{}", first.message + 1),
                    false => format!("{letter}{}–{letter}{}", first.message + 1, last.message + 1),
                })
            })
            .collect();
        (!spans.is_empty()).then(|| spans.join(", "))
    }

    /// The answer to a call whose arguments are `arguments` (the JSON the model wrote),
    /// within `max_tokens` as `tokens` counts them.
    pub fn answer(&self, arguments: &str, max_tokens: u64, tokens: &dyn Fn(&str) -> u64) -> String {
        let args: Arguments = serde_json::from_str(arguments).unwrap_or_default();
        let span = self.span().unwrap_or_else(|| "none".to_owned());
        let mut chosen: Vec<usize> = Vec::new();
        let mut problems = Vec::new();
        if let Some(id) = args.id.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            match self.by_id(id) {
                Some(found) if !found.is_empty() => chosen.extend(found),
                _ => problems.push(format!(
                    "`{id}` is not a condensed message (they are {span})"
                )),
            }
        }
        if let Some(query) = args
            .query
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let texts: Vec<&str> = self.passages.iter().map(|p| p.text.as_str()).collect();
            let ranked = rank::rank(&texts, query);
            if ranked.is_empty() {
                problems.push(format!("no condensed message matches \"{query}\""));
            }
            chosen.extend(
                ranked
                    .into_iter()
                    .filter(|p| !chosen.contains(p))
                    .collect::<Vec<_>>(),
            );
        }
        if args.id.is_none() && args.query.is_none() {
            problems.push("give `id` or `query`".to_owned());
        }
        self.write(&chosen, &problems, &span, max_tokens, tokens)
    }

    /// The answers to one provider answer's calls (`arguments`: each call's), in order,
    /// within `limits` as `tokens` counts them; each with whether it was served (one
    /// past the limits is answered [`TOO_MANY`] or [`ROUND_SPENT`], and each call when
    /// nothing is condensed [`NOTHING_CONDENSED`], at no cost).
    pub fn answer_round(
        &self,
        arguments: &[&str],
        limits: Limits,
        tokens: &dyn Fn(&str) -> u64,
    ) -> Vec<(String, bool)> {
        if self.nothing() {
            return arguments
                .iter()
                .map(|_| (NOTHING_CONDENSED.to_owned(), false))
                .collect();
        }
        let mut left = limits.round_tokens;
        arguments
            .iter()
            .enumerate()
            .map(|(i, arguments)| {
                if i >= limits.calls {
                    return (TOO_MANY.to_owned(), false);
                }
                let budget = left.min(limits.tokens);
                if budget < LEAST_TOKENS {
                    return (ROUND_SPENT.to_owned(), false);
                }
                let text = self.answer(arguments, budget, tokens);
                left = left.saturating_sub(tokens(&text));
                (text, true)
            })
            .collect()
    }

    /// The passages an id names: a message (all its parts), one part, or a range. `c12`
    /// names an archived message; `m12` (or `12`) one of the request's, or an archived
    /// one when the request has none condensed (the tool's description speaks of `m`).
    fn by_id(&self, id: &str) -> Option<Vec<usize>> {
        let number = |s: &str| -> Option<(Option<Source>, usize, Option<usize>)> {
            let s = s.trim();
            let (source, s) = match s.chars().next()? {
                'c' | 'C' => (Some(Source::Archive), &s[1..]),
                'm' | 'M' => (Some(Source::Request), &s[1..]),
                _ => (None, s),
            };
            match s.split_once('.') {
                Some((m, k)) => Some((source, m.parse().ok()?, Some(k.parse().ok()?))),
                None => Some((source, s.parse().ok()?, None)),
            }
        };
        let (from, to) = match id.split_once(['-', '–']) {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(id)?, number(id)?),
        };
        let own = self.passages.iter().any(|p| p.source == Source::Request);
        let source = match from.0.or(to.0) {
            Some(Source::Request) | None if !own => Source::Archive,
            Some(source) => source,
            None => Source::Request,
        };
        let (lo, hi) = (from.1.checked_sub(1)?, to.1.checked_sub(1)?);
        let part = (from.1 == to.1 && from.2 == to.2)
            .then_some(from.2)
            .flatten();
        Some(
            self.passages
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    p.source == source
                        && (lo..=hi).contains(&p.message)
                        && part.is_none_or(|k| p.part == k)
                })
                .map(|(i, _)| i)
                .collect(),
        )
    }

    fn write(
        &self,
        chosen: &[usize],
        problems: &[String],
        span: &str,
        max_tokens: u64,
        tokens: &dyn Fn(&str) -> u64,
    ) -> String {
        let mut out = String::from("[abridge_recall: the exact text of condensed messages");
        if !problems.is_empty() {
            let _ = write!(out, "; {}", problems.join("; "));
        }
        if let Some(note) = &self.note {
            let _ = write!(out, "; {note}");
        }
        out.push_str("]\n");
        let used = tokens(&out);
        let (text, returned) = self.within(chosen, used, max_tokens, tokens);
        out.push_str(&text);
        if returned < chosen.len() {
            let more: Vec<String> = chosen[returned..]
                .iter()
                .take(8)
                .map(|&p| self.passages[p].id())
                .collect();
            let _ = write!(out, "\n[more matches, not shown: {}]\n", more.join(", "));
        }
        if chosen.is_empty() {
            let _ = write!(out, "\nCondensed messages: {span}.\n");
        }
        out
    }

    /// The `chosen` passages, best first, as many as fit in `max_tokens` with `used`
    /// already spent (the first one cut to fit if it alone does not), and how many.
    fn within(
        &self,
        chosen: &[usize],
        mut used: u64,
        max_tokens: u64,
        tokens: &dyn Fn(&str) -> u64,
    ) -> (String, usize) {
        let mut out = String::new();
        let mut returned = 0;
        for &p in chosen {
            let passage = &self.passages[p];
            let block = format!("\n{}\n", passage.text);
            let cost = tokens(&block);
            if used + cost <= max_tokens {
                out.push_str(&block);
                used += cost;
                returned += 1;
                continue;
            }
            if returned == 0 {
                // The best match alone is over the budget: its start, cut.
                let room = max_tokens.saturating_sub(used + 16) as usize * 3;
                let cut = crate::strategies::text::truncate_chars(&passage.text, room);
                let _ = write!(out, "\n{cut}\n[… cut at recall.max_tokens]\n");
                returned += 1;
            }
            break;
        }
        (out, returned)
    }

    /// The passages' text, joined: the condensed messages as recall keeps them (labelled,
    /// secrets redacted), for `abridge replay` to tell a withheld identifier from a lost
    /// one.
    pub fn joined(&self) -> String {
        self.passages.iter().map(|p| p.text.as_str()).collect()
    }

    /// The passages indexed for many queries (see [`Searcher`]).
    pub fn searcher(&self) -> Searcher<'_> {
        let texts: Vec<&str> = self.passages.iter().map(|p| p.text.as_str()).collect();
        Searcher {
            corpus: self,
            index: rank::Index::new(&texts),
        }
    }
}

/// A corpus indexed once, for `abridge replay`, which asks a query per identifier.
pub struct Searcher<'c> {
    corpus: &'c Corpus,
    index: rank::Index<'c>,
}

impl Searcher<'_> {
    /// The condensed text a `query` call would return, within `max_tokens` (no header,
    /// no notes): what `abridge replay` checks an identifier against.
    pub fn returned_for(
        &self,
        query: &str,
        max_tokens: u64,
        tokens: &dyn Fn(&str) -> u64,
    ) -> String {
        let ranked = self.index.rank(query);
        self.corpus.within(&ranked, 0, max_tokens, tokens).0
    }
}

/// A message as a labelled block: `[m12 user]`, its text, its tool calls.
fn render(i: usize, m: &Item<'_>) -> String {
    format!("[m{} {}]\n{}", i + 1, label(m), readable_redacted(m))
}

/// A message's role as recall labels it: `user`, `assistant`, `tool result call_1`.
pub(crate) fn label(m: &Item<'_>) -> String {
    let role = match m.role {
        Role::System => "system",
        Role::Developer => "developer",
        Role::User if !m.results.is_empty() => "tool result",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool | Role::Function => "tool result",
    };
    match m.results.first() {
        Some(id) => format!("{role} {id}"),
        None => role.to_owned(),
    }
}

/// A message's text and tool calls as recall returns them, secrets redacted by the
/// summariser's rules.
pub(crate) fn readable_redacted(m: &Item<'_>) -> String {
    let mut out = redact(&content_text(m)).into_owned();
    for call in &m.calls {
        let _ = write!(
            out,
            "\n[tool call {} {}]\n{}",
            call.name,
            call.id,
            redact(&call.arguments)
        );
    }
    out
}

/// A message's content as text: what `text_lossy` leaves out of a value abridge does not
/// model, kept as written.
fn content_text<'a>(m: &'a Item<'_>) -> Cow<'a, str> {
    match &m.content {
        Content::Other(raw) => Cow::Borrowed(raw.get()),
        content => content.text_lossy(),
    }
}

/// What the model reads of a message: its text, and its tool calls' names and
/// arguments (not an item's ids or metadata).
pub fn readable(m: &Item<'_>) -> String {
    let mut out = content_text(m).into_owned();
    for call in &m.calls {
        let _ = write!(out, "\n{} {}", call.name, call.arguments);
    }
    out
}

/// Message `message` of `source`, rendered as `text`, onto `passages` in parts.
fn push(passages: &mut Vec<Passage>, (source, message): (Source, usize), text: &str) {
    let pieces = parts::split(text, PART_CHARS);
    let parts = pieces.len();
    passages.extend(pieces.into_iter().enumerate().map(|(k, text)| Passage {
        source,
        message,
        part: k + 1,
        parts,
        text,
    }));
}

#[cfg(test)]
mod tests;
