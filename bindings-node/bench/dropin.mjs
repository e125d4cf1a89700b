// What the drop-in fetch costs a user beside the SDK alone: client CPU time
// per request of the openai SDK with its own retries off (maxRetries 0), plain
// and through retrywise's wrapFetch -- the README wiring (one route) and a
// multi-provider catalog (every request read, routed by its model and
// rewritten for the upstream the core chose) -- against a local
// OpenAI-compatible upstream in another process (the project's fault server,
// model `fb-ok`). The Node twin of bindings-python/bench/dropin.py.
//
// Rounds interleave the clients, so a slow moment of the machine falls on all
// of them alike; each round times `--requests` requests per client with
// process.cpuUsage() (user + system of this process: the upstream's CPU is
// not counted). Reported: the median over rounds per request with the range,
// the overhead against the plain SDK in the same run, and for streams the
// overhead per chunk.
//
//   node bench/dropin.mjs                       # JSON and a 200-chunk stream
//   node bench/dropin.mjs --rounds 9 --requests 600
//   node bench/dropin.mjs --quick               # a smoke run (CI)
//   node bench/dropin.mjs --compare before=/path/to/other/bindings-node
//
// `--compare LABEL=DIR` adds the README wiring and the catalog of another
// build of this package (its index.js and addon; e.g. a checkout of an earlier
// commit, built) to the same rounds, so before and after are measured in one
// run, interleaved. `--only json|stream` runs one workload.
//
// The fault server is $RETRYWISE_FAULT_SERVER, else the release or debug build
// under the workspace's target directory (`cargo build --release -p
// retrywise-fault-server`).
import { createRequire } from 'node:module'
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const here = path.dirname(fileURLToPath(import.meta.url))
const ROOT = path.resolve(here, '..', '..')
const MESSAGES = [{ role: 'user', content: 'Say hello in a few words.' }]
const KEY_ENV = 'RETRYWISE_BENCH_KEY'

function args() {
  const a = { rounds: 7, requests: 400, streamWords: 200, quick: false, compare: [], only: null }
  const argv = process.argv.slice(2)
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i]
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${k} needs a value`)
      return argv[++i]
    }
    if (k === '--rounds') a.rounds = Number(v())
    else if (k === '--requests') a.requests = Number(v())
    else if (k === '--stream-words') a.streamWords = Number(v())
    else if (k === '--quick') a.quick = true
    else if (k === '--only') a.only = v()
    else if (k === '--compare') {
      const s = v()
      const eq = s.indexOf('=')
      a.compare.push(eq > 0 ? [s.slice(0, eq), s.slice(eq + 1)] : [path.basename(path.resolve(s, '..')), s])
    } else if (k === '--help' || k === '-h') {
      console.log(fs.readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\nimport ')[0])
      process.exit(0)
    } else throw new Error(`unknown argument ${k}`)
  }
  if (a.quick) {
    a.rounds = 2
    a.requests = 20
  }
  if (!(a.rounds >= 1 && a.requests >= 1 && a.streamWords >= 1)) throw new Error('--rounds, --requests and --stream-words must be >= 1')
  return a
}

/** The fault server on an ephemeral port: its process and base URL. */
async function faultServer() {
  const target = path.resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target')
  const candidates = [process.env.RETRYWISE_FAULT_SERVER, ...['release', 'debug'].map((p) => path.join(target, p, 'retrywise-fault-server'))]
  const exe = candidates.find((c) => {
    if (!c) return false
    try {
      fs.accessSync(c, fs.constants.X_OK)
      return true
    } catch {
      return false
    }
  })
  if (exe === undefined) {
    console.error('no fault server: cargo build --release -p retrywise-fault-server (or set RETRYWISE_FAULT_SERVER)')
    process.exit(2)
  }
  const proc = spawn(exe, ['--exit-on-stdin-close'], { stdio: ['pipe', 'pipe', 'inherit'] })
  const line = await new Promise((resolve, reject) => {
    createInterface({ input: proc.stdout }).once('line', resolve)
    proc.once('exit', (code) => reject(new Error(`fault server exited with ${code}`)))
  })
  if (!line.startsWith('LISTENING ')) throw new Error(`fault server said ${JSON.stringify(line)}`)
  return { proc, base: `http://${line.trim().split(' ')[1]}` }
}

/**
 * The policy of the multi-provider catalog: a primary and a backup per route
 * (for `fb-ok` and for the streamed `fb-ok:words=N` alike), each with its
 * base URL, key variable, wire family, context window and capabilities; the
 * request's model picks the route and every attempt is rewritten.
 */
function catalogPolicy(base, words) {
  const upstream = { base_url: `${base}/v1`, api: 'openai', api_key_env: KEY_ENV, context_tokens: 128_000 }
  const streamed = `fb-ok:words=${words}`
  const upstreams = {}
  const routes = {}
  for (const [route, model] of [
    ['chat', 'fb-ok'],
    ['chat_stream', streamed],
  ]) {
    upstreams[`${route}_primary`] = { ...upstream, provider: 'local', model, capabilities: ['streaming', 'tool_calling', 'json_schema', 'json_mode', 'vision'] }
    upstreams[`${route}_backup`] = { ...upstream, provider: 'local-b', model: `${model}:id=backup`, capabilities: ['streaming', 'tool_calling', 'json_mode', 'assistant_prefill'] }
    routes[route] = { candidates: [`${route}_primary`, `${route}_backup`], stream_recovery: 'continue' }
  }
  return { deadline_ms: 30_000, upstreams, models: { 'fb-ok': 'chat', [streamed]: 'chat_stream' }, routes }
}

