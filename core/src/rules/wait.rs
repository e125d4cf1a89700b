//! How long to wait: jittered exponential backoff, server wait hints
//! (`retry-after-ms`, then `retry-after` as delta-seconds or HTTP-date, then
//! gRPC's `grpc-retry-pushback-ms`, then a wait the error body asked for),
//! and `plan`, the wait's rule after a failure: a wait is for the upstream
//! that failed (a valid, capped Retry-After wins over jitter and must fit
//! the deadline); a fallback to another upstream goes now.

use super::{Failed, Halt, Target, Wait};
use crate::clock::ms;
use crate::outcome::{Headers, Outcome};
use crate::policy::{Backoff, BackoffKind, OnExceed, RetryAfter};
use crate::types::{Reason, WaitSource};
use rand::Rng;
use std::time::{Duration, SystemTime};

/// Largest exponent used: `2^62` already saturates any cap, so huge attempt
/// numbers (n = 10 000) never overflow.
const MAX_EXP: u32 = 62;

/// `min(cap, base * 2^n)` in ms, saturating.
pub fn ceiling_ms(cfg: &Backoff, n: u32) -> u64 {
    let factor = 1u64 << n.min(MAX_EXP);
    cfg.base_ms.saturating_mul(factor).min(cfg.cap_ms)
}

/// The jittered wait before retry number `n` (0 for the first retry), in ms.
/// `prev_ms` is the previous wait (decorrelated jitter only).
pub fn jitter_ms<R: Rng + ?Sized>(cfg: &Backoff, n: u32, prev_ms: u64, rng: &mut R) -> u64 {
    match cfg.kind {
        BackoffKind::Full => {
            let hi = ceiling_ms(cfg, n);
            rng.gen_range(0..=hi)
        }
        BackoffKind::Equal => {
            let c = ceiling_ms(cfg, n);
            let half = c / 2;
            half + rng.gen_range(0..=(c - half))
        }
        BackoffKind::Decorrelated => {
            let lo = cfg.base_ms;
            let hi = prev_ms.max(cfg.base_ms).saturating_mul(3).max(lo);
            rng.gen_range(lo..=hi).min(cfg.cap_ms)
        }
    }
}

/// Why a server wait hint was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintProblem {
    /// Not a number and not an HTTP-date.
    Unparseable,
    /// Negative.
    Negative,
    /// Larger than a year: no server means that.
    Absurd,
}

impl HintProblem {
    /// Stable name, recorded in decisions and events.
    pub fn as_str(self) -> &'static str {
        match self {
            HintProblem::Unparseable => "retry_after_unparseable",
            HintProblem::Negative => "retry_after_negative",
            HintProblem::Absurd => "retry_after_absurd",
        }
    }
}

/// Result of reading the wait-hint headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryHint {
    /// The wait the server asked for, when one valid header was found.
    pub wait: Option<Duration>,
    /// Which header supplied it.
    pub source: Option<&'static str>,
    /// The first invalid header met, when any (its value was ignored).
    pub problem: Option<HintProblem>,
}

/// Anything above a year is no real wait: the parser reports it as
/// [`HintProblem::Absurd`], and the wait rule treats it as a year (too long
/// for any deadline or cap).
pub const ABSURD: Duration = Duration::from_secs(365 * 24 * 3600);

/// Reads `retry-after-ms` (milliseconds, may be decimal), then `retry-after`
/// (delta-seconds, integer or decimal, or an HTTP-date in IMF-fixdate, RFC 850
/// or asctime form, relative to `wall_now`). An invalid header is skipped and
/// the next one is tried, as Envoy does. A date in the past means "now".
pub fn parse_retry_after(headers: &Headers, wall_now: SystemTime) -> RetryHint {
    parse_retry_after_with(headers, || wall_now)
}

/// [`parse_retry_after`] reading the wall clock only for an HTTP-date (the
/// engine calls this on every report; most responses carry no hint).
pub fn parse_retry_after_with(headers: &Headers, wall_now: impl FnOnce() -> SystemTime) -> RetryHint {
    let mut hint = RetryHint::default();
    if headers.is_empty() {
        return hint;
    }
    if let Some(v) = headers.get("retry-after-ms") {
        match parse_number(v, 1e-3) {
            Ok(d) => {
                hint.wait = Some(d);
                hint.source = Some("retry-after-ms");
                return hint;
            }
            Err(p) => hint.problem = Some(p),
        }
    }
    if let Some(v) = headers.get("retry-after") {
        match parse_retry_after_value_with(v, wall_now) {
            Ok(d) => {
                hint.wait = Some(d);
                hint.source = Some("retry-after");
                return hint;
            }
            Err(p) => {
                if hint.problem.is_none() {
                    hint.problem = Some(p)
                }
            }
        }
    }
    // gRPC (A6): whole milliseconds; a negative or unreadable value means
    // "do not retry", which the classifier reads from the same header.
    if let Some(v) = headers.get("grpc-retry-pushback-ms") {
        let t = v.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            match parse_number(t, 1e-3) {
                Ok(d) => {
                    hint.wait = Some(d);
                    hint.source = Some("grpc-retry-pushback-ms");
                    return hint;
                }
                Err(p) => hint.problem = hint.problem.or(Some(p)),
            }
        }
    }
    hint
}

