#!/usr/bin/env node
// Runs the conformance vectors (tests/vectors/*.json, format 1) through the
// Node binding's public API with a manual clock and a fixed seed.
//
//   node tests/vectors/run_node.mjs [NAME ...]        # exit 1 on any mismatch
//
// RETRYWISE_NODE_PACKAGE names the built package (default: bindings-node).
// Every runner (Rust, Python, Node, C) builds the same canonical view of each
// result and compares it with the vector's expectations using the same rules:
// a subset match (keys absent from `expect` are not checked), `null` matches
// an absent value, integers are exact and other numbers within 1e-9, and `{i}`
// in a `repeat` step's strings is the 0-based iteration. See README.md.

import { readFileSync, readdirSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const HERE = process.env.RETRYWISE_VECTORS_DIR ?? dirname(fileURLToPath(import.meta.url))
const PKG = resolve(process.env.RETRYWISE_NODE_PACKAGE ?? join(dirname(fileURLToPath(import.meta.url)), '../../bindings-node'))
const FORMAT = 1

// The environment kill switch must not leak into replayed decisions.
delete process.env.RETRYWISE_DISABLE

const rw = createRequire(import.meta.url)(PKG)
const { Engine, PolicyError } = rw
const StoppedError = rw.StoppedError ?? rw.Stopped

// ------------------------------------------------------------------ compare --

const dumps = (v) => JSON.stringify(v === undefined ? null : sortKeys(v))
function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys)
  if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]))
  return v
}

function compare(path, expected, actual, out) {
  if (actual === undefined) actual = null
  if (expected !== null && typeof expected === 'object' && !Array.isArray(expected)) {
    if (actual === null || typeof actual !== 'object' || Array.isArray(actual)) {
      out.push([path, dumps(expected), dumps(actual)])
      return
    }
    for (const [k, ev] of Object.entries(expected)) compare(path ? `${path}.${k}` : k, ev, actual[k], out)
  } else if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      out.push([path, dumps(expected), dumps(actual)])
      return
    }
    expected.forEach((e, i) => compare(`${path}[${i}]`, e, actual[i], out))
  } else if (typeof expected === 'number') {
    const a = typeof actual === 'bigint' ? Number(actual) : actual
    const ok = typeof a === 'number' && (Number.isInteger(expected) && Number.isInteger(a) ? expected === a : Math.abs(expected - a) <= 1e-9)
    if (!ok) out.push([path, dumps(expected), dumps(a)])
  } else if (expected !== actual) {
    out.push([path, dumps(expected), dumps(actual)])
  }
}

function substitute(v, i) {
  if (typeof v === 'string') return v.replaceAll('{i}', String(i))
  if (Array.isArray(v)) return v.map((x) => substitute(x, i))
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, substitute(x, i)]))
  return v
}

// --------------------------------------------------------- canonical views --

// First defined property among the names given (camelCase binding names first).
function pick(obj, ...names) {
  for (const n of names) if (obj != null && obj[n] !== undefined) return obj[n]
  return null
}
const num = (v) => (typeof v === 'bigint' ? Number(v) : v)

function headersObject(h) {
  if (h == null) return {}
  if (typeof h.entries === 'function' && !Array.isArray(h)) return Object.fromEntries([...h.entries()].map(([k, v]) => [String(k), String(v)]))
  if (Array.isArray(h)) return Object.fromEntries(h.map(([k, v]) => [String(k), String(v)]))
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k, String(v)]))
}

