//! Response bodies, including scripted streams that pause, stall or break on purpose.

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
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::time::{sleep, Sleep};

use crate::shapes;
use crate::spec::MAX_WAIT_MS;
use crate::state::{Ending, Tracker};

/// The error a body yields to make hyper abort the connection. Hyper then closes
/// the socket without the final `0\r\n\r\n` chunk, which is exactly what a client
/// sees when an upstream dies mid-stream.
#[derive(Debug)]
pub struct Cut;

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stream cut on purpose by the fault")
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

/// A JSON response with `content-length`.
pub fn json_response(status: u16, value: &impl Serialize) -> Response<ResBody> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut res = Response::new(full(body));
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// How a scripted body ends after its last step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Normal end of body (chunked terminator written).
    Clean,
    /// Abort the connection after the last frame has been flushed.
    Cut,
    /// Send nothing more and keep the connection open (a stall), until the client
    /// leaves or [`MAX_WAIT_MS`] pass; then abort like `Cut`.
    Hold,
}

/// One write of a scripted body, after an optional pause.
#[derive(Debug, Clone)]
pub struct Step {
    pub pause: Duration,
    pub frame: shapes::Frame,
}

impl Step {
    pub fn now(frame: shapes::Frame) -> Self {
        Step {
            pause: Duration::ZERO,
            frame,
        }
    }
}

/// Grace period between the last frame and the cut. Returning `Pending` here lets
/// hyper flush the frames already queued; yielding the error right away could make
/// hyper drop them unsent, and a cut after `k` deltas must deliver exactly those.
const CUT_FLUSH_GRACE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Sending,
    /// Waiting out the flush grace (or the hold cap), then aborting.
    Aborting,
}

/// A body that sends its steps (each after its pause), then ends as `end` says,
/// and reports every visible delta and the ending to the request log. Timers live
/// inside the body, so when the client goes away and hyper drops the body, nothing
/// keeps running (and the log says the client closed).
pub struct ScriptBody {
    steps: VecDeque<Step>,
    end: End,
    /// `Some`: sent with this `content-length` (a cut or stall then leaves the
    /// body short); `None`: chunked.
    len: Option<u64>,
    phase: Phase,
    sleep: Option<Pin<Box<Sleep>>>,
    tracker: Tracker,
}

impl ScriptBody {
    pub fn new(steps: Vec<Step>, end: End, len: Option<u64>, tracker: Tracker) -> Self {
        if steps.is_empty() && end == End::Clean {
            tracker.finish(Ending::Complete);
        }
        Self {
            steps: steps.into(),
            end,
            len,
            phase: Phase::Sending,
            sleep: None,
            tracker,
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
        loop {
            if let Some(timer) = this.sleep.as_mut() {
                // Polling registers the waker that brings hyper back.
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
                if this.phase == Phase::Aborting {
                    this.tracker.finish(Ending::Cut);
                    return Poll::Ready(Some(Err(Cut)));
                }
            }
            if let Some(step) = this.steps.front_mut() {
                if !step.pause.is_zero() {
                    let pause = std::mem::take(&mut step.pause);
                    this.sleep = Some(Box::pin(sleep(pause)));
                    continue;
                }
            }
            if let Some(step) = this.steps.pop_front() {
                if let Some(delta) = &step.frame.delta {
                    this.tracker.delta(delta);
                }
                if this.steps.is_empty() && this.end == End::Clean {
                    // Hyper may not poll again once `is_end_stream` says so.
                    this.tracker.finish(Ending::Complete);
                }
                return Poll::Ready(Some(Ok(Frame::data(step.frame.bytes))));
            }
            match this.end {
                End::Clean => {
                    this.tracker.finish(Ending::Complete);
                    return Poll::Ready(None);
                }
                End::Cut | End::Hold if this.phase == Phase::Sending => {
                    this.phase = Phase::Aborting;
                    let wait = match this.end {
                        End::Hold => Duration::from_millis(MAX_WAIT_MS),
                        _ => CUT_FLUSH_GRACE,
                    };
                    this.sleep = Some(Box::pin(sleep(wait)));
                }
                End::Cut | End::Hold => {
                    this.tracker.finish(Ending::Cut);
                    return Poll::Ready(Some(Err(Cut)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end == End::Clean && self.steps.is_empty() && self.sleep.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // Unknown length forces chunked encoding, which a cut must be able to break.
        self.len.map(SizeHint::with_exact).unwrap_or_default()
    }
}
