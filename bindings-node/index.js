'use strict'
// retrywise for Node: the idiomatic JS layer over the lean native API.
//
// Every decision is made by the Rust core. This file translates JS values to
// the core's numeric codes and back, sleeps, races timers, links AbortSignals,
// tracks nesting with AsyncLocalStorage and maps Node/undici errors to the
// core's ErrorKind names. It never decides whether to retry.

const { AsyncLocalStorage } = require('node:async_hooks')
const native = require('./native.js')

const VOCAB = JSON.parse(native.vocab())
const SCRATCH_LEN = VOCAB.scratchLen

// ---------------------------------------------------------------------------
// Vocabulary: names <-> stable numeric codes (from the core, read once)
// ---------------------------------------------------------------------------

function codeTable(names) {
  const m = new Map()
  names.forEach((n, i) => m.set(n, i))
  return m
}
const CODES = {
  idempotency: codeTable(VOCAB.idempotency),
  phase: codeTable(VOCAB.phase),
  error: codeTable(VOCAB.errorKind),
  effect: codeTable(VOCAB.effect),
}
const ACTION = VOCAB.action
const REASON = VOCAB.reason
const ERROR_CLASS = VOCAB.errorClass
const WAIT_SOURCE = VOCAB.waitSource
const ON_FAILURE = VOCAB.onFailure

// Same normalization as the core's FromStr: trimmed, case-insensitive, '-' for '_'.
function toCode(kind, value, argName) {
  const table = CODES[kind]
  if (typeof value === 'string') {
    let c = table.get(value)
    if (c !== undefined) return c
    c = table.get(value.trim().toLowerCase().replace(/-/g, '_'))
    if (c !== undefined) return c
  }
  throw new TypeError(`${argName} must be one of ${[...table.keys()].map((k) => `'${k}'`).join(', ')}; got ${describe(value)}`)
}

