//! What a scope's merged records mean for this instance: the open the fleet
//! agrees on (quorum), the latest open and recovery, and the provider's
//! rate-limit evidence. Pure functions of the records, the instance's own
//! id, the time and the quorum: the same records give the same view in any
//! order they arrived.

use super::record::{Body, Records, WindowRecord};

/// The fleet's word on one breaker scope, other instances' records only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BreakerView {
    /// A closed breaker opens until then: at least `quorum` distinct
    /// instances reported an open within the window, and this is the
    /// `quorum`-th latest end among them (one instance cannot make the fleet
    /// wait longer than the others say).
    pub quorum_until: Option<u64>,
    /// An open breaker may stay open until then: the latest end of an open
    /// not cancelled by a later recovery.
    pub latest_until: Option<u64>,
    /// The latest recovery (probes succeeded) reported, wall ms.
    pub recovered_at: Option<u64>,
    /// Distinct instances whose open counts toward the quorum.
    pub reporters: u32,
}

/// The breaker view of `records` at `now` (wall ms), leaving out `me`'s own.
pub fn breaker_view(records: &Records, me: &str, now: u64, quorum: u32, window_ms: u64) -> BreakerView {
    let others = || records.iter().filter(|(who, _)| who.as_str() != me).map(|(_, r)| r);
    let recovered_at = others()
        .filter_map(|r| match r.body {
            Body::Closed { expiry } if expiry > now => Some(r.at),
            _ => None,
        })
        .max();
    let live: Vec<(u64, u64)> = others()
        .filter_map(|r| match r.body {
            Body::Open { until, .. } if until > now && recovered_at.is_none_or(|c| r.at > c) => Some((r.at, until)),
            _ => None,
        })
        .collect();
    let mut recent: Vec<u64> = live
        .iter()
        .filter(|(at, _)| at.saturating_add(window_ms) >= now)
        .map(|(_, until)| *until)
        .collect();
    recent.sort_unstable_by(|a, b| b.cmp(a));
    let q = quorum.max(1) as usize;
    BreakerView {
        quorum_until: recent.get(q - 1).copied(),
        latest_until: live.iter().map(|(_, u)| *u).max(),
        recovered_at,
        reporters: recent.len() as u32,
    }
}

/// The fleet's rate-limit evidence for one scope, other instances' records only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitsView {
    /// The latest Retry-After cooldown still running (latest expiry wins).
    pub cooldown_until: Option<u64>,
    /// The latest quota exhaustion still running.
    pub quota_until: Option<u64>,
    /// Per kind, the freshest reading (latest `observed_at`; ties: the lower remaining).
    pub windows: [Option<WindowRecord>; 4],
}

/// The rate-limit view of `records` at `now` (wall ms), leaving out `me`'s own.
pub fn limits_view(records: &Records, me: &str, now: u64) -> LimitsView {
    let mut v = LimitsView::default();
    for (who, r) in records {
        let Body::Limits(l) = &r.body else { continue };
        if who.as_str() == me {
            continue;
        }
        if l.cooldown_until > now {
            v.cooldown_until = v.cooldown_until.max(Some(l.cooldown_until));
        }
        if l.quota_until > now {
            v.quota_until = v.quota_until.max(Some(l.quota_until));
        }
        for (slot, w) in v.windows.iter_mut().zip(&l.windows) {
            let Some(w) = w else { continue };
            let key = |w: &WindowRecord| (w.observed_at, u64::MAX - w.remaining, w.reset_at);
            if slot.is_none_or(|s| key(w) > key(&s)) {
                *slot = Some(*w);
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fleet::record::Record;

    fn open(at: u64, until: u64) -> Record {
        Record {
            at,
            body: Body::Open {
                until,
                reason: "failure_rate".into(),
            },
        }
    }

    fn recs(rs: &[(&str, Record)]) -> Records {
        rs.iter().map(|(w, r)| ((*w).into(), r.clone())).collect()
    }

    #[test]
    fn quorum_takes_the_quorum_th_latest_end_and_recoveries_cancel_earlier_opens() {
        let r = recs(&[
            ("a", open(100, 5_000)),
            ("b", open(200, 9_000)),
            ("me", open(300, 99_000)),
        ]);
        let v = breaker_view(&r, "me", 1_000, 2, 10_000);
        assert_eq!(
            (v.quorum_until, v.latest_until, v.reporters),
            (Some(5_000), Some(9_000), 2)
        );
        // One instance is below a quorum of two; its own records never count.
        let v = breaker_view(&r, "a", 1_000, 3, 10_000);
        assert_eq!((v.quorum_until, v.reporters), (None, 2));
        // Reports older than the window count for extending, not for opening.
        let v = breaker_view(&r, "me", 20_000, 1, 10_000);
        assert_eq!((v.quorum_until, v.latest_until), (None, None), "both ended");
        let far = recs(&[("a", open(100, 50_000))]);
        let v = breaker_view(&far, "me", 20_000, 1, 10_000);
        assert_eq!((v.quorum_until, v.latest_until), (None, Some(50_000)));
        // A recovery after an open cancels it; an open after the recovery stands.
        let mut r = recs(&[("a", open(100, 5_000)), ("b", open(400, 6_000))]);
        r.insert(
            "c".into(),
            Record {
                at: 300,
                body: Body::Closed { expiry: 60_000 },
            },
        );
        let v = breaker_view(&r, "me", 1_000, 1, 10_000);
        assert_eq!(
            (v.quorum_until, v.recovered_at, v.reporters),
            (Some(6_000), Some(300), 1)
        );
    }
}
