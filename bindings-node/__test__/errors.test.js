'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const rw = require('..')
const { Engine, PolicyError, RetrywiseError } = rw

test('invalid policy: PolicyError with code and the field path', () => {
  assert.throws(
    () => new Engine({ breaker: { failure_rat: 0.5 } }),
    (err) => err instanceof PolicyError && err instanceof RetrywiseError && err.code === 'ERR_RETRYWISE_POLICY' && err.path === 'breaker.failure_rat' && /unknown field/.test(err.message),
  )
  assert.throws(
    () => new Engine('max_attempts: 0\ndeadline_ms: 0\n'),
    (err) => err instanceof PolicyError && err.path === 'max_attempts' && err.errors.length >= 2 && err.errors[1].path === 'deadline_ms',
  )
  assert.throws(() => new Engine({ breaker: { failure_rate: 2 } }), (err) => err.path === 'breaker.failure_rate')
  assert.throws(() => Engine.fromFile('/nonexistent/policy.yaml'), (err) => err instanceof PolicyError && /cannot read/.test(err.message))
})

test('bad arguments: TypeError naming the argument', () => {
  const e = new Engine()
  const cases = [
    [() => new Engine(42), /policy/],
    [() => new Engine({}, { seed: -1 }), /opts\.seed/],
    [() => new Engine({}, { seed: 1.5 }), /opts\.seed/],
    [() => new Engine({}, { seed: 1n << 64n }), /opts\.seed/],
    [() => new Engine({}, { manualClock: 'yes' }), /opts\.manualClock/],
    [() => e.begin(), /spec must be an object/],
    [() => e.begin({}), /spec\.route/],
    [() => e.begin({ route: 'u', deadlineMs: -5 }), /spec\.deadlineMs/],
    [() => e.begin({ route: 'u', deadlineMs: '5' }), /spec\.deadlineMs/],
    [() => e.begin({ route: 'u', idempotency: 'maybe' }), /spec\.idempotency must be one of 'safe', 'keyed', 'unsafe'/],
    [() => e.begin({ route: 'u', tenant: 5 }), /spec\.tenant/],
    [() => e.begin({ route: 'u', task: 5 }), /spec\.task/],
    [() => e.begin({ route: 'u', inboundHeaders: 5 }), /spec\.inboundHeaders/],
    [() => e.onEvent('x'), /cb must be a function/],
    [() => e.setMode({ retries: 'no' }), /mode\.retries/],
    [() => e.breakerState(1), /upstream/],
    [() => e.advanceClock('1'), /ms must be a number/],
    [() => rw.deriveIdempotencyKey('t', 1, 'd'), /operation/],
    [() => rw.paramsDigest(undefined), /params/],
    [() => rw.wrapFetch({}, fetch), /engine must be a retrywise Engine/],
    [() => rw.wrapFetch(e, 'fetch'), /fetch must be a function/],
  ]
  for (const [f, re] of cases) assert.throws(f, (err) => err instanceof TypeError && re.test(err.message), String(re))
  const c = e.begin({ route: 'u' })
  c.nextAttempt()
  const outcomes = [
    [{ status: 42 }, /outcome\.status/],
    [{ status: '503' }, /outcome\.status/],
    [{ error: 'kaboom' }, /outcome\.error must be one of/],
    [{ status: 500, phase: 'later' }, /outcome\.phase must be one of 'before_send'/],
    [{ status: 500, effect: 'some' }, /outcome\.effect/],
    [{ status: 500, vendorCode: 7 }, /outcome\.vendorCode/],
    [{ status: 500, inputTokens: -1 }, /outcome\.inputTokens/],
    [{ status: 500, headers: 5 }, /outcome\.headers/],
    ['503', /outcome must be an object/],
  ]
  for (const [o, re] of outcomes) assert.throws(() => c.report(o), (err) => err instanceof TypeError && re.test(err.message), String(re))
  // The call is still usable after rejected arguments.
  assert.equal(c.report({ status: 200 }).action, 'succeeded')
})

test('engine.run rejects bad arguments', async () => {
  const e = new Engine()
  await assert.rejects(e.run('nope'), (err) => err instanceof TypeError && /fn must be a function/.test(err.message))
  await assert.rejects(e.run(async () => 1, { signal: {} }), (err) => err instanceof TypeError && /opts\.signal/.test(err.message))
  await assert.rejects(e.run(async () => 1, { route: 5 }), (err) => err instanceof TypeError && /opts\.route/.test(err.message))
})

test('a Rust panic becomes a JS Error; the engine stays usable (testing.panic_on_vendor_code)', async () => {
  const e = new Engine({ testing: { panic_on_vendor_code: 'boom' } })
  const c = e.begin({ route: 'u' })
  c.nextAttempt()
  assert.throws(
    () => c.report({ status: 500, vendorCode: 'boom' }),
    (err) => err instanceof Error && err.code === 'ERR_RETRYWISE_PANIC' && /panicked/.test(err.message),
  )
  // The same call and the engine go on.
  assert.equal(c.report({ status: 200 }).action, 'succeeded')
  const c2 = e.begin({ route: 'u' })
  c2.nextAttempt()
  assert.equal(c2.report({ status: 503 }).action, 'retry')
  // Through engine.run: an error carrying that vendor code makes run() reject with the panic error.
  await assert.rejects(
    e.run(async () => {
      throw new rw.AttemptError({ status: 500, vendorCode: 'boom' })
    }),
    { code: 'ERR_RETRYWISE_PANIC' },
  )
  assert.equal(await e.run(async () => 'fine', { route: 'u' }), 'fine')
  assert.equal(e.stats().successes, 2)
})
