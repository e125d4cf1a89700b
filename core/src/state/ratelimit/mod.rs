//! Provider rate limits as state: read every rate-limit header, pace before
//! the 429, adapt concurrency.
//!
//! retrywise sees every response of every call in the process, so it can know
//! the provider's remaining allowance and keep calls from spending what is
//! not there. Three parts, each usable alone:
//!
//! - [`Reading`] ([`headers`] and the value grammars in [`values`]): one
//!   response's evidence — OpenAI, Azure OpenAI, Anthropic and IETF
//!   `RateLimit` headers, Retry-After, and Gemini's body evidence given by the
//!   caller — in one model of [`Window`]s per [`Kind`]. Malformed values are
//!   ignored and named, never a panic.
//! - [`RateLimits`]: the table of every scope's windows (scope = what the
//!   provider limits: key × provider × model, as a string the caller builds).
//!   [`RateLimits::admit`] before an attempt answers [`Admission::Go`] with a
//!   [`Reservation`], [`Admission::Wait`] (paced: until the caller's slot
//!   after the window resets, or behind the waiters of the open window,
//!   jittered, so waiters never wake together) or
//!   [`Admission::Stop`] with [`StopWhy::RateLimitedUntil`] (the wait does not
//!   fit the time left) or [`StopWhy::QuotaExhausted`] (a per-day quota stops
//!   at once). [`RateLimits::settle`] takes the attempt's response (and
//!   [`RateLimits::observe`] a reading that belongs to no admitted attempt).
//!   [`RateLimits::snapshot`] feeds gauges and stats.
//! - [`AdaptiveConcurrency`]: AIMD on attempts in flight. In the call path
//!   (`rate_limits.concurrency`) each scope has one, and an attempt takes a
//!   place in its scope's before it is sent (`gate.rs`).
//!
//! Time is injected (monotonic nanoseconds on the engine's clock, plus a wall
//! clock only for RFC 3339 and HTTP-date instants), randomness too.
//!
//! The whole cycle:
//!
//! ```
//! use rand::SeedableRng;
//! use retrywise::rules::deadline::TokenEstimate;
//! use retrywise::ratelimit::{
//!     AdaptiveConcurrency, Admission, Feedback, Kind, RateLimits, Reading, StopWhy, Usage,
//! };
//! use std::time::{Duration, UNIX_EPOCH};
//!
//! const S: u64 = 1_000_000_000; // engine time is in nanoseconds
//! let limits = RateLimits::default();
//! let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
//! let wall = UNIX_EPOCH + Duration::from_secs(1_735_689_600);
//! let scope = "key-a/openai/gpt-4o";
//! let est = TokenEstimate { input: Some(1_000), max_output: Some(500) };
//! let left = Duration::from_secs(60);
//!
//! // Nothing known about the scope yet: go (the attempt is counted in flight).
//! let Admission::Go(first) = limits.admit(scope, 0, est, left, None, &mut rng) else { panic!() };
//!
//! // Its response: one request left in this minute, the window resets in 20 s.
//! let headers = [
//!     ("x-ratelimit-limit-requests", "60"),
//!     ("x-ratelimit-remaining-requests", "1"),
//!     ("x-ratelimit-reset-requests", "20s"),
//!     ("x-ratelimit-remaining-tokens", "149000"),
//!     ("x-ratelimit-reset-tokens", "400ms"),
//! ];
//! let reading = Reading::parse(headers, wall);
//! assert_eq!(reading.window(Kind::Requests).remaining, Some(1));
//! limits.settle(scope, first, &reading, Usage::tokens(1_000, 120), S);
//!
//! // The last request of the window goes, with its estimate reserved.
//! let Admission::Go(second) = limits.admit(scope, S, est, left, None, &mut rng) else { panic!() };
//! assert_eq!(second.cost(Kind::Tokens), 1_500);
//!
//! // A call with 5 s left cannot wait 20 s for the reset: it stops.
//! let short = limits.admit(scope, S, est, Duration::from_secs(5), None, &mut rng);
//! assert!(matches!(short, Admission::Stop(StopWhy::RateLimitedUntil(d)) if d == Duration::from_secs(20)));
//!
//! // A call with time waits for its slot: the reset plus jitter within 1 s (60 s / 60 requests).
//! let Admission::Wait { wait, ticket } = limits.admit(scope, S, est, left, None, &mut rng) else { panic!() };
//! assert!(wait >= Duration::from_secs(20) && wait <= Duration::from_secs(21));
//!
//! // It comes back with its ticket after the reset: the window is full again.
//! let back = S + wait.as_nanos() as u64;
//! let Admission::Go(third) = limits.admit(scope, back, est, left, Some(ticket), &mut rng) else { panic!() };
//!
//! // The second attempt's connection failed before sending: its units come back.
//! limits.settle(scope, second, &Reading::default(), Usage::not_sent(), back);
//! // The third's response was a 429 on a per-day quota (Gemini's QuotaFailure): stop at once.
//! let refusal = Reading::default().rate_limited().quota_exhausted();
//! limits.settle(scope, third, &refusal, Usage::sent(), back);
//! let stopped = limits.admit(scope, back, est, left, None, &mut rng);
//! assert!(matches!(stopped, Admission::Stop(StopWhy::QuotaExhausted)));
//!
//! // Another model of the same key is not affected.
//! let other = limits.admit("key-a/openai/gpt-4o-mini", back, est, left, None, &mut rng);
//! assert!(matches!(other, Admission::Go(_)));
//!
//! // Gauges and counters.
//! let snap = limits.snapshot(back);
//! assert_eq!(snap.scopes[0].kinds[0].limit, Some(60));
//! assert!(snap.scopes[0].quota_exhausted);
//! assert_eq!((snap.counters.paced_waits, snap.counters.stops_quota), (1, 1));
//!
//! // Adaptive concurrency: a 429 halves the attempts allowed in flight.
//! let gate = AdaptiveConcurrency::default();
//! let permits: Vec<_> = (0..8).map(|_| gate.try_acquire().unwrap()).collect();
//! gate.release(permits[0], Feedback::RateLimited);
//! assert_eq!(gate.limit(), 4);
//! for p in &permits[1..] {
//!     gate.release(*p, Feedback::Success);
//! }
//! ```

mod admission;
mod answer;
mod concurrency;
pub(crate) mod fleet;
mod gate;
pub mod headers;
mod ietf;
mod reading;
mod snapshot;
mod state;
mod table;
pub mod values;

pub(crate) use admission::Cell;
pub use admission::{Admission, Reservation, StopWhy, Ticket, Usage};
pub use concurrency::{AdaptiveConcurrency, AimdConfig, Feedback, Permit};
pub(crate) use gate::GatePermit;
pub use reading::{Kind, Reading, Window};
pub use snapshot::{ConcurrencySnapshot, KindSnapshot, RateLimitCounters, RateLimitSnapshot, ScopeSnapshot};
pub(crate) use table::Asker;
pub use table::{RateLimitConfig, RateLimits};

#[cfg(test)]
mod tests;
