'use strict'
// wrapFetch: a fetch whose retries retrywise owns, for SDKs that take a
// `fetch` (openai-node: `maxRetries: 0` + this). Per request: its facts read
// once in Rust (family, model, what it needs: the call begins with those needs,
// so a fallback keeps them). Per attempt: propagation headers, timeouts from
// the core as AbortSignals, error and JSON bodies read inside the loop so the
// core sees vendor codes and malformed successes; other bodies are handed on
// wrapped (see stream.js).

const dc = require('node:diagnostics_channel')
const native = require('../native.js')
const { SLOT } = require('./vocab.js')
const { describe, AttemptTimeoutError } = require('./errors.js')
const { Call, Attempt, decisionFromScratch, stoppedFromScratch, stoppedFromDecision, reportNative, DECISION, decisionOf } = require('./call.js')
const { headerPairs, errorOutcome, timerKind, bodyBytes } = require('./outcomes.js')
const { readChecked, readNext, READ_NEXT } = require('./request.js')
const { abortReason, sleep, attemptController } = require('./timers.js')
const { runInFlight } = require('./context.js')
const { Engine } = require('./engine.js')
const { wrapBody } = require('./stream.js')

const { STEP_RESULT, RESULT_ATTEMPT, STOPPED_WAIT_MS } = SLOT

/**
 * @typedef {import('../index').Decision} Decision
 * @typedef {import('../index').Outcome} Outcome
 * @typedef {import('../index').CallSpec} CallSpec
 * @typedef {import('../index').WrapFetchOptions} WrapFetchOptions
 * @typedef {import('../index').FetchLike} FetchLike
 * @typedef {import('../index').Needs} Needs
 * @typedef {import('../index').RouteRequest} RouteRequest
 * @typedef {import('./request.js').RequestFacts} RequestFacts
 * @typedef {import('./timers.js').AttemptController} AttemptController
 */

/**
 * A request as every attempt sends it again.
 * @typedef {object} Req
 * @property {string} url
 * @property {string | undefined} method
 * @property {string[]} flat its headers as the caller gave them, `[name, value, ...]`: every later attempt's are made from these
 * @property {Headers} headers the same as a `Headers`, made (and checked) when the request came: the first attempt sends them
 * @property {boolean} sent whether an attempt took `headers` (the next makes its own from `flat`)
 * @property {string | null} names its header names joined by `\n` (what its facts read of its headers)
 * @property {any} body
 * @property {Uint8Array | null} bytes the body as bytes, when it is a string or bytes (null when absent or another kind): what its facts, rewrites and continuations read, encoded once
 * @property {RequestFacts | null} facts what the request says about itself (`readRequest`), for the `routes` and `needs` functions given (null otherwise: the engine keeps what it read)
 * @property {string | null} model the body's model, read with its facts
 * @property {import('../index').ApiFamily} family the request's wire family, read with its facts
 * @property {AbortSignal | null | undefined} signal
 * @property {Record<string, unknown>} rest the other `init` fields, passed on
 */

/**
 * A success whose body is handed on: the attempt that produced it and its reader.
 * @typedef {object} BodyParts
 * @property {Response} res
 * @property {Attempt} attempt
 * @property {AttemptController} ctl
 * @property {ReadableStreamDefaultReader<Uint8Array>} reader
 * @property {number} sentAt when its request was sent (`performance.now()`): its first-token timer counts from there
 * @property {number | null} firstAt when the first bytes of its body reached the caller (the gate's first release), or null
 * @property {import('../native').Splicer | null} splicer a continuation's: turns its stream into the rest of the caller's
 * @property {import('./stream.js').NativeGate | null} gate the body's gate (the policy's, `engine.streamGate`) while it watches: an event stream's preamble and error events
 * @property {boolean} events an event stream (its gate holds its preamble): watched to its end
 */

/**
 * What `FetchCall#next` ends with: a response to return, or (when splicing) the parts of a success body.
 * @typedef {{ response: Response, handedOver: boolean, parts?: undefined } | { parts: BodyParts, handedOver: true, response?: undefined }} Next
 */

const MAX_ERROR_BODY = 1 << 20

/**
 * Attempts whose request has not gone out yet, by their propagation headers
 * (`<retrywise-request-id> <retrywise-attempt>`): told when it has. Node's
 * fetch (undici, bundled or installed) says on the diagnostics channel
 * `undici:client:sendHeaders` when it wrote a request's headers to its
 * connection, so an attempt's first-byte timeout counts from there, as the
 * core defines it (from request sent), instead of from before the connect.
 * Engines seeded alike number their calls alike: attempts with the same
 * headers are told in the order they were sent.
 * @type {Map<string, Array<() => void>>}
 */
const sending = new Map()
let watchingSends = false

