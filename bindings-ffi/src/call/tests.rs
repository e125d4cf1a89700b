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

#[test]
fn the_thread_spec_is_lent_anew_to_every_begin() {
    let mut spec = CallSpec::default();
    let usual = rw_call_spec {
        route: rw_str::of("openai/gpt-4o"),
        tenant: rw_str::of("acme"),
        deadline_ms: 2_000,
        ..Default::default()
    };
    // SAFETY: every spec below points to live bytes (or NULL with length 0).
    unsafe {
        lend(&mut spec, &usual).unwrap();
        assert_eq!(spec.route, "openai/gpt-4o");
        assert_eq!(spec.tenant.as_deref(), Some("acme"));
        assert_eq!(spec.deadline, Some(Duration::from_millis(2_000)));
        // A tenant a refused begin left in the spec is not carried over.
        lend(
            &mut spec,
            &rw_call_spec {
                tenant: rw_str::NONE,
                deadline_ms: 0,
                idempotency: rw_idempotency::Unsafe as i32,
                ..usual
            },
        )
        .unwrap();
        assert_eq!(spec.tenant, None);
        assert_eq!(spec.deadline, None);
        assert_eq!(spec.idempotency, retrywise_core::Idempotency::Unsafe);
        // Another route of the same length, then bytes that are not UTF-8:
        // compared, not trusted.
        lend(
            &mut spec,
            &rw_call_spec {
                route: rw_str::of("openai/gpt-4x"),
                ..usual
            },
        )
        .unwrap();
        assert_eq!(spec.route, "openai/gpt-4x");
        let bad = rw_call_spec {
            route: rw_str {
                ptr: c"openai/gpt-4\xff".as_ptr(),
                len: 13,
            },
            ..usual
        };
        assert_eq!(lend(&mut spec, &bad).unwrap_err(), rw_result::RwErrInvalidArg);
        let null = rw_call_spec {
            route: rw_str {
                ptr: std::ptr::null(),
                len: 13,
            },
            ..usual
        };
        assert_eq!(lend(&mut spec, &null).unwrap_err(), rw_result::RwErrNull);
        lend(
            &mut spec,
            &rw_call_spec {
                route: rw_str::NONE,
                ..usual
            },
        )
        .unwrap();
        assert_eq!(spec.route, "");
        let long = "a-route-name-longer-than-thirty-two-bytes";
        lend(
            &mut spec,
            &rw_call_spec {
                route: rw_str::of(long),
                ..usual
            },
        )
        .unwrap();
        assert_eq!(spec.route, long);
    }
    // Through the ABI: each begin on this thread gets its own route.
    let e = engine("{}");
    for route in [
        "openai/gpt-4o",
        "openai/gpt-4o",
        "openai/gpt-4x",
        "anthropic/claude",
        "openai/gpt-4o",
    ] {
        let spec = rw_call_spec {
            route: rw_str::of(route),
            ..Default::default()
        };
        let (mut c, mut a) = (std::ptr::null_mut(), rw_attempt::default());
        // SAFETY: live engine, readable spec, writable outs; the call is freed once.
        unsafe {
            assert_eq!(rw_call_begin(e, &spec, &mut c), rw_result::RwOk);
            assert_eq!(rw_call_next_attempt(c, &mut a), rw_result::RwOk);
            assert_eq!(text(a.upstream), route);
            rw_call_free(c);
        }
    }
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(e) };
}

#[test]
fn short_copies_and_compares_match_the_slice_ones() {
    let src: Vec<u8> = (0..48u8).map(|i| b'a' + i % 26).collect();
    for n in 0..=src.len() {
        let mut dst = [0u8; 64];
        // SAFETY: `dst` has room for `n` bytes and does not overlap `src`.
        unsafe { copy_short(&src[..n], dst.as_mut_ptr()) };
        assert_eq!(&dst[..n], &src[..n]);
        assert!(dst[n..].iter().all(|&b| b == 0), "wrote past {n}");
        let mut other = src[..n].to_vec();
        assert!(same_bytes(&src[..n], &other));
        for i in 0..n {
            other[i] ^= 1;
            assert!(!same_bytes(&src[..n], &other), "missed byte {i} of {n}");
            other[i] ^= 1;
        }
        assert!(!same_bytes(&src[..n], &src[..n.saturating_sub(1)]) || n == 0);
    }
}

