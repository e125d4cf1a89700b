// The loops users write, against cockatiel and opossum, in one process.
// `node bindings-node/bench/bench.mjs` (after the release build; BENCH_ROUNDS, BENCH_ITER).
//
// Every case is a successful call of an async function that answers at once,
// so the number is each library's own cost per logical request:
// - retrywise README loop: a default `new Engine()`, the README's explicit
//   loop with an awaited function per attempt, no release();
// - retrywise engine.run(async (attempt) => ...);
// - cockatiel: wrap(retry, circuitBreaker).execute, configured as its README
//   shows (retry handleAll, 3 attempts, exponential backoff; consecutive
//   breaker of 5, half-open after 10 s): retries and a breaker, as retrywise;
// - opossum: breaker.fire, configured as its README shows (3 s timeout, 50 %
//   errors, 30 s reset): a breaker with a per-call timeout, no retries.
//
// Each case runs with AsyncLocalStorage off and on. On: an AsyncLocalStorage
// of the benchmark's own is in use around the loop (`als.run(...)`, as
// frameworks and tracers do), so Node runs its async_hooks callbacks for
// every promise. Off: none of the benchmark's. retrywise's nesting carrier is
// printed: on Node 20, V8's continuation data (no async_hooks); with
// RETRYWISE_NESTING=async-local-storage its own AsyncLocalStorage, enabled only
// while its engine.run is in flight and let go when idle (lib/context.js):
// before each case with it off the benchmark then waits until that happened,
// so no case pays for the one before.
//
// Rounds are interleaved (each round runs every case once, in one mode),
// so noise that lasts longer than a case hits every library alike. Reported
// per case and mode: the best of the rounds (the number compared), the
// median and the worst; and retrywise / cockatiel per round, whose spread
// says how far the comparison can be trusted on this machine.
import { createRequire } from 'node:module'
import { AsyncLocalStorage } from 'node:async_hooks'
import { cockatiel, op, sleep, value } from './peers.mjs'

const require = createRequire(import.meta.url)
const CircuitBreaker = require('opossum')
const { Engine } = require('../index.js')
const { IDLE_MS, carrierName } = require('../lib/context.js')

const ROUNDS = Number(process.env.BENCH_ROUNDS || 3)
const ITER = Number(process.env.BENCH_ITER || 200_000)
const WARMUP = Math.min(ITER, 20_000)

// retrywise, as a new user writes it.
const engine = new Engine()
const spec = { route: 'openai/gpt-4o-mini', deadlineMs: 10_000 }
async function doIo(attempt) {
  return { status: 200 }
}

// The peers, as their READMEs configure them (cockatiel in peers.mjs).
const opossum = new CircuitBreaker(op, { timeout: 3000, errorThresholdPercentage: 50, resetTimeout: 30000 })

/** A timer for one case: wall ns and process CPU ns (user + system) per call. */
function start() {
  const cpu = process.cpuUsage()
  const t0 = process.hrtime.bigint()
  return (n) => {
    const wall = Number(process.hrtime.bigint() - t0) / n
    const c = process.cpuUsage(cpu)
    return { wall, cpu: ((c.user + c.system) * 1000) / n }
  }
}

// Each case's loop is a function of its own, so every call site in it sees one callee.
const CASES = [
  [
    'retrywise README loop',
    async (n) => {
      const done = start()
      for (let i = 0; i < n; i++) {
        const call = engine.begin(spec)
        for (;;) {
          const a = call.nextAttempt()
          const d = call.report(await doIo(a))
          if (d.action === 'retry' || d.action === 'fallback') {
            await sleep(d.delayMs)
            continue
          }
          break
        }
      }
      return done(n)
    },
  ],
  [
    'retrywise engine.run',
    async (n) => {
      const done = start()
      for (let i = 0; i < n; i++) await engine.run(async (attempt) => value, spec)
      return done(n)
    },
  ],
  [
    'cockatiel wrap(retry, circuitBreaker)',
    async (n) => {
      const done = start()
      for (let i = 0; i < n; i++) await cockatiel.execute(op)
      return done(n)
    },
  ],
  [
    'opossum fire',
    async (n) => {
      const done = start()
      for (let i = 0; i < n; i++) await opossum.fire()
      return done(n)
    },
  ],
]
const COCKATIEL = 2