/**
 * A request's headers as undici hands them to the channel (a flat
 * `[name, value, ...]` array; a `name: value\r\n` string in older versions):
 * the key of the attempt that sent it, or null.
 * @param {unknown} h
 * @returns {string | null}
 */
function sentKey(h) {
  let id = null
  let n = null
  if (Array.isArray(h)) {
    for (let i = 0; i + 1 < h.length; i += 2) {
      const name = h[i]
      // Only names of these lengths can be one of the two (most are not).
      const len = typeof name === 'string' ? name.length : -1
      if (len !== 20 && len !== 17 && typeof name === 'string') continue
      const k = String(name).toLowerCase()
      if (k === 'retrywise-request-id') id = String(h[i + 1])
      else if (k === 'retrywise-attempt') n = String(h[i + 1])
    }
  } else if (typeof h === 'string') {
    const i = /^retrywise-request-id:\s*(.*?)\s*$/im.exec(h)
    const a = /^retrywise-attempt:\s*(.*?)\s*$/im.exec(h)
    if (i !== null) id = i[1]
    if (a !== null) n = a[1]
  }
  return id === null || n === null ? null : `${id} ${n}`
}

/** @param {unknown} message */
function onSendHeaders(message) {
  if (sending.size === 0) return
  const req = message && typeof message === 'object' ? /** @type {{ request?: { headers?: unknown } }} */ (message).request : undefined
  const key = req ? sentKey(req.headers) : null
  const waiting = key === null ? undefined : sending.get(key)
  if (waiting === undefined) return
  const cb = /** @type {() => void} */ (waiting.shift())
  if (waiting.length === 0) sending.delete(/** @type {string} */ (key))
  cb()
}

/** What stops watching when nothing was watched. */
const NO_WATCH = () => {}

/**
 * Calls `onSent` when the request of the attempt whose propagation headers
 * are `id` (`retrywise-request-id`) and `n` (`retrywise-attempt`) goes out
 * (if its fetch says so); returns what stops watching.
 * @param {string | undefined} id
 * @param {string | undefined} n
 * @param {() => void} onSent
 * @returns {() => void}
 */
function watchSend(id, n, onSent) {
  if (id === undefined || n === undefined) return NO_WATCH
  if (!watchingSends) {
    watchingSends = true
    dc.subscribe('undici:client:sendHeaders', onSendHeaders)
  }
  const key = `${id} ${n}`
  const waiting = sending.get(key)
  if (waiting === undefined) sending.set(key, [onSent])
  else waiting.push(onSent)
  return () => {
    const w = sending.get(key)
    const i = w === undefined ? -1 : w.indexOf(onSent)
    if (i < 0) return
    /** @type {Array<() => void>} */ (w).splice(i, 1)
    if (/** @type {Array<() => void>} */ (w).length === 0) sending.delete(key)
  }
}

const NOOP = () => {}

/**
 * The body's bytes, at most `limit` of them (the rest is cancelled), read
 * while the attempt's idle timer runs between chunks; rejects with the
 * attempt's abort reason once it is aborted (its reader is cancelled, so a
 * read in progress ends at once).
 * @param {Response} res
 * @param {number} limit
 * @param {AttemptController} ctl
 * @returns {Promise<Uint8Array>}
 */
async function readBody(res, limit, ctl) {
  if (!res.body) return EMPTY
  const reader = res.body.getReader()
  ctl.onAbort = (reason) => {
    reader.cancel(reason).catch(NOOP)
  }
  /** @type {Uint8Array[]} */
  const chunks = []
  let size = 0
  try {
    for (;;) {
      ctl.touch()
      let r
      try {
        r = await reader.read()
      } catch (e) {
        throw ctl.aborted ? ctl.reason : e
      }
      if (ctl.aborted) throw ctl.reason
      if (r.done) break
      const value = r.value
      size += value.byteLength
      if (size > limit) {
        reader.cancel().catch(NOOP)
        break
      }
      chunks.push(value)
    }
  } finally {
    ctl.untouch()
    ctl.onAbort = null
  }
  if (chunks.length === 1) return chunks[0]
  return chunks.length === 0 ? EMPTY : Buffer.concat(chunks)
}

/**
 * @param {Response} res
 * @param {null} body
 * @param {Decision | null} decision
 * @returns {Response}
 */
function rebuildResponse(res, body, decision) {
  const out = new Response(body, {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
  })
  if (res.url) Object.defineProperty(out, 'url', { value: res.url })
  if (decision) /** @type {any} */ (out)[DECISION] = decision
  return out
}

const BYTES = Symbol('retrywise.bytes')
const USED = Symbol('retrywise.used')
const INNER = Symbol('retrywise.inner')
const FROM_URL = Symbol('retrywise.url')
/** UTF-8 as a fetch Response decodes a body (a BOM dropped, bad bytes replaced). */
const utf8 = new TextDecoder()

