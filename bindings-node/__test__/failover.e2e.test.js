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
const { Engine, wrapFetch, PolicyError, StoppedError, AttemptTimeoutError } = require('..')
const { useFaultServer, runReadmeExample, localServer } = require('./helpers.js')
const { scoreboard } = require('./scoreboard.js')

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
  // first_byte_ms = 300 ms on the silent primary from when its request went out, then the backup at once.
  assert.ok(r.elapsedMs >= 300 && r.elapsedMs < 1500, `${r.elapsedMs} ms`)
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

// ------------------------------------------------------------ scoreboard --
// The sixteen faults of the failover methodology through the README's
// multi-provider wiring (scoreboard.js): under the openai SDK over wrapFetch
// (JSON and streamed), and through engine.run with the SDK pointed where each
// attempt's reach says and timed as its timeouts say, with the default
// silence rule (half the time left) and with a caller's per-attempt limit as
// long as the deadline, which must still leave the fallback its time.

// Short silence limits where a path is not about them.
const SHORT = { first_byte_ms: 1000, first_token_ms: 1000, idle_ms: 1000 }
const HI = [{ role: 'user', content: 'hi' }]

/** The README's client: maxRetries 0, one wrapped fetch; its own base URL refuses connections. */
function readmeClient(engine) {
  return new OpenAI({ apiKey: 'sk-client', baseURL: `http://127.0.0.1:${ctx.closed}/v1`, maxRetries: 0, fetch: wrapFetch(engine, fetch) })
}

/**
 * One engine.run attempt as a caller writes it: the openai SDK (its own
 * retries off) pointed where `attempt.reach` says, with the attempt's
 * propagation headers, its signal and its timeouts (first byte from sending,
 * first token, idle between deltas); the streamed answer is read whole
 * before fn returns, so nothing was shown when an attempt fails.
 * @param {import('..').Attempt} attempt
 */
async function askWhereReachSays(attempt) {
  const { baseUrl, model, apiKey } = attempt.reach
  const t = attempt.timeouts
  const client = new OpenAI({ apiKey, baseURL: baseUrl, maxRetries: 0, timeout: t.totalMs, logLevel: 'off', defaultHeaders: attempt.headers })
  const ac = new AbortController()
  const signal = /** @type {AbortSignal} */ (attempt.signal)
  const onAbort = () => ac.abort(signal.reason)
  signal.addEventListener('abort', onAbort, { once: true })
  let expired = null
  let timer = null
  const expire = (kind, ms) => {
    clearTimeout(timer)
    timer = setTimeout(
      () => {
        expired = new AttemptTimeoutError(kind, ms)
        ac.abort(expired)
      },
      Math.max(0, ms),
    )
  }
  const sentAt = performance.now()
  expire('first_byte_timeout', t.firstByteMs)
  try {
    const s = await client.chat.completions.create({ model, messages: HI, stream: true, stream_options: { include_usage: true } }, { signal: ac.signal })
    // A stream that opens and shows nothing is as silent as one that never answers.
    expire('first_byte_timeout', t.firstTokenMs - (performance.now() - sentAt))
    let text = ''
    let usage = null
    for await (const ch of s) {
      const delta = ch.choices[0]?.delta?.content
      if (delta) {
        text += delta
        expire('stream_idle_timeout', t.idleMs)
      }
      if (ch.usage) usage = ch.usage.completion_tokens
    }
    // The SDK ends a stream it was told to abort as if it had ended: not an answer.
    if (ac.signal.aborted) throw ac.signal.reason
    return { text, usage }
  } catch (err) {
    throw expired ?? err
  } finally {
    clearTimeout(timer)
    signal.removeEventListener('abort', onAbort)
  }
}

const RUN_DEADLINE_MS = 3000

