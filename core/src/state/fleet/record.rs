//! The delta format: one record per (scope, instance), as text, and the
//! merge of record sets.
//!
//! A scope's records are a map from instance id to that instance's latest
//! record; two maps merge field by field, the later record (by `at`, then by
//! its text) winning. A map of last-writer-wins registers is a join
//! semilattice, so the merge is commutative, associative and idempotent: any
//! instance that has seen the same records, in any order and any number of
//! times, holds the same map. What an instance *does* with a map (quorum,
//! latest expiry) is computed from it in `view.rs`.
//!
//! Text, not binary: a record is read by Redis's Lua (its leading `at` is the
//! write's rank) and by people running `HGETALL` while debugging.

use smol_str::SmolStr;
use std::collections::BTreeMap;

/// What one instance last said about a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Its breaker opened on its own evidence (a trip or a failed probe),
    /// refusing until `until` (wall ms).
    Open {
        /// End of the open period, wall ms.
        until: u64,
        /// The breaker's reason (`failure_rate`, `probe_failed`, ...).
        reason: SmolStr,
    },
    /// Its probes succeeded: the upstream recovered. Cancels every open
    /// reported before it; the record lives until `expiry` so that it
    /// outlives the opens it cancels.
    Closed {
        /// When the record may be forgotten, wall ms.
        expiry: u64,
    },
    /// Provider rate-limit state it read from its own responses.
    Limits(Box<Limits>),
}

/// One instance's rate-limit evidence for a scope (wall ms throughout).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits {
    /// A 429's Retry-After asked every caller to wait until then (0: none).
    pub cooldown_until: u64,
    /// A quota (per day, billing) is exhausted until then (0: none).
    pub quota_until: u64,
    /// Per kind (requests, tokens, input tokens, output tokens): the last reading.
    pub windows: [Option<WindowRecord>; 4],
}

/// One kind's reading: what the provider said remained, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRecord {
    /// The limit, when stated.
    pub limit: Option<u64>,
    /// Units remaining in the window.
    pub remaining: u64,
    /// When the window resets, wall ms.
    pub reset_at: u64,
    /// When the reading was taken, wall ms.
    pub observed_at: u64,
    /// The window's length, ms, when stated.
    pub window: Option<u64>,
}

/// A record: when it was made (wall ms, the instance's clock) and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When the instance made it, wall ms; its rank among the instance's records.
    pub at: u64,
    /// What it says.
    pub body: Body,
}

impl Record {
    /// The instant after which the record says nothing (the TTL of its key).
    pub fn expiry(&self) -> u64 {
        match &self.body {
            Body::Open { until, .. } => *until,
            Body::Closed { expiry } => *expiry,
            Body::Limits(l) => l
                .windows
                .iter()
                .flatten()
                .map(|w| w.reset_at)
                .chain([l.cooldown_until, l.quota_until])
                .max()
                .unwrap_or(0),
        }
    }

    /// The record as stored: `<at> o <until> <reason>`, `<at> c <expiry>` or
    /// `<at> r <cooldown> <quota> <w0> <w1> <w2> <w3>`, where a window is `-`
    /// or `limit,remaining,reset_at,observed_at,window` (`-` for an unknown
    /// limit or window).
    pub fn encode(&self) -> String {
        let at = self.at;
        match &self.body {
            Body::Open { until, reason } => format!("{at} o {until} {reason}"),
            Body::Closed { expiry } => format!("{at} c {expiry}"),
            Body::Limits(l) => {
                let mut s = format!("{at} r {} {}", l.cooldown_until, l.quota_until);
                for w in &l.windows {
                    s.push(' ');
                    match w {
                        None => s.push('-'),
                        Some(w) => {
                            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
                            s.push_str(&format!(
                                "{},{},{},{},{}",
                                opt(w.limit),
                                w.remaining,
                                w.reset_at,
                                w.observed_at,
                                opt(w.window)
                            ));
                        }
                    }
                }
                s
            }
        }
    }

