'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const rw = require('..')
const { Engine, wrapFetch, decisionOf, StoppedError } = rw
const { localServer } = require('./helpers.js')

const fast = { backoff: { base_ms: 1, cap_ms: 5 } }

test('propagation headers on every attempt; Headers, plain objects, pairs and Request inputs', async () => {
  const srv = await localServer((req, res, n, rec) => {
    if (n % 2 === 1) {
      res.writeHead(503, { 'content-type': 'application/json' })
      return res.end('{"error":{"type":"server_error"}}')
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ got: rec.body }))
  })
  try {
    const e = new Engine(fast)
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 5000 })
    const inits = [
      () => [srv.url + '/a', { method: 'POST', headers: new Headers({ 'x-app': 'h' }), body: 'one' }],
      () => [srv.url + '/b', { method: 'POST', headers: { 'x-app': 'o' }, body: 'two' }],
      () => [new URL(srv.url + '/c'), { method: 'POST', headers: [['x-app', 'p']], body: new TextEncoder().encode('three') }],
      () => [new Request(srv.url + '/d', { method: 'POST', headers: { 'x-app': 'r' }, body: 'four' })],
    ]
    const bodies = ['one', 'two', 'three', 'four']
    const apps = ['h', 'o', 'p', 'r']
    for (let i = 0; i < inits.length; i++) {
      const r = await f(...inits[i]())
      assert.equal(r.status, 200)
      assert.deepEqual(await r.json(), { got: bodies[i] })
      const pair = srv.seen.slice(-2)
      for (const rec of pair) {
        assert.equal(rec.body, bodies[i], 'body replayed')
        assert.equal(rec.headers['x-app'], apps[i])
        assert.ok(Number(rec.headers['retrywise-deadline-ms']) <= 5000)
      }
      assert.equal(pair[0].headers['retrywise-request-id'], pair[1].headers['retrywise-request-id'])
      assert.deepEqual(pair.map((x) => x.headers['retrywise-attempt']), ['1', '2'])
    }
    assert.equal(e.liveCalls, 0)
    assert.equal(e.stats().successes, 4)
  } finally {
    await srv.close()
  }
})

test('a streamed request body is buffered once and replayed', async () => {
  const srv = await localServer((req, res, n, rec) => {
    res.writeHead(n === 1 ? 502 : 200)
    res.end(rec.body)
  })
  try {
    const f = wrapFetch(new Engine(fast), fetch, { route: 'local' })
    const body = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode('stre'))
        c.enqueue(new TextEncoder().encode('am'))
        c.close()
      },
    })
    const r = await f(srv.url, { method: 'POST', body, duplex: 'half' })
    assert.equal(await r.text(), 'stream')
    assert.deepEqual(srv.seen.map((x) => x.body), ['stream', 'stream'])
  } finally {
    await srv.close()
  }
})

test('retry-after-ms is honoured; the final error response is returned with its decision', async () => {
  const srv = await localServer((req, res, n) => {
    if (n === 1) {
      res.writeHead(429, { 'retry-after-ms': '300' })
      return res.end('{}')
    }
    res.writeHead(400, { 'content-type': 'application/json' })
    res.end('{"error":{"code":"bad_thing","type":"invalid_request_error"}}')
  })
  try {
    const f = wrapFetch(new Engine(), fetch, { route: 'local' })
    const t0 = Date.now()
    const r = await f(srv.url, { method: 'POST', body: '{}' })
    assert.ok(Date.now() - t0 >= 290)
    assert.equal(r.status, 400)
    assert.deepEqual(await r.json(), { error: { code: 'bad_thing', type: 'invalid_request_error' } })
    const d = decisionOf(r)
    assert.equal(d.action, 'stop')
    assert.equal(d.reason, 'invalid_request')
    assert.equal(srv.seen.length, 2)
  } finally {
    await srv.close()
  }
})