#[test]
fn plain_outcomes_read_as_the_full_conversion_does() {
    let plain = rw_outcome {
        status: 200,
        ok: true,
        input_tokens: 12,
        resumable: true,
        first_token_ms: 340,
        // Ignored without a length, as before.
        headers: [rw_header {
            name: rw_str::of("x"),
            value: rw_str::of("y"),
        }]
        .as_ptr(),
        ..Default::default()
    };
    assert!(is_plain(&plain));
    // SAFETY: no pointer is read (plain), and the others point to live bytes.
    unsafe {
        assert_eq!(outcome_from(&plain).unwrap(), outcome_plain(&plain));
        for not_plain in [
            rw_outcome {
                error_kind: rw_error_kind::Connect as i32,
                ..plain
            },
            rw_outcome {
                phase: rw_phase::Sent as i32,
                ..plain
            },
            rw_outcome { effect: 0, ..plain },
            rw_outcome {
                continuation: 0,
                ..plain
            },
            rw_outcome {
                vendor_code: rw_str::of("overloaded_error"),
                ..plain
            },
        ] {
            assert!(!is_plain(&not_plain));
            assert_ne!(outcome_from(&not_plain).unwrap(), outcome_plain(&plain));
        }
        // A body is read (here it changes nothing: a 200 without a JSON content type).
        assert!(!is_plain(&rw_outcome {
            body: rw_str::of("{}"),
            ..plain
        }));
        // A NULL string with a length is still refused, and a bad enum value.
        let null_code = rw_outcome {
            vendor_code: rw_str {
                ptr: std::ptr::null(),
                len: 4,
            },
            ..plain
        };
        assert_eq!(outcome_from(&null_code).unwrap_err(), rw_result::RwErrNull);
        let bad_kind = rw_outcome {
            error_kind: 99,
            ..plain
        };
        assert_eq!(outcome_from(&bad_kind).unwrap_err(), rw_result::RwErrInvalidArg);
    }
}

#[test]
fn simple_specs_are_told_apart_by_every_field() {
    let usual = rw_call_spec {
        route: rw_str::of("chat"),
        tenant: rw_str::of("acme"),
        deadline_ms: 9,
        idempotency: rw_idempotency::Keyed as i32,
        max_cost: -1.0,
        ..Default::default()
    };
    assert!(is_simple(&usual));
    assert!(is_simple(&rw_call_spec {
        max_cost: f64::NAN,
        ..usual
    }));
    let s = rw_str::of("x");
    let caps = [s];
    for other in [
        rw_call_spec { task: s, ..usual },
        rw_call_spec { priority: s, ..usual },
        rw_call_spec {
            idempotency_key: s,
            ..usual
        },
        rw_call_spec {
            params_digest: s,
            ..usual
        },
        rw_call_spec {
            data_boundary: s,
            ..usual
        },
        rw_call_spec {
            data_boundary: rw_str {
                ptr: std::ptr::null(),
                len: 1,
            },
            ..usual
        },
        rw_call_spec {
            inbound_headers_len: 1,
            ..usual
        },
        rw_call_spec {
            capabilities: caps.as_ptr(),
            capabilities_len: 1,
            ..usual
        },
        rw_call_spec {
            input_tokens: 1,
            ..usual
        },
        rw_call_spec {
            max_output_tokens: 1,
            ..usual
        },
        rw_call_spec { max_cost: 0.5, ..usual },
    ] {
        assert!(!is_simple(&other), "{other:?}");
    }
}

#[test]
fn a_call_is_about_a_kibibyte() {
    // `rw_call_free` documents the memory a thread keeps per spare call.
    let size = std::mem::size_of::<rw_call>();
    assert!((768..=1280).contains(&size), "rw_call is {size} bytes");
}
