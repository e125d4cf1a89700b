'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const rw = require('..')
const { Engine, StoppedError } = rw

const fast = { backoff: { base_ms: 1, cap_ms: 5 } }

function httpError(status, headers) {
  const e = new Error(`HTTP ${status}`)
  e.status = status
  if (headers) e.headers = headers
  return e
}

test('run: retries a thrown 503 and resolves with the value', async () => {
  const e = new Engine(fast)
  const seen = []
  const v = await e.run(
    async (a) => {
      seen.push([a.number, a.headers['retrywise-attempt'], a.signal instanceof AbortSignal])
      if (a.number < 3) throw httpError(503)
      return 'done'
    },
    { route: 'u', deadlineMs: 5000 },
  )
  assert.equal(v, 'done')
  assert.deepEqual(seen, [
    [1, '1', true],
    [2, '2', true],
    [3, '3', true],
  ])
  assert.equal(e.liveCalls, 0)
})

test('run: gives up with StoppedError carrying the last failure as cause', async () => {
  const e = new Engine(fast)
  let n = 0
  await assert.rejects(
    e.run(async () => {
      n++
      throw httpError(503)
    }),
    (err) => err instanceof StoppedError && err.reason === 'max_attempts' && err.errorClass === 'transient' && err.attempts === 3 && err.cause.status === 503,
  )
  assert.equal(n, 3)
  n = 0
  await assert.rejects(
    e.run(async () => {
      n++
      throw httpError(401)
    }),
    (err) => err.reason === 'auth_error' && err.action === 'stop',
  )
  assert.equal(n, 1)
})

test('run: network error codes map to error kinds (undici-style cause chain)', async () => {
  const e = new Engine(fast)
  let n = 0
  const v = await e.run(async () => {
    n++
    if (n === 1) throw new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }) })
    return n
  })
  assert.equal(v, 2)
  const u = new Engine(fast)
  await assert.rejects(
    u.run(
      async () => {
        throw new TypeError('fetch failed', { cause: Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET' }) })
      },
      { idempotency: 'unsafe' },
    ),
    (err) => err.action === 'reconcile' && err.reason === 'effect_unknown',
  )
  assert.equal(u.reconcileList().length, 1)
})

test('run: Retry-After from an error object; too long for the deadline stops at once', async () => {
  const e = new Engine()
  const t0 = Date.now()
  let n = 0
  await assert.rejects(
    e.run(
      async () => {
        n++
        throw httpError(429, new Headers({ 'retry-after': '3600' }))
      },
      { deadlineMs: 5000 },
    ),
    (err) => err.reason === 'retry_after_exceeds_deadline',
  )
  assert.equal(n, 1)
  assert.ok(Date.now() - t0 < 1000)
})

test('run: a non-2xx Response is a failure; classify() maps values', async () => {
  const e = new Engine(fast)
  let n = 0
  const r = await e.run(async () => (++n < 2 ? new Response('busy', { status: 503 }) : new Response('ok', { status: 200 })))
  assert.equal(await r.text(), 'ok')
  assert.equal(n, 2)
  n = 0
  const v = await e.run(async () => ({ code: ++n < 3 ? 'busy' : 'ok' }), { classify: (x) => (x.code === 'busy' ? { status: 503 } : undefined) })
  assert.deepEqual(v, { code: 'ok' })
  await assert.rejects(
    e.run(async () => new Response('nope', { status: 400 })),
    (err) => err.reason === 'invalid_request' && err.response.status === 400,
  )
})

test('run: the attempt timer ends an attempt that ignores its signal, within the deadline', async () => {
  const e = new Engine({ min_attempt_ms: 50 })
  const t0 = Date.now()
  let aborted = false
  await assert.rejects(
    e.run(
      (a) =>
        new Promise(() => {
          a.signal.addEventListener('abort', () => (aborted = true))
        }),
      { deadlineMs: 300 },
    ),
    (err) => err instanceof StoppedError && err.reason === 'deadline_exceeded' && err.cause.code === 'ERR_RETRYWISE_TIMEOUT',
  )
  const dt = Date.now() - t0
  assert.ok(dt >= 290 && dt < 600, `took ${dt} ms`)
  assert.ok(aborted)
})

test('run: attempts are stamped on the process clock (nowMs) however long after it started their engine was built', async () => {
  // engine.run's attempt timers compare the stamp (attempt.STAMP) with nowMs().
  // The stamp is the engine's own reading moved by the engine's offset from
  // the process clock, so an engine built 250 ms after the first one checks it.
  const native = require('../native.js')
  const { len, slots } = JSON.parse(native.vocab()).scratch
  new native.NativeEngine(new Float64Array(len), 0, null, '1', false)
  await new Promise((r) => setTimeout(r, 250))
  const s = new Float64Array(len)
  const n = new native.NativeEngine(s, 0, null, '1', false)
  const f = n.fast()
  s[slots.begin.ROUTE] = n.intern('openai/gpt-4o')
  s[slots.begin.DEADLINE_MS] = 10_000
  s[slots.begin.IDEMPOTENCY] = 0
  s[slots.begin.TENANT] = -1
  const before = native.nowMs()
  f.beginAttempt()
  const after = native.nowMs()
  assert.equal(s[slots.step.RESULT], 0)
  const stamp = s[slots.attempt.STAMP]
  assert.ok(stamp >= before - 1 && stamp <= after + 1, `stamp ${stamp} not within [${before}, ${after}]`)
})

