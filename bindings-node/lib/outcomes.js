'use strict'
// What an attempt produced (a thrown error, headers, a body) as the outcome
// the core classifies. Node-specific: it knows Node's and undici's error codes
// and header containers; what they mean is decided by the core.

const native = require('../native.js')
const { describe, StoppedError, AttemptTimeoutError } = require('./errors.js')

/**
 * @typedef {import('../index').Outcome} Outcome
 * @typedef {import('../index').ErrorKind} ErrorKind
 * @typedef {import('../index').Phase} Phase
 * @typedef {import('../index').Attempt} Attempt
 */

/**
 * Any header container (Headers, Map, plain object, array of pairs) -> [[name, value], ...].
 * @param {unknown} h
 * @param {string} argName
 * @returns {Array<[string, string]>}
 */
function headerPairs(h, argName) {
  /** @type {Array<[string, string]>} */
  const out = []
  if (h === undefined || h === null) return out
  const any = /** @type {any} */ (h)
  if (typeof any.forEach === 'function' && typeof any.get === 'function' && !(h instanceof Map)) {
    any.forEach((/** @type {unknown} */ v, /** @type {string} */ k) => out.push([k, String(v)]))
    return out
  }
  if (h instanceof Map || Array.isArray(h)) {
    for (const pair of h) {
      if (!pair || pair.length !== 2) throw new TypeError(`${argName} entries must be [name, value] pairs`)
      out.push([String(pair[0]), String(pair[1])])
    }
    return out
  }
  if (typeof h === 'object') {
    const o = /** @type {Record<string, unknown>} */ (h)
    for (const k of Object.keys(o)) {
      const v = o[k]
      if (v === undefined || v === null) continue
      out.push([k, Array.isArray(v) ? v.join(', ') : String(v)])
    }
    return out
  }
  throw new TypeError(`${argName} must be a Headers, a Map, an object or an array of pairs; got ${describe(h)}`)
}

/**
 * Headers as the flat `[name, value, ...]` list the addon takes; null when absent.
 * @param {unknown} h
 * @param {string} argName
 * @returns {string[] | null}
 */
function flatHeaders(h, argName) {
  if (h === undefined || h === null) return null
  const flat = []
  for (const [k, v] of headerPairs(h, argName)) flat.push(k, v)
  return flat
}

/**
 * `v`, checked to be an HTTP status (an integer 100-999); otherwise a
 * TypeError naming argument `arg` (its `field`, when given). The name is
 * built only for the error: reports check every status.
 * @param {unknown} v
 * @param {string} arg
 * @param {string} [field]
 * @returns {number}
 */
function httpStatus(v, arg, field) {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 100 || v > 999) {
    throw new TypeError(`${field === undefined ? arg : `${arg}.${field}`} must be an integer HTTP status (100-999); got ${describe(v)}`)
  }
  return v
}

const EMPTY_BODY = new Uint8Array(0)

/**
 * A body as the bytes the core reads (a string as UTF-8, an object as JSON); null when absent.
 * @param {unknown} body
 * @param {string} argName
 * @returns {Uint8Array | null}
 */
function bodyBytes(body, argName) {
  if (body === undefined || body === null) return null
  if (body instanceof Uint8Array) return body
  if (typeof body === 'string') return Buffer.from(body, 'utf8')
  if (body instanceof ArrayBuffer) return new Uint8Array(body)
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength)
  if (typeof body === 'object') return Buffer.from(JSON.stringify(body), 'utf8')
  throw new TypeError(`${argName} must be a string, bytes or an object; got ${describe(body)}`)
}

// ---------------------------------------------------------------------------
// Node / undici errors -> outcomes
// ---------------------------------------------------------------------------

/** @type {Record<string, ErrorKind>} */
const NET_CODES = {
  ECONNREFUSED: 'connect',
  EHOSTUNREACH: 'connect',
  ENETUNREACH: 'connect',
  EADDRNOTAVAIL: 'connect',
  ENOTFOUND: 'dns',
  EAI_AGAIN: 'dns',
  EAI_FAIL: 'dns',
  ECONNRESET: 'connection_reset',
  EPIPE: 'connection_reset',
  ECONNABORTED: 'connection_reset',
  UND_ERR_SOCKET: 'connection_reset',
  UND_ERR_CLOSED: 'connection_reset',
  ERR_STREAM_PREMATURE_CLOSE: 'connection_reset',
  UND_ERR_CONNECT_TIMEOUT: 'connect_timeout',
  UND_ERR_HEADERS_TIMEOUT: 'first_byte_timeout',
  UND_ERR_BODY_TIMEOUT: 'stream_idle_timeout',
  ETIMEDOUT: 'connect_timeout',
  ERR_TLS_CERT_ALTNAME_INVALID: 'tls',
  UND_ERR_RESPONSE_STATUS_CODE: 'other',
  UND_ERR_INVALID_ARG: 'other',
}

