//! `StreamGate`: the core's [`retrywise::StreamGate`] for a response body in
//! JS. `wrapFetch` runs each attempt's body through one; it is exported for
//! callers that read streams themselves.

use crate::guard;
use napi::bindgen_prelude::*;
use napi_derive::napi;

/// Holds a streamed body's preamble (a role-only delta, `message_start`,
/// pings) until its first meaningful event, so a cut before it is
/// `stream_open` and may be retried. Only `text/event-stream` is held back.
#[napi]
pub struct StreamGate {
    gate: retrywise::StreamGate,
}

#[napi]
impl StreamGate {
    /// A gate for a body of `contentType` (the response's `content-type`).
    #[napi(constructor)]
    pub fn new(content_type: Option<String>) -> Self {
        StreamGate {
            gate: retrywise::StreamGate::new(content_type.as_deref()),
        }
    }

    /// Bytes received from upstream in; what the consumer may see now out
    /// (empty while only preamble arrived; `chunk` itself once visible).
    #[napi]
    pub fn feed(&mut self, env: Env, chunk: Uint8Array) -> Result<Uint8Array> {
        let out = guard(&env, || Ok(self.gate.feed_pass(&chunk)))?;
        Ok(out.map_or(chunk, Uint8Array::new))
    }

    /// The body ended: everything still held, to deliver before the end.
    #[napi]
    pub fn finish(&mut self) -> Uint8Array {
        Uint8Array::new(self.gate.finish())
    }

    /// Whether bytes were released: a failure from now on is `stream_visible`.
    #[napi(getter)]
    pub fn visible(&self) -> bool {
        self.gate.is_visible()
    }

    /// Whether feeding may still hold bytes back (an event stream before its
    /// first meaningful event); once false, chunks come back as they are.
    #[napi(getter)]
    pub fn may_hold(&self) -> bool {
        self.gate.may_hold()
    }

    /// `'stream_open'` or `'stream_visible'`: the phase a failure of the body would have now.
    #[napi(getter)]
    pub fn phase(&self) -> &'static str {
        self.gate.phase().as_str()
    }

    /// Bytes held back so far.
    #[napi(getter)]
    pub fn held(&self) -> u32 {
        self.gate.held() as u32
    }
}
