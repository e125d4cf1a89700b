//! What the fleet may do to a breaker cell (`state/fleet/`): read the end
//! of its open period, open a closed one, extend an open one and close one
//! whose open the fleet's probe ended. Each takes the cell's lock and
//! leaves a half-open breaker alone: probes in flight decide it locally.

use super::{BreakerCell, BreakerParams, BreakerState, State, Transition, OPEN};
use std::sync::atomic::Ordering;

impl BreakerCell {
    /// The end of the open period (engine ms) while the breaker is open,
    /// elapsed or not, before any probe went.
    pub(crate) fn open_until(&self) -> Option<u64> {
        (self.hint.load(Ordering::Acquire) == OPEN).then(|| self.open_until.load(Ordering::Relaxed))
    }

    /// Refuses until `until_ms` (engine ms): a closed breaker opens when
    /// `open_closed` (the fleet reached its quorum); an open one is extended
    /// when that is later than its own end. Returns the transition when a
    /// closed breaker opened, and whether anything changed.
    pub(crate) fn adopt_open(&self, until_ms: u64, now_ms: u64, open_closed: bool) -> (bool, Option<Transition>) {
        if until_ms <= now_ms {
            return (false, None);
        }
        let mut g = self.inner.lock();
        match g.state {
            State::Closed if open_closed => {
                self.set_state(&mut g, State::Open { until_ms });
                let t = Transition {
                    from: BreakerState::Closed,
                    to: BreakerState::Open,
                    reason: "fleet_open",
                    open_for_ms: until_ms - now_ms,
                };
                (true, Some(t))
            }
            State::Open { until_ms: own } if until_ms > own => {
                self.set_state(&mut g, State::Open { until_ms });
                (true, None)
            }
            _ => (false, None),
        }
    }

    /// The fleet's probe succeeded: an open breaker closes (its window and
    /// trip count restart, as after its own probes).
    pub(crate) fn adopt_close(&self, params: &BreakerParams) -> Option<Transition> {
        let mut g = self.lock(params);
        if !matches!(g.state, State::Open { .. }) {
            return None;
        }
        let mut t = self.close(&mut g, params);
        t.from = BreakerState::Open;
        t.reason = "fleet_recovered";
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guards::breaker::{Admit, Record};
    use crate::policy::Breaker as BreakerPolicy;

    fn params() -> BreakerParams {
        BreakerParams::new(&BreakerPolicy {
            min_calls: 2,
            window_size: 4,
            failure_rate: Some(0.5),
            open_jitter: 0.0,
            half_open_probes: 1,
            close_after: 1,
            ..BreakerPolicy::default()
        })
    }

    #[test]
    fn adopt_opens_extends_and_closes_but_leaves_half_open_alone() {
        let p = params();
        let c = BreakerCell::new(p.clone(), 1);
        assert_eq!(
            c.adopt_open(5_000, 1_000, false),
            (false, None),
            "below quorum: stays closed"
        );
        let (changed, t) = c.adopt_open(5_000, 1_000, true);
        assert!(changed && t.is_some_and(|t| t.reason == "fleet_open" && t.open_for_ms == 4_000));
        assert_eq!(c.open_until(), Some(5_000));
        assert!(matches!(
            c.acquire(&p, None, 4_999).0,
            Admit::Rejected { retry_in_ms: 1 }
        ));
        assert_eq!(
            c.adopt_open(4_000, 1_000, true),
            (false, None),
            "an earlier end never shortens"
        );
        assert_eq!(
            c.adopt_open(7_000, 1_000, false),
            (true, None),
            "an open breaker is extended"
        );
        assert_eq!(c.open_until(), Some(7_000));
        assert_eq!(c.adopt_close(&p).map(|t| t.reason), Some("fleet_recovered"));
        assert_eq!(c.state(&p, None, 1_000), BreakerState::Closed);
        assert_eq!(c.open_until(), None);
        // Half-open: the probe in flight decides.
        c.adopt_open(2_000, 1_000, true);
        assert_eq!(c.acquire(&p, None, 2_000).0, Admit::Allowed { probe: true });
        assert_eq!(c.adopt_open(9_000, 2_000, true), (false, None));
        assert_eq!(c.adopt_close(&p), None);
        assert!(c.record(&p, None, 2_100, true, Record::Success, false).is_some());
        assert_eq!(c.state(&p, None, 2_100), BreakerState::Closed);
    }
}
