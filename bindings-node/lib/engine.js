'use strict'
// Engine: the native engine (one per process, shared) plus what the JS layer
// keeps beside it: interned names, the scratch buffer the native steps read
// and write, the release queue, the GC safety net and event listeners.

const native = require('../native.js')
const { SLOT, toCode } = require('./vocab.js')
const { describe, translateNativeError } = require('./errors.js')
const { currentAttempt } = require('./context.js')
const { headerPairs } = require('./outcomes.js')
const { Call } = require('./call.js')
const { startRun } = require('./run.js')
const { StreamGate } = require('./stream.js')
const { Fleet } = require('./fleet.js')
const { RequestFacts, READ_NEXT } = require('./request.js')

const {
  LEN: SCRATCH_LEN,
  BEGIN_ROUTE,
  BEGIN_DEADLINE_MS,
  BEGIN_IDEMPOTENCY,
  BEGIN_TENANT,
  BEGIN_REQUEST,
  NEXT_HANDLE,
  NEXT_STAMP,
  RELEASE_HANDLE,
  STEP_RESULT,
  STEP_HANDLE,
  STEP_PENDING_RELEASE,
} = SLOT

/**
 * @typedef {import('../index').Policy} Policy
 * @typedef {import('../index').EngineOptions} EngineOptions
 * @typedef {import('../index').CallSpec} CallSpec
 * @typedef {import('../index').RunOptions} RunOptions
 * @typedef {import('../index').Mode} Mode
 * @typedef {import('../index').RetrywiseEvent} RetrywiseEvent
 * @typedef {import('../index').Stats} Stats
 * @typedef {import('../index').ReconcileItem} ReconcileItem
 * @typedef {import('../index').BreakerState} BreakerState
 * @typedef {import('../index').Attempt} Attempt
 * @typedef {import('../native').NativeEngine} NativeEngine
 * @typedef {ReturnType<NativeEngine['fast']>} FastSteps
 * @typedef {Partial<CallSpec>} SpecInput a spec as callers pass it, checked here
 * @typedef {import('../index').Engine} ApiEngine
 * @typedef {import('../index').FleetConfig} FleetConfig
 */

/**
 * A policy argument as the addon takes it: `[kind, text]` (0 default, 1 JSON
 * of an object, 2 JSON/YAML/TOML text; 3, a file path, comes from `fromFile`).
 * @param {unknown} policy
 * @returns {[number, string | null]}
 */
function policyArgs(policy) {
  if (policy === undefined || policy === null) return [0, null]
  if (typeof policy === 'string') return [2, policy]
  if (typeof policy === 'object' && !Array.isArray(policy)) {
    let text
    try {
      text = JSON.stringify(policy)
    } catch (e) {
      throw new TypeError(`policy must be JSON-serializable: ${/** @type {Error} */ (e).message}`)
    }
    return [1, text]
  }
  throw new TypeError(`policy must be an object or a JSON/YAML/TOML string; got ${describe(policy)}`)
}

/**
 * @param {unknown} seed
 * @returns {string | null}
 */
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

/** JSON Schema of the policy document. */
function policySchema() {
  return JSON.parse(native.policySchema())
}

const NO_OPTS = Object.freeze({})
/** `fromFile`'s policy argument, passed through the options. */
const ENGINE = Symbol('retrywise.engine')
/** Calls begun that wait, at most, to be checked for the GC safety net (see Engine#_track). */
const PEND_BATCH = 256
// Released calls that hold nothing wait in the `step.PENDING_RELEASE` slot,
// where the next native begin frees them (no crossing of their own); one that
// finds the slot taken joins a batch freed this many at a time (one crossing).
const RELEASE_BATCH = 64

