'use strict'
// Fleet-wide state through Redis: `engine.fleet(config)` attaches the core's
// Fleet (which plans every sync cycle and applies its answers) and
// `RedisFleet` runs each plan as one pipeline on a Redis client (ioredis) on
// an unref'd timer. No decision is made here: a call reads only its
// engine's own cells, so it never waits on Redis; a cycle that fails or
// outlasts the config's timeout is reported to the core (fail-open).

const { createHash } = require('node:crypto')
const native = require('../native.js')
const { describe, translateNativeError } = require('./errors.js')

/**
 * @typedef {import('../index').FleetConfig} FleetConfig
 * @typedef {import('../index').FleetSettings} FleetSettings
 * @typedef {import('../index').SyncPlan} SyncPlan
 * @typedef {import('../index').SyncReport} SyncReport
 * @typedef {import('../index').FleetStats} FleetStats
 * @typedef {import('../index').FleetRedisClient} FleetRedisClient
 * @typedef {import('../index').Fleet} ApiFleet
 * @typedef {import('../index').RedisFleet} ApiRedisFleet
 * @typedef {import('../native').NativeFleet} NativeFleet
 * @typedef {import('../native').NativeEngine} NativeEngine
 */

/** The merge and claim scripts, with their SHA-1 for EVALSHA. */
const SCRIPTS = (() => {
  const s = native.fleetScripts()
  /** @param {string} text */
  const sha = (text) => createHash('sha1').update(text).digest('hex')
  return Object.freeze({ merge: s.merge, claim: s.claim, mergeSha: sha(s.merge), claimSha: sha(s.claim) })
})()

/** The config's fields: a misspelt one is an error, not a default silently kept. */
const CONFIG_FIELDS = ['instance', 'namespace', 'quorum', 'quorumWindowMs', 'intervalMs', 'timeoutMs', 'probeLeaseMs']

/**
 * Checks a config's shape (the core checks its values).
 * @param {unknown} config
 */
function checkConfig(config) {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) throw new TypeError(`fleet config must be an object; got ${describe(config)}`)
  for (const [k, v] of Object.entries(config)) {
    if (!CONFIG_FIELDS.includes(k)) throw new TypeError(`unknown fleet config field ${k} (known: ${CONFIG_FIELDS.join(', ')})`)
    if (v === undefined) continue
    if (k === 'instance' || k === 'namespace') {
      if (typeof v !== 'string') throw new TypeError(`fleet config ${k} must be a string; got ${describe(v)}`)
    } else if (k === 'quorum') {
      if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new TypeError(`fleet config quorum must be an integer >= 1; got ${describe(v)}`)
    } else if (typeof v !== 'number') {
      throw new TypeError(`fleet config ${k} must be a number of ms; got ${describe(v)}`)
    }
  }
}

/** @implements {ApiFleet} */
class Fleet {
  /**
   * Use `engine.fleet(config)`.
   * @param {NativeEngine} engine
   * @param {FleetConfig} config
   * @param {() => void} flush delivers the engine's queued events to its listeners
   */
  constructor(engine, config, flush) {
    checkConfig(config)
    try {
      /** @type {NativeFleet} */
      this._n = new native.NativeFleet(engine, config)
    } catch (e) {
      throw translateNativeError(e)
    }
    this._flush = flush
  }

  /** @type {FleetSettings} */
  get config() {
    return this._n.config
  }

  /** @type {number} */
  get stalenessBoundMs() {
    return this._n.stalenessBoundMs
  }

  /** @returns {SyncPlan} */
  plan() {
    return this._n.plan()
  }

  /**
   * @param {number} id
   * @param {Array<Record<string, string>>} reads
   * @param {Array<string | null>} claims
   * @returns {SyncReport}
   */
  complete(id, reads, claims) {
    const r = this._n.complete(id, reads, claims)
    this._flush()
    return r
  }

  /**
   * @param {number} id
   * @param {string} error
   */
  failed(id, error) {
    this._n.failed(id, String(error))
    this._flush()
  }

  /** @returns {boolean} */
  healthy() {
    return this._n.healthy()
  }

  /** @returns {FleetStats} */
  stats() {
    return this._n.stats()
  }
}

/**
 * `p` settled, or a rejection after `ms` (the timer unref'd).
 * @template T
 * @param {Promise<T>} p
 * @param {number} ms
 * @returns {Promise<T>}
 */
function within(p, ms) {
  /** @type {NodeJS.Timeout | undefined} */
  let t
  const late = new Promise((_, reject) => {
    t = setTimeout(() => reject(new Error(`redis did not answer within ${ms} ms`)), ms)
    t.unref()
  })
  return /** @type {Promise<T>} */ (Promise.race([p, late])).finally(() => clearTimeout(t))
}

/**
 * A hash as a client answers HGETALL: an object (ioredis), or a flat array.
 * @param {unknown} v
 * @returns {Record<string, string>}
 */
