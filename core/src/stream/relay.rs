//! A streamed answer on its way to the caller, leg by leg: the attempt that
//! answered first, then each continuation after a break. One call per chunk
//! does what every drop-in does to it — the leg's [`StreamGate`] (preamble,
//! error and malformed events), the leg's [`Splicer`] for a continuation (no
//! second opening, no restated text), the [`Transcript`] of what the caller
//! received — so a binding crosses into the core once per chunk and holds no
//! rule of its own about the order of those steps.
//!
//! ```
//! use retrywise::stream::{Relay, StreamGate};
//! use retrywise::wire::Transcript;
//! use retrywise::ApiFamily;
//!
//! let gate = StreamGate::new(Some("text/event-stream")).end_at_error();
//! let mut relay = Relay::new(Transcript::new(ApiFamily::OpenAi), gate);
//! let text = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
//! assert_eq!(&relay.feed(text)[..], &text[..]); // whole events come back as they are
//! assert_eq!(relay.transcript().text(), "Hi");
//! // The body ended without the answer's finish: a cut, which another upstream may continue.
//! let end = relay.end_outcome(200);
//! assert!(end.error.is_some() && end.resumable);
//! ```

use super::StreamGate;
use crate::outcome::Outcome;
use crate::wire::{Splicer, Transcript};
use std::borrow::Cow;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Relay {
    transcript: Transcript,
    gate: StreamGate,
    splicer: Option<Splicer>,
}

impl Relay {
    /// The first leg: `gate` over the body of the attempt that answered,
    /// `transcript` of what the caller received so far (usually nothing).
    pub fn new(transcript: Transcript, gate: StreamGate) -> Relay {
        Relay {
            transcript,
            gate,
            splicer: None,
        }
    }

    /// The next leg, a continuation: `gate` over its body, spliced into
    /// what the caller already has.
    pub fn continue_with(&mut self, gate: StreamGate) {
        self.splicer = Some(Splicer::new(self.transcript.api(), &self.transcript));
        self.gate = gate;
    }

    /// Bytes of the leg's body in; the bytes the caller gets now out (the
    /// chunk itself, without a copy, when it is made of whole events passed
    /// on as they are).
    pub fn feed<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        let out = if self.gate.watching() {
            self.gate.feed(chunk)
        } else {
            Cow::Borrowed(chunk)
        };
        let out = match &mut self.splicer {
            Some(s) if !out.is_empty() => Cow::Owned(s.feed(&out)),
            _ => out,
        };
        if !out.is_empty() {
            self.transcript.observe(&out);
        }
        out
    }

    /// The leg's body ended: what is still held, for the caller before the end.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = self.gate.finish();
        if let Some(s) = &mut self.splicer {
            let mut spliced = if out.is_empty() { Vec::new() } else { s.feed(&out) };
            spliced.extend(s.finish());
            out = spliced;
        }
        if !out.is_empty() {
            self.transcript.observe(&out);
        }
        out
    }

    /// The gate ended the leg (a malformed event under `error`, an error
    /// event after output): nothing after it goes to the caller.
    pub fn cut_short(&self) -> bool {
        self.gate.stream_error().is_some() && !self.gate.watching()
    }

    /// What the leg reports when its body ended cleanly now with HTTP
    /// `status` ([`StreamGate::end_outcome`] over the transcript).
    pub fn end_outcome(&self, status: u16) -> Outcome {
        self.gate.end_outcome(status, &self.transcript)
    }

    /// What the leg reports when the caller stopped reading, or before
    /// anything was shown ([`StreamGate::outcome`]).
    pub fn outcome(&self, status: u16) -> Outcome {
        self.gate.outcome(status)
    }

    /// What the caller received so far.
    pub fn transcript(&self) -> &Transcript {
        &self.transcript
    }

    /// The current leg's gate.
    pub fn gate(&self) -> &StreamGate {
        &self.gate
    }

    /// The current leg is a continuation.
    pub fn continuing(&self) -> bool {
        self.splicer.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ApiFamily, ErrorKind, Phase};

    fn chat(text: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
    }
    const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    const STOP: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    fn gate() -> StreamGate {
        StreamGate::new(Some("text/event-stream")).end_at_error()
    }

    #[test]
    fn a_leg_and_its_continuation_give_the_caller_one_answer() {
        let mut r = Relay::new(Transcript::new(ApiFamily::OpenAi), gate());
        let mut caller = Vec::new();
        assert!(r.feed(ROLE.as_bytes()).is_empty(), "the preamble is held");
        caller.extend_from_slice(&r.feed(chat("Hello").as_bytes()));
        // Split mid-event: the gate waits for its end.
        let half = chat(" wor");
        let (a, b) = half.as_bytes().split_at(10);
        caller.extend_from_slice(&r.feed(a));
        caller.extend_from_slice(&r.feed(b));
        assert_eq!(r.transcript().text(), "Hello wor");
        let cut = r.end_outcome(200);
        assert_eq!(
            (cut.error, cut.phase, cut.resumable),
            (Some(ErrorKind::ConnectionReset), Some(Phase::StreamVisible), true)
        );
        // The continuation opens again and restates the text: the caller gets only the rest.
        r.continue_with(gate());
        assert!(r.continuing());
        for part in [ROLE.to_string(), chat("Hello wor"), chat("ld"), STOP.to_string()] {
            caller.extend_from_slice(&r.feed(part.as_bytes()));
        }
        caller.extend(r.finish());
        assert_eq!(r.transcript().text(), "Hello world");
        assert!(r.transcript().finished());
        assert_eq!(r.end_outcome(200).error, None);
        let mut seen = Transcript::new(ApiFamily::OpenAi);
        seen.observe(&caller);
        assert_eq!((seen.text(), seen.finished()), ("Hello world", true));
    }

    #[test]
    fn an_error_event_after_output_cuts_the_leg_short() {
        let mut r = Relay::new(Transcript::new(ApiFamily::Anthropic), gate());
        let text = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
        let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_eq!(&r.feed(text.as_bytes())[..], text.as_bytes());
        assert!(r.feed(err.as_bytes()).is_empty());
        assert!(r.cut_short());
        let o = r.end_outcome(200);
        assert_eq!(
            (o.status, o.vendor_code.as_deref(), o.resumable),
            (Some(529), Some("overloaded_error"), true)
        );
        // Not an event stream: passed on as it comes.
        let mut plain = Relay::new(
            Transcript::new(ApiFamily::OpenAi),
            StreamGate::new(Some("application/octet-stream")),
        );
        assert_eq!(&plain.feed(b"\x00\x01")[..], b"\x00\x01");
        assert!(!plain.cut_short());
    }
}
