//! A relayed answer's body rewritten on its way to the client, a chunk at a time: the
//! provider APIs' wings say what goes on for each chunk and at the end ([`Rewriter`]);
//! frames other than data (trailers) and the provider's errors pass as they are.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::Bytes;
use http_body::Frame;

/// What a wing does to an answer's bytes.
pub(super) trait Rewriter: Unpin + Send + 'static {
    /// What goes on for this chunk (empty: held for a later one).
    fn feed(&mut self, data: Bytes) -> Bytes;
    /// What goes on once the provider's body has ended (empty: nothing).
    fn finish(&mut self) -> Bytes;
}

/// The client's body: the provider's, through a [`Rewriter`].
pub(super) struct Rewritten<R> {
    inner: Body,
    rewriter: R,
    ended: bool,
}

impl<R: Rewriter> Rewritten<R> {
    pub(super) fn body(inner: Body, rewriter: R) -> Body {
        Body::new(Rewritten {
            inner,
            rewriter,
            ended: false,
        })
    }
}

impl<R: Rewriter> http_body::Body for Rewritten<R> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.rewriter.feed(data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.ended = true;
                    let out = this.rewriter.finish();
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out))));
                }
            }
        }
    }
}
