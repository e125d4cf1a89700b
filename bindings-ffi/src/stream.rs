//! `rw_stream_gate`: the core's `StreamGate` for a response body read in C.
//! It holds an event stream's preamble (a role-only delta, `message_start`,
//! pings) until its first meaningful event, so a stream cut before it is
//! `RW_PHASE_STREAM_OPEN` and may be retried (nothing reached the consumer).
//! When the body ends or breaks, it says what the attempt reports: the
//! failure an error event in the stream named, or a cut when output was shown
//! without its finish (with an `rw_transcript`).

use crate::args::{opt_str, slice};
use crate::engine::rw_engine;
use crate::panic::{ffi_boundary, try_arg};
use crate::transcript::rw_transcript;
use crate::types::{rw_outcome, rw_result, rw_str};
use crate::vocab::{rw_error_kind, rw_phase};
use retrywise_core::{Outcome, StreamGate};

/// One attempt's response body. Opaque.
pub struct rw_stream_gate {
    gate: StreamGate,
    /// The bytes last released from the gate's hold, lent to the caller.
    out: Vec<u8>,
    /// The vendor code of the last outcome written, lent to the caller.
    code: Option<String>,
}

/// `gate` as a gate handed to C (freed by `rw_stream_gate_free`).
fn boxed(gate: StreamGate) -> *mut rw_stream_gate {
    Box::into_raw(Box::new(rw_stream_gate {
        gate,
        out: Vec::new(),
        code: None,
    }))
}

/// Writes the core's outcome `o` into `*out` as `RW_OUTCOME_INIT` with its
/// status, error kind, phase, vendor code (a view of `code`) and resumable flag set.
fn put_outcome(code: &mut Option<String>, o: Outcome, out: &mut rw_outcome) {
    *code = o.vendor_code;
    *out = rw_outcome {
        status: o.status.unwrap_or(0),
        error_kind: o.error.map_or(rw_error_kind::None, rw_error_kind::from) as i32,
        phase: o.phase.map_or(rw_phase::None, rw_phase::from) as i32,
        vendor_code: rw_str::of_opt(code.as_deref()),
        resumable: o.resumable,
        ..rw_outcome::default()
    };
}

/// The gate and out-pointers of a call, or `RW_ERR_NULL` when one is NULL.
///
/// # Safety
/// `gate` is NULL or live and used by this thread only; the out-pointers are NULL or writable.
unsafe fn parts<'a>(
    gate: *mut rw_stream_gate,
    out: *mut *const u8,
    out_len: *mut usize,
) -> Result<(&'a mut rw_stream_gate, Lend), rw_result> {
    // SAFETY: NULL or a live gate used by this thread only, per the contract.
    match (unsafe { gate.as_mut() }, out.is_null() || out_len.is_null()) {
        (Some(g), false) => Ok((g, Lend { out, out_len })),
        _ => Err(rw_result::RwErrNull),
    }
}

/// Non-NULL, writable out-pointers for a byte view.
struct Lend {
    out: *mut *const u8,
    out_len: *mut usize,
}

impl Lend {
    /// Writes the view of `b`; NULL and 0 when it is empty.
    fn write(self, b: &[u8]) -> rw_result {
        // SAFETY: non-NULL (checked in `parts`) and writable per the contract.
        unsafe {
            self.out.write(if b.is_empty() { std::ptr::null() } else { b.as_ptr() });
            self.out_len.write(b.len());
        }
        rw_result::RwOk
    }
}

/// A gate for a response body of `content_type` (the `content-type` header;
/// absent = not an event stream). Only `text/event-stream` bodies are held
/// back; any other body passes through from its first byte. NULL when
/// `content_type` is NULL with a non-zero length or not UTF-8. Free with
/// `rw_stream_gate_free`.
///
/// Thread safety: a gate moves between threads; one thread at a time.
///
/// # Safety
/// `content_type` is absent or valid for its length.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_new(content_type: rw_str) -> *mut rw_stream_gate {
    ffi_boundary! {
        // SAFETY: valid for its length per the contract.
        let Ok(ct) = (unsafe { opt_str(content_type) }) else { return std::ptr::null_mut() };
        boxed(StreamGate::new(ct))
    }
}

/// A gate as `rw_stream_gate_new` makes, reading malformed events as
/// `engine`'s policy says (`streams.malformed_event`: `skip`, the default and
/// what `rw_stream_gate_new` does, or `error`: the stream ends there, and the
/// gate's outcome is `RW_ERROR_KIND_MALFORMED_RESPONSE`). NULL when `engine`
/// is NULL or `content_type` is as `rw_stream_gate_new` refuses.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live; `content_type` is absent or valid for its length.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_stream_gate(engine: *const rw_engine, content_type: rw_str) -> *mut rw_stream_gate {
    ffi_boundary! {
        // SAFETY: NULL or live per the contract.
        let Some(e) = (unsafe { engine.as_ref() }) else { return std::ptr::null_mut() };
        // SAFETY: valid for its length per the contract.
        let Ok(ct) = (unsafe { opt_str(content_type) }) else { return std::ptr::null_mut() };
        boxed(e.engine.stream_gate(ct))
    }
}

