'use strict'
// Shared test helpers: a tiny local HTTP upstream and the fault server launcher.
const http = require('node:http')
const path = require('node:path')
const fs = require('node:fs')
const { spawn } = require('node:child_process')
const readline = require('node:readline')
const net = require('node:net')
const os = require('node:os')
const { execFile } = require('node:child_process')

/** Starts an HTTP server on 127.0.0.1 with `handler(req, res, n)` (n = 1-based request count). */
async function localServer(handler) {
  const seen = []
  const server = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const rec = { method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString('utf8') }
      seen.push(rec)
      handler(req, res, seen.length, rec)
    })
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  const { port } = server.address()
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections()
        server.close(() => r())
      }),
  }
}

/** Path of the fault server binary built by `cargo build -p retrywise-fault-server`. */
function faultServerBin() {
  if (process.env.RETRYWISE_FAULT_SERVER) return process.env.RETRYWISE_FAULT_SERVER
  const root = path.resolve(__dirname, '..', '..')
  const dirs = [process.env.CARGO_TARGET_DIR, path.join(root, 'target')].filter(Boolean)
  for (const d of dirs) {
    for (const prof of ['debug', 'release']) {
      const p = path.join(path.resolve(root, d), prof, 'retrywise-fault-server')
      if (fs.existsSync(p)) return p
    }
  }
  return null
}

/** Starts the fault server; resolves `{ base, addr, counts(), requests(q), reset(), stop() }`. */
async function startFaultServer() {
  const bin = faultServerBin()
  if (!bin) throw new Error('retrywise-fault-server not built: run `cargo build -p retrywise-fault-server` (or set RETRYWISE_FAULT_SERVER)')
  const proc = spawn(bin, ['--exit-on-stdin-close'], { stdio: ['pipe', 'pipe', 'inherit'] })
  const rl = readline.createInterface({ input: proc.stdout })
  const addr = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('fault server did not start within 10 s')), 10_000)
    rl.once('line', (line) => {
      clearTimeout(t)
      const m = /^LISTENING (\S+)$/.exec(line.trim())
      if (m) resolve(m[1])
      else reject(new Error(`unexpected fault server line: ${line}`))
    })
    proc.once('exit', (code) => reject(new Error(`fault server exited with ${code}`)))
  })
  const base = `http://${addr}`
  const get = async (p) => (await fetch(base + p)).json()
  return {
    addr,
    base,
    url: (spec) => `${base}/s/${spec}/v1`,
    counts: () => get('/control/counts'),
    requests: (q = '') => get('/control/requests' + q),
    /** Records of one spec, oldest first. */
    recordsOf: (spec) => get('/control/requests?spec=' + encodeURIComponent(spec)),
    /** A 127.0.0.1 port just bound and released: connecting to it is refused. */
    closedPort: async () => (await get('/control/closed-port')).port,
    reset: async () => (await fetch(base + '/control/reset', { method: 'POST' })).json(),
    stop: () =>
      new Promise((r) => {
        proc.once('exit', () => r())
        proc.stdin.end()
        setTimeout(() => proc.kill('SIGTERM'), 2000).unref()
      }),
  }
}

/** A free port of 127.0.0.1 (bound, then released). */
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {net.AddressInfo} */ (s.address())
      s.close(() => resolve(port))
    })
  })
}

/** Whether a Redis answers PING on `port` of 127.0.0.1. */
function pings(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1')
    let got = ''
    const done = (ok) => {
      sock.destroy()
      resolve(ok)
    }
    sock.setTimeout(200, () => done(false))
    sock.once('error', () => done(false))
    sock.once('connect', () => sock.write('PING\r\n'))
    sock.on('data', (d) => {
      got += d
      if (got.includes('\r\n')) done(got.startsWith('+PONG'))
    })
  })
}

/**
 * Starts a `redis-server` on 127.0.0.1 (`$RETRYWISE_REDIS_SERVER`, else
 * `redis-server` on PATH) on `port` or a free one, with no persistence (a
 * restart is empty); resolves `{ port, url, kill() }`.
 */
async function startRedis(port) {
  if (port === undefined) port = await freePort()
  const bin = process.env.RETRYWISE_REDIS_SERVER || 'redis-server'
  const proc = spawn(bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: ['ignore', 'ignore', 'inherit'] })
  let failed = null
  proc.once('error', (e) => (failed = new Error(`cannot run ${bin} (${e.message}): install Debian's redis-server (scripts/test-all does)`)))
  proc.once('exit', (code) => (failed = failed || new Error(`${bin} exited with ${code}`)))
  const exited = new Promise((r) => proc.once('close', r))
  // Wait for it to listen (startup, not behaviour: no assertion on time).
  for (let i = 0; !(await pings(port)); i++) {
    if (failed) throw failed
    if (i >= 400) throw new Error(`redis-server did not start on port ${port}`)
    await new Promise((r) => setTimeout(r, 25))
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    kill: async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL')
      await exited
    },
  }
}

/**
 * The fault server for one test file: started before its tests (with `env`
 * set, the keys the policies name) and stopped after them. Returns
 * `{ fs, closed }`, filled in by the time the tests run (`closed`: a port
 * that refuses connections, for a client whose own base URL must never be used).
 * @param {typeof import('node:test')} test
 * @param {Record<string, string>} env
 */
function useFaultServer(test, env) {
  const ctx = { fs: null, closed: 0 }
  test.before(async () => {
    ctx.fs = await startFaultServer()
    ctx.closed = await ctx.fs.closedPort()
    Object.assign(process.env, env)
  })
  test.after(async () => {
    if (ctx.fs) await ctx.fs.stop()
  })
  return ctx
}

/**
 * Runs the first ```js block after `heading` in this package's README.md as
 * written, but for `replacements` ([from, to], each must occur), as the
 * script of a project of its own with retrywise (this package) and `deps`
 * (from this package's node_modules) installed; resolves its stdout.
 * @param {string} heading
 * @param {[string, string][]} replacements
 * @param {string[]} deps
 * @param {Record<string, string>} env
 * @returns {Promise<string>}
 */
async function runReadmeExample(heading, replacements, deps, env) {
  const here = path.join(__dirname, '..')
  const readme = fs.readFileSync(path.join(here, 'README.md'), 'utf8')
  const start = readme.indexOf(heading)
  if (start < 0) throw new Error(`README.md has no ${heading}`)
  const m = /```js\n([\s\S]*?)```/.exec(readme.slice(start))
  if (!m) throw new Error(`README.md has no js block after ${heading}`)
  let src = m[1]
  for (const [from, to] of replacements) {
    if (!src.includes(from)) throw new Error(`the example under ${heading} no longer says ${from}`)
    src = src.replace(from, to)
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rw-readme-'))
  try {
    const modules = path.join(dir, 'node_modules')
    fs.mkdirSync(modules)
    fs.symlinkSync(here, path.join(modules, 'retrywise'))
    for (const d of deps) {
      fs.mkdirSync(path.dirname(path.join(modules, d)), { recursive: true })
      fs.symlinkSync(path.join(here, 'node_modules', d), path.join(modules, d))
    }
    fs.writeFileSync(path.join(dir, 'example.js'), src)
    return await new Promise((resolve, reject) =>
      execFile(process.execPath, ['example.js'], { cwd: dir, env: { ...process.env, ...env } }, (err, stdout, stderr) =>
        err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
      ),
    )
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

module.exports = { localServer, startFaultServer, faultServerBin, startRedis, useFaultServer, runReadmeExample }