function describe(v) {
  if (typeof v === 'string') return JSON.stringify(v)
  if (v === null) return 'null'
  if (typeof v === 'object') return v.constructor && v.constructor.name ? `an instance of ${v.constructor.name}` : 'an object'
  return `${typeof v} ${String(v)}`
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

class RetrywiseError extends Error {
  constructor(message, code, options) {
    super(message, options)
    this.name = 'RetrywiseError'
    this.code = code
  }
}

class PolicyError extends RetrywiseError {
  constructor(errors) {
    const first = errors[0] || { path: '', message: 'invalid policy' }
    const text = errors.map((e) => (e.path ? `${e.path}: ${e.message}` : e.message)).join('; ')
    super(`invalid policy: ${text}`, 'ERR_RETRYWISE_POLICY')
    this.name = 'PolicyError'
    this.path = first.path
    this.errors = errors
  }
}

class StoppedError extends RetrywiseError {
  constructor(fields, options) {
    const msg = `retrywise stopped: ${fields.reason}` + (fields.errorClass ? ` (class ${fields.errorClass})` : '') + (fields.detail ? `: ${fields.detail}` : '')
    super(msg, 'ERR_RETRYWISE_STOPPED', options)
    this.name = 'StoppedError'
    this.action = fields.action || 'stop'
    this.reason = fields.reason
    this.errorClass = fields.errorClass
    this.detail = fields.detail
    this.onFailure = fields.onFailure
    this.attempts = fields.attempts
    this.decision = fields.decision || null
    this.response = fields.response || null
  }
}

function translateNativeError(err) {
  if (err && err.code === 'ERR_RETRYWISE_POLICY') {
    let list
    try {
      list = JSON.parse(err.message)
    } catch {
      list = [{ path: '', message: err.message }]
    }
    return new PolicyError(list)
  }
  return err
}

// ---------------------------------------------------------------------------
// Policy arguments
// ---------------------------------------------------------------------------

function policyArgs(policy) {
  if (policy === undefined || policy === null) return [0, null]
  if (typeof policy === 'string') return [2, policy]
  if (typeof policy === 'object' && !Array.isArray(policy)) {
    let text
    try {
      text = JSON.stringify(policy)
    } catch (e) {
      throw new TypeError(`policy must be JSON-serializable: ${e.message}`)
    }
    return [1, text]
  }
  throw new TypeError(`policy must be an object or a JSON/YAML/TOML string; got ${describe(policy)}`)
}

function seedArg(seed) {
  if (seed === undefined || seed === null) return null
  if (typeof seed === 'bigint') {
    if (seed < 0n || seed >= 1n << 64n) throw new TypeError('opts.seed must be in [0, 2^64)')
    return seed.toString()
  }
  if (typeof seed === 'number') {
    if (!Number.isSafeInteger(seed) || seed < 0) throw new TypeError(`opts.seed must be a non-negative safe integer or a bigint; got ${seed}`)
    return String(seed)
  }
  throw new TypeError(`opts.seed must be a number or a bigint; got ${describe(seed)}`)
}

// ---------------------------------------------------------------------------
// Nesting: the retrywise call (and attempt) the current async context runs in
// ---------------------------------------------------------------------------

const als = new AsyncLocalStorage()

/** The innermost retrywise attempt the caller runs inside, or undefined. */
function currentAttempt() {
  const ctx = als.getStore()
  return ctx ? ctx.attempt : undefined
}

// ---------------------------------------------------------------------------
// Headers
// ---------------------------------------------------------------------------

/** Any header container (Headers, Map, plain object, array of pairs) -> [[name, value], ...]. */
function headerPairs(h, argName) {
  const out = []
  if (h === undefined || h === null) return out
  if (typeof h.forEach === 'function' && typeof h.get === 'function' && !(h instanceof Map)) {
    h.forEach((v, k) => out.push([k, String(v)]))
    return out
  }
  if (h instanceof Map || Array.isArray(h)) {
    for (const pair of h) {
      if (!pair || pair.length !== 2) throw new TypeError(`${argName} entries must be [name, value] pairs`)
      out.push([String(pair[0]), String(pair[1])])
    }
    return out
  }
  if (typeof h === 'object') {
    for (const k of Object.keys(h)) {
      const v = h[k]
      if (v === undefined || v === null) continue
      out.push([k, Array.isArray(v) ? v.join(', ') : String(v)])
    }
    return out
  }
  throw new TypeError(`${argName} must be a Headers, a Map, an object or an array of pairs; got ${describe(h)}`)
}

function flatHeaders(h, argName) {
  if (h === undefined || h === null) return null
  const flat = []
  for (const [k, v] of headerPairs(h, argName)) flat.push(k, v)
  return flat
}

// ---------------------------------------------------------------------------
// Engine
// ---------------------------------------------------------------------------

const ENGINE = Symbol('retrywise.engine')

class Engine {
  /**
   * @param policy a policy object, or a JSON / YAML / TOML string; default policy when absent
   * @param opts `{ seed?: number | bigint, manualClock?: boolean }`
   */
  constructor(policy, opts) {
    if (opts !== undefined && (opts === null || typeof opts !== 'object')) throw new TypeError(`opts must be an object; got ${describe(opts)}`)
    const o = opts || {}
    if (o.manualClock !== undefined && typeof o.manualClock !== 'boolean') throw new TypeError('opts.manualClock must be a boolean')
    const [kind, text] = o[ENGINE] ? o[ENGINE] : policyArgs(policy)
    this._s = new Float64Array(SCRATCH_LEN)
    try {
      this._n = new native.NativeEngine(this._s, kind, text, seedArg(o.seed), o.manualClock === true)
    } catch (e) {
      throw translateNativeError(e)
    }
    this._names = []
    this._listeners = null
    this._listenerErrors = 0
    this._reg = null
  }

  /** Builds an engine from a policy file (`.json`, `.yaml`/`.yml`, `.toml`). */
  static fromFile(path, opts) {
    if (typeof path !== 'string' && !(path instanceof URL)) throw new TypeError(`path must be a string; got ${describe(path)}`)
    const p = path instanceof URL ? require('node:url').fileURLToPath(path) : path
    return new Engine(undefined, { ...(opts || {}), [ENGINE]: [3, p] })
  }

  _name(i) {
    let n = this._names[i]
    if (n === undefined) {
      n = this._n.upstreamName(i)
      this._names[i] = n
    }
    return n
  }

  /** Opens a native call for `spec` (nesting-aware); returns its handle. */
  _open(spec, argName) {
    if (spec === null || typeof spec !== 'object') throw new TypeError(`${argName} must be an object; got ${describe(spec)}`)
    const route = spec.route
    if (typeof route !== 'string') throw new TypeError(`${argName}.route must be a string; got ${describe(route)}`)
    let dl = -1
    if (spec.deadlineMs !== undefined && spec.deadlineMs !== null) {
      dl = spec.deadlineMs
      if (typeof dl !== 'number' || !(dl >= 0) || !Number.isFinite(dl)) throw new TypeError(`${argName}.deadlineMs must be a finite number >= 0; got ${describe(dl)}`)
    }
    const idem = spec.idempotency === undefined ? 0 : toCode('idempotency', spec.idempotency, `${argName}.idempotency`)
    const tenant = spec.tenant
    if (tenant !== undefined && tenant !== null && typeof tenant !== 'string') throw new TypeError(`${argName}.tenant must be a string`)
    const parent = spec.inherit === false ? undefined : als.getStore()
    const simple =
      parent === undefined &&
      spec.task === undefined &&
      spec.priority === undefined &&
      spec.idempotencyKey === undefined &&
      spec.params === undefined &&
      spec.paramsDigest === undefined &&
      spec.needs === undefined &&
      spec.inboundHeaders === undefined
    if (simple) return this._n.begin(route, dl, idem, tenant)
    const extra = {}
    for (const k of ['task', 'priority', 'idempotencyKey', 'paramsDigest']) {
      const v = spec[k]
      if (v !== undefined && v !== null) {
        if (typeof v !== 'string') throw new TypeError(`${argName}.${k} must be a string; got ${describe(v)}`)
        extra[k] = v
      }
    }
    if (tenant) extra.tenant = tenant
    if (spec.params !== undefined) extra.params = spec.params
    if (spec.needs !== undefined && spec.needs !== null) {
      if (typeof spec.needs !== 'object') throw new TypeError(`${argName}.needs must be an object`)
      extra.needs = spec.needs
    }
    let parentHandle = -1
    let parentAttempt = 0
    if (parent !== undefined) {
      if (parent.engine === this && parent.call._h >= 0) {
        parentHandle = parent.call._h
        parentAttempt = parent.attempt.number
      } else {
        // Another engine: inherit through propagation headers. A parent that
        // already finished (a task that outlived its attempt) passes nothing on.
        let hs = null
        try {
          hs = parent.attempt.headers
        } catch {
          hs = null
        }
        if (hs !== null) extra.inboundHeaders = headerPairs(hs, 'inboundHeaders')
      }
    } else if (spec.inboundHeaders !== undefined && spec.inboundHeaders !== null) {
      extra.inboundHeaders = headerPairs(spec.inboundHeaders, `${argName}.inboundHeaders`)
    }
    let text
    try {
      text = JSON.stringify(extra)
    } catch (e) {
      throw new TypeError(`${argName}.params must be JSON-serializable: ${e.message}`)
    }
    try {
      return this._n.beginEx(route, dl, idem, text, parentHandle, parentAttempt)
    } catch (e) {
      if (e && e.code === 'ERR_RETRYWISE_RELEASED') return this._n.beginEx(route, dl, idem, text, -1, 0)
      throw e
    }
  }

  /**
   * Begins one logical request. Inside another retrywise call (same async
   * context) the new call inherits its deadline and is a non-owner, unless
   * `spec.inherit === false`.
   */
  begin(spec) {
    const h = this._open(spec, 'spec')
    this._flush()
    const call = new Call(this, h)
    if (this._reg === null) this._reg = new FinalizationRegistry((handle) => this._n.release(handle))
    this._reg.register(call, h, call)
    return call
  }

  /**
   * Runs `fn(attempt)` under the engine: every retry, wait and fallback is
   * decided by the core. `fn` signals failure by throwing (errors with
   * `status`/`headers`, Node/undici network errors and AbortErrors are
   * understood) or by returning a non-2xx `Response`; `opts.classify(value)`
   * may map a resolved value to an outcome. Resolves with fn's value; rejects
   * with a `StoppedError` (cause: the last failure) when the core gives up.
   */
  async run(fn, opts) {
    if (typeof fn !== 'function') throw new TypeError(`fn must be a function; got ${describe(fn)}`)
    const o = opts === undefined ? {} : opts
    if (o === null || typeof o !== 'object') throw new TypeError('opts must be an object')
    const signal = o.signal
    if (signal !== undefined && signal !== null && !(signal instanceof AbortSignal)) throw new TypeError('opts.signal must be an AbortSignal')
    if (o.classify !== undefined && typeof o.classify !== 'function') throw new TypeError('opts.classify must be a function')
    if (signal && signal.aborted) throw signal.reason
    const spec = o.route === undefined ? { ...o, route: '' } : o
    return runLoop(this, new Call(this, this._open(spec, 'opts')), fn, o, signal)
  }

  _flush() {
    if (this._listeners === null) return
    const text = this._n.takeEvents()
    if (text === null) return
    const events = JSON.parse(text)
    const ls = this._listeners.slice()
    for (const ev of events) {
      for (const cb of ls) {
        try {
          cb(ev)
        } catch (err) {
          this._listenerErrors++
          if (this._listenerErrors === 1) process.emitWarning(`retrywise: an onEvent listener threw (${err && err.message}); further errors are counted in engine.listenerErrors`, 'RetrywiseWarning')
        }
      }
    }
  }

  /**
   * Registers an event listener; returns a function that removes it.
   * Listeners run synchronously on the JS thread, right after the native call
   * that produced the events (before `report()` / `nextAttempt()` return).
   * A listener that throws is counted (`listenerErrors`) and never affects a decision.
   */
  onEvent(cb) {
    if (typeof cb !== 'function') throw new TypeError(`cb must be a function; got ${describe(cb)}`)
    if (this._listeners === null) {
      this._listeners = []
      this._n.setListening(true)
    }
    this._listeners.push(cb)
    let on = true
    return () => {
      if (!on) return
      on = false
      const i = this._listeners ? this._listeners.indexOf(cb) : -1
      if (i >= 0) this._listeners.splice(i, 1)
      if (this._listeners && this._listeners.length === 0) {
        this._listeners = null
        this._n.setListening(false)
      }
    }
  }

  /** Listener exceptions swallowed so far. */
  get listenerErrors() {
    return this._listenerErrors
  }

  /** Events in the ring buffer, oldest first (`drain: true` takes them out). */
  events(opts) {
    return JSON.parse(opts && opts.drain ? this._n.drainEvents() : this._n.events())
  }

  stats() {
    return JSON.parse(this._n.stats())
  }

  prometheus() {
    return this._n.prometheus()
  }

  /** Swaps the policy; an invalid policy throws `PolicyError` and leaves the old one in force. */
  reload(policy) {
    const [kind, text] = policyArgs(policy)
    try {
      this._n.reload(kind, text)
    } catch (e) {
      throw translateNativeError(e)
    }
    this._flush()
  }

  /** The kill switch: `{ retries?, fallback?, hedging? }`; omitted fields keep their value. */
  setMode(mode) {
    if (mode === null || typeof mode !== 'object') throw new TypeError(`mode must be an object; got ${describe(mode)}`)
    const cur = this.mode()
    const next = { ...cur }
    for (const k of ['retries', 'fallback', 'hedging']) {
      if (mode[k] !== undefined) {
        if (typeof mode[k] !== 'boolean') throw new TypeError(`mode.${k} must be a boolean`)
        next[k] = mode[k]
      }
    }
    this._n.setMode(next.retries, next.fallback, next.hedging)
    this._flush()
  }

  mode() {
    const b = this._n.mode()
    return { retries: (b & 1) !== 0, fallback: (b & 2) !== 0, hedging: (b & 4) !== 0 }
  }

  reconcileList() {
    return JSON.parse(this._n.reconcileList())
  }

  drainReconcile() {
    return JSON.parse(this._n.drainReconcile())
  }

  breakerState(upstream) {
    if (typeof upstream !== 'string') throw new TypeError(`upstream must be a string; got ${describe(upstream)}`)
    return this._n.breakerState(upstream)
  }

  /** The policy in force (as the core serializes it). */
  policy() {
    return JSON.parse(this._n.policy())
  }

  get policyVersion() {
    return this._n.policyVersion()
  }

  /** Testing hook: moves the manual clock (engine built with `{ manualClock: true }`). */
  advanceClock(ms) {
    if (typeof ms !== 'number') throw new TypeError(`ms must be a number; got ${describe(ms)}`)
    this._n.advanceClock(ms)
  }

  /** Calls begun with `begin()` and not yet released or garbage-collected. */
  get liveCalls() {
    return this._n.liveCalls()
  }
}

// ---------------------------------------------------------------------------
// Call, Attempt, Decision
// ---------------------------------------------------------------------------

class Attempt {
  constructor(call, s) {
    const e = call._e
    this.number = s[1]
    const ui = s[2]
    this.upstream = ui >= 0 ? e._name(ui) : e._n.upstreamOfAttempt(call._h, s[1])
    this.timeouts = { connectMs: s[3], firstByteMs: s[4], idleMs: s[5], totalMs: s[6] }
    this.remainingMs = s[7]
    const f = s[8]
    this.hedge = (f & 1) !== 0
    this.fallback = (f & 2) !== 0
    this._signal = undefined
    this._run = null
    this._call = call
    this._headers = undefined
    this._requestId = undefined
  }

  /** Aborts when the attempt times out or the caller aborts (engine.run, wrapFetch). */
  get signal() {
    if (this._signal === undefined && this._run !== null) this._signal = this._run.signal()
    return this._signal
  }

  set signal(s) {
    this._signal = s
  }

  /** Propagation headers to add to this attempt's request (`retrywise-*`, `idempotency-key`). */
  get headers() {
    if (this._headers === undefined) {
      const flat = this._call._e._n.attemptHeaders(this._call._h, this.number)
      const h = {}
      for (let i = 0; i < flat.length; i += 2) h[flat[i]] = flat[i + 1]
      this._headers = h
    }
    return this._headers
  }

  /** Logical request id (shared by every attempt of the call). */
  get requestId() {
    if (this._requestId === undefined) this._requestId = this._call.id
    return this._requestId
  }

  toJSON() {
    return {
      number: this.number,
      upstream: this.upstream,
      timeouts: this.timeouts,
      headers: this.headers,
      hedge: this.hedge,
      fallback: this.fallback,
      requestId: this.requestId,
      remainingMs: this.remainingMs,
    }
  }
}

function decisionFromScratch(call) {
  const e = call._e
  const s = e._s
  const ui = s[4]
  const flags = s[9]
  const cls = s[2]
  const ra = s[6]
  const of = s[7]
  return {
    action: ACTION[s[0]],
    delayMs: s[1],
    errorClass: cls >= 0 ? ERROR_CLASS[cls] : null,
    reason: REASON[s[3]],
    upstream: ui >= 0 ? e._name(ui) : ui === -1 ? null : e._n.decisionUpstream(call._h),
    waitSource: WAIT_SOURCE[s[5]],
    retryAfterMs: ra >= 0 ? ra : null,
    onFailure: of >= 0 ? ON_FAILURE[of] : null,
    detail: (flags & 2) !== 0 ? e._n.detail(call._h) : null,
    attempt: s[8],
    hedge: (flags & 1) !== 0,
    excluded: (flags & 4) !== 0 ? pairsOf(e._n.excluded(call._h)) : [],
  }
}

function pairsOf(flat) {
  const out = []
  for (let i = 0; i < flat.length; i += 2) out.push([flat[i], flat[i + 1]])
  return out
}

function stoppedFromScratch(call, cause) {
  const e = call._e
  const s = e._s
  const cls = s[2]
  const of = s[3]
  return new StoppedError(
    {
      action: 'stop',
      reason: REASON[s[1]],
      errorClass: cls >= 0 ? ERROR_CLASS[cls] : null,
      onFailure: of >= 0 ? ON_FAILURE[of] : null,
      detail: s[4] === 1 ? e._n.detail(call._h) : null,
      attempts: e._n.callAttempts(call._h),
    },
    cause === undefined ? undefined : { cause },
  )
}

function stoppedFromDecision(call, d, cause, response) {
  return new StoppedError(
    {
      action: d.action,
      reason: d.reason,
      errorClass: d.errorClass,
      onFailure: d.onFailure,
      detail: d.detail,
      attempts: call._e._n.callAttempts(call._h),
      decision: d,
      response,
    },
    cause === undefined ? undefined : { cause },
  )
}

/** Outcome object -> native report; returns the action code (decision in scratch). */
function reportNative(call, outcome, argName) {
  const n = call._e._n
  const h = call._h
  if (outcome === undefined || outcome === null) return n.reportOk(h)
  if (typeof outcome !== 'object') throw new TypeError(`${argName} must be an object; got ${describe(outcome)}`)
  const st = outcome.status
  if (
    st !== undefined &&
    outcome.error === undefined &&
    outcome.headers === undefined &&
    outcome.phase === undefined &&
    outcome.vendorCode === undefined &&
    outcome.effect === undefined &&
    outcome.inputTokens === undefined &&
    outcome.body === undefined &&
    outcome.attempt === undefined &&
    outcome.ok === undefined
  ) {
    if (typeof st !== 'number' || !Number.isInteger(st) || st < 100 || st > 999) throw new TypeError(`${argName}.status must be an integer HTTP status (100-999); got ${describe(st)}`)
    return n.reportStatus(h, st)
  }
  let status = -1
  if (st !== undefined && st !== null) {
    if (typeof st !== 'number' || !Number.isInteger(st) || st < 100 || st > 999) throw new TypeError(`${argName}.status must be an integer HTTP status (100-999); got ${describe(st)}`)
    status = st
  }
  const error = outcome.error === undefined || outcome.error === null ? -1 : toCode('error', outcome.error, `${argName}.error`)
  const phase = outcome.phase === undefined || outcome.phase === null ? -1 : toCode('phase', outcome.phase, `${argName}.phase`)
  const effect = outcome.effect === undefined || outcome.effect === null ? -1 : toCode('effect', outcome.effect, `${argName}.effect`)
  let vendor = outcome.vendorCode
  if (vendor === undefined || vendor === null) vendor = null
  else if (typeof vendor !== 'string') throw new TypeError(`${argName}.vendorCode must be a string; got ${describe(vendor)}`)
  let tokens = -1
  if (outcome.inputTokens !== undefined && outcome.inputTokens !== null) {
    tokens = outcome.inputTokens
    if (typeof tokens !== 'number' || !Number.isInteger(tokens) || tokens < 0) throw new TypeError(`${argName}.inputTokens must be a non-negative integer`)
  }
  let attempt = 0
  if (outcome.attempt !== undefined && outcome.attempt !== null) {
    attempt = outcome.attempt
    if (typeof attempt !== 'number' || !Number.isInteger(attempt) || attempt < 1) throw new TypeError(`${argName}.attempt must be an attempt number >= 1`)
  }
  const ok = outcome.ok === true
  return n.report(h, status, error, phase, effect, vendor, flatHeaders(outcome.headers, `${argName}.headers`), tokens, bodyText(outcome.body, `${argName}.body`), attempt, ok)
}

function bodyText(body, argName) {
  if (body === undefined || body === null) return null
  if (typeof body === 'string') return body
  if (body instanceof ArrayBuffer) return Buffer.from(body).toString('utf8')
  if (ArrayBuffer.isView(body)) return Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8')
  if (typeof body === 'object') return JSON.stringify(body)
  throw new TypeError(`${argName} must be a string, bytes or an object; got ${describe(body)}`)
}

class Call {
  constructor(engine, h) {
    this._e = engine
    this._h = h
  }

  /** The next attempt to make; throws `StoppedError` when none may start. */
  nextAttempt() {
    const e = this._e
    const r = e._n.nextAttempt(this._h)
    e._flush()
    if (r === 0) return new Attempt(this, e._s)
    throw stoppedFromScratch(this)
  }

  /**
   * Reports the latest attempt's outcome (`outcome.attempt` names another one
   * when hedging); returns the decision.
   */
  report(outcome) {
    reportNative(this, outcome, 'outcome')
    this._e._flush()
    return decisionFromScratch(this)
  }

  /** Cancels the call: attempts in flight are reported as cancelled; returns the final decision. */
  cancel() {
    this._e._n.cancel(this._h)
    this._e._flush()
    return decisionFromScratch(this)
  }

  /**
   * Whether a hedged (parallel) attempt may start now:
   * `{ action: 'start', attempt }`, `{ action: 'wait', delayMs }` or `{ action: 'no', reason }`.
   */
  nextHedge() {
    const e = this._e
    const r = e._n.nextHedge(this._h)
    e._flush()
    if (r === 0) return { action: 'start', attempt: new Attempt(this, e._s) }
    if (r === 2) return { action: 'wait', delayMs: e._s[1] }
    return { action: 'no', reason: REASON[e._s[1]] }
  }

  get id() {
    return this._e._n.callId(this._h)
  }

  get attempts() {
    return this._e._n.callAttempts(this._h)
  }

  get remainingMs() {
    return this._e._n.callRemainingMs(this._h)
  }

  /** `{ id, attempts, remainingMs, owner, finished, policyVersion, target }`. */
  info() {
    return JSON.parse(this._e._n.callInfo(this._h))
  }

  /** Frees the native call now (otherwise it is freed when garbage-collected). */
  release() {
    if (this._e._reg) this._e._reg.unregister(this)
    this._release()
  }

  _release() {
    if (this._h >= 0) {
      this._e._n.release(this._h)
      this._h = -1
    }
  }
}

// ---------------------------------------------------------------------------
// Node / undici errors -> outcomes
// ---------------------------------------------------------------------------

/** Thrown into an attempt's AbortSignal when one of its timers fires. */
class AttemptTimeoutError extends RetrywiseError {
  constructor(kind, ms) {
    super(`retrywise: attempt ${kind.replace(/_/g, ' ')} after ${ms} ms`, 'ERR_RETRYWISE_TIMEOUT')
    this.name = 'TimeoutError'
    this.kind = kind
  }
}

const NET_CODES = {
  ECONNREFUSED: 'connect',
  EHOSTUNREACH: 'connect',
  ENETUNREACH: 'connect',
  EADDRNOTAVAIL: 'connect',
  ENOTFOUND: 'dns',
  EAI_AGAIN: 'dns',
  EAI_FAIL: 'dns',
  ECONNRESET: 'connection_reset',
  EPIPE: 'connection_reset',
  ECONNABORTED: 'connection_reset',
  UND_ERR_SOCKET: 'connection_reset',
  UND_ERR_CLOSED: 'connection_reset',
  ERR_STREAM_PREMATURE_CLOSE: 'connection_reset',
  UND_ERR_CONNECT_TIMEOUT: 'connect_timeout',
  UND_ERR_HEADERS_TIMEOUT: 'first_byte_timeout',
  UND_ERR_BODY_TIMEOUT: 'stream_idle_timeout',
  ETIMEDOUT: 'connect_timeout',
  ERR_TLS_CERT_ALTNAME_INVALID: 'tls',
  UND_ERR_RESPONSE_STATUS_CODE: 'other',
  UND_ERR_INVALID_ARG: 'other',
}

function netKind(err) {
  for (let e = err, i = 0; e && i < 6; e = e.cause, i++) {
    const c = e.code
    if (typeof c === 'string') {
      if (NET_CODES[c]) return NET_CODES[c]
      if (c.startsWith('ERR_SSL') || c.startsWith('ERR_TLS') || c.includes('CERT')) return 'tls'
    }
  }
  return null
}

/** Explicit outcome attached to an error: `throw new AttemptError(outcome)` or `err.retrywise = outcome`. */
class AttemptError extends Error {
  constructor(outcome, message, options) {
    super(message || 'retrywise attempt failed', options)
    this.name = 'AttemptError'
    this.retrywise = outcome
  }
}

function errorOutcome(err, attemptSignal, phase) {
  if (err && typeof err === 'object' && err.retrywise && typeof err.retrywise === 'object') return err.retrywise
  // A nested (non-owner) call gave up: classify the evidence it gave up on.
  if (err instanceof StoppedError && !(attemptSignal && attemptSignal.aborted)) {
    if (err.response) return { status: err.response.status, headers: err.response.headers, phase }
    if (err.cause !== undefined) return errorOutcome(err.cause, undefined, phase)
  }
  const timeout = attemptSignal && attemptSignal.aborted && attemptSignal.reason instanceof AttemptTimeoutError ? attemptSignal.reason : null
  if (timeout) return { error: timeout.kind, phase }
  if (err instanceof AttemptTimeoutError) return { error: err.kind, phase }
  if (err && typeof err === 'object') {
    const st = err.status
    if (typeof st === 'number' && Number.isInteger(st) && st >= 100 && st <= 999) {
      // An HTTP error object (e.g. an SDK's APIError): status, headers, vendor code.
      let vendor
      if (typeof err.code === 'string' && !/^(E[A-Z]+$|ERR_|UND_ERR)/.test(err.code)) vendor = err.code
      else if (typeof err.type === 'string') vendor = err.type
      let headers
      try {
        headers = err.headers ? headerPairs(err.headers, 'error.headers') : undefined
      } catch {
        headers = undefined
      }
      return { status: st, headers, vendorCode: vendor, body: vendor === undefined && err.error && typeof err.error === 'object' ? { error: err.error } : undefined, phase }
    }
    const k = netKind(err)
    if (k) return { error: k, phase }
    if (err.name === 'AbortError') return { error: 'cancelled', phase }
    if (err.name === 'TimeoutError') return { error: 'first_byte_timeout', phase }
    // JSON.parse of a truncated or garbled body (an SDK decoding the answer).
    if (err instanceof SyntaxError) return { error: 'malformed_response', phase }
  }
  return { error: 'other', phase }
}

/** Which ErrorKind the attempt's overall timer means (see the report: a candidate for the core). */
function totalTimeoutKind(attempt) {
  return attempt.timeouts.totalMs >= attempt.remainingMs ? 'deadline_exceeded' : 'first_byte_timeout'
}

// ---------------------------------------------------------------------------
// Sleeping and racing
// ---------------------------------------------------------------------------

function abortReason(signal) {
  return signal.reason !== undefined ? signal.reason : new DOMException('This operation was aborted', 'AbortError')
}

function sleep(ms, signal) {
  if (!(ms > 0)) return signal && signal.aborted ? Promise.reject(abortReason(signal)) : Promise.resolve()
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(abortReason(signal))
    const onAbort = () => {
      clearTimeout(t)
      reject(abortReason(signal))
    }
    const t = setTimeout(() => {
      if (signal) signal.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    if (signal) signal.addEventListener('abort', onAbort, { once: true })
  })
}

/** Per-attempt AbortController whose timer aborts with an AttemptTimeoutError; linked to the caller's signal. */
function attemptController(attempt, userSignal) {
  const ac = new AbortController()
  const total = attempt.timeouts.totalMs
  const kind = totalTimeoutKind(attempt)
  const timer = setTimeout(() => ac.abort(new AttemptTimeoutError(kind, total)), Math.max(0, total))
  let unlink = null
  if (userSignal) {
    const onAbort = () => ac.abort(abortReason(userSignal))
    if (userSignal.aborted) onAbort()
    else {
      userSignal.addEventListener('abort', onAbort, { once: true })
      unlink = () => userSignal.removeEventListener('abort', onAbort)
    }
  }
  return {
    ac,
    done() {
      clearTimeout(timer)
      if (unlink) unlink()
    },
    /** Keeps the timer without holding the process open (a body nobody reads). */
    unref() {
      timer.unref()
    },
  }
}

/** Resolves/rejects with `p`, or rejects as soon as `signal` aborts (the attempt is abandoned). */
function raceAbort(p, signal) {
  if (signal.aborted) return Promise.reject(signal.reason)
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason)
    signal.addEventListener('abort', onAbort, { once: true })
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort)
        resolve(v)
      },
      (e) => {
        signal.removeEventListener('abort', onAbort)
        reject(e)
      },
    )
  })
}

