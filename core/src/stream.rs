//! A streamed answer's phase, read from its bytes: [`Phase::StreamOpen`]
//! until its first meaningful event, [`Phase::StreamVisible`] after.
//!
//! Model APIs open a stream with events that carry nothing for the reader:
//! OpenAI's first chunk is a role-only delta, Anthropic sends
//! `message_start`, an empty `content_block_start` and `ping`s. Passing
//! those on at once would make a cut right after them look like visible
//! output, which is never replayed. A [`StreamGate`] holds such events back
//! until the first event with output (text, a tool call, a finish reason,
//! anything it does not know), then releases everything held and passes the
//! rest on event by event. A stream cut while the gate still holds is
//! `StreamOpen`: nothing reached the consumer, so the attempt may be retried
//! and the next attempt's stream delivered in its place.
//!
//! An error event (`event: error`, Anthropic's `{"type": "error", ...}`,
//! OpenAI's `{"error": {...}}` chunk, the Responses API's `response.failed`)
//! is not output either: before any output the gate holds it and everything
//! after it, and [`StreamGate::outcome`] reports the attempt as the failure
//! the event names (an `overloaded_error` is an overload, retried like a
//! 529), still `StreamOpen`. After output, the gate keeps watching the bytes
//! it passes on for one, so a stream that shows text and then an error is a
//! partial stream, never a success.
//!
//! A malformed event (its data neither JSON nor `[DONE]`) would make an SDK's
//! stream parser raise mid-answer. By default ([`MalformedEvent::Skip`]) the
//! gate drops it and counts it ([`StreamGate::skipped`]); with
//! [`MalformedEvent::Error`] it ends the stream with a `malformed_event`
//! [`StreamError`] and delivers nothing from that event on. To drop an event
//! whole, the gate passes on complete events only: an event's bytes wait for
//! its blank line (an SDK acts on nothing before it anyway). A chunk made of
//! whole, well-formed events comes back as it is, without a copy.
//!
//! A [`Relay`] carries one answer to the caller leg by leg: each leg's gate,
//! a continuation's splicer and the transcript, in one call per chunk.
//!
//! The SSE framing is read by the shared [`EventReader`]: only the bytes
//! already buffered are looked at, which the SSE crates (built around async
//! streams) do not offer.
//!
//! ```
//! use retrywise::stream::StreamGate;
//!
//! let mut gate = StreamGate::new(Some("text/event-stream"));
//! let role = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
//! assert!(gate.feed(role).is_empty()); // held: a cut now is stream_open
//! let text = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
//! let out = gate.feed(text).into_owned();
//! assert_eq!(out, [&role[..], &text[..]].concat()); // both released at once
//! assert!(gate.is_visible());
//! assert!(gate.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\n\n").is_empty()); // not JSON
//! assert_eq!(gate.skipped(), 1);
//! ```

use crate::outcome::{media_type, Outcome};
use crate::types::{ErrorKind, MalformedEvent, Phase};
pub use crate::wire::sse::meaningful;
use crate::wire::sse::EventReader;
use crate::wire::Transcript;
use serde_json::Value;
use std::borrow::Cow;

/// Bytes a gate holds at most; past that it releases them (and counts the
/// stream as visible), so a long preamble is never buffered without bound.
/// After release, an unfinished event longer than this is passed on as it
/// comes (and is not checked).
pub const HOLD_LIMIT: usize = 64 * 1024;

/// The [`StreamError::code`] of a malformed event under [`MalformedEvent::Error`].
pub const MALFORMED_EVENT: &str = "malformed_event";

/// Holds a stream's preamble back until its first meaningful event (see the
/// module documentation). One per attempt's response body.
#[derive(Debug, Clone)]
pub struct StreamGate {
    /// Bytes received and not yet released, read as events.
    reader: EventReader,
    /// An event stream whose first meaningful event has not come yet.
    holding: bool,
    /// Bytes reached the consumer.
    visible: bool,
    /// An event stream: after release, its events are still read.
    sse: bool,
    /// The error event the stream carried, when it carried one.
    error: Option<StreamError>,
    /// What a malformed event does.
    malformed: MalformedEvent,
    /// Malformed events dropped.
    skipped: u64,
    /// A malformed event ended the stream: nothing more is delivered.
    ended: bool,
    /// An error event after output ends the stream before it (see [`StreamGate::end_at_error`]).
    end_at_error: bool,
}

