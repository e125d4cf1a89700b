'use strict'
// The sixteen-fault failover scoreboard, shared by failover.e2e.test.js (the
// openai SDK over wrapFetch, JSON and streamed; engine.run with the SDK per
// attempt) and anthropic.e2e.test.js (@anthropic-ai/sdk over wrapFetch).
//
// Every fault meets the README's multi-provider wiring on the fault server: a
// primary and a backup (each its wire family, its key variable, the README's
// complete `capabilities` lists and a declared `context_tokens`), 3 attempts,
// `stream_recovery: continue`, every other knob at its default but the
// silence limits, kept short where the path is not about them. The backup's
// window is the larger here (the README's deepseek backup declares 64 000
// tokens, where a context-length refusal rightly stops: no larger window):
// a context-length refusal is rescued by moving to it. The sixteen
// faults of one path run side by side, each on its own engine and its own
// fault models (`:id=<path>-<n>`), so a path costs about its slowest fault (the
// flapping primary, ~3.5 s).
//
// A fault is rescued when the caller gets the whole answer (from the primary,
// from the backup, or spliced from both), except for the content filter,
// where the rescue is a clean error naming the provider's reason after one
// attempt; the fallback-accounting fault also needs the engine's stats to
// count the fallback and the attempts exactly.
const { Engine } = require('..')

const ANSWER = (model) => `answer from ${model}: w1 w2 w3 w4 w5 w6`

/** The sixteen faults, in the methodology's order: the primary's model (and the backup's, when not `fb-ok`). */
const FAULTS = [
  { name: '429 with Retry-After', primary: 'fb-429-retry-after' },
  { name: '429 without Retry-After', primary: 'fb-429' },
  { name: '500 once', primary: 'fb-500-once' },
  { name: '503 persistent', primary: 'fb-503' },
  { name: 'reset before headers', primary: 'fb-reset' },
  { name: 'silent upstream', primary: 'fb-silent' },
  // Long enough for every silence limit here, short enough for the server to let go soon.
  { name: 'slow first token', primary: 'fb-slow-first-token:ms=8000' },
  { name: 'stream cut', primary: 'fb-stream-cut:k=3' },
  { name: 'stream stall', primary: 'fb-stream-stall:k=3' },
  { name: 'malformed SSE event', primary: 'fb-malformed-sse' },
  { name: 'no [DONE]', primary: 'fb-no-done' },
  { name: 'context length', primary: 'fb-context-length' },
  { name: 'content filter', primary: 'fb-content-filter', refusal: /reason: hate/ },
  // A stream cut after text, and a backup that declares assistant_prefill but refuses it.
  { name: 'fallback that rejects prefill', primary: 'fb-stream-cut:k=3', backup: 'fb-no-prefill' },
  { name: 'a primary that flaps', primary: 'fb-flap:down=1500', flap: true },
  { name: 'fallback accounting', primary: 'fb-503', accounting: true },
]

/** The flapping primary: one request every FLAP_EVERY_MS for FLAP_FOR_MS (its outage is 1.5 s from its first request). */
const FLAP_EVERY_MS = 250
const FLAP_FOR_MS = 3500

/**
 * The README's multi-provider wiring, pointed at the fault server.
 * @param {object} o
 * @param {string} o.base the fault server's `/v1`
 * @param {'openai' | 'anthropic'} o.api
 * @param {string} o.requestModel the model the caller asks for (mapped to the route)
 * @param {string} o.primary
 * @param {string} o.backup
 * @param {number} o.deadlineMs
 * @param {object} o.timeouts
 */
function readmePolicy({ base, api, requestModel, primary, backup, deadlineMs, timeouts }) {
  return {
    max_attempts: 3,
    deadline_ms: deadlineMs,
    timeouts,
    upstreams: {
      primary: { provider: api === 'anthropic' ? 'anthropic' : 'openai', model: primary, api, base_url: base, api_key_env: 'RW_TEST_PRIMARY_KEY', context_tokens: api === 'anthropic' ? 200000 : 128000, capabilities: ['streaming', 'tool_calling', 'json_schema', 'json_mode', 'vision', 'file_input'] },
      backup: { provider: 'backup', model: backup, api, base_url: base, api_key_env: 'RW_TEST_BACKUP_KEY', context_tokens: 1000000, capabilities: ['streaming', 'tool_calling', 'json_mode', 'assistant_prefill'] },
    },
    routes: { chat: { candidates: ['primary', 'backup'], stream_recovery: 'continue' } },
    models: { [requestModel]: 'chat' },
  }
}

/**
 * One fault through one path: what the caller got, what the server saw, a verdict.
 * @param {{ fs: any }} ctx the file's fault server
 * @param {Path} path
 * @param {typeof FAULTS[number]} fault
 * @returns {Promise<{ rescued: boolean, note: string }>}
 */
