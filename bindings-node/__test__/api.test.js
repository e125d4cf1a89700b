'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const rw = require('..')
const { Engine, StoppedError } = rw

test('vocabulary comes from the core, in code order', () => {
  assert.equal(rw.vocabulary.action[0], 'succeeded')
  assert.ok(rw.vocabulary.reason.includes('retry_after_exceeds_deadline'))
  assert.deepEqual(rw.vocabulary.idempotency, ['safe', 'keyed', 'unsafe'])
  assert.equal(typeof rw.version, 'string')
})

test('policy as object, JSON, YAML, TOML string and file', () => {
  for (const p of [{ max_attempts: 5 }, '{"max_attempts": 5}', 'max_attempts: 5\n', 'max_attempts = 5\n']) {
    assert.equal(new Engine(p).policy().max_attempts, 5)
  }
  assert.equal(new Engine().policy().max_attempts, 3)
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rw-'))
  const f = path.join(dir, 'p.yaml')
  fs.writeFileSync(f, 'version: v7\nmax_attempts: 2\n')
  const e = Engine.fromFile(f)
  assert.equal(e.policyVersion, 'v7')
  assert.equal(e.policy().max_attempts, 2)
})

test('decision loop: retry on 503, then success; attempt fields', () => {
  const e = new Engine({}, { seed: 1 })
  const c = e.begin({ route: 'openai/gpt-4o', deadlineMs: 10_000 })
  const a = c.nextAttempt()
  assert.equal(a.number, 1)
  assert.equal(a.upstream, 'openai/gpt-4o')
  assert.equal(a.hedge, false)
  assert.equal(a.fallback, false)
  assert.ok(a.remainingMs > 9_000 && a.remainingMs <= 10_000)
  assert.deepEqual(Object.keys(a.timeouts).sort(), ['connectMs', 'firstByteMs', 'firstTokenMs', 'idleMs', 'totalMs'])
  assert.equal(a.headers['retrywise-attempt'], '1')
  assert.equal(a.headers['retrywise-request-id'], a.requestId)
  let d = c.report({ status: 503 })
  assert.equal(d.action, 'retry')
  assert.equal(d.errorClass, 'transient')
  assert.equal(d.reason, 'retryable_status')
  assert.equal(d.waitSource, 'jitter')
  assert.equal(d.upstream, 'openai/gpt-4o')
  assert.equal(d.attempt, 1)
  const a2 = c.nextAttempt()
  assert.equal(a2.number, 2)
  assert.equal(a2.requestId, a.requestId)
  d = c.report({ status: 200 })
  assert.equal(d.action, 'succeeded')
  assert.equal(d.errorClass, null)
  assert.equal(c.attempts, 2)
  assert.throws(() => c.nextAttempt(), (err) => err instanceof StoppedError && err.reason === 'call_finished')
  c.release()
  assert.throws(() => c.nextAttempt(), { code: 'ERR_RETRYWISE_RELEASED' })
})

test('Retry-After wins over jitter and must fit the deadline', () => {
  const e = new Engine()
  let c = e.begin({ route: 'u', deadlineMs: 10_000 })
  c.nextAttempt()
  let d = c.report({ status: 429, headers: { 'Retry-After': '2' } })
  assert.equal(d.action, 'retry')
  assert.equal(d.waitSource, 'retry_after')
  assert.equal(d.retryAfterMs, 2000)
  assert.ok(d.delayMs >= 2000)
  c = e.begin({ route: 'u', deadlineMs: 5_000 })
  c.nextAttempt()
  d = c.report({ status: 429, headers: new Headers({ 'retry-after': '3600' }) })
  assert.equal(d.action, 'stop')
  assert.equal(d.reason, 'retry_after_exceeds_deadline')
  assert.match(d.detail, /retry-after/)
})

