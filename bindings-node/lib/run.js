'use strict'
// engine.run: the decision loop done for the caller. Each attempt runs `fn`
// inside the attempt's async context with a timer and a lazy AbortSignal;
// its result or error becomes the outcome the core decides on; the waits the
// core hands out are slept here.

const { SLOT } = require('./vocab.js')
const { AttemptTimeoutError } = require('./errors.js')
const { Attempt, decisionFromScratch, stoppedFromScratch, stoppedFromDecision, reportNative, reportOk } = require('./call.js')
const { errorOutcome, timerKind } = require('./outcomes.js')
const { abortReason, sleep, timers } = require('./timers.js')
const { runIn, enter, leave } = require('./context.js')

const { STEP_RESULT, RESULT_ATTEMPT, ATTEMPT_STAMP, STOPPED_WAIT_MS, ACTION_SUCCEEDED, ACTION_RETRY, ACTION_FALLBACK } = SLOT

/**
 * @typedef {import('./engine.js').Engine} Engine
 * @typedef {import('./call.js').Call} Call
 * @typedef {import('../index').Outcome} Outcome
 * @typedef {(attempt: Attempt) => unknown} AttemptFn
 * @typedef {(value: any) => Outcome | undefined | null} Classify
 */

/**
 * `v instanceof Response`, without the generic `instanceof` lookup for the
 * values fn usually returns (primitives, plain objects and arrays, whose
 * prototype chains cannot hold Response.prototype).
 * @param {unknown} v
 * @returns {v is Response}
 */
function isResponse(v) {
  if (v === null || typeof v !== 'object') return false
  const p = Object.getPrototypeOf(v)
  if (p === Object.prototype || p === Array.prototype || p === null) return false
  return typeof Response !== 'undefined' && v instanceof Response
}

/** One attempt of engine.run: its expiry, its (lazy) AbortSignal and how it ended. */
class RunAttempt {
  /**
   * @param {Run} run
   * @param {Attempt} attempt
   * @param {number} startedAt stamp on the `nowMs` clock
   */
  constructor(run, attempt, startedAt) {
    this.run = run
    this.attempt = attempt
    this.at = startedAt + attempt.timeouts.totalMs
    /** @type {AbortController | null} */
    this.ac = null
    /** @type {unknown} */
    this.reason = null
    /** @type {import('./timers.js').Pending | null} */
    this.prev = null
    /** @type {import('./timers.js').Pending | null} */
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
  /**
   * Abandons the attempt (its timer fired, or the caller's signal aborted): reported as failed.
   * @param {unknown} reason
   */
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
    this.abort(new AttemptTimeoutError(timerKind(a, 'total', false), a.timeouts.totalMs))
  }
}

