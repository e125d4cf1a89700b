//! Events as calls record them: [`Rec`], the compact record the rings
//! store, and [`Hot`], an attempt's start or end borrowed from its call; an
//! [`Event`] is built from a record only when a sink or a snapshot asks.

use super::ring;
use super::{AttemptId, BreakerChange, Event, EventKind};
use crate::id::CallId;
use crate::types::{Action, ErrorClass, ErrorKind, Phase, Reason, WaitSource};
use smol_str::SmolStr;
use std::sync::Arc;

/// The rarely present parts of an event, boxed so a record stays small.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Extra {
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) breaker: Option<BreakerChange>,
    pub(crate) detail: Option<String>,
    pub(crate) excluded: Vec<(String, String)>,
}

/// A decision folded into the attempt-end record it directly follows: one
/// record, two events (the common end of an attempt costs one ring slot).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Then {
    pub(crate) action: Action,
    pub(crate) reason: Reason,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) remaining_ms: u64,
    pub(crate) delay_ms: u64,
    pub(crate) wait_source: WaitSource,
}

impl Then {
    /// The call succeeded, `remaining_ms` before its deadline.
    #[inline(always)]
    pub(crate) fn success(remaining_ms: u64) -> Then {
        Then {
            action: Action::Succeeded,
            reason: Reason::Success,
            error_class: None,
            remaining_ms,
            delay_ms: 0,
            wait_source: WaitSource::None,
        }
    }
}

/// An attempt's start or end borrowed from its call: the two events every
/// attempt records, encoded into the ring without building a [`Rec`].
#[derive(Debug, Clone)]
pub(crate) struct Hot<'a> {
    /// `AttemptStart`, `Hedge` or `AttemptEnd`.
    pub(crate) kind: EventKind,
    pub(crate) at_ns: u64,
    pub(crate) version: u32,
    pub(crate) id: &'a CallId,
    pub(crate) upstream: &'a SmolStr,
    /// `upstream` as a ring slot stores it (`None`: too long for one), packed once per upstream.
    pub(crate) up_packed: Option<ring::Packed>,
    pub(crate) tenant: Option<&'a SmolStr>,
    pub(crate) task: Option<&'a SmolStr>,
    pub(crate) attempt: u32,
    /// A start names the attempt before it (`parent_attempt`); an end does not.
    pub(crate) start: bool,
    pub(crate) hedge: bool,
    pub(crate) status: Option<u16>,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) reason: Option<Reason>,
    pub(crate) phase: Option<Phase>,
    pub(crate) error_kind: Option<ErrorKind>,
    pub(crate) delay_ms: Option<u64>,
    pub(crate) remaining_ms: u64,
}

impl Hot<'_> {
    /// The fields an attempt's end writes into its start record.
    #[cfg(test)]
    pub(crate) fn end(&self) -> ring::End {
        ring::End {
            at_ns: self.at_ns,
            status: self.status,
            error_class: self.error_class,
            reason: self.reason,
            phase: self.phase,
            error_kind: self.error_kind,
            hedge: self.hedge,
            remaining_ms: self.remaining_ms,
            delay_ms: self.delay_ms.unwrap_or(0),
        }
    }

    /// The same event as a record (sinks, the shared ring, the side list).
    pub(crate) fn to_rec(&self) -> Rec {
        let n = self.attempt;
        Rec {
            id: Some(self.id.clone()),
            upstream: Some(self.upstream.clone()),
            tenant: self.tenant.cloned(),
            task: self.task.cloned(),
            attempt: Some(n),
            attempt_id: Some(n),
            parent_attempt: (self.start && n > 1).then(|| n - 1),
            resend_count: Some(n.saturating_sub(1)),
            status: self.status,
            error_class: self.error_class,
            reason: self.reason,
            phase: self.phase,
            error_kind: self.error_kind,
            hedge: self.hedge,
            delay_ms: self.delay_ms,
            remaining_ms: Some(self.remaining_ms),
            ..Rec::new(self.kind, self.at_ns, self.version)
        }
    }
}