test('status classes: 400, 401, insufficient_quota via body', () => {
  const e = new Engine()
  const one = (o) => {
    const c = e.begin({ route: 'u' })
    c.nextAttempt()
    return c.report(o)
  }
  assert.equal(one({ status: 400 }).reason, 'invalid_request')
  assert.equal(one({ status: 401 }).reason, 'auth_error')
  const q = one({ status: 429, body: '{"error":{"code":"insufficient_quota","type":"insufficient_quota"}}' })
  assert.equal(q.action, 'stop')
  assert.equal(q.reason, 'quota_exhausted')
  // Pacing (on by default) stops later calls to `u` while its quota is out: another upstream.
  const c2 = e.begin({ route: 'v' })
  c2.nextAttempt()
  assert.equal(c2.report({ status: 429, vendorCode: 'insufficient_quota' }).reason, 'quota_exhausted')
  assert.equal(rw.vendorCodeFromBody({ type: 'error', error: { type: 'overloaded_error' } }), 'overloaded_error')
  assert.equal(rw.vendorCodeFromBody('nope'), null)
})

test('machine errors, phases and effects; unsafe calls reconcile', () => {
  const e = new Engine()
  let c = e.begin({ route: 'u', idempotency: 'unsafe', idempotencyKey: undefined, tenant: 't1' })
  c.nextAttempt()
  let d = c.report({ error: 'connection_reset', phase: 'sent' })
  assert.equal(d.action, 'reconcile')
  assert.equal(d.reason, 'effect_unknown')
  const list = e.reconcileList()
  assert.equal(list.length, 1)
  assert.equal(list[0].tenant, 't1')
  assert.equal(e.drainReconcile().length, 1)
  assert.equal(e.reconcileList().length, 0)
  c = e.begin({ route: 'u' })
  c.nextAttempt()
  d = c.report({ status: 200, error: 'connection-reset', phase: 'Stream-Visible' })
  assert.equal(d.action, 'stop')
  assert.equal(d.reason, 'stream_visible_output')
  assert.equal(d.errorClass, 'partial_stream')
  c = e.begin({ route: 'u' })
  c.nextAttempt()
  d = c.report({ error: 'connect' })
  assert.equal(d.action, 'retry')
})

test('cancel reports attempts in flight as cancelled', () => {
  const e = new Engine()
  const c = e.begin({ route: 'u' })
  c.nextAttempt()
  const d = c.cancel()
  assert.equal(d.action, 'stop')
  assert.equal(d.reason, 'cancelled')
  assert.equal(d.errorClass, 'cancelled')
})

test('seed + manual clock make decisions reproducible; advanceClock', () => {
  const run = () => {
    const e = new Engine({ max_attempts: 5 }, { seed: 42n, manualClock: true })
    const c = e.begin({ route: 'u', deadlineMs: 60_000 })
    const delays = []
    for (let i = 0; i < 4; i++) {
      c.nextAttempt()
      const d = c.report({ status: 503 })
      delays.push(d.delayMs)
      e.advanceClock(d.delayMs)
    }
    return [delays, c.remainingMs]
  }
  const [d1, r1] = run()
  const [d2, r2] = run()
  assert.deepEqual(d1, d2)
  assert.equal(r1, r2)
  assert.equal(r1, 60_000 - d1.reduce((a, b) => a + b, 0))
  assert.throws(() => new Engine().advanceClock(1), { code: 'ERR_RETRYWISE_NO_MANUAL_CLOCK' })
  const m = new Engine({ min_attempt_ms: 100 }, { manualClock: true })
  const c = m.begin({ route: 'u', deadlineMs: 1000 })
  m.advanceClock(950)
  assert.throws(() => c.nextAttempt(), (err) => err.reason === 'deadline_exceeded' && err.errorClass === 'deadline_exceeded')
})

test('stats, prometheus and events', () => {
  const e = new Engine()
  const c = e.begin({ route: 'u', tenant: 'acme' })
  c.nextAttempt()
  c.report({ status: 503 })
  c.nextAttempt()
  c.report({ status: 200 })
  const s = e.stats()
  assert.equal(s.logical_requests, 1)
  assert.equal(s.attempts, 2)
  assert.equal(s.amplification, 2)
  assert.equal(s.per_tenant.acme.attempts, 2)
  assert.match(e.prometheus(), /retrywise_attempts_total 2/)
  const ev = e.events()
  assert.ok(ev.some((x) => x.kind === 'attempt_start'))
  assert.ok(ev.some((x) => x.kind === 'decision' && x.action === 'succeeded'))
  assert.ok(e.events({ drain: true }).length > 0)
  assert.equal(e.events().length, 0)
})

