'use strict'
// readRequest (the core's RequestFacts, read once in Rust) on the three wire
// families; begin({ request, needs }) laying the caller's needs over the
// request's; a route the policy does not know refused by begin, run and a
// wrapped fetch before any I/O; firstTokenMs reported with a success (by hand,
// and by a wrapped fetch for a streamed answer).
const test = require('node:test')
const assert = require('node:assert/strict')
const { Engine, wrapFetch, readRequest, RequestFacts, PolicyError, StoppedError } = require('..')
const { localServer } = require('./helpers.js')

const CHAT = 'https://api.openai.com/v1/chat/completions'
const RESPONSES = 'https://api.openai.com/v1/responses'
const MESSAGES = 'https://api.anthropic.com/v1/messages'
const PNG = 'data:image/png;base64,iVBORw0KGgo='

test('readRequest: OpenAI chat completions (stream, tools, json_schema, an image part, max_tokens)', () => {
  const body = {
    model: 'gpt-4o',
    stream: true,
    max_tokens: 300,
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }],
    response_format: { type: 'json_schema', json_schema: { name: 'w', schema: { type: 'object' } } },
    messages: [{ role: 'user', content: [{ type: 'text', text: 'What city is this?' }, { type: 'image_url', image_url: { url: PNG } }] }],
  }
  const f = readRequest(CHAT, { 'content-type': 'application/json' }, JSON.stringify(body))
  assert.ok(f instanceof RequestFacts)
  assert.equal(f.family, 'openai')
  assert.equal(f.endpoint, 'chat_completions')
  assert.equal(f.model, 'gpt-4o')
  const n = f.needs
  assert.deepEqual(n.capabilities, ['streaming', 'tool_calling', 'json_schema', 'vision'])
  assert.equal(n.api, 'openai')
  assert.equal(n.maxOutputTokens, 300)
  assert.ok(Number.isInteger(n.inputTokens) && n.inputTokens > 0, String(n.inputTokens))
  // Absent fields are left out, so the needs can go to begin as they are.
  assert.equal('dataBoundary' in n, false)
  assert.equal('maxCost' in n, false)
  assert.deepEqual(JSON.parse(JSON.stringify(f)), { family: 'openai', endpoint: 'chat_completions', model: 'gpt-4o', needs: n })
  // A plain request needs only its family; 'user' (4) + 'Say hi' (6) = 10 characters -> 2 tokens.
  const plain = readRequest(CHAT, null, JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Say hi' }] }))
  assert.deepEqual(plain.needs, { capabilities: [], api: 'openai', inputTokens: 2 })
})

test('readRequest: OpenAI Responses (input_image, input_file, text.format, max_output_tokens)', () => {
  const body = {
    model: 'o3',
    stream: true,
    max_output_tokens: 1000,
    tools: [{ type: 'web_search' }],
    text: { format: { type: 'json_schema', name: 'x', schema: {} } },
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Describe' }, { type: 'input_image', image_url: 'https://example.com/a.png' }, { type: 'input_file', file_id: 'file-2' }] }],
  }
  const f = readRequest(new URL(RESPONSES), new Headers({ authorization: 'Bearer k' }), new TextEncoder().encode(JSON.stringify(body)))
  assert.equal(f.family, 'openai')
  assert.equal(f.endpoint, 'responses')
  assert.equal(f.model, 'o3')
  assert.deepEqual(f.needs.capabilities, ['streaming', 'tool_calling', 'json_schema', 'vision', 'file_input'])
  assert.equal(f.needs.maxOutputTokens, 1000)
  // json_object is JSON mode, not a schema; audio parts and modalities need audio.
  const audio = readRequest(CHAT, [], { model: 'gpt-4o-audio', modalities: ['text', 'audio'], response_format: { type: 'json_object' }, messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }] }] })
  assert.deepEqual(audio.needs.capabilities, ['json_mode', 'audio'])
})

