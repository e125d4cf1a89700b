'use strict'
// Three retrywise layers in a chain: the openai SDK over wrapFetch (the owner) →
// a service → a gateway → the fault server. The service and the gateway are small
// HTTP servers on 127.0.0.1, each with its own Engine (max_attempts 3 like the
// client's); they read the inbound propagation headers and govern their outbound
// call with them, so they are not retry owners. Against a persistently failing
// upstream the fault server sees the owner's max_attempts, not 3 x 3 x 3; every
// layer sees the same logical request id; the deadline shrinks down the chain.
const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const { OpenAI } = require('openai')
const { Engine, wrapFetch, StoppedError } = require('..')
const { startFaultServer } = require('./helpers.js')

const POLICY = { max_attempts: 3, backoff: { base_ms: 10, cap_ms: 40 } }
const PROPAGATION = ['retrywise-deadline-ms', 'retrywise-request-id', 'retrywise-attempt', 'idempotency-key']

/** A retrywise-governed hop forwarding every POST to `upstream`. */
async function layer(name, upstream) {
  const engine = new Engine(POLICY, { seed: 3 })
  const seen = []
  const server = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', async () => {
      seen.push({ ...req.headers })
      const inboundHeaders = Object.fromEntries(PROPAGATION.filter((h) => req.headers[h] !== undefined).map((h) => [h, req.headers[h]]))
      const body = Buffer.concat(chunks)
      let upstreamRes
      try {
        upstreamRes = await engine.run(
          (a) =>
            fetch(upstream + req.url, {
              method: 'POST',
              body,
              headers: { 'content-type': req.headers['content-type'] ?? 'application/json', ...a.headers },
              signal: a.signal,
            }),
          { route: name, inboundHeaders },
        )
      } catch (err) {
        if (!(err instanceof StoppedError) || !err.response) {
          res.writeHead(502, { 'content-type': 'application/json' })
          res.end('{"error":{"message":"upstream unreachable"}}')
          return
        }
        upstreamRes = err.response
      }
      const out = {}
      for (const h of ['content-type', 'retry-after', 'retry-after-ms']) if (upstreamRes.headers.get(h)) out[h] = upstreamRes.headers.get(h)
      const text = await upstreamRes.text()
      res.writeHead(upstreamRes.status, out)
      res.end(text)
    })
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  return {
    engine,
    seen,
    url: `http://127.0.0.1:${server.address().port}`,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections()
        server.close(() => r())
      }),
  }
}

let fs
test.before(async () => {
  fs = await startFaultServer()
})
test.after(async () => {
  if (fs) await fs.stop()
})

test('three layers against a persistent 503 cost the owner max_attempts, not 27', async () => {
  await fs.reset()
  const gateway = await layer('gateway', `${fs.base}/s/status:503`)
  const service = await layer('service', gateway.url)
  try {
    const owner = new Engine(POLICY, { seed: 5 })
    const c = new OpenAI({
      apiKey: 'test',
      baseURL: `${service.url}/v1`,
      maxRetries: 0,
      fetch: wrapFetch(owner, fetch, { route: 'service', deadlineMs: 8000, idempotency: 'keyed', idempotencyKey: 'k-chain' }),
    })
    await assert.rejects(c.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }), (err) => err instanceof OpenAI.InternalServerError)

    const rows = await fs.recordsOf('status:503')
    // Worst case at the upstream: the single owner's max_attempts, not 3 x 3 x 3.
    assert.equal(rows.length, 3)
    assert.equal(service.seen.length, 3)
    assert.equal(gateway.seen.length, 3)
    assert.equal(owner.stats().attempts, 3)
    assert.deepEqual(owner.stats().stops, { max_attempts: 1 })
    for (const l of [service, gateway]) {
      const s = l.engine.stats()
      assert.equal(s.logical_requests, 3)
      assert.equal(s.attempts, 3)
      assert.equal(s.retries, 0)
      assert.deepEqual(s.stops, { not_owner: 3 })
    }
    // One logical request end to end.
    const ids = new Set([...service.seen, ...gateway.seen].map((h) => h['retrywise-request-id']).concat(rows.map((r) => r.logical_id)))
    assert.equal(ids.size, 1)
    assert.ok([...ids][0])
    for (let n = 0; n < 3; n++) {
      assert.equal(service.seen[n]['retrywise-attempt'], String(n + 1))
      assert.equal(gateway.seen[n]['retrywise-attempt'], String(n + 1))
      assert.equal(rows[n].attempt, n + 1)
      assert.equal(service.seen[n]['idempotency-key'], 'k-chain')
      assert.equal(gateway.seen[n]['idempotency-key'], 'k-chain')
      assert.equal(rows[n].idempotency_key, 'k-chain')
      // The deadline shrinks down the chain.
      const atService = Number(service.seen[n]['retrywise-deadline-ms'])
      const atGateway = Number(gateway.seen[n]['retrywise-deadline-ms'])
      const atUpstream = rows[n].deadline_ms
      assert.ok(8000 > atService && atService > atGateway && atGateway > atUpstream && atUpstream > 0, `${atService} ${atGateway} ${atUpstream}`)
    }
  } finally {
    await service.close()
    await gateway.close()
  }
})