/**
 * A response whose body was read inside the retry loop (an error's, for its
 * vendor code; a JSON success, to check that it parses), handed on with
 * those bytes. A real `Response` (a subclass): status, headers and `url` as
 * received; `text()`, `json()`, `arrayBuffer()`, `blob()` and `bytes()`
 * answer from the bytes without a stream, which the platform's Response
 * would build over them (most of the cost of building one, and of reading
 * it); `body` makes that stream when asked. Read once, as any Response.
 */
// The platform's Response, untyped: the DOM typings declare its body
// members as properties, which a subclass's methods and accessors may not override in them.
/** @type {any} */
const PlatformResponse = Response

class BufferedResponse extends PlatformResponse {
  /**
   * @param {Uint8Array} bytes
   * @param {Response} from the response as received (its body read)
   */
  constructor(bytes, from) {
    super(null, { status: from.status, statusText: from.statusText, headers: from.headers })
    const nullBody = from.status === 204 || from.status === 304
    /** @type {Uint8Array | null} */
    this[BYTES] = nullBody ? null : bytes
    this[USED] = false
    /** @type {Response | null} */
    this[INNER] = null
    this[FROM_URL] = from.url
  }

  /** @type {string} */
  get url() {
    return this[FROM_URL]
  }

  /** A platform Response over the bytes, for what needs their stream. */
  _inner() {
    let inner = this[INNER]
    if (inner === null) {
      if (this[USED]) {
        // Read already: a stream that says so.
        inner = new Response(EMPTY)
        inner.arrayBuffer().catch(NOOP)
      } else inner = new Response(this[BYTES])
      this[INNER] = inner
    }
    return inner
  }

  /** @type {ReadableStream<Uint8Array> | null} */
  get body() {
    return this[BYTES] === null ? null : this._inner().body
  }

  /** @type {boolean} */
  get bodyUsed() {
    const inner = this[INNER]
    return inner !== null ? inner.bodyUsed : this[USED]
  }

  /** The bytes, taken once. */
  _take() {
    if (this[USED]) throw new TypeError('Body is unusable: Body has already been read')
    this[USED] = true
    const b = this[BYTES]
    return b === null ? EMPTY : b
  }

  async text() {
    if (this[INNER] !== null) return this[INNER].text()
    return utf8.decode(this._take())
  }

  async json() {
    if (this[INNER] !== null) return this[INNER].json()
    return JSON.parse(utf8.decode(this._take()))
  }

  async arrayBuffer() {
    if (this[INNER] !== null) return this[INNER].arrayBuffer()
    const b = this._take()
    return /** @type {ArrayBuffer} */ (b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength))
  }

  async bytes() {
    if (this[INNER] !== null) return new Uint8Array(await this[INNER].arrayBuffer())
    return new Uint8Array(this._take())
  }

  async blob() {
    if (this[INNER] !== null) return this[INNER].blob()
    const b = this._take()
    return new Blob([b], { type: this.headers.get('content-type') || '' })
  }

  async formData() {
    return this._inner().formData()
  }

  /** @returns {any} */
  clone() {
    if (this[INNER] !== null) return this[INNER].clone()
    if (this[USED]) throw new TypeError('Response.clone: Body has already been consumed.')
    const c = new BufferedResponse(/** @type {Uint8Array} */ (this[BYTES] === null ? EMPTY : this[BYTES]), /** @type {any} */ (this))
    const d = /** @type {any} */ (this)[DECISION]
    if (d !== undefined) /** @type {any} */ (c)[DECISION] = d
    return c
  }
}

/**
 * A response whose body was read (`bytes`), handed on with decision `d`.
 * @param {Response} res
 * @param {Uint8Array} bytes
 * @param {Decision} d
 * @returns {Response}
 */
function bufferedResponse(res, bytes, d) {
  /** @type {any} */
  const out = new BufferedResponse(bytes, res)
  out[DECISION] = d
  return out
}

/**
 * A `Headers` as the one string `reportResponse` and `rewriteEdits` take
 * (`name\nvalue\n...`; a header value holds no line break).
 * @param {Headers} h
 * @returns {string}
 */
function headersText(h) {
  let out = ''
  h.forEach((v, k) => {
    out += `${k}\n${v}\n`
  })
  return out
}

let lastType = /** @type {string | null} */ (null)
let lastTypeJson = false
/**
 * Whether a response's `content-type` names JSON (the core's `json_media_type`),
 * asked again only when it changes (an upstream answers with one).
 * @param {string | null} ct
 * @returns {boolean}
 */
function isJsonType(ct) {
  if (ct === lastType) return lastTypeJson
  lastTypeJson = ct !== null && native.jsonMediaType(ct)
  lastType = ct
  return lastTypeJson
}

