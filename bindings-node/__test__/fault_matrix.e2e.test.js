'use strict'
// The seed 000 §11 fault matrix end to end: the real `openai` SDK (maxRetries: 0)
// over wrapFetch against the local fault server. Every fault is checked on what
// the fault server recorded: physical attempts (exact where the policy makes them
// exact), arrival times (Retry-After waits measured between attempts), one logical
// request id and one idempotency key on every attempt, the propagated attempt
// numbers and deadlines, no replay after visible stream output, an unsafe call
// never sent twice once it may have executed, the stop reason the engine counted,
// and the whole call within its deadline + 10 %.
const test = require('node:test')
const assert = require('node:assert/strict')
const { OpenAI } = require('openai')
const { Engine, wrapFetch, StoppedError } = require('..')
const { startFaultServer } = require('./helpers.js')

let fs
test.before(async () => {
  fs = await startFaultServer()
})
test.after(async () => {
  if (fs) await fs.stop()
})

const MAX_ATTEMPTS = 3
// Short timeouts and jitter: the matrix tests decisions, not patience. wrapFetch
// waits first_byte_ms for the response headers from when the request went out
// (Node's fetch says when), connect_ms + first_byte_ms with a fetch that does not say.
const POLICY = {
  max_attempts: MAX_ATTEMPTS,
  backoff: { base_ms: 10, cap_ms: 40 },
  timeouts: { connect_ms: 200, first_byte_ms: 300, idle_ms: 300 },
}
const MESSAGES = [{ role: 'user', content: 'hi' }]

function client(engine, baseURL, spec) {
  return new OpenAI({ apiKey: 'test', baseURL, maxRetries: 0, fetch: wrapFetch(engine, fetch, { route: 'openai', ...spec }) })
}

/** One chat completion (streamed and consumed when `stream`) against `spec`. */
async function run(spec, { deadlineMs = 3000, stream = false, policy = POLICY, baseURL, signal, messages = MESSAGES, ...callSpec } = {}) {
  await fs.reset()
  const engine = new Engine(policy, { seed: 11 })
  const c = client(engine, baseURL ?? fs.url(spec), { deadlineMs, ...callSpec })
  const t0 = performance.now()
  let error = null
  let value = null
  let text = ''
  try {
    const r = await c.chat.completions.create({ model: 'm', messages, stream }, { signal })
    if (stream) for await (const ch of r) text += ch.choices[0]?.delta?.content ?? ''
    value = r
  } catch (err) {
    error = err
  }
  const elapsedMs = performance.now() - t0
  const rows = await fs.recordsOf(spec)
  const stats = engine.stats()
  return { rows, elapsedMs, error, value, text, engine, stats, attempts: rows.length, gaps: rows.slice(1).map((r, i) => r.at_ms - rows[i].at_ms) }
}

/** The StoppedError behind an SDK error (wrapFetch puts it in `cause`). */
function stopOf(err) {
  if (err instanceof StoppedError) return err
  if (err && err.cause instanceof StoppedError) return err.cause
  return null
}

/** What holds for every fault that reached the server. */
function checkInvariants(r, { deadlineMs = 3000, key } = {}) {
  assert.ok(r.attempts >= 1 && r.attempts <= MAX_ATTEMPTS, `${r.attempts} attempts`)
  const ids = new Set(r.rows.map((x) => x.logical_id))
  assert.equal(ids.size, 1)
  assert.ok(r.rows[0].logical_id)
  assert.deepEqual(
    r.rows.map((x) => x.attempt),
    r.rows.map((_, i) => i + 1),
  )
  if (key !== undefined)
    assert.deepEqual(
      r.rows.map((x) => x.idempotency_key),
      r.rows.map(() => key),
    )
  const deadlines = r.rows.map((x) => x.deadline_ms)
  assert.ok(deadlines.every((d) => d > 0 && d < deadlineMs), String(deadlines))
  assert.deepEqual(deadlines, [...deadlines].sort((a, b) => b - a))
  assert.ok(r.rows.every((x) => x.x_stainless_retry_count === null || x.x_stainless_retry_count === '0'))
  assert.ok(r.elapsedMs <= deadlineMs * 1.1, `${r.elapsedMs.toFixed(0)} ms for a ${deadlineMs} ms deadline`)
  assert.equal(r.stats.logical_requests, 1)
  assert.equal(r.stats.attempts, r.attempts)
}

const retryWaits = (engine) => engine.events().filter((e) => e.kind === 'decision' && e.action === 'retry')

// ------------------------------------------------------------ before send --

