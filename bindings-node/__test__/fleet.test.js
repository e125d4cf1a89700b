'use strict'
// Three engines sharing one real Redis through RedisFleet (a redis-server
// each test starts on a free port of 127.0.0.1 and stops), mirroring
// fleet/tests/processes.rs. The three instances are three Engines in this
// one process, each with its own ioredis connection and its own manual
// clock (all start at the same wall instant and the test advances them
// together): Redis sees three clients, as it would three processes, and
// the engines share nothing else. The test runs each sync cycle itself
// (`syncOnce`, one tick of the timer), so every step is deterministic: "within
// the staleness bound" means within the cycles that bound allows. The last
// test runs a second Node process against the same Redis.
const test = require('node:test')
const path = require('node:path')
const { execFile } = require('node:child_process')
const assert = require('node:assert/strict')
const Redis = require('ioredis')
const { Engine, RedisFleet, StoppedError, fleetScripts } = require('..')
const { startRedis } = require('./helpers.js')

/** One upstream `up` whose breaker opens at 2 failures of 4 calls, for 30 s. */
const POLICY = `
max_attempts: 1
breaker:
  min_calls: 4
  window_size: 4
  failure_rate: 0.5
  open_ms: 30000
  open_max_ms: 60000
  open_jitter: 0
  half_open_probes: 1
  close_after: 1
  hold: false
`
const INTERVAL_MS = 250

/** One call of one attempt answered with `status`: "sent", or the refusal's reason. */
function call(engine, status, route = 'up') {
  const c = engine.begin({ route, deadlineMs: 60_000 })
  try {
    c.nextAttempt()
  } catch (e) {
    if (e instanceof StoppedError) return e.reason
    throw e
  }
  c.report({ status })
  return 'sent'
}

/** An ioredis client that fails at once while disconnected (no offline queue) and reconnects quickly. */
async function client(url) {
  const c = new Redis(url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 50 })
  c.on('error', () => {})
  await ready(c)
  return c
}

/** Resolves once `c` is connected (startup, not behaviour). */
function ready(c) {
  return c.status === 'ready' ? Promise.resolve() : new Promise((r) => c.once('ready', r))
}

/** One instance: an engine on a manual clock, a twin with no fleet (same clock steps, same seed), its RedisFleet. */
async function instance(name, quorum, redis, extra = {}) {
  const engine = new Engine(POLICY, { manualClock: true, seed: 7 })
  const twin = new Engine(POLICY, { manualClock: true, seed: 7 })
  const fleet = engine.fleet({ instance: name, quorum, intervalMs: INTERVAL_MS, ...extra })
  const redisClient = await client(redis.url)
  const rf = new RedisFleet(fleet, redisClient)
  const events = []
  engine.onEvent((e) => {
    if (e.kind === 'fleet') events.push(e.detail)
  })
  return {
    engine,
    twin,
    fleet,
    client: redisClient,
    events,
    call: (status, route) => call(engine, status, route),
    twinCall: (status) => call(twin, status),
    state: () => engine.breakerState('up'),
    /** One sync cycle: `opened extended recovered won lost limits`, or `error ...`. */
    sync: async () => {
      try {
        const r = await rf.syncOnce()
        return `${r.opened} ${r.extended} ${r.recovered} ${r.leasesWon} ${r.leasesLost} ${r.limits}`
      } catch (e) {
        return `error ${e.message}`
      }
    },
    advance(ms) {
      engine.advanceClock(ms)
      twin.advanceClock(ms)
    },
    close: () => redisClient.disconnect(),
  }
}

/** Three instances and their Redis; `t.after` stops them. */
async function fleetOf(t, quorum) {
  const redis = await startRedis()
  const nodes = [await instance('a', quorum, redis), await instance('b', quorum, redis), await instance('c', quorum, redis)]
  t.after(async () => {
    for (const n of nodes) n.close()
    await redis.kill()
  })
  return { redis, nodes }
}

function advance(nodes, ms) {
  for (const n of nodes) n.advance(ms)
}