/// An error event carried by a stream (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The provider's error type or code (`overloaded_error`, `server_error`,
    /// `rate_limit_exceeded`), or [`MALFORMED_EVENT`].
    pub code: Option<String>,
    /// Its message, when it had one.
    pub message: Option<String>,
    /// It came after output reached the consumer.
    pub after_output: bool,
}

impl StreamError {
    /// The HTTP status an error of this type stands for in the classifier's
    /// tables (the stream itself answered 200): overloads are 529, rate
    /// limits 429, request and auth errors their 4xx, anything else a 500.
    pub fn status(&self) -> u16 {
        match self.code.as_deref().unwrap_or("") {
            "overloaded_error" | "overloaded" => 529,
            "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" | "RESOURCE_EXHAUSTED" => 429,
            "invalid_request_error" | "invalid_request" | "context_length_exceeded" => 400,
            "authentication_error" | "invalid_api_key" => 401,
            "permission_error" => 403,
            "not_found_error" => 404,
            "request_too_large" => 413,
            "timeout_error" => 504,
            _ => 500,
        }
    }

    /// A malformed event ended the stream (not an error the provider sent).
    pub fn is_malformed(&self) -> bool {
        self.code.as_deref() == Some(MALFORMED_EVENT)
    }
}

/// What one complete event means to the gate.
enum Verdict {
    /// An error event.
    Error(StreamError),
    /// Data neither JSON nor `[DONE]`; the message says what it was.
    Malformed(String),
    /// The first meaningful event (looked for only while holding).
    Output,
    /// Anything else.
    Quiet,
}

impl StreamGate {
    /// A gate for a response body of `content_type`. Only `text/event-stream`
    /// bodies are gated; any other body passes through from its first byte.
    /// Malformed events are skipped (see [`StreamGate::on_malformed`]).
    pub fn new(content_type: Option<&str>) -> StreamGate {
        let sse = content_type.is_some_and(|ct| media_type(ct).eq_ignore_ascii_case("text/event-stream"));
        StreamGate {
            reader: EventReader::new(),
            holding: sse,
            visible: false,
            sse,
            error: None,
            malformed: MalformedEvent::Skip,
            skipped: 0,
            ended: false,
            end_at_error: false,
        }
    }

    /// An error event after output ends the stream the way a malformed event
    /// does under [`MalformedEvent::Error`]: what came before it is delivered,
    /// the event and anything after it are not (by default the event is
    /// passed on, for the consumer's SDK to raise). For a transport that
    /// continues the answer elsewhere or ends the consumer's stream with its
    /// own error: the provider's error event must not reach the consumer in
    /// the middle of an answer that goes on.
    pub fn end_at_error(mut self) -> StreamGate {
        self.end_at_error = true;
        self
    }

    /// What a malformed event does (the policy's `streams.malformed_event`).
    pub fn on_malformed(mut self, mode: MalformedEvent) -> StreamGate {
        self.malformed = mode;
        self
    }

    /// Malformed events dropped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The error event the stream carried, when it carried one.
    pub fn stream_error(&self) -> Option<&StreamError> {
        self.error.as_ref()
    }

    /// Whether the gate still reads what it is fed: an event stream is
    /// watched for an error event to its end, other bodies only until their
    /// first byte. A binding that stops feeding once this is false loses
    /// nothing (after a `malformed_event` error the gate delivers nothing more:
    /// the binding ends the consumer's stream).
    pub fn watching(&self) -> bool {
        self.error.is_none() && (self.holding || self.sse || !self.visible)
    }

    /// The outcome of an attempt whose body ended (or broke) now with HTTP
    /// `status`: a plain `status` when the stream carried no error event,
    /// else the failure the event names (see [`StreamError::status`]) with
    /// its vendor code, in the phase it came in. A malformed event under
    /// [`MalformedEvent::Error`] is a [`ErrorKind::MalformedResponse`].
    pub fn outcome(&self, status: u16) -> Outcome {
        match &self.error {
            None => Outcome::status(status),
            Some(e) => {
                let mut o = if e.is_malformed() {
                    let mut o = Outcome::status(status);
                    o.error = Some(ErrorKind::MalformedResponse);
                    o
                } else {
                    Outcome::status(e.status())
                };
                o.phase = Some(if e.after_output {
                    Phase::StreamVisible
                } else {
                    Phase::StreamOpen
                });
                o.vendor_code = e.code.clone();
                o
            }
        }
    }

