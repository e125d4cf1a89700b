'use strict'
// wrapFetch under the real `@anthropic-ai/sdk` (its `fetch` option, maxRetries: 0)
// against the fault server's Anthropic messages API (`/v1/messages`), faults
// chosen by the model name: the route comes from the request's model, each
// attempt goes to the upstream the core chose (the catalog's base URL, model
// and key as `x-api-key`; the client's own base URL is a closed port), and the
// server's log says how many attempts each model got.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Anthropic } = require('@anthropic-ai/sdk')
const { Engine, wrapFetch } = require('..')
const { useFaultServer, runReadmeExample } = require('./helpers.js')
const { scoreboard } = require('./scoreboard.js')

const ctx = useFaultServer(test, { RW_TEST_PRIMARY_KEY: 'sk-ant-primary', RW_TEST_BACKUP_KEY: 'sk-ant-backup' })

const ANSWER = (model) => `answer from ${model}: w1 w2 w3 w4 w5 w6`
const DEADLINE_MS = 4000

/** Two upstreams on the fault server's messages API; `claude-x` maps to the route that falls back. */
function policy(primaryModel, backupModel = 'fb-ok') {
  const base = `${ctx.fs.base}/v1`
  return {
    max_attempts: 3,
    backoff: { base_ms: 10, cap_ms: 40 },
    timeouts: { connect_ms: 200, first_byte_ms: 300, first_token_ms: 300, idle_ms: 300 },
    upstreams: {
      primary: { provider: 'anthropic', model: primaryModel, base_url: base, api: 'anthropic', api_key_env: 'RW_TEST_PRIMARY_KEY', capabilities: ['streaming'] },
      backup: { provider: 'anthropic-b', model: backupModel, base_url: base, api: 'anthropic', api_key_env: 'RW_TEST_BACKUP_KEY', capabilities: ['streaming', 'assistant_prefill'] },
    },
    routes: { chat: { candidates: ['primary', 'backup'], stream_recovery: 'continue' } },
    models: { 'claude-x': 'chat' },
  }
}

/**
 * One `messages` call for `claude-x` through a client whose own base URL
 * refuses connections: streamed (`messages.stream`, text and final message) or not.
 */
async function run(primaryModel, { stream = true, backupModel } = {}) {
  await ctx.fs.reset()
  const engine = new Engine(policy(primaryModel, backupModel), { seed: 25 })
  const sent = []
  const spy = (url, init) => {
    const h = new Headers(init.headers)
    sent.push([String(url), h.get('x-api-key'), h.get('authorization')])
    return fetch(url, init)
  }
  const client = new Anthropic({ apiKey: 'sk-ant-client', baseURL: `http://127.0.0.1:${ctx.closed}`, maxRetries: 0, fetch: wrapFetch(engine, spy, { deadlineMs: DEADLINE_MS }) })
  const req = { model: 'claude-x', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] }
  const t0 = performance.now()
  let text = ''
  let final = null
  let error = null
  try {
    if (stream) {
      const s = client.messages.stream(req)
      s.on('text', (t) => {
        text += t
      })
      final = await s.finalMessage()
    } else {
      final = await client.messages.create(req)
      text = final.content.map((b) => (b.type === 'text' ? b.text : '')).join('')
    }
  } catch (err) {
    error = err
  }
  const elapsedMs = performance.now() - t0
  const rows = await ctx.fs.requests()
  return { text, final, error, elapsedMs, rows, sent, stats: engine.stats() }
}

/** The models the fault server saw, in order, with the continuation each carried. */
const seen = (rows) => rows.map((r) => [r.model, r.continuation ? r.continuation.via : null])

test('anthropic: a 529 overloaded error event before any output is held and retried on the primary; the caller reads one stream', async () => {
  // The first attempt's stream opens and then names the overload (k=0: no text first).
  const primary = 'fb-stream-cut:k=0:end=error:n=1'
  const r = await run(primary)
  assert.equal(r.error, null, String(r.error))
  assert.equal(r.text, ANSWER(primary))
  assert.deepEqual(seen(r.rows), [
    [primary, null],
    [primary, null],
  ])
  assert.equal(r.final.model, primary)
  assert.equal(r.final.stop_reason, 'end_turn')
  assert.ok(r.final.usage.output_tokens > 0)
  assert.deepEqual(r.stats.stops, {})
  assert.equal(r.stats.successes, 1)
  assert.ok(r.elapsedMs < 1000, `${r.elapsedMs} ms`)
})