function fields(v) {
  if (Array.isArray(v)) {
    /** @type {Record<string, string>} */
    const o = {}
    for (let i = 0; i + 1 < v.length; i += 2) o[String(v[i])] = String(v[i + 1])
    return o
  }
  if (v === null || v === undefined) return {}
  return /** @type {Record<string, string>} */ (v)
}

/** @implements {ApiRedisFleet} */
class RedisFleet {
  /**
   * @param {ApiFleet} fleet from `engine.fleet(config)`
   * @param {FleetRedisClient} client an ioredis client (`new Redis(url)`)
   */
  constructor(fleet, client) {
    if (!(fleet instanceof Fleet)) throw new TypeError('fleet must come from engine.fleet(config)')
    if (client === null || typeof client !== 'object' || typeof client.pipeline !== 'function') {
      throw new TypeError('client must be an ioredis client (with pipeline())')
    }
    this._fleet = fleet
    this._client = client
    /** @type {NodeJS.Timeout | null} */
    this._timer = null
    // A script runs as EVALSHA once an EVAL of it succeeded (which caches it
    // on the server); after any failed cycle (Redis restarted, NOSCRIPT) as EVAL again.
    this._cached = { merge: false, claim: false }
    this._tick = () => {
      const started = performance.now()
      this.syncOnce().then(
        () => this._next(started),
        () => this._next(started),
      )
    }
  }

  /** @type {ApiFleet} */
  get fleet() {
    return this._fleet
  }

  /** @type {boolean} */
  get running() {
    return this._timer !== null
  }

  /**
   * Starts the cycles: one now, then one every `intervalMs` (an unref'd
   * timer: it never keeps the process alive).
   * @returns {this}
   */
  start() {
    if (this._timer === null) this._schedule(0)
    return this
  }

  /** Stops the cycles (a cycle in flight still completes). */
  stop() {
    if (this._timer !== null) clearTimeout(this._timer)
    this._timer = null
  }

  /** @param {number} ms */
  _schedule(ms) {
    this._timer = setTimeout(this._tick, ms)
    this._timer.unref()
  }

  /** @param {number} started */
  _next(started) {
    if (this._timer === null) return
    this._schedule(Math.max(0, this._fleet.config.intervalMs - (performance.now() - started)))
  }

  /**
   * Runs one cycle now: resolves to what it changed, or rejects with why it
   * failed (the failure already reported to the fleet).
   * @returns {Promise<SyncReport>}
   */
  async syncOnce() {
    const fleet = this._fleet
    const plan = fleet.plan()
    let answers
    try {
      answers = await within(this._exec(plan), fleet.config.timeoutMs)
    } catch (e) {
      this._cached = { merge: false, claim: false }
      const err = e instanceof Error ? e : new Error(String(e))
      fleet.failed(plan.id, err.message)
      throw err
    }
    return fleet.complete(plan.id, answers.reads, answers.claims)
  }

  /**
   * The plan as one pipeline: writes (answers checked, not used), reads, claims.
   * @param {SyncPlan} plan
   * @returns {Promise<{ reads: Array<Record<string, string>>, claims: Array<string | null> }>}
   */
  async _exec(plan) {
    const client = this._client
    // A client that is not connected would queue the commands (ioredis's
    // offline queue): the cycle fails now instead, and a lazy client connects.
    const status = client.status
    if (status !== undefined && status !== 'ready') {
      if (status === 'wait' && typeof client.connect === 'function') client.connect().catch(() => {})
      throw new Error(`redis client is ${status}`)
    }
    const { merge, claim } = this._cached
    const p = client.pipeline()
    for (const w of plan.writes) {
      if (merge) p.evalsha(SCRIPTS.mergeSha, 1, w.key, w.field, w.value, w.ttlMs)
      else p.eval(SCRIPTS.merge, 1, w.key, w.field, w.value, w.ttlMs)
    }
    for (const k of plan.reads) p.hgetall(k)
    for (const c of plan.claims) {
      if (claim) p.evalsha(SCRIPTS.claimSha, 1, c.key, c.value, c.nowMs, c.ttlMs)
      else p.eval(SCRIPTS.claim, 1, c.key, c.value, c.nowMs, c.ttlMs)
    }
    // Nothing to say or read: a PING keeps the health honest.
    if (plan.writes.length + plan.reads.length + plan.claims.length === 0) p.ping()
    const res = await p.exec()
    if (!res) throw new Error('redis pipeline discarded')
    for (const [err] of res) if (err) throw err
    const nw = plan.writes.length
    const nr = plan.reads.length
    const reads = res.slice(nw, nw + nr).map(([, v]) => fields(v))
    const claims = res.slice(nw + nr, nw + nr + plan.claims.length).map(([, v]) => (v === null || v === undefined ? null : String(v)))
    this._cached = { merge: merge || nw > 0, claim: claim || plan.claims.length > 0 }
    return { reads, claims }
  }
}

module.exports = { Fleet, RedisFleet, fleetScripts: SCRIPTS }
