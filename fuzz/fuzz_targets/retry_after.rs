//! Retry-After parsing: `retry-after-ms` and `retry-after` (delta-seconds,
//! decimals, HTTP-date in IMF-fixdate, RFC 850 and asctime form) on arbitrary
//! header bytes.
//!
//! Input: the raw header value(s). When the input holds a `\n`, the bytes
//! before it are a `retry-after-ms` value and the bytes after it a
//! `retry-after` value; otherwise the whole input is tried as each header alone.
//!
//! Checks: never a panic; a parsed wait always names its source; a numeric
//! hint is never negative or above the one-year "absurd" bound; an
//! all-digit value of up to 9 digits is parsed exactly (or refused above a year); a valid HTTP-date
//! gives `max(0, date - now)`; header names match case-insensitively;
//! `retry-after-ms` wins over `retry-after` when valid.

#![no_main]

use libfuzzer_sys::fuzz_target;
use retrywise_core::rules::wait::{parse_retry_after, parse_retry_after_value, RetryHint};
use retrywise_core::Headers;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One year: the bound above which a numeric hint is "absurd".
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

fn walls() -> [SystemTime; 3] {
    [
        UNIX_EPOCH,
        // 2025-01-01T00:00:00Z, the manual clock's default wall time.
        UNIX_EPOCH + Duration::from_secs(1_735_689_600),
        // 9999-12-31T23:59:59Z, the last instant an HTTP-date can name.
        UNIX_EPOCH + Duration::from_secs(253_402_300_799),
    ]
}

fn numeric(v: &str) -> bool {
    v.trim()
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.'))
}

fn check_one(name: &str, v: &str, wall: SystemTime) -> RetryHint {
    let h: Headers = [(name, v)].into_iter().collect();
    let hint = parse_retry_after(&h, wall);
    assert_eq!(hint.wait.is_some(), hint.source.is_some(), "{hint:?}");
    assert_eq!(hint.wait.is_some(), hint.problem.is_none(), "one header: {hint:?}");
    // Header names are case-insensitive.
    let upper: Headers = [(name.to_ascii_uppercase().as_str(), v)].into_iter().collect();
    assert_eq!(parse_retry_after(&upper, wall), hint);
    if let Some(w) = hint.wait {
        if name == "retry-after-ms" || numeric(v) {
            assert!(w <= YEAR, "numeric hint above a year accepted: {v:?} -> {w:?}");
        }
    }
    if name == "retry-after" {
        // The header path and the value parser agree.
        assert_eq!(parse_retry_after_value(v, wall).ok(), hint.wait, "{v:?}");
        let t = v.trim();
        if !t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit()) {
            let secs: u64 = t.parse().unwrap_or(u64::MAX);
            let want = Some(Duration::from_secs(secs)).filter(|d| *d <= YEAR);
            assert_eq!(hint.wait, want, "{v:?}");
        }
        if !numeric(v) {
            if let Ok(at) = httpdate::parse_http_date(t) {
                let want = at.duration_since(wall).unwrap_or(Duration::ZERO);
                assert_eq!(hint.wait, Some(want), "{v:?}");
            }
        }
    }
    hint
}

fuzz_target!(|data: &[u8]| {
    for wall in walls() {
        match data.iter().position(|b| *b == b'\n') {
            Some(i) => {
                let ms = String::from_utf8_lossy(&data[..i]);
                let ra = String::from_utf8_lossy(&data[i + 1..]);
                let a = check_one("retry-after-ms", &ms, wall);
                let b = check_one("retry-after", &ra, wall);
                let both: Headers = [("retry-after", &*ra), ("retry-after-ms", &*ms)].into_iter().collect();
                let hint = parse_retry_after(&both, wall);
                if a.wait.is_some() {
                    // A valid retry-after-ms wins, wherever it appears.
                    assert_eq!(hint, a);
                } else {
                    assert_eq!(hint.wait, b.wait);
                    assert_eq!(hint.problem, a.problem.or(b.problem));
                }
            }
            None => {
                let v = String::from_utf8_lossy(data);
                check_one("retry-after", &v, wall);
                check_one("retry-after-ms", &v, wall);
            }
        }
    }
});