/**
 * The ErrorKind of a Node / undici network error (its `code`, or a cause's), or null.
 * @param {any} err
 * @returns {ErrorKind | null}
 */
function netKind(err) {
  for (let e = err, i = 0; e && i < 6; e = e.cause, i++) {
    const c = e.code
    if (typeof c === 'string') {
      // The connection broke while the request was still being written.
      if ((c === 'ECONNRESET' || c === 'EPIPE') && e.syscall === 'write') return 'write'
      if (NET_CODES[c]) return NET_CODES[c]
      if (c.startsWith('ERR_SSL') || c.startsWith('ERR_TLS') || c.includes('CERT')) return 'tls'
    }
  }
  return null
}

/**
 * The outcome an attempt that failed with `err` reports: an explicit one
 * (`AttemptError`, `err.retrywise`), the evidence a nested call gave up on,
 * the attempt's own timeout, an HTTP error object's status, headers and
 * vendor code, or a network error's kind.
 * @param {any} err
 * @param {AbortSignal | null | undefined} attemptSignal
 * @param {Phase} [phase]
 * @returns {Outcome}
 */
function errorOutcome(err, attemptSignal, phase) {
  if (err && typeof err === 'object' && err.retrywise && typeof err.retrywise === 'object') return err.retrywise
  // A nested (non-owner) call gave up: classify the evidence it gave up on.
  if (err instanceof StoppedError && !(attemptSignal && attemptSignal.aborted)) {
    if (err.response) return { status: err.response.status, headers: err.response.headers, phase }
    if (err.cause !== undefined) return errorOutcome(err.cause, undefined, phase)
  }
  const timeout = attemptSignal && attemptSignal.aborted && attemptSignal.reason instanceof AttemptTimeoutError ? attemptSignal.reason : null
  if (timeout) return { error: timeout.kind, phase }
  if (err instanceof AttemptTimeoutError) return { error: err.kind, phase }
  if (err && typeof err === 'object') {
    const st = err.status
    if (typeof st === 'number' && Number.isInteger(st) && st >= 100 && st <= 999) {
      // An HTTP error object (e.g. an SDK's APIError): status, headers, vendor code.
      let vendor
      if (typeof err.code === 'string' && !/^(E[A-Z]+$|ERR_|UND_ERR)/.test(err.code)) vendor = err.code
      else if (typeof err.type === 'string') vendor = err.type
      let headers
      try {
        headers = err.headers ? headerPairs(err.headers, 'error.headers') : undefined
      } catch {
        headers = undefined
      }
      return { status: st, headers, vendorCode: vendor, body: vendor === undefined && err.error && typeof err.error === 'object' ? { error: err.error } : undefined, phase }
    }
    const k = netKind(err)
    if (k) return { error: k, phase }
    if (err.name === 'AbortError') return { error: 'cancelled', phase }
    if (err.name === 'TimeoutError') return { error: 'first_byte_timeout', phase }
    // JSON.parse of a truncated or garbled body (an SDK decoding the answer).
    if (err instanceof SyntaxError) return { error: 'malformed_response', phase }
  }
  return { error: 'other', phase }
}

/**
 * The ErrorKind an expired timer of `attempt` means, as the core maps it
 * (`Attempt::timer_error`); `bodyStarted`: the response's headers had arrived.
 * @param {Attempt} attempt
 * @param {'connect' | 'first_byte' | 'first_token' | 'idle' | 'total'} timer
 * @param {boolean} bodyStarted
 * @returns {ErrorKind}
 */
function timerKind(attempt, timer, bodyStarted) {
  return /** @type {ErrorKind} */ (native.timerError(timer, attempt.timeouts.totalMs, attempt.remainingMs, bodyStarted))
}

/**
 * Vendor error code of an OpenAI- or Anthropic-style error body (or null).
 * @param {string | Uint8Array | ArrayBuffer | object} body
 * @returns {string | null}
 */
function vendorCodeFromBody(body) {
  return native.vendorCodeFromBody(bodyBytes(body, 'body') || EMPTY_BODY)
}

/**
 * Whether a `content-type` names JSON (`application/json`, `+json`): the 2xx bodies a report checks.
 * @param {string} contentType
 * @returns {boolean}
 */
function jsonMediaType(contentType) {
  if (typeof contentType !== 'string') throw new TypeError(`contentType must be a string; got ${describe(contentType)}`)
  return native.jsonMediaType(contentType)
}

module.exports = { httpStatus, headerPairs, flatHeaders, bodyBytes, errorOutcome, timerKind, vendorCodeFromBody, jsonMediaType }