const PATHS = [
  {
    tag: 'json',
    title: 'openai SDK over wrapFetch, JSON',
    deadlineMs: 30000,
    timeouts: SHORT,
    withinMs: 3000,
    asker: (engine) => {
      const client = readmeClient(engine)
      return async () => {
        const r = await client.chat.completions.create({ model: 'gpt-4o', messages: HI })
        return { text: r.choices[0].message.content, usage: r.usage?.completion_tokens ?? null }
      }
    },
  },
  {
    tag: 'stream',
    title: 'openai SDK over wrapFetch, streamed',
    deadlineMs: 30000,
    timeouts: SHORT,
    withinMs: 3000,
    asker: (engine) => {
      const client = readmeClient(engine)
      return async () => {
        const s = await client.chat.completions.create({ model: 'gpt-4o', messages: HI, stream: true, stream_options: { include_usage: true } })
        let text = ''
        let usage = null
        for await (const ch of s) {
          text += ch.choices[0]?.delta?.content ?? ''
          if (ch.usage) usage = ch.usage.completion_tokens
        }
        return { text, usage }
      }
    },
  },
  {
    tag: 'run',
    title: 'engine.run, the SDK per attempt, the default silence rule (half the time left)',
    deadlineMs: RUN_DEADLINE_MS,
    timeouts: { idle_ms: 1000 },
    withinMs: RUN_DEADLINE_MS,
    asker: (engine) => () => engine.run(askWhereReachSays, { route: engine.routeForModel('gpt-4o') }),
  },
  {
    tag: 'run-limit',
    title: "engine.run, the SDK per attempt, a caller's per-attempt limit as long as the deadline",
    deadlineMs: RUN_DEADLINE_MS,
    timeouts: { first_byte_ms: RUN_DEADLINE_MS, first_token_ms: RUN_DEADLINE_MS, idle_ms: 1000 },
    withinMs: RUN_DEADLINE_MS,
    asker: (engine) => () => engine.run(askWhereReachSays, { route: engine.routeForModel('gpt-4o') }),
  },
]

for (const path of PATHS) {
  test(`scoreboard, ${path.title}: all sixteen faults rescued`, async (t) => {
    const { rescued, board } = await scoreboard(ctx, { ...path, api: 'openai', requestModel: 'gpt-4o' })
    t.diagnostic(board)
    assert.equal(rescued, 16, board)
  })
}

// ------------------------------------------------- learned first-token limit --
// The README's wiring with no silence timeouts (deadline 30 s: a cold
// upstream gets half the time left, 15 s, for its first byte and its first
// token). The primary's first 20 streamed answers come at once and teach the
// engine (timeouts.learn: quantile 0.99 x 3, floor 1 s, 20 samples); then it
// goes silent for 20 s, and is left for the backup after about the 1 s floor,
// not after 15 s; engine.stats().first_token shows what was learned.

const WARM = 20

/** The README's wiring (complete capability lists, context windows, continue) with `primary` reached at `primaryBase`. */
function learningEngine(primaryModel, primaryBase, backup) {
  return new Engine(
    {
      deadline_ms: 30000,
      upstreams: {
        primary: { provider: 'openai', model: primaryModel, api: 'openai', base_url: primaryBase, api_key_env: 'RW_TEST_PRIMARY_KEY', context_tokens: 128000, capabilities: ['streaming', 'tool_calling', 'json_schema', 'json_mode', 'vision', 'file_input'] },
        backup: { provider: 'deepseek', model: backup, api: 'openai', base_url: `${ctx.fs.base}/v1`, api_key_env: 'RW_TEST_BACKUP_KEY', context_tokens: 64000, capabilities: ['streaming', 'tool_calling', 'json_mode', 'assistant_prefill'] },
      },
      models: { 'gpt-4o': 'chat' },
      routes: { chat: { candidates: ['primary', 'backup'], stream_recovery: 'continue' } },
    },
    { seed: 20 },
  )
}

/**
 * Streams WARM answers from the primary through the README's client, checks
 * what the engine learned, then makes one more request: its text, how long it
 * took, and how the primary's attempts that failed ended (kind, phase, ms).
 */
