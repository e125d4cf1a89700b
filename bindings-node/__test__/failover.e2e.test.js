'use strict'
// One wrapped fetch serving a two-upstream route under the real `openai` SDK
// (maxRetries: 0) against the fault server's model-named faults: the route
// comes from the request's model (the policy's `models` map), every attempt
// goes to the upstream the core chose with its own base URL, model and key
// (the client's own base URL is a closed port: nothing reaches it), and the
// server's log says how many attempts each model got.
const test = require('node:test')
const assert = require('node:assert/strict')
const { OpenAI } = require('openai')
const { Engine, wrapFetch, PolicyError, StoppedError } = require('..')
const { useFaultServer, runReadmeExample } = require('./helpers.js')

const ctx = useFaultServer(test, { RW_TEST_PRIMARY_KEY: 'sk-primary', RW_TEST_BACKUP_KEY: 'sk-backup' })

const ANSWER = (model) => `answer from ${model}: w1 w2 w3 w4 w5 w6`

function policy(primaryModel) {
  const base = `${ctx.fs.base}/v1`
  return {
    max_attempts: 3,
    backoff: { base_ms: 10, cap_ms: 40 },
    timeouts: { connect_ms: 200, first_byte_ms: 300, idle_ms: 300 },
    upstreams: {
      primary: { provider: 'openai', model: primaryModel, base_url: base, api: 'openai', api_key_env: 'RW_TEST_PRIMARY_KEY' },
      backup: { provider: 'openai', model: 'fb-ok', base_url: base, api: 'openai', api_key_env: 'RW_TEST_BACKUP_KEY' },
    },
    routes: { chat: { candidates: ['primary', 'backup'] } },
    models: { 'gpt-4o': 'chat' },
  }
}

/** One chat completion for `model` through a client whose own base URL refuses connections. */
async function run(primaryModel, { model = 'gpt-4o', deadlineMs = 3000, stream = false } = {}) {
  await ctx.fs.reset()
  const engine = new Engine(policy(primaryModel), { seed: 25 })
  // What each attempt was sent with: its URL and its key.
  const sent = []
  const spy = (url, init) => {
    sent.push([String(url), new Headers(init.headers).get('authorization')])
    return fetch(url, init)
  }
  const client = new OpenAI({ apiKey: 'sk-client', baseURL: `http://127.0.0.1:${ctx.closed}/v1`, maxRetries: 0, fetch: wrapFetch(engine, spy, { deadlineMs }) })
  const t0 = performance.now()
  let value = null
  let error = null
  let text = ''
  try {
    value = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], stream })
    if (stream) for await (const ch of value) text += ch.choices[0]?.delta?.content ?? ''
    else text = value.choices[0].message.content
  } catch (err) {
    error = err
  }
  const elapsedMs = performance.now() - t0
  const counts = (await ctx.fs.counts()).by_model
  return { value, error, text, elapsedMs, counts, sent, stats: engine.stats() }
}

test('a persistent 503 on the primary: its attempts per upstream, then the backup answers, named as the model that answered', async () => {
  const r = await run('fb-503')
  assert.equal(r.error, null)
  assert.deepEqual(r.counts, { 'fb-503': 2, 'fb-ok': 1 })
  assert.equal(r.value.model, 'fb-ok')
  assert.equal(r.value.choices[0].message.content, ANSWER('fb-ok'))
  assert.ok(r.value.usage.completion_tokens > 0)
  assert.ok(r.elapsedMs < 3000, `${r.elapsedMs} ms`)
  const url = `${ctx.fs.base}/v1/chat/completions`
  assert.deepEqual(r.sent, [
    [url, 'Bearer sk-primary'],
    [url, 'Bearer sk-primary'],
    [url, 'Bearer sk-backup'],
  ])
})

test('a silent primary is left for the backup at its first-byte timeout, not retried', async () => {
  const r = await run('fb-silent')
  assert.equal(r.error, null)
  assert.deepEqual(r.counts, { 'fb-silent': 1, 'fb-ok': 1 })
  assert.equal(r.value.choices[0].message.content, ANSWER('fb-ok'))
  // connect_ms + first_byte_ms = 500 ms on the silent primary, then the backup at once.
  assert.ok(r.elapsedMs >= 500 && r.elapsedMs < 1500, `${r.elapsedMs} ms`)
})