test('readRequest: Anthropic messages, by path or by its headers; Azure by its URL', () => {
  const body = {
    model: 'claude-sonnet',
    max_tokens: 1024,
    stream: true,
    system: 'You are terse.',
    tools: [{ name: 'lookup', input_schema: { type: 'object' } }],
    messages: [
      {
        role: 'user',
        content: [
          { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } },
          { type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'contract text' } },
        ],
      },
    ],
  }
  const f = readRequest(MESSAGES, { 'anthropic-version': '2023-06-01' }, Buffer.from(JSON.stringify(body)))
  assert.equal(f.family, 'anthropic')
  assert.equal(f.endpoint, 'messages')
  assert.equal(f.model, 'claude-sonnet')
  assert.deepEqual(f.needs.capabilities, ['streaming', 'tool_calling', 'vision', 'file_input'])
  assert.equal(f.needs.api, 'anthropic')
  assert.equal(f.needs.maxOutputTokens, 1024)
  // Another path, but the Anthropic SDK's headers (any container; only names count).
  const local = 'http://127.0.0.1:8080/v1/chat/completions'
  const json = '{"model":"m","messages":[]}'
  for (const h of [{ 'anthropic-version': '2023-06-01' }, [['X-Api-Key', 'k']], new Map([['anthropic-version', 'x']]), new Headers({ 'x-api-key': 'k' })]) {
    assert.equal(readRequest(local, h, json).family, 'anthropic', String(h))
  }
  assert.equal(readRequest(local, { authorization: 'Bearer k' }, json).family, 'openai')
  const azure = readRequest('https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21', null, '{"messages":[{"role":"user","content":"abcdefghijkl"}]}')
  assert.equal(azure.family, 'azure_openai')
  assert.equal(azure.model, null)
  assert.deepEqual(azure.needs, { capabilities: [], api: 'azure_openai', inputTokens: 4 })
})

test('readRequest: a body that is not a JSON object, or none, gives only the family; arguments are checked', () => {
  for (const body of ['not json', '', null, undefined, new ArrayBuffer(0), '[1,2]']) {
    const f = readRequest(CHAT, undefined, body)
    assert.equal(f.model, null)
    assert.deepEqual(f.needs, { capabilities: [], api: 'openai' })
  }
  assert.equal(readRequest('https://api.openai.com/v1/models').endpoint, null)
  assert.throws(() => readRequest(42), (e) => e instanceof TypeError && /url must be a string or a URL/.test(e.message))
  assert.throws(() => readRequest(CHAT, 'x-api-key'), (e) => e instanceof TypeError && /headers/.test(e.message))
  assert.throws(() => readRequest(CHAT, null, 7), (e) => e instanceof TypeError && /body/.test(e.message))
  assert.throws(() => new RequestFacts({}), TypeError)
})

/** Three candidates: `mini` (streaming only, a 1000-token window), `gpt` (tools, schema, images), `compat` (capabilities unknown). */
const POLICY = {
  max_attempts: 3,
  backoff: { base_ms: 0, cap_ms: 0 },
  upstreams: {
    mini: { api: 'openai', capabilities: ['streaming'], context_tokens: 1000 },
    gpt: { api: 'openai', capabilities: ['streaming', 'tool_calling', 'json_schema', 'vision'], context_tokens: 128000 },
    compat: { api: 'openai' },
    claude: { api: 'anthropic', capabilities: ['streaming', 'tool_calling'] },
  },
  routes: { chat: { candidates: ['mini', 'gpt', 'compat'], attempts_per_upstream: 1 }, claude: { candidates: ['claude'] } },
}

const chatBody = (extra) => JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...extra })

