'use strict'
// Nesting: the retrywise attempt the running code belongs to. A call begun
// inside one inherits its deadline and ids and is a non-owner (the core
// decides what that means; this only carries the attempt along).
//
// The attempt is carried by V8's promise hooks (`v8.promiseHooks`), not by
// an AsyncLocalStorage. On Node 20 an enabled AsyncLocalStorage turns on
// async_hooks, whose promise hooks assign async ids, emit init events and
// push and pop an async context for every promise in the process (an
// awaited async function costs about three times as much); these hooks make
// a comparison or an assignment or two per promise event:
// - init(promise): a promise created while an attempt is current is tagged
//   with it (a symbol property; a WeakMap about doubled the cost of a whole
//   engine.run call, most of it in the garbage collector's ephemeron work);
// - before(promise): a reaction about to run (a then/catch/finally callback,
//   an async function resuming after `await`, a thenable's `then` called by
//   the job that adopts it) makes the tag of its promise current, which is
//   the attempt that was current when the reaction was registered;
// - after: puts back the attempt current before the reaction (reactions do
//   not nest: one variable keeps it).
// fn's synchronous part runs with the attempt current (`runIn`).
//
// What carries the attempt, as an AsyncLocalStorage does: the synchronous
// code of fn (and of a wrapped fetch's fetch), and every promise
// continuation registered inside it, at any depth: `await` chains through
// other async functions (an SDK's), then/catch/finally, Promise.all / race /
// allSettled / any, async generators and `for await`, awaited thenables.
// What does not: a callback Node calls from its event loop — a setTimeout,
// setInterval or setImmediate callback, process.nextTick, queueMicrotask, an
// EventEmitter or stream listener — runs in no attempt, so a call begun
// there is an owner. Code that continues after awaiting a promise such a
// callback settles (`await new Promise((ok) => setTimeout(ok, ms))`) is back
// in the attempt. A call begun from such a callback can be tied to the
// attempt by hand with its propagation headers
// (`engine.begin({ route, inboundHeaders: attempt.headers })`). Node 20 has
// no hook for those callbacks but async_hooks, and enabling an async hook of
// any kind installs Node's own promise hooks: the cost this module avoids.
//
// Any promise hook makes V8 take its generic promise paths for the rest of
// the process (a protector it never restores), and the hooks cost a call per
// promise event while enabled. So they are enabled only while a call that
// may nest is in flight (an engine.run, a wrapped fetch's attempt), and
// disabled once none has been for IDLE_MS: a process that makes no such
// call has no hook at all, and one that makes them in bursts does not switch
// them at every gap. A task that outlives its call finds no attempt then, as
// it finds a finished one before: it begins as an owner.

const { promiseHooks } = require('node:v8')

/** @typedef {import('./call.js').Attempt} Attempt */

/**
 * The attempt the running code belongs to.
 * @type {Attempt | undefined}
 */
let current
/**
 * What before() replaced, for after().
 * @type {Attempt | undefined}
 */
let saved

/** The property of a promise created in an attempt that names it. */
const TAG = Symbol('retrywise.attempt')

/** @param {Promise<unknown>} promise */
function init(promise) {
  if (current !== undefined) /** @type {any} */ (promise)[TAG] = current
}

/** @param {Promise<unknown>} promise */
function before(promise) {
  saved = current
  current = /** @type {any} */ (promise)[TAG]
}

function after() {
  current = saved
  saved = undefined
}

/**
 * Stops the hooks while they are enabled.
 * @type {(() => void) | null}
 */
let stopHooks = null

/** How long no call that may nest must have been in flight before the hooks are disabled, ms. */
const IDLE_MS = 1000

/** Calls that may nest (engine.run calls, wrapped-fetch attempts) in flight, and started so far. */
let inFlight = 0
let started = 0
/** `started` when the pending idle check was armed; -1: none armed. */
let armedAt = -1

/** A call that may nest started: the hooks are enabled until it ends. */
function enter() {
  if (stopHooks === null) stopHooks = /** @type {() => void} */ (promiseHooks.createHook({ init, before, after }))
  inFlight++
  started++
}

/** A call that may nest ended: with none in flight for IDLE_MS, the hooks are disabled. */
function leave() {
  inFlight--
  if (inFlight === 0 && armedAt < 0) armIdleCheck()
}

function armIdleCheck() {
  armedAt = started
  setTimeout(disableIfIdle, IDLE_MS).unref()
}

// A timer callback: no promise reaction is running, so no before() waits for its after().
function disableIfIdle() {
  const seen = armedAt
  armedAt = -1
  if (inFlight > 0) return // the next leave() arms it again
  if (started !== seen) return armIdleCheck() // used meanwhile: idle for a full period first
  if (stopHooks !== null) {
    stopHooks()
    stopHooks = null
  }
}

/**
 * Calls `fn(arg)` with `attempt` current; the promises it creates carry it
 * (while the hooks are enabled: between enter() and leave()).
 * @template A, R
 * @param {Attempt} attempt
 * @param {(arg: A) => R} fn
 * @param {A} arg
 * @returns {R}
 */
function runIn(attempt, fn, arg) {
  const prev = current
  current = attempt
  try {
    return fn(arg)
  } finally {
    current = prev
  }
}

/**
 * Runs `fn` with `attempt` as the current retrywise attempt, counted as in
 * flight until `fn`'s result settles (wrapFetch's attempts).
 * @template R
 * @param {Attempt} attempt
 * @param {() => R} fn
 * @returns {R}
 */
function runTracked(attempt, fn) {
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

/**
 * The innermost retrywise attempt the caller runs inside, or undefined.
 * @returns {Attempt | undefined}
 */
function currentAttempt() {
  return current
}

/** Whether the hooks are enabled (tests). */
function hooksEnabled() {
  return stopHooks !== null
}

module.exports = { runIn, runTracked, enter, leave, currentAttempt, hooksEnabled, IDLE_MS }