/// The wait hint of an outcome: its headers' ([`parse_retry_after_with`]),
/// else the one its error body carried ([`Outcome::retry_delay`]).
pub fn wait_hint(outcome: &Outcome, wall_now: impl FnOnce() -> SystemTime) -> RetryHint {
    let mut hint = parse_retry_after_with(&outcome.headers, wall_now);
    if hint.wait.is_none() {
        if let Some(d) = outcome.retry_delay {
            hint.wait = Some(d);
            hint.source = Some("body");
        }
    }
    hint
}

/// Parses one `retry-after` value: delta-seconds or an HTTP-date.
pub fn parse_retry_after_value(v: &str, wall_now: SystemTime) -> Result<Duration, HintProblem> {
    parse_retry_after_value_with(v, || wall_now)
}

fn parse_retry_after_value_with(v: &str, wall_now: impl FnOnce() -> SystemTime) -> Result<Duration, HintProblem> {
    let t = v.trim();
    if t.is_empty() {
        return Err(HintProblem::Unparseable);
    }
    let first = t.as_bytes()[0];
    if first.is_ascii_digit() || first == b'-' || first == b'+' || first == b'.' {
        return parse_number(t, 1.0);
    }
    match httpdate::parse_http_date(t) {
        Ok(at) => match at.duration_since(wall_now()) {
            // A date more than a year ahead is garbage, as the same wait in seconds would be.
            Ok(d) if d > ABSURD => Err(HintProblem::Absurd),
            Ok(d) => Ok(d),
            Err(_) => Ok(Duration::ZERO),
        },
        Err(_) => Err(HintProblem::Unparseable),
    }
}

