//! End-to-end deadlines: per-attempt timeouts clamped to what is left,
//! propagation headers so a downstream engine inherits the caller's deadline
//! (and knows it is not the retry owner) instead of starting a fresh one,
//! and the rule that no attempt starts with less than `min_attempt` left.

use super::Halt;
use crate::clock::Nanos;
use crate::outcome::Headers;
use crate::policy::{Timeouts as TimeoutPolicy, HALF};
use crate::types::{ErrorKind, Reason};
use std::time::Duration;

/// Header carrying the remaining deadline in ms (relative, minus the safety margin).
pub const H_DEADLINE: &str = "retrywise-deadline-ms";
/// Header carrying the logical request id.
pub const H_REQUEST_ID: &str = "retrywise-request-id";
/// Header carrying the attempt number (1-based).
pub const H_ATTEMPT: &str = "retrywise-attempt";
/// Header carrying the business idempotency key.
pub const H_IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Timeouts for one attempt. Each is at most `total`, and `total` is at most
/// what is left of the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AttemptTimeouts {
    /// TCP + TLS connect.
    #[serde(serialize_with = "ser_ms")]
    pub connect: Duration,
    /// Request sent → first response byte.
    #[serde(serialize_with = "ser_ms")]
    pub first_byte: Duration,
    /// Request sent → first visible output of a streamed answer (keep-alive
    /// pings and an opening preamble do not count).
    #[serde(serialize_with = "ser_ms")]
    pub first_token: Duration,
    /// Longest gap between stream chunks.
    #[serde(serialize_with = "ser_ms")]
    pub idle: Duration,
    /// The whole attempt.
    #[serde(serialize_with = "ser_ms")]
    pub total: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// [`AttemptTimeouts`] as an attempt carries them: whole milliseconds
/// (floored, so never past the deadline; saturating at `u32::MAX`, 49 days)
/// in 20 bytes instead of 80, which keeps an [`crate::Attempt`] small enough
/// to move with a few vector stores rather than a `memcpy` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeoutsMs {
    connect: u32,
    first_byte: u32,
    first_token: u32,
    idle: u32,
    total: u32,
}

#[inline(always)]
fn ms32(ms: u64) -> u32 {
    ms.min(u32::MAX as u64) as u32
}

impl TimeoutsMs {
    /// The fixed timeouts `[connect, first_byte, first_token, idle]` (ms;
    /// [`HALF`]: half of `total`), each clamped to `total` (ms).
    #[inline(always)]
    pub(crate) fn clamped(fixed: &[u64; 4], total: u64) -> TimeoutsMs {
        let at_most = |ms: u64| if ms == HALF { total / 2 } else { ms.min(total) };
        TimeoutsMs {
            connect: ms32(at_most(fixed[0])),
            first_byte: ms32(at_most(fixed[1])),
            first_token: ms32(at_most(fixed[2])),
            idle: ms32(at_most(fixed[3])),
            total: ms32(total),
        }
    }

    /// A learned limit of `ms` on the first token (`token`) and the first
    /// byte (`byte`), never raising either.
    pub(crate) fn learned(&mut self, ms: u32, token: bool, byte: bool) {
        if token {
            self.first_token = self.first_token.min(ms);
        }
        if byte {
            self.first_byte = self.first_byte.min(ms);
        }
    }

    /// Caps the silence limits (first byte, first token) at `room` ms;
    /// `(first_byte, first_token)` as they were when either was above it.
    pub(crate) fn cap_silence(&mut self, room: u32) -> Option<(u32, u32)> {
        if self.first_byte <= room && self.first_token <= room {
            return None;
        }
        let was = (self.first_byte, self.first_token);
        self.first_byte = self.first_byte.min(room);
        self.first_token = self.first_token.min(room);
        Some(was)
    }

    /// `t` in whole milliseconds.
    pub(crate) fn of(t: &AttemptTimeouts) -> TimeoutsMs {
        let ms = |d: Duration| Nanos::of(d).ms();
        TimeoutsMs {
            connect: ms32(ms(t.connect)),
            first_byte: ms32(ms(t.first_byte)),
            first_token: ms32(ms(t.first_token)),
            idle: ms32(ms(t.idle)),
            total: ms32(ms(t.total)),
        }
    }

