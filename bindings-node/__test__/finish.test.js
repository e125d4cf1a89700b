'use strict'
// A call run to its end frees itself: the final decision that leaves no
// attempt in flight frees the native call at once (no release(), no
// FinalizationRegistry entry), and the call still answers what the core
// answered before it was freed.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Engine, StoppedError } = require('..')
const native = require('../native.js')

const fast = { backoff: { base_ms: 1, cap_ms: 2 } }
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))

/**
 * The README's loop: an awaited function per attempt, the waits slept, no release().
 * @returns {Promise<[import('..').Call, import('..').Decision]>}
 */
async function readmeLoop(e, doIo) {
  const call = e.begin({ route: 'openai/gpt-4o-mini', deadlineMs: 10_000 })
  for (;;) {
    const a = call.nextAttempt()
    const d = call.report(await doIo(a))
    if (d.action === 'retry' || d.action === 'fallback') {
      await sleep(d.delayMs)
      continue
    }
    return [call, d]
  }
}

test('the README loop with an awaited function per attempt leaves no live call and never reaches the GC safety net', async () => {
  const e = new Engine({ ...fast, breaker: { enabled: false }, budget: { enabled: false } })
  const ids = new Set()
  for (let i = 0; i < 1000; i++) {
    const [call, d] = await readmeLoop(e, async () => ({ status: 200 }))
    assert.equal(d.action, 'succeeded')
    assert.equal(call.attempts, 1)
    ids.add(call.id)
  }
  assert.equal(ids.size, 1000, 'every call kept its own id')
  assert.equal(e.liveCalls, 0)
  assert.equal(e._reg, null, 'no call was registered for garbage collection')

  // Calls alive when the event loop turns (a retry's sleep) are registered then, and still freed when they finish.
  for (let i = 0; i < 20; i++) {
    const [call, d] = await readmeLoop(e, async (a) => ({ status: a.number < 2 ? 503 : 200 }))
    assert.equal(d.action, 'succeeded')
    assert.equal(call.attempts, 2)
  }
  assert.notEqual(e._reg, null)
  assert.equal(e.liveCalls, 0)
})

test('a call finished by a report keeps the core answers: id, attempts, info, final stop, final decision, hedge', () => {
  const e = new Engine({ max_attempts: 3, deadline_ms: 20_000 }, { seed: 3, manualClock: true })
  const c = e.begin({ route: 'openai/gpt-4o', deadlineMs: 10_000 })
  const a = c.nextAttempt()
  const requestId = a.requestId
  const live = c.info()
  assert.equal(live.finished, false)
  const d = c.report({ status: 200 })
  assert.equal(d.action, 'succeeded')
  assert.equal(e.liveCalls, 0, 'freed by the report')
  assert.equal(c.id, requestId)
  assert.equal(c.attempts, 1)
  assert.deepEqual(a.headers, {}, 'a reported attempt has no headers left (as before it was freed)')
  e.advanceClock(1500)
  assert.deepEqual(c.info(), { ...live, finished: true, remainingMs: live.remainingMs - 1500 })
  assert.equal(c.remainingMs, 10_000 - 1500)
  assert.throws(() => c.nextAttempt(), (err) => err instanceof StoppedError && err.reason === 'call_finished' && err.errorClass === null && err.detail === null)
  assert.deepEqual(c.report({ status: 503 }), d, 'a late report repeats the final decision')
  assert.notEqual(c.report({ status: 503 }), d, 'as a copy')
  assert.deepEqual(c.cancel(), d)
  assert.deepEqual(c.nextHedge(), { action: 'no', reason: 'hedge_not_allowed' })
  e.advanceClock(20_000)
  assert.equal(c.remainingMs, 0)
  assert.equal(c.info().remainingMs, 0)
  c.release()
  assert.throws(() => c.id, { code: 'ERR_RETRYWISE_RELEASED' })
  assert.throws(() => c.nextAttempt(), { code: 'ERR_RETRYWISE_RELEASED' })
})

