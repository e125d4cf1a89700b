'use strict'
// One logical request (Call) and its attempts (Attempt), and the decisions
// the core makes about them, built from the numbers a native step left in
// the engine's scratch buffer.

const { SLOT, toCode, ACTION, REASON, ERROR_CLASS, WAIT_SOURCE, ON_FAILURE } = require('./vocab.js')
const { describe, StoppedError } = require('./errors.js')
const { flatHeaders, bodyBytes } = require('./outcomes.js')

const {
  ATTEMPT_NUMBER,
  ATTEMPT_UPSTREAM,
  ATTEMPT_CONNECT_MS,
  ATTEMPT_FIRST_BYTE_MS,
  ATTEMPT_IDLE_MS,
  ATTEMPT_TOTAL_MS,
  ATTEMPT_REMAINING_MS,
  ATTEMPT_FLAGS,
  FLAG_ATTEMPT_HEDGE,
  FLAG_ATTEMPT_FALLBACK,
  STOPPED_REASON,
  STOPPED_CLASS,
  STOPPED_ON_FAILURE,
  STOPPED_HAS_DETAIL,
  DECISION_ACTION,
  DECISION_DELAY_MS,
  DECISION_CLASS,
  DECISION_REASON,
  DECISION_UPSTREAM,
  DECISION_WAIT_SOURCE,
  DECISION_RETRY_AFTER_MS,
  DECISION_ON_FAILURE,
  DECISION_ATTEMPT,
  DECISION_FLAGS,
  FLAG_DECISION_HEDGE,
  FLAG_DECISION_DETAIL,
  FLAG_DECISION_EXCLUDED,
  HEDGE_AFTER_WAIT_MS,
  HEDGE_NO_REASON,
  STEP_RESULT,
  STEP_HANDLE,
  STEP_IDLE,
  REPORT_HANDLE,
  REPORT_STATUS,
  REPORT_RELEASE,
  RELEASE_HANDLE,
  RESULT_ATTEMPT,
  RESULT_HEDGE_START,
  RESULT_HEDGE_AFTER,
} = SLOT

/**
 * @typedef {import('./engine.js').Engine} Engine
 * @typedef {import('./run.js').RunAttempt} RunAttempt
 * @typedef {import('../index').Decision} Decision
 * @typedef {import('../index').HedgePlan} HedgePlan
 * @typedef {import('../index').CallInfo} CallInfo
 * @typedef {import('../index').AttemptTimeouts} AttemptTimeouts
 * @typedef {import('../index').Attempt} ApiAttempt
 * @typedef {import('../index').Call} ApiCall
 */

/** @implements {ApiAttempt} */
class Attempt {
  /**
   * The attempt whose fields a native step just left in scratch `s`.
   * @param {Call} call
   * @param {Float64Array} s
   */
  constructor(call, s) {
    const e = call._e
    this.number = s[ATTEMPT_NUMBER]
    const ui = s[ATTEMPT_UPSTREAM]
    /** @type {string} */
    this.upstream = /** @type {string} */ (ui >= 0 ? e._name(ui) : e._n.upstreamOfAttempt(call._h, s[ATTEMPT_NUMBER]))
    /** @type {AttemptTimeouts} */
    this.timeouts = { connectMs: s[ATTEMPT_CONNECT_MS], firstByteMs: s[ATTEMPT_FIRST_BYTE_MS], idleMs: s[ATTEMPT_IDLE_MS], totalMs: s[ATTEMPT_TOTAL_MS] }
    this.remainingMs = s[ATTEMPT_REMAINING_MS]
    const f = s[ATTEMPT_FLAGS]
    this.hedge = (f & FLAG_ATTEMPT_HEDGE) !== 0
    this.fallback = (f & FLAG_ATTEMPT_FALLBACK) !== 0
    /** @type {AbortSignal | undefined} */
    this._signal = undefined
    /** @type {RunAttempt | null} */
    this._run = null
    this._call = call
    /** @type {Record<string, string> | undefined} */
    this._headers = undefined
    /** @type {string | undefined} */
    this._requestId = undefined
  }

  /**
   * Aborts when the attempt times out or the caller aborts (engine.run, wrapFetch).
   * @type {AbortSignal | undefined}
   */
  get signal() {
    if (this._signal === undefined && this._run !== null) this._signal = this._run.signal()
    return this._signal
  }

  set signal(s) {
    this._signal = s
  }

  /**
   * Propagation headers to add to this attempt's request (`retrywise-*`, `idempotency-key`).
   * @type {Record<string, string>}
   */
  get headers() {
    if (this._headers === undefined) {
      const flat = this._call._e._n.attemptHeaders(this._call._h, this.number)
      /** @type {Record<string, string>} */
      const h = {}
      for (let i = 0; i < flat.length; i += 2) h[flat[i]] = flat[i + 1]
      this._headers = h
    }
    return this._headers
  }

