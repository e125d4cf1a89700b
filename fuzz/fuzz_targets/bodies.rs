//! Response bodies from an untrusted upstream: `StreamGate` (a stream's
//! preamble held until its first meaningful event) and `Outcome::read_body`
//! (vendor codes, malformed JSON successes).
//!
//! Input: byte 0 picks the content type, byte 1 the status class, bytes 2..4
//! seed the chunk sizes; the rest is the body.
//!
//! Checks: never a panic; the bytes released plus `finish()` are the same
//! however the body is chunked, and exactly the body when no event was
//! malformed or an error (nothing when an error event came before output);
//! nothing is released before the event that releases a byte-by-byte feed,
//! and the first release comes with the chunk holding that byte; while
//! holding, at most `HOLD_LIMIT` bytes are held; a non-SSE body passes from
//! its first byte, every chunk as it is. `read_body` marks `malformed_response` exactly for a
//! non-empty 2xx JSON-typed body that does not parse (a full parse is the
//! oracle), sets no other error, and reads vendor codes only from error statuses.

#![no_main]

use libfuzzer_sys::fuzz_target;
use retrywise_core::stream::{StreamGate, HOLD_LIMIT};
use retrywise_core::{json_media_type, ErrorKind, Outcome};

const TYPES: [Option<&str>; 6] = [
    Some("text/event-stream"),
    Some("text/event-stream; charset=utf-8"),
    Some("application/json"),
    Some("application/problem+json"),
    Some("text/plain"),
    None,
];

/// Byte count after which a byte-by-byte feed first releases (None: never),
/// and everything it released.
fn byte_by_byte(ct: Option<&str>, body: &[u8]) -> (Option<usize>, Vec<u8>) {
    let mut g = StreamGate::new(ct);
    let (mut point, mut out) = (None, Vec::new());
    for (i, b) in body.iter().enumerate() {
        let r = g.feed(std::slice::from_ref(b));
        if !r.is_empty() && point.is_none() {
            point = Some(i + 1);
        }
        out.extend_from_slice(&r);
    }
    out.extend(g.finish());
    (point, out)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let ct = TYPES[data[0] as usize % TYPES.len()];
    let status = [200u16, 204, 302, 429, 500][data[1] as usize % 5];
    let (seed, body) = (u16::from_le_bytes([data[2], data[3]]), &data[4..]);

    // StreamGate, fed in pseudo-random chunks of 1..=64 bytes.
    let sse = StreamGate::new(ct).may_hold();
    let (point, oracle) = byte_by_byte(ct, body);
    let mut g = StreamGate::new(ct);
    assert!(!g.is_visible(), "nothing delivered before the first byte");
    let (mut out, mut first, mut i, mut k) = (Vec::new(), None, 0usize, seed as usize);
    while i < body.len() {
        k = k.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = (1 + (k >> 8) % 64).min(body.len() - i);
        let chunk = &body[i..i + n];
        let r = g.feed(chunk).into_owned();
        if !sse {
            assert_eq!(r, chunk, "a body that is not an event stream passes as it is");
        }
        if !r.is_empty() && first.is_none() {
            first = Some(i + n);
        }
        assert_eq!(
            g.is_visible(),
            first.is_some(),
            "visible exactly once bytes were released"
        );
        if g.may_hold() {
            assert!(r.is_empty() && g.held() <= HOLD_LIMIT && g.held() <= i + n);
        }
        out.extend_from_slice(&r);
        i += n;
    }
    out.extend(g.finish());
    assert!(!g.may_hold());
    assert_eq!(out, oracle, "chunking changes nothing");
    match g.stream_error() {
        Some(e) if !e.after_output => assert!(out.is_empty(), "an error before output shows nothing"),
        None if g.skipped() == 0 => {
            assert_eq!(g.is_visible(), !body.is_empty());
            assert_eq!(out, body, "nothing lost, nothing reordered");
        }
        _ => assert!(out.len() <= body.len()),
    }
    if !sse && !body.is_empty() {
        assert_eq!(point, Some(1), "a non-SSE body passes from its first byte");
    }
    match (point, first) {
        (Some(p), Some(f)) => assert!(f >= p && f < p + 64, "released at {f}, byte-by-byte at {p}"),
        (None, None) => {}
        (p, f) => panic!("byte-by-byte release {p:?}, chunked {f:?}"),
    }

    // Outcome::read_body.
    let mut o = Outcome::status(status);
    if let Some(ct) = ct {
        o = o.header("content-type", ct);
    }
    let o = o.body(body);
    // Oracle: a full parse. It cannot judge a number too large for f64 (valid
    // JSON: the grammar has no range), so such bodies are only run.
    let json_ok = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(_) => Some(true),
        Err(e) if e.to_string().starts_with("number out of range") => None,
        Err(_) => Some(false),
    };
    let judged = (200..300).contains(&status) && !body.is_empty() && ct.is_some_and(json_media_type);
    let is_malformed = o.error == Some(ErrorKind::MalformedResponse);
    assert!(judged || !is_malformed, "only a non-empty 2xx JSON body is judged");
    assert!(o.error.is_none() || is_malformed);
    if let (true, Some(ok)) = (judged, json_ok) {
        assert_eq!(is_malformed, !ok);
    }
    if status < 400 {
        assert_eq!(o.vendor_code, None);
    }
});