/**
 * What `opts.routes` and `opts.needs` as functions are given: the request and its facts.
 * @param {Req} req
 * @returns {RouteRequest}
 */
function requestView(req) {
  const facts = /** @type {RequestFacts} */ (req.facts)
  return { url: req.url, method: req.method, headers: req.headers, model: req.model, facts }
}

/**
 * Headers made from `[name, value, ...]`.
 * @param {string[]} flat
 * @returns {Headers}
 */
function headersOf(flat) {
  const h = new Headers()
  for (let i = 0; i < flat.length; i += 2) h.append(flat[i], flat[i + 1])
  return h
}

/**
 * The route of one request: `spec.route` when given; else `routes` (a map from
 * the request's model, or a function of the request); else, with a `task`, the
 * core's lookup by task (empty route name); else the core's route for the
 * request's model (`engine.routeForModel`: an unknown model is a PolicyError
 * before any I/O); else the empty route name. The model is the one the
 * request's facts read from its body.
 * @param {Engine} engine
 * @param {WrapFetchOptions['routes']} routes
 * @param {Req} req
 * @param {Partial<CallSpec>} spec
 * @returns {string}
 */
function routeOf(engine, routes, req, spec) {
  if (spec.route !== undefined) return spec.route
  if (typeof routes === 'function') {
    const r = routes(requestView(req))
    if (typeof r !== 'string') throw new TypeError(`opts.routes(request) must return a route name; got ${describe(r)}`)
    return r
  }
  const model = req.model
  if (routes && model !== null && Object.prototype.hasOwnProperty.call(routes, model)) return routes[model]
  if (spec.task !== undefined || model === null) return ''
  return engine._routeForModel(model)
}

/**
 * The request for an attempt on `upstream`: as the SDK built it, or rewritten
 * by the core for the upstream's catalog entry (its base URL, model and key;
 * `wire::rewrite`). `headers` already carry the attempt's propagation headers
 * and are edited in place; `body` is what the attempt sends, `bytes` the same
 * as bytes (null: not bytes). An upstream the catalog does not rewrite costs
 * no crossing (`engine._rewrites`, asked once per upstream and policy).
 * @param {Engine} engine
 * @param {string} upstream
 * @param {Req} req
 * @param {Headers} headers
 * @param {any} body
 * @param {Uint8Array | null} bytes
 * @returns {{ url: string, headers: Headers, body: any }}
 */
function requestFor(engine, upstream, req, headers, body, bytes) {
  if (!engine._rewrites(upstream)) return { url: req.url, headers, body }
  const edit = engine._n.rewriteEdits(upstream, req.method || 'GET', req.url, headersText(headers), bytes || EMPTY)
  if (edit === null) return { url: req.url, headers, body }
  for (const k of edit.drop) headers.delete(k)
  const set = edit.set
  for (let i = 0; i < set.length; i += 2) headers.set(set[i], set[i + 1])
  return { url: edit.url, headers, body: bytes === null ? body : edit.body !== null && edit.body !== undefined ? edit.body : bytes }
}

const EMPTY = new Uint8Array(0)

/**
 * A needs argument (`opts.needs` or `init.retrywise.needs`), checked: an object, or none.
 * @param {unknown} n
 * @param {string} argName
 * @returns {Needs | null}
 */
function needsArg(n, argName) {
  if (n === undefined || n === null) return null
  if (typeof n !== 'object' || Array.isArray(n)) throw new TypeError(`${argName} must be a needs object ({ capabilities, inputTokens, ... }); got ${describe(n)}`)
  return /** @type {Needs} */ (n)
}

/**
 * Wraps `fetch` so that retrywise owns its retries. `opts` is the call spec
 * (`route`, `deadlineMs`, `idempotency`, `tenant`, ...) for every request;
 * `init.retrywise` overrides it per request. Without a route, each request's
 * route comes from its model (`opts.routes`, or `engine.routeForModel`), and
 * each attempt goes to the upstream the core chose, rewritten for it when the
 * policy's catalog says how to reach it (`base_url`, `model`, `api_key_env`).
 * Every call begins with what its request needs (its facts, read once), with
 * `opts.needs` (an object, or a function of the request) laid over them and
 * `init.retrywise.needs` over both, so no attempt goes to a candidate that
 * lacks what the request relies on.
 * @param {import('../index').Engine} engine
 * @param {FetchLike | null} [fetchImpl]
 * @param {WrapFetchOptions} [opts]
 * @returns {(input: string | URL | Request, init?: RequestInit & { retrywise?: Partial<CallSpec> }) => Promise<Response>}
 */
