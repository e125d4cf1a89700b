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
 * One attempt of a wrapped fetch: its AbortController (the fetch's signal)
 * and the timers the core handed out. Every abort goes through `abort()`:
 * the total timer (its kind as the core maps it, once `bodyStarted` says
 * whether the response's headers had come), the idle timer, the first-byte
 * and first-token timers, and the caller's signal (linked). Whoever waits on
 * the attempt is told through `onAbort`, one slot, held by one wait at a time
 * (the request, a body being read): no listener is added to or removed from
 * an AbortSignal per wait, which costs more than the wait's own bookkeeping.
 */
class AttemptController {
  /**
   * @param {Attempt} attempt
   * @param {AbortSignal | null | undefined} userSignal
   */
  constructor(attempt, userSignal) {
    this.ac = new AbortController()
    this.attempt = attempt
    this.bodyStarted = false
    this.aborted = false
    /** @type {unknown} */
    this.reason = undefined
    /**
     * Told once, when the attempt is aborted (the current wait's), then cleared.
     * @type {((reason: unknown) => void) | null}
     */
    this.onAbort = null
    const total = attempt.timeouts.totalMs
    /** @type {NodeJS.Timeout} */
    this.timer = setTimeout(() => this.abort(new AttemptTimeoutError(timerKind(attempt, 'total', this.bodyStarted), total)), Math.max(0, total))
    // The idle timer: armed once, moved lazily (see `touch`).
    /** @type {NodeJS.Timeout | null} */
    this.idleTimer = null
    this.lastAt = 0
    this.idleMs = attempt.timeouts.idleMs
    this.idleCheck = () => {
      this.idleTimer = null
      const quiet = performance.now() - this.lastAt
      // A timer may fire up to a millisecond early on the clock it is read against.
      if (quiet + 1 >= this.idleMs) this.abort(new AttemptTimeoutError(timerKind(this.attempt, 'idle', true), this.idleMs))
      else this.idleTimer = setTimeout(this.idleCheck, this.idleMs - quiet)
    }
    /** @type {AbortSignal | null} */
    this.user = null
    /** @type {(() => void) | null} */
    this.onUser = null
    if (userSignal) {
      if (userSignal.aborted) this.abort(abortReason(userSignal))
      else {
        this.user = userSignal
        this.onUser = () => this.abort(abortReason(userSignal))
        userSignal.addEventListener('abort', this.onUser, { once: true })
      }
    }
  }

  /**
   * Aborts the attempt (once): its signal, then whoever waits on it.
   * @param {unknown} reason
   */
  abort(reason) {
    if (this.aborted) return
    this.aborted = true
    this.reason = reason
    this.ac.abort(reason)
    const f = this.onAbort
    if (f !== null) {
      this.onAbort = null
      f(reason)
    }
  }

  /** The attempt ended: its timers stop, the caller's signal is let go. */
  done() {
    clearTimeout(this.timer)
    this.untouch()
    if (this.user !== null) {
      this.user.removeEventListener('abort', /** @type {() => void} */ (this.onUser))
      this.user = null
    }
  }

  /** Keeps the timers without holding the process open (a body nobody reads). */
  unref() {
    this.timer.unref()
    if (this.idleTimer !== null) this.idleTimer.unref()
  }

  /**
   * (Re)starts the idle timer: the attempt aborts with stream_idle_timeout
   * unless `touch` is called again within idle_ms. One Node timer per
   * attempt, moved only when it fires before the attempt was quiet that
   * long: a touch per chunk reads the clock instead of clearing and arming a timer.
   */
  touch() {
    this.lastAt = performance.now()
    if (this.idleTimer === null && !this.aborted) this.idleTimer = setTimeout(this.idleCheck, this.idleMs)
  }

  /** Stops the idle timer (the body ended, or the attempt did). */
  untouch() {
    if (this.idleTimer !== null) {
      clearTimeout(this.idleTimer)
      this.idleTimer = null
    }
  }

  /**
   * Resolves/rejects with `p`, or rejects with the reason as soon as the attempt is aborted.
   * @template T
   * @param {Promise<T>} p
   * @returns {Promise<T>}
   */
  race(p) {
    if (this.aborted) return Promise.reject(this.reason)
    return new Promise((resolve, reject) => {
      this.onAbort = reject
      p.then(
        (v) => {
          if (this.onAbort === reject) this.onAbort = null
          resolve(v)
        },
        (e) => {
          if (this.onAbort === reject) this.onAbort = null
          reject(e)
        },
      )
    })
  }
}

/**
 * An attempt's controller (see `AttemptController`), linked to the caller's signal.
 * @param {Attempt} attempt
 * @param {AbortSignal | null | undefined} userSignal
 * @returns {AttemptController}
 */
function attemptController(attempt, userSignal) {
  return new AttemptController(attempt, userSignal)
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

module.exports = { abortReason, sleep, attemptController, AttemptController, timers }