test('fleet config: the core defaults, the staleness bound, the scripts', () => {
  const f = new Engine(POLICY).fleet({ instance: 'x' })
  assert.deepEqual(f.config, {
    instance: 'x',
    namespace: 'retrywise',
    quorum: 2,
    quorumWindowMs: 30_000,
    intervalMs: 250,
    timeoutMs: 200,
    probeLeaseMs: 10_000,
  })
  assert.equal(f.stalenessBoundMs, 900)
  assert.match(fleetScripts.merge, /HSET/)
  assert.match(fleetScripts.claim, /'PX'/)
  assert.match(fleetScripts.mergeSha, /^[0-9a-f]{40}$/)
  const e = new Engine(POLICY)
  e.fleet()
  assert.throws(() => e.fleet(), { code: 'ERR_RETRYWISE_FLEET' })
  assert.throws(() => new Engine(POLICY).fleet({ quorum: 0 }), { code: 'ERR_RETRYWISE_FLEET' })
  assert.throws(() => new Engine(POLICY).fleet({ intervalMs: -1 }), TypeError)
  assert.throws(() => new Engine(POLICY).fleet({ interval_ms: 100 }), /unknown fleet config field interval_ms/)
  assert.throws(() => new Engine(POLICY).fleet({ quorum: -1 }), /quorum must be an integer/)
  assert.throws(() => new Engine(POLICY).fleet({ timeoutMs: '200' }), /timeoutMs must be a number/)
  assert.throws(() => new RedisFleet(new Engine(POLICY).fleet(), /** @type {any} */ ({})), TypeError)
})

test('an open on one engine stops the others within the staleness bound', async (t) => {
  const { nodes } = await fleetOf(t, 1)
  const [a, b, c] = nodes
  for (const n of nodes) {
    assert.equal(n.call(200), 'sent')
    assert.equal(await n.sync(), '0 0 0 0 0 0')
  }
  for (let i = 0; i < 3; i++) assert.equal(a.call(503), 'sent')
  assert.equal(a.state(), 'open')
  // The worst case: the open lands just after a's cycle began, so it goes
  // out one interval later, and b and c read it an interval after that.
  advance(nodes, INTERVAL_MS)
  assert.deepEqual([b.call(200), c.call(200)], ['sent', 'sent'], 'not written yet')
  assert.equal(await a.sync(), '0 0 0 0 0 0')
  advance(nodes, INTERVAL_MS)
  assert.equal(await b.sync(), '1 0 0 0 0 0')
  assert.equal(await c.sync(), '1 0 0 0 0 0')
  assert.ok(2 * INTERVAL_MS <= a.fleet.stalenessBoundMs)
  assert.deepEqual([b.call(200), c.call(200)], ['breaker_open', 'breaker_open'])
  assert.deepEqual([b.state(), c.state()], ['open', 'open'])
  assert.equal(b.fleet.stats().opened, 1)
})

test('exactly one probe goes fleet-wide and its success closes every breaker', async (t) => {
  const { nodes } = await fleetOf(t, 1)
  const [a, b, c] = nodes
  for (const n of [b, c]) assert.equal(n.call(200), 'sent')
  for (let i = 0; i < 4; i++) a.call(503)
  await a.sync()
  assert.equal(await b.sync(), '1 0 0 0 0 0')
  assert.equal(await c.sync(), '1 0 0 0 0 0')
  // Shortly before the open period ends every instance claims the probe lease.
  advance(nodes, 29_800)
  const claims = []
  for (const n of [b, a, c]) claims.push(await n.sync())
  assert.deepEqual(claims, ['0 0 0 1 0 0', '0 1 0 0 1 0', '0 1 0 0 1 0'], 'b won, a and c hold')
  advance(nodes, 300)
  // Every instance has calls to make while b's probe is in flight: none goes.
  const probe = b.engine.begin({ route: 'up', deadlineMs: 60_000 })
  probe.nextAttempt()
  for (let i = 0; i < 3; i++) {
    for (const n of [a, c, b]) assert.equal(n.call(200), 'breaker_open')
  }
  probe.report({ status: 200 })
  assert.equal(b.state(), 'closed')
  assert.equal(b.call(200), 'sent')
  assert.deepEqual([a.call(200), c.call(200)], ['breaker_open', 'breaker_open'], 'until they sync')
  // b's recovery reaches the others at their next cycle.
  await b.sync()
  assert.equal(await a.sync(), '0 0 1 0 0 0')
  assert.equal(await c.sync(), '0 0 1 0 0 0')
  assert.deepEqual([a.call(200), c.call(200)], ['sent', 'sent'])
})