function wrapFetch(engine, fetchImpl, opts) {
  if (!(engine instanceof Engine)) throw new TypeError(`engine must be a retrywise Engine; got ${describe(engine)}`)
  const f = fetchImpl === undefined || fetchImpl === null ? globalThis.fetch : fetchImpl
  if (typeof f !== 'function') throw new TypeError(`fetch must be a function; got ${describe(fetchImpl)}`)
  const defaults = opts === undefined ? {} : opts
  if (defaults === null || typeof defaults !== 'object') throw new TypeError('opts must be an object')
  if (defaults.route !== undefined && typeof defaults.route !== 'string') throw new TypeError('opts.route must be a string')
  const routes = defaults.routes
  if (routes !== undefined && (routes === null || (typeof routes !== 'object' && typeof routes !== 'function'))) throw new TypeError('opts.routes must be an object (request model -> route) or a function (request -> route)')
  const needs = defaults.needs
  const needsFn = typeof needs === 'function' ? needs : null
  const fixedNeeds = needsFn === null ? needsArg(needs, 'opts.needs') : null
  // The spec every request begins with (routes and needs are read per request).
  /** @type {Record<string, any>} */
  const base = { ...defaults }
  delete base.routes
  delete base.needs
  // A function given is shown the request's facts: they are made as an object.
  const factsShown = needsFn !== null || typeof routes === 'function'

  // The base spec checked once, when it is one the engine's fast begin takes
  // (route, deadline, idempotency, tenant): a request with no per-request
  // spec or needs then begins with no spec object made.
  const simple = needsFn === null && fixedNeeds === null && typeof routes !== 'function' ? engine._simpleSpec(base) : null

  return async function retrywiseFetch(input, init) {
    // Synchronous unless the input is a Request or the body a stream: the
    // first attempt goes out in the caller's job.
    let req = normalizeSync(input, init)
    if (req === null) req = await normalizeRequest(input, init)
    const over = init && init.retrywise ? init.retrywise : null
    /** @type {number} */
    let h
    if (over === null && simple !== null) {
      // One native call reads the request's family, model and needs from its
      // URL, header names and body; they stay in the engine for the begin
      // below (no object is made): nothing between reads another request.
      const read = readNext(engine, req.url, req.names, req.bytes)
      req.model = read.model
      req.family = read.family
      h = engine._openReadNext(routeOf(engine, routes, req, base), simple, base)
    } else {
      // `needs` may become a list of layers (engine._open passes it on as it is).
      /** @type {Record<string, any>} */
      const spec = over === null ? { ...base } : { ...base, ...over }
      if (factsShown) {
        const facts = readChecked(req.url, req.names, req.bytes)
        req.facts = facts
        req.model = facts.model
        req.family = facts.family
        spec.request = facts
      } else {
        const read = readNext(engine, req.url, req.names, req.bytes)
        req.model = read.model
        req.family = read.family
        spec.request = READ_NEXT
      }
      spec.route = routeOf(engine, routes, req, spec)
      // The caller's needs over the request's, in layers (the core merges them).
      const mine = needsFn !== null ? needsArg(needsFn(requestView(req)), 'opts.needs(request)') : fixedNeeds
      const theirs = over === null ? null : needsArg(over.needs, 'init.retrywise.needs')
      if (mine !== null && theirs !== null) spec.needs = [mine, theirs]
      else if (mine !== null || theirs !== null) spec.needs = /** @type {Needs} */ (mine !== null ? mine : theirs)
      else spec.needs = undefined
      // The call's first attempt is asked for in the same native step.
      h = engine._open(spec, 'opts', true)
    }
    const call = new Call(engine, h)
    const fc = new FetchCall(engine, call, f, req)
    fc.primed = true
    let handedOver = false
    try {
      const res = await fc.next()
      handedOver = res.handedOver
      return /** @type {Response} */ (res.response)
    } finally {
      if (!handedOver) call._release()
    }
  }
}

/** `init` when none was given. */
const NO_INIT = Object.freeze({})

/**
 * Whether a body is a stream (read once: buffered first).
 * @param {any} body
 * @returns {boolean}
 */
function isStreamBody(body) {
  return !!body && typeof body === 'object' && (body instanceof ReadableStream || (Symbol.asyncIterator in body && !(body instanceof Uint8Array)))
}

/**
 * `fetch`'s arguments as one request every attempt can send again, without
 * waiting: null when the input is a `Request` or the body a stream, which
 * `normalizeRequest` reads first.
 * @param {unknown} input
 * @param {(RequestInit & { retrywise?: Partial<CallSpec> }) | undefined} init
 * @returns {Req | null}
 */
function normalizeSync(input, init) {
  /** @type {string} */
  let url
  if (typeof input === 'string') url = input
  else if (input instanceof URL) url = String(input)
  else if (typeof Request !== 'undefined' && input instanceof Request) return null
  else if (input && typeof input === 'object' && typeof (/** @type {{ url?: unknown }} */ (input).url) === 'string') url = /** @type {{ url: string }} */ (input).url
  else throw new TypeError(`input must be a URL string, a URL or a Request; got ${describe(input)}`)
  const i = /** @type {Record<string, any>} */ (init || NO_INIT)
  if (isStreamBody(i.body)) return null
  return collect(url, undefined, null, undefined, undefined, {}, i)
}