function isPromise(v) {
  return v !== null && typeof v === 'object' && typeof v.then === 'function'
}

// ---------------------------------------------------------------------------
// engine.run
// ---------------------------------------------------------------------------

/**
 * Attempt timers of engine.run share one Node timer: arming a timer per
 * attempt (setTimeout + clearTimeout) costs more than the decision itself.
 * The timer is armed for the earliest expiry and kept referenced only while
 * attempts are pending; expired attempts are found by a scan when it fires.
 */
const { performance } = require('node:perf_hooks')
const timerSet = {
  items: new Set(),
  armedAt: Infinity,
  timer: null,
  add(item) {
    this.items.add(item)
    if (item.at < this.armedAt) this.arm(item.at)
    else if (this.items.size === 1 && this.timer) this.timer.ref()
  },
  delete(item) {
    this.items.delete(item)
    if (this.items.size === 0 && this.timer) this.timer.unref()
  },
  arm(at) {
    if (this.timer) clearTimeout(this.timer)
    this.armedAt = at
    this.timer = setTimeout(() => this.fire(), Math.max(0, Math.ceil(at - performance.now())))
  },
  fire() {
    this.timer = null
    this.armedAt = Infinity
    const now = performance.now()
    let next = Infinity
    for (const it of this.items) {
      if (it.at <= now + 0.5) {
        this.items.delete(it)
        it.fire()
      } else if (it.at < next) next = it.at
    }
    if (next < Infinity) this.arm(next)
  },
}

