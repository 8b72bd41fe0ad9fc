//! Serving `abridge_recall` for one client request (see [`crate::recall`]): when the
//! provider's answer calls it, abridge answers each call from the request's condensed
//! messages, appends the calls and their results to the forwarded request and asks the
//! provider again — at most `recall.max_rounds` times, the last time asking for an
//! answer without tools. The client gets the last answer, with every round's usage
//! summed; a recall call never reaches it.
//!
//! The tool is added only to a request with something condensed — a checkpoint applied,
//! or a provider-API compaction item or block carrying an archive — that lets the model
//! choose its tools (see [`wanted`]); with `recall.offer = "always"`, to every request
//! of an agent, and a call before anything is condensed is answered so. A streamed
//! answer goes through the rounds as it streams ([`super::recall_stream`]); this module
//! reads whole answers. When a follow-up cannot be sent or the provider refuses it, the
//! request is sent once more as the client would have had it answered without recall
//! (the forwarded request without the tool), and the client is told.
//!
//! **Bounds.** One answer's calls are served within `recall.max_calls_per_answer` and
//! `recall.max_round_tokens`, built and ranked through the CPU pool ([`answer_calls`]).
//! A whole answer is read decoded, within `recall.max_answer_bytes` and the body budget
//! ([`read_whole`]), or not at all: then the request is answered without the tool. A
//! follow-up's body holds its share of the body budget while it is the one sent.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{StatusCode, Uri};
use http_body_util::BodyExt;

use crate::accounting::{self, Tally};
use crate::compactor::Decision;
use crate::controls::Report;
use crate::error::Error;
use crate::formats::Request;
use crate::identity::Fingerprint;
use crate::ingress::Held;
use crate::prepare::Prepared;
use crate::prices::Price;
use crate::recall::{Condensed, Corpus, Limits, NAME, wire};
use crate::relay::decode::Decoding;
use crate::relay::usage;
use crate::state::AppState;
use crate::tokens::Estimator;

use super::recall_stream::Streamed;
use super::{Exchange, Upstream, first_answer};

/// Whether this request gets the recall tool (see the module docs).
pub(super) fn wanted(prepared: &Prepared, decision: &Decision) -> bool {
    prepared.recall_always()
        || prepared.recall_tool.is_some()
            && decision.active
            && condensed(prepared, decision).is_some()
}

/// What the request's recall reads: the messages its applied checkpoint condensed, and
/// what a provider-API compaction item or block it carries replaced (its archive).
fn condensed(prepared: &Prepared, decision: &Decision) -> Condensed {
    Condensed {
        checkpoint: decision.apply.clone(),
        archive: prepared.archive.clone(),
    }
}

/// The recall tool in `prepared`'s format, when `recall` says it is added.
pub(super) fn tool(prepared: &Prepared, recall: bool) -> Option<Cow<'static, str>> {
    let tool = prepared.recall_tool.as_ref().filter(|_| recall)?;
    Some(tool.definition(prepared.request.format()))
}

/// The name the tool goes by in `prepared`'s request.
fn name(prepared: &Prepared) -> &str {
    prepared.recall_tool.as_ref().map_or(NAME, |t| &t.name)
}

/// The provider refused the tool: a 400 or 422 whose text names tools.
pub(super) fn refused(prepared: &Prepared, upstream: &Upstream) -> bool {
    match upstream {
        Upstream::Buffered(head, body) => {
            matches!(head.status.as_u16(), 400 | 422) && wire::refused(body, name(prepared))
        }
        _ => false,
    }
}

/// The provider refused the tool and took the request without it: the tenant's requests
/// go without it for a while (see [`crate::tenants`]); no other tenant's do. The client
/// is told in `report`.
pub(super) fn remember_refusal(state: &AppState, prepared: &Prepared, report: &mut Report) {
    let Some(identified) = &prepared.identified else {
        report.add_note(
            "the provider refused the abridge_recall tool abridge adds: retried without it",
        );
        return;
    };
    state.tenants().recall_refused(identified.payer);
    tracing::info!(
        "the provider refused the abridge_recall tool for this credential; its requests go without it for an hour"
    );
    report.add_note(
        "the provider refused the abridge_recall tool abridge adds: retried without it; recall is off for this credential for an hour",
    );
}

