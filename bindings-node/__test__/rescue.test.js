'use strict'
// What the core's rescue and hold decisions look like from Node: continuations
// of a broken stream (decision.continuation, outcome.resumable / continuation),
// a call held for an open breaker's probe window (StoppedError.waitMs; run()
// and wrapFetch wait it out), the route of a request model, how an upstream is
// reached, the policy's stream gate, and timer expiry mapped by the core.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Engine, wrapFetch, StoppedError, PolicyError, AttemptTimeoutError } = require('..')

// b's capabilities are a complete list: it declares streaming, or a streamed request never reaches it.
const CONTINUE = {
  upstreams: { a: {}, b: { capabilities: ['streaming', 'assistant_prefill'] }, c: {} },
  routes: { r: { candidates: ['a', 'b'], stream_recovery: 'continue' }, r2: { candidates: ['a', 'c'], stream_recovery: 'continue' } },
}

test('a stream cut after text is continued elsewhere: prefill where declared, then an instruction when the prefill is refused', () => {
  const e = new Engine(CONTINUE, { seed: 116, manualClock: true })
  const c = e.begin({ route: 'r' })
  assert.equal(c.nextAttempt().upstream, 'a')
  let d = c.report({ error: 'connection_reset', phase: 'stream_visible', resumable: true })
  assert.equal(d.action, 'fallback')
  assert.equal(d.upstream, 'b')
  assert.equal(d.reason, 'stream_visible_output')
  assert.equal(d.continuation, 'prefill')
  assert.equal(d.delayMs, 0)
  const a2 = c.nextAttempt()
  assert.equal(a2.upstream, 'b')
  assert.equal(a2.fallback, true)
  d = c.report({ status: 400, continuation: 'prefill', body: '{"type":"error","error":{"type":"invalid_request_error","message":"no prefill"}}' })
  assert.equal(d.action, 'retry')
  assert.equal(d.reason, 'prefill_rejected')
  assert.equal(d.continuation, 'instruction')
  assert.equal(c.nextAttempt().upstream, 'b')
  d = c.report({ status: 200, continuation: 'instruction' })
  assert.equal(d.action, 'succeeded')
  assert.equal(d.continuation, null)

  // Without assistant_prefill the continuation is an instruction; not resumable: a stop.
  const y = e.begin({ route: 'r2' })
  y.nextAttempt()
  assert.equal(y.report({ error: 'connection_reset', phase: 'stream_visible', resumable: true }).continuation, 'instruction')
  const t = e.begin({ route: 'r' })
  t.nextAttempt()
  d = t.report({ error: 'connection_reset', phase: 'stream_visible' })
  assert.equal(d.action, 'stop')
  assert.equal(d.reason, 'stream_visible_output')
  assert.equal(d.continuation, null)
  assert.throws(() => e.begin({ route: 'r' }).report({ status: 200, continuation: 'splice' }), TypeError)
})

const HOLD = { max_attempts: 1, breaker: { min_calls: 2, window_size: 2, failure_rate: 0.5, open_ms: 5000, open_jitter: 0, hold_jitter_ms: 1000, hold_max_ms: 5000 } }

/** Two failed calls on `route`: its breaker opens. */
function trip(e, route) {
  for (let i = 0; i < 2; i++) {
    const c = e.begin({ route })
    c.nextAttempt()
    assert.equal(c.report({ status: 503 }).action, 'stop')
  }
}

test('a call refused by an open breaker whose probe window comes within the deadline is held: waitMs, then an attempt', () => {
  const e = new Engine(HOLD, { seed: 114, manualClock: true })
  trip(e, 'up')
  e.advanceClock(1000)
  const h = e.begin({ route: 'up', deadlineMs: 30_000 })
  assert.throws(
    () => h.nextAttempt(),
    (err) => err instanceof StoppedError && err.reason === 'breaker_open' && err.waitMs === 4030,
  )
  assert.equal(e.stats().stops.breaker_open, undefined)
  e.advanceClock(5000)
  assert.equal(h.nextAttempt().upstream, 'up')
  assert.equal(h.report({ status: 200 }).action, 'succeeded')
  // An open period that does not fit the deadline: a stop, no wait.
  trip(e, 'other')
  assert.throws(
    () => e.begin({ route: 'other', deadlineMs: 3000 }).nextAttempt(),
    (err) => err instanceof StoppedError && err.reason === 'breaker_open' && err.waitMs === null,
  )
  assert.equal(e.stats().stops.breaker_open, 1)
})