/** @implements {ApiEngine} */
class Engine {
  /**
   * @param {Policy | string | null} [policy] a policy object, or a JSON / YAML / TOML string; default policy when absent
   * @param {EngineOptions} [opts] `{ seed?: number | bigint, manualClock?: boolean }`
   */
  constructor(policy, opts) {
    if (opts !== undefined && (opts === null || typeof opts !== 'object')) throw new TypeError(`opts must be an object; got ${describe(opts)}`)
    const o = /** @type {EngineOptions & { [ENGINE]?: [number, string] }} */ (opts || {})
    if (o.manualClock !== undefined && typeof o.manualClock !== 'boolean') throw new TypeError('opts.manualClock must be a boolean')
    const [kind, text] = o[ENGINE] ? o[ENGINE] : policyArgs(policy)
    // On a SharedArrayBuffer, which cannot be detached: the native steps then
    // need no check that it still is attached (see src/scratch.rs).
    /** @type {Float64Array} */
    this._s = new Float64Array(new SharedArrayBuffer(SCRATCH_LEN * Float64Array.BYTES_PER_ELEMENT))
    try {
      /** @type {NativeEngine} */
      this._n = new native.NativeEngine(this._s, kind, text, seedArg(o.seed), o.manualClock === true)
    } catch (e) {
      throw translateNativeError(e)
    }
    // Fast entry points (arguments and results in this._s, see src/fast.rs).
    /** @type {FastSteps} */
    this._f = this._n.fast()
    /** @type {Array<string | null>} */
    this._names = []
    // Route and tenant names interned by the native engine (name -> id).
    /** @type {Map<string, number>} */
    this._ids = new Map()
    this._idsFull = false
    /** @type {string | null} */
    this._lastRoute = null
    this._lastRouteId = -1
    /** @type {Array<(event: RetrywiseEvent) => void> | null} */
    this._listeners = null
    this._listenerErrors = 0
    /** @type {FinalizationRegistry<number> | null} */
    this._reg = null
    // Calls begun since the event loop last turned (or in the last
    // PEND_BATCH begins), registered for garbage collection only if still
    // live then: a call run to its end was freed when it finished, and a
    // FinalizationRegistry register + unregister costs more than the whole
    // decision cycle. A call whose attempt waits on I/O is registered, a
    // cost small beside the I/O.
    /** @type {Array<Call | undefined>} */
    this._pend = new Array(PEND_BATCH).fill(undefined)
    this._pendN = 0
    this._sweepQueued = false
    this._sweep = () => {
      this._sweepQueued = false
      this._trackPending(true)
    }
    // Released calls that hold nothing are freed by the end of the job at the latest.
    this._relQueued = false
    this._relFlush = () => {
      this._relQueued = false
      this._releaseBatch()
    }
    // Handles of released calls that hold nothing, freed by the next batch
    // (one more place for the one in the `step.PENDING_RELEASE` slot).
    this._rel = new Float64Array(RELEASE_BATCH + 1)
    this._relN = 0
    // What the policy in force says, asked once (cleared by `reload`): the
    // route of a request model, and whether an upstream's requests are rewritten.
    /** @type {Map<string, string>} */
    this._modelRoutes = new Map()
    /** @type {Map<string, boolean>} */
    this._rewriting = new Map()
  }

  /**
   * Builds an engine from a policy file (`.json`, `.yaml`/`.yml`, `.toml`).
   * @param {string | URL} path
   * @param {EngineOptions} [opts]
   * @returns {Engine}
   */
  static fromFile(path, opts) {
    if (typeof path !== 'string' && !(path instanceof URL)) throw new TypeError(`path must be a string; got ${describe(path)}`)
    const p = path instanceof URL ? require('node:url').fileURLToPath(path) : path
    return new Engine(undefined, /** @type {EngineOptions} */ ({ ...(opts || {}), [ENGINE]: [3, p] }))
  }

  /**
   * The name of interned upstream `i` (cached).
   * @param {number} i
   * @returns {string | null}
   */
  _name(i) {
    let n = this._names[i]
    if (n === undefined) {
      n = this._n.upstreamName(i)
      this._names[i] = n
    }
    return n
  }

  /**
   * Id of an interned route or tenant name, or -1 (table full: pass the string).
   * @param {string} name
   * @returns {number}
   */
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