/// Takes `len` bytes received from upstream and sets `*out` / `*out_len` to
/// what the consumer may see now: nothing (`NULL`, 0) while only preamble
/// arrived; everything held when the first meaningful event completes; then
/// `data` itself. The view is valid until the next call on the gate (or
/// until `data` is freed, when it is `data`).
///
/// Thread safety: not concurrently with any other function on the same gate.
///
/// # Safety
/// `gate` is NULL or live; `data` is NULL with `len == 0` or points to `len`
/// readable bytes; `out` and `out_len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_feed(
    gate: *mut rw_stream_gate,
    data: *const u8,
    len: usize,
    out: *mut *const u8,
    out_len: *mut usize,
) -> rw_result {
    ffi_boundary! {
        // SAFETY: per the contract.
        let (g, lend) = try_arg!(unsafe { parts(gate, out, out_len) });
        // SAFETY: `data` points to `len` readable bytes per the contract.
        let chunk = try_arg!(unsafe { slice(data, len) });
        match g.gate.feed_pass(chunk) {
            None => lend.write(chunk),
            Some(v) => {
                g.out = v;
                lend.write(&g.out)
            }
        }
    }
}

/// The body ended: sets `*out` / `*out_len` to everything still held (a
/// stream of preamble only, or a last event without its blank line), to
/// deliver before the end. The view is valid until the next call on the gate.
///
/// # Safety
/// As for `rw_stream_gate_feed`.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_finish(
    gate: *mut rw_stream_gate,
    out: *mut *const u8,
    out_len: *mut usize,
) -> rw_result {
    ffi_boundary! {
        // SAFETY: per the contract.
        let (g, lend) = try_arg!(unsafe { parts(gate, out, out_len) });
        g.out = g.gate.finish();
        lend.write(&g.out)
    }
}

/// The phase a failure of the body would have now, to report with it:
/// `RW_PHASE_STREAM_OPEN` until bytes were released, then
/// `RW_PHASE_STREAM_VISIBLE`. `RW_PHASE_NONE` for NULL.
///
/// # Safety
/// `gate` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_phase(gate: *const rw_stream_gate) -> rw_phase {
    ffi_boundary! {
        // SAFETY: NULL or live per the contract.
        match unsafe { gate.as_ref() } {
            Some(g) => rw_phase::from(g.gate.phase()),
            None => rw_phase::None,
        }
    }
}

/// Sets `*out` to what the attempt whose body ended or broke now with HTTP
/// `status` reports: `status` alone, or the failure an error event in the
/// stream named (its error kind, vendor code and phase), as
/// `rw_call_report` takes it. The vendor code is a view valid until the next
/// call on the gate. Use it when the body broke (then set the break's error
/// kind unless this gives one); when it ended cleanly, use
/// `rw_stream_gate_end_outcome`.
///
/// Thread safety: not concurrently with any other function on the same gate.
///
/// # Safety
/// `gate` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_outcome(
    gate: *mut rw_stream_gate,
    status: u16,
    out: *mut rw_outcome,
) -> rw_result {
    ffi_boundary! {
        // SAFETY: NULL or live (used by this thread only) and NULL or writable, per the contract.
        let (Some(g), Some(out)) = (unsafe { gate.as_mut() }, unsafe { out.as_mut() }) else {
            return rw_result::RwErrNull;
        };
        put_outcome(&mut g.code, g.gate.outcome(status), out);
        rw_result::RwOk
    }
}

/// Sets `*out` to what the attempt whose body ended cleanly now with HTTP
/// `status` reports, `transcript` having read every byte the caller
/// received: as `rw_stream_gate_outcome`, except that output shown without
/// its finish was cut (`RW_ERROR_KIND_CONNECTION_RESET` in the gate's phase,
/// `resumable` when only text was shown). A close-delimited body, or a proxy
/// that ends its stream when the upstream drops, ends cleanly too.
///
/// Thread safety: not concurrently with any other function on the same gate
/// or transcript.
///
/// # Safety
/// `gate` and `transcript` are NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_end_outcome(
    gate: *mut rw_stream_gate,
    status: u16,
    transcript: *const rw_transcript,
    out: *mut rw_outcome,
) -> rw_result {
    ffi_boundary! {
        // SAFETY: each NULL or live (or writable), per the contract.
        let (Some(g), Some(t), Some(out)) = (unsafe { gate.as_mut() }, unsafe { transcript.as_ref() }, unsafe { out.as_mut() }) else {
            return rw_result::RwErrNull;
        };
        put_outcome(&mut g.code, g.gate.end_outcome(status, &t.t), out);
        rw_result::RwOk
    }
}

/// Frees a gate (and the bytes it held). NULL is a no-op.
///
/// # Safety
/// `gate` is NULL or a gate from `rw_stream_gate_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_stream_gate_free(gate: *mut rw_stream_gate) {
    ffi_boundary! {
        if !gate.is_null() {
            // SAFETY: allocated by Box::into_raw in rw_stream_gate_new and not freed yet.
            drop(unsafe { Box::from_raw(gate) });
        }
    }
}