test('a body interrupted after bytes were delivered is not replayed (stream_visible)', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: {"delta":"c1 "}\n\n')
    setTimeout(() => res.socket.destroy(), 50)
  })
  try {
    const e = new Engine(fast)
    const f = wrapFetch(e, fetch, { route: 'local' })
    const r = await f(srv.url, { method: 'POST', body: '{}' })
    assert.equal(r.status, 200)
    const reader = r.body.getReader()
    const first = await reader.read()
    assert.match(new TextDecoder().decode(first.value), /c1/)
    await assert.rejects(reader.read(), (err) => err instanceof StoppedError && err.reason === 'stream_visible_output' && err.errorClass === 'partial_stream')
    assert.equal(srv.seen.length, 1)
    assert.equal(e.stats().stops.stream_visible_output, 1)
    assert.equal(e.liveCalls, 0)
  } finally {
    await srv.close()
  }
})

test('a body that fails before any byte is retried and the next body spliced in', async () => {
  const srv = await localServer((req, res, n) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    if (n === 1) {
      res.flushHeaders()
      setTimeout(() => res.socket.destroy(), 50)
      return
    }
    res.end('{"ok":true}')
  })
  try {
    const e = new Engine(fast)
    const f = wrapFetch(e, fetch, { route: 'local' })
    const r = await f(srv.url, { method: 'POST', body: '{}' })
    assert.deepEqual(await r.json(), { ok: true })
    assert.equal(srv.seen.length, 2)
    assert.equal(e.stats().successes, 1)
  } finally {
    await srv.close()
  }
})

test('a JSON success body that stalls hits the idle timeout inside the loop and is retried', async () => {
  const srv = await localServer((req, res, n) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    if (n === 1) return res.write('{"id":')
    res.end('{"ok":true}')
  })
  try {
    const e = new Engine({ ...fast, timeouts: { idle_ms: 200 } })
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 5000 })
    const t0 = Date.now()
    const r = await f(srv.url, { method: 'POST', body: '{}' })
    assert.deepEqual(await r.json(), { ok: true })
    const dt = Date.now() - t0
    assert.ok(dt >= 190 && dt < 1500, `${dt} ms: the idle timeout, not the deadline`)
    assert.equal(srv.seen.length, 2)
    const ends = e.events().filter((x) => x.kind === 'attempt_end')
    assert.equal(ends[0].error_kind, 'stream_idle_timeout')
    assert.equal(e.stats().successes, 1)
  } finally {
    await srv.close()
  }
})

test('a stream cut after its preamble, retried with a JSON answer: that body is spliced in', async () => {
  const role = 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
  const srv = await localServer((req, res, n) => {
    if (n === 1) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(role)
      setTimeout(() => res.socket.destroy(), 50)
      return
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"ok":true}')
  })
  try {
    const e = new Engine(fast)
    const f = wrapFetch(e, fetch, { route: 'local' })
    const r = await f(srv.url, { method: 'POST', body: '{}' })
    assert.equal(await r.text(), '{"ok":true}', 'the held preamble is dropped with its attempt')
    assert.equal(srv.seen.length, 2)
    assert.equal(e.stats().successes, 1)
  } finally {
    await srv.close()
  }
})

test('idle timeout between chunks ends the attempt', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: 1\n\n')
  })
  try {
    const e = new Engine({ timeouts: { idle_ms: 200 } })
    const f = wrapFetch(e, fetch, { route: 'local' })
    const t0 = Date.now()
    const r = await f(srv.url)
    await assert.rejects(r.text(), (err) => err.reason === 'stream_visible_output')
    const dt = Date.now() - t0
    assert.ok(dt >= 190 && dt < 1500, `${dt}`)
    const ends = e.events().filter((x) => x.kind === 'attempt_end')
    assert.equal(ends[0].error_kind, 'stream_idle_timeout')
  } finally {
    await srv.close()
  }
})

test('the caller AbortSignal cancels the call', async () => {
  const srv = await localServer(() => {})
  try {
    const e = new Engine()
    const f = wrapFetch(e, fetch, { route: 'local' })
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 100)
    const t0 = Date.now()
    await assert.rejects(f(srv.url, { signal: ac.signal }), (err) => err.name === 'AbortError')
    assert.ok(Date.now() - t0 < 1000)
    assert.equal(e.stats().stops.cancelled, 1)
  } finally {
    await srv.close()
  }
})