/// The rounds, for an answer read whole (`upstream`) to a request sent as `sent` (see
/// the module docs). Anything else is handed back as it is.
pub(super) async fn serve(
    state: &AppState,
    prepared: &Prepared,
    (parts, target, sent): (&Parts, &Uri, Bytes),
    decision: &mut Decision,
    upstream: Upstream,
    exchange: &mut Exchange,
) -> Upstream {
    let at = (parts, target);
    match upstream {
        Upstream::Whole(head, body, usage, held) => {
            let whole = Whole {
                head,
                body,
                usage,
                held,
            };
            serve_whole(state, prepared, (at, sent), decision, whole, exchange).await
        }
        Upstream::Streaming(_) | Upstream::Peeked(_) => {
            let held = exchange.held.clone().unwrap_or_default();
            streamed(
                state,
                prepared,
                (parts, target, sent),
                decision,
                (upstream, held),
            )
        }
        Upstream::Unread(why) => {
            tracing::info!(
                why,
                "the provider's answer was not read for recall; asked again without the tool"
            );
            decision.report.add_note(format!(
                "recall: the provider's answer was not read for recall ({why}); answered without recall"
            ));
            without_tool(state, prepared, at, decision, exchange)
                .await
                .unwrap_or(Upstream::Unread(why))
        }
        other => other,
    }
}

/// A provider's whole answer, read (see [`read_whole`]).
struct Whole {
    head: http::response::Parts,
    body: Bytes,
    /// The usage to record for the forwarded history (the first round's).
    usage: Option<crate::relay::Usage>,
    held: Held,
}

impl Whole {
    fn into_upstream(self) -> Upstream {
        Upstream::Whole(self.head, self.body, self.usage, self.held)
    }
}

/// The rounds for a whole answer.
async fn serve_whole(
    state: &AppState,
    prepared: &Prepared,
    ((parts, target), sent): ((&Parts, &Uri), Bytes),
    decision: &mut Decision,
    mut first: Whole,
    exchange: &mut Exchange,
) -> Upstream {
    let format = prepared.request.format();
    // An answer that never names the tool calls it not (and, on Responses, does not
    // echo it): no parse. The common case: most answers call nothing.
    let name = name(prepared);
    if memchr::memmem::find(&first.body, name.as_bytes()).is_none() {
        decision.report.recalls = Some(0);
        return first.into_upstream();
    }
    let Some(answer) = read_answer(state, format, &first.body, name).await else {
        return first.into_upstream();
    };
    decision.report.recalls = Some(0);
    let choice = client_choice(prepared);
    let condensed = condensed(prepared, decision);
    // Offered from the first request, calls are served even with nothing condensed
    // (answered so): a call never reaches a client that does not know the tool.
    let served = condensed.is_some() || prepared.recall_always();
    let (true, false) = (served, answer.calls.is_empty()) else {
        // A Responses answer echoes the tools, and the calls of another choice than
        // the first are not served: the client sees only its own.
        first.body = Bytes::from(wire::finish(format, answer.value, None, &choice, name));
        return first.into_upstream();
    };
    let rounds = Rounds {
        state,
        served: (&prepared.request, &condensed),
        price: state.prices().of(prepared.request.model()),
        format,
        choice: choice.clone(),
        name,
    };
    match rounds.run(answer, sent, (parts, target), exchange).await {
        Ok((last, spent)) => {
            decision.report.recalls = Some(u32::try_from(spent.recalls).unwrap_or(u32::MAX));
            let conversation = prepared.identified.as_ref().map(|i| i.conversation);
            account(state, conversation, &spent);
            // What the provider counted for the forwarded history is the first round's.
            Whole {
                usage: first.usage,
                ..last
            }
            .into_upstream()
        }
        Err(why) => {
            state.stats().recall_failure();
            tracing::warn!(%why, "recall follow-up failed; answered without recall");
            decision
                .report
                .add_note(format!("recall: {why}; answered without recall"));
            match without_tool(state, prepared, (parts, target), decision, exchange).await {
                Some(answered) => answered,
                // Not even that: the first answer, its recall calls taken out.
                None => {
                    if let Some(a) = read_answer(state, format, &first.body, name).await {
                        first.body =
                            Bytes::from(wire::finish(format, a.value, None, &choice, name));
                    }
                    first.into_upstream()
                }
            }
        }
    }
}

