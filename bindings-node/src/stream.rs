//! `StreamGate`: the core's [`retrywise::StreamGate`] for a response body in
//! JS. `wrapFetch` runs each attempt's body through one; it is exported for
//! callers that read streams themselves.

use crate::errors::guard;
use napi::bindgen_prelude::*;
use napi_derive::napi;

/// Holds a streamed body's preamble (a role-only delta, `message_start`,
/// pings) until its first meaningful event, so a cut before it is
/// `stream_open` and may be retried. Only `text/event-stream` is held back.
#[napi]
pub struct StreamGate {
    gate: retrywise::StreamGate,
}

impl StreamGate {
    pub(crate) fn from_core(gate: retrywise::StreamGate) -> StreamGate {
        StreamGate { gate }
    }
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

    /// Malformed events dropped so far (`streams.malformed_event: skip`).
    #[napi(getter)]
    pub fn skipped(&self) -> f64 {
        self.gate.skipped() as f64
    }

    /// Whether the gate still reads what it is fed (an event stream is
    /// watched for an error event to its end); once false, feeding it is not needed.
    #[napi(getter)]
    pub fn watching(&self) -> bool {
        self.gate.watching()
    }

    /// The error event the stream carried, as JSON `{code, message, afterOutput}`, or null.
    #[napi(getter)]
    pub fn stream_error(&self) -> Option<String> {
        self.gate.stream_error().map(|e| {
            serde_json::json!({ "code": e.code, "message": e.message, "afterOutput": e.after_output }).to_string()
        })
    }

    /// The outcome of the attempt whose body ended (or broke) now with HTTP
    /// `status`, as JSON `{status, error, phase, vendorCode, resumable}`
    /// (absent fields null): the status, or the failure an error event named.
    #[napi]
    pub fn outcome(&self, status: u32) -> String {
        outcome_json(&self.gate.outcome(status.min(u16::MAX as u32) as u16))
    }

    /// The outcome of the attempt whose body ended cleanly now with HTTP
    /// `status`, `transcript` being what the caller received, as JSON
    /// `{status, error, phase, vendorCode, resumable}` (the core's
    /// `StreamGate::end_outcome`): as `outcome`, except that output shown
    /// without its finish was cut.
    #[napi]
    pub fn end_outcome(&self, status: u32, transcript: &crate::wire::Transcript) -> String {
        outcome_json(
            &self
                .gate
                .end_outcome(status.min(u16::MAX as u32) as u16, transcript.core()),
        )
    }

    /// Bytes received from upstream in; what the consumer may see now out
    /// (empty while only preamble arrived; `chunk` itself once visible).
    #[napi]
    pub fn feed(&mut self, env: Env, chunk: Uint8Array) -> Result<Uint8Array> {
        let out = guard(&env, || Ok(self.gate.feed_pass(&chunk)))?;
        Ok(out.map_or(chunk, Uint8Array::new))
    }

    /// `feed`, and what it releases observed by `transcript` (what the caller
    /// receives now), in one crossing: the per-chunk step of a wrapped body
    /// that no splice rewrites. Returns `chunk` itself (the same JS object)
    /// when it passes unchanged, which says that nothing was held or withheld:
    /// an error event (or a malformed one the policy ends on) is never passed
    /// on by a gate that ends at errors, so a chunk returned as it came
    /// carried none, and `watching` need not be asked.
    #[napi(ts_return_type = "Uint8Array")]
    pub fn relay<'e>(
        &mut self,
        env: &'e Env,
        chunk: Uint8ArraySlice<'e>,
        transcript: &mut crate::wire::Transcript,
    ) -> Result<Unknown<'e>> {
        let out = guard(env, || {
            let out = self.gate.feed_pass(&chunk);
            transcript.observe_bytes(out.as_deref().unwrap_or(&chunk));
            Ok(out)
        })?;
        match out {
            // SAFETY: `chunk`'s value belongs to this call's scope.
            None => Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), chunk.raw()) }),
            Some(v) => {
                // SAFETY: a fresh value in this call's scope.
                let raw = unsafe { Uint8Array::to_napi_value(env.raw(), Uint8Array::new(v))? };
                Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), raw) })
            }
        }
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

/// An outcome as the JSON the JS layer reads (null fields kept as null).
fn outcome_json(o: &retrywise::Outcome) -> String {
    serde_json::json!({
        "status": o.status,
        "error": o.error.map(|e| e.as_str()),
        "phase": o.phase.map(|p| p.as_str()),
        "vendorCode": o.vendor_code,
        "resumable": o.resumable,
    })
    .to_string()
}
