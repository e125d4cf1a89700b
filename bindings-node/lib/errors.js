'use strict'
// Errors retrywise throws, and how arguments are named in TypeErrors. Plain JS
// classes so they carry typed fields; the addon's coded errors are translated here.

/**
 * @typedef {import('../index').Action} Action
 * @typedef {import('../index').Reason} Reason
 * @typedef {import('../index').ErrorClass} ErrorClass
 * @typedef {import('../index').ErrorKind} ErrorKind
 * @typedef {import('../index').OnFailure} OnFailure
 * @typedef {import('../index').Decision} Decision
 * @typedef {import('../index').Outcome} Outcome
 * @typedef {import('../index').StoppedFields} StoppedFields
 */

/**
 * How a bad argument is named in a TypeError message.
 * @param {unknown} v
 * @returns {string}
 */
function describe(v) {
  if (typeof v === 'string') return JSON.stringify(v)
  if (v === null) return 'null'
  if (typeof v === 'object') return v.constructor && v.constructor.name ? `an instance of ${v.constructor.name}` : 'an object'
  return `${typeof v} ${String(v)}`
}

/** @template {string} [C=string] */
class RetrywiseError extends Error {
  /**
   * @param {string} message
   * @param {C} code
   * @param {ErrorOptions} [options]
   */
  constructor(message, code, options) {
    super(message, options)
    this.name = 'RetrywiseError'
    this.code = code
  }
}

/** @extends {RetrywiseError<'ERR_RETRYWISE_POLICY'>} */
class PolicyError extends RetrywiseError {
  /** @param {Array<{ path: string, message: string }>} errors */
  constructor(errors) {
    const first = errors[0] || { path: '', message: 'invalid policy' }
    const text = errors.map((e) => (e.path ? `${e.path}: ${e.message}` : e.message)).join('; ')
    super(`invalid policy: ${text}`, 'ERR_RETRYWISE_POLICY')
    this.name = 'PolicyError'
    this.path = first.path
    this.errors = errors
  }
}

/** @extends {RetrywiseError<'ERR_RETRYWISE_STOPPED'>} */
class StoppedError extends RetrywiseError {
  /**
   * @param {StoppedFields} fields
   * @param {ErrorOptions} [options]
   */
  constructor(fields, options) {
    const msg = `retrywise stopped: ${fields.reason}` + (fields.errorClass ? ` (class ${fields.errorClass})` : '') + (fields.detail ? `: ${fields.detail}` : '')
    super(msg, 'ERR_RETRYWISE_STOPPED', options)
    this.name = 'StoppedError'
    /** @type {Action} */
    this.action = fields.action || 'stop'
    this.reason = fields.reason
    /** @type {ErrorClass | null} */
    this.errorClass = fields.errorClass
    /** @type {string | null} */
    this.detail = fields.detail
    /** @type {OnFailure | null} */
    this.onFailure = fields.onFailure
    this.attempts = fields.attempts
    /** @type {number | null} */
    this.waitMs = fields.waitMs === undefined ? null : fields.waitMs
    /** @type {Decision | null} */
    this.decision = fields.decision || null
    /** @type {Response | null} */
    this.response = fields.response || null
  }
}

/**
 * Thrown into an attempt's AbortSignal when one of its timers fires.
 * @extends {RetrywiseError<'ERR_RETRYWISE_TIMEOUT'>}
 */
class AttemptTimeoutError extends RetrywiseError {
  /**
   * @param {ErrorKind} kind
   * @param {number} ms
   */
  constructor(kind, ms) {
    super(`retrywise: attempt ${kind.replace(/_/g, ' ')} after ${ms} ms`, 'ERR_RETRYWISE_TIMEOUT')
    this.name = 'TimeoutError'
    this.kind = kind
  }
}

/** Explicit outcome attached to an error: `throw new AttemptError(outcome)` or `err.retrywise = outcome`. */
class AttemptError extends Error {
  /**
   * @param {Outcome} outcome
   * @param {string} [message]
   * @param {ErrorOptions} [options]
   */
  constructor(outcome, message, options) {
    super(message || 'retrywise attempt failed', options)
    this.name = 'AttemptError'
    this.retrywise = outcome
  }
}

/**
 * The addon's policy error (its message is the JSON list of problems) as a
 * `PolicyError`; any other error as it is.
 * @param {unknown} err
 * @returns {unknown}
 */
function translateNativeError(err) {
  const e = /** @type {{ code?: unknown, message: string } | null | undefined} */ (err)
  if (e && e.code === 'ERR_RETRYWISE_POLICY') {
    let list
    try {
      list = JSON.parse(e.message)
    } catch {
      list = [{ path: '', message: e.message }]
    }
    return new PolicyError(list)
  }
  return err
}

module.exports = { describe, RetrywiseError, PolicyError, StoppedError, AttemptTimeoutError, AttemptError, translateNativeError }
