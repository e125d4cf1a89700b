'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const rw = require('..')
const { Engine, wrapFetch } = rw
const { localServer } = require('./helpers.js')

const fast = { backoff: { base_ms: 1, cap_ms: 5 } }

test('a call inside an attempt inherits deadline and ids and is a non-owner', async () => {
  const e = new Engine(fast)
  const inner = []
  let outerN = 0
  await assert.rejects(
    e.run(
      async (outer) => {
        outerN++
        assert.equal(rw.currentAttempt(), outer)
        const c = e.begin({ route: 'inner', deadlineMs: 60_000 })
        const a = c.nextAttempt()
        inner.push({ id: a.requestId, outerId: outer.requestId, remaining: a.remainingMs, outerRemaining: outer.remainingMs, owner: c.info().owner })
        const d = c.report({ status: 503 })
        assert.equal(d.action, 'stop')
        assert.equal(d.reason, 'not_owner')
        assert.match(d.detail, /retryable_status/)
        c.release()
        const err = new Error('503 from inner')
        err.status = 503
        throw err
      },
      { route: 'outer', deadlineMs: 4000 },
    ),
    (err) => err.reason === 'max_attempts',
  )
  assert.equal(outerN, 3)
  for (const x of inner) {
    assert.equal(x.id, x.outerId)
    assert.equal(x.owner, false)
    assert.ok(x.remaining <= x.outerRemaining, `${x.remaining} <= ${x.outerRemaining}`)
    assert.ok(x.remaining <= 4000)
  }
  assert.equal(rw.currentAttempt(), undefined)
})

test('inherit: false opts out of nesting', async () => {
  const e = new Engine()
  await e.run(async () => {
    const c = e.begin({ route: 'x', inherit: false })
    c.nextAttempt()
    assert.equal(c.info().owner, true)
    c.release()
  })
})

test('nested engine.run: the inner StoppedError carries the evidence to the outer owner', async () => {
  const e = new Engine(fast)
  let calls = 0
  const v = await e.run(async () => {
    return e.run(async () => {
      calls++
      if (calls < 3) {
        const err = new Error('busy')
        err.status = 503
        throw err
      }
      return 'ok'
    })
  })
  assert.equal(v, 'ok')
  assert.equal(calls, 3) // 3 outer attempts x 1 inner attempt, not 3 x 3
})

test('wrapFetch inside engine.run: one physical request per outer attempt (no multiplication)', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(503, { 'content-type': 'application/json' })
    res.end('{"error":{"message":"busy","type":"server_error"}}')
  })
  try {
    const e = new Engine(fast)
    const f = wrapFetch(e, fetch, { route: 'local' })
    await assert.rejects(
      e.run(async () => {
        const r = await f(srv.url + '/v1/x', { method: 'POST', body: '{}' })
        return r
      }, { route: 'outer', deadlineMs: 5000 }),
      (err) => err.reason === 'max_attempts' && err.response.status === 503,
    )
    assert.equal(srv.seen.length, 3)
    const ids = new Set(srv.seen.map((r) => r['headers']['retrywise-request-id']))
    assert.equal(ids.size, 1)
    // Each inner (non-owner) call sends the owner's attempt number downstream.
    assert.deepEqual(
      srv.seen.map((r) => r.headers['retrywise-attempt']),
      ['1', '2', '3'],
    )
    for (const r of srv.seen) assert.ok(Number(r.headers['retrywise-deadline-ms']) <= 5000)
  } finally {
    await srv.close()
  }
})

test('a call of another engine inherits through propagation headers', async () => {
  const outerEngine = new Engine()
  const innerEngine = new Engine()
  await outerEngine.run(async (outer) => {
    const c = innerEngine.begin({ route: 'svc' })
    const a = c.nextAttempt()
    assert.equal(a.requestId, outer.requestId)
    assert.equal(c.info().owner, false)
    assert.ok(a.remainingMs <= outer.remainingMs)
    c.release()
  }, { deadlineMs: 3000 })
})

test('a task that outlives its attempt begins as an owner', async () => {
  const e = new Engine()
  const other = new Engine()
  let later
  await e.run(async () => {
    later = new Promise((ok) => setTimeout(ok, 20)).then(() => [e.begin({ route: 'x' }), other.begin({ route: 'y' })])
  })
  const [c1, c2] = await later
  for (const c of [c1, c2]) {
    c.nextAttempt()
    assert.equal(c.info().owner, true)
    c.release()
  }
})

test('nesting holds while a call is in flight however long, and again after retrywise was idle', async () => {
  const { IDLE_MS } = require('../lib/context.js')
  // One attempt: a failed assertion inside an attempt must not be retried away.
  const e = new Engine({ ...fast, max_attempts: 1 })
  const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))
  const innerOwner = (waitMs) => async (outer) => {
    // Turns of the event loop inside the attempt: the context must still be there.
    await sleep(waitMs)
    const c = e.begin({ route: 'inner' })
    const a = c.nextAttempt()
    assert.equal(a.requestId, outer.requestId)
    const owner = c.info().owner
    c.report({ status: 200 })
    return owner
  }
  // Another call ends while this one is in flight for longer than the idle period (twice: a check
  // armed before that call started waits a period more): the context stays.
  const long = e.run(innerOwner(2 * IDLE_MS + 200), { route: 'outer', deadlineMs: 10_000 })
  await e.run(async () => 'short', { route: 'short' })
  assert.equal(await long, false)
  // Idle for longer than the idle period: retrywise's async context is let go, then taken up by the next call.
  await sleep(IDLE_MS + 100)
  assert.equal(rw.currentAttempt(), undefined)
  const c = e.begin({ route: 'alone' })
  c.nextAttempt()
  assert.equal(c.info().owner, true)
  assert.equal(await e.run(innerOwner(5), { route: 'outer', deadlineMs: 5000 }), false)

  // A wrapped fetch's attempt carries its context too.
  const f = wrapFetch(
    e,
    async (url, init) => {
      await sleep(5)
      const inner = e.begin({ route: 'inside-fetch' })
      const a = inner.nextAttempt()
      const body = JSON.stringify({ owner: inner.info().owner, id: a.requestId, sent: init.headers.get('retrywise-request-id') })
      inner.report({ status: 200 })
      return new Response(body, { status: 200, headers: { 'content-type': 'application/json' } })
    },
    { route: 'fetch' },
  )
  const r = await (await f('http://127.0.0.1:9/x')).json()
  assert.equal(r.owner, false)
  assert.equal(r.id, r.sent)
})
