'use strict'
// Run by tests/artifacts/run.sh from a fresh npm project that installed only
// the tarballs from scripts/package: the decision loop and wrapFetch against a
// server this script starts on 127.0.0.1.
const assert = require('node:assert/strict')
const http = require('node:http')
const path = require('node:path')

const rw = require('retrywise')

// The addon must come from the platform package, not from the main package.
const addons = Object.keys(require.cache).filter((f) => f.endsWith('.node'))
assert.deepEqual(
  addons.map((f) => path.relative(process.cwd(), f)),
  [path.join('node_modules', 'retrywise-linux-x64-gnu', 'retrywise.linux-x64-gnu.node')],
)
console.log('retrywise', rw.version, 'addon from', path.relative(process.cwd(), addons[0]))

// A release build has no test hooks: a policy that sets one is refused.
assert.throws(
  () => new rw.Engine({ testing: { panic_on_vendor_code: 'boom' } }),
  (e) => e instanceof rw.PolicyError && /testing/.test(e.message),
  'the addon accepts test hooks: it was built with the test-hooks feature',
)
console.log('no test hooks: a policy that sets one is refused')

// The decision loop: a 503 asking for 5 ms, then a 200 (no Retry-After
// jitter, so the wait is exactly the hint).
const engine = new rw.Engine({ max_attempts: 3, retry_after: { jitter_ms: 0 } }, { seed: 7, manualClock: true })
const call = engine.begin({ route: 'openai/gpt-4o', deadlineMs: 10000 })
let a = call.nextAttempt()
assert.deepEqual([a.number, a.upstream, a.headers['retrywise-attempt']], [1, 'openai/gpt-4o', '1'])
let d = call.report({ status: 503, headers: { 'retry-after-ms': '5' } })
assert.deepEqual(
  [d.action, d.reason, d.errorClass, d.waitSource, d.delayMs, d.retryAfterMs, d.attempt],
  ['retry', 'retryable_status', 'transient', 'retry_after', 5, 5, 1],
)
a = call.nextAttempt()
assert.equal(a.number, 2)
d = call.report({ status: 200 })
assert.deepEqual([d.action, d.reason, d.errorClass, d.attempt], ['succeeded', 'success', null, 2])
assert.throws(() => call.nextAttempt(), (e) => e instanceof rw.StoppedError && e.reason === 'call_finished')
console.log('decision loop: retry (retryable_status, 5 ms from retry-after-ms), then succeeded')

// wrapFetch against a local upstream: 503 (retry-after-ms: 1), then 200.
const seen = []
const server = http.createServer((req, res) => {
  req.resume()
  req.on('end', () => {
    seen.push(req.headers['retrywise-attempt'])
    const first = seen.length === 1
    res.writeHead(first ? 503 : 200, { 'content-type': 'application/json', ...(first ? { 'retry-after-ms': '1' } : {}) })
    res.end(first ? '{"error":{"type":"overloaded"}}' : '{"ok":true}')
  })
})
server.listen(0, '127.0.0.1', async () => {
  try {
    const e = new rw.Engine({ max_attempts: 3, retry_after: { jitter_ms: 0 } }, { seed: 7 })
    const f = rw.wrapFetch(e, fetch, { route: 'local' })
    const res = await f(`http://127.0.0.1:${server.address().port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"model":"m"}',
    })
    assert.equal(res.status, 200)
    assert.deepEqual(await res.json(), { ok: true })
    assert.deepEqual(seen, ['1', '2'])
    const s = e.stats()
    assert.deepEqual([s.logical_requests, s.attempts, s.retries, s.retry_successes], [1, 2, 1, 1])
    console.log('wrapFetch on 127.0.0.1: 503 then 200, 2 requests, 1 retry')
  } finally {
    server.close()
  }
})