/// `body` read as `format`'s answer (through the CPU pool: an answer may be megabytes).
async fn read_answer(
    state: &AppState,
    format: crate::formats::Format,
    body: &[u8],
    name: &str,
) -> Option<wire::Answer> {
    let permit = state.cpu().permit_for(body.len()).await;
    state
        .cpu()
        .run_with(&permit, || wire::Answer::read(format, body, name))
}

/// A whole 200 answer read for the recall rounds: decoded when the provider compressed
/// it anyway (abridge asks for `identity`), each part held against the body budget as
/// it comes, at most `recall.max_answer_bytes` decoded. An answer that cannot be read
/// within those (larger, no room in the budget, an encoding abridge does not decode) is
/// not read further: [`Upstream::Unread`], and the request is answered without the
/// tool, so that no call of it can reach the client.
pub(super) async fn read_whole(
    state: &AppState,
    response: http::Response<hyper::body::Incoming>,
) -> Result<Upstream, Error> {
    const TOO_LARGE: &str = "larger than recall.max_answer_bytes";
    const NO_ROOM: &str = "no room for it in limits.max_inflight_body_bytes";
    const UNDECODED: &str = "it could not be decoded within recall.max_answer_bytes";
    let limit = state.config().recall.max_answer_bytes;
    let (head, mut body) = response.into_parts();
    let decoding = Decoding::for_encoding(&head.headers, limit, state.decode_budget().clone());
    let Ok(mut decoder) = decoding else {
        return Ok(Upstream::Unread(
            "a content encoding abridge does not decode",
        ));
    };
    let announced = head
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if decoder.is_none() && announced.is_some_and(|n| n > limit) {
        return Ok(Upstream::Unread(TOO_LARGE));
    }
    let unreadable =
        || Error::UpstreamUnreachable("the provider's answer could not be read".to_owned());
    let idle = state.config().timeouts.stream_idle();
    let (mut read, mut held) = (BytesMut::new(), None);
    loop {
        let data = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
            Ok(None) => break,
            Ok(Some(Err(_))) | Err(_) => return Err(unreadable()),
        };
        let data = match &mut decoder {
            // Corrupt, or more than the bound once decoded.
            Some(decoder) => {
                decoder.push(data);
                let mut decoded = BytesMut::new();
                while decoder.has_pending() {
                    match decoder.next_chunk().await {
                        Ok(chunk) => decoded.extend_from_slice(&chunk),
                        Err(_) => return Ok(Upstream::Unread(UNDECODED)),
                    }
                }
                decoded.freeze()
            }
            None if read.len() + data.len() > limit => return Ok(Upstream::Unread(TOO_LARGE)),
            None => data,
        };
        if state.body_budget().take(&mut held, data.len()).is_err() {
            return Ok(Upstream::Unread(NO_ROOM));
        }
        read.extend_from_slice(&data);
    }
    if let Some(decoder) = &mut decoder {
        let Ok(rest) = decoder.finish() else {
            return Ok(Upstream::Unread(UNDECODED));
        };
        if state.body_budget().take(&mut held, rest.len()).is_err() {
            return Ok(Upstream::Unread(NO_ROOM));
        }
        read.extend_from_slice(&rest);
    }
    let body = read.freeze();
    let usage = crate::relay::usage::from_json(&body);
    Ok(Upstream::Whole(head, body, usage, Held::of(held)))
}

