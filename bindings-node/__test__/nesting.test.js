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

// What carries the attempt (lib/context.js, README "Nesting"): fn's synchronous code and
// every promise continuation registered inside it, with either carrier; with
// AsyncLocalStorage also the callbacks it schedules and the work a thenable's then starts
// when awaited. ci.sh runs this file under both carriers (RETRYWISE_NESTING).
const { carrierName } = require('../lib/context.js')
const fullCarrier = carrierName === 'async-local-storage'

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))

/** A Promise subclass whose then starts its work on first use. */
class LazyPromise extends Promise {
  /** @param {() => Promise<unknown>} make */
  constructor(make) {
    super((ok) => ok(null))
    this.make = make
  }
  /** @type {Promise<any>['then']} */
  then(onOk, onErr) {
    return this.make().then(onOk, onErr)
  }
}

/** Begins a call of `e` where it is called and says whether it is an owner and its request id. */
function probe(e, spec = { route: 'inner' }) {
  const c = e.begin(spec)
  const a = c.nextAttempt()
  const r = { owner: c.info().owner, id: a.requestId }
  c.report({ status: 200 })
  return r
}

/**
 * Runs `body(e, outer)` inside engine.run and checks every probe it returns began
 * inside the attempt: a non-owner with the outer request id.
 */
async function nestedEverywhere(body) {
  const e = new Engine({ ...fast, max_attempts: 1 })
  let outerId
  const got = await e.run(
    async (outer) => {
      outerId = outer.requestId
      return body(e, outer)
    },
    { route: 'outer', deadlineMs: 10_000 },
  )
  assert.ok(got.length > 0)
  for (const [i, r] of got.entries()) {
    assert.equal(r.owner, false, `probe ${i} began as an owner`)
    assert.equal(r.id, outerId, `probe ${i}`)
  }
  assert.equal(rw.currentAttempt(), undefined)
  return got
}

test('nesting path: await chains through other async functions, at any depth', async () => {
  await nestedEverywhere(async (e) => {
    async function deepest() {
      await Promise.resolve()
      await sleep(2)
      return probe(e)
    }
    async function middle() {
      await null
      const r = await deepest()
      return [r, probe(e)]
    }
    const rs = await middle()
    await sleep(1)
    return [...rs, probe(e)]
  })
})

test('nesting path: then / catch / finally callbacks registered inside the attempt', async () => {
  // A promise made outside any attempt and settled from outside: its reaction runs in the
  // attempt that registered it, as with an AsyncLocalStorage.
  let open
  const gate = new Promise((ok) => {
    open = ok
  })
  setTimeout(() => open(), 5)
  await nestedEverywhere(async (e) => {
    const out = []
    await Promise.resolve().then(() => out.push(probe(e)))
    await Promise.reject(new Error('x')).catch(() => out.push(probe(e)))
    await sleep(1).finally(() => out.push(probe(e)))
    await gate.then(() => out.push(probe(e)))
    await new Promise((ok) => {
      sleep(1).then(() => ok(out.push(probe(e))))
    })
    return out
  })
})

test('nesting path: Promise.all, race, allSettled and any', async () => {
  await nestedEverywhere(async (e) => {
    const later = async (ms) => {
      await sleep(ms)
      return probe(e)
    }
    const all = await Promise.all([later(1), later(3), Promise.resolve().then(() => probe(e))])
    const race = await Promise.race([later(1), sleep(50)])
    const settled = (await Promise.allSettled([later(2)])).map((s) => /** @type {any} */ (s).value)
    const any = await Promise.any([Promise.reject(new Error('no')), later(1)])
    const after = await Promise.all([sleep(1), sleep(2)]).then(() => probe(e))
    return [...all, race, ...settled, any, after]
  })
})

test('nesting path: async generators and for await', async () => {
  await nestedEverywhere(async (e) => {
    async function* chunks() {
      for (let i = 0; i < 3; i++) {
        await sleep(1)
        yield probe(e)
      }
    }
    const out = []
    for await (const r of chunks()) {
      out.push(r)
      await null
      out.push(probe(e))
    }
    out.push(probe(e))
    return out
  })
})

