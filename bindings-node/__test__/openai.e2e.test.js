'use strict'
// End to end with the real `openai` SDK (maxRetries: 0) over wrapFetch against
// the local fault server (tests/fault-server), which counts physical requests.
const test = require('node:test')
const assert = require('node:assert/strict')
const { OpenAI } = require('openai')
const rw = require('..')
const { Engine, wrapFetch, StoppedError } = rw
const { startFaultServer } = require('./helpers.js')

let fs
test.before(async () => {
  fs = await startFaultServer()
})
test.after(async () => {
  if (fs) await fs.stop()
})

const fast = { backoff: { base_ms: 5, cap_ms: 20 } }

function client(engine, spec, fetchOpts) {
  return new OpenAI({
    apiKey: 'test',
    baseURL: fs.url(spec),
    maxRetries: 0,
    fetch: wrapFetch(engine, fetch, { route: 'openai/gpt-4o-mini', ...fetchOpts }),
  })
}

const chat = (c, extra) => c.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], ...extra })

async function total() {
  return (await fs.counts()).total
}

test('ok: one request, propagation headers, the SDK does not retry on its own', async () => {
  await fs.reset()
  const e = new Engine()
  const r = await chat(client(e, 'ok', { deadlineMs: 10_000 }))
  assert.equal(r.object, 'chat.completion')
  const recs = await fs.requests()
  assert.equal(recs.length, 1)
  assert.equal(recs[0].attempt, 1)
  assert.ok(recs[0].deadline_ms > 0 && recs[0].deadline_ms <= 10_000)
  assert.equal(recs[0].x_stainless_retry_count, '0')
  assert.equal(e.stats().successes, 1)
})

test('persistent 503: exactly max_attempts requests', async () => {
  await fs.reset()
  const e = new Engine({ ...fast, max_attempts: 3 })
  await assert.rejects(chat(client(e, 'status:503')), (err) => err instanceof OpenAI.APIError && err.status === 503)
  assert.equal(await total(), 3)
  const recs = await fs.requests()
  assert.deepEqual(recs.map((r) => r.attempt), [1, 2, 3])
  assert.equal(new Set(recs.map((r) => r.logical_id)).size, 1)
  assert.equal(e.stats().stops.max_attempts, 1)
})

test('flaky 503 twice, then ok: recovered on the third attempt', async () => {
  await fs.reset()
  const e = new Engine(fast)
  const r = await chat(client(e, 'flaky:2:503'))
  assert.equal(r.object, 'chat.completion')
  assert.equal(await total(), 3)
  assert.equal(e.stats().retry_successes, 1)
})

for (const [spec, reason, errClass] of [
  ['status:400', 'invalid_request', OpenAI.BadRequestError],
  ['status:401', 'auth_error', OpenAI.AuthenticationError],
  ['status:429:insufficient_quota', 'quota_exhausted', OpenAI.RateLimitError],
]) {
  test(`${spec}: exactly one request (${reason})`, async () => {
    await fs.reset()
    const e = new Engine(fast)
    await assert.rejects(chat(client(e, spec)), (err) => err instanceof errClass)
    assert.equal(await total(), 1)
    assert.equal(e.stats().stops[reason], 1)
  })
}

test('Retry-After: 3600 with a 5 s deadline: one request, returns within 5 s', async () => {
  await fs.reset()
  const e = new Engine()
  const t0 = Date.now()
  await assert.rejects(chat(client(e, 'ra-secs:3600', { deadlineMs: 5000 })), (err) => err instanceof OpenAI.RateLimitError)
  const dt = Date.now() - t0
  assert.ok(dt < 5000, `took ${dt} ms`)
  assert.equal(await total(), 1)
  assert.equal(e.stats().stops.retry_after_exceeds_deadline, 1)
})

test('Retry-After: 1 then ok: waits about a second and succeeds', async () => {
  await fs.reset()
  const e = new Engine()
  const t0 = Date.now()
  const r = await chat(client(e, 'ra-secs:1:then-ok', { deadlineMs: 10_000 }))
  assert.equal(r.object, 'chat.completion')
  assert.ok(Date.now() - t0 >= 950)
  assert.equal(await total(), 2)
})

test('read-then-drop on an unsafe call: one request and a reconcile item', async () => {
  await fs.reset()
  const e = new Engine(fast)
  await assert.rejects(chat(client(e, 'drop', { idempotency: 'unsafe', tenant: 'acme' })), (err) => {
    assert.ok(err instanceof OpenAI.APIConnectionError, String(err))
    assert.ok(err.cause instanceof StoppedError)
    assert.equal(err.cause.action, 'reconcile')
    return true
  })
  assert.equal(await total(), 1)
  const items = e.reconcileList()
  assert.equal(items.length, 1)
  assert.equal(items[0].reason, 'effect_unknown')
  assert.equal(items[0].tenant, 'acme')
})

test('hanging upstream with a 2 s deadline: first byte is half the time left (1 s, 0.5 s, 0.25 s), three attempts, all within 2.2 s', async () => {
  await fs.reset()
  const e = new Engine(fast)
  const t0 = Date.now()
  await assert.rejects(chat(client(e, 'hang', { deadlineMs: 2000 })), (err) => err instanceof OpenAI.APIError)
  const dt = Date.now() - t0
  // The first-byte timer counts from when the request went out (undici says
  // when), not from before the connect: a hang leaves time for another attempt.
  assert.ok(dt <= 2200, `took ${dt} ms`)
  assert.ok(dt >= 1500, `took ${dt} ms`)
  assert.equal(await total(), 3)
  assert.deepEqual(e.stats().stops, { max_attempts: 1 })
})

test('streaming: a complete stream succeeds; a stream cut after visible output is not replayed', async () => {
  await fs.reset()
  const e = new Engine(fast)
  let text = ''
  for await (const ch of await chat(client(e, 'ok'), { stream: true })) text += ch.choices[0]?.delta?.content || ''
  assert.match(text, /c1/)
  assert.equal(await total(), 1)
  await fs.reset()
  const s = await chat(client(e, 'sse-cut:2'), { stream: true })
  let got = ''
  await assert.rejects(
    (async () => {
      for await (const ch of s) got += ch.choices[0]?.delta?.content || ''
    })(),
    (err) => {
      const stop = err instanceof StoppedError ? err : err.cause
      assert.ok(stop instanceof StoppedError, String(err))
      assert.equal(stop.reason, 'stream_visible_output')
      return true
    },
  )
  assert.match(got, /c1/)
  assert.equal(await total(), 1)
})

test('nesting: the SDK inside engine.run is a non-owner; the outer owner retries', async () => {
  await fs.reset()
  const e = new Engine({ ...fast, max_attempts: 2 })
  const c = client(e, 'status:503')
  await assert.rejects(e.run(() => chat(c), { route: 'app', deadlineMs: 8000 }), (err) => err.reason === 'max_attempts')
  assert.equal(await total(), 2)
  const recs = await fs.requests()
  assert.equal(new Set(recs.map((r) => r.logical_id)).size, 1)
})