/**
 * `fetch`'s arguments as one request every attempt can send again (a
 * `Request`'s body and a streamed body are buffered).
 * @param {unknown} input
 * @param {(RequestInit & { retrywise?: Partial<CallSpec> }) | undefined} init
 * @returns {Promise<Req>}
 */
async function normalizeRequest(input, init) {
  const i = /** @type {Record<string, any>} */ (init || NO_INIT)
  /** @type {string} */
  let url
  /** @type {string | undefined} */
  let method
  /** @type {Headers | null} */
  let headers = null
  /** @type {any} */
  let body
  /** @type {AbortSignal | null | undefined} */
  let signal
  /** @type {Record<string, unknown>} */
  const rest = {}
  if (typeof Request !== 'undefined' && input instanceof Request) {
    url = input.url
    method = input.method
    headers = input.headers
    signal = input.signal
    if (input.body !== null && i.body === undefined) body = new Uint8Array(await input.arrayBuffer())
    for (const k of /** @type {const} */ (['redirect', 'credentials', 'mode', 'cache', 'referrer', 'referrerPolicy', 'integrity', 'keepalive'])) {
      if (input[k] !== undefined) rest[k] = input[k]
    }
  } else if (typeof input === 'string' || input instanceof URL) {
    url = String(input)
  } else if (input && typeof input === 'object' && typeof (/** @type {{ url?: unknown }} */ (input).url) === 'string') {
    url = /** @type {{ url: string }} */ (input).url
  } else {
    throw new TypeError(`input must be a URL string, a URL or a Request; got ${describe(input)}`)
  }
  if (i.body !== undefined) body = i.body
  // A stream can be read once: buffer it so every attempt sends the same bytes.
  if (isStreamBody(body)) {
    const chunks = []
    for await (const c of body) chunks.push(typeof c === 'string' ? Buffer.from(c) : Buffer.from(c))
    body = Buffer.concat(chunks)
    const req = collect(url, method, headers, signal, body, rest, { ...i, body: undefined })
    delete req.rest.duplex
    return req
  }
  return collect(url, method, headers, signal, body, rest, i)
}

/**
 * The request from what `input` gave (a Request's method, headers, signal,
 * body and options) and `init` over it.
 * @param {string} url
 * @param {string | undefined} method
 * @param {Headers | null} headers
 * @param {AbortSignal | null | undefined} signal
 * @param {any} body
 * @param {Record<string, unknown>} rest
 * @param {Record<string, any>} i
 * @returns {Req}
 */
function collect(url, method, headers, signal, body, rest, i) {
  for (const k in i) {
    if (k === 'headers' || k === 'body' || k === 'signal' || k === 'method' || k === 'retrywise' || !Object.prototype.hasOwnProperty.call(i, k)) continue
    rest[k] = i[k]
  }
  if (i.method !== undefined) method = i.method
  // The headers as `[name, value, ...]`, and their names joined as the
  // request's facts read them (only which are present counts).
  /** @type {string[]} */
  const flat = []
  /** @type {string | null} */
  let names = null
  const given = i.headers !== undefined ? i.headers : headers
  if (given !== undefined && given !== null) {
    if (given instanceof Headers) {
      given.forEach((v, k) => {
        flat.push(k, v)
      })
    } else {
      const pairs = headerPairs(given, i.headers !== undefined ? 'init.headers' : 'headers')
      for (let j = 0; j < pairs.length; j++) flat.push(pairs[j][0], pairs[j][1])
    }
    names = ''
    for (let j = 0; j < flat.length; j += 2) names = j === 0 ? flat[j] : `${names}\n${flat[j]}`
  }
  // Checked now (a bad header fails the request before its call begins); the first attempt sends these.
  const first = headersOf(flat)
  if (i.signal !== undefined && i.signal !== null) signal = i.signal
  if (i.body !== undefined) body = i.body
  // Encoded once, for the request's facts and every rewrite and continuation.
  const bytes = typeof body === 'string' || body instanceof Uint8Array ? bodyBytes(body, 'body') : null
  return { url, method, flat, headers: first, sent: false, names, body, bytes, facts: null, model: null, family: 'openai', signal, rest }
}

