//! The simulated upstream: a model provider with finite capacity.
//!
//! * **Service rate.** Admitted requests pass one FIFO stage that serves at most
//!   `capacity_per_sec` requests per second (prefill / GPU throughput). A request
//!   that finds the stage busy waits in the queue; that wait adds to its latency.
//! * **Bounded queue.** A request that would wait longer than `max_queue_ms` is
//!   refused at once with `529 overloaded` and consumes no capacity.
//! * **Sunk work.** The upstream never learns that a client gave up: a request
//!   admitted and then abandoned by a client timeout still uses its share of
//!   capacity, exactly like a GPU that keeps running a prefill nobody waits for.
//! * **Latency.** After its turn in the stage, a request takes a log-normal time
//!   (mean from the fault schedule, spread `latency_sigma`) to answer — success,
//!   or an error status with the schedule's error rate.
//! * **Faults** (from [`Conditions`]): a hard outage answers `503` fast without
//!   using capacity; a rate limit answers `429` with `retry-after` fast: a
//!   token bucket (one second of burst) that states nothing else, or, with
//!   `rate_window_s`, a fixed window whose every answer states the limit,
//!   the allowance left and the reset ([`Limits::headers`]), as providers
//!   state their RPM limits.
//!
//! Everything about an attempt is decided when it is sent (the stage is FIFO), so
//! the model needs no events of its own: `send` is O(1).

use super::rng::Rng;

/// What the world looks like at one instant (baseline plus active faults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conditions {
    /// Probability that an admitted request ends in `error_status`.
    pub error_rate: f64,
    /// Status of those errors (e.g. 503).
    pub error_status: u16,
    /// Mean latency after the queue, ms.
    pub latency_mean_ms: f64,
    /// Hard outage: every request gets a fast 503, no capacity used.
    pub outage: bool,
    /// Provider-side rate limit, requests per second (429 beyond it).
    pub rate_limit_per_sec: Option<f64>,
    /// `retry-after` sent with a 429, seconds.
    pub retry_after_s: u32,
    /// The rate limit's window, seconds: 0 = a token bucket whose 429s say
    /// only `retry-after`; otherwise fixed windows of `rate × window`
    /// requests, stated on every answer ([`Limits`]).
    pub rate_window_s: u32,
    /// Multiplier on the offered logical QPS (traffic surge).
    pub qps_factor: f64,
}

impl Default for Conditions {
    fn default() -> Self {
        Conditions {
            error_rate: 0.0001,
            error_status: 503,
            latency_mean_ms: 800.0,
            outage: false,
            rate_limit_per_sec: None,
            retry_after_s: 2,
            rate_window_s: 0,
            qps_factor: 1.0,
        }
    }
}

/// Fixed properties of the upstream.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct UpstreamParams {
    /// Requests per second the service stage can admit.
    pub capacity_per_sec: f64,
    /// Longest queue wait before refusing with 529, ms.
    pub max_queue_ms: f64,
    /// How fast refusals (429, 529, outage 503) come back, ms.
    pub reject_ms: f64,
    /// Log-space standard deviation of latency.
    pub latency_sigma: f64,
}

/// What the upstream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// 200.
    Ok,
    /// An admitted request that failed with this status.
    Error(u16),
    /// 529: the queue is full.
    Overloaded,
    /// 429 with `retry-after` seconds.
    RateLimited(u32),
    /// 503 from a hard outage (nothing admitted).
    Down,
}

/// A fixed-window rate limit as an answer states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests per window.
    pub limit: u32,
    /// Requests left in the current window after this one.
    pub remaining: u32,
    /// Time until the window resets, ms.
    pub reset_ms: u32,
    /// The window, seconds.
    pub window_s: u32,
}

impl Limits {
    /// OpenAI's fields (limit, remaining, reset to the millisecond) and the
    /// IETF policy field for the window's length, which OpenAI's do not state.
    pub fn headers(&self) -> [(&'static str, String); 4] {
        [
            ("x-ratelimit-limit-requests", self.limit.to_string()),
            ("x-ratelimit-remaining-requests", self.remaining.to_string()),
            ("x-ratelimit-reset-requests", format!("{}ms", self.reset_ms)),
            (
                "ratelimit-policy",
                format!("\"rl\";q={};w={}", self.limit, self.window_s),
            ),
        ]
    }

    /// Seconds until the reset, rounded up (a 429's `retry-after`).
    pub fn reset_s(&self) -> u32 {
        self.reset_ms.div_ceil(1_000)
    }
}

/// The answer and when it reaches the client (if the client still waits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Response {
    /// The reply.
    pub reply: Reply,
    /// Absolute time of the answer, µs.
    pub at_us: u64,
    /// The rate limit the answer states, if any.
    pub limits: Option<Limits>,
}

/// Per-second counters of the upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SecStats {
    /// Attempts that arrived.
    pub arrived: u32,
    /// Attempts admitted to the service stage.
    pub admitted: u32,
    /// Refused with 529.
    pub overloaded: u32,
    /// Refused with 429.
    pub rate_limited: u32,
    /// Longest queue wait seen, ms.
    pub max_wait_ms: u32,
}

