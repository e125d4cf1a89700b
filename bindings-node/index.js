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

// ---------------------------------------------------------------------------
// Scratch layout: slot indices by name, from the addon (src/scratch.rs), resolved once
// ---------------------------------------------------------------------------

const SCRATCH = VOCAB.scratch
const SCRATCH_LEN = SCRATCH.len

/** Index of scratch slot `group.name`; throws when the addon has no such slot (a build of another version). */
function slot(group, name) {
  const g = SCRATCH.slots[group]
  const i = g === undefined ? undefined : g[name]
  if (!Number.isInteger(i) || i < 0 || i >= SCRATCH_LEN) throw new Error(`retrywise: the native addon has no scratch slot ${group}.${name}: index.js and the addon are from different builds`)
  return i
}

/** A result code or flag bit the scratch carries. */
function code(table, name) {
  const v = SCRATCH[table][name]
  if (!Number.isInteger(v)) throw new Error(`retrywise: the native addon has no scratch ${table} code ${name}: index.js and the addon are from different builds`)
  return v
}

// An admitted attempt.
const ATTEMPT_NUMBER = slot('attempt', 'NUMBER')
const ATTEMPT_UPSTREAM = slot('attempt', 'UPSTREAM')
const ATTEMPT_CONNECT_MS = slot('attempt', 'CONNECT_MS')
const ATTEMPT_FIRST_BYTE_MS = slot('attempt', 'FIRST_BYTE_MS')
const ATTEMPT_IDLE_MS = slot('attempt', 'IDLE_MS')
const ATTEMPT_TOTAL_MS = slot('attempt', 'TOTAL_MS')
const ATTEMPT_REMAINING_MS = slot('attempt', 'REMAINING_MS')
const ATTEMPT_FLAGS = slot('attempt', 'FLAGS')
const ATTEMPT_STAMP = slot('attempt', 'STAMP')
// No attempt may start.
const STOPPED_REASON = slot('stopped', 'REASON')
const STOPPED_CLASS = slot('stopped', 'CLASS')
const STOPPED_ON_FAILURE = slot('stopped', 'ON_FAILURE')
const STOPPED_HAS_DETAIL = slot('stopped', 'HAS_DETAIL')
// A decision.
const DECISION_ACTION = slot('decision', 'ACTION')
const DECISION_DELAY_MS = slot('decision', 'DELAY_MS')
const DECISION_CLASS = slot('decision', 'CLASS')
const DECISION_REASON = slot('decision', 'REASON')
const DECISION_UPSTREAM = slot('decision', 'UPSTREAM')
const DECISION_WAIT_SOURCE = slot('decision', 'WAIT_SOURCE')
const DECISION_RETRY_AFTER_MS = slot('decision', 'RETRY_AFTER_MS')
const DECISION_ON_FAILURE = slot('decision', 'ON_FAILURE')
const DECISION_ATTEMPT = slot('decision', 'ATTEMPT')
const DECISION_FLAGS = slot('decision', 'FLAGS')
// A hedge plan.
const HEDGE_AFTER_WAIT_MS = slot('hedge_after', 'WAIT_MS')
const HEDGE_NO_REASON = slot('hedge_no', 'REASON')
// What every step leaves.
const STEP_RESULT = slot('step', 'RESULT')
const STEP_HANDLE = slot('step', 'HANDLE')
const STEP_IDLE = slot('step', 'IDLE')
const STEP_PENDING_RELEASE = slot('step', 'PENDING_RELEASE')
// Arguments of the fast entry points.
const BEGIN_ROUTE = slot('begin', 'ROUTE')
const BEGIN_DEADLINE_MS = slot('begin', 'DEADLINE_MS')
const BEGIN_IDEMPOTENCY = slot('begin', 'IDEMPOTENCY')
const BEGIN_TENANT = slot('begin', 'TENANT')
const NEXT_HANDLE = slot('next', 'HANDLE')
const NEXT_STAMP = slot('next', 'STAMP')
const REPORT_HANDLE = slot('report', 'HANDLE')
const REPORT_STATUS = slot('report', 'STATUS')
const REPORT_RELEASE = slot('report', 'RELEASE')
const RELEASE_HANDLE = slot('release', 'HANDLE')
// Result codes and flag bits.
const RESULT_ATTEMPT = code('results', 'ATTEMPT')
const RESULT_HEDGE_START = code('results', 'HEDGE_START')
const RESULT_HEDGE_AFTER = code('results', 'HEDGE_AFTER')
const FLAG_ATTEMPT_HEDGE = code('flags', 'ATTEMPT_HEDGE')
const FLAG_ATTEMPT_FALLBACK = code('flags', 'ATTEMPT_FALLBACK')
const FLAG_DECISION_HEDGE = code('flags', 'DECISION_HEDGE')
const FLAG_DECISION_DETAIL = code('flags', 'DECISION_DETAIL')
const FLAG_DECISION_EXCLUDED = code('flags', 'DECISION_EXCLUDED')

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
const ACTION_SUCCEEDED = ACTION.indexOf('succeeded')
const ACTION_RETRY = ACTION.indexOf('retry')
const ACTION_FALLBACK = ACTION.indexOf('fallback')
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

