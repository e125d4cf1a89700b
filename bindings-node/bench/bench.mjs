// Successful governed cycle, ns/op, retrywise vs cockatiel (retry + breaker
// wrap), opossum and p-retry, in one run. `npm run bench` (after the release build).
//
// Every library runs an async operation that succeeds at once, so the number
// is each library's own per-call overhead. retrywise is measured through its
// idiomatic APIs (engine.run, the explicit begin/nextAttempt/report loop) and
// through the lean native API they wrap.
import { createRequire } from 'node:module'
import { retry, circuitBreaker, wrap, handleAll, ConsecutiveBreaker, ExponentialBackoff } from 'cockatiel'
import pRetry from 'p-retry'
import { AsyncLocalStorage } from 'node:async_hooks'

const require = createRequire(import.meta.url)
const CircuitBreaker = require('opossum')
const rw = require('../index.js')
const native = require('../native.js')

const ROUNDS = Number(process.env.BENCH_ROUNDS || 7)
const ITER = Number(process.env.BENCH_ITER || 100_000)

const value = { ok: true }
const op = async () => value

async function measure(name, fn, iters = ITER) {
  // warm up (JIT, caches)
  for (let i = 0; i < Math.min(iters, 20_000); i++) await fn()
  const samples = []
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < iters; i++) await fn()
    samples.push(Number(process.hrtime.bigint() - t0) / iters)
  }
  samples.sort((a, b) => a - b)
  return { name, median: samples[Math.floor(samples.length / 2)], min: samples[0] }
}

function measureSync(name, fn, iters = ITER) {
  for (let i = 0; i < Math.min(iters, 20_000); i++) fn()
  const samples = []
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < iters; i++) fn()
    samples.push(Number(process.hrtime.bigint() - t0) / iters)
  }
  samples.sort((a, b) => a - b)
  return { name, median: samples[Math.floor(samples.length / 2)], min: samples[0] }
}

// --- retrywise -------------------------------------------------------------
const quiet = { telemetry: { ring_size: 0 } }
const eng = new rw.Engine(undefined, { seed: 1 })
const engQuiet = new rw.Engine(quiet, { seed: 1 })
const spec = { route: 'openai/gpt-4o-mini', deadlineMs: 10_000 }
const ok = { status: 200 }

function explicitCycle(e) {
  const c = e.begin(spec)
  c.nextAttempt()
  const d = c.report(ok)
  c.release()
  return d
}

// Slot indices by name from the addon, and a scratch buffer on a
// SharedArrayBuffer (no detach check per step), as the JS layer (lib/engine.js) has them.
const { len: SCRATCH_LEN, slots: SLOT } = JSON.parse(native.vocab()).scratch
const scratch = new Float64Array(new SharedArrayBuffer(SCRATCH_LEN * 8))
const lean = new native.NativeEngine(scratch, 1, JSON.stringify(quiet), '1', false)
function leanCycle() {
  const h = lean.begin('openai/gpt-4o-mini', 10_000, 0, null)
  lean.nextAttempt(h)
  const a = lean.reportStatus(h, 200)
  lean.release(h)
  return a
}

// The fast entry points the JS layer uses (src/fast.rs): arguments and results in
// the scratch buffer, the route interned once. Begin + first attempt in one
// crossing, report + release (on success) in the other.
const fast = lean.fast()
const routeId = lean.intern('openai/gpt-4o-mini')
const { ROUTE, DEADLINE_MS, IDEMPOTENCY, TENANT } = SLOT.begin
const { HANDLE, STATUS, RELEASE } = SLOT.report
const { RESULT, HANDLE: BEGUN } = SLOT.step
function fastCycle() {
  scratch[ROUTE] = routeId
  scratch[DEADLINE_MS] = 10_000
  scratch[IDEMPOTENCY] = 0
  scratch[TENANT] = -1
  fast.beginAttempt()
  scratch[HANDLE] = scratch[BEGUN]
  scratch[STATUS] = 200
  scratch[RELEASE] = 1
  fast.reportStatus()
  return scratch[RESULT]
}

// engine.run and wrapFetch need AsyncLocalStorage (nesting), and once it is
// enabled every promise in the process runs async_hooks callbacks: the peers
// are also measured in a process where it is enabled, as it is in any process
// that uses engine.run (or OpenTelemetry, Next.js, ...).
function enableAls() {
  new AsyncLocalStorage().run({}, () => {})
}

// --- peers -----------------------------------------------------------------
const cockatiel = wrap(
  retry(handleAll, { maxAttempts: 2, backoff: new ExponentialBackoff() }),
  circuitBreaker(handleAll, { halfOpenAfter: 10_000, breaker: new ConsecutiveBreaker(5) }),
)
const opossum = new CircuitBreaker(op, { timeout: false, errorThresholdPercentage: 50, resetTimeout: 30_000 })

const CASES = [
  ['retrywise engine.run (default policy: 1024-event ring)', () => measure(null, () => eng.run(op, spec))],
  ['retrywise engine.run (telemetry.ring_size: 0)', () => measure(null, () => engQuiet.run(op, spec))],
  ['retrywise begin/nextAttempt/report/release (sync)', () => measureSync(null, () => explicitCycle(eng))],
  ['retrywise begin/nextAttempt/report/release (sync, ring_size: 0)', () => measureSync(null, () => explicitCycle(engQuiet))],
  ['retrywise lean native cycle (4 crossings, ring_size: 0)', () => measureSync(null, leanCycle, ITER * 2)],
  ['retrywise fast entry points (2 crossings, ring_size: 0)', () => measureSync(null, fastCycle, ITER * 2)],
  ['cockatiel wrap(retry, circuitBreaker).execute', () => measure(null, () => cockatiel.execute(op))],
  ['opossum breaker.fire', () => measure(null, () => opossum.fire())],
  ['p-retry pRetry(fn, {retries: 2})', () => measure(null, () => pRetry(op, { retries: 2 }), Math.max(1, ITER / 10))],
  ['cockatiel execute (AsyncLocalStorage enabled)', () => (enableAls(), measure(null, () => cockatiel.execute(op)))],
  ['opossum breaker.fire (AsyncLocalStorage enabled)', () => (enableAls(), measure(null, () => opossum.fire()))],
]

const which = process.argv.indexOf('--case')
if (which >= 0) {
  // Child: one case in a fresh process, so no library pays for another's
  // process-wide state (e.g. AsyncLocalStorage's promise hooks).
  const i = Number(process.argv[which + 1])
  const r = await CASES[i][1]()
  opossum.shutdown()
  process.stdout.write(JSON.stringify({ name: CASES[i][0], median: r.median, min: r.min }) + '\n')
} else {
  const { execFileSync } = await import('node:child_process')
  const { fileURLToPath } = await import('node:url')
  const self = fileURLToPath(import.meta.url)
  const results = CASES.map((_, i) => JSON.parse(execFileSync(process.execPath, [self, '--case', String(i)], { encoding: 'utf8', env: process.env }).trim()))
  opossum.shutdown()
  const base = results[0].median
  const pad = Math.max(...results.map((r) => r.name.length))
  console.log(`node ${process.version}, one process per case, ${ROUNDS} rounds of ${ITER} iterations (p-retry: ${ITER / 10})`)
  console.log('median ns/op (min of rounds), ratio to retrywise engine.run (default policy)')
  for (const r of results) {
    console.log(`${r.name.padEnd(pad)}  ${r.median.toFixed(0).padStart(7)} ns/op  (min ${r.min.toFixed(0).padStart(6)})  x${(r.median / base).toFixed(2)}`)
  }
}