/** One attempt of engine.run: its expiry, its (lazy) AbortSignal and the pending race. */
class RunAttempt {
  constructor(attempt) {
    this.attempt = attempt
    this.at = performance.now() + attempt.timeouts.totalMs
    this.ac = null
    this.reason = null
    this.reject = null
  }
  signal() {
    if (this.ac === null) {
      this.ac = new AbortController()
      if (this.reason !== null) this.ac.abort(this.reason)
    }
    return this.ac.signal
  }
  abort(reason) {
    if (this.reason !== null) return
    this.reason = reason
    if (this.ac !== null) this.ac.abort(reason)
    if (this.reject !== null) this.reject(reason)
  }
  fire() {
    const a = this.attempt
    this.abort(new AttemptTimeoutError(totalTimeoutKind(a), a.timeouts.totalMs))
  }
  race(p) {
    if (this.reason !== null) return Promise.reject(this.reason)
    return new Promise((resolve, reject) => {
      this.reject = reject
      p.then(resolve, reject)
    })
  }
}

async function runLoop(engine, call, fn, opts, signal) {
  const n = engine._n
  const s = engine._s
  const classify = opts.classify
  let lastErr
  let current = null
  let onAbort = null
  if (signal) {
    onAbort = () => {
      if (current !== null) current.abort(abortReason(signal))
    }
    signal.addEventListener('abort', onAbort, { once: true })
  }
  try {
    for (;;) {
      const r = n.nextAttempt(call._h)
      engine._flush()
      if (r !== 0) throw stoppedFromScratch(call, lastErr)
      const attempt = new Attempt(call, s)
      const ra = new RunAttempt(attempt)
      attempt._run = ra
      current = ra
      timerSet.add(ra)
      let value
      let outcome
      let failed = false
      let response
      try {
        value = als.run({ engine, call, attempt }, fn, attempt)
        if (isPromise(value)) value = await ra.race(value)
        else if (ra.reason !== null) throw ra.reason
        if (classify !== undefined) outcome = classify(value)
        else if (typeof Response !== 'undefined' && value instanceof Response) {
          response = value
          outcome = value.ok ? undefined : { status: value.status, headers: value.headers }
        }
      } catch (err) {
        timerSet.delete(ra)
        current = null
        if (signal && signal.aborted) {
          n.cancel(call._h)
          engine._flush()
          throw err
        }
        failed = true
        lastErr = err
        outcome = ra.reason instanceof AttemptTimeoutError ? { error: ra.reason.kind } : errorOutcome(err, null)
      }
      timerSet.delete(ra)
      current = null
      const action = outcome === undefined || outcome === null ? n.reportOk(call._h) : reportNative(call, outcome, 'classify() result')
      engine._flush()
      if (action === 0) return failed ? undefined : value
      const d = decisionFromScratch(call)
      if (action === 1 || action === 2) {
        if (response && response.body) response.body.cancel().catch(() => {})
        try {
          await sleep(d.delayMs, signal)
        } catch (err) {
          n.cancel(call._h)
          engine._flush()
          throw err
        }
        continue
      }
      throw stoppedFromDecision(call, d, failed ? lastErr : undefined, response)
    }
  } finally {
    if (onAbort !== null) signal.removeEventListener('abort', onAbort)
    call._release()
  }
}