test('begin({ request }): the call begins with what its request needs; spec.needs goes on top', () => {
  const e = new Engine(POLICY)
  const first = (spec) => {
    const c = e.begin(spec)
    const a = c.nextAttempt()
    return [c, a]
  }
  // A plain stream starts on mini.
  assert.equal(first({ route: 'chat', request: readRequest(CHAT, null, chatBody({ stream: true })) })[1].upstream, 'mini')
  // Tools never reach mini; a 503 on gpt falls back to compat (unknown capabilities are no refusal).
  const [c, a] = first({ route: 'chat', request: readRequest(CHAT, null, chatBody({ tools: [{ type: 'function', function: { name: 'f' } }] })) })
  assert.equal(a.upstream, 'gpt')
  const d = c.report({ status: 503 })
  assert.equal(d.action, 'fallback')
  assert.equal(d.upstream, 'compat')
  assert.deepEqual(d.excluded, [
    ['mini', 'missing_capability:tool_calling'],
    ['gpt', 'already_tried'],
  ])
  // A caller's need is added to the request's (capabilities of both).
  assert.equal(first({ route: 'chat', request: readRequest(CHAT, null, chatBody({ stream: true })), needs: { capabilities: ['vision'] } })[1].upstream, 'gpt')
  // A caller's input estimate replaces the request's.
  assert.equal(first({ route: 'chat', request: readRequest(CHAT, null, chatBody()), needs: { inputTokens: 5000 } })[1].upstream, 'gpt')
  // An Anthropic body has no candidate on the all-OpenAI route: the stop names every skipped one.
  const [, , err] = (() => {
    const call = e.begin({ route: 'chat', request: readRequest(MESSAGES, null, '{"model":"claude","max_tokens":10,"messages":[]}') })
    try {
      call.nextAttempt()
    } catch (x) {
      return [call, null, x]
    }
    return [call, null, null]
  })()
  assert.ok(err instanceof StoppedError)
  assert.equal(err.reason, 'no_eligible_upstream')
  assert.equal(err.detail, 'candidates skipped: mini (api_family:openai!=anthropic), gpt (api_family:openai!=anthropic), compat (api_family:openai!=anthropic)')
  // Needs alone still work (the request is optional), and api in the binding's spelling.
  assert.equal(first({ route: 'claude', needs: { api: 'anthropic', capabilities: ['tool_calling'] } })[1].upstream, 'claude')
  assert.throws(() => e.begin({ route: 'chat', request: { family: 'openai', needs: {} } }), (x) => x instanceof TypeError && /spec\.request must be what readRequest\(\) returned/.test(x.message))
  assert.throws(() => e.begin({ route: 'chat', needs: 'vision' }), (x) => x instanceof TypeError && /spec\.needs must be an object/.test(x.message))
  assert.throws(() => e.begin({ route: 'chat', needs: { api: 'gemini' } }), (x) => x instanceof TypeError && /spec\.needs\.api/.test(x.message))
})

test('a route the policy does not know: begin throws a PolicyError naming the known routes; run rejects; an upstream named alone is fine', async () => {
  const e = new Engine(POLICY)
  assert.throws(
    () => e.begin({ route: 'caht' }),
    (x) => x instanceof PolicyError && x.path === 'routes.caht' && x.message.includes('no route "caht" in `routes`') && x.message.includes('known routes: chat, claude'),
  )
  // The same through the slower entry points (a tenant, a request).
  assert.throws(() => e.begin({ route: 'caht', tenant: 't', request: readRequest(CHAT, null, chatBody()) }), PolicyError)
  let ran = false
  await assert.rejects(
    e.run(
      async () => {
        ran = true
      },
      { route: 'caht' },
    ),
    (x) => x instanceof PolicyError && /known routes: chat, claude/.test(x.message),
  )
  assert.equal(ran, false)
  assert.equal(e.liveCalls, 0)
  assert.equal(e.stats().logical_requests, 0)
  // A catalog upstream named alone is the way to call one upstream with no route.
  const c = e.begin({ route: 'mini', request: readRequest(CHAT, null, chatBody({ tools: [{ type: 'function', function: { name: 'f' } }] })) })
  assert.equal(c.nextAttempt().upstream, 'mini')
  // A policy without routes names none: any route is an ad-hoc upstream.
  assert.equal(new Engine({}).begin({ route: 'openai/gpt-4o' }).nextAttempt().upstream, 'openai/gpt-4o')
})