/// Parses a non-negative decimal number of `unit_secs` seconds.
fn parse_number(v: &str, unit_secs: f64) -> Result<Duration, HintProblem> {
    let t = v.trim();
    if t.is_empty()
        || !t
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'+')
    {
        return Err(HintProblem::Unparseable);
    }
    let x: f64 = t.parse().map_err(|_| HintProblem::Unparseable)?;
    if !x.is_finite() {
        return Err(HintProblem::Absurd);
    }
    if x < 0.0 || t.starts_with('-') {
        return Err(HintProblem::Negative);
    }
    let secs = x * unit_secs;
    if secs > ABSURD.as_secs_f64() {
        return Err(HintProblem::Absurd);
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The wait's rule after a failure, with `room` usable before the
/// deadline: a valid Retry-After wins over jitter — capped at
/// `retry_after.max_ms` when `on_exceed` says so, plus up to
/// `retry_after.jitter_ms` — and must fit `room`: a hint that cannot stops
/// the call (`retry_after_exceeds_deadline`) instead of sleeping past the
/// user's deadline. Without a hint, the backoff's jitter, cut to `room`.
/// The server's wait as the rules read it: capped at `retry_after.max_ms`
/// when the policy says `on_exceed: cap`; an absurd hint (beyond a year) is
/// a very long wait, not no hint.
pub(crate) fn hinted(hint: &RetryHint, ra: &RetryAfter) -> Option<Duration> {
    let max = Duration::from_millis(ra.max_ms);
    hint.wait
        .or((hint.problem == Some(HintProblem::Absurd)).then_some(ABSURD))
        .map(|w| {
            if w > max && ra.on_exceed == OnExceed::Cap {
                max
            } else {
                w
            }
        })
}

/// A hinted wait the call cannot honour: past the deadline's room, or above the maximum.
pub(crate) fn too_long(hint: Option<Duration>, room: Duration, ra: &RetryAfter) -> bool {
    hint.is_some_and(|w| w > room || w > Duration::from_millis(ra.max_ms))
}

/// The wait's rule after a failure: a retry waits for the upstream that
/// failed (its hint, else jitter); a fallback goes to another upstream now.
pub(crate) fn plan<C: Failed>(
    c: &mut C,
    hint: Option<Duration>,
    to: &Target,
    room: Duration,
    at_once: bool,
) -> Result<Wait, Halt> {
    if to.fallback || at_once {
        return Ok(Wait {
            delay: Duration::ZERO,
            source: WaitSource::None,
        });
    }
    let (ra, backoff) = c.waits();
    let (max_ms, ra_jitter) = (ra.max_ms, ra.jitter_ms);
    let Some(mut w) = hint else {
        let cfg = backoff.clone();
        let (retries, prev_wait_ms) = c.waited();
        let j = jitter_ms(&cfg, retries, prev_wait_ms, c.rng());
        return Ok(Wait {
            delay: Duration::from_millis(j).min(room),
            source: WaitSource::Jitter,
        });
    };
    let max = Duration::from_millis(max_ms);
    // The user's deadline comes first: a hint that cannot fit stops at once.
    if w > room {
        let detail = format!("retry-after {} ms, {} ms usable before the deadline", ms(w), ms(room));
        return Err(Halt::stop(Reason::RetryAfterExceedsDeadline, Some(detail)));
    }
    if w > max {
        let detail = format!("retry-after {} ms > max {} ms", ms(w), max_ms);
        return Err(Halt::stop(Reason::RetryAfterTooLarge, Some(detail)));
    }
    if ra_jitter > 0 {
        let extra = Duration::from_millis(c.rng().gen_range(0..=ra_jitter));
        w = (w + extra).min(room);
    }
    Ok(Wait {
        delay: w,
        source: WaitSource::RetryAfter,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;
    use std::time::UNIX_EPOCH;

    fn now() -> SystemTime {
        // Sun, 06 Nov 1994 08:49:37 GMT minus 10 s.
        UNIX_EPOCH + Duration::from_secs(784_111_777 - 10)
    }

    fn ms(v: &[(&str, &str)]) -> (Option<u64>, Option<&'static str>) {
        let h: Headers = v.iter().copied().collect();
        let r = parse_retry_after(&h, now());
        (r.wait.map(|d| d.as_millis() as u64), r.problem.map(|p| p.as_str()))
    }

    #[test]
    fn retry_after_table() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<u64>, Option<&'a str>);
        let cases: &[Case] = &[
            (&[("retry-after", "2")], Some(2_000), None),
            (&[("retry-after", "2.5")], Some(2_500), None),
            (&[("retry-after", "0")], Some(0), None),
            (&[("retry-after", "-1")], None, Some("retry_after_negative")),
            (&[("retry-after", "")], None, Some("retry_after_unparseable")),
            (&[("retry-after", "soon")], None, Some("retry_after_unparseable")),
            (
                &[("retry-after", "99999999999999999999")],
                None,
                Some("retry_after_absurd"),
            ),
            (&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")], Some(10_000), None),
            (&[("retry-after", "Sunday, 06-Nov-94 08:49:37 GMT")], Some(10_000), None),
            (&[("retry-after", "Sun Nov  6 08:49:37 1994")], Some(10_000), None),
            (&[("retry-after", "Sat, 05 Nov 1994 08:49:37 GMT")], Some(0), None),
            (&[("retry-after-ms", "1500")], Some(1_500), None),
            (&[("retry-after-ms", "1500"), ("retry-after", "9")], Some(1_500), None),
            (
                &[("retry-after-ms", "junk"), ("retry-after", "3")],
                Some(3_000),
                Some("retry_after_unparseable"),
            ),
            (&[("Retry-After", "1")], Some(1_000), None),
            (&[], None, None),
        ];
        for (headers, wait, problem) in cases {
            assert_eq!(ms(headers), (*wait, *problem), "{headers:?}");
        }
    }

    #[test]
    fn full_jitter_bounds_and_no_overflow() {
        let cfg = Backoff::default();
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        for n in [0u32, 1, 2, 3, 4, 10, 63, 64, 10_000, u32::MAX] {
            let c = ceiling_ms(&cfg, n);
            assert_eq!(c, (250u64.saturating_mul(1 << n.min(62))).min(4_000));
            for _ in 0..100 {
                assert!(jitter_ms(&cfg, n, 0, &mut rng) <= c);
            }
        }
    }

    #[test]
    fn equal_and_decorrelated_bounds() {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let eq = Backoff {
            kind: BackoffKind::Equal,
            ..Backoff::default()
        };
        for n in 0..20 {
            let c = ceiling_ms(&eq, n);
            let w = jitter_ms(&eq, n, 0, &mut rng);
            assert!(w >= c / 2 && w <= c, "{w} {c}");
        }
        let de = Backoff {
            kind: BackoffKind::Decorrelated,
            ..Backoff::default()
        };
        let mut prev = 0;
        for n in 0..50 {
            let w = jitter_ms(&de, n, prev, &mut rng);
            assert!(w <= de.cap_ms && w >= de.base_ms.min(de.cap_ms));
            prev = w;
        }
    }
}
