'use strict'
// The README's quickstart as a program: node examples/quickstart.js [URL]
// (an OpenAI-compatible chat completions endpoint; ci.sh runs it against a local one).
const { Engine, StoppedError } = require('retrywise')
const { setTimeout: sleep } = require('node:timers/promises')

const url = process.argv[2] ?? 'https://api.openai.com/v1/chat/completions'
const body = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] })
const headers = { 'content-type': 'application/json', authorization: `Bearer ${process.env.OPENAI_API_KEY ?? ''}` }

const engine = new Engine({ max_attempts: 3, deadline_ms: 20000 }) // or a JSON / YAML / TOML string, or Engine.fromFile(path)

/** One attempt's I/O, as the outcome retrywise judges. */
async function doIo(a) {
  try {
    const signal = AbortSignal.timeout(a.timeouts.totalMs)
    const res = await fetch(url, { method: 'POST', body, headers: { ...headers, ...a.headers }, signal })
    return { status: res.status, headers: res.headers, body: await res.text() }
  } catch (err) {
    return { error: err.name === 'TimeoutError' ? 'first_byte_timeout' : 'connect' }
  }
}

async function main() {
  // 1. The idiomatic loop: the core decides, run() sleeps and enforces the deadline.
  const text = await engine.run(
    async (attempt) => {
      const res = await fetch(url, { method: 'POST', body, headers: { ...headers, ...attempt.headers }, signal: attempt.signal })
      if (!res.ok) throw Object.assign(new Error(`HTTP ${res.status}`), { status: res.status, headers: res.headers })
      return res.text()
    },
    { route: 'openai/gpt-4o-mini', deadlineMs: 10000 },
  )
  console.log('run:', JSON.parse(text).choices[0].message.content)

  // 2. The explicit decision loop (what every binding exposes).
  const call = engine.begin({ route: 'openai/gpt-4o-mini', deadlineMs: 10000, idempotency: 'safe' })
  for (;;) {
    let a
    try {
      a = call.nextAttempt() // throws StoppedError { reason, errorClass, detail, onFailure, waitMs }
    } catch (e) {
      // waitMs set: not a stop but "not yet" (a paced slot, a breaker's probe): ask again after it.
      if (e instanceof StoppedError && e.waitMs != null) { await sleep(e.waitMs); continue }
      throw e
    }
    const outcome = await doIo(a) // { status, error, headers, phase, vendorCode, effect, inputTokens, body }
    const d = call.report(outcome) // { action, delayMs, errorClass, reason, upstream, waitSource, retryAfterMs, onFailure, detail, attempt, excluded }
    if (d.action === 'retry' || d.action === 'fallback') { await sleep(d.delayMs); continue }
    console.log('loop:', d.action, d.reason, `after ${call.attempts} attempt(s)`)
    break // succeeded, stop or reconcile
  }
  // No release(): the final decision freed the call; call.id, call.attempts, call.info() still answer.
}

main().catch((err) => {
  console.error(err)
  process.exitCode = 1
})