test('a wrapped fetch with a route the policy does not know rejects with the PolicyError; no request is sent', async () => {
  const srv = await localServer((req, res) => res.end('{}'))
  try {
    const e = new Engine(POLICY)
    const f = wrapFetch(e, fetch, { routes: { 'gpt-4o': 'caht' } })
    await assert.rejects(f(srv.url + '/v1/chat/completions', { method: 'POST', body: chatBody() }), (x) => x instanceof PolicyError && /known routes: chat, claude/.test(x.message))
    const g = wrapFetch(e, fetch)
    await assert.rejects(g(srv.url + '/v1/chat/completions', { method: 'POST', body: chatBody(), retrywise: { route: 'nope' } }), PolicyError)
    assert.equal(srv.seen.length, 0)
    assert.equal(e.liveCalls, 0)
  } finally {
    await srv.close()
  }
})

/**
 * Spies on the native report of `engine`: the firstTokenMs argument of each
 * general report (the last one; -1 when absent).
 */
function spyFirstToken(engine) {
  const seen = []
  const n = engine._n
  const report = n.report
  n.report = (...args) => {
    seen.push(args[args.length - 1])
    return report.apply(n, args)
  }
  return seen
}

test('report({ firstTokenMs }): passed to the core with the success; checked', () => {
  const e = new Engine({})
  const seen = spyFirstToken(e)
  const c = e.begin({ route: 'up' })
  c.nextAttempt()
  assert.equal(c.report({ status: 200, firstTokenMs: 123.5 }).action, 'succeeded')
  assert.deepEqual(seen, [123.5])
  const c2 = e.begin({ route: 'up' })
  c2.nextAttempt()
  for (const bad of [-1, Number.NaN, Infinity, '5']) {
    assert.throws(() => c2.report({ status: 200, firstTokenMs: bad }), (x) => x instanceof TypeError && /outcome\.firstTokenMs must be a finite number >= 0/.test(x.message), String(bad))
  }
  assert.equal(c2.report({ status: 200, firstTokenMs: null }).action, 'succeeded')
})

test('a wrapped fetch reports a streamed success with its time to first token (preamble and pings excluded)', async () => {
  const ev = (o) => `data: ${JSON.stringify(o)}\n\n`
  const chunk = (delta, finish = null) => ({ id: 'c1', object: 'chat.completion.chunk', model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] })
  const srv = await localServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    // The role-only preamble at once, then 200 ms of silence, then the answer.
    res.write(ev(chunk({ role: 'assistant', content: '' })))
    setTimeout(() => {
      res.write(ev(chunk({ content: 'hello' })))
      res.write(ev(chunk({}, 'stop')))
      res.end('data: [DONE]\n\n')
    }, 200)
  })
  try {
    const e = new Engine({})
    const seen = spyFirstToken(e)
    const f = wrapFetch(e, fetch, { route: 'local' })
    const t0 = performance.now()
    const r = await f(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: chatBody({ stream: true }) })
    const text = await r.text()
    const elapsed = performance.now() - t0
    assert.match(text, /hello/)
    assert.equal(seen.length, 1)
    const ms = seen[0]
    assert.ok(ms >= 190 && ms <= elapsed, `firstTokenMs ${ms}, elapsed ${elapsed}`)
    assert.equal(e.stats().successes, 1)
  } finally {
    await srv.close()
  }
})