/** One request through a wrapped fetch: its call, and the attempts it makes. */
class FetchCall {
  /**
   * @param {Engine} engine
   * @param {Call} call
   * @param {FetchLike} fetchImpl
   * @param {Req} req
   */
  constructor(engine, call, fetchImpl, req) {
    this.engine = engine
    this.call = call
    this.fetch = fetchImpl
    this.req = req
    /** @type {Response | null} */
    this.lastResponse = null
    /** @type {unknown} */
    this.lastErr = undefined
    // The result of the call's first attempt request is already in scratch.
    this.primed = false
    // A streamed body handed on: the API family the caller reads and what it was delivered (stream.js).
    /** @type {string | null} */
    this.api = null
    /** @type {import('../native').Transcript | null} */
    this.transcript = null
    // Continuing a stream broken after output: how, and the request body that asks for it.
    /** @type {import('../index').Continuation | null} */
    this.continuation = null
    /** @type {Uint8Array | null} */
    this.contBody = null
  }

  /**
   * The next attempts continue the caller's broken stream this way: the
   * core's continuation body (the conversation plus what was delivered, as a
   * prefill or an instruction) replaces the request's.
   * @param {import('../index').Continuation} how
   */
  continueWith(how) {
    const body = this.req.bytes || EMPTY
    this.contBody = native.continuationBody(/** @type {string} */ (this.api), body, /** @type {import('../native').Transcript} */ (this.transcript), how)
    this.continuation = how
  }

  _abortIfUser() {
    const sig = this.req.signal
    if (sig && sig.aborted) {
      this.engine._n.cancel(this.call._h)
      this.engine._flush()
      throw abortReason(sig)
    }
  }

  /**
   * @param {Outcome} outcome
   * @returns {Decision}
   */
  _report(outcome) {
    // An attempt that continued a broken stream says how (a refused prefill is the core's to handle).
    const o = this.continuation !== null && outcome.continuation === undefined ? { ...outcome, continuation: this.continuation } : outcome
    reportNative(this.call, o, 'outcome')
    this.engine._flush()
    const d = decisionFromScratch(this.call)
    if (d.continuation !== null && this.transcript !== null) this.continueWith(d.continuation)
    return d
  }

  /**
   * Reports a response whose body was read inside the loop (`bytes`): its
   * status, headers and body cross as one status, one string and the bytes.
   * @param {Response} res
   * @param {Uint8Array} bytes
   * @returns {Decision}
   */
  _reportResponse(res, bytes) {
    if (this.continuation !== null) return this._report({ status: res.status, headers: res.headers, body: bytes })
    const engine = this.engine
    engine._n.reportResponse(this.call._h, res.status, headersText(res.headers), bytes)
    engine._flush()
    const d = decisionFromScratch(this.call)
    if (d.continuation !== null && this.transcript !== null) this.continueWith(d.continuation)
    return d
  }