test('connection refused is retried, then surfaces as StoppedError', async () => {
  const srv = await localServer(() => {})
  const url = srv.url
  await srv.close()
  const e = new Engine(fast)
  const f = wrapFetch(e, fetch, { route: 'local' })
  await assert.rejects(f(url), (err) => err instanceof StoppedError && err.reason === 'max_attempts' && err.cause instanceof TypeError)
  assert.equal(e.stats().attempts, 3)
})

test('per-request overrides via init.retrywise; a dropped unsafe request reconciles', async () => {
  const srv = await localServer((req) => req.socket.destroy())
  try {
    const e = new Engine(fast)
    const f = wrapFetch(e, undefined, { route: 'local' })
    await assert.rejects(
      f(srv.url, { method: 'POST', body: '{}', retrywise: { idempotency: 'unsafe', tenant: 't9' } }),
      (err) => err instanceof StoppedError && err.action === 'reconcile' && err.reason === 'effect_unknown' && err.errorClass === 'result_unknown',
    )
    assert.equal(srv.seen.length, 1)
    assert.equal(e.reconcileList()[0].tenant, 't9')
  } finally {
    await srv.close()
  }
})

test('wrapFetch without a route routes by task', async () => {
  const e = new Engine({ upstreams: { a: {} }, routes: { summarize: { candidates: ['a'] } } })
  const f = wrapFetch(e, async () => new Response('x'), { task: 'summarize' })
  assert.equal(await (await f('http://127.0.0.1:9/')).text(), 'x')
  assert.equal(e.stats().per_upstream.a.attempts, 1)
})

test('a body nobody reads does not keep the call open past its deadline', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: 1\n\n')
  })
  try {
    const e = new Engine({ min_attempt_ms: 50 })
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 300 })
    const r = await f(srv.url)
    assert.equal(r.status, 200)
    assert.equal(e.liveCalls, 1)
    await new Promise((ok) => setTimeout(ok, 500))
    assert.equal(e.liveCalls, 0)
    assert.equal(e.stats().stops.deadline_exceeded, 1)
    await assert.rejects(r.text(), (err) => err instanceof StoppedError && err.reason === 'deadline_exceeded')
  } finally {
    await srv.close()
  }
})

test('a retry whose next attempt is refused returns the last response with the stop as its decision', async () => {
  // hold: false — a refused call stops at once instead of waiting for the
  // probe window (that is rescue.test.js's 'wrapFetch waits out a hold').
  const e = new Engine({ ...fast, breaker: { min_calls: 3, failure_rate: 0.5, open_jitter: 0, hold: false } })
  // Two other calls fail on the same upstream while the wrapper waits out the
  // Retry-After below: the breaker opens and the granted retry cannot start.
  const others = () => {
    for (let i = 0; i < 2; i++) {
      const c = e.begin({ route: 'local' })
      c.nextAttempt()
      c.report({ status: 503 })
      c.release()
    }
  }
  let n = 0
  const fake = async () => {
    n++
    setTimeout(others, 20)
    return new Response('{"error":{"type":"server_error"}}', {
      status: 503,
      headers: { 'content-type': 'application/json', 'retry-after-ms': '200' },
    })
  }
  const f = wrapFetch(e, fake, { route: 'local', deadlineMs: 5000 })
  const r = await f('http://127.0.0.1:9/x', { method: 'POST', body: '{}' })
  assert.equal(n, 1)
  assert.equal(r.status, 503)
  assert.deepEqual(await r.json(), { error: { type: 'server_error' } })
  const d = decisionOf(r)
  assert.equal(d.action, 'stop')
  assert.equal(d.reason, 'breaker_open')
  assert.equal(d.delayMs, 0)
  assert.equal(d.waitSource, 'none')
  assert.equal(d.errorClass, 'transient')
  assert.equal(e.liveCalls, 0)
})