// ---------------------------------------------------------------------------
// wrapFetch
// ---------------------------------------------------------------------------

const DECISION = Symbol.for('retrywise.decision')

/** The final decision behind a Response returned by a wrapped fetch (or null). */
function decisionOf(response) {
  return (response && response[DECISION]) || null
}

const MAX_ERROR_BODY = 1 << 20

async function readErrorBody(res) {
  if (!res.body) return ''
  const reader = res.body.getReader()
  const chunks = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > MAX_ERROR_BODY) {
      reader.cancel().catch(() => {})
      break
    }
    chunks.push(value)
  }
  return Buffer.concat(chunks.map((c) => Buffer.from(c.buffer, c.byteOffset, c.byteLength)))
}

function rebuildResponse(res, body, decision) {
  const out = new Response(res.status === 204 || res.status === 304 ? null : body, {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
  })
  if (res.url) Object.defineProperty(out, 'url', { value: res.url })
  if (decision) out[DECISION] = decision
  return out
}

/**
 * Wraps `fetch` so that retrywise owns its retries. `opts` is the call spec
 * (`route`, `deadlineMs`, `idempotency`, `tenant`, ...) for every request;
 * `init.retrywise` overrides it per request.
 */
function wrapFetch(engine, fetchImpl, opts) {
  if (!(engine instanceof Engine)) throw new TypeError(`engine must be a retrywise Engine; got ${describe(engine)}`)
  const f = fetchImpl === undefined || fetchImpl === null ? globalThis.fetch : fetchImpl
  if (typeof f !== 'function') throw new TypeError(`fetch must be a function; got ${describe(fetchImpl)}`)
  const defaults = opts === undefined ? {} : opts
  if (defaults === null || typeof defaults !== 'object') throw new TypeError('opts must be an object')
  if (defaults.route !== undefined && typeof defaults.route !== 'string') throw new TypeError('opts.route must be a string')

  return async function retrywiseFetch(input, init) {
    const req = await normalizeRequest(input, init)
    const spec = { ...defaults, ...(init && init.retrywise ? init.retrywise : {}) }
    // No route: the core looks the route up by task (empty route name).
    if (spec.route === undefined) spec.route = ''
    const call = new Call(engine, engine._open(spec, 'opts'))
    const fc = new FetchCall(engine, call, f, req)
    let handedOver = false
    try {
      const res = await fc.next()
      handedOver = res.handedOver
      return res.response
    } finally {
      if (!handedOver) call._release()
    }
  }
}