// One executor for every engine.run promise (no closure per call): it runs
// synchronously inside `new Promise`, so its results are picked up at once.
/** @type {((v: any) => void) | null} */
let capturedResolve = null
/** @type {((e: unknown) => void) | null} */
let capturedReject = null
/**
 * @param {(v: any) => void} resolve
 * @param {(e: unknown) => void} reject
 */
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
  /**
   * @param {Engine} engine
   * @param {Call} call
   * @param {AttemptFn} fn
   * @param {Classify | undefined} classify
   * @param {AbortSignal | null} signal
   * @param {(v: any) => void} resolve
   * @param {(e: unknown) => void} reject
   */
  constructor(engine, call, fn, classify, signal, resolve, reject) {
    this.engine = engine
    this.call = call
    this.fn = fn
    this.classify = classify
    this.signal = signal
    this.resolve = resolve
    this.reject = reject
    /** @type {RunAttempt | null} */
    this.current = null
    /** @type {unknown} */
    this.lastErr = undefined
    /** @type {(() => void) | null} */
    this.onAbort = null
    // In flight until finish(): nesting's async context stays enabled (context.js).
    this.live = true
    enter()
    if (signal !== null) {
      this.onAbort = () => {
        if (this.current !== null) this.current.abort(abortReason(signal))
      }
      signal.addEventListener('abort', this.onAbort, { once: true })
    }
  }

  /**
   * The native call just asked for an attempt (result code in the `step.RESULT`
   * slot): start it, ask again after the wait a held call was given, or stop.
   */
  admitted() {
    const engine = this.engine
    const s = engine._s
    engine._flush()
    if (s[STEP_RESULT] !== RESULT_ATTEMPT) {
      const wait = s[STOPPED_WAIT_MS]
      if (wait >= 0) return this.after(wait)
      return this.finish(false, stoppedFromScratch(this.call, this.lastErr))
    }
    const attempt = new Attempt(this.call, s)
    const ra = new RunAttempt(this, attempt, s[ATTEMPT_STAMP])
    attempt._run = ra
    this.current = ra
    timers.add(ra, s[ATTEMPT_STAMP])
    /** @type {any} */
    let value
    try {
      value = runIn(attempt, this.fn, attempt)
    } catch (err) {
      return this.failed(ra, err)
    }
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      try {
        value.then(
          (/** @type {unknown} */ v) => this.succeeded(ra, v),
          (/** @type {unknown} */ e) => this.failed(ra, e),
        )
      } catch (err) {
        this.failed(ra, err)
      }
      return
    }
    this.succeeded(ra, value)
  }

  /**
   * fn's value for attempt `ra` (ignored once the attempt was abandoned).
   * @param {RunAttempt} ra
   * @param {unknown} value
   */
  succeeded(ra, value) {
    if (this.current !== ra) return
    if (ra.reason !== null) return this.failed(ra, ra.reason)
    /** @type {Outcome | undefined | null} */
    let outcome
    /** @type {Response | undefined} */
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

  /**
   * Attempt `ra` failed with `err` (thrown, rejected, timed out or aborted).
   * @param {RunAttempt} ra
   * @param {unknown} err
   */
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

  /**
   * Reports attempt `ra`'s outcome and acts on the decision: resolve, sleep
   * and start the next attempt, or reject with the stop.
   * @param {RunAttempt} ra
   * @param {Outcome | undefined | null} outcome
   * @param {boolean} failed
   * @param {unknown} value
   * @param {Response | undefined} response
   */
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
      return this.after(d.delayMs)
    }
    this.finish(false, stoppedFromDecision(call, d, failed ? this.lastErr : undefined, response))
  }

  /**
   * Sleeps `ms` (a retry's delay, or a held call's wait), then asks for the
   * next attempt; the caller's signal cancels the call instead.
   * @param {number} ms
   */
  after(ms) {
    const engine = this.engine
    const call = this.call
    sleep(ms, this.signal === null ? undefined : this.signal).then(
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
  }

  /**
   * @param {boolean} ok
   * @param {unknown} v
   */
  finish(ok, v) {
    if (this.live) {
      this.live = false
      leave()
    }
    if (this.onAbort !== null) /** @type {AbortSignal} */ (this.signal).removeEventListener('abort', this.onAbort)
    this.call._release()
    if (ok) this.resolve(v)
    else this.reject(v)
  }
}

/**
 * Runs a call whose first attempt the native step that began it already
 * asked for (handle's result in scratch); resolves with fn's value or
 * rejects with the stop.
 * @param {Engine} engine
 * @param {Call} call
 * @param {AttemptFn} fn
 * @param {Classify | undefined} classify
 * @param {AbortSignal | null} signal
 * @returns {Promise<any>}
 */
function startRun(engine, call, fn, classify, signal) {
  const p = new Promise(captureResolvers)
  const r = new Run(engine, call, fn, classify, signal, /** @type {(v: any) => void} */ (capturedResolve), /** @type {(e: unknown) => void} */ (capturedReject))
  capturedResolve = capturedReject = null
  try {
    r.admitted()
  } catch (e) {
    r.finish(false, e)
  }
  return p
}

module.exports = { RunAttempt, startRun }