test('a healthy primary answers itself: one attempt, with its own key', async () => {
  const r = await run('fb-ok:words=3')
  assert.equal(r.error, null)
  assert.deepEqual(r.counts, { 'fb-ok:words=3': 1 })
  assert.equal(r.value.choices[0].message.content, 'answer from fb-ok:words=3: w1 w2 w3')
  assert.deepEqual(r.sent, [[`${ctx.fs.base}/v1/chat/completions`, 'Bearer sk-primary']])
})

test('an unknown request model rejects with a PolicyError naming it, before any request', async () => {
  const r = await run('fb-ok', { model: 'claude-3' })
  // The SDK wraps what its fetch threw (APIConnectionError); the cause is retrywise's.
  const cause = r.error instanceof PolicyError ? r.error : r.error?.cause
  assert.ok(cause instanceof PolicyError, String(r.error))
  assert.match(cause.message, /claude-3/)
  assert.equal(cause.path, 'models.claude-3')
  assert.deepEqual(r.counts, {})
  assert.deepEqual(r.sent, [])
})

// The rest of the matrix through the same wiring: attempts per model, the
// final text or the clean error, the stops the engine counted, an elapsed bound.
for (const [fault, { stream = false, counts, text, error, stops, maxMs }] of Object.entries({
  'fb-content-filter': { counts: { 'fb-content-filter': 1 }, error: (e) => e.status === 400 && /hate/.test(e.message), stops: { invalid_request: 1 }, maxMs: 1000 },
  'fb-context-length': { counts: { 'fb-context-length': 1 }, error: (e) => e.status === 400 && /context length/.test(e.message), stops: { context_length_exceeded: 1 }, maxMs: 1000 },
  'fb-429-retry-after': { counts: { 'fb-429-retry-after': 2 }, text: ANSWER('fb-429-retry-after'), stops: {}, maxMs: 2500 },
  'fb-429': { counts: { 'fb-429': 2 }, text: ANSWER('fb-429'), stops: {}, maxMs: 1000 },
  'fb-500-once': { counts: { 'fb-500-once': 2 }, text: ANSWER('fb-500-once'), stops: {}, maxMs: 1000 },
  'fb-reset': { counts: { 'fb-reset': 2 }, text: ANSWER('fb-reset'), stops: {}, maxMs: 1000 },
  'fb-slow-first-token:ms=2000': { stream: true, counts: { 'fb-slow-first-token:ms=2000': 1, 'fb-ok': 1 }, text: ANSWER('fb-ok'), stops: {}, maxMs: 1500 },
  'fb-malformed-sse': { stream: true, counts: { 'fb-malformed-sse': 1 }, text: ANSWER('fb-malformed-sse'), stops: {}, maxMs: 1000 },
  'fb-no-done': { stream: true, counts: { 'fb-no-done': 1 }, text: ANSWER('fb-no-done'), stops: {}, maxMs: 1000 },
  // stream_recovery: never (the default): a cut or stall after output is a clean typed error, never a truncated success.
  'fb-stream-cut': { stream: true, counts: { 'fb-stream-cut': 1 }, error: (e) => e instanceof StoppedError && e.reason === 'stream_visible_output', stops: { stream_visible_output: 1 }, maxMs: 1000 },
  // A clean end of body after text with no finish_reason and no [DONE] is a cut too.
  'fb-stream-cut:end=close': { stream: true, counts: { 'fb-stream-cut:end=close': 1 }, error: (e) => e instanceof StoppedError && e.reason === 'stream_visible_output', stops: { stream_visible_output: 1 }, maxMs: 1000 },
  'fb-stream-stall': { stream: true, counts: { 'fb-stream-stall': 1 }, error: (e) => e instanceof StoppedError && e.reason === 'stream_visible_output', stops: { stream_visible_output: 1 }, maxMs: 1500 },
})) {
  test(`${fault}${stream ? ' (streamed)' : ''}: ${text ? 'answered' : 'a clean error'}, attempts per model ${JSON.stringify(counts)}`, async () => {
    const r = await run(fault, { stream, deadlineMs: 4000 })
    assert.deepEqual(r.counts, counts)
    if (text !== undefined) {
      assert.equal(r.error, null)
      assert.equal(r.text, text)
    } else {
      assert.ok(r.error && error(r.error), String(r.error))
    }
    assert.deepEqual(r.stats.stops, stops)
    assert.ok(r.elapsedMs < maxMs, `${r.elapsedMs} ms`)
  })
}

