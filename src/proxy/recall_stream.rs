//! Recall for a streamed answer: the rounds of [`crate::recall::stream`] driven over the
//! network. The client's body is fed by a task that reads each round's stream (relayed
//! by [`crate::relay`] as every stream is: timeouts, decoding, usage stripping), passes
//! its events through the round, and — when a round called `abridge_recall` — answers
//! the calls, asks the provider again with the same streamed request extended by the
//! calls and their results (the last time with `tool_choice: none`), and relays that
//! stream as the continuation. The client sees one stream.
//!
//! The first round's usage is what is recorded for the conversation (the forwarded
//! history, as the provider counted it), by the first round's relay. When a follow-up
//! cannot be sent or is refused, the forwarded request is sent once more without the
//! tool and its stream continues the client's; when even that fails, the round's own
//! answer is relayed with its recall calls taken out. The calls served are counted for
//! the conversation when the stream ends; the `x-abridge-recalls` header, sent before
//! anything is known, is not set on streams.
//!
//! **Bounds.** A round is read by a [`Reader`] within `recall.max_answer_bytes`, and
//! holds its events at most `recall.max_hold_ms` (timed here): past either, recall is
//! given up for it (see [`crate::recall::stream`]). The task keeps the request body's
//! share of `limits.max_inflight_body_bytes` for as long as it runs (the body is in the
//! follow-ups it sends), and each follow-up's body takes a share of its own while it
//! is the one sent; when the budget has no room for one, the round is answered without
//! recall (its calls taken out), never failed.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{StatusCode, Uri};
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use crate::accounting::{self, Tally};
use crate::formats::Request;
use crate::identity::Fingerprint;
use crate::ingress::Held;
use crate::recall::Condensed;
use crate::recall::stream::reader::{Fed, Reader};
use crate::recall::stream::{Carry, Round};
use crate::recall::wire;
use crate::relay::{self, Watch};
use crate::state::AppState;

use super::{Exchange, Upstream, first_answer};

type Sent = Result<Frame<Bytes>, axum::Error>;

/// What the rounds of one streamed request need, taken from its handler.
pub(super) struct Streamed {
    pub state: AppState,
    pub request: Arc<Request>,
    /// What the request's recall reads.
    pub condensed: Condensed,
    pub parts: Parts,
    pub target: Uri,
    /// The body of the first round, as sent.
    pub sent: Bytes,
    /// The client's `tool_choice`, as a Responses answer echoes it.
    pub choice: Value,
    /// The tool's name in this request.
    pub name: Cow<'static, str>,
    pub conversation: Option<Fingerprint>,
    /// The request body's share of the body budget (a clone of the request's own),
    /// kept while the rounds run.
    #[allow(dead_code, reason = "held for its Drop")]
    pub held: Held,
}

/// Where the rounds of one streamed request stand.
struct Rounds {
    /// The stream of the round being read.
    body: Body,
    /// The body sent last, and its share of the budget (none for the first).
    sent: (Bytes, Held),
    followups: u32,
    spent: Tally,
    corpus: Option<crate::recall::Corpus>,
}

/// A copy of a request's head (method, URI, version, headers).
pub(super) fn copy(parts: &Parts) -> Parts {
    let (mut copy, ()) = http::Request::new(()).into_parts();
    copy.method = parts.method.clone();
    copy.uri = parts.uri.clone();
    copy.version = parts.version;
    copy.headers = parts.headers.clone();
    copy
}

impl Streamed {
    /// The client's response: `first` (the first round, relayed) when it is not a
    /// stream; otherwise the same head with a body fed by the rounds.
    pub(super) fn wrap(self, first: Response, watch: Watch, bounds: relay::Bounds) -> Response {
        if first.status() != StatusCode::OK || !relay::is_event_stream(first.headers()) {
            return first;
        }
        let (head, body) = first.into_parts();
        let (tx, rx) = mpsc::channel(8);
        let span = tracing::Span::current();
        tokio::spawn(self.run(body, (watch, bounds), tx).instrument(span));
        Response::from_parts(head, Body::new(Channel(rx)))
    }

    async fn run(
        self,
        first: Body,
        (watch, bounds): (Watch, relay::Bounds),
        tx: mpsc::Sender<Sent>,
    ) {
        let config = &self.state.config().recall;
        let (max_rounds, max_bytes) = (config.max_rounds, config.max_answer_bytes);
        let hold = Duration::from_millis(config.max_hold_ms);
        let price = self.state.prices().of(self.request.model());
        let mut carry = Carry::new(
            self.request.format(),
            self.choice.clone(),
            self.name.clone(),
        );
        let mut at = Rounds {
            body: first,
            sent: (self.sent.clone(), Held::default()),
            followups: 0,
            spent: Tally::default(),
            corpus: None,
        };
        loop {
            let mut round = Round::new(carry);
            let reader = Reader::new(max_bytes);
            if !relay_round(&mut at.body, (&mut round, reader), &tx, hold).await {
                break;
            }
            if at.followups > 0
                && let Some(usage) = round.usage().and_then(crate::relay::usage::of_value)
            {
                let spent = accounting::recall(0, accounting::reported(&usage), price);
                at.spent.add(&spent);
            }
            let Some(answer) = round.recalled(at.followups < max_rounds) else {
                let _ = send(&tx, round.flush()).await;
                break;
            };
            at.followups += 1;
            if !self.follow(answer, &mut at, (watch, &bounds)).await {
                let _ = send(&tx, round.flush()).await;
                break;
            }
            carry = round.into_carry();
        }
        super::recall::account(&self.state, self.conversation, &at.spent);
    }