test('run: AbortSignal aborts the attempt and reports it as cancelled', async () => {
  const e = new Engine()
  const ac = new AbortController()
  const seen = []
  e.onEvent((ev) => seen.push(ev))
  setTimeout(() => ac.abort(new Error('user gave up')), 50)
  const t0 = Date.now()
  await assert.rejects(
    e.run((a) => new Promise(() => {}), { signal: ac.signal, deadlineMs: 10_000 }),
    (err) => err.message === 'user gave up',
  )
  assert.ok(Date.now() - t0 < 1000)
  assert.ok(seen.some((ev) => ev.kind === 'decision' && ev.reason === 'cancelled'))
  assert.equal(e.stats().stops.cancelled, 1)
  assert.equal(e.liveCalls, 0)
})

test('run: AbortSignal aborts the sleep between attempts', async () => {
  const e = new Engine({ backoff: { base_ms: 5000, cap_ms: 5000, kind: 'equal' } })
  const ac = new AbortController()
  let n = 0
  setTimeout(() => ac.abort(), 100)
  const t0 = Date.now()
  await assert.rejects(
    e.run(
      async () => {
        n++
        throw httpError(503)
      },
      { signal: ac.signal, deadlineMs: 20_000 },
    ),
    (err) => err.name === 'AbortError',
  )
  assert.equal(n, 1)
  assert.ok(Date.now() - t0 < 1000)
  assert.equal(e.stats().stops.cancelled, 1)
  const pre = new AbortController()
  pre.abort()
  await assert.rejects(e.run(async () => 1, { signal: pre.signal }), (err) => err.name === 'AbortError')
})

test('run: a SyntaxError (a body that does not parse) is a retryable malformed_response', async () => {
  const e = new Engine({ ...fast, max_attempts: 3 })
  let n = 0
  const v = await e.run(
    async () => {
      n++
      if (n < 3) return JSON.parse('{"truncated": ')
      return 'parsed'
    },
    { route: 'u', deadlineMs: 5000 },
  )
  assert.equal(v, 'parsed')
  assert.equal(n, 3)
  const ends = e.events().filter((ev) => ev.kind === 'attempt_end' && ev['error.type'])
  assert.deepEqual(
    ends.map((ev) => ev.error_kind),
    ['malformed_response', 'malformed_response'],
  )
})

test('run: synchronous fn (value, throw) and thenables are attempts like async ones', async () => {
  const e = new Engine(fast)
  assert.equal(await e.run(() => 7), 7)
  let n = 0
  const v = await e.run(() => {
    if (++n < 2) throw httpError(503)
    return 'sync'
  })
  assert.equal(v, 'sync')
  assert.equal(n, 2)
  // A thenable whose then() throws is a failed attempt; one that calls back twice counts once.
  n = 0
  const w = await e.run(() => {
    n++
    if (n === 1)
      return {
        then() {
          throw httpError(503)
        },
      }
    return {
      then(ok) {
        ok('thenable')
        ok('again')
      },
    }
  })
  assert.equal(w, 'thenable')
  assert.equal(n, 2)
  assert.equal(e.liveCalls, 0)
  assert.equal(e.stats().attempts, 5)
})

test('run: bad arguments reject (never throw synchronously)', async () => {
  const e = new Engine()
  const bad = [
    () => e.run('nope'),
    () => e.run(async () => 1, null),
    () => e.run(async () => 1, { signal: {} }),
    () => e.run(async () => 1, { classify: 1 }),
    () => e.run(async () => 1, { deadlineMs: -1 }),
    () => e.run(async () => 1, { idempotency: 'sometimes' }),
  ]
  for (const f of bad) {
    let p
    assert.doesNotThrow(() => (p = f()))
    await assert.rejects(p, TypeError)
  }
  assert.equal(e.liveCalls, 0)
})

test('run: a successful attempt releases its call; routes and tenants past the interning table still work', async () => {
  const e = new Engine()
  for (let i = 0; i < 4200; i++) {
    const v = await e.run(async (a) => a.number, { route: 'r', tenant: `t${i}` })
    assert.equal(v, 1)
  }
  const c = e.begin({ route: 'another-route', tenant: 't4199' })
  assert.equal(c.nextAttempt().number, 1)
  assert.equal(c.report({ status: 200 }).action, 'succeeded')
  c.release()
  assert.equal(e.liveCalls, 0)
  assert.equal(e.stats().logical_requests, 4201)
})

test('run: an attempt timer keeps the process alive only while an attempt is pending', () => {
  const { spawnSync } = require('node:child_process')
  const path = require('node:path')
  const pkg = path.join(__dirname, '..')
  // Finished runs with 60 s deadlines leave the shared timer armed: the process still exits at once.
  const idle = spawnSync(
    process.execPath,
    ['-e', `const { Engine } = require(${JSON.stringify(pkg)}); const e = new Engine();
      (async () => { for (let i = 0; i < 3; i++) await e.run(async () => 1, { route: 'u', deadlineMs: 60000 }) })()`],
    { timeout: 20_000 },
  )
  assert.equal(idle.status, 0, String(idle.stderr))
  assert.equal(idle.signal, null, 'exited by itself, not killed at the timeout')
  // An attempt that waits on nothing else is kept alive by its timer until it times out.
  const t0 = Date.now()
  const pending = spawnSync(
    process.execPath,
    ['-e', `const { Engine } = require(${JSON.stringify(pkg)}); const e = new Engine({ max_attempts: 1 });
      e.run(() => new Promise(() => {}), { route: 'u', deadlineMs: 1000 }).catch((err) => { console.log(err.reason); })`],
    { timeout: 20_000, encoding: 'utf8' },
  )
  assert.equal(pending.status, 0, pending.stderr)
  assert.ok(Date.now() - t0 >= 900, 'waited for the attempt timer')
  assert.equal(pending.stdout.trim(), 'deadline_exceeded')
})