    /// The outcome of an attempt whose body ended *cleanly* now with HTTP
    /// `status`, given `delivered`, the transcript of what the caller
    /// received: [`StreamGate::outcome`], except that an answer that showed
    /// output ([`Transcript::shown`]: text, a tool call, ...) and never
    /// finished (no `finish_reason`, `message_stop` or `response.completed`)
    /// was cut however the body ended. A close-delimited body, or a proxy
    /// that ends its chunked stream when the upstream drops, ends like a
    /// complete one. Such an answer is a [`ErrorKind::ConnectionReset`] in the
    /// gate's phase, never a success. After output, the outcome is
    /// `resumable` when only text reached the caller, so a route with
    /// `stream_recovery: continue` continues it elsewhere (a half tool call
    /// is not continued: the call stops).
    ///
    /// ```
    /// use retrywise::stream::StreamGate;
    /// use retrywise::wire::Transcript;
    /// use retrywise::{ApiFamily, ErrorKind, Phase};
    ///
    /// let text = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    /// let mut gate = StreamGate::new(Some("text/event-stream"));
    /// let mut seen = Transcript::new(ApiFamily::OpenAi);
    /// seen.observe(&gate.feed(text));
    /// // The body ended here: no finish_reason, no [DONE].
    /// let cut = gate.end_outcome(200, &seen);
    /// assert_eq!(cut.error, Some(ErrorKind::ConnectionReset));
    /// assert_eq!(cut.phase, Some(Phase::StreamVisible));
    /// assert!(cut.resumable);
    ///
    /// let finish = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    /// seen.observe(&gate.feed(finish));
    /// let done = gate.end_outcome(200, &seen);
    /// assert_eq!((done.status, done.error, done.resumable), (Some(200), None, false));
    /// ```
    pub fn end_outcome(&self, status: u16, delivered: &Transcript) -> Outcome {
        let mut o = self.outcome(status);
        let cut = self.error.is_none() && delivered.shown() && !delivered.finished();
        if cut {
            o.error = Some(ErrorKind::ConnectionReset);
            o.phase = Some(if self.visible {
                Phase::StreamVisible
            } else {
                Phase::StreamOpen
            });
        }
        // An error event or a cut after output: whether another upstream may go on from it.
        o.resumable = self.visible && (cut || self.error.is_some()) && delivered.resumable();
        o
    }

    /// Whether bytes were released: a cut from now on is `StreamVisible`.
    pub fn is_visible(&self) -> bool {
        self.visible
    }

    /// Whether the gate still holds an event stream's preamble (before its
    /// first meaningful event). After it, an event stream is still read event
    /// by event (an unfinished event waits, a malformed one is dropped), so a
    /// binding keeps feeding while [`StreamGate::watching`]; other bodies come
    /// back as they are.
    pub fn may_hold(&self) -> bool {
        self.holding
    }

    /// The phase a failure of the body would have now.
    pub fn phase(&self) -> Phase {
        if self.visible {
            Phase::StreamVisible
        } else {
            Phase::StreamOpen
        }
    }

    /// Bytes held back so far.
    pub fn held(&self) -> usize {
        self.reader.buffered().len()
    }

