'use strict'
// Provider rate limits end to end, with the default policy: the real `openai` SDK
// (maxRetries: 0) over wrapFetch against the fault server's `fb-ratelimit`, which
// enforces L requests per window — fixed windows or a token bucket refilled
// continuously — and states it as one provider family does: OpenAI, Anthropic and
// IETF headers (limit, remaining, reset), Azure's remaining count alone (and
// `retry-after-ms` on a 429), or Gemini's nothing at all (a 429's body says when).
// The same matrix as bindings-python/tests/test_ratelimit_e2e.py. Two owners per
// case, each on its own model name (so its own limit), offered the same load: 2 L
// requests per window, evenly spaced, for 3 windows:
// - jitter-only: retries on 429 with jittered backoff (Retry-After honoured), no
//   budget, no breaker, rate limits off;
// - retrywise with the default policy: an attempt the window has no room for waits
//   for its slot before it is sent (StoppedError.waitMs, waited out by wrapFetch),
//   or stops cleanly when the slot is past its deadline.
// From the fault server's request log: 429s per owner, and requests answered in
// each window of the offered period. Asserted, per case: retrywise sends at most
// 1 % (floor) of jitter-only's 429s where the provider states its limit (10 % after
// the first window where it states nothing), completes at least 90 % of L in the
// steady windows (every one after the first; the target, 95 %, is measured by
// bench/run-all on a quiet machine), and every request is answered or ends with a
// clean reason within its deadline.
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

const MESSAGES = [{ role: 'user', content: 'hi' }]
const KEY_ENV = 'RW_TEST_RATELIMIT_KEY'
process.env[KEY_ENV] = 'sk-fault-test'
// Slack on a request's deadline for the event loop and the SDK around wrapFetch.
const DEADLINE_SLACK_MS = 1000

const STATED = ['openai', 'anthropic', 'ietf']
const FAMILIES = [...STATED, 'azure', 'gemini']
const CASES = FAMILIES.flatMap((family) =>
  ['fixed', 'bucket'].map((mode) => ({ family, mode, limit: 20, windowMs: 6000, windows: 3, deadlineMs: 6000 })),
)
// How a paced request that gets no slot ends: its slot is past its deadline
// (refused before it waits), or its deadline passed while it waited.
const CLEAN_STOPS = ['retry_after_exceeds_deadline', 'rate_limited', 'deadline_exceeded']
const OWNERS = {
  'jitter-only': { budget: { enabled: false }, breaker: { enabled: false }, rate_limits: { enabled: false } },
  retrywise: {},
}

function policy(model, c, owner) {
  return {
    max_attempts: 5,
    deadline_ms: c.deadlineMs,
    upstreams: { primary: { provider: 'fault', model, base_url: `${fs.base}/v1`, api: 'openai', api_key_env: KEY_ENV } },
    models: { [model]: 'chat' },
    routes: { chat: { candidates: ['primary'] } },
    ...owner,
  }
}

/** The clean reason a request ended with: the stop reason, or the provider's status. */
function reasonOf(err) {
  for (let e = err; e; e = e.cause) {
    if (e instanceof StoppedError) return e.reason
    if (e instanceof OpenAI.APIError && e.status) return `status ${e.status}`
    // openai-node rethrows any fetch rejection whose text says "timeout" or "timed out"
    // (a stop of class `timeout`: an attempt that ran into the deadline) as its own
    // APIConnectionTimeoutError, without the cause.
    if (e instanceof OpenAI.APIConnectionTimeoutError) return 'deadline_exceeded'
  }
  throw err
}

/** 2 L requests per window for `windows` windows, evenly spaced from t0. */
async function offer(client, model, c, t0) {
  const n = 2 * c.limit * c.windows
  const gap = c.windowMs / (2 * c.limit)
  const one = async (i) => {
    await new Promise((r) => setTimeout(r, Math.max(0, t0 + i * gap - performance.now())))
    const start = performance.now()
    try {
      const r = await client.chat.completions.create({ model, messages: MESSAGES })
      assert.ok(r.choices[0].message.content.startsWith(`answer from ${model}:`))
      return { ok: true, reason: null, elapsedMs: performance.now() - start }
    } catch (err) {
      return { ok: false, reason: reasonOf(err), elapsedMs: performance.now() - start }
    }
  }
  return Promise.all(Array.from({ length: n }, (_, i) => one(i)))
}

/** What the fault server saw of one model: sent, 429s (after the first window), answered per window. */
function tally(rows, model, c) {
  rows = rows.filter((r) => r.model === model)
  const first = rows[0].at_ms
  const perWindow = new Array(c.windows).fill(0)
  let later = 0
  for (const r of rows) {
    const k = Math.floor((r.at_ms - first) / c.windowMs)
    if (r.status === 200 && k < c.windows) perWindow[k] += 1
    if (r.status === 429 && k >= 1) later += 1
  }
  return { sent: rows.length, rejected: rows.filter((r) => r.status === 429).length, later, perWindow }
}

