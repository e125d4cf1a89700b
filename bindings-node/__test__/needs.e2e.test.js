'use strict'
// A fallback keeps what the request needs, end to end: the real `openai` and
// `@anthropic-ai/sdk` clients (maxRetries: 0) through one wrapped fetch, the
// fault server's model-named faults behind a route of three upstreams. The
// primary (`fb-503`) always fails; `plain` (`fb-ok:id=plain`) declares
// streaming only and a 1000-token window; `tools` (`fb-ok:id=tools`) declares
// streaming, tools, JSON schema and images. Each request's facts are read
// once by the core, so a tools, schema, image or oversize request never
// reaches `plain` (the server's records say which models got what), and one
// no upstream can serve stops before any request is sent.
const test = require('node:test')
const assert = require('node:assert/strict')
const { OpenAI } = require('openai')
const { Anthropic } = require('@anthropic-ai/sdk')
const { Engine, wrapFetch, PolicyError, StoppedError } = require('..')
const { useFaultServer } = require('./helpers.js')

const ctx = useFaultServer(test, { RW_TEST_NEEDS_KEY: 'sk-needs' })

const PRIMARY = 'fb-503'
const PLAIN = 'fb-ok:id=plain'
const TOOLS = 'fb-ok:id=tools'
const PNG = 'iVBORw0KGgo='
// 6 000 characters: about 1 500 tokens by the core's estimate, past plain's 1 000-token window.
const LONG = 'lorem '.repeat(1000)

/** The route `chat` for one wire family: primary, plain, tools, all on the fault server. */
function policy(api) {
  const up = (model, extra) => ({ provider: `${api}-${model}`, model, base_url: `${ctx.fs.base}/v1`, api, api_key_env: 'RW_TEST_NEEDS_KEY', ...extra })
  return {
    max_attempts: 3,
    backoff: { base_ms: 0, cap_ms: 0 },
    timeouts: { connect_ms: 500, first_byte_ms: 2000, idle_ms: 2000 },
    upstreams: {
      primary: up(PRIMARY, { capabilities: ['streaming', 'tool_calling', 'json_schema', 'vision'] }),
      plain: up(PLAIN, { capabilities: ['streaming'], context_tokens: 1000 }),
      tools: up(TOOLS, { capabilities: ['streaming', 'tool_calling', 'json_schema', 'vision'], context_tokens: 128000 }),
    },
    routes: { chat: { candidates: ['primary', 'plain', 'tools'], attempts_per_upstream: 1 } },
    models: { 'gpt-4o': 'chat', 'claude-x': 'chat' },
  }
}

/** How each SDK asks for each kind of request, and reads the model that answered. */
const FLAVORS = {
  openai: {
    client: (f) => new OpenAI({ apiKey: 'sk-client', baseURL: `http://127.0.0.1:${ctx.closed}/v1`, maxRetries: 0, fetch: f }),
    body: (kind) => {
      const b = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }
      if (kind === 'tools') b.tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }]
      if (kind === 'json_schema') b.response_format = { type: 'json_schema', json_schema: { name: 'w', schema: { type: 'object', properties: {} } } }
      if (kind === 'image') b.messages[0].content = [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG}` } }]
      if (kind === 'oversize') b.messages[0].content = LONG
      if (kind === 'unservable') b.messages[0].content = [{ type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }]
      return b
    },
    /** The model that answered (streamed: the chunks' model) and its text. */
    send: async (client, body, stream, options) => {
      if (!stream) {
        const r = await client.chat.completions.create(body, options)
        return { model: r.model, text: r.choices[0].message.content }
      }
      const s = await client.chat.completions.create({ ...body, stream: true }, options)
      let text = ''
      let model = null
      for await (const ch of s) {
        model = ch.model
        text += ch.choices[0]?.delta?.content ?? ''
      }
      return { model, text }
    },
    unservable: 'audio',
  },
  anthropic: {
    client: (f) => new Anthropic({ apiKey: 'sk-client', baseURL: `http://127.0.0.1:${ctx.closed}`, maxRetries: 0, fetch: f }),
    body: (kind) => {
      const b = { model: 'claude-x', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] }
      if (kind === 'tools') b.tools = [{ name: 'lookup', description: 'Looks up', input_schema: { type: 'object', properties: {} } }]
      if (kind === 'json_schema') b.output_config = { format: { type: 'json_schema', schema: { type: 'object', properties: {} } } }
      if (kind === 'image') b.messages[0].content = [{ type: 'text', text: 'What is this?' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } }]
      if (kind === 'oversize') b.messages[0].content = LONG
      if (kind === 'unservable') b.messages[0].content = [{ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'contract' } }]
      return b
    },
    send: async (client, body, stream, options) => {
      const m = stream ? await client.messages.stream(body, options).finalMessage() : await client.messages.create(body, options)
      return { model: m.model, text: m.content.map((c) => (c.type === 'text' ? c.text : '')).join('') }
    },
    unservable: 'file_input',
  },
}