async function learnThenAsk(engine, primaryModel) {
  const silences = []
  engine.onEvent((ev) => {
    if (ev.kind === 'attempt_end' && ev.error_kind !== undefined) silences.push([ev.upstream, ev.error_kind, ev.phase, ev.delay_ms])
  })
  const client = readmeClient(engine)
  const ask = async () => {
    const t0 = performance.now()
    let text = ''
    for await (const ch of await client.chat.completions.create({ model: 'gpt-4o', messages: HI, stream: true })) text += ch.choices[0]?.delta?.content ?? ''
    return { text, ms: performance.now() - t0 }
  }
  assert.deepEqual(engine.stats().first_token, {}, 'cold: nothing learned yet')
  for (let i = 0; i < WARM; i++) assert.equal((await ask()).text, ANSWER(primaryModel))
  const learned = engine.stats().first_token.primary
  assert.equal(learned.samples, WARM)
  assert.ok(learned.quantile_ms !== null && learned.quantile_ms * 3 < 1000, JSON.stringify(learned))
  assert.equal(learned.limit_ms, 1000, JSON.stringify(learned))
  const last = await ask()
  const stats = engine.stats()
  assert.deepEqual(stats.first_token.primary, learned, 'a timeout teaches nothing')
  assert.equal(stats.successes, WARM + 1)
  assert.equal(stats.fallbacks, 1)
  assert.deepEqual(stats.stops, {})
  return { ...last, silences }
}

test('learned first-token limit: after 20 fast streamed answers, a primary whose first token comes after 20 s is left for the backup after about the 1 s floor, not half the deadline; engine.stats() shows it', async () => {
  await ctx.fs.reset()
  // The fault server's upstream that was fast for a while: its first 20 requests answered at once.
  const primary = `fb-slow-first-token:after=${WARM}:ms=20000:id=learn`
  const backup = 'fb-ok:id=learn'
  const r = await learnThenAsk(learningEngine(primary, `${ctx.fs.base}/v1`, backup), primary)
  assert.equal(r.text, ANSWER(backup))
  assert.ok(r.ms >= 950 && r.ms < 3000, `left after ${Math.round(r.ms)} ms`)
  // The preamble came at once; no token within the learned limit.
  assert.equal(r.silences.length, 1)
  const [up, kind, phase, ms] = r.silences[0]
  assert.deepEqual([up, kind, phase], ['primary', 'first_byte_timeout', 'stream_open'])
  assert.ok(ms >= 950 && ms < 2000, `${ms} ms`)
  assert.deepEqual((await ctx.fs.counts()).by_model, { [primary]: WARM + 1, [backup]: 1 })
})

test("learned first-byte limit: after 20 fast streamed answers, a primary that sends no headers at all is left after about the 1 s floor, not connect_ms (5 s) + it: wrapFetch's first byte counts from the request's going out", async () => {
  await ctx.fs.reset()
  // A local upstream fast for its first 20 requests, then silent (requests read, never answered).
  const primaryModel = 'local-primary'
  const primary = await localServer((req, res, n) => {
    if (n > WARM) return
    const chunk = (delta, finish = null) => `data: ${JSON.stringify({ id: 'chatcmpl-local', object: 'chat.completion.chunk', created: 1700000000, model: primaryModel, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(chunk({ role: 'assistant', content: '' }))
    for (const d of ANSWER(primaryModel).split(/(?= )/)) res.write(chunk({ content: d }))
    res.end(chunk({}, 'stop') + 'data: [DONE]\n\n')
  })
  try {
    const backup = 'fb-ok:id=learn-silent'
    const r = await learnThenAsk(learningEngine(primaryModel, `${primary.url}/v1`, backup), primaryModel)
    assert.equal(r.text, ANSWER(backup))
    assert.ok(r.ms >= 950 && r.ms < 3000, `left after ${Math.round(r.ms)} ms`)
    assert.equal(r.silences.length, 1)
    const [up, kind, phase, ms] = r.silences[0]
    assert.deepEqual([up, kind, phase], ['primary', 'first_byte_timeout', 'sent'])
    assert.ok(ms >= 950 && ms < 2000, `${ms} ms`)
    assert.equal(primary.seen.length, WARM + 1)
  } finally {
    await primary.close()
  }
})