test('onEvent: synchronous delivery; a throwing listener never breaks decisions', () => {
  const e = new Engine()
  const seen = []
  const off = e.onEvent((ev) => seen.push(ev.kind))
  const off2 = e.onEvent(() => {
    throw new Error('listener bug')
  })
  const c = e.begin({ route: 'u' })
  c.nextAttempt()
  assert.ok(seen.includes('attempt_start'))
  const d = c.report({ status: 200 })
  assert.equal(d.action, 'succeeded')
  assert.ok(seen.includes('attempt_end') && seen.includes('decision'))
  assert.ok(e.listenerErrors >= 3)
  off()
  off2()
  const n = seen.length
  const c2 = e.begin({ route: 'u' })
  c2.nextAttempt()
  c2.report({ status: 200 })
  assert.equal(seen.length, n)
})

test('reload swaps the policy; an invalid one keeps the old', () => {
  const e = new Engine({ version: 'a' })
  const seen = []
  e.onEvent((ev) => seen.push(ev))
  e.reload('version: b\nmax_attempts: 4\n')
  assert.equal(e.policyVersion, 'b')
  assert.ok(seen.some((x) => x.kind === 'reload'))
  assert.throws(() => e.reload({ max_attempts: 0 }), (err) => err instanceof rw.PolicyError && err.path === 'max_attempts')
  assert.equal(e.policyVersion, 'b')
})

test('setMode / mode: kill switch', () => {
  const e = new Engine()
  assert.deepEqual(e.mode(), { retries: true, fallback: true, hedging: true })
  e.setMode({ retries: false })
  assert.deepEqual(e.mode(), { retries: false, fallback: true, hedging: true })
  const c = e.begin({ route: 'u' })
  c.nextAttempt()
  assert.equal(c.report({ status: 503 }).reason, 'retries_disabled')
  e.setMode({ retries: true, hedging: false })
  assert.deepEqual(e.mode(), { retries: true, fallback: true, hedging: false })
})

test('routes: fallback to the next candidate, exclusions, breakerState', () => {
  const e = new Engine({
    upstreams: { a: { capabilities: ['tool_calling'] }, b: { capabilities: [] }, c: { capabilities: ['tool_calling'] } },
    routes: { chat: { candidates: ['a', 'b', 'c'], require: ['tool_calling'], attempts_per_upstream: 1 } },
  })
  const c = e.begin({ route: 'chat' })
  assert.equal(c.nextAttempt().upstream, 'a')
  const d = c.report({ status: 503 })
  assert.equal(d.action, 'fallback')
  assert.equal(d.upstream, 'c')
  assert.ok(d.excluded.some(([u, why]) => u === 'b' && why.startsWith('missing_capability')))
  const a2 = c.nextAttempt()
  assert.equal(a2.upstream, 'c')
  assert.equal(a2.fallback, true)
  assert.equal(e.breakerState('a'), 'closed')
})

test('nextHedge: after, then start a parallel attempt; report names the attempt', () => {
  const e = new Engine({ upstreams: { a: {}, b: {} }, routes: { r: { candidates: ['a', 'b'], hedge_after_ms: 100 } } }, { manualClock: true })
  const c = e.begin({ route: 'r', deadlineMs: 10_000 })
  c.nextAttempt()
  const w = c.nextHedge()
  assert.equal(w.action, 'after')
  assert.equal(w.delayMs, 100)
  e.advanceClock(100)
  const h = c.nextHedge()
  assert.equal(h.action, 'start')
  assert.equal(h.attempt.hedge, true)
  assert.equal(h.attempt.number, 2)
  const d = c.report({ status: 200, attempt: 2 })
  assert.equal(d.action, 'succeeded')
  assert.equal(d.hedge, true)
  const u = e.begin({ route: 'r', idempotency: 'unsafe' })
  u.nextAttempt()
  assert.deepEqual(u.nextHedge(), { action: 'no', reason: 'hedge_not_allowed' })
})