  /**
   * Runs attempts until one returns a 2xx/3xx response (its body wrapped so
   * the success is reported when the body ends) or the core stops.
   * Returns `{ response, handedOver }` (handedOver: the body wrapper now owns the call),
   * or, with `splice` (a retry inside a body already handed on), a success body's `parts`.
   * @param {boolean} [splice]
   * @returns {Promise<Next>}
   */
  async next(splice) {
    const { engine, call, req } = this
    for (;;) {
      let r
      if (this.primed) {
        this.primed = false
        r = engine._s[STEP_RESULT]
      } else r = engine._next(call._h, 0)
      engine._flush()
      if (r !== RESULT_ATTEMPT && engine._s[STOPPED_WAIT_MS] >= 0) {
        // Not a stop but "not yet" (an open breaker's probe window comes within the deadline).
        await this._sleep(engine._s[STOPPED_WAIT_MS])
        continue
      }
      if (r !== RESULT_ATTEMPT) {
        // No attempt may start (deadline, breaker, ...): surface the last failure as it was,
        // its decision now the stop (not the retry that the refused attempt was for).
        const stopped = stoppedFromScratch(call, this.lastErr)
        if (this.lastResponse) {
          const prev = decisionOf(this.lastResponse)
          const last = /** @type {any} */ (this.lastResponse)
          last[DECISION] = {
            ...prev,
            action: 'stop',
            delayMs: 0,
            reason: stopped.reason,
            errorClass: stopped.errorClass ?? (prev ? prev.errorClass : null),
            onFailure: stopped.onFailure,
            detail: stopped.detail,
            waitSource: 'none',
            retryAfterMs: null,
          }
          return { response: this.lastResponse, handedOver: false }
        }
        throw stopped
      }
      const attempt = new Attempt(call, engine._s)
      // The caller's headers (the first attempt takes those made when the
      // request came), with the attempt's propagation headers over them.
      let headers
      if (req.sent) headers = headersOf(req.flat)
      else {
        headers = req.headers
        req.sent = true
      }
      const ph = engine._n.attemptHeadersText(call._h, attempt.number)
      /** @type {string | undefined} */
      let sentId
      /** @type {string | undefined} */
      let sentN
      if (ph !== '') {
        const p = ph.split('\n')
        for (let i = 0; i < p.length; i += 2) {
          const k = p[i]
          headers.set(k, p[i + 1])
          if (k === 'retrywise-request-id') sentId = p[i + 1]
          else if (k === 'retrywise-attempt') sentN = p[i + 1]
        }
      }
      const cont = this.contBody
      const wire = cont !== null ? requestFor(engine, attempt.upstream, req, headers, cont, cont) : requestFor(engine, attempt.upstream, req, headers, req.body, req.bytes)
      const ctl = attemptController(attempt, req.signal)
      attempt.signal = ctl.ac.signal
      // No response headers within connect + first-byte: the request may have been
      // received. Once the fetch says the request went out, first-byte from then.
      const { totalMs, firstByteMs } = attempt.timeouts
      const hdrMs = Math.min(attempt.timeouts.connectMs + firstByteMs, totalMs)
      /** @param {number} ms */
      const firstByteTimer = (ms) => setTimeout(() => ctl.abort(new AttemptTimeoutError(timerKind(attempt, 'first_byte', false), ms)), ms)
      let hdrTimer = hdrMs < totalMs ? firstByteTimer(hdrMs) : null
      const init = { ...req.rest, method: req.method, headers: wire.headers, body: wire.body, signal: ctl.ac.signal }
      const sentAt = performance.now()
      const unwatch = watchSend(sentId, sentN, () => {
        const at = performance.now() - sentAt + firstByteMs
        if (at >= Math.min(hdrMs, totalMs)) return
        if (hdrTimer) clearTimeout(hdrTimer)
        hdrTimer = firstByteTimer(firstByteMs)
      })
      let res
      try {
        res = await ctl.race(runInFlight(attempt, () => this.fetch(wire.url, init)))
      } catch (err) {
        unwatch()
        if (hdrTimer) clearTimeout(hdrTimer)
        ctl.done()
        this._abortIfUser()
        this.lastErr = err
        this.lastResponse = null
        const d = this._report(errorOutcome(err, ctl.ac.signal))
        if (d.action === 'retry' || d.action === 'fallback') {
          await this._sleep(d.delayMs)
          continue
        }
        throw stoppedFromDecision(call, d, err)
      }
      unwatch()
      if (hdrTimer) clearTimeout(hdrTimer)
      ctl.bodyStarted = true
      const failed = res.status >= 400 || res.status < 200
      // Error bodies (vendor codes) and JSON successes (a body that does not
      // parse is malformed_response) are read inside the loop, so either may be
      // retried; the idle timeout runs between their chunks. A retry spliced into
      // a stream (`splice`) hands any success body to that stream as it comes.
      if (failed || (!splice && res.body && isJsonType(res.headers.get('content-type')))) {
        let body
        try {
          body = await readBody(res, failed ? MAX_ERROR_BODY : Infinity, ctl)
        } catch (err) {
          ctl.done()
          this._abortIfUser()
          this.lastErr = err
          this.lastResponse = null
          const d = this._report({ status: res.status, headers: res.headers, ...errorOutcome(err, ctl.ac.signal), phase: 'headers' })
          if (d.action === 'retry' || d.action === 'fallback') {
            await this._sleep(d.delayMs)
            continue
          }
          throw stoppedFromDecision(call, d, err)
        }
        ctl.done()
        const d = this._reportResponse(res, body)
        this.lastErr = undefined
        this.lastResponse = bufferedResponse(res, body, d)
        if (d.action === 'retry' || d.action === 'fallback') {
          await this._sleep(d.delayMs)
          continue
        }
        // The upstream may have executed an unsafe call: never let it pass for a
        // plain error response (which a caller might simply send again).
        if (d.action === 'reconcile') throw stoppedFromDecision(call, d, undefined, this.lastResponse)
        return { response: this.lastResponse, handedOver: false }
      }
      if (!res.body) {
        ctl.done()
        const d = this._report({ status: res.status })
        const out = rebuildResponse(res, null, d)
        return { response: out, handedOver: false }
      }
      // An error event after output never reaches the SDK: the answer is continued
      // elsewhere or the caller's stream ends with the core's stop (as in Python).
      const gate = engine._n.streamGate(res.headers.get('content-type'), true)
      /** @type {BodyParts} */
      const parts = { res, attempt, ctl, reader: res.body.getReader(), gate, events: gate.mayHold, splicer: null, sentAt, firstAt: null }
      if (splice) return { parts, handedOver: true }
      return { response: wrapBody(this, parts), handedOver: true }
    }
  }

  /**
   * Sleeps `ms` (a decision's delay, a held call's wait); the caller's signal cancels the call.
   * @param {number} ms
   */
  async _sleep(ms) {
    try {
      await sleep(ms, this.req.signal)
    } catch (err) {
      this.engine._n.cancel(this.call._h)
      this.engine._flush()
      throw err
    }
  }
}

module.exports = { wrapFetch, FetchCall }
