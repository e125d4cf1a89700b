//! `NativeEngine`'s methods on one call, named by its handle: begin, the
//! attempt cycle (`nextAttempt`, the reports, `cancel`, `nextHedge`), release,
//! and what the JS layer reads of a call by handle. The common steps also
//! exist as fast entry points (`fast`); what concerns the engine as a whole is
//! in `engine`.

use crate::convert::{call_needs, deadline, http_status, idempotency_of, outcome, pairs_to_headers};
use crate::engine::NativeEngine;
use crate::errors::{guard, throw, throw_type, Fail};
use crate::scratch::{codes, hedge_after, hedge_no, step};
use crate::state::live;
use crate::wire::RequestFacts;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::idempotency::params_digest as core_params_digest;
use retrywise::{Call, CallSpec, Continuation, HedgePlan, Inbound, IntoName, Outcome};
use std::time::Duration;

#[napi]
impl NativeEngine {
    /// Reads the request a wrapped fetch is about to begin a call for (the
    /// core's `RequestFacts::read_with`, as `readRequest`: `headerNames` the
    /// names of its headers joined by `\n`, `body` its bytes) and keeps what
    /// it needs for that call: the next begin given `begin::REQUEST` 1 (or
    /// `readNext`) takes it. No object is made for the facts: the family's
    /// code goes into the `request.FAMILY` slot, and the body's model (what
    /// the route comes from) is returned (null: none).
    #[napi]
    pub fn read_next_request(
        &mut self,
        env: Env,
        url: String,
        header_names: Option<String>,
        body: Option<Uint8Array>,
    ) -> Result<Option<String>> {
        guard(&env, || {
            let f = crate::wire::read_facts(&url, header_names.as_deref(), body.as_deref());
            let (mut st, s) = self.st_slots(&env)?;
            s.set(crate::scratch::request::FAMILY, f.family.code() as f64);
            st.read = Some(f.needs);
            Ok(f.model)
        })
    }