test("the README's fallback example runs as written, pointed at the fault server (primary: a persistent 503, backup: fb-ok)", async () => {
  await ctx.fs.reset()
  const out = await runReadmeExample(
    '### Fallback across upstreams',
    [
      ['https://api.openai.com/v1', `${ctx.fs.base}/v1`],
      ['https://api.deepseek.com/v1', `${ctx.fs.base}/v1`],
      ["model: 'gpt-4o', api", "model: 'fb-503', api"],
      ["model: 'deepseek-chat'", "model: 'fb-ok'"],
    ],
    ['openai'],
    { OPENAI_API_KEY: 'sk-a', DEEPSEEK_API_KEY: 'sk-b' },
  )
  assert.equal(out, `fb-ok ${ANSWER('fb-ok')}\n`)
  assert.deepEqual((await ctx.fs.counts()).by_model, { 'fb-503': 2, 'fb-ok': 1 })
})

// stream_recovery: continue — a stream cut (or stalled) after visible text is
// continued by the backup inside the same stream the SDK reads: with an
// assistant prefill where the backup declares it, else (or when the prefill is
// refused) with an instruction quoting what was delivered; the caller reads
// the primary's whole answer once, no gap, no duplicate.
async function runContinue(primaryModel, backupModel, backupCaps) {
  await ctx.fs.reset()
  const base = `${ctx.fs.base}/v1`
  const engine = new Engine(
    {
      max_attempts: 4,
      backoff: { base_ms: 10, cap_ms: 40 },
      timeouts: { connect_ms: 200, first_byte_ms: 300, idle_ms: 300 },
      upstreams: {
        primary: { provider: 'openai', model: primaryModel, base_url: base, api: 'openai', api_key_env: 'RW_TEST_PRIMARY_KEY' },
        backup: { provider: 'openai', model: backupModel, base_url: base, api: 'openai', api_key_env: 'RW_TEST_BACKUP_KEY', capabilities: backupCaps },
      },
      routes: { chat: { candidates: ['primary', 'backup'], stream_recovery: 'continue' } },
      models: { 'gpt-4o': 'chat' },
    },
    { seed: 25 },
  )
  const client = new OpenAI({ apiKey: 'sk-client', baseURL: `http://127.0.0.1:${ctx.closed}/v1`, maxRetries: 0, fetch: wrapFetch(engine, fetch, { deadlineMs: 4000 }) })
  const t0 = performance.now()
  let text = ''
  let error = null
  try {
    const s = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true })
    for await (const ch of s) text += ch.choices[0]?.delta?.content ?? ''
  } catch (err) {
    error = err
  }
  const elapsedMs = performance.now() - t0
  const rows = await ctx.fs.requests()
  return { text, error, elapsedMs, rows, stats: engine.stats() }
}