function canonAttempt(a) {
  const t = pick(a, 'timeouts') ?? {}
  const headers = headersObject(pick(a, 'headers'))
  return {
    number: num(pick(a, 'number')),
    upstream: pick(a, 'upstream'),
    fallback: pick(a, 'fallback'),
    hedge: pick(a, 'hedge'),
    remaining_ms: num(pick(a, 'remainingMs', 'remaining_ms')),
    // The Node Attempt carries the key only as its `idempotency-key` header.
    idempotency_key: pick(a, 'idempotencyKey', 'idempotency_key') ?? headers['idempotency-key'] ?? null,
    timeouts_ms: {
      connect: num(pick(t, 'connectMs', 'connect_ms', 'connect')),
      first_byte: num(pick(t, 'firstByteMs', 'first_byte_ms', 'firstByte')),
      first_token: num(pick(t, 'firstTokenMs', 'first_token_ms', 'firstToken')),
      idle: num(pick(t, 'idleMs', 'idle_ms', 'idle')),
      total: num(pick(t, 'totalMs', 'total_ms', 'total')),
    },
    headers,
  }
}

function canonStop(s) {
  return {
    stop: {
      reason: pick(s, 'reason'),
      class: pick(s, 'errorClass', 'error_class', 'class'),
      on_failure: pick(s, 'onFailure', 'on_failure'),
      detail: pick(s, 'detail'),
      wait_ms: num(pick(s, 'waitMs', 'wait_ms')),
    },
  }
}

function canonExcluded(x) {
  if (x == null) return {}
  if (Array.isArray(x)) return Object.fromEntries(x.map((e) => (Array.isArray(e) ? e : [e.upstream, e.reason ?? e.why])))
  return { ...x }
}

function canonDecision(d) {
  return {
    action: pick(d, 'action'),
    delay_ms: num(pick(d, 'delayMs', 'delay_ms')),
    class: pick(d, 'errorClass', 'error_class', 'class'),
    reason: pick(d, 'reason'),
    upstream: pick(d, 'upstream'),
    wait_source: pick(d, 'waitSource', 'wait_source'),
    retry_after_ms: num(pick(d, 'retryAfterMs', 'retry_after_ms')),
    on_failure: pick(d, 'onFailure', 'on_failure'),
    detail: pick(d, 'detail'),
    attempt: num(pick(d, 'attempt')),
    hedge: pick(d, 'hedge'),
    excluded: canonExcluded(pick(d, 'excluded')),
    continuation: pick(d, 'continuation'),
  }
}

// The Node binding names the core's HedgePlan::After `{ action: 'wait', delayMs }`.
function canonHedge(p) {
  const action = pick(p, 'action')
  if (action === 'start') return { action, attempt: canonAttempt(pick(p, 'attempt')) }
  if (action === 'after' || action === 'wait') return { action: 'after', after_ms: num(pick(p, 'afterMs', 'after_ms', 'delayMs')) }
  return { action, reason: pick(p, 'reason') }
}

// A `request` object (`url`, `headers` object, `body` text) read as a drop-in transport reads it.
function factsOf(r) {
  return rw.readRequest(r.url ?? '', r.headers ?? {}, r.body ?? '')
}

// The canonical view of `read_request`: family, endpoint, model and the needs,
// capabilities joined with commas in the order read.
function canonRequest(step) {
  const f = factsOf(step)
  const n = f.needs
  return {
    family: f.family,
    endpoint: f.endpoint,
    model: f.model,
    needs: {
      capabilities: (n.capabilities ?? []).join(','),
      api: n.api ?? null,
      input_tokens: n.inputTokens ?? null,
      max_output_tokens: n.maxOutputTokens ?? null,
    },
  }
}

// Vector spec (snake_case) -> the binding's camelCase begin() options.
function beginOptions(spec) {
  const o = {}
  const map = {
    route: 'route', deadline_ms: 'deadlineMs', idempotency: 'idempotency', tenant: 'tenant', task: 'task',
    priority: 'priority', idempotency_key: 'idempotencyKey', params: 'params', inbound_headers: 'inboundHeaders',
  }
  for (const [k, v] of Object.entries(spec)) {
    if (k === 'needs') {
      o.needs = {}
      const n = { capabilities: 'capabilities', api: 'api', input_tokens: 'inputTokens', max_output_tokens: 'maxOutputTokens', data_boundary: 'dataBoundary', max_cost: 'maxCost' }
      for (const [nk, nv] of Object.entries(v)) o.needs[n[nk] ?? nk] = nv
    } else if (k === 'request') {
      // Read as the drop-in transports read it; the spec's needs go on top.
      o.request = factsOf(v)
    } else {
      o[map[k] ?? k] = v
    }
  }
  return o
}

