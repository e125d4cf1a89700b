//! A limit no header states, learned from refusals: the table against a
//! simulated provider that sends no rate-limit headers (Gemini) or only
//! refusals with a wait, offered twice its limit, beside a jitter-only owner
//! offered the same load.

use super::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// How the simulated provider counts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Count {
    /// Back-to-back windows from the first request.
    Fixed,
    /// A bucket of `limit`, refilled at `limit` per window, full at first.
    Bucket,
}

/// What a refusal says of its wait: whole seconds rounded up (Gemini's
/// `retryDelay`, `Retry-After`) or milliseconds (Azure's `retry-after-ms`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Hint {
    Secs,
    Millis,
}

struct Provider {
    count: Count,
    limit: u64,
    window: u64,
    start: Option<u64>,
    used: u64,
    /// Bucket level in ns of refill (a unit is `window / limit`).
    level: u64,
    since: u64,
}

impl Provider {
    fn new(count: Count, limit: u64, window: u64) -> Self {
        Provider {
            count,
            limit,
            window,
            start: None,
            used: 0,
            level: window,
            since: 0,
        }
    }

    /// `None`: taken; `Some(wait)`: refused until room comes back.
    fn take(&mut self, now: u64, hint: Hint) -> Option<u64> {
        let room = match self.count {
            Count::Fixed => {
                let start = *self.start.get_or_insert(now);
                let n = (now - start) / self.window;
                if n > 0 {
                    self.start = Some(start + n * self.window);
                    self.used = 0;
                }
                if self.used < self.limit {
                    self.used += 1;
                    return None;
                }
                self.start.unwrap() + self.window - now
            }
            Count::Bucket => {
                let tau = self.window / self.limit;
                self.level = (self.level + (now - self.since)).min(self.window);
                self.since = now;
                if self.level >= tau {
                    self.level -= tau;
                    return None;
                }
                tau - self.level
            }
        };
        Some(match hint {
            Hint::Secs => room.div_ceil(S).max(1) * S,
            Hint::Millis => room.div_ceil(MS).max(1) * MS,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A caller asks to send (or, jitter-only, sends).
    Ask(usize),
    /// Its attempt reaches the provider.
    Arrive(usize),
    /// Its answer: refused with a wait, or taken.
    Answer(usize, Option<u64>),
}

#[derive(Default)]
struct Caller {
    deadline: u64,
    attempts: u32,
    res: Option<Reservation>,
    ticket: Option<Ticket>,
}

/// Each way of owning retries, offered `2 L` a window for `windows` windows,
/// each call with a deadline of one window and five attempts: the refusals
/// (429s) the provider sent after the first window, and the calls taken per window.
fn run(count: Count, hint: Hint, limit: u64, window: u64, windows: u64, paced: bool) -> (u64, Vec<u64>) {
    const LATENCY: u64 = 25 * MS;
    let table = RateLimits::default();
    let mut rng = rng();
    let mut provider = Provider::new(count, limit, window);
    let n = (2 * limit * windows) as usize;
    let gap = window / (2 * limit);
    let mut callers: Vec<Caller> = (0..n)
        .map(|i| Caller {
            deadline: i as u64 * gap + window,
            ..Default::default()
        })
        .collect();
    let mut queue = BinaryHeap::new();
    // Events by time, then in the order they were made.
    let mut seq = 0u64;
    let mut push = |q: &mut BinaryHeap<Reverse<(u64, u64, Ev)>>, at: u64, ev: Ev| {
        seq += 1;
        q.push(Reverse((at, seq, ev)));
    };
    for i in 0..n {
        push(&mut queue, i as u64 * gap, Ev::Ask(i));
    }
    let (mut refused_later, mut taken) = (0u64, vec![0u64; windows as usize]);
    while let Some(Reverse((t, _, ev))) = queue.pop() {
        match ev {
            Ev::Ask(i) => {
                let c = &mut callers[i];
                if t >= c.deadline {
                    continue;
                }
                if !paced {
                    push(&mut queue, t + LATENCY, Ev::Arrive(i));
                    continue;
                }
                let left = Duration::from_nanos(c.deadline - t);
                match table.admit(SCOPE, t, none(), left, c.ticket.take(), &mut rng) {
                    Admission::Go(res) => {
                        c.res = Some(res);
                        push(&mut queue, t + LATENCY, Ev::Arrive(i));
                    }
                    Admission::Wait { wait, ticket } => {
                        c.ticket = Some(ticket);
                        push(&mut queue, t + wait.as_nanos() as u64, Ev::Ask(i));
                    }
                    Admission::Stop(_) => {}
                }
            }
            Ev::Arrive(i) => {
                let answer = provider.take(t, hint);
                if answer.is_some() && t >= window {
                    refused_later += 1;
                }
                if answer.is_none() && t / window < windows {
                    taken[(t / window) as usize] += 1;
                }
                push(&mut queue, t + LATENCY, Ev::Answer(i, answer));
            }
            Ev::Answer(i, wait) => {
                let c = &mut callers[i];
                if let Some(res) = c.res.take() {
                    let reading = match wait {
                        None => Reading::default().answered(),
                        Some(w) => Reading::default().rate_limited().retry_delay(Duration::from_nanos(w)),
                    };
                    table.settle(SCOPE, res, &reading, Usage::sent(), t);
                }
                let Some(w) = wait else { continue };
                c.attempts += 1;
                // The server's wait, and (jitter-only) a jitter of up to half of it more.
                let jitter = if paced { 0 } else { rng.gen_range(0..=w / 2) };
                if c.attempts < 5 && t + w + jitter < c.deadline {
                    push(&mut queue, t + w + jitter, Ev::Ask(i));
                }
            }
        }
    }
    (refused_later, taken)
}

#[test]
fn a_limit_no_header_states_is_learned_from_refusals() {
    for (count, hint, limit, window) in [
        (Count::Fixed, Hint::Secs, 20, 6 * S),
        (Count::Bucket, Hint::Secs, 20, 6 * S),
        (Count::Fixed, Hint::Secs, 30, 60 * S),
        (Count::Bucket, Hint::Secs, 30, 60 * S),
        (Count::Bucket, Hint::Millis, 30, 60 * S),
        (Count::Fixed, Hint::Millis, 30, 60 * S),
    ] {
        let (jitter, _) = run(count, hint, limit, window, 3, false);
        let (paced, taken) = run(count, hint, limit, window, 3, true);
        let case = format!("{count:?} {hint:?} {limit} per {} s", window / S);
        println!(
            "{case}: 429s after the first window: jitter-only {jitter}, paced {paced}; taken per window {taken:?}"
        );
        assert!(jitter >= limit, "{case}: the load does not overload ({jitter} 429s)");
        assert!(
            paced <= jitter / 10,
            "{case}: {paced} 429s after the first window against jitter-only's {jitter}"
        );
    }
}