    /// The total, ms.
    #[inline]
    pub(crate) fn total_ms(&self) -> u64 {
        u64::from(self.total)
    }

    /// As durations.
    #[inline]
    pub(crate) fn timeouts(&self) -> AttemptTimeouts {
        let d = |ms: u32| Duration::from_millis(u64::from(ms));
        AttemptTimeouts {
            connect: d(self.connect),
            first_byte: d(self.first_byte),
            first_token: d(self.first_token),
            idle: d(self.idle),
            total: d(self.total),
        }
    }
}

/// One of an attempt's timers, as a binding arms them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Connecting took longer than `timeouts.connect`.
    Connect,
    /// No response byte within `timeouts.first_byte`.
    FirstByte,
    /// A streamed answer showed no output within `timeouts.first_token` of
    /// its request (keep-alive pings and an opening preamble do not count).
    FirstToken,
    /// The body went silent for `timeouts.idle`.
    Idle,
    /// The attempt as a whole ran `timeouts.total`.
    Total,
}

/// The [`ErrorKind`] an expired timer means, the same in every binding: the
/// total timer is the deadline's own when the attempt was given all the time
/// left (`total_ms ≥ remaining_ms`); otherwise a hang before the response
/// (`body_started` false) is a first-byte timeout and one inside the body an
/// idle stream. A stream silent past its first-token timer is a first-byte
/// timeout too: nothing reached the caller, so it is retried like a hang
/// before the response (reported in phase `stream_open`).
pub fn timer_error(timer: Timer, total_ms: u64, remaining_ms: u64, body_started: bool) -> ErrorKind {
    match timer {
        Timer::Connect => ErrorKind::ConnectTimeout,
        Timer::FirstByte | Timer::FirstToken => ErrorKind::FirstByteTimeout,
        Timer::Idle => ErrorKind::StreamIdleTimeout,
        Timer::Total if total_ms >= remaining_ms => ErrorKind::DeadlineExceeded,
        Timer::Total if body_started => ErrorKind::StreamIdleTimeout,
        Timer::Total => ErrorKind::FirstByteTimeout,
    }
}

/// Token counts a caller may give so the attempt timeout scales with the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenEstimate {
    /// Input tokens (estimated or counted).
    pub input: Option<u64>,
    /// Requested `max_tokens`.
    pub max_output: Option<u64>,
}

/// Computes one attempt's timeouts from the policy and the time left.
pub fn attempt_timeouts(p: &TimeoutPolicy, remaining: Duration, tokens: TokenEstimate) -> AttemptTimeouts {
    let mut total = remaining;
    if let Some(a) = p.attempt_ms {
        total = total.min(Duration::from_millis(a));
    }
    if let (Some(d), true) = (&p.dynamic, tokens.input.is_some() || tokens.max_output.is_some()) {
        let us = d
            .per_input_token_us
            .saturating_mul(tokens.input.unwrap_or(0))
            .saturating_add(d.per_output_token_us.saturating_mul(tokens.max_output.unwrap_or(0)));
        let dynamic = Duration::from_millis(d.base_ms).saturating_add(Duration::from_micros(us));
        total = total.min(dynamic);
    }
    AttemptTimeouts {
        connect: Duration::from_millis(p.connect_ms).min(total),
        first_byte: p
            .first_byte_ms
            .map_or(total / 2, |t| Duration::from_millis(t).min(total)),
        first_token: p
            .first_token_ms
            .map_or(total / 2, |t| Duration::from_millis(t).min(total)),
        idle: Duration::from_millis(p.idle_ms).min(total),
        total,
    }
}

/// What an inbound request (or an enclosing call in the same process) tells
/// this engine: someone above owns retries, and how much time is left.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inbound {
    /// Remaining deadline as sent by the caller.
    pub deadline: Option<Duration>,
    /// The caller's logical request id.
    pub request_id: Option<String>,
    /// The caller's attempt number.
    pub attempt: Option<u32>,
    /// The business idempotency key, carried unchanged.
    pub idempotency_key: Option<String>,
}