    /// Serves `answer`'s calls and asks the provider again: `at.body` is then the next
    /// round's stream (the follow-up's, or the request's without the tool when the
    /// follow-up failed). `false`: nothing more to read (the round's own answer is the
    /// client's, its calls taken out).
    async fn follow(
        &self,
        answer: wire::Answer,
        at: &mut Rounds,
        (watch, bounds): (Watch, &relay::Bounds),
    ) -> bool {
        let format = self.request.format();
        let max_rounds = self.state.config().recall.max_rounds;
        let (results, served) = super::recall::answer_calls(
            &self.state,
            (&self.request, &self.condensed),
            &mut at.corpus,
            &answer.calls,
        )
        .await;
        at.spent.recalls += served;
        let items = wire::round_items(format, &answer, &results, &self.name);
        let last = at.followups >= max_rounds;
        let next = wire::follow_up(format, &at.sent.0, &items, last).map(Bytes::from);
        let asked = match next {
            Some(next) => self.ask(next, watch, bounds).await,
            None => Err("the forwarded request could not be extended".to_owned()),
        };
        let why = match asked {
            Ok((body, sent)) => {
                (at.body, at.sent) = (body, sent);
                return true;
            }
            Err(why) => why,
        };
        self.state.stats().recall_failure();
        tracing::warn!(%why, "recall follow-up failed; continued without recall");
        let checkpoint = self.condensed.checkpoint.as_ref();
        let (plain, watch) =
            super::conversation::rewrite(&self.state, &self.request, checkpoint, None);
        match self.ask(plain, watch, bounds).await {
            Ok((body, sent)) => {
                (at.body, at.sent) = (body, sent);
                at.followups = max_rounds;
                true
            }
            Err(_) => false,
        }
    }

    /// The provider's stream for `body`, relayed (its usage is not recorded: the
    /// conversation's is the first round's), and `body` with its share of the budget,
    /// taken first (no room: not sent).
    async fn ask(
        &self,
        body: Bytes,
        watch: Watch,
        bounds: &relay::Bounds,
    ) -> Result<(Body, (Bytes, Held)), String> {
        let held = self.state.body_budget().hold(body.len()).map_err(|_| {
            "no room for the follow-up in limits.max_inflight_body_bytes".to_owned()
        })?;
        let sent = body.clone();
        let mut exchange = Exchange::detached();
        let answer = first_answer(
            &self.state,
            &self.parts,
            &self.target,
            body,
            (false, false),
            &mut exchange,
        )
        .await
        .map_err(|e| format!("the follow-up could not be sent ({e})"))?;
        let Upstream::Streaming(response) = answer else {
            return Err("the provider's answer to the follow-up was not a stream".to_owned());
        };
        if response.status() != StatusCode::OK || !relay::is_event_stream(response.headers()) {
            return Err(format!(
                "the provider answered the follow-up with {}",
                response.status()
            ));
        }
        let relayed = relay::respond(response, watch, bounds.clone(), Box::new(|_| {}));
        Ok((relayed.into_body(), (sent, held)))
    }
}

/// Reads one round's stream to its end through `round` (its bytes into events by
/// `reader`), sending the client what it lets through as it comes; once the round has
/// held its events for `hold`, recall is given up for it. `false`: the stream failed or
/// was ended (the error went to the client), or the client is gone.
async fn relay_round(
    body: &mut Body,
    (round, mut reader): (&mut Round, Reader),
    tx: &mpsc::Sender<Sent>,
    hold: Duration,
) -> bool {
    let mut deadline: Option<Instant> = None;
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = tx.closed() => return false,
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                tracing::debug!(?hold, "a streamed round held its events too long; recall given up for it");
                deadline = None;
                if !send(tx, round.give_up()).await {
                    return false;
                }
                continue;
            }
        };
        let data = match frame {
            None => return send(tx, reader.finish(round)).await,
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return false;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        let (out, more) = match reader.feed(round, &data) {
            Fed::Bytes(out) => (out, true),
            Fed::End(out) => (out, false),
        };
        if !send(tx, out).await || !more {
            return false;
        }
        if deadline.is_none() && round.holding() {
            deadline = Some(Instant::now() + hold);
        }
    }
}

/// Sends `bytes` to the client (nothing when empty); `false` when it is gone.
async fn send(tx: &mpsc::Sender<Sent>, bytes: Vec<u8>) -> bool {
    bytes.is_empty() || tx.send(Ok(Frame::data(Bytes::from(bytes)))).await.is_ok()
}

/// The client's body: what the rounds send.
struct Channel(mpsc::Receiver<Sent>);

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Sent>> {
        self.0.poll_recv(cx)
    }
}
