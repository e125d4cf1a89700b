//! `NativeEngine`: the lean native engine class, its constructor (policy
//! argument, seed, clock, scratch) and its engine-wide methods (fast entry
//! points, interning, policy and reload, kill switch, stats, events and
//! listeners, the reconcile list, breakers, wire helpers, stream gates, the
//! manual clock). Its methods on one call, by handle, are in `calls`; its
//! state is `state::Inner`.

use crate::clock::rt_now_ms;
use crate::convert::{load_policy, ms_exact};
use crate::errors::{guard, policy_error, throw, throw_type};
use crate::finished::Versions;
use crate::names::Names;
use crate::scratch::{step, Scratch, Slots};
use crate::state::Inner;
use crate::{fast, stream, wire};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::{Clock, Engine, Event, ManualClock, Mode, PolicyErrors};
use smol_str::SmolStr;
use std::cell::{RefCell, RefMut};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Route and tenant strings interned per engine (`intern`); past this many the
/// JS side passes the string (slower entry points).
const MAX_STRINGS: usize = 4096;

/// Lean native engine. Use `Engine` from `index.js` instead.
///
/// Calls live in a slab inside the engine and JS holds a numeric handle:
/// creating a wrapped N-API object per call (and finalizing it) costs more
/// than the whole decision cycle. `release(handle)` drops a call (giving back
/// what an unfinished one holds, exactly as dropping a core `Call` does).
#[napi]
pub struct NativeEngine {
    inner: Rc<RefCell<Inner>>,
}