/**
 * One request of `kind` through `flavor`'s SDK and a wrapped fetch (`opts`
 * and the per-request `options` given): what came back, the models the
 * fault server saw in order, the fallback decisions' exclusions and the stops.
 */
async function run(flavor, kind, { stream = false, opts = {}, options, pol } = {}) {
  await ctx.fs.reset()
  const F = FLAVORS[flavor]
  const engine = new Engine(pol || policy(flavor), { seed: 7 })
  const excluded = []
  engine.onEvent((ev) => {
    if (ev.action === 'fallback' || ev.action === 'stop') excluded.push(ev.excluded || [])
  })
  const sent = []
  const spy = (url, init) => {
    sent.push(String(url))
    return fetch(url, init)
  }
  const client = F.client(wrapFetch(engine, spy, { deadlineMs: 5000, ...opts }))
  let value = null
  let error = null
  try {
    value = await F.send(client, F.body(kind), stream, options)
  } catch (err) {
    error = err
  }
  const models = (await ctx.fs.requests()).map((r) => r.model)
  return { value, error, models, sent, excluded, stats: engine.stats() }
}

/** The answer text of fb-ok models. */
const ANSWER = (model) => `answer from ${model}: w1 w2 w3 w4 w5 w6`

for (const flavor of Object.keys(FLAVORS)) {
  test(`${flavor}: a plain request falls back to the first backup (nothing it needs is missing there)`, async () => {
    const r = await run(flavor, 'plain')
    assert.equal(r.error, null, String(r.error))
    assert.deepEqual(r.models, [PRIMARY, PLAIN])
    assert.equal(r.value.model, PLAIN)
    assert.equal(r.value.text, ANSWER(PLAIN))
  })

  for (const [kind, why, stream] of /** @type {const} */ ([
    ['tools', 'missing_capability:tool_calling', false],
    ['json_schema', 'missing_capability:json_schema', false],
    ['image', 'missing_capability:vision', true],
    ['oversize', 'context_too_small:1000<', false],
  ])) {
    test(`${flavor}: a ${kind} request${stream ? ' (streamed)' : ''} never reaches the backup without it (${why}...) and is answered by the one with it`, async () => {
      const r = await run(flavor, kind, { stream })
      assert.equal(r.error, null, String(r.error))
      assert.deepEqual(r.models, [PRIMARY, TOOLS])
      assert.equal(r.value.model, TOOLS)
      assert.equal(r.value.text, ANSWER(TOOLS))
      // The fallback decision says why plain was skipped.
      assert.equal(r.excluded.length, 1)
      const plain = r.excluded[0].find(([u]) => u === 'plain')
      assert.ok(plain && plain[1].startsWith(why), JSON.stringify(r.excluded))
    })
  }

  test(`${flavor}: caller needs add a capability: wrapFetch's needs (an object, a function of the request) and init.retrywise.needs`, async () => {
    // A plain request would go to plain; the caller says it needs images.
    let r = await run(flavor, 'plain', { opts: { needs: { capabilities: ['vision'] } } })
    assert.equal(r.error, null, String(r.error))
    assert.deepEqual(r.models, [PRIMARY, TOOLS])
    const seen = []
    const needs = (req) => {
      seen.push([req.model, req.facts.family, req.facts.endpoint])
      return { capabilities: ['tool_calling'] }
    }
    r = await run(flavor, 'plain', { opts: { needs } })
    assert.deepEqual(r.models, [PRIMARY, TOOLS])
    assert.deepEqual(seen, [[flavor === 'openai' ? 'gpt-4o' : 'claude-x', flavor, flavor === 'openai' ? 'chat_completions' : 'messages']])
    // Per request, through the SDK's fetchOptions (RequestInit, passed on to the fetch).
    r = await run(flavor, 'plain', { options: { fetchOptions: { retrywise: { needs: { capabilities: ['json_schema'] } } } } })
    assert.equal(r.error, null, String(r.error))
    assert.deepEqual(r.models, [PRIMARY, TOOLS])
    assert.equal(r.value.model, TOOLS)
  })

  test(`${flavor}: a request no candidate can serve stops with no_eligible_upstream naming every skipped one; nothing is sent`, async () => {
    const cap = FLAVORS[flavor].unservable
    const r = await run(flavor, 'unservable')
    const stopped = r.error instanceof StoppedError ? r.error : r.error?.cause
    assert.ok(stopped instanceof StoppedError, String(r.error))
    assert.equal(stopped.reason, 'no_eligible_upstream')
    assert.equal(stopped.detail, `candidates skipped: primary (missing_capability:${cap}), plain (missing_capability:${cap}), tools (missing_capability:${cap})`)
    assert.deepEqual(r.models, [])
    assert.deepEqual(r.sent, [])
  })

  test(`${flavor}: after the primary fails, a request no backup can serve stops there (no_eligible_upstream, the skipped backups named)`, async () => {
    // Only plain behind the primary: a tools request has nowhere to go.
    const pol = policy(flavor)
    pol.routes.chat.candidates = ['primary', 'plain']
    const r = await run(flavor, 'tools', { pol })
    assert.ok(r.error && r.error.status === 503, String(r.error))
    assert.deepEqual(r.models, [PRIMARY])
    assert.deepEqual(r.stats.stops, { no_eligible_upstream: 1 })
    assert.deepEqual(r.excluded, [
      [
        ['primary', 'already_tried'],
        ['plain', 'missing_capability:tool_calling'],
      ],
    ])
  })

  test(`${flavor}: a route the policy does not know rejects with a PolicyError naming the known routes; no request reaches the server`, async () => {
    const r = await run(flavor, 'plain', { opts: { routes: { 'gpt-4o': 'caht', 'claude-x': 'caht' } } })
    const cause = r.error instanceof PolicyError ? r.error : r.error?.cause
    assert.ok(cause instanceof PolicyError, String(r.error))
    assert.equal(cause.path, 'routes.caht')
    assert.match(cause.message, /no route "caht" in `routes`.*known routes: chat/)
    assert.deepEqual(r.models, [])
    assert.deepEqual(r.sent, [])
  })
}

