'use strict'
// Nesting: the retrywise attempt the current async context runs in. A call
// begun inside one inherits its deadline and ids and is a non-owner (the
// core decides what that means; this only carries the attempt along).
//
// Carrying it across `await` takes an AsyncLocalStorage, and while one is
// enabled Node 20 runs async_hooks callbacks for every promise in the
// process (an awaited async function costs about three times as much). So
// retrywise's storage is enabled only while a call that may nest is in
// flight (an engine.run, a wrapped fetch's attempt) and disabled once the
// event loop turns with none in flight: a process that makes no such call
// at the moment pays nothing for it. A task that outlives its call finds no
// attempt then, as it finds a finished one before: it begins as an owner.

const { AsyncLocalStorage } = require('node:async_hooks')

/**
 * The store is the Attempt itself (its call and engine are attempt._call, attempt._call._e).
 * @type {AsyncLocalStorage<import('./call.js').Attempt>}
 */
const storage = new AsyncLocalStorage()

/** Calls that may nest (engine.run calls, wrapped-fetch attempts) in flight. */
let inFlight = 0
let idleCheck = false

/** A call that may nest started: the storage stays enabled until it ends. */
function enter() {
  inFlight++
}

/** A call that may nest ended: with none left when the event loop turns, the storage is disabled. */
function leave() {
  inFlight--
  if (inFlight === 0 && !idleCheck) {
    idleCheck = true
    setImmediate(disableIfIdle)
  }
}

function disableIfIdle() {
  idleCheck = false
  // run() enables it again when the next call that may nest starts.
  if (inFlight === 0) storage.disable()
}

/**
 * Runs `fn` with `attempt` as the current retrywise attempt, counted as in
 * flight until `fn`'s result settles (wrapFetch's attempts).
 */
const als = {
  /**
   * @template R
   * @param {import('./call.js').Attempt} attempt
   * @param {() => R} fn
   * @returns {R}
   */
  run(attempt, fn) {
    enter()
    /** @type {R} */
    let r
    try {
      r = storage.run(attempt, fn)
    } catch (e) {
      leave()
      throw e
    }
    const p = /** @type {any} */ (r)
    if (p !== null && typeof p === 'object' && typeof p.then === 'function') p.then(leave, leave)
    else leave()
    return r
  },
  /** @returns {import('./call.js').Attempt | undefined} */
  getStore() {
    return storage.getStore()
  },
}

/**
 * The innermost retrywise attempt the caller runs inside, or undefined.
 * @returns {import('./call.js').Attempt | undefined}
 */
function currentAttempt() {
  return storage.getStore()
}

module.exports = { als, storage, enter, leave, currentAttempt }