const SHORT_HOLD = { max_attempts: 1, breaker: { min_calls: 2, window_size: 2, failure_rate: 0.5, open_ms: 300, open_jitter: 0, hold_jitter_ms: 0, hold_max_ms: 1000 } }

test('run() waits out a hold and then makes its attempt', async () => {
  const e = new Engine(SHORT_HOLD, { seed: 3 })
  trip(e, 'up')
  assert.equal(e.breakerState('up'), 'open')
  let calls = 0
  const v = await e.run(async () => ++calls, { route: 'up', deadlineMs: 5000 })
  assert.equal(v, 1)
  assert.equal(calls, 1)
  assert.equal(e.stats().stops.breaker_open, undefined)
  // Its attempt was the first probe of the half-open breaker.
  assert.equal(e.breakerState('up'), 'half_open')
})

test('wrapFetch waits out a hold and then sends the request', async () => {
  const e = new Engine(SHORT_HOLD, { seed: 3 })
  trip(e, 'up')
  assert.equal(e.breakerState('up'), 'open')
  let sent = 0
  const fake = async () => {
    sent++
    return new Response('{"ok":true}', { status: 200, headers: { 'content-type': 'application/json' } })
  }
  const f = wrapFetch(e, fake, { route: 'up', deadlineMs: 5000 })
  const r = await f('http://127.0.0.1:9/v1/chat/completions', { method: 'POST', body: '{}' })
  assert.equal(r.status, 200)
  assert.deepEqual(await r.json(), { ok: true })
  assert.equal(sent, 1)
  assert.equal(e.stats().stops.breaker_open, undefined)
  assert.equal(e.liveCalls, 0)
})

test('routeForModel: the models map, a route or an upstream of that name; anything else names the keys to add', () => {
  const e = new Engine({
    upstreams: {
      primary: { provider: 'openai', model: 'gpt-4o', base_url: 'https://api.openai.com/v1', api: 'openai', api_key_env: 'OPENAI_API_KEY' },
      backup: { provider: 'deepseek', model: 'deepseek-chat', capabilities: ['assistant_prefill'] },
    },
    routes: { chat: { candidates: ['primary', 'backup'] } },
    models: { 'gpt-4o-latest': 'chat' },
  })
  assert.equal(e.routeForModel('gpt-4o-latest'), 'chat')
  assert.equal(e.routeForModel('chat'), 'chat')
  assert.equal(e.routeForModel('backup'), 'backup')
  assert.equal(e.routeForModel('deepseek-chat'), 'backup')
  assert.throws(() => e.routeForModel('claude-3'), (err) => err instanceof PolicyError && /claude-3/.test(err.message))
  assert.throws(() => e.routeForModel(7), TypeError)
  assert.deepEqual(e.reach('primary'), {
    upstream: 'primary',
    baseUrl: 'https://api.openai.com/v1',
    api: 'openai',
    model: 'gpt-4o',
    apiKeyEnv: 'OPENAI_API_KEY',
    apiVersion: null,
    prefill: false,
  })
  assert.equal(e.reach('backup').prefill, true)
  assert.equal(e.reach('nowhere').baseUrl, null)
})