/** The clients measured, by name: the SDK alone, then each build's README wiring and catalog. */
function clients(base, words, builds) {
  process.env[KEY_ENV] = 'sk-bench'
  const { OpenAI } = require('openai')
  const sdk = (fetchImpl) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-caller', maxRetries: 0, ...(fetchImpl ? { fetch: fetchImpl } : {}) })
  const out = [['sdk alone', sdk(null)]]
  for (const [label, rw] of builds) {
    const suffix = label === '' ? '' : ` (${label})`
    const readme = new rw.Engine({ max_attempts: 3, deadline_ms: 20_000 })
    const catalog = new rw.Engine(catalogPolicy(base, words))
    out.push([`README wiring${suffix}`, sdk(rw.wrapFetch(readme, fetch, { route: 'openai/gpt-4o' }))])
    out.push([`catalog${suffix}`, sdk(rw.wrapFetch(catalog, fetch))])
  }
  return out
}

async function jsonRequest(client) {
  const r = await client.chat.completions.create({ model: 'fb-ok', messages: MESSAGES })
  if (!r.choices[0].message.content) throw new Error('no content')
}

function streamRequest(words) {
  const model = `fb-ok:words=${words}`
  return async (client) => {
    let n = 0
    const stream = await client.chat.completions.create({ model, messages: MESSAGES, stream: true })
    for await (const chunk of stream) if (chunk.choices.length > 0 && chunk.choices[0].delta.content) n++
    if (n < words) throw new Error(`${n} content chunks, expected at least ${words}`)
  }
}

/** CPU µs per request, per client, per round (interleaved). */
async function measure(workload, cs, rounds, requests) {
  for (const [, c] of cs) for (let i = 0; i < Math.max(3, Math.floor(requests / 10)); i++) await workload(c)
  const out = new Map(cs.map(([name]) => [name, []]))
  for (let r = 0; r < rounds; r++) {
    // Each round starts with another client, so none is always the first after a pause.
    for (let k = 0; k < cs.length; k++) {
      const [name, c] = cs[(k + r) % cs.length]
      const t0 = process.cpuUsage()
      for (let i = 0; i < requests; i++) await workload(c)
      const t = process.cpuUsage(t0)
      out.get(name).push((t.user + t.system) / requests)
    }
  }
  return out
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 === 1 ? s[m] : (s[m - 1] + s[m]) / 2
}

function report(title, per, chunks) {
  const base = median(per.get('sdk alone'))
  const width = Math.max(16, ...[...per.keys()].map((k) => k.length))
  console.log(`\n${title}`)
  console.log(`${'client'.padEnd(width)} ${'median µs/req'.padStart(14)} ${'range'.padStart(19)} ${'overhead'.padStart(10)}${chunks ? '  µs/chunk' : ''}`)
  for (const [name, xs] of per) {
    const med = median(xs)
    const extra = med - base
    let line = `${name.padEnd(width)} ${med.toFixed(1).padStart(14)} ${Math.min(...xs).toFixed(1).padStart(9)}-${Math.max(...xs).toFixed(1).padEnd(9)} `
    line += name === 'sdk alone' ? ''.padStart(10) : `${((extra / base) * 100).toFixed(1).padStart(9)}%`
    if (chunks && name !== 'sdk alone') line += `  ${(extra / chunks >= 0 ? '+' : '') + (extra / chunks).toFixed(2).padStart(7)}`
    console.log(line)
  }
}

const a = args()
const builds = [['', require('../index.js')]]
for (const [label, dir] of a.compare) builds.push([label, createRequire(path.join(path.resolve(dir), 'index.js'))('./index.js')])
const { proc, base } = await faultServer()
try {
  const openaiVersion = JSON.parse(fs.readFileSync(require.resolve('openai').replace(/(node_modules[\\/]openai)[\\/].*$/, '$1/package.json'), 'utf8')).version
  const carrier = require('../lib/context.js').carrierName
  console.log(
    `node ${process.version}, openai ${openaiVersion}, retrywise ${builds[0][1].version} (nesting carrier ${carrier}); ` +
      `${a.rounds} rounds x ${a.requests} requests per client (streams: ${Math.max(1, a.requests >> 2)}), interleaved; CPU µs per request (process.cpuUsage)`,
  )
  const cs = clients(base, a.streamWords, builds)
  if (a.only === null || a.only === 'json') report('JSON completion', await measure(jsonRequest, cs, a.rounds, a.requests), 0)
  if (a.only === null || a.only === 'stream') {
    const per = await measure(streamRequest(a.streamWords), cs, a.rounds, Math.max(1, a.requests >> 2))
    report(`${a.streamWords}-chunk stream`, per, a.streamWords)
  }
} finally {
  proc.stdin.end()
  await new Promise((r) => {
    if (proc.exitCode !== null) r()
    else proc.once('exit', r)
  })
}