test('inbound propagation headers make a non-owner call', () => {
  const e = new Engine()
  const c = e.begin({ route: 'u', inboundHeaders: { 'retrywise-deadline-ms': '2000', 'retrywise-request-id': 'up-1', 'retrywise-attempt': '2' } })
  const a = c.nextAttempt()
  assert.equal(a.requestId, 'up-1')
  assert.ok(a.remainingMs <= 2000)
  const d = c.report({ status: 503 })
  assert.equal(d.action, 'stop')
  assert.equal(d.reason, 'not_owner')
  assert.equal(c.info().owner, false)
  assert.throws(() => e.begin({ route: 'u', inboundHeaders: { 'retrywise-deadline-ms': 'soon' } }), { code: 'ERR_RETRYWISE_INBOUND' })
})

test('idempotency helpers and key conflicts', () => {
  const d1 = rw.paramsDigest({ b: 1, a: [1, { y: 2, x: 1 }] })
  const d2 = rw.paramsDigest({ a: [1, { x: 1, y: 2 }], b: 1 })
  assert.equal(d1, d2)
  assert.match(d1, /^[0-9a-f]{64}$/)
  const k = rw.deriveIdempotencyKey('acme', 'send_email', d1)
  assert.match(k, /^rw1_[0-9a-f]{32}$/)
  const e = new Engine()
  const c1 = e.begin({ route: 'u', idempotency: 'keyed', idempotencyKey: k, params: { to: 'a' } })
  assert.equal(c1.nextAttempt().headers['idempotency-key'], k)
  const c2 = e.begin({ route: 'u', idempotency: 'keyed', idempotencyKey: k, params: { to: 'b' } })
  assert.throws(() => c2.nextAttempt(), (err) => err.reason === 'idempotency_conflict')
})

test('calls from begin() are freed by release() or garbage collection', () => {
  const e = new Engine()
  const before = e.liveCalls
  const c = e.begin({ route: 'u' })
  assert.equal(e.liveCalls, before + 1)
  c.release()
  c.release()
  assert.equal(e.liveCalls, before)
})

test('a call dropped without release() is freed once garbage-collected', async () => {
  const v8 = require('node:v8')
  const vm = require('node:vm')
  v8.setFlagsFromString('--expose-gc')
  const gc = vm.runInNewContext('gc')
  const e = new Engine()
  ;(() => {
    for (let i = 0; i < 10; i++) e.begin({ route: 'u' }).nextAttempt()
  })()
  assert.equal(e.liveCalls, 10)
  // Registration happens after the microtask; cleanup callbacks run as tasks after a GC.
  for (let i = 0; i < 50 && e.liveCalls > 0; i++) {
    await new Promise((ok) => setTimeout(ok, 5))
    gc()
  }
  assert.equal(e.liveCalls, 0)
})

test('calls released in the same job never reach the GC safety net; more than a batch of them is fine', () => {
  const e = new Engine()
  for (let i = 0; i < 1000; i++) {
    const c = e.begin({ route: 'u' })
    c.nextAttempt()
    c.report({ status: 200 })
    c.release()
  }
  assert.equal(e.liveCalls, 0)
})