test("first byte counts from when the request went out (Node's fetch says when), connect + first byte with a fetch that does not say", async () => {
  const srv = await localServer(() => {}) // reads each request, never answers
  try {
    // connect_ms at its default (5 s): the silence is first_byte_ms alone once undici wrote the request.
    const e = new Engine({ ...fast, max_attempts: 1, timeouts: { first_byte_ms: 300 } })
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 4000 })
    let t0 = performance.now()
    await assert.rejects(f(srv.url + '/silent', { method: 'POST', body: 'x' }), (err) => err instanceof StoppedError && err.cause && err.cause.kind === 'first_byte_timeout')
    let ms = performance.now() - t0
    assert.ok(ms >= 290 && ms < 1500, `${ms} ms`)
    assert.equal(srv.seen.length, 1)
    // A fetch of its own (no undici underneath): connect_ms + first_byte_ms, as before.
    const e2 = new Engine({ ...fast, max_attempts: 1, timeouts: { connect_ms: 400, first_byte_ms: 300 } })
    const never = (_url, init) => new Promise((_resolve, reject) => init.signal.addEventListener('abort', () => reject(init.signal.reason), { once: true }))
    const f2 = wrapFetch(e2, never, { route: 'local', deadlineMs: 4000 })
    t0 = performance.now()
    await assert.rejects(f2(srv.url + '/never', { method: 'POST', body: 'x' }), (err) => err instanceof StoppedError && err.cause && err.cause.kind === 'first_byte_timeout')
    ms = performance.now() - t0
    assert.ok(ms >= 690 && ms < 2000, `${ms} ms`)
  } finally {
    await srv.close()
  }
})

test('a body read inside the loop is handed on as a Response: read once, any reader, cloned, streamed on demand', async () => {
  const json = JSON.stringify({ ok: true, text: 'héllo' })
  const srv = await localServer((req, res) => {
    if (req.url === '/err') {
      res.writeHead(400, { 'content-type': 'application/json', 'x-request-id': 'e1' })
      return res.end('{"error":{"type":"invalid_request_error","code":"bad"}}')
    }
    res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': 'r1' })
    res.end(json)
  })
  try {
    const f = wrapFetch(new Engine(fast), fetch, { route: 'local', deadlineMs: 5000 })
    const r = await f(srv.url + '/ok')
    assert.ok(r instanceof Response)
    assert.equal(r.status, 200)
    assert.equal(r.ok, true)
    assert.equal(r.url, srv.url + '/ok')
    assert.equal(r.headers.get('x-request-id'), 'r1')
    assert.equal(decisionOf(r).action, 'succeeded')
    assert.equal(r.bodyUsed, false)
    const c = r.clone()
    assert.equal(decisionOf(c).action, 'succeeded')
    assert.deepEqual(await r.json(), JSON.parse(json))
    assert.equal(r.bodyUsed, true)
    await assert.rejects(r.text(), TypeError)
    assert.throws(() => r.clone(), TypeError)
    assert.equal(await c.text(), json)
    // Each reader, and the body as a stream, as the platform's Response gives them.
    for (const read of [(x) => x.arrayBuffer(), (x) => x.blob(), (x) => new Response(x.body).arrayBuffer()]) {
      const x = await f(srv.url + '/ok')
      const got = await read(x)
      const bytes = new Uint8Array(got instanceof Blob ? await got.arrayBuffer() : got)
      assert.equal(Buffer.from(bytes).toString('utf8'), json)
      assert.equal(x.bodyUsed, true)
    }
    const b = await f(srv.url + '/ok')
    assert.equal((await b.blob()).type, 'application/json')
    // The final error response, its body read for the vendor code, reads as it came.
    const e = await f(srv.url + '/err')
    assert.equal(e.status, 400)
    assert.equal(decisionOf(e).reason, 'invalid_request')
    assert.deepEqual(await e.json(), { error: { type: 'invalid_request_error', code: 'bad' } })
  } finally {
    await srv.close()
  }
})