test('a route mixing wire families, or an unknown capability, is a PolicyError at new Engine naming the field', () => {
  const pol = policy('openai')
  pol.upstreams.claude = { api: 'anthropic', model: 'fb-ok', base_url: `${ctx.fs.base}/v1` }
  pol.routes.chat.candidates = ['primary', 'claude']
  assert.throws(
    () => new Engine(pol),
    (e) => e instanceof PolicyError && e.path === 'routes.chat.candidates[1]' && /mixes wire families: "claude" speaks anthropic, "primary" speaks openai/.test(e.message),
  )
  const typo = policy('openai')
  typo.upstreams.plain.capabilities = ['streaming', 'visoin']
  assert.throws(() => new Engine(typo), (e) => e instanceof PolicyError && e.path === 'upstreams.plain.capabilities[1]' && /names no capability/.test(e.message))
})

test('openai: a streamed answer reports its time to first token (the preamble and the silence after it included)', async () => {
  await ctx.fs.reset()
  const engine = new Engine({ upstreams: { slow: { provider: 'openai', model: 'fb-slow-first-token:ms=300', base_url: `${ctx.fs.base}/v1`, api: 'openai', api_key_env: 'RW_TEST_NEEDS_KEY', capabilities: ['streaming'] } }, models: { 'gpt-4o': 'slow' } })
  // The native report's last argument is firstTokenMs (-1: absent).
  const reported = []
  const report = engine._n.report
  engine._n.report = (...args) => {
    reported.push(args[args.length - 1])
    return report.apply(engine._n, args)
  }
  const r = await FLAVORS.openai.send(FLAVORS.openai.client(wrapFetch(engine, fetch)), FLAVORS.openai.body('plain'), true)
  assert.equal(r.text, ANSWER('fb-slow-first-token:ms=300'))
  assert.equal(reported.length, 1)
  assert.ok(reported[0] >= 290 && reported[0] < 3000, String(reported[0]))
  assert.equal(engine.stats().successes, 1)
})