test('nesting path: awaited Promise subclasses whose work started inside the attempt', async () => {
  await nestedEverywhere(async (e) => {
    const out = []
    // The SDK shape (openai-node's APIPromise): the work starts when the promise is made.
    const started = (async () => {
      await sleep(1)
      return probe(e)
    })()
    out.push(await new LazyPromise(() => started))
    // A subclass that keeps Promise's then.
    class Sub extends Promise {}
    out.push(await Sub.resolve(1).then(() => probe(e)))
    out.push(probe(e))
    return out
  })
})

test('nesting path: work a thenable starts in its then when awaited', async () => {
  const e = new Engine({ ...fast, max_attempts: 1 })
  const got = await e.run(
    async (outer) => ({
      outer: outer.requestId,
      // A plain thenable: its then is called by the job that adopts it.
      plain: await { then: (/** @type {(v: unknown) => void} */ ok) => ok(probe(e)) },
      // A Promise subclass whose then starts its work on first use.
      lazy: await new LazyPromise(async () => {
        await sleep(1)
        return probe(e)
      }),
      back: probe(e),
    }),
    { route: 'outer', deadlineMs: 10_000 },
  )
  // V8 runs the job that calls an awaited thenable's then without the continuation's
  // data (Node 20): with that carrier, a call begun there is an owner.
  for (const r of [got.plain, got.lazy]) {
    assert.equal(r.owner, !fullCarrier)
    if (fullCarrier) assert.equal(r.id, got.outer)
    else assert.notEqual(r.id, got.outer)
  }
  // The continuation of the await is back in the attempt either way.
  assert.equal(got.back.owner, false)
  assert.equal(got.back.id, got.outer)
})

test('nesting path: callbacks of timers, setImmediate, nextTick and queueMicrotask scheduled inside the attempt', async () => {
  const e = new Engine({ ...fast, max_attempts: 1 })
  const got = await e.run(
    async (outer) => {
      const inTimer = await new Promise((ok) => setTimeout(() => ok(probe(e)), 1))
      const inImmediate = await new Promise((ok) => setImmediate(() => ok(probe(e))))
      const inTick = await new Promise((ok) => process.nextTick(() => ok(probe(e))))
      const inMicrotask = await new Promise((ok) => queueMicrotask(() => ok(probe(e))))
      // Tied by its propagation headers as well (as a call in another process would be).
      const byHand = await new Promise((ok) => setTimeout(() => ok(probe(e, { route: 'inner', inboundHeaders: outer.headers })), 1))
      // Awaiting what the callback settled is back in the attempt.
      const back = probe(e)
      return { outer: outer.requestId, owners: [inTimer, inImmediate, inTick, inMicrotask], byHand, back }
    },
    { route: 'outer', deadlineMs: 10_000 },
  )
  // AsyncLocalStorage carries the context into every callback scheduled inside the
  // attempt: a call begun there is no second retry owner. V8's continuation data does
  // not follow a callback Node schedules: a call begun there is an owner, unless tied
  // by the attempt's headers.
  for (const [i, r] of got.owners.entries()) {
    assert.equal(r.owner, !fullCarrier, `callback ${i}`)
    if (fullCarrier) assert.equal(r.id, got.outer)
    else assert.notEqual(r.id, got.outer)
  }
  assert.equal(got.byHand.owner, false)
  assert.equal(got.byHand.id, got.outer)
  assert.equal(got.back.owner, false)
  assert.equal(got.back.id, got.outer)
})

test('nesting carrier: V8 continuation data on Node 20 unless RETRYWISE_NESTING asks for AsyncLocalStorage', () => {
  const asked = process.env.RETRYWISE_NESTING
  const major = Number(process.versions.node.split('.')[0])
  if (asked === 'async-local-storage') assert.equal(carrierName, 'async-local-storage')
  else if (major === 20) assert.equal(carrierName, 'continuation')
  else assert.ok(['continuation', 'async-local-storage'].includes(carrierName))
})

