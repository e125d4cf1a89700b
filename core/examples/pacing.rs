//! Provider-limit pacing on simulated time: one scope whose provider allows
//! `L` requests per minute, offered `2 L` calls per minute (one every
//! 30/L s), each with a 60 s deadline. Every attempt goes through
//! `RateLimits::admit`; the provider counts it `latency / 10` after it is sent
//! and its response (with OpenAI-style headers) arrives `latency` after it is
//! sent. A refused call asks again at once (admission paces it). Prints the
//! 429s sent, the calls completed per minute after the first minute (against
//! `L`), the calls stopped by their deadline, and the paced waits.
//!
//! Usage: `pacing [L] [LATENCY_MS] [bucket|window]` (defaults 60, 1000,
//! bucket). `bucket`: a token bucket of `L` refilled continuously, whose reset
//! is the time until it is full (OpenAI, Anthropic); `window`: fixed windows of
//! one minute, whose reset is the end of the window.

use rand::SeedableRng;
use retrywise::ratelimit::{Admission, RateLimits, Reading, Reservation, Ticket, Usage};
use retrywise::rules::deadline::TokenEstimate;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, UNIX_EPOCH};

const S: u64 = 1_000_000_000;
const MINUTE: u64 = 60 * S;
const SCOPE: &str = "key/openai/gpt-4o";

#[derive(Clone, Copy)]
enum Step {
    Try,
    Receive,
    Respond,
}

/// The provider's limiter.
struct Provider {
    limit: f64,
    bucket: bool,
    level: f64,
    at: u64,
}

impl Provider {
    /// Counts a request received at `now`: whether it is allowed, and the headers to answer with.
    fn receive(&mut self, now: u64) -> (bool, [(&'static str, String); 3]) {
        let (ok, remaining, reset) = if self.bucket {
            let rate = self.limit / 60.0;
            self.level = (self.level + (now - self.at) as f64 / S as f64 * rate).min(self.limit);
            self.at = now;
            let ok = self.level >= 1.0;
            if ok {
                self.level -= 1.0;
            }
            (ok, self.level.floor(), (self.limit - self.level) / rate)
        } else {
            let start = now / MINUTE * MINUTE;
            if start != self.at {
                (self.at, self.level) = (start, 0.0);
            }
            let ok = self.level + 1.0 <= self.limit;
            if ok {
                self.level += 1.0;
            }
            (ok, self.limit - self.level, (start + MINUTE - now) as f64 / S as f64)
        };
        let headers = [
            ("x-ratelimit-limit-requests", format!("{}", self.limit)),
            ("x-ratelimit-remaining-requests", format!("{remaining}")),
            ("x-ratelimit-reset-requests", format!("{reset:.3}s")),
        ];
        (ok, headers)
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let limit: u64 = args.next().map_or(60, |a| a.parse().expect("L"));
    let latency: u64 = args.next().map_or(1000, |a| a.parse().expect("LATENCY_MS")) * 1_000_000;
    let bucket = args.next().is_none_or(|m| m != "window");
    let horizon = 10 * MINUTE;
    let calls = (horizon / (30 * S / limit)) as usize;
    let limits = RateLimits::default();
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(1);
    let wall = UNIX_EPOCH + Duration::from_secs(1_735_689_600);
    let mut provider = Provider {
        limit: limit as f64,
        bucket,
        level: if bucket { limit as f64 } else { 0.0 },
        at: 0,
    };
    let mut queue: BinaryHeap<Reverse<(u64, usize, u8)>> = BinaryHeap::new();
    let steps = [Step::Try, Step::Receive, Step::Respond];
    for c in 0..calls {
        queue.push(Reverse((c as u64 * 30 * S / limit, c, 0)));
    }
    let deadline = |c: usize| c as u64 * 30 * S / limit + MINUTE;
    let mut tickets: Vec<Option<Ticket>> = (0..calls).map(|_| None).collect();
    let mut held: Vec<Option<Reservation>> = (0..calls).map(|_| None).collect();
    let mut answers: Vec<Option<(bool, Reading)>> = (0..calls).map(|_| None).collect();
    let (mut refused, mut stopped, mut completed) = (0u64, 0u64, 0u64);
    while let Some(Reverse((now, c, step))) = queue.pop() {
        match steps[step as usize] {
            Step::Try => {
                let left = Duration::from_nanos(deadline(c).saturating_sub(now));
                match limits.admit(SCOPE, now, TokenEstimate::default(), left, tickets[c].take(), &mut rng) {
                    Admission::Go(r) => {
                        held[c] = Some(r);
                        queue.push(Reverse((now + latency / 10, c, 1)));
                    }
                    Admission::Wait { wait, ticket } => {
                        tickets[c] = Some(ticket);
                        queue.push(Reverse((now + wait.as_nanos() as u64, c, 0)));
                    }
                    Admission::Stop(_) => stopped += 1,
                }
            }
            Step::Receive => {
                let (ok, headers) = provider.receive(now);
                let reading = Reading::parse(headers.iter().map(|(k, v)| (*k, v.as_str())), wall);
                refused += u64::from(!ok);
                answers[c] = Some((ok, if ok { reading } else { reading.rate_limited() }));
                queue.push(Reverse((now + latency - latency / 10, c, 2)));
            }
            Step::Respond => {
                let (ok, reading) = answers[c].take().expect("received");
                let res = held[c].take().expect("admitted");
                limits.settle(SCOPE, res, &reading, Usage::sent(), now);
                if ok {
                    completed += u64::from(now >= MINUTE && now < horizon);
                } else {
                    queue.push(Reverse((now, c, 0)));
                }
            }
        }
    }
    let per_minute = completed as f64 / ((horizon - MINUTE) / MINUTE) as f64;
    println!(
        "L={limit}/min {} latency={}ms offered={calls} calls: 429s={refused} completed/min={per_minute:.1} ({:.1}% of L) stopped={stopped} paced_waits={}",
        if bucket { "bucket" } else { "window" },
        latency / 1_000_000,
        per_minute / limit as f64 * 100.0,
        limits.counters().paced_waits,
    );
}