test('release() gives back at once what a call holds; a call that holds nothing is freed with the next batch', async () => {
  const e = new Engine({ budget: { ratio: 1.0, min_per_sec: 100, max_concurrent_retries: 1 } })
  const a = e.begin({ route: 'u' })
  a.nextAttempt()
  assert.equal(a.report({ status: 503 }).action, 'retry')
  const b = e.begin({ route: 'u' })
  b.nextAttempt()
  assert.equal(b.report({ status: 503 }).reason, 'retry_concurrency', 'a holds the only retry slot')
  b.release()
  // a holds its retry slot: released, it gives the slot back before release() returns.
  a.release()
  const c = e.begin({ route: 'u' })
  c.nextAttempt()
  assert.equal(c.report({ status: 503 }).action, 'retry', 'the slot came back at once')
  c.release()
  assert.equal(e.liveCalls, 0)

  // A finished call holds nothing: its final report freed it, with no release();
  // it still answers from what it kept until release().
  const native = e._n
  const done = e.begin({ route: 'u' })
  done.nextAttempt()
  assert.equal(done.report({ status: 200 }).action, 'succeeded')
  assert.equal(native.liveCalls(), 0, 'freed by its final report')
  assert.equal(done.attempts, 1)
  done.release()
  assert.throws(() => done.id, /released/, 'released for JS at once')

  // A call that holds nothing but is not finished (its last decision a
  // retry) waits for the batch when released, nothing else does.
  const e2 = new Engine({ budget: { enabled: false }, breaker: { enabled: false } })
  const n2 = e2._n
  const idle = () => {
    const x = e2.begin({ route: 'u' })
    x.nextAttempt()
    assert.equal(x.report({ status: 503 }).action, 'retry')
    return x
  }
  const w = idle()
  w.release()
  assert.equal(n2.liveCalls(), 1, 'queued, not yet freed')
  assert.throws(() => w.id, /released/, 'released for JS at once')
  await null
  assert.equal(n2.liveCalls(), 0, 'freed by the end of the job')

  // The next begin frees the call released before it, in its own step.
  for (let i = 0; i < 100; i++) idle().release()
  assert.equal(n2.liveCalls(), 1, 'only the last one waits')
  assert.equal(e2.liveCalls, 0, 'liveCalls frees what waits first')

  // Released with no begin between them: a full batch is freed without waiting for the job to end.
  const calls = []
  for (let i = 0; i < 100; i++) calls.push(idle())
  for (const x of calls) x.release()
  assert.equal(n2.liveCalls(), 100 - 65)
  await null
  assert.equal(n2.liveCalls(), 0)
})

test('an onEvent listener that calls into the engine does not disturb the step being reported', () => {
  const e = new Engine({ max_attempts: 3, backoff: { base_ms: 1, cap_ms: 2 } })
  let inner = 0
  e.onEvent(() => {
    if (inner++ < 20) {
      const c = e.begin({ route: 'side' })
      c.nextAttempt()
      c.report({ status: 200 })
      c.release()
    }
  })
  const c = e.begin({ route: 'main', deadlineMs: 5000 })
  const a = c.nextAttempt()
  assert.equal(a.number, 1)
  assert.equal(a.upstream, 'main')
  const d = c.report({ status: 503 })
  assert.equal(d.action, 'retry')
  assert.equal(d.reason, 'retryable_status')
  c.release()
})

test('StreamGate: a preamble is held until the first meaningful event; other bodies pass through', () => {
  const enc = (t) => new TextEncoder().encode(t)
  const dec = (b) => new TextDecoder().decode(b)
  const role = 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
  const text = 'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
  const g = new rw.StreamGate('text/event-stream; charset=utf-8')
  assert.equal(g.visible, false)
  assert.equal(g.feed(enc(role)).byteLength, 0)
  assert.equal(g.phase, 'stream_open')
  assert.equal(g.held, role.length)
  // Split mid-event: nothing until the event's blank line arrives.
  assert.equal(g.feed(enc(text.slice(0, 10))).byteLength, 0)
  assert.equal(dec(g.feed(Buffer.from(text.slice(10)))), role + text)
  assert.equal(g.phase, 'stream_visible')
  assert.equal(dec(g.feed(enc('data: [DONE]\n\n'))), 'data: [DONE]\n\n')
  assert.equal(g.finish().byteLength, 0)

  const pre = new rw.StreamGate('text/event-stream')
  const start = 'event: message_start\ndata: {"type":"message_start","message":{"content":[]}}\n\n'
  assert.equal(pre.feed(enc(start)).byteLength, 0)
  assert.equal(dec(pre.finish()), start, 'a body that ends holding delivers what it held')

  for (const ct of [undefined, null, 'application/json']) {
    const p = new rw.StreamGate(ct)
    assert.equal(p.mayHold, false)
    assert.equal(p.phase, 'stream_open', 'nothing delivered yet')
    assert.equal(dec(p.feed(enc(role))), role)
    assert.equal(p.phase, 'stream_visible')
  }
  assert.equal(new rw.StreamGate('text/event-stream').mayHold, true)
  assert.throws(() => new rw.StreamGate('text/event-stream').feed('text'), { name: 'TypeError', message: 'chunk must be a Uint8Array; got "text"' })
  assert.throws(() => new rw.StreamGate(42), { name: 'TypeError', message: 'contentType must be a string; got number 42' })
})