    /// Parses a stored record; `None` for anything malformed (a record
    /// written by a newer version, or not by retrywise, is ignored).
    pub fn decode(s: &str) -> Option<Record> {
        let mut it = s.split(' ');
        let at = it.next()?.parse().ok()?;
        let body = match it.next()? {
            "o" => Body::Open {
                until: it.next()?.parse().ok()?,
                reason: SmolStr::new(it.next()?),
            },
            "c" => Body::Closed {
                expiry: it.next()?.parse().ok()?,
            },
            "r" => {
                let cooldown_until = it.next()?.parse().ok()?;
                let quota_until = it.next()?.parse().ok()?;
                let mut windows = [None; 4];
                for w in windows.iter_mut() {
                    *w = window(it.next()?)?;
                }
                Body::Limits(Box::new(Limits {
                    cooldown_until,
                    quota_until,
                    windows,
                }))
            }
            _ => return None,
        };
        if it.next().is_some() {
            return None;
        }
        Some(Record { at, body })
    }

    /// True when `self` wins over `other` as the same instance's record:
    /// the later one, ties broken by the text (any total order would do).
    pub fn supersedes(&self, other: &Record) -> bool {
        (self.at, self.encode()) > (other.at, other.encode())
    }
}

/// `-` → `Some(None)`; a window's five fields → `Some(Some(w))`; malformed → `None`.
fn window(s: &str) -> Option<Option<WindowRecord>> {
    if s == "-" {
        return Some(None);
    }
    let f: Vec<&str> = s.split(',').collect();
    if f.len() != 5 {
        return None;
    }
    let opt = |v: &str| -> Option<Option<u64>> {
        if v == "-" {
            Some(None)
        } else {
            v.parse().ok().map(Some)
        }
    };
    Some(Some(WindowRecord {
        limit: opt(f[0])?,
        remaining: f[1].parse().ok()?,
        reset_at: f[2].parse().ok()?,
        observed_at: f[3].parse().ok()?,
        window: opt(f[4])?,
    }))
}

/// One scope's records: instance id → its latest record.
pub type Records = BTreeMap<SmolStr, Record>;

/// Merges `other` into `into`: per instance, the superseding record stays.
pub fn merge(into: &mut Records, other: &Records) {
    for (who, r) in other {
        match into.get(who) {
            Some(cur) if !r.supersedes(cur) => {}
            _ => {
                into.insert(who.clone(), r.clone());
            }
        }
    }
}

/// Decodes a Redis hash's fields (instance → stored text), skipping malformed ones.
pub fn decode_fields<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Records {
    let mut out = Records::new();
    for (who, v) in fields {
        if let Some(r) = Record::decode(v) {
            let one: Records = [(SmolStr::new(who), r)].into_iter().collect();
            merge(&mut out, &one);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_malformed_ones_are_ignored() {
        let open = Record {
            at: 1_700_000_000_123,
            body: Body::Open {
                until: 1_700_000_005_123,
                reason: "failure_rate".into(),
            },
        };
        assert_eq!(open.encode(), "1700000000123 o 1700000005123 failure_rate");
        let closed = Record {
            at: 5,
            body: Body::Closed { expiry: 9 },
        };
        let mut l = Limits {
            cooldown_until: 20,
            quota_until: 0,
            ..Limits::default()
        };
        l.windows[0] = Some(WindowRecord {
            limit: Some(60),
            remaining: 0,
            reset_at: 30,
            observed_at: 10,
            window: None,
        });
        let limits = Record {
            at: 10,
            body: Body::Limits(Box::new(l)),
        };
        assert_eq!(limits.encode(), "10 r 20 0 60,0,30,10,- - - -");
        for r in [&open, &closed, &limits] {
            assert_eq!(Record::decode(&r.encode()).as_ref(), Some(r));
        }
        assert_eq!(
            (open.expiry(), closed.expiry(), limits.expiry()),
            (1_700_000_005_123, 9, 30)
        );
        for bad in [
            "",
            "x o 1 r",
            "1 o 1",
            "1 z 3",
            "1 c 2 3",
            "1 r 1 2 - - -",
            "1 r 1 2 1,2 - - -",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad:?}");
        }
    }
}
