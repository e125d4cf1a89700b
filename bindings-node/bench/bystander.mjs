// What a retrywise call in flight costs the rest of the process: another
// library's awaited calls (cockatiel's retry + breaker, as bench.mjs runs it),
// timed with nothing of retrywise in flight and with one engine.run pending.
// With the AsyncLocalStorage nesting carrier every promise of the process pays
// Node 20's async_hooks while that call is in flight; with V8's continuation
// data (Node 20's default) nothing does (lib/context.js).
// `node bindings-node/bench/bystander.mjs` (RETRYWISE_NESTING picks the carrier; BENCH_ROUNDS, BENCH_ITER).
import { createRequire } from 'node:module'
import { cockatiel, op, sleep } from './peers.mjs'

const require = createRequire(import.meta.url)
const { Engine } = require('../index.js')
const { carrierName, IDLE_MS } = require('../lib/context.js')

const ROUNDS = Number(process.env.BENCH_ROUNDS || 5)
const ITER = Number(process.env.BENCH_ITER || 200_000)

async function loop(n) {
  for (let i = 0; i < n; i++) await cockatiel.execute(op)
}
async function time(n) {
  const t0 = process.hrtime.bigint()
  await loop(n)
  return Number(process.hrtime.bigint() - t0) / n
}

const engine = new Engine()
await loop(Math.min(ITER, 20_000))
const idle = []
const busy = []
for (let r = 0; r < ROUNDS; r++) {
  idle.push(await time(ITER))
  /** @type {(v: unknown) => void} */
  let answer = () => {}
  const pending = engine.run(() => new Promise((ok) => (answer = ok)), { route: 'slow', deadlineMs: 600_000 })
  busy.push(await time(ITER))
  answer(1)
  await pending
  // The storage carrier lets go of async_hooks only after IDLE_MS with nothing in flight.
  if (carrierName === 'async-local-storage') await sleep(2 * IDLE_MS + 100)
}
const best = (v) => Math.min(...v).toFixed(0)
console.log(`node ${process.version}; retrywise nesting carrier: ${carrierName}; best of ${ROUNDS} rounds of ${ITER} calls`)
console.log(`cockatiel wrap(retry, circuitBreaker), ns per awaited call: nothing of retrywise in flight ${best(idle)}, one engine.run in flight ${best(busy)}`)
