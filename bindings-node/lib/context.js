'use strict'
// Nesting: the retrywise attempt the current async context runs in. A call
// begun inside one inherits its deadline and ids and is a non-owner (the
// core decides what that means; this only carries the attempt along).
//
// Carrying it across `await` takes an AsyncLocalStorage, and while one is
// enabled Node 20 runs async_hooks callbacks for every promise in the
// process (an awaited async function costs about three times as much). So
// retrywise's storage is enabled only while a call that may nest is in
// flight (an engine.run, a wrapped fetch's attempt), and disabled once none
// has been for IDLE_MS: a process that makes no such call pays nothing for
// it, and one that makes them in bursts does not switch Node's promise
// hooks at every gap. A task that outlives its call finds no attempt then,
// as it finds a finished one before: it begins as an owner.

const { AsyncLocalStorage } = require('node:async_hooks')

/**
 * The store is the Attempt itself (its call and engine are attempt._call, attempt._call._e).
 * @type {AsyncLocalStorage<import('./call.js').Attempt>}
 */
const storage = new AsyncLocalStorage()

/** How long no call that may nest must have been in flight before the storage is disabled, ms. */
const IDLE_MS = 1000

/** Calls that may nest (engine.run calls, wrapped-fetch attempts) in flight, and started so far. */
let inFlight = 0
let started = 0
/** `started` when the pending idle check was armed; -1: none armed. */
let armedAt = -1

/** A call that may nest started: the storage stays enabled until it ends. */
function enter() {
  inFlight++
  started++
}

/** A call that may nest ended: with none in flight for IDLE_MS, the storage is disabled. */
function leave() {
  inFlight--
  if (inFlight === 0 && armedAt < 0) armIdleCheck()
}

function armIdleCheck() {
  armedAt = started
  setTimeout(disableIfIdle, IDLE_MS).unref()
}

function disableIfIdle() {
  const seen = armedAt
  armedAt = -1
  if (inFlight > 0) return // the next leave() arms it again
  if (started !== seen) return armIdleCheck() // used meanwhile: idle for a full period first
  // run() enables it again when the next call that may nest starts.
  storage.disable()
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

module.exports = { als, storage, enter, leave, currentAttempt, IDLE_MS }
