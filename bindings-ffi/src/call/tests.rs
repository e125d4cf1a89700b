//! Unit tests of `rw_call`: attempt strings, reused boxes, the usual and the full spec, unknown routes.

use super::*;
use crate::engine::{rw_engine_free, rw_engine_new_with};
use crate::error::{rw_error_free, rw_error_message};
use crate::request::{rw_request_free, rw_request_read};

fn engine(policy: &str) -> *mut rw_engine {
    let opts = rw_engine_options {
        seed: 1,
        has_seed: true,
        manual_clock: true,
    };
    // SAFETY: `policy` is valid for its length; a NULL error pointer is allowed.
    let e = unsafe { rw_engine_new_with(policy.as_ptr().cast(), policy.len(), &opts, std::ptr::null_mut()) };
    assert!(!e.is_null());
    e
}

fn text(s: rw_str) -> String {
    // SAFETY: every `rw_str` an attempt returns points to `len` valid bytes while the call lives.
    let b = unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) };
    String::from_utf8(b.to_vec()).unwrap()
}

fn headers(a: &rw_attempt) -> Vec<(String, String)> {
    if a.headers_len == 0 {
        assert!(a.headers.is_null());
        return Vec::new();
    }
    // SAFETY: `headers` points to `headers_len` views while the call lives.
    let hs = unsafe { std::slice::from_raw_parts(a.headers, a.headers_len) };
    hs.iter().map(|h| (text(h.name), text(h.value))).collect()
}

/// Runs one attempt of a call begun with `spec` and returns its headers and request id.
fn first_attempt(e: *mut rw_engine, spec: &rw_call_spec) -> (Vec<(String, String)>, String) {
    let (mut c, mut a) = (std::ptr::null_mut(), rw_attempt::default());
    // SAFETY: live engine, readable spec, writable outs; the call is freed once.
    unsafe {
        assert_eq!(rw_call_begin(e, spec, &mut c), rw_result::RwOk);
        assert_eq!(rw_call_next_attempt(c, &mut a), rw_result::RwOk);
        let out = (headers(&a), text(a.request_id));
        rw_call_free(c);
        out
    }
}

#[test]
fn attempt_strings_fit_inline_or_spill_and_share_the_request_id() {
    let e = engine("{}");
    let route = "openai/gpt-4o";
    let long_key = "k".repeat(TEXT + 7);
    for key in ["order-17", long_key.as_str()] {
        let spec = rw_call_spec {
            route: rw_str::of(route),
            idempotency: rw_idempotency::Keyed as i32,
            idempotency_key: rw_str::of(key),
            deadline_ms: 5_000,
            ..Default::default()
        };
        let (hs, id) = first_attempt(e, &spec);
        let names: Vec<&str> = hs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "retrywise-deadline-ms",
                "retrywise-request-id",
                "retrywise-attempt",
                "idempotency-key"
            ]
        );
        assert_eq!(hs[0].1, "4950", "deadline minus the 50 ms safety margin");
        assert_eq!(hs[1].1, id);
        assert_eq!(id.len(), 23);
        assert_eq!(hs[2].1, "1");
        assert_eq!(hs[3].1, key);
    }
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(e) };
}

#[test]
fn request_id_is_kept_without_propagation_headers_and_inherited_ids_pass_through() {
    let e = engine(r#"{"propagation": {"enabled": false}}"#);
    let spec = rw_call_spec {
        route: rw_str::of("openai/gpt-4o"),
        ..Default::default()
    };
    let (hs, id) = first_attempt(e, &spec);
    assert!(hs.is_empty());
    assert_eq!(id.len(), 23);
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(e) };

    let e = engine("{}");
    let parent = "p".repeat(120);
    let inbound = [
        rw_header {
            name: rw_str::of("retrywise-request-id"),
            value: rw_str::of(&parent),
        },
        rw_header {
            name: rw_str::of("retrywise-deadline-ms"),
            value: rw_str::of("900"),
        },
    ];
    let spec = rw_call_spec {
        route: rw_str::of("openai/gpt-4o"),
        inbound_headers: inbound.as_ptr(),
        inbound_headers_len: inbound.len(),
        ..Default::default()
    };
    let (hs, id) = first_attempt(e, &spec);
    assert_eq!(id, parent, "an inherited id longer than the inline bytes spills intact");
    assert_eq!(hs[1], ("retrywise-request-id".to_string(), parent));
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(e) };
}