function reportOptions(outcome) {
  const map = { vendor_code: 'vendorCode', input_tokens: 'inputTokens', first_token_ms: 'firstTokenMs' }
  return Object.fromEntries(Object.entries(outcome).map(([k, v]) => [map[k] ?? k, v]))
}

/** A `stream_gate` step's view: what the consumer saw, and the phase a failure would have now. */
function canonGate(step) {
  const g = new rw.StreamGate(step.content_type)
  const parts = (step.chunks ?? []).map((c) => Buffer.from(g.feed(Buffer.from(c, 'utf8'))))
  if (step.finish) parts.push(Buffer.from(g.finish()))
  return { released: Buffer.concat(parts).toString('utf8'), phase: g.phase }
}

// ------------------------------------------------------------------ runner --

class Run {
  constructor(name, engine) {
    this.name = name
    this.engine = engine
    this.calls = new Map()
    this.mismatches = []
  }

  fail(step, field, expected, actual) {
    this.mismatches.push(`vector ${this.name} step ${step}: ${field}: expected ${expected}, got ${actual}`)
  }

  // `{"ok": true}` or `{"ok": false, "error": message}` against `expect` (default
  // `{"ok": true}`), whose `error_contains` checks a part of the message.
  checkResult(label, expected, actual) {
    const exp = { ...(expected ?? { ok: true }) }
    const needle = exp.error_contains
    delete exp.error_contains
    if (needle !== undefined && !(actual.error ?? '').includes(needle)) this.fail(label, 'error_contains', dumps(needle), dumps(actual.error ?? ''))
    this.check(label, exp, actual)
  }

  check(step, expected, actual) {
    if (expected == null) return
    const exp = { ...expected }
    const diffs = []
    if (exp.delay_within_ms !== undefined) {
      const [lo, hi] = exp.delay_within_ms
      delete exp.delay_within_ms
      const d = actual.delay_ms
      if (!(Number.isInteger(d) && d >= lo && d <= hi)) diffs.push(['delay_within_ms', dumps([lo, hi]), dumps(d)])
    }
    compare('', exp, actual, diffs)
    for (const [f, e, a] of diffs) this.fail(step, f, e, a)
  }

  steps(steps, prefix = '') {
    steps.forEach((s, i) => this.step(s, prefix ? `${prefix}.${i}` : String(i)))
  }

  step(step, base) {
    const op = step.op ?? ''
    const call = step.call ?? ''
    const label = call ? `${base} (${op} ${call})` : `${base} (${op})`
    try {
      this.doStep(step, op, call, base, label)
    } catch (e) {
      this.fail(label, 'exception', 'no exception', `${e?.name}: ${e?.message}`)
    }
  }