    /// Begins a call: the fast path (route, deadline, idempotency, tenant).
    /// `deadlineMs` < 0 means the policy default; `idempotency` is a code.
    /// `readNext`: the call needs what the request last read by
    /// `readNextRequest` needs. Returns the call's handle.
    #[napi]
    pub fn begin(
        &mut self,
        env: Env,
        route: String,
        deadline_ms: f64,
        idempotency: u32,
        tenant: Option<String>,
        read_next: Option<bool>,
    ) -> Result<f64> {
        guard(&env, || {
            let mut spec = CallSpec::new(route);
            spec.deadline = deadline(deadline_ms);
            spec.idempotency = idempotency_of(idempotency as f64).map_err(|f| f.into_error(&env))?;
            spec.tenant = tenant.map(IntoName::into_name);
            let (mut st, s) = self.st_slots(&env)?;
            if read_next == Some(true) {
                spec.needs = st.read.take().unwrap_or_default();
            }
            st.start(&s, &mut spec, false)
                .map(|(h, _)| h)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Begins a call with every field. `extra` is JSON (null: none of them):
    /// `{tenant, task, priority, idempotencyKey, params, paramsDigest,
    ///   needs: {capabilities, api, inputTokens, maxOutputTokens, dataBoundary, maxCost},
    ///   inboundHeaders: [[name, value], ...]}`; `needs` may also be a list
    /// of such objects, each laid over the one before.
    /// `request`: what the call's request needs (`readRequest`), under `needs`
    /// (`Needs::merged`); `readNext` (without `request`): what the request
    /// last read by `readNextRequest` needs, likewise.
    /// `parent` (a handle, < 0 for none) / `parentAttempt` (0 = latest): an enclosing
    /// call of this engine (nesting); the new call inherits what is left of its
    /// deadline, its ids and key, and is a non-owner.
    /// With `first`, the call's first attempt is asked for in the same step
    /// (result code in the `step.RESULT` slot of `vocab().scratch`, attempt or stop fields in scratch, as `nextAttempt`).
    /// A route the policy does not know throws a policy error (`Engine::try_begin`).
    #[napi(
        ts_args_type = "route: string, deadlineMs: number, idempotency: number, extra: string | undefined | null, parent: number, parentAttempt: number, first?: boolean | undefined | null, request?: RequestFacts | undefined | null, readNext?: boolean | undefined | null"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn begin_ex(
        &mut self,
        env: Env,
        route: String,
        deadline_ms: f64,
        idempotency: u32,
        extra: Option<String>,
        parent: f64,
        parent_attempt: u32,
        first: Option<bool>,
        request: Option<&RequestFacts>,
        read_next: Option<bool>,
    ) -> Result<f64> {
        guard(&env, || {
            let mut spec = CallSpec::new(route);
            spec.deadline = deadline(deadline_ms);
            spec.idempotency = idempotency_of(idempotency as f64).map_err(|f| f.into_error(&env))?;
            let x: serde_json::Value = match extra {
                Some(text) => serde_json::from_str(&text).map_err(|e| throw_type(&env, &format!("spec: {e}")))?,
                None => serde_json::Value::Null,
            };
            let s = |k: &str| x.get(k).and_then(|v| v.as_str()).map(str::to_string);
            spec.tenant = s("tenant").map(IntoName::into_name);
            spec.task = s("task").map(IntoName::into_name);
            spec.priority = s("priority").map(IntoName::into_name);
            spec.idempotency_key = s("idempotencyKey");
            spec.params_digest = s("paramsDigest");
            if let Some(p) = x.get("params") {
                spec.params_digest = Some(core_params_digest(p));
            }
            let (mut st, s) = self.st_slots(&env)?;
            if parent >= 0.0 {
                let e = st.entry(parent).map_err(|f| f.into_error(&env))?;
                let call = e.call.as_ref().ok_or_else(|| Fail::released().into_error(&env))?;
                spec.inbound = Some(e.inbound_for(call, parent_attempt));
            } else if let Some(h) = x.get("inboundHeaders").and_then(|h| h.as_array()) {
                let headers = pairs_to_headers(h);
                match Inbound::from_headers(&headers) {
                    Ok(i) => spec.inbound = i,
                    Err(e) => return Err(throw(&env, "ERR_RETRYWISE_INBOUND", &e.to_string())),
                }
            }
            // Taken once nothing else can fail before the begin (a released
            // parent is retried as no parent, with the same request).
            let read = match request {
                Some(r) => Some(r.needs_ref().clone()),
                None if read_next == Some(true) => st.read.take(),
                None => None,
            };
            if let Some(n) = call_needs(&env, read, x.get("needs"))? {
                spec.needs = n;
            }
            let first = first.unwrap_or(false);
            let (h, r) = st.start(&s, &mut spec, first).map_err(|f| f.into_error(&env))?;
            if first {
                s.set(step::RESULT, r as f64);
            }
            Ok(h)
        })
    }

    /// Drops a call (an unfinished one gives back its probe permits, gate
    /// slots and budget holds, as dropping a core `Call` does). Idempotent.
    #[napi]
    pub fn release(&mut self, env: Env, h: f64) -> Result<()> {
        guard(&env, || {
            self.st(&env)?.release(h);
            Ok(())
        })
    }

    /// Drops the first `n` calls of `handles` (each as `release` does): one
    /// crossing for a batch of finished calls. Unknown and released handles
    /// are skipped.
    #[napi]
    pub fn release_many(&mut self, env: Env, handles: Float64Array, n: u32) -> Result<()> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            for &h in handles.iter().take(n as usize) {
                st.release(h);
            }
            Ok(())
        })
    }

    /// Live (unreleased) calls.
    #[napi]
    pub fn live_calls(&self, env: Env) -> Result<u32> {
        let st = self.st(&env)?;
        Ok((st.slab.len() - st.free.len()) as u32)
    }