#[test]
fn a_reused_box_starts_a_fresh_call_on_any_thread() {
    let e = engine("{}");
    let spec = rw_call_spec {
        route: rw_str::of("openai/gpt-4o"),
        tenant: rw_str::of("acme"),
        deadline_ms: 5_000,
        ..Default::default()
    };
    let begin = |e: *mut rw_engine| {
        let mut c = std::ptr::null_mut();
        // SAFETY: live engine, readable spec, writable out.
        assert_eq!(unsafe { rw_call_begin(e, &spec, &mut c) }, rw_result::RwOk);
        c as usize
    };
    // A call that failed, retried and succeeded leaves strings behind in its box.
    let first = begin(e) as *mut rw_call;
    let (mut a, mut d) = (rw_attempt::default(), rw_decision::default());
    let mut o = rw_outcome {
        status: 503,
        ..Default::default()
    };
    // SAFETY: the call is live and used by this thread only; outs are writable.
    unsafe {
        assert_eq!(rw_call_next_attempt(first, &mut a), rw_result::RwOk);
        assert_eq!(rw_call_report(first, &o, &mut d), rw_result::RwOk);
        assert_eq!(d.action, rw_action::Retry);
        o.status = 200;
        assert_eq!(rw_call_next_attempt(first, &mut a), rw_result::RwOk);
        assert_eq!(a.number, 2);
        rw_call_free(first);
    }
    // The next call on this thread reuses that memory and starts at attempt 1.
    let second = begin(e) as *mut rw_call;
    assert_eq!(second, first, "the freed box is reused");
    // SAFETY: as above.
    unsafe {
        assert_eq!(rw_call_next_attempt(second, &mut a), rw_result::RwOk);
        assert_eq!(a.number, 1);
        assert_eq!(text(a.upstream), "openai/gpt-4o");
        assert!(headers(&a).contains(&("retrywise-attempt".to_string(), "1".to_string())));
        assert_eq!(rw_call_report(second, &o, &mut d), rw_result::RwOk);
        assert_eq!(d.action, rw_action::Succeeded);
        assert_eq!(d.attempt, 1);
    }
    // Calls begun here and freed on other threads (which keep or free
    // the memory, and free their spares when they exit).
    let calls: Vec<usize> = (0..12).map(|_| begin(e)).collect();
    std::thread::scope(|s| {
        for chunk in calls.chunks(6) {
            s.spawn(move || {
                for &c in chunk {
                    // SAFETY: each call was begun above and is freed exactly once, here.
                    unsafe { rw_call_free(c as *mut rw_call) };
                }
            });
        }
    });
    // SAFETY: each call freed once; the engine created above, freed once.
    unsafe {
        rw_call_free(second);
        rw_engine_free(e);
    }
}

#[test]
fn the_usual_spec_and_the_full_one_begin_the_same_call() {
    let e = engine(r#"{"upstreams": {"openai/gpt-4o": {}}, "routes": {"chat": {"candidates": ["openai/gpt-4o"]}}}"#);
    let usual = rw_call_spec {
        route: rw_str::of("chat"),
        tenant: rw_str::of("acme"),
        deadline_ms: 3_000,
        idempotency: rw_idempotency::Unsafe as i32,
        ..Default::default()
    };
    // A spec that sets one more field goes the full way.
    let full = rw_call_spec {
        input_tokens: 10,
        ..usual
    };
    let (hu, _) = first_attempt(e, &usual);
    let (hf, _) = first_attempt(e, &full);
    assert_eq!(hu.len(), hf.len());
    assert_eq!(hu[0], ("retrywise-deadline-ms".to_string(), "2950".to_string()));
    assert_eq!(hu[0], hf[0]);
    // Bad input is refused the same way on both paths.
    for bad in [
        rw_call_spec {
            idempotency: 99,
            ..usual
        },
        rw_call_spec {
            idempotency: 99,
            ..full
        },
        rw_call_spec {
            tenant: rw_str {
                ptr: c"\xff".as_ptr(),
                len: 1,
            },
            ..usual
        },
    ] {
        let mut c = std::ptr::null_mut();
        // SAFETY: live engine, readable spec, writable out.
        assert_eq!(unsafe { rw_call_begin(e, &bad, &mut c) }, rw_result::RwErrInvalidArg);
        assert!(c.is_null());
    }
    let null_tenant = rw_call_spec {
        tenant: rw_str {
            ptr: std::ptr::null(),
            len: 3,
        },
        ..usual
    };
    let mut c = std::ptr::null_mut();
    // SAFETY: as above.
    assert_eq!(unsafe { rw_call_begin(e, &null_tenant, &mut c) }, rw_result::RwErrNull);
    // An unknown route too (the core's try_begin), with its message.
    for spec in [
        rw_call_spec {
            route: rw_str::of("caht"),
            ..usual
        },
        rw_call_spec {
            route: rw_str::of("caht"),
            ..full
        },
    ] {
        let mut c = std::ptr::null_mut();
        // SAFETY: as above.
        assert_eq!(unsafe { rw_call_begin(e, &spec, &mut c) }, rw_result::RwErrPolicy);
        assert!(c.is_null());
        let mut err = std::ptr::null_mut();
        // SAFETY: as above; `err` is writable.
        let r = unsafe { rw_call_begin_err(e, &spec, &mut c, &mut err) };
        assert_eq!(r, rw_result::RwErrPolicy);
        assert!(c.is_null() && !err.is_null());
        // SAFETY: `err` is a live error from rw_call_begin_err.
        let message = unsafe { std::ffi::CStr::from_ptr(rw_error_message(err)) }
            .to_str()
            .unwrap();
        assert!(message.starts_with("routes.caht: no route \"caht\""), "{message}");
        assert!(message.contains("known routes: chat"), "{message}");
        // SAFETY: freed once.
        unsafe { rw_error_free(err) };
    }
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(e) };
}

#[test]
fn a_spec_with_a_request_goes_the_full_way() {
    let body = br#"{"model":"gpt-4o","stream":true,"messages":[]}"#;
    let mut req = std::ptr::null_mut();
    // SAFETY: a live URL and body, a writable out.
    let r = unsafe {
        rw_request_read(
            rw_str::of("https://api.openai.com/v1/chat/completions"),
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            &mut req,
        )
    };
    assert_eq!(r, rw_result::RwOk);
    let usual = rw_call_spec {
        route: rw_str::of("chat"),
        ..Default::default()
    };
    assert!(is_simple(&usual));
    assert!(!is_simple(&rw_call_spec { request: req, ..usual }));
    // SAFETY: from rw_request_read, freed once.
    unsafe { rw_request_free(req) };
}
