//! `fb-ratelimit`: a real request limit per model name, on the server's monotonic
//! clock, stated in one provider family's rate-limit headers on every answer.
//!
//! Fixed windows start at the model's first request (since start or the last
//! reset) and follow each other back to back; a sliding window counts the
//! admitted requests of the last `window` ms; a token bucket holds up to
//! `limit` requests and refills continuously at `limit` per `window` (as
//! Anthropic and OpenAI describe theirs). Refused requests (429) do not count
//! against the limit, as with the real providers.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::model::Family;

/// How `fb-ratelimit` counts its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Back-to-back windows of `window` ms, each admitting `limit`.
    Fixed,
    /// At most `limit` admitted in any `window` ms.
    Sliding,
    /// A bucket of `limit` requests refilled continuously at `limit` per `window`.
    Bucket,
}

/// The limit of one model name.
#[derive(Debug)]
pub struct Limiter {
    /// Fixed: when the current window started. Bucket: when `tokens` was counted.
    start: Instant,
    /// Fixed: requests admitted in the current window.
    used: u32,
    /// Sliding: when each admitted request of the last window arrived, oldest first.
    admitted: VecDeque<Instant>,
    /// Bucket: requests in the bucket at `start` (`None`: full, never used).
    tokens: Option<f64>,
}

/// What one request got from its model's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub admitted: bool,
    pub limit: u32,
    /// Requests left in the window after this one.
    pub remaining: u32,
    /// Fixed: until the window resets. Sliding: until the next admitted request
    /// leaves the window (room for one more; the whole window when none is in it).
    /// Bucket: until the bucket is full again. For a refused fixed or sliding
    /// request, the time until the window has room.
    pub reset: Duration,
    pub window: Duration,
    /// Until there is room for one request (`retry-after` of a refusal).
    pub room: Duration,
}

impl Limiter {
    pub fn new(now: Instant) -> Self {
        Self {
            start: now,
            used: 0,
            admitted: VecDeque::new(),
            tokens: None,
        }
    }

    /// Counts a request at `now` against `limit` per `window` if there is room.
    pub fn take(&mut self, now: Instant, limit: u32, window: Duration, mode: Mode) -> Slot {
        if mode == Mode::Bucket {
            return self.take_bucket(now, limit, window);
        }
        let (admitted, used, reset) = if mode == Mode::Sliding {
            while self.admitted.front().is_some_and(|t| now.duration_since(*t) >= window) {
                self.admitted.pop_front();
            }
            let admitted = self.admitted.len() < limit as usize;
            if admitted {
                self.admitted.push_back(now);
            }
            let oldest = self.admitted.front().copied().unwrap_or(now);
            let reset = (oldest + window).saturating_duration_since(now);
            (admitted, u32::try_from(self.admitted.len()).unwrap_or(u32::MAX), reset)
        } else {
            let elapsed = now.duration_since(self.start);
            if elapsed >= window {
                // Back-to-back windows: skip every whole window that has passed.
                let whole = elapsed.as_nanos() / window.as_nanos().max(1);
                self.start += window * u32::try_from(whole).unwrap_or(u32::MAX);
                self.used = 0;
            }
            let admitted = self.used < limit;
            if admitted {
                self.used += 1;
            }
            let reset = (self.start + window).saturating_duration_since(now);
            (admitted, self.used, reset)
        };
        Slot {
            admitted,
            limit,
            remaining: limit.saturating_sub(used),
            reset,
            window,
            room: reset,
        }
    }

    /// The token bucket: refilled since `start`, then one request taken when
    /// there is one.
    fn take_bucket(&mut self, now: Instant, limit: u32, window: Duration) -> Slot {
        let cap = f64::from(limit);
        let per_s = cap / window.as_secs_f64().max(1e-9);
        let tokens = match self.tokens {
            None => cap,
            Some(t) => (t + now.duration_since(self.start).as_secs_f64() * per_s).min(cap),
        };
        let admitted = tokens >= 1.0;
        let tokens = if admitted { tokens - 1.0 } else { tokens };
        self.tokens = Some(tokens);
        self.start = now;
        let secs = |units: f64| Duration::from_secs_f64((units.max(0.0) / per_s).min(window.as_secs_f64()));
        Slot {
            admitted,
            limit,
            remaining: tokens.floor() as u32,
            reset: secs(cap - tokens),
            window,
            room: secs(1.0 - tokens),
        }
    }
}