/// An event as the ring stores it: fixed-size fields, names inline (see
/// [`SmolStr`]), the policy version as an index into the bus's name table.
#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub(crate) at_ns: u64,
    pub(crate) seq: u64,
    pub(crate) kind: EventKind,
    pub(crate) version: u32,
    pub(crate) id: Option<CallId>,
    pub(crate) upstream: Option<SmolStr>,
    pub(crate) tenant: Option<SmolStr>,
    pub(crate) task: Option<SmolStr>,
    pub(crate) attempt: Option<u32>,
    /// Attempt number of `attempt_id` (`<id>.<n>`).
    pub(crate) attempt_id: Option<u32>,
    pub(crate) parent_attempt: Option<u32>,
    pub(crate) resend_count: Option<u32>,
    pub(crate) status: Option<u16>,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) reason: Option<Reason>,
    pub(crate) action: Option<Action>,
    pub(crate) wait_source: Option<WaitSource>,
    pub(crate) phase: Option<Phase>,
    pub(crate) error_kind: Option<ErrorKind>,
    pub(crate) hedge: bool,
    pub(crate) delay_ms: Option<u64>,
    pub(crate) remaining_ms: Option<u64>,
    pub(crate) extra: Option<Box<Extra>>,
    /// A `Decision` event that directly follows this `AttemptEnd`.
    pub(crate) then: Option<Then>,
    /// Only the folded decision is left to deliver (a drain took the rest).
    pub(crate) only_then: bool,
}

impl Rec {
    /// A record with only the common fields set.
    #[inline(always)]
    pub(crate) fn new(kind: EventKind, at_ns: u64, version: u32) -> Self {
        Rec {
            at_ns,
            seq: 0,
            kind,
            version,
            id: None,
            upstream: None,
            tenant: None,
            task: None,
            attempt: None,
            attempt_id: None,
            parent_attempt: None,
            resend_count: None,
            status: None,
            error_class: None,
            reason: None,
            action: None,
            wait_source: None,
            phase: None,
            error_kind: None,
            hedge: false,
            delay_ms: None,
            remaining_ms: None,
            extra: None,
            then: None,
            only_then: false,
        }
    }

    /// Events this record stands for (1, or 2 with a folded decision).
    pub(crate) fn events(&self) -> u64 {
        1 + self.then.is_some() as u64 - self.only_then as u64
    }

    pub(super) fn push_events(&self, names: &[Arc<str>], out: &mut Vec<Event>) {
        let first = self.to_event(names);
        let then = self.then.map(|t| {
            let mut d = Event::new(EventKind::Decision, first.at_ms, first.policy_version.clone());
            d.seq = first.seq + 1;
            d.logical_request_id = first.logical_request_id.clone();
            d.attempt_id = first.attempt_id.clone();
            d.attempt = first.attempt;
            d.resend_count = first.resend_count;
            d.upstream = first.upstream.clone();
            d.tenant = first.tenant.clone();
            d.task = first.task.clone();
            d.error_class = t.error_class;
            d.reason = Some(t.reason);
            d.action = Some(t.action);
            d.delay_ms = Some(t.delay_ms);
            d.wait_source = Some(t.wait_source);
            d.remaining_ms = Some(t.remaining_ms);
            d.hedge = first.hedge;
            d
        });
        if !self.only_then {
            out.push(first);
        }
        out.extend(then);
    }

    /// The boxed rare fields, created on first use.
    pub(crate) fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    fn to_event(&self, names: &[Arc<str>]) -> Event {
        let logical: Option<Arc<str>> = self.id.as_ref().map(|i| Arc::from(i.text().as_str()));
        let aid = |n: Option<u32>| {
            n.zip(logical.clone())
                .map(|(attempt, logical)| AttemptId { logical, attempt })
        };
        let x = self.extra.as_deref();
        Event {
            seq: self.seq,
            at_ms: self.at_ns / 1_000_000,
            kind: self.kind,
            policy_version: names
                .get(self.version as usize)
                .cloned()
                .unwrap_or_else(|| Arc::from("")),
            attempt_id: aid(self.attempt_id),
            parent_attempt_id: aid(self.parent_attempt),
            logical_request_id: logical.clone(),
            attempt: self.attempt,
            resend_count: self.resend_count,
            upstream: self.upstream.as_deref().map(Arc::from),
            tenant: self.tenant.as_deref().map(Arc::from),
            task: self.task.as_deref().map(Arc::from),
            error_class: self.error_class,
            reason: self.reason,
            action: self.action,
            delay_ms: self.delay_ms,
            wait_source: self.wait_source,
            remaining_ms: self.remaining_ms,
            phase: self.phase,
            status: self.status,
            error_kind: self.error_kind,
            hedge: self.hedge,
            headers: x.map(|x| x.headers.clone()).unwrap_or_default(),
            breaker: x.and_then(|x| x.breaker.clone()),
            detail: x.and_then(|x| x.detail.clone()),
            excluded: x.map(|x| x.excluded.clone()).unwrap_or_default(),
        }
    }
}
