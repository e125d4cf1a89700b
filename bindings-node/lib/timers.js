'use strict'
// Sleeping, racing and per-attempt timers: the Node idioms around the waits
// and timeouts the core hands out (it never sleeps itself).

const native = require('../native.js')
const { AttemptTimeoutError } = require('./errors.js')
const { timerKind } = require('./outcomes.js')

/** @typedef {import('../index').Attempt} Attempt */

/**
 * Why `signal` aborted (an AbortError when it gave no reason).
 * @param {AbortSignal} signal
 * @returns {unknown}
 */
function abortReason(signal) {
  return signal.reason !== undefined ? signal.reason : new DOMException('This operation was aborted', 'AbortError')
}

/**
 * Resolves after `ms`, or rejects as soon as `signal` aborts.
 * @param {number} ms
 * @param {AbortSignal | null} [signal]
 * @returns {Promise<void>}
 */
function sleep(ms, signal) {
  if (!(ms > 0)) return signal && signal.aborted ? Promise.reject(abortReason(signal)) : Promise.resolve()
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(abortReason(signal))
    const onAbort = () => {
      clearTimeout(t)
      reject(abortReason(/** @type {AbortSignal} */ (signal)))
    }
    const t = setTimeout(() => {
      if (signal) signal.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    if (signal) signal.addEventListener('abort', onAbort, { once: true })
  })
}

/**
 * Per-attempt AbortController whose timer aborts with an AttemptTimeoutError
 * (its kind as the core maps the attempt's total timer, once `bodyStarted`
 * says whether the response's headers had come); linked to the caller's signal.
 * @param {Attempt} attempt
 * @param {AbortSignal | null | undefined} userSignal
 */
function attemptController(attempt, userSignal) {
  const ac = new AbortController()
  const total = attempt.timeouts.totalMs
  const ctl = {
    ac,
    bodyStarted: false,
    done() {
      clearTimeout(timer)
      if (unlink) unlink()
    },
    /** Keeps the timer without holding the process open (a body nobody reads). */
    unref() {
      timer.unref()
    },
  }
  const timer = setTimeout(() => ac.abort(new AttemptTimeoutError(timerKind(attempt, 'total', ctl.bodyStarted), total)), Math.max(0, total))
  /** @type {(() => void) | null} */
  let unlink = null
  if (userSignal) {
    const onAbort = () => ac.abort(abortReason(userSignal))
    if (userSignal.aborted) onAbort()
    else {
      userSignal.addEventListener('abort', onAbort, { once: true })
      unlink = () => userSignal.removeEventListener('abort', onAbort)
    }
  }
  return ctl
}

/** @typedef {ReturnType<typeof attemptController>} AttemptController */

/**
 * Resolves/rejects with `p`, or rejects as soon as `signal` aborts (the attempt is abandoned).
 * @template T
 * @param {Promise<T>} p
 * @param {AbortSignal} signal
 * @returns {Promise<T>}
 */
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

/**
 * (Re)starts an attempt's idle timer: `ctl` aborts with stream_idle_timeout unless the next chunk comes within idle_ms.
 * @param {NodeJS.Timeout | null | undefined} prev
 * @param {Attempt} attempt
 * @param {AttemptController} ctl
 * @returns {NodeJS.Timeout}
 */
function restartIdle(prev, attempt, ctl) {
  if (prev) clearTimeout(prev)
  const ms = attempt.timeouts.idleMs
  return setTimeout(() => ctl.ac.abort(new AttemptTimeoutError(timerKind(attempt, 'idle', true), ms)), ms)
}

/**
 * What the shared timer list holds: an attempt of engine.run (`RunAttempt`).
 * @typedef {object} Pending
 * @property {number} at expiry on the `nowMs` clock
 * @property {Pending | null} prev
 * @property {Pending | null} next
 * @property {boolean} linked
 * @property {() => void} fire
 */

/**
 * Attempt timers of engine.run share one Node timer: arming a timer per
 * attempt (setTimeout + clearTimeout) costs more than the decision itself.
 * Pending attempts form a doubly linked list (O(1) add and remove, no
 * allocation); the timer is armed for the earliest expiry and kept referenced
 * only while attempts are pending (it is let go once the event loop finds
 * none pending, not each time the count drops to zero: a ref and an unref per
 * call cost two native calls); expired attempts are found by a scan when it
 * fires. Expiries are on the native process-wide monotonic clock
 * (`nowMs`): the native step that admitted an attempt stamped it
 * (the `attempt.STAMP` slot), so no clock is read here.
 */
const timers = {
  /** @type {Pending | null} */
  head: null,
  /** @type {Pending | null} */
  tail: null,
  size: 0,
  armedAt: Infinity,
  /** @type {NodeJS.Timeout | null} */
  timer: null,
  // Whether `timer` keeps the process alive, and whether a check to let it go is queued.
  refed: false,
  idleCheck: false,
  /**
   * @param {Pending} ra
   * @param {number} now
   */
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
  /** @param {Pending} ra */
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
  /**
   * @param {number} at
   * @param {number} now
   */
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

module.exports = { abortReason, sleep, attemptController, raceAbort, restartIdle, timers }