/// A propagation header that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundError {
    /// The header name.
    pub header: &'static str,
    /// Why it was rejected.
    pub message: String,
}

impl std::fmt::Display for InboundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "header {}: {}", self.header, self.message)
    }
}

impl std::error::Error for InboundError {}

impl Inbound {
    /// Parses propagation headers (case-insensitive). Returns `Ok(None)` when
    /// none is present (this engine is then the owner). A malformed header is
    /// an error naming it; the caller decides whether to reject the request.
    pub fn from_headers(h: &Headers) -> Result<Option<Inbound>, InboundError> {
        let deadline = h.get(H_DEADLINE);
        let id = h.get(H_REQUEST_ID);
        let attempt = h.get(H_ATTEMPT);
        if deadline.is_none() && id.is_none() && attempt.is_none() {
            return Ok(None);
        }
        let deadline = match deadline {
            None => None,
            Some(v) => {
                let ms: u64 = v.trim().parse().map_err(|_| InboundError {
                    header: H_DEADLINE,
                    message: format!("expected non-negative integer milliseconds, got {v:?}"),
                })?;
                if ms > 86_400_000 * 7 {
                    return Err(InboundError {
                        header: H_DEADLINE,
                        message: format!("more than 7 days, got {ms}"),
                    });
                }
                Some(Duration::from_millis(ms))
            }
        };
        let attempt = match attempt {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| InboundError {
                        header: H_ATTEMPT,
                        message: format!("expected an integer ≥ 1, got {v:?}"),
                    })?,
            ),
        };
        let request_id = match id {
            None => None,
            Some(v) => {
                let v = v.trim();
                if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(InboundError {
                        header: H_REQUEST_ID,
                        message: "expected 1-128 visible ASCII characters".into(),
                    });
                }
                Some(v.to_string())
            }
        };
        Ok(Some(Inbound {
            deadline,
            request_id,
            attempt,
            idempotency_key: h.get(H_IDEMPOTENCY_KEY).map(|s| s.trim().to_string()),
        }))
    }
}

/// Builds the outbound propagation headers for one attempt.
pub fn outbound_headers(
    remaining: Duration,
    safety_margin: Duration,
    request_id: &str,
    attempt: u32,
    idempotency_key: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut v = Vec::with_capacity(4);
    let ms = remaining.saturating_sub(safety_margin).as_millis();
    v.push((H_DEADLINE, ms.to_string()));
    v.push((H_REQUEST_ID, request_id.to_string()));
    v.push((H_ATTEMPT, attempt.to_string()));
    if let Some(k) = idempotency_key {
        v.push((H_IDEMPOTENCY_KEY, k.to_string()));
    }
    v
}

/// Why no attempt may start with `remaining` left — less than
/// `min_attempt` (given as [`Nanos`] and in ms), or nothing — as a stop's
/// detail; `None` when one may.
#[inline]
pub(crate) fn too_late(remaining: Nanos, (min_attempt, min_attempt_ms): (Nanos, u64)) -> Option<String> {
    (remaining < min_attempt || remaining.is_zero())
        .then(|| format!("{} ms left, min_attempt is {} ms", remaining.ms(), min_attempt_ms))
}

