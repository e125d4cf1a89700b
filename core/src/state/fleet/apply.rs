//! One completed cycle applied to local cells: breaker scopes through
//! their view (quorum, latest open, recovery), probe leases, rate-limit
//! evidence. Times cross between the store's wall clock (ms) and the
//! engine's monotonic clock (ms for breakers, ns for rate-limit tables)
//! at the instant of the cycle.

use super::record::{decode_fields, Limits, WindowRecord};
use super::view::{breaker_view, limits_view};
use super::{wall_ms, Fleet, InFlight, SyncReport, SyncState};
use crate::clock::ms;
use crate::guards::breaker::Transition;
use crate::state::ratelimit::fleet::{Evidence, WindowState};
use crate::state::scope::display_key;
use crate::telemetry::{BreakerChange, Event, EventKind};

const MS: u64 = 1_000_000;

/// A wall instant (ms) on the engine's clock, in `unit`s (1 for ms, `MS` for ns).
fn to_mono(wall: u64, now_wall: u64, now_mono: u64, unit: u64) -> u64 {
    if wall >= now_wall {
        now_mono.saturating_add((wall - now_wall).saturating_mul(unit))
    } else {
        now_mono.saturating_sub((now_wall - wall).saturating_mul(unit))
    }
}

/// An engine instant (ns) on the wall clock (ms); 0 stays 0 (none).
fn ns_to_wall(t: u64, now_ns: u64, now_wall: u64) -> u64 {
    if t == 0 {
        0
    } else if t >= now_ns {
        now_wall + (t - now_ns) / MS
    } else {
        now_wall.saturating_sub((now_ns - t).div_ceil(MS))
    }
}

/// A table's evidence (engine ns) as a record (wall ms).
pub(super) fn to_wall(e: &Evidence, now_ns: u64, now_wall: u64) -> Limits {
    let w = |t| ns_to_wall(t, now_ns, now_wall);
    Limits {
        cooldown_until: w(e.cooldown_until),
        quota_until: w(e.quota_until),
        windows: e.windows.map(|x| {
            x.map(|x| WindowRecord {
                limit: x.limit,
                remaining: x.remaining,
                reset_at: w(x.reset_at),
                observed_at: w(x.observed_at),
                window: x.window.map(|d| d / MS),
            })
        }),
    }
}

/// A record's evidence (wall ms) on a table's clock (engine ns).
fn to_evidence(l: &super::view::LimitsView, now_ns: u64, now_wall: u64) -> Evidence {
    let m = |t: u64| to_mono(t, now_wall, now_ns, MS);
    Evidence {
        cooldown_until: l.cooldown_until.map_or(0, m),
        quota_until: l.quota_until.map_or(0, m),
        windows: l.windows.map(|x| {
            x.map(|x| WindowState {
                limit: x.limit,
                remaining: x.remaining,
                reset_at: m(x.reset_at),
                observed_at: m(x.observed_at),
                window: x.window.map(|d| d.saturating_mul(MS)),
            })
        }),
    }
}

/// Applies one cycle's answers (see [`Fleet::complete`]).
pub(super) fn cycle(
    fleet: &Fleet,
    st: &mut SyncState,
    f: &InFlight,
    reads: &[Vec<(String, String)>],
    claims: &[Option<String>],
) -> SyncReport {
    let sh = &fleet.shared;
    let cfg = &fleet.cfg;
    let (now_wall, now_ns) = (wall_ms(sh), sh.clock.now_ns().0);
    let now_ms = now_ns / MS;
    let version = (fleet.version)();
    let params = &version.breaker;
    let cap = now_ms.saturating_add(version.policy.breaker.open_max_ms);
    let mut r = SyncReport::default();
    let mut changes: Vec<(&str, Transition)> = Vec::new();
    for (key, fields) in f.breakers.iter().zip(reads) {
        let records = decode_fields(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let v = breaker_view(&records, &cfg.instance, now_wall, cfg.quorum, ms(cfg.quorum_window));
        let Some(cell) = sh.breakers.get(key) else { continue };
        let cell = &cell.value;
        let mono = |wall: u64| to_mono(wall, now_wall, now_ms, 1).min(cap);
        if cell.open_until().is_some() {
            let since = fleet.outbox.opened_at(key).max(st.since.get(key).copied()).unwrap_or(0);
            if v.recovered_at.is_some_and(|c| c > since) && v.latest_until.is_none() {
                if let Some(t) = cell.adopt_close(params) {
                    st.since.remove(key);
                    st.claimed.remove(key);
                    r.recovered += 1;
                    changes.push((key, t));
                }
            } else if let Some(u) = v.latest_until {
                r.extended += cell.adopt_open(mono(u), now_ms, false).0 as u32;
            }
        } else if let Some(u) = v.quorum_until.filter(|_| cell.is_closed()) {
            if let (_, Some(t)) = cell.adopt_open(mono(u), now_ms, true) {
                st.since.insert(key.clone(), now_wall);
                r.opened += 1;
                changes.push((key, t));
            }
        }
    }
    let grace = ms(cfg.interval + cfg.timeout + cfg.interval);
    for ((key, until, _end), answer) in f.claims.iter().zip(claims) {
        let holder = answer
            .as_deref()
            .and_then(|v| v.rsplit_once(' '))
            .and_then(|(who, end)| Some((who, end.parse::<u64>().ok()?)));
        match holder {
            Some((who, end)) if who != cfg.instance => {
                r.leases_lost += 1;
                if let Some(cell) = sh.breakers.get(key) {
                    // Open until the holder's lease ends, plus a cycle to claim the next one.
                    let hold = to_mono(end, now_wall, now_ms, 1).saturating_add(grace);
                    r.extended += cell.value.adopt_open(hold, now_ms, false).0 as u32;
                }
            }
            _ => {
                r.leases_won += 1;
                st.claimed.insert(key.clone(), *until);
            }
        }
    }
    let tables = fleet.tables.lock().clone();
    let nb = f.breakers.len();
    for ((table, scope), fields) in f.limits.iter().zip(&reads[nb..]) {
        let records = decode_fields(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let v = limits_view(&records, &cfg.instance, now_wall);
        if v == Default::default() {
            continue;
        }
        if let Some(t) = tables.get(*table) {
            r.limits += t.adopt(scope, &to_evidence(&v, now_ns, now_wall), now_ns) as u32;
        }
    }
    if sh.bus.active() {
        for (key, t) in changes {
            let mut e = Event::new(EventKind::BreakerTransition, now_ms, version.version.clone());
            e.breaker = Some(BreakerChange {
                key: display_key(key).to_string(),
                from: t.from.as_str(),
                to: t.to.as_str(),
                reason: t.reason,
                open_for_ms: t.open_for_ms,
            });
            sh.bus.emit(e);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_and_engine_instants_convert_both_ways() {
        assert_eq!(to_mono(1_500, 1_000, 20, 1), 520);
        assert_eq!(to_mono(500, 1_000, 20, 1), 0, "before the engine clock began");
        assert_eq!(to_mono(1_002, 1_000, 5 * MS, MS), 7 * MS);
        assert_eq!(ns_to_wall(7 * MS, 5 * MS, 1_000), 1_002);
        assert_eq!(ns_to_wall(3 * MS + 1, 5 * MS, 1_000), 998);
        assert_eq!(ns_to_wall(0, 5 * MS, 1_000), 0);
    }
}