async function runFault(ctx, path, fault, n) {
  // Models of their own: a fault's counters, flap window and records are its own.
  const primary = `${fault.primary}:id=${path.tag}-${n}`
  const backup = `${fault.backup || 'fb-ok'}:id=${path.tag}-${n}`
  const engine = new Engine(readmePolicy({ base: `${ctx.fs.base}/v1`, api: path.api, requestModel: path.requestModel, primary, backup, deadlineMs: path.deadlineMs, timeouts: path.timeouts }), { seed: 16 })
  const ask = path.asker(engine)
  const mine = async () => (await ctx.fs.requests()).filter((r) => r.model === primary || r.model === backup)
  const tally = (rows) => `${rows.filter((r) => r.model === primary).length}+${rows.filter((r) => r.model === backup).length} attempts`
  const whole = (text) => text === ANSWER(primary) || text === ANSWER(backup)
  const who = (text) => (text === ANSWER(primary) ? 'the primary' : 'the backup')

  if (fault.flap) {
    // Every request answered, nothing the primary answered came from its
    // outage, and the primary serves again soon after it recovers.
    const served = []
    const t0 = performance.now()
    while (performance.now() - t0 < FLAP_FOR_MS) {
      try {
        const r = await ask()
        served.push(whole(r.text) ? (r.text === ANSWER(primary) ? 'P' : 'B') : '?')
      } catch (err) {
        served.push(`!${errorText(err)}`)
      }
      await new Promise((resolve) => setTimeout(resolve, FLAP_EVERY_MS))
    }
    const rows = await mine()
    const ofPrimary = rows.filter((r) => r.model === primary)
    const upAt = ofPrimary[0].at_ms + 1500
    const early = ofPrimary.filter((r) => r.status === 200 && r.at_ms < upAt).length
    const rescued = served.every((s) => s === 'P' || s === 'B') && early === 0 && served.at(-1) === 'P'
    return { rescued, note: `served ${served.join('')}, ${tally(rows)}, ${early} primary answers inside its outage` }
  }

  const t0 = performance.now()
  let got = null
  let error = null
  try {
    got = await ask()
  } catch (err) {
    error = err
  }
  const ms = Math.round(performance.now() - t0)
  const rows = await mine()
  const stats = engine.stats()
  if (fault.refusal) {
    const rescued = error !== null && fault.refusal.test(errorText(error)) && rows.length === 1 && stats.attempts === 1
    return { rescued, note: `${error ? `error "${errorText(error).slice(0, 120)}"` : `answered "${got.text}"`}, ${tally(rows)}, ${ms} ms` }
  }
  if (error !== null) return { rescued: false, note: `error ${errorText(error)}, ${tally(rows)}, ${ms} ms` }
  if (!whole(got.text)) return { rescued: false, note: `text "${got.text}", ${tally(rows)}, ${ms} ms` }
  // A rescue that waited out more than the path's silence limits allow came too late.
  if (ms > path.withinMs) return { rescued: false, note: `too late: ${ms} ms > ${path.withinMs} ms, ${tally(rows)}` }
  let note = `answered by ${who(got.text)}, ${tally(rows)}, ${ms} ms`
  if (fault.accounting) {
    // The engine counts what the server saw: one logical request, two attempts
    // on the primary, one fallback and one attempt on the backup, one success.
    const counted = {
      logical: stats.logical_requests,
      attempts: stats.attempts,
      fallbacks: stats.fallbacks,
      successes: stats.successes,
      primary: stats.per_upstream.primary?.attempts,
      backup: stats.per_upstream.backup?.attempts,
      served: [rows.filter((r) => r.model === primary).length, rows.filter((r) => r.model === backup).length],
    }
    const exact = JSON.stringify(counted) === JSON.stringify({ logical: 1, attempts: 3, fallbacks: 1, successes: 1, primary: 2, backup: 1, served: [2, 1] })
    const usage = got.usage === undefined || (got.usage !== null && got.usage > 0)
    note += `, stats ${JSON.stringify(counted)}, usage ${got.usage}`
    return { rescued: exact && usage && got.text === ANSWER(backup), note }
  }
  return { rescued: true, note }
}

/** An error's message with its causes'. */
function errorText(err) {
  const parts = []
  for (let e = err, i = 0; e && i < 4; e = e.cause, i++) parts.push(e.message ? String(e.message) : String(e))
  return parts.join(' <- ')
}

/**
 * @typedef {object} Path
 * @property {string} tag names the path's fault models (`:id=<tag>-<n>`)
 * @property {'openai' | 'anthropic'} api
 * @property {string} requestModel
 * @property {number} deadlineMs
 * @property {object} timeouts the policy's `timeouts`
 * @property {number} withinMs the longest a rescued answer may take
 * @property {(engine: Engine) => () => Promise<{ text: string, usage?: number | null }>} asker one request as the caller makes it
 */

/**
 * Runs the sixteen faults through `path` side by side (after a reset of the
 * server); resolves `{ rescued, board }`: how many were rescued, and one line per fault.
 * @param {{ fs: any }} ctx
 * @param {Path} path
 */
async function scoreboard(ctx, path) {
  await ctx.fs.reset()
  const t0 = performance.now()
  const verdicts = await Promise.all(FAULTS.map((f, i) => runFault(ctx, path, f, i + 1)))
  const wallMs = Math.round(performance.now() - t0)
  const board = verdicts.map((v, i) => `${String(i + 1).padStart(2)} ${FAULTS[i].name}: ${v.rescued ? 'rescued' : 'NOT RESCUED'} (${v.note})`)
  return { rescued: verdicts.filter((v) => v.rescued).length, board: `${path.tag} (${wallMs} ms)\n${board.join('\n')}` }
}

module.exports = { FAULTS, ANSWER, readmePolicy, scoreboard }