test('anthropic: a persistent 503 on the primary: two attempts there, then the backup answers with its own key, named as the model that answered', async () => {
  const r = await run('fb-503')
  assert.equal(r.error, null, String(r.error))
  assert.equal(r.text, ANSWER('fb-ok'))
  assert.deepEqual(seen(r.rows), [
    ['fb-503', null],
    ['fb-503', null],
    ['fb-ok', null],
  ])
  assert.deepEqual(
    r.rows.map((x) => x.status),
    [503, 503, 200],
  )
  assert.equal(r.final.model, 'fb-ok')
  assert.ok(r.final.usage.output_tokens > 0)
  // Anthropic's key header for each upstream; the caller's key never leaves.
  const url = `${ctx.fs.base}/v1/messages`
  assert.deepEqual(r.sent, [
    [url, 'sk-ant-primary', null],
    [url, 'sk-ant-primary', null],
    [url, 'sk-ant-backup', null],
  ])
  assert.deepEqual(r.stats.stops, {})
  assert.ok(r.elapsedMs < 1500, `${r.elapsedMs} ms`)
})

test('anthropic: a persistent 503, not streamed: the backup answers the JSON message', async () => {
  const r = await run('fb-503', { stream: false })
  assert.equal(r.error, null, String(r.error))
  assert.equal(r.text, ANSWER('fb-ok'))
  assert.equal(r.final.model, 'fb-ok')
  assert.deepEqual(seen(r.rows), [
    ['fb-503', null],
    ['fb-503', null],
    ['fb-ok', null],
  ])
  assert.ok(r.elapsedMs < 1500, `${r.elapsedMs} ms`)
})

// Before any output, the rest of the Python anthropic matrix: a silent primary
// left for the backup at its first-byte timeout (300 ms), not retried; a
// malformed event skipped, the primary's whole answer; a whole answer (its
// stop_reason came) whose stream never says message_stop, completed for the
// SDK, whose MessageStream makes its final message only at that event.
for (const [primary, models, answeredBy, minMs, maxMs] of [
  ['fb-silent', ['fb-silent', 'fb-ok'], 'fb-ok', 300, 1500],
  ['fb-malformed-sse', ['fb-malformed-sse'], 'fb-malformed-sse', 0, 1000],
  ['fb-no-done', ['fb-no-done'], 'fb-no-done', 0, 1000],
]) {
  test(`anthropic: ${primary} is answered by ${answeredBy}, attempts ${JSON.stringify(models)}`, async () => {
    const r = await run(primary)
    assert.equal(r.error, null, String(r.error))
    assert.equal(r.text, ANSWER(answeredBy))
    assert.deepEqual(
      r.rows.map((x) => x.model),
      models,
    )
    assert.equal(r.final.model, answeredBy)
    assert.equal(r.final.stop_reason, 'end_turn')
    assert.deepEqual(r.stats.stops, {})
    assert.ok(r.elapsedMs >= minMs && r.elapsedMs < maxMs, `${r.elapsedMs} ms`)
  })
}