test('Transcript and StreamGate.endOutcome: a body that ends after output without its finish was cut', () => {
  const enc = (t) => new TextEncoder().encode(t)
  const role = 'data: {"id":"c1","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
  const text = 'data: {"id":"c1","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
  const stop = 'data: {"id":"c1","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
  const usage = 'data: {"id":"c1","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
  const cut = new rw.StreamGate('text/event-stream')
  const seen = new rw.Transcript('openai')
  assert.equal(seen.api, 'openai')
  assert.deepEqual([seen.text, seen.resumable, seen.finished, seen.usage, seen.model], ['', true, false, null, null])
  // Nothing shown yet: the plain status (the gate still holds the preamble).
  seen.observe(cut.feed(enc(role)))
  assert.deepEqual(cut.endOutcome(200, seen), { status: 200 })
  // Text shown, no finish: cut where the caller saw it, and another upstream may continue it.
  seen.observe(cut.feed(enc(text)))
  assert.deepEqual(cut.endOutcome(200, seen), { status: 200, error: 'connection_reset', phase: 'stream_visible', resumable: true })
  assert.deepEqual(cut.outcome(200), { status: 200 }, 'outcome() alone does not read the transcript')
  // Its finish arrived: the plain status again (as in Python and C).
  seen.observe(cut.feed(enc(stop + usage)))
  assert.deepEqual(cut.endOutcome(200, seen), { status: 200 })
  assert.deepEqual([seen.text, seen.resumable, seen.finished, seen.usage, seen.model], ['Hi', false, true, { inputTokens: 5, outputTokens: 2 }, 'gpt-4o-mini'])

  // A half tool call ended cleanly: cut, and not continued elsewhere (not only text was shown).
  const tool = 'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"f","arguments":"{\\"a"}}]}}]}\n\n'
  const tg = new rw.StreamGate('text/event-stream')
  const tt = new rw.Transcript('openai')
  tt.observe(tg.feed(enc(tool)))
  assert.deepEqual(tg.endOutcome(200, tt), { status: 200, error: 'connection_reset', phase: 'stream_visible' })
  assert.equal(tt.resumable, false)

  // Anthropic: text after message_start, no message_stop.
  const ag = new rw.StreamGate('text/event-stream')
  const at = new rw.Transcript('anthropic')
  at.observe(ag.feed(enc('event: message_start\ndata: {"type":"message_start","message":{"model":"claude-x","content":[],"usage":{"input_tokens":7,"output_tokens":1}}}\n\n')))
  at.observe(ag.feed(enc('event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n')))
  at.observe(ag.feed(enc('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}\n\n')))
  assert.deepEqual(ag.endOutcome(200, at), { status: 200, error: 'connection_reset', phase: 'stream_visible', resumable: true })
  assert.deepEqual([at.text, at.model], ['Hel', 'claude-x'])

  assert.throws(() => new rw.Transcript('gemini'), { name: 'TypeError', message: 'api must be one of openai, anthropic, azure_openai; got "gemini"' })
  assert.throws(() => seen.observe('data'), { name: 'TypeError', message: 'delivered must be a Uint8Array; got "data"' })
  assert.throws(() => cut.endOutcome(200, {}), { name: 'TypeError', message: 'transcript must be a Transcript; got an instance of Object' })
  assert.throws(() => cut.endOutcome(20, seen), { name: 'TypeError', message: 'status must be an integer HTTP status (100-999); got number 20' })
})