    /// Admits the next attempt of call `h` (`0`, fields in scratch) or says
    /// why none may start (`1`, stop fields in scratch).
    #[napi]
    pub fn next_attempt(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            st.next_attempt(&s, h, false).map_err(|f| f.into_error(&env))
        })
    }

    /// Reports a bare HTTP status for the latest attempt (the fast path); returns the action code.
    #[napi]
    pub fn report_status(&mut self, env: Env, h: f64, status: u32) -> Result<i32> {
        guard(&env, || {
            let st16 = http_status(status as f64).map_err(|f| f.into_error(&env))?;
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &Outcome::status(st16), 0, 0)
                .map(|r| r.0)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Reports a success with no status (a transport with no HTTP status); returns the action code.
    #[napi]
    pub fn report_ok(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &Outcome::success(), 0, 0)
                .map(|r| r.0)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Reports a full outcome. Numbers < 0 mean absent; enum fields are codes.
    /// `resumable`: a stream broken after output showed text only;
    /// `continuation`: the code of how the attempt continued a broken stream.
    /// `headers` is a flat `[name, value, ...]` list. `body` is read by
    /// `Outcome::read_body` (an error's vendor code when `vendorCode` is absent;
    /// a JSON success that does not parse is `malformed_response`). `attempt` 0 = the latest.
    /// `firstTokenMs` (< 0: absent): a streamed answer's time from sending to
    /// its first visible output (`Outcome::first_token`).
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn report(
        &mut self,
        env: Env,
        h: f64,
        status: f64,
        error: i32,
        phase: i32,
        effect: i32,
        vendor_code: Option<String>,
        headers: Option<Vec<String>>,
        input_tokens: f64,
        body: Option<Uint8Array>,
        attempt: u32,
        ok: bool,
        resumable: Option<bool>,
        continuation: Option<i32>,
        first_token_ms: Option<f64>,
    ) -> Result<i32> {
        guard(&env, || {
            let mut o = outcome(
                &env,
                status,
                error,
                phase,
                effect,
                vendor_code,
                headers,
                input_tokens,
                body,
                ok,
            )?;
            o.resumable = resumable.unwrap_or(false);
            if let Some(c) = continuation.filter(|c| *c >= 0) {
                o.continuation =
                    Some(Continuation::from_code(c as u8).ok_or_else(|| throw_type(&env, "bad continuation code"))?);
            }
            if let Some(ms) = first_token_ms.filter(|ms| *ms >= 0.0) {
                if !ms.is_finite() {
                    return Err(throw_type(&env, "outcome.firstTokenMs must be a finite number >= 0"));
                }
                o.first_token = Some(Duration::from_micros((ms * 1000.0) as u64));
            }
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &o, attempt, 0)
                .map(|r| r.0)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Reports the latest attempt's response as a wrapped fetch read it:
    /// HTTP `status`, its headers as one string (names and values in turn, each
    /// followed by a line feed, as a `Headers` gives them; null: none) and the body read inside the loop
    /// (`Outcome::read_body`: an error's vendor code, a JSON success that does
    /// not parse). One string crosses instead of a list of 2 × n. Returns the
    /// action code (decision in scratch).
    #[napi]
    pub fn report_response(
        &mut self,
        env: Env,
        h: f64,
        status: u32,
        headers: Option<String>,
        body: Option<Uint8ArraySlice>,
    ) -> Result<i32> {
        guard(&env, || {
            let st16 = http_status(status as f64).map_err(|f| f.into_error(&env))?;
            let mut o = Outcome::status(st16);
            if let Some(text) = headers.as_deref() {
                let mut it = text.split('\n');
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    o.headers.insert(k, v);
                }
            }
            if let Some(b) = body.as_deref() {
                o.read_body(b);
            }
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &o, 0, 0).map(|r| r.0).map_err(|f| f.into_error(&env))
        })
    }

    /// Cancels call `h`; the decision goes to scratch; returns the action code.
    #[napi]
    pub fn cancel(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            let st = &mut *st;
            let e = live(&mut st.slab, h).ok_or_else(|| Fail::released().into_error(&env))?;
            let call = e.call.as_mut().ok_or_else(|| Fail::released().into_error(&env))?;
            let d = call.cancel();
            Ok(e.put_decision(&s, &mut st.names, d))
        })
    }

    /// Whether a hedged attempt may start: `HEDGE_START` (attempt in scratch),
    /// `HEDGE_AFTER` (ask again after `hedge_after.WAIT_MS` ms) or `HEDGE_NO`
    /// (`hedge_no.REASON`); slots and codes as `vocab().scratch` names them.
    #[napi]
    pub fn next_hedge(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            let st = &mut *st;
            let e = live(&mut st.slab, h).ok_or_else(|| Fail::released().into_error(&env))?;
            let call = e.call.as_mut().ok_or_else(|| Fail::released().into_error(&env))?;
            match call.next_hedge() {
                HedgePlan::Start(a) => {
                    e.put_attempt(&s, &mut st.names, a);
                    Ok(codes::HEDGE_START)
                }
                HedgePlan::After(d) => {
                    s.set(hedge_after::WAIT_MS, d.as_secs_f64() * 1000.0);
                    Ok(codes::HEDGE_AFTER)
                }
                HedgePlan::No(r) => {
                    s.set(hedge_no::REASON, r.code() as f64);
                    Ok(codes::HEDGE_NO)
                }
            }
        })
    }

    /// Propagation headers of attempt `n` (0 = latest) of call `h` as a flat `[name, value, ...]` list.
    #[napi]
    pub fn attempt_headers(&mut self, env: Env, h: f64, n: u32) -> Result<Vec<String>> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            let e = st.entry(h).map_err(|f| f.into_error(&env))?;
            let mut out = Vec::new();
            if let Some(a) = e.find_attempt(n) {
                a.for_each_header(|k, v| {
                    out.push(k.to_string());
                    out.push(v.to_string());
                });
            }
            Ok(out)
        })
    }

    /// Propagation headers of attempt `n` (0 = latest) of call `h` as one
    /// string, names and values in turn joined by line feeds (neither holds
    /// one): one value crosses.
    #[napi]
    pub fn attempt_headers_text(&mut self, env: Env, h: f64, n: u32) -> Result<String> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            let e = st.entry(h).map_err(|f| f.into_error(&env))?;
            let mut out = String::with_capacity(128);
            if let Some(a) = e.find_attempt(n) {
                a.for_each_header(|k, v| {
                    out.push_str(k);
                    out.push('\n');
                    out.push_str(v);
                    out.push('\n');
                });
            }
            out.pop();
            Ok(out)
        })
    }

    /// Upstream of attempt `n` (0 = latest); for names that were not interned.
    #[napi]
    pub fn upstream_of_attempt(&mut self, env: Env, h: f64, n: u32) -> Result<Option<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.find_attempt(n).map(|a| a.upstream.to_string()))
    }

    /// Upstream of the last decision (for names that were not interned).
    #[napi]
    pub fn decision_upstream(&mut self, env: Env, h: f64) -> Result<Option<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.upstream.as_deref().map(str::to_string))
    }

    /// Detail of the last decision or stop of call `h`.
    #[napi]
    pub fn detail(&mut self, env: Env, h: f64) -> Result<Option<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.detail.clone())
    }

    /// Exclusions of the last decision as a flat `[upstream, why, ...]` list.
    #[napi]
    pub fn excluded(&mut self, env: Env, h: f64) -> Result<Vec<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.excluded.iter().flat_map(|(a, b)| [a.clone(), b.clone()]).collect())
    }

    fn with_call<T>(&self, env: &Env, h: f64, f: impl FnOnce(&Call) -> T) -> Result<T> {
        let mut st = self.st(env)?;
        let e = st.entry(h).map_err(|f| f.into_error(env))?;
        let call = e.call.as_ref().ok_or_else(|| Fail::released().into_error(env))?;
        Ok(f(call))
    }

    /// Facts about call `h` as JSON: `{id, attempts, remainingMs, owner, finished, policyVersion, target}`.
    #[napi]
    pub fn call_info(&mut self, env: Env, h: f64) -> Result<String> {
        self.with_call(&env, h, |call| {
            serde_json::json!({
                "id": call.id(),
                "attempts": call.attempts(),
                "remainingMs": call.remaining().as_millis() as u64,
                "owner": call.is_owner(),
                "finished": call.is_finished(),
                "policyVersion": call.policy_version(),
                "target": call.target(),
            })
            .to_string()
        })
    }

    /// Logical request id of call `h`.
    #[napi]
    pub fn call_id(&mut self, env: Env, h: f64) -> Result<String> {
        self.with_call(&env, h, |call| call.id().to_string())
    }

    /// Physical attempts call `h` started so far.
    #[napi]
    pub fn call_attempts(&mut self, env: Env, h: f64) -> Result<u32> {
        self.with_call(&env, h, |call| call.attempts())
    }

    /// Time left before call `h`'s deadline, ms.
    #[napi]
    pub fn call_remaining_ms(&mut self, env: Env, h: f64) -> Result<f64> {
        self.with_call(&env, h, |call| call.remaining().as_secs_f64() * 1000.0)
    }
}
