'use strict'
// What a request an SDK built says about itself (the core's
// wire::RequestFacts), read once in Rust from its URL, header names and body:
// its wire family, endpoint and model, and what any upstream serving it needs
// (streaming, tools, structured output, media, its size). `engine.begin`
// takes it as `request` (its needs under the spec's own), and a wrapped fetch
// reads every request through it. What the body means is the core's reading.

const native = require('../native.js')
const { describe } = require('./errors.js')
const { headerPairs, bodyBytes } = require('./outcomes.js')
const { SLOT, API_FAMILY } = require('./vocab.js')

const { REQUEST_FAMILY } = SLOT

/**
 * `spec.request` of a call whose request the engine read last
 * (`readNext`): the call begins with what it needs, and no facts object is
 * made (a wrapped fetch's common path). Internal.
 */
const READ_NEXT = Symbol('retrywise.readNext')

/**
 * @typedef {import('../index').Needs} Needs
 * @typedef {import('../index').ApiFamily} ApiFamily
 * @typedef {import('../index').Endpoint} Endpoint
 * @typedef {import('../index').RequestFacts} ApiRequestFacts
 * @typedef {import('../native').RequestFacts} NativeFacts
 */

/** Cached absent value (a getter read once crosses once). */
const UNREAD = Symbol('unread')

/**
 * What one request says about itself: from `readRequest(url, headers, body)`.
 * Its fields are read from the native facts when first asked for.
 * @implements {ApiRequestFacts}
 */
class RequestFacts {
  /** @param {NativeFacts} n */
  constructor(n) {
    if (!(n instanceof native.RequestFacts)) throw new TypeError(`RequestFacts come from readRequest(url, headers, body); got ${describe(n)}`)
    /** @type {NativeFacts} */
    this._n = n
    /** @type {string | null | typeof UNREAD} */
    this._model = UNREAD
  }

  /**
   * The wire family the request was built for.
   * @type {ApiFamily}
   */
  get family() {
    return /** @type {ApiFamily} */ (this._n.family)
  }

  /**
   * Its endpoint, when its path names one.
   * @type {Endpoint | null}
   */
  get endpoint() {
    return /** @type {Endpoint | null} */ (this._n.endpoint ?? null)
  }

  /**
   * The body's `model`, or null.
   * @type {string | null}
   */
  get model() {
    let m = this._model
    if (m === UNREAD) {
      m = this._n.model ?? null
      this._model = m
    }
    return m
  }

  /**
   * What any upstream serving the request needs, as `begin`'s `needs` takes
   * it (absent fields left out; a new object at each read).
   * @type {Needs}
   */
  get needs() {
    const n = this._n.needs
    /** @type {Needs} */
    const out = { capabilities: n.capabilities }
    if (n.api !== null && n.api !== undefined) out.api = /** @type {ApiFamily} */ (n.api)
    if (n.inputTokens !== null && n.inputTokens !== undefined) out.inputTokens = n.inputTokens
    if (n.maxOutputTokens !== null && n.maxOutputTokens !== undefined) out.maxOutputTokens = n.maxOutputTokens
    if (n.dataBoundary !== null && n.dataBoundary !== undefined) out.dataBoundary = n.dataBoundary
    if (n.maxCost !== null && n.maxCost !== undefined) out.maxCost = n.maxCost
    return out
  }

  toJSON() {
    return { family: this.family, endpoint: this.endpoint, model: this.model, needs: this.needs }
  }
}

/**
 * The names of a request's headers as the addon takes them (joined by `\n`:
 * one string crosses; only their presence is read), or null for none.
 * @param {unknown} headers
 * @param {string} argName
 * @returns {string | null}
 */
function headerNames(headers, argName) {
  if (headers === undefined || headers === null) return null
  if (headers instanceof Headers) {
    let out = ''
    for (const k of headers.keys()) out = out === '' ? k : `${out}\n${k}`
    return out
  }
  return headerPairs(headers, argName)
    .map((p) => p[0])
    .join('\n')
}

/**
 * Reads what a request an SDK built says about itself (the core's
 * `RequestFacts::read`): its family from the URL and headers, its endpoint
 * from the path, its model and needs from the body (a body that is not a JSON
 * object gives none but the family's).
 * @param {string | URL} url
 * @param {import('../index').HeadersLike | null} [headers]
 * @param {string | Uint8Array | ArrayBuffer | object | null} [body] a string is read as UTF-8, an object as its JSON
 * @returns {RequestFacts}
 */
function readRequest(url, headers, body) {
  if (typeof url !== 'string' && !(url instanceof URL)) throw new TypeError(`url must be a string or a URL; got ${describe(url)}`)
  return new RequestFacts(native.readRequest(String(url), headerNames(headers, 'headers'), bodyBytes(body, 'body')))
}

/**
 * `readRequest` for a request a wrapped fetch already checked: its header
 * names joined by `\n` (`headerNames`), its body as bytes (null: none, or not bytes).
 * @param {string} url
 * @param {string | null} names
 * @param {Uint8Array | null} bytes
 * @returns {RequestFacts}
 */
function readChecked(url, names, bytes) {
  return new RequestFacts(native.readRequest(url, names, bytes))
}

/**
 * Reads a request for the next call `engine` begins with
 * `spec.request: READ_NEXT` (the core's reading, as `readRequest`, kept in
 * the native engine: no facts object is made). Returns the body's model and
 * the request's family.
 * @param {import('./engine.js').Engine} engine
 * @param {string} url
 * @param {string | null} names its header names joined by `\n` (`headerNames`)
 * @param {Uint8Array | null} bytes
 * @returns {{ model: string | null, family: ApiFamily }}
 */
function readNext(engine, url, names, bytes) {
  const model = engine._n.readNextRequest(url, names, bytes)
  return { model: model ?? null, family: /** @type {ApiFamily} */ (API_FAMILY[engine._s[REQUEST_FAMILY]]) }
}

module.exports = { RequestFacts, readRequest, readChecked, readNext, headerNames, READ_NEXT }