async function normalizeRequest(input, init) {
  const i = init || {}
  let url
  let method
  let headers
  let body
  let signal
  const rest = {}
  if (typeof Request !== 'undefined' && input instanceof Request) {
    url = input.url
    method = input.method
    headers = new Headers(input.headers)
    signal = input.signal
    if (input.body !== null && i.body === undefined) body = new Uint8Array(await input.arrayBuffer())
    for (const k of ['redirect', 'credentials', 'mode', 'cache', 'referrer', 'referrerPolicy', 'integrity', 'keepalive']) {
      if (input[k] !== undefined) rest[k] = input[k]
    }
  } else if (typeof input === 'string' || input instanceof URL) {
    url = String(input)
  } else if (input && typeof input === 'object' && typeof input.url === 'string') {
    url = input.url
  } else {
    throw new TypeError(`input must be a URL string, a URL or a Request; got ${describe(input)}`)
  }
  for (const k of Object.keys(i)) {
    if (k === 'headers' || k === 'body' || k === 'signal' || k === 'method' || k === 'retrywise') continue
    rest[k] = i[k]
  }
  if (i.method !== undefined) method = i.method
  if (i.headers !== undefined) headers = new Headers(headerPairs(i.headers, 'init.headers'))
  if (!headers) headers = new Headers()
  if (i.signal !== undefined && i.signal !== null) signal = i.signal
  if (i.body !== undefined) body = i.body
  // A stream can be read once: buffer it so every attempt sends the same bytes.
  if (body && typeof body === 'object' && (body instanceof ReadableStream || (Symbol.asyncIterator in body && !(body instanceof Uint8Array)))) {
    const chunks = []
    for await (const c of body) chunks.push(typeof c === 'string' ? Buffer.from(c) : Buffer.from(c))
    body = Buffer.concat(chunks)
    delete rest.duplex
  }
  return { url, method, headers, body, signal, rest }
}