#[napi]
impl NativeEngine {
    /// `scratch`: a `Float64Array` of at least `vocab().scratch.len` (40)
    /// elements over a `SharedArrayBuffer` (no detach check per step) or a
    /// fixed-length `ArrayBuffer` (see the `scratch` module). `kind`: 0 default
    /// policy, 1 JSON text of a policy object, 2 JSON/YAML/TOML text, 3 a file path.
    /// `seed`: decimal u64 string. `manualClock`: use a `ManualClock`.
    #[napi(
        constructor,
        ts_args_type = "scratch: Float64Array, kind: number, policy: string | undefined | null, seed: string | undefined | null, manualClock: boolean"
    )]
    pub fn new(
        env: Env,
        scratch: Unknown<'_>,
        kind: u32,
        policy: Option<String>,
        seed: Option<String>,
        manual_clock: bool,
    ) -> Result<Self> {
        guard(&env, || {
            let scratch = Scratch::new(&env, scratch).map_err(|f| f.into_error(&env))?;
            let policy = load_policy(&env, kind, policy)?;
            let mut b = Engine::builder(policy);
            // Without a manual clock the core keeps its own system clock
            // (statically dispatched); an injected one is a trait object.
            let manual = if manual_clock {
                let c = ManualClock::new();
                b = b.clock(Arc::new(c.clone()) as Arc<dyn Clock>);
                Some(c)
            } else {
                None
            };
            if let Some(s) = seed {
                let v: u64 = s
                    .trim()
                    .parse()
                    .map_err(|_| throw_type(&env, &format!("opts.seed must be an integer in [0, 2^64), got {s}")))?;
                b = b.seed(v);
            }
            let engine = b.build().map_err(|e| policy_error(&env, &e))?;
            let rt_offset_ms = manual.is_none().then(|| rt_now_ms() - ms_exact(engine.now()));
            scratch
                .slots(&env)
                .map_err(|f| f.into_error(&env))?
                .set(step::PENDING_RELEASE, -1.0);
            Ok(NativeEngine {
                inner: Rc::new(RefCell::new(Inner {
                    engine,
                    manual,
                    rt_offset_ms,
                    scratch,
                    names: Names::default(),
                    versions: Versions::default(),
                    strings: Vec::new(),
                    pending: Arc::new(Mutex::new(Vec::new())),
                    sink: None,
                    slab: Vec::new(),
                    free: Vec::new(),
                    read: None,
                })),
            })
        })
    }

    pub(crate) fn st(&self, env: &Env) -> Result<RefMut<'_, Inner>> {
        self.inner.try_borrow_mut().map_err(|_| {
            throw(
                env,
                "ERR_RETRYWISE_BUSY",
                "the engine is in use (re-entered from a callback)",
            )
        })
    }

    /// The engine's state and its scratch, checked, for a step that reads or writes scratch.
    pub(crate) fn st_slots<'e>(&self, env: &'e Env) -> Result<(RefMut<'_, Inner>, Slots<'e>)> {
        let st = self.st(env)?;
        let s = st.scratch.slots(env).map_err(|f| f.into_error(env))?;
        Ok((st, s))
    }

    /// The fast entry points of this engine (see the `fast` module): an object
    /// of functions taking no argument, whose inputs and results are in scratch.
    #[napi(
        ts_return_type = "{ begin(): void; beginAttempt(): void; next(): void; reportStatus(): string | undefined; reportOk(): string | undefined; release(): void; finish(): string | undefined }"
    )]
    pub fn fast(&self, env: Env) -> Result<Object<'static>> {
        guard(&env, || fast::create(&env, &self.inner))
    }

    /// Interns a route or tenant name for the fast entry points; returns its
    /// id, or -1 when the table is full (then pass the string to `begin`).
    #[napi]
    pub fn intern(&self, env: Env, s: String) -> Result<i32> {
        let mut st = self.st(&env)?;
        if let Some(i) = st.strings.iter().position(|x| x.as_str() == s) {
            return Ok(i as i32);
        }
        if st.strings.len() >= MAX_STRINGS {
            return Ok(-1);
        }
        st.strings.push(SmolStr::from(s));
        Ok(st.strings.len() as i32 - 1)
    }

    /// The engine's clock now, ms with their fraction: a finished call's
    /// remaining time is its `finished.DEADLINE_MS` minus this.
    #[napi]
    pub fn clock_ms(&self, env: Env) -> Result<f64> {
        Ok(ms_exact(self.st(&env)?.engine.now()))
    }

    /// A policy version by the index a finished call gave (`finished.POLICY`).
    #[napi]
    pub fn policy_name(&self, env: Env, i: u32) -> Result<Option<String>> {
        Ok(self.st(&env)?.versions.name(i))
    }

    /// Name of an interned upstream index.
    #[napi]
    pub fn upstream_name(&self, env: Env, i: u32) -> Result<Option<String>> {
        Ok(self.st(&env)?.names.name(i))
    }

    /// Engine stats as JSON.
    #[napi]
    pub fn stats(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.stats()).unwrap_or_default())
        })
    }

    /// Prometheus text exposition.
    #[napi]
    pub fn prometheus(&self, env: Env) -> Result<String> {
        guard(&env, || Ok(self.st(&env)?.engine.prometheus()))
    }

    /// The event ring buffer as JSON (oldest first).
    #[napi]
    pub fn events(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.events()).unwrap_or_default())
        })
    }

    /// Takes the event ring buffer as JSON.
    #[napi]
    pub fn drain_events(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.drain_events()).unwrap_or_default())
        })
    }

    /// Starts or stops collecting events for JS listeners.
    #[napi]
    pub fn set_listening(&mut self, env: Env, on: bool) -> Result<()> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            match (on, st.sink) {
                (true, None) => {
                    let q = st.pending.clone();
                    let id = st.engine.on_event(Arc::new(move |e: &Event| {
                        let mut g = q.lock().unwrap_or_else(|p| p.into_inner());
                        if g.len() < 100_000 {
                            g.push(e.clone());
                        }
                    }));
                    st.sink = Some(id);
                }
                (false, Some(id)) => {
                    st.engine.remove_sink(id);
                    st.sink = None;
                    st.pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
                }
                _ => {}
            }
            Ok(())
        })
    }

    /// Events collected for listeners since the last call, as JSON; `null` when none.
    #[napi]
    pub fn take_events(&self, env: Env) -> Result<Option<String>> {
        guard(&env, || {
            let st = self.st(&env)?;
            let evs = std::mem::take(&mut *st.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if evs.is_empty() {
                return Ok(None);
            }
            Ok(Some(serde_json::to_string(&evs).unwrap_or_default()))
        })
    }

    /// Swaps the policy (same `kind` values as the constructor).
    #[napi]
    pub fn reload(&self, env: Env, kind: u32, policy: Option<String>) -> Result<()> {
        guard(&env, || {
            let p = load_policy(&env, kind, policy)?;
            self.st(&env)?.engine.reload(p).map_err(|e| policy_error(&env, &e))
        })
    }

    /// Kill switch: bit 1 retries, 2 fallback, 4 hedging.
    #[napi]
    pub fn set_mode(&self, env: Env, retries: bool, fallback: bool, hedging: bool) -> Result<()> {
        guard(&env, || {
            self.st(&env)?.engine.set_mode(Mode {
                retries,
                fallback,
                hedging,
            });
            Ok(())
        })
    }

    /// Current mode as bits (1 retries, 2 fallback, 4 hedging).
    #[napi]
    pub fn mode(&self, env: Env) -> Result<u32> {
        let m = self.st(&env)?.engine.mode();
        Ok(m.retries as u32 | (m.fallback as u32) << 1 | (m.hedging as u32) << 2)
    }

    /// The reconcile list as JSON.
    #[napi]
    pub fn reconcile_list(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.reconcile_list()).unwrap_or_default())
        })
    }

    /// Takes the reconcile list, as JSON.
    #[napi]
    pub fn drain_reconcile(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.drain_reconcile()).unwrap_or_default())
        })
    }

    /// Breaker state name of an upstream.
    #[napi]
    pub fn breaker_state(&self, env: Env, upstream: String) -> Result<String> {
        guard(&env, || {
            Ok(self.st(&env)?.engine.breaker_state(&upstream).as_str().to_string())
        })
    }

    /// The policy in force, as JSON.
    #[napi]
    pub fn policy(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.policy()).unwrap_or_default())
        })
    }

    /// Version string of the policy in force.
    #[napi]
    pub fn policy_version(&self, env: Env) -> Result<String> {
        Ok(self.st(&env)?.engine.policy_version())
    }

    /// The route a request for `model` takes (`Engine::route_for_model`: the
    /// policy's `models` map, a route or an upstream of that name); throws a
    /// policy error naming the keys to add for an unknown model.
    #[napi]
    pub fn route_for_model(&self, env: Env, model: String) -> Result<String> {
        guard(&env, || {
            let st = self.st(&env)?;
            st.engine
                .route_for_model(&model)
                .map_err(|e| policy_error(&env, &PolicyErrors(vec![e])))
        })
    }

    /// How to reach `upstream` (`Engine::reach`) as JSON: `{upstream, baseUrl,
    /// api, model, apiKeyEnv, apiVersion, prefill}`, unset fields null.
    #[napi]
    pub fn reach(&self, env: Env, upstream: String) -> Result<String> {
        guard(&env, || {
            Ok(wire::reach_json(&self.st(&env)?.engine.reach(&upstream)).to_string())
        })
    }

    /// The request for an attempt on `upstream` (`wire::rewrite` with the
    /// upstream's reach and this process's environment), or `null` when the
    /// catalog says nothing that would change it.
    #[napi]
    pub fn rewrite(&self, env: Env, upstream: String, req: wire::Request) -> Result<Option<wire::Request>> {
        guard(&env, || {
            let reach = self.st(&env)?.engine.reach(&upstream);
            wire::rewrite(&env, &reach, req)
        })
    }

    /// Whether a request for `upstream` is rewritten (`Reach::rewrites`: the
    /// catalog names its base URL, model, key or family); the JS layer asks
    /// once per upstream and policy, and makes no rewrite crossing otherwise.
    #[napi]
    pub fn rewrites(&self, env: Env, upstream: String) -> Result<bool> {
        Ok(self.st(&env)?.engine.reach(&upstream).rewrites())
    }

    /// `rewrite` for a wrapped fetch: the headers as one string
    /// (names and values in turn, each followed by a line feed), the result as the edits to make (`WireEdit`),
    /// or `null` when the catalog changes nothing.
    #[napi]
    pub fn rewrite_edits(
        &self,
        env: Env,
        upstream: String,
        method: String,
        url: String,
        headers: String,
        body: Option<Uint8ArraySlice>,
    ) -> Result<Option<wire::WireEdit>> {
        guard(&env, || {
            let reach = self.st(&env)?.engine.reach(&upstream);
            wire::rewrite_edits(&env, &reach, method, url, &headers, body.as_deref().unwrap_or(&[]))
        })
    }

    /// A stream gate for one attempt's body, reading malformed events as the
    /// policy says (`streams.malformed_event`). `endAtError`: an error event
    /// after output ends the stream before it (`StreamGate::end_at_error`),
    /// for wrapFetch, which continues the answer or ends the stream itself.
    #[napi]
    pub fn stream_gate(
        &self,
        env: Env,
        content_type: Option<String>,
        end_at_error: Option<bool>,
    ) -> Result<stream::StreamGate> {
        guard(&env, || {
            let gate = self.st(&env)?.engine.stream_gate(content_type.as_deref());
            Ok(stream::StreamGate::from_core(if end_at_error.unwrap_or(false) {
                gate.end_at_error()
            } else {
                gate
            }))
        })
    }

    /// Moves the manual clock forward; throws unless built with `manualClock`.
    #[napi]
    pub fn advance_clock(&self, env: Env, ms: f64) -> Result<()> {
        guard(&env, || match &self.st(&env)?.manual {
            Some(c) => {
                if ms.is_nan() || ms < 0.0 || !ms.is_finite() {
                    return Err(throw_type(&env, "ms must be a finite number >= 0"));
                }
                c.advance(Duration::from_micros((ms * 1000.0) as u64));
                Ok(())
            }
            None => Err(throw(
                &env,
                "ERR_RETRYWISE_NO_MANUAL_CLOCK",
                "advanceClock needs an engine built with { manualClock: true }",
            )),
        })
    }
}
