//! Beginning a call: its id, deadline, owner, route and first upstream.

use super::effects::{rec_for, tenant_counters};
use super::upstreams::{match_route, Who};
use super::{Call, CallSpec, Ext, NO_NEEDS};
use crate::clock::Nanos;
use crate::few::Few;
use crate::hot::{thread_up, Begin, Start};
use crate::id::RequestId;
use crate::policy::FallbackMode;
use crate::rules::route::match_candidates;
use crate::telemetry::EventKind;
use crate::types::Reason;
use smol_str::SmolStr;
use std::time::Duration;

impl Call {
    /// `Engine::begin_at` once the thread has given the call its sequence
    /// number and either its upstream's state or the policy handle.
    #[inline(never)]
    pub(crate) fn begin_resolved(spec: CallSpec, seq: u64, start: Start, now: Nanos) -> Call {
        let CallSpec {
            mut route,
            deadline: spec_deadline,
            idempotency,
            tenant,
            task,
            priority,
            idempotency_key,
            params_digest,
            inbound,
            needs,
        } = spec;
        let now_ms = now.ms();
        let lb = Begin { seq, start };
        let pol = &*lb.start.handle().pol;
        let sh = &*pol.shared;
        let id = match inbound.as_ref().and_then(|b| b.request_id.as_deref()) {
            Some(parent) => RequestId::remote(parent),
            None => RequestId::local(sh.id_prefix, lb.seq),
        };
        let mut deadline = spec_deadline.unwrap_or(Duration::from_millis(pol.policy.deadline_ms));
        if let Some(d) = inbound.as_ref().and_then(|b| b.deadline) {
            deadline = deadline.min(d);
        }
        let owner = inbound.is_none();
        let routes = &pol.policy.routes;
        let route_key = if routes.is_empty() {
            None
        } else if routes.contains_key(route.as_str()) {
            Some(route.clone())
        } else {
            task.as_ref()
                .filter(|t| route.is_empty() && routes.contains_key(t.as_str()))
                .cloned()
        };
        let max_attempts = if owner {
            route_key
                .as_ref()
                .and_then(|k| routes.get(k.as_str()))
                .and_then(|r| r.max_attempts)
                .unwrap_or(pol.policy.max_attempts)
        } else {
            1
        };
        let key: Option<SmolStr> = idempotency_key
            .or_else(|| inbound.as_ref().and_then(|b| b.idempotency_key.clone()))
            .map(SmolStr::from);
        let unknown = crate::rules::route::check_route(&pol.policy, &route)
            .err()
            .map(|e| (Reason::NoEligibleUpstream, e.message));
        let conflict = match (&key, &params_digest) {
            (Some(k), Some(d)) => sh
                .ledger
                .check(
                    k,
                    d,
                    now_ms,
                    pol.policy.idempotency.ttl_ms,
                    pol.policy.idempotency.max_keys as usize,
                )
                .err()
                .map(|prev| {
                    let detail = format!("idempotency key {k} was used with parameters {prev}, now {d}");
                    (Reason::IdempotencyConflict, detail)
                }),
            _ => None,
        };
        let refused = unknown.or(conflict);
        // A call that names an upstream goes there; a routed call goes to the
        // first eligible candidate (capabilities, boundary, cost, breaker).
        let routed = route_key.as_ref().and_then(|k| routes.get(k.as_str())).map(|route| {
            let who = Who {
                tenant: tenant.as_deref(),
                priority: priority.as_deref(),
                task: task.as_deref(),
            };
            // A call that may not fall back starts where its route starts,
            // whatever the breakers say: an open breaker then stops it (with
            // the route's on_failure) instead of moving it to another upstream.
            let may_fall_back = route.fallback == FallbackMode::Allowed && owner && sh.mode().fallback;
            let m = if may_fall_back {
                match_route(pol, route, &who, &needs, &[], None, now_ms, None)
            } else {
                match_candidates(&pol.policy, route, who.task, &needs, &[], &|_| false)
            };
            let target = m
                .eligible
                .first()
                .or_else(|| route.candidates.first())
                .map(|t| SmolStr::from(t.as_str()))
                .unwrap_or_default();
            (target, m)
        });
        let tenant_counters = tenant_counters(pol, tenant.as_ref(), now_ms);
        let seq = lb.seq;
        let engine_id = sh.engine_id;
        let target = match &routed {
            Some((t, _)) => t.clone(),
            None => std::mem::take(&mut route),
        };
        let tu = match lb.start {
            Start::Cached(tu) => {
                tu.touch(now_ms);
                tu
            }
            Start::Fresh(h) => thread_up(engine_id, &h, &target, now_ms),
        };
        let pol = &*tu.handle.pol;
        let sh = &*pol.shared;
        let inbound_attempt = inbound.as_ref().and_then(|b| b.attempt);
        let plain = route_key.is_none()
            && priority.is_none()
            && refused.is_none()
            && inbound_attempt.is_none()
            && needs == NO_NEEDS;
        let deadline_at = now.saturating_add(Nanos::of(deadline));
        // The initial fallback choice recorded before the call is built: it
        // is built in place, as the return value.
        let mut fallback_pending = false;
        if let Some((target, m)) = routed {
            if sh.bus.active() && !m.excluded.is_empty() {
                let mut e = rec_for(
                    pol.version_idx,
                    &id,
                    &tenant,
                    &task,
                    deadline_at,
                    EventKind::Fallback,
                    now,
                );
                e.upstream = Some(target);
                let x = e.extra();
                x.excluded = m.exclusion_strings();
                x.detail = Some("initial_selection".into());
                sh.bus.write(tu.handle.ring_here(), &mut e);
            }
            fallback_pending = m.eligible.is_empty();
        }
        let x = (!plain).then(|| {
            Box::new(Ext {
                route_key,
                first_upstream: target,
                tried: Few::new(),
                pending_hold: Few::new(),
                fallback_pending,
                needs,
                priority,
                refused,
                inbound_attempt,
                rate_ticket: None,
                clamped: None,
            })
        });
        Call::assemble(
            tu,
            id,
            seq,
            tenant,
            task,
            idempotency,
            key,
            deadline_at,
            owner,
            max_attempts,
            tenant_counters,
            x,
        )
    }
}