/// The upstream's state.
#[derive(Debug, Clone)]
pub struct Upstream {
    p: UpstreamParams,
    service_us: f64,
    next_free_us: f64,
    tokens: f64,
    tokens_at_us: u64,
    limited: bool,
    /// The fixed window in force (its index) and the requests it took.
    window: (u64, u32),
    rng: Rng,
    /// Counters by second of arrival.
    pub per_sec: Vec<SecStats>,
}

impl Upstream {
    /// An idle upstream.
    pub fn new(p: UpstreamParams, rng: Rng) -> Self {
        Upstream {
            service_us: 1e6 / p.capacity_per_sec.max(1e-9),
            p,
            next_free_us: 0.0,
            tokens: 0.0,
            tokens_at_us: 0,
            limited: false,
            window: (u64::MAX, 0),
            rng,
            per_sec: Vec::new(),
        }
    }

    fn sec(&mut self, now_us: u64) -> &mut SecStats {
        let s = (now_us / 1_000_000) as usize;
        if self.per_sec.len() <= s {
            self.per_sec.resize(s + 1, SecStats::default());
        }
        &mut self.per_sec[s]
    }

    /// Sends one attempt at `now_us` under conditions `c`.
    pub fn send(&mut self, now_us: u64, c: &Conditions) -> Response {
        self.sec(now_us).arrived += 1;
        let reject_at = now_us + (self.p.reject_ms * 1000.0) as u64;
        if c.outage {
            return Response {
                reply: Reply::Down,
                at_us: reject_at,
                limits: None,
            };
        }
        let mut limits = None;
        match c.rate_limit_per_sec {
            Some(rate) if c.rate_window_s > 0 => {
                let w_us = u64::from(c.rate_window_s) * 1_000_000;
                let idx = now_us / w_us;
                if self.window.0 != idx {
                    self.window = (idx, 0);
                }
                let limit = (rate * f64::from(c.rate_window_s)) as u32;
                let mut l = Limits {
                    limit,
                    remaining: 0,
                    reset_ms: ((idx + 1) * w_us - now_us).div_ceil(1_000) as u32,
                    window_s: c.rate_window_s,
                };
                if self.window.1 >= limit {
                    self.sec(now_us).rate_limited += 1;
                    return Response {
                        reply: Reply::RateLimited(l.reset_s()),
                        at_us: reject_at,
                        limits: Some(l),
                    };
                }
                self.window.1 += 1;
                l.remaining = limit - self.window.1;
                limits = Some(l);
            }
            Some(rate) => {
                if !self.limited {
                    self.limited = true;
                    self.tokens = rate;
                    self.tokens_at_us = now_us;
                }
                let dt = now_us.saturating_sub(self.tokens_at_us) as f64 / 1e6;
                self.tokens = (self.tokens + dt * rate).min(rate);
                self.tokens_at_us = now_us;
                if self.tokens < 1.0 {
                    self.sec(now_us).rate_limited += 1;
                    return Response {
                        reply: Reply::RateLimited(c.retry_after_s),
                        at_us: reject_at,
                        limits: None,
                    };
                }
                self.tokens -= 1.0;
            }
            None => self.limited = false,
        }
        let now = now_us as f64;
        let start = self.next_free_us.max(now);
        let wait_us = start - now;
        if wait_us > self.p.max_queue_ms * 1000.0 {
            self.sec(now_us).overloaded += 1;
            return Response {
                reply: Reply::Overloaded,
                at_us: reject_at,
                limits,
            };
        }
        self.next_free_us = start + self.service_us;
        let wait_ms = (wait_us / 1000.0) as u32;
        let s = self.sec(now_us);
        s.admitted += 1;
        s.max_wait_ms = s.max_wait_ms.max(wait_ms);
        let latency_us = self
            .rng
            .lognormal_mean(c.latency_mean_ms * 1000.0, self.p.latency_sigma);
        let at_us = (start + latency_us).ceil() as u64;
        let reply = if self.rng.unit() < c.error_rate {
            Reply::Error(c.error_status)
        } else {
            Reply::Ok
        };
        Response { reply, at_us, limits }
    }