  doStep(step, op, call, base, label) {
    switch (op) {
      case 'advance':
        this.engine.advanceClock(step.ms ?? 0)
        break
      case 'begin': {
        // begin refuses a route the policy does not know (a PolicyError): a
        // `begin` expecting `{"ok": false}` checks the error.
        const opts = beginOptions(step.spec ?? {})
        let actual
        let c = null
        try {
          c = this.engine.begin(opts)
          actual = { ok: true }
        } catch (e) {
          if (!(e instanceof PolicyError)) throw e
          actual = { ok: false, error: String(e.message) }
        }
        this.checkResult(label, step.expect, actual)
        if (c !== null) this.calls.set(call, c)
        break
      }
      case 'read_request':
        this.check(label, step.expect, canonRequest(step))
        break
      case 'next_attempt': {
        const c = this.calls.get(call)
        let actual
        try {
          actual = canonAttempt(c.nextAttempt())
        } catch (e) {
          if (!(StoppedError && e instanceof StoppedError)) throw e
          actual = canonStop(e)
        }
        this.checkAttempt(label, step.expect, actual)
        break
      }
      case 'report': {
        // `attempt`: report that attempt (hedging), else the latest in flight.
        const o = reportOptions(step.outcome ?? {})
        if (step.attempt !== undefined) o.attempt = step.attempt
        const d = this.calls.get(call).report(o)
        this.check(label, step.expect, canonDecision(d))
        break
      }
      case 'next_hedge':
        this.check(label, step.expect, canonHedge(this.calls.get(call).nextHedge()))
        break
      case 'cancel':
        this.check(label, step.expect, canonDecision(this.calls.get(call).cancel()))
        break
      case 'reload': {
        let actual
        try {
          this.engine.reload(step.policy ?? {})
          actual = { ok: true }
        } catch (e) {
          actual = { ok: false, error: String(e?.message ?? e) }
        }
        this.checkResult(label, step.expect, actual)
        break
      }
      case 'set_mode': {
        const m = step.mode ?? {}
        this.engine.setMode({ retries: m.retries ?? true, fallback: m.fallback ?? true, hedging: m.hedging ?? true })
        break
      }
      case 'stream_gate':
        this.check(label, step.expect, canonGate(step))
        break
      case 'stats':
        this.check(label, step.expect, this.engine.stats())
        break
      case 'repeat':
        for (let i = 0; i < (step.times ?? 0); i++) this.steps((step.steps ?? []).map((s) => substitute(s, i)), `${base}[${i}]`)
        break
      default:
        this.fail(label, 'op', 'a known op', dumps(op))
    }
  }

  checkAttempt(label, expected, actual) {
    if (expected == null) return
    const wantsStop = 'stop' in expected
    const gotStop = 'stop' in actual
    if (wantsStop !== gotStop) {
      const e = wantsStop ? `stop ${dumps(expected.stop)}` : `attempt ${dumps(expected)}`
      const a = gotStop ? `stop ${dumps(actual.stop)}` : `attempt ${dumps(actual)}`
      this.fail(label, 'result', e, a)
      return
    }
    this.check(label, expected, actual)
  }
}

// A vector with `skip` (a known core bug) is reported and not run, unless RETRYWISE_VECTORS_RUN_SKIPPED=1.
const RUN_SKIPPED = process.env.RETRYWISE_VECTORS_RUN_SKIPPED === '1'

function runVector(file) {
  const v = JSON.parse(readFileSync(file, 'utf8'))
  const stem = file.split('/').pop().replace(/\.json$/, '')
  if (v.format !== FORMAT) return [`vector ${stem}: format must be ${FORMAT}`]
  if (v.name !== stem) return [`vector ${stem}: name ${JSON.stringify(v.name)} differs from the file name`]
  if (v.skip !== undefined && !RUN_SKIPPED) return { skipped: String(v.skip) }
  let engine
  try {
    engine = new Engine(v.policy ?? {}, { seed: v.seed, manualClock: true })
  } catch (e) {
    return [`vector ${v.name}: engine: ${e?.name}: ${e?.message}`]
  }
  const run = new Run(v.name, engine)
  run.steps(v.steps ?? [])
  return run.mismatches
}

const only = process.argv.slice(2)
const files = readdirSync(HERE)
  .filter((f) => f.endsWith('.json') && (only.length === 0 || only.includes(f.replace(/\.json$/, ''))))
  .sort()
  .map((f) => join(HERE, f))
if (files.length === 0) {
  console.error(`no vectors in ${HERE}`)
  process.exit(2)
}
let failed = 0
let skipped = 0
const problems = []
for (const f of files) {
  const ms = runVector(f)
  if (!Array.isArray(ms)) {
    skipped++
    console.log(`vector ${f.split('/').pop().replace(/\.json$/, '')} skipped: ${ms.skipped}`)
    continue
  }
  if (ms.length) failed++
  problems.push(...ms)
}
for (const m of problems) console.log(m)
console.log(`node: ${files.length} vectors, ${files.length - failed - skipped} passed, ${failed} failed, ${problems.length} mismatches, ${skipped} skipped`)
process.exit(problems.length ? 1 : 0)