/// A streamed answer, to go through the rounds as it streams.
fn streamed(
    state: &AppState,
    prepared: &Prepared,
    (parts, target, sent): (&Parts, &Uri, Bytes),
    decision: &Decision,
    (upstream, held): (Upstream, Held),
) -> Upstream {
    let condensed = condensed(prepared, decision);
    if !condensed.is_some() && !prepared.recall_always() {
        return upstream;
    }
    let rounds = Streamed {
        state: state.clone(),
        request: prepared.request.clone(),
        condensed,
        parts: super::recall_stream::copy(parts),
        target: target.clone(),
        sent,
        choice: client_choice(prepared),
        name: Cow::Owned(name(prepared).to_owned()),
        conversation: prepared.identified.as_ref().map(|i| i.conversation),
        held,
    };
    Upstream::Recalling(Box::new(upstream), Box::new(rounds))
}

/// The calls of one provider answer, each with its result, and how many were served:
/// answered from the request's condensed messages (`corpus`, built from `request` and
/// `condensed` the first time) within `recall.max_calls_per_answer`, `max_tokens` and
/// `max_round_tokens` (see [`Corpus::answer_round`]). Building and ranking run through
/// the CPU pool (off the async workers for a large request, see [`crate::offload`]).
/// The calls served are counted in the stats.
pub(super) async fn answer_calls(
    state: &AppState,
    (request, condensed): (&Request, &Condensed),
    corpus: &mut Option<Corpus>,
    calls: &[wire::Call],
) -> (Vec<(wire::Call, String)>, u64) {
    let config = &state.config().recall;
    let limits = Limits {
        calls: usize::try_from(config.max_calls_per_answer).unwrap_or(usize::MAX),
        tokens: config.max_tokens,
        round_tokens: config.max_round_tokens,
    };
    let estimator = Estimator::for_model_ready(request.model());
    let permit = state.cpu().permit_for(request.body().len()).await;
    let answered = state.cpu().run_with(&permit, || {
        let corpus = corpus.get_or_insert_with(|| Corpus::for_request(request.items(), condensed));
        let arguments: Vec<&str> = calls.iter().map(|c| c.arguments.as_str()).collect();
        corpus.answer_round(&arguments, limits, &|t| estimator.text(t))
    });
    drop(permit);
    let mut served = 0;
    let results = calls
        .iter()
        .zip(answered)
        .map(|(call, (text, answered))| {
            if answered {
                served += 1;
                state.stats().recalled(estimator.text(&text));
            }
            (call.clone(), text)
        })
        .collect();
    (results, served)
}

/// What recall did for one client request (`spent`: the calls answered, the follow-ups'
/// tokens and cost), into the totals and the conversation's account (written in the
/// background: the client waits for nothing).
pub(super) fn account(state: &AppState, conversation: Option<Fingerprint>, spent: &Tally) {
    if *spent == Tally::default() {
        return;
    }
    state.stats().tally(spent);
    if let Some(conversation) = conversation {
        let (store, spent) = (state.store().clone(), *spent);
        // Failures are counted and logged by the store.
        tokio::spawn(async move { store.add_tally(&conversation, &spent).await });
    }
}

/// The client's `tool_choice` as a Responses answer echoes it: `auto` when it sent none.
fn client_choice(prepared: &Prepared) -> serde_json::Value {
    prepared
        .request
        .tool_choice()
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .filter(|v: &serde_json::Value| !v.is_null())
        .unwrap_or_else(|| serde_json::Value::from("auto"))
}

/// The forwarded request once more, without the tool.
async fn without_tool(
    state: &AppState,
    prepared: &Prepared,
    (parts, target): (&Parts, &Uri),
    decision: &mut Decision,
    exchange: &mut Exchange,
) -> Option<Upstream> {
    decision.report.recalls = None;
    let (outgoing, _) =
        super::conversation::rewrite(state, &prepared.request, decision.apply.as_ref(), None);
    first_answer(state, parts, target, outgoing, (false, false), exchange)
        .await
        .ok()
}