  /**
   * Logical request id (shared by every attempt of the call).
   * @type {string}
   */
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

/**
 * The decision a native step just left in scratch for `call`.
 * @param {Call} call
 * @returns {Decision}
 */
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

/**
 * @param {string[]} flat
 * @returns {Array<[string, string]>}
 */
function pairsOf(flat) {
  /** @type {Array<[string, string]>} */
  const out = []
  for (let i = 0; i < flat.length; i += 2) out.push([flat[i], flat[i + 1]])
  return out
}

/**
 * The stop a native step just left in scratch for `call` (no attempt may start).
 * @param {Call} call
 * @param {unknown} [cause]
 * @returns {StoppedError}
 */
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

/**
 * A final decision `d` (stop or reconcile) as the error the caller sees.
 * @param {Call} call
 * @param {Decision} d
 * @param {unknown} [cause]
 * @param {Response | null} [response]
 * @returns {StoppedError}
 */
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

/**
 * Outcome object -> native report; returns the action code (decision in scratch).
 * @param {Call} call
 * @param {unknown} outcome
 * @param {string} argName
 * @returns {number}
 */
function reportNative(call, outcome, argName) {
  const e = call._e
  const n = e._n
  const h = call._h
  if (outcome === undefined || outcome === null) return reportOk(call, 0)
  if (typeof outcome !== 'object') throw new TypeError(`${argName} must be an object; got ${describe(outcome)}`)
  const o = /** @type {Record<string, unknown>} */ (outcome)
  const st = o.status
  if (
    st !== undefined &&
    o.error === undefined &&
    o.headers === undefined &&
    o.phase === undefined &&
    o.vendorCode === undefined &&
    o.effect === undefined &&
    o.inputTokens === undefined &&
    o.body === undefined &&
    o.attempt === undefined &&
    o.ok === undefined
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
  const error = o.error === undefined || o.error === null ? -1 : toCode('error', o.error, `${argName}.error`)
  const phase = o.phase === undefined || o.phase === null ? -1 : toCode('phase', o.phase, `${argName}.phase`)
  const effect = o.effect === undefined || o.effect === null ? -1 : toCode('effect', o.effect, `${argName}.effect`)
  let vendor = o.vendorCode
  if (vendor === undefined || vendor === null) vendor = null
  else if (typeof vendor !== 'string') throw new TypeError(`${argName}.vendorCode must be a string; got ${describe(vendor)}`)
  let tokens = -1
  if (o.inputTokens !== undefined && o.inputTokens !== null) {
    const t = o.inputTokens
    if (typeof t !== 'number' || !Number.isInteger(t) || t < 0) throw new TypeError(`${argName}.inputTokens must be a non-negative integer`)
    tokens = t
  }
  let attempt = 0
  if (o.attempt !== undefined && o.attempt !== null) {
    const a = o.attempt
    if (typeof a !== 'number' || !Number.isInteger(a) || a < 1) throw new TypeError(`${argName}.attempt must be an attempt number >= 1`)
    attempt = a
  }
  const ok = o.ok === true
  return n.report(h, status, error, phase, effect, /** @type {string | null} */ (vendor), flatHeaders(o.headers, `${argName}.headers`), tokens, bodyBytes(o.body, `${argName}.body`), attempt, ok)
}

/**
 * Reports a success with no status for the latest attempt; with `release` 1, a
 * call that succeeded is released in the same step. Returns the action code.
 * @param {Call} call
 * @param {0 | 1} release
 * @returns {number}
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

/** @implements {ApiCall} */
class Call {
  /**
   * @param {Engine} engine
   * @param {number} h the native call's handle
   */
  constructor(engine, h) {
    this._e = engine
    this._h = h
    this._tracked = false
    // The last report left nothing held (scratch[STEP_IDLE]): release() may batch.
    this._idle = false
  }

  /**
   * The next attempt to make; throws `StoppedError` when none may start.
   * @returns {Attempt}
   */
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
   * @param {import('../index').Outcome | null} [outcome]
   * @returns {Decision}
   */
  report(outcome) {
    reportNative(this, outcome, 'outcome')
    this._idle = this._e._s[STEP_IDLE] === 1
    this._e._flush()
    return decisionFromScratch(this)
  }

  /**
   * Cancels the call: attempts in flight are reported as cancelled; returns the final decision.
   * @returns {Decision}
   */
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
   * @returns {HedgePlan}
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

  /** @type {string} */
  get id() {
    return this._e._n.callId(this._h)
  }

  /** @type {number} */
  get attempts() {
    return this._e._n.callAttempts(this._h)
  }

  /** @type {number} */
  get remainingMs() {
    return this._e._n.callRemainingMs(this._h)
  }

  /**
   * `{ id, attempts, remainingMs, owner, finished, policyVersion, target }`.
   * @returns {CallInfo}
   */
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
      const reg = /** @type {FinalizationRegistry<number>} */ (this._e._reg)
      reg.unregister(this)
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

/** Where a wrapped fetch keeps the decision behind a Response it returns. */
const DECISION = Symbol.for('retrywise.decision')

/**
 * The final decision behind a Response returned by a wrapped fetch (or null).
 * @param {Response} response
 * @returns {Decision | null}
 */
function decisionOf(response) {
  return (response && /** @type {any} */ (response)[DECISION]) || null
}

module.exports = { Attempt, Call, decisionFromScratch, stoppedFromScratch, stoppedFromDecision, reportNative, reportOk, DECISION, decisionOf }