test('one engine below the quorum opens nobody else', async (t) => {
  const { nodes } = await fleetOf(t, 2)
  const [a, b, c] = nodes
  for (let i = 0; i < 4; i++) a.call(503)
  assert.equal(a.state(), 'open')
  await a.sync()
  for (const n of [b, c]) {
    assert.equal(await n.sync(), '0 0 0 0 0 0')
    assert.equal(n.call(200), 'sent')
    assert.equal(n.state(), 'closed')
  }
  // A second instance's own evidence makes the quorum of two: the third opens.
  for (let i = 0; i < 4; i++) b.call(503)
  await b.sync()
  assert.equal(await c.sync(), '1 0 0 0 0 0')
  assert.equal(c.call(200), 'breaker_open')
})

test('scripts run as EVALSHA once Redis has them; a flushed script cache costs one cycle', async (t) => {
  const { nodes } = await fleetOf(t, 1)
  const [a, b] = nodes
  assert.equal(await a.client.script('LOAD', fleetScripts.merge), fleetScripts.mergeSha)
  assert.equal(await a.client.script('LOAD', fleetScripts.claim), fleetScripts.claimSha)
  assert.equal(await a.client.script('FLUSH'), 'OK')
  for (const route of ['up', 'up2']) assert.equal(b.call(200, route), 'sent')
  for (let i = 0; i < 4; i++) a.call(503)
  assert.equal(await a.sync(), '0 0 0 0 0 0', 'EVAL: the merge script is cached now')
  assert.equal(await b.sync(), '1 0 0 0 0 0')
  assert.equal(await a.client.script('FLUSH'), 'OK')
  for (let i = 0; i < 4; i++) a.call(503, 'up2')
  assert.match(await a.sync(), /^error NOSCRIPT/, 'EVALSHA')
  assert.equal(await b.sync(), '0 0 0 0 0 0')
  assert.equal(await a.sync(), '0 0 0 0 0 0', 'EVAL again')
  assert.equal(await b.sync(), '1 0 0 0 0 0')
  assert.equal(b.call(200, 'up2'), 'breaker_open')
})

test('killing Redis loses no call and changes no local decision, then the fleet resyncs', async (t) => {
  let redis = await startRedis()
  const port = redis.port
  const a = await instance('a', 1, redis)
  const b = await instance('b', 1, redis)
  t.after(async () => {
    a.close()
    b.close()
    await redis.kill()
  })
  assert.equal(b.call(200), 'sent', 'b knows the scope')
  assert.equal(await a.sync(), '0 0 0 0 0 0')
  assert.equal(await b.sync(), '0 0 0 0 0 0')
  await redis.kill()
  // Every cycle fails; every call is answered at once, as the twin engine
  // with no fleet (same clock steps, same seed) answers it.
  for (let i = 0; i < 12; i++) {
    assert.match(await a.sync(), /^error /, `cycle ${i}`)
    const status = i < 6 ? 503 : 200
    assert.equal(a.call(status), a.twinCall(status), `call ${i}`)
    a.advance(1_000)
  }
  assert.deepEqual([a.engine.stats().logical_requests, a.twin.stats().logical_requests], [12, 12])
  assert.equal(a.state(), 'open')
  const s = a.fleet.stats()
  assert.deepEqual([s.healthy, s.failures, s.cycles], [false, 12, 1])
  assert.match(await b.sync(), /^error /)
  // Redis comes back empty on the same port: a writes its open again, b adopts it.
  redis = await startRedis(port)
  await Promise.all([ready(a.client), ready(b.client)])
  b.advance(12_000)
  assert.equal(await b.sync(), '0 0 0 0 0 0')
  assert.equal(await a.sync(), '0 0 0 0 0 0')
  const back = a.fleet.stats()
  assert.deepEqual([back.healthy, back.failures, back.cycles], [true, 12, 2])
  assert.equal(a.events.length, 2, `one event each way: ${a.events.join('|')}`)
  assert.match(a.events[0], /^store_unavailable: /)
  assert.equal(a.events[1], 'store_resynced')
  assert.equal(await b.sync(), '1 0 0 0 0 0')
  assert.equal(b.call(200), 'breaker_open')
})