test('a stop with a detail, a report with headers and a stop at nextAttempt finish the call too', () => {
  const e = new Engine({ max_attempts: 2, backoff: { base_ms: 1, cap_ms: 1 } })
  // not_owner carries a detail: the call is freed once the detail is read.
  const inner = e.begin({ route: 'u', inboundHeaders: { 'retrywise-deadline-ms': '2000', 'retrywise-request-id': 'up-1' } })
  inner.nextAttempt()
  const stop = inner.report({ status: 503, headers: { 'x-request-id': 'r1' } })
  assert.equal(stop.action, 'stop')
  assert.equal(stop.reason, 'not_owner')
  assert.match(stop.detail, /retryable_status/)
  assert.equal(e.liveCalls, 0)
  assert.equal(inner.id, 'up-1')
  // A success with a status only finishes the call in the fast step; an inherited id has no numbers, so the step hands its text over.
  const kept = e.begin({ route: 'u', inboundHeaders: { 'retrywise-deadline-ms': '2000', 'retrywise-request-id': 'up-2' } })
  kept.nextAttempt()
  assert.equal(kept.report({ status: 200 }).action, 'succeeded')
  assert.equal(e.liveCalls, 0)
  assert.equal(kept.id, 'up-2')
  assert.equal(inner.info().owner, false)
  assert.throws(
    () => inner.nextAttempt(),
    (err) => err instanceof StoppedError && err.reason === 'not_owner' && err.detail === stop.detail && err.attempts === 1,
  )
  assert.deepEqual(inner.report({ status: 200 }), stop)

  // Attempts used up: the stop comes from nextAttempt, whose call is then finished and freed.
  const c = e.begin({ route: 'v' })
  c.nextAttempt()
  assert.equal(c.report({ status: 503 }).action, 'retry')
  c.nextAttempt()
  const last = c.report({ status: 503, headers: { 'retry-after-ms': '1' } })
  assert.equal(last.action, 'stop')
  assert.equal(last.reason, 'max_attempts')
  assert.equal(e.liveCalls, 0)
  assert.throws(() => c.nextAttempt(), (err) => err.reason === 'max_attempts' && err.errorClass === 'transient')

  // A deadline already spent: nextAttempt stops, and that finishes the call.
  const late = e.begin({ route: 'w', deadlineMs: 0 })
  assert.throws(() => late.nextAttempt(), (err) => err.reason === 'deadline_exceeded')
  assert.equal(e.liveCalls, 0)
  assert.throws(() => late.nextAttempt(), (err) => err.reason === 'deadline_exceeded')
  const final = late.report({ status: 200 })
  assert.equal(final.action, 'stop')
  assert.equal(final.reason, 'deadline_exceeded')
  assert.deepEqual(late.cancel(), final)
})

test('a call that still holds something, or is not finished, is not freed by its decision', () => {
  const e = new Engine({ budget: { ratio: 1.0, min_per_sec: 100, max_concurrent_retries: 1 } })
  const early = e.begin({ route: 'u' })
  assert.equal(early.report({ status: 200 }).reason, 'invalid_state', 'a report with no attempt in flight stops and changes nothing')
  assert.equal(e.liveCalls, 1)
  assert.equal(early.nextAttempt().number, 1)
  assert.equal(early.report({ status: 200 }).action, 'succeeded')
  assert.equal(e.liveCalls, 0)

  const a = e.begin({ route: 'u' })
  a.nextAttempt()
  assert.equal(a.report({ status: 503 }).action, 'retry')
  assert.equal(e.liveCalls, 1, 'a retry decision: the call goes on')
  a.cancel()
  assert.equal(e.liveCalls, 0, 'cancelled: finished, nothing held')
  assert.equal(a.cancel().reason, 'cancelled')
})

test('a finished call keeps its own policy version and target across reloads', () => {
  const e = new Engine({ version: 'v1' })
  const a = e.begin({ route: 'openai/gpt-4o' })
  a.nextAttempt()
  e.reload({ version: 'v2' })
  assert.equal(a.report({ status: 200 }).action, 'succeeded')
  const b = e.begin({ route: 'anthropic/claude' })
  b.nextAttempt()
  assert.equal(b.report({ status: 200 }).action, 'succeeded')
  assert.equal(e.liveCalls, 0)
  assert.deepEqual([a.info().policyVersion, a.info().target], ['v1', 'openai/gpt-4o'])
  assert.deepEqual([b.info().policyVersion, b.info().target], ['v2', 'anthropic/claude'])
})

test('a finished call keeps its id as two numbers and prints it when asked', () => {
  const e = new Engine(null, { seed: 9 })
  const c = e.begin({ route: 'openai/gpt-4o' })
  const printed = c.nextAttempt().requestId
  c.report({ status: 200 })
  assert.equal(e.liveCalls, 0)
  const fin = c._fin
  assert.equal(fin._id, null, 'not printed by the step')
  assert.equal(native.requestIdText(fin.idHi, fin.idLo), printed)
  assert.equal(c.id, printed)
  assert.equal(c.info().id, printed)
  for (const [hi, lo] of [[-1, 0], [0.5, 0], [0, 2 ** 40], [2 ** 52, 0], [NaN, 0]]) {
    assert.throws(() => native.requestIdText(hi, lo), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /are not the numbers of a request id/ }, `${hi} ${lo}`)
  }
})