class FetchCall {
  constructor(engine, call, fetchImpl, req) {
    this.engine = engine
    this.call = call
    this.fetch = fetchImpl
    this.req = req
    this.lastResponse = null
    this.lastErr = undefined
  }

  _abortIfUser() {
    const sig = this.req.signal
    if (sig && sig.aborted) {
      this.engine._n.cancel(this.call._h)
      this.engine._flush()
      throw abortReason(sig)
    }
  }

  _report(outcome) {
    reportNative(this.call, outcome, 'outcome')
    this.engine._flush()
    return decisionFromScratch(this.call)
  }

  /**
   * Runs attempts until one returns a 2xx/3xx response (its body wrapped so
   * the success is reported when the body ends) or the core stops.
   * Returns `{ response, handedOver }` (handedOver: the body wrapper now owns the call).
   */
  async next(splice) {
    const { engine, call, req } = this
    const n = engine._n
    for (;;) {
      const r = n.nextAttempt(call._h)
      engine._flush()
      if (r !== 0) {
        // No attempt may start (deadline, breaker, ...): surface the last failure as it was.
        if (this.lastResponse) return { response: this.lastResponse, handedOver: false }
        throw stoppedFromScratch(call, this.lastErr)
      }
      const attempt = new Attempt(call, engine._s)
      const headers = new Headers(req.headers)
      const ph = attempt.headers
      for (const k in ph) headers.set(k, ph[k])
      const ctl = attemptController(attempt, req.signal)
      attempt.signal = ctl.ac.signal
      // No response headers within connect + first-byte: the request may have been received.
      const hdrMs = Math.min(attempt.timeouts.connectMs + attempt.timeouts.firstByteMs, attempt.timeouts.totalMs)
      const hdrTimer = hdrMs < attempt.timeouts.totalMs ? setTimeout(() => ctl.ac.abort(new AttemptTimeoutError('first_byte_timeout', hdrMs)), hdrMs) : null
      const init = { ...req.rest, method: req.method, headers, body: req.body, signal: ctl.ac.signal }
      let res
      try {
        res = await raceAbort(
          als.run({ engine, call, attempt }, () => this.fetch(req.url, init)),
          ctl.ac.signal,
        )
      } catch (err) {
        if (hdrTimer) clearTimeout(hdrTimer)
        ctl.done()
        this._abortIfUser()
        this.lastErr = err
        this.lastResponse = null
        const d = this._report(errorOutcome(err, ctl.ac.signal))
        if (d.action === 'retry' || d.action === 'fallback') {
          await this._sleep(d)
          continue
        }
        throw stoppedFromDecision(call, d, err)
      }
      if (hdrTimer) clearTimeout(hdrTimer)
      if (res.status >= 400 || res.status < 200) {
        let body
        try {
          body = await raceAbort(readErrorBody(res), ctl.ac.signal)
        } catch (err) {
          ctl.done()
          this._abortIfUser()
          this.lastErr = err
          this.lastResponse = null
          const d = this._report({ status: res.status, headers: res.headers, ...errorOutcome(err, ctl.ac.signal), phase: 'headers' })
          if (d.action === 'retry' || d.action === 'fallback') {
            await this._sleep(d)
            continue
          }
          throw stoppedFromDecision(call, d, err)
        }
        ctl.done()
        const d = this._report({ status: res.status, headers: res.headers, body })
        this.lastErr = undefined
        this.lastResponse = rebuildResponse(res, body, d)
        if (d.action === 'retry' || d.action === 'fallback') {
          await this._sleep(d)
          continue
        }
        return { response: this.lastResponse, handedOver: false }
      }
      if (!res.body) {
        ctl.done()
        const d = this._report({ status: res.status })
        const out = rebuildResponse(res, null, d)
        return { response: out, handedOver: false }
      }
      const parts = { res, attempt, ctl, reader: res.body.getReader() }
      if (splice) return { parts, handedOver: true }
      return { response: this._wrapBody(parts), handedOver: true }
    }
  }