/** What one case got wrong (empty: nothing). */
function check(c, jitter, paced, outcomes) {
  const wrong = []
  const offered = 2 * c.limit * c.windows
  for (const os of outcomes) {
    if (os.length !== offered) wrong.push(`${os.length} outcomes of ${offered}`)
    const late = os.filter((o) => o.elapsedMs > c.deadlineMs + DEADLINE_SLACK_MS)
    if (late.length) wrong.push(`past the deadline: ${JSON.stringify(late.slice(0, 3))}`)
  }
  // Where the provider states nothing, a request refused in the first window whose
  // retry does not fit its deadline gets the provider's own 429.
  const stated = STATED.includes(c.family)
  const clean = stated ? CLEAN_STOPS : [...CLEAN_STOPS, 'status 429']
  for (const o of outcomes[1]) if (!o.ok && !clean.includes(o.reason)) wrong.push(`unclean stop ${o.reason}`)
  // The limit is real (a bucket, full at first, may answer twice it in the first window).
  const cap = c.mode === 'fixed' ? c.limit : 2 * c.limit
  if (Math.max(...jitter.perWindow, ...paced.perWindow) > cap) wrong.push(`over the limit: ${jitter.perWindow} ${paced.perWindow}`)
  if (jitter.rejected < c.limit) wrong.push(`the load does not overload: jitter-only got ${jitter.rejected} 429s`)
  if (stated && paced.rejected > Math.floor(jitter.rejected / 100)) {
    wrong.push(`${paced.rejected} 429s against jitter-only's ${jitter.rejected} (at most 1 %)`)
  }
  if (!stated && paced.later > Math.floor(jitter.rejected / 10)) {
    wrong.push(`${paced.later} 429s after the first window against jitter-only's ${jitter.rejected} (at most 10 %)`)
  }
  // 95 % of L is the target (met on a quiet machine: bench/run-all, BENCHMARKS.md); CI
  // runs the Python suite beside this one on two cores, where a wait's timer fires
  // late and a few more requests reach their deadline: 90 % here.
  const steady = paced.perWindow.slice(1)
  const share = 0.9
  if (steady.reduce((a, b) => a + b, 0) < share * c.limit * steady.length) wrong.push(`steady windows ${steady} below ${share * 100} % of ${c.limit}`)
  return wrong
}

// The families that state their limit, then the others: all ten cases at once,
// with the Python suite running beside this one in CI, left the event loop late
// enough that waits ran past their deadlines.
const BATCHES = [STATED, ['azure', 'gemini']]

test('the default policy paces every family, fixed windows and buckets', async () => {
  const failures = []
  for (const families of BATCHES) {
    await fs.reset()
    const t0 = performance.now() + 300
    const runs = CASES.filter((c) => families.includes(c.family)).flatMap((c) =>
      Object.entries(OWNERS).map(([name, owner]) => {
        const model = `fb-ratelimit:rpm=${c.limit}:window=${c.windowMs}:family=${c.family}:mode=${c.mode}:id=${name}`
        const engine = new Engine(policy(model, c, owner), { seed: 11 })
        const client = new OpenAI({ apiKey: 'sk-caller', baseURL: `${fs.base}/v1`, maxRetries: 0, fetch: wrapFetch(engine, fetch) })
        return { c, model, done: offer(client, model, c, t0) }
      }),
    )
    const outcomes = await Promise.all(runs.map((r) => r.done))
    const rows = await fs.requests()
    for (let i = 0; i < runs.length; i += 2) {
      const c = runs[i].c
      const [jitter, paced] = [runs[i], runs[i + 1]].map((r) => tally(rows, r.model, c))
      const stops = {}
      for (const o of outcomes[i + 1]) if (o.reason) stops[o.reason] = (stops[o.reason] ?? 0) + 1
      // The numbers BENCHMARKS.md reports.
      console.log(
        `${c.family}-${c.mode}: L=${c.limit}/${c.windowMs} ms, offered ${2 * c.limit * c.windows} per owner\n` +
          `  jitter-only: ${jitter.rejected} 429s of ${jitter.sent} sent, per window [${jitter.perWindow}]\n` +
          `  retrywise:   ${paced.rejected} 429s (${paced.later} after the first window) of ${paced.sent} sent, per window [${paced.perWindow}], stops ${JSON.stringify(stops)}`,
      )
      for (const w of check(c, jitter, paced, [outcomes[i], outcomes[i + 1]])) failures.push(`${c.family}-${c.mode}: ${w}`)
    }
  }
  assert.deepEqual(failures, [])
})