test("the README's relay loop reports a stream cut after text as the core decides", async () => {
  // The ```js block after "Code that relays a stream itself", run as written with its free names given.
  const readme = require('node:fs').readFileSync(require('node:path').join(__dirname, '..', 'README.md'), 'utf8')
  const at = readme.indexOf('Code that relays a stream itself')
  assert.ok(at >= 0)
  const block = /```js\n([\s\S]*?)```/.exec(readme.slice(at))[1]
  const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor
  const relay = new AsyncFunction('engine', 'call', 'res', 'send', 'Transcript', `${block}\nreturn d`)
  const enc = (t) => new TextEncoder().encode(t)
  const chunks = [
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n',
    'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n',
  ]
  const run = async (parts) => {
    const e = new rw.Engine({ max_attempts: 3 }, { seed: 1 })
    const call = e.begin({ route: 'u', idempotency: 'safe' })
    call.nextAttempt()
    const body = new ReadableStream({
      start(c) {
        for (const p of parts) c.enqueue(enc(p))
        c.close()
      },
    })
    const res = new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } })
    const sent = []
    const d = await relay(e, call, res, (b) => sent.push(new TextDecoder().decode(b)), rw.Transcript)
    return { d, sent: sent.join('') }
  }
  // Cut after text (a clean end of body, no finish): the caller saw text, so it is never replayed.
  let { d, sent } = await run(chunks)
  assert.equal(sent, chunks.join(''))
  assert.deepEqual([d.action, d.reason, d.errorClass], ['stop', 'stream_visible_output', 'partial_stream'])
  // With its finish it succeeded.
  ;({ d, sent } = await run([...chunks, 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n', 'data: [DONE]\n\n']))
  assert.deepEqual([d.action, d.reason], ['succeeded', 'success'])
})

test('report body: a JSON 2xx that does not parse is malformed_response; an error body gives its vendor code', () => {
  const e = new rw.Engine({ max_attempts: 3 }, { seed: 1 })
  const json = { 'content-type': 'application/json; charset=utf-8' }
  let c = e.begin({ route: 'u' })
  c.nextAttempt()
  let d = c.report({ status: 200, headers: json, body: '{"id":"x","choices":[' })
  assert.equal(d.action, 'retry')
  assert.equal(d.reason, 'retryable_error')
  c.nextAttempt()
  d = c.report({ status: 200, headers: json, body: Buffer.from('{"id":"x"}') })
  assert.equal(d.action, 'succeeded')
  c.release()
  // Not JSON by its content-type (or none given): not judged.
  for (const headers of [{ 'content-type': 'text/plain' }, undefined]) {
    c = e.begin({ route: 'u' })
    c.nextAttempt()
    assert.equal(c.report({ status: 200, headers, body: '{garbled' }).action, 'succeeded')
    c.release()
  }
  // Its own upstream: pacing (on by default) would stop the calls to `u` after it.
  c = e.begin({ route: 'q' })
  c.nextAttempt()
  d = c.report({ status: 429, body: '{"error":{"code":"insufficient_quota"}}' })
  assert.equal(d.reason, 'quota_exhausted')
  c.release()
  // Bytes are judged as received, as in Python and C: a JSON body that is
  // not UTF-8 is malformed, in any byte form; the same text as a string is not.
  const bad = Buffer.from([0x7b, 0x22, 0x69, 0x64, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]) // {"id":"\xff"}
  for (const body of [bad, new Uint8Array(bad), bad.buffer.slice(bad.byteOffset, bad.byteOffset + bad.length), new DataView(bad.buffer, bad.byteOffset, bad.length)]) {
    c = e.begin({ route: 'u' })
    c.nextAttempt()
    d = c.report({ status: 200, headers: json, body })
    assert.equal(d.action, 'retry', `body ${Object.prototype.toString.call(body)}`)
    assert.equal(d.reason, 'retryable_error')
    c.release()
  }
  c = e.begin({ route: 'u' })
  c.nextAttempt()
  assert.equal(c.report({ status: 200, headers: json, body: bad.toString('utf8') }).action, 'succeeded')
  c.release()
  c = e.begin({ route: 'u' })
  c.nextAttempt()
  assert.equal(c.report({ status: 200, headers: json, body: { id: 'x' } }).action, 'succeeded')
  c.release()
  assert.throws(() => e.begin({ route: 'u' }).report({ status: 200, body: 42 }), { name: 'TypeError', message: 'outcome.body must be a string, bytes or an object; got number 42' })
  assert.equal(rw.vendorCodeFromBody(Buffer.from('{"error":{"type":"overloaded_error"}}')), 'overloaded_error')
  assert.equal(rw.vendorCodeFromBody('{"error":{"code":"insufficient_quota"}}'), 'insufficient_quota')
  assert.equal(rw.vendorCodeFromBody('not json'), null)
  assert.equal(rw.jsonMediaType('application/problem+json'), true)
  assert.equal(rw.jsonMediaType('text/event-stream'), false)
  assert.throws(() => rw.jsonMediaType(1), { name: 'TypeError', message: 'contentType must be a string; got number 1' })
})