  async _sleep(d) {
    try {
      await sleep(d.delayMs, this.req.signal)
    } catch (err) {
      this.engine._n.cancel(this.call._h)
      this.engine._flush()
      throw err
    }
  }

  /**
   * The success response with its body wrapped: the idle timer runs between
   * chunks, the end of the body reports success, and a failure reports phase
   * `stream_open` (nothing delivered yet: the core may retry, and the next
   * attempt's body is spliced in) or `stream_visible` (bytes were delivered:
   * never replayed).
   */
  _wrapBody(first) {
    const self = this
    const engine = this.engine
    const res = first.res
    let cur = first
    let delivered = 0
    let finished = false
    let idle = null
    const armIdle = () => {
      if (idle) clearTimeout(idle)
      const ms = cur.attempt.timeouts.idleMs
      const c = cur.ctl
      idle = setTimeout(() => c.ac.abort(new AttemptTimeoutError('stream_idle_timeout', ms)), ms)
    }
    const stopTimers = () => {
      if (idle) clearTimeout(idle)
      idle = null
      cur.ctl.done()
    }
    const finish = () => {
      finished = true
      stopTimers()
      self.call._release()
    }
    let pulling = false
    let ctrl = null
    const readOnce = () => raceAbort(cur.reader.read(), cur.ctl.ac.signal)
    // The attempt's timer (or the caller's signal) may fire while nobody reads the
    // body: report it then, so an unread body cannot keep the call open.
    const watch = (parts) => {
      parts.ctl.unref()
      parts.ctl.ac.signal.addEventListener(
        'abort',
        () => {
          if (pulling || finished || cur !== parts) return
          const reason = parts.ctl.ac.signal.reason
          stopTimers()
          parts.reader.cancel(reason).catch(() => {})
          const sig = self.req.signal
          let e
          if (sig && sig.aborted) {
            engine._n.cancel(self.call._h)
            engine._flush()
            e = abortReason(sig)
          } else {
            const phase = delivered > 0 ? 'stream_visible' : 'stream_open'
            const d = self._report({ status: parts.res.status, ...errorOutcome(reason, parts.ctl.ac.signal, phase), phase })
            e = stoppedFromDecision(self.call, d, reason)
          }
          finish()
          if (ctrl) ctrl.error(e)
        },
        { once: true },
      )
    }
    watch(first)
    const stream = new ReadableStream(
      {
        start(controller) {
          ctrl = controller
        },
        async pull(controller) {
          pulling = true
          try {
            await pullOnce(controller)
          } finally {
            pulling = false
          }
        },
        cancel(reason) {
          if (finished) return
          stopTimers()
          cur.reader.cancel(reason).catch(() => {})
          engine._n.cancel(self.call._h)
          engine._flush()
          finish()
        },
      },
      { highWaterMark: 0 },
    )
    async function pullOnce(controller) {
      if (finished) return
      for (;;) {
        armIdle()
        let chunk
        try {
          chunk = await readOnce()
        } catch (err) {
          stopTimers()
          cur.reader.cancel(err).catch(() => {})
          const sig = self.req.signal
          if (sig && sig.aborted) {
            engine._n.cancel(self.call._h)
            engine._flush()
            finish()
            controller.error(abortReason(sig))
            return
          }
          const phase = delivered > 0 ? 'stream_visible' : 'stream_open'
          const d = self._report({ status: cur.res.status, ...errorOutcome(err, cur.ctl.ac.signal, phase), phase })
          if (delivered === 0 && (d.action === 'retry' || d.action === 'fallback')) {
            try {
              await self._sleep(d)
              self.lastErr = err
              const next = await self.next(true)
              if (!next.parts) {
                // The retry ended in an error response or a stop: surface it on the stream.
                const e3 = stoppedFromDecision(self.call, decisionOf(next.response) || d, err, next.response)
                finish()
                controller.error(e3)
                return
              }
              cur = next.parts
              watch(cur)
              continue
            } catch (e2) {
              finish()
              controller.error(e2)
              return
            }
          }
          const stopped = stoppedFromDecision(self.call, d, err)
          finish()
          controller.error(stopped)
          return
        }
        if (chunk.done) {
          stopTimers()
          self._report({ status: cur.res.status })
          finish()
          controller.close()
          return
        }
        const v = chunk.value
        if (v && v.byteLength > 0) {
          delivered += v.byteLength
          controller.enqueue(v)
          return
        }
      }
    }
    const out = new Response(stream, { status: res.status, statusText: res.statusText, headers: res.headers })
    if (res.url) Object.defineProperty(out, 'url', { value: res.url })
    return out
  }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/** SHA-256 (hex) of the canonical JSON of `params` (object keys sorted). */
function paramsDigest(params) {
  let text
  try {
    text = JSON.stringify(params)
  } catch (e) {
    throw new TypeError(`params must be JSON-serializable: ${e.message}`)
  }
  if (text === undefined) throw new TypeError(`params must be JSON-serializable; got ${describe(params)}`)
  return native.paramsDigest(text)
}

/** `rw1_` + 32 hex digits derived from tenant, operation and a params digest. */
function deriveIdempotencyKey(tenant, operation, digest) {
  for (const [name, v] of [
    ['tenant', tenant],
    ['operation', operation],
    ['digest', digest],
  ]) {
    if (typeof v !== 'string') throw new TypeError(`${name} must be a string; got ${describe(v)}`)
  }
  return native.deriveIdempotencyKey(tenant, operation, digest)
}

/** Vendor error code of an OpenAI- or Anthropic-style error body (or null). */
function vendorCodeFromBody(body) {
  return native.vendorCodeFromBody(bodyText(body, 'body') || '')
}

/** JSON Schema of the policy document. */
function policySchema() {
  return JSON.parse(native.policySchema())
}

module.exports = {
  Engine,
  Call,
  Attempt,
  RetrywiseError,
  PolicyError,
  StoppedError,
  AttemptError,
  AttemptTimeoutError,
  wrapFetch,
  decisionOf,
  currentAttempt,
  paramsDigest,
  deriveIdempotencyKey,
  vendorCodeFromBody,
  policySchema,
  version: VOCAB.version,
  vocabulary: {
    errorClass: VOCAB.errorClass.slice(),
    phase: VOCAB.phase.slice(),
    errorKind: VOCAB.errorKind.slice(),
    idempotency: VOCAB.idempotency.slice(),
    effect: VOCAB.effect.slice(),
    action: VOCAB.action.slice(),
    waitSource: VOCAB.waitSource.slice(),
    reason: VOCAB.reason.slice(),
  },
}