test('a cycle slower than the timeout fails open and the next one completes', async (t) => {
  const redis = await startRedis()
  const a = await instance('a', 1, redis, { timeoutMs: 100 })
  const blocker = await client(redis.url)
  t.after(async () => {
    a.close()
    blocker.disconnect()
    await redis.kill()
  })
  assert.equal(a.call(200), 'sent')
  assert.equal(await a.sync(), '0 0 0 0 0 0')
  // Redis holds every client's commands for 1 s: the cycle gives up after 100 ms.
  assert.equal(await blocker.client('PAUSE', 1000, 'ALL'), 'OK')
  assert.equal(await a.sync(), 'error redis did not answer within 100 ms')
  // Decided locally meanwhile.
  assert.equal(a.call(200), 'sent')
  assert.equal(await blocker.ping(), 'PONG', 'the pause is over')
  assert.equal(await a.sync(), '0 0 0 0 0 0')
  assert.deepEqual([a.fleet.stats().failures, a.fleet.healthy()], [1, true])
})

/** Polls `done` for up to 10 s. */
async function eventually(what, done) {
  const start = Date.now()
  while (!done()) {
    assert.ok(Date.now() - start < 10_000, `never: ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

test('the timer shares an open on the system clock and keeps deciding with Redis gone', async (t) => {
  const redis = await startRedis()
  const engines = [new Engine(POLICY), new Engine(POLICY)]
  const clients = [await client(redis.url), await client(redis.url)]
  const [fa, fb] = engines.map((e, i) => new RedisFleet(e.fleet({ instance: 'ab'[i], quorum: 1, intervalMs: 20 }), clients[i]).start())
  t.after(async () => {
    fa.stop()
    fb.stop()
    for (const c of clients) c.disconnect()
    await redis.kill()
  })
  const [a, b] = engines
  assert.equal(fa.running, true)
  assert.equal(call(b, 200), 'sent', 'b knows the scope')
  for (let i = 0; i < 4; i++) assert.equal(call(a, 503), 'sent')
  assert.equal(a.breakerState('up'), 'open')
  await eventually("b adopts a's open", () => b.breakerState('up') === 'open')
  assert.equal(call(b, 200), 'breaker_open')
  assert.equal(fb.fleet.stats().opened, 1)
  await redis.kill()
  await eventually('a notices Redis is gone', () => !fa.fleet.healthy())
  // Decisions go on from local state.
  assert.deepEqual([call(a, 200), call(b, 200)], ['breaker_open', 'breaker_open'])
  assert.ok(fa.fleet.stats().failures >= 1)
  fa.stop()
  assert.equal(fa.running, false)
})

test('another process shares its open, and a started RedisFleet never keeps a process alive', async (t) => {
  const redis = await startRedis()
  const b = await instance('b', 1, redis)
  t.after(async () => {
    b.close()
    await redis.kill()
  })
  assert.equal(b.call(200), 'sent', 'b knows the scope')
  // The other process opens its breaker, syncs once, closes its connection
  // and leaves its RedisFleet started: it exits only if the timer is unref'd.
  const child = `
    const Redis = require('ioredis')
    const { Engine, RedisFleet } = require('.')
    const engine = new Engine(${JSON.stringify(POLICY)})
    const client = new Redis(${JSON.stringify(redis.url)}, { enableOfflineQueue: false, maxRetriesPerRequest: 0 })
    client.on('error', () => {})
    client.once('ready', async () => {
      const fleet = new RedisFleet(engine.fleet({ instance: 'other', quorum: 1 }), client).start()
      for (let i = 0; i < 4; i++) { const c = engine.begin({ route: 'up' }); c.nextAttempt(); c.report({ status: 503 }) }
      await fleet.syncOnce()
      client.disconnect()
      console.log(engine.breakerState('up'), fleet.running)
    })
  `
  const out = await new Promise((resolve, reject) => {
    execFile(process.execPath, ['-e', child], { cwd: path.join(__dirname, '..'), timeout: 30_000 }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
  })
  assert.equal(out.trim(), 'open true')
  assert.equal(await b.sync(), '1 0 0 0 0 0')
  assert.equal(b.call(200), 'breaker_open')
})