// A stream broken after visible text is continued by the backup inside the
// stream the SDK reads (content-block indexes continue the caller's): the
// primary's whole answer once, no gap, no duplicate.
for (const [primary, backup, via, maxMs] of [
  ['fb-stream-cut:k=3', 'fb-ok', ['prefill'], 1500],
  // An overloaded error event after text: never shown to the SDK, the answer continued.
  ['fb-stream-cut:k=3:end=error', 'fb-ok', ['prefill'], 1500],
  // A clean end of body after text, with no message_stop: a cut all the same.
  ['fb-stream-cut:k=3:end=close', 'fb-ok', ['prefill'], 1500],
  // The stall is noticed at idle_ms (300 ms).
  ['fb-stream-stall:k=3', 'fb-ok', ['prefill'], 2000],
  // The backup refuses the prefill: asked again by instruction, the refusal never shown.
  ['fb-stream-cut:k=3', 'fb-no-prefill', ['prefill', 'instruction'], 1500],
]) {
  test(`anthropic: ${primary} after text is continued by ${backup} (${via.join(' refused, then ')}): the exact answer, spliced`, async () => {
    const r = await run(primary, { backupModel: backup })
    assert.equal(r.error, null, String(r.error))
    assert.equal(r.text, ANSWER(primary))
    assert.deepEqual(seen(r.rows), [[primary, null], ...via.map((v) => [backup, v])])
    assert.equal(r.rows.at(-1).continuation.prefix, 'answer from ' + primary + ': w1 w2')
    // One text block: the continuation's deltas extend the caller's block.
    assert.deepEqual(
      r.final.content.map((b) => [b.type, b.text]),
      [['text', ANSWER(primary)]],
    )
    assert.equal(r.final.stop_reason, 'end_turn')
    assert.deepEqual(r.stats.stops, {})
    assert.ok(r.elapsedMs < maxMs, `${r.elapsedMs} ms`)
  })
}

for (const [fault, stream, pattern, stop] of [
  ['fb-content-filter', true, /content filtering policy \(reason: hate\)/, 'invalid_request'],
  ['fb-content-filter', false, /content filtering policy \(reason: hate\)/, 'invalid_request'],
  ['fb-context-length', false, /prompt is too long/, 'context_length_exceeded'],
]) {
  test(`anthropic: ${fault}${stream ? ' (streamed)' : ''} is a clean error naming the provider's reason, the primary not retried`, async () => {
    const r = await run(fault, { stream })
    assert.ok(r.error instanceof Anthropic.BadRequestError, String(r.error))
    assert.equal(r.error.status, 400)
    assert.match(r.error.message, pattern)
    assert.equal(r.error.error.error.type, 'invalid_request_error')
    assert.equal(r.text, '')
    assert.deepEqual(seen(r.rows), [[fault, null]])
    assert.equal(r.stats.successes, 0)
    assert.deepEqual(r.stats.stops, { [stop]: 1 })
    assert.ok(r.elapsedMs < 1000, `${r.elapsedMs} ms`)
  })
}

test("the README's anthropic example runs as written, pointed at the fault server (a stream cut after text, continued by the backup)", async () => {
  await ctx.fs.reset()
  const out = await runReadmeExample(
    '### Under the anthropic SDK',
    [
      ['https://api.anthropic.com/v1', `${ctx.fs.base}/v1`],
      ["model: 'claude-sonnet-4-5', capabilities", "model: 'fb-stream-cut:k=3', capabilities"],
      ["model: 'claude-haiku-4-5'", "model: 'fb-ok'"],
    ],
    ['@anthropic-ai/sdk'],
    { ANTHROPIC_API_KEY: 'sk-ant' },
  )
  assert.equal(out, ANSWER('fb-stream-cut:k=3'))
  assert.deepEqual(seen(await ctx.fs.requests()), [
    ['fb-stream-cut:k=3', null],
    ['fb-ok', 'prefill'],
  ])
})

// The sixteen faults of the failover methodology through the README's
// multi-provider wiring (scoreboard.js) under the anthropic SDK: each a
// `messages.stream` read to its final message, silence limits short (1 s).
test('scoreboard, @anthropic-ai/sdk over wrapFetch (/v1/messages, streamed): all sixteen faults rescued', async (t) => {
  const { rescued, board } = await scoreboard(ctx, {
    tag: 'anthropic',
    api: 'anthropic',
    requestModel: 'claude-x',
    deadlineMs: 30000,
    timeouts: { first_byte_ms: 1000, first_token_ms: 1000, idle_ms: 1000 },
    withinMs: 3000,
    asker: (engine) => {
      const client = new Anthropic({ apiKey: 'sk-ant-client', baseURL: `http://127.0.0.1:${ctx.closed}`, maxRetries: 0, fetch: wrapFetch(engine, fetch) })
      return async () => {
        const m = await client.messages.stream({ model: 'claude-x', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] }).finalMessage()
        return { text: m.content.map((b) => (b.type === 'text' ? b.text : '')).join(''), usage: m.usage.output_tokens }
      }
    },
  })
  t.diagnostic(board)
  assert.equal(rescued, 16, board)
})
