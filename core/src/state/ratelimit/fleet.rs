//! What a fleet (`state/fleet/`) reads from and gives to the table: the
//! scopes with new evidence, a scope's evidence on the table's clock, and
//! remote evidence applied through the same rules as a local reading.
//! Nothing here runs unless a fleet is attached: the table's own paths pay
//! one relaxed load.

use super::reading::{Kind, Window};
use super::table::RateLimits;
use parking_lot::Mutex;
use smol_str::SmolStr;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Scopes with new evidence since the fleet last looked.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    on: AtomicBool,
    scopes: Mutex<BTreeSet<SmolStr>>,
}

impl Changes {
    /// Notes that `scope` took a reading (only while a fleet is attached).
    #[inline]
    pub(crate) fn mark(&self, scope: &str) {
        if self.on.load(Ordering::Relaxed) {
            self.scopes.lock().insert(SmolStr::new(scope));
        }
    }
}

/// One kind's reading on the table's clock (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowState {
    pub(crate) limit: Option<u64>,
    pub(crate) remaining: u64,
    pub(crate) reset_at: u64,
    pub(crate) observed_at: u64,
    pub(crate) window: Option<u64>,
}

/// A scope's evidence on the table's clock (ns; 0: none).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Evidence {
    pub(crate) cooldown_until: u64,
    pub(crate) quota_until: u64,
    pub(crate) windows: [Option<WindowState>; 4],
}

impl RateLimits {
    /// Starts noting changed scopes for a fleet.
    pub(crate) fn fleet_attach(&self) {
        self.changes.on.store(true, Ordering::Relaxed);
    }

    /// The scopes that took a reading since the last call.
    pub(crate) fn take_changed(&self) -> Vec<SmolStr> {
        std::mem::take(&mut *self.changes.scopes.lock()).into_iter().collect()
    }

    /// Every scope tracked.
    pub(crate) fn scope_names(&self) -> Vec<SmolStr> {
        let mut out = Vec::new();
        self.scopes.for_each(|s| out.push(s.key.clone()));
        out
    }

    /// What this process read for `scope`, at `now`: running holds, and the
    /// windows a reading stated (not the full limit assumed at a reset).
    pub(crate) fn evidence(&self, scope: &str, now: u64) -> Option<Evidence> {
        let cell = self.scopes.get(scope)?;
        let mut st = cell.value.state.lock().clone();
        st.roll(now, &self.params);
        let mut e = Evidence {
            cooldown_until: st.cooldown_until * (st.cooldown_until > now) as u64,
            quota_until: st.quota_until.filter(|&u| u > now).unwrap_or(0),
            ..Evidence::default()
        };
        for (w, k) in e.windows.iter_mut().zip(&st.kinds) {
            if let (Some(remaining), None) = (k.remaining, k.rolled_at) {
                *w = Some(WindowState {
                    limit: k.limit,
                    remaining,
                    reset_at: k.reset_at,
                    observed_at: k.observed_at,
                    window: k.window,
                });
            }
        }
        Some(e)
    }

    /// Takes another instance's evidence for a tracked `scope` at `now`: a
    /// cooldown holds the scope's requests until it ends (never longer than
    /// `max_hold` from now, as a local 429 would), a quota hold stops it, and
    /// each reading is taken as a reading of this process's own would be
    /// (newer replaces, older only lowers the same window). True when the
    /// scope's state changed.
    pub(crate) fn adopt(&self, scope: &str, e: &Evidence, now: u64) -> bool {
        let Some(cell) = self.scopes.get(scope) else {
            return false;
        };
        let p = &self.params;
        let mut st = cell.value.state.lock();
        let before = st.clone();
        st.roll(now, p);
        if e.cooldown_until > now {
            let until = e.cooldown_until.min(now.saturating_add(p.max_hold));
            let req = &st.kinds[Kind::Requests.index()];
            if req.remaining != Some(0) || req.reset_at < until {
                st.kinds[Kind::Requests.index()].hold(now, until);
            }
        }
        if e.quota_until > now && st.quota_until.is_none_or(|u| u < e.quota_until) {
            st.quota_until = Some(e.quota_until);
        }
        for (k, w) in st.kinds.iter_mut().zip(&e.windows) {
            let Some(w) = w else { continue };
            let window = Window {
                limit: w.limit,
                remaining: Some(w.remaining),
                reset: Some(Duration::from_nanos(w.reset_at.saturating_sub(w.observed_at))),
                window: w.window.map(Duration::from_nanos),
            };
            k.observe(window, w.observed_at, w.observed_at, p);
        }
        *st != before
    }
}