test('nesting carrier: V8 continuation data enables no async_hooks, the storage does while a run is in flight', () => {
  const { spawnSync } = require('node:child_process')
  // In a process of its own: promises get async ids only while Node's promise hooks are on.
  const script = `
    const { executionAsyncId } = require('node:async_hooks')
    const { Engine } = require('./index.js')
    const e = new Engine()
    ;(async () => {
      const ids = []
      await e.run(async () => { await null; ids.push(executionAsyncId()) }, { route: 'x' })
      await null
      ids.push(executionAsyncId())
      console.log(JSON.stringify(ids))
    })()`
  /** @param {string} nesting */
  const ids = (nesting) => {
    const r = spawnSync(process.execPath, ['-e', script], {
      cwd: require('node:path').join(__dirname, '..'),
      env: { ...process.env, RETRYWISE_NESTING: nesting },
      encoding: 'utf8',
    })
    assert.equal(r.status, 0, r.stderr)
    return JSON.parse(r.stdout)
  }
  // An AsyncLocalStorage on async_hooks (Node 20 and 22) turns promise hooks on
  // while it is enabled; one on AsyncContextFrame (Node 24) needs none.
  const { AsyncLocalStorage } = require('node:async_hooks')
  const hooksBased = typeof (/** @type {any} */ (AsyncLocalStorage.prototype)._propagate) === 'function'
  assert.equal(ids('async-local-storage').filter((id) => id > 0).length, hooksBased ? 2 : 0)
  if (Number(process.versions.node.split('.')[0]) === 20) assert.deepEqual(ids('continuation'), [0, 0])
})

test('nesting carrier: without V8\'s symbols the storage carries the attempt (the fallback, on any Node)', () => {
  const { spawnSync } = require('node:child_process')
  // RETRYWISE_TEST_HIDE_V8 (honoured by the test build only) makes the addon
  // find none of V8's continuation-data functions, as a Node that does not
  // export them would: the carrier falls back to AsyncLocalStorage, asked for or not.
  const script = `
    const { carrierName } = require('./lib/context.js')
    const { Engine, currentAttempt } = require('./index.js')
    const e = new Engine({ backoff: { base_ms: 1, cap_ms: 5 } })
    ;(async () => {
      const seen = []
      await e.run(async (outer) => {
        await null
        const c = e.begin({ route: 'inner' })
        seen.push(currentAttempt() === outer, c.info().owner, c.nextAttempt().requestId === outer.requestId)
        c.release()
        await new Promise((r) => setTimeout(r, 1))
        seen.push(currentAttempt() === outer)
      }, { route: 'outer' })
      seen.push(currentAttempt() === undefined)
      console.log(JSON.stringify({ carrierName, seen }))
    })()`
  for (const nesting of ['', 'continuation']) {
    const r = spawnSync(process.execPath, ['-e', script], {
      cwd: require('node:path').join(__dirname, '..'),
      env: { ...process.env, RETRYWISE_TEST_HIDE_V8: '1', RETRYWISE_NESTING: nesting },
      encoding: 'utf8',
    })
    assert.equal(r.status, 0, r.stderr)
    assert.deepEqual(JSON.parse(r.stdout), { carrierName: 'async-local-storage', seen: [true, false, true, true, true] }, `RETRYWISE_NESTING=${JSON.stringify(nesting)}`)
  }
})

test('nesting carrier: an unknown RETRYWISE_NESTING is refused at load, naming the variable', () => {
  const { spawnSync } = require('node:child_process')
  const r = spawnSync(process.execPath, ['-e', "require('./index.js')"], {
    cwd: require('node:path').join(__dirname, '..'),
    env: { ...process.env, RETRYWISE_NESTING: 'hooks' },
    encoding: 'utf8',
  })
  assert.notEqual(r.status, 0)
  assert.match(r.stderr, /RETRYWISE_NESTING must be "continuation" or "async-local-storage"; got "hooks"/)
})

