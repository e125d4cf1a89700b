//! Propagation-header parsing: `retrywise::Inbound::from_headers` on
//! arbitrary header bytes (`name: value` lines), then a non-owner call begun
//! with what was accepted.
//!
//! Checks: never a panic; an accepted deadline is at most 7 days, an accepted
//! attempt is ≥ 1 and an accepted request id is 1–128 visible ASCII bytes; an
//! accepted inbound survives a round trip through the outbound headers; a call
//! begun under it is a non-owner that makes exactly one attempt, within the
//! inherited deadline and with the inherited request id.

#![no_main]

use libfuzzer_sys::fuzz_target;
use retrywise_core::rules::deadline::outbound_headers;
use retrywise_core::{Action, CallSpec, Engine, Headers, Inbound, ManualClock, Outcome, Policy};
use retrywise_fuzz::headers_from_lines;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        // No breaker: every input reports a 503 on the same upstream, and an
        // open breaker would refuse attempts for reasons unrelated to the input.
        let mut p = Policy::default();
        p.breaker.enabled = false;
        Engine::builder(p)
            .clock(Arc::new(ManualClock::new()))
            .seed(1)
            .read_env(false)
            .build()
            .expect("default policy")
    })
}

fuzz_target!(|data: &[u8]| {
    let h = headers_from_lines(data, "retrywise-deadline-ms");
    let inbound = match Inbound::from_headers(&h) {
        Ok(Some(i)) => i,
        Ok(None) => {
            assert!(h.get("retrywise-deadline-ms").is_none());
            assert!(h.get("retrywise-request-id").is_none());
            assert!(h.get("retrywise-attempt").is_none());
            return;
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    if let Some(d) = inbound.deadline {
        assert!(d <= Duration::from_secs(7 * 86_400), "{d:?}");
    }
    if let Some(n) = inbound.attempt {
        assert!(n >= 1);
    }
    if let Some(id) = &inbound.request_id {
        assert!(
            (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()),
            "{id:?}"
        );
    }

    // Round trip: what this engine would send downstream parses back the same.
    if let (Some(d), Some(id), Some(n)) = (inbound.deadline, &inbound.request_id, inbound.attempt) {
        let key_ok = inbound
            .idempotency_key
            .as_deref()
            .is_none_or(|k| !k.contains(['\n', '\r']));
        if key_ok {
            let out = outbound_headers(d, Duration::ZERO, id, n, inbound.idempotency_key.as_deref());
            let back: Headers = out.iter().map(|(k, v)| (*k, v.as_str())).collect();
            assert_eq!(Inbound::from_headers(&back), Ok(Some(inbound.clone())));
        }
    }

    // A call under an upstream owner: one attempt, inherited deadline and id.
    let mut call = engine().begin(
        CallSpec::new("fuzz/upstream")
            .deadline_ms(30_000)
            .inbound(inbound.clone()),
    );
    assert!(!call.is_owner());
    match call.next_attempt() {
        Ok(a) => {
            assert_eq!(a.number, 1);
            if let Some(d) = inbound.deadline {
                assert!(a.remaining() <= d);
            }
            if let Some(id) = &inbound.request_id {
                assert_eq!(a.request_id, id.as_str());
            }
            let d = call.report(&Outcome::status(503));
            assert_ne!(d.action, Action::Retry);
            assert_ne!(d.action, Action::Fallback);
            assert!(call.next_attempt().is_err());
            assert_eq!(call.attempts(), 1);
        }
        Err(s) => {
            // Only a deadline shorter than min_attempt may refuse the first attempt.
            assert!(inbound.deadline.is_some_and(|d| d < Duration::from_millis(300)), "{s}");
        }
    }
});