    /// Queue wait a request sent at `now_us` would see, ms.
    #[cfg(test)]
    pub fn queue_wait_ms(&self, now_us: u64) -> f64 {
        (self.next_free_us - now_us as f64).max(0.0) / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(cap: f64) -> UpstreamParams {
        UpstreamParams {
            capacity_per_sec: cap,
            max_queue_ms: 2_000.0,
            reject_ms: 20.0,
            latency_sigma: 0.6,
        }
    }

    /// Sends `qps` evenly spaced requests per second for `secs` seconds.
    fn drive(u: &mut Upstream, qps: f64, secs: u64, c: &Conditions) -> Vec<(u64, Response)> {
        let n = (qps * secs as f64) as u64;
        let gap = 1e6 / qps;
        (0..n)
            .map(|i| {
                let t = (i as f64 * gap) as u64;
                (t, u.send(t, c))
            })
            .collect()
    }

    #[test]
    fn under_capacity_nothing_queues_and_latency_matches_the_schedule() {
        let mut u = Upstream::new(params(1_000.0), Rng::new(1));
        let c = Conditions {
            error_rate: 0.0,
            ..Conditions::default()
        };
        let out = drive(&mut u, 800.0, 10, &c);
        assert!(out.iter().all(|(_, r)| r.reply == Reply::Ok));
        let mean_ms = out.iter().map(|(t, r)| (r.at_us - t) as f64 / 1000.0).sum::<f64>() / out.len() as f64;
        assert!((mean_ms - 800.0).abs() < 25.0, "mean latency {mean_ms}");
        assert!(u.per_sec.iter().all(|s| s.overloaded == 0 && s.max_wait_ms <= 2));
    }

    #[test]
    fn over_capacity_the_queue_grows_then_529s_and_admissions_stay_at_capacity() {
        let mut u = Upstream::new(params(1_000.0), Rng::new(2));
        let c = Conditions {
            error_rate: 0.0,
            ..Conditions::default()
        };
        let out = drive(&mut u, 1_500.0, 20, &c);
        // The queue grows by 0.5 s per second, so it is full after ~4 s.
        assert!(u.per_sec[1].overloaded == 0 && u.per_sec[1].max_wait_ms > 400);
        assert!(u.per_sec[10].overloaded > 0 && u.per_sec[10].max_wait_ms >= 1_990);
        let admitted: u32 = u.per_sec[5..19].iter().map(|s| s.admitted).sum();
        let per_sec = admitted as f64 / 14.0;
        assert!((per_sec - 1_000.0).abs() < 5.0, "admitted {per_sec}/s");
        // Refusals are fast; admitted requests carry the queue wait.
        let late = out.iter().filter(|(t, _)| *t > 10_000_000);
        for (t, r) in late {
            let ms = (r.at_us - t) / 1000;
            match r.reply {
                Reply::Overloaded => assert_eq!(ms, 20),
                Reply::Ok => assert!(ms >= 1_900, "admitted request answered after {ms} ms"),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn error_rate_and_status_follow_the_schedule() {
        let mut u = Upstream::new(params(100_000.0), Rng::new(3));
        let c = Conditions {
            error_rate: 0.05,
            error_status: 503,
            latency_mean_ms: 2_500.0,
            ..Conditions::default()
        };
        let out = drive(&mut u, 10_000.0, 10, &c);
        let errors = out.iter().filter(|(_, r)| r.reply == Reply::Error(503)).count() as f64 / out.len() as f64;
        assert!((errors - 0.05).abs() < 0.005, "error share {errors}");
        let mean_ms = out.iter().map(|(t, r)| (r.at_us - t) as f64 / 1000.0).sum::<f64>() / out.len() as f64;
        assert!((mean_ms - 2_500.0).abs() < 40.0, "mean latency {mean_ms}");
    }

    #[test]
    fn outage_is_fast_and_uses_no_capacity() {
        let mut u = Upstream::new(params(1_000.0), Rng::new(4));
        let down = Conditions {
            outage: true,
            ..Conditions::default()
        };
        let out = drive(&mut u, 5_000.0, 2, &down);
        assert!(out.iter().all(|(t, r)| r.reply == Reply::Down && r.at_us - t == 20_000));
        // Right after the outage the stage is idle: no queue built up.
        assert_eq!(u.queue_wait_ms(2_000_000), 0.0);
        assert_eq!(u.per_sec[0].admitted, 0);
    }

    #[test]
    fn rate_limit_answers_429_with_retry_after_and_admits_the_rate() {
        let mut u = Upstream::new(params(100_000.0), Rng::new(5));
        let c = Conditions {
            rate_limit_per_sec: Some(600.0),
            retry_after_s: 2,
            error_rate: 0.0,
            ..Conditions::default()
        };
        let out = drive(&mut u, 1_000.0, 10, &c);
        assert!(out.iter().any(|(_, r)| r.reply == Reply::RateLimited(2)));
        // One second of burst, then the rate.
        let ok = out.iter().filter(|(_, r)| r.reply == Reply::Ok).count() as f64;
        assert!((ok - 6_600.0).abs() < 20.0, "admitted {ok}");
        // Lifting the limit lets everything through again.
        let free = Conditions {
            error_rate: 0.0,
            ..Conditions::default()
        };
        assert_eq!(u.send(11_000_000, &free).reply, Reply::Ok);
    }

    #[test]
    fn same_seed_same_answers() {
        let c = Conditions::default();
        let mut a = Upstream::new(params(1_000.0), Rng::new(9));
        let mut b = Upstream::new(params(1_000.0), Rng::new(9));
        assert_eq!(drive(&mut a, 1_200.0, 3, &c), drive(&mut b, 1_200.0, 3, &c));
    }
}