/// The deadline's rule after a failure: what one more attempt and the wait
/// before it may use (the time left minus `min_attempt`), or the stop when
/// that is nothing.
pub(crate) fn room(remaining: Nanos, min_attempt: (Nanos, u64)) -> Result<Duration, Halt> {
    if let Some(detail) = too_late(remaining, min_attempt) {
        return Err(Halt::stop(Reason::DeadlineExceeded, Some(detail)));
    }
    Ok(remaining.saturating_sub(min_attempt.0).dur())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::DynamicTimeout;

    #[test]
    fn attempt_timeouts_in_ms_floor_clamp_and_saturate() {
        let t = TimeoutsMs::clamped(&[2_000, 30_000, 4_000, 60_000], 9_999).timeouts();
        assert_eq!(
            t,
            AttemptTimeouts {
                connect: Duration::from_millis(2_000),
                first_byte: Duration::from_millis(9_999),
                first_token: Duration::from_millis(4_000),
                idle: Duration::from_millis(9_999),
                total: Duration::from_millis(9_999),
            }
        );
        // A timeout given as half of the time left (null in the policy).
        let t = TimeoutsMs::clamped(&[2_000, HALF, HALF, 60_000], 9_999).timeouts();
        assert_eq!(
            (t.first_byte, t.first_token),
            (Duration::from_millis(4_999), Duration::from_millis(4_999))
        );
        // Floored: 1.9999 ms left is 1 ms, never more than what is left.
        let t = TimeoutsMs::of(&AttemptTimeouts {
            connect: Duration::from_micros(1_999),
            first_byte: Duration::from_nanos(999_999),
            first_token: Duration::ZERO,
            idle: Duration::ZERO,
            total: Duration::from_micros(1_999),
        })
        .timeouts();
        assert_eq!(
            (t.connect, t.first_byte, t.total),
            (Duration::from_millis(1), Duration::ZERO, Duration::from_millis(1))
        );
        // Beyond u32::MAX ms (49.7 days) a timeout reads as u32::MAX ms.
        let max = Duration::from_millis(u64::from(u32::MAX));
        assert_eq!(TimeoutsMs::clamped(&[u64::MAX; 4], u64::MAX).timeouts().total, max);
        assert_eq!(
            TimeoutsMs::of(&AttemptTimeouts {
                total: Duration::MAX,
                ..t
            })
            .timeouts()
            .total,
            max
        );
    }

    #[test]
    fn timeouts_are_clamped_to_remaining() {
        let p = TimeoutPolicy::default();
        let t = attempt_timeouts(&p, Duration::from_millis(2_000), TokenEstimate::default());
        assert_eq!(t.total, Duration::from_millis(2_000));
        assert_eq!(t.connect, Duration::from_millis(2_000));
        assert_eq!(t.idle, Duration::from_millis(2_000));
        let t = attempt_timeouts(&p, Duration::from_secs(100), TokenEstimate::default());
        assert_eq!(t.connect, Duration::from_millis(5_000));
        assert_eq!(t.total, Duration::from_secs(100));
    }

    #[test]
    fn dynamic_timeout_from_tokens() {
        let p = TimeoutPolicy {
            dynamic: Some(DynamicTimeout {
                base_ms: 1_000,
                per_input_token_us: 100,
                per_output_token_us: 20_000,
            }),
            ..TimeoutPolicy::default()
        };
        let t = attempt_timeouts(
            &p,
            Duration::from_secs(60),
            TokenEstimate {
                input: Some(10_000),
                max_output: Some(500),
            },
        );
        // 1 000 + 10 000 * 0.1 + 500 * 20 = 12 000 ms
        assert_eq!(t.total, Duration::from_millis(12_000));
        let t = attempt_timeouts(
            &p,
            Duration::from_secs(5),
            TokenEstimate {
                input: Some(10_000),
                max_output: Some(500),
            },
        );
        assert_eq!(t.total, Duration::from_secs(5));
        let t = attempt_timeouts(&p, Duration::from_secs(60), TokenEstimate::default());
        assert_eq!(t.total, Duration::from_secs(60));
    }

    #[test]
    fn propagation_round_trip() {
        let out = outbound_headers(
            Duration::from_millis(5_000),
            Duration::from_millis(50),
            "abc",
            2,
            Some("k1"),
        );
        let h: Headers = out.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let inb = Inbound::from_headers(&h).unwrap().unwrap();
        assert_eq!(inb.deadline, Some(Duration::from_millis(4_950)));
        assert_eq!(inb.request_id.as_deref(), Some("abc"));
        assert_eq!(inb.attempt, Some(2));
        assert_eq!(inb.idempotency_key.as_deref(), Some("k1"));
        assert_eq!(Inbound::from_headers(&Headers::new()).unwrap(), None);
        let bad: Headers = [("Retrywise-Deadline-Ms", "soon")].into_iter().collect();
        assert_eq!(Inbound::from_headers(&bad).unwrap_err().header, H_DEADLINE);
        let bad: Headers = [("retrywise-attempt", "0")].into_iter().collect();
        assert_eq!(Inbound::from_headers(&bad).unwrap_err().header, H_ATTEMPT);
    }
}
