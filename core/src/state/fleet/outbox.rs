//! What this instance says: its own latest record per scope, written to the
//! store by the next sync. The breaker's transitions on local evidence land
//! here (through the call that saw them); adopted state never does, so an
//! instance never repeats another's open as its own (a quorum counts
//! evidence, not echoes).

use super::record::{Body, Limits, Record};
use crate::guards::breaker::{BreakerState, Transition};
use parking_lot::Mutex;
use smol_str::SmolStr;
use std::collections::HashMap;

/// Which family of keys a scope belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Space {
    /// A breaker scope (the engine's registry key).
    Breaker,
    /// A rate-limit scope (the table's scope string), with the table's index.
    Limits(usize),
}

#[derive(Debug)]
struct Own {
    rec: Record,
    /// Not yet known to be in the store.
    dirty: bool,
}

/// This instance's records (see the module documentation).
#[derive(Debug)]
pub(crate) struct Outbox {
    own: Mutex<HashMap<(Space, SmolStr), Own>>,
    /// How long a recovery record lives, ms (it must outlive the opens it cancels).
    close_ttl_ms: u64,
}

/// A record to write: its space, scope, and the record.
pub(crate) type Pending = (Space, SmolStr, Record);

impl Outbox {
    pub(crate) fn new(close_ttl_ms: u64) -> Self {
        Outbox {
            own: Mutex::new(HashMap::new()),
            close_ttl_ms,
        }
    }

    /// Sets this instance's record for a scope, stamped no earlier than its
    /// previous one (a wall clock stepping back must not make it lose).
    fn put(&self, space: Space, scope: &str, wall_ms: u64, body: Body) {
        let mut own = self.own.lock();
        let key = (space, SmolStr::new(scope));
        let at = own.get(&key).map_or(wall_ms, |o| wall_ms.max(o.rec.at + 1));
        own.insert(
            key,
            Own {
                rec: Record { at, body },
                dirty: true,
            },
        );
    }

    /// A breaker transition this instance's own calls caused, at `wall_ms`:
    /// an open (a trip or a failed probe) or a recovery. Half-open is not
    /// said: which instance probes is settled by the probe lease.
    pub(crate) fn breaker(&self, key: &str, t: &Transition, wall_ms: u64) {
        let body = match t.to {
            BreakerState::Open => Body::Open {
                until: wall_ms.saturating_add(t.open_for_ms),
                reason: SmolStr::new(t.reason),
            },
            BreakerState::Closed => Body::Closed {
                expiry: wall_ms.saturating_add(self.close_ttl_ms),
            },
            _ => return,
        };
        self.put(Space::Breaker, key, wall_ms, body);
    }

    /// A rate-limit table's evidence for `scope`, read at `wall_ms`.
    pub(crate) fn limits(&self, table: usize, scope: &str, wall_ms: u64, l: Limits) {
        self.put(Space::Limits(table), scope, wall_ms, Body::Limits(Box::new(l)));
    }

    /// When this instance's own breaker record for `key` says it opened (its
    /// own evidence), if that is the record.
    pub(crate) fn opened_at(&self, key: &str) -> Option<u64> {
        let own = self.own.lock();
        let o = own.get(&(Space::Breaker, SmolStr::new(key)))?;
        matches!(o.rec.body, Body::Open { .. }).then_some(o.rec.at)
    }

    /// The records to write (dirty ones), dropping those that expired by `now_wall`.
    pub(crate) fn dirty(&self, now_wall: u64) -> Vec<Pending> {
        let mut own = self.own.lock();
        own.retain(|_, o| o.rec.expiry() > now_wall);
        let mut out: Vec<Pending> = own
            .iter()
            .filter(|(_, o)| o.dirty)
            .map(|((s, k), o)| (*s, k.clone(), o.rec.clone()))
            .collect();
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        out
    }

    /// The store has these records: clean unless changed since.
    pub(crate) fn written(&self, done: &[Pending]) {
        let mut own = self.own.lock();
        for (s, k, r) in done {
            if let Some(o) = own.get_mut(&(*s, k.clone())) {
                if o.rec == *r {
                    o.dirty = false;
                }
            }
        }
    }

    /// Every live record is written again (the store may have lost them).
    pub(crate) fn resend_all(&self) {
        for o in self.own.lock().values_mut() {
            o.dirty = true;
        }
    }

    /// Records held (live or not yet dropped).
    pub(crate) fn len(&self) -> usize {
        self.own.lock().len()
    }
}