for (const idempotency of ['safe', 'unsafe']) {
  test(`connection refused (${idempotency}): never received, so retried up to max_attempts`, async () => {
    const port = await fs.closedPort()
    const r = await run('refused', { baseURL: `http://127.0.0.1:${port}/v1`, idempotency })
    assert.ok(r.error instanceof OpenAI.APIConnectionError, String(r.error))
    assert.equal(r.stats.attempts, MAX_ATTEMPTS)
    assert.deepEqual(r.stats.stops, { max_attempts: 1 })
    assert.equal((await fs.counts()).total, 0)
    assert.ok(r.elapsedMs <= 3300)
  })
}

// ------------------------------------------------------- sent, no answer --

// Larger than the loopback socket buffers: the client is still writing when a
// write-cut closes the connection.
const BIG = [{ role: 'user', content: 'x'.repeat(8 << 20) }]

test('request write cut, keyed: the upload broke, retried with the same key, exactly max_attempts', async () => {
  const r = await run('write-cut:64', { idempotency: 'keyed', idempotencyKey: 'k-up', messages: BIG })
  assert.ok(r.error instanceof OpenAI.APIConnectionError, String(r.error))
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  const ends = r.engine.events().filter((e) => e.kind === 'attempt_end')
  // undici reports the reset from the write (kind write) or, when the read
  // sees it first, from the read (connection_reset): phase sent either way.
  assert.deepEqual(
    ends.map((e) => [['write', 'connection_reset'].includes(e.error_kind), e.phase]),
    ends.map(() => [true, 'sent']),
  )
  checkInvariants(r, { key: 'k-up' })
})

test('request write cut, unsafe: the upstream may have started on it: sent once, then reconcile', async () => {
  const r = await run('write-cut:64', { idempotency: 'unsafe', messages: BIG })
  assert.equal(r.attempts, 1)
  assert.deepEqual(r.stats.stops, { effect_unknown: 1 })
  assert.equal(stopOf(r.error)?.action, 'reconcile')
  assert.equal(r.engine.reconcileList().length, 1)
  checkInvariants(r)
})

test('read-then-drop, keyed: retried with the same key on every attempt', async () => {
  const r = await run('drop', { idempotency: 'keyed', idempotencyKey: 'order-7' })
  assert.ok(r.error instanceof OpenAI.APIConnectionError)
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r, { key: 'order-7' })
  assert.ok(r.rows.every((x) => x.status === null))
})

for (const spec of ['drop', 'hang', 'status:500']) {
  test(`unsafe call, ${spec}: sent once, then reconcile`, async () => {
    const r = await run(spec, { idempotency: 'unsafe', tenant: 'acme' })
    assert.equal(r.attempts, 1)
    checkInvariants(r)
    assert.deepEqual(r.stats.stops, { effect_unknown: 1 })
    const items = r.engine.reconcileList()
    assert.equal(items.length, 1)
    assert.equal(items[0].tenant, 'acme')
    assert.ok(r.error instanceof OpenAI.APIError, String(r.error))
    // A response (the 500) or none: either way the caller is told to reconcile.
    // After a timeout (hang) openai-node throws APIConnectionTimeoutError with no
    // cause; the reconcile list above is what says it then.
    if (spec !== 'hang') {
      assert.equal(stopOf(r.error)?.action, 'reconcile')
      assert.equal(stopOf(r.error).reason, 'effect_unknown')
    }
    if (spec === 'status:500') assert.equal(stopOf(r.error).response.status, 500)
  })
}

test('accept-then-hang: each attempt ends at the first-byte timeout; exactly max_attempts', async () => {
  const r = await run('hang', { idempotency: 'keyed', idempotencyKey: 'k-hang' })
  assert.ok(r.error instanceof OpenAI.APIConnectionError, String(r.error))
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r, { key: 'k-hang' })
  // first_byte_ms = 300 ms per attempt, from when its request went out, before giving up on the headers.
  assert.ok(r.gaps.every((g) => g >= 300), String(r.gaps))
  assert.ok(r.elapsedMs < 2500)
})

// ---------------------------------------------------------------- streams --

test('stream cut after visible output: not replayed', async () => {
  const r = await run('sse-cut:3', { stream: true, idempotency: 'keyed', idempotencyKey: 'k-cut' })
  assert.equal(stopOf(r.error)?.reason, 'stream_visible_output')
  assert.equal(r.text, 'c1 c2 ')
  assert.equal(r.attempts, 1)
  assert.deepEqual(r.stats.stops, { stream_visible_output: 1 })
  checkInvariants(r, { key: 'k-cut' })
})

test('stream cut before any byte: the stream is retried and spliced, exactly max_attempts', async () => {
  const r = await run('sse-cut:0', { stream: true })
  assert.ok(r.error, 'the last attempt fails too')
  assert.equal(r.text, '')
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r)
})