    /// Takes `chunk`, received from upstream, and returns what the consumer
    /// may see now: nothing while only preamble arrived; everything held when
    /// the first meaningful event completes (or the hold limit is passed);
    /// after that the complete events (`chunk` itself when it is made of
    /// whole, well-formed events), and other bodies from their first byte.
    pub fn feed<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.sse {
            self.visible |= !chunk.is_empty();
            return Cow::Borrowed(chunk);
        }
        if self.ended || (self.error.is_some() && !self.visible) {
            // Failed before any output, or ended by a malformed event: nothing more is shown.
            return Cow::Borrowed(&[]);
        }
        if self.error.is_some() {
            // After an error event the stream is the consumer's to end.
            return Cow::Borrowed(chunk);
        }
        let fresh = self.reader.buffered().is_empty();
        self.reader.push(chunk);
        if self.holding {
            self.feed_held()
        } else {
            self.feed_released(chunk, fresh)
        }
    }

    /// [`StreamGate::feed`] for a binding that can hand the caller's own chunk
    /// back: `None` when the consumer gets `chunk` as it is, else the bytes
    /// it gets instead (empty while holding).
    pub fn feed_pass(&mut self, chunk: &[u8]) -> Option<Vec<u8>> {
        match self.feed(chunk) {
            Cow::Borrowed(b) if b.len() == chunk.len() => None,
            other => Some(other.into_owned()),
        }
    }

    /// The body ended: everything still held (a stream of preamble only, or
    /// a last event without its blank line), to deliver before the end.
    pub fn finish(&mut self) -> Vec<u8> {
        if !self.sse || self.ended || self.error.is_some() {
            return Vec::new();
        }
        self.holding = false;
        let out = self.reader.buffered().to_vec();
        self.reader.drop_buffered();
        self.visible |= !out.is_empty();
        out
    }

    /// While holding: reads the events completed so far.
    fn feed_held(&mut self) -> Cow<'static, [u8]> {
        let mut released = false;
        while let Some(ev) = self.reader.next_event() {
            let raw = ev.raw.clone();
            match verdict(ev.name, ev.data, ev.truncated, !released) {
                Verdict::Error(mut e) if !released => {
                    // Held, never delivered: the next attempt's stream takes its place.
                    e.after_output = false;
                    return self.fail_before_output(e);
                }
                Verdict::Error(mut e) => {
                    e.after_output = true;
                    if self.end_at_error {
                        return self.end_at(raw.start, e);
                    }
                    self.error = Some(e);
                    return Cow::Owned(self.take_all());
                }
                Verdict::Malformed(why) => match self.malformed {
                    MalformedEvent::Skip => self.skip(raw),
                    MalformedEvent::Error if !released => {
                        return self.fail_before_output(malformed_error(why, false));
                    }
                    MalformedEvent::Error => return self.end_before(raw.start, why),
                },
                Verdict::Output => {
                    released = true;
                    self.holding = false;
                    self.visible = true;
                }
                Verdict::Quiet => {}
            }
        }
        if released {
            return Cow::Owned(self.take_complete());
        }
        if self.reader.buffered().len() > HOLD_LIMIT {
            self.holding = false;
            self.visible = true;
            return Cow::Owned(self.take_all());
        }
        Cow::Borrowed(&[])
    }

    /// After release: passes complete events on, drops or stops at a
    /// malformed one, and keeps an unfinished event (up to the hold limit).
    /// `fresh`: nothing was buffered before `chunk`.
    fn feed_released<'a>(&mut self, chunk: &'a [u8], fresh: bool) -> Cow<'a, [u8]> {
        let mut whole = fresh;
        while let Some(ev) = self.reader.next_event() {
            let raw = ev.raw.clone();
            match verdict(ev.name, ev.data, ev.truncated, false) {
                Verdict::Error(mut e) => {
                    e.after_output = true;
                    if self.end_at_error {
                        return self.end_at(raw.start, e);
                    }
                    self.error = Some(e);
                    return self.pass_all(chunk, whole);
                }
                Verdict::Malformed(why) => match self.malformed {
                    MalformedEvent::Skip => {
                        self.skip(raw);
                        whole = false;
                    }
                    MalformedEvent::Error => return self.end_before(raw.start, why),
                },
                Verdict::Output | Verdict::Quiet => {}
            }
        }
        let complete = self.reader.pending_start();
        if self.reader.buffered().len() - complete > HOLD_LIMIT {
            // An event this long is passed on as it comes.
            return self.pass_all(chunk, whole);
        }
        if whole {
            // The buffer is `chunk`: its complete events go on without a copy.
            self.reader.consume(complete);
            return Cow::Borrowed(&chunk[..complete]);
        }
        Cow::Owned(self.take_complete())
    }

    /// Drops the malformed event just read.
    fn skip(&mut self, raw: std::ops::Range<usize>) {
        self.reader.excise(raw);
        self.skipped += 1;
    }

    /// A malformed event at `at` ends a stream that showed output: what came
    /// before it is delivered, nothing from it on.
    fn end_before(&mut self, at: usize, why: String) -> Cow<'static, [u8]> {
        self.end_at(at, malformed_error(why, true))
    }

    /// The stream that showed output ends at `at` with `e`: what came before
    /// is delivered, nothing from it on.
    fn end_at(&mut self, at: usize, e: StreamError) -> Cow<'static, [u8]> {
        self.error = Some(e);
        self.ended = true;
        let out = self.reader.buffered()[..at].to_vec();
        self.reader.drop_buffered();
        Cow::Owned(out)
    }

    /// The stream failed before any output: nothing of it is ever delivered.
    fn fail_before_output(&mut self, e: StreamError) -> Cow<'static, [u8]> {
        self.error = Some(e);
        self.holding = false;
        self.reader = EventReader::new();
        Cow::Borrowed(&[])
    }

    /// Everything buffered, which is `chunk` when `whole`.
    fn pass_all<'a>(&mut self, chunk: &'a [u8], whole: bool) -> Cow<'a, [u8]> {
        if whole {
            self.reader.drop_buffered();
            return Cow::Borrowed(chunk);
        }
        Cow::Owned(self.take_all())
    }

    fn take_all(&mut self) -> Vec<u8> {
        let out = self.reader.buffered().to_vec();
        self.reader.drop_buffered();
        out
    }

    fn take_complete(&mut self) -> Vec<u8> {
        let n = self.reader.pending_start();
        let out = self.reader.buffered()[..n].to_vec();
        self.reader.consume(n);
        out
    }
}