test("engine.streamGate: an error event before output is held and named; malformed events as the policy says", () => {
  const enc = (s) => new TextEncoder().encode(s)
  const dec = (b) => new TextDecoder().decode(b)
  const e = new Engine({})
  let g = e.streamGate('text/event-stream')
  assert.equal(dec(g.feed(enc('event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'))), '')
  assert.deepEqual(g.streamError, { code: 'overloaded_error', message: 'busy', afterOutput: false })
  assert.deepEqual(g.outcome(200), { status: 529, phase: 'stream_open', vendorCode: 'overloaded_error' })
  const ok = 'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
  g = e.streamGate('text/event-stream')
  assert.equal(dec(g.feed(enc(ok + 'data: {oops\n\n' + ok))), ok + ok)
  assert.equal(g.skipped, 1)
  assert.deepEqual(g.outcome(200), { status: 200 })
  const strict = new Engine({ streams: { malformed_event: 'error' } })
  g = strict.streamGate('text/event-stream')
  assert.equal(dec(g.feed(enc(ok + 'data: {oops\n\n' + ok))), ok)
  assert.equal(g.streamError.code, 'malformed_event')
  assert.deepEqual(g.outcome(200), { status: 200, error: 'malformed_response', phase: 'stream_visible', vendorCode: 'malformed_event' })
})

test('an attempt timer shorter than the time left is a first-byte timeout (the core maps expiries), retried', async () => {
  const e = new Engine({ max_attempts: 2, backoff: { base_ms: 0, cap_ms: 0 }, timeouts: { attempt_ms: 30 } })
  const kinds = []
  await assert.rejects(
    e.run(
      (a) =>
        new Promise((_, reject) => {
          a.signal.addEventListener('abort', () => {
            kinds.push(a.signal.reason.kind)
            reject(a.signal.reason)
          })
        }),
      { deadlineMs: 5000 },
    ),
    (err) => err instanceof StoppedError && err.reason === 'max_attempts' && err.cause instanceof AttemptTimeoutError,
  )
  assert.deepEqual(kinds, ['first_byte_timeout', 'first_byte_timeout'])
  // Every timer by name (attempt 10 ms of 100 left, body started): a stream
  // silent past its first-token timer showed nothing, a first-byte timeout.
  const { timerError } = require('../native.js')
  assert.deepEqual(
    ['connect', 'first_byte', 'first_token', 'idle', 'total'].map((t) => timerError(t, 10, 100, true)),
    ['connect_timeout', 'first_byte_timeout', 'first_byte_timeout', 'stream_idle_timeout', 'stream_idle_timeout'],
  )
  assert.throws(() => timerError('first_tokens', 10, 100, true), (err) => err instanceof TypeError && /first_token, idle or total/.test(err.message))
})

const { localServer } = require('./helpers.js')

const SSE = { 'content-type': 'text/event-stream' }
const chunk = (text) => `data: {"choices":[{"index":0,"delta":{"content":"${text}"}}]}\n\n`
const DONE = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'

test('wrapFetch: an SSE error event before any output is held, classified (overloaded) and retried; the caller reads one stream', async () => {
  const srv = await localServer((req, res, n) => {
    res.writeHead(200, SSE)
    if (n === 1) return res.end('event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n')
    res.end(chunk('a') + chunk('b') + DONE)
  })
  try {
    const e = new Engine({ backoff: { base_ms: 0, cap_ms: 0 } })
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 5000 })
    const r = await f(srv.url + '/v1/chat/completions', { method: 'POST', body: '{}' })
    assert.equal(await r.text(), chunk('a') + chunk('b') + DONE)
    const decisions = e.events().filter((x) => x.kind === 'decision')
    assert.deepEqual(
      decisions.map((x) => [x.action, x['error.type'] ?? null]),
      [
        ['retry', 'overloaded'],
        ['succeeded', null],
      ],
    )
    assert.equal(e.stats().attempts, 2)
  } finally {
    await srv.close()
  }
})

test('wrapFetch: a malformed SSE event is skipped by default, and ends the stream with a clean StoppedError under malformed_event: error', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(200, SSE)
    res.end(chunk('a') + 'data: {not json\n\n' + chunk('b') + DONE)
  })
  try {
    const skip = wrapFetch(new Engine({}), fetch, { route: 'local', deadlineMs: 5000 })
    let r = await skip(srv.url + '/v1/chat/completions', { method: 'POST', body: '{}' })
    assert.equal(await r.text(), chunk('a') + chunk('b') + DONE)

    const e = new Engine({ streams: { malformed_event: 'error' } })
    const strict = wrapFetch(e, fetch, { route: 'local', deadlineMs: 5000 })
    r = await strict(srv.url + '/v1/chat/completions', { method: 'POST', body: '{}' })
    const reader = r.body.getReader()
    let text = ''
    let err = null
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        text += new TextDecoder().decode(value)
      }
    } catch (x) {
      err = x
    }
    assert.equal(text, chunk('a'))
    assert.ok(err instanceof StoppedError, String(err))
    assert.equal(err.reason, 'stream_visible_output')
    assert.equal(e.stats().attempts, 1)
    assert.deepEqual(e.stats().stops, { stream_visible_output: 1 })
  } finally {
    await srv.close()
  }
})