impl Slot {
    /// `retry-after` of a refused request: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.room).max(1)
    }

    /// `retry-after-ms` of a refused request (Azure): milliseconds, rounded up, at least 1.
    pub fn retry_after_ms(&self) -> u64 {
        u64::try_from(self.room.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The family's rate-limit headers stating limit, remaining and reset.
    pub fn headers(&self, family: Family, wall: SystemTime) -> Vec<(&'static str, String)> {
        let (limit, remaining) = (self.limit.to_string(), self.remaining.to_string());
        match family {
            Family::OpenAi => vec![
                ("x-ratelimit-limit-requests", limit),
                ("x-ratelimit-remaining-requests", remaining),
                ("x-ratelimit-reset-requests", go_duration(self.reset)),
            ],
            Family::Anthropic => vec![
                ("anthropic-ratelimit-requests-limit", limit),
                ("anthropic-ratelimit-requests-remaining", remaining),
                ("anthropic-ratelimit-requests-reset", rfc3339(wall + self.reset)),
            ],
            // Azure OpenAI: the remaining count alone (no limit, no reset).
            Family::Azure => vec![("x-ratelimit-remaining-requests", remaining)],
            // Gemini: no rate-limit headers at all; a refusal says when in its body.
            Family::Gemini => vec![],
            Family::Ietf => vec![
                (
                    "ratelimit-policy",
                    format!("\"default\";q={limit};w={}", ceil_secs(self.window).max(1)),
                ),
                (
                    "ratelimit",
                    format!("\"default\";r={remaining};t={}", ceil_secs(self.reset)),
                ),
            ],
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A Go `time.Duration` string as OpenAI sends it, to the millisecond:
/// `20ms`, `1.5s`, `6m0s`, `1h2m3.25s`; rounded up so a client never comes back early.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s_ms) = (ms / 3_600_000, ms / 60_000 % 60, ms % 60_000);
    let secs = if s_ms % 1000 == 0 {
        format!("{}s", s_ms / 1000)
    } else {
        let frac = format!("{:03}", s_ms % 1000);
        format!("{}.{}s", s_ms / 1000, frac.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// An RFC 3339 UTC instant with milliseconds, rounded up: `2025-01-01T00:00:12.500Z`.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = since.as_nanos().div_ceil(1_000_000);
    let (days, ms_of_day) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fixed_windows_refuse_over_the_limit_and_reset_back_to_back() {
        let t0 = Instant::now();
        let mut l = Limiter::new(t0);
        let w = 1000 * MS;
        let got: Vec<_> = (0..3).map(|i| l.take(t0 + i * 100 * MS, 2, w, Mode::Fixed)).collect();
        assert_eq!(got.iter().map(|s| s.admitted).collect::<Vec<_>>(), [true, true, false]);
        assert_eq!(got.iter().map(|s| s.remaining).collect::<Vec<_>>(), [1, 0, 0]);
        assert_eq!(got[2].reset, 800 * MS);
        assert_eq!(got[2].retry_after_secs(), 1);
        // 2.5 windows later: the third window, which started at 2000 ms.
        let s = l.take(t0 + 2500 * MS, 2, w, Mode::Fixed);
        assert_eq!((s.admitted, s.remaining, s.reset), (true, 1, 500 * MS));
    }

    #[test]
    fn a_sliding_window_counts_the_last_window() {
        let t0 = Instant::now();
        let mut l = Limiter::new(t0);
        let w = 1000 * MS;
        assert!(l.take(t0, 2, w, Mode::Sliding).admitted);
        assert!(l.take(t0 + 600 * MS, 2, w, Mode::Sliding).admitted);
        let s = l.take(t0 + 900 * MS, 2, w, Mode::Sliding);
        assert_eq!((s.admitted, s.remaining, s.reset), (false, 0, 100 * MS));
        // The first left the window at 1000 ms; the second is still in it.
        let s = l.take(t0 + 1000 * MS, 2, w, Mode::Sliding);
        assert_eq!((s.admitted, s.remaining, s.reset), (true, 0, 600 * MS));
    }

    #[test]
    fn a_bucket_refills_continuously_and_states_the_time_until_full() {
        let t0 = Instant::now();
        let mut l = Limiter::new(t0);
        let w = 1000 * MS; // 4 per second: one every 250 ms
        let got: Vec<_> = (0..5).map(|_| l.take(t0, 4, w, Mode::Bucket)).collect();
        assert_eq!(
            got.iter().map(|s| s.admitted).collect::<Vec<_>>(),
            [true, true, true, true, false]
        );
        assert_eq!(got.iter().map(|s| s.remaining).collect::<Vec<_>>(), [3, 2, 1, 0, 0]);
        assert_eq!((got[0].reset, got[3].reset), (250 * MS, 1000 * MS));
        assert_eq!(
            (got[4].room, got[4].retry_after_secs(), got[4].retry_after_ms()),
            (250 * MS, 1, 250)
        );
        // 300 ms later one request has come back (and a fifth of the next).
        let s = l.take(t0 + 300 * MS, 4, w, Mode::Bucket);
        assert!(s.admitted);
        assert_eq!(s.remaining, 0);
        assert!(s.reset > 949 * MS && s.reset < 951 * MS, "{:?}", s.reset);
        assert!(!l.take(t0 + 400 * MS, 4, w, Mode::Bucket).admitted);
        // Idle for longer than a window: full, never more.
        let s = l.take(t0 + 5000 * MS, 4, w, Mode::Bucket);
        assert_eq!((s.admitted, s.remaining, s.reset), (true, 3, 250 * MS));
    }

    #[test]
    fn azure_and_gemini_state_little() {
        let slot = Slot {
            admitted: false,
            limit: 5,
            remaining: 0,
            reset: 1500 * MS,
            window: 2000 * MS,
            room: 1200 * MS,
        };
        assert_eq!(
            slot.headers(Family::Azure, UNIX_EPOCH),
            [("x-ratelimit-remaining-requests", "0".to_owned())]
        );
        assert!(slot.headers(Family::Gemini, UNIX_EPOCH).is_empty());
        assert_eq!((slot.retry_after_secs(), slot.retry_after_ms()), (2, 1200));
    }

    #[test]
    fn header_values() {
        assert_eq!(go_duration(20 * MS), "20ms");
        assert_eq!(go_duration(1500 * MS), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_micros(1_250_001)), "1.251s");
        assert_eq!(go_duration(Duration::from_millis(3_723_250)), "1h2m3.25s");
        let at = UNIX_EPOCH + Duration::from_millis(1_735_689_612_500);
        assert_eq!(rfc3339(at), "2025-01-01T00:00:12.500Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
        let slot = Slot {
            admitted: true,
            limit: 5,
            remaining: 4,
            reset: 1500 * MS,
            window: 2000 * MS,
            room: 1500 * MS,
        };
        assert_eq!(
            slot.headers(Family::Ietf, UNIX_EPOCH),
            [
                ("ratelimit-policy", "\"default\";q=5;w=2".to_owned()),
                ("ratelimit", "\"default\";r=4;t=2".to_owned())
            ]
        );
        assert_eq!(slot.headers(Family::OpenAi, UNIX_EPOCH)[2].1, "1.5s");
        assert_eq!(
            slot.headers(Family::Anthropic, UNIX_EPOCH)[2].1,
            "1970-01-01T00:00:01.500Z"
        );
    }
}