test('stream cut after its preamble: nothing meaningful was delivered, so retried, exactly max_attempts', async () => {
  const r = await run('sse-cut:1', { stream: true })
  assert.ok(r.error, 'the last attempt fails too')
  assert.equal(r.text, '')
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  const ends = r.engine.events().filter((e) => e.kind === 'attempt_end')
  assert.deepEqual(
    ends.map((e) => e.phase),
    ends.map(() => 'stream_open'),
  )
  assert.equal(ends.length, MAX_ATTEMPTS)
  checkInvariants(r)
})

test('stream cut after its preamble, then whole: the caller reads the retry stream once', async () => {
  const r = await run('seq:sse-cut:1', { stream: true })
  assert.equal(r.error, null)
  assert.equal(r.text, 'c1 c2 c3 ')
  assert.equal(r.attempts, 2)
  assert.deepEqual(r.stats.stops, {})
  assert.equal(r.stats.successes, 1)
  checkInvariants(r)
})

test('slow stream: the idle timeout fires between chunks after output; no replay', async () => {
  const r = await run('slow-sse:1000:2', { stream: true })
  assert.equal(stopOf(r.error)?.reason, 'stream_visible_output')
  assert.equal(r.text, 'c1 ')
  assert.equal(r.attempts, 1)
  assert.deepEqual(r.stats.stops, { stream_visible_output: 1 })
  checkInvariants(r)
  assert.ok(r.elapsedMs >= 300 && r.elapsedMs < 1000, `${r.elapsedMs} ms`)
})

test('slow stream: the idle timeout fires before any output; every attempt retried', async () => {
  const r = await run('slow-sse:1000', { stream: true })
  assert.ok(r.error, 'the last attempt times out too')
  assert.equal(r.text, '')
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r)
  assert.ok(r.elapsedMs >= 900 && r.elapsedMs < 2000, `${r.elapsedMs} ms`)
})

// ------------------------------------------------------------ Retry-After --

for (const [spec, hintMs] of [
  ['ra-secs:1:then-ok', 1000],
  ['ra-ms:300:then-ok', 300],
  ['ra-date:2:then-ok', 1000],
]) {
  test(`429 with ${spec}: the second attempt arrives no earlier than the hint`, async () => {
    const r = await run(spec, { idempotency: 'keyed', idempotencyKey: 'k-ra' })
    assert.equal(r.error, null)
    assert.equal(r.value.object, 'chat.completion')
    assert.equal(r.attempts, 2)
    checkInvariants(r, { key: 'k-ra' })
    const waits = retryWaits(r.engine)
    assert.deepEqual(
      waits.map((w) => w.wait_source),
      ['retry_after'],
    )
    // The wait is the hint plus up to retry_after.jitter_ms (250 by default), so
    // a fleet told the same hint does not come back at once; the second attempt
    // arrives no earlier than the wait decided.
    assert.ok(r.gaps[0] >= waits[0].delay_ms && r.gaps[0] < 3000, `${r.gaps} vs ${waits[0].delay_ms}`)
    // The HTTP-date has one-second resolution: a 2 s date is 1-2 s away.
    if (!spec.startsWith('ra-date')) assert.ok(waits[0].delay_ms >= hintMs && waits[0].delay_ms <= hintMs + 250, String(waits[0].delay_ms))
    else assert.ok(waits[0].delay_ms >= hintMs && waits[0].delay_ms <= 2000 + 250, String(waits[0].delay_ms))
  })
}

test('429 without a hint: jittered backoff, exactly max_attempts', async () => {
  const r = await run('status:429')
  assert.ok(r.error instanceof OpenAI.RateLimitError)
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r)
  const waits = retryWaits(r.engine)
  assert.deepEqual(
    waits.map((w) => w.wait_source),
    ['jitter', 'jitter'],
  )
  assert.ok(waits.every((w) => w.delay_ms <= 40))
})

test('503 with a 1 s hint: every wait honours it, exactly max_attempts', async () => {
  const r = await run('ra-secs:1:503', { idempotency: 'keyed', idempotencyKey: 'k-503' })
  assert.ok(r.error instanceof OpenAI.InternalServerError)
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r, { key: 'k-503' })
  assert.ok(r.gaps.every((g) => g >= 1000 && g < 3000), String(r.gaps))
})

// --------------------------------------------------------- server answers --

test('persistent 500: exactly max_attempts', async () => {
  const r = await run('status:500', { idempotency: 'keyed', idempotencyKey: 'k-500' })
  assert.ok(r.error instanceof OpenAI.InternalServerError)
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  checkInvariants(r, { key: 'k-500' })
})

