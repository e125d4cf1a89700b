'use strict'
// One logical request (Call) and its attempts (Attempt), and the decisions
// the core makes about them, built from the numbers a native step left in
// the engine's scratch buffer.

const { SLOT, toCode, ACTION, REASON, ERROR_CLASS, WAIT_SOURCE, ON_FAILURE, CONTINUATION } = require('./vocab.js')
const { describe, StoppedError } = require('./errors.js')
const { flatHeaders, bodyBytes, httpStatus } = require('./outcomes.js')
const native = require('../native.js')

const {
  ATTEMPT_NUMBER,
  ATTEMPT_UPSTREAM,
  ATTEMPT_CONNECT_MS,
  ATTEMPT_FIRST_BYTE_MS,
  ATTEMPT_FIRST_TOKEN_MS,
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
  STOPPED_WAIT_MS,
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
  DECISION_CONTINUATION_SHIFT,
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
  ACTION_SUCCEEDED,
  ACTION_STOP,
  ACTION_RECONCILE,
  FINISHED_ATTEMPTS,
  FINISHED_OWNER,
  FINISHED_STOP_REASON,
  FINISHED_STOP_CLASS,
  FINISHED_STOP_ON_FAILURE,
  FINISHED_STOP_HAS_DETAIL,
  FINISHED_HEDGE_REASON,
  FINISHED_TARGET,
  FINISHED_POLICY,
  FINISHED_DEADLINE_MS,
  FINISHED_ID_HI,
  FINISHED_ID_LO,
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
    this.timeouts = {
      connectMs: s[ATTEMPT_CONNECT_MS],
      firstByteMs: s[ATTEMPT_FIRST_BYTE_MS],
      firstTokenMs: s[ATTEMPT_FIRST_TOKEN_MS],
      idleMs: s[ATTEMPT_IDLE_MS],
      totalMs: s[ATTEMPT_TOTAL_MS],
    }
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
      // A finished call has no attempt in flight: as the native call says of a reported attempt, no headers.
      const c = this._call
      const flat = c._h < 0 && c._fin !== null ? [] : c._e._n.attemptHeaders(c._h, this.number)
      /** @type {Record<string, string>} */
      const h = {}
      for (let i = 0; i < flat.length; i += 2) h[flat[i]] = flat[i + 1]
      this._headers = h
    }
    return this._headers
  }

  /**
   * How to reach this attempt's upstream (the policy catalog), with the key
   * read from the environment variable it names: point the request of an
   * `engine.run` attempt here so it goes to the upstream the core chose.
   * @type {import('../index').AttemptReach}
   */
  get reach() {
    /** @type {import('../index').Reach} */
    const r = JSON.parse(this._call._e._n.reach(this.upstream))
    const key = r.apiKeyEnv === null ? undefined : process.env[r.apiKeyEnv]
    return { ...r, apiKey: key === undefined || key === '' ? null : key }
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
  const cont = (flags >> DECISION_CONTINUATION_SHIFT) & 3
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
    continuation: cont > 0 ? CONTINUATION[cont - 1] : null,
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
  const wait = s[STOPPED_WAIT_MS]
  return new StoppedError(
    {
      action: 'stop',
      reason: REASON[s[STOPPED_REASON]],
      errorClass: cls >= 0 ? ERROR_CLASS[cls] : null,
      onFailure: of >= 0 ? ON_FAILURE[of] : null,
      detail: s[STOPPED_HAS_DETAIL] === 1 ? e._n.detail(call._h) : null,
      attempts: e._n.callAttempts(call._h),
      waitMs: wait >= 0 ? wait : null,
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
 * What a fast report step returned when it finished its call (`mode` 2):
 * `true` (the id is in scratch as numbers) or the id's text; undefined when
 * it did not. Read right after `reportNative`, before anything else can step.
 * @type {true | string | undefined}
 */
let finishedId

/**
 * Outcome object -> native report; returns the action code (decision in scratch).
 * `mode` (the `report.RELEASE` slot, src/state.rs `Inner::report`): 0 keeps the
 * call, 2 finishes it when the decision is final and it holds nothing (a
 * status or bare success only: `finishedId` set).
 * @param {Call} call
 * @param {unknown} outcome
 * @param {string} argName
 * @param {0 | 2} [mode]
 * @returns {number}
 */
function reportNative(call, outcome, argName, mode = 0) {
  const e = call._e
  const n = e._n
  const h = call._h
  finishedId = undefined
  if (outcome === undefined || outcome === null) return reportOk(call, mode)
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
    o.ok === undefined &&
    o.resumable === undefined &&
    o.continuation === undefined &&
    o.firstTokenMs === undefined
  ) {
    const checked = httpStatus(st, argName, 'status')
    const s = e._s
    s[REPORT_HANDLE] = h
    s[REPORT_STATUS] = checked
    s[REPORT_RELEASE] = mode
    finishedId = e._f.reportStatus()
    return s[STEP_RESULT]
  }
  let status = -1
  if (st !== undefined && st !== null) {
    status = httpStatus(st, argName, 'status')
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
  const resumable = o.resumable === true
  const continuation = o.continuation === undefined || o.continuation === null ? -1 : toCode('continuation', o.continuation, `${argName}.continuation`)
  let firstToken = -1
  if (o.firstTokenMs !== undefined && o.firstTokenMs !== null) {
    const t = o.firstTokenMs
    if (typeof t !== 'number' || !(t >= 0) || !Number.isFinite(t)) throw new TypeError(`${argName}.firstTokenMs must be a finite number >= 0; got ${describe(t)}`)
    firstToken = t
  }
  return n.report(h, status, error, phase, effect, /** @type {string | null} */ (vendor), flatHeaders(o.headers, `${argName}.headers`), tokens, bodyBytes(o.body, `${argName}.body`), attempt, ok, resumable, continuation, firstToken)
}

/**
 * Reports a success with no status for the latest attempt; with `release` 1, a
 * call that succeeded is released in the same step (2: see `reportNative`).
 * Returns the action code.
 * @param {Call} call
 * @param {0 | 1 | 2} release
 * @returns {number}
 */
function reportOk(call, release) {
  const e = call._e
  const s = e._s
  s[REPORT_HANDLE] = call._h
  s[REPORT_RELEASE] = release
  finishedId = e._f.reportOk()
  if (release === 1 && s[STEP_HANDLE] === 1) call._h = -1
  return s[STEP_RESULT]
}

/**
 * @param {number} action
 * @returns {boolean}
 */
function isFinal(action) {
  return action === ACTION_SUCCEEDED || action === ACTION_STOP || action === ACTION_RECONCILE
}

/**
 * What a finished call still tells once its native call is freed: the
 * `finished` slots a native step wrote (src/finished.rs: the core's answers,
 * asked before the call was dropped) and its final decision.
 */
class Finished {
  /**
   * @param {Float64Array} s scratch, just written
   * @param {true | string} id the step's value: its id's text, or `true` when
   *   the id is in the `finished.ID_*` slots (printed only when asked: most
   *   calls never are)
   */
  constructor(s, id) {
    /** @type {string | null} */
    this._id = id === true ? null : id
    this.idHi = s[FINISHED_ID_HI]
    this.idLo = s[FINISHED_ID_LO]
    /** @type {Decision | null} */
    this.decision = null
    this.attempts = s[FINISHED_ATTEMPTS]
    this.owner = s[FINISHED_OWNER] === 1
    this.stopReason = s[FINISHED_STOP_REASON]
    this.stopClass = s[FINISHED_STOP_CLASS]
    this.stopOnFailure = s[FINISHED_STOP_ON_FAILURE]
    this.stopHasDetail = s[FINISHED_STOP_HAS_DETAIL] === 1
    this.hedgeReason = s[FINISHED_HEDGE_REASON]
    this.target = s[FINISHED_TARGET]
    this.policy = s[FINISHED_POLICY]
    this.deadlineMs = s[FINISHED_DEADLINE_MS]
    // Names that were not interned, read by handle before the call was freed.
    /** @type {string | null} */
    this.targetName = null
    /** @type {string | null} */
    this.policyName = null
  }

  /** @type {string} */
  get id() {
    if (this._id === null) this._id = native.requestIdText(this.idHi, this.idLo)
    return this._id
  }

  /**
   * The final decision again (what the core answers to a late report or cancel), as a copy.
   * @returns {Decision}
   */
  again() {
    const d = /** @type {Decision} */ (this.decision)
    return { ...d, excluded: d.excluded.map(([u, why]) => [u, why]) }
  }

  /**
   * What `nextAttempt` throws now: the core's final stop (its detail is the final decision's).
   * @returns {StoppedError}
   */
  stop() {
    const d = /** @type {Decision} */ (this.decision)
    return new StoppedError({
      action: 'stop',
      reason: REASON[this.stopReason],
      errorClass: this.stopClass >= 0 ? ERROR_CLASS[this.stopClass] : null,
      onFailure: this.stopOnFailure >= 0 ? ON_FAILURE[this.stopOnFailure] : null,
      detail: this.stopHasDetail ? d.detail : null,
      attempts: this.attempts,
    })
  }
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
    // Once finished and freed (_h -1): what the call still tells; null otherwise, and after release().
    /** @type {Finished | null} */
    this._fin = null
  }

  /** Finished and freed: its answers come from `_fin`. */
  get _done() {
    return this._h < 0 && this._fin !== null
  }

  /**
   * The next attempt to make; throws `StoppedError` when none may start.
   * @returns {Attempt}
   */
  nextAttempt() {
    const e = this._e
    if (this._done) throw /** @type {Finished} */ (this._fin).stop()
    this._idle = false
    const r = e._next(this._h, 0)
    const finished = r !== RESULT_ATTEMPT && e._s[STEP_IDLE] === 1
    e._flush()
    if (r === RESULT_ATTEMPT) return new Attempt(this, e._s)
    const err = stoppedFromScratch(this)
    // The stop finished the call (deadline, attempts, breaker, ...).
    if (finished) this._finish(null)
    throw err
  }

  /**
   * Reports the latest attempt's outcome (`outcome.attempt` names another one
   * when hedging); returns the decision. A final decision that leaves no
   * attempt in flight finishes the call: it is freed at once, and still
   * answers from what it kept (see `release()`).
   * @param {import('../index').Outcome | null} [outcome]
   * @returns {Decision}
   */
  report(outcome) {
    if (this._done) return /** @type {Finished} */ (this._fin).again()
    const e = this._e
    const s = e._s
    const action = reportNative(this, outcome, 'outcome', 2)
    const id = finishedId
    this._idle = s[STEP_IDLE] === 1
    if (id !== undefined) {
      const fin = new Finished(s, id)
      const freed = s[STEP_HANDLE] === 1
      if (freed) this._h = -1
      const d = decisionFromScratch(this)
      this._adopt(fin, d, freed)
      e._flush()
      return d
    }
    const d = decisionFromScratch(this)
    // A report that went the general way (headers, errors, bodies) finishes here.
    if (this._idle && isFinal(action)) this._finish(d)
    e._flush()
    return d
  }

  /**
   * Cancels the call: attempts in flight are reported as cancelled; returns the final decision.
   * @returns {Decision}
   */
  cancel() {
    if (this._done) return /** @type {Finished} */ (this._fin).again()
    this._idle = false
    this._e._n.cancel(this._h)
    this._e._flush()
    const d = decisionFromScratch(this)
    this._finish(d)
    return d
  }

  /**
   * Whether a hedged (parallel) attempt may start now:
   * `{ action: 'start', attempt }`, `{ action: 'after', delayMs }` (ask again then) or
   * `{ action: 'no', reason }`: the core's `HedgePlan`, named as in the Python and C bindings.
   * @returns {HedgePlan}
   */
  nextHedge() {
    if (this._done) return { action: 'no', reason: REASON[/** @type {Finished} */ (this._fin).hedgeReason] }
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
    if (this._done) return /** @type {Finished} */ (this._fin).id
    return this._e._n.callId(this._h)
  }

  /** @type {number} */
  get attempts() {
    if (this._done) return /** @type {Finished} */ (this._fin).attempts
    return this._e._n.callAttempts(this._h)
  }

  /** @type {number} */
  get remainingMs() {
    if (this._done) return Math.max(0, /** @type {Finished} */ (this._fin).deadlineMs - this._e._n.clockMs())
    return this._e._n.callRemainingMs(this._h)
  }

  /**
   * `{ id, attempts, remainingMs, owner, finished, policyVersion, target }`.
   * @returns {CallInfo}
   */
  info() {
    const f = this._fin
    if (f === null || this._h >= 0) return JSON.parse(this._e._n.callInfo(this._h))
    const e = this._e
    return {
      id: f.id,
      attempts: f.attempts,
      remainingMs: Math.floor(this.remainingMs),
      owner: f.owner,
      finished: true,
      policyVersion: f.policyName !== null ? f.policyName : /** @type {string} */ (e._n.policyName(f.policy)),
      target: f.targetName !== null ? f.targetName : /** @type {string} */ (e._name(f.target)),
    }
  }

  /**
   * Call `h` finished (final decision `d`, or the one the native step leaves
   * when `d` is null) and holds nothing: keep what it still tells and free it.
   * Does nothing for a call that is not finished or still holds something.
   * @param {Decision | null} d
   */
  _finish(d) {
    const e = this._e
    const s = e._s
    s[RELEASE_HANDLE] = this._h
    const id = e._f.finish()
    if (id === undefined) return
    const fin = new Finished(s, id)
    this._adopt(fin, d !== null ? d : decisionFromScratch(this), false)
  }

  /**
   * Keeps `fin` (final decision `d`); frees the native call unless the step already did.
   * @param {Finished} fin
   * @param {Decision} d
   * @param {boolean} freed
   */
  _adopt(fin, d, freed) {
    fin.decision = d
    if (!freed) {
      // Names the engine could not intern are read while the call still exists.
      if (fin.target < 0 || fin.policy < 0) {
        const info = JSON.parse(this._e._n.callInfo(this._h))
        fin.targetName = info.target
        fin.policyName = info.policyVersion
      }
      const h = this._h
      this._h = -1
      this._e._s[RELEASE_HANDLE] = h
      this._e._f.release()
    }
    this._fin = fin
    this._untrack()
  }

  /** Takes the call out of the GC safety net (it was freed or released). */
  _untrack() {
    if (this._tracked) {
      this._tracked = false
      const reg = /** @type {FinalizationRegistry<number>} */ (this._e._reg)
      reg.unregister(this)
    }
  }

  /**
   * Frees the native call. Never needed for a call run to its end: a call
   * whose final decision left no attempt in flight was freed then (and still
   * answers `id`, `attempts`, `info()`, `nextAttempt()` and `report()` from
   * what it kept, until `release()`); one dropped before its end is freed
   * when garbage-collected. A call that holds nothing is freed by the
   * engine's next begin or by the end of the current job, whichever comes
   * first; one that holds something gives it back now.
   */
  release() {
    this._untrack()
    this._fin = null
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