const als = new AsyncLocalStorage()
/**
 * One case in one mode. With ALS on, the loop runs inside the benchmark's own
 * storage, let go afterwards so the next case with it off starts clean.
 */
async function runCase(loop, on, n) {
  if (!on) {
    // retrywise's own storage is let go after IDLE_MS with nothing in flight
    // (a check armed before its last call waits a period more).
    if (carrierName === 'async-local-storage') await sleep(2 * IDLE_MS + 100)
    return loop(n)
  }
  try {
    return await als.run({ request: 'bench' }, () => loop(n))
  } finally {
    als.disable()
  }
}

const MODES = [
  ['off', false],
  ['on', true],
]

// `--one CASE N off|on`: that case once, N calls, and nothing else (for
// bench/instructions.sh, which counts instructions under valgrind).
const one = process.argv.indexOf('--one')
if (one >= 0) {
  const [name, n, mode] = process.argv.slice(one + 1)
  const c = CASES.find(([label]) => label === name)
  if (c === undefined) throw new Error(`no case ${name}: ${CASES.map(([label]) => label).join(', ')}`)
  if (mode === 'on') await als.run({ request: 'bench' }, () => c[1](Number(n)))
  else await c[1](Number(n))
  opossum.shutdown()
  process.exit(0)
}

// Every round with AsyncLocalStorage off runs before the first with it on:
// once async_hooks were enabled in a process, V8 keeps its promise fast paths
// off for good, so "off" rows measured after an "on" row would not be what a
// process that never enables async_hooks gets.
/** samples[mode][case] = ns/op per round */
const samples = MODES.map(() => CASES.map(() => []))
for (let m = 0; m < MODES.length; m++) {
  const on = MODES[m][1]
  for (const [, loop] of CASES) await runCase(loop, on, WARMUP)
  for (let r = 0; r < ROUNDS; r++) {
    for (let c = 0; c < CASES.length; c++) samples[m][c].push(await runCase(CASES[c][1], on, ITER))
  }
}
opossum.shutdown()

const sorted = (v) => [...v].sort((a, b) => a - b)
const median = (v) => sorted(v)[Math.floor(v.length / 2)]
const f0 = (x) => x.toFixed(0).padStart(6)
const f2 = (x) => x.toFixed(2)

console.log(`node ${process.version}, one process; ${ROUNDS} interleaved rounds of ${ITER} calls per case and mode; retrywise nesting carrier: ${carrierName}`)
console.log('ns per successful call, wall clock: best of the rounds (median, worst); x = best / cockatiel best;')
console.log('rounds = retrywise / cockatiel in each round; cpu = process CPU time (user + system, all threads) in the best round')
const pad = Math.max(...CASES.map(([name]) => name.length))
for (let m = 0; m < MODES.length; m++) {
  console.log(`\nAsyncLocalStorage ${MODES[m][0]}`)
  const ck = samples[m][COCKATIEL].map((x) => x.wall)
  const ckBest = Math.min(...ck)
  for (let c = 0; c < CASES.length; c++) {
    const rows = samples[m][c]
    const s = rows.map((x) => x.wall)
    const best = Math.min(...s)
    const cpu = rows[s.indexOf(best)].cpu
    let line = `  ${CASES[c][0].padEnd(pad)} ${f0(best)} (${f0(median(s))}, ${f0(Math.max(...s))})  x${f2(best / ckBest)}  cpu ${f0(cpu)}`
    if (c !== COCKATIEL) line += `  rounds ${s.map((v, i) => f2(v / ck[i])).join(' ')}`
    console.log(line)
  }
}