  /**
   * @param {string} route
   * @returns {number}
   */
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
   * `first`, the call's first attempt is asked for in the same step: the
   * `step.RESULT` slot says whether one was admitted (attempt fields in
   * scratch, stamped) or not (stop fields in scratch). A route the policy
   * does not know throws a `PolicyError` naming the known routes (the core's
   * `try_begin`), before any attempt.
   * @param {SpecInput} spec
   * @param {string} argName
   * @param {boolean} first
   * @returns {number}
   */
  _open(spec, argName, first) {
    try {
      return this._openRaw(spec, argName, first)
    } catch (e) {
      throw translateNativeError(e)
    }
  }

  /**
   * `_open` without the translation of the addon's policy errors.
   * @param {SpecInput} spec
   * @param {string} argName
   * @param {boolean} first
   * @returns {number}
   */
  _openRaw(spec, argName, first) {
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
    const parent = spec.inherit === false ? undefined : currentAttempt()
    // READ_NEXT (a wrapped fetch): the needs of the request the engine read last.
    const readNext = /** @type {unknown} */ (spec.request) === READ_NEXT
    const simple =
      parent === undefined &&
      spec.task === undefined &&
      spec.priority === undefined &&
      spec.idempotencyKey === undefined &&
      spec.params === undefined &&
      spec.paramsDigest === undefined &&
      spec.needs === undefined &&
      (spec.request === undefined || readNext) &&
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
        s[BEGIN_REQUEST] = readNext ? 1 : 0
        if (first) this._f.beginAttempt()
        else this._f.begin()
        return s[STEP_HANDLE]
      }
      const h = this._n.begin(route, dl, idem, tenant, readNext)
      if (first) this._next(h, 1)
      return h
    }
    /** @type {Record<string, unknown>} */
    const extra = {}
    // Whether `extra` holds anything: none crosses as JSON otherwise.
    let any = false
    for (const k of /** @type {const} */ (['task', 'priority', 'idempotencyKey', 'paramsDigest'])) {
      const v = spec[k]
      if (v !== undefined && v !== null) {
        if (typeof v !== 'string') throw new TypeError(`${argName}.${k} must be a string; got ${describe(v)}`)
        extra[k] = v
        any = true
      }
    }
    if (tenant) {
      extra.tenant = tenant
      any = true
    }
    if (spec.params !== undefined) {
      extra.params = spec.params
      any = true
    }
    // An object; a wrapped fetch passes a list of them, each laid over the one before (the core's Needs::merged).
    if (spec.needs !== undefined && spec.needs !== null) {
      if (typeof spec.needs !== 'object') throw new TypeError(`${argName}.needs must be an object; got ${describe(spec.needs)}`)
      extra.needs = spec.needs
      any = true
    }
    /** @type {import('../native').RequestFacts | null} */
    let facts = null
    if (spec.request !== undefined && spec.request !== null && !readNext) {
      if (!(spec.request instanceof RequestFacts)) throw new TypeError(`${argName}.request must be what readRequest() returned; got ${describe(spec.request)}`)
      facts = spec.request._n
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
        if (hs !== null) {
          extra.inboundHeaders = headerPairs(hs, 'inboundHeaders')
          any = true
        }
      }
    } else if (spec.inboundHeaders !== undefined && spec.inboundHeaders !== null) {
      extra.inboundHeaders = headerPairs(spec.inboundHeaders, `${argName}.inboundHeaders`)
      any = true
    }
    let text = null
    if (any) {
      try {
        text = JSON.stringify(extra)
      } catch (e) {
        throw new TypeError(`${argName}.params must be JSON-serializable: ${/** @type {Error} */ (e).message}`)
      }
    }
    try {
      return this._n.beginEx(route, dl, idem, text, parentHandle, parentAttempt, first === true, facts, readNext)
    } catch (e) {
      if (e && /** @type {{ code?: unknown }} */ (e).code === 'ERR_RETRYWISE_RELEASED') return this._n.beginEx(route, dl, idem, text, -1, 0, first === true, facts, readNext)
      throw e
    }
  }

  /**
   * The fields of a base spec a wrapped fetch begins every request with,
   * checked once, when the engine's fast begin takes them all (a route, and
   * at most a deadline, an idempotency, a tenant and `inherit`); null
   * otherwise (each request then goes through `_open`, which checks it).
   * @param {Record<string, any>} spec
   * @returns {{ dl: number, idem: number, tid: number, inherit: boolean } | null}
   */
  _simpleSpec(spec) {
    for (const k in spec) {
      if (spec[k] === undefined) continue
      if (k !== 'route' && k !== 'deadlineMs' && k !== 'idempotency' && k !== 'tenant' && k !== 'inherit') return null
    }
    let dl = -1
    if (spec.deadlineMs !== undefined && spec.deadlineMs !== null) {
      dl = spec.deadlineMs
      if (typeof dl !== 'number' || !(dl >= 0) || !Number.isFinite(dl)) return null
    }
    let idem = 0
    try {
      idem = spec.idempotency === undefined ? 0 : toCode('idempotency', spec.idempotency, 'opts.idempotency')
    } catch {
      return null
    }
    let tid = -1
    const tenant = spec.tenant
    if (tenant !== undefined && tenant !== null) {
      if (typeof tenant !== 'string') return null
      tid = this._sid(tenant)
      if (tid < 0) return null
    }
    if (spec.inherit !== undefined && typeof spec.inherit !== 'boolean') return null
    return { dl, idem, tid, inherit: spec.inherit !== false }
  }

  /**
   * Opens a wrapped fetch's call on `route` with a base spec `_simpleSpec`
   * checked (`simple`), beginning with what the request the engine read last
   * needs (`readNextRequest`) and asking for its first attempt in the same
   * step. Inside another retrywise call (nesting), or for a route not
   * interned, it goes through `_open` with `spec`.
   * @param {string} route
   * @param {{ dl: number, idem: number, tid: number, inherit: boolean }} simple
   * @param {Record<string, any>} spec
   * @returns {number}
   */
  _openReadNext(route, simple, spec) {
    if (!simple.inherit || currentAttempt() === undefined) {
      const rid = this._routeId(route)
      if (rid >= 0) {
        const s = this._s
        s[BEGIN_ROUTE] = rid
        s[BEGIN_DEADLINE_MS] = simple.dl
        s[BEGIN_IDEMPOTENCY] = simple.idem
        s[BEGIN_TENANT] = simple.tid
        s[BEGIN_REQUEST] = 1
        try {
          this._f.beginAttempt()
        } catch (e) {
          throw translateNativeError(e)
        }
        return s[STEP_HANDLE]
      }
    }
    return this._open(/** @type {SpecInput} */ ({ ...spec, route, request: /** @type {any} */ (READ_NEXT) }), 'opts', true)
  }

  /**
   * `routeForModel`, asked once per model and policy.
   * @param {string} model
   * @returns {string}
   */
  _routeForModel(model) {
    let r = this._modelRoutes.get(model)
    if (r === undefined) {
      r = this.routeForModel(model)
      if (this._modelRoutes.size >= 1024) this._modelRoutes.clear()
      this._modelRoutes.set(model, r)
    }
    return r
  }

  /**
   * Whether requests for `upstream` are rewritten (its catalog entry names
   * a base URL, model, key or family), asked once per upstream and policy.
   * @param {string} upstream
   * @returns {boolean}
   */
  _rewrites(upstream) {
    let r = this._rewriting.get(upstream)
    if (r === undefined) {
      r = this._n.rewrites(upstream)
      if (this._rewriting.size >= 1024) this._rewriting.clear()
      this._rewriting.set(upstream, r)
    }
    return r
  }

  /**
   * Asks for the next attempt of call `h` (stamped when `stamp` is 1);
   * returns the result code (`RESULT_ATTEMPT` or stopped), as the `step.RESULT` slot has it.
   * @param {number} h
   * @param {0 | 1} stamp
   * @returns {number}
   */
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
   * @param {number} h
   */
  _releaseLater(h) {
    const s = this._s
    const waiting = s[STEP_PENDING_RELEASE]
    s[STEP_PENDING_RELEASE] = h
    if (waiting >= 0) {
      this._rel[this._relN++] = waiting
      if (this._relN === RELEASE_BATCH) return this._releaseBatch()
    }
    if (!this._relQueued) {
      this._relQueued = true
      queueMicrotask(this._relFlush)
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

  /**
   * Registers `call` with the GC safety net unless it is freed (finished or
   * released) before the event loop turns or PEND_BATCH more calls begin.
   * @param {Call} call
   */
  _track(call) {
    if (!this._sweepQueued) {
      this._sweepQueued = true
      setImmediate(this._sweep)
    }
    this._pend[this._pendN++] = call
    if (this._pendN === PEND_BATCH) this._trackPending(false)
  }

  /**
   * Registers the pending calls still live with the GC safety net, and
   * forgets the others. Before the event loop turned (`turned` false: the
   * list is full), live calls stay pending while they fill at most half of
   * it: a loop that begins its calls one after the other has one live.
   * @param {boolean} turned
   */
  _trackPending(turned) {
    const p = this._pend
    let n = this._pendN
    if (!turned) {
      let live = 0
      for (let i = 0; i < n; i++) if (/** @type {Call} */ (p[i])._h >= 0) p[live++] = p[i]
      p.fill(undefined, live, n)
      n = live
      if (live <= PEND_BATCH / 2) {
        this._pendN = live
        return
      }
    }
    this._pendN = 0
    for (let i = 0; i < n; i++) {
      const c = /** @type {Call} */ (p[i])
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
   * `spec.inherit === false`. `spec.request` (from `readRequest`): what the
   * request needs, with `spec.needs` laid over it. A route the policy does
   * not know throws a `PolicyError` naming the known routes.
   * @param {CallSpec} spec
   * @returns {Call}
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
   * @template T
   * @param {(attempt: Attempt) => T | Promise<T>} fn
   * @param {RunOptions} [opts]
   * @returns {Promise<T>}
   */
  run(fn, opts) {
    if (typeof fn !== 'function') return Promise.reject(new TypeError(`fn must be a function; got ${describe(fn)}`))
    const o = /** @type {RunOptions} */ (opts === undefined ? NO_OPTS : opts)
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
    return startRun(this, new Call(this, h), fn, classify, signal || null)
  }

  /** Delivers the events the last native step queued to the listeners (see `onEvent`). */
  _flush() {
    if (this._listeners === null) return
    const text = this._n.takeEvents()
    if (text === null) return
    /** @type {RetrywiseEvent[]} */
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
          if (this._listenerErrors === 1) process.emitWarning(`retrywise: an onEvent listener threw (${err && /** @type {Error} */ (err).message}); further errors are counted in engine.listenerErrors`, 'RetrywiseWarning')
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
   * @param {(event: RetrywiseEvent) => void} cb
   * @returns {() => void}
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
      if (i >= 0) /** @type {Array<(event: RetrywiseEvent) => void>} */ (this._listeners).splice(i, 1)
      if (this._listeners && this._listeners.length === 0) {
        this._listeners = null
        this._n.setListening(false)
      }
    }
  }

  /**
   * Listener exceptions swallowed so far.
   * @type {number}
   */
  get listenerErrors() {
    return this._listenerErrors
  }

  /**
   * Events in the ring buffer, oldest first (`drain: true` takes them out).
   * @param {{ drain?: boolean }} [opts]
   * @returns {RetrywiseEvent[]}
   */
  events(opts) {
    return JSON.parse(opts && opts.drain ? this._n.drainEvents() : this._n.events())
  }

  /** @returns {Stats} */
  stats() {
    return JSON.parse(this._n.stats())
  }

  /** @returns {string} */
  prometheus() {
    return this._n.prometheus()
  }

  /**
   * Swaps the policy; an invalid policy throws `PolicyError` and leaves the old one in force.
   * @param {Policy | string} policy
   */
  reload(policy) {
    const [kind, text] = policyArgs(policy)
    try {
      this._n.reload(kind, text)
    } catch (e) {
      throw translateNativeError(e)
    }
    this._modelRoutes.clear()
    this._rewriting.clear()
    this._flush()
  }

  /**
   * The kill switch: `{ retries?, fallback?, hedging? }`; omitted fields keep their value.
   * @param {Partial<Mode>} mode
   */
  setMode(mode) {
    if (mode === null || typeof mode !== 'object') throw new TypeError(`mode must be an object; got ${describe(mode)}`)
    const cur = this.mode()
    const next = { ...cur }
    for (const k of /** @type {const} */ (['retries', 'fallback', 'hedging'])) {
      const v = mode[k]
      if (v !== undefined) {
        if (typeof v !== 'boolean') throw new TypeError(`mode.${k} must be a boolean`)
        next[k] = v
      }
    }
    this._n.setMode(next.retries, next.fallback, next.hedging)
    this._flush()
  }

  /** @returns {Mode} */
  mode() {
    const b = this._n.mode()
    return { retries: (b & 1) !== 0, fallback: (b & 2) !== 0, hedging: (b & 4) !== 0 }
  }

  /** @returns {ReconcileItem[]} */
  reconcileList() {
    return JSON.parse(this._n.reconcileList())
  }

  /** @returns {ReconcileItem[]} */
  drainReconcile() {
    return JSON.parse(this._n.drainReconcile())
  }

  /**
   * @param {string} upstream
   * @returns {BreakerState}
   */
  breakerState(upstream) {
    if (typeof upstream !== 'string') throw new TypeError(`upstream must be a string; got ${describe(upstream)}`)
    return /** @type {BreakerState} */ (this._n.breakerState(upstream))
  }

  /**
   * The policy in force (as the core serializes it).
   * @returns {Policy}
   */
  policy() {
    return JSON.parse(this._n.policy())
  }

  /** @type {string} */
  get policyVersion() {
    return this._n.policyVersion()
  }

  /**
   * The route a request for `model` takes (the policy's `models` map, a route
   * or an upstream of that name); a `PolicyError` naming the keys to add otherwise.
   * @param {string} model
   * @returns {string}
   */
  routeForModel(model) {
    if (typeof model !== 'string') throw new TypeError(`model must be a string; got ${describe(model)}`)
    try {
      return this._n.routeForModel(model)
    } catch (e) {
      throw translateNativeError(e)
    }
  }

  /**
   * How to reach `upstream`, from the policy catalog.
   * @param {string} upstream
   * @returns {import('../index').Reach}
   */
  reach(upstream) {
    if (typeof upstream !== 'string') throw new TypeError(`upstream must be a string; got ${describe(upstream)}`)
    return JSON.parse(this._n.reach(upstream))
  }

  /**
   * A StreamGate reading malformed events as the policy says (`streams.malformed_event`).
   * @param {string | null} [contentType]
   * @returns {StreamGate}
   */
  streamGate(contentType) {
    if (contentType !== undefined && contentType !== null && typeof contentType !== 'string') throw new TypeError(`contentType must be a string; got ${describe(contentType)}`)
    return StreamGate._of(this._n.streamGate(contentType))
  }

  /**
   * Attaches this engine to a fleet (once): the core plans each sync cycle,
   * a `RedisFleet` runs it. Breaker state is then shared through the store.
   * @param {FleetConfig} [config]
   * @returns {import('../index').Fleet}
   */
  fleet(config) {
    return new Fleet(this._n, config === undefined ? {} : config, () => this._flush())
  }

  /**
   * Testing hook: moves the manual clock (engine built with `{ manualClock: true }`).
   * @param {number} ms
   */
  advanceClock(ms) {
    if (typeof ms !== 'number') throw new TypeError(`ms must be a number; got ${describe(ms)}`)
    this._n.advanceClock(ms)
  }

  /**
   * Calls begun with `begin()` and not yet released or garbage-collected.
   * @type {number}
   */
  get liveCalls() {
    this._releaseBatch()
    return this._n.liveCalls()
  }
}

module.exports = { Engine, policySchema }
