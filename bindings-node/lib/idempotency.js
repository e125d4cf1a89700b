'use strict'
// Idempotency helpers: the params digest a business key is checked against,
// and a key derived from tenant, operation and digest (both computed by the core).

const native = require('../native.js')
const { describe } = require('./errors.js')

/**
 * SHA-256 (hex) of the canonical JSON of `params` (object keys sorted).
 * @param {unknown} params
 * @returns {string}
 */
function paramsDigest(params) {
  let text
  try {
    text = JSON.stringify(params)
  } catch (e) {
    throw new TypeError(`params must be JSON-serializable: ${/** @type {Error} */ (e).message}`)
  }
  if (text === undefined) throw new TypeError(`params must be JSON-serializable; got ${describe(params)}`)
  return native.paramsDigest(text)
}

/**
 * `rw1_` + 32 hex digits derived from tenant, operation and a params digest.
 * @param {string} tenant
 * @param {string} operation
 * @param {string} digest
 * @returns {string}
 */
function deriveIdempotencyKey(tenant, operation, digest) {
  for (const [name, v] of [
    ['tenant', tenant],
    ['operation', operation],
    ['digest', digest],
  ]) {
    if (typeof v !== 'string') throw new TypeError(`${name} must be a string; got ${describe(v)}`)
  }
  return native.deriveIdempotencyKey(tenant, operation, digest)
}

module.exports = { paramsDigest, deriveIdempotencyKey }