// The store is the Attempt itself (its call and engine are attempt._call, attempt._call._e).
const als = new AsyncLocalStorage()
const NO_OPTS = Object.freeze({})

/** The innermost retrywise attempt the caller runs inside, or undefined. */
function currentAttempt() {
  return als.getStore()
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
/** Calls begun in one job checked for the GC safety net at once (see Engine#_track). */
const PEND_BATCH = 256
// Released calls that hold nothing wait in scratch[STEP_PENDING_RELEASE], where
// the next native begin frees them (no crossing of their own); one that finds
// the slot taken joins a batch freed this many at a time (one crossing).
const RELEASE_BATCH = 64

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
    // On a SharedArrayBuffer, which cannot be detached: the native steps then
    // need no check that it still is attached (see src/scratch.rs).
    this._s = new Float64Array(new SharedArrayBuffer(SCRATCH_LEN * Float64Array.BYTES_PER_ELEMENT))
    try {
      this._n = new native.NativeEngine(this._s, kind, text, seedArg(o.seed), o.manualClock === true)
    } catch (e) {
      throw translateNativeError(e)
    }
    // Fast entry points (arguments and results in this._s, see src/fast.rs).
    this._f = this._n.fast()
    this._names = []
    // Route and tenant names interned by the native engine (name -> id).
    this._ids = new Map()
    this._idsFull = false
    this._lastRoute = null
    this._lastRouteId = -1
    this._listeners = null
    this._listenerErrors = 0
    this._reg = null
    // Calls begun since the last microtask, registered for garbage collection
    // only if still unreleased then (a FinalizationRegistry register +
    // unregister costs more than the whole decision cycle).
    this._pend = new Array(PEND_BATCH).fill(undefined)
    this._pendN = 0
    this._pendQueued = false
    this._pendFlush = () => this._trackPending(true)
    // Handles of released calls that hold nothing, freed by the next batch
    // (one more place for the one in scratch[STEP_PENDING_RELEASE]).
    this._rel = new Float64Array(RELEASE_BATCH + 1)
    this._relN = 0
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

  /** Id of an interned route or tenant name, or -1 (table full: pass the string). */
  _sid(name) {
    let id = this._ids.get(name)
    if (id === undefined) {
      if (this._idsFull) return -1
      id = this._n.intern(name)
      if (id < 0) {
        this._idsFull = true
        return -1
      }
      this._ids.set(name, id)
    }
    return id
  }

  _routeId(route) {
    if (route === this._lastRoute) return this._lastRouteId
    const id = this._sid(route)
    if (id >= 0) {
      this._lastRoute = route
      this._lastRouteId = id
    }
    return id
  }

  /**
   * Opens a native call for `spec` (nesting-aware); returns its handle. With
   * `first`, the call's first attempt is asked for in the same step:
   * scratch[STEP_RESULT] is RESULT_ATTEMPT (attempt fields in scratch, stamped)
   * or not (stop fields in scratch).
   */
  _open(spec, argName, first) {
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
    const s = this._s
    if (simple) {
      const rid = this._routeId(route)
      const tid = tenant === undefined || tenant === null ? -1 : this._sid(tenant)
      if (rid >= 0 && (tid >= 0 || tenant === undefined || tenant === null)) {
        s[BEGIN_ROUTE] = rid
        s[BEGIN_DEADLINE_MS] = dl
        s[BEGIN_IDEMPOTENCY] = idem
        s[BEGIN_TENANT] = tid
        if (first) this._f.beginAttempt()
        else this._f.begin()
        return s[STEP_HANDLE]
      }
      const h = this._n.begin(route, dl, idem, tenant)
      if (first) this._next(h, 1)
      return h
    }
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
      const pc = parent._call
      if (pc._e === this && pc._h >= 0) {
        parentHandle = pc._h
        parentAttempt = parent.number
      } else {
        // Another engine: inherit through propagation headers. A parent that
        // already finished (a task that outlived its attempt) passes nothing on.
        let hs = null
        try {
          hs = parent.headers
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
      return this._n.beginEx(route, dl, idem, text, parentHandle, parentAttempt, first === true)
    } catch (e) {
      if (e && e.code === 'ERR_RETRYWISE_RELEASED') return this._n.beginEx(route, dl, idem, text, -1, 0, first === true)
      throw e
    }
  }

  /** Asks for the next attempt of call `h` (stamped when `stamp` is 1); returns the result code (RESULT_ATTEMPT or stopped), also in scratch[STEP_RESULT]. */
  _next(h, stamp) {
    const s = this._s
    s[NEXT_HANDLE] = h
    s[NEXT_STAMP] = stamp
    this._f.next()
    return s[STEP_RESULT]
  }

  /**
   * Frees call `h` at the next native begin, or with the next batch, by the
   * end of the current job at the latest. Only for a call that holds nothing
   * (its drop gives nothing back, so freeing it later changes no decision).
   */
  _releaseLater(h) {
    const s = this._s
    const waiting = s[STEP_PENDING_RELEASE]
    s[STEP_PENDING_RELEASE] = h
    if (waiting >= 0) {
      this._rel[this._relN++] = waiting
      if (this._relN === RELEASE_BATCH) return this._releaseBatch()
    }
    if (!this._pendQueued) {
      this._pendQueued = true
      queueMicrotask(this._pendFlush)
    }
  }

  /** Frees every call waiting to be freed (see `_releaseLater`). */
  _releaseBatch() {
    const s = this._s
    const waiting = s[STEP_PENDING_RELEASE]
    if (waiting >= 0) {
      s[STEP_PENDING_RELEASE] = -1
      this._rel[this._relN++] = waiting
    }
    const n = this._relN
    if (n === 0) return
    this._relN = 0
    if (n === 1) {
      s[RELEASE_HANDLE] = this._rel[0]
      this._f.release()
    } else this._n.releaseMany(this._rel, n)
  }

  /** Registers `call` with the GC safety net unless it is released before the next microtask. */
  _track(call) {
    if (!this._pendQueued) {
      this._pendQueued = true
      queueMicrotask(this._pendFlush)
    }
    this._pend[this._pendN++] = call
    if (this._pendN === PEND_BATCH) this._trackPending(false)
  }

  _trackPending(last) {
    if (last) {
      this._pendQueued = false
      this._releaseBatch()
    }
    const p = this._pend
    const n = this._pendN
    this._pendN = 0
    for (let i = 0; i < n; i++) {
      const c = p[i]
      p[i] = undefined
      if (c._h >= 0) {
        if (this._reg === null) this._reg = new FinalizationRegistry((handle) => this._n.release(handle))
        this._reg.register(c, c._h, c)
        c._tracked = true
      }
    }
  }

  /**
   * Begins one logical request. Inside another retrywise call (same async
   * context) the new call inherits its deadline and is a non-owner, unless
   * `spec.inherit === false`.
   */
  begin(spec) {
    const h = this._open(spec, 'spec', false)
    this._flush()
    const call = new Call(this, h)
    this._track(call)
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
  run(fn, opts) {
    if (typeof fn !== 'function') return Promise.reject(new TypeError(`fn must be a function; got ${describe(fn)}`))
    const o = opts === undefined ? NO_OPTS : opts
    if (o === null || typeof o !== 'object') return Promise.reject(new TypeError('opts must be an object'))
    const signal = o.signal
    if (signal !== undefined && signal !== null && !(signal instanceof AbortSignal)) return Promise.reject(new TypeError('opts.signal must be an AbortSignal'))
    const classify = o.classify
    if (classify !== undefined && typeof classify !== 'function') return Promise.reject(new TypeError('opts.classify must be a function'))
    if (signal && signal.aborted) return Promise.reject(signal.reason)
    const spec = o.route === undefined ? { ...o, route: '' } : o
    let h
    try {
      h = this._open(spec, 'opts', true)
    } catch (e) {
      return Promise.reject(e)
    }
    const p = new Promise(captureResolvers)
    const r = new Run(this, new Call(this, h), fn, classify, signal || null, capturedResolve, capturedReject)
    capturedResolve = capturedReject = null
    try {
      r.admitted()
    } catch (e) {
      r.finish(false, e)
    }
    return p
  }

  _flush() {
    if (this._listeners === null) return
    const text = this._n.takeEvents()
    if (text === null) return
    const events = JSON.parse(text)
    const ls = this._listeners.slice()
    // The step's results are still in scratch: a listener that calls into
    // this engine must not overwrite them before the caller reads them.
    const saved = this._s.slice()
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
    this._s.set(saved)
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
    this._releaseBatch()
    return this._n.liveCalls()
  }
}

// ---------------------------------------------------------------------------
// Call, Attempt, Decision
// ---------------------------------------------------------------------------

class Attempt {
  constructor(call, s) {
    const e = call._e
    this.number = s[ATTEMPT_NUMBER]
    const ui = s[ATTEMPT_UPSTREAM]
    this.upstream = ui >= 0 ? e._name(ui) : e._n.upstreamOfAttempt(call._h, s[ATTEMPT_NUMBER])
    this.timeouts = { connectMs: s[ATTEMPT_CONNECT_MS], firstByteMs: s[ATTEMPT_FIRST_BYTE_MS], idleMs: s[ATTEMPT_IDLE_MS], totalMs: s[ATTEMPT_TOTAL_MS] }
    this.remainingMs = s[ATTEMPT_REMAINING_MS]
    const f = s[ATTEMPT_FLAGS]
    this.hedge = (f & FLAG_ATTEMPT_HEDGE) !== 0
    this.fallback = (f & FLAG_ATTEMPT_FALLBACK) !== 0
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
  const ui = s[DECISION_UPSTREAM]
  const flags = s[DECISION_FLAGS]
  const cls = s[DECISION_CLASS]
  const ra = s[DECISION_RETRY_AFTER_MS]
  const of = s[DECISION_ON_FAILURE]
  return {
    action: ACTION[s[DECISION_ACTION]],
    delayMs: s[DECISION_DELAY_MS],
    errorClass: cls >= 0 ? ERROR_CLASS[cls] : null,
    reason: REASON[s[DECISION_REASON]],
    upstream: ui >= 0 ? e._name(ui) : ui === -1 ? null : e._n.decisionUpstream(call._h),
    waitSource: WAIT_SOURCE[s[DECISION_WAIT_SOURCE]],
    retryAfterMs: ra >= 0 ? ra : null,
    onFailure: of >= 0 ? ON_FAILURE[of] : null,
    detail: (flags & FLAG_DECISION_DETAIL) !== 0 ? e._n.detail(call._h) : null,
    attempt: s[DECISION_ATTEMPT],
    hedge: (flags & FLAG_DECISION_HEDGE) !== 0,
    excluded: (flags & FLAG_DECISION_EXCLUDED) !== 0 ? pairsOf(e._n.excluded(call._h)) : [],
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
  const cls = s[STOPPED_CLASS]
  const of = s[STOPPED_ON_FAILURE]
  return new StoppedError(
    {
      action: 'stop',
      reason: REASON[s[STOPPED_REASON]],
      errorClass: cls >= 0 ? ERROR_CLASS[cls] : null,
      onFailure: of >= 0 ? ON_FAILURE[of] : null,
      detail: s[STOPPED_HAS_DETAIL] === 1 ? e._n.detail(call._h) : null,
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
  const e = call._e
  const n = e._n
  const h = call._h
  if (outcome === undefined || outcome === null) return reportOk(call, 0)
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
    const s = e._s
    s[REPORT_HANDLE] = h
    s[REPORT_STATUS] = st
    s[REPORT_RELEASE] = 0
    e._f.reportStatus()
    return s[STEP_RESULT]
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
  return n.report(h, status, error, phase, effect, vendor, flatHeaders(outcome.headers, `${argName}.headers`), tokens, bodyBytes(outcome.body, `${argName}.body`), attempt, ok)
}

/**
 * Reports a success with no status for the latest attempt; with `release` 1, a
 * call that succeeded is released in the same step. Returns the action code.
 */
function reportOk(call, release) {
  const e = call._e
  const s = e._s
  s[REPORT_HANDLE] = call._h
  s[REPORT_RELEASE] = release
  e._f.reportOk()
  if (s[STEP_HANDLE] === 1) call._h = -1
  return s[STEP_RESULT]
}

const EMPTY_BODY = new Uint8Array(0)

/** A body as the bytes the core reads (a string as UTF-8, an object as JSON); null when absent. */
function bodyBytes(body, argName) {
  if (body === undefined || body === null) return null
  if (body instanceof Uint8Array) return body
  if (typeof body === 'string') return Buffer.from(body, 'utf8')
  if (body instanceof ArrayBuffer) return new Uint8Array(body)
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength)
  if (typeof body === 'object') return Buffer.from(JSON.stringify(body), 'utf8')
  throw new TypeError(`${argName} must be a string, bytes or an object; got ${describe(body)}`)
}

class Call {
  constructor(engine, h) {
    this._e = engine
    this._h = h
    this._tracked = false
    // The last report left nothing held (scratch[STEP_IDLE]): release() may batch.
    this._idle = false
  }

  /** The next attempt to make; throws `StoppedError` when none may start. */
  nextAttempt() {
    const e = this._e
    this._idle = false
    const r = e._next(this._h, 0)
    e._flush()
    if (r === RESULT_ATTEMPT) return new Attempt(this, e._s)
    throw stoppedFromScratch(this)
  }

  /**
   * Reports the latest attempt's outcome (`outcome.attempt` names another one
   * when hedging); returns the decision.
   */
  report(outcome) {
    reportNative(this, outcome, 'outcome')
    this._idle = this._e._s[STEP_IDLE] === 1
    this._e._flush()
    return decisionFromScratch(this)
  }

  /** Cancels the call: attempts in flight are reported as cancelled; returns the final decision. */
  cancel() {
    this._idle = false
    this._e._n.cancel(this._h)
    this._e._flush()
    return decisionFromScratch(this)
  }

  /**
   * Whether a hedged (parallel) attempt may start now:
   * `{ action: 'start', attempt }`, `{ action: 'after', delayMs }` (ask again then) or
   * `{ action: 'no', reason }`: the core's `HedgePlan`, named as in the Python and C bindings.
   */
  nextHedge() {
    const e = this._e
    this._idle = false
    const r = e._n.nextHedge(this._h)
    e._flush()
    if (r === RESULT_HEDGE_START) return { action: 'start', attempt: new Attempt(this, e._s) }
    if (r === RESULT_HEDGE_AFTER) return { action: 'after', delayMs: e._s[HEDGE_AFTER_WAIT_MS] }
    return { action: 'no', reason: REASON[e._s[HEDGE_NO_REASON]] }
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

  /**
   * Frees the native call (otherwise it is freed when garbage-collected). A
   * call that holds nothing (its last report left no attempt in flight) is
   * freed by the engine's next begin or by the end of the current job,
   * whichever comes first; one that holds something gives it back now.
   */
  release() {
    if (this._tracked) {
      this._tracked = false
      this._e._reg.unregister(this)
    }
    this._release()
  }

  _release() {
    const h = this._h
    if (h >= 0) {
      this._h = -1
      const e = this._e
      if (this._idle) e._releaseLater(h)
      else {
        e._s[RELEASE_HANDLE] = h
        e._f.release()
      }
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
      // The connection broke while the request was still being written.
      if ((c === 'ECONNRESET' || c === 'EPIPE') && e.syscall === 'write') return 'write'
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

// ---------------------------------------------------------------------------
// engine.run
// ---------------------------------------------------------------------------

/**
 * Attempt timers of engine.run share one Node timer: arming a timer per
 * attempt (setTimeout + clearTimeout) costs more than the decision itself.
 * Pending attempts form a doubly linked list (O(1) add and remove, no
 * allocation); the timer is armed for the earliest expiry and kept referenced
 * only while attempts are pending (it is let go once the event loop finds
 * none pending, not each time the count drops to zero: a ref and an unref per
 * call cost two native calls); expired attempts are found by a scan when it
 * fires. Expiries are on the native process-wide monotonic clock
 * (`nowMs`): the native step that admitted an attempt stamped it (scratch[9]),
 * so no clock is read here.
 */
const timers = {
  head: null,
  tail: null,
  size: 0,
  armedAt: Infinity,
  timer: null,
  // Whether `timer` keeps the process alive, and whether a check to let it go is queued.
  refed: false,
  idleCheck: false,
  add(ra, now) {
    ra.prev = this.tail
    ra.next = null
    if (this.tail === null) this.head = ra
    else this.tail.next = ra
    this.tail = ra
    ra.linked = true
    this.size++
    if (ra.at < this.armedAt) this.arm(ra.at, now)
    else if (!this.refed && this.timer !== null) {
      this.timer.ref()
      this.refed = true
    }
  },
  delete(ra) {
    if (!ra.linked) return
    ra.linked = false
    const p = ra.prev
    const n = ra.next
    if (p === null) this.head = n
    else p.next = n
    if (n === null) this.tail = p
    else n.prev = p
    ra.prev = ra.next = null
    this.size--
    if (this.size === 0 && this.refed && !this.idleCheck) {
      this.idleCheck = true
      setImmediate(letTimerGo)
    }
  },
  /** After the current event-loop turn: an armed timer with nothing pending no longer keeps the process alive. */
  letGo() {
    this.idleCheck = false
    if (this.size === 0 && this.refed && this.timer !== null) {
      this.timer.unref()
      this.refed = false
    }
  },
  arm(at, now) {
    if (this.timer !== null) clearTimeout(this.timer)
    this.armedAt = at
    this.timer = setTimeout(fireTimers, Math.max(0, Math.ceil(at - now)))
    this.refed = true
  },
  fire() {
    this.timer = null
    this.refed = false
    this.armedAt = Infinity
    const now = native.nowMs()
    let next = Infinity
    for (let it = this.head; it !== null; ) {
      const following = it.next
      if (it.at <= now + 0.5) {
        this.delete(it)
        it.fire()
      } else if (it.at < next) next = it.at
      it = following
    }
    if (next < Infinity && this.size > 0) this.arm(next, now)
  },
}

function fireTimers() {
  timers.fire()
}

function letTimerGo() {
  timers.letGo()
}

/**
 * `v instanceof Response`, without the generic `instanceof` lookup for the
 * values fn usually returns (primitives, plain objects and arrays, whose
 * prototype chains cannot hold Response.prototype).
 */
function isResponse(v) {
  if (v === null || typeof v !== 'object') return false
  const p = Object.getPrototypeOf(v)
  if (p === Object.prototype || p === Array.prototype || p === null) return false
  return typeof Response !== 'undefined' && v instanceof Response
}

/** One attempt of engine.run: its expiry, its (lazy) AbortSignal and how it ended. */
class RunAttempt {
  constructor(run, attempt, startedAt) {
    this.run = run
    this.attempt = attempt
    this.at = startedAt + attempt.timeouts.totalMs
    this.ac = null
    this.reason = null
    this.prev = null
    this.next = null
    this.linked = false
  }
  signal() {
    if (this.ac === null) {
      this.ac = new AbortController()
      if (this.reason !== null) this.ac.abort(this.reason)
    }
    return this.ac.signal
  }
  /** Abandons the attempt (its timer fired, or the caller's signal aborted): reported as failed. */
  abort(reason) {
    if (this.reason !== null) return
    this.reason = reason
    if (this.run.current === this) {
      // Settle after the code that aborted returns, as a rejected race would;
      // queued first, so it wins over fn reacting to the abort below.
      queueMicrotask(() => this.run.failed(this, reason))
    }
    if (this.ac !== null) this.ac.abort(reason)
  }
  fire() {
    const a = this.attempt
    this.abort(new AttemptTimeoutError(totalTimeoutKind(a), a.timeouts.totalMs))
  }
}

// One executor for every engine.run promise (no closure per call): it runs
// synchronously inside `new Promise`, so its results are picked up at once.
let capturedResolve = null
let capturedReject = null
function captureResolvers(resolve, reject) {
  capturedResolve = resolve
  capturedReject = reject
}

/**
 * One engine.run call as a small state machine: the returned promise is the
 * only one it creates (besides one `then` per asynchronous attempt), which
 * matters because with AsyncLocalStorage enabled every promise costs hook
 * calls. The first attempt was admitted by the native step that began the call.
 */
class Run {
  constructor(engine, call, fn, classify, signal, resolve, reject) {
    this.engine = engine
    this.call = call
    this.fn = fn
    this.classify = classify
    this.signal = signal
    this.resolve = resolve
    this.reject = reject
    this.current = null
    this.lastErr = undefined
    this.onAbort = null
    if (signal !== null) {
      this.onAbort = () => {
        if (this.current !== null) this.current.abort(abortReason(signal))
      }
      signal.addEventListener('abort', this.onAbort, { once: true })
    }
  }

  /** The native call just asked for an attempt (result code scratch[STEP_RESULT]): start it, or stop. */
  admitted() {
    const engine = this.engine
    const s = engine._s
    engine._flush()
    if (s[STEP_RESULT] !== RESULT_ATTEMPT) return this.finish(false, stoppedFromScratch(this.call, this.lastErr))
    const attempt = new Attempt(this.call, s)
    const ra = new RunAttempt(this, attempt, s[ATTEMPT_STAMP])
    attempt._run = ra
    this.current = ra
    timers.add(ra, s[ATTEMPT_STAMP])
    let value
    try {
      value = als.run(attempt, this.fn, attempt)
    } catch (err) {
      return this.failed(ra, err)
    }
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      try {
        value.then(
          (v) => this.succeeded(ra, v),
          (e) => this.failed(ra, e),
        )
      } catch (err) {
        this.failed(ra, err)
      }
      return
    }
    this.succeeded(ra, value)
  }

  /** fn's value for attempt `ra` (ignored once the attempt was abandoned). */
  succeeded(ra, value) {
    if (this.current !== ra) return
    if (ra.reason !== null) return this.failed(ra, ra.reason)
    let outcome
    let response
    const classify = this.classify
    try {
      if (classify !== undefined) outcome = classify(value)
      else if (isResponse(value)) {
        response = value
        outcome = value.ok ? undefined : { status: value.status, headers: value.headers }
      }
    } catch (err) {
      return this.failed(ra, err)
    }
    this.settle(ra, outcome, false, value, response)
  }

  /** Attempt `ra` failed with `err` (thrown, rejected, timed out or aborted). */
  failed(ra, err) {
    if (this.current !== ra) return
    const signal = this.signal
    if (signal !== null && signal.aborted) {
      timers.delete(ra)
      this.current = null
      try {
        this.engine._n.cancel(this.call._h)
        this.engine._flush()
      } catch (e) {
        return this.finish(false, e)
      }
      return this.finish(false, err)
    }
    this.lastErr = err
    const outcome = ra.reason instanceof AttemptTimeoutError ? { error: ra.reason.kind } : errorOutcome(err, null)
    this.settle(ra, outcome, true, undefined, undefined)
  }

  settle(ra, outcome, failed, value, response) {
    timers.delete(ra)
    this.current = null
    const engine = this.engine
    const call = this.call
    let action
    try {
      // A success releases the call in the same native step.
      action = outcome === undefined || outcome === null ? reportOk(call, 1) : reportNative(call, outcome, 'classify() result')
      engine._flush()
    } catch (e) {
      return this.finish(false, e)
    }
    if (action === ACTION_SUCCEEDED) return this.finish(true, failed ? undefined : value)
    const d = decisionFromScratch(call)
    if (action === ACTION_RETRY || action === ACTION_FALLBACK) {
      if (response && response.body) response.body.cancel().catch(() => {})
      sleep(d.delayMs, this.signal === null ? undefined : this.signal).then(
        () => {
          try {
            engine._next(call._h, 1)
          } catch (e) {
            return this.finish(false, e)
          }
          this.admitted()
        },
        (err) => {
          try {
            engine._n.cancel(call._h)
            engine._flush()
          } catch (e) {
            return this.finish(false, e)
          }
          this.finish(false, err)
        },
      )
      return
    }
    this.finish(false, stoppedFromDecision(call, d, failed ? this.lastErr : undefined, response))
  }

  finish(ok, v) {
    if (this.onAbort !== null) this.signal.removeEventListener('abort', this.onAbort)
    this.call._release()
    if (ok) this.resolve(v)
    else this.reject(v)
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

/** (Re)starts an attempt's idle timer: `ctl` aborts with stream_idle_timeout unless the next chunk comes within idle_ms. */
function restartIdle(prev, attempt, ctl) {
  if (prev) clearTimeout(prev)
  const ms = attempt.timeouts.idleMs
  return setTimeout(() => ctl.ac.abort(new AttemptTimeoutError('stream_idle_timeout', ms)), ms)
}

/** The body's bytes, at most `limit` of them (the rest is cancelled); `onChunk` runs as each arrives. */
async function readBody(res, limit, onChunk) {
  if (!res.body) return ''
  const reader = res.body.getReader()
  const chunks = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    onChunk()
    size += value.byteLength
    if (size > limit) {
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
    // The call's first attempt is asked for in the same native step.
    const call = new Call(engine, engine._open(spec, 'opts', true))
    const fc = new FetchCall(engine, call, f, req)
    fc.primed = true
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
    // The result of the call's first attempt request is already in scratch.
    this.primed = false
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
    for (;;) {
      let r
      if (this.primed) {
        this.primed = false
        r = engine._s[STEP_RESULT]
      } else r = engine._next(call._h, 0)
      engine._flush()
      if (r !== RESULT_ATTEMPT) {
        // No attempt may start (deadline, breaker, ...): surface the last failure as it was,
        // its decision now the stop (not the retry that the refused attempt was for).
        const stopped = stoppedFromScratch(call, this.lastErr)
        if (this.lastResponse) {
          const prev = decisionOf(this.lastResponse)
          this.lastResponse[DECISION] = {
            ...prev,
            action: 'stop',
            delayMs: 0,
            reason: stopped.reason,
            errorClass: stopped.errorClass ?? (prev ? prev.errorClass : null),
            onFailure: stopped.onFailure,
            detail: stopped.detail,
            waitSource: 'none',
            retryAfterMs: null,
          }
          return { response: this.lastResponse, handedOver: false }
        }
        throw stopped
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
          als.run(attempt, () => this.fetch(req.url, init)),
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
      const failed = res.status >= 400 || res.status < 200
      // Error bodies (vendor codes) and JSON successes (a body that does not
      // parse is malformed_response) are read inside the loop, so either may be
      // retried; the idle timeout runs between their chunks. A retry spliced into
      // a stream (`splice`) hands any success body to that stream as it comes.
      if (failed || (!splice && res.body && native.jsonMediaType(res.headers.get('content-type') || ''))) {
        let body
        let idle = null
        const armIdle = () => {
          idle = restartIdle(idle, attempt, ctl)
        }
        try {
          armIdle()
          body = await raceAbort(readBody(res, failed ? MAX_ERROR_BODY : Infinity, armIdle), ctl.ac.signal)
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
        } finally {
          clearTimeout(idle)
        }
        ctl.done()
        const d = this._report({ status: res.status, headers: res.headers, body })
        this.lastErr = undefined
        this.lastResponse = rebuildResponse(res, body, d)
        if (d.action === 'retry' || d.action === 'fallback') {
          await this._sleep(d)
          continue
        }
        // The upstream may have executed an unsafe call: never let it pass for a
        // plain error response (which a caller might simply send again).
        if (d.action === 'reconcile') throw stoppedFromDecision(call, d, undefined, this.lastResponse)
        return { response: this.lastResponse, handedOver: false }
      }
      if (!res.body) {
        ctl.done()
        const d = this._report({ status: res.status })
        const out = rebuildResponse(res, null, d)
        return { response: out, handedOver: false }
      }
      const gate = new native.StreamGate(res.headers.get('content-type'))
      const parts = { res, attempt, ctl, reader: res.body.getReader(), gate: gate.mayHold ? gate : null }
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
   * never replayed). Each attempt's event stream passes through the core's
   * StreamGate, which holds its preamble (a role-only delta, `message_start`)
   * back until the first meaningful event, so a cut after the preamble still
   * delivered nothing.
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
      idle = restartIdle(idle, cur.attempt, cur.ctl)
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
          if (cur.gate !== null) {
            // A stream of preamble only, or a last event without its blank line.
            const rest = cur.gate.finish()
            cur.gate = null
            if (rest.byteLength > 0) {
              delivered += rest.byteLength
              controller.enqueue(rest)
            }
          }
          self._report({ status: cur.res.status })
          finish()
          controller.close()
          return
        }
        let v = chunk.value
        if (v && v.byteLength > 0 && cur.gate !== null) {
          v = cur.gate.feed(v)
          if (!cur.gate.mayHold) cur.gate = null
        }
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

/**
 * Holds a streamed body's preamble (a role-only delta, `message_start`, pings)
 * until its first meaningful event, so a cut before it is `stream_open` and may
 * be retried (the core's StreamGate; wrapFetch runs every attempt's body through one).
 */
class StreamGate {
  constructor(contentType) {
    if (contentType !== undefined && contentType !== null && typeof contentType !== 'string') throw new TypeError(`contentType must be a string; got ${describe(contentType)}`)
    this._g = new native.StreamGate(contentType)
  }

  /** Bytes received in; what the consumer may see now out (empty while holding). */
  feed(chunk) {
    if (!(chunk instanceof Uint8Array)) throw new TypeError(`chunk must be a Uint8Array; got ${describe(chunk)}`)
    return this._g.feed(chunk)
  }

  /** The body ended: everything still held. */
  finish() {
    return this._g.finish()
  }

  get visible() {
    return this._g.visible
  }

  /** Whether feeding may still hold bytes back (an event stream before its first meaningful event). */
  get mayHold() {
    return this._g.mayHold
  }

  get phase() {
    return this._g.phase
  }

  get held() {
    return this._g.held
  }
}

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
  return native.vendorCodeFromBody(bodyBytes(body, 'body') || EMPTY_BODY)
}

/** Whether a `content-type` names JSON (`application/json`, `+json`): the 2xx bodies a report checks. */
function jsonMediaType(contentType) {
  if (typeof contentType !== 'string') throw new TypeError(`contentType must be a string; got ${describe(contentType)}`)
  return native.jsonMediaType(contentType)
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
  jsonMediaType,
  StreamGate,
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
