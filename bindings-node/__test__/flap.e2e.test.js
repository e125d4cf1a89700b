'use strict'
// The failover bench's flapping primary in real time through the README's
// wiring (openai-node, maxRetries: 0, `fetch: wrapFetch(engine, fetch)`; a
// primary and a fallback upstream; 3 attempts, a 30 s deadline, every other
// knob at its default): the primary answers 503 for 60 s from its first
// request, then is healthy; 20 requests 4 s apart, and more (still 4 s apart)
// while a run's primary has not served again, until 30 s after its recovery.
//
// Ten runs side by side, each its own engine (differently seeded) and its own
// flapping model on the fault server. In each: every request is answered,
// nothing the primary answered came from its outage, the breaker spares the
// primary part of the outage (fewer than two attempts per request: five
// failures in a row over a second open it, then it only probes), and the
// primary serves again within 30 s of its recovery. Each failed probe reopens
// the breaker 1.5 times longer, up to open_max_ms (20 s): a probe failed late
// in the outage may keep the primary out until ~20 s after its recovery, past
// the 20th request (76 s, 16 s after it), hence the requests after it.
const test = require('node:test')
const assert = require('node:assert/strict')
const { OpenAI } = require('openai')
const { Engine, wrapFetch } = require('..')
const { useFaultServer } = require('./helpers.js')

const ctx = useFaultServer(test, { RW_TEST_FLAP_KEY: 'sk-flap' })

const ANSWER = (model) => `answer from ${model}: w1 w2 w3 w4 w5 w6`
const RUNS = 10
const REQUESTS = 20
const EVERY_MS = 4000
const DOWN_MS = 60000
/** The primary must serve again within this long after its recovery. */
const BACK_WITHIN_MS = 30000

function policy(primary, backup) {
  const base = `${ctx.fs.base}/v1`
  return {
    max_attempts: 3,
    deadline_ms: 30000,
    upstreams: {
      primary: { provider: 'fault', model: primary, base_url: base, api_key_env: 'RW_TEST_FLAP_KEY', capabilities: ['streaming'] },
      backup: { provider: 'fault-b', model: backup, base_url: base, api_key_env: 'RW_TEST_FLAP_KEY', capabilities: ['streaming'] },
    },
    models: { [primary]: 'chat' },
    routes: { chat: { candidates: ['primary', 'backup'] } },
  }
}

/** One user's requests on a fixed schedule: [ms since start, the model that answered] each. */
async function user(seed) {
  const primary = `fb-flap:down=${DOWN_MS + seed}`
  const engine = new Engine(policy(primary, `fb-ok:id=backup${seed}`), { seed })
  const client = new OpenAI({ apiKey: 'sk-caller', baseURL: `${ctx.fs.base}/v1`, maxRetries: 0, fetch: wrapFetch(engine, fetch) })
  const served = []
  const t0 = performance.now()
  // The primary served again since its recovery (this client's clock: the outage began at its first request).
  const back = () => served.some(([at, model]) => at >= DOWN_MS + seed && model === primary)
  for (let i = 0; i < REQUESTS || (!back() && i * EVERY_MS < DOWN_MS + seed + BACK_WITHIN_MS); i++) {
    const wait = t0 + i * EVERY_MS - performance.now()
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    const r = await client.chat.completions.create({ model: primary, messages: [{ role: 'user', content: 'hi' }] })
    assert.equal(r.choices[0].message.content, ANSWER(r.model))
    served.push([performance.now() - t0, r.model])
  }
  return { primary, served, stats: engine.stats() }
}

test('a 60 s outage of the primary, 10 runs: the fallback serves it, the primary is back within 30 s of its recovery in each', { timeout: 200000 }, async () => {
  await ctx.fs.reset()
  const runs = await Promise.all(Array.from({ length: RUNS }, (_, i) => user(i + 1)))
  const rows = await ctx.fs.requests()
  const summary = []
  for (const [i, { primary, served, stats }] of runs.entries()) {
    const seed = i + 1
    const mine = rows.filter((r) => r.model === primary)
    const upAt = mine[0].at_ms + DOWN_MS + seed // the server's clock: the outage ends here
    assert.ok(served.length >= REQUESTS, `run ${seed}: ${served.length} requests`)
    assert.deepEqual(stats.stops, {})
    const answers = mine.filter((r) => r.status === 200)
    assert.ok(
      answers.every((r) => r.at_ms >= upAt),
      `run ${seed}`,
    )
    const inOutage = mine.filter((r) => r.at_ms < upAt).length
    const requestsInOutage = served.filter(([at]) => at < DOWN_MS).length
    // Without a breaker every request of the outage costs the primary
    // attempts_per_upstream (2) attempts.
    assert.ok(inOutage < 2 * requestsInOutage, `run ${seed}: ${inOutage} primary attempts for ${requestsInOutage} requests`)
    assert.ok(answers.length > 0, `run ${seed}: the primary never served again`)
    const backAfterMs = answers[0].at_ms - upAt
    assert.ok(backAfterMs < BACK_WITHIN_MS, `run ${seed}: back after ${backAfterMs} ms`)
    assert.equal(served.at(-1)[1], primary)
    summary.push([seed, inOutage, requestsInOutage, Math.round(backAfterMs), served.length])
  }
  console.log(`seed, primary attempts in the outage, requests in the outage, back after ms, requests: ${JSON.stringify(summary)}`)
})
