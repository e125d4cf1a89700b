//! Response bodies, including scripted streams that pause or break on purpose.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{sleep, Sleep};

/// The error a body yields to make hyper abort the connection. Hyper then closes
/// the socket without the final `0\r\n\r\n` chunk, which is exactly what a client
/// sees when an upstream dies mid-stream.
#[derive(Debug)]
pub struct Cut;

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stream cut on purpose by the fault spec")
    }
}

impl std::error::Error for Cut {}

/// Body type of every response.
pub type ResBody = BoxBody<Bytes, Cut>;

/// A fixed body sent in one piece with a `content-length`.
pub fn full(bytes: impl Into<Bytes>) -> ResBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// How a scripted stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Normal end of body (chunked terminator written).
    Clean,
    /// Abort the connection after the last chunk has been flushed.
    Cut,
}

/// Grace period between the last chunk and the cut. Returning `Pending` here lets
/// hyper flush the chunks already queued; yielding the error right away could make
/// hyper drop them unsent, and `sse-cut:<n>` must deliver exactly `n` chunks.
const CUT_FLUSH_GRACE: Duration = Duration::from_millis(20);

/// A body that sends `frames` with `gap` between them (the first `fast` of them
/// back to back), then ends as `end` says.
/// Timers live inside the body, so when the client goes away and hyper drops the
/// body, nothing keeps running.
pub struct ScriptBody {
    frames: VecDeque<Bytes>,
    gap: Duration,
    /// Frames sent before the first gap.
    fast: u32,
    sent: u32,
    end: End,
    sleep: Option<Pin<Box<Sleep>>>,
    /// True once the cut's grace sleep has been scheduled.
    cutting: bool,
}

impl ScriptBody {
    pub fn new(frames: Vec<Bytes>, gap: Duration, fast: u32, end: End) -> Self {
        Self {
            frames: frames.into(),
            gap,
            fast,
            sent: 0,
            end,
            sleep: None,
            cutting: false,
        }
    }

    pub fn boxed(self) -> ResBody {
        BodyExt::boxed(self)
    }
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = Cut;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Cut>>> {
        let this = &mut *self;
        if let Some(timer) = this.sleep.as_mut() {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleep = None;
        }
        if let Some(frame) = this.frames.pop_front() {
            this.sent += 1;
            if !this.frames.is_empty() && !this.gap.is_zero() && this.sent >= this.fast {
                this.sleep = Some(Box::pin(sleep(this.gap)));
            }
            return Poll::Ready(Some(Ok(Frame::data(frame))));
        }
        match this.end {
            End::Clean => Poll::Ready(None),
            End::Cut if this.cutting => Poll::Ready(Some(Err(Cut))),
            End::Cut => {
                this.cutting = true;
                let mut timer = Box::pin(sleep(CUT_FLUSH_GRACE));
                // Polling registers the waker that brings hyper back for the cut.
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Cut)));
                }
                this.sleep = Some(timer);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end == End::Clean && self.frames.is_empty() && self.sleep.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // Unknown length forces chunked encoding, which a cut must be able to break.
        SizeHint::default()
    }
}
