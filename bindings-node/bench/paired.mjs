// retrywise against cockatiel and opossum in paired rounds: ratios less
// exposed to machine noise. `npm run bench:paired` (after the release build).
//
// bench.mjs runs every case in a process of its own; on a shared machine a
// row moves by tens of percent from one process to the next, so two rows of
// that table are not comparable to better than that. Here the cases of one
// group share a process and run in alternating rounds (A B C, A B C, ...):
// noise that lasts longer than a round hits its cases alike, and each round
// gives a ratio retrywise / peer. The median ratio is the comparison; the
// ns/op here are higher than bench.mjs's (cases sharing a process slow each
// other: collections, shared builtins), and round ratios still spread.
//
// Two groups, each in its own process:
// - `async-context`: engine.run, which enables AsyncLocalStorage (nesting),
//   against the peers' execute in that same process (as any process that uses
//   engine.run, wrapFetch or OpenTelemetry has it enabled);
// - `plain`: the explicit begin/nextAttempt/report/release cycle, which
//   needs no async context, against the peers in a process without it.
//
// The target (400 ns here, where cockatiel took ~520 ns and opossum
// ~485 ns) reads as ratios of 0.77 to cockatiel and 0.82 to opossum.
import { createRequire } from 'node:module'
import { retry, circuitBreaker, wrap, handleAll, ConsecutiveBreaker, ExponentialBackoff } from 'cockatiel'
import { AsyncLocalStorage } from 'node:async_hooks'

const require = createRequire(import.meta.url)
const CircuitBreaker = require('opossum')
const rw = require('../index.js')

const ROUNDS = Number(process.env.BENCH_ROUNDS || 9)
const ITER = Number(process.env.BENCH_ITER || 100_000)

const value = { ok: true }
const op = async () => value
const spec = { route: 'openai/gpt-4o-mini', deadlineMs: 10_000 }
const ok = { status: 200 }

const engine = new rw.Engine(undefined, { seed: 1 })
const cockatiel = wrap(
  retry(handleAll, { maxAttempts: 2, backoff: new ExponentialBackoff() }),
  circuitBreaker(handleAll, { halfOpenAfter: 10_000, breaker: new ConsecutiveBreaker(5) }),
)
const opossum = new CircuitBreaker(op, { timeout: false, errorThresholdPercentage: 50, resetTimeout: 30_000 })

function explicitCycle() {
  const c = engine.begin(spec)
  c.nextAttempt()
  const d = c.report(ok)
  c.release()
  return d
}

// Each case's loop is a function literal of its own, so every call site in
// it sees one callee, as in bench.mjs (a loop shared by the cases would see three).
const ns = (t0, n) => Number(process.hrtime.bigint() - t0) / n
const GROUPS = {
  'async-context': [
    ['retrywise engine.run', async (n) => { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) await engine.run(op, spec); return ns(t0, n) }],
    ['cockatiel execute', async (n) => { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) await cockatiel.execute(op); return ns(t0, n) }],
    ['opossum fire', async (n) => { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) await opossum.fire(); return ns(t0, n) }],
  ],
  plain: [
    ['retrywise begin/nextAttempt/report/release', async (n) => { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) explicitCycle(); return ns(t0, n) }],
    ['cockatiel execute', async (n) => { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) await cockatiel.execute(op); return ns(t0, n) }],
    ['opossum fire', async (n) => { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) await opossum.fire(); return ns(t0, n) }],
  ],
}

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]

async function runGroup(name) {
  const cases = GROUPS[name]
  if (name === 'async-context') new AsyncLocalStorage().run({}, () => {})
  for (const [, loop] of cases) await loop(20_000) // warm up (JIT, caches)
  const samples = cases.map(() => [])
  for (let r = 0; r < ROUNDS; r++) {
    for (let i = 0; i < cases.length; i++) samples[i].push(await cases[i][1](ITER))
  }
  return cases.map(([label], i) => ({ label, ns: samples[i] }))
}

const which = process.argv.indexOf('--group')
if (which >= 0) {
  const rows = await runGroup(process.argv[which + 1])
  opossum.shutdown()
  process.stdout.write(JSON.stringify(rows) + '\n')
} else {
  const { execFileSync } = await import('node:child_process')
  const { fileURLToPath } = await import('node:url')
  const self = fileURLToPath(import.meta.url)
  opossum.shutdown()
  console.log(`node ${process.version}; ${ROUNDS} paired rounds of ${ITER} operations per case; ns/op medians, and per-round ratios retrywise / peer`)
  for (const name of Object.keys(GROUPS)) {
    const rows = JSON.parse(execFileSync(process.execPath, [self, '--group', name], { encoding: 'utf8', env: process.env }).trim())
    const [mine, ...peers] = rows
    console.log(`\n[${name}]`)
    for (const r of rows) console.log(`  ${r.label.padEnd(44)} ${median(r.ns).toFixed(0).padStart(6)} ns/op`)
    for (const p of peers) {
      const ratios = mine.ns.map((v, i) => v / p.ns[i])
      const lo = Math.min(...ratios).toFixed(2)
      const hi = Math.max(...ratios).toFixed(2)
      console.log(`  ${mine.label} / ${p.label}: median ratio ${median(ratios).toFixed(2)} (rounds ${lo}-${hi})`)
    }
  }
}