/// What a complete event means; `holding`: look for the first output too.
fn verdict(name: &[u8], data: &[u8], truncated: bool, holding: bool) -> Verdict {
    if truncated {
        return Verdict::Quiet;
    }
    if let Some(e) = error_event(name, data) {
        return Verdict::Error(e);
    }
    if malformed(data) {
        let shown = String::from_utf8_lossy(&data[..data.len().min(80)]).into_owned();
        return Verdict::Malformed(shown);
    }
    if holding && meaningful(name, data) {
        Verdict::Output
    } else {
        Verdict::Quiet
    }
}

/// Event data an SDK's stream parser would raise on: neither `[DONE]` nor a
/// JSON text (which is UTF-8). Data that does not even start like a JSON
/// object or array is rejected at its first byte; the rest takes one
/// validating pass without allocation: a cut event starts like JSON too
/// (the common failure: a proxy or a broken upstream loses its end).
pub fn malformed(data: &[u8]) -> bool {
    if data.starts_with(b"[DONE]") {
        return false;
    }
    let first = data.iter().find(|b| !b.is_ascii_whitespace());
    if !matches!(
        first,
        Some(b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
    ) {
        return true;
    }
    std::str::from_utf8(data).map_or(true, |s| serde_json::from_str::<serde::de::IgnoredAny>(s).is_err())
}

fn malformed_error(shown: String, after_output: bool) -> StreamError {
    StreamError {
        code: Some(MALFORMED_EVENT.to_owned()),
        message: Some(format!("stream event data is neither JSON nor [DONE]: {shown}")),
        after_output,
    }
}

/// Whether a `data:` line of an event named `name` may belong to an error
/// event (cheap: the first bytes only), so most events are not parsed for it.
fn may_be_error(name: &[u8], value: &[u8]) -> bool {
    name == b"error"
        || name == b"response.failed"
        || value.starts_with(b"{\"error\"")
        || value.starts_with(b"{\"type\":\"error\"")
        || value.starts_with(b"{\"type\": \"error\"")
        || value.starts_with(b"{\"type\":\"response.failed\"")
}

/// The error an SSE event reports, when it is an error event: `event: error`,
/// a JSON payload of `type` `error` (Anthropic, the Responses API) or with an
/// `error` object (OpenAI chat chunks), or `response.failed`.
pub fn error_event(name: &[u8], data: &[u8]) -> Option<StreamError> {
    let named = name == b"error" || name == b"response.failed";
    if !named && !may_be_error(name, data) {
        return None;
    }
    let v: Value = serde_json::from_slice(data).unwrap_or(Value::Null);
    let ty = v.get("type").and_then(Value::as_str);
    let err = match ty {
        Some("response.failed") => v.get("response").and_then(|r| r.get("error")),
        _ => v.get("error"),
    };
    let text = |x: Option<&Value>, k: &str| {
        x.and_then(|x| x.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let is_error = named || ty == Some("error") || ty == Some("response.failed") || err.is_some_and(Value::is_object);
    if !is_error {
        return None;
    }
    let obj = err.filter(|e| e.is_object());
    Some(StreamError {
        code: text(obj, "type")
            .or_else(|| text(obj, "code"))
            .or_else(|| text(Some(&v), "code")),
        message: text(obj, "message").or_else(|| text(Some(&v), "message")),
        after_output: false,
    })
}

mod relay;
#[cfg(test)]
mod tests;

pub use relay::Relay;