struct Rounds<'a> {
    state: &'a AppState,
    /// The request whose condensed messages are recalled, and what they are.
    served: (&'a Request, &'a Condensed),
    price: Option<Price>,
    format: crate::formats::Format,
    /// The client's `tool_choice`, as the answer echoes it (Responses).
    choice: serde_json::Value,
    /// The tool's name in this request.
    name: &'a str,
}

impl Rounds<'_> {
    /// Serves `answer`'s calls and asks again until an answer calls none (or the last
    /// round): that answer, finished, and what the rounds spent (the calls served
    /// among it). Each follow-up's body holds its share of the body budget while it
    /// is the one sent; without room for it, the rounds stop (answered without recall).
    async fn run(
        &self,
        mut answer: wire::Answer,
        mut sent: Bytes,
        at: (&Parts, &Uri),
        exchange: &mut Exchange,
    ) -> Result<(Whole, Tally), String> {
        let config = &self.state.config().recall;
        let mut usage = answer.value.get("usage").cloned();
        let mut spent = Tally::default();
        let (mut corpus, mut round, mut _sent_held) = (None, 0, Held::default());
        loop {
            round += 1;
            let (results, served) =
                answer_calls(self.state, self.served, &mut corpus, &answer.calls).await;
            spent.recalls += served;
            let items = wire::round_items(self.format, &answer, &results, self.name);
            let last = round >= config.max_rounds;
            let next = wire::follow_up(self.format, &sent, &items, last)
                .ok_or("the forwarded request could not be extended")?;
            let next = Bytes::from(next);
            let next_held = self.state.body_budget().hold(next.len()).map_err(|_| {
                "no room for the follow-up in limits.max_inflight_body_bytes".to_owned()
            })?;
            let reply;
            (reply, answer) = self.ask(next.clone(), at, exchange).await?;
            if let Some(more) = answer.value.get("usage").and_then(usage::of_value) {
                spent.add(&accounting::recall(
                    0,
                    accounting::reported(&more),
                    self.price,
                ));
            }
            match (&mut usage, answer.value.get("usage")) {
                (Some(total), Some(more)) => wire::add_usage(total, more),
                (None, Some(more)) => usage = Some(more.clone()),
                _ => {}
            }
            (sent, _sent_held) = (next, next_held);
            if answer.calls.is_empty() || last {
                let body = wire::finish(self.format, answer.value, usage, &self.choice, self.name);
                let body = Bytes::from(body);
                return Ok((Whole { body, ..reply }, spent));
            }
        }
    }

    /// The provider's answer to the follow-up `next`, read whole, and as an answer.
    async fn ask(
        &self,
        next: Bytes,
        (parts, target): (&Parts, &Uri),
        exchange: &mut Exchange,
    ) -> Result<(Whole, wire::Answer), String> {
        let reply = first_answer(self.state, parts, target, next, (false, true), exchange)
            .await
            .map_err(|e| format!("the follow-up could not be sent ({e})"))?;
        let (head, body, usage, held) = match reply {
            Upstream::Whole(head, body, usage, held) => (head, body, usage, held),
            Upstream::Unread(why) => {
                return Err(format!(
                    "the provider's answer to the follow-up was not read ({why})"
                ));
            }
            _ => {
                return Err("the provider's answer to the follow-up was not read whole".to_owned());
            }
        };
        if head.status != StatusCode::OK {
            return Err(format!(
                "the provider answered the follow-up with {}",
                head.status
            ));
        }
        let answer = read_answer(self.state, self.format, &body, self.name)
            .await
            .ok_or("the provider's answer to the follow-up is not JSON")?;
        let whole = Whole {
            head,
            body,
            usage,
            held,
        };
        Ok((whole, answer))
    }
}
