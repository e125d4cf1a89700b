// Where a retrywise call's time goes in Node: the loops users write beside
// the native steps they cross into, raw (the engine's fast entry points fed
// through its scratch buffer, no JS objects built), and beside an awaited
// call with no library at all.
// `node bindings-node/bench/steps.mjs` (after the release build; BENCH_ROUNDS, BENCH_ITER).
//
// - await: `await doIo()` alone, the floor every case pays;
// - native begin+next+report: the README loop's three steps (begin, next,
//   a 200 that finishes and frees the call), and the await;
// - native beginAttempt+reportOk: engine.run's two steps (begin with the
//   first attempt, a success that releases the call), and the await;
// - promise and then: the least an engine.run-shaped wrapper does with no
//   library at all (its own promise, fn called, a then on fn's promise that
//   settles it), and the await;
// - nesting swap pair: what engine.run's attempt pays to carry its attempt
//   (lib/context.js runIn: set V8's continuation data, then restore it), and
//   the await; on Node 20's continuation carrier only;
// - README loop, engine.run, cockatiel: as bench.mjs runs them.
//
// The gap between a loop and its raw steps is the JS layer (objects, checks,
// nesting); the gap between the raw steps and the await is the native work
// and its crossings. AsyncLocalStorage off; best of the rounds, ns per call.
import { createRequire } from 'node:module'
import { cockatiel, op, value } from './peers.mjs'

const require = createRequire(import.meta.url)
const { Engine } = require('../index.js')
const { SLOT } = require('../lib/vocab.js')
const { carrierName } = require('../lib/context.js')
const native = require('../native.js')

const ROUNDS = Number(process.env.BENCH_ROUNDS || 7)
const ITER = Number(process.env.BENCH_ITER || 200_000)

const engine = new Engine()
const spec = { route: 'openai/gpt-4o-mini', deadlineMs: 10_000 }
async function doIo(attempt) {
  return { status: 200 }
}
const carrier = native.continuationCarrier()
const s = engine._s
const f = engine._f
const route = engine._routeId(spec.route)
/** The begin step's arguments, as the engine's simple begin writes them. */
function putSpec() {
  s[SLOT.BEGIN_ROUTE] = route
  s[SLOT.BEGIN_DEADLINE_MS] = spec.deadlineMs
  s[SLOT.BEGIN_IDEMPOTENCY] = 0
  s[SLOT.BEGIN_TENANT] = -1
}

// An engine.run-shaped wrapper with no library: one executor for every
// promise (as lib/run.js), fn's promise settled through a then.
let capturedResolve = null
let capturedReject = null
const capture = (resolve, reject) => {
  capturedResolve = resolve
  capturedReject = reject
}
function wrapped(fn) {
  const p = new Promise(capture)
  const resolve = capturedResolve
  const reject = capturedReject
  fn().then(
    (v) => resolve(v),
    (e) => reject(e),
  )
  return p
}

/** @type {Array<[string, (n: number) => Promise<void>]>} */
const CASES = [
  [
    'await',
    async (n) => {
      for (let i = 0; i < n; i++) await doIo(null)
    },
  ],
  [
    'native begin+next+report',
    async (n) => {
      for (let i = 0; i < n; i++) {
        putSpec()
        f.begin()
        const h = s[SLOT.STEP_HANDLE]
        s[SLOT.NEXT_HANDLE] = h
        s[SLOT.NEXT_STAMP] = 0
        f.next()
        const r = await doIo(null)
        s[SLOT.REPORT_HANDLE] = h
        s[SLOT.REPORT_STATUS] = r.status
        s[SLOT.REPORT_RELEASE] = 2
        f.reportStatus()
      }
    },
  ],
  [
    'native beginAttempt+reportOk',
    async (n) => {
      for (let i = 0; i < n; i++) {
        putSpec()
        f.beginAttempt()
        const h = s[SLOT.STEP_HANDLE]
        await doIo(null)
        s[SLOT.REPORT_HANDLE] = h
        s[SLOT.REPORT_RELEASE] = 1
        f.reportOk()
      }
    },
  ],
  [
    'promise and then',
    async (n) => {
      for (let i = 0; i < n; i++) await wrapped(async () => value)
    },
  ],
  [
    'nesting swap pair',
    async (n) => {
      for (let i = 0; i < n; i++) {
        const prev = carrier.swap(spec)
        carrier.swap(prev)
        await doIo(null)
      }
    },
  ],
  [
    'retrywise README loop',
    async (n) => {
      for (let i = 0; i < n; i++) {
        const call = engine.begin(spec)
        for (;;) {
          const a = call.nextAttempt()
          const d = call.report(await doIo(a))
          if (d.action === 'retry' || d.action === 'fallback') continue
          break
        }
      }
    },
  ],
  [
    'retrywise engine.run',
    async (n) => {
      for (let i = 0; i < n; i++) await engine.run(async (attempt) => value, spec)
    },
  ],
  [
    'cockatiel wrap(retry, circuitBreaker)',
    async (n) => {
      for (let i = 0; i < n; i++) await cockatiel.execute(op)
    },
  ],
]

if (carrierName !== 'continuation' || carrier === null) CASES.splice(CASES.findIndex(([name]) => name === 'nesting swap pair'), 1)
for (const [, loop] of CASES) await loop(Math.min(ITER, 20_000))
const best = CASES.map(() => Infinity)
for (let r = 0; r < ROUNDS; r++) {
  for (let c = 0; c < CASES.length; c++) {
    const t0 = process.hrtime.bigint()
    await CASES[c][1](ITER)
    best[c] = Math.min(best[c], Number(process.hrtime.bigint() - t0) / ITER)
  }
}
if (engine.liveCalls !== 0) throw new Error(`${engine.liveCalls} calls left live: a case leaks`)

console.log(`node ${process.version}; nesting carrier ${carrierName}; best of ${ROUNDS} interleaved rounds of ${ITER} calls; ns per call, and beyond the bare await`)
const pad = Math.max(...CASES.map(([name]) => name.length))
for (let c = 0; c < CASES.length; c++) {
  const extra = c === 0 ? '' : `  +${(best[c] - best[0]).toFixed(0)}`
  console.log(`  ${CASES[c][0].padEnd(pad)} ${best[c].toFixed(0).padStart(6)}${extra}`)
}