test('malformed JSON: no success; malformed_response, retried to max_attempts; the parse error reaches the caller', async () => {
  const r = await run('malformed')
  assert.ok(r.error instanceof SyntaxError, String(r.error))
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.equal(r.stats.successes, 0)
  assert.deepEqual(r.stats.stops, { max_attempts: 1 })
  const ends = r.engine.events().filter((e) => e.kind === 'attempt_end')
  assert.deepEqual(
    ends.map((e) => e.error_kind),
    ends.map(() => 'malformed_response'),
  )
  assert.equal(ends.length, MAX_ATTEMPTS)
  checkInvariants(r)
})

test('malformed JSON, then whole: two requests, one success', async () => {
  const r = await run('seq:malformed')
  assert.equal(r.error, null)
  assert.ok(r.value.choices[0].message.content)
  assert.equal(r.attempts, 2)
  assert.equal(r.stats.successes, 1)
  assert.deepEqual(r.stats.stops, {})
  checkInvariants(r)
})

test('malformed JSON on an unsafe call: executed, result unread: sent once, then reconcile', async () => {
  const r = await run('malformed', { idempotency: 'unsafe', tenant: 'acme' })
  assert.equal(stopOf(r.error)?.action, 'reconcile', String(r.error))
  assert.equal(r.attempts, 1)
  assert.deepEqual(r.stats.stops, { effect_unknown: 1 })
  assert.equal(r.engine.reconcileList().length, 1)
  checkInvariants(r)
})

test('malformed JSON under an app-level engine.run: malformed_response, 3 owner attempts = 3 requests', async () => {
  await fs.reset()
  const engine = new Engine(POLICY, { seed: 11 })
  const c = client(engine, fs.url('malformed'), {})
  const t0 = performance.now()
  await assert.rejects(
    engine.run(() => c.chat.completions.create({ model: 'm', messages: MESSAGES }), { route: 'app', deadlineMs: 3000 }),
    (err) => err instanceof StoppedError && err.reason === 'max_attempts' && err.cause instanceof SyntaxError,
  )
  const rows = await fs.recordsOf('malformed')
  assert.deepEqual(
    rows.map((x) => x.attempt),
    [1, 2, 3],
  )
  assert.equal(new Set(rows.map((x) => x.logical_id)).size, 1)
  assert.ok(performance.now() - t0 <= 3300)
})

// --------------------------------------------------------- queue timeout --

test('work that waited out its deadline in a queue is dropped at the door: no upstream request', async () => {
  // Taken off a queue with 50 ms of its deadline left (below min_attempt, 300 ms).
  const r = await run('ok', { inboundHeaders: { 'retrywise-deadline-ms': '50' } })
  assert.ok(r.error instanceof OpenAI.APIConnectionError, String(r.error))
  assert.equal(stopOf(r.error)?.reason, 'deadline_exceeded')
  assert.equal(r.attempts, 0)
  assert.ok(r.elapsedMs < 200, `${r.elapsedMs} ms`)
  assert.deepEqual(r.stats.stops, { deadline_exceeded: 1 })
})

// ---------------------------------------------------------- cancellation --

test('caller cancellation: the attempt is reported cancelled, nothing is retried', async () => {
  const ac = new AbortController()
  setTimeout(() => ac.abort(), 200)
  const r = await run('delay:2000', { signal: ac.signal })
  assert.ok(r.error instanceof OpenAI.APIUserAbortError, String(r.error))
  assert.ok(r.elapsedMs < 600, `${r.elapsedMs} ms`)
  assert.equal(r.attempts, 1)
  assert.equal(r.stats.attempts, 1)
  assert.deepEqual(r.stats.stops, { cancelled: 1 })
  assert.equal(r.stats.successes, 0)
})

// --------------------------------------------------------------- combined --

test('429 (1 s hint), then a hang, then a stream cut: three attempts under one 4 s deadline', async () => {
  const spec = 'seq:ra-secs:1,hang,sse-cut:2'
  const r = await run(spec, { deadlineMs: 4000, stream: true, idempotency: 'keyed', idempotencyKey: 'k-seq' })
  assert.equal(stopOf(r.error)?.reason, 'stream_visible_output')
  assert.equal(r.text, 'c1 ')
  assert.deepEqual(
    r.rows.map((x) => x.status),
    [429, null, 200],
  )
  assert.equal(r.attempts, MAX_ATTEMPTS)
  assert.deepEqual(r.stats.stops, { stream_visible_output: 1 })
  checkInvariants(r, { deadlineMs: 4000, key: 'k-seq' })
  assert.ok(r.gaps[0] >= 1000 && r.gaps[0] < 4000 && r.gaps[1] >= 300, String(r.gaps))
})
