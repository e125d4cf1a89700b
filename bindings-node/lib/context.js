'use strict'
// Nesting: the retrywise attempt the current async context runs in. A call
// begun inside one inherits its deadline and ids and is a non-owner (the
// core decides what that means; this only carries the attempt along).
//
// Two carriers, chosen once when the module loads:
//
// - `continuation` (Node 20): V8's continuation-preserved embedder data
//   (native `continuationCarrier()`, found in the process by V8's C++ symbol
//   names: used only when all of them are there and a swap/get round trip
//   gives back what it set; the storage otherwise), which V8 captures when a reaction is
//   registered (`await`, `then`) and restores while it runs, at no cost to
//   promises. It follows every promise continuation (await chains,
//   then/catch/finally, Promise combinators, async generators, Promise
//   subclasses whose work started in the attempt), but not a callback Node
//   schedules itself (timers, setImmediate, nextTick, queueMicrotask, event
//   emitters), nor work a thenable starts in its own `then` when awaited (V8
//   runs that job without the data): a call begun there is an owner unless
//   given `inboundHeaders: attempt.headers`. Node 20 itself leaves that slot
//   unused (its AsyncLocalStorage is the async_hooks one). Only Node 20's V8
//   is used this way: it is the one the tests run on.
// - `async-local-storage`: Node 22 and later (from 24, or on 22 with
//   --experimental-async-context-frame, Node keeps it in that same slot and
//   carries it into callbacks at no cost to promises), or
//   `RETRYWISE_NESTING=async-local-storage` on Node 20, for code that begins
//   nested calls from such callbacks. On Node 20, while an AsyncLocalStorage
//   is enabled, async_hooks callbacks run for every promise in the process
//   (an awaited async function costs about three times as much). So this
//   storage is enabled only while a call that may nest is in flight (an
//   engine.run, a wrapped fetch's attempt), and disabled once none has been
//   for IDLE_MS.
//
// Either way, code that runs when no call that may nest is in flight finds no
// attempt: a task that outlives its call begins as an owner.

const { AsyncLocalStorage } = require('node:async_hooks')
const { continuationCarrier } = require('../native.js')

/**
 * The store is the Attempt itself (its call and engine are attempt._call, attempt._call._e).
 * @type {AsyncLocalStorage<import('./call.js').Attempt>}
 */
const storage = new AsyncLocalStorage()

/** @typedef {{ swap(value: unknown): unknown, get(): unknown }} Carrier */

/**
 * The continuation carrier, or null for the storage. RETRYWISE_NESTING
 * `async-local-storage` asks for the storage; unset (or `continuation`), the
 * continuation carrier is used on Node 20 when the host exports V8's
 * functions for it and Node's own AsyncLocalStorage does not write the slot.
 * @returns {Carrier | null}
 */
function chooseCarrier() {
  const asked = process.env.RETRYWISE_NESTING
  if (asked !== undefined && asked !== '' && asked !== 'continuation' && asked !== 'async-local-storage') {
    throw new Error(`RETRYWISE_NESTING must be "continuation" or "async-local-storage"; got ${JSON.stringify(asked)}`)
  }
  if (asked === 'async-local-storage') return null
  // Node 20 only: the V8 whose C++ ABI and promise jobs the tests checked.
  if (process.versions.node.split('.')[0] !== '20') return null
  // Node's AsyncLocalStorage on AsyncContextFrame would keep its frame in the
  // slot; the one on async_hooks propagates stores itself (`_propagate`) and
  // leaves the slot alone. Told apart without running one: enabling
  // async_hooks even once leaves V8's promise fast paths off for the rest of
  // the process.
  const hooksBased = typeof (/** @type {any} */ (AsyncLocalStorage.prototype)._propagate) === 'function'
  if (!hooksBased) return null
  // Null when the process does not export V8's functions (src/continuation.rs).
  const c = continuationCarrier()
  if (c === null) return null
  // What is set is what is read, and the slot is given back as it was.
  const probe = {}
  const prev = c.swap(probe)
  const same = c.get() === probe
  c.swap(prev)
  return same && c.get() === prev ? c : null
}

const carrier = chooseCarrier()

/** Which carrier this process uses: 'continuation' or 'async-local-storage'. */
const carrierName = carrier === null ? 'async-local-storage' : 'continuation'

/** How long no call that may nest must have been in flight before the storage is disabled, ms. */
const IDLE_MS = 1000

/** Calls that may nest (engine.run calls, wrapped-fetch attempts) in flight, and started so far. */
let inFlight = 0
let started = 0
/** `started` when the pending idle check was armed; -1: none armed. */
let armedAt = -1

/** A call that may nest started: with AsyncLocalStorage, it stays enabled until it ends. */
function enter() {
  inFlight++
  started++
}

/** A call that may nest ended: with none in flight for IDLE_MS, the storage is disabled. */
function leave() {
  inFlight--
  if (inFlight === 0 && armedAt < 0 && carrier === null) armIdleCheck()
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
  // runIn() (storage.run) enables it again when the next call that may nest starts.
  storage.disable()
}

/**
 * Calls `fn(arg)` with `attempt` as the current retrywise attempt: its
 * synchronous code and every continuation it registers run in it.
 * @template A, R
 * @param {import('./call.js').Attempt} attempt
 * @param {(arg: A) => R} fn
 * @param {A} arg
 * @returns {R}
 */
function runIn(attempt, fn, arg) {
  if (carrier === null) return storage.run(attempt, fn, arg)
  const prev = carrier.swap(attempt)
  try {
    return fn(arg)
  } finally {
    carrier.swap(prev)
  }
}

/**
 * The innermost retrywise attempt the caller runs inside, or undefined.
 * @returns {import('./call.js').Attempt | undefined}
 */
function currentAttempt() {
  if (carrier === null) return storage.getStore()
  // Nothing that may nest in flight: no attempt is current (a task that outlived its call).
  return inFlight === 0 ? undefined : /** @type {import('./call.js').Attempt | undefined} */ (carrier.get())
}

/**
 * Runs `fn` with `attempt` as the current retrywise attempt, counted as in
 * flight until `fn`'s result settles (wrapFetch's attempts).
 * @template R
 * @param {import('./call.js').Attempt} attempt
 * @param {() => R} fn
 * @returns {R}
 */
function runInFlight(attempt, fn) {
  enter()
  /** @type {R} */
  let r
  try {
    r = runIn(attempt, fn, undefined)
  } catch (e) {
    leave()
    throw e
  }
  const p = /** @type {any} */ (r)
  if (p !== null && typeof p === 'object' && typeof p.then === 'function') p.then(leave, leave)
  else leave()
  return r
}

module.exports = { runInFlight, enter, leave, runIn, currentAttempt, carrierName, IDLE_MS }