test('nesting path: a wrapped fetch called from an SDK-like async chain inside engine.run', async () => {
  const srv = await localServer((req, res, n) => {
    if (n < 3) {
      res.writeHead(503, { 'content-type': 'application/json' })
      res.end('{"error":{"message":"busy","type":"server_error"}}')
      return
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"ok":true}')
  })
  try {
    // What an SDK does between the caller and fetch: option preparation and an
    // awaited request builder behind a lazy Promise subclass, its own retries off.
    class MiniSdk {
      /** @param {typeof fetch} f */
      constructor(f) {
        this.fetch = f
      }
      async prepare() {
        await sleep(1)
        return { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"m"}' }
      }
      /** @param {string} url */
      async request(url) {
        const init = await this.prepare()
        const res = await this.fetch(url, init)
        if (!res.ok) throw Object.assign(new Error(`HTTP ${res.status}`), { status: res.status, headers: res.headers })
        return res.json()
      }
      /** @param {string} url */
      create(url) {
        // As openai-node's APIPromise: the request starts here, parsing when awaited.
        const started = this.request(url)
        return new LazyPromise(() => started)
      }
    }
    const e = new Engine(fast)
    const sdk = new MiniSdk(wrapFetch(e, fetch, { route: 'local' }))
    /** @type {string[]} */
    const outerIds = []
    const v = await e.run(
      async (outer) => {
        outerIds.push(outer.requestId)
        return sdk.create(srv.url + '/v1/chat')
      },
      { route: 'outer', deadlineMs: 5000 },
    )
    assert.deepEqual(v, { ok: true })
    // One physical request per outer attempt: the wrapped fetch was a non-owner each
    // time, and the outer owner retried.
    assert.equal(outerIds.length, 3)
    assert.equal(srv.seen.length, 3)
    assert.deepEqual(
      srv.seen.map((r) => r.headers['retrywise-request-id']),
      outerIds,
    )
    assert.deepEqual(
      srv.seen.map((r) => r.headers['retrywise-attempt']),
      ['1', '2', '3'],
    )
  } finally {
    await srv.close()
  }
})

test('nesting: concurrent attempts each see their own, and code outside sees none', async () => {
  const e = new Engine({ ...fast, max_attempts: 1 })
  const outside = []
  let stop = false
  // A chain made outside any attempt, running while the attempts do.
  const bystander = (async () => {
    while (!stop) {
      await sleep(1)
      outside.push(rw.currentAttempt())
      outside.push(probe(e))
    }
  })()
  const one = (ms) =>
    e.run(
      async (outer) => {
        const out = []
        for (let i = 0; i < 5; i++) {
          await sleep(ms)
          out.push(probe(e))
          out.push(rw.currentAttempt() === outer)
        }
        return { outer: outer.requestId, out }
      },
      { route: 'outer', deadlineMs: 10_000 },
    )
  const runs = await Promise.all([one(1), one(2), one(3)])
  stop = true
  await bystander
  assert.equal(new Set(runs.map((r) => r.outer)).size, 3)
  for (const r of runs) {
    for (const x of r.out) {
      if (typeof x === 'boolean') assert.equal(x, true)
      else {
        assert.equal(x.owner, false)
        assert.equal(x.id, r.outer)
      }
    }
  }
  assert.ok(outside.length > 0)
  for (const x of outside) {
    if (x === undefined) continue
    assert.equal(x.owner, true)
  }
  assert.equal(rw.currentAttempt(), undefined)
})

test('nesting works beside an AsyncLocalStorage of the caller, which keeps its own store', async () => {
  const { AsyncLocalStorage } = require('node:async_hooks')
  const als = new AsyncLocalStorage()
  try {
    await als.run({ request: 'r1' }, async () => {
      await nestedEverywhere(async (e) => {
        const out = []
        await sleep(1)
        assert.deepEqual(als.getStore(), { request: 'r1' })
        out.push(probe(e))
        await Promise.all([sleep(1), sleep(2)])
        assert.deepEqual(als.getStore(), { request: 'r1' })
        out.push(probe(e))
        // The caller's storage still carries through timers, ours does not.
        out.push(await new Promise((ok) => setTimeout(() => ok(als.getStore()), 1)).then((s) => (assert.deepEqual(s, { request: 'r1' }), probe(e))))
        return out
      })
      assert.deepEqual(als.getStore(), { request: 'r1' })
    })
  } finally {
    als.disable()
  }
})