test('wrapFetch needs: an object or a function of the request, init.retrywise.needs over both; checked', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"ok":true}')
  })
  try {
    const url = srv.url + '/v1/chat/completions'
    const first = async (opts, init = {}, extra = {}) => {
      const e = new Engine(POLICY)
      const ups = []
      e.onEvent((x) => {
        if (x.kind === 'attempt_start') ups.push(x.upstream)
      })
      const r = await wrapFetch(e, fetch, { route: 'chat', ...opts })(url, { method: 'POST', body: chatBody(extra), ...init })
      assert.equal(r.status, 200)
      return ups
    }
    assert.deepEqual(await first({}), ['mini'])
    assert.deepEqual(await first({ needs: { capabilities: ['vision'] } }), ['gpt'])
    const asked = []
    const fn = (req) => {
      asked.push([req.model, req.facts.family, req.facts.needs.capabilities, req.url, req.method])
      return req.headers.get('x-needs') === 'vision' ? { capabilities: ['vision'] } : null
    }
    assert.deepEqual(await first({ needs: fn }), ['mini'])
    assert.deepEqual(await first({ needs: fn }, { headers: { 'x-needs': 'vision' } }), ['gpt'])
    assert.deepEqual(asked[0], ['gpt-4o', 'openai', [], url, 'POST'])
    // Per request, over the wrapper's: capabilities of both.
    assert.deepEqual(await first({ needs: { capabilities: ['streaming'] } }, { retrywise: { needs: { capabilities: ['tool_calling'] } } }), ['gpt'])
    assert.deepEqual(await first({}, { retrywise: { needs: { inputTokens: 4000 } } }), ['gpt'])
    // The body's needs are always there: tools never start on mini, whatever the caller adds.
    assert.deepEqual(await first({ needs: { capabilities: ['streaming'] } }, {}, { tools: [{ type: 'function', function: { name: 'f' } }] }), ['gpt'])
    assert.throws(() => wrapFetch(new Engine(POLICY), fetch, { needs: 'vision' }), (x) => x instanceof TypeError && /opts\.needs must be a needs object/.test(x.message))
    await assert.rejects(wrapFetch(new Engine(POLICY), fetch, { route: 'chat', needs: () => 'vision' })(url, { method: 'POST', body: '{}' }), (x) => x instanceof TypeError && /opts\.needs\(request\)/.test(x.message))
    await assert.rejects(wrapFetch(new Engine(POLICY), fetch, { route: 'chat' })(url, { method: 'POST', body: '{}', retrywise: { needs: ['vision'] } }), (x) => x instanceof TypeError && /init\.retrywise\.needs/.test(x.message))
  } finally {
    await srv.close()
  }
})

test('opts.routes as a function is given the request facts too', async () => {
  const srv = await localServer((req, res) => res.end('ok'))
  try {
    const got = []
    const f = wrapFetch(new Engine({}), fetch, {
      routes: (req) => {
        got.push([req.model, req.facts.endpoint, req.facts.needs.capabilities])
        return 'local'
      },
    })
    const r = await f(srv.url + '/v1/messages', { method: 'POST', headers: { 'anthropic-version': '2023-06-01' }, body: JSON.stringify({ model: 'claude-x', max_tokens: 5, stream: true, messages: [] }) })
    assert.equal(await r.text(), 'ok')
    assert.deepEqual(got, [['claude-x', 'messages', ['streaming']]])
  } finally {
    await srv.close()
  }
})

test('a wrapped fetch inside engine.run (a nested, non-owner call) begins with its request needs too', async () => {
  const srv = await localServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"ok":true}')
  })
  try {
    const e = new Engine(POLICY)
    const starts = []
    e.onEvent((x) => {
      if (x.kind === 'attempt_start') starts.push(x.upstream)
    })
    const f = wrapFetch(e, fetch, { route: 'chat' })
    const tools = chatBody({ tools: [{ type: 'function', function: { name: 'f' } }] })
    const out = await e.run(async () => (await f(srv.url + '/v1/chat/completions', { method: 'POST', body: tools })).json(), { route: 'chat' })
    assert.deepEqual(out, { ok: true })
    // The outer call (no request) starts on mini; the inner one, with tools, on gpt.
    assert.deepEqual(starts, ['mini', 'gpt'])
    assert.equal(e.stats().logical_requests, 2)
  } finally {
    await srv.close()
  }
})