test('wrapFetch: an SSE error event after output on a route that does not continue: the text before it is delivered, the event never is, and the stream ends with a StoppedError (never replayed, never a truncated success)', async () => {
  const errEvent = 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
  let n = 0
  const srv = await localServer((req, res) => {
    n++
    res.writeHead(200, SSE)
    res.end(chunk('a') + errEvent)
  })
  try {
    const e = new Engine({ backoff: { base_ms: 0, cap_ms: 0 } })
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 5000 })
    const r = await f(srv.url + '/v1/chat/completions', { method: 'POST', body: '{}' })
    const reader = r.body.getReader()
    const first = await reader.read()
    assert.equal(Buffer.from(first.value).toString(), chunk('a'))
    await assert.rejects(reader.read(), (err) => err instanceof StoppedError && err.reason === 'stream_visible_output')
    assert.equal(n, 1)
    assert.deepEqual(e.stats().stops, { stream_visible_output: 1 })
    assert.equal(e.liveCalls, 0)
  } finally {
    await srv.close()
  }
})

test('wrapFetch: a stream that opens and then only pings is ended at its first-token timeout (before output: retried), however often the pings reset the idle timer', async () => {
  const role = 'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
  const timers = []
  const srv = await localServer((req, res, n) => {
    res.writeHead(200, SSE)
    if (n === 1) {
      res.write(role)
      const t = setInterval(() => res.write(': ping\n\n'), 30)
      timers.push(t)
      res.on('close', () => clearInterval(t))
      return
    }
    res.end(chunk('a') + DONE)
  })
  try {
    const e = new Engine({ backoff: { base_ms: 0, cap_ms: 0 }, timeouts: { first_token_ms: 200, idle_ms: 1000 } })
    const f = wrapFetch(e, fetch, { route: 'local', deadlineMs: 5000 })
    const r = await f(srv.url + '/v1/chat/completions', { method: 'POST', body: '{}' })
    assert.equal(await r.text(), chunk('a') + DONE)
    const failures = e.events().filter((x) => x.kind === 'attempt_end' && x.error_kind)
    assert.deepEqual(
      failures.map((x) => [x.error_kind, x.phase]),
      [['first_byte_timeout', 'stream_open']],
    )
    assert.equal(e.stats().attempts, 2)
  } finally {
    for (const t of timers) clearInterval(t)
    await srv.close()
  }
})

test('wrapFetch: an SSE error event after output, on a route that continues, is dropped and the answer continued by the fallback in the same stream', async () => {
  const errEvent = 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
  const srv = await localServer((req, res, n) => {
    res.writeHead(200, SSE)
    if (n > 1) return res.end(chunk('b') + DONE)
    // The text and the error event in one write: the text reaches the caller, the event does not.
    res.end(chunk('a') + errEvent)
  })
  try {
    const e = new Engine({ backoff: { base_ms: 0, cap_ms: 0 }, ...CONTINUE }, { seed: 5 })
    const f = wrapFetch(e, fetch, { route: 'r', deadlineMs: 5000 })
    const body = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] })
    const r = await f(srv.url + '/v1/chat/completions', { method: 'POST', body })
    assert.equal(await r.text(), chunk('a') + chunk('b') + DONE)
    assert.equal(srv.seen.length, 2)
    // The fallback (it declares assistant_prefill) was asked to go on after what was delivered.
    assert.deepEqual(JSON.parse(srv.seen[1].body).messages.at(-1), { role: 'assistant', content: 'a' })
    assert.deepEqual(e.stats().stops, {})
    assert.equal(e.stats().successes, 1)
    assert.equal(e.liveCalls, 0)
  } finally {
    await srv.close()
  }
})