for (const [primary, backup, caps, via] of [
  ['fb-stream-cut:k=3', 'fb-ok', ['streaming', 'assistant_prefill'], ['prefill']],
  ['fb-stream-cut:k=3', 'fb-ok', ['streaming'], ['instruction']],
  // A clean end of body after text, with no finish_reason and no [DONE]: a cut all the same.
  ['fb-stream-cut:k=3:end=close', 'fb-ok', ['streaming', 'assistant_prefill'], ['prefill']],
  ['fb-stream-stall:k=3', 'fb-ok', ['streaming', 'assistant_prefill'], ['prefill']],
  ['fb-stream-cut:k=3', 'fb-no-prefill', ['streaming', 'assistant_prefill'], ['prefill', 'instruction']],
  // The backup restates the quoted text before going on: the splice drops the repetition.
  ['fb-stream-cut:k=3', 'fb-ok:resend=1', ['streaming'], ['instruction']],
]) {
  test(`stream_recovery continue: ${primary} continued by ${backup} (${via.join(' refused, then ')}): the whole answer once`, async () => {
    const r = await runContinue(primary, backup, caps)
    assert.equal(r.error, null)
    assert.equal(r.text, ANSWER(primary))
    assert.deepEqual(
      r.rows.map((x) => [x.model, x.continuation ? x.continuation.via : null]),
      [[primary, null], ...via.map((v) => [backup, v])],
    )
    assert.deepEqual(r.stats.stops, {})
    assert.ok(r.elapsedMs < 2000, `${r.elapsedMs} ms`)
  })
}

test('engine.run: each attempt says where to send it (attempt.reach): the primary, then the backup after its 503s', async () => {
  await ctx.fs.reset()
  const engine = new Engine(policy('fb-503'), { seed: 25 })
  const seen = []
  const text = await engine.run(
    async (attempt) => {
      const { baseUrl, model, apiKey } = attempt.reach
      seen.push([attempt.upstream, model, apiKey])
      const client = new OpenAI({ apiKey, baseURL: baseUrl, maxRetries: 0 })
      const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] })
      return r.choices[0].message.content
    },
    { route: engine.routeForModel('gpt-4o'), deadlineMs: 3000 },
  )
  assert.equal(text, ANSWER('fb-ok'))
  assert.deepEqual(seen, [
    ['primary', 'fb-503', 'sk-primary'],
    ['primary', 'fb-503', 'sk-primary'],
    ['backup', 'fb-ok', 'sk-backup'],
  ])
  assert.deepEqual((await ctx.fs.counts()).by_model, { 'fb-503': 2, 'fb-ok': 1 })
})

test('a flapping primary (fb-flap, down 1.5 s), a request every 250 ms: each answered (by the backup in the outage), then the primary again soon after it recovers', async () => {
  await ctx.fs.reset()
  const model = 'fb-flap:down=1500'
  const p = policy(model)
  // Four requests a second: a breaker that judges on 4 calls (not 20) opens within the outage.
  p.breaker = { min_calls: 4, window_size: 10 }
  const engine = new Engine(p, { seed: 25 })
  const client = new OpenAI({ apiKey: 'sk-client', baseURL: `http://127.0.0.1:${ctx.closed}/v1`, maxRetries: 0, fetch: wrapFetch(engine, fetch, { deadlineMs: 3000 }) })
  const served = []
  const t0 = performance.now()
  while (performance.now() - t0 < 4000) {
    const r = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] })
    assert.equal(r.choices[0].message.content, ANSWER(r.model))
    served.push(r.model)
    await new Promise((resolve) => setTimeout(resolve, 250))
  }
  const rows = await ctx.fs.requests()
  const upAt = rows[0].at_ms + 1500 // the server's clock: the outage ends here
  const primaryAnswers = rows.filter((x) => x.model === model && x.status === 200)
  assert.ok(
    primaryAnswers.every((x) => x.at_ms >= upAt),
    JSON.stringify(primaryAnswers.map((x) => x.at_ms - upAt)),
  )
  assert.deepEqual(served.slice(0, 2), ['fb-ok', 'fb-ok'])
  assert.equal(served.at(-1), model)
  // Back on the primary within the breaker's second open period (1 s x 1.5,
  // +10 % jitter) and one request interval of recovering.
  assert.ok(primaryAnswers.length > 0 && primaryAnswers[0].at_ms - upAt < 2000, JSON.stringify(rows.map((x) => [x.model, x.status, Math.round(x.at_ms - upAt)])))
  assert.deepEqual(engine.stats().stops, {})
  assert.equal(engine.stats().successes, served.length)
})
